//! Tests of the archive module: real files in temp directories, archives read back with the
//! `zip` crate and, where installed, Info-ZIP's `zip`/`unzip` (compared with what they do).

use std::fs;
use std::io::{Read, Write};
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;

use super::*;

fn write_file(root: &Path, rel: &str, content: &[u8]) {
    let p = root.join(rel);
    fs::create_dir_all(p.parent().unwrap()).unwrap();
    fs::write(p, content).unwrap();
}

fn sel(paths: &[&str], exclude: &[&str]) -> Selection {
    Selection {
        paths: paths.iter().map(|s| s.to_string()).collect(),
        exclude: exclude.iter().map(|s| s.to_string()).collect(),
        untracked: false,
    }
}

fn names(s: &Selected) -> Vec<String> {
    s.entries.iter().map(|p| p.to_string_lossy().into_owned()).collect()
}

/// out/a.txt, out/b.log, out/sub/c.txt, out/sub/deep/d.txt, top.txt, other/e.txt
fn project() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    for f in ["out/a.txt", "out/b.log", "out/sub/c.txt", "out/sub/deep/d.txt", "top.txt", "other/e.txt"] {
        write_file(d.path(), f, f.as_bytes());
    }
    d
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("-v").output().map(|o| o.status.success()).unwrap_or(false)
}

// ---------------------------------------------------------------- selection

#[test]
fn a_directory_adds_its_whole_tree_sorted() {
    let d = project();
    let s = select(d.path(), &sel(&["out", "top.txt"], &[])).unwrap();
    assert_eq!(
        names(&s),
        ["out", "out/a.txt", "out/b.log", "out/sub", "out/sub/c.txt", "out/sub/deep", "out/sub/deep/d.txt", "top.txt"]
    );
    assert!(s.warnings.is_empty(), "{:?}", s.warnings);
    assert!(s.infos.contains(&"out: found 7 matching artifact files and directories".to_string()), "{:?}", s.infos);
}

#[test]
fn globs_have_doublestar_semantics() {
    let d = project();
    let s = select(d.path(), &sel(&["**/*.txt"], &[])).unwrap();
    assert_eq!(names(&s), ["other/e.txt", "out/a.txt", "out/sub/c.txt", "out/sub/deep/d.txt", "top.txt"]);
    let s = select(d.path(), &sel(&["out/*.txt"], &[])).unwrap();
    assert_eq!(names(&s), ["out/a.txt"]);
    // `*` matches a directory, which is then walked.
    let s = select(d.path(), &sel(&["out/s*"], &[])).unwrap();
    assert_eq!(names(&s), ["out/sub", "out/sub/c.txt", "out/sub/deep", "out/sub/deep/d.txt"]);
    // `dir/**` is the directory and everything below.
    let s = select(d.path(), &sel(&["out/sub/**"], &[])).unwrap();
    assert_eq!(names(&s), ["out/sub", "out/sub/c.txt", "out/sub/deep", "out/sub/deep/d.txt"]);
    // A trailing `/` matches directories only.
    let s = select(d.path(), &sel(&["out/*/"], &[])).unwrap();
    assert_eq!(names(&s), ["out/sub", "out/sub/c.txt", "out/sub/deep", "out/sub/deep/d.txt"]);
    let s = select(d.path(), &sel(&["{top,other/e}.txt"], &[])).unwrap();
    assert_eq!(names(&s), ["other/e.txt", "top.txt"]);
    // `./` prefixes and absolute paths inside the project are the same paths.
    let abs = d.path().join("out/*.log").to_string_lossy().into_owned();
    let s = select(d.path(), &sel(&["./top.txt", &abs], &[])).unwrap();
    assert_eq!(names(&s), ["out/b.log", "top.txt"]);
}

#[test]
fn excludes_are_counted_per_rule_and_do_not_prune_the_walk() {
    let d = project();
    let s = select(d.path(), &sel(&["out"], &["out/*.txt", "**/*.log", "out/sub"])).unwrap();
    // `out/sub` excludes the directory entry only; its files stay, as in gitlab-runner.
    assert_eq!(names(&s), ["out", "out/sub/c.txt", "out/sub/deep", "out/sub/deep/d.txt"]);
    assert!(s.infos.contains(&"out/*.txt: excluded 1 files".to_string()), "{:?}", s.infos);
    assert!(s.infos.contains(&"**/*.log: excluded 1 files".to_string()), "{:?}", s.infos);
    assert!(s.infos.contains(&"out/sub: excluded 1 files".to_string()), "{:?}", s.infos);
    let s = select(d.path(), &sel(&["out"], &["out/sub/**"])).unwrap();
    assert_eq!(names(&s), ["out", "out/a.txt", "out/b.log"]);
    assert!(s.infos.contains(&"out/sub/**: excluded 4 files".to_string()), "{:?}", s.infos);
}

