//! The Redis job store: several managers share one namespace, and a lease per job decides
//! which one runs it.
//!
//! Keys, all under `runway:store:{<namespace>}:` (the braces are a Redis Cluster hash tag, so a
//! namespace's keys share one slot and every script may touch them together):
//! - `job:<id>`: a hash with `meta` (the [`EntryMeta`] JSON as saved), `owner`, `heartbeat`
//!   (unix seconds on the server's clock), `resumes` — these three are authoritative over the
//!   copies inside `meta`, because only they are changed by the scripts — and `body` (the
//!   sealed body, raw bytes);
//! - `jobs`: the set of job ids;
//! - `trace:<id>`: the job's masked trace, appended with `APPEND`.
//!
//! Every check-and-write is one Lua script, atomic on the server: `save` writes only when the
//! entry is absent or the caller owns it; `claim` takes an entry only from its own owner or one
//! whose heartbeat is older than the health timeout by the server's `TIME`, so exactly one of
//! several concurrent claimers wins; `append_trace` truncates back to the saved offset and
//! appends in one step. Owns these keys and scripts; must not know what a body means.

use std::time::Duration;

use async_trait::async_trait;
use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use redis::Script;

use super::seal::StoreKey;
use super::{Entry, EntryMeta, JobStore, JobStoreError, Listed};

/// `save`: write the entry when it is absent or owned by the caller; 1 written, 0 lost.
/// KEYS: job hash, id set. ARGV: job id, owner, meta JSON, resumes, sealed body.
const SAVE: &str = r"
redis.replicate_commands()
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner and owner ~= ARGV[2] then return 0 end
local now = redis.call('TIME')[1]
redis.call('HSET', KEYS[1], 'meta', ARGV[3], 'owner', ARGV[2], 'heartbeat', now, 'resumes', ARGV[4], 'body', ARGV[5])
redis.call('SADD', KEYS[2], ARGV[1])
return 1
";

/// `claim`: `{status, meta, owner, heartbeat, resumes, body}` with status 0 = held by a live
/// owner, 1 = taken (fields as now stored), 2 = no such entry.
/// KEYS: job hash. ARGV: claimant, health timeout in seconds.
const CLAIM: &str = r"
redis.replicate_commands()
if redis.call('EXISTS', KEYS[1]) == 0 then return {2, false, false, false, false, false} end
local f = redis.call('HMGET', KEYS[1], 'owner', 'heartbeat', 'resumes')
local now = tonumber(redis.call('TIME')[1])
local heartbeat = tonumber(f[2])
if f[1] ~= ARGV[1] and heartbeat and now - heartbeat <= tonumber(ARGV[2]) then
  return {0, false, false, false, false, false}
end
local resumes = (tonumber(f[3]) or 0) + 1
redis.call('HSET', KEYS[1], 'owner', ARGV[1], 'heartbeat', now, 'resumes', resumes)
local v = redis.call('HMGET', KEYS[1], 'meta', 'owner', 'heartbeat', 'resumes', 'body')
return {1, v[1], v[2], v[3], v[4], v[5]}
";

/// `append_trace`: returns the trace's length before; when it was at least the offset, the
/// trace is cut back to the offset and the bytes are appended.
/// KEYS: trace. ARGV: offset, bytes.
const APPEND: &str = r"
local len = redis.call('STRLEN', KEYS[1])
local offset = tonumber(ARGV[1])
if len < offset then return len end
if len > offset then
  if offset == 0 then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], redis.call('GETRANGE', KEYS[1], 0, offset - 1))
  end
end
if #ARGV[2] > 0 then redis.call('APPEND', KEYS[1], ARGV[2]) end
return len
";

/// A job store in a Redis database (see the module doc for the keys).
#[derive(Clone)]
pub struct RedisStore {
    conn: ConnectionManager,
    prefix: String,
    key: StoreKey,
    describe: String,
    save: std::sync::Arc<Script>,
    claim: std::sync::Arc<Script>,
    append: std::sync::Arc<Script>,
}

impl std::fmt::Debug for RedisStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore").field("store", &self.describe).field("prefix", &self.prefix).finish()
    }
}

/// What [`JobStore::claim`]'s script answered.
type ClaimReply = (u8, Option<Vec<u8>>, Option<String>, Option<u64>, Option<u32>, Option<Vec<u8>>);

