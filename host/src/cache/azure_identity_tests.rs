use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::extract::{Query, State};
use axum::http::HeaderMap;
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use chrono::TimeZone as _;
use serde_json::json;

use super::*;

fn env_of(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: BTreeMap<String, String> = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    move |k| map.get(k).cloned()
}

#[test]
fn the_chain_takes_the_first_source_the_environment_sets_up() {
    let all = [
        ("AZURE_TENANT_ID", "t"),
        ("AZURE_CLIENT_ID", "c"),
        ("AZURE_CLIENT_SECRET", "s"),
        ("AZURE_FEDERATED_TOKEN_FILE", "/var/run/token"),
        ("AZURE_AUTHORITY_HOST", "http://127.0.0.1:9/"),
        ("IDENTITY_ENDPOINT", "http://127.0.0.1:8/msi/token"),
        ("IDENTITY_HEADER", "h"),
        ("AZURE_POD_IDENTITY_AUTHORITY_HOST", "http://127.0.0.1:7/"),
    ];
    let authority = "http://127.0.0.1:9".to_string();
    assert_eq!(
        TokenSource::select(&env_of(&all)),
        TokenSource::ClientSecret {
            authority: authority.clone(),
            tenant: "t".into(),
            client_id: "c".into(),
            secret: "s".into()
        },
        "environment credential first"
    );
    assert_eq!(
        TokenSource::select(&env_of(&all[..2].iter().chain(&all[3..]).copied().collect::<Vec<_>>())),
        TokenSource::WorkloadIdentity {
            authority,
            tenant: "t".into(),
            client_id: "c".into(),
            token_file: "/var/run/token".into()
        },
        "then workload identity"
    );
    assert_eq!(
        TokenSource::select(&env_of(&all[1..2].iter().chain(&all[3..]).copied().collect::<Vec<_>>())),
        TokenSource::AppService {
            endpoint: "http://127.0.0.1:8/msi/token".into(),
            header: "h".into(),
            client_id: Some("c".into())
        },
        "no tenant: managed identity, AZURE_CLIENT_ID naming the user-assigned identity"
    );
    assert_eq!(
        TokenSource::select(&env_of(&[("IDENTITY_ENDPOINT", "http://127.0.0.1:8/t"), ("IMDS_ENDPOINT", "x")])),
        TokenSource::Arc { endpoint: "http://127.0.0.1:8/t".into() }
    );
    assert_eq!(
        TokenSource::select(&env_of(&all[7..])),
        TokenSource::Imds { host: "http://127.0.0.1:7".into(), client_id: None }
    );
    assert_eq!(
        TokenSource::select(&env_of(&[("AZURE_CLIENT_SECRET", "s"), ("AZURE_TENANT_ID", "")])),
        TokenSource::Imds { host: DEFAULT_IMDS.into(), client_id: None },
        "an incomplete environment credential is skipped; the default is the VM's metadata service"
    );
}

