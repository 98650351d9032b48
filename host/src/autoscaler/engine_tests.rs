//! The engine on a virtual clock: GitLab's documented examples, step by step.

use std::time::Duration;

use super::*;
use crate::autoscaler::clock::{Clock, VirtualClock};

fn machine(idle_count: u32, max_growth_rate: u32, limit: u32, max_builds: u32) -> Engine {
    Engine::new(Settings {
        capacity_per_instance: 1,
        max_use_count: max_builds,
        max_instances: limit,
        policy: Policy::Machine { idle_count, idle_count_min: 0, idle_scale_factor: 0.0, idle_time: Duration::from_secs(1800), max_growth_rate },
    })
}

/// A provider that creates instances instantly: every Create becomes created + ready.
fn settle(engine: &mut Engine, clock: &VirtualClock, next_id: &mut u32) -> Vec<Action> {
    let mut all = Vec::new();
    for _ in 0..100 {
        let actions = engine.tick(clock.now());
        if actions.is_empty() {
            break;
        }
        for action in &actions {
            match action {
                Action::Create(n) => {
                    for _ in 0..*n {
                        *next_id += 1;
                        let id = format!("m{next_id}");
                        engine.instance_created(&id, clock.now());
                        engine.instance_ready(&id, clock.now());
                    }
                }
                Action::Delete(ids, _) => {
                    for id in ids {
                        engine.instance_removed(id);
                    }
                }
            }
        }
        all.extend(actions);
    }
    all
}

#[test]
fn seed_001_worked_example_idle_count_2_max_growth_rate_1_limit_10() {
    let clock = VirtualClock::default();
    let mut engine = machine(2, 1, 10, 0);

    // "At the beginning ... GitLab Runner starts two machines", one at a time (MaxGrowthRate).
    assert_eq!(engine.tick(clock.now()), vec![Action::Create(1)]);
    assert_eq!(engine.tick(clock.now()), vec![], "MaxGrowthRate = 1: no second creation while one is in flight");
    engine.instance_created("m1", clock.now());
    engine.instance_ready("m1", clock.now());
    let mut next = 1;
    settle(&mut engine, &clock, &mut next);
    let c = engine.counts();
    assert_eq!((c.ready, c.idle_slots), (2, 2), "two idle machines");

    // "5 jobs are queued": the first two take the idle machines.
    clock.advance(Duration::from_secs(60));
    let jobs: Vec<String> = (1..=5).map(|i| format!("job{i}")).collect();
    for job in &jobs {
        engine.reserve(job).expect("idle machine available or capacity under the limit");
        engine.acquire(job);
        if engine.counts().idle_slots == 0 {
            break;
        }
    }
    assert_eq!(engine.counts().acquired, 2);
    for job in &jobs[2..] {
        engine.acquire(job);
    }
    assert_eq!(engine.counts().pending, 3, "the remaining 3 jobs wait for machines");

    // New machines are provisioned sequentially; each goes to a waiting job, then two more
    // are created to satisfy IdleCount.
    let actions = settle(&mut engine, &clock, &mut next);
    assert!(actions.iter().all(|a| matches!(a, Action::Create(1))), "sequential: {actions:?}");
    let c = engine.counts();
    assert_eq!((c.ready, c.acquired, c.idle_slots, c.pending), (7, 5, 2, 0), "seven machines, five busy, two idle");

    // Jobs finish; after IdleTime the extra idle machines go, IdleCount stay.
    clock.advance(Duration::from_secs(600));
    for job in &jobs {
        engine.release(job, clock.now());
    }
    assert!(settle(&mut engine, &clock, &mut next).is_empty(), "nothing is removed before IdleTime");
    clock.advance(Duration::from_secs(1801));
    let actions = settle(&mut engine, &clock, &mut next);
    assert!(matches!(&actions[..], [Action::Delete(ids, RemovalReason::Idle)] if ids.len() == 5), "{actions:?}");
    assert_eq!(engine.counts().ready, 2, "always two idle machines");
}

#[test]
fn on_demand_mode_creates_per_job_and_limit_caps_the_fleet() {
    let clock = VirtualClock::default();
    let mut engine = machine(0, 0, 3, 0);
    let mut next = 0;
    assert!(settle(&mut engine, &clock, &mut next).is_empty(), "IdleCount = 0 keeps nothing warm");
    for i in 0..5 {
        let key = format!("j{i}");
        engine.reserve(&key).ok();
        engine.acquire(&key);
    }
    settle(&mut engine, &clock, &mut next);
    let c = engine.counts();
    assert_eq!((c.ready, c.acquired, c.pending), (3, 3, 2), "limit = 3 machines; two jobs wait");
    engine.release("j0", clock.now());
    assert_eq!(engine.counts().acquired, 3, "a freed machine takes a waiting job");
}