#[test]
fn paths_outside_the_project_are_refused_with_gitlab_runners_warning() {
    let d = project();
    let outside = tempfile::tempdir().unwrap();
    write_file(outside.path(), "secret", b"x");
    let abs_outside = outside.path().join("secret").to_string_lossy().into_owned();
    let s = select(d.path(), &sel(&["../secret", &abs_outside, "out/../../x/*", "top.txt"], &[])).unwrap();
    assert_eq!(names(&s), ["top.txt"]);
    for p in ["../secret", abs_outside.as_str(), "out/../../x/*"] {
        let w = format!("processPath: artifact path is not a subpath of project directory: {p}");
        assert!(s.warnings.contains(&w), "{w} not in {:?}", s.warnings);
    }
    // An exclude rule outside the project is a warning and excludes nothing.
    let s = select(d.path(), &sel(&["top.txt"], &["../*"])).unwrap();
    assert_eq!(names(&s), ["top.txt"]);
    assert_eq!(s.warnings, ["isExcluded: artifact path is not a subpath of project directory: ../*"]);
}

#[test]
fn no_matching_files_and_empty_paths_warn() {
    let d = project();
    let s = select(d.path(), &sel(&["missing/*.xml", "", "nothere"], &[])).unwrap();
    assert!(s.entries.is_empty());
    let wd = d.path().display();
    assert_eq!(
        s.warnings,
        [
            format!(
                "missing/*.xml: no matching files. Ensure that the artifact path is relative to the working directory ({wd})"
            ),
            "No matching files. Path is empty.".to_string(),
            format!("nothere: no matching files. Ensure that the artifact path is relative to the working directory ({wd})"),
        ]
    );
}

#[test]
fn symlinks_are_entries_and_never_followed() {
    let d = project();
    let outside = tempfile::tempdir().unwrap();
    write_file(outside.path(), "big/file", b"x");
    symlink(outside.path().join("big"), d.path().join("out/link")).unwrap();
    symlink("sub", d.path().join("out/inner")).unwrap();
    let s = select(d.path(), &sel(&["out"], &[])).unwrap();
    assert!(names(&s).contains(&"out/link".to_string()));
    assert!(names(&s).contains(&"out/inner".to_string()));
    assert!(!names(&s).iter().any(|n| n.starts_with("out/link/") || n.starts_with("out/inner/")), "{:?}", names(&s));
    let s = select(d.path(), &sel(&["**/file"], &[])).unwrap();
    assert!(s.entries.is_empty(), "** went through a link: {:?}", names(&s));
}

#[test]
fn the_project_directory_itself_is_no_entry() {
    let d = project();
    let s = select(d.path(), &sel(&["."], &[])).unwrap();
    assert_eq!(names(&s).len(), 10);
    assert!(!names(&s).contains(&".".to_string()));
    let s2 = select(d.path(), &sel(&[&d.path().to_string_lossy()], &[])).unwrap();
    assert_eq!(s.entries, s2.entries);
}

#[test]
fn untracked_lists_what_git_does_not_track_including_ignored_files() {
    let d = project();
    let git = |args: &[&str]| {
        let o = Command::new("git").args(args).current_dir(d.path()).output().unwrap();
        assert!(o.status.success(), "git {args:?}: {}", String::from_utf8_lossy(&o.stderr));
    };
    git(&["init", "-q"]);
    git(&["add", "out", "other"]);
    write_file(d.path(), ".gitignore", b"*.tmp\n");
    write_file(d.path(), "build/x.tmp", b"ignored");
    let s = select(d.path(), &Selection { untracked: true, ..Default::default() }).unwrap();
    assert_eq!(names(&s), [".gitignore", "build/x.tmp", "top.txt"]);
    assert_eq!(s.infos, ["untracked: found 3 files"]);
    let s =
        select(d.path(), &Selection { untracked: true, exclude: vec!["*.txt".into()], ..Default::default() }).unwrap();
    assert_eq!(names(&s), [".gitignore", "build/x.tmp"]);
}

#[test]
fn untracked_outside_a_git_repository_warns() {
    let d = project();
    let s = select(d.path(), &Selection { untracked: true, ..Default::default() }).unwrap();
    assert!(s.entries.is_empty());
    assert!(s.warnings.iter().any(|w| w.starts_with("untracked: ")), "{:?}", s.warnings);
}

// ---------------------------------------------------------------- zip writer

