//! The AWS Query protocol as the Auto Scaling and EC2 APIs speak it: form-encoded `POST`s
//! signed with SigV4 (AWS's `aws-sigv4` signer), XML answers, XML error bodies
//! (`<ErrorResponse><Error><Code>` for Auto Scaling, `<Response><Errors><Error><Code>` for
//! EC2); and JSON 1.1 as EC2 Instance Connect speaks it (`X-Amz-Target`, JSON bodies and
//! errors). Throttling and 5xx answers are retried with back-off; expired temporary credentials
//! are refreshed once.
//!
//! Owns: requests, signing, error classification. Must not touch: what the calls mean for the
//! fleet (the plugin's `lib.rs`).

use std::time::{Duration, SystemTime};

use aws_credential_types::Credentials as AwsCredentials;
use aws_sigv4::http_request::{sign, SignableBody, SignableRequest, SigningSettings};
use aws_sigv4::sign::v4;
use aws_smithy_runtime_api::client::identity::Identity;
use cloud_common::http::{self, HttpError, Request};
use cloud_common::retry::{with_backoff, Attempt};
use runway_sdk::fleeting::{CapacityError, ProviderError};

use crate::credentials::{Credentials, Sources};

/// One AWS service endpoint.
#[derive(Clone, Debug)]
pub struct Service {
    /// Signing name (`autoscaling`, `ec2`).
    pub name: &'static str,
    /// API version of the Query protocol.
    pub version: &'static str,
    /// Base URL.
    pub url: String,
}

/// An API error answer.
#[derive(Debug, Clone)]
pub struct ApiError {
    pub status: u16,
    pub code: String,
    pub message: String,
}

impl ApiError {
    /// Throttled or failed on the server's side: worth trying again.
    fn retryable(&self) -> bool {
        const THROTTLING: [&str; 9] = [
            "Throttling",
            "ThrottlingException",
            "ThrottledException",
            "RequestThrottled",
            "RequestLimitExceeded",
            "TooManyRequestsException",
            "RequestThrottledException",
            "SlowDown",
            "PriorRequestNotComplete",
        ];
        self.status == 429
            || self.status >= 500
            || THROTTLING.contains(&self.code.as_str())
            || matches!(self.code.as_str(), "InternalFailure" | "ServiceUnavailable" | "Unavailable")
    }

    /// The credentials are no good (expired temporary ones are worth one refresh).
    fn expired(&self) -> bool {
        matches!(self.code.as_str(), "ExpiredToken" | "ExpiredTokenException" | "RequestExpired")
    }
}

/// Why a call failed.
#[derive(Debug, Clone)]
pub enum CallError {
    /// The service answered with an error.
    Api(ApiError),
    /// No answer.
    Http(HttpError),
    /// No credentials.
    Credentials(String),
}

impl std::fmt::Display for CallError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CallError::Api(e) => write!(f, "{} (HTTP {}): {}", e.code, e.status, e.message),
            CallError::Http(e) => write!(f, "{e}"),
            CallError::Credentials(e) => write!(f, "{e}"),
        }
    }
}

impl CallError {
    /// The error code the service sent, if it answered.
    pub fn code(&self) -> Option<&str> {
        match self {
            CallError::Api(e) => Some(&e.code),
            _ => None,
        }
    }

    /// As the fleeting contract's error: throttling and transport are transient, a denied
    /// host and missing credentials are configuration, the rest is the service's word.
    pub fn into_provider(self, what: &str) -> ProviderError {
        let message = format!("{what}: {self}");
        match &self {
            CallError::Api(e) if e.retryable() => ProviderError::Transient(message),
            CallError::Api(e) if e.code.contains("NotFound") || e.code == "InvalidInstanceID.Malformed" => {
                ProviderError::NotFound(message)
            }
            CallError::Api(e) if e.code == "ScalingActivityInProgress" || e.code == "ResourceContention" => {
                ProviderError::Transient(message)
            }
            CallError::Api(e) if e.code == "LimitExceeded" => {
                ProviderError::Capacity(CapacityError { message, retry_after_seconds: 60 })
            }
            CallError::Api(e) if e.status == 401 || e.status == 403 => ProviderError::InvalidConfig(message),
            CallError::Api(_) => ProviderError::Other(message),
            CallError::Http(HttpError::Denied(_)) | CallError::Credentials(_) => ProviderError::InvalidConfig(message),
            CallError::Http(_) => ProviderError::Transient(message),
        }
    }
}

/// A signed-request client for one region.
pub struct Client {
    pub region: String,
    sources: Sources,
    credentials: Option<Credentials>,
}

impl Client {
    /// A client that resolves credentials from `sources` on first use.
    pub fn new(region: String, sources: Sources) -> Client {
        Client { region, sources, credentials: None }
    }

    /// Current credentials, resolved or refreshed when missing or within 5 minutes of expiry.
    pub fn credentials(&mut self) -> Result<Credentials, CallError> {
        let fresh = self
            .credentials
            .as_ref()
            .filter(|c| c.expires_at.is_none_or(|at| at > cloud_common::now_unix() + 300))
            .cloned();
        match fresh {
            Some(c) => Ok(c),
            None => {
                let c = self.sources.resolve().map_err(CallError::Credentials)?;
                self.credentials = Some(c.clone());
                Ok(c)
            }
        }
    }