fn taskscaler(idle_count: u32, capacity: u32, max_instances: u32, max_use_count: u32, preemptive: bool) -> Engine {
    Engine::new(Settings {
        capacity_per_instance: capacity,
        max_use_count,
        max_instances,
        policy: Policy::Taskscaler { idle_count, idle_time: Duration::from_secs(300), scale_factor: 0.0, scale_factor_limit: 0, preemptive },
    })
}

#[test]
fn scale_from_zero_then_idle_time_scales_back_down() {
    let clock = VirtualClock::default();
    let mut engine = taskscaler(0, 2, 10, 0, false);
    let mut next = 0;
    for i in 0..5 {
        let key = format!("j{i}");
        engine.reserve(&key).expect("non-preemptive: capacity allows");
        engine.acquire(&key);
    }
    settle(&mut engine, &clock, &mut next);
    let c = engine.counts();
    assert_eq!((c.ready, c.acquired, c.pending), (3, 5, 0), "ceil(5 / 2) instances");
    for i in 0..5 {
        engine.release(&format!("j{i}"), clock.now());
    }
    clock.advance(Duration::from_secs(299));
    assert!(settle(&mut engine, &clock, &mut next).is_empty());
    clock.advance(Duration::from_secs(2));
    settle(&mut engine, &clock, &mut next);
    assert_eq!(engine.counts().ready, 0, "idle_count = 0: everything idle past idle_time goes");
}

#[test]
fn preemptive_mode_reserves_only_idle_ready_slots() {
    let clock = VirtualClock::default();
    let mut engine = taskscaler(1, 1, 5, 0, true);
    assert_eq!(engine.reserve("a"), Err(NoCapacity), "nothing ready yet");
    let mut next = 0;
    settle(&mut engine, &clock, &mut next);
    engine.reserve("a").expect("an idle slot exists");
    assert_eq!(engine.reserve("b"), Err(NoCapacity), "the only idle slot is reserved");
    engine.unreserve("a");
    engine.reserve("b").expect("freed by unreserve");
}

#[test]
fn max_use_count_retires_instances_after_their_last_job() {
    let clock = VirtualClock::default();
    let mut engine = taskscaler(0, 1, 5, 2, false);
    let mut next = 0;
    for round in 0..2 {
        let key = format!("r{round}");
        engine.acquire(&key);
        settle(&mut engine, &clock, &mut next);
        assert_eq!(engine.acquisition(&key).map(|a| a.instance), Some("m1".to_string()));
        engine.release(&key, clock.now());
    }
    let actions = engine.tick(clock.now());
    assert!(actions.contains(&Action::Delete(vec!["m1".into()], RemovalReason::MaxUseCount)), "{actions:?}");
}

#[test]
fn a_lost_instance_reports_its_jobs_and_is_replaced() {
    let clock = VirtualClock::default();
    let mut engine = taskscaler(0, 2, 5, 0, false);
    let mut next = 0;
    engine.acquire("a");
    engine.acquire("b");
    settle(&mut engine, &clock, &mut next);
    let mut lost = engine.instance_removed("m1");
    lost.sort();
    assert_eq!(lost, vec!["a", "b"]);
    assert_eq!(engine.counts().acquired, 0);
    engine.acquire("c");
    settle(&mut engine, &clock, &mut next);
    assert_eq!(engine.acquisition("c").map(|a| a.instance), Some("m2".into()), "a replacement serves new work");
}

#[test]
fn a_restarted_manager_adopts_instances_with_their_use_counts() {
    let clock = VirtualClock::default();
    let mut engine = taskscaler(1, 1, 5, 3, true);
    let mut next = 10;
    settle(&mut engine, &clock, &mut next);
    engine.acquire("x");
    engine.release("x", clock.now());
    let snapshot = engine.snapshot();

    let mut restarted = taskscaler(1, 1, 5, 3, true);
    for (id, uses) in &snapshot {
        restarted.adopt(id, *uses, clock.now());
    }
    assert_eq!(restarted.snapshot(), snapshot);
    assert!(settle(&mut restarted, &clock, &mut next).is_empty(), "adopted instances satisfy the idle target: nothing created or deleted");
}
