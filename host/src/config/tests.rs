use super::*;

fn parse_str(text: &str) -> Result<Loaded, ConfigError> {
    parse(text, Path::new("/etc/runway/config.toml"))
}

#[test]
fn defaults_match_gitlab_runner() {
    let loaded = parse_str("concurrent = 2\n[[runners]]\nurl = \"https://gitlab.example.com/\"\ntoken = \"glrt-abc\"\nexecutor = \"shell\"\n").expect("loads");
    let c = &loaded.config;
    assert_eq!(
        (c.check_interval, c.log_level.as_str(), c.log_format.as_str(), c.shutdown_timeout),
        (3, "info", "runner", 30)
    );
    let r = &c.runners[0];
    assert_eq!(r.resolved_url(), "https://gitlab.example.com");
    assert_eq!((r.limit, r.request_concurrency, r.output_limit), (0, 1, 4096));
    assert_eq!(
        (r.unhealthy_requests_limit, r.unhealthy_interval, r.job_status_final_update_retry_limit),
        (3, Duration::from_secs(3600), 10)
    );
    assert_eq!(r.executor_config_json(), "{}");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    assert_eq!(loaded.plugins_dir(), PathBuf::from("/etc/runway/plugins"));
}

#[test]
fn unknown_keys_warn_with_file_line_and_key() {
    let text = "concurrent = 1\nbogus = true\n[[runners]]\nurl = \"https://x\"\ntoken = \"t\"\nexecutor = \"shell\"\nmystery = 1\n[runners.shell]\nlogin = false\n";
    let loaded = parse_str(text).expect("loads");
    assert!(
        loaded.warnings.iter().any(|w| w == "/etc/runway/config.toml:2: bogus: unknown key (ignored)"),
        "{:?}",
        loaded.warnings
    );
    assert!(loaded.warnings.iter().any(|w| w.contains(":7: runners[0].mystery")), "{:?}", loaded.warnings);
    assert_eq!(loaded.config.runners[0].executor_config_json(), "{\"login\":false}");
}

#[test]
fn invalid_values_fail_with_file_line_and_key() {
    let text =
        "concurrent = 1\n\n[[runners]]\nurl = \"https://x\"\ntoken = \"t\"\nexecutor = \"shell\"\nlimit = \"lots\"\n";
    let err = parse_str(text).expect_err("bad limit");
    assert_eq!((err.line, err.key.as_deref()), (Some(7), Some("runners[0].limit")), "{err}");
    assert!(err.to_string().starts_with("/etc/runway/config.toml:7: runners[0].limit: "), "{err}");
    let err = parse_str("concurrent = 0\n").expect_err("zero");
    assert_eq!(err.to_string(), "/etc/runway/config.toml:1: concurrent: must be greater than 0");
    // A runner `run` cannot use is left out with the same file, line and key.
    let loaded = parse_str("concurrent = 1\n[[runners]]\nurl = \"ftp://x\"\ntoken = \"t\"\nexecutor = \"shell\"\n")
        .expect("loads");
    let why = loaded.config.runners[0].unusable.as_deref().unwrap_or_default();
    assert!(why.starts_with("/etc/runway/config.toml:3: runners[0].url: "), "{why}");
    let err = parse_str("concurrent = 1\n[plugins.shell]\nmemory_mb = \"big\"\n").expect_err("grant");
    assert_eq!(err.line, Some(3), "{err}");
}

