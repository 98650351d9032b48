//! The engine's table of instances with a running census of them (phases and slots by
//! state), so the census a job request or a tick needs does not walk every instance.
//!
//! Owns only the map and its tally: every change of an instance goes through [`Instances`]
//! (a mutable borrow is an [`InstanceMut`] that counts the instance again when it ends), so
//! the tally cannot drift from the map; debug builds check it against a full count on every
//! read. Must not touch keys or decide anything.

use std::collections::BTreeMap;
use std::ops::{Deref, DerefMut};

use super::scaling::Census;
use super::{Instance, Phase};

/// Instances by provider id, with their census.
#[derive(Debug)]
pub(super) struct Instances {
    map: BTreeMap<String, Instance>,
    tally: Census,
    capacity: u32,
    max_use: u32,
}

/// What one instance adds to the census.
fn contribution(inst: &Instance, capacity: u32, max_use: u32) -> Census {
    let mut c = Census::default();
    match inst.phase {
        Phase::Deleting { .. } => {
            c.deleting = 1;
            return c;
        }
        Phase::Creating => c.creating = 1,
        Phase::ReadyCheck => c.ready_checking = 1,
        Phase::Ready => c.ready = 1,
    }
    let active = inst.active();
    c.acquired = active;
    let usable = inst.usable_with(active, capacity, max_use);
    c.unavailable = capacity.saturating_sub(active).saturating_sub(usable);
    if inst.assignable() {
        if inst.heartbeat_failures > 0 {
            c.unhealthy = usable;
        } else {
            c.idle = usable;
        }
    }
    c
}

impl Census {
    fn add(&mut self, other: &Census, sign: i32) {
        let apply = |field: &mut u32, by: u32| {
            *field = if sign > 0 { field.saturating_add(by) } else { field.saturating_sub(by) };
        };
        apply(&mut self.creating, other.creating);
        apply(&mut self.ready_checking, other.ready_checking);
        apply(&mut self.ready, other.ready);
        apply(&mut self.deleting, other.deleting);
        apply(&mut self.idle, other.idle);
        apply(&mut self.acquired, other.acquired);
        apply(&mut self.unavailable, other.unavailable);
        apply(&mut self.unhealthy, other.unhealthy);
    }
}

impl Instances {
    /// An empty table for instances of `capacity` slots used at most `max_use` times (0: no limit).
    pub(super) fn new(capacity: u32, max_use: u32) -> Instances {
        Instances { map: BTreeMap::new(), tally: Census::default(), capacity, max_use }
    }

    /// The census of the instances (keys' counts left at 0).
    pub(super) fn census(&self) -> Census {
        debug_assert_eq!(self.tally, self.recount(), "the instances' tally drifted from the table");
        self.tally.clone()
    }

    fn recount(&self) -> Census {
        let mut c = Census::default();
        for inst in self.map.values() {
            c.add(&contribution(inst, self.capacity, self.max_use), 1);
        }
        c
    }

    pub(super) fn get(&self, id: &str) -> Option<&Instance> {
        self.map.get(id)
    }

    /// `id`'s instance to change; it is counted again when the borrow ends.
    pub(super) fn get_mut(&mut self, id: &str) -> Option<InstanceMut<'_>> {
        let (capacity, max_use) = (self.capacity, self.max_use);
        let inst = self.map.get_mut(id)?;
        let before = contribution(inst, capacity, max_use);
        Some(InstanceMut { inst, tally: &mut self.tally, before, capacity, max_use })
    }

    /// Add or replace `id`'s instance.
    pub(super) fn insert(&mut self, id: String, inst: Instance) {
        self.tally.add(&contribution(&inst, self.capacity, self.max_use), 1);
        if let Some(old) = self.map.insert(id, inst) {
            self.tally.add(&contribution(&old, self.capacity, self.max_use), -1);
        }
    }

    /// Take `id`'s instance out.
    pub(super) fn remove(&mut self, id: &str) -> Option<Instance> {
        let old = self.map.remove(id)?;
        self.tally.add(&contribution(&old, self.capacity, self.max_use), -1);
        Some(old)
    }

    pub(super) fn len(&self) -> usize {
        self.map.len()
    }

    pub(super) fn iter(&self) -> std::collections::btree_map::Iter<'_, String, Instance> {
        self.map.iter()
    }

    pub(super) fn keys(&self) -> std::collections::btree_map::Keys<'_, String, Instance> {
        self.map.keys()
    }

    pub(super) fn values(&self) -> std::collections::btree_map::Values<'_, String, Instance> {
        self.map.values()
    }

    /// Change every instance with `f` (each counted again after).
    pub(super) fn for_each_mut(&mut self, mut f: impl FnMut(&String, &mut Instance)) {
        for (id, inst) in self.map.iter_mut() {
            let before = contribution(inst, self.capacity, self.max_use);
            f(id, inst);
            self.tally.add(&before, -1);
            self.tally.add(&contribution(inst, self.capacity, self.max_use), 1);
        }
    }
}

impl<'a> IntoIterator for &'a Instances {
    type Item = (&'a String, &'a Instance);
    type IntoIter = std::collections::btree_map::Iter<'a, String, Instance>;

    fn into_iter(self) -> Self::IntoIter {
        self.map.iter()
    }
}

/// A borrowed instance that is counted again when dropped.
pub(super) struct InstanceMut<'a> {
    inst: &'a mut Instance,
    tally: &'a mut Census,
    before: Census,
    capacity: u32,
    max_use: u32,
}

impl Deref for InstanceMut<'_> {
    type Target = Instance;

    fn deref(&self) -> &Instance {
        self.inst
    }
}

impl DerefMut for InstanceMut<'_> {
    fn deref_mut(&mut self) -> &mut Instance {
        self.inst
    }
}

impl Drop for InstanceMut<'_> {
    fn drop(&mut self) {
        self.tally.add(&self.before, -1);
        self.tally.add(&contribution(self.inst, self.capacity, self.max_use), 1);
    }
}
