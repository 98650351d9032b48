//! The engine's table of instances with a running census of them (phases and slots by
//! state) and the indexes a tick reads instead of walking every instance: the instances a
//! waiting job can be given (in the order the choice takes), the idle ready instances by the
//! start of their idle period (scale-down and the next idle expiry), the ready instances by
//! their next heartbeat, and the instances marked for removal whose removal is not yet asked.
//!
//! Owns only the map, its tally and its indexes: every change of an instance goes through
//! [`Instances`] (a mutable borrow is an [`InstanceMut`] that counts and indexes the instance
//! again when it ends), so neither can drift from the map; debug builds check them against a
//! full count on every read. Must not touch keys or decide anything.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BTreeSet};
use std::ops::{Bound, Deref, DerefMut};
use std::time::Duration;

use super::scaling::Census;
use super::{Instance, Moment, Phase};

/// Instances by provider id, with their census and indexes.
#[derive(Debug)]
pub(super) struct Instances {
    map: BTreeMap<String, Instance>,
    tally: Census,
    index: Index,
    capacity: u32,
    max_use: u32,
}

/// An instance's place in the assignable index: (active slots, ready first, id).
type Rank = (u32, Reverse<Option<Moment>>, String);

/// The indexes over the table, each holding the instances it applies to.
#[derive(Debug, Default, PartialEq)]
struct Index {
    /// Healthy assignable instances with a usable slot, ordered so that the last is the one a
    /// waiting job gets: the busiest, then the one ready first, then the last id.
    assignable: BTreeSet<Rank>,
    /// Ready instances running no job, by (idle since, id).
    idle: BTreeSet<(Moment, String)>,
    /// Ready instances by (next heartbeat, id).
    heartbeat: BTreeSet<(Moment, String)>,
    /// Instances marked for removal whose removal the provider was not asked for yet.
    to_delete: BTreeSet<String>,
}

/// Where an instance stands in each index, its id aside (compared before building keys, so
/// an unchanged place costs no allocation).
#[derive(Clone, Debug, Default, PartialEq)]
struct Place {
    rank: Option<(u32, Reverse<Option<Moment>>)>,
    idle: Option<Moment>,
    heartbeat: Option<Moment>,
    to_delete: bool,
}

