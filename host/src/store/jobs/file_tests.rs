//! The file store: its lock, layout, journal and committer.

use std::os::unix::fs::PermissionsExt as _;

use super::*;

fn key() -> StoreKey {
    StoreKey::from_bytes([7; 32])
}

#[tokio::test]
async fn an_earlier_versions_store_is_moved_whole_unless_in_use() {
    let root = tempfile::tempdir().unwrap();
    let (old, new) = (root.path().join("abcdefghi"), root.path().join("0123456789abcdef"));
    {
        let store = FileStore::open(&old, key()).unwrap();
        store.save(&entry(7, "m1", b"kept")).await.unwrap();
        // While a manager holds the old directory, nothing moves.
        let err = migrate(&old, &new).unwrap_err();
        assert!(matches!(err, JobStoreError::Locked(_)), "{err}");
        assert!(old.is_dir() && !new.exists());
    }
    migrate(&old, &new).unwrap();
    assert!(!old.exists());
    let store = FileStore::open(&new, key()).unwrap();
    let claimed = store.claim(7, "m1", Duration::from_secs(30)).await.unwrap().unwrap();
    assert_eq!(claimed.body, b"kept");
    // Once moved (or when the new one exists), a later start changes nothing.
    std::fs::create_dir_all(&old).unwrap();
    migrate(&old, &new).unwrap();
    assert!(old.is_dir() && new.is_dir());
}

fn entry(job_id: u64, owner: &str, body: &[u8]) -> Entry {
    Entry {
        meta: EntryMeta {
            job_id,
            owner: owner.into(),
            created: 1,
            heartbeat: 0,
            resumes: 0,
            stage: "build_script".into(),
            project: "group/project".into(),
        },
        body: body.to_vec(),
    }
}

#[test]
fn a_second_open_is_locked_and_names_the_holder() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("store");
    let first = FileStore::open(&path, key()).expect("first");
    let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
    assert_eq!(mode, 0o700);
    let err = FileStore::open(&path, key()).expect_err("locked");
    let JobStoreError::Locked(message) = &err else { panic!("{err:?}") };
    assert!(message.contains(&path.display().to_string()), "{message}");
    assert!(message.contains(&format!("pid {}", std::process::id())), "{message}");
    drop(first);
    FileStore::open(&path, key()).expect("free again once the first is dropped");
}

#[tokio::test]
async fn read_only_opens_beside_the_holder_and_never_writes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), key()).expect("open");
    store.save(&entry(5, "m1", b"body")).await.expect("save");
    let reader = FileStore::open_read_only(dir.path(), key()).expect("read-only beside the holder");
    let listed = reader.list().await.expect("list");
    assert!(matches!(listed.as_slice(), [Listed::Entry(m)] if m.job_id == 5 && m.owner == "m1"), "{listed:?}");
    let err = reader.remove(5).await.expect_err("read-only");
    assert!(err.to_string().contains("read-only"), "{err}");
    assert!(reader.claim(5, "m1", Duration::from_secs(30)).await.is_err());
    assert!(FileStore::open_read_only(&dir.path().join("absent"), key()).is_err());
}

#[tokio::test]
async fn list_skips_temporary_and_lock_files_and_reports_unreadable_entries() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), key()).expect("open");
    store.save(&entry(1, "m1", b"one")).await.expect("save");
    std::fs::write(dir.path().join(".tmpAbC123"), b"half a write").expect("temp");
    std::fs::write(dir.path().join("1.trace"), b"trace bytes").expect("trace");
    std::fs::write(dir.path().join("2.json"), b"{ not json").expect("corrupt");
    std::fs::write(
        dir.path().join("3.json"),
        serde_json::to_vec(&EntryFile { meta: entry(4, "m1", b"").meta, body: String::new() }).expect("json"),
    )
    .expect("moved");
    std::fs::write(dir.path().join("notes.json"), b"{}").expect("stray");
    let mut listed = store.list().await.expect("list");
    listed.sort_by_key(|l| match l {
        Listed::Entry(m) => Some(m.job_id),
        Listed::Corrupt { job_id, .. } => *job_id,
    });
    assert_eq!(listed.len(), 4, "{listed:?}");
    assert!(matches!(&listed[0], Listed::Corrupt { job_id: None, location, .. } if location.ends_with("notes.json")));
    assert!(matches!(&listed[1], Listed::Entry(m) if m.job_id == 1));
    assert!(matches!(&listed[2], Listed::Corrupt { job_id: Some(2), .. }), "{:?}", listed[2]);
    assert!(matches!(&listed[3], Listed::Corrupt { job_id: Some(3), error, .. } if error.contains("job 4")));
    // A corrupt entry is claimed as an error, saved over, and removed.
    let err = store.claim(2, "m1", Duration::from_secs(30)).await.expect_err("corrupt");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 2, .. }), "{err:?}");
    store.remove(3).await.expect("remove");
    store.save(&entry(2, "m1", b"two")).await.expect("a corrupt entry is replaced");
    assert!(store.claim(2, "m1", Duration::ZERO).await.expect("claim").is_some());
}

#[tokio::test]
async fn files_are_private_and_hold_no_body_in_clear() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), key()).expect("open");
    store.save(&entry(9, "m1", b"password=hunter2")).await.expect("save");
    store.append_trace(9, 0, b"masked [MASKED]\n").await.expect("trace");
    let private_and_sealed = |names: &[&str]| {
        for name in names {
            let path = dir.path().join(name);
            let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{name}");
            let bytes = std::fs::read(&path).expect("read");
            assert!(!bytes.windows(7).any(|w| w == b"hunter2"), "{name} holds the secret");
        }
    };
    // While the store is open the writes are in the journal; once it is dropped, in the files.
    private_and_sealed(&["journal"]);
    drop(store);
    private_and_sealed(&["journal", "9.json", "9.trace"]);
    assert_eq!(std::fs::read(dir.path().join("9.trace")).expect("trace"), b"masked [MASKED]\n");
    assert_eq!(std::fs::read(dir.path().join("journal")).expect("journal"), journal::MAGIC);
}

