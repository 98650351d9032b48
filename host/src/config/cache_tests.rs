//! `[runners.cache]` as gitlab-runner writes it: every key loads, wrong ones name file, line and key.

use std::path::Path;

use crate::config::cache::{CacheType, S3AuthType, S3Encryption};
use crate::config::{parse, ConfigError, Loaded};

const HEAD: &str =
    "concurrent = 1\n[[runners]]\nurl = \"https://gitlab.example.com\"\ntoken = \"glrt-x\"\nexecutor = \"shell\"\n";

fn parse_str(cache: &str) -> Result<Loaded, ConfigError> {
    parse(&format!("{HEAD}{cache}"), Path::new("/etc/runway/config.toml"))
}

#[test]
fn every_gitlab_runner_key_loads() {
    let text = r#"[runners.cache]
  Type = "s3"
  Path = "ci"
  Shared = true
  MaxUploadedArchiveSize = 1048576
  [runners.cache.s3]
    ServerAddress = "minio.example:9000"
    AccessKey = "AK"
    SecretKey = "SK"
    SessionToken = "ST"
    BucketName = "cache"
    BucketLocation = "eu-west-1"
    Insecure = true
    AuthenticationType = "access-key"
    ServerSideEncryption = "KMS"
    ServerSideEncryptionKeyID = "alias/x"
    DualStack = false
    PathStyle = true
    Accelerate = false
    RoleARN = "arn:aws:iam::1:role/r"
    UploadRoleARN = "arn:aws:iam::1:role/u"
    AssumeRoleMaxConcurrency = 5
    DisableAssumeRoleCredentialsCaching = true
  [runners.cache.gcs]
    AccessID = "sa@p.iam.gserviceaccount.com"
    PrivateKey = "-----BEGIN PRIVATE KEY-----\nMII\n-----END PRIVATE KEY-----\n"
    CredentialsFile = "/etc/gcs.json"
    BucketName = "cache"
    UniverseDomain = "googleapis.com"
  [runners.cache.azure]
    AccountName = "acct"
    AccountKey = "a2V5"
    ContainerName = "cache"
    StorageDomain = "blob.core.windows.net"
"#;
    let loaded = parse_str(text).expect("loads");
    assert!(loaded.warnings.is_empty(), "{:?}", loaded.warnings);
    let cache = loaded.config.runners[0].cache.clone().expect("cache");
    assert_eq!(cache.provider(), Ok(Some(CacheType::S3)));
    assert_eq!((cache.path.as_str(), cache.shared, cache.max_uploaded_archive_size), ("ci", true, 1_048_576));
    let s3 = cache.s3.clone().expect("s3");
    assert_eq!((s3.auth_type(), s3.encryption()), (Ok(S3AuthType::AccessKey), Ok(S3Encryption::Kms)));
    assert_eq!(
        (s3.dual_stack, s3.path_style, s3.server_side_encryption_key_id.as_str()),
        (Some(false), Some(true), "alias/x")
    );
    assert_eq!(cache.gcs.as_ref().map(|g| g.credentials_file.as_str()), Some("/etc/gcs.json"));
    assert_eq!(cache.azure.as_ref().map(|a| a.account_name.as_str()), Some("acct"));
    // Saved under the same names.
    let saved = toml::to_string(&loaded.config).expect("toml");
    assert!(saved.contains("Type = \"s3\"") && saved.contains("ServerSideEncryptionKeyID = \"alias/x\""), "{saved}");
    let again = parse(&saved, Path::new("again.toml")).expect("reloads");
    assert_eq!(again.config.runners[0].cache, Some(cache));
}

#[test]
fn auth_type_is_inferred_as_gitlab_runner_does() {
    let loaded = parse_str("[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketName = \"b\"\n").expect("loads");
    let s3 = loaded.config.runners[0].cache.as_ref().and_then(|c| c.s3.clone()).expect("s3");
    assert_eq!(s3.auth_type(), Ok(S3AuthType::Iam), "no keys: IAM");
    let loaded = parse_str("[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketName = \"b\"\nServerAddress = \"m:9000\"\nAccessKey = \"a\"\nSecretKey = \"s\"\n").expect("loads");
    let s3 = loaded.config.runners[0].cache.as_ref().and_then(|c| c.s3.clone()).expect("s3");
    assert_eq!(s3.auth_type(), Ok(S3AuthType::AccessKey));
    assert!(parse_str("[runners.cache]\n").expect("no Type: no cache").config.runners[0].cache.is_some());
}

#[test]
fn wrong_values_name_file_line_and_key() {
    let err = parse_str("[runners.cache]\n  Type = \"s4\"\n").expect_err("type");
    assert_eq!((err.line, err.key.as_deref()), (Some(7), Some("runners[0].cache.Type")), "{err}");
    assert!(err
        .to_string()
        .starts_with("/etc/runway/config.toml:7: runners[0].cache.Type: \"s4\" is not a cache type"));
    let err =
        parse_str("[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketLocation = \"x\"\n").expect_err("bucket");
    assert_eq!((err.line, err.key.as_deref()), (Some(8), Some("runners[0].cache.s3.BucketName")), "{err}");
    let err = parse_str("[runners.cache]\nType = \"s3\"\n").expect_err("section");
    assert_eq!(err.key.as_deref(), Some("runners[0].cache.Type"), "{err}");
    let err = parse_str(
        "[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketName = \"b\"\nAuthenticationType = \"token\"\n",
    )
    .expect_err("auth");
    assert_eq!((err.line, err.key.as_deref()), (Some(10), Some("runners[0].cache.s3.AuthenticationType")), "{err}");
    let err = parse_str(
        "[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketName = \"b\"\nServerSideEncryption = \"rot13\"\n",
    )
    .expect_err("sse");
    assert_eq!(err.key.as_deref(), Some("runners[0].cache.s3.ServerSideEncryption"), "{err}");
    // No AccountKey: the Azure identity of the environment signs (user delegation SAS).
    parse_str("[runners.cache]\nType = \"azure\"\n[runners.cache.azure]\nAccountName = \"a\"\nContainerName = \"c\"\n")
        .expect("Azure cache without AccountKey");
    let err = parse_str("[runners.cache]\nType = \"azure\"\n[runners.cache.azure]\nAccountName = \"a\"\n")
        .expect_err("container");
    assert_eq!(err.key.as_deref(), Some("runners[0].cache.azure.ContainerName"), "{err}");
    let err = parse_str("[runners.cache]\nType = \"gcs\"\n[runners.cache.gcs]\nBucketName = \"b\"\nAccessID = \"x\"\n")
        .expect_err("gcs");
    assert_eq!(err.key.as_deref(), Some("runners[0].cache.gcs.PrivateKey"), "{err}");
    let err = parse_str("[runners.cache]\nMaxUploadedArchiveSize = -1\n").expect_err("size");
    assert_eq!((err.line, err.key.as_deref()), (Some(7), Some("runners[0].cache.MaxUploadedArchiveSize")), "{err}");
}

#[test]
fn unknown_cache_keys_warn_with_their_line() {
    let loaded =
        parse_str("[runners.cache]\nType = \"s3\"\n[runners.cache.s3]\nBucketName = \"b\"\nBucketNmae = \"c\"\n")
            .expect("loads");
    assert!(
        loaded.warnings.iter().any(|w| w.starts_with("/etc/runway/config.toml:10: ") && w.contains("s3.?.BucketNmae")),
        "{:?}",
        loaded.warnings
    );
}
