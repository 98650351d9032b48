//! The cloud secret resolvers (`aws_secrets_manager`, `gcp_secret_manager`, `azure_key_vault`)
//! against real or faithful servers on 127.0.0.1: moto's server for STS and Secrets Manager
//! (started by the test, killed by PID), and the Google and Microsoft fakes of
//! `support/cloud_secrets_fake.rs`, which check the job's JWT signature and audience.
//!
//! Each resolver reads a value; each failure (a refused role or identity, a missing secret, a
//! missing field, an unreachable server) is a `SecretError` naming the server and its reason,
//! with neither the token nor a value in its text.

#[path = "support/cloud_secrets_fake.rs"]
mod cloud_secrets_fake;
#[path = "support/object_servers.rs"]
mod object_servers;

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
