//! A small Google Cloud Storage XML-API server for the cache tests, written from Google's V4
//! signing documentation ("Signature V4 signing process"), because no installable GCS emulator
//! checks signed URLs (fake-gcs-server and gcp-storage-emulator accept any signature).
//!
//! It serves `PUT`, `GET` and `HEAD` of `/{bucket}/{object}` on a free port of 127.0.0.1 and
//! refuses a request unless its `X-Goog-Signature` verifies with the service account's public
//! key (RSA PKCS #1 v1.5, SHA-256) over the canonical request it rebuilds from what it
//! received, and the URL has not expired. A `PUT` must send every signed header;
//! `x-goog-content-length-range` is enforced. Stopped (task aborted) on drop.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::body::{Body, Bytes};
use axum::http::{HeaderMap, Method, Response, StatusCode, Uri};
use chrono::{NaiveDateTime, Utc};
use sha2::{Digest, Sha256};

/// A stored object: bytes and the headers it was written with.
#[derive(Clone, Debug)]
pub(crate) struct Object {
    pub bytes: Vec<u8>,
    pub headers: BTreeMap<String, String>,
}

#[derive(Clone)]
struct State {
    email: String,
    public_key: Vec<u8>,
    objects: Arc<Mutex<BTreeMap<String, Object>>>,
}

