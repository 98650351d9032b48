//! The engine's table of job keys (reserved, pending, acquired) with running counts of
//! reserved and pending keys, so a census does not walk every key.
//!
//! Owns only the map and its counts: every insert and removal goes through here, so the
//! counts cannot drift from the map. Must not touch instances or decide anything.

use std::collections::HashMap;

use super::KeyState;

/// Job keys and their states, with counts by state.
#[derive(Debug, Default)]
pub(super) struct Keys {
    map: HashMap<String, KeyState>,
    reserved: u32,
    pending: u32,
}

impl Keys {
    fn count(&mut self, state: &KeyState, delta: i32) {
        let counter = match state {
            KeyState::Reserved => &mut self.reserved,
            KeyState::Pending { .. } => &mut self.pending,
            KeyState::Acquired(_) => return,
        };
        *counter = counter.saturating_add_signed(delta);
    }

    /// The state of `key`.
    pub(super) fn get(&self, key: &str) -> Option<&KeyState> {
        self.map.get(key)
    }

    /// Whether `key` is known.
    pub(super) fn contains_key(&self, key: &str) -> bool {
        self.map.contains_key(key)
    }

    /// Set the state of `key`; returns the previous one.
    pub(super) fn insert(&mut self, key: String, state: KeyState) -> Option<KeyState> {
        self.count(&state, 1);
        let old = self.map.insert(key, state);
        if let Some(old) = &old {
            self.count(old, -1);
        }
        old
    }

    /// Forget `key`; returns its state.
    pub(super) fn remove(&mut self, key: &str) -> Option<KeyState> {
        let old = self.map.remove(key);
        if let Some(old) = &old {
            self.count(old, -1);
        }
        old
    }

    /// Keys reserved (a job request in flight).
    pub(super) fn reserved(&self) -> u32 {
        debug_assert_eq!(self.reserved as usize, self.map.values().filter(|s| matches!(s, KeyState::Reserved)).count());
        self.reserved
    }

    /// Keys waiting for a slot.
    pub(super) fn pending(&self) -> u32 {
        debug_assert_eq!(
            self.pending as usize,
            self.map.values().filter(|s| matches!(s, KeyState::Pending { .. })).count()
        );
        self.pending
    }
}
