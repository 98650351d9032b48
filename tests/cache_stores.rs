//! `[runners.cache]` pre-signed URLs against real object stores started by each test on
//! 127.0.0.1: moto's S3 server, Azurite's blob service, and a GCS XML-API server written from
//! Google's signing docs that verifies signatures (tests/support/gcs_fake.rs; no installable
//! emulator does). Bytes travel only through the pre-signed URLs, with the headers the store
//! says to send, as the in-job helper does.
//!
//! moto does not verify signatures of pre-signed URLs (with its IAM checks on, a pre-signed
//! request fails with a server error whatever its signature), so S3 signatures are checked by
//! the AWS documentation vector in the unit tests; Azurite and the GCS server check theirs here,
//! tampered and expired URLs included. An Azure cache without `AccountKey` signs in through
//! workload identity at a fake Microsoft login (tests/support/cloud_secrets_fake.rs) and gets
//! its user delegation key from Azurite over HTTPS (`--oauth basic`), which checks the SAS.

#[path = "support/cloud_secrets_fake.rs"]
mod cloud_secrets_fake;
#[path = "support/gcs_fake.rs"]
mod gcs_fake;
#[path = "support/object_servers.rs"]
mod object_servers;
#[path = "support/test_ca.rs"]
mod test_ca;

use std::collections::BTreeMap;
use std::time::Duration;

use base64::Engine as _;
use chrono::Utc;
use hmac::Mac as _;
use object_servers::{Server, AZURITE_ACCOUNT, AZURITE_KEY};
use runway::cache::{CacheStore, GcsSigner, Operation, Presigned};
use runway::config::cache::{CacheAzureConfig, CacheConfig, CacheGcsConfig, CacheS3Config};
use serde_json::json;

const GCS_ACCOUNT: &str = include_str!("fixtures/cache/gcs-conformance-service-account.json");

/// Send `p` as the in-job helper does: its method, URL and headers, with `body`.
async fn send(p: &Presigned, body: Option<Vec<u8>>) -> reqwest::Response {
    send_with(&reqwest::Client::new(), p, body).await
}

/// [`send`] through `client`. A connection the server drops before it answers is tried again
/// (twice at most): every request here is idempotent, moto on a loaded machine now and then
/// closes one mid-response (hyper's `IncompleteMessage`), and what is tested is the signing.
async fn send_with(client: &reqwest::Client, p: &Presigned, body: Option<Vec<u8>>) -> reqwest::Response {
    let method = reqwest::Method::from_bytes(p.method.as_bytes()).expect("method");
    let mut attempt = 0;
    loop {
        let mut request = client.request(method.clone(), &p.url);
        for (k, v) in &p.headers {
            request = request.header(k, v);
        }
        if let Some(body) = &body {
            request = request.body(body.clone());
        }
        match request.send().await {
            Ok(response) => return response,
            Err(e) if attempt < 2 && (e.is_request() || e.is_connect()) => attempt += 1,
            Err(e) => panic!("request: {e:?}"),
        }
    }
}

fn tamper(url: &str, param: &str) -> String {
    let (head, tail) = url.split_once(&format!("{param}=")).expect("signed URL");
    let mut chars: Vec<char> = tail.chars().collect();
    // A different value whatever the encoding: hex (case-insensitive) or base64.
    let at = chars.iter().position(|c| c.is_ascii_alphanumeric()).expect("a signature character");
    chars[at] = if chars[at] == '0' { '1' } else { '0' };
    format!("{head}{param}={}", chars.into_iter().collect::<String>())
}

fn none() -> BTreeMap<String, String> {
    BTreeMap::new()
}

fn metadata() -> BTreeMap<String, String> {
    BTreeMap::from([("cachekey".to_string(), "main-protected".to_string())])
}

