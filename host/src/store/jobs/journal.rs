//! The file store's journal: every write of the file store (an entry saved, trace bytes
//! appended, an entry removed) is first a record appended to `<dir>/journal`, and many
//! writers' records share one `fdatasync` (group commit: the writes of all jobs that arrive
//! while a sync runs go out with the next one). The per-job files are brought up to date from
//! the journal now and then ([`Overlay::apply_to`], "compaction"), and the journal starts over.
//!
//! A record is `[payload length: u32 LE][CRC-32 of the payload: u32 LE][payload]`; a crash can
//! leave a torn last record, which fails its length or checksum and ends the journal there
//! ([`decode`]). Replaying records in order over files that already have some of them gives
//! the same files (a save replaces the entry, trace bytes go at their offset, a remove removes).
//!
//! Owns: the record format and the [`Overlay`] (what the journal says over the files, per job).
//! Must not touch: locking, the committer, what a body means (the file store's and the
//! caller's).

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::Path;

use super::{EntryMeta, JobStoreError};

/// The journal's name in the store directory.
pub const JOURNAL_FILE: &str = "journal";

/// What a journal file starts with.
pub const MAGIC: &[u8] = b"runway job store journal 1\n";

const SAVE: u8 = 1;
const TRACE: u8 = 2;
const REMOVE: u8 = 3;

/// One write of the file store.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Record {
    /// The entry of `meta.job_id` is `meta` with this sealed body.
    Save {
        /// The entry's meta.
        meta: EntryMeta,
        /// The sealed body.
        sealed: Vec<u8>,
    },
    /// The job's trace is its first `offset` bytes followed by `bytes`.
    Trace {
        /// The job.
        job_id: u64,
        /// Where `bytes` go.
        offset: u64,
        /// The bytes.
        bytes: Vec<u8>,
    },
    /// The job's entry and trace are gone.
    Remove {
        /// The job.
        job_id: u64,
    },
}

impl Record {
    /// Append the framed record to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) -> Result<(), JobStoreError> {
        let mut payload = Vec::new();
        match self {
            Record::Save { meta, sealed } => {
                let meta = serde_json::to_vec(meta)
                    .map_err(|e| JobStoreError::Backend(format!("encoding the entry of job {}: {e}", meta.job_id)))?;
                payload.push(SAVE);
                payload.extend_from_slice(&(meta.len() as u64).to_le_bytes());
                payload.extend_from_slice(&meta);
                payload.extend_from_slice(sealed);
            }
            Record::Trace { job_id, offset, bytes } => {
                payload.push(TRACE);
                payload.extend_from_slice(&job_id.to_le_bytes());
                payload.extend_from_slice(&offset.to_le_bytes());
                payload.extend_from_slice(bytes);
            }
            Record::Remove { job_id } => {
                payload.push(REMOVE);
                payload.extend_from_slice(&job_id.to_le_bytes());
            }
        }
        let len = u32::try_from(payload.len())
            .map_err(|_| JobStoreError::Backend(format!("a journal record of {} bytes is too long", payload.len())))?;
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&crc32fast::hash(&payload).to_le_bytes());
        out.extend_from_slice(&payload);
        Ok(())
    }

    fn decode(payload: &[u8]) -> Option<Record> {
        let (&kind, rest) = payload.split_first()?;
        let u64_at = |bytes: &[u8], at: usize| -> Option<u64> {
            Some(u64::from_le_bytes(bytes.get(at..at + 8)?.try_into().ok()?))
        };
        match kind {
            SAVE => {
                let len = usize::try_from(u64_at(rest, 0)?).ok()?;
                let meta = serde_json::from_slice(rest.get(8..8usize.checked_add(len)?)?).ok()?;
                Some(Record::Save { meta, sealed: rest.get(8 + len..)?.to_vec() })
            }
            TRACE => Some(Record::Trace {
                job_id: u64_at(rest, 0)?,
                offset: u64_at(rest, 8)?,
                bytes: rest.get(16..)?.to_vec(),
            }),
            REMOVE if rest.len() == 8 => Some(Record::Remove { job_id: u64_at(rest, 0)? }),
            _ => None,
        }
    }
}

/// The records of a journal's bytes (after [`MAGIC`]) and the length of the valid prefix of
/// `bytes`: a record whose length runs past the end or whose checksum fails ends the journal
/// (the torn write of a crash), and so does everything after it.
pub fn decode(bytes: &[u8]) -> (Vec<Record>, usize) {
    let mut records = Vec::new();
    let mut at = 0;
    while let Some(header) = bytes.get(at..at + 8) {
        let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
        let crc = u32::from_le_bytes([header[4], header[5], header[6], header[7]]);
        let Some(payload) = bytes.get(at + 8..at + 8 + len) else { break };
        if crc32fast::hash(payload) != crc {
            break;
        }
        let Some(record) = Record::decode(payload) else { break };
        records.push(record);
        at += 8 + len;
    }
    (records, at)
}

