//! Root filesystems for `docker import`, made from files of the runner's own machine: Runway's
//! helper image (bash, git, tar, coreutils, CA certificates, …) needs no registry, and tests
//! build their job and service images the same way.
//!
//! [`RootfsBuilder`] collects programs (by name on a fixed search path, or by path), whole
//! directories and synthetic files, and puts each at the path it has on this machine. Every ELF
//! file brings its shared-library closure: its program interpreter and its `DT_NEEDED`
//! libraries, read from the ELF itself with the `object` crate (already in the build through
//! wasmtime) and resolved the way `ld.so` does — `DT_RPATH`/`DT_RUNPATH` (with `$ORIGIN`), the
//! directories of `/etc/ld.so.conf` and its includes, then the default directories — taking only
//! libraries of the same ELF class and machine. `ldd` is not used: it runs the program's loader
//! (unsafe on a file one does not trust) and its output is a format for people. Symbolic links
//! are kept as links (also those in the middle of a path, such as `/lib → usr/lib` on a
//! merged-`/usr` system) and their targets added too; hard links become tar hard links.
//!
//! [`RootfsBuilder::build`] writes a deterministic tar: entries sorted by path, owner root,
//! modification time [`MTIME`], no user or group names; setuid and setgid bits are dropped. The
//! SHA-256 of that tar names the content ([`Rootfs::sha256`]), so the same files give the same
//! image tag. [`helper_rootfs`] is the helper image's content and reference.
//!
//! All of this reads files synchronously: call it from a blocking task.
//!
//! Owns: reading the runner's files into a root filesystem tar. Must not touch: Docker (the
//! caller imports the tar), WIT types, plugins.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::io::Read;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Component, Path, PathBuf};

use object::elf;
use object::read::elf::{FileHeader, ProgramHeader};
use object::Endianness;
use sha2::{Digest, Sha256};

/// The directories programs are looked up in: Docker's default `PATH` for containers, so a
/// program found here is on the container's `PATH` too.
pub const STANDARD_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The modification time of every entry (2000-01-01T00:00:00Z): fixed, so the same files give
/// the same tar.
pub const MTIME: u64 = 946_684_800;

/// Where `ld.so` looks after the configured directories (64-bit and 32-bit defaults).
const DEFAULT_LIB_DIRS: &[&str] = &["/lib64", "/usr/lib64", "/lib", "/usr/lib"];

/// Symbolic links followed while resolving one path before giving up (as the kernel's 40).
const MAX_LINK_HOPS: u32 = 40;

/// What went wrong while collecting or writing a root filesystem.
#[derive(Debug, thiserror::Error)]
pub enum RootfsError {
    /// A program asked for by name is on none of the search directories.
    #[error("program `{program}` not found in {search_path}")]
    ProgramNotFound {
        /// The name asked for.
        program: String,
        /// The directories searched, `:`-separated.
        search_path: String,
    },
    /// A shared library an ELF file needs is in none of the library directories.
    #[error("library `{library}` needed by {needed_by} not found in {searched}")]
    LibraryNotFound {
        /// The `DT_NEEDED` name.
        library: String,
        /// The file that needs it.
        needed_by: PathBuf,
        /// The directories searched, `:`-separated.
        searched: String,
    },
    /// A path that must be absolute is not.
    #[error("{0}: not an absolute path")]
    NotAbsolute(PathBuf),
    /// Too many symbolic links while resolving a path (a loop).
    #[error("{0}: too many levels of symbolic links")]
    LinkLoop(PathBuf),
    /// An ELF file whose headers cannot be read.
    #[error("{path}: unreadable ELF file: {message}")]
    BadElf {
        /// The file.
        path: PathBuf,
        /// What the ELF reader said.
        message: String,
    },
    /// Reading a file or writing the tar failed.
    #[error("{path}: {source}")]
    Io {
        /// The file (or the entry being written).
        path: PathBuf,
        /// The error.
        source: std::io::Error,
    },
}

fn io_err(path: &Path) -> impl FnOnce(std::io::Error) -> RootfsError + '_ {
    move |source| RootfsError::Io { path: path.to_path_buf(), source }
}