fn zip_of(root: &Path, entries: &[&str], level: Level) -> (Vec<u8>, Written) {
    let entries: Vec<PathBuf> = entries.iter().map(PathBuf::from).collect();
    let mut out = Vec::new();
    let w = write(Format::Zip, level, root, &entries, &mut out).unwrap();
    (out, w)
}

fn random_bytes(n: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

fn rich_tree() -> tempfile::TempDir {
    let d = tempfile::tempdir().unwrap();
    write_file(d.path(), "dir/text.txt", "hello world\n".repeat(1000).as_bytes());
    write_file(d.path(), "dir/random.bin", &random_bytes(50_000, 7));
    write_file(d.path(), "dir/empty", b"");
    write_file(d.path(), "run.sh", b"#!/bin/sh\necho hi\n");
    fs::set_permissions(d.path().join("run.sh"), fs::Permissions::from_mode(0o755)).unwrap();
    fs::set_permissions(d.path().join("dir/empty"), fs::Permissions::from_mode(0o600)).unwrap();
    symlink("text.txt", d.path().join("dir/link")).unwrap();
    fs::create_dir(d.path().join("dir/emptydir")).unwrap();
    d
}

const RICH: &[&str] = &["dir", "dir/empty", "dir/emptydir", "dir/link", "dir/random.bin", "dir/text.txt", "run.sh"];

fn extra_field(extra: &[u8], id: u16) -> Option<Vec<u8>> {
    let mut i = 0;
    while i + 4 <= extra.len() {
        let tag = u16::from_le_bytes([extra[i], extra[i + 1]]);
        let len = u16::from_le_bytes([extra[i + 2], extra[i + 3]]) as usize;
        if tag == id {
            return Some(extra[i + 4..i + 4 + len].to_vec());
        }
        i += 4 + len;
    }
    None
}

/// The central directory records, parsed by hand: (name, made-by, external attrs, extra).
fn central_records(zip: &[u8]) -> Vec<(String, u16, u32, Vec<u8>)> {
    let mut out = Vec::new();
    let mut i = 0;
    while i + 46 <= zip.len() {
        if zip[i..i + 4] == [0x50, 0x4b, 0x01, 0x02] {
            let made_by = u16::from_le_bytes([zip[i + 4], zip[i + 5]]);
            let n = u16::from_le_bytes([zip[i + 28], zip[i + 29]]) as usize;
            let e = u16::from_le_bytes([zip[i + 30], zip[i + 31]]) as usize;
            let attrs = u32::from_le_bytes([zip[i + 38], zip[i + 39], zip[i + 40], zip[i + 41]]);
            let name = String::from_utf8(zip[i + 46..i + 46 + n].to_vec()).unwrap();
            out.push((name, made_by, attrs, zip[i + 46 + n..i + 46 + n + e].to_vec()));
            i += 46 + n + e;
        } else {
            i += 1;
        }
    }
    out
}

#[test]
fn zip_entries_carry_gitlab_runners_metadata() {
    let d = rich_tree();
    let (bytes, written) = zip_of(d.path(), RICH, Level::Default);
    assert_eq!(written.entries, 7);
    assert_eq!(written.bytes_out, bytes.len() as u64);
    assert!(written.warnings.is_empty());

    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
    let mut seen = Vec::new();
    for i in 0..zip.len() {
        let mut f = zip.by_index(i).unwrap();
        let name = f.name().unwrap().to_string();
        let mode = f.unix_mode().unwrap();
        let method = f.compression();
        let mut content = Vec::new();
        f.read_to_end(&mut content).unwrap();
        seen.push(name.clone());
        match name.as_str() {
            "dir/" | "dir/emptydir/" => {
                assert!(f.is_dir());
                assert_eq!(mode & 0o170000, 0o040000);
            }
            "dir/link" => {
                assert!(f.is_symlink());
                assert_eq!(content, b"text.txt");
                assert_eq!(method, zip::CompressionMethod::Stored);
            }
            "dir/text.txt" => {
                assert_eq!(method, zip::CompressionMethod::Deflated);
                assert_eq!(content, fs::read(d.path().join("dir/text.txt")).unwrap());
                assert_eq!(mode, 0o100644);
            }
            "dir/random.bin" => {
                // Deflate does not shrink random bytes: stored, as `zip` does.
                assert_eq!(method, zip::CompressionMethod::Stored);
                assert_eq!(content, random_bytes(50_000, 7));
            }
            "dir/empty" => {
                assert!(content.is_empty());
                assert_eq!(mode, 0o100600);
            }
            "run.sh" => assert_eq!(mode, 0o100755),
            other => panic!("unexpected entry {other}"),
        }
    }
    assert_eq!(seen, ["dir/", "dir/empty", "dir/emptydir/", "dir/link", "dir/random.bin", "dir/text.txt", "run.sh"]);

    let meta = fs::symlink_metadata(d.path().join("dir/text.txt")).unwrap();
    let records = central_records(&bytes);
    assert_eq!(records.len(), 7);
    for (name, made_by, attrs, extra) in &records {
        assert_eq!(made_by >> 8, 3, "{name}: creator is unix");
        let ugid = extra_field(extra, 0x7875).unwrap_or_else(|| panic!("{name}: no 0x7875"));
        assert_eq!(ugid.len(), 11);
        assert_eq!(&ugid[..2], &[1, 4]);
        assert_eq!(u32::from_le_bytes(ugid[2..6].try_into().unwrap()), meta.uid());
        assert_eq!(u32::from_le_bytes(ugid[7..11].try_into().unwrap()), meta.gid());
        let ts = extra_field(extra, 0x5455).unwrap_or_else(|| panic!("{name}: no 0x5455"));
        assert_eq!(ts[0], 1);
        if name == "dir/text.txt" {
            assert_eq!(u32::from_le_bytes(ts[1..5].try_into().unwrap()) as i64, meta.mtime());
            assert_eq!(attrs >> 16, 0o100644);
        }
        if name.ends_with('/') {
            assert_eq!(attrs & 0x10, 0x10, "{name}: MS-DOS directory bit");
        }
    }
}

#[test]
fn fastest_stores_and_the_levels_parse_like_gitlab_runner() {
    let d = rich_tree();
    let (bytes, _) = zip_of(d.path(), RICH, Level::Fastest);
    let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
    for i in 0..zip.len() {
        assert_eq!(zip.by_index(i).unwrap().compression(), zip::CompressionMethod::Stored);
    }
    let (slowest, _) = zip_of(d.path(), RICH, Level::Slowest);
    let (fast, _) = zip_of(d.path(), RICH, Level::Fast);
    assert!(slowest.len() <= fast.len());

    assert_eq!(Level::from_variable("fastest"), (Level::Fastest, None));
    assert_eq!(Level::from_variable(""), (Level::Default, None));
    assert_eq!(Level::from_variable("slowest").0.deflate(), Some(9));
    let (level, warning) = Level::from_variable("turbo");
    assert_eq!(level, Level::Default);
    assert_eq!(warning.unwrap(), "compression level \"turbo\" is invalid, falling back to default");
    assert_eq!("gzip".parse::<Format>().unwrap(), Format::Gzip);
    assert_eq!(Format::Zip.file_name("reports/junit"), "junit.zip");
    assert_eq!(Format::Gzip.file_name("junit"), "junit.gz");
    assert_eq!(Format::Raw.file_name(""), "default");
    let err = "zipzstd".parse::<Format>().unwrap_err().to_string();
    assert!(err.contains("\"zipzstd\" format: unsupported archive format"), "{err}");
}

#[test]
fn vanished_and_special_files_are_ignored_with_a_warning() {
    let d = rich_tree();
    let fifo = d.path().join("fifo");
    assert!(Command::new("mkfifo").arg(&fifo).status().unwrap().success());
    let (bytes, written) = zip_of(d.path(), &["gone.txt", "fifo", "run.sh"], Level::Default);
    assert_eq!(written.entries, 1);
    assert!(written.warnings[0].starts_with("File ignored: lstat gone.txt: "), "{:?}", written.warnings);
    assert_eq!(written.warnings[1], "File ignored: fifo");
    assert_eq!(zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap().len(), 1);
}

#[test]
fn entries_outside_the_project_are_refused() {
    let d = rich_tree();
    for bad in ["/etc/hostname", "../x", "dir/../../x"] {
        let err = write(Format::Zip, Level::Default, d.path(), &[PathBuf::from(bad)], &mut Vec::new()).unwrap_err();
        assert!(err.to_string().starts_with(&format!("{bad}: archive: entries must be relative")), "{err}");
    }
}

#[test]
fn git_directory_parts_warn() {
    let d = tempfile::tempdir().unwrap();
    write_file(d.path(), ".git/config", b"[core]\n");
    let (_, written) = zip_of(d.path(), &[".git/config"], Level::Default);
    assert_eq!(
        written.warnings,
        ["Part of .git directory is on the list of files to archive", "This may introduce unexpected problems"]
    );
}

#[test]
fn large_files_are_staged_and_round_trip() {
    let d = tempfile::tempdir().unwrap();
    let mut big = "0123456789abcdef\n".repeat(400_000).into_bytes(); // 6.8 MB, above zip_write::MEM_LIMIT
    big.extend(random_bytes(1 << 20, 3));
    write_file(d.path(), "big.txt", &big);
    write_file(d.path(), "small.txt", b"small");
    for level in [Level::Fastest, Level::Default] {
        let (bytes, written) = zip_of(d.path(), &["big.txt", "small.txt"], level);
        assert_eq!(written.bytes_in, big.len() as u64 + 5);
        let mut zip = zip::ZipArchive::new(std::io::Cursor::new(&bytes)).unwrap();
        let mut content = Vec::new();
        zip.by_name("big.txt").unwrap().read_to_end(&mut content).unwrap();
        assert!(content == big, "{level:?}: big.txt differs");
    }
}

#[test]
fn info_zip_reads_our_archives_as_its_own() {
    if !have("unzip") {
        eprintln!("unzip not installed: skipped");
        return;
    }
    let d = rich_tree();
    let (bytes, _) = zip_of(d.path(), RICH, Level::Default);
    let archive = d.path().join("a.zip");
    fs::write(&archive, &bytes).unwrap();
    let t = Command::new("unzip").arg("-tq").arg(&archive).output().unwrap();
    assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stdout));
    let z = Command::new("unzip").arg("-Z").arg(&archive).output().unwrap();
    let listing = String::from_utf8_lossy(&z.stdout);
    assert!(listing.contains("lrwxrwxrwx") && listing.contains("-rwxr-xr-x"), "{listing}");
    assert!(listing.lines().filter(|l| l.contains(" unx ")).count() == 7, "{listing}");
    let into = tempfile::tempdir().unwrap();
    let x = Command::new("unzip").arg("-q").arg(&archive).arg("-d").arg(into.path()).output().unwrap();
    assert!(x.status.success(), "{}", String::from_utf8_lossy(&x.stderr));
    assert_eq!(fs::read_link(into.path().join("dir/link")).unwrap(), Path::new("text.txt"));
    assert_eq!(fs::read(into.path().join("dir/random.bin")).unwrap(), random_bytes(50_000, 7));
    let m = fs::metadata(into.path().join("run.sh")).unwrap();
    assert_eq!(m.mode() & 0o777, 0o755);
    assert_eq!(m.mtime(), fs::metadata(d.path().join("run.sh")).unwrap().mtime());
}

