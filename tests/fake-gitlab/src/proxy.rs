//! [`FaultProxy`]: an HTTP/1.1 proxy on loopback between a runner and a GitLab (the fake, in
//! tests) that injects the faults a flaky network and an overloaded GitLab produce, at a seeded
//! rate, per kind of runner request:
//!
//! - a 5xx answer without forwarding ([`Fault::ServerError`]);
//! - a 429 with `Retry-After` without forwarding ([`Fault::TooManyRequests`]);
//! - the connection cut before the request reaches GitLab ([`Fault::Cut`]);
//! - the connection dropped: held silent for a while, then cut ([`Fault::Dropped`]);
//! - the request forwarded and its effect done at GitLab, then the reply lost ([`Fault::LostReply`]);
//! - the reply's headers sent and its body cut halfway ([`Fault::CutReply`]);
//! - latency before forwarding ([`Fault::Latency`]).
//!
//! No request kind sees more than [`FaultPlan::max_consecutive`] faults in a row, so a correct
//! client always gets through. Every injected fault is counted ([`FaultProxy::injected`]) so a
//! test can assert that what it meant to exercise was exercised.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::{Request, Response};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use tokio::task::JoinHandle;

/// A fault the proxy can inject into one request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Fault {
    /// Answer 500, 502 or 503 without forwarding.
    ServerError,
    /// Answer 429 with `Retry-After: 1` without forwarding.
    TooManyRequests,
    /// Close the connection before forwarding.
    Cut,
    /// Hold the connection silent for [`FaultPlan::drop_hold`], then close it.
    Dropped,
    /// Forward (GitLab does the work), then close the connection instead of answering.
    LostReply,
    /// Forward, send the status and headers and half the body, then close.
    CutReply,
    /// Wait [`FaultPlan::latency`], then forward normally.
    Latency,
}

impl Fault {
    /// Every fault.
    pub const ALL: [Fault; 7] = [
        Fault::ServerError,
        Fault::TooManyRequests,
        Fault::Cut,
        Fault::Dropped,
        Fault::LostReply,
        Fault::CutReply,
        Fault::Latency,
    ];
}

/// The kind of runner request, from its method and path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RequestKind {
    /// `POST /api/v4/jobs/request`.
    RequestJob,
    /// `PATCH /api/v4/jobs/:id/trace`.
    PatchTrace,
    /// `PUT /api/v4/jobs/:id`.
    UpdateJob,
    /// Anything else (registration, verify, artifacts, git).
    Other,
}

impl RequestKind {
    /// Classify a request.
    pub fn of(method: &str, path: &str) -> RequestKind {
        let path = path.split('?').next().unwrap_or(path);
        match (method, path.strip_prefix("/api/v4/jobs/")) {
            ("POST", Some("request")) => RequestKind::RequestJob,
            ("PATCH", Some(rest)) if rest.ends_with("/trace") => RequestKind::PatchTrace,
            ("PUT", Some(rest)) if rest.chars().all(|c| c.is_ascii_digit()) => RequestKind::UpdateJob,
            _ => RequestKind::Other,
        }
    }
}

/// What to inject.
#[derive(Debug, Clone)]
pub struct FaultPlan {
    /// Seed of the choice of requests and faults: the same seed and the same request sequence
    /// give the same faults.
    pub seed: u64,
    /// Probability that a request of a faulted kind gets a fault.
    pub rate: f64,
    /// The faults to choose from. Each request kind deals them from its own seeded, shuffled
    /// deck, so every fault is injected once into a kind before any is injected twice.
    pub faults: Vec<Fault>,
    /// The request kinds that get faults.
    pub kinds: Vec<RequestKind>,
    /// Most faults in a row for one request kind.
    pub max_consecutive: u32,
    /// How long [`Fault::Dropped`] holds the connection.
    pub drop_hold: Duration,
    /// How long [`Fault::Latency`] waits.
    pub latency: Duration,
}

impl Default for FaultPlan {
    fn default() -> Self {
        FaultPlan {
            seed: 1,
            rate: 0.3,
            faults: Fault::ALL.to_vec(),
            kinds: vec![RequestKind::RequestJob, RequestKind::PatchTrace, RequestKind::UpdateJob],
            max_consecutive: 2,
            drop_hold: Duration::from_millis(300),
            latency: Duration::from_millis(200),
        }
    }
}

