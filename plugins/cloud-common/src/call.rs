//! One authorized call to a cloud's JSON REST API, as the Azure and Google plugins make them:
//! a bearer token on every request, a refused token (401) refreshed once, throttling and
//! server errors retried with back-off ([`crate::retry`]), and why a call failed
//! ([`CallError`]) mapped onto the fleeting contract's errors.
//!
//! Owns: the request loop and the error's shape. Must not touch: a cloud's error bodies or
//! codes (its [`ApiError`] implementation), how it gets tokens (its [`Bearer`]).

use std::time::Duration;

use runway_sdk::fleeting::ProviderError;

use crate::http::{self, HttpError, Request, Response};
use crate::retry::{with_backoff, Attempt};

/// A cloud's error answer: read from a non-2xx response, classified by the cloud's rules.
pub trait ApiError: Sized {
    /// The error a non-2xx `response` carries.
    fn from_response(response: &Response) -> Self;
    /// Throttled or failed on the server's side: worth trying again.
    fn retryable(&self) -> bool;
    /// The HTTP status it came with.
    fn status(&self) -> u16;
    /// As the fleeting contract's error; `what` names the call.
    fn into_provider(self, what: &str) -> ProviderError;
}

/// Where a client gets its bearer tokens.
pub trait Bearer {
    /// A token now (a cached one while it is valid).
    fn bearer(&mut self) -> Result<String, String>;
    /// Forget the cached token: the API refused it.
    fn invalidate(&mut self);
}

/// Why a call failed.
#[derive(Debug, Clone)]
pub enum CallError<A> {
    /// The API answered with an error.
    Api(A),
    /// No answer.
    Http(HttpError),
    /// No token.
    Auth(String),
}

impl<A: ApiError> CallError<A> {
    /// As the fleeting contract's error: a denied host and a missing token are configuration,
    /// transport is transient, the rest is the API's word.
    pub fn into_provider(self, what: &str) -> ProviderError {
        match self {
            CallError::Api(e) => e.into_provider(what),
            CallError::Http(e @ HttpError::Denied(_)) => ProviderError::InvalidConfig(format!("{what}: {e}")),
            CallError::Http(e) => ProviderError::Transient(format!("{what}: {e}")),
            CallError::Auth(e) => ProviderError::InvalidConfig(format!("{what}: {e}")),
        }
    }

    /// The HTTP status of an API error.
    pub fn status(&self) -> Option<u16> {
        match self {
            CallError::Api(e) => Some(e.status()),
            _ => None,
        }
    }
}

/// One request with a token from `auth` (`body` as JSON), retried on transport failures,
/// throttling and server errors, with the token refreshed once when refused; the 2xx
/// response.
pub fn send<A: ApiError>(
    auth: &mut impl Bearer,
    method: &str,
    url: &str,
    body: Option<String>,
) -> Result<Response, CallError<A>> {
    let mut refreshed = false;
    with_backoff(|_| {
        let token = match auth.bearer() {
            Ok(t) => t,
            Err(e) => return Attempt::Done(Err(CallError::Auth(e))),
        };
        let mut request = Request::new(method, url).header("authorization", format!("Bearer {token}"));
        if let Some(body) = &body {
            request = request.header("content-type", "application/json").body(body.clone());
        }
        let response = match http::send(&request) {
            Ok(r) => r,
            Err(e @ HttpError::Transport(_)) => return Attempt::Retry(CallError::Http(e), None),
            Err(e) => return Attempt::Done(Err(CallError::Http(e))),
        };
        if (200..300).contains(&response.status) {
            return Attempt::Done(Ok(response));
        }
        let error = A::from_response(&response);
        if response.status == 401 && !refreshed {
            refreshed = true;
            auth.invalidate();
            return Attempt::Retry(CallError::Api(error), Some(Duration::ZERO));
        }
        if error.retryable() {
            let delay = response.retry_after();
            return Attempt::Retry(CallError::Api(error), delay);
        }
        Attempt::Done(Err(CallError::Api(error)))
    })
}