#[test]
fn zip64_when_entries_exceed_65535() {
    let d = tempfile::tempdir().unwrap();
    let mut entries = Vec::new();
    for i in 0..66_000 {
        let name = format!("f{i:05}");
        fs::write(d.path().join(&name), b"").unwrap();
        entries.push(PathBuf::from(name));
    }
    let mut out = Vec::new();
    let w = write(Format::Zip, Level::Default, d.path(), &entries, &mut out).unwrap();
    assert_eq!(w.entries, 66_000);
    let zip = zip::ZipArchive::new(std::io::Cursor::new(&out)).unwrap();
    assert_eq!(zip.len(), 66_000);
    if have("unzip") {
        let archive = d.path().join("z.zip");
        fs::write(&archive, &out).unwrap();
        let t = Command::new("unzip").arg("-tq").arg(&archive).output().unwrap();
        assert!(t.status.success(), "{}", String::from_utf8_lossy(&t.stdout));
    }
}

// ---------------------------------------------------------------- extraction

#[test]
fn extraction_restores_files_modes_times_links_and_directories() {
    let d = rich_tree();
    let old = filetime(d.path().join("dir/text.txt"), 1_500_000_000);
    filetime(d.path().join("dir"), 1_400_000_000);
    let (bytes, _) = zip_of(d.path(), RICH, Level::Default);
    let archive = tempfile::NamedTempFile::new().unwrap();
    fs::write(archive.path(), &bytes).unwrap();
    let dest = tempfile::tempdir().unwrap();
    let target = dest.path().join("new/sub");
    let x = extract_zip(archive.path(), &target).unwrap();
    assert_eq!(x.entries, 7);
    assert!(x.warnings.is_empty(), "{:?}", x.warnings);
    assert_eq!(fs::read(target.join("dir/text.txt")).unwrap(), fs::read(d.path().join("dir/text.txt")).unwrap());
    assert_eq!(fs::read(target.join("dir/random.bin")).unwrap(), random_bytes(50_000, 7));
    assert_eq!(fs::read_link(target.join("dir/link")).unwrap(), Path::new("text.txt"));
    assert!(target.join("dir/emptydir").is_dir());
    assert_eq!(fs::metadata(target.join("run.sh")).unwrap().mode() & 0o777, 0o755);
    assert_eq!(fs::metadata(target.join("dir/empty")).unwrap().mode() & 0o777, 0o600);
    assert_eq!(fs::metadata(target.join("dir/text.txt")).unwrap().mtime(), old);
    assert_eq!(fs::metadata(target.join("dir")).unwrap().mtime(), 1_400_000_000, "directory time set after its files");
    assert_eq!(x.bytes, fs::metadata(d.path().join("dir/text.txt")).unwrap().len() + 50_000 + 18);
}