#[test]
fn token_answers_of_entra_id_and_of_managed_identity() {
    let now = Utc.with_ymd_and_hms(2026, 1, 1, 0, 0, 0).single().expect("date");
    let entra = parse_token(r#"{"token_type":"Bearer","expires_in":3599,"access_token":"e"}"#, now).expect("entra");
    assert_eq!((entra.token.as_str(), entra.expires), ("e", now + chrono::Duration::seconds(3599)));
    // The metadata service writes its numbers as strings.
    let imds = parse_token(
        r#"{"access_token":"m","expires_in":"86399","expires_on":"1767229199","resource":"https://storage.azure.com/","token_type":"Bearer"}"#,
        now,
    )
    .expect("imds");
    assert_eq!(imds.expires.timestamp(), 1_767_229_199);
    assert!(parse_token(r#"{"access_token":"x"}"#, now).is_err(), "no expiry");
    assert!(parse_token(r#"{"error":"invalid_client"}"#, now).is_err());
}

/// The answer of Get User Delegation Key as Microsoft's REST reference shows it.
#[test]
fn user_delegation_key_answer() {
    let xml = "<?xml version=\"1.0\" encoding=\"utf-8\"?>\n<UserDelegationKey>\n    <SignedOid>11111111-2222-3333-4444-555555555555</SignedOid>\n    <SignedTid>66666666-7777-8888-9999-000000000000</SignedTid>\n    <SignedStart>2023-05-24T01:13:55Z</SignedStart>\n    <SignedExpiry>2023-05-24T09:13:55Z</SignedExpiry>\n    <SignedService>b</SignedService>\n    <SignedVersion>2022-11-02</SignedVersion>\n    <Value>cnVud2F5LXVzZXItZGVsZWdhdGlvbi1rZXk=</Value>\n</UserDelegationKey>";
    let key = parse_user_delegation_key(xml).expect("key");
    assert_eq!(key.value, b"runway-user-delegation-key");
    assert_eq!(
        (key.start.as_str(), key.version.as_str(), key.service.as_str()),
        ("2023-05-24T01:13:55Z", "2022-11-02", "b")
    );
    assert_eq!(key.expires, Utc.with_ymd_and_hms(2023, 5, 24, 9, 13, 55).single().expect("date"));
    assert!(parse_user_delegation_key(&xml.replace("<Value>", "<Valu>")).is_err());
}

#[derive(Default)]
struct Seen {
    requests: Vec<String>,
}

type Shared = Arc<Mutex<Seen>>;

/// A source's variables, the request the server should see, and the token it answers.
type Case<'a> = (Vec<(&'a str, &'a str)>, &'a str, &'a str);

async fn entra(State(seen): State<Shared>, Form(form): Form<BTreeMap<String, String>>) -> Json<serde_json::Value> {
    let grant = if form.contains_key("client_secret") { "secret" } else { "assertion" };
    let line = format!(
        "entra {grant} {} {} {}",
        form.get("client_id").cloned().unwrap_or_default(),
        form.get("scope").cloned().unwrap_or_default(),
        form.get("client_assertion").cloned().unwrap_or_default()
    );
    seen.lock().expect("seen").requests.push(line);
    Json(json!({"token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": "entra-token"}))
}

async fn managed(
    State(seen): State<Shared>,
    headers: HeaderMap,
    Query(q): Query<BTreeMap<String, String>>,
) -> Json<serde_json::Value> {
    let header = |k: &str| headers.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    let line = format!(
        "mi {} {} metadata={} identity={}",
        q.get("api-version").cloned().unwrap_or_default(),
        q.get("resource").cloned().unwrap_or_default(),
        header("metadata"),
        header("x-identity-header")
    );
    seen.lock().expect("seen").requests.push(line);
    let expires_on = (Utc::now() + chrono::Duration::hours(24)).timestamp().to_string();
    Json(
        json!({"access_token": "mi-token", "expires_on": expires_on, "resource": "https://storage.azure.com/", "token_type": "Bearer"}),
    )
}

/// Each source's request as Microsoft documents it, against a loopback server; a fresh token
/// is kept, not asked again.
#[tokio::test]
async fn each_source_asks_its_endpoint_and_the_token_is_kept() {
    let seen: Shared = Arc::default();
    let router = Router::new()
        .route("/tenant-1/oauth2/v2.0/token", post(entra))
        .route("/metadata/identity/oauth2/token", get(managed))
        .route("/msi/token", get(managed))
        .with_state(seen.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let base = format!("http://{}", listener.local_addr().expect("addr"));
    let server = tokio::spawn(async move { axum::serve(listener, router).await });
    let dir = tempfile::tempdir().expect("dir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, "federated.jwt.token\n").expect("write");
    let token_file = token_file.display().to_string();
    let cases: Vec<Case<'_>> = vec![
        (
            vec![("AZURE_TENANT_ID", "tenant-1"), ("AZURE_CLIENT_ID", "app"), ("AZURE_CLIENT_SECRET", "pw")],
            "entra secret app https://storage.azure.com/.default ",
            "entra-token",
        ),
        (
            vec![
                ("AZURE_TENANT_ID", "tenant-1"),
                ("AZURE_CLIENT_ID", "app"),
                ("AZURE_FEDERATED_TOKEN_FILE", &token_file),
            ],
            "entra assertion app https://storage.azure.com/.default federated.jwt.token",
            "entra-token",
        ),
        (
            vec![("IDENTITY_HEADER", "secret-header")],
            "mi 2019-08-01 https://storage.azure.com/ metadata= identity=secret-header",
            "mi-token",
        ),
        (vec![], "mi 2018-02-01 https://storage.azure.com/ metadata=true identity=", "mi-token"),
    ];
    let msi = format!("{base}/msi/token");
    for (mut vars, expected, token) in cases {
        vars.push(("AZURE_AUTHORITY_HOST", &base));
        vars.push(("AZURE_POD_IDENTITY_AUTHORITY_HOST", &base));
        if vars.iter().any(|(k, _)| *k == "IDENTITY_HEADER") {
            vars.push(("IDENTITY_ENDPOINT", &msi));
        }
        let env = env_of(&vars);
        let source = TokenSource::select(&env);
        let delegation = Delegation::default();
        assert_eq!(delegation.token(&source, &env, Utc::now()).await.expect("token"), token, "{source:?}");
        assert_eq!(delegation.token(&source, &env, Utc::now()).await.expect("kept"), token);
        let requests = std::mem::take(&mut seen.lock().expect("seen").requests);
        assert_eq!(requests, vec![expected.to_string()], "one request per fresh token: {source:?}");
        // Near its expiry the token is asked again.
        let later = Utc::now() + chrono::Duration::hours(25);
        delegation.token(&source, &env, later).await.expect("renewed");
        assert_eq!(seen.lock().expect("seen").requests.len(), 1, "renewed near expiry");
        seen.lock().expect("seen").requests.clear();
    }
    let refused = TokenSource::Imds { host: format!("{base}/nothing"), client_id: None };
    let err = fetch_token(&refused, &env_of(&[])).await.expect_err("404");
    assert!(
        err.to_string().contains("managed identity (instance metadata)") && err.to_string().contains("404"),
        "{err}"
    );
    server.abort();
}
