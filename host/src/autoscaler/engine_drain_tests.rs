//! The engine when the provider takes instances away or stops answering: interruption notices
//! drain an instance (no new jobs, replaced for the policy, its jobs lost only when it is gone),
//! a failing provider is retried with back-off and no capacity is promised meanwhile, and
//! instances a self-launching group starts on its own are adopted.

use std::time::Duration;

use super::*;

fn two_slot_fleet() -> Harness {
    let settings =
        AutoscalerSettings { capacity_per_instance: 2, policies: vec![utc_policy(2, 3600)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.step_until(Duration::from_secs(600), "ready", |h| h.metrics().slots_idle == 2);
    h
}

#[test]
fn an_interrupted_instance_takes_no_new_job_is_replaced_and_its_job_is_lost_when_it_goes() {
    let mut h = two_slot_fleet();
    assert!(h.reserve_and_acquire("job-a"));
    let instance = h.instance_of("job-a").expect("acquired");
    // One free slot beside the job, two on a second instance for the idle target.
    h.step_until(Duration::from_secs(600), "idle target restored", |h| h.metrics().slots_idle == 3);
    h.provider.interrupt(&instance, "spot capacity reclaimed");
    h.step_until(Duration::from_secs(600), "notice seen", |h| h.metrics().instances_interrupted == 1);
    let notice = h.events.iter().find_map(|e| match e {
        EngineEvent::InstanceInterrupted { instance, reason, keys } => {
            Some((instance.clone(), reason.clone(), keys.clone()))
        }
        _ => None,
    });
    assert_eq!(notice, Some((instance.clone(), "spot capacity reclaimed".into(), vec!["job-a".to_string()])));
    // Its free slot left the capacity.
    assert_eq!((h.metrics().slots_idle, h.metrics().slots_unavailable), (2, 1));
    for key in ["job-b", "job-c"] {
        assert!(h.reserve_and_acquire(key));
    }
    // The policy replaces the lost capacity elsewhere: jobs and the idle target on new instances.
    h.step_until(Duration::from_secs(600), "replaced", |h| h.metrics().slots_idle >= 2);
    for key in ["job-b", "job-c"] {
        let placed = h.instance_of(key).expect("placed");
        assert_ne!(placed, instance, "{key} placed on the draining instance");
    }
    // The job keeps running while the cloud takes its time.
    h.run_for(Duration::from_secs(120));
    assert!(!h.events.iter().any(|e| matches!(e, EngineEvent::InstanceLost { .. })));
    h.provider.vanish(&instance);
    h.step_until(Duration::from_secs(600), "gone", |h| {
        h.events.iter().any(|e| matches!(e, EngineEvent::InstanceLost { .. }))
    });
    let lost = h.events.iter().find_map(|e| match e {
        EngineEvent::InstanceLost { instance, keys, reason } => Some((instance.clone(), keys.clone(), *reason)),
        _ => None,
    });
    assert_eq!(lost, Some((instance, vec!["job-a".to_string()], RemovalReason::Interrupted)));
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Interrupted), Some(&1));
    assert_eq!(h.metrics().instances_interrupted, 0);
}

#[test]
fn a_job_on_an_interrupted_instance_finishes_normally_when_it_outlives_nothing() {
    let mut h = two_slot_fleet();
    assert!(h.reserve_and_acquire("job-a"));
    let instance = h.instance_of("job-a").expect("acquired");
    h.provider.interrupt(&instance, "rebalance");
    h.step_until(Duration::from_secs(600), "notice seen", |h| h.metrics().instances_interrupted == 1);
    assert_eq!(h.engine.release("job-a", h.now()), Ok(()));
    // Idle and draining: never given out again, never counted idle.
    h.run_for(Duration::from_secs(60));
    assert!(h.reserve_and_acquire("job-b"));
    assert_ne!(h.instance_of("job-b"), Some(instance));
}

#[test]
fn a_failing_provider_is_retried_with_back_off_and_promises_no_capacity() {
    let settings = AutoscalerSettings { policies: vec![utc_policy(0, 60)], ..Default::default() };
    let mut h = Harness::new(&settings, cloud(10.0));
    h.provider.failing = Some("host autoscaling.example is not in allow_hosts".into());
    h.run_for(Duration::from_secs(300));
    let failures: Vec<(u32, Duration)> = h
        .events
        .iter()
        .filter_map(|e| match e {
            EngineEvent::ProviderFailing { failures, retry_in, message } => {
                assert!(message.contains("allow_hosts"), "{message}");
                Some((*failures, *retry_in))
            }
            _ => None,
        })
        .collect();
    assert!(failures.len() >= 4, "{failures:?}");
    let waits: Vec<Duration> = failures.iter().map(|(_, w)| *w).collect();
    assert!(waits.windows(2).all(|w| w[0] <= w[1]), "the interval grows: {waits:?}");
    assert_eq!(waits.iter().max(), Some(&Duration::from_secs(60)), "and stops growing at a minute");
    assert_eq!(h.engine.provider_error(), Some("host autoscaling.example is not in allow_hosts"));
    assert!(h.metrics().provider_consecutive_failures >= 4);
    // Non-preemptive mode would otherwise reserve on the promise of a new instance.
    assert_eq!(h.engine.reserve("job", h.now()), Err(ReserveError::NoCapacity));
    assert_eq!(h.provider.increase_calls, 0);

    h.provider.failing = None;
    h.step_until(Duration::from_secs(120), "recovered", |h| {
        h.events.iter().any(|e| matches!(e, EngineEvent::ProviderRecovered { .. }))
    });
    assert_eq!(h.engine.provider_error(), None);
    assert!(h.reserve_and_acquire("job"));
    h.step_until(Duration::from_secs(600), "job placed", |h| h.instance_of("job").is_some());
}

#[test]
fn a_self_launching_group_s_own_instances_are_adopted_not_deleted() {
    let mut h = two_slot_fleet();
    h.provider.self_launching = true;
    let replacement = h.provider.launch_on_its_own();
    h.step_until(Duration::from_secs(600), "adopted", |h| h.metrics().instances_adopted_total == 1);
    h.run_for(Duration::from_secs(30));
    assert!(h.engine.instance_summary().iter().any(|(id, _, _)| *id == replacement));
    assert_eq!(h.metrics().instances_removed_total.get(&RemovalReason::Unknown), None);

    // Without the capability the same instance is removed for safety.
    let mut h = two_slot_fleet();
    h.provider.launch_on_its_own();
    h.step_until(Duration::from_secs(600), "removed", |h| {
        h.metrics().instances_removed_total.get(&RemovalReason::Unknown) == Some(&1)
    });
}