fn filetime(path: PathBuf, secs: i64) -> i64 {
    let f = fs::File::open(&path).unwrap();
    f.set_modified(std::time::UNIX_EPOCH + std::time::Duration::from_secs(secs as u64)).unwrap();
    secs
}

#[test]
fn extraction_overwrites_existing_files_and_links() {
    let d = rich_tree();
    let (bytes, _) = zip_of(d.path(), RICH, Level::Default);
    let archive = tempfile::NamedTempFile::new().unwrap();
    fs::write(archive.path(), &bytes).unwrap();
    let dest = tempfile::tempdir().unwrap();
    write_file(dest.path(), "dir/text.txt", b"old and longer than anything else in here .......");
    fs::set_permissions(dest.path().join("dir/text.txt"), fs::Permissions::from_mode(0o444)).unwrap();
    write_file(dest.path(), "elsewhere", b"keep");
    symlink(dest.path().join("elsewhere"), dest.path().join("run.sh")).unwrap();
    write_file(dest.path(), "dir/link", b"a file where the link goes");
    write_file(dest.path(), "unrelated", b"stays");
    extract_zip(archive.path(), dest.path()).unwrap();
    assert_eq!(fs::read(dest.path().join("dir/text.txt")).unwrap(), fs::read(d.path().join("dir/text.txt")).unwrap());
    assert!(!fs::symlink_metadata(dest.path().join("run.sh")).unwrap().file_type().is_symlink());
    assert_eq!(fs::read(dest.path().join("elsewhere")).unwrap(), b"keep", "not written through the old link");
    assert_eq!(fs::read_link(dest.path().join("dir/link")).unwrap(), Path::new("text.txt"));
    assert_eq!(fs::read(dest.path().join("unrelated")).unwrap(), b"stays");
}