/// One entry of the root filesystem, keyed by its absolute path in the image.
#[derive(Debug, Clone)]
enum Entry {
    /// A directory with its permission bits.
    Dir { mode: u32 },
    /// A file of this machine, read when the tar is written; `inode` finds hard links.
    HostFile { source: PathBuf, mode: u32, inode: Option<(u64, u64)> },
    /// A file with the given content.
    Data { data: Vec<u8>, mode: u32 },
    /// A symbolic link to `target` (as written, relative or absolute).
    Symlink { target: PathBuf },
}

/// A root filesystem written as a tar, with its content hash.
#[derive(Debug, Clone)]
pub struct Rootfs {
    /// The tar archive (uncompressed), ready for `docker import` / `POST /images/create?fromSrc=-`.
    pub tar: Vec<u8>,
    /// The SHA-256 of `tar`, lowercase hex.
    pub sha256: String,
}

impl Rootfs {
    /// The first 12 hex digits of the content hash, for an image tag.
    pub fn short_hash(&self) -> &str {
        &self.sha256[..12]
    }
}

/// Collects files of the runner's machine into a root filesystem (see the module doc).
#[derive(Debug, Clone)]
pub struct RootfsBuilder {
    entries: BTreeMap<PathBuf, Entry>,
    /// Directories whose whole tree is in (a directory entry alone may be just a parent).
    trees: BTreeSet<PathBuf>,
    search_path: Vec<PathBuf>,
    lib_dirs: Vec<PathBuf>,
}

impl Default for RootfsBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl RootfsBuilder {
    /// An empty root filesystem (just `/`), looking programs up on [`STANDARD_PATH`] and
    /// libraries where this machine's `ld.so` would.
    pub fn new() -> Self {
        let mut entries = BTreeMap::new();
        entries.insert(PathBuf::from("/"), Entry::Dir { mode: 0o755 });
        RootfsBuilder {
            entries,
            trees: BTreeSet::new(),
            search_path: split_path(STANDARD_PATH),
            lib_dirs: system_lib_dirs(),
        }
    }

    /// Look programs up in these directories (`:`-separated, like `PATH`) instead.
    pub fn search_path(&mut self, path: &str) -> &mut Self {
        self.search_path = split_path(path);
        self
    }

    /// Add the program `name`: found on the search path when it has no `/`, else taken as a
    /// path. Links on the way are kept, and an ELF program brings its libraries.
    pub fn program(&mut self, name: &str) -> Result<&mut Self, RootfsError> {
        let path = self.find_program(name)?;
        self.path(&path)
    }