/// What one instance adds to the census, and its place in the indexes.
fn standing(inst: &Instance, capacity: u32, max_use: u32) -> (Census, Place) {
    let mut c = Census::default();
    let mut place = Place::default();
    match inst.phase {
        Phase::Deleting { requested_at, .. } => {
            c.deleting = 1;
            place.to_delete = requested_at.is_none();
            return (c, place);
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
            if usable > 0 {
                place.rank = Some((active, Reverse(inst.ready_at)));
            }
        }
    }
    if inst.phase == Phase::Ready {
        place.heartbeat = Some(inst.next_heartbeat);
        if active == 0 {
            place.idle = Some(inst.idle_since);
        }
    }
    (c, place)
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

impl Index {
    /// Move `id` from its place `before` to `after` (`None`: not in the table).
    fn shift(&mut self, id: &str, before: Option<&Place>, after: Option<&Place>) {
        let none = Place::default();
        let (before, after) = (before.unwrap_or(&none), after.unwrap_or(&none));
        if before.rank != after.rank {
            if let Some((active, ready)) = before.rank {
                self.assignable.remove(&(active, ready, id.to_string()));
            }
            if let Some((active, ready)) = after.rank {
                self.assignable.insert((active, ready, id.to_string()));
            }
        }
        shift_timed(&mut self.idle, id, before.idle, after.idle);
        shift_timed(&mut self.heartbeat, id, before.heartbeat, after.heartbeat);
        if before.to_delete != after.to_delete {
            if after.to_delete {
                self.to_delete.insert(id.to_string());
            } else {
                self.to_delete.remove(id);
            }
        }
    }
}

fn shift_timed(set: &mut BTreeSet<(Moment, String)>, id: &str, before: Option<Moment>, after: Option<Moment>) {
    if before != after {
        if let Some(t) = before {
            set.remove(&(t, id.to_string()));
        }
        if let Some(t) = after {
            set.insert((t, id.to_string()));
        }
    }
}

impl Instances {
    /// An empty table for instances of `capacity` slots used at most `max_use` times (0: no limit).
    pub(super) fn new(capacity: u32, max_use: u32) -> Instances {
        Instances { map: BTreeMap::new(), tally: Census::default(), index: Index::default(), capacity, max_use }
    }

    /// Debug builds: the indexes hold what a full walk over the table finds (each entry is
    /// where its instance stands, and each index holds as many entries as the walk finds
    /// instances for it; no allocation, so the check stays linear).
    fn check_index(&self) {
        if !cfg!(debug_assertions) {
            return;
        }
        let (capacity, max_use) = (self.capacity, self.max_use);
        let mut counts = [0usize; 4];
        for inst in self.map.values() {
            let place = standing(inst, capacity, max_use).1;
            counts[0] += usize::from(place.rank.is_some());
            counts[1] += usize::from(place.idle.is_some());
            counts[2] += usize::from(place.heartbeat.is_some());
            counts[3] += usize::from(place.to_delete);
        }
        let place = |id: &String| self.map.get(id).map(|i| standing(i, capacity, max_use).1);
        let index = &self.index;
        let sizes = [index.assignable.len(), index.idle.len(), index.heartbeat.len(), index.to_delete.len()];
        debug_assert_eq!(sizes, counts, "an index of instances holds more or fewer than the table");
        debug_assert!(
            index.assignable.iter().all(|(a, r, id)| place(id).is_some_and(|p| p.rank == Some((*a, *r))))
                && index.idle.iter().all(|(t, id)| place(id).is_some_and(|p| p.idle == Some(*t)))
                && index.heartbeat.iter().all(|(t, id)| place(id).is_some_and(|p| p.heartbeat == Some(*t)))
                && index.to_delete.iter().all(|id| place(id).is_some_and(|p| p.to_delete)),
            "an index of instances drifted from the table"
        );
    }

    /// The instance a waiting job gets: of the healthy ready instances with a usable slot, the
    /// busiest (packing, so others drain and go idle), then the one ready first, then the last
    /// in id order.
    pub(super) fn best_assignable(&self) -> Option<&String> {
        self.check_index();
        self.index.assignable.last().map(|(_, _, id)| id)
    }

    /// Ready instances running no job, longest idle first (ties: id order), with the start of
    /// their idle period.
    pub(super) fn idle(&self) -> impl Iterator<Item = (Moment, &String)> {
        self.check_index();
        self.index.idle.iter().map(|(since, id)| (*since, id))
    }

    /// The earliest end of an idle period of `idle_time` that is later than `after`, over the
    /// ready instances running no job.
    pub(super) fn next_idle_expiry(&self, after: Moment, idle_time: Duration) -> Option<Moment> {
        self.check_index();
        // Idle periods that began before `after - idle_time` ended by `after`; the ends grow
        // with the starts, so the first later one is the earliest.
        let ms = u64::try_from(idle_time.as_millis()).unwrap_or(u64::MAX);
        let from = Moment(after.0.saturating_sub(ms));
        self.index
            .idle
            .range((Bound::Included((from, String::new())), Bound::Unbounded))
            .map(|(since, _)| since.plus(idle_time))
            .find(|expiry| *expiry > after)
    }

    /// Ready instances whose next heartbeat is due by `now`, earliest first.
    pub(super) fn heartbeats_due(&self, now: Moment) -> impl Iterator<Item = &String> {
        self.check_index();
        self.index.heartbeat.iter().take_while(move |(at, _)| *at <= now).map(|(_, id)| id)
    }

    /// The earliest next heartbeat of a ready instance.
    pub(super) fn first_heartbeat(&self) -> Option<Moment> {
        self.check_index();
        self.index.heartbeat.first().map(|(at, _)| *at)
    }

    /// Instances marked for removal whose removal was not asked of the provider yet, in id order.
    pub(super) fn to_delete(&self) -> impl Iterator<Item = &String> {
        self.check_index();
        self.index.to_delete.iter()
    }

    /// The census of the instances (keys' counts left at 0).
    pub(super) fn census(&self) -> Census {
        debug_assert_eq!(self.tally, self.recount(), "the instances' tally drifted from the table");
        self.tally.clone()
    }

    fn recount(&self) -> Census {
        let mut c = Census::default();
        for inst in self.map.values() {
            c.add(&standing(inst, self.capacity, self.max_use).0, 1);
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
        let (before, before_place) = standing(inst, capacity, max_use);
        Some(InstanceMut {
            id: key,
            inst,
            tally: &mut self.tally,
            index: &mut self.index,
            before,
            before_place,
            capacity,
            max_use,
        })
    }

    /// Add or replace `id`'s instance.
    pub(super) fn insert(&mut self, id: String, inst: Instance) {
        let (counted, place) = standing(&inst, self.capacity, self.max_use);
        self.tally.add(&counted, 1);
        let old = self.map.insert(id.clone(), inst);
        let old_place = old.map(|old| {
            let (counted, place) = standing(&old, self.capacity, self.max_use);
            self.tally.add(&counted, -1);
            place
        });
        self.index.shift(&id, old_place.as_ref(), Some(&place));
    }

    /// Take `id`'s instance out.
    pub(super) fn remove(&mut self, id: &str) -> Option<Instance> {
        let old = self.map.remove(id)?;
        let (counted, place) = standing(&old, self.capacity, self.max_use);
        self.tally.add(&counted, -1);
        self.index.shift(id, Some(&place), None);
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
    index: &'a mut Index,
    before: Census,
    before_place: Place,
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
        let (after, place) = standing(self.inst, self.capacity, self.max_use);
        if after != self.before {
            self.tally.add(&self.before, -1);
            self.tally.add(&after, 1);
        }
        if place != self.before_place {
            self.index.shift(self.id, Some(&self.before_place), Some(&place));
        }
    }
}
