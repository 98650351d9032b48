//! How many job requests of one runner may be in flight: `request_concurrency`, or with
//! `FF_USE_ADAPTIVE_REQUEST_CONCURRENCY` (on by default in gitlab-runner 19) an adaptive limit
//! between 1 and it, as gitlab-runner's AIMD: a job received grows it by 10 %, an empty answer
//! shrinks it by 5 %, an answer GitLab was struggling to give (a failed request) halves it.
//!
//! Owns the counter and the limit; must not make requests or sleep (the pollers do).

use std::sync::Mutex;

/// The limits in force after a request was admitted or refused, for metrics.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RequestLimits {
    /// Requests in flight now.
    pub in_flight: usize,
    /// The adaptive limit (the configured one when not adaptive).
    pub adaptive: f64,
    /// The limit used: the adaptive one rounded up, between 1 and `request_concurrency`.
    pub used: usize,
}

/// What a job request's answer says about GitLab's load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A job was handed out.
    Job,
    /// Nothing to do.
    Empty,
    /// GitLab failed or was overloaded.
    Failed,
}

/// One runner's gate.
#[derive(Debug)]
pub struct RequestGate {
    hard: usize,
    adaptive: bool,
    state: Mutex<(usize, f64)>,
}

impl RequestGate {
    /// At most `request_concurrency` requests (≥ 1), adaptively below that when `adaptive`.
    pub fn new(request_concurrency: usize, adaptive: bool) -> Self {
        let hard = request_concurrency.max(1);
        // gitlab-runner starts its adaptive limit at 0, which the bounds make 1.
        let start = if adaptive { 1.0 } else { hard as f64 };
        RequestGate { hard, adaptive, state: Mutex::new((0, start)) }
    }

    /// The configured `request_concurrency`.
    pub fn hard_limit(&self) -> usize {
        self.hard
    }

    fn used(&self, adaptive: f64) -> usize {
        if self.adaptive {
            (adaptive.ceil() as usize).clamp(1, self.hard)
        } else {
            self.hard
        }
    }

    /// Admit one more request (`Ok`) or refuse it because the limit is reached (`Err`).
    pub fn acquire(&self) -> Result<RequestLimits, RequestLimits> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let used = self.used(state.1);
        if state.0 >= used {
            return Err(RequestLimits { in_flight: state.0, adaptive: state.1, used });
        }
        state.0 += 1;
        Ok(RequestLimits { in_flight: state.0, adaptive: state.1, used })
    }

    /// A request admitted by [`RequestGate::acquire`] ended with `answer`.
    pub fn release(&self, answer: Answer) -> RequestLimits {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if self.adaptive {
            let factor = match answer {
                Answer::Failed => 0.5,
                Answer::Job => 1.1,
                Answer::Empty => 0.95,
            };
            state.1 = (state.1 * factor).clamp(1.0, self.hard as f64);
        }
        state.0 = state.0.saturating_sub(1);
        RequestLimits { in_flight: state.0, adaptive: state.1, used: self.used(state.1) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fixed_admits_request_concurrency() {
        let gate = RequestGate::new(2, false);
        assert!(gate.acquire().is_ok() && gate.acquire().is_ok());
        assert_eq!(gate.acquire().map_err(|l| l.used), Err(2));
        gate.release(Answer::Empty);
        assert!(gate.acquire().is_ok(), "an empty answer changes nothing without the flag");
    }

    #[test]
    fn adaptive_grows_on_jobs_shrinks_on_empty_and_halves_on_failure() {
        let gate = RequestGate::new(4, true);
        assert!(gate.acquire().is_ok());
        assert!(gate.acquire().is_err(), "starts at 1");
        let mut limits = gate.release(Answer::Job);
        assert_eq!((limits.used, limits.in_flight), (2, 0), "1.1 rounds up to 2");
        for _ in 0..20 {
            assert!(gate.acquire().is_ok());
            limits = gate.release(Answer::Job);
        }
        assert_eq!(limits.used, 4, "capped at request_concurrency");
        assert!((limits.adaptive - 4.0).abs() < f64::EPSILON);
        assert!(gate.acquire().is_ok());
        limits = gate.release(Answer::Failed);
        assert_eq!(limits.used, 2, "halved");
        assert!(gate.acquire().is_ok());
        limits = gate.release(Answer::Empty);
        assert_eq!(limits.used, 2, "1.9 rounds up to 2");
        for _ in 0..30 {
            assert!(gate.acquire().is_ok());
            limits = gate.release(Answer::Empty);
        }
        assert_eq!(limits.used, 1, "never below 1");
    }
}
