//! Google Cloud's and Microsoft's secret stores for the `secrets:` tests, written from their
//! REST references, because neither has a server one can run:
//!
//! - [`GcpFake`]: the Security Token Service's `POST /v1/token` (RFC 8693 token exchange, as
//!   "Method: v1.token" documents it: `grantType`, `audience` naming a workload identity pool
//!   provider, `subjectTokenType` `…:id_token` or `…:jwt`, errors `invalid_grant` /
//!   `invalid_target` / `invalid_request`) and Secret Manager's `GET
//!   /v1/projects/*/secrets/*/versions/*:access` (payload `data` base64 with `dataCrc32c`,
//!   errors as `google.rpc.Status`: `NOT_FOUND`, `UNAUTHENTICATED`).
//! - [`AzureFake`]: Microsoft identity platform's `POST /{tenant}/oauth2/v2.0/token` with a
//!   federated client assertion or a client secret (client credentials grant for Key Vault's or
//!   Azure Storage's `.default` scope; access tokens shaped as Entra ID's v1 tokens: `aud`,
//!   `iss` `https://sts.windows.net/<tenant>/`, `oid`, `tid`; `AADSTS…` errors) and Key Vault's
//!   Get Secret `GET /secrets/{name}/{version}?api-version=…` (errors `SecretNotFound`,
//!   `Unauthorized`).
//!
//! Both check the job's JWT as the real services do: an RS256 signature under one of the keys
//! the test gives (the fake GitLab's JWKS), not expired, and the audience (and, for Azure, the
//! issuer and subject of the app's federated credential). They serve on 127.0.0.1 and stop
//! (task aborted) when dropped.

#![allow(dead_code)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Form, Json, Router};
use base64::Engine as _;
use serde_json::{json, Value};

/// An RSA public key (a JWK's `n` and `e`, big-endian bytes).
#[derive(Clone, Debug)]
pub(crate) struct PublicKey {
    pub n: Vec<u8>,
    pub e: Vec<u8>,
}

impl PublicKey {
    /// The keys of a JWKS document (`{"keys": [{"kty": "RSA", "n": …, "e": …}]}`).
    pub(crate) fn from_jwks(jwks: &Value) -> Vec<PublicKey> {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        jwks["keys"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|k| k["kty"] == "RSA")
            .filter_map(|k| {
                Some(PublicKey { n: b64.decode(k["n"].as_str()?).ok()?, e: b64.decode(k["e"].as_str()?).ok()? })
            })
            .collect()
    }
}

/// The claims of `token` when its RS256 signature verifies under one of `keys` and it has not
/// expired; else why not.
pub(crate) fn verify_jwt(token: &str, keys: &[PublicKey]) -> Result<Value, String> {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let parts: Vec<&str> = token.split('.').collect();
    let [header, claims, signature] = parts.as_slice() else { return Err("not a JWT".into()) };
    let header: Value =
        serde_json::from_slice(&b64.decode(header).map_err(|_| "bad header")?).map_err(|_| "bad header".to_string())?;
    if header["alg"] != "RS256" {
        return Err(format!("unsupported alg {}", header["alg"]));
    }
    let signature = b64.decode(signature).map_err(|_| "bad signature encoding")?;
    let input = format!("{}.{}", parts[0], parts[1]);
    let verified = keys.iter().any(|k| {
        ring::signature::RsaPublicKeyComponents { n: &k.n, e: &k.e }
            .verify(&ring::signature::RSA_PKCS1_2048_8192_SHA256, input.as_bytes(), &signature)
            .is_ok()
    });
    if !verified {
        return Err("the signature does not verify".into());
    }
    let claims: Value =
        serde_json::from_slice(&b64.decode(claims).map_err(|_| "bad claims")?).map_err(|_| "bad claims".to_string())?;
    let now = chrono::Utc::now().timestamp();
    if claims["exp"].as_i64().is_none_or(|exp| exp <= now) {
        return Err("the token has expired".into());
    }
    Ok(claims)
}

/// Whether the JWT's `aud` (a string or a list) holds `audience`.
fn has_audience(claims: &Value, audience: &str) -> bool {
    match &claims["aud"] {
        Value::String(s) => s == audience,
        Value::Array(list) => list.iter().any(|a| a == audience),
        _ => false,
    }
}

