//! The pod streams: `pods/log` (`container`, `follow`, `previous`, `sinceSeconds`,
//! `sinceTime`, `timestamps`, `tailLines`, `limitBytes`) from the Docker container's logs,
//! and `pods/exec` / `pods/attach` over WebSocket (`v5.channel.k8s.io`, `v4.channel.k8s.io`:
//! channel 0 stdin, 1 stdout, 2 stderr, 3 error (a Status), 4 resize; v5's 255 closes a
//! stream) bridged to Docker's hijacked exec/attach streams, the exit code in the error
//! channel as the kubelet writes it. The fault knob can cut every open stream.

use axum::body::Body;
use axum::extract::ws::{Message, WebSocket, WebSocketUpgrade};
use axum::extract::{FromRequestParts, Request};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures::{SinkExt, StreamExt};
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::{Query, Target};
use crate::app::Shared;
use crate::docker::{demux, Docker};
use crate::resources::PODS;
use crate::status::ApiError;

pub(super) async fn handle(app: Shared, target: Target, query: Query, request: Request) -> Result<Response, ApiError> {
    let ns = target.namespace.clone().unwrap_or_default();
    let name = target.name.clone().unwrap_or_default();
    let pod = app.store.get(PODS, &ns, &name).ok_or_else(|| ApiError::not_found("pods", &name))?;
    let containers: Vec<String> = pod["spec"]["containers"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(pod["spec"]["initContainers"].as_array().into_iter().flatten())
        .filter_map(|c| c["name"].as_str().map(String::from))
        .collect();
    let app_containers = pod["spec"]["containers"].as_array().map(|a| a.len()).unwrap_or(0);
    let container = match query.get("container") {
        Some(c) if !c.is_empty() => {
            if !containers.iter().any(|n| n == c) {
                return Err(ApiError::bad_request(format!("container {c} is not valid for pod {name}")));
            }
            c.to_string()
        }
        _ if app_containers == 1 => containers[0].clone(),
        _ => {
            let default = pod["metadata"]["annotations"]["kubectl.kubernetes.io/default-container"].as_str();
            match default {
                Some(d) => d.to_string(),
                None => {
                    return Err(ApiError::bad_request(format!(
                        "a container name must be specified for pod {name}, choose one of: [{}]",
                        containers[..app_containers].join(" ")
                    )))
                }
            }
        }
    };
    let uid = pod["metadata"]["uid"].as_str().unwrap_or_default();
    let running = app.kubelet.running(uid).unwrap_or_default();
    let state = pod["status"]["containerStatuses"]
        .as_array()
        .into_iter()
        .flatten()
        .chain(pod["status"]["initContainerStatuses"].as_array().into_iter().flatten())
        .find(|s| s["name"].as_str() == Some(&container))
        .map(|s| s["state"].clone())
        .unwrap_or(Value::Null);
    let waiting = || {
        let reason = state["waiting"]["reason"].as_str().unwrap_or("ContainerCreating");
        ApiError::bad_request(format!("container \"{container}\" in pod \"{name}\" is waiting to start: {reason}"))
    };
    match target.sub.as_deref() {
        Some("log") => {
            let id = if query.flag("previous") {
                running.previous.get(&container).cloned().ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "previous terminated container \"{container}\" in pod \"{name}\" not found"
                    ))
                })?
            } else {
                running.current.get(&container).cloned().ok_or_else(waiting)?
            };
            logs(&app.kubelet.docker, &id, &query).await
        }
        Some(sub) => {
            let id = running.current.get(&container).cloned().ok_or_else(waiting)?;
            if state.get("running").is_none() {
                return Err(ApiError::bad_request(format!("container {container} is not running (pod {name})")));
            }
            let (mut parts, _body) = request.into_parts();
            let upgrade = WebSocketUpgrade::from_request_parts(&mut parts, &()).await.map_err(|e| {
                ApiError::bad_request(format!("Upgrade request required: pods/{sub} is served over WebSocket ({e})"))
            })?;
            let attach = sub == "attach";
            let docker = app.kubelet.docker.clone();
            let cuts = app.faults.stream_cuts(target.namespace.clone());
            let command: Vec<String> = query.all("command").into_iter().map(String::from).collect();
            if !attach && command.is_empty() {
                return Err(ApiError::bad_request("you must specify at least 1 command"));
            }
            let flags = Flags {
                stdin: query.flag("stdin"),
                stdout: query.get("stdout").is_none_or(|v| v != "0" && v != "false"),
                stderr: query.get("stderr").is_none_or(|v| v != "0" && v != "false"),
                tty: query.flag("tty"),
            };
            let upgrade = upgrade.protocols(["v5.channel.k8s.io", "v4.channel.k8s.io"]);
            Ok(upgrade
                .on_upgrade(move |socket| async move {
                    bridge(socket, docker, id, attach, command, flags, cuts).await;
                })
                .into_response())
        }
        None => Err(ApiError::bad_request("no subresource")),
    }
}