/// Open (creating it, mode 0600) the journal of `dir` for appending, returning it with its
/// records and its valid length; a torn tail is cut off. A file that does not start with
/// [`MAGIC`] is refused, never overwritten.
pub fn open(dir: &Path) -> Result<(File, Vec<Record>, u64), JobStoreError> {
    let path = dir.join(JOURNAL_FILE);
    let backend = |action: &str, e: std::io::Error| JobStoreError::Backend(format!("{action} {}: {e}", path.display()));
    let mut file = open_private(&path).map_err(|e| backend("opening", e))?;
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes).map_err(|e| backend("reading", e))?;
    if bytes.is_empty() {
        file.write_all(MAGIC).and_then(|()| file.sync_all()).map_err(|e| backend("writing", e))?;
        File::open(dir).and_then(|d| d.sync_all()).map_err(|e| backend("syncing the directory of", e))?;
        return Ok((file, Vec::new(), MAGIC.len() as u64));
    }
    let Some(body) = bytes.strip_prefix(MAGIC) else {
        return Err(JobStoreError::Backend(format!(
            "{} is not a job store journal of this version (it does not start with {:?})",
            path.display(),
            String::from_utf8_lossy(MAGIC).trim_end()
        )));
    };
    let (records, valid) = decode(body);
    let len = (MAGIC.len() + valid) as u64;
    if len < bytes.len() as u64 {
        tracing::warn!(journal = %path.display(), bytes = bytes.len() as u64 - len, "cutting off the torn end of the job store journal (a crash during a write)");
        file.set_len(len).and_then(|()| file.sync_all()).map_err(|e| backend("truncating", e))?;
    }
    file.seek(SeekFrom::Start(len)).map_err(|e| backend("seeking in", e))?;
    Ok((file, records, len))
}

/// The records of `dir`'s journal as they stand, for a reader beside the holder (nothing is
/// written; no journal reads as none).
pub fn read(dir: &Path) -> Result<Vec<Record>, JobStoreError> {
    let path = dir.join(JOURNAL_FILE);
    match std::fs::read(&path) {
        Ok(bytes) => Ok(bytes.strip_prefix(MAGIC).map(|body| decode(body).0).unwrap_or_default()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(JobStoreError::Backend(format!("reading {}: {e}", path.display()))),
    }
}

/// What the journal says about one job, over what its files say.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Pending {
    /// The files were removed (before `entry` and `trace`, when those are set too).
    pub removed: bool,
    /// The newest entry: meta and sealed body.
    pub entry: Option<(EntryMeta, Vec<u8>)>,
    /// The trace from an offset on: `(start, bytes)` replace whatever the trace has past `start`.
    pub trace: Option<(u64, Vec<u8>)>,
}

impl Pending {
    /// The trace's length when the journal decides it.
    pub fn trace_len(&self) -> Option<u64> {
        match &self.trace {
            Some((start, bytes)) => Some(start + bytes.len() as u64),
            None if self.removed => Some(0),
            None => None,
        }
    }
}

/// The journal's records folded per job: what the files will say once brought up to date.
#[derive(Debug, Default)]
pub struct Overlay {
    jobs: HashMap<u64, Pending>,
}

impl Overlay {
    /// The overlay of `records`, in order.
    pub fn of(records: Vec<Record>) -> Overlay {
        let mut overlay = Overlay::default();
        for record in records {
            overlay.apply(record);
        }
        overlay
    }

    /// Fold one more record in.
    pub fn apply(&mut self, record: Record) {
        match record {
            Record::Save { meta, sealed } => {
                let job_id = meta.job_id;
                self.jobs.entry(job_id).or_default().entry = Some((meta, sealed));
            }
            Record::Trace { job_id, offset, bytes } => {
                let pending = self.jobs.entry(job_id).or_default();
                match &mut pending.trace {
                    Some((start, kept)) if offset >= *start => {
                        kept.truncate(usize::try_from(offset - *start).unwrap_or(usize::MAX));
                        kept.extend_from_slice(&bytes);
                    }
                    trace => *trace = Some((offset, bytes)),
                }
            }
            Record::Remove { job_id } => {
                self.jobs.insert(job_id, Pending { removed: true, ..Pending::default() });
            }
        }
    }

    /// What the journal says about `job_id`.
    pub fn get(&self, job_id: u64) -> Option<&Pending> {
        self.jobs.get(&job_id)
    }

    /// Every job the journal speaks of.
    pub fn iter(&self) -> impl Iterator<Item = (&u64, &Pending)> {
        self.jobs.iter()
    }

    /// Nothing pending.
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// Forget everything (the files are up to date).
    pub fn clear(&mut self) {
        self.jobs.clear();
    }
}

/// Open `path` to read and write, creating it with mode 0600, keeping what it holds.
fn open_private(path: &Path) -> std::io::Result<File> {
    OpenOptions::new().read(true).write(true).create(true).truncate(false).mode(0o600).open(path)
}