impl RedisStore {
    /// Connect to the database at `url` (`redis://` or `rediss://` for TLS), storing this
    /// runner's entries under `namespace`. The connection is re-established by itself when
    /// it drops; a call made while the server is away fails with [`JobStoreError::Backend`].
    pub async fn open(url: &str, namespace: &str, key: StoreKey) -> Result<RedisStore, JobStoreError> {
        let describe = format!("redis {}", without_credentials(url));
        let error = |e: redis::RedisError| JobStoreError::Backend(format!("job store {describe}: {e}"));
        let client = redis::Client::open(url).map_err(error)?;
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(Duration::from_secs(5)))
            .set_response_timeout(Some(Duration::from_secs(10)))
            .set_number_of_retries(3)
            .set_max_delay(Duration::from_secs(2));
        let conn = client.get_connection_manager_with_config(config).await.map_err(error)?;
        Ok(RedisStore {
            conn,
            prefix: format!("runway:store:{{{namespace}}}:"),
            key,
            describe,
            save: std::sync::Arc::new(Script::new(SAVE)),
            claim: std::sync::Arc::new(Script::new(CLAIM)),
            append: std::sync::Arc::new(Script::new(APPEND)),
        })
    }

    /// The prefix of every key of this store (`runway:store:{<namespace>}:`).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Move the entries an earlier version kept under `old_namespace` (the runner's short
    /// token) into this store's namespace, once: only while this namespace has no entries.
    /// Each key is copied (`DUMP`/`RESTORE`, which works across Cluster slots) before the old
    /// one is deleted, so a crash in between leaves a copy, never nothing.
    pub async fn migrate(&self, old_namespace: &str) -> Result<(), JobStoreError> {
        let mut conn = self.conn.clone();
        let mine: u64 =
            redis::cmd("SCARD").arg(self.set_key()).query_async(&mut conn).await.map_err(|e| self.error(e))?;
        if mine > 0 {
            return Ok(());
        }
        let old_prefix = format!("runway:store:{{{old_namespace}}}:");
        let old_set = format!("{old_prefix}jobs");
        let members: Vec<String> =
            redis::cmd("SMEMBERS").arg(&old_set).query_async(&mut conn).await.map_err(|e| self.error(e))?;
        for member in &members {
            for kind in ["job", "trace"] {
                let from = format!("{old_prefix}{kind}:{member}");
                let to = format!("{}{kind}:{member}", self.prefix);
                let dump: Option<Vec<u8>> =
                    redis::cmd("DUMP").arg(&from).query_async(&mut conn).await.map_err(|e| self.error(e))?;
                if let Some(dump) = dump {
                    let () = redis::cmd("RESTORE")
                        .arg(&to)
                        .arg(0)
                        .arg(dump)
                        .arg("REPLACE")
                        .query_async(&mut conn)
                        .await
                        .map_err(|e| self.error(e))?;
                }
            }
            let _: u64 = redis::cmd("SADD")
                .arg(self.set_key())
                .arg(member)
                .query_async(&mut conn)
                .await
                .map_err(|e| self.error(e))?;
            for kind in ["job", "trace"] {
                let _: u64 = redis::cmd("DEL")
                    .arg(format!("{old_prefix}{kind}:{member}"))
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| self.error(e))?;
            }
            let _: u64 =
                redis::cmd("SREM").arg(&old_set).arg(member).query_async(&mut conn).await.map_err(|e| self.error(e))?;
        }
        if !members.is_empty() {
            tracing::info!(
                store = %self.describe,
                from = %old_prefix,
                to = %self.prefix,
                entries = members.len(),
                "moved the job store's entries to the runner's token digest namespace"
            );
        }
        Ok(())
    }

    fn job_key(&self, job_id: u64) -> String {
        format!("{}job:{job_id}", self.prefix)
    }

    fn trace_key(&self, job_id: u64) -> String {
        format!("{}trace:{job_id}", self.prefix)
    }

    fn set_key(&self) -> String {
        format!("{}jobs", self.prefix)
    }

    fn error(&self, e: redis::RedisError) -> JobStoreError {
        JobStoreError::Backend(format!("job store {}: {e}", self.describe))
    }
}

/// `url` with any `user:password@` left out, for logs.
fn without_credentials(url: &str) -> String {
    let (scheme, rest) = url.split_once("://").unwrap_or(("", url));
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let host = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    if scheme.is_empty() {
        format!("{host}{path}")
    } else {
        format!("{scheme}://{host}{path}")
    }
}

