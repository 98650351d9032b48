//! A job's web terminal in one of its containers: a new shell `exec`ed with a tty each time a
//! terminal connects — in the Docker container the docker plugin named (on its engine, a fleet
//! instance's too) as gitlab-runner's Docker executor does, or in the pod's build container as
//! its Kubernetes executor does — in the job's project directory (its nearest existing parent
//! before the sources are fetched) with the job's variables (on Kubernetes the public ones the
//! build container has from the pod spec). The connector carries the bytes
//! (the engine's hijacked exec stream; the `pods/exec` WebSocket), and resizes the tty.
//!
//! Owns: [`ContainerShell`], the command a terminal runs in a container. Must not touch: the
//! session server (`crate::session`), the transports (`crate::connector`).

use std::path::{Path, PathBuf};

use async_trait::async_trait;

use crate::connector::docker::exec::ExecSpec;
use crate::connector::docker::DockerClient;
use crate::connector::kube::terminal::TtyResize;
use crate::executor::AttachPoint;
use crate::session::{Attached, Resize, TerminalError, TerminalTarget};
use crate::stop::StopSignal;

/// A shell in a running container of the job.
pub(crate) struct ContainerShell {
    /// The container.
    pub(crate) point: AttachPoint,
    /// The job's project directory there.
    pub(crate) dir: PathBuf,
    /// The job's variables.
    pub(crate) env: Vec<(String, String)>,
}

/// The command: into the project directory (else its nearest parent there), then the first
/// shell the image has, bash before sh — gitlab-runner's interactive shell detection.
fn shell_command(dir: &Path) -> Vec<String> {
    let script = "for d in \"$@\"; do cd \"$d\" 2>/dev/null && break; done; \
                  for s in /usr/local/bin/bash /usr/bin/bash /bin/bash /usr/local/bin/sh /usr/bin/sh /bin/sh /busybox/sh; do \
                  if [ -x \"$s\" ]; then exec \"$s\"; fi; done; echo 'shell not found' >&2; exit 1";
    let mut cmd = vec!["sh".to_string(), "-c".to_string(), script.to_string(), "sh".to_string()];
    cmd.extend(dir.ancestors().map(|d| d.display().to_string()));
    cmd
}

/// `KEY=value` of the job's variables, with `TERM` for a terminal that has none.
fn environment(env: &[(String, String)]) -> Vec<String> {
    let mut out: Vec<String> = env.iter().map(|(k, v)| format!("{k}={v}")).collect();
    if !env.iter().any(|(k, _)| k == "TERM") {
        out.push("TERM=xterm".into());
    }
    out
}

fn failed(e: impl std::fmt::Display) -> TerminalError {
    TerminalError::Environment(e.to_string())
}

struct DockerResize {
    client: DockerClient,
    exec: String,
}

#[async_trait]
impl Resize for DockerResize {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), TerminalError> {
        self.client.exec_resize(&self.exec, cols, rows, &StopSignal::new()).await.map_err(failed)
    }
}

#[async_trait]
impl Resize for TtyResize {
    async fn resize(&self, cols: u16, rows: u16) -> Result<(), TerminalError> {
        TtyResize::resize(self, cols, rows).await.map_err(failed)
    }
}

#[async_trait]
impl TerminalTarget for ContainerShell {
    async fn open(&self, cols: u16, rows: u16) -> Result<Attached, TerminalError> {
        let cmd = shell_command(&self.dir);
        match &self.point {
            AttachPoint::Docker { client, container, user } => {
                let spec =
                    ExecSpec { cmd, env: environment(&self.env), user: user.clone(), working_dir: String::new() };
                let exec = client.exec_tty(container, &spec, cols, rows, &StopSignal::new()).await.map_err(failed)?;
                let resize = DockerResize { client: client.clone(), exec: exec.id };
                Ok(Attached { output: exec.output, input: exec.input, resize: Box::new(resize) })
            }
            AttachPoint::Kube { client, target } => {
                // The build container has the job's public variables already (the pod spec's
                // `env`, as gitlab-runner's); the rest would travel in the exec request's URL,
                // which API servers log: only the terminal type is added.
                let term = self.env.iter().find(|(k, _)| k == "TERM").map_or("xterm", |(_, v)| v.as_str());
                let mut command = vec!["env".to_string(), format!("TERM={term}")];
                command.extend(cmd);
                let exec = client.exec_tty(target, &command, cols, rows).await.map_err(failed)?;
                Ok(Attached { output: exec.output, input: exec.input, resize: Box::new(exec.resize) })
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_starts_in_the_nearest_existing_project_directory() {
        let cmd = shell_command(Path::new("/builds/group/project"));
        assert_eq!(&cmd[..2], &["sh", "-c"]);
        assert!(cmd[2].starts_with("for d in \"$@\"; do cd \"$d\""));
        assert!(cmd[2].contains("/usr/local/bin/bash /usr/bin/bash /bin/bash"));
        assert_eq!(&cmd[3..], &["sh", "/builds/group/project", "/builds/group", "/builds", "/"]);
    }

    #[test]
    fn terminal_type_unless_the_job_sets_one() {
        let env = vec![("A".to_string(), "1".to_string())];
        assert_eq!(environment(&env), vec!["A=1", "TERM=xterm"]);
        let env = vec![("TERM".to_string(), "dumb".to_string())];
        assert_eq!(environment(&env), vec!["TERM=dumb"]);
    }
}
