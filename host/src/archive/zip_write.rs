//! The zip writer: gitlab-runner's entries (directories as `name/`, symbolic links stored as
//! their target, files deflated), its metadata (unix mode in the external attributes, creator
//! "unix", the UTF-8 name flag, the Info-ZIP unix uid/gid field 0x7875 and the extended
//! timestamp field 0x5455 in the local and central headers), Zip64 when sizes, offsets or the
//! entry count need it.
//!
//! Speed: worker threads (one per core) each take the next entry, read it and compress it —
//! into memory up to [`MEM_LIMIT`], into an anonymous temp file beyond — while this thread
//! writes finished entries in order. Workers run at most [`WINDOW`] entries ahead of the writer,
//! which bounds memory (see [`MAX_WINDOW`]). As the local header is written after the entry is compressed, it has
//! the final CRC and sizes (no data descriptors) and the output never needs to seek. A file that
//! deflate does not shrink (already compressed data) is stored instead, as `zip` does.
//!
//! Owns: zip bytes. Must not touch: selection, extraction, the network.

use std::fs::File;
use std::io::{self, BufWriter, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::{Condvar, Mutex};

use chrono::{Datelike, Local, TimeZone, Timelike};
use flate2::write::DeflateEncoder;
use flate2::Compression;

use super::counting::Counting;
use super::{git_warning, is_git_path, ArchiveError, Level, Written};

/// Files up to this size are compressed in memory; larger ones into a temp file.
pub(crate) const MEM_LIMIT: u64 = 2 << 20;
/// How many entries each worker may prepare ahead of the one being written.
const WINDOW_PER_THREAD: usize = 4;
/// The bounds of that window whatever the thread count: memory stays under about
/// `MAX_WINDOW × 2 × MEM_LIMIT` (file and its compressed copy), 128 MiB on a large machine and
/// 32 MiB on two cores.
const MIN_WINDOW: usize = 4;
const MAX_WINDOW: usize = 32;

const METHOD_STORE: u16 = 0;
const METHOD_DEFLATE: u16 = 8;
const VERSION_20: u16 = 20;
const VERSION_45: u16 = 45;
const CREATOR_UNIX: u16 = 3 << 8;
const FLAG_UTF8: u16 = 0x800;
const U32_MAX: u64 = 0xFFFF_FFFF;

/// One entry, read and compressed, ready to be written.
struct Prepared {
    name: String,
    method: u16,
    crc: u32,
    size: u64,
    csize: u64,
    body: Body,
    external_attrs: u32,
    dos_time: u16,
    dos_date: u16,
    extra: Vec<u8>,
}

enum Body {
    Mem(Vec<u8>),
    Staged(File),
}

/// What a worker hands the writer for one entry.
enum Outcome {
    Entry(Box<Prepared>),
    /// Not archived; the warning says why.
    Skipped(String),
}

/// The central directory record of a written entry.
struct Central {
    name: String,
    method: u16,
    crc: u32,
    size: u64,
    csize: u64,
    offset: u64,
    external_attrs: u32,
    dos_time: u16,
    dos_date: u16,
    extra: Vec<u8>,
}

struct Progress {
    next: usize,
    written: usize,
    stop: bool,
}

/// Writes the zip archive of `entries` (relative to `project_dir`) to `out`.
pub(crate) fn write_zip<W: Write>(
    level: Level,
    project_dir: &Path,
    entries: &[PathBuf],
    out: &mut W,
) -> Result<Written, ArchiveError> {
    let mut written = Written::default();
    if entries.iter().any(|e| is_git_path(&e.to_string_lossy())) {
        written.warnings.extend(git_warning("archive"));
    }
    let threads = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1).clamp(1, entries.len().max(1));
    let window = (threads * WINDOW_PER_THREAD).clamp(MIN_WINDOW, MAX_WINDOW);
    let progress = Mutex::new(Progress { next: 0, written: 0, stop: false });
    let cv = Condvar::new();
    let mut sink = Counting::new(BufWriter::with_capacity(256 << 10, out));

    let result = std::thread::scope(|scope| {
        let (tx, rx) = mpsc::channel::<(usize, Result<Outcome, ArchiveError>)>();
        for _ in 0..threads {
            let tx = tx.clone();
            let (progress, cv) = (&progress, &cv);
            scope.spawn(move || loop {
                let index = {
                    let Ok(mut p) = progress.lock() else { return };
                    loop {
                        if p.stop || p.next >= entries.len() {
                            return;
                        }
                        if p.next < p.written + window {
                            p.next += 1;
                            break p.next - 1;
                        }
                        p = match cv.wait(p) {
                            Ok(p) => p,
                            Err(_) => return,
                        };
                    }
                };
                let rel = &entries[index];
                // A panic must not leave the writer waiting for this entry forever.
                let outcome =
                    std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| prepare(level, project_dir, rel)))
                        .unwrap_or_else(|_| {
                            Err(ArchiveError::Io {
                                path: rel.clone(),
                                op: "compress",
                                source: io::Error::other("the compressing thread panicked"),
                            })
                        });
                if tx.send((index, outcome)).is_err() {
                    return;
                }
            });
        }
        drop(tx);
        let result = write_in_order(entries.len(), &rx, &progress, &cv, &mut sink, &mut written);
        if let Ok(mut p) = progress.lock() {
            p.stop = true;
        }
        cv.notify_all();
        result
    });
    result?;
    sink.flush().map_err(ArchiveError::Output)?;
    written.bytes_out = sink.count();
    Ok(written)
}

