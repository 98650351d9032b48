//! The cloud secret resolvers (`aws_secrets_manager`, `gcp_secret_manager`, `azure_key_vault`)
//! against real or faithful servers on 127.0.0.1: moto's server for STS and Secrets Manager
//! (started by the test, killed by PID), and the Google and Microsoft fakes of
//! `support/cloud_secrets_fake.rs`, which check the job's JWT signature and audience.
//!
//! Each resolver reads a value; each failure (a refused role or identity, a missing secret, a
//! missing field, an unreachable server) is a `SecretError` naming the server and its reason,
//! with neither the token nor a value in its text.
//!
//! End to end (`runway run` as a real process, the shell executor, the fake GitLab signing the
//! job's `id_tokens:` and the fakes checking them against its JWKS): each resolver's value
//! reaches the job as a file and as a variable, masked in the trace; each failure fails the
//! job before its script with the secret, the server and the server's reason in the trace and
//! nothing secret. The runner finds the servers through its environment
//! (`AWS_ENDPOINT_URL`, `RUNWAY_GCP_STS_ENDPOINT`, `RUNWAY_GCP_SECRET_MANAGER_ENDPOINT`,
//! `AZURE_AUTHORITY_HOST`); Key Vault's URL comes with the secret.

#[path = "support/cloud_secrets_fake.rs"]
mod cloud_secrets_fake;
#[path = "support/object_servers.rs"]
mod object_servers;
#[path = "support/runway_process.rs"]
mod runway_process;

use cloud_secrets_fake::{AzureFake, AzureState, GcpFake, GcpState, Signer};
use runway::payload::secrets::{
    AwsSecret, AwsServer, AzureKeyVaultSecret, AzureKeyVaultServer, GcpSecretManagerSecret, GcpSecretManagerServer,
};
use runway::secrets::aws::{self, AwsEndpoints};
use runway::secrets::{azure, gcp, SecretError};
use serde_json::json;

/// A port of 127.0.0.1 nothing listens on.
fn closed_port() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let port = listener.local_addr().expect("addr").port();
    drop(listener);
    format!("http://127.0.0.1:{port}")
}

fn assert_clean(error: &SecretError, secrets: &[&str]) -> String {
    let text = error.to_string();
    for s in secrets {
        assert!(!text.contains(s), "{text:?} leaks {s:?}");
    }
    text
}

// ---- AWS on moto ----