    /// Add the program `name` if it is on the search path; `Ok(false)` when it is not.
    pub fn optional_program(&mut self, name: &str) -> Result<bool, RootfsError> {
        match self.find_program(name) {
            Ok(path) => self.path(&path).map(|_| true),
            Err(RootfsError::ProgramNotFound { .. }) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// Add `path` of this machine at the same place: a file (with its libraries when it is an
    /// ELF file), a directory with everything under it, or a symbolic link and its target.
    pub fn path(&mut self, path: &Path) -> Result<&mut Self, RootfsError> {
        self.add_host_path(path, true)?;
        Ok(self)
    }

    /// Add the file `source` of this machine at `path` (absolute) in the image, with its mode
    /// and (an ELF file) its libraries, replacing what was there.
    pub fn host_file(&mut self, path: &str, source: &Path) -> Result<&mut Self, RootfsError> {
        let path = image_path(path)?;
        let meta = std::fs::metadata(source).map_err(io_err(source))?;
        self.ensure_parents(&path);
        let mode = meta.permissions().mode() & 0o1777;
        self.entries.insert(path, Entry::HostFile { source: source.to_path_buf(), mode, inode: None });
        self.add_libraries_of(source)?;
        Ok(self)
    }

    /// Add a file with `data` at `path` (absolute) in the image, replacing what was there.
    pub fn file(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) -> Result<&mut Self, RootfsError> {
        let path = image_path(path)?;
        self.ensure_parents(&path);
        self.entries.insert(path, Entry::Data { data: data.into(), mode: mode & 0o7777 });
        Ok(self)
    }

    /// Add an empty directory at `path` (absolute) with `mode` (e.g. `0o1777` for `/tmp`).
    pub fn dir(&mut self, path: &str, mode: u32) -> Result<&mut Self, RootfsError> {
        let path = image_path(path)?;
        self.ensure_parents(&path);
        self.entries.insert(path, Entry::Dir { mode: mode & 0o7777 });
        Ok(self)
    }

    /// What every image needs besides programs: `/etc/passwd` and `/etc/group` with `root` and
    /// `nobody`, `/etc/nsswitch.conf` (files, then DNS), `/tmp` (1777) and `/root` (0700).
    pub fn base_system(&mut self) -> Result<&mut Self, RootfsError> {
        self.file(
            "/etc/passwd",
            "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
            0o644,
        )?;
        self.file("/etc/group", "root:x:0:\nnogroup:x:65534:\n", 0o644)?;
        self.file("/etc/nsswitch.conf", "passwd: files\ngroup: files\nhosts: files dns\n", 0o644)?;
        self.dir("/tmp", 0o1777)?;
        self.dir("/root", 0o700)
    }

    /// Whether `path` (absolute, in the image) has an entry.
    pub fn contains(&self, path: &str) -> bool {
        self.entries.contains_key(Path::new(path))
    }

    /// Write the tar: sorted, root-owned, fixed times; hard links of this machine as tar hard
    /// links (to the first path in sorted order).
    pub fn build(&self) -> Result<Rootfs, RootfsError> {
        let mut builder = tar::Builder::new(Vec::new());
        let mut first_of_inode: HashMap<(u64, u64), PathBuf> = HashMap::new();
        for (path, entry) in &self.entries {
            if path == Path::new("/") {
                continue;
            }
            let name = path.strip_prefix("/").unwrap_or(path);
            let mut header = tar::Header::new_gnu();
            header.set_uid(0);
            header.set_gid(0);
            header.set_mtime(MTIME);
            let write = |r: std::io::Result<()>| r.map_err(io_err(path));
            match entry {
                Entry::Dir { mode } => {
                    header.set_entry_type(tar::EntryType::Directory);
                    header.set_mode(*mode);
                    header.set_size(0);
                    write(builder.append_data(&mut header, name, std::io::empty()))?;
                }
                Entry::Symlink { target } => {
                    header.set_entry_type(tar::EntryType::Symlink);
                    header.set_mode(0o777);
                    header.set_size(0);
                    write(builder.append_link(&mut header, name, target))?;
                }
                Entry::Data { data, mode } => {
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_mode(*mode);
                    header.set_size(data.len() as u64);
                    write(builder.append_data(&mut header, name, data.as_slice()))?;
                }
                Entry::HostFile { source, mode, inode } => {
                    header.set_mode(*mode);
                    if let Some(first) = inode.and_then(|key| first_of_inode.get(&key)) {
                        header.set_entry_type(tar::EntryType::Link);
                        header.set_size(0);
                        let target = first.strip_prefix("/").unwrap_or(first).to_path_buf();
                        write(builder.append_link(&mut header, name, target))?;
                        continue;
                    }
                    let mut data = Vec::new();
                    std::fs::File::open(source).and_then(|mut f| f.read_to_end(&mut data)).map_err(io_err(source))?;
                    header.set_entry_type(tar::EntryType::Regular);
                    header.set_size(data.len() as u64);
                    write(builder.append_data(&mut header, name, data.as_slice()))?;
                    if let Some(key) = inode {
                        first_of_inode.insert(*key, path.clone());
                    }
                }
            }
        }
        let tar = builder.into_inner().map_err(io_err(Path::new("/")))?;
        let sha256 = hex::encode(Sha256::digest(&tar));
        Ok(Rootfs { tar, sha256 })
    }

    fn find_program(&self, name: &str) -> Result<PathBuf, RootfsError> {
        if name.contains('/') {
            return Ok(PathBuf::from(name));
        }
        for dir in &self.search_path {
            let candidate = dir.join(name);
            if let Ok(meta) = std::fs::metadata(&candidate) {
                if meta.is_file() && meta.permissions().mode() & 0o111 != 0 {
                    return Ok(candidate);
                }
            }
        }
        Err(RootfsError::ProgramNotFound { program: name.to_string(), search_path: join_paths(&self.search_path) })
    }

    /// Add `path`, resolving it like the kernel does and recording every symbolic link met on
    /// the way. With `follow_last`, a link at the end is followed too. Returns the real path.
    fn add_host_path(&mut self, path: &Path, follow_last: bool) -> Result<PathBuf, RootfsError> {
        if !path.is_absolute() {
            return Err(RootfsError::NotAbsolute(path.to_path_buf()));
        }
        let mut pending: Vec<std::ffi::OsString> = components_rev(path);
        let mut current = PathBuf::from("/");
        let mut hops = 0;
        while let Some(part) = pending.pop() {
            if part == ".." {
                current.pop();
                continue;
            }
            let next = current.join(&part);
            let meta = std::fs::symlink_metadata(&next).map_err(io_err(&next))?;
            if meta.file_type().is_symlink() && (follow_last || !pending.is_empty()) {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(RootfsError::LinkLoop(path.to_path_buf()));
                }
                let target = std::fs::read_link(&next).map_err(io_err(&next))?;
                self.add_parents_of(&next)?;
                self.entries.insert(next.clone(), Entry::Symlink { target: target.clone() });
                if target.is_absolute() {
                    current = PathBuf::from("/");
                }
                pending.extend(components_rev(&target));
                continue;
            }
            current = next;
        }
        self.add_real(&current)?;
        Ok(current)
    }

    /// Add a path whose parents are real directories (not links).
    fn add_real(&mut self, path: &Path) -> Result<(), RootfsError> {
        // A file, link or synthetic file already there stays (synthetic files win).
        if let Some(Entry::HostFile { .. } | Entry::Symlink { .. } | Entry::Data { .. }) = self.entries.get(path) {
            return Ok(());
        }
        let meta = std::fs::symlink_metadata(path).map_err(io_err(path))?;
        self.add_parents_of(path)?;
        let file_type = meta.file_type();
        if file_type.is_symlink() {
            let target = std::fs::read_link(path).map_err(io_err(path))?;
            self.entries.insert(path.to_path_buf(), Entry::Symlink { target });
        } else if file_type.is_dir() {
            self.add_dir_tree(path, &meta)?;
        } else if file_type.is_file() {
            let inode = (meta.nlink() > 1).then(|| (meta.dev(), meta.ino()));
            let mode = meta.permissions().mode() & 0o1777;
            self.entries.insert(path.to_path_buf(), Entry::HostFile { source: path.to_path_buf(), mode, inode });
            self.add_libraries_of(path)?;
        }
        // Sockets, fifos and devices have no place in an image.
        Ok(())
    }

    /// A directory and everything under it. Links inside are kept and their targets added
    /// when they exist (a dangling link stays dangling, as on this machine).
    fn add_dir_tree(&mut self, dir: &Path, meta: &std::fs::Metadata) -> Result<(), RootfsError> {
        if !self.trees.insert(dir.to_path_buf()) {
            return Ok(());
        }
        self.entries.insert(dir.to_path_buf(), Entry::Dir { mode: meta.permissions().mode() & 0o7777 });
        let mut children: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(io_err(dir))?
            .map(|entry| entry.map(|e| e.path()))
            .collect::<Result<_, _>>()
            .map_err(io_err(dir))?;
        children.sort();
        for child in children {
            let child_meta = std::fs::symlink_metadata(&child).map_err(io_err(&child))?;
            if child_meta.file_type().is_symlink() {
                let target = std::fs::read_link(&child).map_err(io_err(&child))?;
                self.entries.insert(child.clone(), Entry::Symlink { target });
                match self.add_host_path(&child, true) {
                    Ok(_) => {}
                    Err(RootfsError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(e),
                }
            } else {
                self.add_real(&child)?;
            }
        }
        Ok(())
    }

    /// The real directories above `path`, with their modes on this machine.
    fn add_parents_of(&mut self, path: &Path) -> Result<(), RootfsError> {
        let mut ancestors: Vec<&Path> = path.ancestors().skip(1).collect();
        ancestors.reverse();
        for dir in ancestors {
            if self.entries.contains_key(dir) {
                continue;
            }
            let meta = std::fs::symlink_metadata(dir).map_err(io_err(dir))?;
            self.entries.insert(dir.to_path_buf(), Entry::Dir { mode: meta.permissions().mode() & 0o7777 });
        }
        Ok(())
    }

    /// Parents of a synthetic entry: `0755` directories where none are yet.
    fn ensure_parents(&mut self, path: &Path) {
        for dir in path.ancestors().skip(1) {
            self.entries.entry(dir.to_path_buf()).or_insert(Entry::Dir { mode: 0o755 });
        }
    }

    /// When `path` is an ELF file: its interpreter and the closure of its `DT_NEEDED`.
    fn add_libraries_of(&mut self, path: &Path) -> Result<(), RootfsError> {
        let Some(ident) = read_ident(path)? else {
            return Ok(());
        };
        let data = std::fs::read(path).map_err(io_err(path))?;
        let deps = elf_dependencies(&data, ident.is_64)
            .map_err(|e| RootfsError::BadElf { path: path.to_path_buf(), message: e.to_string() })?;
        if let Some(interpreter) = &deps.interpreter {
            self.add_host_path(interpreter, true)?;
        }
        let origin = path.parent().unwrap_or(Path::new("/"));
        let mut dirs: Vec<PathBuf> = Vec::new();
        if deps.runpath.is_empty() {
            dirs.extend(expand_origin(&deps.rpath, origin));
        }
        dirs.extend(expand_origin(&deps.runpath, origin));
        dirs.extend(self.lib_dirs.iter().cloned());
        for library in &deps.needed {
            if library.contains('/') {
                self.add_host_path(Path::new(library), true)?;
                continue;
            }
            let found = dirs.iter().map(|d| d.join(library)).find(|c| read_ident(c).ok().flatten() == Some(ident));
            match found {
                Some(lib) => {
                    self.add_host_path(&lib, true)?;
                }
                None => {
                    return Err(RootfsError::LibraryNotFound {
                        library: library.clone(),
                        needed_by: path.to_path_buf(),
                        searched: join_paths(&dirs),
                    })
                }
            }
        }
        Ok(())
    }
}

fn image_path(path: &str) -> Result<PathBuf, RootfsError> {
    let p = PathBuf::from(path);
    if !p.is_absolute() || p.components().any(|c| matches!(c, Component::ParentDir)) {
        return Err(RootfsError::NotAbsolute(p));
    }
    Ok(p.components().collect())
}

/// The normal components of `path` (and `..`), last first, for a stack.
fn components_rev(path: &Path) -> Vec<std::ffi::OsString> {
    let mut parts: Vec<std::ffi::OsString> = path
        .components()
        .filter_map(|c| match c {
            Component::Normal(n) => Some(n.to_os_string()),
            Component::ParentDir => Some("..".into()),
            _ => None,
        })
        .collect();
    parts.reverse();
    parts
}

fn split_path(path: &str) -> Vec<PathBuf> {
    path.split(':').filter(|s| !s.is_empty()).map(PathBuf::from).collect()
}

fn join_paths(paths: &[PathBuf]) -> String {
    paths.iter().map(|p| p.display().to_string()).collect::<Vec<_>>().join(":")
}

/// ELF class and machine: a library must match the program that loads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct ElfIdent {
    is_64: bool,
    little_endian: bool,
    machine: u16,
}

/// The ELF identity of `path`, `None` when it is no ELF file (or too short, or unreadable as
/// a directory).
fn read_ident(path: &Path) -> Result<Option<ElfIdent>, RootfsError> {
    let mut head = [0u8; 20];
    let mut file = match std::fs::File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(RootfsError::Io { path: path.to_path_buf(), source: e }),
    };
    if !file.metadata().map(|m| m.is_file()).unwrap_or(false) {
        return Ok(None);
    }
    let mut filled = 0;
    while filled < head.len() {
        match file.read(&mut head[filled..]) {
            Ok(0) => return Ok(None),
            Ok(n) => filled += n,
            Err(e) => return Err(RootfsError::Io { path: path.to_path_buf(), source: e }),
        }
    }
    if head[..4] != elf::ELFMAG {
        return Ok(None);
    }
    let little_endian = head[5] == elf::ELFDATA2LSB;
    let machine =
        if little_endian { u16::from_le_bytes([head[18], head[19]]) } else { u16::from_be_bytes([head[18], head[19]]) };
    Ok(Some(ElfIdent { is_64: head[4] == elf::ELFCLASS64, little_endian, machine }))
}