fn s3_config(server: &Server, bucket: &str) -> CacheConfig {
    CacheConfig {
        cache_type: "s3".into(),
        s3: Some(CacheS3Config {
            server_address: format!("127.0.0.1:{}", server.port),
            access_key: "AKIDRUNWAYTEST".into(),
            secret_key: "runway-test-secret".into(),
            bucket_name: bucket.into(),
            insecure: true,
            ..Default::default()
        }),
        ..Default::default()
    }
}

async fn create_bucket(server: &Server, bucket: &str) {
    // moto answers unsigned requests (it checks no signature).
    let status = reqwest::Client::new().put(format!("{}/{bucket}", server.url())).send().await.expect("put").status();
    assert!(status.is_success(), "create bucket: {status}");
}

async fn round_trip(store: &CacheStore, object: &str) -> Presigned {
    round_trip_with(&reqwest::Client::new(), store, object).await
}

/// [`round_trip`] through `client`.
async fn round_trip_with(client: &reqwest::Client, store: &CacheStore, object: &str) -> Presigned {
    let send = |p: Presigned, body: Option<Vec<u8>>| async move { send_with(client, &p, body).await };
    let expires = Duration::from_secs(3600);
    let head = store.head(object, expires).expect("head url");
    assert_eq!(send(head, None).await.status(), 404, "a miss before the upload");
    let bytes = b"cache archive bytes \x00\x01\x02".to_vec();
    let up = store.upload(object, expires, &metadata()).expect("upload url");
    let put = send(up.clone(), Some(bytes.clone())).await;
    assert!(put.status().is_success(), "PUT: {} {}", put.status(), put.text().await.unwrap_or_default());
    let head = send(store.head(object, expires).expect("head url"), None).await;
    assert_eq!(head.status(), 200, "HEAD after the upload");
    assert_eq!(head.headers().get("content-length").and_then(|v| v.to_str().ok()), Some("23"));
    let get = send(store.download(object, expires).expect("download url"), None).await;
    assert_eq!(get.status(), 200);
    assert_eq!(get.bytes().await.expect("body").to_vec(), bytes);
    up
}

#[tokio::test]
async fn s3_put_head_get_through_presigned_urls_on_moto() {
    let server = Server::moto();
    create_bucket(&server, "runway-cache").await;
    let mut cfg = s3_config(&server, "runway-cache");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.session_token = "session-token-123".into();
        s3.server_side_encryption = "KMS".into();
        s3.server_side_encryption_key_id = "alias/runway-cache".into();
    }
    let store = CacheStore::from_config(&cfg).expect("valid").expect("a store");
    let object = store.object_name("tok123", 42, "main-protected").expect("name");
    assert_eq!(object, "runner/tok123/project/42/main-protected");
    let up = round_trip(&store, &object).await;
    assert!(up.url.contains("X-Amz-Security-Token=session-token-123"), "{}", up.url);
    // The upload's SSE and metadata headers reached the object.
    let head = send(&store.head(&object, Duration::from_secs(60)).expect("head"), None).await;
    let header = |n: &str| head.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_string);
    assert_eq!(header("x-amz-server-side-encryption").as_deref(), Some("aws:kms"));
    assert_eq!(header("x-amz-server-side-encryption-aws-kms-key-id").as_deref(), Some("alias/runway-cache"));
    assert_eq!(header("x-amz-meta-cachekey").as_deref(), Some("main-protected"));
}

#[tokio::test]
async fn s3_with_iam_credentials_from_the_instance_metadata_service() {
    let server = Server::moto();
    create_bucket(&server, "iam-cache").await;
    let imds = imds_fake().await;
    let mut cfg = s3_config(&server, "iam-cache");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.authentication_type = "iam".into();
        s3.access_key.clear();
        s3.secret_key.clear();
    }
    let store = CacheStore::from_config(&cfg).expect("valid").expect("a store");
    assert!(store.download("o", Duration::from_secs(60)).is_err(), "no credentials before a refresh");
    let endpoint = imds.0.clone();
    let env = move |k: &str| (k == "AWS_EC2_METADATA_SERVICE_ENDPOINT").then(|| endpoint.clone());
    store.refresh_credentials_from(&env).await.expect("IMDSv2");
    let url = store.download("o", Duration::from_secs(60)).expect("url").url;
    assert!(url.contains("X-Amz-Credential=ASIAIMDSROLE%2F"), "{url}");
    assert!(url.contains("X-Amz-Security-Token=imds-session"), "{url}");
    assert_eq!(store.credentials_expire().map(|t| t.timestamp()), Some(4_102_444_800));
    round_trip(&store, &store.object_name("tok", 1, "k").expect("name")).await;
}