async fn logs(docker: &Docker, id: &str, query: &Query) -> Result<Response, ApiError> {
    let mut path = format!("/containers/{id}/logs?stdout=1&stderr=1");
    if query.flag("follow") {
        path.push_str("&follow=1");
    }
    if query.flag("timestamps") {
        path.push_str("&timestamps=1");
    }
    if let Some(tail) = query.get("tailLines").and_then(|t| t.parse::<i64>().ok()) {
        path.push_str(&format!("&tail={}", tail.max(0)));
    }
    let since = if let Some(s) = query.get("sinceSeconds").and_then(|s| s.parse::<i64>().ok()) {
        Some(chrono::Utc::now().timestamp() - s)
    } else {
        query.get("sinceTime").and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok()).map(|t| t.timestamp())
    };
    if let Some(since) = since {
        path.push_str(&format!("&since={since}"));
    }
    let limit = query.get("limitBytes").and_then(|l| l.parse::<usize>().ok());
    let tty = docker.inspect(id).await.map(|i| i["Config"]["Tty"].as_bool().unwrap_or(false)).unwrap_or(false);
    let body = docker.stream(&path).await.map_err(|e| ApiError::new(500, "InternalError", e.to_string()))?;
    let (tx, rx) = tokio::sync::mpsc::channel::<Result<Bytes, std::io::Error>>(64);
    tokio::spawn(async move {
        let mut body = body;
        let mut buffer = Vec::new();
        let mut sent = 0usize;
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else { break };
            let Ok(data) = frame.into_data() else { continue };
            let mut out = Vec::new();
            if tty {
                out.extend_from_slice(&data);
            } else {
                buffer.extend_from_slice(&data);
                while let Some((_, payload)) = demux(&mut buffer) {
                    out.extend_from_slice(&payload);
                }
            }
            if let Some(limit) = limit {
                out.truncate(limit.saturating_sub(sent));
            }
            sent += out.len();
            if !out.is_empty() && tx.send(Ok(Bytes::from(out))).await.is_err() {
                return;
            }
            if limit.is_some_and(|l| sent >= l) {
                return;
            }
        }
    });
    let stream = futures::stream::unfold(rx, |mut rx| async move { rx.recv().await.map(|item| (item, rx)) });
    Response::builder()
        .status(200)
        .header("content-type", "text/plain")
        .body(Body::from_stream(stream))
        .map_err(|e| ApiError::new(500, "InternalError", e.to_string()))
}

#[derive(Debug, Clone, Copy)]
struct Flags {
    stdin: bool,
    stdout: bool,
    stderr: bool,
    tty: bool,
}

fn frame(channel: u8, data: &[u8]) -> Message {
    let mut bytes = Vec::with_capacity(data.len() + 1);
    bytes.push(channel);
    bytes.extend_from_slice(data);
    Message::Binary(Bytes::from(bytes))
}

