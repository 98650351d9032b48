//! `.runner_system_id` beside config.toml and the short runner token (protocol reference
//! §1.2).

use std::path::Path;

use hmac::{Hmac, Mac};
use rand::Rng;
use sha2::Sha256;

fn valid(id: &str) -> bool {
    id.len() == 14
        && (id.starts_with("s_") || id.starts_with("r_"))
        && id[2..].chars().all(|c| c.is_ascii_alphanumeric())
}

fn generate() -> String {
    if let Ok(machine_id) = std::fs::read_to_string("/etc/machine-id") {
        let machine_id = machine_id.trim();
        if !machine_id.is_empty() {
            if let Ok(mut mac) = Hmac::<Sha256>::new_from_slice(machine_id.as_bytes()) {
                mac.update(b"gitlab-runner");
                let digest = hex::encode(mac.finalize().into_bytes());
                return format!("s_{}", &digest[..12]);
            }
        }
    }
    random_id()
}

fn random_id() -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..12).map(|_| rng.sample(rand::distr::Alphanumeric) as char).collect();
    format!("r_{suffix}")
}

/// The identity of a `runway router` kept in `<dir>/.runway_router_id`: random (`r_…`), so two
/// routers on one machine — which share a machine-derived system ID — own their store entries
/// apart; stable across restarts.
pub fn router_id(dir: &Path) -> anyhow::Result<String> {
    let path = dir.join(".runway_router_id");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let existing = existing.trim();
        if valid(existing) {
            return Ok(existing.to_string());
        }
    }
    let id = random_id();
    crate::store::atomic::write(&path, format!("{id}\n").as_bytes(), None)?;
    Ok(id)
}

/// The system ID stored in `<config dir>/.runner_system_id`, created when missing or invalid.
/// A config directory that cannot be written (a read-only ConfigMap mount in a pod) keeps the
/// new ID for this run only, with a warning saying how to make it stick, as gitlab-runner does.
pub fn system_id(config_dir: &Path) -> anyhow::Result<String> {
    let path = config_dir.join(".runner_system_id");
    if let Ok(existing) = std::fs::read_to_string(&path) {
        let existing = existing.trim();
        if valid(existing) {
            return Ok(existing.to_string());
        }
    }
    let id = generate();
    if let Err(e) = crate::store::atomic::write(&path, format!("{id}\n").as_bytes(), None) {
        tracing::warn!(
            state_file = %path.display(), system_id = %id,
            "couldn't save the new system ID ({e:#}); to identify this runner reliably, put a file there holding it: echo {id:?} > {:?}",
            path.display().to_string()
        );
    }
    Ok(id)
}

/// The short token shown in logs and `CI_RUNNER_SHORT_TOKEN`: prefixes stripped, 9 characters.
pub fn short_token(token: &str) -> String {
    let mut rest = token;
    for prefix in ["glrt-", "glrtr-", "glcbt-"] {
        if let Some(r) = rest.strip_prefix(prefix) {
            rest = r;
            break;
        }
    }
    for partition in ["t1_", "t2_", "t3_"] {
        if let Some(r) = rest.strip_prefix(partition) {
            rest = r;
            break;
        }
    }
    if rest.len() > 9 && rest.starts_with("GR") && rest[2..9].chars().all(|c| c.is_ascii_hexdigit()) {
        rest = &rest[9..];
    }
    rest.chars().take(9).collect()
}

/// What names a runner's own files and keys (its job store directory and Redis namespace, its
/// fleet state file): the first 16 hex digits of the SHA-256 of the whole token. The short
/// token is not enough: two runners whose tokens share their first characters would share
/// one store (gitlab-runner's `ShortenToken` has that flaw for its state storage).
pub fn token_digest(token: &str) -> String {
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(token.as_bytes());
    hex::encode(&digest[..8])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_config_dir_that_cannot_be_written_still_gets_an_id() {
        let dir = tempfile::tempdir().expect("dir");
        let missing = dir.path().join("not-there");
        let id = system_id(&missing).expect("an id without a file");
        assert!(valid(&id), "{id}");
        let kept = system_id(dir.path()).expect("id");
        assert_eq!(system_id(dir.path()).expect("again"), kept, "a writable dir keeps it");
    }

    #[test]
    fn token_digests_tell_tokens_with_one_prefix_apart() {
        let a = token_digest("glrt-t1_abcdefghijkXYZ");
        let b = token_digest("glrt-t1_abcdefghijkUVW");
        assert_eq!(short_token("glrt-t1_abcdefghijkXYZ"), short_token("glrt-t1_abcdefghijkUVW"));
        assert_ne!(a, b);
        assert_eq!(a.len(), 16);
        assert!(a.chars().all(|c| c.is_ascii_hexdigit()));
        assert_eq!(token_digest("glrt-t1_abcdefghijkXYZ"), a);
    }

    #[test]
    fn short_tokens() {
        assert_eq!(short_token("glrt-t1_abcdefghijklmnop"), "abcdefghi");
        assert_eq!(short_token("glrt-xyz123456789"), "xyz123456");
        assert_eq!(short_token("GR1348941abcdefghijk"), "abcdefghi");
        assert_eq!(short_token("short"), "short");
    }

    #[test]
    fn system_id_is_created_once_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let first = system_id(dir.path()).expect("create");
        assert!(valid(&first), "{first}");
        assert_eq!(system_id(dir.path()).expect("reuse"), first);
        std::fs::write(dir.path().join(".runner_system_id"), "garbage").expect("write");
        let replaced = system_id(dir.path()).expect("replace");
        assert!(valid(&replaced));
    }
}