fn random_token(prefix: &str) -> String {
    let mut bytes = [0u8; 24];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes).expect("random");
    format!("{prefix}{}", hex::encode(bytes))
}

fn bearer(headers: &HeaderMap) -> Option<String> {
    let value = headers.get("authorization")?.to_str().ok()?;
    value.strip_prefix("Bearer ").map(str::to_string)
}

struct Served {
    address: String,
    task: tokio::task::JoinHandle<()>,
}

async fn serve(router: Router) -> Served {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let address = format!("http://{}", listener.local_addr().expect("address"));
    let task = tokio::spawn(async move {
        let _ = axum::serve(listener, router).await;
    });
    Served { address, task }
}

// ---- Google Cloud ----

/// One project's workload identity provider and secrets.
#[derive(Default)]
pub(crate) struct GcpState {
    pub project_number: String,
    pub pool: String,
    pub provider: String,
    /// The provider's allowed audience: what the JWT's `aud` must hold (Google's default is
    /// `https://iam.googleapis.com/projects/<n>/locations/global/workloadIdentityPools/<p>/providers/<q>`).
    pub allowed_audience: String,
    pub keys: Vec<PublicKey>,
    /// Secret name → its versions' data (version 1 first).
    pub secrets: BTreeMap<String, Vec<Vec<u8>>>,
    pub tokens: BTreeSet<String>,
    /// Every exchange the STS accepted or refused (for assertions on what was sent).
    pub exchanges: Vec<Value>,
}

/// Google's STS and Secret Manager on one loopback port.
pub(crate) struct GcpFake {
    pub state: Arc<Mutex<GcpState>>,
    served: Served,
}

impl GcpFake {
    pub(crate) async fn start(state: GcpState) -> GcpFake {
        let state = Arc::new(Mutex::new(state));
        let router = Router::new()
            .route("/v1/token", post(gcp_token))
            .route("/v1/{*name}", get(gcp_access))
            .with_state(state.clone());
        GcpFake { state, served: serve(router).await }
    }

    pub(crate) fn url(&self) -> String {
        self.served.address.clone()
    }
}

impl Drop for GcpFake {
    fn drop(&mut self) {
        self.served.task.abort();
    }
}

fn gcp_sts_error(error: &str, description: &str) -> Response {
    (StatusCode::BAD_REQUEST, Json(json!({ "error": error, "error_description": description }))).into_response()
}

fn google_status(code: StatusCode, status: &str, message: &str) -> Response {
    (code, Json(json!({ "error": { "code": code.as_u16(), "message": message, "status": status } }))).into_response()
}

/// `POST /v1/token`: a JSON (or form) body of the token exchange.
async fn gcp_token(State(state): State<Arc<Mutex<GcpState>>>, headers: HeaderMap, body: String) -> Response {
    let json_body = headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.contains("json"));
    let request: Value = if json_body {
        serde_json::from_str(&body).unwrap_or(Value::Null)
    } else {
        let pairs: BTreeMap<String, String> = url::form_urlencoded::parse(body.as_bytes()).into_owned().collect();
        let camel = |k: &str| pairs.get(k).cloned().unwrap_or_default();
        json!({
            "grantType": camel("grant_type"), "audience": camel("audience"), "subjectToken": camel("subject_token"),
            "subjectTokenType": camel("subject_token_type"), "requestedTokenType": camel("requested_token_type"),
            "scope": camel("scope"),
        })
    };
    let mut state = state.lock().expect("state");
    let mut recorded = request.clone();
    recorded["subjectToken"] = json!("<redacted>");
    state.exchanges.push(recorded);
    let field = |k: &str| request[k].as_str().unwrap_or_default().to_string();
    if field("grantType") != "urn:ietf:params:oauth:grant-type:token-exchange" {
        return gcp_sts_error("unsupported_grant_type", "The grant type is not supported.");
    }
    if !matches!(
        field("subjectTokenType").as_str(),
        "urn:ietf:params:oauth:token-type:id_token" | "urn:ietf:params:oauth:token-type:jwt"
    ) {
        return gcp_sts_error("invalid_request", "Invalid value for \"subject_token_type\".");
    }
    let expected = format!(
        "//iam.googleapis.com/projects/{}/locations/global/workloadIdentityPools/{}/providers/{}",
        state.project_number, state.pool, state.provider
    );
    if field("audience") != expected {
        return gcp_sts_error(
            "invalid_target",
            "The target service indicated by the \"audience\" parameters is invalid. This might either be because \
             the pool or provider is disabled or deleted or because it doesn't exist.",
        );
    }
    let claims = match verify_jwt(&field("subjectToken"), &state.keys) {
        Ok(claims) => claims,
        Err(why) => return gcp_sts_error("invalid_grant", &format!("Unable to verify the ID Token: {why}.")),
    };
    if !has_audience(&claims, &state.allowed_audience) {
        return gcp_sts_error(
            "invalid_grant",
            &format!("The audience in ID Token [{}] does not match the expected audience.", claims["aud"]),
        );
    }
    let token = random_token("ya29.fake-");
    state.tokens.insert(token.clone());
    Json(json!({
        "access_token": token,
        "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
        "token_type": "Bearer",
        "expires_in": 3600,
    }))
    .into_response()
}

