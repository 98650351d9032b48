//! What the executor knows of the job beyond the executor's `job` record: variables, registry
//! credentials and the `image:`/`services:` details (`runway:host/job`), with the record's
//! image and services as the fallback when the host has no details. Reads only.

use std::cell::RefCell;
use std::collections::BTreeMap;

use runway_sdk::executor::{Image, Job};
use runway_sdk::job::{Credential, ImageDetails, Variable};

/// The job's details, as the executor uses them.
pub struct JobContext {
    /// Every variable, in GitLab's order.
    pub variables: Vec<Variable>,
    /// Registry credentials.
    pub credentials: Vec<Credential>,
    /// `image:`.
    pub image: Option<ImageDetails>,
    /// `services:`.
    pub services: Vec<ImageDetails>,
    /// Images made present for this job so far (name → ID): not pulled twice (GitLab's rule).
    pub used_images: RefCell<BTreeMap<String, String>>,
}

fn from_record(image: &Image) -> ImageDetails {
    ImageDetails {
        name: image.name.clone(),
        entrypoint: image.entrypoint.clone(),
        command: image.command.clone(),
        aliases: image.aliases.clone(),
        pull_policies: Vec::new(),
        variables: Vec::new(),
        user: String::new(),
        platform: String::new(),
    }
}

impl JobContext {
    /// The current job's details (the host's), else what the job record has.
    pub fn load(job: &Job) -> JobContext {
        match runway_sdk::job::current() {
            Some(details) => JobContext {
                variables: details.variables,
                credentials: details.credentials,
                image: details.image.filter(|i| !i.name.trim().is_empty()),
                services: details.services,
                used_images: RefCell::default(),
            },
            None => JobContext {
                variables: Vec::new(),
                credentials: Vec::new(),
                image: job.image.as_ref().filter(|i| !i.name.trim().is_empty()).map(from_record),
                services: job.services.iter().map(from_record).collect(),
                used_images: RefCell::default(),
            },
        }
    }

    /// The value of the last variable named `key`.
    pub fn variable(&self, key: &str) -> Option<&str> {
        self.variables.iter().rev().find(|v| v.key == key).map(|v| v.value.as_str())
    }

    /// `text` with `$NAME`/`${NAME}` expanded from the job's variables (image names).
    pub fn expand(&self, text: &str) -> String {
        docker_logic::reference::expand(text, |name| self.variable(name).map(str::to_string))
    }

    /// Whether variable `key` is set to a true value (Go's `ParseBool`).
    pub fn truthy(&self, key: &str) -> bool {
        matches!(self.variable(key), Some("1" | "t" | "T" | "true" | "TRUE" | "True"))
    }

    /// `CI_DEBUG_SERVICES` or `CI_DEBUG_TRACE` set to a true value.
    pub fn debug_services(&self) -> bool {
        self.truthy("CI_DEBUG_SERVICES") || self.truthy("CI_DEBUG_TRACE")
    }

    /// `KEY=value` of the job's public, non-file variables: what services see of the job
    /// (GitLab passes services no secret variables).
    pub fn service_environment(&self) -> Vec<String> {
        self.variables.iter().filter(|v| v.public && !v.file).map(|v| format!("{}={}", v.key, v.value)).collect()
    }
}
