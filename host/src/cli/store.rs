//! `runway store list|show|forget`: what the job store of each runner holds, for operators.
//!
//! Reads only what is in clear (an entry's meta); bodies stay sealed and the store key is never
//! read. A file store a running manager holds is read without its lock (`list`, `show`); `forget`
//! needs the lock, so it refuses while a manager runs. Owns the verbs' output only: opening
//! stores is `store::jobs`, settings are `config`.

use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Subcommand;

use crate::config::{self, store::StorePathVariables, RunnerConfig};
use crate::store::jobs::file::FileStore;
use crate::store::jobs::redis::RedisStore;
use crate::store::jobs::seal::StoreKey;
use crate::store::jobs::{Backend, EntryMeta, JobStore, JobStoreError, Listed};

/// `runway store` verbs.
#[derive(Subcommand, Debug)]
pub enum StoreCommand {
    /// List the stored jobs: runner, job id, project, owner, stage, heartbeat age, resumes.
    List {
        /// Only this runner (its name or short token); default: every runner.
        #[arg(long)]
        runner: Option<String>,
    },
    /// Show one stored job's meta (its body is sealed and never shown).
    Show {
        /// GitLab's job id.
        job_id: u64,
        /// Only this runner (its name or short token); default: every runner.
        #[arg(long)]
        runner: Option<String>,
    },
    /// Remove a stored job (entry and trace) so no manager resumes it. Refused on a file store
    /// a running manager holds.
    Forget {
        /// GitLab's job id.
        job_id: u64,
        /// Only this runner (its name or short token); default: every runner.
        #[arg(long)]
        runner: Option<String>,
    },
}

/// Run a `runway store` verb against the runners of the config file at `path`.
pub(super) async fn run(command: StoreCommand, path: &Path) -> anyhow::Result<ExitCode> {
    let loaded = config::load(path).map_err(|e| anyhow::anyhow!("{e}"))?;
    let filter = match &command {
        StoreCommand::List { runner } | StoreCommand::Show { runner, .. } | StoreCommand::Forget { runner, .. } => {
            runner.as_deref()
        }
    };
    let runners = select(&loaded.config.runners, filter, path)?;
    match command {
        StoreCommand::List { .. } => list(&runners, path).await,
        StoreCommand::Show { job_id, .. } => show(&runners, path, job_id).await,
        StoreCommand::Forget { job_id, .. } => forget(&runners, path, job_id).await,
    }
}

fn select<'a>(runners: &'a [RunnerConfig], filter: Option<&str>, path: &Path) -> anyhow::Result<Vec<&'a RunnerConfig>> {
    let Some(wanted) = filter else { return Ok(runners.iter().collect()) };
    let chosen: Vec<&RunnerConfig> =
        runners.iter().filter(|r| r.name == wanted || config::short_token(&r.resolved_token()) == wanted).collect();
    if chosen.is_empty() {
        let known: Vec<String> =
            runners.iter().map(|r| format!("{} ({})", r.name, config::short_token(&r.resolved_token()))).collect();
        anyhow::bail!("no runner named {wanted:?} in {} (runners: {})", path.display(), known.join(", "));
    }
    Ok(chosen)
}

/// A runner's name for output: `name (short token)`.
fn label(runner: &RunnerConfig) -> String {
    let token = config::short_token(&runner.resolved_token());
    if runner.name.is_empty() {
        token
    } else {
        format!("{} ({token})", runner.name)
    }
}

/// How a verb needs the store.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    Read,
    Write,
}

/// Why a runner has no store to read.
#[derive(Debug, thiserror::Error)]
enum NoStore {
    /// `[runners.store]` turns it off.
    #[error("the job store is off (name = \"none\")")]
    Off,
    /// A file store that was never written.
    #[error("no entries: {} does not exist yet", .0.display())]
    NotWritten(std::path::PathBuf),
}