fn crafted(entries: &[(&str, Option<&str>, &[u8])]) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().unwrap();
    let mut w = zip::ZipWriter::new(fs::File::create(file.path()).unwrap());
    let opts = zip::write::SimpleFileOptions::default().compression_method(zip::CompressionMethod::Stored);
    for (name, link, data) in entries {
        match link {
            Some(target) => w.add_symlink(*name, *target, opts).unwrap(),
            None => {
                w.start_file(*name, opts).unwrap();
                w.write_all(data).unwrap();
            }
        }
    }
    w.finish().unwrap();
    file
}

#[test]
fn zip_slip_is_refused_naming_the_entry() {
    let outside = tempfile::tempdir().unwrap();
    let dest = tempfile::tempdir().unwrap();
    let root = dest.path().join("root");

    let a = crafted(&[("ok.txt", None, b"fine"), ("../evil.txt", None, b"x")]);
    let err = extract_zip(a.path(), &root).unwrap_err().to_string();
    assert!(err.contains("entry \"../evil.txt\"") && err.contains("'..'"), "{err}");
    assert!(!dest.path().join("evil.txt").exists());

    let abs = format!("{}/abs.txt", outside.path().display());
    let a = crafted(&[(&abs, None, b"x")]);
    let err = extract_zip(a.path(), &root).unwrap_err().to_string();
    assert!(err.contains("absolute names"), "{err}");
    assert!(!outside.path().join("abs.txt").exists());

    // A link pointing out is extracted as a link, but nothing is written through it.
    let out_str = outside.path().to_string_lossy().into_owned();
    let a = crafted(&[("escape", Some(&out_str), b""), ("escape/pwned.txt", None, b"x")]);
    let err = extract_zip(a.path(), &root).unwrap_err().to_string();
    assert!(err.contains("entry \"escape/pwned.txt\"") && err.contains("outside the destination"), "{err}");
    assert!(!outside.path().join("pwned.txt").exists());

    // Also when the link was already there before extraction, and through a relative link.
    let root2 = dest.path().join("root2");
    fs::create_dir_all(&root2).unwrap();
    symlink("../..", root2.join("up")).unwrap();
    let a = crafted(&[("up/x/pwned.txt", None, b"x")]);
    assert!(extract_zip(a.path(), &root2).is_err());

    // A link that stays inside may be written through.
    let a = crafted(&[("real/", None, b""), ("alias", Some("real"), b""), ("alias/f.txt", None, b"in")]);
    extract_zip(a.path(), &root).unwrap();
    assert_eq!(fs::read(root.join("real/f.txt")).unwrap(), b"in");
}

