//! `concurrent` as a capacity that a config reload resizes: the one semaphore every manager
//! generation shares (a retiring manager's running jobs and the new manager's pollers together
//! respect it), grown at once and shrunk as running jobs hand their permits back. Owns only the
//! permit count; it must not know about runners, jobs or config.

use std::sync::Arc;

use tokio::sync::{watch, Semaphore};

/// The global job capacity (`concurrent`, at least 1).
pub struct Capacity {
    semaphore: Arc<Semaphore>,
    target: watch::Sender<usize>,
}

impl Capacity {
    /// A capacity of `concurrent` (at least 1). Needs a tokio runtime: a task applies resizes.
    pub fn new(concurrent: usize) -> Self {
        let concurrent = concurrent.max(1);
        let semaphore = Arc::new(Semaphore::new(concurrent));
        let (target, changes) = watch::channel(concurrent);
        tokio::spawn(resize(semaphore.clone(), concurrent, changes));
        Capacity { semaphore, target }
    }

    /// The semaphore the managers take a permit of per job request and job.
    pub fn semaphore(&self) -> Arc<Semaphore> {
        self.semaphore.clone()
    }

    /// Resize to `concurrent` (at least 1): more permits at once; fewer as held ones come back
    /// (running jobs are never interrupted).
    pub fn set(&self, concurrent: usize) {
        self.target.send_replace(concurrent.max(1));
    }
}

/// Keep the semaphore's permits (available and held) at the latest target; ends when the
/// [`Capacity`] is dropped.
async fn resize(semaphore: Arc<Semaphore>, mut total: usize, mut target: watch::Receiver<usize>) {
    loop {
        let want = *target.borrow_and_update();
        if want > total {
            semaphore.add_permits(want - total);
            total = want;
            continue;
        }
        if want < total {
            total -= semaphore.forget_permits(total - want);
            if total == want {
                continue;
            }
            // The rest comes back as jobs end (the semaphore is fair: queued requests first).
            tokio::select! {
                permit = semaphore.acquire() => match permit {
                    Ok(permit) => {
                        permit.forget();
                        total -= 1;
                    }
                    Err(_) => return,
                },
                changed = target.changed() => if changed.is_err() { return },
            }
            continue;
        }
        if target.changed().await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    async fn until_available(semaphore: &Semaphore, n: usize) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while semaphore.available_permits() != n {
            assert!(tokio::time::Instant::now() < deadline, "{} permits, not {n}", semaphore.available_permits());
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn grows_at_once_and_shrinks_as_held_permits_return() {
        let capacity = Capacity::new(2);
        let semaphore = capacity.semaphore();
        let held = semaphore.clone().acquire_many_owned(2).await.unwrap();
        capacity.set(1);
        // Nothing running is taken away: both permits stay held.
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(semaphore.available_permits(), 0);
        drop(held);
        until_available(&semaphore, 1).await;
        capacity.set(4);
        until_available(&semaphore, 4).await;
        // A shrink still waiting is overtaken by a grow: the latest value wins.
        let held = semaphore.clone().acquire_many_owned(4).await.unwrap();
        capacity.set(1);
        tokio::time::sleep(Duration::from_millis(20)).await;
        capacity.set(3);
        drop(held);
        until_available(&semaphore, 3).await;
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert_eq!(semaphore.available_permits(), 3);
        capacity.set(0);
        until_available(&semaphore, 1).await;
    }
}
