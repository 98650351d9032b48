//! Headless Chromium (Debian's `chromium`) driven over the Chrome DevTools Protocol, for tests
//! of what a person sees in a browser: open a page, evaluate JavaScript in it, type keys, take a
//! screenshot. The browser is started by the test on 127.0.0.1 with a profile of its own and
//! killed by PID when the [`Browser`] is dropped; it is told not to reach any other address
//! (no background networking, updates, sync or first-run pages).
//!
//! A missing `chromium` fails the test (tests/setup.sh installs it).

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;
use futures::{SinkExt, StreamExt};
use serde_json::{json, Value};
use tokio_tungstenite::tungstenite::Message;

type Socket = tokio_tungstenite::WebSocketStream<tokio::net::TcpStream>;

/// One headless Chromium with one page, driven over its DevTools WebSocket.
pub(crate) struct Browser {
    child: Child,
    _profile: tempfile::TempDir,
    page: Socket,
    next_id: u64,
}

impl Browser {
    /// Start Chromium headless on a random DevTools port and attach to its first page.
    pub(crate) async fn start() -> Browser {
        let profile = tempfile::tempdir().expect("profile dir");
        let mut child = Command::new("chromium")
            .args([
                "--headless=new",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--disable-extensions",
                "--disable-default-apps",
                "--metrics-recording-only",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "--window-size=900,500",
            ])
            .arg(format!("--user-data-dir={}", profile.path().display()))
            .arg("about:blank")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("chromium runs (Debian's `chromium`, installed by tests/setup.sh)");
        // Chromium prints "DevTools listening on ws://127.0.0.1:PORT/devtools/browser/ID".
        let stderr = child.stderr.take().expect("stderr");
        let (found, listening) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            let mut sent = false;
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                if !sent {
                    if let Some(url) = line.strip_prefix("DevTools listening on ") {
                        let _ = found.send(url.trim().to_string());
                        sent = true;
                    }
                }
            }
        });
        let browser_url = listening.recv_timeout(Duration::from_secs(60)).expect("chromium's DevTools endpoint");
        let authority = browser_url.trim_start_matches("ws://").split('/').next().expect("host:port").to_string();
        let targets: Value = reqwest::get(format!("http://{authority}/json/list"))
            .await
            .expect("DevTools /json/list")
            .json()
            .await
            .expect("targets");
        let page_url = targets
            .as_array()
            .into_iter()
            .flatten()
            .find(|t| t["type"] == "page")
            .and_then(|t| t["webSocketDebuggerUrl"].as_str())
            .expect("a page target")
            .to_string();
        let tcp = tokio::net::TcpStream::connect(&authority).await.expect("DevTools port");
        let (page, _) = tokio_tungstenite::client_async(page_url, tcp).await.expect("page DevTools socket");
        Browser { child, _profile: profile, page, next_id: 0 }
    }

    /// One DevTools command: its `result` (events arriving meanwhile are skipped).
    pub(crate) async fn call(&mut self, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let request = json!({"id": id, "method": method, "params": params});
        self.page.send(Message::Text(request.to_string().into())).await.expect("DevTools send");
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            let message = tokio::time::timeout_at(deadline, self.page.next())
                .await
                .unwrap_or_else(|_| panic!("DevTools {method} did not answer"))
                .expect("DevTools socket open")
                .expect("DevTools message");
            let Message::Text(text) = message else { continue };
            let answer: Value = serde_json::from_str(&text).expect("DevTools JSON");
            if answer["id"] == id {
                assert!(answer.get("error").is_none(), "DevTools {method}: {}", answer["error"]);
                return answer["result"].clone();
            }
        }
    }

    /// Load `url` in the page.
    pub(crate) async fn navigate(&mut self, url: &str) {
        let result = self.call("Page.navigate", json!({"url": url})).await;
        assert!(result.get("errorText").is_none(), "navigating to {url}: {}", result["errorText"]);
    }

    /// Evaluate a JavaScript expression in the page: its value (promises awaited).
    pub(crate) async fn evaluate(&mut self, expression: &str) -> Value {
        let result = self
            .call("Runtime.evaluate", json!({"expression": expression, "returnByValue": true, "awaitPromise": true}))
            .await;
        assert!(result.get("exceptionDetails").is_none(), "{expression}: {}", result["exceptionDetails"]);
        result["result"]["value"].clone()
    }

    /// Evaluate `expression` until it is `true`, failing after `limit` with `what`.
    pub(crate) async fn until(&mut self, what: &str, limit: Duration, expression: &str) {
        let start = Instant::now();
        while self.evaluate(expression).await != Value::Bool(true) {
            assert!(start.elapsed() < limit, "{what} never came ({expression})");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Type `text` as a person would, a key at a time into the focused element; `\r` is Enter.
    pub(crate) async fn type_text(&mut self, text: &str) {
        for c in text.chars() {
            let (key, code, keycode, text) = match c {
                '\r' | '\n' => ("Enter".to_string(), "Enter".to_string(), 13, "\r".to_string()),
                c => (c.to_string(), String::new(), 0, c.to_string()),
            };
            let down = json!({"type": "keyDown", "key": key, "code": code, "text": text,
                "windowsVirtualKeyCode": keycode, "nativeVirtualKeyCode": keycode});
            self.call("Input.dispatchKeyEvent", down).await;
            let up = json!({"type": "keyUp", "key": key, "code": code,
                "windowsVirtualKeyCode": keycode, "nativeVirtualKeyCode": keycode});
            self.call("Input.dispatchKeyEvent", up).await;
        }
    }

    /// A PNG of the page as it is drawn now.
    pub(crate) async fn screenshot(&mut self) -> Vec<u8> {
        let result = self.call("Page.captureScreenshot", json!({"format": "png"})).await;
        let data = result["data"].as_str().expect("screenshot data");
        base64::engine::general_purpose::STANDARD.decode(data).expect("base64 PNG")
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
