//! GitLab's CI/CD ID tokens (`id_tokens:`): RS256 JWTs signed with the instance's key, with
//! the claims GitLab documents ("OpenID Connect (OIDC) Authentication Using ID Tokens"), and
//! the keys to check them: the JWKS at `/oauth/discovery/keys`, named by
//! `/.well-known/openid-configuration`.
//!
//! A job spec asks for ID tokens with [`crate::JobSpec::id_token`]; its payload carries a
//! placeholder variable per token, which the fake's enqueue turns into a signed token
//! once the job has its id (the claims need it). As GitLab does, each token is a masked job
//! variable named after its `id_tokens:` key.

use std::sync::{Arc, LazyLock};

use axum::extract::State;
use axum::Json;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use base64::Engine as _;
use ring::signature::{KeyPair, RsaKeyPair};
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

use crate::Shared;

/// A variable value the fake replaces by an ID token for the audience that follows it.
pub const ID_TOKEN_PLACEHOLDER: &str = "__FAKE_ID_TOKEN__:";

/// The instance's signing key (2048-bit RSA, PKCS#8), fixed for the fake.
static KEY: LazyLock<RsaKeyPair> = LazyLock::new(|| {
    let pem = include_str!("id_token_key.pem");
    let body: String = pem.lines().filter(|l| !l.starts_with("-----")).collect();
    let der = STANDARD.decode(body).expect("fake-gitlab: the ID token key is base64");
    RsaKeyPair::from_pkcs8(&der).expect("fake-gitlab: the ID token key is an RSA PKCS#8 key")
});

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// The public key as a JWK's `n` and `e`.
fn public_parts() -> (String, String) {
    let public = KEY.public_key();
    let n = ring::rsa::PublicKeyComponents::<Vec<u8>>::from(public);
    (b64(&n.n), b64(&n.e))
}

