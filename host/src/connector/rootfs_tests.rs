use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

/// Path (without leading `/`) → (entry type, mode, link target, size) of every entry.
fn listing(tar_bytes: &[u8]) -> BTreeMap<String, (tar::EntryType, u32, Option<PathBuf>, u64)> {
    let mut archive = tar::Archive::new(tar_bytes);
    let mut out = BTreeMap::new();
    for entry in archive.entries().unwrap() {
        let entry = entry.unwrap();
        let header = entry.header();
        assert_eq!(header.mtime().unwrap(), MTIME);
        assert_eq!((header.uid().unwrap(), header.gid().unwrap()), (0, 0));
        let path = entry.path().unwrap().to_string_lossy().trim_end_matches('/').to_string();
        let link = entry.link_name().unwrap().map(|l| l.into_owned());
        out.insert(path, (header.entry_type(), header.mode().unwrap(), link, header.size().unwrap()));
    }
    out
}

/// What `ldd` says `program` loads, as real paths: the oracle the ELF reader is checked against.
fn ldd_real_paths(program: &Path) -> Vec<PathBuf> {
    let out = Command::new("ldd").arg(program).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.split_whitespace().filter(|w| w.starts_with('/')).map(|w| std::fs::canonicalize(w).unwrap()).collect()
}

fn rel(path: &Path) -> String {
    path.strip_prefix("/").unwrap().display().to_string()
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Unpack `tar_bytes` into a new directory and run `args` chrooted there.
fn run_chrooted(tar_bytes: &[u8], args: &[&str]) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    tar::Archive::new(tar_bytes).unpack(dir.path()).unwrap();
    // What a container engine provides: /dev/null.
    std::fs::create_dir_all(dir.path().join("dev")).unwrap();
    let null = std::ffi::CString::new(dir.path().join("dev/null").display().to_string()).unwrap();
    // SAFETY: a valid path; makes the null device node (1, 3) as root.
    assert_eq!(unsafe { libc::mknod(null.as_ptr(), libc::S_IFCHR | 0o666, libc::makedev(1, 3)) }, 0);
    let out = Command::new("chroot").arg(dir.path()).args(args).env_clear().env("PATH", STANDARD_PATH).output();
    out.unwrap()
}

#[test]
fn bash_comes_with_every_library_it_loads() {
    let mut builder = RootfsBuilder::new();
    builder.program("bash").unwrap();
    let rootfs = builder.build().unwrap();
    let entries = listing(&rootfs.tar);
    let bash = std::fs::canonicalize(builder.find_program("bash").unwrap()).unwrap();
    assert_eq!(entries.get(&rel(&bash)).map(|e| e.0), Some(tar::EntryType::Regular), "{entries:?}");
    let libraries = ldd_real_paths(&bash);
    assert!(libraries.iter().any(|l| l.to_string_lossy().contains("libc.so")), "ldd found no libc: {libraries:?}");
    for lib in libraries {
        assert_eq!(entries.get(&rel(&lib)).map(|e| e.0), Some(tar::EntryType::Regular), "{} missing", lib.display());
    }
    if is_root() {
        let out = run_chrooted(&rootfs.tar, &["bash", "-c", "echo from the rootfs"]);
        assert_eq!(String::from_utf8_lossy(&out.stdout), "from the rootfs\n", "{out:?}");
    }
}

#[test]
fn links_on_the_way_are_kept_as_links() {
    let mut builder = RootfsBuilder::new();
    builder.program("/bin/sh").unwrap();
    let entries = listing(&builder.build().unwrap().tar);
    let meta = std::fs::symlink_metadata("/bin").unwrap();
    if meta.file_type().is_symlink() {
        let (kind, _, target, _) = &entries["bin"];
        assert_eq!(*kind, tar::EntryType::Symlink);
        assert_eq!(target.as_deref(), Some(std::fs::read_link("/bin").unwrap().as_path()));
    }
    let sh_real = std::fs::canonicalize("/bin/sh").unwrap();
    assert_eq!(entries[&rel(&sh_real)].0, tar::EntryType::Regular);
    if std::fs::symlink_metadata("/usr/bin/sh").unwrap().file_type().is_symlink() {
        assert_eq!(entries["usr/bin/sh"].0, tar::EntryType::Symlink);
    }
}

