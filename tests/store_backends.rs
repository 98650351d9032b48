//! The job store contract, run the same way against both backends: a `FileStore` in a
//! temporary directory and a `RedisStore` on a real `redis-server` each test starts on a free
//! port of 127.0.0.1 (stopped by PID). Plus what only one backend has: the file lock, Redis
//! leases contested by several connections at once, Redis restarts.

#[path = "support/redis_server.rs"]
mod redis_server;

use std::sync::Arc;
use std::time::{Duration, Instant};

use redis_server::RedisServer;
use runway::store::jobs::file::FileStore;
use runway::store::jobs::redis::RedisStore;
use runway::store::jobs::seal::StoreKey;
use runway::store::jobs::{Entry, EntryMeta, JobStore, JobStoreError, Listed};

/// A value the body carries that must never be found at rest.
const SECRET: &str = "s3cr3t-masked-value-6f1d";

fn key() -> StoreKey {
    StoreKey::from_bytes([42; 32])
}

fn entry(job_id: u64, owner: &str, body: &[u8]) -> Entry {
    Entry {
        meta: EntryMeta {
            job_id,
            owner: owner.into(),
            created: 1_700_000_000,
            heartbeat: 0,
            resumes: 0,
            stage: "build_script".into(),
            project: "group/project".into(),
        },
        body: body.to_vec(),
    }
}

fn metas(listed: &[Listed]) -> Vec<EntryMeta> {
    let mut out: Vec<EntryMeta> = listed
        .iter()
        .filter_map(|l| match l {
            Listed::Entry(m) => Some(m.clone()),
            Listed::Corrupt { .. } => None,
        })
        .collect();
    out.sort_by_key(|m| m.job_id);
    out
}

// ---- the contract, for any backend ----

async fn round_trip(store: &dyn JobStore) {
    let body = format!("{{\"payload\":\"{SECRET}\"}}").into_bytes();
    store.save(&entry(1, "m1", &body)).await.expect("save");
    let now = store.now().await.expect("now");
    let listed = metas(&store.list().await.expect("list"));
    assert_eq!(listed.len(), 1, "{listed:?}");
    let meta = &listed[0];
    assert_eq!((meta.job_id, meta.owner.as_str(), meta.resumes), (1, "m1", 0));
    assert_eq!(
        (meta.stage.as_str(), meta.project.as_str(), meta.created),
        ("build_script", "group/project", 1_700_000_000)
    );
    assert!(
        meta.heartbeat <= now && now - meta.heartbeat <= 5,
        "heartbeat {} set by the store (now {now})",
        meta.heartbeat
    );

    // The same manager after a restart takes its own entry back at once.
    let claimed = store.claim(1, "m1", Duration::from_secs(30)).await.expect("claim").expect("own entry");
    assert_eq!(claimed.body, body);
    assert_eq!((claimed.meta.owner.as_str(), claimed.meta.resumes), ("m1", 1));
    assert_eq!(metas(&store.list().await.expect("list"))[0].resumes, 1, "the resume is stored");

    // Saving again keeps what the caller says (the resume count it was handed).
    let mut next = claimed.clone();
    next.meta.stage = "after_script".into();
    next.body = b"second".to_vec();
    store.save(&next).await.expect("save again");
    let again = store.claim(1, "m1", Duration::from_secs(30)).await.expect("claim").expect("own entry");
    assert_eq!(
        (again.body.as_slice(), again.meta.stage.as_str(), again.meta.resumes),
        (&b"second"[..], "after_script", 2)
    );

    store.remove(1).await.expect("remove");
    store.remove(1).await.expect("removing twice is fine");
    assert!(store.list().await.expect("list").is_empty());
    assert!(store.claim(1, "m1", Duration::from_secs(30)).await.expect("claim").is_none(), "gone");
}