/// What an ELF file needs at load time.
#[derive(Debug, Default)]
struct ElfDeps {
    interpreter: Option<PathBuf>,
    needed: Vec<String>,
    rpath: Vec<String>,
    runpath: Vec<String>,
}

fn elf_dependencies(data: &[u8], is_64: bool) -> object::read::Result<ElfDeps> {
    if is_64 {
        read_deps::<elf::FileHeader64<Endianness>>(data)
    } else {
        read_deps::<elf::FileHeader32<Endianness>>(data)
    }
}

fn read_deps<Elf: FileHeader<Endian = Endianness>>(data: &[u8]) -> object::read::Result<ElfDeps> {
    let header = Elf::parse(data)?;
    let endian = header.endian()?;
    let mut deps = ElfDeps::default();
    for segment in header.program_headers(endian, data)? {
        if let Some(interp) = segment.interpreter(endian, data)? {
            deps.interpreter = Some(PathBuf::from(String::from_utf8_lossy(interp).into_owned()));
        }
    }
    let sections = header.sections(endian, data)?;
    let table = sections.dynamic_table(endian, data)?;
    for entry in table.iter() {
        let list = match entry.tag {
            elf::DT_NEEDED => &mut deps.needed,
            elf::DT_RPATH => &mut deps.rpath,
            elf::DT_RUNPATH => &mut deps.runpath,
            _ => continue,
        };
        let value = String::from_utf8_lossy(table.string(entry)?).into_owned();
        list.push(value);
    }
    Ok(deps)
}