/// The runner's store, or why there is none (it is off or has never been written).
async fn open(
    runner: &RunnerConfig,
    path: &Path,
    access: Access,
) -> anyhow::Result<Result<Arc<dyn JobStore>, NoStore>> {
    let vars =
        StorePathVariables { version: crate::buildinfo::VERSION, revision: crate::buildinfo::REVISION, tags: "" };
    let settings = runner.store_settings(path, &vars)?;
    // Nothing here unseals a body: the store key is not read (nor created).
    let key = StoreKey::from_bytes(rand::random());
    // A store an earlier version kept under the short token, not moved yet (the manager moves
    // it when it starts): that is where this runner's entries are.
    let backend = match (settings.backend, settings.migrate_from) {
        (Some(Backend::File { path }), Some(Backend::File { path: old })) if !path.exists() && old.is_dir() => {
            Some(Backend::File { path: old })
        }
        (Some(Backend::Redis { url, namespace }), Some(Backend::Redis { namespace: old, .. })) => {
            let store = RedisStore::open(&url, &namespace, key.clone()).await?;
            if store.list().await?.is_empty() {
                Some(Backend::Redis { url, namespace: old })
            } else {
                return Ok(Ok(Arc::new(store)));
            }
        }
        (backend, _) => backend,
    };
    match backend {
        None => Ok(Err(NoStore::Off)),
        Some(Backend::File { path: dir }) => {
            if !dir.exists() {
                return Ok(Err(NoStore::NotWritten(dir)));
            }
            let store = match access {
                Access::Read => FileStore::open_read_only(&dir, key)?,
                Access::Write => match FileStore::open(&dir, key) {
                    Ok(store) => store,
                    Err(JobStoreError::Locked(message)) => anyhow::bail!(
                        "{message}\nrunway store forget refuses to change a store a running manager holds: stop that manager first (it resumes or fails its jobs itself when it starts again)"
                    ),
                    Err(e) => return Err(e.into()),
                },
            };
            Ok(Ok(Arc::new(store)))
        }
        Some(Backend::Redis { url, namespace }) => Ok(Ok(Arc::new(RedisStore::open(&url, &namespace, key).await?))),
    }
}

/// `3d4h`, `1h2m`, `5m3s`, `42s`.
fn age(seconds: u64) -> String {
    let (d, h, m, s) = (seconds / 86_400, seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    match (d, h, m) {
        (0, 0, 0) => format!("{s}s"),
        (0, 0, _) => format!("{m}m{s}s"),
        (0, _, _) => format!("{h}h{m}m"),
        _ => format!("{d}d{h}h"),
    }
}

fn sorted(mut listed: Vec<Listed>) -> Vec<Listed> {
    listed.sort_by_key(|l| match l {
        Listed::Entry(meta) => (0, meta.job_id),
        Listed::Corrupt { job_id, .. } => (1, job_id.unwrap_or(u64::MAX)),
    });
    listed
}

async fn list(runners: &[&RunnerConfig], path: &Path) -> anyhow::Result<ExitCode> {
    let mut rows = vec![["RUNNER", "JOB", "PROJECT", "OWNER", "STAGE", "HEARTBEAT", "RESUMES"].map(String::from)];
    let mut notes = Vec::new();
    for runner in runners {
        let store = match open(runner, path, Access::Read).await? {
            Ok(store) => store,
            Err(reason) => {
                notes.push(format!("{}: {reason}", label(runner)));
                continue;
            }
        };
        let now = store.now().await?;
        for item in sorted(store.list().await?) {
            match item {
                Listed::Entry(meta) => rows.push([
                    label(runner),
                    meta.job_id.to_string(),
                    meta.project,
                    meta.owner,
                    meta.stage,
                    format!("{} ago", age(now.saturating_sub(meta.heartbeat))),
                    meta.resumes.to_string(),
                ]),
                Listed::Corrupt { job_id, location, error } => notes.push(format!(
                    "{}: job {}: unreadable entry {location}: {error} (runway store forget removes it)",
                    label(runner),
                    job_id.map_or_else(|| "?".to_string(), |id| id.to_string()),
                )),
            }
        }
    }
    let widths: Vec<usize> = (0..7).map(|c| rows.iter().map(|r| r[c].chars().count()).max().unwrap_or(0)).collect();
    if rows.len() == 1 {
        println!("No stored jobs.");
    } else {
        for row in &rows {
            let cells: Vec<String> = row.iter().zip(&widths).map(|(cell, w)| format!("{cell:<w$}")).collect();
            println!("{}", cells.join("  ").trim_end());
        }
    }
    for note in notes {
        println!("{note}");
    }
    Ok(ExitCode::SUCCESS)
}

fn print_meta(runner: &RunnerConfig, store: &dyn JobStore, meta: &EntryMeta, now: u64) {
    println!("Job {} of runner {} in {}", meta.job_id, label(runner), store.describe());
    println!("  project:   {}", meta.project);
    println!("  owner:     {} (the manager's system id)", meta.owner);
    println!("  stage:     {}", meta.stage);
    println!("  created:   {} ({} ago)", when(meta.created), age(now.saturating_sub(meta.created)));
    println!("  heartbeat: {} ({} ago)", when(meta.heartbeat), age(now.saturating_sub(meta.heartbeat)));
    println!("  resumes:   {}", meta.resumes);
    println!("  body:      sealed (payload, trace position, executor state); not shown");
}

fn when(unix: u64) -> String {
    i64::try_from(unix)
        .ok()
        .and_then(|s| chrono::DateTime::from_timestamp(s, 0))
        .map_or_else(|| unix.to_string(), |t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true))
}

