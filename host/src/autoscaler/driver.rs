//! The production driver around [`Taskscaler`]: one shared engine per `[[runners]]` entry,
//! used by job workers (`reserve`, `acquire().await`, `release`) and stepped by a background
//! [`Autoscaler::run`] loop that sleeps on the [`Clock`] until the engine's next wakeup or
//! until something changes. Ready checks run concurrently through a [`ReadyCommand`]; every
//! other engine event (lost instances, timeouts, removals) is forwarded on a channel for the
//! job and metrics modules. Provider calls are made from `tick` while the engine lock is held,
//! so an [`InstanceGroup`] implementation should return promptly (plugin calls have a deadline).

use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::{mpsc, Notify};
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::engine::{
    AcquireError, AcquireStatus, Acquisition, EngineEvent, EngineMetrics, EngineSnapshot, NotReady, ReleaseError,
    ReserveError, Taskscaler,
};
use super::provider::InstanceGroup;
use super::settings::{AutoscalerSettings, SettingsError};

/// Runs `instance_ready_command` on a new instance (over the connector, in production).
#[async_trait::async_trait]
pub trait ReadyCommand: Send + Sync {
    /// `Ok` when the instance is usable; `Err` with the reason otherwise.
    async fn run(&self, instance: &str) -> Result<(), NotReady>;
}

struct Inner {
    engine: Taskscaler,
    provider: Box<dyn InstanceGroup>,
}

/// A shared, clock-driven taskscaler.
pub struct Autoscaler {
    inner: Mutex<Inner>,
    clock: Arc<dyn Clock>,
    changed: Notify,
    progressed: Notify,
}

