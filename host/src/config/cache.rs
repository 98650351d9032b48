//! `[runners.cache]`: the distributed cache of a runner, with gitlab-runner's key names
//! (`Type`, `Path`, `Shared`, `MaxUploadedArchiveSize`, `[runners.cache.s3]`,
//! `[runners.cache.gcs]`, `[runners.cache.azure]`) so a gitlab-runner config.toml loads as it is.
//!
//! Owns the model, the reading of its values (`AuthenticationType`, `ServerSideEncryption`,
//! the S3 endpoint) and the checks that name file, line and key. Must not sign anything, read
//! credentials files or talk to a provider: that is `crate::cache`.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::config::{line_of_key, ConfigError, Invalid};

/// `Type` values that mean S3 (gitlab-runner's `s3v2` is its current S3 adapter).
pub const S3_TYPES: &[&str] = &["s3", "s3v2"];
/// `Type` values that mean Google Cloud Storage.
pub const GCS_TYPES: &[&str] = &["gcs", "gcsv2"];
/// `Type` values that mean Azure Blob Storage.
pub const AZURE_TYPES: &[&str] = &["azure"];

/// `[runners.cache]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct CacheConfig {
    /// `s3`, `gcs` or `azure` (`s3v2`, `gcsv2` accepted); empty: no distributed cache.
    #[serde(rename = "Type", default, skip_serializing_if = "String::is_empty")]
    pub cache_type: String,
    /// Prefix of every object name.
    #[serde(rename = "Path", default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// Share the cache between runners (no `runner/<short token>/` in object names).
    #[serde(rename = "Shared", default, skip_serializing_if = "std::ops::Not::not")]
    pub shared: bool,
    /// Largest cache archive uploaded, in bytes (0: no limit).
    #[serde(rename = "MaxUploadedArchiveSize", default, skip_serializing_if = "is_zero")]
    pub max_uploaded_archive_size: i64,
    /// `[runners.cache.s3]`.
    #[serde(rename = "s3", default, skip_serializing_if = "Option::is_none")]
    pub s3: Option<CacheS3Config>,
    /// `[runners.cache.gcs]`.
    #[serde(rename = "gcs", default, skip_serializing_if = "Option::is_none")]
    pub gcs: Option<CacheGcsConfig>,
    /// `[runners.cache.azure]`.
    #[serde(rename = "azure", default, skip_serializing_if = "Option::is_none")]
    pub azure: Option<CacheAzureConfig>,
}

fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// The provider a `Type` names.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheType {
    /// Amazon S3 or an S3-compatible server.
    S3,
    /// Google Cloud Storage.
    Gcs,
    /// Azure Blob Storage.
    Azure,
}

impl CacheConfig {
    /// The provider of `Type`: `Ok(None)` when empty, `Err` with the accepted values when unknown.
    pub fn provider(&self) -> Result<Option<CacheType>, Invalid> {
        let t = self.cache_type.as_str();
        if t.is_empty() {
            Ok(None)
        } else if S3_TYPES.contains(&t) {
            Ok(Some(CacheType::S3))
        } else if GCS_TYPES.contains(&t) {
            Ok(Some(CacheType::Gcs))
        } else if AZURE_TYPES.contains(&t) {
            Ok(Some(CacheType::Azure))
        } else {
            Err(Invalid(format!("{t:?} is not a cache type: use \"s3\", \"gcs\" or \"azure\" (or leave it out for no distributed cache)")))
        }
    }
}

