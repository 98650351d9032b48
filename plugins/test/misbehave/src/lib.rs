//! A deliberately bad executor. `run` does what the stage name says:
//!
//! - `loop`: spins forever (the call deadline must stop it);
//! - `membomb`: allocates until the memory limit stops it;
//! - `panic`: panics (a trap);
//! - `http:<url>`: GETs `<url>` through wasi:http and writes the status or error to the trace;
//! - `readfile:<path>`: reads a host file and writes what happened to the trace;
//! - `flood:<bytes>`: writes `<bytes>` bytes to the trace in 64 KiB chunks, then 2 MiB at once;
//! - `env`: writes the environment it sees to the trace;
//! - anything else: writes `ok <name>` to the trace.

use runway_sdk::executor::*;

struct Misbehave;
struct Env;

impl Executor for Misbehave {
    type Environment = Env;
    fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
        Ok(ProviderInfo::new("misbehave", "bash"))
    }
    fn prepare(_job: Job) -> Result<Env, ExecutorError> {
        Ok(Env)
    }
}

fn http_get(url: &str) -> Result<u16, String> {
    use wasip2::http::outgoing_handler;
    use wasip2::http::types::{Fields, OutgoingRequest, Scheme};
    let (scheme, rest) = url.split_once("://").ok_or("url needs a scheme")?;
    let (authority, path) = match rest.find('/') {
        Some(i) => (&rest[..i], &rest[i..]),
        None => (rest, "/"),
    };
    let request = OutgoingRequest::new(Fields::new());
    request.set_scheme(Some(&if scheme == "https" { Scheme::Https } else { Scheme::Http })).map_err(|_| "scheme")?;
    request.set_authority(Some(authority)).map_err(|_| "authority")?;
    request.set_path_with_query(Some(path)).map_err(|_| "path")?;
    let future = outgoing_handler::handle(request, None).map_err(|e| format!("{e:?}"))?;
    future.subscribe().block();
    match future.get() {
        Some(Ok(Ok(response))) => Ok(response.status()),
        Some(Ok(Err(e))) => Err(format!("{e:?}")),
        Some(Err(())) => Err("response already taken".into()),
        None => Err("no response".into()),
    }
}

impl Environment for Env {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let name = stage.name.as_str();
        if name == "loop" {
            let mut x: u64 = 0;
            loop {
                x = std::hint::black_box(x.wrapping_add(1));
            }
        } else if name == "membomb" {
            let mut hoard: Vec<Vec<u8>> = Vec::new();
            loop {
                hoard.push(vec![1u8; 1 << 20]);
                std::hint::black_box(&hoard);
            }
        } else if name == "panic" {
            panic!("misbehave plugin panics on purpose");
        } else if let Some(url) = name.strip_prefix("http:") {
            match http_get(url) {
                Ok(status) => runway_sdk::trace::write_str(&format!("http status {status}\n")),
                Err(e) => runway_sdk::trace::write_str(&format!("http error {e}\n")),
            }
        } else if let Some(path) = name.strip_prefix("readfile:") {
            match std::fs::read(path) {
                Ok(bytes) => runway_sdk::trace::write_str(&format!("read {} bytes\n", bytes.len())),
                Err(e) => runway_sdk::trace::write_str(&format!("read error: {e}\n")),
            }
        } else if let Some(n) = name.strip_prefix("flood:") {
            let total: usize = n.parse().unwrap_or(0);
            let chunk = vec![b'x'; 64 * 1024];
            let mut sent = 0;
            while sent < total {
                let _ = runway_sdk::trace::write(&chunk);
                sent += chunk.len();
            }
            // One oversized write straight through the raw binding: the host must refuse it.
            let big = vec![b'y'; 2 << 20];
            match runway_sdk::bindings::executor::runway::host::trace::write(&big) {
                Ok(()) => runway_sdk::trace::write_str("\noversized write accepted\n"),
                Err(e) => runway_sdk::trace::write_str(&format!("\noversized write refused: {e:?}\n")),
            }
        } else if name == "env" {
            let vars: Vec<String> = std::env::vars().map(|(k, v)| format!("{k}={v}")).collect();
            runway_sdk::trace::write_str(&format!("env: [{}]\n", vars.join(",")));
        } else {
            runway_sdk::trace::write_str(&format!("ok {name}\n"));
        }
        Ok(ExitStatus { code: 0 })
    }
}

runway_sdk::export_executor!(Misbehave, name: "misbehave", description: "misbehaves on purpose (tests only)");