async fn trace(store: &dyn JobStore) {
    store.append_trace(2, 0, b"hello ").await.expect("append");
    store.append_trace(2, 6, b"world").await.expect("append");
    assert_eq!(store.read_trace(2, 11).await.expect("read"), b"hello world");
    assert_eq!(store.read_trace(2, 5).await.expect("prefix"), b"hello");
    // Bytes past the last saved offset were never confirmed: they are replaced.
    store.append_trace(2, 6, b"there").await.expect("truncate and append");
    assert_eq!(store.read_trace(2, 11).await.expect("read"), b"hello there");
    assert!(store.read_trace(2, 12).await.is_err(), "fewer bytes stored than asked");
    let err = store.append_trace(2, 20, b"x").await.expect_err("a gap");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 2, .. }), "{err:?}");
    assert_eq!(store.read_trace(2, 11).await.expect("unchanged"), b"hello there");
    store.append_trace(2, 0, b"").await.expect("truncate to nothing");
    assert_eq!(store.read_trace(2, 0).await.expect("empty"), b"");
    assert!(store.read_trace(2, 1).await.is_err());
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    store.append_trace(2, 0, &big[..60_000]).await.expect("append");
    store.append_trace(2, 60_000, &big[60_000..]).await.expect("append");
    assert_eq!(store.read_trace(2, 100_000).await.expect("read"), big);
    store.save(&entry(2, "m1", b"b")).await.expect("save");
    store.remove(2).await.expect("remove");
    assert!(store.read_trace(2, 1).await.is_err(), "remove deletes the trace");
}

