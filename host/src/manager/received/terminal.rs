//! A received job's web terminal, with gitlab-runner's lifetime: the session made for the
//! job request is given the job's [`TerminalTarget`] once the job is prepared (a shell on
//! this machine for the shell executor, a container's for docker and kubernetes); after the stages a connected terminal holds the job
//! until it disconnects or `session_timeout` (or what is left of the job's timeout) runs out,
//! and the trace says which; a cancelled or aborted job closes its terminals; the job's end
//! closes the session (its URL answers 404 from then on).
//!
//! Owns: [`JobTerminal`]. Must not touch: the session server and its byte pump
//! (`crate::session`), GitLab calls (`super::gitlab`).

use std::sync::Arc;
use std::time::Duration;

use super::exec_terminal::ContainerShell;
use crate::config::duration::go_string;
use crate::executor::TerminalPlace;
use crate::job::JobControl;
use crate::session::pty::LocalShell;
use crate::session::{JobSession, TerminalTarget};
use crate::trace::format::TraceLog;
use crate::trace::JobTrace;

/// One job's terminal session.
pub(crate) struct JobTerminal {
    session: Arc<JobSession>,
    /// `session_timeout`.
    timeout: Duration,
    control: JobControl,
    trace: JobTrace,
}

impl JobTerminal {
    /// The terminal of a job controlled by `control` writing to `trace`, in `session`; a
    /// cancel or abort of the job closes it from now on.
    pub(crate) fn new(session: Arc<JobSession>, timeout: Duration, control: JobControl, trace: JobTrace) -> Self {
        let (watched, cancel, abort) = (session.clone(), control.cancel.clone(), control.abort.clone());
        tokio::spawn(async move {
            tokio::select! {
                () = cancel.cancelled() => watched.close(),
                () = abort.cancelled() => watched.close(),
                () = watched.closed() => {}
            }
        });
        JobTerminal { session, timeout, control, trace }
    }

    /// The job's environment is prepared: terminals open at `place` from now on.
    pub(crate) fn attach(&self, place: TerminalPlace) {
        let target: Arc<dyn TerminalTarget> = match place {
            TerminalPlace::Local { shell, dir, env, user } => Arc::new(LocalShell { shell, dir, env, user }),
            TerminalPlace::Container { point, dir, env } => Arc::new(ContainerShell { point, dir, env }),
        };
        self.session.set_target(target);
    }

    /// gitlab-runner's `waitForTerminal`: with a terminal connected, wait for it to
    /// disconnect, at most `session_timeout` or `left` of the job's timeout, whichever is
    /// shorter; a cancel or abort ends the wait and the terminal. Then the session closes.
    pub(crate) async fn wait(&self, left: Duration) {
        self.wait_for_disconnect(left).await;
        // The job is finishing: no new terminal from now on.
        self.session.close();
    }

    async fn wait_for_disconnect(&self, left: Duration) {
        if !self.session.connected() {
            return;
        }
        let timeout = self.timeout.min(left);
        let shown = go_string(Duration::from_secs(timeout.as_secs() + u64::from(timeout.subsec_millis() >= 500)));
        self.trace.info(&format!("Terminal is connected, will time out in {shown}..."));
        tokio::select! {
            () = tokio::time::sleep(timeout) => {
                self.trace.info(&format!("terminal session timed out (maximum time allowed - {shown})"));
                self.session.close();
            }
            () = self.session.disconnected() => self.trace.info("Terminal disconnected"),
            () = self.control.cancel.cancelled() => self.session.close(),
            () = self.control.abort.cancelled() => self.session.close(),
        }
    }
}

impl Drop for JobTerminal {
    fn drop(&mut self) {
        self.session.close();
    }
}