/// Bring `job_id`'s trace file at `path` up to date with `start` and `bytes` and sync it.
pub fn write_trace(path: &Path, job_id: u64, start: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
    let backend = |action: &str, e: std::io::Error| JobStoreError::Backend(format!("{action} {}: {e}", path.display()));
    let mut file = open_private(path).map_err(|e| backend("opening", e))?;
    let len = file.metadata().map_err(|e| backend("reading the size of", e))?.len();
    if len < start {
        return Err(JobStoreError::Corrupt {
            job_id,
            message: format!("{}: the trace has {len} bytes, {start} were stored", path.display()),
        });
    }
    if len > start {
        file.set_len(start).map_err(|e| backend("truncating", e))?;
    }
    file.seek(SeekFrom::Start(start))
        .and_then(|_| file.write_all(bytes))
        .and_then(|()| file.sync_data())
        .map_err(|e| backend("appending to", e))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(job_id: u64, owner: &str) -> EntryMeta {
        EntryMeta {
            job_id,
            owner: owner.into(),
            created: 1,
            heartbeat: 2,
            resumes: 0,
            stage: "step_script".into(),
            project: "g/p".into(),
        }
    }

    fn framed(records: &[Record]) -> Vec<u8> {
        let mut out = Vec::new();
        for record in records {
            record.encode(&mut out).expect("encode");
        }
        out
    }

    #[test]
    fn records_round_trip_and_a_torn_or_damaged_tail_ends_the_journal() {
        let records = vec![
            Record::Save { meta: meta(7, "m1"), sealed: vec![1, 2, 3] },
            Record::Trace { job_id: 7, offset: 0, bytes: b"line\n".to_vec() },
            Record::Remove { job_id: 7 },
        ];
        let bytes = framed(&records);
        assert_eq!(decode(&bytes), (records.clone(), bytes.len()));
        // Every cut inside the last record leaves the first two.
        let two = framed(&records[..2]).len();
        for cut in two..bytes.len() {
            assert_eq!(decode(&bytes[..cut]), (records[..2].to_vec(), two), "cut at {cut}");
        }
        // A flipped byte in the second record ends the journal after the first.
        let one = framed(&records[..1]).len();
        let mut damaged = bytes.clone();
        damaged[one + 12] ^= 0x40;
        assert_eq!(decode(&damaged), (records[..1].to_vec(), one));
    }

    #[test]
    fn the_overlay_folds_saves_traces_and_removes_in_order() {
        let overlay = Overlay::of(vec![
            Record::Trace { job_id: 1, offset: 10, bytes: b"abc".to_vec() },
            Record::Trace { job_id: 1, offset: 12, bytes: b"XY".to_vec() },
            Record::Save { meta: meta(1, "m1"), sealed: vec![1] },
            Record::Save { meta: meta(1, "m2"), sealed: vec![2] },
            Record::Trace { job_id: 2, offset: 4, bytes: b"zz".to_vec() },
            Record::Trace { job_id: 2, offset: 1, bytes: b"q".to_vec() },
            Record::Save { meta: meta(3, "m1"), sealed: vec![3] },
            Record::Remove { job_id: 3 },
        ]);
        let one = overlay.get(1).expect("job 1");
        assert_eq!(one.trace, Some((10, b"abXY".to_vec())));
        assert_eq!(one.trace_len(), Some(14));
        assert_eq!(one.entry.as_ref().map(|(m, s)| (m.owner.as_str(), s.clone())), Some(("m2", vec![2])));
        // A write before the kept bytes replaces them from there on.
        assert_eq!(overlay.get(2).expect("job 2").trace, Some((1, b"q".to_vec())));
        let three = overlay.get(3).expect("job 3");
        assert!(three.removed && three.entry.is_none() && three.trace_len() == Some(0));
    }

    #[test]
    fn a_journal_is_created_reopened_and_its_torn_end_cut_off() {
        let dir = tempfile::tempdir().expect("tempdir");
        let (mut file, records, len) = open(dir.path()).expect("create");
        assert!(records.is_empty() && len == MAGIC.len() as u64);
        let record = Record::Remove { job_id: 4 };
        let mut bytes = framed(std::slice::from_ref(&record));
        let whole = len + bytes.len() as u64;
        bytes.extend_from_slice(&[9, 0, 0, 0, 1]);
        file.write_all(&bytes).expect("write");
        drop(file);
        let (_, records, len) = open(dir.path()).expect("reopen");
        assert_eq!((records, len), (vec![record.clone()], whole));
        assert_eq!(std::fs::metadata(dir.path().join(JOURNAL_FILE)).expect("meta").len(), whole);
        assert_eq!(read(dir.path()).expect("read"), vec![record]);
        std::fs::write(dir.path().join(JOURNAL_FILE), b"something else").expect("write");
        let err = open(dir.path()).expect_err("not a journal");
        assert!(err.to_string().contains("not a job store journal"), "{err}");
    }
}