/// `DT_RPATH`/`DT_RUNPATH` entries as directories, `$ORIGIN` replaced; entries with other
/// dynamic string tokens (`$LIB`, `$PLATFORM`) are skipped.
fn expand_origin(entries: &[String], origin: &Path) -> Vec<PathBuf> {
    let origin = origin.display().to_string();
    entries
        .iter()
        .flat_map(|e| e.split(':'))
        .filter(|s| !s.is_empty())
        .map(|s| s.replace("${ORIGIN}", &origin).replace("$ORIGIN", &origin))
        .filter(|s| !s.contains('$') && s.starts_with('/'))
        .map(PathBuf::from)
        .collect()
}

/// The library directories of this machine's `ld.so`: `/etc/ld.so.conf` (with its `include`s),
/// then the defaults.
fn system_lib_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    let mut seen_files = BTreeSet::new();
    read_ld_conf(Path::new("/etc/ld.so.conf"), &mut dirs, &mut seen_files);
    for d in DEFAULT_LIB_DIRS {
        dirs.push(PathBuf::from(d));
    }
    let mut seen = BTreeSet::new();
    dirs.retain(|d| seen.insert(d.clone()));
    dirs
}

fn read_ld_conf(file: &Path, dirs: &mut Vec<PathBuf>, seen_files: &mut BTreeSet<PathBuf>) {
    if !seen_files.insert(file.to_path_buf()) {
        return;
    }
    let Ok(text) = std::fs::read_to_string(file) else {
        return;
    };
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        if let Some(pattern) = line.strip_prefix("include") {
            let pattern = pattern.trim();
            let pattern = if pattern.starts_with('/') {
                pattern.to_string()
            } else {
                file.parent().unwrap_or(Path::new("/")).join(pattern).display().to_string()
            };
            let mut matches: Vec<PathBuf> =
                glob::glob(&pattern).map(|paths| paths.filter_map(Result::ok).collect()).unwrap_or_default();
            matches.sort();
            for m in matches {
                read_ld_conf(&m, dirs, seen_files);
            }
        } else if !line.is_empty() && !line.starts_with("hwcap") {
            dirs.extend(line.split([' ', '\t', ':', ',']).filter(|s| s.starts_with('/')).map(PathBuf::from));
        }
    }
}

