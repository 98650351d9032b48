//! Readiness probes (`readinessProbe.httpGet`) as the kubelet runs them: after
//! `initialDelaySeconds`, a GET every `periodSeconds` (default 10) with `timeoutSeconds`
//! (default 1); a status from 200 to 399 is a success; `successThreshold` and
//! `failureThreshold` (defaults 1 and 3) successes or failures in a row flip the container's
//! readiness, which the pod's Ready condition follows. Probed at the pod's IP: 127.0.0.1 for a
//! pod on the node's network (`hostNetwork`, `--pod-network host`); a pod with a network of its
//! own cannot be reached from fake-kube, so its probed containers count as ready once running
//! (the README says so). Knows nothing of the store.

use std::time::Duration;

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The probe's settings, when `container` has an HTTP readiness probe.
#[derive(Debug, Clone)]
pub(super) struct HttpProbe {
    port: u16,
    path: String,
    initial: Duration,
    period: Duration,
    timeout: Duration,
    success: u32,
    failure: u32,
}

impl HttpProbe {
    pub(super) fn of(container: &Value) -> Option<HttpProbe> {
        let probe = &container["readinessProbe"];
        let get = probe.get("httpGet")?;
        let port = match &get["port"] {
            Value::Number(n) => n.as_u64().and_then(|p| u16::try_from(p).ok())?,
            Value::String(name) => container["ports"]
                .as_array()
                .into_iter()
                .flatten()
                .find(|p| p["name"].as_str() == Some(name))
                .and_then(|p| p["containerPort"].as_u64())
                .and_then(|p| u16::try_from(p).ok())
                .or_else(|| name.parse().ok())?,
            _ => return None,
        };
        let seconds = |key: &str, default: u64| Duration::from_secs(probe[key].as_u64().unwrap_or(default));
        let count = |key: &str, default: u64| probe[key].as_u64().unwrap_or(default).max(1) as u32;
        Some(HttpProbe {
            port,
            path: get["path"].as_str().unwrap_or("/").to_string(),
            initial: seconds("initialDelaySeconds", 0),
            period: seconds("periodSeconds", 10).max(Duration::from_secs(1)),
            timeout: seconds("timeoutSeconds", 1).max(Duration::from_secs(1)),
            success: count("successThreshold", 1),
            failure: count("failureThreshold", 3),
        })
    }

    /// One GET: whether it answered 200–399 in time.
    async fn once(&self) -> bool {
        let attempt = async {
            let mut stream = tokio::net::TcpStream::connect(("127.0.0.1", self.port)).await.ok()?;
            let request = format!(
                "GET {} HTTP/1.1\r\nHost: 127.0.0.1:{}\r\nUser-Agent: kube-probe/1.37\r\nAccept: */*\r\nConnection: close\r\n\r\n",
                self.path, self.port
            );
            stream.write_all(request.as_bytes()).await.ok()?;
            let mut head = [0u8; 12];
            stream.read_exact(&mut head).await.ok()?;
            let code: u16 = std::str::from_utf8(&head[9..12]).ok()?.parse().ok()?;
            Some((200..400).contains(&code))
        };
        matches!(tokio::time::timeout(self.timeout, attempt).await, Ok(Some(true)))
    }

    /// Probe until `report` says to stop; it is called after every probe with the new
    /// readiness when it changed (`None`: unchanged).
    pub(super) async fn run(self, mut report: impl FnMut(Option<bool>) -> bool) {
        tokio::time::sleep(self.initial).await;
        let (mut ready, mut successes, mut failures) = (false, 0u32, 0u32);
        loop {
            if self.once().await {
                successes += 1;
                failures = 0;
            } else {
                failures += 1;
                successes = 0;
            }
            let now = if ready { failures < self.failure } else { successes >= self.success };
            let change = (now != ready).then_some(now);
            ready = now;
            if !report(change) {
                return;
            }
            tokio::time::sleep(self.period).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_named_port_and_the_defaults() {
        let c = serde_json::json!({"ports": [{"name": "metrics", "containerPort": 9252}],
            "readinessProbe": {"httpGet": {"path": "/health/ready", "port": "metrics"}, "periodSeconds": 5}});
        let p = HttpProbe::of(&c).expect("probe");
        assert_eq!((p.port, p.path.as_str(), p.period, p.failure), (9252, "/health/ready", Duration::from_secs(5), 3));
        assert!(HttpProbe::of(&serde_json::json!({"readinessProbe": {"exec": {}}})).is_none());
    }
}