/// The key id: the JWK's RFC 7638 thumbprint, as GitLab names its signing key.
pub fn key_id() -> String {
    let (n, e) = public_parts();
    let canonical = format!(r#"{{"e":"{e}","kty":"RSA","n":"{n}"}}"#);
    b64(&Sha256::digest(canonical.as_bytes()))
}

/// The JWKS document.
pub fn jwks() -> Value {
    let (n, e) = public_parts();
    json!({ "keys": [{ "kty": "RSA", "kid": key_id(), "e": e, "n": n, "use": "sig", "alg": "RS256" }] })
}

/// The public key in PEM (SubjectPublicKeyInfo), for a JWT auth method configured with
/// `jwt_validation_pubkeys` instead of a JWKS URL.
pub fn public_key_pem() -> String {
    // SubjectPublicKeyInfo = SEQUENCE { AlgorithmIdentifier rsaEncryption NULL, BIT STRING { RSAPublicKey } }.
    let rsa_public = KEY.public_key().as_ref().to_vec();
    let mut bit_string = vec![0u8];
    bit_string.extend_from_slice(&rsa_public);
    let algorithm: &[u8] = &[0x30, 0x0d, 0x06, 0x09, 0x2a, 0x86, 0x48, 0x86, 0xf7, 0x0d, 0x01, 0x01, 0x01, 0x05, 0x00];
    let mut body = algorithm.to_vec();
    body.extend(der(0x03, &bit_string));
    let spki = der(0x30, &body);
    let text = STANDARD.encode(spki);
    let lines: Vec<&str> = text.as_bytes().chunks(64).map(|c| std::str::from_utf8(c).unwrap_or_default()).collect();
    format!("-----BEGIN PUBLIC KEY-----\n{}\n-----END PUBLIC KEY-----\n", lines.join("\n"))
}

fn der(tag: u8, content: &[u8]) -> Vec<u8> {
    let mut out = vec![tag];
    let len = content.len();
    if len < 0x80 {
        out.push(len as u8);
    } else {
        let bytes: Vec<u8> = len.to_be_bytes().iter().copied().skip_while(|b| *b == 0).collect();
        out.push(0x80 | bytes.len() as u8);
        out.extend(bytes);
    }
    out.extend_from_slice(content);
    out
}

/// Sign `claims` as an RS256 JWT.
pub fn sign(claims: &Value) -> String {
    let header = json!({ "alg": "RS256", "typ": "JWT", "kid": key_id() });
    let input = format!("{}.{}", b64(header.to_string().as_bytes()), b64(claims.to_string().as_bytes()));
    let mut signature = vec![0u8; KEY.public().modulus_len()];
    KEY.sign(&ring::signature::RSA_PKCS1_SHA256, &ring::rand::SystemRandom::new(), input.as_bytes(), &mut signature)
        .expect("fake-gitlab: RS256 signing");
    format!("{input}.{}", b64(&signature))
}

/// The claims GitLab puts in an ID token for `aud`, read from the job's `payload` (its id
/// already set) and the instance's `issuer` URL.
pub fn claims(payload: &Value, issuer: &str, aud: &str) -> Value {
    let var = |key: &str| -> String {
        payload["variables"]
            .as_array()
            .into_iter()
            .flatten()
            .rev()
            .find(|v| v["key"] == key)
            .and_then(|v| v["value"].as_str())
            .unwrap_or_default()
            .to_string()
    };
    let project_path = payload["job_info"]["project_full_path"].as_str().unwrap_or_default().to_string();
    let namespace_path = project_path.rsplit_once('/').map(|(ns, _)| ns.to_string()).unwrap_or_default();
    let git_ref = payload["git_info"]["ref"].as_str().unwrap_or_default().to_string();
    let ref_type = payload["git_info"]["ref_type"].as_str().unwrap_or("branch").to_string();
    let ref_path = if ref_type == "tag" { format!("refs/tags/{git_ref}") } else { format!("refs/heads/{git_ref}") };
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    // GitLab's ID tokens live as long as the job may run, plus five minutes.
    let timeout = payload["runner_info"]["timeout"].as_u64().unwrap_or(3600);
    let sha = payload["git_info"]["sha"].as_str().unwrap_or_default();
    json!({
        "namespace_id": "1",
        "namespace_path": namespace_path,
        "project_id": payload["job_info"]["project_id"].to_string(),
        "project_path": project_path,
        "user_id": "1",
        "user_login": "root",
        "user_email": "admin@example.com",
        "user_access_level": "owner",
        "pipeline_id": payload["job_info"]["pipeline_id"].to_string(),
        "pipeline_source": var("CI_PIPELINE_SOURCE"),
        "job_id": payload["id"].to_string(),
        "ref": git_ref,
        "ref_type": ref_type,
        "ref_path": ref_path,
        "ref_protected": (git_ref == var("CI_DEFAULT_BRANCH")).to_string(),
        "runner_id": 1,
        "runner_environment": "self-hosted",
        "sha": sha,
        "project_visibility": "private",
        "ci_config_ref_uri": format!("{}/{project_path}//.gitlab-ci.yml@{ref_path}", issuer.trim_start_matches("http://").trim_start_matches("https://")),
        "ci_config_sha": sha,
        "jti": crate::random_hex(),
        "iss": issuer,
        "iat": now,
        "nbf": now.saturating_sub(5),
        "exp": now + timeout + 300,
        "sub": format!("project_path:{project_path}:ref_type:{ref_type}:ref:{git_ref}"),
        "aud": aud,
    })
}

/// Replace every ID token placeholder of `payload` by a signed token: in its variables (the
/// `id_tokens:` a job asks for) and in its `secrets:` (the JWT Rails itself puts in a
/// `gitlab_secrets_manager` secret's `inline_auth`).
pub fn mint(payload: &mut Value, issuer: &str) {
    let snapshot = payload.clone();
    let replace = |value: &mut Value| {
        if let Some(aud) = value.as_str().and_then(|v| v.strip_prefix(ID_TOKEN_PLACEHOLDER)) {
            *value = Value::String(sign(&claims(&snapshot, issuer, aud)));
        }
    };
    if let Some(variables) = payload.get_mut("variables").and_then(Value::as_array_mut) {
        for variable in variables {
            if let Some(value) = variable.get_mut("value") {
                replace(value);
            }
        }
    }
    if let Some(secrets) = payload.get_mut("secrets").and_then(Value::as_object_mut) {
        for secret in secrets.values_mut() {
            if let Some(jwt) = secret.pointer_mut("/gitlab_secrets_manager/server/inline_auth/jwt") {
                replace(jwt);
            }
        }
    }
}

/// `GET /oauth/discovery/keys`.
pub(crate) async fn keys() -> Json<Value> {
    Json(jwks())
}

/// `GET /.well-known/openid-configuration`, as GitLab serves it (the parts a verifier reads).
pub(crate) async fn openid_configuration(State(shared): State<Arc<Shared>>) -> Json<Value> {
    let issuer = shared.lock().base_url.clone();
    Json(json!({
        "issuer": issuer,
        "authorization_endpoint": format!("{issuer}/oauth/authorize"),
        "token_endpoint": format!("{issuer}/oauth/token"),
        "revocation_endpoint": format!("{issuer}/oauth/revoke"),
        "introspection_endpoint": format!("{issuer}/oauth/introspect"),
        "userinfo_endpoint": format!("{issuer}/oauth/userinfo"),
        "jwks_uri": format!("{issuer}/oauth/discovery/keys"),
        "scopes_supported": ["api", "read_api", "read_user", "openid", "profile", "email"],
        "response_types_supported": ["code"],
        "response_modes_supported": ["query", "fragment", "form_post"],
        "grant_types_supported": ["authorization_code", "password", "client_credentials", "refresh_token"],
        "token_endpoint_auth_methods_supported": ["client_secret_basic", "client_secret_post"],
        "subject_types_supported": ["public"],
        "id_token_signing_alg_values_supported": ["RS256"],
        "claim_types_supported": ["normal"],
        "claims_supported": ["iss", "sub", "aud", "exp", "iat", "sub_legacy", "name", "nickname",
            "preferred_username", "email", "email_verified", "website", "profile", "picture",
            "groups", "groups_direct", "https://gitlab.org/claims/groups/owner",
            "https://gitlab.org/claims/groups/maintainer", "https://gitlab.org/claims/groups/developer"]
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_with_the_published_key() {
        let token = sign(&json!({"sub": "x"}));
        let (input, signature) = token.rsplit_once('.').unwrap();
        let (n, e) = public_parts();
        let public = ring::signature::RsaPublicKeyComponents {
            n: URL_SAFE_NO_PAD.decode(n).unwrap(),
            e: URL_SAFE_NO_PAD.decode(e).unwrap(),
        };
        public
            .verify(
                &ring::signature::RSA_PKCS1_2048_8192_SHA256,
                input.as_bytes(),
                &URL_SAFE_NO_PAD.decode(signature).unwrap(),
            )
            .unwrap();
        assert!(
            public_key_pem().starts_with("-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA")
        );
    }
}