/// An instance metadata service on loopback: IMDSv2 token, then the role and its credentials.
async fn imds_fake() -> (String, tokio::task::JoinHandle<()>) {
    use axum::http::HeaderMap;
    use axum::routing::{get, put};
    let ok = |h: &HeaderMap| h.get("x-aws-ec2-metadata-token").is_some_and(|v| v == "imds-token");
    let app = axum::Router::new()
        .route(
            "/latest/api/token",
            put(|h: HeaderMap| async move {
                if h.get("x-aws-ec2-metadata-token-ttl-seconds").is_some() {
                    (axum::http::StatusCode::OK, "imds-token")
                } else {
                    (axum::http::StatusCode::BAD_REQUEST, "")
                }
            }),
        )
        .route(
            "/latest/meta-data/iam/security-credentials/",
            get(move |h: HeaderMap| async move {
                if ok(&h) {
                    (axum::http::StatusCode::OK, "runner-role\n".to_string())
                } else {
                    (axum::http::StatusCode::UNAUTHORIZED, String::new())
                }
            }),
        )
        .route(
            "/latest/meta-data/iam/security-credentials/runner-role",
            get(move |h: HeaderMap| async move {
                if !ok(&h) {
                    return (axum::http::StatusCode::UNAUTHORIZED, String::new());
                }
                let body = serde_json::json!({
                    "Code": "Success", "Type": "AWS-HMAC", "AccessKeyId": "ASIAIMDSROLE",
                    "SecretAccessKey": "imds-secret", "Token": "imds-session",
                    "Expiration": "2100-01-01T00:00:00Z"
                });
                (axum::http::StatusCode::OK, body.to_string())
            }),
        );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}", listener.local_addr().expect("addr"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, app).await;
    });
    (url, task)
}

