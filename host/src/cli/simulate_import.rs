//! `runway simulate import --url … --token … --project … [--out trace.jsonl]`: page through
//! GitLab's jobs API (`GET /api/v4/projects/:id/jobs`, following `X-Next-Page`) and write the
//! project's history as a JSONL trace for `runway simulate`. The conversion itself
//! (`autoscaler::trace::trace_from_jobs`) is pure; this file only fetches and writes.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::Context;

use crate::autoscaler::trace::{trace_from_jobs, write_trace, ApiJob};

/// Arguments of `runway simulate import`.
#[derive(clap::Args, Debug, Clone)]
pub struct ImportArgs {
    /// GitLab's URL (e.g. `https://gitlab.example.com`).
    #[arg(long)]
    pub url: String,
    /// A personal, project or group access token with `read_api` (sent as `PRIVATE-TOKEN`).
    #[arg(long, env = "GITLAB_TOKEN", hide_env_values = true)]
    pub token: String,
    /// The project: numeric id or full path (`group/project`).
    #[arg(long)]
    pub project: String,
    /// Job statuses to import (`scope[]`); default: finished jobs (`success`, `failed`).
    #[arg(long, value_delimiter = ',', default_values_t = ["success".to_string(), "failed".to_string()])]
    pub scope: Vec<String>,
    /// Stop after this many pages of 100 jobs (0 = all).
    #[arg(long, default_value_t = 0)]
    pub max_pages: u32,
    /// Write the trace here (default: standard output).
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn encode_component(s: &str) -> String {
    let mut out = String::new();
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Fetch every page of the project's jobs.
pub async fn fetch_jobs(args: &ImportArgs) -> anyhow::Result<Vec<ApiJob>> {
    let client = reqwest::Client::builder().build().context("cannot build the HTTP client")?;
    let base = format!("{}/api/v4/projects/{}/jobs", args.url.trim_end_matches('/'), encode_component(&args.project));
    let mut jobs = Vec::new();
    let mut page = 1u32;
    loop {
        let mut query: Vec<(String, String)> =
            vec![("per_page".into(), "100".into()), ("page".into(), page.to_string())];
        query.extend(args.scope.iter().map(|s| ("scope[]".to_string(), s.clone())));
        let response = client
            .get(&base)
            .header("PRIVATE-TOKEN", &args.token)
            .query(&query)
            .send()
            .await
            .with_context(|| format!("GET {base} (page {page})"))?;
        let status = response.status();
        let next = response
            .headers()
            .get("x-next-page")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok());
        let body = response.text().await.with_context(|| format!("GET {base} (page {page}): reading the body"))?;
        if !status.is_success() {
            anyhow::bail!("GET {base} (page {page}): {status}: {}", body.trim());
        }
        let batch: Vec<ApiJob> =
            serde_json::from_str(&body).with_context(|| format!("GET {base} (page {page}): not a list of jobs"))?;
        jobs.extend(batch);
        match next {
            Some(n) if n > page && (args.max_pages == 0 || page < args.max_pages) => page = n,
            _ => break,
        }
    }
    Ok(jobs)
}

/// Run `runway simulate import`.
pub async fn run(args: ImportArgs) -> anyhow::Result<ExitCode> {
    let jobs = fetch_jobs(&args).await?;
    let (trace, skipped) = trace_from_jobs(&jobs);
    let mut bytes = Vec::new();
    write_trace(&mut bytes, &trace).context("cannot format the trace")?;
    match &args.out {
        Some(path) => std::fs::write(path, &bytes).with_context(|| format!("cannot write {}", path.display()))?,
        None => print!("{}", String::from_utf8_lossy(&bytes)),
    }
    eprintln!(
        "runway simulate import: {} jobs fetched, {} in the trace, {} skipped (never started or finished)",
        jobs.len(),
        trace.len(),
        skipped
    );
    Ok(ExitCode::SUCCESS)
}
