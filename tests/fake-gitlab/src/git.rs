//! Git repositories: bare repos on disk, committing files (and submodule links) into them
//! with plumbing commands, and serving them over smart HTTP through `git http-backend` as a
//! CGI process, with Git LFS beside them (`crate::lfs`).

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{Request, State};
use axum::http::HeaderMap;
use axum::response::Response;
use base64::Engine;
use futures::StreamExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::{finish, response, Incoming};
use crate::Shared;

/// Runs git with a clean environment for repository plumbing.
fn git(dir: Option<&Path>, args: &[&str], envs: &[(&str, &str)], stdin: Option<&[u8]>) -> Result<String, String> {
    let mut cmd = Command::new("git");
    if let Some(dir) = dir {
        cmd.arg("--git-dir").arg(dir);
    }
    cmd.args(args);
    for var in ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY", "GIT_CONFIG_PARAMETERS"] {
        cmd.env_remove(var);
    }
    cmd.env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_AUTHOR_NAME", "Fake GitLab")
        .env("GIT_AUTHOR_EMAIL", "fake@gitlab.test");
    cmd.env("GIT_COMMITTER_NAME", "Fake GitLab").env("GIT_COMMITTER_EMAIL", "fake@gitlab.test");
    for (k, v) in envs {
        cmd.env(k, v);
    }
    cmd.stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = cmd.spawn().map_err(|e| format!("spawn git {args:?}: {e}"))?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        use std::io::Write;
        pipe.write_all(data).map_err(|e| format!("write to git {args:?}: {e}"))?;
    }
    let out = child.wait_with_output().map_err(|e| format!("wait for git {args:?}: {e}"))?;
    if !out.status.success() {
        return Err(format!("git {args:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim()));
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) fn init_bare(dir: &Path) -> Result<(), String> {
    let dir_str = dir.to_str().ok_or("non-UTF-8 repository path")?;
    git(None, &["init", "--quiet", "--bare", "--initial-branch=main", dir_str], &[], None)?;
    // Pushes over HTTP are allowed for authenticated users (http-backend's default).
    git(Some(dir), &["config", "http.receivepack", "true"], &[], None)?;
    Ok(())
}

/// The commit `branch` points at, if it exists.
pub(crate) fn head_sha(dir: &Path, branch: &str) -> Option<String> {
    git(Some(dir), &["rev-parse", "--verify", "--quiet", &format!("refs/heads/{branch}^{{commit}}")], &[], None).ok()
}

pub(crate) fn commit_files(
    dir: &Path,
    branch: &str,
    files: &[(&str, &[u8], bool)],
    message: &str,
) -> Result<String, String> {
    commit_entries(dir, branch, files, &[], message)
}

/// Commits `files` and `gitlinks` (path, commit sha: submodule entries) on top of `branch`.
pub(crate) fn commit_entries(
    dir: &Path,
    branch: &str,
    files: &[(&str, &[u8], bool)],
    gitlinks: &[(&str, &str)],
    message: &str,
) -> Result<String, String> {
    let index_dir = tempfile::tempdir().map_err(|e| format!("temp index: {e}"))?;
    let index = index_dir.path().join("index");
    let index_str = index.to_str().ok_or("non-UTF-8 temp path")?;
    let env = [("GIT_INDEX_FILE", index_str)];
    let parent = head_sha(dir, branch);
    if let Some(parent) = &parent {
        git(Some(dir), &["read-tree", parent], &env, None)?;
    }
    for (path, content, executable) in files {
        let blob = git(Some(dir), &["hash-object", "-w", "--stdin"], &env, Some(content))?;
        let mode = if *executable { "100755" } else { "100644" };
        git(Some(dir), &["update-index", "--add", "--cacheinfo", &format!("{mode},{blob},{path}")], &env, None)?;
    }
    for (path, sha) in gitlinks {
        git(Some(dir), &["update-index", "--add", "--cacheinfo", &format!("160000,{sha},{path}")], &env, None)?;
    }
    let tree = git(Some(dir), &["write-tree"], &env, None)?;
    let mut args = vec!["commit-tree", tree.as_str(), "-m", message];
    if let Some(parent) = &parent {
        args.extend(["-p", parent.as_str()]);
    }
    let commit = git(Some(dir), &args, &env, None)?;
    git(Some(dir), &["update-ref", &format!("refs/heads/{branch}"), &commit], &env, None)?;
    Ok(commit)
}

/// Splits `/group/project.git/info/refs` into (`group/project`, `/info/refs`).
fn split_repo_path(path: &str) -> Option<(&str, &str)> {
    let idx = path.find(".git/")?;
    let repo = path[..idx].trim_start_matches('/');
    (!repo.is_empty() && !repo.contains("..")).then(|| (repo, &path[idx + 4..]))
}

/// `gitlab-ci-token:<token>` from a Basic `Authorization` header.
fn basic_credentials(headers: &HeaderMap) -> Option<(String, String)> {
    let value = headers.get("authorization")?.to_str().ok()?;
    let encoded = value.strip_prefix("Basic ").or_else(|| value.strip_prefix("basic "))?;
    let decoded = base64::engine::general_purpose::STANDARD.decode(encoded.trim()).ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, pass) = text.split_once(':')?;
    Some((user.to_string(), pass.to_string()))
}

/// Fallback handler: git smart HTTP for known repositories, 404 for everything else.
pub(crate) async fn serve(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let req = Incoming {
        method: parts.method.clone(),
        uri: parts.uri.clone(),
        headers: parts.headers.clone(),
        body: Bytes::new(),
    };
    let Some((repo, rest)) = split_repo_path(parts.uri.path()) else {
        return finish(&shared, &req, response(404, &[], "404 Not Found"));
    };
    let (known, public, user_ok) = {
        let s = shared.lock();
        let public = s.repos.get(repo).copied();
        let user_ok = basic_credentials(&parts.headers).is_some_and(|(user, pass)| {
            user == "gitlab-ci-token" && s.jobs.values().any(|j| j.token == pass && j.status.is_processing())
        });
        (public.is_some(), public.unwrap_or(false), user_ok)
    };
    if !known {
        return finish(&shared, &req, response(404, &[], "404 Not Found"));
    }
    if !public && !user_ok {
        return finish(
            &shared,
            &req,
            response(401, &[("WWW-Authenticate", "Basic realm=\"GitLab\"".to_string())], "HTTP Basic: Access denied"),
        );
    }
    let repo_dir = shared.repo_root.join(format!("{repo}.git"));
    if rest == "/info/lfs/objects/batch" && parts.method == axum::http::Method::POST {
        let bytes = match axum::body::to_bytes(body, 1 << 20).await {
            Ok(b) => b,
            Err(e) => return finish(&shared, &req, response(400, &[], format!("bad body: {e}"))),
        };
        let repo_url = format!("{}/{repo}.git", shared.lock().base_url);
        let resp = crate::lfs::batch(&repo_dir, &repo_url, &parts.headers, &bytes);
        return finish(&shared, &Incoming { body: bytes, ..req }, resp);
    }
    if let Some(object) = rest.strip_prefix("/gitlab-lfs/objects/") {
        return finish(&shared, &req, crate::lfs::download(&repo_dir, object));
    }
    let resp = match run_http_backend(&shared, &parts, body, user_ok).await {
        Ok(r) => r,
        Err(e) => response(500, &[], format!("fake-gitlab: git http-backend: {e}")),
    };
    finish(&shared, &req, resp)
}

async fn run_http_backend(
    shared: &Shared,
    parts: &axum::http::request::Parts,
    body: Body,
    authenticated: bool,
) -> Result<Response, String> {
    let header = |name: &str| parts.headers.get(name).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let mut cmd = tokio::process::Command::new("git");
    cmd.arg("http-backend");
    for var in ["GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_CONFIG_PARAMETERS"] {
        cmd.env_remove(var);
    }
    cmd.env("GIT_PROJECT_ROOT", &shared.repo_root)
        .env("GIT_HTTP_EXPORT_ALL", "1")
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GATEWAY_INTERFACE", "CGI/1.1")
        .env("SERVER_PROTOCOL", "HTTP/1.1")
        .env("REQUEST_METHOD", parts.method.as_str())
        .env("PATH_INFO", parts.uri.path())
        .env("QUERY_STRING", parts.uri.query().unwrap_or(""))
        .env("CONTENT_TYPE", header("content-type"))
        .env("REMOTE_ADDR", "127.0.0.1");
    let length = header("content-length");
    if !length.is_empty() {
        cmd.env("CONTENT_LENGTH", length);
    }
    let encoding = header("content-encoding");
    if !encoding.is_empty() {
        cmd.env("HTTP_CONTENT_ENCODING", encoding);
    }
    let protocol = header("git-protocol");
    if !protocol.is_empty() {
        cmd.env("GIT_PROTOCOL", protocol);
    }
    if authenticated {
        cmd.env("REMOTE_USER", "gitlab-ci-token");
    }
    cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).kill_on_drop(true);
    let mut child = cmd.spawn().map_err(|e| format!("spawn: {e}"))?;
    let (Some(mut stdin), Some(mut stdout), Some(mut stderr)) =
        (child.stdin.take(), child.stdout.take(), child.stderr.take())
    else {
        return Err("missing pipes".into());
    };
    // Stream the request body in while the response streams out.
    tokio::spawn(async move {
        let mut stream = body.into_data_stream();
        while let Some(chunk) = stream.next().await {
            let Ok(chunk) = chunk else { break };
            if stdin.write_all(&chunk).await.is_err() {
                break;
            }
        }
        let _ = stdin.shutdown().await;
    });
    tokio::spawn(async move {
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err).await;
        if !err.trim().is_empty() {
            tracing::debug!("git http-backend: {}", err.trim());
        }
        let _ = child.wait().await;
    });

    // CGI headers end at the first empty line.
    let mut head = Vec::new();
    let body_start = loop {
        let mut buf = [0u8; 8192];
        let n = stdout.read(&mut buf).await.map_err(|e| format!("read: {e}"))?;
        if n == 0 {
            return Err(format!("ended before its headers: {}", String::from_utf8_lossy(&head)));
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break (i, i + 4);
        }
        if let Some(i) = head.windows(2).position(|w| w == b"\n\n") {
            break (i, i + 2);
        }
    };
    let rest = head.split_off(body_start.1);
    let header_text = String::from_utf8_lossy(&head[..body_start.0]).into_owned();
    let mut status = 200u16;
    let mut headers = Vec::new();
    for line in header_text.lines() {
        let Some((name, value)) = line.split_once(':') else { continue };
        let (name, value) = (name.trim(), value.trim().to_string());
        if name.eq_ignore_ascii_case("status") {
            status = value.split_whitespace().next().and_then(|c| c.parse().ok()).unwrap_or(200);
        } else {
            headers.push((name.to_string(), value));
        }
    }
    let tail = tokio_util::io::ReaderStream::new(stdout);
    let stream = futures::stream::once(async move { Ok::<Bytes, std::io::Error>(Bytes::from(rest)) }).chain(tail);
    let header_refs: Vec<(&str, String)> = headers.iter().map(|(n, v)| (n.as_str(), v.clone())).collect();
    Ok(response(status, &header_refs, Body::from_stream(stream)))
}
