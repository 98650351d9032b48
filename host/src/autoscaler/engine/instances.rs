//! The engine's table of instances with a running census of them (phases and slots by
//! state) and an index of the instances a waiting job can be given, so neither the census a
//! job request or a tick needs nor the choice of a slot walks every instance.
//!
//! Owns only the map, its tally and its index: every change of an instance goes through
//! [`Instances`] (a mutable borrow is an [`InstanceMut`] that counts and indexes the instance
//! again when it ends), so neither can drift from the map; debug builds check both against a
//! full count on every read. Must not touch keys or decide anything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, Deref, DerefMut};

use super::scaling::Census;
use super::{Instance, Moment, Phase};

/// Instances by provider id, with their census and the index of assignable ones.
#[derive(Debug)]
pub(super) struct Instances {
    map: BTreeMap<String, Instance>,
    tally: Census,
    /// Healthy assignable instances with a usable slot, ordered so that the last is the one a
    /// waiting job gets: the busiest, then the one ready first, then the last id.
    assignable: BTreeSet<Rank>,
    capacity: u32,
    max_use: u32,
}

/// An instance's place in the index: (active slots, ready first, id).
type Rank = (u32, Reverse<Option<Moment>>, String);

/// Where `inst` stands in the index, when it can take a job.
fn rank(id: &str, inst: &Instance, capacity: u32, max_use: u32) -> Option<Rank> {
    if !inst.assignable() || inst.heartbeat_failures != 0 {
        return None;
    }
    let active = inst.active();
    (inst.usable_with(active, capacity, max_use) > 0).then(|| (active, Reverse(inst.ready_at), id.to_string()))
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
        Instances { map: BTreeMap::new(), tally: Census::default(), assignable: BTreeSet::new(), capacity, max_use }
    }

    /// The instance a waiting job gets: of the healthy ready instances with a usable slot, the
    /// busiest (packing, so others drain and go idle), then the one ready first, then the last
    /// in id order.
    pub(super) fn best_assignable(&self) -> Option<&String> {
        debug_assert_eq!(
            self.assignable,
            self.map.iter().filter_map(|(id, i)| rank(id, i, self.capacity, self.max_use)).collect::<BTreeSet<_>>(),
            "the index of assignable instances drifted from the table"
        );
        self.assignable.last().map(|(_, _, id)| id)
    }

    /// Count and index `inst` (`sign` 1) or take it out (-1).
    fn account(&mut self, id: &str, inst: &Instance, sign: i32) {
        self.tally.add(&contribution(inst, self.capacity, self.max_use), sign);
        if let Some(rank) = rank(id, inst, self.capacity, self.max_use) {
            if sign > 0 {
                self.assignable.insert(rank);
            } else {
                self.assignable.remove(&rank);
            }
        }
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

    /// `id`'s instance to change; it is counted and indexed again when the borrow ends.
    pub(super) fn get_mut(&mut self, id: &str) -> Option<InstanceMut<'_>> {
        let (capacity, max_use) = (self.capacity, self.max_use);
        let (key, inst) = self.map.range_mut::<str, _>((Bound::Included(id), Bound::Included(id))).next()?;
        let before = contribution(inst, capacity, max_use);
        let before_rank = rank(key, inst, capacity, max_use);
        Some(InstanceMut {
            id: key,
            inst,
            tally: &mut self.tally,
            assignable: &mut self.assignable,
            before,
            before_rank,
            capacity,
            max_use,
        })
    }

    /// Add or replace `id`'s instance.
    pub(super) fn insert(&mut self, id: String, inst: Instance) {
        self.account(&id, &inst, 1);
        if let Some(old) = self.map.insert(id.clone(), inst) {
            self.account(&id, &old, -1);
        }
    }

    /// Take `id`'s instance out.
    pub(super) fn remove(&mut self, id: &str) -> Option<Instance> {
        let old = self.map.remove(id)?;
        self.account(id, &old, -1);
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

    /// Change every instance with `f` (each counted and indexed again after).
    pub(super) fn for_each_mut(&mut self, mut f: impl FnMut(&String, &mut Instance)) {
        let ids: Vec<String> = self.map.keys().cloned().collect();
        for id in ids {
            if let Some(mut inst) = self.get_mut(&id) {
                f(&id, &mut inst);
            }
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

/// A borrowed instance that is counted and indexed again when dropped.
pub(super) struct InstanceMut<'a> {
    id: &'a String,
    inst: &'a mut Instance,
    tally: &'a mut Census,
    assignable: &'a mut BTreeSet<Rank>,
    before: Census,
    before_rank: Option<Rank>,
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
        let after = rank(self.id, self.inst, self.capacity, self.max_use);
        if after != self.before_rank {
            if let Some(before) = self.before_rank.take() {
                self.assignable.remove(&before);
            }
            if let Some(after) = after {
                self.assignable.insert(after);
            }
        }
    }
}
