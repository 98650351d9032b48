//! Unit tests of the simulated provider: delays, capacity, groups sharing a cloud, spot
//! interruptions and the creation rate limit.

use super::*;
use crate::autoscaler::clock::VirtualClock;

#[test]
fn lognormal_samples_have_the_requested_median() {
    let mut rng = StdRng::seed_from_u64(7);
    let mut samples: Vec<f64> = (0..20_001).map(|_| lognormal(&mut rng, 27.0, 45.0)).collect();
    samples.sort_by(f64::total_cmp);
    let median = samples[10_000];
    let p95 = samples[19_000];
    assert!((25.0..29.0).contains(&median), "median {median}");
    assert!((41.0..50.0).contains(&p95), "p95 {p95}");
}

#[test]
fn simulated_instances_come_up_and_go_away() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let settings = SimProviderSettings {
        provisioning: DelayDistribution::Fixed { seconds: 30.0, jitter_s: 0.0 },
        deletion: DelayDistribution::Fixed { seconds: 10.0, jitter_s: 0.0 },
        timeout_rate: 0.0,
        billing_minimum_s: 0.0,
        ..Default::default()
    };
    let mut p = SimProvider::new(settings, clock.clone());
    assert_eq!(p.increase(2), Ok(2));
    let listed = p.update().expect("update");
    assert!(listed.iter().all(|(_, s)| *s == InstanceState::Creating));
    clock.advance(Duration::from_secs(30));
    let listed = p.update().expect("update");
    assert!(listed.iter().all(|(_, s)| *s == InstanceState::Running));
    let id = listed[0].0.clone();
    assert_eq!(p.decrease(std::slice::from_ref(&id)), Ok(vec![id.clone()]));
    assert!(p.update().expect("update").contains(&(id.clone(), InstanceState::Deleting)));
    clock.advance(Duration::from_secs(10));
    assert_eq!(p.update().expect("update").len(), 1);
    assert_eq!(p.billed_seconds(clock.now()), 40.0 + 40.0, "one deleted after 40 s, one still running");
}

#[test]
fn full_group_reports_capacity_error_with_retry_after() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let mut p = SimProvider::new(SimProviderSettings { max_size: 1, ..Default::default() }, clock);
    assert_eq!(p.increase(3), Ok(1));
    assert!(matches!(p.increase(1), Err(ProviderError::Capacity { retry_after: Some(_) })));
}

fn fixed(seconds: f64) -> DelayDistribution {
    DelayDistribution::Fixed { seconds, jitter_s: 0.0 }
}

#[test]
fn groups_list_only_their_own_instances_and_share_the_quota() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let settings =
        SimProviderSettings { max_size: 3, timeout_rate: 0.0, provisioning: fixed(10.0), ..Default::default() };
    let mut cloud = SimProvider::new(settings, clock.clone());
    assert_eq!(cloud.group(0).increase(2), Ok(2));
    assert_eq!(cloud.group(1).increase(2), Ok(1), "the quota is the account's, not the group's");
    assert!(matches!(cloud.group(1).increase(1), Err(ProviderError::Capacity { .. })));
    clock.advance(Duration::from_secs(10));
    let a = cloud.group(0).update().expect("update");
    let b = cloud.group(1).update().expect("update");
    assert_eq!((a.len(), b.len()), (2, 1));
    assert!(a.iter().all(|(id, _)| !b.iter().any(|(other, _)| other == id)), "ids are unique in the cloud");
    assert_eq!(cloud.group(1).decrease(&[a[0].0.clone()]), Ok(vec![]), "a group cannot remove another's instance");
    assert_eq!(cloud.group_stats(1).capacity_refused, 1);
    assert_eq!((cloud.group_stats(0).created, cloud.group_stats(1).created), (2, 1));
    clock.advance(Duration::from_secs(3600));
    let end = clock.now();
    let total = cloud.billed_seconds(end);
    assert_eq!(total, cloud.group_billed_seconds(0, end) + cloud.group_billed_seconds(1, end));
    assert_eq!(cloud.group_billed_seconds(1, end), 3610.0);
}

