//! Google Cloud Storage signed URLs (Google's V4 signing, `GOOG4-RSA-SHA256`) with a service
//! account's RSA key, and the reading of that key (inline PEM or a service-account JSON file).
//!
//! Owns key parsing and pure signing functions of the key and `now`; must not do I/O (the
//! credentials file is read by `CacheStore::refresh_credentials`) or read the clock.

use chrono::{DateTime, Utc};
use ring::rand::SystemRandom;
use ring::signature::{RsaKeyPair, RSA_PKCS1_SHA256};
use sha2::{Digest, Sha256};

use crate::cache::canonical::Canonical;
use base64::Engine as _;

/// Why a service-account key could not be read, or a URL not signed with it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct KeyError(String);

/// A service account that signs: its e-mail and RSA key.
pub struct GcsSigner {
    /// `client_email` / `AccessID`.
    pub(crate) email: String,
    key: RsaKeyPair,
}

impl std::fmt::Debug for GcsSigner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcsSigner").field("email", &self.email).finish_non_exhaustive()
    }
}

impl GcsSigner {
    /// A signer from the account e-mail and its PEM key (`PRIVATE KEY`, PKCS #8, as in
    /// service-account files, or `RSA PRIVATE KEY`, PKCS #1).
    pub fn new(email: &str, pem: &str) -> Result<GcsSigner, KeyError> {
        let (label, der) = pem_decode(pem)?;
        let key = match label.as_str() {
            "PRIVATE KEY" => RsaKeyPair::from_pkcs8(&der),
            "RSA PRIVATE KEY" => RsaKeyPair::from_der(&der),
            other => return Err(KeyError(format!("a {other:?} PEM block is not an RSA private key"))),
        }
        .map_err(|e| KeyError(format!("not a usable RSA private key: {e}")))?;
        Ok(GcsSigner { email: email.to_string(), key })
    }

    /// A signer from a service-account JSON key (`client_email`, `private_key`).
    pub fn from_json(json: &str) -> Result<GcsSigner, KeyError> {
        #[derive(serde::Deserialize)]
        struct ServiceAccount {
            client_email: String,
            private_key: String,
        }
        let sa: ServiceAccount = serde_json::from_str(json)
            .map_err(|e| KeyError(format!("not a service-account key (client_email, private_key): {e}")))?;
        GcsSigner::new(&sa.client_email, &sa.private_key)
    }

    /// The public key (DER `RSAPublicKey`), for a server that checks signatures.
    pub fn public_key_der(&self) -> Vec<u8> {
        use ring::signature::KeyPair as _;
        self.key.public_key().as_ref().to_vec()
    }

    fn sign(&self, message: &[u8]) -> Result<Vec<u8>, KeyError> {
        let mut signature = vec![0; self.key.public().modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &SystemRandom::new(), message, &mut signature)
            .map_err(|_| KeyError("RSA signing failed".into()))?;
        Ok(signature)
    }
}

/// The first PEM block of `pem`: its label and bytes.
fn pem_decode(pem: &str) -> Result<(String, Vec<u8>), KeyError> {
    let pem = pem.replace("\\n", "\n");
    let begin = pem.find("-----BEGIN ").ok_or_else(|| KeyError("no -----BEGIN line: not a PEM key".into()))?;
    let rest = &pem[begin + 11..];
    let label_end =
        rest.find("-----").ok_or_else(|| KeyError("a -----BEGIN line without its closing dashes".into()))?;
    let label = rest[..label_end].to_string();
    let body_start = label_end + 5;
    let end_marker = format!("-----END {label}-----");
    let body_end = rest.find(&end_marker).ok_or_else(|| KeyError(format!("no {end_marker} line")))?;
    let body: String = rest[body_start..body_end].chars().filter(|c| !c.is_whitespace()).collect();
    let der = base64::engine::general_purpose::STANDARD
        .decode(body)
        .map_err(|e| KeyError(format!("the {label} block is not base64: {e}")))?;
    Ok((label, der))
}

/// A V4 signed URL: `method` on `path` (encoded, `/bucket/object`) at `scheme://host`, valid
/// `expires_secs` from `now`, carrying `headers` (signed: the request must send them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn presign(
    signer: &GcsSigner,
    method: &str,
    scheme: &str,
    host: &str,
    path: &str,
    headers: &[(String, String)],
    expires_secs: u64,
    now: DateTime<Utc>,
) -> Result<String, KeyError> {
    let date = now.format("%Y%m%d").to_string();
    let timestamp = now.format("%Y%m%dT%H%M%SZ").to_string();
    let scope = format!("{date}/auto/storage/goog4_request");
    let mut canonical = Canonical { method, scheme, host, path, query: Vec::new(), headers };
    canonical.query = vec![
        ("X-Goog-Algorithm".to_string(), "GOOG4-RSA-SHA256".to_string()),
        ("X-Goog-Credential".to_string(), format!("{}/{scope}", signer.email)),
        ("X-Goog-Date".to_string(), timestamp.clone()),
        ("X-Goog-Expires".to_string(), expires_secs.to_string()),
        ("X-Goog-SignedHeaders".to_string(), canonical.signed_headers()),
    ];
    let request_hash = hex::encode(Sha256::digest(canonical.request().as_bytes()));
    let string_to_sign = format!("GOOG4-RSA-SHA256\n{timestamp}\n{scope}\n{request_hash}");
    let signature = hex::encode(signer.sign(string_to_sign.as_bytes())?);
    Ok(canonical.url("X-Goog-Signature", &signature))
}