/// Programs of the helper image that must be there.
const HELPER_PROGRAMS: &[&str] = &[
    "bash",
    "sh",
    "git",
    "tar",
    "gzip",
    "gunzip",
    "find",
    "xargs",
    "sed",
    "grep",
    "cat",
    "cp",
    "mv",
    "rm",
    "mkdir",
    "rmdir",
    "ls",
    "chmod",
    "chown",
    "ln",
    "touch",
    "dirname",
    "basename",
    "env",
    "sleep",
    "head",
    "tail",
    "sort",
    "wc",
    "tr",
    "cut",
    "date",
    "id",
    "mktemp",
    "printf",
    "test",
    "[",
    "true",
    "false",
    "stat",
    "readlink",
    "realpath",
    "uname",
    "tee",
    "expr",
    "seq",
    "timeout",
    "sha256sum",
    "sync",
    // Stages run detached in a pod's helper container (the kubernetes executor).
    "setsid",
];

/// Directories of the helper image when this machine has them: the CA certificates. (The git
/// found on the search path brings its helpers and templates, see [`git_dirs`].)
const HELPER_DIRS: &[&str] = &["/etc/ssl/certs"];

/// The helper image's repository name.
pub const HELPER_REPOSITORY: &str = "runway-helper";

/// Where the helper image carries the helper executable: the predefined stages in the
/// helper container call it as gitlab-runner's helper (`artifacts-uploader`, `cache-archiver`, …).
pub const HELPER_BINARY: &str = "/usr/local/bin/runway";

