//! `CI_CONCURRENT_ID` / `CI_CONCURRENT_PROJECT_ID`: each new build gets the lowest integer
//! not used by another running build of the same runner (and, for the project ID, of the
//! same runner and project) — protocol reference §4.2.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

/// Slot indices of one runner.
#[derive(Default)]
pub struct SlotAllocator {
    state: Mutex<SlotState>,
}

#[derive(Default)]
struct SlotState {
    runner: BTreeSet<u32>,
    project: BTreeMap<i64, BTreeSet<u32>>,
}

fn lowest_free(used: &BTreeSet<u32>) -> u32 {
    (0..).find(|i| !used.contains(i)).unwrap_or(0)
}

/// A held pair of slot indices; released on drop.
pub struct Slot {
    allocator: Arc<SlotAllocator>,
    project_id: i64,
    /// `CI_CONCURRENT_ID`: the slot among all the runner's jobs.
    pub concurrent_id: u32,
    /// `CI_CONCURRENT_PROJECT_ID`: the slot among the project's jobs.
    pub concurrent_project_id: u32,
}

impl SlotAllocator {
    /// Take the lowest free indices for a build of `project_id`.
    pub fn take(self: &Arc<Self>, project_id: i64) -> Slot {
        let mut state = match self.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        let concurrent_id = lowest_free(&state.runner);
        state.runner.insert(concurrent_id);
        let project = state.project.entry(project_id).or_default();
        let concurrent_project_id = lowest_free(project);
        project.insert(concurrent_project_id);
        Slot { allocator: self.clone(), project_id, concurrent_id, concurrent_project_id }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut state = match self.allocator.state.lock() {
            Ok(s) => s,
            Err(poisoned) => poisoned.into_inner(),
        };
        state.runner.remove(&self.concurrent_id);
        if let Some(project) = state.project.get_mut(&self.project_id) {
            project.remove(&self.concurrent_project_id);
            if project.is_empty() {
                state.project.remove(&self.project_id);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowest_free_indices_are_reused() {
        let slots = Arc::new(SlotAllocator::default());
        let a = slots.take(1);
        let b = slots.take(1);
        let c = slots.take(2);
        assert_eq!((a.concurrent_id, a.concurrent_project_id), (0, 0));
        assert_eq!((b.concurrent_id, b.concurrent_project_id), (1, 1));
        assert_eq!((c.concurrent_id, c.concurrent_project_id), (2, 0));
        drop(a);
        let d = slots.take(1);
        assert_eq!((d.concurrent_id, d.concurrent_project_id), (0, 0));
    }
}