fn write_in_order<W: Write>(
    total: usize,
    rx: &mpsc::Receiver<(usize, Result<Outcome, ArchiveError>)>,
    progress: &Mutex<Progress>,
    cv: &Condvar,
    sink: &mut Counting<BufWriter<W>>,
    written: &mut Written,
) -> Result<(), ArchiveError> {
    let mut pending = std::collections::BTreeMap::new();
    let mut central = Vec::with_capacity(total);
    for index in 0..total {
        let outcome = loop {
            if let Some(o) = pending.remove(&index) {
                break o;
            }
            match rx.recv() {
                Ok((i, o)) => {
                    pending.insert(i, o);
                }
                Err(_) => return Err(ArchiveError::Output(io::Error::other("archive workers stopped early"))),
            }
        };
        match outcome? {
            Outcome::Skipped(warning) => written.warnings.push(warning),
            Outcome::Entry(prepared) => {
                written.entries += 1;
                written.bytes_in += prepared.size;
                central.push(write_entry(sink, *prepared).map_err(ArchiveError::Output)?);
            }
        }
        if let Ok(mut p) = progress.lock() {
            p.written = index + 1;
        }
        cv.notify_all();
    }
    write_central(sink, &central).map_err(ArchiveError::Output)
}

/// Reads and compresses one entry (a worker's job).
fn prepare(level: Level, project_dir: &Path, rel: &Path) -> Result<Outcome, ArchiveError> {
    let io_err = |op, source| ArchiveError::Io { path: rel.to_path_buf(), op, source };
    // Entry names are these paths: they must stay relative and inside the project.
    if rel.is_absolute() || rel.components().any(|c| matches!(c, std::path::Component::ParentDir)) {
        let why = io::Error::new(io::ErrorKind::InvalidInput, "entries must be relative to the project directory");
        return Err(io_err("archive", why));
    }
    let full = project_dir.join(rel);
    let meta = match std::fs::symlink_metadata(&full) {
        Ok(m) => m,
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            return Ok(Outcome::Skipped(format!("File ignored: lstat {}: {e}", rel.display())));
        }
        Err(e) => return Err(io_err("lstat", e)),
    };
    let mut name = rel.to_string_lossy().replace('\\', "/");
    let ft = meta.file_type();
    let mode = meta.mode();
    let (dos_time, dos_date) = dos_datetime(meta.mtime());
    let extra = extra_fields(meta.uid(), meta.gid(), meta.mtime());
    let mut external_attrs = mode << 16;
    if mode & 0o200 == 0 {
        external_attrs |= 0x01; // MS-DOS read-only
    }
    let mut p = Prepared {
        name: String::new(),
        method: METHOD_STORE,
        crc: 0,
        size: 0,
        csize: 0,
        body: Body::Mem(Vec::new()),
        external_attrs,
        dos_time,
        dos_date,
        extra,
    };
    if ft.is_dir() {
        name.push('/');
        p.external_attrs |= 0x10; // MS-DOS directory
    } else if ft.is_symlink() {
        let target = std::fs::read_link(&full).map_err(|e| io_err("readlink", e))?;
        let bytes = target.as_os_str().as_encoded_bytes().to_vec();
        p.crc = crc32fast::hash(&bytes);
        p.size = bytes.len() as u64;
        p.csize = p.size;
        p.body = Body::Mem(bytes);
    } else if ft.is_file() {
        if meta.len() <= MEM_LIMIT {
            compress_in_memory(&mut p, &full, level).map_err(|e| io_err("read", e))?;
        } else {
            compress_staged(&mut p, &full, level).map_err(|e| io_err("read", e))?;
        }
    } else if ft.is_fifo() || ft.is_socket() || ft.is_block_device() || ft.is_char_device() {
        return Ok(Outcome::Skipped(format!("File ignored: {}", rel.display())));
    }
    p.name = name;
    Ok(Outcome::Entry(Box::new(p)))
}

