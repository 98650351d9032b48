//! A token bucket: at most `burst` actions at once, refilled at `rate` per second. The engine's
//! scale throttle (`[runners.autoscaler.scale_throttle]`, instance requests) and the simulated
//! cloud's launch rate limit (`create_rate_per_s`) are both one.
//!
//! Owns the arithmetic only: must not read a clock (callers pass the time) or decide what a
//! refused action does.

use std::time::Duration;

use super::clock::Moment;

/// Tokens for `rate` actions per second, at most `burst` at once.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenBucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: Moment,
}

impl TokenBucket {
    /// A full bucket at `now`.
    pub fn full(rate: f64, burst: u32, now: Moment) -> Self {
        TokenBucket { rate, burst: f64::from(burst), tokens: f64::from(burst), at: now }
    }

    /// Add what accrued since the last refill, up to `burst`; the bucket is counted at `now`.
    pub fn refill(&mut self, now: Moment) {
        let elapsed = now.since(self.at).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.rate).min(self.burst);
        self.at = now;
    }

    /// Whole tokens there are (actions allowed now).
    pub fn available(&self) -> u32 {
        self.tokens.floor().max(0.0) as u32
    }

    /// Spend `n` tokens.
    pub fn take(&mut self, n: u32) {
        self.tokens -= f64::from(n);
    }

    /// How long after the last refill the next whole token is there; `None` while one is.
    pub fn wait_for_token(&self) -> Option<Duration> {
        (self.tokens < 1.0).then(|| Duration::from_secs_f64((1.0 - self.tokens) / self.rate))
    }

    /// When the bucket was last counted.
    pub fn counted_at(&self) -> Moment {
        self.at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bucket_lets_a_burst_through_then_refills_at_its_rate() {
        let mut b = TokenBucket::full(2.0, 3, Moment(0));
        assert_eq!(b.available(), 3);
        assert_eq!(b.wait_for_token(), None);
        b.take(3);
        assert_eq!(b.available(), 0);
        assert_eq!(b.wait_for_token(), Some(Duration::from_millis(500)));
        b.refill(Moment(250));
        assert_eq!(b.available(), 0);
        assert_eq!(b.wait_for_token(), Some(Duration::from_millis(250)));
        b.refill(Moment(1250));
        assert_eq!(b.available(), 2);
        b.refill(Moment(60_000));
        assert_eq!(b.available(), 3, "never more than the burst");
        assert_eq!(b.counted_at(), Moment(60_000));
    }
}
