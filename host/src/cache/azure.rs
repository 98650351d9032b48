//! Azure Blob Storage service SAS tokens signed with the storage account key (HMAC-SHA256),
//! one blob, read or write, as gitlab-runner's Azure adapter asks for them.
//!
//! Owns pure functions of the key and `now`; must not do I/O or read the clock.

use base64::Engine as _;
use chrono::{DateTime, Utc};
use hmac::{Hmac, Mac};
use sha2::Sha256;

use crate::cache::canonical::uri_encode;

/// The SAS version signed (its string-to-sign layout is the one below).
pub(crate) const SAS_VERSION: &str = "2020-12-06";

/// One blob's SAS: what it allows and when.
pub(crate) struct BlobSas<'a> {
    pub account: &'a str,
    pub container: &'a str,
    pub blob: &'a str,
    /// `r` (read: GET, HEAD) or `w` (write: PUT).
    pub permissions: &'a str,
    pub start: DateTime<Utc>,
    pub expiry: DateTime<Utc>,
    /// `https`, or `https,http` for an http endpoint.
    pub protocol: &'a str,
}

fn sas_time(t: DateTime<Utc>) -> String {
    t.format("%Y-%m-%dT%H:%M:%SZ").to_string()
}

impl BlobSas<'_> {
    /// The string-to-sign of a service SAS (version 2020-12-06 and later, blob resource).
    pub(crate) fn string_to_sign(&self) -> String {
        let resource = format!("/blob/{}/{}/{}", self.account, self.container, self.blob);
        [
            self.permissions,
            &sas_time(self.start),
            &sas_time(self.expiry),
            &resource,
            "", // signed identifier
            "", // signed IP
            self.protocol,
            SAS_VERSION,
            "b", // signed resource: a blob
            "",  // snapshot time
            "",  // encryption scope
            "",  // rscc
            "",  // rscd
            "",  // rsce
            "",  // rscl
            "",  // rsct
        ]
        .join("\n")
    }

    /// The SAS query string (without `?`), signed with the account key (its raw bytes).
    pub(crate) fn query(&self, key: &[u8]) -> String {
        // HMAC takes a key of any length: new_from_slice cannot fail.
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
        mac.update(self.string_to_sign().as_bytes());
        let sig = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
        [
            ("sv", SAS_VERSION.to_string()),
            ("st", sas_time(self.start)),
            ("se", sas_time(self.expiry)),
            ("sr", "b".to_string()),
            ("sp", self.permissions.to_string()),
            ("spr", self.protocol.to_string()),
            ("sig", sig),
        ]
        .iter()
        .map(|(k, v)| format!("{k}={}", uri_encode(v, false)))
        .collect::<Vec<_>>()
        .join("&")
    }
}