    /// Call `action` of `service` with `params` (the Query protocol); the XML body of a 2xx
    /// answer.
    pub fn call(&mut self, service: &Service, action: &str, params: &[(String, String)]) -> Result<String, CallError> {
        let mut pairs: Vec<(String, String)> =
            vec![("Action".into(), action.into()), ("Version".into(), service.version.into())];
        pairs.extend(params.iter().cloned());
        let body = cloud_common::form_encode(&pairs);
        self.send(service, &body, QUERY_CONTENT_TYPE, None)
    }

    /// Call `target` (`Service.Operation`) of a JSON 1.1 `service` with the JSON `body`; the
    /// JSON body of a 2xx answer.
    pub fn call_json(&mut self, service: &Service, target: &str, body: &str) -> Result<String, CallError> {
        self.send(service, body, JSON_CONTENT_TYPE, Some(target))
    }

    /// One signed `POST`, retried while throttled or failing on the service's side.
    fn send(
        &mut self,
        service: &Service,
        body: &str,
        content_type: &str,
        target: Option<&str>,
    ) -> Result<String, CallError> {
        let mut refreshed = false;
        with_backoff(|_| {
            let credentials = match self.credentials() {
                Ok(c) => c,
                Err(e) => return Attempt::Done(Err(e)),
            };
            let request = match signed(service, &self.region, &credentials, body, content_type, target) {
                Ok(r) => r,
                Err(e) => return Attempt::Done(Err(e)),
            };
            let response = match http::send(&request) {
                Ok(r) => r,
                Err(e @ HttpError::Transport(_)) => return Attempt::Retry(CallError::Http(e), None),
                Err(e) => return Attempt::Done(Err(CallError::Http(e))),
            };
            if (200..300).contains(&response.status) {
                return Attempt::Done(Ok(response.text()));
            }
            let error = parse_error(response.status, &response.text());
            if error.expired() && !refreshed && credentials.expires_at.is_some() {
                refreshed = true;
                self.credentials = None;
                return Attempt::Retry(CallError::Api(error), Some(Duration::ZERO));
            }
            if error.retryable() {
                let delay = response.retry_after();
                return Attempt::Retry(CallError::Api(error), delay);
            }
            Attempt::Done(Err(CallError::Api(error)))
        })
    }
}

const QUERY_CONTENT_TYPE: &str = "application/x-www-form-urlencoded; charset=utf-8";
const JSON_CONTENT_TYPE: &str = "application/x-amz-json-1.1";

/// The request for `body`, signed for `service` in `region` (`target`: the JSON protocol's
/// `X-Amz-Target`, signed with the rest).
fn signed(
    service: &Service,
    region: &str,
    credentials: &Credentials,
    body: &str,
    content_type: &str,
    target: Option<&str>,
) -> Result<Request, CallError> {
    let identity: Identity = AwsCredentials::new(
        &credentials.access_key_id,
        &credentials.secret_access_key,
        credentials.session_token.clone(),
        None,
        "runway",
    )
    .into();
    let params = v4::SigningParams::builder()
        .identity(&identity)
        .region(region)
        .name(service.name)
        .time(SystemTime::now())
        .settings(SigningSettings::default())
        .build()
        .map_err(|e| CallError::Credentials(format!("signing: {e}")))?
        .into();
    let mut headers = vec![("content-type", content_type)];
    if let Some(target) = target {
        headers.push(("x-amz-target", target));
    }
    let signable =
        SignableRequest::new("POST", &service.url, headers.iter().copied(), SignableBody::Bytes(body.as_bytes()))
            .map_err(|e| CallError::Credentials(format!("signing {}: {e}", service.url)))?;
    let (instructions, _) =
        sign(signable, &params).map_err(|e| CallError::Credentials(format!("signing: {e}")))?.into_parts();
    let mut request = Request::new("POST", service.url.clone()).body(body);
    for (name, value) in headers.iter().copied().chain(instructions.headers()) {
        request = request.header(name, value);
    }
    Ok(request)
}

/// The code and message of an error body (the Query protocols' XML, or JSON 1.1's
/// `{"__type": "…#Code", "message": …}`), or the status alone.
pub fn parse_error(status: u16, body: &str) -> ApiError {
    if let Ok(serde_json::Value::Object(json)) = serde_json::from_str::<serde_json::Value>(body) {
        let text = |key: &str| json.get(key).and_then(|v| v.as_str()).map(str::to_string);
        let code =
            text("__type").or_else(|| text("code")).map(|t| t.rsplit('#').next().unwrap_or_default().to_string());
        return ApiError {
            status,
            code: code.filter(|c| !c.is_empty()).unwrap_or_else(|| format!("HTTP{status}")),
            message: text("message").or_else(|| text("Message")).unwrap_or_default(),
        };
    }
    let doc = roxmltree::Document::parse(body).ok();
    let find = |name: &str| {
        doc.as_ref().and_then(|d| {
            d.descendants().find(|n| n.tag_name().name() == name).and_then(|n| n.text()).map(str::to_string)
        })
    };
    ApiError {
        status,
        code: find("Code").unwrap_or_else(|| format!("HTTP{status}")),
        message: find("Message").unwrap_or_else(|| body.chars().take(300).collect()),
    }
}