#[test]
fn output_is_deterministic_whatever_the_order() {
    let build = |programs: &[&str]| {
        let mut builder = RootfsBuilder::new();
        builder.base_system().unwrap();
        for p in programs {
            builder.program(p).unwrap();
        }
        builder.build().unwrap()
    };
    let a = build(&["bash", "cat", "ls"]);
    let b = build(&["ls", "cat", "bash"]);
    assert_eq!(a.sha256, b.sha256);
    assert!(a.tar == b.tar);
    assert_eq!(a.sha256, hex::encode(Sha256::digest(&a.tar)));
    assert_eq!(a.short_hash().len(), 12);
    let c = build(&["bash", "cat"]);
    assert_ne!(a.sha256, c.sha256);
}

#[test]
fn a_missing_program_is_named() {
    let err = RootfsBuilder::new().program("no-such-program-runway").unwrap_err();
    let text = err.to_string();
    assert!(text.contains("`no-such-program-runway`") && text.contains("/usr/bin"), "{text}");
    let mut builder = RootfsBuilder::new();
    assert!(!builder.optional_program("no-such-program-runway").unwrap());
    let err = RootfsBuilder::new().program("/nonexistent/tool").unwrap_err();
    assert!(err.to_string().contains("/nonexistent"), "{err}");
}

#[test]
fn a_missing_library_is_named_with_who_needs_it() {
    // A copy of bash whose DT_NEEDED names a library no machine has (same length, so the
    // string table stays valid).
    let bash = std::fs::canonicalize(RootfsBuilder::new().find_program("bash").unwrap()).unwrap();
    let mut data = std::fs::read(&bash).unwrap();
    let needle = b"libc.so.6\0";
    let at = data.windows(needle.len()).position(|w| w == needle).unwrap();
    data[at..at + needle.len()].copy_from_slice(b"libq.so.6\0");
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("bash");
    std::fs::write(&copy, data).unwrap();
    let err = RootfsBuilder::new().path(&copy).map(|_| ()).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("`libq.so.6`") && text.contains(&copy.display().to_string()), "{text}");
}

#[test]
fn base_system_and_synthetic_files() {
    let mut builder = RootfsBuilder::new();
    builder.base_system().unwrap().file("/etc/runway-image", "job\n", 0o644).unwrap();
    assert!(builder.contains("/etc/passwd"));
    let rootfs = builder.build().unwrap();
    let entries = listing(&rootfs.tar);
    assert_eq!((entries["tmp"].0, entries["tmp"].1), (tar::EntryType::Directory, 0o1777));
    assert_eq!((entries["root"].0, entries["root"].1), (tar::EntryType::Directory, 0o700));
    assert_eq!(entries["etc"].0, tar::EntryType::Directory);
    assert_eq!(entries["etc/runway-image"].3, 4);
    let mut archive = tar::Archive::new(rootfs.tar.as_slice());
    let passwd = archive
        .entries()
        .unwrap()
        .map(|e| e.unwrap())
        .find(|e| e.path().unwrap() == Path::new("etc/passwd"))
        .map(|mut e| {
            let mut s = String::new();
            e.read_to_string(&mut s).unwrap();
            s
        })
        .unwrap();
    assert!(passwd.starts_with("root:x:0:0:"), "{passwd}");
    assert!(matches!(builder.file("relative", "x", 0o644), Err(RootfsError::NotAbsolute(_))));
}