fn azure_config(server: &Server) -> CacheConfig {
    CacheConfig {
        cache_type: "azure".into(),
        azure: Some(CacheAzureConfig {
            account_name: AZURITE_ACCOUNT.into(),
            account_key: AZURITE_KEY.into(),
            container_name: "runway-cache".into(),
            endpoint: format!("{}/{AZURITE_ACCOUNT}", server.url()),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// `PUT /devstoreaccount1/<container>?restype=container` signed with SharedKey.
async fn create_container(server: &Server, container: &str) {
    create_container_at(&reqwest::Client::new(), &server.url(), container).await;
}

/// [`create_container`] on the Azurite at `base` through `client`.
async fn create_container_at(client: &reqwest::Client, base: &str, container: &str) {
    let date = Utc::now().format("%a, %d %b %Y %H:%M:%S GMT").to_string();
    let version = "2020-12-06";
    let string_to_sign = format!(
        "PUT\n\n\n\n\n\n\n\n\n\n\n\nx-ms-date:{date}\nx-ms-version:{version}\n/{AZURITE_ACCOUNT}/{AZURITE_ACCOUNT}/{container}\nrestype:container"
    );
    let key = base64::engine::general_purpose::STANDARD.decode(AZURITE_KEY).expect("key");
    let mut mac = hmac::Hmac::<sha2::Sha256>::new_from_slice(&key).expect("hmac");
    mac.update(string_to_sign.as_bytes());
    let signature = base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes());
    let response = client
        .put(format!("{base}/{AZURITE_ACCOUNT}/{container}?restype=container"))
        .header("x-ms-date", date)
        .header("x-ms-version", version)
        .header("content-length", "0")
        .header("authorization", format!("SharedKey {AZURITE_ACCOUNT}:{signature}"))
        .send()
        .await
        .expect("create container");
    let status = response.status();
    assert_eq!(status, 201, "create container: {}", response.text().await.unwrap_or_default());
}

#[tokio::test]
async fn azure_sas_put_head_get_on_azurite() {
    let server = Server::azurite();
    create_container(&server, "runway-cache").await;
    let store = CacheStore::from_config(&azure_config(&server)).expect("valid").expect("a store");
    let object = store.object_name("tok", 7, "main").expect("name");
    let up = round_trip(&store, &object).await;
    assert!(up.headers.contains(&("x-ms-blob-type".to_string(), "BlockBlob".to_string())));
    let get = store.download(&object, Duration::from_secs(60)).expect("url");
    let head = send(&store.head(&object, Duration::from_secs(60)).expect("url"), None).await;
    assert_eq!(head.headers().get("x-ms-meta-cachekey").and_then(|v| v.to_str().ok()), Some("main-protected"));
    // A tampered signature, an expired URL and a read URL used to write are refused.
    let tampered = Presigned { url: tamper(&get.url, "sig"), ..get.clone() };
    assert_eq!(send(&tampered, None).await.status(), 403, "tampered SAS");
    let old = Utc::now() - chrono::Duration::hours(3);
    let expired = store.presign(Operation::Download, &object, Duration::from_secs(3600), &none(), old).expect("url");
    assert_eq!(send(&expired, None).await.status(), 403, "expired SAS");
    let write_with_read = Presigned { method: "PUT".into(), headers: up.headers.clone(), ..get };
    assert_eq!(send(&write_with_read, Some(b"x".to_vec())).await.status(), 403, "read SAS used to write");
}

/// gitlab-runner's Azure cache without `AccountKey`: a token for Azure Storage from workload
/// identity (the federated token file as the client assertion, at `AZURE_AUTHORITY_HOST`), a
/// user delegation key from the blob service, and user delegation SAS URLs Azurite verifies.
#[tokio::test(flavor = "multi_thread")]
async fn azure_without_account_key_uses_workload_identity_and_user_delegation_sas() {
    use cloud_secrets_fake::{AzureFake, AzureState, Signer};
    let dir = tempfile::tempdir().expect("tempdir");
    let ca = test_ca::make_ca(&dir.path().join("tls"), "azurite");
    let server = Server::azurite_https(&ca.cert, &ca.key);
    let pem = std::fs::read(&ca.ca).expect("ca");
    let client = reqwest::Client::builder()
        .add_root_certificate(reqwest::Certificate::from_pem(&pem).expect("pem"))
        .build()
        .expect("client");
    let base = format!("https://127.0.0.1:{}", server.port);
    create_container_at(&client, &base, "identity-cache").await;

    let signer = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let (tenant, app, object_id) = (
        "72f988bf-0000-4000-8000-000000000001",
        "0f5e2c4a-0000-4000-8000-000000000002",
        "5c1d7a9e-0000-4000-8000-000000000003",
    );
    let (issuer, subject) = ("https://oidc.aks.example/tenant/", "system:serviceaccount:gitlab-runner:gitlab-runner");
    let login = AzureFake::start(AzureState {
        tenant: tenant.into(),
        client_id: app.into(),
        issuer: issuer.into(),
        subject: subject.into(),
        audience: "api://AzureADTokenExchange".into(),
        keys: vec![signer.public_key()],
        object_id: object_id.into(),
        ..AzureState::default()
    })
    .await;
    let token_file = dir.path().join("azure-identity-token");
    std::fs::write(
        &token_file,
        signer.sign(json!({"iss": issuer, "sub": subject, "aud": "api://AzureADTokenExchange"})),
    )
    .expect("token file");
    let vars = BTreeMap::from([
        ("AZURE_TENANT_ID", tenant.to_string()),
        ("AZURE_CLIENT_ID", app.to_string()),
        ("AZURE_FEDERATED_TOKEN_FILE", token_file.display().to_string()),
        ("AZURE_AUTHORITY_HOST", login.url()),
        ("SSL_CERT_FILE", ca.ca.display().to_string()),
    ]);
    let env = |k: &str| vars.get(k).cloned();

    let cfg = CacheConfig {
        cache_type: "azure".into(),
        azure: Some(CacheAzureConfig {
            account_name: AZURITE_ACCOUNT.into(),
            container_name: "identity-cache".into(),
            endpoint: format!("{base}/{AZURITE_ACCOUNT}"),
            ..Default::default()
        }),
        ..Default::default()
    };
    let store = CacheStore::from_config(&cfg).expect("valid without AccountKey").expect("a store");
    assert!(store.download("o", Duration::from_secs(60)).is_err(), "no delegation key before a refresh");
    store.refresh_credentials_from(&env).await.expect("token and user delegation key");
    store.refresh_credentials_from(&env).await.expect("kept");
    assert_eq!(login.state.lock().expect("state").tokens.len(), 1, "one sign-in and one key per validity window");
    let renew = store.credentials_expire().expect("a key to renew");
    assert!(renew > Utc::now() + chrono::Duration::days(5), "a key for (about) 7 days, renewed a day early: {renew}");

    let object = store.object_name("tok", 5, "main").expect("name");
    let up = round_trip_with(&client, &store, &object).await;
    assert!(
        up.url.contains(&format!("skoid={object_id}")) && up.url.contains(&format!("sktid={tenant}")),
        "{}",
        up.url
    );
    assert!(!up.url.contains("AccountKey") && up.url.starts_with("https://"), "{}", up.url);
    let head = send_with(&client, &store.head(&object, Duration::from_secs(60)).expect("url"), None).await;
    assert_eq!(head.headers().get("x-ms-meta-cachekey").and_then(|v| v.to_str().ok()), Some("main-protected"));
    let get = store.download(&object, Duration::from_secs(60)).expect("url");
    let tampered = Presigned { url: tamper(&get.url, "sig"), ..get.clone() };
    assert_eq!(send_with(&client, &tampered, None).await.status(), 403, "tampered user delegation SAS");
    let other_identity =
        Presigned { url: get.url.replace(object_id, "5c1d7a9e-0000-4000-8000-00000000ffff"), ..get.clone() };
    assert_eq!(send_with(&client, &other_identity, None).await.status(), 403, "skoid is signed");
    let write_with_read = Presigned { method: "PUT".into(), headers: up.headers.clone(), ..get };
    assert_eq!(send_with(&client, &write_with_read, Some(b"x".to_vec())).await.status(), 403, "read SAS used to write");

    // An identity the login does not know: the refresh says why, and nothing is signed.
    let stranger = CacheStore::from_config(&cfg).expect("valid").expect("a store");
    let wrong =
        |k: &str| if k == "AZURE_CLIENT_ID" { Some("0f5e2c4a-0000-4000-8000-0000000000ff".into()) } else { env(k) };
    let err = stranger.refresh_credentials_from(&wrong).await.expect_err("unknown app");
    assert!(err.to_string().contains("AADSTS700016") && err.to_string().contains("workload identity"), "{err}");
    assert!(stranger.download("o", Duration::from_secs(60)).is_err());
}

#[tokio::test]
async fn gcs_signed_urls_verified_by_a_signature_checking_server() {
    let signer = GcsSigner::from_json(GCS_ACCOUNT).expect("key");
    let email = "test-iam-credentials@dummy-project-id.iam.gserviceaccount.com";
    let fake = gcs_fake::GcsFake::start(email, signer.public_key_der()).await;
    let credentials = tempfile::NamedTempFile::new().expect("file");
    std::fs::write(credentials.path(), GCS_ACCOUNT).expect("write");
    let cfg = CacheConfig {
        cache_type: "gcs".into(),
        max_uploaded_archive_size: 100,
        gcs: Some(CacheGcsConfig {
            credentials_file: credentials.path().display().to_string(),
            bucket_name: "runway-cache".into(),
            endpoint: fake.url.clone(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let store = CacheStore::from_config(&cfg).expect("valid").expect("a store");
    assert!(store.head("o", Duration::from_secs(60)).is_err(), "the file is read by refresh_credentials");
    store.refresh_credentials().await.expect("credentials file");
    let object = store.object_name("tok", 9, "feature/x").expect("name");
    round_trip(&store, &object).await;
    let stored = fake.object(&format!("runway-cache/{object}")).expect("stored");
    assert_eq!(stored.headers.get("x-goog-meta-cachekey").map(String::as_str), Some("main-protected"));
    assert_eq!(stored.headers.get("content-type").map(String::as_str), Some("application/octet-stream"));
    let get = store.download(&object, Duration::from_secs(60)).expect("url");
    let tampered = Presigned { url: tamper(&get.url, "X-Goog-Signature"), ..get.clone() };
    assert_eq!(send(&tampered, None).await.status(), 403, "tampered signature");
    let old = Utc::now() - chrono::Duration::hours(3);
    let expired = store.presign(Operation::Download, &object, Duration::from_secs(3600), &none(), old).expect("url");
    assert_eq!(send(&expired, None).await.status(), 400, "expired URL");
    let up = store.upload(&object, Duration::from_secs(60), &none()).expect("url");
    let unsigned_headers = Presigned { headers: Vec::new(), ..up.clone() };
    assert_eq!(send(&unsigned_headers, Some(b"x".to_vec())).await.status(), 403, "signed headers left out");
    assert_eq!(send(&up, Some(vec![0; 101])).await.status(), 400, "over MaxUploadedArchiveSize");
}

/// botocore (installed with moto) signs the same upload at the same second: an independent
/// SigV4 implementation agrees with ours on a PUT with a session token, KMS encryption and
/// metadata headers (the AWS documentation vector covers only a plain GET).
#[test]
fn s3_presigned_upload_matches_botocore() {
    let script = r#"
import sys
from botocore.auth import S3SigV4QueryAuth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
req = AWSRequest(method='PUT', url=sys.argv[1], headers={
    'x-amz-server-side-encryption': 'aws:kms',
    'x-amz-server-side-encryption-aws-kms-key-id': 'alias/runway-cache',
    'x-amz-meta-cachekey': 'main-protected'})
S3SigV4QueryAuth(Credentials('AKIDRUNWAYTEST', 'runway-test-secret', 'session-token-123'), 's3', 'eu-west-1', expires=3600).add_auth(req)
print(req.url)
"#;
    let cfg = CacheConfig {
        cache_type: "s3".into(),
        s3: Some(CacheS3Config {
            server_address: "127.0.0.1:9000".into(),
            access_key: "AKIDRUNWAYTEST".into(),
            secret_key: "runway-test-secret".into(),
            session_token: "session-token-123".into(),
            bucket_name: "runway-cache".into(),
            bucket_location: "eu-west-1".into(),
            insecure: true,
            server_side_encryption: "KMS".into(),
            server_side_encryption_key_id: "alias/runway-cache".into(),
            ..Default::default()
        }),
        ..Default::default()
    };
    let store = CacheStore::from_config(&cfg).expect("valid").expect("a store");
    let object = "runner/tok/project/42/a b";
    let unsigned = "http://127.0.0.1:9000/runway-cache/runner/tok/project/42/a%20b";
    let out = std::process::Command::new("python3")
        .args(["-c", script, unsigned])
        .output()
        .expect("python3 (botocore comes with moto: pip install \"moto[server]\")");
    assert!(out.status.success(), "botocore: {}", String::from_utf8_lossy(&out.stderr));
    let theirs = String::from_utf8(out.stdout).expect("utf-8").trim().to_string();
    let param = |url: &str, name: &str| {
        url.split_once('?')
            .and_then(|(_, q)| q.split('&').find_map(|p| p.strip_prefix(&format!("{name}=")).map(str::to_string)))
    };
    let date = param(&theirs, "X-Amz-Date").expect("X-Amz-Date");
    let at = chrono::NaiveDateTime::parse_from_str(&date, "%Y%m%dT%H%M%SZ").expect("date").and_utc();
    let ours = store.presign(Operation::Upload, object, Duration::from_secs(3600), &metadata(), at).expect("url");
    assert!(ours.url.starts_with(&format!("{unsigned}?")), "{}", ours.url);
    for name in ["X-Amz-Credential", "X-Amz-SignedHeaders", "X-Amz-Security-Token", "X-Amz-Expires", "X-Amz-Signature"]
    {
        assert_eq!(param(&ours.url, name), param(&theirs, name), "{name}: ours {} botocore {theirs}", ours.url);
    }
}

/// Without `BucketLocation` the store asks the bucket its region (as gitlab-runner does) and
/// signs for that region.
#[tokio::test]
async fn s3_bucket_location_is_asked_when_not_configured() {
    let server = Server::moto();
    let body =
        "<CreateBucketConfiguration><LocationConstraint>eu-west-3</LocationConstraint></CreateBucketConfiguration>";
    let status = reqwest::Client::new()
        .put(format!("{}/paris-cache", server.url()))
        .body(body)
        .send()
        .await
        .expect("put")
        .status();
    assert!(status.is_success(), "create bucket: {status}");
    let store = CacheStore::from_config(&s3_config(&server, "paris-cache")).expect("valid").expect("a store");
    assert!(store.download("o", Duration::from_secs(60)).expect("url").url.contains("%2Fus-east-1%2Fs3%2F"));
    store.refresh_credentials().await.expect("refresh");
    let url = store.download("o", Duration::from_secs(60)).expect("url").url;
    assert!(url.contains("%2Feu-west-3%2Fs3%2Faws4_request"), "{url}");
    round_trip(&store, "runner/t/project/1/k").await;
}

/// The `DurationSeconds` of every `AssumeRole` moto received (its request recording).
async fn recorded_durations(server: &Server) -> Vec<String> {
    server
        .moto_recording()
        .await
        .into_iter()
        .filter_map(|r| r["body"].as_str().and_then(|b| base64::engine::general_purpose::STANDARD.decode(b).ok()))
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .filter(|b| b.contains("Action=AssumeRole"))
        .filter_map(|b| b.split('&').find_map(|p| p.strip_prefix("DurationSeconds=")).map(str::to_string))
        .collect()
}

fn query_value(url: &str, name: &str) -> Option<String> {
    let raw = url.split_once('?')?.1.split('&').find_map(|p| p.strip_prefix(&format!("{name}=")))?;
    Some(url::form_urlencoded::parse(format!("v={raw}").as_bytes()).next()?.1.into_owned())
}

/// `RoleARN` and `UploadRoleARN` (issue 29): the manager assumes the role through moto's STS
/// (`AWS_ENDPOINT_URL_STS`) with its own keys and signs with the temporary credentials. moto
/// checks no signature (see the top of this file), so the test checks what it can hold: the
/// URLs carry the access key and session token moto handed out for that role, moto was asked
/// for that role with gitlab-runner's session name, duration and a policy naming the one
/// object, and a second URL of the same object reuses the credentials instead of asking again.
#[tokio::test]
async fn s3_role_arn_and_upload_role_arn_are_assumed_through_sts() {
    let server = Server::moto();
    server.moto_start_recording().await;
    create_bucket(&server, "role-cache").await;
    let sts = server.url();
    let env = move |k: &str| (k == "AWS_ENDPOINT_URL_STS").then(|| sts.clone());
    const ROLE: &str = "arn:aws:iam::123456789012:role/runway-cache";
    const UPLOAD_ROLE: &str = "arn:aws:iam::123456789012:role/runway-cache-upload";

    // RoleARN: every URL is signed with the role's credentials.
    let mut cfg = s3_config(&server, "role-cache");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.bucket_location = "us-east-1".into();
        s3.role_arn = ROLE.into();
    }
    let store = CacheStore::from_config_with(&cfg, &env).expect("valid").expect("a store");
    let object = store.object_name("tok123", 7, "role-key").expect("name");
    let up = round_trip(&store, &object).await;
    let get = store.download(&object, Duration::from_secs(3600)).expect("download url");
    let roles = server.moto_assumed_roles().await;
    assert_eq!(roles.len(), 2, "one AssumeRole for downloads and HEAD, one for the upload: {roles:?}");
    for (url, action) in [(&get.url, "s3:GetObject"), (&up.url, "s3:PutObject")] {
        let key = query_value(url, "X-Amz-Credential").expect("credential");
        let key = key.split('/').next().expect("access key");
        assert_ne!(key, "AKIDRUNWAYTEST", "not the runner's own key: {url}");
        let role = roles.iter().find(|r| r["access_key_id"] == key).unwrap_or_else(|| panic!("{key} from moto"));
        assert_eq!(role["role_arn"], ROLE);
        assert_eq!(query_value(url, "X-Amz-Security-Token").as_deref(), role["session_token"].as_str(), "{url}");
        let session = role["session_name"].as_str().expect("session name");
        assert!(session.starts_with("gitlab-runner-cache-upload-") && session.len() == 43, "{session}");
        let policy: serde_json::Value =
            serde_json::from_str(role["policy"].as_str().expect("policy")).expect("policy JSON");
        assert_eq!(
            policy,
            serde_json::json!({"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": [action],
                "Resource": format!("arn:aws:s3:::role-cache/{object}")}]})
        );
    }
    assert_eq!(recorded_durations(&server).await, ["3600", "3600"]);

    // UploadRoleARN: only the upload assumes it; downloads keep the runner's own key.
    let mut cfg = s3_config(&server, "role-cache");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.bucket_location = "us-east-1".into();
        s3.upload_role_arn = UPLOAD_ROLE.into();
    }
    let store = CacheStore::from_config_with(&cfg, &env).expect("valid").expect("a store");
    let object = store.object_name("tok123", 7, "upload-role-key").expect("name");
    let up = round_trip(&store, &object).await;
    let get = store.download(&object, Duration::from_secs(3600)).expect("download url");
    assert!(query_value(&get.url, "X-Amz-Credential").is_some_and(|c| c.starts_with("AKIDRUNWAYTEST/")), "{}", get.url);
    assert_eq!(query_value(&get.url, "X-Amz-Security-Token"), None);
    let roles = server.moto_assumed_roles().await;
    assert_eq!(roles.len(), 3, "{roles:?}");
    assert_eq!(roles[2]["role_arn"], UPLOAD_ROLE);
    let key = query_value(&up.url, "X-Amz-Credential").expect("credential");
    assert!(key.starts_with(&format!("{}/", roles[2]["access_key_id"].as_str().expect("key"))), "{key}");
    assert!(roles[2]["policy"].as_str().is_some_and(|p| p.contains("s3:PutObject") && p.contains(&object)));

    // No STS (a closed loopback port): the URL fails with the role named.
    let mut cfg = s3_config(&server, "role-cache");
    if let Some(s3) = cfg.s3.as_mut() {
        s3.role_arn = ROLE.into();
    }
    let closed = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind");
    let nowhere = format!("http://127.0.0.1:{}", closed.local_addr().expect("addr").port());
    drop(closed);
    let store = CacheStore::from_config_with(&cfg, &move |k: &str| (k == "AWS_ENDPOINT_URL").then(|| nowhere.clone()))
        .expect("valid")
        .expect("a store");
    let err = store.download("o", Duration::from_secs(60)).expect_err("no credentials");
    assert!(err.to_string().contains(&format!("AssumeRole {ROLE}")), "{err}");
}