/// `GET /v1/projects/{p}/secrets/{s}/versions/{v}:access`.
async fn gcp_access(
    State(state): State<Arc<Mutex<GcpState>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
) -> Response {
    let state = state.lock().expect("state");
    if !bearer(&headers).is_some_and(|t| state.tokens.contains(&t)) {
        return google_status(
            StatusCode::UNAUTHORIZED,
            "UNAUTHENTICATED",
            "Request had invalid authentication credentials. Expected OAuth 2 access token.",
        );
    }
    let Some(resource) = name.strip_suffix(":access") else {
        return google_status(StatusCode::NOT_FOUND, "NOT_FOUND", "Method not found.");
    };
    let parts: Vec<&str> = resource.split('/').collect();
    let ["projects", project, "secrets", secret, "versions", version] = parts.as_slice() else {
        return google_status(
            StatusCode::BAD_REQUEST,
            "INVALID_ARGUMENT",
            "Invalid resource field value in the request.",
        );
    };
    if *project != state.project_number {
        return google_status(
            StatusCode::FORBIDDEN,
            "PERMISSION_DENIED",
            &format!(
                "Permission 'secretmanager.versions.access' denied for resource '{resource}' (or it may not exist)."
            ),
        );
    }
    let Some(versions) = state.secrets.get(*secret).filter(|v| !v.is_empty()) else {
        return google_status(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!("Secret [projects/{project}/secrets/{secret}] not found or has no versions."),
        );
    };
    let index = if *version == "latest" { Some(versions.len()) } else { version.parse::<usize>().ok() };
    let Some(data) = index.filter(|i| *i >= 1).and_then(|i| versions.get(i - 1)) else {
        return google_status(
            StatusCode::NOT_FOUND,
            "NOT_FOUND",
            &format!("Secret Version [projects/{project}/secrets/{secret}/versions/{version}] not found."),
        );
    };
    let number = index.unwrap_or(1);
    Json(json!({
        "name": format!("projects/{project}/secrets/{secret}/versions/{number}"),
        "payload": {
            "data": base64::engine::general_purpose::STANDARD.encode(data),
            "dataCrc32c": runway::secrets::gcp::crc32c(data).to_string(),
        },
    }))
    .into_response()
}

// ---- Azure ----

/// One tenant's app with a federated credential, and one vault's secrets.
#[derive(Default)]
pub(crate) struct AzureState {
    pub tenant: String,
    pub client_id: String,
    /// The federated credential: the assertion's `iss`, `sub` and `aud` must equal these.
    pub issuer: String,
    pub subject: String,
    pub audience: String,
    pub keys: Vec<PublicKey>,
    /// The app's client secret (none: only federated assertions sign in).
    pub client_secret: String,
    /// The service principal's object id (the tokens' `oid`).
    pub object_id: String,
    /// Secret name → versions (id, value), the last the current one.
    pub secrets: BTreeMap<String, Vec<(String, String)>>,
    pub tokens: BTreeSet<String>,
}

/// Microsoft's token endpoint and one Key Vault on one loopback port.
pub(crate) struct AzureFake {
    pub state: Arc<Mutex<AzureState>>,
    served: Served,
}

impl AzureFake {
    pub(crate) async fn start(state: AzureState) -> AzureFake {
        let state = Arc::new(Mutex::new(state));
        let router = Router::new()
            .route("/{tenant}/oauth2/v2.0/token", post(azure_token))
            .route("/secrets/{name}", get(azure_secret_latest))
            .route("/secrets/{name}/", get(azure_secret_latest))
            .route("/secrets/{name}/{version}", get(azure_secret))
            .with_state(state.clone());
        AzureFake { state, served: serve(router).await }
    }