/// The error channel's Status for an exit code, as the kubelet writes it.
pub(crate) fn exit_status(command: &[String], code: Option<i64>) -> Value {
    match code {
        Some(0) | None => json!({"metadata": {}, "status": "Success"}),
        Some(code) => json!({
            "metadata": {},
            "status": "Failure",
            "message": format!("command terminated with non-zero exit code: error executing command [{}], exit code {code}", command.join(" ")),
            "reason": "NonZeroExitCode",
            "details": {"causes": [{"reason": "ExitCode", "message": code.to_string()}]}
        }),
    }
}

/// The error channel's Status for a command the runtime could not run, as the kubelet writes
/// the CRI's error.
fn exec_error_status(error: &str) -> Value {
    json!({"metadata": {}, "status": "Failure",
        "message": format!("Internal error occurred: error executing command in container: {error}"),
        "reason": "InternalError", "code": 500})
}

async fn bridge(
    socket: WebSocket,
    docker: Docker,
    container: String,
    attach: bool,
    command: Vec<String>,
    flags: Flags,
    cuts: crate::faults::Cut,
) {
    let v5 = socket.protocol().and_then(|p| p.to_str().ok()) == Some("v5.channel.k8s.io");
    let (mut ws_tx, mut ws_rx) = socket.split();
    let started = async {
        if attach {
            let path = format!(
                "/containers/{container}/attach?stream=1&stdin={}&stdout={}&stderr={}",
                u8::from(flags.stdin),
                u8::from(flags.stdout),
                u8::from(flags.stderr)
            );
            let tty = docker.inspect(&container).await?["Config"]["Tty"].as_bool().unwrap_or(false);
            Ok::<_, crate::docker::DockerError>((docker.hijack(&path, None).await?, None, tty))
        } else {
            let config = json!({"AttachStdin": flags.stdin, "AttachStdout": flags.stdout, "AttachStderr": flags.stderr,
                "Tty": flags.tty, "Cmd": command});
            let exec = docker.exec_create(&container, &config).await?;
            let io = docker
                .hijack(&format!("/exec/{exec}/start"), Some(&json!({"Detach": false, "Tty": flags.tty})))
                .await?;
            Ok((io, Some(exec), flags.tty))
        }
    };
    // The engine can leave an attach to a container that stops around it hanging, before or
    // after the hijack (the exit lands before the attach is registered). The kubelet's attach
    // ends with the container, so a watcher tells when the engine has the container stopped.
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let watcher = attach.then(|| {
        let (docker, container) = (docker.clone(), container.clone());
        tokio::spawn(async move {
            let _ = docker.wait(&container).await;
            let _ = stop_tx.send(true);
        })
    });
    let _abort = AbortOnDrop(watcher);
    let started = tokio::select! {
        started = started => started,
        () = stopped(stop_rx.clone(), STOP_GRACE) => {
            let _ = ws_tx.send(frame(3, exit_status(&command, None).to_string().as_bytes())).await;
            let _ = ws_tx.send(normal_close()).await;
            return;
        }
    };
    let (io, exec, tty) = match started {
        Ok(started) => started,
        Err(e) => {
            let status = exec_error_status(&e.to_string());
            let _ = ws_tx.send(frame(3, status.to_string().as_bytes())).await;
            let _ = ws_tx.send(normal_close()).await;
            return;
        }
    };
    let (mut reader, mut writer) = tokio::io::split(io);
    let resize_docker = docker.clone();
    let resize_target = exec.clone().unwrap_or_else(|| container.clone());
    let is_exec = exec.is_some();
    let input = async move {
        while let Some(Ok(message)) = ws_rx.next().await {
            let data = match message {
                Message::Binary(data) => data,
                Message::Close(_) => break,
                _ => continue,
            };
            match data.first() {
                Some(0) if data.len() > 1 && writer.write_all(&data[1..]).await.is_err() => break,
                Some(4) => {
                    if let Ok(size) = serde_json::from_slice::<Value>(&data[1..]) {
                        let (w, h) = (size["Width"].as_u64().unwrap_or(80), size["Height"].as_u64().unwrap_or(24));
                        let _ = resize_docker.resize(&resize_target, is_exec, w, h).await;
                    }
                }
                Some(255) if v5 && data.get(1) == Some(&0) => {
                    let _ = writer.shutdown().await;
                }
                _ => {}
            }
        }
        // The client is gone: keep the task alive until the output side ends.
        std::future::pending::<()>().await;
    };
    let output = async {
        let mut buffer = Vec::new();
        let mut chunk = vec![0u8; 32 * 1024];
        let mut exited = std::pin::pin!(stopped(stop_rx, std::time::Duration::ZERO));
        let mut gone = false;
        loop {
            // Once the container is stopped, the output is drained until it has been quiet for
            // STOP_GRACE, then the stream ends.
            let read = if gone {
                match tokio::time::timeout(STOP_GRACE, reader.read(&mut chunk)).await {
                    Ok(read) => read,
                    Err(_) => break,
                }
            } else {
                tokio::select! {
                    read = reader.read(&mut chunk) => read,
                    () = &mut exited => {
                        gone = true;
                        continue;
                    }
                }
            };
            let n = match read {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if tty {
                if ws_tx.send(frame(1, &chunk[..n])).await.is_err() {
                    return false;
                }
                continue;
            }
            buffer.extend_from_slice(&chunk[..n]);
            while let Some((stream, payload)) = demux(&mut buffer) {
                let channel = if stream == 2 { 2 } else { 1 };
                if ws_tx.send(frame(channel, &payload)).await.is_err() {
                    return false;
                }
            }
        }
        true
    };
    let finished = tokio::select! {
        finished = output => finished,
        _ = input => false,
        _ = cuts.cut() => return,
    };
    if !finished {
        return;
    }
    let code = match &exec {
        Some(exec) => {
            let mut code = None;
            for _ in 0..100 {
                match docker.exec_inspect(exec).await {
                    Ok(info) if info["Running"] == false => {
                        code = info["ExitCode"].as_i64();
                        break;
                    }
                    Ok(_) => tokio::time::sleep(std::time::Duration::from_millis(20)).await,
                    Err(_) => break,
                }
            }
            code
        }
        None => None,
    };
    // An exec the runtime could not start because its container was stopping (evicted,
    // deleted: the engine answers 126, "cannot exec in a deleted state"): the kubelet reports
    // the CRI's error, not an exit code of the command.
    let stopped_under_it = exec.is_some()
        && code == Some(126)
        && docker.inspect(&container).await.is_ok_and(|info| info["State"]["Running"] != true);
    let status =
        if stopped_under_it { exec_error_status("container is not running") } else { exit_status(&command, code) };
    let _ = ws_tx.send(frame(3, status.to_string().as_bytes())).await;
    let _ = ws_tx.send(normal_close()).await;
}

/// How long an attach stream may stay quiet after its container stopped before it is ended.
const STOP_GRACE: std::time::Duration = std::time::Duration::from_millis(500);

/// Resolves `grace` after the watcher reports the container stopped; never without a watcher.
async fn stopped(mut stop: tokio::sync::watch::Receiver<bool>, grace: std::time::Duration) {
    if stop.wait_for(|stopped| *stopped).await.is_err() {
        std::future::pending::<()>().await;
    }
    tokio::time::sleep(grace).await;
}

/// Aborts the container watcher when the stream ends.
struct AbortOnDrop(Option<tokio::task::JoinHandle<()>>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        if let Some(task) = &self.0 {
            task.abort();
        }
    }
}

/// A close frame with 1000 (normal closure): clients read it as the end of every stream.
fn normal_close() -> Message {
    Message::Close(Some(axum::extract::ws::CloseFrame { code: 1000, reason: "".into() }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_in_the_error_channel() {
        let status = exit_status(&["sh".into(), "-c".into(), "exit 3".into()], Some(3));
        assert_eq!(status["reason"], "NonZeroExitCode");
        assert_eq!(status["details"]["causes"][0], json!({"reason": "ExitCode", "message": "3"}));
        assert_eq!(exit_status(&[], Some(0))["status"], "Success");
    }
}