/// moto with a JSON secret `ci/db` (two versions: the first staged `AWSPREVIOUS`) and a plain
/// one `ci/token`, created through its API as any AWS client would.
async fn moto_with_secrets() -> (object_servers::Server, String, String) {
    let moto = tokio::task::spawn_blocking(object_servers::Server::moto).await.expect("moto");
    let http = reqwest::Client::new();
    let admin = runway::cache::AwsCredentials {
        access_key_id: "AKIDADMIN".into(),
        secret_access_key: "admin-secret".into(),
        session_token: None,
        expires: None,
    };
    let call = |target: &'static str, body: serde_json::Value| {
        let http = http.clone();
        let admin = admin.clone();
        let url = moto.url();
        async move {
            let body = body.to_string().into_bytes();
            let host = url.trim_start_matches("http://").to_string();
            let headers = vec![
                ("content-type".to_string(), "application/x-amz-json-1.1".to_string()),
                ("x-amz-target".to_string(), format!("secretsmanager.{target}")),
            ];
            let signed = runway::cache::sign_request(
                &runway::cache::SignedRequest {
                    method: "POST",
                    scheme: "http",
                    host: &host,
                    path: "/",
                    headers: &headers,
                    body: &body,
                    region: "eu-west-1",
                    service: "secretsmanager",
                },
                &admin,
                chrono::Utc::now(),
            );
            let mut request = http.post(format!("{url}/")).body(body);
            for (k, v) in headers.iter().chain(&signed) {
                request = request.header(k, v);
            }
            let response = request.send().await.expect("moto");
            let status = response.status();
            let answer: serde_json::Value = response.json().await.expect("json");
            assert!(status.is_success(), "{target}: {answer}");
            answer
        }
    };
    let first = call(
        "CreateSecret",
        json!({"Name": "ci/db", "SecretString": r#"{"user":"ci","password":"first-pw-1f0a","port":5432}"#}),
    )
    .await;
    let first_version = first["VersionId"].as_str().expect("version").to_string();
    call(
        "PutSecretValue",
        json!({"SecretId": "ci/db", "SecretString": r#"{"user":"ci","password":"second-pw-77c3"}"#}),
    )
    .await;
    call("CreateSecret", json!({"Name": "ci/token", "SecretString": "plain-token-9d2e"})).await;
    let url = moto.url();
    (moto, url, first_version)
}

fn aws_secret(id: &str, jwt: &str) -> AwsSecret {
    AwsSecret {
        secret_id: id.into(),
        server: AwsServer {
            region: "eu-west-1".into(),
            jwt: jwt.into(),
            role_arn: "arn:aws:iam::123456789012:role/ci-secrets".into(),
            role_session_name: "17-4-gitlab.example.com".into(),
        },
        ..AwsSecret::default()
    }
}

#[tokio::test]
async fn aws_reads_versions_stages_and_fields_on_moto() {
    let (_moto, url, first_version) = moto_with_secrets().await;
    let http = reqwest::Client::new();
    let endpoints = AwsEndpoints::from_env(&|k| (k == "AWS_ENDPOINT_URL").then(|| url.clone()));
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJwcm9qZWN0In0.c2ln";

    let plain = aws::read(&aws_secret("ci/token", jwt), &http, &endpoints).await.expect("plain");
    assert_eq!(plain, "plain-token-9d2e");

    let mut field = aws_secret("ci/db", jwt);
    field.field = "password".into();
    assert_eq!(aws::read(&field, &http, &endpoints).await.expect("current"), "second-pw-77c3");

    let mut by_id = field.clone();
    by_id.version_id = first_version;
    assert_eq!(aws::read(&by_id, &http, &endpoints).await.expect("by id"), "first-pw-1f0a");

    let mut by_stage = field.clone();
    by_stage.version_stage = "AWSPREVIOUS".into();
    assert_eq!(aws::read(&by_stage, &http, &endpoints).await.expect("by stage"), "first-pw-1f0a");

    let mut number = aws_secret("ci/db", jwt);
    number.field = "port".into();
    number.version_stage = "AWSPREVIOUS".into();
    number.region = "eu-west-1".into();
    assert_eq!(aws::read(&number, &http, &endpoints).await.expect("number"), "5432");
}

#[tokio::test]
async fn aws_failures_name_the_server_and_the_reason() {
    let (_moto, url, _) = moto_with_secrets().await;
    let http = reqwest::Client::new();
    let endpoints = AwsEndpoints::from_env(&|k| (k == "AWS_ENDPOINT_URL").then(|| url.clone()));
    let jwt = "eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzZWNyZXQtand0In0.c2ln";
    let secrets = [jwt, "second-pw-77c3", "first-pw-1f0a", "plain-token-9d2e"];

    let missing = aws::read(&aws_secret("ci/nope", jwt), &http, &endpoints).await.expect_err("missing");
    assert!(matches!(missing, SecretError::NotFound { .. }), "{missing:?}");
    let text = assert_clean(&missing, &secrets);
    assert!(text.contains(&url) && text.contains("ci/nope") && text.contains("can't find"), "{text}");

    let mut field = aws_secret("ci/db", jwt);
    field.field = "api_key".into();
    let text = assert_clean(&aws::read(&field, &http, &endpoints).await.expect_err("field"), &secrets);
    assert!(text.contains("key 'api_key' not found") && text.contains("ci/db"), "{text}");

    // A JWT without a role to assume with it (gitlab-runner's own refusal).
    let mut no_role = aws_secret("ci/db", jwt);
    no_role.server.role_arn.clear();
    let text = assert_clean(&aws::read(&no_role, &http, &endpoints).await.expect_err("no role"), &secrets);
    assert!(text.contains("Role ARN is required"), "{text}");

    let down = closed_port();
    let unreachable = AwsEndpoints::from_env(&|k| (k == "AWS_ENDPOINT_URL").then(|| down.clone()));
    let error = aws::read(&aws_secret("ci/db", jwt), &http, &unreachable).await.expect_err("down");
    assert!(matches!(error, SecretError::Unreachable { .. }), "{error:?}");
    let text = assert_clean(&error, &secrets);
    assert!(text.contains(&down), "{text}");
}

// ---- Google Cloud ----

const GCP_AUDIENCE: &str =
    "https://iam.googleapis.com/projects/4242/locations/global/workloadIdentityPools/gitlab/providers/gitlab-jwt";

async fn gcp_fake(signer: &Signer) -> GcpFake {
    let mut state = GcpState {
        project_number: "4242".into(),
        pool: "gitlab".into(),
        provider: "gitlab-jwt".into(),
        allowed_audience: GCP_AUDIENCE.into(),
        keys: vec![signer.public_key()],
        ..GcpState::default()
    };
    state.secrets.insert("db-password".into(), vec![b"gcp-old-31a8".to_vec(), b"gcp-current-5b0e".to_vec()]);
    GcpFake::start(state).await
}

fn gcp_secret(name: &str, version: &str, jwt: &str) -> GcpSecretManagerSecret {
    GcpSecretManagerSecret {
        name: name.into(),
        version: version.into(),
        server: GcpSecretManagerServer {
            project_number: "4242".into(),
            workload_identity_federation_pool_id: "gitlab".into(),
            workload_identity_federation_provider_id: "gitlab-jwt".into(),
            jwt: jwt.into(),
        },
    }
}

fn gcp_endpoints(url: &str) -> gcp::GcpEndpoints {
    gcp::GcpEndpoints::from_env(&|k| {
        matches!(k, "RUNWAY_GCP_STS_ENDPOINT" | "RUNWAY_GCP_SECRET_MANAGER_ENDPOINT").then(|| url.to_string())
    })
}

#[tokio::test]
async fn gcp_exchanges_the_jwt_then_reads_the_version() {
    let signer = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let fake = gcp_fake(&signer).await;
    let http = reqwest::Client::new();
    let jwt = signer.sign(json!({"iss": "https://gitlab.example.com", "sub": "project_path:g/p:ref_type:branch:ref:main", "aud": GCP_AUDIENCE}));
    let endpoints = gcp_endpoints(&fake.url());
    assert_eq!(
        gcp::read(&gcp_secret("db-password", "latest", &jwt), &http, &endpoints).await.expect("latest"),
        "gcp-current-5b0e"
    );
    assert_eq!(gcp::read(&gcp_secret("db-password", "1", &jwt), &http, &endpoints).await.expect("v1"), "gcp-old-31a8");
    let exchange = fake.state.lock().expect("state").exchanges[0].clone();
    assert_eq!(exchange["subjectTokenType"], "urn:ietf:params:oauth:token-type:id_token");
    assert_eq!(exchange["scope"], "https://www.googleapis.com/auth/cloud-platform");
}

#[tokio::test]
async fn gcp_failures_name_the_server_and_the_reason() {
    let signer = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let other = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let fake = gcp_fake(&signer).await;
    let http = reqwest::Client::new();
    let endpoints = gcp_endpoints(&fake.url());
    let claims = json!({"iss": "https://gitlab.example.com", "sub": "project_path:g/p", "aud": GCP_AUDIENCE});
    let jwt = signer.sign(claims.clone());
    let secrets = [jwt.as_str(), "gcp-current-5b0e", "gcp-old-31a8"];

    // The wrong provider (the identity GitLab's token is not federated with).
    let mut wrong_provider = gcp_secret("db-password", "latest", &jwt);
    wrong_provider.server.workload_identity_federation_provider_id = "someone-else".into();
    let error = gcp::read(&wrong_provider, &http, &endpoints).await.expect_err("wrong provider");
    assert!(matches!(error, SecretError::Refused { status: 400, .. }), "{error:?}");
    let text = assert_clean(&error, &secrets);
    assert!(text.contains(&fake.url()) && text.contains("invalid_target"), "{text}");

    // A token signed by another key, and one for another audience.
    let forged = other.sign(claims);
    let text = assert_clean(
        &gcp::read(&gcp_secret("db-password", "latest", &forged), &http, &endpoints).await.expect_err("forged"),
        &[forged.as_str()],
    );
    assert!(text.contains("invalid_grant") && text.contains("signature"), "{text}");
    let elsewhere = signer.sign(json!({"sub": "x", "aud": "https://elsewhere.example"}));
    let text = gcp::read(&gcp_secret("db-password", "latest", &elsewhere), &http, &endpoints)
        .await
        .expect_err("aud")
        .to_string();
    assert!(text.contains("does not match the expected audience"), "{text}");

    let error = gcp::read(&gcp_secret("nope", "latest", &jwt), &http, &endpoints).await.expect_err("missing");
    assert!(matches!(error, SecretError::NotFound { .. }), "{error:?}");
    let text = assert_clean(&error, &secrets);
    assert!(text.contains("projects/4242/secrets/nope") && text.contains("not found"), "{text}");

    let down = closed_port();
    let error =
        gcp::read(&gcp_secret("db-password", "latest", &jwt), &http, &gcp_endpoints(&down)).await.expect_err("down");
    assert!(matches!(error, SecretError::Unreachable { .. }), "{error:?}");
    assert!(assert_clean(&error, &secrets).contains(&down));
}

// ---- Azure ----

const AZURE_ISSUER: &str = "https://gitlab.example.com";
const AZURE_SUBJECT: &str = "project_path:group/project:ref_type:branch:ref:main";

async fn azure_fake(signer: &Signer) -> AzureFake {
    let mut state = AzureState {
        tenant: "b5d3c1a0-0000-4000-8000-000000000001".into(),
        client_id: "0f5e2c4a-0000-4000-8000-000000000002".into(),
        issuer: AZURE_ISSUER.into(),
        subject: AZURE_SUBJECT.into(),
        audience: "api://AzureADTokenExchange".into(),
        keys: vec![signer.public_key()],
        ..AzureState::default()
    };
    state.secrets.insert(
        "deploy-key".into(),
        vec![("1111aaaa".into(), "azure-old-6d1c".into()), ("2222bbbb".into(), "azure-current-0e9f".into())],
    );
    AzureFake::start(state).await
}

fn azure_secret(url: &str, name: &str, version: &str, jwt: &str) -> AzureKeyVaultSecret {
    AzureKeyVaultSecret {
        name: name.into(),
        version: version.into(),
        server: AzureKeyVaultServer {
            client_id: "0f5e2c4a-0000-4000-8000-000000000002".into(),
            tenant_id: "b5d3c1a0-0000-4000-8000-000000000001".into(),
            jwt: jwt.into(),
            url: url.into(),
        },
    }
}

#[tokio::test]
async fn azure_signs_in_with_the_jwt_then_reads_the_secret() {
    let signer = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let fake = azure_fake(&signer).await;
    let http = reqwest::Client::new();
    let jwt = signer.sign(json!({"iss": AZURE_ISSUER, "sub": AZURE_SUBJECT, "aud": "api://AzureADTokenExchange"}));
    let url = fake.url();
    let latest = azure::read(&azure_secret(&url, "deploy-key", "", &jwt), &http, &url).await.expect("latest");
    assert_eq!(latest, "azure-current-0e9f");
    let old = azure::read(&azure_secret(&url, "deploy-key", "1111aaaa", &jwt), &http, &url).await.expect("old");
    assert_eq!(old, "azure-old-6d1c");
}

#[tokio::test]
async fn azure_failures_name_the_server_and_the_reason() {
    let signer = tokio::task::spawn_blocking(Signer::generate).await.expect("key");
    let fake = azure_fake(&signer).await;
    let http = reqwest::Client::new();
    let url = fake.url();
    let jwt = signer.sign(json!({"iss": AZURE_ISSUER, "sub": AZURE_SUBJECT, "aud": "api://AzureADTokenExchange"}));
    let secrets = [jwt.as_str(), "azure-current-0e9f", "azure-old-6d1c"];

    // An application that does not exist in the tenant (the wrong identity).
    let mut wrong_app = azure_secret(&url, "deploy-key", "", &jwt);
    wrong_app.server.client_id = "99999999-0000-4000-8000-000000000000".into();
    let error = azure::read(&wrong_app, &http, &url).await.expect_err("wrong app");
    assert!(matches!(error, SecretError::Refused { status: 400, .. }), "{error:?}");
    let text = assert_clean(&error, &secrets);
    assert!(text.contains(&url) && text.contains("AADSTS700016"), "{text}");

    // A token from another branch: no federated credential matches its subject.
    let feature = signer.sign(json!({"iss": AZURE_ISSUER, "sub": "project_path:group/project:ref_type:branch:ref:feature", "aud": "api://AzureADTokenExchange"}));
    let text = azure::read(&azure_secret(&url, "deploy-key", "", &feature), &http, &url)
        .await
        .expect_err("subject")
        .to_string();
    assert!(text.contains("AADSTS700213") && !text.contains(&feature), "{text}");

    let error = azure::read(&azure_secret(&url, "nope", "", &jwt), &http, &url).await.expect_err("missing");
    assert!(matches!(error, SecretError::NotFound { .. }), "{error:?}");
    let text = assert_clean(&error, &secrets);
    assert!(text.contains("SecretNotFound") && text.contains("\"nope\""), "{text}");

    let down = closed_port();
    let error = azure::read(&azure_secret(&down, "deploy-key", "", &jwt), &http, &url).await.expect_err("vault down");
    assert!(matches!(error, SecretError::Unreachable { .. }), "{error:?}");
    assert!(assert_clean(&error, &secrets).contains(&down));
}

/// botocore (installed with moto) signs the same `GetSecretValue` at the same second: an
/// independent SigV4 implementation agrees with the header signature the AWS resolver sends
/// (moto itself checks no signature).
#[test]
fn aws_header_signature_matches_botocore() {
    let script = r#"
import sys
from botocore.auth import SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
req = AWSRequest(method='POST', url='https://secretsmanager.eu-west-1.amazonaws.com/', data=sys.argv[1].encode(),
    headers={'Content-Type': 'application/x-amz-json-1.1', 'X-Amz-Target': 'secretsmanager.GetSecretValue'})
SigV4Auth(Credentials('ASIARUNWAYTEST', 'runway/test+secret', 'session-token-123'), 'secretsmanager', 'eu-west-1').add_auth(req)
print(req.headers['X-Amz-Date'])
print(req.headers['Authorization'])
"#;
    let body = r#"{"SecretId":"ci/db","VersionStage":"AWSPREVIOUS"}"#;
    let out = std::process::Command::new("python3")
        .args(["-c", script, body])
        .output()
        .expect("python3 (botocore comes with moto: pip install \"moto[server]\")");
    assert!(out.status.success(), "botocore: {}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8(out.stdout).expect("utf-8");
    let mut lines = text.lines();
    let date = lines.next().expect("date");
    let theirs = lines.next().expect("authorization");
    let at = chrono::NaiveDateTime::parse_from_str(date, "%Y%m%dT%H%M%SZ").expect("date").and_utc();
    let headers = vec![
        ("content-type".to_string(), "application/x-amz-json-1.1".to_string()),
        ("x-amz-target".to_string(), "secretsmanager.GetSecretValue".to_string()),
    ];
    let credentials = runway::cache::AwsCredentials {
        access_key_id: "ASIARUNWAYTEST".into(),
        secret_access_key: "runway/test+secret".into(),
        session_token: Some("session-token-123".into()),
        expires: None,
    };
    let signed = runway::cache::sign_request(
        &runway::cache::SignedRequest {
            method: "POST",
            scheme: "https",
            host: "secretsmanager.eu-west-1.amazonaws.com",
            path: "/",
            headers: &headers,
            body: body.as_bytes(),
            region: "eu-west-1",
            service: "secretsmanager",
        },
        &credentials,
        at,
    );
    let ours = signed.iter().find(|(k, _)| k == "authorization").map(|(_, v)| v.as_str());
    assert_eq!(ours, Some(theirs));
}

// ---- End to end ----

const SCRIPT_RAN: &str = "SCRIPT-RAN-MARKER";
const E2E_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// moto, the Google fake and the Azure fake trusting the fake GitLab's key, and `runway run`
/// with one shell runner pointed at them.
struct World {
    fake: fake_gitlab::FakeGitLab,
    _root: tempfile::TempDir,
    process: runway_process::RunwayProcess,
    moto_url: String,
    _moto: object_servers::Server,
    gcp: GcpFake,
    azure: AzureFake,
}

impl World {
    async fn start() -> World {
        let fake = fake_gitlab::FakeGitLab::start_with(fake_gitlab::Config {
            long_poll: std::time::Duration::from_secs(1),
            trace_update_interval: 1,
        })
        .await;
        let runner = fake.create_runner("cloud-secrets");
        fake.create_repo("group/project");
        fake.commit_files("group/project", "main", &[("README.md", "hi\n")], "init");
        let keys = cloud_secrets_fake::PublicKey::from_jwks(&fake_gitlab::id_tokens::jwks());
        assert!(!keys.is_empty(), "the fake GitLab's JWKS has a key");
        let (moto, moto_url, _) = moto_with_secrets().await;
        let mut gcp_state = GcpState {
            project_number: "4242".into(),
            pool: "gitlab".into(),
            provider: "gitlab-jwt".into(),
            allowed_audience: GCP_AUDIENCE.into(),
            keys: keys.clone(),
            ..GcpState::default()
        };
        gcp_state.secrets.insert("db-password".into(), vec![b"gcp-current-5b0e".to_vec()]);
        let gcp = GcpFake::start(gcp_state).await;
        let mut azure_state = AzureState {
            tenant: "b5d3c1a0-0000-4000-8000-000000000001".into(),
            client_id: "0f5e2c4a-0000-4000-8000-000000000002".into(),
            issuer: fake.url(),
            subject: "project_path:group/project:ref_type:branch:ref:main".into(),
            audience: "api://AzureADTokenExchange".into(),
            keys,
            ..AzureState::default()
        };
        azure_state.secrets.insert("deploy-key".into(), vec![("2222bbbb".into(), "azure-current-0e9f".into())]);
        let azure = AzureFake::start(azure_state).await;
        let root = tempfile::tempdir().expect("tempdir");
        let config = format!(
            r#"concurrent = 4
check_interval = 1
shutdown_timeout = 5

[plugins.shell]
allow_process = true

[[runners]]
name = "cloud-secrets"
url = "{url}"
token = "{token}"
executor = "shell"
limit = 4
builds_dir = "{builds}"
cache_dir = "{cache}"
  [runners.shell]
  login = false
"#,
            url = fake.url(),
            token = runner.token,
            builds = root.path().join("builds").display(),
            cache = root.path().join("cache").display(),
        );
        std::fs::write(root.path().join("config.toml"), config).expect("config.toml");
        let mut process = runway_process::RunwayProcess::new(root.path().to_path_buf())
            .env("AWS_ENDPOINT_URL", &moto_url)
            .env("RUNWAY_GCP_STS_ENDPOINT", &gcp.url())
            .env("RUNWAY_GCP_SECRET_MANAGER_ENDPOINT", &gcp.url())
            .env("AZURE_AUTHORITY_HOST", &azure.url());
        process.start();
        World { fake, _root: root, process, moto_url, _moto: moto, gcp, azure }
    }

    fn enqueue(&self, spec: fake_gitlab::JobSpec) -> i64 {
        self.fake.enqueue(self.fake.job_payload(&spec))
    }

    async fn finished(&self, id: i64) -> fake_gitlab::JobRecord {
        match self.fake.wait_for_job_state(id, |j| j.final_state.is_some(), E2E_WAIT).await {
            Some(record) => record,
            None => panic!(
                "job {id} did not finish; trace:\n{}\nrunway log:\n{}",
                self.fake.job(id).map(|j| j.trace_text()).unwrap_or_default(),
                self.process.log()
            ),
        }
    }

    fn aws(&self, id: &str, field: &str) -> serde_json::Value {
        json!({"aws_secrets_manager": {"secret_id": id, "field": field, "server": {
            "region": "eu-west-1", "jwt": "$AWS_ID_TOKEN", "role_arn": "arn:aws:iam::123456789012:role/ci-secrets"}}})
    }

    fn gcp(&self, name: &str, provider: &str) -> serde_json::Value {
        json!({"gcp_secret_manager": {"name": name, "version": "latest", "server": {
            "project_number": "4242", "workload_identity_federation_pool_id": "gitlab",
            "workload_identity_federation_provider_id": provider, "jwt": "$GCP_ID_TOKEN"}}})
    }

    fn azure(&self, vault: &str, name: &str, client_id: &str) -> serde_json::Value {
        json!({"azure_key_vault": {"name": name, "version": "", "server": {
            "client_id": client_id, "tenant_id": "b5d3c1a0-0000-4000-8000-000000000001",
            "jwt": "$AZURE_ID_TOKEN", "url": vault}}})
    }
}

fn with_tokens(spec: fake_gitlab::JobSpec) -> fake_gitlab::JobSpec {
    spec.id_token("AWS_ID_TOKEN", "sts.amazonaws.com")
        .id_token("GCP_ID_TOKEN", GCP_AUDIENCE)
        .id_token("AZURE_ID_TOKEN", "api://AzureADTokenExchange")
}

fn not_a_file(mut secret: serde_json::Value) -> serde_json::Value {
    secret["file"] = json!(false);
    secret
}

fn sha256(value: &str) -> String {
    use sha2::Digest;
    format!("{:x}", sha2::Sha256::digest(value.as_bytes()))
}

const VALUES: &[&str] =
    &["second-pw-77c3", "first-pw-1f0a", "plain-token-9d2e", "gcp-current-5b0e", "azure-current-0e9f"];

/// Nothing secret in the trace: no value, no ID token nor its signature.
fn leaks_nothing(record: &fake_gitlab::JobRecord) {
    let trace = record.trace_text();
    for value in VALUES {
        assert!(!trace.contains(value), "the trace shows {value}:\n{trace}");
    }
    let text = record.payload.to_string();
    let tokens: Vec<&str> = text.split('"').filter(|s| s.starts_with("eyJ") && s.matches('.').count() == 2).collect();
    assert!(!tokens.is_empty(), "the job was given ID tokens");
    for token in tokens {
        assert!(!trace.contains(token), "the trace shows an ID token:\n{trace}");
        assert!(!trace.contains(token.split('.').nth(2).unwrap_or("x")), "the trace shows a signature:\n{trace}");
    }
}

/// A job printing the SHA-256 of the file variable's content and of the plain variable, then
/// both (to be masked).
fn reading_job(name: &str, secrets: serde_json::Value) -> fake_gitlab::JobSpec {
    with_tokens(fake_gitlab::JobSpec::new(
        "group/project",
        name,
        &[
            "test -f \"$S_FILE\" && echo \"a file: $S_FILE\"",
            "printf '%s' \"$(cat \"$S_FILE\")\" | sha256sum",
            "printf '%s' \"$S_VAR\" | sha256sum",
            "echo \"file says $(cat \"$S_FILE\"), variable says $S_VAR\"",
        ],
    ))
    .secrets(secrets)
}

fn failing_job(name: &str, secret: serde_json::Value) -> fake_gitlab::JobSpec {
    with_tokens(fake_gitlab::JobSpec::new("group/project", name, &[&format!("echo {SCRIPT_RAN}")]))
        .secrets(json!({ "S": secret }))
}

fn read_into_the_job(record: &fake_gitlab::JobRecord, resolver: &str, value: &str) {
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("success"), "trace:\n{trace}");
    assert!(trace.contains(&format!("Using \"{resolver}\" secret resolver...")), "{trace}");
    assert!(trace.contains("a file: "), "not a file:\n{trace}");
    assert_eq!(trace.matches(&sha256(value)).count(), 2, "the value did not reach the file and the variable:\n{trace}");
    assert!(trace.contains("file says [MASKED], variable says [MASKED]"), "not masked:\n{trace}");
    leaks_nothing(record);
}

/// Failed before its script, the line naming secret `S`, `server` (when given) and `said`.
fn failed_resolving(record: &fake_gitlab::JobRecord, server: Option<&str>, said: &str) {
    let trace = record.trace_text();
    assert_eq!(record.final_state.as_deref(), Some("failed"), "trace:\n{trace}");
    assert!(!trace.contains(SCRIPT_RAN), "the script ran:\n{trace}");
    let line = trace
        .lines()
        .find(|l| l.contains("resolving secret \"S\""))
        .unwrap_or_else(|| panic!("no line names the secret:\n{trace}"));
    if let Some(server) = server {
        assert!(line.contains(server), "the line does not name the server {server}: {line}");
    }
    assert!(line.contains(said), "the line does not give the reason ({said}): {line}");
    leaks_nothing(record);
}

#[tokio::test(flavor = "multi_thread")]
async fn cloud_secrets_reach_the_job_as_file_and_variable_masked() {
    let w = World::start().await;
    let vault = w.azure.url();
    let aws = w.enqueue(reading_job(
        "aws",
        json!({"S_FILE": w.aws("ci/db", "password"), "S_VAR": not_a_file(w.aws("ci/db", "password"))}),
    ));
    let gcp = w.enqueue(reading_job(
        "gcp",
        json!({"S_FILE": w.gcp("db-password", "gitlab-jwt"), "S_VAR": not_a_file(w.gcp("db-password", "gitlab-jwt"))}),
    ));
    let client = "0f5e2c4a-0000-4000-8000-000000000002";
    let azure = w.enqueue(reading_job(
        "azure",
        json!({"S_FILE": w.azure(&vault, "deploy-key", client), "S_VAR": not_a_file(w.azure(&vault, "deploy-key", client))}),
    ));
    read_into_the_job(&w.finished(aws).await, "aws_secrets_manager", "second-pw-77c3");
    read_into_the_job(&w.finished(gcp).await, "gcp_secret_manager", "gcp-current-5b0e");
    read_into_the_job(&w.finished(azure).await, "azure-key-vault", "azure-current-0e9f");
    // The exchange carried GitLab's token for the provider's audience, not another one.
    assert!(!w.gcp.state.lock().expect("state").exchanges.is_empty());
}

#[tokio::test(flavor = "multi_thread")]
async fn cloud_secret_failures_fail_the_job_before_its_script_with_the_servers_reason() {
    let w = World::start().await;
    let down = closed_port();
    let vault = w.azure.url();
    let client = "0f5e2c4a-0000-4000-8000-000000000002";
    let mut no_role = w.aws("ci/db", "password");
    no_role["aws_secrets_manager"]["server"]["role_arn"] = json!("");
    let jobs = [
        // AWS: moto trusts any role, so the refused role is gitlab-runner's own check.
        (failing_job("aws-role", no_role), None, "Role ARN is required".to_string()),
        (
            failing_job("aws-missing", w.aws("ci/nope", "")),
            Some(w.moto_url.clone()),
            "can't find the specified secret".into(),
        ),
        (
            failing_job("aws-field", w.aws("ci/db", "api_key")),
            Some(w.moto_url.clone()),
            "key 'api_key' not found".into(),
        ),
        (failing_job("gcp-role", w.gcp("db-password", "someone-else")), Some(w.gcp.url()), "invalid_target".into()),
        (
            failing_job("gcp-missing", w.gcp("nope", "gitlab-jwt")),
            Some(w.gcp.url()),
            "not found or has no versions".into(),
        ),
        (
            failing_job("azure-role", w.azure(&vault, "deploy-key", "99999999-0000-4000-8000-000000000000")),
            Some(w.azure.url()),
            "AADSTS700016".into(),
        ),
        (failing_job("azure-missing", w.azure(&vault, "nope", client)), Some(vault.clone()), "SecretNotFound".into()),
        (
            failing_job("azure-down", w.azure(&down, "deploy-key", client)),
            Some(down.clone()),
            "onnection refused".into(),
        ),
    ];
    let mut queued = Vec::new();
    for (spec, server, said) in jobs {
        queued.push((w.enqueue(spec), server, said));
    }
    for (id, server, said) in queued {
        failed_resolving(&w.finished(id).await, server.as_deref(), &said);
    }
}