    /// The authority host (`AZURE_AUTHORITY_HOST`) and the vault's URL.
    pub(crate) fn url(&self) -> String {
        self.served.address.clone()
    }
}

impl Drop for AzureFake {
    fn drop(&mut self) {
        self.served.task.abort();
    }
}

fn aad_error(status: StatusCode, error: &str, description: &str) -> Response {
    let body = json!({
        "error": error,
        "error_description": format!("{description}\r\nTrace ID: 00000000-0000-0000-0000-000000000000\r\nTimestamp: {}", chrono::Utc::now().to_rfc3339()),
        "error_codes": [description.get(5..11).and_then(|c| c.parse::<u32>().ok()).unwrap_or(0)],
    });
    (status, Json(body)).into_response()
}

async fn azure_token(
    State(state): State<Arc<Mutex<AzureState>>>,
    Path(tenant): Path<String>,
    Form(form): Form<BTreeMap<String, String>>,
) -> Response {
    let mut state = state.lock().expect("state");
    let field = |k: &str| form.get(k).cloned().unwrap_or_default();
    if tenant != state.tenant {
        return aad_error(
            StatusCode::BAD_REQUEST,
            "invalid_tenant",
            &format!("AADSTS90002: Tenant '{tenant}' not found. Check to make sure you have the correct tenant ID."),
        );
    }
    if field("grant_type") != "client_credentials" {
        return aad_error(
            StatusCode::BAD_REQUEST,
            "unsupported_grant_type",
            "AADSTS70003: The app requested an unsupported grant type.",
        );
    }
    let by_secret = form.contains_key("client_secret");
    if !by_secret && field("client_assertion_type") != "urn:ietf:params:oauth:client-assertion-type:jwt-bearer" {
        return aad_error(StatusCode::BAD_REQUEST, "invalid_request", "AADSTS50027: Invalid client_assertion_type.");
    }
    if field("client_id") != state.client_id {
        return aad_error(
            StatusCode::BAD_REQUEST,
            "unauthorized_client",
            &format!(
                "AADSTS700016: Application with identifier '{}' was not found in the directory '{tenant}'.",
                field("client_id")
            ),
        );
    }
    let scope = field("scope");
    let Some(resource) =
        ["https://vault.azure.net", "https://storage.azure.com"].into_iter().find(|r| scope == format!("{r}/.default"))
    else {
        return aad_error(
            StatusCode::BAD_REQUEST,
            "invalid_scope",
            "AADSTS70011: The provided value for scope is not valid.",
        );
    };
    if by_secret {
        if state.client_secret.is_empty() || field("client_secret") != state.client_secret {
            return aad_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                &format!(
                    "AADSTS7000215: Invalid client secret provided. Ensure the secret being sent in the request is the client secret value, not the client secret ID, for a secret added to app '{}'.",
                    state.client_id
                ),
            );
        }
        return access_token(&mut state, &tenant, resource);
    }
    let claims = match verify_jwt(&field("client_assertion"), &state.keys) {
        Ok(claims) => claims,
        Err(why) => {
            return aad_error(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                &format!("AADSTS700024: Client assertion is not valid: {why}."),
            )
        }
    };
    if claims["iss"] != state.issuer.as_str()
        || claims["sub"] != state.subject.as_str()
        || !has_audience(&claims, &state.audience)
    {
        return aad_error(
            StatusCode::BAD_REQUEST,
            "invalid_client",
            &format!(
                "AADSTS700213: No matching federated identity record found for presented assertion subject '{}'.",
                claims["sub"].as_str().unwrap_or_default()
            ),
        );
    }
    access_token(&mut state, &tenant, resource)
}

/// An access token for `resource`, as Entra ID's v1 access tokens look (a JWT whose claims
/// resource servers read: `aud`, `iss`, `oid`, `tid`, lifetimes); its signature part is random
/// (no resource server here checks it).
fn access_token(state: &mut AzureState, tenant: &str, resource: &str) -> Response {
    let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let now = chrono::Utc::now().timestamp();
    let header = b64.encode(json!({"typ": "JWT", "alg": "RS256", "kid": "fake-entra"}).to_string());
    let claims = json!({
        "aud": resource, "iss": format!("https://sts.windows.net/{tenant}/"), "iat": now, "nbf": now,
        "exp": now + 3599, "appid": state.client_id, "oid": state.object_id, "sub": state.object_id,
        "tid": tenant, "ver": "1.0",
    });
    let token = format!("{header}.{}.{}", b64.encode(claims.to_string()), random_token(""));
    state.tokens.insert(token.clone());
    Json(json!({ "token_type": "Bearer", "expires_in": 3599, "ext_expires_in": 3599, "access_token": token }))
        .into_response()
}