impl Autoscaler {
    /// A new autoscaler over `provider`.
    pub fn new(
        settings: &AutoscalerSettings,
        provider: Box<dyn InstanceGroup>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, SettingsError> {
        let engine = Taskscaler::new(settings, clock.now())?;
        Ok(Self::wrap(engine, provider, clock))
    }

    /// An autoscaler that adopts the instances of a saved snapshot.
    pub fn restore(
        settings: &AutoscalerSettings,
        snapshot: &EngineSnapshot,
        provider: Box<dyn InstanceGroup>,
        clock: Arc<dyn Clock>,
    ) -> Result<Arc<Self>, SettingsError> {
        let engine = Taskscaler::restore(settings, snapshot, clock.now())?;
        Ok(Self::wrap(engine, provider, clock))
    }

    fn wrap(engine: Taskscaler, provider: Box<dyn InstanceGroup>, clock: Arc<dyn Clock>) -> Arc<Self> {
        Arc::new(Autoscaler {
            inner: Mutex::new(Inner { engine, provider }),
            clock,
            changed: Notify::new(),
            progressed: Notify::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Claim capacity before asking GitLab for a job.
    pub fn reserve(&self, key: &str) -> Result<(), ReserveError> {
        let result = self.lock().engine.reserve(key, self.clock.now());
        self.changed.notify_one();
        result
    }

    /// GitLab had no job for this reservation.
    pub fn unreserve(&self, key: &str) -> bool {
        let result = self.lock().engine.unreserve(key);
        self.changed.notify_one();
        result
    }

    /// Wait for a slot (bounded by `instance_acquire_timeout`, measured on the clock).
    pub async fn acquire(&self, key: &str) -> Result<Acquisition, AcquireError> {
        let mut first = true;
        loop {
            let progressed = self.progressed.notified();
            tokio::pin!(progressed);
            progressed.as_mut().enable();
            let status = {
                let mut inner = self.lock();
                if first {
                    first = false;
                    inner.engine.acquire(key, self.clock.now())
                } else {
                    inner.engine.poll_acquire(key)
                }
            };
            match status? {
                AcquireStatus::Ready(acquisition) => return Ok(acquisition),
                AcquireStatus::Waiting { .. } => {
                    self.changed.notify_one();
                    progressed.await;
                }
            }
        }
    }

    /// The job finished: free its slot.
    pub fn release(&self, key: &str) -> Result<(), ReleaseError> {
        let result = self.lock().engine.release(key, self.clock.now());
        self.changed.notify_one();
        result
    }

    /// An instance failed its probes after a job lost its connection: replace it.
    pub fn instance_unhealthy(&self, instance: &str) {
        self.lock().engine.instance_unhealthy(instance);
        self.changed.notify_one();
    }

    /// The provider's last error while its `update()` keeps failing.
    pub fn provider_error(&self) -> Option<String> {
        self.lock().engine.provider_error().map(str::to_string)
    }

    /// Gauges and counters.
    pub fn metrics(&self) -> EngineMetrics {
        self.lock().engine.metrics()
    }

    /// The predictive policy's revision (changes when it learned something worth saving);
    /// `None` without the predictive policy.
    pub fn predictor_revision(&self) -> Option<u64> {
        self.lock().engine.predictor().map(|p| p.revision())
    }

    /// The instances with jobs still on them (never deleted on shutdown).
    pub fn busy_instances(&self) -> Vec<String> {
        self.lock()
            .engine
            .instance_summary()
            .into_iter()
            .filter(|(_, _, active)| *active > 0)
            .map(|(id, _, _)| id)
            .collect()
    }

    /// Hold the restored acquisitions for the jobs that may resume (see
    /// [`Taskscaler::hold_restored`]).
    pub fn hold_restored(&self) {
        self.lock().engine.hold_restored();
    }

    /// Restored keys still held for a job that has not resumed.
    pub fn restored_keys(&self) -> Vec<String> {
        self.lock().engine.restored_keys()
    }

    /// The resumed job of `key` takes its restored slot back.
    pub fn reattach(&self, key: &str) -> Option<Acquisition> {
        let result = self.lock().engine.reattach(key);
        self.changed.notify_one();
        result
    }

    /// Release the held restored keys `keep` rejects, as abandoned acquisitions; how many.
    pub fn abandon_restored(&self, keep: &dyn Fn(&str) -> bool) -> usize {
        let released = self.lock().engine.abandon_restored(keep);
        self.changed.notify_one();
        released
    }

    /// Rename a key (to its job's); `false` when `old` is unknown or `new` taken.
    pub fn rekey(&self, old: &str, new: &str) -> bool {
        let result = self.lock().engine.rekey(old, new);
        self.changed.notify_one();
        result
    }

    /// State to persist (`state_storage`).
    pub fn snapshot(&self) -> EngineSnapshot {
        self.lock().engine.snapshot(self.clock.now())
    }

    /// Step the engine until `cancel` fires, then shut down (removing idle instances when
    /// `delete_instances_on_shutdown` is set). Events other than ready checks go to `events`.
    pub async fn run(
        self: Arc<Self>,
        ready: Arc<dyn ReadyCommand>,
        events: mpsc::UnboundedSender<EngineEvent>,
        cancel: CancellationToken,
    ) {
        loop {
            let (wake, batch) = blocking(|| {
                let mut inner = self.lock();
                let now = self.clock.now();
                let Inner { engine, provider } = &mut *inner;
                engine.tick(now, provider.as_mut());
                (engine.next_wakeup(), engine.take_events())
            });
            for event in batch {
                match event {
                    EngineEvent::ReadyCheckRequested { instance } => {
                        let this = self.clone();
                        let ready = ready.clone();
                        tokio::spawn(async move {
                            let result = ready.run(&instance).await;
                            this.lock().engine.ready_check_finished(&instance, result, this.clock.now());
                            this.changed.notify_one();
                        });
                    }
                    other => {
                        let _ = events.send(other);
                    }
                }
            }
            self.progressed.notify_waiters();
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = self.clock.sleep_until(wake) => {}
                _ = self.changed.notified() => {}
            }
        }
        let batch = blocking(|| {
            let mut inner = self.lock();
            let now = self.clock.now();
            let Inner { engine, provider } = &mut *inner;
            engine.shutdown(now, provider.as_mut());
            engine.take_events()
        });
        for event in batch {
            let _ = events.send(event);
        }
        self.progressed.notify_waiters();
    }
}

/// Provider calls may block (a plugin answering from its own thread): on a multi-threaded
/// runtime, let the other tasks move off this worker meanwhile.
fn blocking<R>(step: impl FnOnce() -> R) -> R {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(step),
        _ => step(),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::autoscaler::clock::{Moment, VirtualClock};
    use crate::autoscaler::provider::{DelayDistribution, SimProvider, SimProviderSettings};
    use crate::autoscaler::settings::IdlePolicy;

    struct AlwaysReady;

    #[async_trait::async_trait]
    impl ReadyCommand for AlwaysReady {
        async fn run(&self, _instance: &str) -> Result<(), super::NotReady> {
            Ok(())
        }
    }

    fn setup(provision_s: f64, acquire_timeout: Duration) -> (Arc<VirtualClock>, Arc<Autoscaler>, CancellationToken) {
        let clock = Arc::new(VirtualClock::new(Moment(1_767_571_200_000)));
        let provider = SimProvider::new(
            SimProviderSettings {
                provisioning: DelayDistribution::Fixed { seconds: provision_s, jitter_s: 0.0 },
                timeout_rate: 0.0,
                ready_failure_rate: 0.0,
                ..Default::default()
            },
            clock.clone(),
        );
        let settings = AutoscalerSettings {
            policies: vec![IdlePolicy {
                timezone: Some("UTC".into()),
                idle_time: Duration::from_secs(60),
                ..Default::default()
            }],
            instance_ready_command: Some("true".into()),
            instance_acquire_timeout: acquire_timeout,
            ..Default::default()
        };
        let scaler = Autoscaler::new(&settings, Box::new(provider), clock.clone()).expect("valid");
        let cancel = CancellationToken::new();
        let (events, _rx) = mpsc::unbounded_channel();
        tokio::spawn(scaler.clone().run(Arc::new(AlwaysReady), events, cancel.clone()));
        (clock, scaler, cancel)
    }

    /// Advance virtual time a second at a time until `task` finishes (at most `limit` seconds).
    async fn drive<T>(clock: &VirtualClock, task: &tokio::task::JoinHandle<T>, limit: u32) {
        for _ in 0..limit {
            if task.is_finished() {
                return;
            }
            clock.advance(Duration::from_secs(1));
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
    }

    #[tokio::test]
    async fn acquire_waits_for_a_new_instance_on_the_virtual_clock() {
        let (clock, scaler, cancel) = setup(30.0, Duration::from_secs(900));
        scaler.reserve("job").expect("non-preemptive reserve");
        let waiter = {
            let scaler = scaler.clone();
            tokio::spawn(async move { scaler.acquire("job").await })
        };
        drive(&clock, &waiter, 300).await;
        let acquisition = waiter.await.expect("task").expect("acquired");
        assert_eq!(acquisition.slot, 0);
        assert_eq!(scaler.metrics().slots_acquired, 1);
        scaler.release("job").expect("release");
        assert_eq!(scaler.metrics().slots_acquired, 0);
        cancel.cancel();
    }

    #[tokio::test]
    async fn acquire_times_out_on_the_virtual_clock() {
        let (clock, scaler, cancel) = setup(3600.0, Duration::from_secs(30));
        scaler.reserve("job").expect("reserve");
        let waiter = {
            let scaler = scaler.clone();
            tokio::spawn(async move { scaler.acquire("job").await })
        };
        drive(&clock, &waiter, 120).await;
        let result = waiter.await.expect("task");
        assert_eq!(result, Err(AcquireError::TimedOut(Duration::from_secs(30))));
        cancel.cancel();
    }
}
