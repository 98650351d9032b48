//! A deliberately bad executor. `run` does what the stage name says:
//!
//! - `loop`: spins forever (the call deadline must stop it);
//! - `membomb`: allocates until the memory limit stops it;
//! - `panic`: panics (a trap);
//! - `http:<url>`: GETs `<url>` through wasi:http and writes the status or error to the trace;
//! - `readfile:<path>`: reads a host file and writes what happened to the trace;
//! - `flood:<bytes>`: writes `<bytes>` bytes to the trace in 64 KiB chunks, then 2 MiB at once;
//! - `env`: writes the environment it sees to the trace;
//! - `kvflood:<keys>:<bytes>`: stores `<keys>` values of `<bytes>` bytes in kv until refused;
//! - `kvkey:<len>`: stores, reads back and lists a key of `<len>` bytes;
//! - `logflood:<lines>`: writes `<lines>` log lines, each with an embedded newline and a
//!   forged runner-log line after it;
//! - `stderr:<bytes>`: writes `<bytes>` bytes to stderr, then returns normally;
//! - `stderrpanic:<bytes>`: the same, then panics;
//! - `bigerror:<bytes>`: returns an error value of `<bytes>` bytes;
//! - anything else: writes `ok <name>` to the trace.
//!
//! A job's `config` that is not JSON (does not start with `{`) replaces the stage name, so a
//! whole job can be made to misbehave in its first stage.

use runway_sdk::executor::*;

struct Misbehave;
struct Env {
    mode: String,
}

impl Executor for Misbehave {
    type Environment = Env;
    fn info(_config: &str) -> Result<ProviderInfo, ExecutorError> {
        Ok(ProviderInfo::new("misbehave", "bash"))
    }
    fn prepare(job: Job) -> Result<Env, ExecutorError> {
        let mode = if job.config.starts_with('{') { String::new() } else { job.config };
        Ok(Env { mode })
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

/// `bytes` bytes of stderr in lines of 1 KiB, each write checked (a failed write panics).
fn write_stderr(bytes: usize) {
    use std::io::Write;
    let line = format!("{}\n", "e".repeat(1023));
    let mut stderr = std::io::stderr();
    let mut sent = 0;
    while sent < bytes {
        stderr.write_all(line.as_bytes()).expect("stderr write");
        sent += line.len();
    }
}

impl Environment for Env {
    fn run(&self, stage: StageScript) -> Result<ExitStatus, ExecutorError> {
        let name = if self.mode.is_empty() { stage.name.as_str() } else { self.mode.as_str() };
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
            match runway_sdk::bindings::executor::runway::host0_1_0::trace::write(&big) {
                Ok(()) => runway_sdk::trace::write_str("\noversized write accepted\n"),
                Err(e) => runway_sdk::trace::write_str(&format!("\noversized write refused: {e:?}\n")),
            }
        } else if let Some(spec) = name.strip_prefix("kvflood:") {
            let (keys, bytes) = spec.split_once(':').unwrap_or((spec, "0"));
            let (keys, bytes): (usize, usize) = (keys.parse().unwrap_or(0), bytes.parse().unwrap_or(0));
            let value = vec![7u8; bytes];
            let mut stored = 0;
            let mut error = String::from("none");
            for i in 0..keys {
                match runway_sdk::kv::set(&format!("flood/{i:06}"), &value) {
                    Ok(()) => stored += 1,
                    Err(e) => {
                        error = format!("{e:?}");
                        break;
                    }
                }
            }
            runway_sdk::trace::write_str(&format!("kv stored {stored} of {keys}, error {error}\n"));
        } else if let Some(len) = name.strip_prefix("kvkey:") {
            let key: String = "k".repeat(len.parse().unwrap_or(1));
            let result = runway_sdk::kv::set(&key, b"value").and_then(|()| {
                let value = runway_sdk::kv::get(&key)?;
                let listed = runway_sdk::kv::list_keys("k")?;
                Ok((value, listed.contains(&key)))
            });
            match result {
                Ok((Some(v), true)) if v == b"value" => runway_sdk::trace::write_str(&format!("kvkey {len} ok\n")),
                other => runway_sdk::trace::write_str(&format!("kvkey {len} failed: {other:?}\n")),
            }
        } else if let Some(n) = name.strip_prefix("logflood:") {
            let lines: usize = n.parse().unwrap_or(0);
            for i in 0..lines {
                runway_sdk::log::info(&format!("flood {i}\nFORGED ERROR runway: job {i} leaked a secret\r\x1b[2K"));
            }
            runway_sdk::trace::write_str(&format!("logged {lines}\n"));
        } else if let Some(n) = name.strip_prefix("stderr:") {
            write_stderr(n.parse().unwrap_or(0));
            runway_sdk::trace::write_str("stderr ok\n");
        } else if let Some(n) = name.strip_prefix("stderrpanic:") {
            write_stderr(n.parse().unwrap_or(0));
            panic!("misbehave panics after a flood of stderr");
        } else if let Some(n) = name.strip_prefix("bigerror:") {
            return Err(ExecutorError::Other("E".repeat(n.parse().unwrap_or(0))));
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