/// `[runners.cache.s3]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct CacheS3Config {
    /// `host[:port]` of an S3-compatible server; empty (or `s3.amazonaws.com`): AWS.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_address: String,
    /// Access key (with `AuthenticationType = "access-key"`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub access_key: String,
    /// Secret key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub secret_key: String,
    /// Session token of temporary access keys.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub session_token: String,
    /// The bucket (required).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bucket_name: String,
    /// The bucket's region (default `us-east-1`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bucket_location: String,
    /// `http://` instead of `https://` to `ServerAddress`.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub insecure: bool,
    /// `iam` or `access-key`; empty: `access-key` when `ServerAddress`, `AccessKey` and
    /// `SecretKey` are all set, else `iam`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub authentication_type: String,
    /// `S3` (`AES256`), `KMS` (`aws:kms`) or `DSSE-KMS` (`aws:kms:dsse`); empty: none.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub server_side_encryption: String,
    /// KMS key (alias, id or ARN) with `KMS`/`DSSE-KMS`.
    #[serde(rename = "ServerSideEncryptionKeyID", default, skip_serializing_if = "String::is_empty")]
    pub server_side_encryption_key_id: String,
    /// Dual-stack AWS endpoints (default true; AWS endpoint only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dual_stack: Option<bool>,
    /// Path-style URLs; absent: path style except on AWS and Google endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub path_style: Option<bool>,
    /// S3 Transfer Acceleration (AWS endpoint only).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub accelerate: bool,
    /// A role the manager assumes through STS (with its own credentials) to sign every URL,
    /// scoped by a session policy to the one object.
    #[serde(rename = "RoleARN", default, skip_serializing_if = "String::is_empty")]
    pub role_arn: String,
    /// As `RoleARN`, for uploads only (`RoleARN` wins when both are set, as in gitlab-runner).
    #[serde(rename = "UploadRoleARN", default, skip_serializing_if = "String::is_empty")]
    pub upload_role_arn: String,
    /// Most `AssumeRole` requests in flight at once: 0 means 5, negative no limit.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub assume_role_max_concurrency: i64,
    /// Ask STS for every URL instead of reusing the role's credentials while they last.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub disable_assume_role_credentials_caching: bool,
}

/// How S3 requests are authenticated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3AuthType {
    /// `AccessKey`/`SecretKey`/`SessionToken` of the config.
    AccessKey,
    /// The environment's `AWS_*` variables, else the EC2 instance profile (IMDSv2).
    Iam,
}

/// Server-side encryption the upload asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum S3Encryption {
    /// None asked.
    None,
    /// `AES256` (S3-managed keys).
    Aes256,
    /// `aws:kms`.
    Kms,
    /// `aws:kms:dsse`.
    DsseKms,
}

impl S3Encryption {
    /// The `x-amz-server-side-encryption` value (empty for none).
    pub fn header_value(self) -> &'static str {
        match self {
            S3Encryption::None => "",
            S3Encryption::Aes256 => "AES256",
            S3Encryption::Kms => "aws:kms",
            S3Encryption::DsseKms => "aws:kms:dsse",
        }
    }
}

impl CacheS3Config {
    /// `AuthenticationType` as gitlab-runner reads it (case-insensitive; empty is inferred).
    pub fn auth_type(&self) -> Result<S3AuthType, Invalid> {
        match self.authentication_type.to_ascii_lowercase().as_str() {
            "access-key" => Ok(S3AuthType::AccessKey),
            "iam" => Ok(S3AuthType::Iam),
            "" if self.server_address.is_empty() || self.access_key.is_empty() || self.secret_key.is_empty() => {
                Ok(S3AuthType::Iam)
            }
            "" => Ok(S3AuthType::AccessKey),
            other => Err(Invalid(format!("{other:?} is not an authentication type: use \"iam\" or \"access-key\""))),
        }
    }

    /// `ServerSideEncryption` as gitlab-runner reads it (case-insensitive).
    pub fn encryption(&self) -> Result<S3Encryption, Invalid> {
        match self.server_side_encryption.to_ascii_uppercase().as_str() {
            "" => Ok(S3Encryption::None),
            "S3" | "AES256" => Ok(S3Encryption::Aes256),
            "KMS" | "AWS:KMS" => Ok(S3Encryption::Kms),
            "DSSE-KMS" | "AWS:KMS:DSSE" => Ok(S3Encryption::DsseKms),
            _ => Err(Invalid(format!(
                "{:?} is not a server-side encryption: use \"S3\", \"KMS\" or \"DSSE-KMS\"",
                self.server_side_encryption
            ))),
        }
    }
}

/// `[runners.cache.gcs]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct CacheGcsConfig {
    /// Service account e-mail that signs (with `PrivateKey`).
    #[serde(rename = "AccessID", default, skip_serializing_if = "String::is_empty")]
    pub access_id: String,
    /// The service account's PEM private key.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub private_key: String,
    /// A service-account JSON key file (`client_email`, `private_key`); default
    /// `$GOOGLE_APPLICATION_CREDENTIALS` when neither this nor `AccessID` is set.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub credentials_file: String,
    /// The bucket (required).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub bucket_name: String,
    /// Universe domain: URLs go to `storage.<UniverseDomain>` (default `googleapis.com`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub universe_domain: String,
    /// Runway only: `scheme://host[:port]` the URLs go to instead (a GCS-compatible server or
    /// a test server); not in gitlab-runner.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
}