fn vault_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, Json(json!({ "error": { "code": code, "message": message } }))).into_response()
}

async fn azure_secret_latest(
    state: State<Arc<Mutex<AzureState>>>,
    Path(name): Path<String>,
    query: Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    azure_secret(state, Path((name, String::new())), query, headers).await
}

async fn azure_secret(
    State(state): State<Arc<Mutex<AzureState>>>,
    Path((name, version)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    let state = state.lock().expect("state");
    if query.get("api-version").is_none_or(|v| v.is_empty()) {
        return vault_error(
            StatusCode::BAD_REQUEST,
            "BadParameter",
            "The request URI contains an invalid API version.",
        );
    }
    if !bearer(&headers).is_some_and(|t| state.tokens.contains(&t)) {
        return vault_error(
            StatusCode::UNAUTHORIZED,
            "Unauthorized",
            "AKV10000: Request is missing a Bearer or PoP token.",
        );
    }
    let not_found = || {
        vault_error(
            StatusCode::NOT_FOUND,
            "SecretNotFound",
            &format!("A secret with (name/id) {name} was not found in this key vault. If you recently deleted this secret you may be able to recover it using the correct recovery command."),
        )
    };
    let Some(versions) = state.secrets.get(&name) else { return not_found() };
    let found = if version.is_empty() { versions.last() } else { versions.iter().find(|(id, _)| *id == version) };
    let Some((id, value)) = found else { return not_found() };
    Json(json!({
        "value": value,
        "id": format!("{}/secrets/{name}/{id}", "https://vault.example"),
        "attributes": { "enabled": true, "created": 1_700_000_000, "updated": 1_700_000_000, "recoveryLevel": "Recoverable+Purgeable" },
        "tags": {},
    }))
    .into_response()
}

// ---- JWTs for the tests ----

/// An RSA key the test signs JWTs with (generated by `openssl genrsa`), standing in for the
/// fake GitLab's signing key where a test needs no GitLab.
pub(crate) struct Signer {
    pair: ring::signature::RsaKeyPair,
}

impl Signer {
    pub(crate) fn generate() -> Signer {
        // PKCS #1 DER (`RSA PRIVATE KEY`), which ring reads as it is.
        let out = std::process::Command::new("sh")
            .args(["-c", "openssl genrsa 2048 2>/dev/null | openssl rsa -outform DER -traditional"])
            .output()
            .expect("openssl (apt-get install openssl)");
        assert!(out.status.success(), "openssl: {}", String::from_utf8_lossy(&out.stderr));
        Signer { pair: ring::signature::RsaKeyPair::from_der(&out.stdout).expect("PKCS #1 key") }
    }

    pub(crate) fn public_key(&self) -> PublicKey {
        use ring::signature::KeyPair;
        let public = self.pair.public_key();
        let components: ring::signature::RsaPublicKeyComponents<Vec<u8>> = public.into();
        PublicKey { n: components.n, e: components.e }
    }

    /// An RS256 JWT of `claims` (`iat` and `exp` added: valid for an hour).
    pub(crate) fn sign(&self, claims: Value) -> String {
        let b64 = base64::engine::general_purpose::URL_SAFE_NO_PAD;
        let now = chrono::Utc::now().timestamp();
        let mut claims = claims;
        claims["iat"] = json!(now);
        claims["exp"] = json!(now + 3600);
        let header = b64.encode(json!({"alg": "RS256", "typ": "JWT", "kid": "test"}).to_string());
        let input = format!("{header}.{}", b64.encode(claims.to_string()));
        let mut signature = vec![0u8; self.pair.public().modulus_len()];
        self.pair
            .sign(
                &ring::signature::RSA_PKCS1_SHA256,
                &ring::rand::SystemRandom::new(),
                input.as_bytes(),
                &mut signature,
            )
            .expect("sign");
        format!("{input}.{}", b64.encode(signature))
    }
}
