//! Acquisitions restored from a snapshot that a job may still hold: a manager killed while
//! jobs ran on its instances comes back with their keys in its snapshot, and the jobs
//! themselves in its job store. Held ([`Taskscaler::hold_restored`]), those keys keep their
//! slots acquired across the restart — the instance is neither handed out nor removed — until
//! the resumed job takes its key back ([`Taskscaler::reattach`]) or the manager finds that no
//! stored job wants it any more ([`Taskscaler::abandon_restored`]), which releases it as an
//! abandoned acquisition always was. Keys are renamed to their job's
//! ([`Taskscaler::rekey`]) when the job is known, so a snapshot names the jobs it holds.
//!
//! Owns: the set of held restored keys and their lifecycle. Must not touch: which job a key
//! belongs to or whether it is stored (the manager's), scaling, the provider.

use std::collections::BTreeMap;

use super::{Acquisition, EngineEvent, KeyState, RemovalReason, Taskscaler};

impl Taskscaler {
    /// Hold the acquisitions of the instances restored from the snapshot instead of
    /// abandoning them when the provider confirms the instance: each saved key takes its slot
    /// again (acquired, so it is neither idle nor removable) until [`Taskscaler::reattach`] or
    /// [`Taskscaler::abandon_restored`]. Call right after `restore`.
    pub fn hold_restored(&mut self) {
        let (keys, restored) = (&mut self.keys, &mut self.restored);
        self.instances.for_each_mut(|id, inst| {
            let Some(saved) = inst.awaiting_adoption.as_mut() else { return };
            let saved = std::mem::take(saved);
            for key in saved {
                let Some(slot) = inst.slots.iter().position(Option::is_none) else {
                    // More keys than slots (capacity_per_instance lowered meanwhile): the rest
                    // cannot be held; they count as abandoned uses.
                    inst.use_count += 1;
                    continue;
                };
                inst.slots[slot] = Some(key.clone());
                let acquisition = Acquisition { instance: id.clone(), slot: slot as u32 };
                keys.insert(key.clone(), KeyState::Acquired(acquisition));
                restored.insert(key);
            }
        });
        self.dirty = true;
    }

    /// Restored keys not yet reattached or abandoned.
    pub fn restored_keys(&self) -> Vec<String> {
        self.restored.iter().filter(|k| self.keys.contains_key(k)).cloned().collect()
    }

    /// The resumed job of `key` takes its restored acquisition back: from now on it is an
    /// ordinary acquisition, freed by `release`. `None` when the key was not held (not in the
    /// snapshot, its instance lost meanwhile, or already abandoned).
    pub fn reattach(&mut self, key: &str) -> Option<Acquisition> {
        if !self.restored.remove(key) {
            return None;
        }
        match self.keys.get(key) {
            Some(KeyState::Acquired(a)) => Some(a.clone()),
            _ => None,
        }
    }

    /// Release the held restored keys `keep` rejects (their job is in no store any more),
    /// as abandoned acquisitions: [`EngineEvent::AcquisitionsAbandoned`], and the instance
    /// removed unless `keep_instance_with_acquisitions` (then each counts as a use). Returns
    /// how many were released.
    pub fn abandon_restored(&mut self, keep: &dyn Fn(&str) -> bool) -> usize {
        let abandoned: Vec<String> = self.restored.iter().filter(|k| !keep(k)).cloned().collect();
        let mut released = 0;
        let mut by_instance: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for key in abandoned {
            self.restored.remove(&key);
            if let Some(KeyState::Acquired(a)) = self.keys.remove(&key) {
                if let Some(mut inst) = self.instances.get_mut(&a.instance) {
                    if let Some(slot) = inst.slots.get_mut(a.slot as usize) {
                        *slot = None;
                    }
                }
                by_instance.entry(a.instance).or_default().push(key);
                released += 1;
            }
        }
        let keep_instance = self.cfg.raw.keep_instance_with_acquisitions;
        for (id, keys) in by_instance {
            let Some(mut inst) = self.instances.get_mut(&id) else { continue };
            if keep_instance {
                inst.use_count += keys.len() as u32;
            }
            drop(inst);
            self.events.push(EngineEvent::AcquisitionsAbandoned { instance: id.clone(), keys });
            if !keep_instance {
                self.mark_for_removal(&id, RemovalReason::AbandonedAcquisitions);
            }
        }
        self.dirty = true;
        released
    }

    /// Rename the key of a reservation or acquisition (to its job's, once the job is known).
    /// `false` when `old` is unknown or `new` is taken.
    pub fn rekey(&mut self, old: &str, new: &str) -> bool {
        if old == new {
            return self.keys.contains_key(old);
        }
        if self.keys.contains_key(new) {
            return false;
        }
        let Some(state) = self.keys.remove(old) else { return false };
        if let KeyState::Acquired(a) = &state {
            if let Some(mut inst) = self.instances.get_mut(&a.instance) {
                if let Some(slot) = inst.slots.get_mut(a.slot as usize) {
                    *slot = Some(new.to_string());
                }
            }
        }
        for pending in self.pending_order.iter_mut().filter(|k| *k == old) {
            *pending = new.to_string();
        }
        if let Some(failure) = self.failed_keys.remove(old) {
            self.failed_keys.insert(new.to_string(), failure);
        }
        self.keys.insert(new.to_string(), state);
        self.dirty = true;
        true
    }
}