fn compress_in_memory(p: &mut Prepared, path: &Path, level: Level) -> io::Result<()> {
    let data = std::fs::read(path)?;
    p.crc = crc32fast::hash(&data);
    p.size = data.len() as u64;
    if let Some(l) = level.deflate() {
        let mut enc = DeflateEncoder::new(Vec::with_capacity(data.len() / 2 + 64), Compression::new(l));
        enc.write_all(&data)?;
        let compressed = enc.finish()?;
        if compressed.len() < data.len() {
            p.method = METHOD_DEFLATE;
            p.csize = compressed.len() as u64;
            p.body = Body::Mem(compressed);
            return Ok(());
        }
    }
    p.method = METHOD_STORE;
    p.csize = p.size;
    p.body = Body::Mem(data);
    Ok(())
}

fn compress_staged(p: &mut Prepared, path: &Path, level: Level) -> io::Result<()> {
    let mut input = File::open(path)?;
    let staged = tempfile::tempfile()?;
    let mut hasher = crc32fast::Hasher::new();
    let mut buf = vec![0u8; 256 << 10];
    let (staged, size) = match level.deflate() {
        Some(l) => {
            let mut enc = DeflateEncoder::new(BufWriter::with_capacity(256 << 10, staged), Compression::new(l));
            let size = copy_hashed(&mut input, &mut enc, &mut buf, &mut hasher)?;
            p.method = METHOD_DEFLATE;
            (enc.finish()?.into_inner().map_err(|e| e.into_error())?, size)
        }
        None => {
            let mut w = BufWriter::with_capacity(256 << 10, staged);
            let size = copy_hashed(&mut input, &mut w, &mut buf, &mut hasher)?;
            p.method = METHOD_STORE;
            (w.into_inner().map_err(|e| e.into_error())?, size)
        }
    };
    let mut staged = staged;
    p.csize = staged.stream_position()?;
    staged.seek(SeekFrom::Start(0))?;
    p.crc = hasher.finalize();
    p.size = size;
    p.body = Body::Staged(staged);
    Ok(())
}

/// Copy all of `input` to `out` through `buf`, hashing what passes; the bytes copied.
fn copy_hashed(
    input: &mut File,
    out: &mut impl Write,
    buf: &mut [u8],
    hasher: &mut crc32fast::Hasher,
) -> io::Result<u64> {
    let mut size = 0u64;
    loop {
        let n = read_some(input, buf)?;
        if n == 0 {
            return Ok(size);
        }
        hasher.update(&buf[..n]);
        size += n as u64;
        out.write_all(&buf[..n])?;
    }
}

fn read_some(r: &mut File, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match r.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            other => return other,
        }
    }
}