async fn lease(store: &dyn JobStore) {
    let timeout = Duration::from_secs(1);
    store.save(&entry(3, "m1", b"three")).await.expect("save");
    assert!(store.claim(3, "m2", timeout).await.expect("claim").is_none(), "m1's heartbeat is fresh");
    let err = store.save(&entry(3, "m2", b"stolen")).await.expect_err("not m2's");
    assert!(matches!(err, JobStoreError::Lost(3)), "{err:?}");
    // Once the heartbeat is older than the timeout, another manager takes the job.
    let deadline = Instant::now() + Duration::from_secs(15);
    let taken = loop {
        if let Some(entry) = store.claim(3, "m2", timeout).await.expect("claim") {
            break entry;
        }
        assert!(Instant::now() < deadline, "the lease never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    assert_eq!((taken.meta.owner.as_str(), taken.meta.resumes, taken.body.as_slice()), ("m2", 1, &b"three"[..]));
    // The old owner is told it lost the job; the new one saves; the old one cannot claim it back.
    let err = store.save(&entry(3, "m1", b"late")).await.expect_err("m1 lost it");
    assert!(matches!(err, JobStoreError::Lost(3)), "{err:?}");
    store.save(&taken).await.expect("m2 saves");
    assert!(store.claim(3, "m1", Duration::from_secs(30)).await.expect("claim").is_none(), "m2 is alive");
    store.remove(3).await.expect("remove");
}

async fn contract(store: &dyn JobStore) {
    round_trip(store).await;
    trace(store).await;
    lease(store).await;
}

// ---- the file store ----

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_keeps_the_contract() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(&dir.path().join("store"), key()).expect("open");
    assert!(store.describe().starts_with("file "), "{}", store.describe());
    contract(&store).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_holds_no_secret_and_refuses_a_wrong_key() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store");
    let store = FileStore::open(&path, key()).expect("open");
    store.save(&entry(7, "m1", format!("token={SECRET}").as_bytes())).await.expect("save");
    store.append_trace(7, 0, b"$ echo [MASKED]\n").await.expect("trace");
    let mut files = 0;
    for item in std::fs::read_dir(&path).expect("list") {
        let bytes = std::fs::read(item.expect("entry").path()).expect("read");
        assert!(!contains(&bytes, SECRET.as_bytes()), "a store file holds the secret in clear");
        files += 1;
    }
    // While the store is open its writes are in the journal (beside the lock); once it is
    // dropped, in the entry and trace files.
    assert!(files >= 2, "journal and lock");
    drop(store);
    for item in std::fs::read_dir(&path).expect("list") {
        let bytes = std::fs::read(item.expect("entry").path()).expect("read");
        assert!(!contains(&bytes, SECRET.as_bytes()), "a store file holds the secret in clear");
    }
    assert!(path.join("7.json").exists() && path.join("7.trace").exists(), "entry and trace files");
    let other = FileStore::open(&path, StoreKey::from_bytes([43; 32])).expect("reopen");
    let err = other.claim(7, "m1", Duration::from_secs(30)).await.expect_err("wrong key");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 7, .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_locked_file_store_refuses_a_second_manager() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store");
    let store = FileStore::open(&path, key()).expect("open");
    let err = FileStore::open(&path, key()).expect_err("same process");
    assert!(matches!(&err, JobStoreError::Locked(m) if m.contains(&format!("pid {}", std::process::id()))), "{err}");
    // Another process sees the lock too (util-linux's flock, non-blocking).
    let status =
        std::process::Command::new("flock").arg("-n").arg(path.join(".lock")).arg("true").status().expect("flock runs");
    assert!(!status.success(), "another process took the lock");
    drop(store);
    let status =
        std::process::Command::new("flock").arg("-n").arg(path.join(".lock")).arg("true").status().expect("flock");
    assert!(status.success(), "the lock is released with the store");
}

// ---- the Redis store ----

async fn redis_store(server: &RedisServer, namespace: &str, key: StoreKey) -> RedisStore {
    RedisStore::open(&server.url(), namespace, key).await.expect("connect")
}

async fn raw(server: &RedisServer) -> redis::aio::MultiplexedConnection {
    redis::Client::open(server.url()).expect("client").get_multiplexed_async_connection().await.expect("connect")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_store_keeps_the_contract() {
    let server = RedisServer::start();
    let store = redis_store(&server, "abc123", key()).await;
    assert_eq!(store.describe(), format!("redis {}", server.url()));
    contract(&store).await;
    // Another runner's namespace is another store.
    store.save(&entry(9, "m1", b"nine")).await.expect("save");
    let other = redis_store(&server, "zzz999", key()).await;
    assert!(other.list().await.expect("list").is_empty());
    assert!(other.claim(9, "m1", Duration::ZERO).await.expect("claim").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_versions_redis_namespace_moves_to_the_token_digest_once() {
    let server = RedisServer::start();
    let old = redis_store(&server, "abcdefghi", key()).await;
    old.save(&entry(5, "m1", b"five")).await.expect("save");
    old.append_trace(5, 0, b"log of five").await.expect("trace");
    let new = redis_store(&server, "0123456789abcdef", key()).await;
    new.migrate("abcdefghi").await.expect("migrate");
    let claimed = new.claim(5, "m1", Duration::from_secs(30)).await.expect("claim").expect("moved");
    assert_eq!(claimed.body, b"five");
    assert_eq!(new.read_trace(5, 11).await.expect("trace"), b"log of five");
    let mut conn = raw(&server).await;
    let left: Vec<String> =
        redis::cmd("KEYS").arg("runway:store:{abcdefghi}:*").query_async(&mut conn).await.expect("keys");
    assert!(left.is_empty(), "the old namespace is emptied: {left:?}");
    // Once the new namespace has entries, an old one (another runner sharing the prefix under
    // an earlier version) is not merged in.
    let stray = redis_store(&server, "abcdefghi", key()).await;
    stray.save(&entry(6, "m2", b"six")).await.expect("save");
    new.migrate("abcdefghi").await.expect("migrate again");
    assert!(new.claim(6, "m2", Duration::ZERO).await.expect("claim").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_values_hold_no_secret_and_a_wrong_key_is_corrupt() {
    let server = RedisServer::start();
    let store = redis_store(&server, "abc123", key()).await;
    store.save(&entry(7, "m1", format!("token={SECRET}").as_bytes())).await.expect("save");
    store.append_trace(7, 0, b"$ echo [MASKED]\n").await.expect("trace");
    let mut conn = raw(&server).await;
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query_async(&mut conn).await.expect("keys");
    assert_eq!(keys.len(), 3, "hash, set and trace: {keys:?}");
    for k in &keys {
        assert!(k.starts_with("runway:store:{abc123}:"), "{k}");
        let kind: String = redis::cmd("TYPE").arg(k).query_async(&mut conn).await.expect("type");
        let values: Vec<Vec<u8>> = match kind.as_str() {
            "string" => vec![redis::cmd("GET").arg(k).query_async(&mut conn).await.expect("get")],
            "hash" => redis::cmd("HGETALL").arg(k).query_async(&mut conn).await.expect("hgetall"),
            "set" => redis::cmd("SMEMBERS").arg(k).query_async(&mut conn).await.expect("smembers"),
            other => panic!("{k}: unexpected type {other}"),
        };
        assert!(!values.is_empty(), "{k}");
        for value in values {
            assert!(!contains(&value, SECRET.as_bytes()), "{k} holds the secret in clear");
        }
    }
    let other = redis_store(&server, "abc123", StoreKey::from_bytes([43; 32])).await;
    let err = other.claim(7, "m1", Duration::from_secs(30)).await.expect_err("wrong key");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 7, .. }), "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exactly_one_of_many_concurrent_claimers_wins_each_expired_lease() {
    let server = RedisServer::start();
    let timeout = Duration::from_secs(1);
    let dead = redis_store(&server, "ns", key()).await;
    let jobs: Vec<u64> = (100..110).collect();
    for id in &jobs {
        dead.save(&entry(*id, "dead-manager", b"body")).await.expect("save");
    }
    // Every lease expires together; then eight managers, each on its own connection, race for
    // every job at once.
    let deadline = Instant::now() + Duration::from_secs(15);
    while dead.now().await.expect("now") < metas(&dead.list().await.expect("list"))[0].heartbeat + 2 {
        assert!(Instant::now() < deadline, "the server clock does not move");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut managers = Vec::new();
    for m in 0..8 {
        managers.push(Arc::new(redis_store(&server, "ns", key()).await));
        let _ = m;
    }
    let mut tasks = Vec::new();
    for id in jobs.clone() {
        for (m, store) in managers.iter().enumerate() {
            let store = Arc::clone(store);
            tasks.push(tokio::spawn(async move {
                (id, m, store.claim(id, &format!("m{m}"), timeout).await.expect("claim").is_some())
            }));
        }
    }
    let mut winners = std::collections::BTreeMap::new();
    for task in tasks {
        let (id, m, won) = task.await.expect("task");
        if won {
            winners.entry(id).or_insert_with(Vec::new).push(m);
        }
    }
    for id in &jobs {
        assert_eq!(winners.get(id).map(Vec::len), Some(1), "job {id}: winners {:?}", winners.get(id));
    }
    for meta in metas(&dead.list().await.expect("list")) {
        assert_eq!(meta.resumes, 1, "job {}: one resume counted", meta.job_id);
        assert_eq!(format!("m{}", winners[&meta.job_id][0]), meta.owner);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_corrupt_entries_are_listed_and_removable() {
    let server = RedisServer::start();
    let store = redis_store(&server, "ns", key()).await;
    store.save(&entry(1, "m1", b"fine")).await.expect("save");
    let mut conn = raw(&server).await;
    let prefix = store.prefix().to_string();
    let _: () = redis::cmd("HSET")
        .arg(format!("{prefix}job:5"))
        .arg("meta")
        .arg("not json")
        .arg("owner")
        .arg("m1")
        .arg("heartbeat")
        .arg(1)
        .arg("resumes")
        .arg(0)
        .query_async(&mut conn)
        .await
        .expect("hset");
    let _: () = redis::cmd("SADD")
        .arg(format!("{prefix}jobs"))
        .arg(5)
        .arg(6)
        .arg("junk")
        .query_async(&mut conn)
        .await
        .expect("sadd");
    let listed = store.list().await.expect("list");
    assert_eq!(metas(&listed).len(), 1);
    let mut corrupt: Vec<Option<u64>> = listed
        .iter()
        .filter_map(|l| match l {
            Listed::Corrupt { job_id, .. } => Some(*job_id),
            Listed::Entry(_) => None,
        })
        .collect();
    corrupt.sort();
    assert_eq!(corrupt, vec![None, Some(5), Some(6)], "{listed:?}");
    let err = store.claim(5, "m2", Duration::ZERO).await.expect_err("corrupt meta");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 5, .. }), "{err:?}");
    store.remove(5).await.expect("remove");
    store.remove(6).await.expect("remove");
    assert_eq!(store.list().await.expect("list").len(), 2, "the entry and the junk member remain");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_store_reconnects_after_the_server_restarts() {
    let mut server = RedisServer::start();
    let store = redis_store(&server, "ns", key()).await;
    store.save(&entry(1, "m1", b"one")).await.expect("save");
    server.restart();
    // The server lost everything (no persistence); the store reconnects by itself.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        match store.save(&entry(2, "m1", b"two")).await {
            Ok(()) => break,
            Err(JobStoreError::Backend(_)) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no reconnect: {e}"),
        }
    }
    let ids: Vec<u64> = metas(&store.list().await.expect("list")).iter().map(|m| m.job_id).collect();
    assert_eq!(ids, vec![2]);
    // A server that is away is an error (the manager keeps serving), not a hang.
    server.stop();
    let err = store.list().await.expect_err("server away");
    assert!(matches!(err, JobStoreError::Backend(_)), "{err:?}");
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

// ---- `runway store` ----

const RUNWAY: &str = env!("CARGO_BIN_EXE_runway");
/// The token of the test runner; its short token is `abcdefghi`.
const TOKEN: &str = "glrt-t1_abcdefghijkl";

fn write_config(dir: &std::path::Path, store_section: &str) -> std::path::PathBuf {
    let path = dir.join("config.toml");
    let text = format!(
        "concurrent = 1\n[[runners]]\nname = \"r1\"\nurl = \"https://gitlab.example.com\"\ntoken = \"{TOKEN}\"\nexecutor = \"shell\"\n{store_section}"
    );
    std::fs::write(&path, text).expect("config");
    path
}

struct Run {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

fn runway(config: &std::path::Path, args: &[&str], env: &[(&str, &std::path::Path)]) -> Run {
    let mut command = std::process::Command::new(RUNWAY);
    command.arg("-c").arg(config).args(args).env_remove("RUNWAY_STORE_KEY");
    for (name, value) in env {
        command.env(name, value);
    }
    let out = command.output().expect("runway runs");
    let run = Run {
        code: out.status.code(),
        stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    };
    assert!(!run.stderr.contains("panicked"), "{}", run.stderr);
    assert!(!run.stdout.contains(SECRET) && !run.stderr.contains(SECRET), "a body was shown");
    run
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runway_store_reads_a_store_a_manager_holds_and_forgets_only_once_it_is_free() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "");
    let store_dir = dir.path().join(".runway/store/abcdefghi");
    // The manager's store (the default path), holding its lock.
    let manager = FileStore::open(&store_dir, key()).expect("open");
    manager.save(&entry(77, "s_0123456789ab", format!("token={SECRET}").as_bytes())).await.expect("save");
    std::fs::write(store_dir.join("78.json"), b"{ torn").expect("corrupt entry");

    let list = runway(&config, &["store", "list"], &[]);
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    let lines: Vec<&str> = list.stdout.lines().collect();
    assert!(lines[0].starts_with("RUNNER") && lines[0].contains("HEARTBEAT"), "{}", list.stdout);
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..7], ["r1", "(abcdefghi)", "77", "group/project", "s_0123456789ab", "build_script", row[6]]);
    assert!(row[6].ends_with('s') && row[7] == "ago" && row[8] == "0", "{}", list.stdout);
    assert!(list.stdout.contains("job 78: unreadable entry"), "{}", list.stdout);

    let show = runway(&config, &["store", "show", "77", "--runner", "abcdefghi"], &[]);
    assert_eq!(show.code, Some(0), "{}", show.stderr);
    assert!(
        show.stdout.contains("project:   group/project") && show.stdout.contains("body:      sealed"),
        "{}",
        show.stdout
    );
    assert_eq!(runway(&config, &["store", "show", "79"], &[]).code, Some(1));
    let unknown = runway(&config, &["store", "list", "--runner", "nosuch"], &[]);
    assert!(unknown.code == Some(1) && unknown.stderr.contains("r1 (abcdefghi)"), "{}", unknown.stderr);

    let refused = runway(&config, &["store", "forget", "77"], &[]);
    assert_eq!(refused.code, Some(1), "{}", refused.stdout);
    assert!(
        refused.stderr.contains(&format!("pid {}", std::process::id())) && refused.stderr.contains("stop that manager"),
        "{}",
        refused.stderr
    );
    let still = runway(&config, &["store", "show", "77", "--runner", "abcdefghi"], &[]);
    assert_eq!(still.code, Some(0), "nothing removed while locked: {}", still.stderr);

    drop(manager);
    for job in ["77", "78"] {
        let forgot = runway(&config, &["store", "forget", job], &[]);
        assert_eq!(forgot.code, Some(0), "{}", forgot.stderr);
        assert!(forgot.stdout.contains(&format!("Forgot job {job} of runner r1 (abcdefghi)")), "{}", forgot.stdout);
    }
    assert_eq!(runway(&config, &["store", "forget", "77"], &[]).code, Some(1), "already gone");
    assert_eq!(runway(&config, &["store", "list"], &[]).stdout.trim(), "No stored jobs.");
    assert!(!dir.path().join(".runway-store.key").exists(), "runway store never needs (or creates) the key");
}

#[test]
fn runway_store_says_when_the_store_is_off_or_empty() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(dir.path(), "[runners.store]\nname = \"none\"\n");
    let off = runway(&config, &["store", "list"], &[]);
    assert!(off.code == Some(0) && off.stdout.contains("r1 (abcdefghi): the job store is off"), "{}", off.stdout);
    let config = write_config(dir.path(), "");
    let empty = runway(&config, &["store", "list"], &[]);
    assert!(empty.code == Some(0) && empty.stdout.contains("does not exist yet"), "{}", empty.stdout);
    assert!(!dir.path().join(".runway").exists(), "listing creates nothing");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runway_store_lists_a_redis_store_over_tls_and_verifies_the_certificate() {
    let server = RedisServer::start_tls();
    let (_, ca) = server.tls.clone().expect("tls");
    // A manager wrote through the plain port; the operator reads over TLS.
    let manager = redis_store(&server, "abcdefghi", key()).await;
    manager.save(&entry(90, "s_0123456789ab", format!("token={SECRET}").as_bytes())).await.expect("save");
    let dir = tempfile::tempdir().expect("tempdir");
    let section = format!("[runners.store]\nname = \"redis\"\n[runners.store.redis]\nurl = \"{}\"\n", server.tls_url());
    let config = write_config(dir.path(), &section);
    let list = runway(&config, &["store", "list"], &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(list.code, Some(0), "{}", list.stderr);
    assert!(list.stdout.contains("90") && list.stdout.contains("s_0123456789ab"), "{}", list.stdout);
    // Without the test CA the server's certificate is not trusted: TLS is verified.
    let untrusted = runway(&config, &["store", "list"], &[("SSL_CERT_FILE", std::path::Path::new("/dev/null"))]);
    assert_eq!(untrusted.code, Some(1), "{}", untrusted.stdout);
    assert!(untrusted.stderr.contains("redis rediss://127.0.0.1"), "{}", untrusted.stderr);
    let forgot = runway(&config, &["store", "forget", "90"], &[("SSL_CERT_FILE", &ca)]);
    assert_eq!(forgot.code, Some(0), "{}", forgot.stderr);
    assert!(manager.list().await.expect("list").is_empty());
}