#[test]
fn directories_are_added_whole_and_hard_links_stay_links() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("tree");
    std::fs::create_dir_all(root.join("sub")).unwrap();
    std::fs::write(root.join("sub/a"), "aaaa").unwrap();
    std::fs::hard_link(root.join("sub/a"), root.join("b")).unwrap();
    std::os::unix::fs::symlink("sub/a", root.join("c")).unwrap();
    std::os::unix::fs::symlink("/nonexistent-runway-target", root.join("dangling")).unwrap();
    std::os::unix::fs::symlink(".", root.join("self")).unwrap();
    let mut builder = RootfsBuilder::new();
    builder.path(&root).unwrap();
    let entries = listing(&builder.build().unwrap().tar);
    let r = rel(&root);
    // Sorted order: `b` comes before `sub/a`, so `b` holds the data and `sub/a` links to it.
    assert_eq!(entries[&format!("{r}/b")].0, tar::EntryType::Regular);
    let (kind, _, target, _) = &entries[&format!("{r}/sub/a")];
    assert_eq!((*kind, target.clone()), (tar::EntryType::Link, Some(PathBuf::from(format!("{r}/b")))));
    assert_eq!(entries[&format!("{r}/c")].2.as_deref(), Some(Path::new("sub/a")));
    assert_eq!(entries[&format!("{r}/dangling")].0, tar::EntryType::Symlink);
    assert_eq!(entries[&format!("{r}/self")].0, tar::EntryType::Symlink);
}

#[test]
fn helper_rootfs_has_git_and_its_helpers() {
    let started = std::time::Instant::now();
    let helper = helper_rootfs().unwrap();
    eprintln!("helper image {}: {} bytes in {:?}", helper.reference, helper.rootfs.tar.len(), started.elapsed());
    let prefix = format!("{HELPER_REPOSITORY}:{}-", env!("CARGO_PKG_VERSION"));
    assert_eq!(helper.reference, format!("{prefix}{}", helper.rootfs.short_hash()));
    let entries = listing(&helper.rootfs.tar);
    // The helpers and templates of the git on the search path (a git of its own in /usr/local
    // has them under /usr/local).
    let git = RootfsBuilder::new().find_program("git").unwrap();
    let dirs = git_dirs(&git).unwrap();
    let exec_path = std::fs::canonicalize(&dirs[0]).unwrap();
    for path in [exec_path.join("git-remote-https"), PathBuf::from("/etc/ssl/certs"), PathBuf::from("/tmp")] {
        assert!(entries.contains_key(&rel(&path)), "{} missing from the helper image", path.display());
    }
    // Servers and other transports of git's exec path are left out.
    for unused in GIT_UNUSED.iter().map(|name| exec_path.join(name)).filter(|p| p.exists()) {
        assert!(!entries.contains_key(&rel(&unused)), "{} is in the helper image", unused.display());
    }
    // The helper executable (`runway-helper` beside the running one, else the running one:
    // here a test binary) is the helper of artifacts and caches, at its fixed path.
    let runway = &entries[&rel(Path::new(HELPER_BINARY))];
    assert_eq!(runway.0, tar::EntryType::Regular);
    let exe_len = std::fs::metadata(helper_executable().unwrap()).unwrap().len();
    assert_eq!(runway.3, exe_len, "the helper executable");
    assert_eq!(dirs.len(), 2, "no templates beside {}: {dirs:?}", dirs[0].display());
    if is_root() {
        let out = run_chrooted(
            &helper.rootfs.tar,
            &[
                "sh",
                "-c",
                "git --version && tar --version | head -1 && git init -q /tmp/r 2>&1 && ls /tmp/r/.git/hooks",
            ],
        );
        assert!(out.status.success(), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stdout).starts_with("git version"), "{out:?}");
        let helper_path = exec_path.join("git-remote-https").display().to_string();
        let out = run_chrooted(&helper.rootfs.tar, &[&helper_path]);
        // Without arguments it complains about usage, after loading every library it needs.
        assert!(!String::from_utf8_lossy(&out.stderr).contains("error while loading"), "{out:?}");
    }
}