#[test]
fn archives_made_by_info_zip_extract() {
    if !have("zip") {
        eprintln!("zip not installed: skipped");
        return;
    }
    let d = rich_tree();
    let archive = tempfile::tempdir().unwrap().keep().join("info.zip");
    let z = Command::new("zip").args(["-q", "-r", "-y"]).arg(&archive).arg(".").current_dir(d.path()).output().unwrap();
    assert!(z.status.success(), "{}", String::from_utf8_lossy(&z.stderr));
    let dest = tempfile::tempdir().unwrap();
    let x = extract_zip(&archive, dest.path()).unwrap();
    assert_eq!(x.entries, 7);
    assert_eq!(fs::read_link(dest.path().join("dir/link")).unwrap(), Path::new("text.txt"));
    assert_eq!(fs::metadata(dest.path().join("run.sh")).unwrap().mode() & 0o777, 0o755);
    assert_eq!(
        fs::metadata(dest.path().join("run.sh")).unwrap().mtime(),
        fs::metadata(d.path().join("run.sh")).unwrap().mtime()
    );
    fs::remove_file(&archive).unwrap();
}

#[test]
fn a_broken_archive_is_an_error_naming_it() {
    let f = tempfile::NamedTempFile::new().unwrap();
    fs::write(f.path(), b"this is not a zip").unwrap();
    let dest = tempfile::tempdir().unwrap();
    let err = extract_zip(f.path(), dest.path()).unwrap_err().to_string();
    assert!(err.starts_with(&f.path().display().to_string()), "{err}");
}

// ---------------------------------------------------------------- gzip and raw

#[test]
fn gzip_is_one_member_per_file_with_names_in_the_header() {
    let d = project();
    write_file(d.path(), "out/ünï.xml", b"<unicode/>");
    let entries: Vec<PathBuf> = ["out/a.txt", "out/b.log", "out/ünï.xml"].iter().map(PathBuf::from).collect();
    let mut out = Vec::new();
    let w = write(Format::Gzip, Level::Default, d.path(), &entries, &mut out).unwrap();
    assert_eq!(w.entries, 3);
    let mut all = String::new();
    flate2::read::MultiGzDecoder::new(&out[..]).read_to_string(&mut all).unwrap();
    assert_eq!(all, "out/a.txtout/b.log<unicode/>");
    // The members, one by one.
    let mut rest: &[u8] = &out;
    let mut headers = Vec::new();
    while !rest.is_empty() {
        let mut dec = flate2::bufread::GzDecoder::new(rest);
        let mut s = Vec::new();
        dec.read_to_end(&mut s).unwrap();
        let h = dec.header().unwrap();
        headers.push((
            String::from_utf8(h.filename().unwrap().to_vec()).unwrap(),
            String::from_utf8(h.comment().unwrap().to_vec()).unwrap(),
        ));
        rest = dec.into_inner();
    }
    assert_eq!(
        headers,
        [
            ("a.txt".to_string(), "out/a.txt".to_string()),
            ("b.log".to_string(), "out/b.log".to_string()),
            ("e:%C3%BCn%C3%AF.xml".to_string(), "e:out%2F%C3%BCn%C3%AF.xml".to_string()),
        ]
    );
    if have("gzip") {
        let f = d.path().join("r.gz");
        fs::write(&f, &out).unwrap();
        let o = Command::new("gzip").arg("-dc").arg(&f).output().unwrap();
        assert_eq!(String::from_utf8(o.stdout).unwrap(), all);
    }
    let err = write(Format::Gzip, Level::Default, d.path(), &[PathBuf::from("out")], &mut Vec::new()).unwrap_err();
    assert_eq!(err.to_string(), "the \"out\" is not a regular file");
}

#[test]
fn raw_is_exactly_one_file() {
    let d = project();
    let mut out = Vec::new();
    let w = write(Format::Raw, Level::Default, d.path(), &[PathBuf::from("top.txt")], &mut out).unwrap();
    assert_eq!(out, b"top.txt");
    assert_eq!(w.bytes_out, 7);
    let two = [PathBuf::from("top.txt"), PathBuf::from("other/e.txt")];
    let err = write(Format::Raw, Level::Default, d.path(), &two, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ArchiveError::TooManyRawFiles(2)), "{err}");
    let err = write(Format::Raw, Level::Default, d.path(), &[PathBuf::from("out")], &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ArchiveError::NotRegular(_)), "{err}");
    let mut none = Vec::new();
    write(Format::Raw, Level::Default, d.path(), &[], &mut none).unwrap();
    assert!(none.is_empty());
}