struct State {
    plan: FaultPlan,
    rng: StdRng,
    consecutive: BTreeMap<RequestKind, u32>,
    decks: BTreeMap<RequestKind, Vec<Fault>>,
    injected: BTreeMap<(RequestKind, Fault), u64>,
    forwarded: BTreeMap<RequestKind, u64>,
}

impl State {
    fn choose(&mut self, kind: RequestKind) -> Option<Fault> {
        if !self.plan.kinds.contains(&kind) || self.plan.faults.is_empty() {
            return None;
        }
        let run = self.consecutive.entry(kind).or_default();
        let roll: f64 = self.rng.random();
        if *run >= self.plan.max_consecutive || roll >= self.plan.rate {
            *run = 0;
            return None;
        }
        *run += 1;
        let deck = self.decks.entry(kind).or_default();
        if deck.is_empty() {
            deck.extend(self.plan.faults.iter().copied());
            deck.shuffle(&mut self.rng);
        }
        let fault = deck.pop()?;
        *self.injected.entry((kind, fault)).or_default() += 1;
        Some(fault)
    }
}

/// The proxy; stops when dropped.
pub struct FaultProxy {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

/// The connection is to be closed without a (complete) answer.
#[derive(Debug)]
struct Abort;

impl std::fmt::Display for Abort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fault injected: connection closed")
    }
}

impl std::error::Error for Abort {}

type ProxyBody = http_body_util::combinators::BoxBody<Bytes, Abort>;

