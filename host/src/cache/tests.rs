//! Unit tests of object names and signing, against the providers' published test vectors.

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{TimeZone, Utc};

use super::*;
use crate::config::cache::{CacheAzureConfig, CacheGcsConfig};

const GCS_ACCOUNT: &str = include_str!("../../../tests/fixtures/cache/gcs-conformance-service-account.json");

fn s3_config(server: &str) -> CacheConfig {
    CacheConfig {
        cache_type: "s3".into(),
        s3: Some(CacheS3Config {
            server_address: server.into(),
            access_key: "AKIAIOSFODNN7EXAMPLE".into(),
            secret_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
            authentication_type: "access-key".into(),
            bucket_name: "examplebucket".into(),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn store(cfg: &CacheConfig) -> CacheStore {
    CacheStore::from_config_with(cfg, &|_| None).expect("valid").expect("a store")
}

fn query<'a>(url: &'a str, name: &str) -> Option<&'a str> {
    url.split_once('?')?.1.split('&').find_map(|p| p.strip_prefix(&format!("{name}=")))
}

/// AWS docs, "Authenticating Requests: Using Query Parameters (AWS Signature Version 4)",
/// example GET of examplebucket/test.txt: the published URL, signature included.
#[test]
fn sigv4_matches_the_aws_documentation_example() {
    let creds = AwsCredentials {
        access_key_id: "AKIAIOSFODNN7EXAMPLE".into(),
        secret_access_key: "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY".into(),
        session_token: None,
        expires: None,
    };
    let loc =
        sigv4::S3Location { scheme: "https", host: "examplebucket.s3.amazonaws.com".into(), path: "/test.txt".into() };
    let now = Utc.with_ymd_and_hms(2013, 5, 24, 0, 0, 0).single().expect("date");
    let url = sigv4::presign("GET", &loc, "us-east-1", &creds, &[], 86400, now);
    assert_eq!(
        url,
        "https://examplebucket.s3.amazonaws.com/test.txt?X-Amz-Algorithm=AWS4-HMAC-SHA256\
         &X-Amz-Credential=AKIAIOSFODNN7EXAMPLE%2F20130524%2Fus-east-1%2Fs3%2Faws4_request\
         &X-Amz-Date=20130524T000000Z&X-Amz-Expires=86400&X-Amz-SignedHeaders=host\
         &X-Amz-Signature=aeeed9bbccd4d02ee5c0109b86d86835f995330da4c265957d157751f604d404"
    );
}

/// Google's V4 signing conformance tests (googleapis/conformance-tests,
/// storage/v1/v4_signatures.json, "Simple GET" and "Simple PUT") with their dummy key.
#[test]
fn gcs_v4_matches_the_google_conformance_vectors() {
    let signer = GcsSigner::from_json(GCS_ACCOUNT).expect("the conformance key");
    let now = Utc.with_ymd_and_hms(2019, 2, 1, 9, 0, 0).single().expect("date");
    let base = "https://storage.googleapis.com/test-bucket/test-object?X-Goog-Algorithm=GOOG4-RSA-SHA256\
        &X-Goog-Credential=test-iam-credentials%40dummy-project-id.iam.gserviceaccount.com%2F20190201%2Fauto%2Fstorage%2Fgoog4_request\
        &X-Goog-Date=20190201T090000Z&X-Goog-Expires=10&X-Goog-SignedHeaders=host&X-Goog-Signature=";
    let get = "95e6a13d43a1d1962e667f17397f2b80ac9bdd1669210d5e08e0135df9dff4e56113485dbe429ca2266487b9d1796ebdee2d7cf682a6ef3bb9fbb4c351686fba90d7b621cf1c4eb1fdf126460dd25fa0837dfdde0a9fd98662ce60844c458448fb2b352c203d9969cb74efa4bdb742287744a4f2308afa4af0e0773f55e32e92973619249214b97283b2daa14195244444e33f938138d1e5f561088ce8011f4986dda33a556412594db7c12fc40e1ff3f1bedeb7a42f5bcda0b9567f17f65855f65071fabb88ea12371877f3f77f10e1466fff6ff6973b74a933322ff0949ce357e20abe96c3dd5cfab42c9c83e740a4d32b9e11e146f0eb3404d2e975896f74";
    let put = "8adff1d4285739e31aa68e73767a46bc5511fde377497dbe08481bf5ceb34e29cc9a59921748d8ec3dd4085b7e9b7772a952afedfcdaecb3ae8352275b8b7c867f204e3db85076220a3127a8a9589302fc1181eae13b9b7fe41109ec8cdc93c1e8bac2d7a0cc32a109ca02d06957211326563ab3d3e678a0ba296e298b5fc5e14593c99d444c94724cc4be97015dbff1dca377b508fa0cb7169195de98d0e4ac96c42b918d28c8d92d33e1bd125ce0fb3cd7ad2c45dae65c22628378f6584971b8bf3945b26f2611eb651e9b6a8648970c1ecf386bb71327b082e7296c4e1ee2fc0bdd8983da80af375c817fb1ad491d0bc22c0f51dba0d66e2cffbc90803e47";
    for (method, sig) in [("GET", get), ("PUT", put)] {
        let url =
            gcs::presign(&signer, method, "https", "storage.googleapis.com", "/test-bucket/test-object", &[], 10, now)
                .expect("signed");
        assert_eq!(url, format!("{base}{sig}"), "{method}");
    }
}

/// The same conformance file (commit e21bdd6), "Simple headers" and "Headers should be trimmed":
/// signed headers beyond `host`, values trimmed and inner runs of blanks made one space.
#[test]
fn gcs_v4_signs_extra_headers_as_google_does() {
    let signer = GcsSigner::from_json(GCS_ACCOUNT).expect("the conformance key");
    let now = Utc.with_ymd_and_hms(2019, 2, 1, 9, 0, 0).single().expect("date");
    let sign = |headers: &[(&str, &str)]| {
        let headers: Vec<(String, String)> = headers.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        gcs::presign(&signer, "GET", "https", "storage.googleapis.com", "/test-bucket/test-object", &headers, 10, now)
            .expect("signed")
    };
    let url = sign(&[("BAR", "BAR-value"), ("foo", "foo-value")]);
    assert_eq!(query(&url, "X-Goog-SignedHeaders"), Some("bar%3Bfoo%3Bhost"));
    assert_eq!(
        query(&url, "X-Goog-Signature"),
        Some("68ecd3b008328ed30d91e2fe37444ed7b9b03f28ed4424555b5161980531ef87db1c3a5bc0265aad5640af30f96014c94fb2dba7479c41bfe1c020eb90c0c6d387d4dd09d4a5df8b60ea50eb6b01cdd786a1e37020f5f95eb8f9b6cd3f65a1f8a8a65c9fcb61ea662959efd9cd73b683f8d8804ef4d6d9b2852419b013368842731359d7f9e6d1139032ceca75d5e67cee5fd0192ea2125e5f2955d38d3d50cf116f3a52e6a62de77f6207f5b95aaa1d7d0f8a46de89ea72e7ea30f21286318d7eba0142232b0deb3a1dc9e1e812a981c66b5ffda3c6b01a8a9d113155792309fd53a3acfd054ca7776e8eec28c26480cd1e3c812f67f91d14217f39a606669d")
    );
    let url = sign(&[
        ("collapsed", "abc    def"),
        ("leading", "    xyz"),
        ("trailing", "abc    "),
        ("tabs", "\tabc\t\t\t\tdef\t"),
    ]);
    assert_eq!(
        query(&url, "X-Goog-Signature"),
        Some("75d77a3ed2d9b74ff7e1e23b2fd7cc714ad4cc32518c65f3a8197827cd87d302623bab990cf2ff3a633bfaae69b6c2d897add78c105aa68411229610421c4239579add4aff6bdbd5067a0fd61c3aa0029d7de0f8ae88fa3458fa70f875e841d6df9598597d9012b9f848c6857e08f2704ca2f332c71738490ffdda2ed928f9340549d7295745725062d28dc1696eab7cb3b88ac4fd445e951423f645d680a60dd8033d65b65f4c10286f59f4258dbb2bcf36a76ffdd40574104cbbf0b76901c24df5854f24c42e9192fcedc386d85704fec6a6bad3a5201e1fb6c491a4c43371b0913420743580daf3504e99204c6ec894b4d70cd27bc60c3fe2850e8bf3ed22")
    );
}

/// Azure's documented string-to-sign layout of a service SAS (version 2020-12-06), and its
/// signature: HMAC-SHA256 with the account key, base64.
#[test]
fn azure_sas_string_to_sign_and_signature() {
    let start = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("date");
    let sas = azure::BlobSas {
        account: "devstoreaccount1",
        container: "cache",
        blob: "runner/abc/project/1/key",
        permissions: "r",
        start,
        expiry: start + chrono::Duration::hours(2),
        protocol: "https",
    };
    assert_eq!(
        sas.string_to_sign(),
        "r\n2026-01-01T00:00:00Z\n2026-01-01T02:00:00Z\n/blob/devstoreaccount1/cache/runner/abc/project/1/key\n\n\nhttps\n2020-12-06\nb\n\n\n\n\n\n\n"
    );
    let key = b"key";
    let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::Mac>::new_from_slice(key).expect("hmac");
    hmac::Mac::update(&mut mac, sas.string_to_sign().as_bytes());
    let expected = base64::engine::general_purpose::STANDARD.encode(hmac::Mac::finalize(mac).into_bytes());
    let q = sas.query(key);
    assert_eq!(query(&format!("?{q}"), "sig"), Some(canonical::uri_encode(&expected, false).as_str()));
    assert!(
        q.starts_with("sv=2020-12-06&st=2026-01-01T00%3A00%3A00Z&se=2026-01-01T02%3A00%3A00Z&sr=b&sp=r&spr=https&sig=")
    );
}

/// Microsoft's "Create a user delegation SAS" string-to-sign (version 2020-12-06 and later):
/// the fields of its example URL (`skoid`, `sktid`, `skt`, `ske`, `sks`, `skv` after the
/// resource), signed with the key's value; the expected signature was computed apart from this
/// code (Python's `hmac`), and Azurite verifies ours in tests/cache_stores.rs.
#[test]
fn azure_user_delegation_sas_string_to_sign_and_signature() {
    let start = Utc.with_ymd_and_hms(2023, 5, 24, 1, 13, 55).single().expect("date");
    let expiry = Utc.with_ymd_and_hms(2023, 5, 24, 9, 13, 55).single().expect("date");
    let key = azure::UserDelegationKey {
        object_id: "11111111-2222-3333-4444-555555555555".into(),
        tenant_id: "66666666-7777-8888-9999-000000000000".into(),
        start: "2023-05-24T01:13:55Z".into(),
        expiry: "2023-05-24T09:13:55Z".into(),
        service: "b".into(),
        version: "2022-11-02".into(),
        value: b"runway-user-delegation-key".to_vec(),
        starts: start,
        expires: expiry,
    };
    let sas = azure::BlobSas {
        account: "myaccount",
        container: "sascontainer",
        blob: "sasblob.txt",
        permissions: "r",
        start,
        expiry,
        protocol: "https",
    };
    assert_eq!(
        sas.delegated_string_to_sign(&key),
        "r\n2023-05-24T01:13:55Z\n2023-05-24T09:13:55Z\n/blob/myaccount/sascontainer/sasblob.txt\n11111111-2222-3333-4444-555555555555\n66666666-7777-8888-9999-000000000000\n2023-05-24T01:13:55Z\n2023-05-24T09:13:55Z\nb\n2022-11-02\n\n\n\n\nhttps\n2020-12-06\nb\n\n\n\n\n\n\n"
    );
    let q = format!("?{}", sas.delegated_query(&key));
    assert_eq!(query(&q, "sig"), Some("KJ%2FdiAD2XrBYqAgNwJgroQj4DHtLHuS7nTiY8Y%2BBg9A%3D"));
    assert_eq!(query(&q, "skoid"), Some("11111111-2222-3333-4444-555555555555"));
    assert_eq!(query(&q, "ske"), Some("2023-05-24T09%3A13%3A55Z"));
    assert_eq!(query(&q, "sks"), Some("b"));
    assert_eq!(query(&q, "skv"), Some("2022-11-02"));
}

/// Without `AccountKey` the store needs a user delegation key first, and a SAS never outlives
/// its key.
#[test]
fn azure_without_account_key_waits_for_a_delegation_key() {
    let cfg = CacheConfig {
        cache_type: "azure".into(),
        azure: Some(CacheAzureConfig { account_name: "a".into(), container_name: "c".into(), ..Default::default() }),
        ..Default::default()
    };
    let s = store(&cfg);
    let err = s.download("o", Duration::from_secs(60)).expect_err("no key yet");
    assert!(err.to_string().contains("user delegation key"), "{err}");
    assert!(s.credentials_expire().is_some_and(|t| t <= Utc::now()), "without a key a refresh is due now");
    let now = Utc::now();
    let Provider::Azure(a) = &s.provider else { panic!("azure") };
    a.delegation_key.store(Some(std::sync::Arc::new(azure::UserDelegationKey {
        object_id: "o".into(),
        tenant_id: "t".into(),
        start: "s".into(),
        expiry: "e".into(),
        service: "b".into(),
        version: "2020-12-06".into(),
        value: b"k".to_vec(),
        starts: now - chrono::Duration::minutes(5),
        expires: now + chrono::Duration::hours(2),
    })));
    assert_eq!(s.credentials_expire(), Some(now + chrono::Duration::hours(2) - AZURE_KEY_RENEWAL));
    let url = s.presign(Operation::Download, "o", Duration::from_secs(86400), &BTreeMap::new(), now).expect("url").url;
    let end = (now + chrono::Duration::hours(2)).format("%Y-%m-%dT%H%%3A%M%%3A%SZ").to_string();
    assert_eq!(query(&url, "se"), Some(end.as_str()), "capped at the key's expiry");
    assert_eq!(query(&url, "skoid"), Some("o"));
    let late = s.presign(
        Operation::Download,
        "o",
        Duration::from_secs(60),
        &BTreeMap::new(),
        now + chrono::Duration::hours(3),
    );
    assert!(late.is_err(), "an expired key signs nothing");
}

#[test]
fn object_names_follow_gitlab_runner() {
    let mut cfg = s3_config("");
    let s = store(&cfg);
    assert_eq!(s.object_name("tok", 42, "main-1").as_deref(), Some("runner/tok/project/42/main-1"));
    assert_eq!(s.object_name("tok", 42, "a/./b//c").as_deref(), Some("runner/tok/project/42/a/b/c"));
    assert_eq!(s.object_name("tok", 42, "a/../b").as_deref(), Some("runner/tok/project/42/b"));
    assert_eq!(s.object_name("tok", 42, "../../43/x"), None, "leaves the project");
    assert_eq!(s.object_name("tok", 42, ".."), None);
    assert_eq!(s.object_name("tok", 42, ""), None);
    assert_eq!(s.object_name_sharded("tok", 42, "ab12").as_deref(), Some("runner/tok/project/42/ab/ab12"));
    assert_eq!(s.object_name_sharded("tok", 42, "a"), None);
    cfg.path = "ci/cache".into();
    cfg.shared = true;
    assert_eq!(store(&cfg).object_name("tok", 7, "k").as_deref(), Some("ci/cache/project/7/k"));
    cfg.path = "/rooted/".into();
    assert_eq!(store(&cfg).object_name("tok", 7, "k").as_deref(), Some("/rooted/project/7/k"));
}

#[test]
fn s3_urls_point_where_gitlab_runner_points_them() {
    let now = Utc::now();
    let none = BTreeMap::new();
    let get = |cfg: &CacheConfig| {
        store(cfg).presign(Operation::Download, "/a b/c", Duration::from_secs(60), &none, now).expect("url").url
    };
    let mut cfg = s3_config("");
    assert!(get(&cfg).starts_with("https://examplebucket.s3.dualstack.us-east-1.amazonaws.com/a%20b/c?"));
    if let Some(s3) = cfg.s3.as_mut() {
        s3.dual_stack = Some(false);
        s3.bucket_location = "eu-west-1".into();
    }
    let url = get(&cfg);
    assert!(url.starts_with("https://examplebucket.s3.eu-west-1.amazonaws.com/a%20b/c?"), "{url}");
    assert!(url.contains("%2Feu-west-1%2Fs3%2Faws4_request"), "{url}");
    let mut cfg = s3_config("minio.example:9000");
    assert!(get(&cfg).starts_with("https://minio.example:9000/examplebucket/a%20b/c?"));
    if let Some(s3) = cfg.s3.as_mut() {
        s3.insecure = true;
        s3.server_address = "127.0.0.1:80".into();
    }
    assert!(get(&cfg).starts_with("http://127.0.0.1/examplebucket/a%20b/c?"));
}

#[test]
fn s3_uploads_carry_encryption_session_and_metadata() {
    let mut cfg = s3_config("127.0.0.1:9000");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.session_token = "the-token".into();
        s3.server_side_encryption = "kms".into();
        s3.server_side_encryption_key_id = "alias/cache".into();
    }
    let metadata = BTreeMap::from([("cachekey".to_string(), "main".to_string())]);
    let up =
        store(&cfg).presign(Operation::Upload, "o", Duration::from_secs(3600), &metadata, Utc::now()).expect("url");
    assert_eq!(up.method, "PUT");
    assert_eq!(
        up.headers,
        vec![
            ("x-amz-server-side-encryption".to_string(), "aws:kms".to_string()),
            ("x-amz-server-side-encryption-aws-kms-key-id".to_string(), "alias/cache".to_string()),
            ("x-amz-meta-cachekey".to_string(), "main".to_string()),
        ]
    );
    assert_eq!(query(&up.url, "X-Amz-Security-Token"), Some("the-token"));
    assert_eq!(
        query(&up.url, "X-Amz-SignedHeaders"),
        Some("host%3Bx-amz-meta-cachekey%3Bx-amz-server-side-encryption%3Bx-amz-server-side-encryption-aws-kms-key-id")
    );
    let azure = CacheConfig {
        cache_type: "azure".into(),
        azure: Some(CacheAzureConfig {
            account_name: "a".into(),
            account_key: "a2V5".into(),
            container_name: "c".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    assert!(store(&azure).download("o", Duration::MAX).is_ok(), "no overflow on a huge expiry");
    let long = store(&cfg).download("o", Duration::from_secs(30 * 86400)).expect("url");
    assert_eq!(query(&long.url, "X-Amz-Expires"), Some("604800"), "capped at 7 days");
}

#[test]
fn iam_needs_a_refresh_before_signing() {
    let mut cfg = s3_config("");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.authentication_type = "iam".into();
        // Set, so the refresh asks no bucket (nothing leaves 127.0.0.0/8 in tests).
        s3.bucket_location = "us-east-1".into();
    }
    let s = store(&cfg);
    assert!(matches!(s.head("o", Duration::from_secs(60)), Err(CacheError::Credentials(_))));
    let env = |k: &str| match k {
        "AWS_ACCESS_KEY_ID" => Some("AKIDENV".to_string()),
        "AWS_SECRET_ACCESS_KEY" => Some("secret".to_string()),
        "AWS_SESSION_TOKEN" => Some("tok".to_string()),
        _ => None,
    };
    tokio::runtime::Builder::new_current_thread()
        .build()
        .expect("runtime")
        .block_on(s.refresh_credentials_from(&env))
        .expect("from the environment");
    let head = s.head("o", Duration::from_secs(60)).expect("url");
    assert!(head.url.contains("X-Amz-Credential=AKIDENV%2F"), "{}", head.url);
    assert_eq!(query(&head.url, "X-Amz-Security-Token"), Some("tok"));
    assert_eq!(aws_iam::metadata_endpoint(&|_| None), "http://169.254.169.254");
    assert_eq!(
        aws_iam::metadata_endpoint(&|_| Some("http://127.0.0.1:1234/".into())),
        "http://127.0.0.1:1234",
        "AWS_EC2_METADATA_SERVICE_ENDPOINT"
    );
}

#[test]
fn gcs_and_azure_uploads_carry_their_headers() {
    let pem = serde_json::from_str::<serde_json::Value>(GCS_ACCOUNT).expect("json")["private_key"]
        .as_str()
        .expect("key")
        .to_string();
    let cfg = CacheConfig {
        cache_type: "gcs".into(),
        max_uploaded_archive_size: 1000,
        gcs: Some(CacheGcsConfig {
            access_id: "sa@p.iam.gserviceaccount.com".into(),
            private_key: pem,
            bucket_name: "b".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let metadata = BTreeMap::from([("cachekey".to_string(), "k".to_string())]);
    let up = store(&cfg).upload("o/p", Duration::from_secs(60), &metadata).expect("url");
    assert!(up.url.starts_with("https://storage.googleapis.com/b/o/p?X-Goog-Algorithm=GOOG4-RSA-SHA256&"));
    assert_eq!(
        up.headers,
        vec![
            ("content-type".to_string(), "application/octet-stream".to_string()),
            ("x-goog-content-length-range".to_string(), "0,1000".to_string()),
            ("x-goog-meta-cachekey".to_string(), "k".to_string()),
        ]
    );
    let cfg = CacheConfig {
        cache_type: "azure".into(),
        azure: Some(CacheAzureConfig {
            account_name: "acct".into(),
            account_key: "a2V5".into(),
            container_name: "c".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let up = store(&cfg).upload("o", Duration::from_secs(60), &metadata).expect("url");
    assert!(up.url.starts_with("https://acct.blob.core.windows.net/c/o?sv="), "{}", up.url);
    assert_eq!(query(&up.url, "sp"), Some("w"));
    assert_eq!(up.headers[0], ("x-ms-blob-type".to_string(), "BlockBlob".to_string()));
    let get = store(&cfg).download("o", Duration::from_secs(60)).expect("url");
    assert_eq!(query(&get.url, "sp"), Some("r"));
    assert!(get.headers.is_empty());
}

#[test]
fn config_errors_name_the_key() {
    let err = |cfg: CacheConfig| CacheStore::from_config_with(&cfg, &|_| None).err().map(|e| e.to_string());
    assert_eq!(CacheStore::from_config_with(&CacheConfig::default(), &|_| None).map(|s| s.is_none()), Ok(true));
    let bad_type = CacheConfig { cache_type: "s4".into(), ..Default::default() };
    assert!(err(bad_type).is_some_and(|e| e.starts_with("[runners.cache] Type: \"s4\" is not a cache type")));
    let mut no_bucket = s3_config("");
    if let Some(s3) = no_bucket.s3.as_mut() {
        s3.bucket_name.clear();
    }
    assert_eq!(err(no_bucket).as_deref(), Some("[runners.cache] s3.BucketName: must name the bucket"));
    let gcs = CacheConfig {
        cache_type: "gcs".into(),
        gcs: Some(CacheGcsConfig { bucket_name: "b".into(), ..Default::default() }),
        ..Default::default()
    };
    assert!(err(gcs).is_some_and(|e| e.starts_with("[runners.cache] gcs.CredentialsFile:")));
}

#[test]
fn bucket_location_answers_are_read_as_gitlab_runner_reads_them() {
    let xml = |v: &str| {
        format!("<?xml version=\"1.0\"?><LocationConstraint xmlns=\"http://s3.amazonaws.com/doc/2006-03-01/\">{v}</LocationConstraint>")
    };
    assert_eq!(sigv4::parse_location(&xml("eu-west-3")).as_deref(), Some("eu-west-3"));
    assert_eq!(sigv4::parse_location(&xml("")).as_deref(), Some("us-east-1"));
    assert_eq!(sigv4::parse_location(&xml("EU")).as_deref(), Some("eu-west-1"));
    assert_eq!(sigv4::parse_location("<LocationConstraint/>").as_deref(), Some("us-east-1"));
    assert_eq!(sigv4::parse_location("<Error/>"), None);
    let cfg = s3_config("127.0.0.1:9000").s3.expect("s3");
    assert_eq!(sigv4::bucket_location(&cfg, "us-east-1").path, "/examplebucket");
    assert_eq!(sigv4::bucket_location(&s3_config("").s3.expect("s3"), "us-east-1").path, "/");
}
