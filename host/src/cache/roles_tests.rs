//! Unit tests of role selection, the credential cache, the concurrency limit and the
//! AssumeRole families. STS itself is a closed loopback port here (a failed call is counted
//! as gitlab-runner counts it); moto answers in tests/cache_stores.rs.

use super::*;

fn cfg(role: &str, upload_role: &str) -> CacheS3Config {
    CacheS3Config {
        bucket_name: "bucket".into(),
        role_arn: role.into(),
        upload_role_arn: upload_role.into(),
        ..Default::default()
    }
}

/// A loopback port nothing listens on.
fn closed_endpoint() -> String {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

fn assumer(cfg: &CacheS3Config, endpoint: &str) -> (RoleAssumer, Arc<CredentialCache>, Arc<AssumeRoleMetrics>) {
    let endpoint = endpoint.to_string();
    let env = move |k: &str| (k == "AWS_ENDPOINT_URL_STS").then(|| endpoint.clone());
    let cache = Arc::new(CredentialCache::default());
    let metrics = Arc::new(AssumeRoleMetrics::new().expect("families"));
    let a = RoleAssumer::from_config(cfg, false, &env).expect("roles").with_parts(cache.clone(), metrics.clone());
    (a, cache, metrics)
}

fn base() -> AwsCredentials {
    AwsCredentials {
        access_key_id: "AKID".into(),
        secret_access_key: "secret".into(),
        session_token: None,
        expires: None,
    }
}

fn temporary(id: &str, valid_for: chrono::Duration) -> AwsCredentials {
    AwsCredentials {
        access_key_id: id.into(),
        secret_access_key: "s".into(),
        session_token: Some("t".into()),
        expires: Some(Utc::now() + valid_for),
    }
}

#[test]
fn roles_are_chosen_as_gitlab_runner_chooses_them() {
    assert!(RoleAssumer::from_config(&cfg("", ""), false, &|_| None).is_none());
    let both = RoleAssumer::from_config(&cfg("arn:r", "arn:u"), false, &|_| None).expect("roles");
    for upload in [false, true] {
        assert_eq!(both.role_for(upload), Some("arn:r"), "RoleARN signs every request");
    }
    let upload = RoleAssumer::from_config(&cfg("", "arn:u"), false, &|_| None).expect("roles");
    assert_eq!(upload.role_for(true), Some("arn:u"));
    assert_eq!(upload.role_for(false), None, "downloads keep the runner's own credentials");
    assert_eq!(upload.endpoint("eu-west-1"), "https://sts.eu-west-1.amazonaws.com");
}

#[test]
fn the_concurrency_limit_is_assume_role_max_concurrency() {
    let limit = |n: i64| {
        RoleAssumer::from_config(&CacheS3Config { assume_role_max_concurrency: n, ..cfg("arn:r", "") }, false, &|_| {
            None
        })
        .expect("roles")
        .limit()
    };
    assert_eq!(limit(0), Some(DEFAULT_MAX_CONCURRENCY));
    assert_eq!(limit(2), Some(2));
    assert_eq!(limit(-1), None, "negative: no limit");
}

#[test]
fn the_cache_keeps_credentials_until_too_little_validity_is_left() {
    let cache = CredentialCache::default();
    let now = Utc::now();
    cache.put("k".into(), temporary("A", chrono::Duration::minutes(30)), now);
    assert!(cache.get("k", Duration::from_secs(29 * 60), now).is_some());
    assert!(cache.get("k", Duration::from_secs(31 * 60), now).is_none(), "less left than the URL needs");
    assert!(cache.get("other", Duration::from_secs(60), now).is_none());
    // Expired entries go when another is put; a full cache drops the one expiring soonest.
    cache.put("old".into(), temporary("B", chrono::Duration::seconds(-1)), now - chrono::Duration::hours(1));
    assert_eq!(cache.put("n".into(), temporary("C", chrono::Duration::minutes(40)), now), 2);
    for i in 0..CACHE_CAPACITY {
        cache.put(format!("f{i}"), temporary("D", chrono::Duration::minutes(50)), now);
    }
    assert_eq!(cache.entries.lock().map(|e| e.len()).unwrap_or(0), CACHE_CAPACITY);
    assert!(cache.get("k", Duration::from_secs(60), now).is_none(), "the soonest to expire went first");
}

#[test]
fn cached_credentials_are_used_without_sts_and_counted_as_hits() {
    let (a, cache, metrics) = assumer(&cfg("arn:r", ""), &closed_endpoint());
    let key = a.cache_key("arn:r", "us-east-1", "obj", false);
    cache.put(key, temporary("ASIACACHED", chrono::Duration::minutes(59)), Utc::now());
    let got = a.credentials("arn:r", &base(), "us-east-1", "obj", false, Duration::from_secs(3600)).expect("cached");
    assert_eq!(got.access_key_id, "ASIACACHED");
    assert_eq!((metrics.hits.get(), metrics.misses.get(), metrics.failures.get()), (1, 0, 0));
    // The upload direction is another entry: a miss, and STS (closed here) fails.
    let err = a.credentials("arn:r", &base(), "us-east-1", "obj", true, Duration::from_secs(3600));
    assert!(matches!(err, Err(StsError::Unreachable { ref role, .. }) if role == "arn:r"), "{err:?}");
    assert_eq!((metrics.hits.get(), metrics.misses.get(), metrics.failures.get()), (1, 1, 1));
}

#[test]
fn without_caching_every_url_asks_sts_and_failures_are_counted() {
    let config = CacheS3Config { disable_assume_role_credentials_caching: true, ..cfg("arn:r", "") };
    let (a, cache, metrics) = assumer(&config, &closed_endpoint());
    cache.put(
        a.cache_key("arn:r", "us-east-1", "obj", false),
        temporary("X", chrono::Duration::minutes(59)),
        Utc::now(),
    );
    for _ in 0..2 {
        assert!(a.credentials("arn:r", &base(), "us-east-1", "obj", false, Duration::from_secs(60)).is_err());
    }
    assert_eq!((metrics.hits.get(), metrics.misses.get(), metrics.failures.get()), (0, 2, 2));
    assert_eq!(metrics.duration.get_sample_count(), 2);
    assert_eq!(metrics.wait.get_sample_count(), 2, "the default limit (5) was waited for");
    assert_eq!(metrics.in_flight.get(), 0, "slots are given back");
    let unlimited = CacheS3Config { assume_role_max_concurrency: -1, ..config };
    let (a, _, metrics) = assumer(&unlimited, &closed_endpoint());
    assert!(a.credentials("arn:r", &base(), "us-east-1", "obj", false, Duration::from_secs(60)).is_err());
    assert_eq!(metrics.wait.get_sample_count(), 0, "no limit, no wait");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn signing_inside_a_multi_threaded_runtime_does_not_stall_it() {
    let (a, _, metrics) = assumer(&cfg("arn:r", ""), &closed_endpoint());
    let other = tokio::spawn(async { 7 });
    assert!(a.credentials("arn:r", &base(), "us-east-1", "obj", false, Duration::from_secs(60)).is_err());
    assert_eq!(other.await.expect("the other task ran"), 7);
    assert_eq!(metrics.failures.get(), 1);
}

#[test]
fn the_families_are_gitlab_runners() {
    let registry = prometheus::Registry::new();
    for c in collectors() {
        registry.register(c).expect("register");
    }
    let mut text = String::new();
    prometheus::TextEncoder::new().encode_utf8(&registry.gather(), &mut text).expect("encode");
    for (name, kind) in [
        ("gitlab_runner_cache_s3_assume_role_requests_in_flight", "gauge"),
        ("gitlab_runner_cache_s3_assume_role_wait_seconds", "histogram"),
        ("gitlab_runner_cache_s3_assume_role_duration_seconds", "histogram"),
        ("gitlab_runner_cache_s3_assume_role_cache_hits_total", "counter"),
        ("gitlab_runner_cache_s3_assume_role_cache_misses_total", "counter"),
        ("gitlab_runner_cache_s3_assume_role_cached_credentials", "gauge"),
        ("gitlab_runner_cache_s3_assume_role_failures_total", "counter"),
    ] {
        assert!(text.contains(&format!("# TYPE {name} {kind}\n")), "{name} {kind}:\n{text}");
    }
    assert!(text.contains("gitlab_runner_cache_s3_assume_role_wait_seconds_bucket{le=\"0.005\"} 0"), "{text}");
    assert!(text.contains("gitlab_runner_cache_s3_assume_role_duration_seconds_bucket{le=\"30\"} 0"), "{text}");
    assert!(text.contains(
        "# HELP gitlab_runner_cache_s3_assume_role_failures_total Number of AssumeRole requests which failed.\n"
    ));
}