// ---------------------------------------------------------------- metadata

fn provenance() -> metadata::Provenance {
    metadata::Provenance {
        runner_id: 42,
        repo_url: "https://gitlab.example/group/project".into(),
        repo_digest: "0123abcd".into(),
        job_name: "build".into(),
        executor_name: "docker".into(),
        runner_name: "runner-1".into(),
        parameters: vec!["CI_PIPELINE_ID".into()],
        started_at: "2026-11-23T10:00:00Z".into(),
        ended_at: "2026-11-23T10:05:30+01:00".into(),
        schema_version: "v1".into(),
        job_id: 1000,
        version: "0.1.0".into(),
        revision: "abc123".into(),
        architecture: "amd64".into(),
    }
}

#[test]
fn metadata_statement_has_slsa_provenance_and_file_digests() {
    let d = project();
    let entries: Vec<PathBuf> = ["top.txt", "out", "out/a.txt"].iter().map(PathBuf::from).collect();
    let (v, warnings) = metadata::statement(&provenance(), d.path(), &entries).unwrap();
    assert!(warnings.is_empty());
    assert_eq!(v["_type"], "https://in-toto.io/Statement/v0.1");
    assert_eq!(v["predicateType"], "https://slsa.dev/provenance/v1");
    let subjects = v["subject"].as_array().unwrap();
    assert_eq!(subjects.len(), 2, "directories are no subjects");
    assert_eq!(subjects[0]["name"], "out/a.txt");
    // sha256("out/a.txt")
    let expected = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(b"out/a.txt"));
    assert_eq!(subjects[0]["digest"]["sha256"], expected);
    let p = &v["predicate"];
    assert_eq!(
        p["buildDefinition"]["buildType"],
        "https://gitlab.com/gitlab-org/gitlab-runner/-/blob/abc123/PROVENANCE.md"
    );
    assert_eq!(p["buildDefinition"]["externalParameters"]["entryPoint"], "build");
    assert_eq!(p["buildDefinition"]["externalParameters"]["CI_PIPELINE_ID"], "");
    assert_eq!(p["buildDefinition"]["internalParameters"]["job"], "1000");
    assert_eq!(p["buildDefinition"]["resolvedDependencies"][0]["digest"]["sha256"], "0123abcd");
    assert_eq!(p["runDetails"]["builder"]["id"], "https://gitlab.example/group/project/-/runners/42");
    assert_eq!(p["runDetails"]["metadata"]["invocationId"], "1000");
    assert_eq!(p["runDetails"]["metadata"]["startedOn"], "2026-11-23T10:00:00Z");
    assert_eq!(p["runDetails"]["metadata"]["finishedOn"], "2026-11-23T09:05:30Z");

    let (rel, _) = metadata::write_statement(&provenance(), "my-artifact", d.path(), &entries).unwrap();
    assert_eq!(rel, PathBuf::from("my-artifact-metadata.json"));
    let back: serde_json::Value = serde_json::from_slice(&fs::read(d.path().join(&rel)).unwrap()).unwrap();
    assert_eq!(back, v);

    let mut bad = provenance();
    bad.started_at = "yesterday".into();
    let err = metadata::statement(&bad, d.path(), &entries).unwrap_err().to_string();
    assert!(err.contains("--started-at \"yesterday\""), "{err}");
    let mut other = provenance();
    other.schema_version = "v2".into();
    other.version = "v17.0.0".into();
    let (v, warnings) = metadata::statement(&other, d.path(), &entries).unwrap();
    assert_eq!(warnings, ["Unknown SLSA provenance version v2, defaulting to v1"]);
    assert_eq!(v["predicate"]["runDetails"]["builder"]["version"]["gitlab-runner"], "v17.0.0");
}

#[test]
fn as_root_extraction_restores_the_archived_owner() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("not root: skipped");
        return;
    }
    let d = tempfile::tempdir().unwrap();
    write_file(d.path(), "owned.txt", b"mine");
    std::os::unix::fs::lchown(d.path().join("owned.txt"), Some(1234), Some(5678)).unwrap();
    let (bytes, _) = zip_of(d.path(), &["owned.txt"], Level::Default);
    let archive = tempfile::NamedTempFile::new().unwrap();
    fs::write(archive.path(), &bytes).unwrap();
    let dest = tempfile::tempdir().unwrap();
    extract_zip(archive.path(), dest.path()).unwrap();
    let m = fs::metadata(dest.path().join("owned.txt")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 5678));
}