#[test]
fn spot_interruptions_come_with_a_notice_then_the_instance_goes() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let settings = SimProviderSettings {
        timeout_rate: 0.0,
        provisioning: fixed(30.0),
        interruption_rate_per_hour: 2.0,
        interruption_notice_s: 120.0,
        billing_minimum_s: 0.0,
        ..Default::default()
    };
    let mut cloud = SimProvider::new(settings.clone(), clock.clone());
    assert_eq!(cloud.increase(50), Ok(50));
    let mut noticed: BTreeMap<String, Moment> = BTreeMap::new();
    let mut gone_after_notice = 0;
    // Step a minute at a time through ten hours: every instance gets its notice, then is
    // gone `interruption_notice_s` later, never earlier.
    for _ in 0..600 {
        clock.advance(Duration::from_secs(60));
        let now = clock.now();
        let listed = cloud.update().expect("update");
        for n in cloud.interruptions().expect("notices") {
            assert_eq!(n.deadline.map(|d| d * 1000 <= now.0 + 120_000), Some(true));
            noticed.entry(n.id).or_insert(now);
        }
        for (id, at) in &noticed {
            let listed_now = listed.iter().any(|(l, _)| l == id);
            if !listed_now && now.since(*at) >= Duration::from_secs(60) {
                gone_after_notice += 1;
            }
        }
        noticed.retain(|id, _| listed.iter().any(|(l, _)| l == id));
    }
    assert_eq!(cloud.update().expect("update").len(), 0, "at 2 per hour all 50 are reclaimed within 10 h");
    assert!(gone_after_notice >= 40, "instances leave after their notice: {gone_after_notice}");
    assert_eq!(cloud.group_stats(0).interruptions, 50);
    // Deterministic from the seed, and its own random stream: provisioning draws are unchanged.
    let mut again = SimProvider::new(settings.clone(), Arc::new(VirtualClock::new(Moment(0))));
    again.increase(50).expect("increase");
    let times = |p: &SimProvider| {
        p.instances().map(|(id, i)| (id.clone(), (i.up_at, i.interruption_at))).collect::<BTreeMap<_, _>>()
    };
    assert_eq!(times(&again), times(&cloud));
    let mut calm = SimProvider::new(
        SimProviderSettings { interruption_rate_per_hour: 0.0, ..settings },
        Arc::new(VirtualClock::new(Moment(0))),
    );
    calm.increase(50).expect("increase");
    let ups = |p: &SimProvider| p.instances().map(|(id, i)| (id.clone(), i.up_at)).collect::<BTreeMap<_, _>>();
    assert_eq!(ups(&calm), ups(&cloud));
    assert!(calm.instances().all(|(_, i)| i.interruption_at.is_none()));
}

#[test]
fn an_instance_removed_before_its_notice_is_not_interrupted() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let settings = SimProviderSettings {
        timeout_rate: 0.0,
        provisioning: fixed(1.0),
        deletion: fixed(5.0),
        interruption_rate_per_hour: 0.001,
        ..Default::default()
    };
    let mut cloud = SimProvider::new(settings, clock.clone());
    cloud.increase(1).expect("increase");
    clock.advance(Duration::from_secs(60));
    let id = cloud.update().expect("update")[0].0.clone();
    assert_eq!(cloud.decrease(std::slice::from_ref(&id)), Ok(vec![id.clone()]));
    clock.advance(Duration::from_secs(3600 * 24 * 365));
    assert!(cloud.update().expect("update").is_empty());
    assert!(cloud.interruptions().expect("notices").is_empty());
    assert_eq!(cloud.group_stats(0).interruptions, 0);
}

#[test]
fn the_creation_rate_limit_throttles_with_a_retry_after() {
    let clock = Arc::new(VirtualClock::new(Moment(0)));
    let settings = SimProviderSettings { create_rate_per_s: 0.5, create_burst: 3, ..Default::default() };
    let mut cloud = SimProvider::new(settings, clock.clone());
    assert_eq!(cloud.group(0).increase(2), Ok(2));
    assert_eq!(cloud.group(1).increase(5), Ok(1), "cut to the one launch left in the shared bucket");
    let Err(ProviderError::Capacity { retry_after: Some(retry) }) = cloud.group(1).increase(1) else {
        panic!("throttled");
    };
    assert_eq!(retry, Duration::from_secs(2), "one launch every 2 s");
    clock.advance(Duration::from_millis(1500));
    let Err(ProviderError::Capacity { retry_after: Some(retry) }) = cloud.group(0).increase(1) else {
        panic!("still throttled");
    };
    assert_eq!(retry, Duration::from_millis(500));
    clock.advance(retry);
    assert_eq!(cloud.group(0).increase(4), Ok(1));
    clock.advance(Duration::from_secs(3600));
    assert_eq!(cloud.group(0).increase(10), Ok(3), "the bucket holds `create_burst` launches");
    let (a, b) = (cloud.group_stats(0), cloud.group_stats(1));
    assert_eq!((a.throttled, b.throttled), (3, 2));
    assert_eq!(a.throttled_wait_s + b.throttled_wait_s, 2.5);
    assert_eq!(a.created + b.created, cloud.created_total);
}

#[test]
fn new_profile_keys_are_validated() {
    let bad = |s: SimProviderSettings| s.validate().expect_err("invalid").to_string();
    assert!(bad(SimProviderSettings { interruption_rate_per_hour: -1.0, ..Default::default() })
        .contains("interruption_rate_per_hour"));
    assert!(
        bad(SimProviderSettings { create_rate_per_s: f64::NAN, ..Default::default() }).contains("create_rate_per_s")
    );
    assert!(bad(SimProviderSettings { create_rate_per_s: 1.0, create_burst: 0, ..Default::default() })
        .contains("create_burst"));
}
