//! Stopping work in flight: [`StopSignal`] is a cancellation token that remembers why it
//! fired ([`StopReason`]). The job fires it (cancel, abort, timeout); capabilities and the
//! SSH connector obey it by killing what they started.
//!
//! A leaf: it imports nothing of the crate.

use std::sync::{Arc, Mutex};

use tokio_util::sync::CancellationToken;

/// Why the host stopped a running stage.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopReason {
    /// The job was cancelled (UI cancel, abort, runner shutdown).
    Canceled,
    /// The job or stage ran out of time.
    TimedOut,
}

/// A cancellation token with a reason, handed to host capabilities for one call.
#[derive(Clone, Debug, Default)]
pub struct StopSignal {
    token: CancellationToken,
    reason: Arc<Mutex<Option<StopReason>>>,
}

impl StopSignal {
    /// A fresh signal.
    pub fn new() -> Self {
        Self::default()
    }
    /// Stop, recording why (the first reason wins).
    pub fn stop(&self, reason: StopReason) {
        if let Ok(mut r) = self.reason.lock() {
            r.get_or_insert(reason);
        }
        self.token.cancel();
    }
    /// Why it stopped, if it did.
    pub fn reason(&self) -> Option<StopReason> {
        if !self.token.is_cancelled() {
            return None;
        }
        self.reason.lock().ok().and_then(|r| *r)
    }
    /// Resolves when stopped.
    pub async fn stopped(&self) {
        self.token.cancelled().await
    }
    /// Has it stopped?
    pub fn is_stopped(&self) -> bool {
        self.token.is_cancelled()
    }
}