/// The Info-ZIP unix uid/gid field (0x7875, version 1, 4-byte ids) and the extended timestamp
/// (0x5455, modification time only), as gitlab-runner's `createZipExtra`.
fn extra_fields(uid: u32, gid: u32, mtime: i64) -> Vec<u8> {
    let mut e = Vec::with_capacity(24);
    e.extend_from_slice(&0x7875u16.to_le_bytes());
    e.extend_from_slice(&11u16.to_le_bytes());
    e.push(1);
    e.push(4);
    e.extend_from_slice(&uid.to_le_bytes());
    e.push(4);
    e.extend_from_slice(&gid.to_le_bytes());
    e.extend_from_slice(&0x5455u16.to_le_bytes());
    e.extend_from_slice(&5u16.to_le_bytes());
    e.push(1);
    e.extend_from_slice(&(mtime.clamp(0, u32::MAX as i64) as u32).to_le_bytes());
    e
}

/// MS-DOS time and date in local time (what `zip` writes), clamped to 1980..=2107.
fn dos_datetime(mtime: i64) -> (u16, u16) {
    let Some(t) = Local.timestamp_opt(mtime, 0).single() else { return (0, 0x21) };
    if t.year() < 1980 {
        return (0, 0x21); // 1980-01-01 00:00
    }
    if t.year() > 2107 {
        return (0xBF7D, 0xFF9F); // 2107-12-31 23:59:58
    }
    let time = ((t.hour() << 11) | (t.minute() << 5) | (t.second() / 2)) as u16;
    let date = ((((t.year() - 1980) as u32) << 9) | (t.month() << 5) | t.day()) as u16;
    (time, date)
}

fn write_entry<W: Write>(sink: &mut Counting<BufWriter<W>>, p: Prepared) -> io::Result<Central> {
    let offset = sink.count();
    let zip64 = p.size >= U32_MAX || p.csize >= U32_MAX;
    let mut extra = p.extra.clone();
    if zip64 {
        extra.extend_from_slice(&1u16.to_le_bytes());
        extra.extend_from_slice(&16u16.to_le_bytes());
        extra.extend_from_slice(&p.size.to_le_bytes());
        extra.extend_from_slice(&p.csize.to_le_bytes());
    }
    let mut h = Vec::with_capacity(30 + p.name.len() + extra.len());
    h.extend_from_slice(&0x0403_4b50u32.to_le_bytes());
    h.extend_from_slice(&(if zip64 { VERSION_45 } else { VERSION_20 }).to_le_bytes());
    h.extend_from_slice(&FLAG_UTF8.to_le_bytes());
    h.extend_from_slice(&p.method.to_le_bytes());
    h.extend_from_slice(&p.dos_time.to_le_bytes());
    h.extend_from_slice(&p.dos_date.to_le_bytes());
    h.extend_from_slice(&p.crc.to_le_bytes());
    h.extend_from_slice(&(if zip64 { U32_MAX } else { p.csize } as u32).to_le_bytes());
    h.extend_from_slice(&(if zip64 { U32_MAX } else { p.size } as u32).to_le_bytes());
    h.extend_from_slice(&(p.name.len() as u16).to_le_bytes());
    h.extend_from_slice(&(extra.len() as u16).to_le_bytes());
    h.extend_from_slice(p.name.as_bytes());
    h.extend_from_slice(&extra);
    sink.write_all(&h)?;
    match p.body {
        Body::Mem(bytes) => sink.write_all(&bytes)?,
        Body::Staged(mut file) => {
            let copied = io::copy(&mut file, sink)?;
            if copied != p.csize {
                return Err(io::Error::other(format!(
                    "{}: staged data is {copied} bytes, expected {}",
                    p.name, p.csize
                )));
            }
        }
    }
    Ok(Central {
        name: p.name,
        method: p.method,
        crc: p.crc,
        size: p.size,
        csize: p.csize,
        offset,
        external_attrs: p.external_attrs,
        dos_time: p.dos_time,
        dos_date: p.dos_date,
        extra: p.extra,
    })
}

