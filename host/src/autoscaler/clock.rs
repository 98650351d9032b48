//! Time for the autoscaler: the [`Moment`] type every engine decision is made at, and the
//! [`Clock`] trait with a real clock (production) and a virtual clock (tests and
//! `runway simulate`). The engine never reads the system time itself: callers pass `now`
//! into every call, and drivers sleep through [`Clock::sleep_until`], so the same engine code
//! runs millions of virtual seconds per real second in the simulator.

use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chrono::{DateTime, TimeZone, Utc};
use serde::{Deserialize, Serialize};

/// A point in time: milliseconds since the Unix epoch. Monotonic within one clock.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct Moment(pub u64);

impl Moment {
    /// The moment `ms` milliseconds after the Unix epoch.
    pub fn from_millis(ms: u64) -> Self {
        Moment(ms)
    }

    /// The moment of a wall-clock date and time.
    pub fn from_datetime(at: DateTime<Utc>) -> Self {
        Moment(u64::try_from(at.timestamp_millis()).unwrap_or(0))
    }

    /// Milliseconds since the Unix epoch.
    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// This moment as a UTC date and time (for cron periods and logs).
    pub fn to_datetime(self) -> DateTime<Utc> {
        let ms = i64::try_from(self.0).unwrap_or(i64::MAX);
        Utc.timestamp_millis_opt(ms).single().unwrap_or(DateTime::<Utc>::MAX_UTC)
    }

    /// `self + d`, saturating.
    pub fn plus(self, d: Duration) -> Moment {
        Moment(self.0.saturating_add(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    /// `self - d`, saturating at the epoch.
    pub fn minus(self, d: Duration) -> Moment {
        Moment(self.0.saturating_sub(u64::try_from(d.as_millis()).unwrap_or(u64::MAX)))
    }

    /// Time from `earlier` to `self` (zero when `earlier` is later).
    pub fn since(self, earlier: Moment) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// A boxed future returned by [`Clock::sleep_until`].
pub type Sleep<'a> = Pin<Box<dyn Future<Output = ()> + Send + 'a>>;

/// The source of time for the autoscaler and its drivers.
pub trait Clock: Send + Sync {
    /// The current moment.
    fn now(&self) -> Moment;
    /// A future that completes once [`Clock::now`] has reached `deadline`.
    fn sleep_until(&self, deadline: Moment) -> Sleep<'_>;
}

/// The production clock: wall-clock anchored at creation, advanced by the monotonic clock so
/// it never goes backwards when the system time is adjusted.
#[derive(Debug)]
pub struct RealClock {
    origin_wall_ms: u64,
    origin: std::time::Instant,
    origin_tokio: tokio::time::Instant,
}

impl RealClock {
    /// A clock reading the current system time.
    pub fn new() -> Self {
        let origin_wall_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        RealClock { origin_wall_ms, origin: std::time::Instant::now(), origin_tokio: tokio::time::Instant::now() }
    }
}

impl Default for RealClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for RealClock {
    fn now(&self) -> Moment {
        let elapsed = u64::try_from(self.origin.elapsed().as_millis()).unwrap_or(u64::MAX);
        Moment(self.origin_wall_ms.saturating_add(elapsed))
    }

    fn sleep_until(&self, deadline: Moment) -> Sleep<'_> {
        let offset = Duration::from_millis(deadline.0.saturating_sub(self.origin_wall_ms));
        let target = self.origin_tokio + offset;
        Box::pin(tokio::time::sleep_until(target))
    }
}

/// A clock that only moves when told to: [`VirtualClock::advance`], [`VirtualClock::set`].
/// Sleepers wake as soon as the virtual time passes their deadline.
#[derive(Debug)]
pub struct VirtualClock {
    now: Mutex<Moment>,
    changed: tokio::sync::watch::Sender<Moment>,
}

impl VirtualClock {
    /// A virtual clock standing at `start`.
    pub fn new(start: Moment) -> Self {
        let (changed, _) = tokio::sync::watch::channel(start);
        VirtualClock { now: Mutex::new(start), changed }
    }

    /// Move the clock forward by `d`.
    pub fn advance(&self, d: Duration) -> Moment {
        let next = self.now().plus(d);
        self.set(next)
    }

    /// Jump to `at` (the next event's time). Moving backwards is ignored: time is monotonic.
    pub fn set(&self, at: Moment) -> Moment {
        let mut now = self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if at > *now {
            *now = at;
            self.changed.send_replace(at);
        }
        *now
    }
}

impl Clock for VirtualClock {
    fn now(&self) -> Moment {
        *self.now.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn sleep_until(&self, deadline: Moment) -> Sleep<'_> {
        let mut changes = self.changed.subscribe();
        Box::pin(async move {
            // `wait_for` checks the current value first, then every change.
            let _ = changes.wait_for(|now| *now >= deadline).await;
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn virtual_clock_moves_only_forward() {
        let clock = VirtualClock::new(Moment(1_000));
        assert_eq!(clock.advance(Duration::from_secs(2)), Moment(3_000));
        assert_eq!(clock.set(Moment(2_000)), Moment(3_000));
        assert_eq!(clock.now(), Moment(3_000));
    }

    #[tokio::test]
    async fn virtual_sleep_wakes_when_time_passes_deadline() {
        let clock = std::sync::Arc::new(VirtualClock::new(Moment(0)));
        let sleeper = {
            let clock = clock.clone();
            tokio::spawn(async move { clock.sleep_until(Moment(5_000)).await })
        };
        clock.advance(Duration::from_secs(4));
        tokio::task::yield_now().await;
        assert!(!sleeper.is_finished(), "woke before the deadline");
        clock.advance(Duration::from_secs(1));
        sleeper.await.expect("sleeper task");
    }

    #[test]
    fn moments_convert_to_wall_time() {
        let at = Utc.with_ymd_and_hms(2026, 1, 5, 4, 0, 0).single().expect("valid date");
        assert_eq!(Moment::from_datetime(at).to_datetime(), at);
    }
}