/// `[runners.cache.azure]`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(rename_all = "PascalCase")]
pub struct CacheAzureConfig {
    /// Storage account (required).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account_name: String,
    /// The account's key, base64: service SAS signed with it. Empty: user delegation SAS with
    /// the Azure identity of the runner's environment (workload or managed identity).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub account_key: String,
    /// The container (required).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub container_name: String,
    /// Blob service domain (default `blob.core.windows.net`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub storage_domain: String,
    /// Runway only: the blob service URL instead of `https://<AccountName>.<StorageDomain>`,
    /// e.g. `http://127.0.0.1:10000/devstoreaccount1` for Azurite; not in gitlab-runner.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub endpoint: String,
}

/// Check the `[runners.cache]` of runner `index`; errors name file, line and key.
pub(super) fn check(index: usize, cache: &CacheConfig, text: &str, path: &Path) -> Result<(), ConfigError> {
    let err = |key: &str, message: String| {
        let key = format!("runners[{index}].cache.{key}");
        ConfigError { path: path.to_path_buf(), line: line_of_key(text, &key), key: Some(key), message }
    };
    if cache.max_uploaded_archive_size < 0 {
        return Err(err("MaxUploadedArchiveSize", "must be 0 (no limit) or a number of bytes".into()));
    }
    let provider = cache.provider().map_err(|m| err("Type", m.0))?;
    match provider {
        None => Ok(()),
        Some(CacheType::S3) => {
            let Some(s3) = &cache.s3 else {
                return Err(err("Type", "Type = \"s3\" needs a [runners.cache.s3] section with BucketName".into()));
            };
            if s3.bucket_name.is_empty() {
                return Err(err("s3.BucketName", "must name the bucket".into()));
            }
            let auth = s3.auth_type().map_err(|m| err("s3.AuthenticationType", m.0))?;
            if auth == S3AuthType::AccessKey && (s3.access_key.is_empty() || s3.secret_key.is_empty()) {
                let key = if s3.access_key.is_empty() { "s3.AccessKey" } else { "s3.SecretKey" };
                return Err(err(key, "AuthenticationType = \"access-key\" needs AccessKey and SecretKey".into()));
            }
            s3.encryption().map_err(|m| err("s3.ServerSideEncryption", m.0))?;
            if s3.server_address.contains("://") || s3.server_address.contains('/') {
                return Err(err(
                    "s3.ServerAddress",
                    format!(
                        "{:?} must be host[:port], without a scheme or path (Insecure = true for http)",
                        s3.server_address
                    ),
                ));
            }
            Ok(())
        }
        Some(CacheType::Gcs) => {
            let Some(gcs) = &cache.gcs else {
                return Err(err("Type", "Type = \"gcs\" needs a [runners.cache.gcs] section with BucketName".into()));
            };
            if gcs.bucket_name.is_empty() {
                return Err(err("gcs.BucketName", "must name the bucket".into()));
            }
            if gcs.access_id.is_empty() != gcs.private_key.is_empty() {
                let key = if gcs.access_id.is_empty() { "gcs.AccessID" } else { "gcs.PrivateKey" };
                return Err(err(key, "AccessID and PrivateKey go together (or use CredentialsFile)".into()));
            }
            check_endpoint(&gcs.endpoint).map_err(|m| err("gcs.Endpoint", m.0))
        }
        Some(CacheType::Azure) => {
            let Some(azure) = &cache.azure else {
                return Err(err(
                    "Type",
                    "Type = \"azure\" needs a [runners.cache.azure] section with AccountName and ContainerName".into(),
                ));
            };
            for (key, value) in
                [("azure.AccountName", &azure.account_name), ("azure.ContainerName", &azure.container_name)]
            {
                if value.is_empty() {
                    return Err(err(key, "must be set".into()));
                }
            }
            check_endpoint(&azure.endpoint).map_err(|m| err("azure.Endpoint", m.0))
        }
    }
}

fn check_endpoint(endpoint: &str) -> Result<(), Invalid> {
    if endpoint.is_empty() || endpoint.starts_with("http://") || endpoint.starts_with("https://") {
        Ok(())
    } else {
        Err(Invalid(format!("{endpoint:?} must be an http:// or https:// URL")))
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