fn write_central<W: Write>(sink: &mut Counting<BufWriter<W>>, entries: &[Central]) -> io::Result<()> {
    let start = sink.count();
    for c in entries {
        let mut z64 = Vec::new();
        if c.size >= U32_MAX {
            z64.extend_from_slice(&c.size.to_le_bytes());
        }
        if c.csize >= U32_MAX {
            z64.extend_from_slice(&c.csize.to_le_bytes());
        }
        if c.offset >= U32_MAX {
            z64.extend_from_slice(&c.offset.to_le_bytes());
        }
        let mut extra = c.extra.clone();
        if !z64.is_empty() {
            extra.extend_from_slice(&1u16.to_le_bytes());
            extra.extend_from_slice(&(z64.len() as u16).to_le_bytes());
            extra.extend_from_slice(&z64);
        }
        let version = if z64.is_empty() { VERSION_20 } else { VERSION_45 };
        let mut h = Vec::with_capacity(46 + c.name.len() + extra.len());
        h.extend_from_slice(&0x0201_4b50u32.to_le_bytes());
        h.extend_from_slice(&(CREATOR_UNIX | version).to_le_bytes());
        h.extend_from_slice(&version.to_le_bytes());
        h.extend_from_slice(&FLAG_UTF8.to_le_bytes());
        h.extend_from_slice(&c.method.to_le_bytes());
        h.extend_from_slice(&c.dos_time.to_le_bytes());
        h.extend_from_slice(&c.dos_date.to_le_bytes());
        h.extend_from_slice(&c.crc.to_le_bytes());
        h.extend_from_slice(&(c.csize.min(U32_MAX) as u32).to_le_bytes());
        h.extend_from_slice(&(c.size.min(U32_MAX) as u32).to_le_bytes());
        h.extend_from_slice(&(c.name.len() as u16).to_le_bytes());
        h.extend_from_slice(&(extra.len() as u16).to_le_bytes());
        h.extend_from_slice(&0u16.to_le_bytes()); // comment length
        h.extend_from_slice(&0u16.to_le_bytes()); // disk number start
        h.extend_from_slice(&0u16.to_le_bytes()); // internal attributes
        h.extend_from_slice(&c.external_attrs.to_le_bytes());
        h.extend_from_slice(&(c.offset.min(U32_MAX) as u32).to_le_bytes());
        h.extend_from_slice(c.name.as_bytes());
        h.extend_from_slice(&extra);
        sink.write_all(&h)?;
    }
    let cd_size = sink.count() - start;
    let count = entries.len() as u64;
    if count >= 0xFFFF || cd_size >= U32_MAX || start >= U32_MAX {
        let z64_offset = sink.count();
        let mut r = Vec::with_capacity(76);
        r.extend_from_slice(&0x0606_4b50u32.to_le_bytes());
        r.extend_from_slice(&44u64.to_le_bytes());
        r.extend_from_slice(&(CREATOR_UNIX | VERSION_45).to_le_bytes());
        r.extend_from_slice(&VERSION_45.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&count.to_le_bytes());
        r.extend_from_slice(&count.to_le_bytes());
        r.extend_from_slice(&cd_size.to_le_bytes());
        r.extend_from_slice(&start.to_le_bytes());
        r.extend_from_slice(&0x0706_4b50u32.to_le_bytes());
        r.extend_from_slice(&0u32.to_le_bytes());
        r.extend_from_slice(&z64_offset.to_le_bytes());
        r.extend_from_slice(&1u32.to_le_bytes());
        sink.write_all(&r)?;
    }
    let mut e = Vec::with_capacity(22);
    e.extend_from_slice(&0x0605_4b50u32.to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    e.extend_from_slice(&(count.min(0xFFFF) as u16).to_le_bytes());
    e.extend_from_slice(&(count.min(0xFFFF) as u16).to_le_bytes());
    e.extend_from_slice(&(cd_size.min(U32_MAX) as u32).to_le_bytes());
    e.extend_from_slice(&(start.min(U32_MAX) as u32).to_le_bytes());
    e.extend_from_slice(&0u16.to_le_bytes());
    sink.write_all(&e)
}
