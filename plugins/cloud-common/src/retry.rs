//! Retries with capped exponential back-off and jitter, kept well inside the host's per-call
//! wasm time (`call_timeout`, 30 s by default: waiting in a WASI poll counts against it).

use std::time::Duration;

/// What one attempt says about trying again.
pub enum Attempt<T, E> {
    /// Done (success or a failure not worth retrying).
    Done(Result<T, E>),
    /// Throttled or transiently failed: try again, after at least the given delay if the
    /// server named one (`Retry-After`).
    Retry(E, Option<Duration>),
}

/// Attempts made at most (the first plus retries).
pub const MAX_ATTEMPTS: u32 = 4;
/// The first back-off; doubled on each retry.
const BASE: Duration = Duration::from_millis(300);
/// No single wait is longer than this.
const CAP: Duration = Duration::from_secs(4);

/// Run `attempt` until it is done or [`MAX_ATTEMPTS`] have been made, sleeping between
/// attempts (300 ms, 600 ms, 1.2 s, each with up to 50 % jitter, at most 4 s or the server's
/// own delay when shorter than that cap). The last retryable error is returned when every
/// attempt was throttled.
pub fn with_backoff<T, E>(mut attempt: impl FnMut(u32) -> Attempt<T, E>) -> Result<T, E> {
    let mut n = 0;
    loop {
        match attempt(n) {
            Attempt::Done(result) => return result,
            Attempt::Retry(error, server_delay) => {
                n += 1;
                if n >= MAX_ATTEMPTS {
                    return Err(error);
                }
                let exponential = BASE.saturating_mul(1 << (n - 1).min(8));
                let jitter = exponential.mul_f64(jitter_fraction() * 0.5);
                let delay = server_delay.unwrap_or(exponential + jitter).min(CAP);
                crate::sleep(delay);
            }
        }
    }
}

/// A fraction in `[0, 1)` from the host's random source.
fn jitter_fraction() -> f64 {
    let bits = wasip2::random::random::get_random_u64() >> 11;
    bits as f64 / (1u64 << 53) as f64
}