async fn show(runners: &[&RunnerConfig], path: &Path, job_id: u64) -> anyhow::Result<ExitCode> {
    let mut found = false;
    for runner in runners {
        let Ok(store) = open(runner, path, Access::Read).await? else { continue };
        let now = store.now().await?;
        for item in store.list().await? {
            match item {
                Listed::Entry(meta) if meta.job_id == job_id => {
                    print_meta(runner, store.as_ref(), &meta, now);
                    found = true;
                }
                Listed::Corrupt { job_id: Some(id), location, error } if id == job_id => {
                    println!("Job {job_id} of runner {}: unreadable entry {location}: {error}", label(runner));
                    found = true;
                }
                _ => {}
            }
        }
    }
    if !found {
        eprintln!("runway: no stored job {job_id}");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

async fn forget(runners: &[&RunnerConfig], path: &Path, job_id: u64) -> anyhow::Result<ExitCode> {
    let mut found = false;
    for runner in runners {
        // Look first without the lock, so a store that does not hold the job is left alone.
        let Ok(reader) = open(runner, path, Access::Read).await? else { continue };
        let held = reader.list().await?.into_iter().find_map(|item| match item {
            Listed::Entry(meta) if meta.job_id == job_id => Some(format!("owner {}, stage {}", meta.owner, meta.stage)),
            Listed::Corrupt { job_id: Some(id), .. } if id == job_id => Some("unreadable".to_string()),
            _ => None,
        });
        let Some(what) = held else { continue };
        drop(reader);
        let Ok(store) = open(runner, path, Access::Write).await? else { continue };
        store.remove(job_id).await?;
        println!(
            "Forgot job {job_id} of runner {} ({what}): its entry and trace are removed from {}. No manager will resume it; GitLab still shows it until it times out or is cancelled there.",
            label(runner),
            store.describe()
        );
        found = true;
    }
    if !found {
        eprintln!("runway: no stored job {job_id}");
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::age;

    #[test]
    fn ages_read_like_durations() {
        assert_eq!(age(0), "0s");
        assert_eq!(age(125), "2m5s");
        assert_eq!(age(3 * 3600 + 61), "3h1m");
        assert_eq!(age(2 * 86_400 + 5 * 3600 + 7), "2d5h");
    }
}
