//! Azure Blob Storage SAS tokens for one blob, read or write, as gitlab-runner's Azure adapter
//! asks for them: a service SAS signed with the storage account key, or (no `AccountKey`) a
//! user delegation SAS signed with a user delegation key the blob service gave an Entra ID
//! identity (both HMAC-SHA256, each with its own string-to-sign).
//!
//! Owns pure functions of the key and `now`; must not do I/O or read the clock (the user
//! delegation key is fetched by `azure_identity`).

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
    /// A string-to-sign of version 2020-12-06 and later for this blob: the permissions,
    /// times and canonicalized resource, then `signer` (what tells a service SAS from a user
    /// delegation SAS), then the fields both end with.
    fn string_to_sign_with(&self, signer: &[&str]) -> String {
        let resource = format!("/blob/{}/{}/{}", self.account, self.container, self.blob);
        let (start, expiry) = (sas_time(self.start), sas_time(self.expiry));
        let head = [self.permissions, start.as_str(), expiry.as_str(), resource.as_str()];
        let tail = [
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
        ];
        head.iter().chain(signer).chain(tail.iter()).copied().collect::<Vec<&str>>().join("\n")
    }

    /// The query parameters both kinds of SAS begin with.
    fn query_head(&self) -> Vec<(&'static str, String)> {
        vec![
            ("sv", SAS_VERSION.to_string()),
            ("st", sas_time(self.start)),
            ("se", sas_time(self.expiry)),
            ("sr", "b".to_string()),
            ("sp", self.permissions.to_string()),
            ("spr", self.protocol.to_string()),
        ]
    }

    /// The string-to-sign of a service SAS (version 2020-12-06 and later, blob resource).
    pub(crate) fn string_to_sign(&self) -> String {
        self.string_to_sign_with(&[""]) // signed identifier
    }

    /// The SAS query string (without `?`), signed with the account key (its raw bytes).
    pub(crate) fn query(&self, key: &[u8]) -> String {
        let mut pairs = self.query_head();
        pairs.push(("sig", hmac_base64(key, &self.string_to_sign())));
        encode(&pairs)
    }

    /// The string-to-sign of a user delegation SAS (version 2020-12-06 and later, before
    /// 2025-07-05, blob resource), as Microsoft's "Create a user delegation SAS" lays it out:
    /// the key's `skoid`, `sktid`, `skt`, `ske`, `sks`, `skv` after the canonicalized resource,
    /// then the (unused) authorized/unauthorized object ids and correlation id.
    pub(crate) fn delegated_string_to_sign(&self, key: &UserDelegationKey) -> String {
        self.string_to_sign_with(&[
            &key.object_id,
            &key.tenant_id,
            &key.start,
            &key.expiry,
            &key.service,
            &key.version,
            "", // signedAuthorizedUserObjectId
            "", // signedUnauthorizedUserObjectId
            "", // signedCorrelationId
        ])
    }

    /// The user delegation SAS query string (without `?`), signed with `key`'s value.
    pub(crate) fn delegated_query(&self, key: &UserDelegationKey) -> String {
        let mut pairs = self.query_head();
        pairs.extend([
            ("skoid", key.object_id.clone()),
            ("sktid", key.tenant_id.clone()),
            ("skt", key.start.clone()),
            ("ske", key.expiry.clone()),
            ("sks", key.service.clone()),
            ("skv", key.version.clone()),
            ("sig", hmac_base64(&key.value, &self.delegated_string_to_sign(key))),
        ]);
        encode(&pairs)
    }
}

/// A user delegation key as Get User Delegation Key answers it; the `Signed*` strings are kept
/// as the service wrote them (they are signed and sent back verbatim).
#[derive(Clone, PartialEq, Eq)]
pub(crate) struct UserDelegationKey {
    /// `SignedOid`: the identity's object id.
    pub object_id: String,
    /// `SignedTid`: its tenant.
    pub tenant_id: String,
    /// `SignedStart`, `SignedExpiry`: the key's validity (ISO 8601).
    pub start: String,
    pub expiry: String,
    /// `SignedService` (`b`) and `SignedVersion`.
    pub service: String,
    pub version: String,
    /// `Value`, base64-decoded.
    pub value: Vec<u8>,
    /// `start` and `expiry` parsed.
    pub starts: DateTime<Utc>,
    pub expires: DateTime<Utc>,
}

impl std::fmt::Debug for UserDelegationKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UserDelegationKey")
            .field("object_id", &self.object_id)
            .field("tenant_id", &self.tenant_id)
            .field("start", &self.start)
            .field("expiry", &self.expiry)
            .finish_non_exhaustive()
    }
}

fn hmac_base64(key: &[u8], text: &str) -> String {
    // HMAC takes a key of any length: new_from_slice cannot fail.
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(text.as_bytes());
    base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
}

fn encode(pairs: &[(&str, String)]) -> String {
    pairs.iter().map(|(k, v)| format!("{k}={}", uri_encode(v, false))).collect::<Vec<_>>().join("&")
}