/// The helper executable's file name beside the runner's (`runway-helper`: the helper commands
/// without the plugin host).
pub const HELPER_EXECUTABLE: &str = "runway-helper";

/// Programs of git's exec path the stage scripts never run (servers, other transports, mail,
/// `scalar`): each a 2 MB copy of git's code, left out of the helper image.
const GIT_UNUSED: &[&str] =
    &["git-daemon", "git-http-backend", "git-http-fetch", "git-http-push", "git-imap-send", "git-shell", "scalar"];

/// The executable the job environment runs the helper commands with: `runway-helper` beside
/// the running executable when it is there (built and installed with it), else the running
/// executable itself (it has the same commands, and all of the runner besides).
pub fn helper_executable() -> std::io::Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let helper = exe.with_file_name(HELPER_EXECUTABLE);
    Ok(if helper.is_file() { helper } else { exe })
}

/// Runway's helper image: its root filesystem and the reference to import it as.
#[derive(Debug, Clone)]
pub struct HelperRootfs {
    /// `runway-helper:<version>-<first 12 hex digits of the content hash>`.
    pub reference: String,
    /// The root filesystem.
    pub rootfs: Rootfs,
}

/// The helper image from this machine's files: bash, sh, git (with the helpers of its exec
/// path the scripts use, and its templates), git-lfs when installed, tar, gzip, find, sed,
/// grep, the coreutils the generated scripts use, the CA certificates, and the helper
/// executable ([`helper_executable`]) at [`HELPER_BINARY`], each with its libraries (so the
/// image's tag changes with the binary). Reads tens of megabytes: call it once and keep the
/// result, from a blocking task.
pub fn helper_rootfs() -> Result<HelperRootfs, RootfsError> {
    let exe = helper_executable().map_err(io_err(Path::new("/proc/self/exe")))?;
    let mut builder = RootfsBuilder::new();
    builder.base_system()?;
    builder.host_file(HELPER_BINARY, &exe)?;
    for program in HELPER_PROGRAMS {
        builder.program(program)?;
    }
    builder.optional_program("git-lfs")?;
    let git = builder.find_program("git")?;
    for dir in git_dirs(&git)? {
        let entries = std::fs::read_dir(&dir).map_err(io_err(&dir))?;
        for entry in entries {
            let path = entry.map_err(io_err(&dir))?.path();
            let unused = path.file_name().and_then(|n| n.to_str()).is_some_and(|n| GIT_UNUSED.contains(&n));
            if !unused {
                builder.path(&path)?;
            }
        }
    }
    for dir in HELPER_DIRS.iter().map(Path::new).filter(|d| d.exists()) {
        builder.path(dir)?;
    }
    let rootfs = builder.build()?;
    let reference = format!("{HELPER_REPOSITORY}:{}-{}", env!("CARGO_PKG_VERSION"), rootfs.short_hash());
    Ok(HelperRootfs { reference, rootfs })
}

/// The directories the git at `git` needs besides itself: its exec path (`git --exec-path`:
/// `git-remote-http(s)` and the other helpers; a git built into `/usr/local` has its own) and
/// the templates beside it (`<prefix>/share/git-core/templates`, when there).
fn git_dirs(git: &Path) -> Result<Vec<PathBuf>, RootfsError> {
    let out = std::process::Command::new(git).arg("--exec-path").output().map_err(io_err(git))?;
    let exec_path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !out.status.success() || !exec_path.is_absolute() || !exec_path.is_dir() {
        return Err(RootfsError::Io {
            path: git.to_path_buf(),
            source: std::io::Error::other(format!(
                "`git --exec-path` gave no directory: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )),
        });
    }
    let mut dirs = vec![exec_path.clone()];
    // <prefix>/libexec/git-core or <prefix>/lib/git-core
    if let Some(prefix) = exec_path.parent().and_then(Path::parent) {
        let templates = prefix.join("share/git-core/templates");
        if templates.is_dir() {
            dirs.push(templates);
        }
    }
    Ok(dirs)
}

#[cfg(test)]
#[path = "rootfs_tests.rs"]
mod tests;