/// Copy the files of `from` (not the lock) to `to`: what a crash at this moment leaves.
fn crash_copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for item in std::fs::read_dir(from).expect("list") {
        let item = item.expect("item");
        if item.file_name() != LOCK_FILE {
            std::fs::copy(item.path(), to.join(item.file_name())).expect("copy");
        }
    }
}

#[tokio::test]
async fn what_a_write_returned_for_survives_a_crash_and_a_torn_write_is_dropped() {
    let root = tempfile::tempdir().expect("tempdir");
    let (live, crashed) = (root.path().join("live"), root.path().join("crashed"));
    let store = FileStore::open(&live, key()).expect("open");
    // Many jobs at once: their writes share syncs, each returns once it is on disk.
    let writes = (1..=16u64).map(|job| {
        let store = store.clone();
        async move {
            let body = format!("body {job}");
            store.save_with_trace(&entry(job, "m1", body.as_bytes()), 0, format!("{job}-a\n").as_bytes()).await?;
            store.save_with_trace(&entry(job, "m1", body.as_bytes()), 4, format!("b{job}\n").as_bytes()).await?;
            store.remove(job).await.map(|()| job)
        }
    });
    let removed = futures::future::try_join_all(writes).await.expect("writes");
    assert_eq!(removed.len(), 16);
    store.save(&entry(40, "m1", b"kept")).await.expect("save");
    store.append_trace(40, 0, b"0123456789").await.expect("trace");
    store.append_trace(40, 4, b"XY").await.expect("a longer trace is cut back first");
    // A save over an entry another manager owns is refused and writes nothing.
    let err = store.save(&entry(40, "m2", b"theirs")).await.expect_err("lost");
    assert!(matches!(err, JobStoreError::Lost(40)), "{err:?}");
    // The crash: the directory as it is now, the last write torn in half.
    crash_copy(&live, &crashed);
    let mut torn = Vec::new();
    Record::Save { meta: entry(41, "m1", b"").meta, sealed: vec![0; 64] }.encode(&mut torn).expect("encode");
    let mut journal_file = OpenOptions::new().append(true).open(crashed.join("journal")).expect("journal");
    journal_file.write_all(&torn[..torn.len() / 2]).expect("torn");
    drop(journal_file);
    let reader = FileStore::open_read_only(&crashed, key()).expect("read-only");
    let listed = reader.list().await.expect("list");
    assert!(matches!(listed.as_slice(), [Listed::Entry(m)] if m.job_id == 40), "{listed:?}");
    assert_eq!(reader.read_trace(40, 6).await.expect("trace"), b"0123XY");
    // The next manager brings the journal into the files and has exactly what was written.
    let next = FileStore::open(&crashed, key()).expect("reopen");
    let claimed = next.claim(40, "m1", Duration::from_secs(30)).await.expect("claim").expect("entry");
    assert_eq!((claimed.body.as_slice(), claimed.meta.resumes), (&b"kept"[..], 1));
    assert_eq!(next.read_trace(40, 6).await.expect("trace"), b"0123XY");
    assert!(next.read_trace(40, 7).await.is_err(), "nothing past what was written");
    for job in 1..=16u64 {
        assert!(next.claim(job, "m1", Duration::ZERO).await.expect("claim").is_none(), "job {job} was removed");
        assert!(!crashed.join(format!("{job}.trace")).exists());
    }
    assert_eq!(std::fs::read(crashed.join("40.trace")).expect("trace file"), b"0123XY");
    drop(store);
}

#[tokio::test]
async fn a_long_journal_is_brought_into_the_files_while_the_store_runs() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), key()).expect("open");
    store.save(&entry(3, "m1", b"body")).await.expect("save");
    let chunk = vec![b'x'; 1 << 20];
    let mut offset = 0;
    while offset <= COMPACT_AT {
        store.append_trace(3, offset, &chunk).await.expect("trace");
        offset += chunk.len() as u64;
    }
    store.append_trace(3, offset, b"end").await.expect("trace");
    let journal_len = std::fs::metadata(dir.path().join("journal")).expect("journal").len();
    assert!(journal_len < COMPACT_AT / 4, "the journal was not started over: {journal_len} bytes");
    assert!(std::fs::metadata(dir.path().join("3.trace")).expect("trace file").len() >= COMPACT_AT);
    let trace = store.read_trace(3, offset + 3).await.expect("read");
    assert_eq!(trace.len() as u64, offset + 3);
    assert!(trace.ends_with(b"xend"));
}

#[tokio::test]
async fn a_trace_shorter_than_the_saved_offset_is_corrupt() {
    let dir = tempfile::tempdir().expect("tempdir");
    let store = FileStore::open(dir.path(), key()).expect("open");
    store.append_trace(1, 0, b"abc").await.expect("append");
    let err = store.append_trace(1, 5, b"x").await.expect_err("short");
    assert!(matches!(err, JobStoreError::Corrupt { job_id: 1, .. }), "{err:?}");
    assert!(store.read_trace(1, 4).await.is_err());
    assert_eq!(store.read_trace(1, 2).await.expect("prefix"), b"ab");
    assert_eq!(store.read_trace(2, 0).await.expect("no trace, nothing stored"), b"");
    assert!(store.read_trace(2, 1).await.is_err());
}
