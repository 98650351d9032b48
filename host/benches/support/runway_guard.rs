//! A `runway run` child of a benchmark, stopped when dropped: SIGQUIT (graceful), then
//! SIGKILL after 20 s. Shared by the benches that start the runner as a process.

use std::process::Child;
use std::time::{Duration, Instant};

/// The runner process; dropping it stops it.
pub(crate) struct RunwayProcess(pub Child);

impl Drop for RunwayProcess {
    fn drop(&mut self) {
        // SAFETY: signalling our own child.
        unsafe {
            libc::kill(self.0.id() as i32, libc::SIGQUIT);
        }
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if self.0.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}
