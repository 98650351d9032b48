//! Sealing job store bodies: XChaCha20-Poly1305 (AEAD) under a 32-byte [`StoreKey`] kept
//! outside the store — `RUNWAY_STORE_KEY` (64 hex characters) or a 0600 key file beside
//! config.toml, created on first use.
//!
//! A sealed body is `nonce (24 random bytes) ‖ ciphertext ‖ tag`, with the job id as associated
//! data, so a body copied into another job's entry does not open. Owns the key, its file and
//! the sealing; must not know what a body holds (the caller's bytes) or where it is stored.

use std::fmt;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use rand::RngCore;

use super::JobStoreError;

/// The environment variable that, when set, holds the key (64 hex characters) instead of the
/// key file.
pub const KEY_ENV: &str = "RUNWAY_STORE_KEY";

/// The key file's name in the config directory (`<config dir>/.runway-store.key`).
pub const KEY_FILE: &str = ".runway-store.key";

/// Length of the random nonce that starts every sealed body.
const NONCE_LEN: usize = 24;

/// The key that seals job store bodies. Its `Debug` never shows the key.
#[derive(Clone)]
pub struct StoreKey {
    cipher: XChaCha20Poly1305,
}

impl fmt::Debug for StoreKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("StoreKey(..)")
    }
}

impl StoreKey {
    /// A key from its bytes (tests, benchmarks, callers that keep the key elsewhere).
    pub fn from_bytes(bytes: [u8; 32]) -> StoreKey {
        StoreKey { cipher: XChaCha20Poly1305::new(&bytes.into()) }
    }

    /// The key from `RUNWAY_STORE_KEY` when it is set, else from the key file at `path`,
    /// which is created (mode 0600, a fresh random key) when missing. A key file that group
    /// or others may read is refused: the key is what keeps the store's secrets.
    pub fn load_or_create(path: &Path) -> Result<StoreKey, JobStoreError> {
        load(std::env::var(KEY_ENV), path)
    }

    /// Seal `plain` for job `job_id`: a fresh random nonce, then the ciphertext and tag.
    pub fn seal(&self, job_id: u64, plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rng().fill_bytes(&mut nonce);
        let aad = job_id.to_be_bytes();
        let nonce_array = XNonce::from(nonce);
        let sealed = self.cipher.encrypt(&nonce_array, Payload { msg: plain, aad: &aad });
        let mut out = Vec::with_capacity(NONCE_LEN + plain.len() + 16);
        out.extend_from_slice(&nonce);
        // Encryption with an in-memory buffer fails only past the cipher's length limit
        // (256 GiB), far beyond any body; an empty seal would then fail to open (Corrupt).
        out.extend_from_slice(&sealed.unwrap_or_default());
        out
    }

    /// Open what [`StoreKey::seal`] sealed for the same `job_id`; a wrong key, another job's
    /// body or any changed byte is [`JobStoreError::Corrupt`].
    pub fn open(&self, job_id: u64, sealed: &[u8]) -> Result<Vec<u8>, JobStoreError> {
        let corrupt = |message: &str| JobStoreError::Corrupt { job_id, message: message.to_string() };
        if sealed.len() < NONCE_LEN + 16 {
            return Err(corrupt("sealed body too short"));
        }
        let (nonce, ciphertext) = sealed.split_at(NONCE_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| corrupt("sealed body too short"))?;
        let aad = job_id.to_be_bytes();
        self.cipher.decrypt(&nonce, Payload { msg: ciphertext, aad: &aad }).map_err(|_| {
            corrupt("the sealed body does not open with this store key (another key, another job's entry, or changed bytes)")
        })
    }
}