/// Why a job hash holds no usable meta (the entry is then listed as corrupt).
#[derive(Debug, thiserror::Error)]
enum BadMeta {
    /// A field the save script always writes is absent.
    #[error("the entry has no {0}")]
    Missing(&'static str),
    /// The `meta` field does not decode.
    #[error("meta is not an entry's JSON: {0}")]
    Json(serde_json::Error),
    /// The `meta` field is another job's.
    #[error("meta holds job {0}")]
    OtherJob(u64),
}

/// The meta of a job hash: the `meta` JSON with the script-kept fields put over it.
fn assemble_meta(
    job_id: u64,
    meta: Option<&[u8]>,
    owner: Option<String>,
    heartbeat: Option<u64>,
    resumes: Option<u32>,
) -> Result<EntryMeta, BadMeta> {
    let meta = meta.ok_or(BadMeta::Missing("meta"))?;
    let mut meta: EntryMeta = serde_json::from_slice(meta).map_err(BadMeta::Json)?;
    if meta.job_id != job_id {
        return Err(BadMeta::OtherJob(meta.job_id));
    }
    meta.owner = owner.ok_or(BadMeta::Missing("owner"))?;
    meta.heartbeat = heartbeat.ok_or(BadMeta::Missing("heartbeat"))?;
    meta.resumes = resumes.ok_or(BadMeta::Missing("resume count"))?;
    Ok(meta)
}

#[async_trait]
impl JobStore for RedisStore {
    fn describe(&self) -> String {
        self.describe.clone()
    }

    async fn save(&self, entry: &Entry) -> Result<(), JobStoreError> {
        let job_id = entry.meta.job_id;
        let meta = serde_json::to_vec(&entry.meta)
            .map_err(|e| JobStoreError::Backend(format!("encoding the meta of job {job_id}: {e}")))?;
        let sealed = self.key.seal(job_id, &entry.body);
        let written: u8 = self
            .save
            .key(self.job_key(job_id))
            .key(self.set_key())
            .arg(job_id)
            .arg(&entry.meta.owner)
            .arg(meta)
            .arg(entry.meta.resumes)
            .arg(sealed)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.error(e))?;
        if written == 1 {
            Ok(())
        } else {
            Err(JobStoreError::Lost(job_id))
        }
    }

