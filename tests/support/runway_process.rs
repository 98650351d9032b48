//! A `runway run` process for end-to-end tests: started with its config directory as working
//! directory and its log appended to `runway.log` there, crashed with SIGKILL, or stopped with
//! SIGQUIT as an administrator would (what a dropped process gets, when asked for).

// Each test binary that includes this file uses part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// One `runway -c <dir>/config.toml run`.
pub(crate) struct RunwayProcess {
    dir: PathBuf,
    env: Vec<(String, String)>,
    env_remove: Vec<String>,
    quit_on_drop: bool,
    child: Option<Child>,
}

impl RunwayProcess {
    /// A process for the config in `dir` (not started).
    pub(crate) fn new(dir: PathBuf) -> RunwayProcess {
        RunwayProcess { dir, env: Vec::new(), env_remove: Vec::new(), quit_on_drop: false, child: None }
    }

    /// Set an environment variable of the process.
    pub(crate) fn env(mut self, key: &str, value: &str) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    /// Remove an environment variable the test process has.
    pub(crate) fn env_remove(mut self, key: &str) -> Self {
        self.env_remove.push(key.into());
        self
    }

    /// When dropped, stop with SIGQUIT (finish and clean up, up to 20 s) instead of SIGKILL.
    pub(crate) fn quit_on_drop(mut self) -> Self {
        self.quit_on_drop = true;
        self
    }

    /// The config directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// The running process's id.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Start it (again).
    pub(crate) fn start(&mut self) {
        let log =
            std::fs::OpenOptions::new().create(true).append(true).open(self.dir.join("runway.log")).expect("log file");
        let mut command = Command::new(env!("CARGO_BIN_EXE_runway"));
        command.arg("-c").arg(self.dir.join("config.toml")).arg("run").current_dir(&self.dir).env("RUST_LOG", "info");
        for (key, value) in &self.env {
            command.env(key, value);
        }
        for key in &self.env_remove {
            command.env_remove(key);
        }
        let child = command.stdout(Stdio::null()).stderr(log).spawn().expect("runway run starts");
        self.child = Some(child);
    }

    /// SIGKILL: no cleanup, no final update, nothing saved on the way out.
    pub(crate) fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// What it logged so far.
    pub(crate) fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("runway.log")).unwrap_or_default()
    }
}

impl Drop for RunwayProcess {
    fn drop(&mut self) {
        if let (true, Some(child)) = (self.quit_on_drop, &self.child) {
            // SAFETY: signalling our own child.
            unsafe {
                libc::kill(child.id() as i32, libc::SIGQUIT);
            }
            let deadline = Instant::now() + Duration::from_secs(20);
            while Instant::now() < deadline {
                if self.child.as_mut().is_some_and(|c| c.try_wait().ok().flatten().is_some()) {
                    self.child = None;
                    return;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        self.kill9();
    }
}