/// The running server.
pub(crate) struct GcsFake {
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    objects: Arc<Mutex<BTreeMap<String, Object>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for GcsFake {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl GcsFake {
    /// Start it for the service account `email` whose public key (DER `RSAPublicKey`) is `public_key`.
    pub(crate) async fn start(email: &str, public_key: Vec<u8>) -> GcsFake {
        let objects = Arc::new(Mutex::new(BTreeMap::new()));
        let state = State { email: email.to_string(), public_key, objects: objects.clone() };
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}", listener.local_addr().expect("addr"));
        let app = axum::Router::new().fallback(move |method: Method, uri: Uri, headers: HeaderMap, body: Bytes| {
            let state = state.clone();
            async move { handle(&state, method, uri, headers, body) }
        });
        let task = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        GcsFake { url, objects, task }
    }

    /// The object stored at `bucket/object`.
    pub(crate) fn object(&self, path: &str) -> Option<Object> {
        self.objects.lock().expect("lock").get(path).cloned()
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response<Body> {
    let body =
        format!("<?xml version='1.0' encoding='UTF-8'?><Error><Code>{code}</Code><Message>{message}</Message></Error>");
    Response::builder().status(status).body(Body::from(body)).expect("response")
}

/// `%XX` decoded (query names and values as sent).
fn decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let Ok(b) = u8::from_str_radix(&s[i + 1..i + 3], 16) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(if bytes[i] == b'+' { b' ' } else { bytes[i] });
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Google's encoding of canonical query names and values.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                (b as char).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}

fn handle(state: &State, method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Response<Body> {
    let query: Vec<(String, String)> = uri
        .query()
        .unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (decode(k), decode(v))
        })
        .collect();
    let get = |name: &str| query.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.clone());
    let (Some(algorithm), Some(credential), Some(date), Some(expires), Some(signed), Some(signature)) = (
        get("X-Goog-Algorithm"),
        get("X-Goog-Credential"),
        get("X-Goog-Date"),
        get("X-Goog-Expires"),
        get("X-Goog-SignedHeaders"),
        get("X-Goog-Signature"),
    ) else {
        return error(StatusCode::FORBIDDEN, "AccessDenied", "not a V4 signed URL");
    };
    if algorithm != "GOOG4-RSA-SHA256" {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", "unknown X-Goog-Algorithm");
    }
    let scope: Vec<&str> = credential.split('/').collect();
    if scope.len() != 5 || scope[0] != state.email || scope[2..] != ["auto", "storage", "goog4_request"] {
        return error(StatusCode::FORBIDDEN, "AccessDenied", "unknown credential");
    }
    let Ok(signed_at) = NaiveDateTime::parse_from_str(&date, "%Y%m%dT%H%M%SZ") else {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", "bad X-Goog-Date");
    };
    if !date.starts_with(scope[1]) {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", "X-Goog-Date is not the credential's date");
    }
    let Ok(expires) = expires.parse::<i64>() else {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", "bad X-Goog-Expires");
    };
    if !(1..=604_800).contains(&expires) {
        return error(StatusCode::BAD_REQUEST, "InvalidArgument", "X-Goog-Expires out of range");
    }
    if Utc::now().naive_utc() > signed_at + chrono::Duration::seconds(expires) {
        return error(StatusCode::BAD_REQUEST, "ExpiredToken", "Invalid argument: the signed URL has expired");
    }
    // The canonical request, rebuilt from what was received.
    let mut canonical_query: Vec<(String, String)> = query
        .iter()
        .filter(|(k, _)| !k.eq_ignore_ascii_case("X-Goog-Signature"))
        .map(|(k, v)| (encode(k), encode(v)))
        .collect();
    canonical_query.sort();
    let canonical_query = canonical_query.iter().map(|(k, v)| format!("{k}={v}")).collect::<Vec<_>>().join("&");
    let mut canonical_headers = String::new();
    for name in signed.split(';') {
        let Some(value) = headers.get(name).and_then(|v| v.to_str().ok()) else {
            return error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", &format!("signed header {name} not sent"));
        };
        let value = value.split([' ', '\t']).filter(|p| !p.is_empty()).collect::<Vec<_>>().join(" ");
        canonical_headers.push_str(&format!("{name}:{value}\n"));
    }
    let request =
        format!("{method}\n{}\n{canonical_query}\n{canonical_headers}\n{signed}\nUNSIGNED-PAYLOAD", uri.path());
    let string_to_sign = format!(
        "GOOG4-RSA-SHA256\n{date}\n{}\n{}",
        scope[1..].join("/"),
        hex::encode(Sha256::digest(request.as_bytes()))
    );
    let Ok(signature) = hex::decode(&signature) else {
        return error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", "signature is not hex");
    };
    let key = ring::signature::UnparsedPublicKey::new(&ring::signature::RSA_PKCS1_2048_8192_SHA256, &state.public_key);
    if key.verify(string_to_sign.as_bytes(), &signature).is_err() {
        return error(StatusCode::FORBIDDEN, "SignatureDoesNotMatch", "the signature does not verify");
    }
    let path = decode(uri.path().trim_start_matches('/'));
    let mut objects = state.objects.lock().expect("lock");
    match method {
        Method::PUT => {
            if let Some(range) = headers.get("x-goog-content-length-range").and_then(|v| v.to_str().ok()) {
                let (lo, hi) = range.split_once(',').unwrap_or(("0", range));
                let (lo, hi) = (lo.trim().parse::<usize>().unwrap_or(0), hi.trim().parse::<usize>().unwrap_or(0));
                if body.len() < lo || body.len() > hi {
                    return error(StatusCode::BAD_REQUEST, "EntityTooLarge", "outside x-goog-content-length-range");
                }
            }
            let kept = headers
                .iter()
                .filter(|(k, _)| k.as_str().starts_with("x-goog-meta-") || k.as_str() == "content-type")
                .filter_map(|(k, v)| Some((k.to_string(), v.to_str().ok()?.to_string())))
                .collect();
            objects.insert(path, Object { bytes: body.to_vec(), headers: kept });
            Response::builder().status(StatusCode::OK).body(Body::empty()).expect("response")
        }
        Method::GET | Method::HEAD => match objects.get(&path) {
            None => error(StatusCode::NOT_FOUND, "NoSuchKey", "The specified key does not exist."),
            Some(o) => {
                let mut response = Response::builder().status(StatusCode::OK);
                for (k, v) in &o.headers {
                    response = response.header(k, v);
                }
                let body = if method == Method::GET { Body::from(o.bytes.clone()) } else { Body::empty() };
                response.header("content-length", o.bytes.len()).body(body).expect("response")
            }
        },
        _ => error(StatusCode::METHOD_NOT_ALLOWED, "MethodNotAllowed", "PUT, GET or HEAD"),
    }
}
