//! Waiting for a condition instead of sleeping for a guess: poll it until it holds, and fail
//! the test with what was awaited when a deadline passes first. Shared by the integration
//! tests (`#[path = "support/wait.rs"] mod wait;`).
#![allow(dead_code)]

use std::future::Future;
use std::time::{Duration, Instant};

/// Generous: only the event matters, and the machine may be loaded.
pub(crate) const WAIT: Duration = Duration::from_secs(30);

/// Poll `done` every `every` until it holds; panic naming `what` after `limit`.
pub(crate) async fn until_every(what: &str, limit: Duration, every: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(every).await;
    }
}

/// Poll `done` every 20 ms until it holds; panic naming `what` after `limit`.
pub(crate) async fn until(what: &str, limit: Duration, done: impl FnMut() -> bool) {
    until_every(what, limit, Duration::from_millis(20), done).await;
}

/// Poll the asynchronous check `done` every 100 ms until it holds; panic naming `what` after
/// `limit`.
pub(crate) async fn until_async<F: Future<Output = bool>>(what: &str, limit: Duration, mut done: impl FnMut() -> F) {
    let deadline = Instant::now() + limit;
    while !done().await {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Poll `done` every 20 ms on this thread until it holds; panic naming `what` after `limit`.
pub(crate) fn until_blocking(what: &str, limit: Duration, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !done() {
        assert!(Instant::now() < deadline, "timed out after {limit:?} waiting until {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
