//! `image:` and `services:` of a `.gitlab-ci.yml` job as the payload GitLab would send:
//! a string, or a mapping with `name`, `entrypoint`, `command`, `alias`, `variables`,
//! `pull_policy` and `docker: {user, platform}`.
//!
//! Owns: reading those two keys. Must not touch: anything else of the job.

use serde_yaml::Value;

use crate::payload::{DockerOptions, ExecutorOptions, Image, JobVariable};

/// A string or a list of scalars as strings (`[]` for anything else).
pub(super) fn strings(value: Option<&Value>) -> Vec<String> {
    match value {
        Some(Value::String(s)) => vec![s.clone()],
        Some(Value::Sequence(items)) => items.iter().filter_map(scalar).collect(),
        _ => Vec::new(),
    }
}

/// A scalar as text.
pub(super) fn scalar(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        Value::Bool(b) => Some(b.to_string()),
        _ => None,
    }
}

/// One image entry; `None` when it names no image.
pub(super) fn image(value: &Value) -> Option<Image> {
    let image = match value {
        Value::String(name) => Image { name: name.clone(), ..Image::default() },
        Value::Mapping(map) => {
            let get = |key: &str| map.get(Value::String(key.into()));
            let docker = get("docker");
            let docker_key = |key: &str| docker.and_then(|d| d.get(key)).and_then(scalar).unwrap_or_default();
            let variables = match get("variables") {
                Some(Value::Mapping(vars)) => vars
                    .iter()
                    .filter_map(|(k, v)| Some(JobVariable::public(&scalar(k)?, &scalar(v).unwrap_or_default())))
                    .collect(),
                _ => Vec::new(),
            };
            Image {
                name: get("name").and_then(scalar).unwrap_or_default(),
                entrypoint: strings(get("entrypoint")),
                command: strings(get("command")),
                alias: get("alias").and_then(scalar).unwrap_or_default(),
                pull_policy: strings(get("pull_policy")),
                variables,
                executor_opts: ExecutorOptions {
                    docker: DockerOptions { user: docker_key("user"), platform: docker_key("platform") },
                },
            }
        }
        _ => return None,
    };
    (!image.name.is_empty()).then_some(image)
}

/// The `services:` list.
pub(super) fn services(value: Option<&Value>) -> Vec<Image> {
    match value {
        Some(Value::Sequence(items)) => items.iter().filter_map(image).collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_mappings() {
        let yaml: Value = serde_yaml::from_str(
            r#"
image: {name: "ruby:3.3", entrypoint: [""], pull_policy: [if-not-present], docker: {user: "1000"}}
services:
  - postgres:16
  - name: redis:7
    alias: cache
    command: ["redis-server", "--port", "6380"]
    variables: {A: 1}
"#,
        )
        .expect("yaml");
        let img = image(&yaml["image"]).expect("image");
        assert_eq!((img.name.as_str(), img.entrypoint.clone()), ("ruby:3.3", vec![String::new()]));
        assert_eq!(
            (img.pull_policy.clone(), img.executor_opts.docker.user.as_str()),
            (vec!["if-not-present".into()], "1000")
        );
        let svcs = services(yaml.get("services"));
        assert_eq!(svcs.len(), 2);
        assert_eq!((svcs[0].name.as_str(), svcs[1].alias.as_str()), ("postgres:16", "cache"));
        assert_eq!(svcs[1].command, vec!["redis-server", "--port", "6380"]);
        assert_eq!((svcs[1].variables[0].key.as_str(), svcs[1].variables[0].value.as_str()), ("A", "1"));
        assert!(image(&Value::Null).is_none());
    }
}