    async fn append_trace(&self, job_id: u64, offset: u64, bytes: &[u8]) -> Result<(), JobStoreError> {
        let before: u64 = self
            .append
            .key(self.trace_key(job_id))
            .arg(offset)
            .arg(bytes)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.error(e))?;
        if before < offset {
            return Err(JobStoreError::Corrupt {
                job_id,
                message: format!("{}: the trace has {before} bytes, {offset} were stored", self.trace_key(job_id)),
            });
        }
        Ok(())
    }

    async fn read_trace(&self, job_id: u64, len: u64) -> Result<Vec<u8>, JobStoreError> {
        if len == 0 {
            return Ok(Vec::new());
        }
        let key = self.trace_key(job_id);
        let end = i64::try_from(len - 1).unwrap_or(i64::MAX);
        let bytes: Vec<u8> = redis::cmd("GETRANGE")
            .arg(&key)
            .arg(0)
            .arg(end)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.error(e))?;
        if (bytes.len() as u64) < len {
            return Err(JobStoreError::Corrupt {
                job_id,
                message: format!("{key}: the trace has {} bytes, {len} were stored", bytes.len()),
            });
        }
        Ok(bytes)
    }

    async fn list(&self) -> Result<Vec<Listed>, JobStoreError> {
        let mut conn = self.conn.clone();
        let set = self.set_key();
        let members: Vec<String> =
            redis::cmd("SMEMBERS").arg(&set).query_async(&mut conn).await.map_err(|e| self.error(e))?;
        let mut out = Vec::new();
        let mut ids = Vec::new();
        for member in members {
            match member.parse::<u64>() {
                Ok(id) => ids.push(id),
                Err(_) => out.push(Listed::Corrupt {
                    job_id: None,
                    location: set.clone(),
                    error: format!("member {member:?} is not a job id"),
                }),
            }
        }
        ids.sort_unstable();
        // One round trip for every entry's meta; the bodies stay on the server.
        let mut pipe = redis::pipe();
        for id in &ids {
            pipe.cmd("HMGET").arg(self.job_key(*id)).arg("meta").arg("owner").arg("heartbeat").arg("resumes");
        }
        type Fields = (Option<Vec<u8>>, Option<String>, Option<String>, Option<String>);
        let rows: Vec<Fields> =
            if ids.is_empty() { Vec::new() } else { pipe.query_async(&mut conn).await.map_err(|e| self.error(e))? };
        for (id, (meta, owner, heartbeat, resumes)) in ids.into_iter().zip(rows) {
            let location = self.job_key(id);
            if meta.is_none() && owner.is_none() {
                out.push(Listed::Corrupt { job_id: Some(id), location, error: "listed, but the entry is gone".into() });
                continue;
            }
            let heartbeat = heartbeat.and_then(|h| h.parse().ok());
            let resumes = resumes.and_then(|r| r.parse().ok());
            match assemble_meta(id, meta.as_deref(), owner, heartbeat, resumes) {
                Ok(meta) => out.push(Listed::Entry(meta)),
                Err(e) => out.push(Listed::Corrupt { job_id: Some(id), location, error: e.to_string() }),
            }
        }
        Ok(out)
    }

    async fn claim(&self, job_id: u64, owner: &str, health_timeout: Duration) -> Result<Option<Entry>, JobStoreError> {
        let reply: ClaimReply = self
            .claim
            .key(self.job_key(job_id))
            .arg(owner)
            .arg(health_timeout.as_secs())
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(|e| self.error(e))?;
        let (status, meta, stored_owner, heartbeat, resumes, body) = reply;
        if status != 1 {
            return Ok(None);
        }
        let corrupt = |message: String| JobStoreError::Corrupt { job_id, message };
        let meta = assemble_meta(job_id, meta.as_deref(), stored_owner, heartbeat, resumes)
            .map_err(|m| corrupt(format!("{}: {m}", self.job_key(job_id))))?;
        let sealed = body.ok_or_else(|| corrupt(format!("{}: the entry has no body", self.job_key(job_id))))?;
        let body = self.key.open(job_id, &sealed)?;
        Ok(Some(Entry { meta, body }))
    }

    async fn remove(&self, job_id: u64) -> Result<(), JobStoreError> {
        redis::pipe()
            .atomic()
            .del(self.job_key(job_id))
            .ignore()
            .del(self.trace_key(job_id))
            .ignore()
            .srem(self.set_key(), job_id)
            .ignore()
            .query_async::<()>(&mut self.conn.clone())
            .await
            .map_err(|e| self.error(e))
    }

    async fn now(&self) -> Result<u64, JobStoreError> {
        let (secs, _micros): (u64, u64) =
            redis::cmd("TIME").query_async(&mut self.conn.clone()).await.map_err(|e| self.error(e))?;
        Ok(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn credentials_never_reach_the_description() {
        assert_eq!(without_credentials("redis://:hunter2@10.0.0.1:6379/0"), "redis://10.0.0.1:6379/0");
        assert_eq!(without_credentials("rediss://user:p%40ss@cache:6380"), "rediss://cache:6380");
        assert_eq!(without_credentials("redis://127.0.0.1/2"), "redis://127.0.0.1/2");
    }

    #[test]
    fn script_fields_override_the_meta_copy_and_bad_meta_is_reported() {
        let meta = EntryMeta {
            job_id: 4,
            owner: "old".into(),
            created: 1,
            heartbeat: 2,
            resumes: 0,
            stage: "build_script".into(),
            project: "g/p".into(),
        };
        let json = serde_json::to_vec(&meta).expect("json");
        let got = assemble_meta(4, Some(&json), Some("new".into()), Some(9), Some(3)).expect("meta");
        assert_eq!((got.owner.as_str(), got.heartbeat, got.resumes, got.stage.as_str()), ("new", 9, 3, "build_script"));
        assert!(assemble_meta(5, Some(&json), Some("o".into()), Some(1), Some(0))
            .expect_err("other job")
            .to_string()
            .contains("job 4"));
        assert!(assemble_meta(4, Some(b"{"), Some("o".into()), Some(1), Some(0))
            .expect_err("json")
            .to_string()
            .contains("JSON"));
        assert!(assemble_meta(4, Some(&json), None, Some(1), Some(0))
            .expect_err("owner")
            .to_string()
            .contains("owner"));
    }
}