#[test]
fn env_expansion_and_legacy_ci_suffix() {
    std::env::set_var("RUNWAY_TEST_TOKEN", "glrt-from-env");
    let loaded = parse_str("concurrent = 1\n[[runners]]\nurl = \"https://gitlab.example.com/ci\"\ntoken = \"${RUNWAY_TEST_TOKEN}\"\nexecutor = \"shell\"\n").expect("loads");
    let runner = &loaded.config.runners[0];
    assert_eq!(
        (runner.resolved_token().as_str(), runner.resolved_url().as_str()),
        ("glrt-from-env", "https://gitlab.example.com")
    );
    // The file's text is kept, so saving the config never writes the secret into it.
    assert_eq!(runner.token, "${RUNWAY_TEST_TOKEN}");
    let dir = tempfile::tempdir().expect("tempdir");
    save(&dir.path().join("c.toml"), &loaded.config).expect("save");
    let written = std::fs::read_to_string(dir.path().join("c.toml")).expect("read");
    assert!(written.contains("${RUNWAY_TEST_TOKEN}") && !written.contains("glrt-from-env"), "{written}");
}

#[test]
fn save_round_trips_with_mode_0600() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("config.toml");
    let mut runner = RunnerConfig::new("r1", "https://gitlab.example.com", "glrt-abc", "shell");
    runner.environment = vec!["A=1".into()];
    runner.sections.insert(
        "shell".into(),
        toml::Value::Table(toml::map::Map::from_iter([("login".to_string(), toml::Value::Boolean(false))])),
    );
    let config = Config {
        concurrent: 4,
        check_interval: 3,
        log_level: "info".into(),
        log_format: "runner".into(),
        listen_address: Some("127.0.0.1:9252".into()),
        shutdown_timeout: 30,
        connection_max_age: None,
        plugins_dir: None,
        plugin_cache_dir: None,
        state_dir: None,
        user: None,
        labels: BTreeMap::new(),
        plugins: BTreeMap::from([("shell".to_string(), PluginGrant { allow_process: true, ..PluginGrant::default() })]),
        session_server: Default::default(),
        runners: vec![runner],
    };
    save(&path, &config).expect("save");
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let loaded = load(&path).expect("load");
    assert_eq!(loaded.config, config);
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn the_example_config_loads_without_warnings() {
    std::env::set_var("RUNWAY_RUNNER_TOKEN", "glrt-example");
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/config.toml");
    let loaded = load(&path).expect("example config loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
}

#[test]
fn autoscaler_and_machine_sections_parse_with_defaults() {
    let text = r#"
concurrent = 4
[[runners]]
url = "https://x"
token = "t"
executor = "instance"
  [runners.autoscaler]
  plugin = "static"
  capacity_per_instance = 2
  max_instances = 5
  [runners.autoscaler.plugin_config]
  hosts = ["127.0.0.2", "127.0.0.3"]
  [runners.autoscaler.connector_config]
  username = "runner"
  [[runners.autoscaler.policy]]
  idle_count = 2
  idle_time = "20m"
  [[runners.autoscaler.policy]]
  periods = ["* 8-18 * * mon-fri"]
  timezone = "Europe/Berlin"
  scale_factor = 1.5
  [runners.machine]
  IdleCount = 2
  MaxGrowthRate = 1
  MaxBuilds = 10
  [[runners.machine.autoscaling]]
  Periods = ["* * 9-17 * * mon-fri *"]
  IdleCount = 5
"#;
    let loaded = parse_str(text).expect("loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let runner = &loaded.config.runners[0];
    let a = runner.autoscaler.as_ref().expect("autoscaler");
    assert_eq!((a.capacity_per_instance, a.max_use_count, a.max_instances), (2, 0, 5));
    assert_eq!(
        (a.instance_acquire_timeout, a.update_interval, a.update_interval_when_expecting),
        (Duration::from_secs(900), Duration::from_secs(60), Duration::from_secs(2))
    );
    assert_eq!((a.failure_threshold, a.shutdown_deletion_retries, a.reservation_throttling), (3, 3, true));
    assert_eq!(a.plugin_config_json("s_1"), r#"{"hosts":["127.0.0.2","127.0.0.3"]}"#);
    assert_eq!(a.policies[0].periods, vec!["* * * * *"]);
    assert!(a.policies[0].preemptive() && !a.policies[1].preemptive());
    assert_eq!(a.policies[0].idle_time, Duration::from_secs(1200));
    let m = runner.machine.as_ref().expect("machine");
    assert_eq!((m.idle_count, m.max_growth_rate, m.max_builds, m.autoscaling[0].idle_count), (2, 1, 10, 5));

    // The engine's settings: taskscaler keys, and Docker Machine semantics from [runners.machine].
    use crate::autoscaler::from_config::{settings, Mapping};
    let taskscaler = settings(a, None, runner.limit, Mapping::RUN);
    assert_eq!((taskscaler.capacity_per_instance, taskscaler.max_instances, taskscaler.policies.len()), (2, 5, 2));
    assert_eq!(taskscaler.policies[1].timezone.as_deref(), Some("Europe/Berlin"));
    assert!(taskscaler.instance_ready_command.is_none() && a.state_storage.enabled);
    taskscaler.compile().expect("valid engine settings");
    let legacy = settings(a, Some(m), 7, Mapping::RUN).legacy.expect("legacy mode");
    assert_eq!((legacy.idle_count, legacy.max_growth_rate, legacy.max_builds, legacy.limit), (2, 1, 10, 7));
    assert_eq!(legacy.autoscaling[0].periods, vec!["* * 9-17 * * mon-fri *"]);
    settings(a, Some(m), 7, Mapping::RUN).compile().expect("valid legacy settings");

    let bad = text.replace("periods = [\"* 8-18 * * mon-fri\"]", "periods = [\"8-18 * *\"]");
    let e = parse_str(&bad).expect_err("bad cron");
    assert_eq!(e.key.as_deref(), Some("runners[0].autoscaler.policy[1].periods"), "{e}");
}

#[test]
fn runners_without_connection_keys_are_left_out_by_name_and_are_optional_for_simulate() {
    // gitlab-runner loads such a file and fails that runner only; Runway warns with the
    // message its model would give (file, line, key) and leaves the runner out of `run`.
    let text = "concurrent = 1\n[[runners]]\nname = \"a\"\ntoken = \"t\"\nexecutor = \"shell\"\n[[runners]]\nname = \"b\"\nurl = \"https://x\"\ntoken = \"u\"\nexecutor = \"shell\"\n";
    let loaded = parse_str(text).expect("loads");
    let why = loaded.config.runners[0].unusable.as_deref().expect("left out");
    assert_eq!(why, "/etc/runway/config.toml:2: runners[0]: missing field `url`");
    assert!(loaded.config.runners[1].unusable.is_none());
    assert!(loaded.warnings.iter().any(|w| w.contains(why) && w.contains("\"a\" cannot ask GitLab for jobs")));
    let text = "concurrent = 1\n[[runners]]\nurl = \"https://x\"\ntoken = \"t\"\nexecutor = \"x\"\n[runners.autoscaler]\ncapacity_per_instance = 1\n";
    let loaded = parse_str(text).expect("loads");
    assert_eq!(
        loaded.config.runners[0].unusable.as_deref(),
        Some("/etc/runway/config.toml:6: runners[0].autoscaler: missing field `plugin`")
    );
    let loaded =
        parse_str("concurrent = 1\n[[runners]]\nurl = \"\"\ntoken = \"\"\nexecutor = \"shell\"\nbuilds_dir = \"\"\n")
            .expect("loads");
    let runner = &loaded.config.runners[0];
    assert_eq!(
        runner.unusable.as_deref(),
        Some("/etc/runway/config.toml:3: runners[0].url: \"\" must be an http:// or https:// URL")
    );
    assert_eq!(runner.builds_dir, None, "an empty builds_dir is unset, as in gitlab-runner");
    // `runway simulate` reads the same file without them; IdleTime takes seconds or a duration.
    let text = "concurrent = 1\n[[runners]]\nlimit = 3\n[runners.machine]\nIdleTime = \"30m\"\n[runners.autoscaler]\n";
    let loaded = parse_for(text, Path::new("/etc/runway/config.toml"), Purpose::Simulate).expect("simulate");
    let runner = &loaded.config.runners[0];
    assert_eq!(runner.machine.as_ref().expect("machine").idle_time, Duration::from_secs(1800));
    assert!(runner.autoscaler.as_ref().expect("autoscaler").plugin.is_empty());
}

/// Every file of tests/fixtures/config/bad starts with `# expect: LINE KEY: TEXT` (KEY `-` for
/// none): loading it must fail, without panicking, with `file:LINE: KEY: ...TEXT...`.
#[test]
fn malformed_config_corpus_fails_with_file_line_and_key() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/config/bad");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("corpus")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 25, "{} fixtures", files.len());
    let mut failures = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        let expect = text.lines().next().and_then(|l| l.strip_prefix("# expect: ")).expect("expect line");
        let (line, rest) = expect.split_once(' ').expect("line");
        let (key, message) = rest.split_once(": ").expect("key");
        let line: usize = line.parse().expect("line number");
        let key = (key != "-").then(|| key.to_string());
        let loaded = std::panic::catch_unwind(|| load(file));
        let err = match loaded {
            Err(_) => {
                failures.push(format!("{}: panicked", file.display()));
                continue;
            }
            Ok(Ok(_)) => {
                failures.push(format!("{}: loaded", file.display()));
                continue;
            }
            Ok(Err(e)) => e,
        };
        let prefix = match &key {
            Some(key) => format!("{}:{line}: {key}: ", file.display()),
            None => format!("{}:{line}: ", file.display()),
        };
        let shown = err.to_string();
        if err.line != Some(line) || err.key != key || !shown.starts_with(&prefix) || !err.message.contains(message) {
            failures.push(format!("{}: got {shown:?}, want {prefix}...{message}...", file.display()));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn line_of_key_finds_dotted_tables_and_nested_arrays() {
    let text = "concurrent = 1\n[plugins.shell]\ncall_timeout = \"1s\"\n[[runners]]\nurl = \"x\"\n[runners.autoscaler]\nplugin = \"p\"\n[[runners.autoscaler.policy]]\nidle_count = 1\n[[runners.autoscaler.policy]]\nidle_time = \"1m\"\n[[runners]]\nlimit = 3\n";
    assert_eq!(line_of_key(text, "plugins.shell.call_timeout"), Some(3));
    assert_eq!(line_of_key(text, "plugins.shell"), Some(2));
    assert_eq!(line_of_key(text, "runners[0].autoscaler.policy[1].idle_time"), Some(11));
    assert_eq!(line_of_key(text, "runners[1].limit"), Some(13));
    assert_eq!(line_of_key(text, "runners.1.limit"), Some(13));
    assert_eq!(line_of_key(text, "concurrent"), Some(1));
}

#[test]
fn limits_accept_the_edges() {
    let runner = "[[runners]]\nurl = \"https://x\"\ntoken = \"t\"\nexecutor = \"shell\"\n";
    let text = format!(
        "concurrent = 10000\ncheck_interval = -1\nlisten_address = \"[::1]:9252\"\n{runner}limit = 10000\nrequest_concurrency = 100\noutput_limit = 0\nunhealthy_interval = \"24h\"\n[plugins.shell]\ncall_timeout = \"100ms\"\nmemory_mb = 4096\n"
    );
    parse_str(&text).expect("edges load");
    let e = parse_str(&text.replace("\"100ms\"", "\"99ms\"")).expect_err("call_timeout below the minimum");
    assert_eq!(
        e.to_string(),
        "/etc/runway/config.toml:13: plugins.shell.call_timeout: 99ms is out of range (must be 100ms..=86400s)"
    );
    // A section for another executor plugin is kept when the runner names that executor.
    let loaded = parse_str(&format!("concurrent = 1\n{}[runners.mine]\nx = 1\n", runner.replace("shell", "mine")))
        .expect("plugin section");
    assert_eq!(loaded.config.runners[0].executor_config_json(), "{\"x\":1}");
}

#[test]
fn the_store_section_parses_saves_and_maps_onto_store_settings() {
    use crate::config::store::{StoreName, StorePathVariables};
    use crate::store::jobs::Backend;
    let text = "concurrent = 1\n[[runners]]\nname = \"r\"\nurl = \"https://x\"\ntoken = \"glrt-t1_abcdefghijk\"\nexecutor = \"shell\"\nenvironment = [\"ROOT=/srv\"]\n[runners.store]\nname = \"redis\"\nhealth_interval = \"2s\"\nhealth_timeout = 20\nmystery = 1\n[runners.store.redis]\nurl = \"redis://127.0.0.1:6379/1\"\n[runners.store.file]\npath = \"$ROOT/$CI_RUNNER_SHORT_TOKEN\"\n";
    let loaded = parse_str(text).expect("loads");
    assert_eq!(loaded.warnings.len(), 1, "{:?}", loaded.warnings);
    assert!(loaded.warnings[0].contains(":12: runners.0.store.?.mystery: unknown key"), "{:?}", loaded.warnings);
    let runner = &loaded.config.runners[0];
    let store = runner.store.as_ref().expect("store");
    assert_eq!(
        (store.name, store.health_interval, store.health_timeout),
        (StoreName::Redis, Duration::from_secs(2), Duration::from_secs(20))
    );
    let vars = StorePathVariables::default();
    let settings = runner.store_settings(&loaded.path, &vars).expect("settings");
    assert_eq!(
        settings.backend,
        Some(Backend::Redis {
            url: "redis://127.0.0.1:6379/1".into(),
            namespace: crate::config::token_digest("glrt-t1_abcdefghijk")
        })
    );
    // An earlier version's namespace (the short token) is moved over when the store opens.
    assert_eq!(
        settings.migrate_from,
        Some(Backend::Redis { url: "redis://127.0.0.1:6379/1".into(), namespace: "abcdefghi".into() })
    );
    // Saving keeps the section (integer seconds, as seed 003 writes them).
    let saved = toml::to_string_pretty(&loaded.config).expect("serialize");
    assert!(saved.contains("health_interval = 2"), "{saved}");
    let again = parse_str(&saved).expect("reloads");
    assert_eq!(again.config.runners[0].store, runner.store);
    // Without the section: the file store under the config directory, keyed by the token's
    // digest; the short token's directory of earlier versions is moved there.
    let plain = parse_str(
        "concurrent = 1\n[[runners]]\nurl = \"https://x\"\ntoken = \"glrt-t1_abcdefghijk\"\nexecutor = \"shell\"\n",
    )
    .expect("loads");
    let settings = plain.config.runners[0].store_settings(&plain.path, &vars).expect("settings");
    let digest = crate::config::token_digest("glrt-t1_abcdefghijk");
    assert_eq!(
        settings.backend,
        Some(Backend::File { path: PathBuf::from(format!("/etc/runway/.runway/store/{digest}")) })
    );
    assert_eq!(
        settings.migrate_from,
        Some(Backend::File { path: PathBuf::from("/etc/runway/.runway/store/abcdefghi") })
    );
}

#[test]
fn a_gitlab_runner_config_loads_and_names_every_key_runway_does_not_support() {
    let text = "concurrent = 2\nsentry_dsn = \"https://sentry\"\nconnection_max_age = \"15m\"\n[session_server]\n  listen_address = \"[::]:8093\"\n[[runners]]\n  name = \"k8s\"\n  url = \"https://gitlab.example.com\"\n  id = 7\n  token = \"glrt-abc\"\n  token_obtained_at = 2026-01-01T00:00:00Z\n  token_expires_at = 0001-01-01T00:00:00Z\n  executor = \"shell\"\n  proxy_exec = true\n  clean_git_config = false\n  [runners.custom_build_dir]\n    enabled = true\n  [runners.cache]\n    Type = \"s3\"\n    [runners.cache.s3]\n      BucketName = \"b\"\n      DualStack = true\n  [runners.parallels]\n    base_name = \"vm\"\n  [runners.docker]\n    image = \"alpine\"\n  [runners.machine]\n    IdleCount = 1\n    OffPeakPeriods = [\"* * * * * sat,sun *\"]\n";
    let loaded = parse_str(text).expect("a gitlab-runner config loads");
    assert_eq!(loaded.config.session_server.listen_address.as_deref(), Some("[::]:8093"));
    let runner = &loaded.config.runners[0];
    assert_eq!(runner.token_obtained_at, Some("2026-01-01T00:00:00Z".parse().expect("time")));
    assert_eq!(runner.token_expires_at, None, "Go's zero time is no expiry");
    let want = [
        "/etc/runway/config.toml:2: sentry_dsn: not supported by Runway (ignored)",
        "/etc/runway/config.toml:3: connection_max_age: not supported by Runway (ignored)",
        "/etc/runway/config.toml:29: runners.0.machine.OffPeakPeriods: not supported by Runway (ignored)",
        "/etc/runway/config.toml:14: runners[0].proxy_exec: not supported by Runway (ignored)",
        "/etc/runway/config.toml:16: runners[0].custom_build_dir: not supported by Runway (ignored)",
        "/etc/runway/config.toml:23: runners[0].parallels: not supported by Runway (ignored)",
    ];
    for w in want {
        assert!(loaded.warnings.iter().any(|got| got == w), "missing {w:?} in {:#?}", loaded.warnings);
    }
    assert!(
        !loaded.warnings.iter().any(|got| got.to_string().contains("session_server")),
        "[session_server] is served: {:#?}",
        loaded.warnings
    );
    assert_eq!(loaded.warnings.len(), want.len(), "{:#?}", loaded.warnings);
    // Runway's executors' sections go to their plugins; other executors' sections go nowhere.
    assert_eq!(runner.executor_config_json(), "{}");
    assert!(runner.sections.contains_key("docker") && !runner.sections.contains_key("parallels"));
}

#[test]
fn a_bad_allow_hosts_entry_fails_the_load_at_its_line() {
    let text = "concurrent = 1\n[plugins.fleeting-aws]\nmemory_mb = 64\nallow_hosts = [\"ec2.eu-west-1.amazonaws.com\", \"https://autoscaling.example\"]\n";
    let e = parse_str(text).expect_err("a URL is not a host");
    let shown = e.to_string();
    assert!(shown.starts_with("/etc/runway/config.toml:4: plugins.fleeting-aws.allow_hosts: "), "{shown}");
    assert!(shown.contains("\"https://autoscaling.example\" is not a host"), "{shown}");
    parse_str(&text.replace("https://", "")).expect("a host loads");
}

#[test]
fn the_default_config_is_gitlab_runners_then_runways_own() {
    let home = Path::new("/home/ci");
    let none = |_: &Path| false;
    assert_eq!(default_path_for(true, Some(home), &none), PathBuf::from("/etc/gitlab-runner/config.toml"));
    assert_eq!(default_path_for(false, Some(home), &none), PathBuf::from("/home/ci/.gitlab-runner/config.toml"));
    assert_eq!(default_path_for(false, None, &none), PathBuf::from("/etc/gitlab-runner/config.toml"));
    // Runway's own files are read when gitlab-runner's is not there.
    let runway_home = |p: &Path| p == Path::new("/home/ci/.runway/config.toml");
    assert_eq!(default_path_for(false, Some(home), &runway_home), PathBuf::from("/home/ci/.runway/config.toml"));
    let local = |p: &Path| p == Path::new("config.toml") || p == Path::new("/home/ci/.runway/config.toml");
    assert_eq!(default_path_for(true, Some(home), &local), PathBuf::from("config.toml"));
    // gitlab-runner's wins when both are there: a switched fleet keeps its file.
    let both = |p: &Path| p == Path::new("config.toml") || p == Path::new("/etc/gitlab-runner/config.toml");
    assert_eq!(default_path_for(true, Some(home), &both), PathBuf::from("/etc/gitlab-runner/config.toml"));
}

#[test]
fn concurrent_defaults_to_one_as_gitlab_runners() {
    let loaded =
        parse_str("[[runners]]\nurl = \"https://gitlab.example.com/\"\ntoken = \"glrt-abc\"\nexecutor = \"shell\"\n")
            .expect("loads");
    assert_eq!(loaded.config.concurrent, 1);
}

/// Whole config.toml examples from gitlab-runner's documentation (each fixture names its page
/// and section) load unchanged for `runway run` with no error: every runner either serves or
/// is left out with a warning naming the key, as gitlab-runner would fail only that runner.
#[test]
fn gitlab_runner_documentation_configs_load_unchanged() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tests/fixtures/gitlab-runner-docs");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .expect("fixtures")
        .map(|e| e.expect("entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    assert!(files.len() >= 12, "a dozen documented configs: {files:?}");
    for file in &files {
        let text = std::fs::read_to_string(file).expect("read");
        assert!(
            text.starts_with("# From gitlab-runner's docs/") || text.starts_with("# The [runners.cache] example"),
            "{}: names its source",
            file.display()
        );
        let loaded = load(file).unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        assert!(!loaded.config.runners.is_empty(), "{}", file.display());
        for warning in &loaded.warnings {
            assert!(warning.starts_with(&file.display().to_string()), "warnings name the file: {warning}");
        }
    }
}

#[test]
fn machine_driver_keys_outside_docker_machine_and_reservation_throttling_are_warned_by_name() {
    let text = "concurrent = 2\n[[runners]]\n  url = \"https://x\"\n  token = \"t\"\n  executor = \"instance\"\n  [runners.autoscaler]\n    plugin = \"gitlab/fleeting-plugin-aws\"\n    reservation_throttling = false\n  [runners.machine]\n    IdleCount = 1\n    MachineDriver = \"amazonec2\"\n    MachineName = \"ci-%s\"\n    MachineOptions = [\"amazonec2-region=eu-west-1\"]\n";
    let loaded = parse_str(text).expect("loads");
    let want = [
        "/etc/runway/config.toml:8: runners.0.autoscaler.reservation_throttling: not supported by Runway (ignored)",
        "/etc/runway/config.toml:11: runners.0.machine.MachineDriver: not supported by Runway (ignored)",
        "/etc/runway/config.toml:12: runners.0.machine.MachineName: not supported by Runway (ignored)",
        "/etc/runway/config.toml:13: runners.0.machine.MachineOptions: not supported by Runway (ignored)",
    ];
    for w in want {
        assert!(loaded.warnings.iter().any(|got| got == w), "missing {w:?} in {:#?}", loaded.warnings);
    }
    assert_eq!(loaded.warnings.len(), want.len(), "{:#?}", loaded.warnings);
    assert_eq!(loaded.config.runners[0].autoscaler.as_ref().map(|a| a.provider()), Some("aws"));
    // docker+machine reads them (and derives its fleet from them: the [runners.autoscaler]
    // section beside them is what it ignores, by name).
    let machine =
        text.replace("\"instance\"", "\"docker+machine\"").replace("    reservation_throttling = false\n", "");
    let loaded = parse_str(&machine).expect("loads");
    assert_eq!(
        loaded.warnings.iter().map(|w| w.to_string()).collect::<Vec<_>>(),
        ["/etc/runway/config.toml:6: runners[0].autoscaler: docker+machine's fleet is [runners.machine]'s: this section is ignored"]
    );
    let fleet = loaded.config.runners[0].autoscaler.as_ref().expect("derived");
    assert!(fleet.docker_machine.is_some() && fleet.plugin == "aws");
}