impl FaultProxy {
    /// Serve on `127.0.0.1:0`, forwarding to `upstream` (`http://127.0.0.1:port`).
    pub async fn start(upstream: &str, plan: FaultPlan) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("fault proxy: bind 127.0.0.1:0");
        let addr = listener.local_addr().expect("fault proxy: local addr");
        let state = Arc::new(Mutex::new(State {
            rng: StdRng::seed_from_u64(plan.seed),
            plan,
            consecutive: BTreeMap::new(),
            decks: BTreeMap::new(),
            injected: BTreeMap::new(),
            forwarded: BTreeMap::new(),
        }));
        let client = reqwest::Client::builder().no_proxy().build().expect("fault proxy: client");
        let upstream = upstream.trim_end_matches('/').to_string();
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else { continue };
                let io = hyper_util::rt::TokioIo::new(stream);
                let (client, upstream, state) = (client.clone(), upstream.clone(), shared.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        handle(req, client.clone(), upstream.clone(), state.clone())
                    });
                    // A fault ends the connection with an error: that is the point.
                    let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, service).await;
                });
            }
        });
        FaultProxy { addr, state, task }
    }

    /// The proxy's base URL, to give the runner instead of GitLab's.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// How many of each fault were injected into each kind of request.
    pub fn injected(&self) -> BTreeMap<(RequestKind, Fault), u64> {
        self.state.lock().map(|s| s.injected.clone()).unwrap_or_default()
    }

    /// How many requests of each kind reached GitLab (faulted ones included where they were
    /// forwarded).
    pub fn forwarded(&self) -> BTreeMap<RequestKind, u64> {
        self.state.lock().map(|s| s.forwarded.clone()).unwrap_or_default()
    }

    /// Stop injecting (the proxy keeps forwarding).
    pub fn calm(&self) {
        if let Ok(mut s) = self.state.lock() {
            s.plan.rate = 0.0;
        }
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn full(status: u16, headers: &[(&str, &str)], body: &str) -> Response<ProxyBody> {
    let mut response = Response::builder().status(status);
    for (name, value) in headers {
        response = response.header(*name, *value);
    }
    response
        .body(Full::new(Bytes::from(body.to_string())).map_err(|e: Infallible| match e {}).boxed())
        .unwrap_or_else(|_| Response::new(http_body_util::Empty::new().map_err(|e: Infallible| match e {}).boxed()))
}

async fn handle(
    req: Request<Incoming>,
    client: reqwest::Client,
    upstream: String,
    state: Arc<Mutex<State>>,
) -> Result<Response<ProxyBody>, Abort> {
    let method = req.method().as_str().to_string();
    let path = req.uri().path_and_query().map(|p| p.as_str().to_string()).unwrap_or_else(|| "/".into());
    let kind = RequestKind::of(&method, &path);
    let (fault, drop_hold, latency) = match state.lock() {
        Ok(mut s) => (s.choose(kind), s.plan.drop_hold, s.plan.latency),
        Err(_) => (None, Duration::ZERO, Duration::ZERO),
    };
    let (parts, body) = req.into_parts();
    let body = body.collect().await.map_err(|_| Abort)?.to_bytes();
    match fault {
        Some(Fault::ServerError) => {
            let status = [500, 502, 503][path.len() % 3];
            return Ok(full(status, &[("content-type", "text/plain")], "injected server error"));
        }
        Some(Fault::TooManyRequests) => {
            return Ok(full(429, &[("retry-after", "1"), ("content-type", "text/plain")], "injected rate limit"));
        }
        Some(Fault::Cut) => return Err(Abort),
        Some(Fault::Dropped) => {
            tokio::time::sleep(drop_hold).await;
            return Err(Abort);
        }
        Some(Fault::Latency) => tokio::time::sleep(latency).await,
        _ => {}
    }
    let mut forward = client.request(parts.method.clone(), format!("{upstream}{path}")).body(body);
    for (name, value) in parts.headers.iter() {
        if name != hyper::header::HOST && name != hyper::header::CONTENT_LENGTH && name != hyper::header::CONNECTION {
            forward = forward.header(name, value);
        }
    }
    let upstream_response = forward.send().await.map_err(|_| Abort)?;
    if let Ok(mut s) = state.lock() {
        *s.forwarded.entry(kind).or_default() += 1;
    }
    let status = upstream_response.status();
    let headers = upstream_response.headers().clone();
    let bytes = upstream_response.bytes().await.map_err(|_| Abort)?;
    if fault == Some(Fault::LostReply) {
        return Err(Abort);
    }
    let mut response = Response::builder().status(status.as_u16());
    for (name, value) in headers.iter() {
        if name != hyper::header::CONTENT_LENGTH && name != hyper::header::TRANSFER_ENCODING {
            response = response.header(name, value);
        }
    }
    let body: ProxyBody = if fault == Some(Fault::CutReply) && !bytes.is_empty() {
        // Announce the whole length, send half, then fail the body: hyper closes the connection.
        response = response.header(hyper::header::CONTENT_LENGTH, bytes.len());
        let half = bytes.slice(..bytes.len() / 2);
        let frames: Vec<Result<Frame<Bytes>, Abort>> = vec![Ok(Frame::data(half)), Err(Abort)];
        StreamBody::new(futures::stream::iter(frames)).boxed()
    } else {
        Full::new(bytes).map_err(|e: Infallible| match e {}).boxed()
    };
    response.body(body).map_err(|_| Abort)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn classifies_runner_requests() {
        assert_eq!(RequestKind::of("POST", "/api/v4/jobs/request"), RequestKind::RequestJob);
        assert_eq!(RequestKind::of("PATCH", "/api/v4/jobs/12/trace"), RequestKind::PatchTrace);
        assert_eq!(RequestKind::of("PUT", "/api/v4/jobs/12"), RequestKind::UpdateJob);
        assert_eq!(RequestKind::of("PUT", "/api/v4/jobs/12/artifacts"), RequestKind::Other);
        assert_eq!(RequestKind::of("POST", "/api/v4/runners/verify"), RequestKind::Other);
    }

    #[test]
    fn never_more_faults_in_a_row_than_allowed() {
        let plan = FaultPlan { rate: 1.0, max_consecutive: 2, ..FaultPlan::default() };
        let mut state = State {
            rng: StdRng::seed_from_u64(plan.seed),
            plan,
            consecutive: BTreeMap::new(),
            decks: BTreeMap::new(),
            injected: BTreeMap::new(),
            forwarded: BTreeMap::new(),
        };
        let choices: Vec<bool> = (0..9).map(|_| state.choose(RequestKind::PatchTrace).is_some()).collect();
        assert_eq!(choices, [true, true, false, true, true, false, true, true, false]);
        assert_eq!(state.choose(RequestKind::Other), None);
    }
}