/// [`StoreKey::load_or_create`] with the environment variable's value handed in.
fn load(env: Result<String, std::env::VarError>, path: &Path) -> Result<StoreKey, JobStoreError> {
    match env {
        Ok(text) => return parse_hex(&text).map_err(|m| key_error(format!("{KEY_ENV}: {m}"))),
        Err(std::env::VarError::NotUnicode(_)) => {
            return Err(key_error(format!("{KEY_ENV}: must be 64 hexadecimal characters")))
        }
        Err(std::env::VarError::NotPresent) => {}
    }
    match std::fs::metadata(path) {
        Ok(meta) => {
            let mode = meta.permissions().mode() & 0o777;
            if mode & 0o077 != 0 {
                return Err(key_error(format!(
                    "{}: the job store key file has mode {mode:04o}; it must be readable by its owner only (chmod 600 {})",
                    path.display(),
                    path.display()
                )));
            }
            read_key_file(path)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => create_key_file(path),
        Err(e) => Err(key_error(format!("{}: {e}", path.display()))),
    }
}

fn key_error(message: String) -> JobStoreError {
    JobStoreError::Backend(format!("job store key: {message}"))
}

/// Text that is not a key: how many characters it had.
#[derive(Debug, thiserror::Error)]
#[error("must be 64 hexadecimal characters (32 bytes), got {0} characters")]
struct NotAKey(usize);

/// 64 hex characters (surrounding white space ignored) as a key.
fn parse_hex(text: &str) -> Result<StoreKey, NotAKey> {
    let text = text.trim();
    let mut bytes = [0u8; 32];
    if text.len() != 64 || hex::decode_to_slice(text, &mut bytes).is_err() {
        return Err(NotAKey(text.len()));
    }
    Ok(StoreKey::from_bytes(bytes))
}

fn read_key_file(path: &Path) -> Result<StoreKey, JobStoreError> {
    let text = std::fs::read_to_string(path).map_err(|e| key_error(format!("{}: {e}", path.display())))?;
    parse_hex(&text).map_err(|m| key_error(format!("{}: {m}", path.display())))
}

/// Create the key file with a fresh key; when another process created it meanwhile, use theirs.
fn create_key_file(path: &Path) -> Result<StoreKey, JobStoreError> {
    let mut bytes = [0u8; 32];
    rand::rng().fill_bytes(&mut bytes);
    let text = format!("{}\n", hex::encode(bytes));
    let created = crate::store::atomic::create_private(path, text.as_bytes())
        .map_err(|e| key_error(format!("creating the key file: {e}")))?;
    if created {
        Ok(StoreKey::from_bytes(bytes))
    } else {
        read_key_file(path)
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    fn key(n: u8) -> StoreKey {
        StoreKey::from_bytes([n; 32])
    }

    #[test]
    fn round_trip_and_nonces_differ() {
        let k = key(1);
        let a = k.seal(7, b"secret body");
        let b = k.seal(7, b"secret body");
        assert_ne!(a, b, "a fresh nonce every time");
        assert!(!a.windows(6).any(|w| w == b"secret"), "no plaintext in the sealed bytes");
        assert_eq!(k.open(7, &a).expect("opens"), b"secret body");
        assert_eq!(k.open(7, &k.seal(7, b"")).expect("empty body"), b"");
    }

    #[test]
    fn wrong_key_other_job_and_tampering_are_corrupt() {
        let sealed = key(1).seal(7, b"body");
        for (what, result) in [
            ("wrong key", key(2).open(7, &sealed)),
            ("other job", key(1).open(8, &sealed)),
            ("too short", key(1).open(7, &sealed[..20])),
        ] {
            assert!(matches!(result, Err(JobStoreError::Corrupt { .. })), "{what}: {result:?}");
        }
        for i in [0, NONCE_LEN, sealed.len() - 1] {
            let mut changed = sealed.clone();
            changed[i] ^= 1;
            assert!(matches!(key(1).open(7, &changed), Err(JobStoreError::Corrupt { job_id: 7, .. })), "byte {i}");
        }
    }

    #[test]
    fn debug_hides_the_key() {
        assert_eq!(format!("{:?}", key(0xab)), "StoreKey(..)");
    }

    fn no_env() -> Result<String, std::env::VarError> {
        Err(std::env::VarError::NotPresent)
    }

    #[test]
    fn key_file_is_created_private_and_reused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(".runway-store.key");
        let first = load(no_env(), &path).expect("created");
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let text = std::fs::read_to_string(&path).expect("read");
        assert_eq!(text.trim().len(), 64);
        let second = load(no_env(), &path).expect("read back");
        assert_eq!(second.open(1, &first.seal(1, b"x")).expect("same key"), b"x");
    }

    #[test]
    fn key_file_readable_by_others_or_malformed_is_refused() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        std::fs::write(&path, "00".repeat(32)).expect("write");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).expect("chmod");
        let err = load(no_env(), &path).expect_err("world readable");
        assert!(err.to_string().contains("mode 0644") && err.to_string().contains("chmod 600"), "{err}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).expect("chmod");
        load(no_env(), &path).expect("private is fine");
        std::fs::write(&path, "not hex").expect("write");
        let err = load(no_env(), &path).expect_err("malformed");
        assert!(err.to_string().contains("64 hexadecimal characters"), "{err}");
    }

    #[test]
    fn the_environment_variable_wins_over_the_file_and_must_be_hex() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("key");
        let from_env = load(Ok("11".repeat(32)), &path).expect("env key");
        assert!(!path.exists(), "no key file is created when the variable is set");
        assert_eq!(key(0x11).open(3, &from_env.seal(3, b"x")).expect("same key"), b"x");
        let err = load(Ok("short".into()), &path).expect_err("not hex");
        assert!(err.to_string().contains("RUNWAY_STORE_KEY: must be 64 hexadecimal characters"), "{err}");
    }

    #[test]
    fn hex_keys_parse_strictly() {
        assert!(parse_hex(&format!("{}\n", "ab".repeat(32))).is_ok());
        assert!(parse_hex(&"ab".repeat(31)).is_err());
        assert!(parse_hex(&"zz".repeat(32)).is_err());
    }
}
