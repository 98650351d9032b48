//! An interactive command with a tty in a pod's container (GitLab's web terminal on
//! Kubernetes jobs), as `kubectl exec -it` opens one: `pods/exec` with `stdin`, `stdout` and
//! `tty` (no `stderr`: a tty merges it), input on channel 0, output on channel 1, and the
//! terminal's size on channel 4 as `{"Width":…,"Height":…}` (Kubernetes' `TerminalSize`),
//! sent once at the start and again on every resize.
//!
//! Owns: the tty exec stream and its pumps. Must not touch: what runs in it (the caller's
//! command), sessions, WIT types.

use futures::{SinkExt as _, StreamExt as _};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};
use tokio::sync::mpsc;
use tokio_tungstenite::tungstenite::Message;

use super::exec::{escape, ContainerRef};
use super::{KubeClient, KubeError};

/// Bytes of input per message.
const INPUT_CHUNK: usize = 16 << 10;

/// An open tty exec: its output, its input, its size. Dropping every part ends the stream.
pub struct TtyExec {
    /// What the command writes to its tty.
    pub output: Box<dyn AsyncRead + Send + Unpin>,
    /// What it reads from its tty.
    pub input: Box<dyn AsyncWrite + Send + Unpin>,
    /// Changes the tty's size.
    pub resize: TtyResize,
}

/// Sends the tty's size (channel 4).
#[derive(Clone)]
pub struct TtyResize(mpsc::Sender<Vec<u8>>);

impl TtyResize {
    /// Set the tty to `cols` × `rows`; an error when the stream is gone.
    pub async fn resize(&self, cols: u16, rows: u16) -> Result<(), KubeError> {
        self.0.send(size_frame(cols, rows)).await.map_err(|_| KubeError::Connection("the exec stream is closed".into()))
    }
}

/// The channel-4 message of a `cols` × `rows` terminal.
fn size_frame(cols: u16, rows: u16) -> Vec<u8> {
    let mut frame = vec![4u8];
    frame.extend_from_slice(serde_json::json!({ "Width": cols, "Height": rows }).to_string().as_bytes());
    frame
}

impl KubeClient {
    /// Run `command` with a tty in `target`, `cols` × `rows` to begin with.
    pub async fn exec_tty(
        &self,
        target: &ContainerRef,
        command: &[String],
        cols: u16,
        rows: u16,
    ) -> Result<TtyExec, KubeError> {
        let server = self.endpoint().server.replacen("http", "ws", 1);
        let mut url = format!(
            "{server}/api/v1/namespaces/{}/pods/{}/exec?container={}&stdin=true&stdout=true&tty=true",
            escape(&target.namespace),
            escape(&target.pod),
            escape(&target.container)
        );
        for arg in command {
            url.push_str(&format!("&command={}", escape(arg)));
        }
        // An interactive shell is not started twice: no retry of a handshake that failed midway.
        let (ws, _) = self.handshake(&url, target, false).await?;
        let (mut sink, mut stream) = ws.split();
        let (frames, mut to_send) = mpsc::channel::<Vec<u8>>(16);
        frames.send(size_frame(cols, rows)).await.map_err(|_| KubeError::Connection("exec stream closed".into()))?;
        let (output_end, mut output_pipe) = tokio::io::duplex(64 << 10);
        let (input_end, mut input_pipe) = tokio::io::duplex(64 << 10);
        // Frames to the server: size messages and input.
        tokio::spawn(async move {
            while let Some(frame) = to_send.recv().await {
                if sink.send(Message::binary(frame)).await.is_err() {
                    break;
                }
            }
            let _ = sink.close().await;
        });
        let input_frames = frames.clone();
        tokio::spawn(async move {
            let mut buf = vec![0u8; INPUT_CHUNK];
            loop {
                match input_pipe.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => {
                        let mut frame = Vec::with_capacity(n + 1);
                        frame.push(0u8);
                        frame.extend_from_slice(&buf[..n]);
                        if input_frames.send(frame).await.is_err() {
                            break;
                        }
                    }
                }
            }
        });
        // Output from the server until the command ends (its status or the close).
        tokio::spawn(async move {
            while let Some(Ok(message)) = stream.next().await {
                let data = match message {
                    Message::Binary(data) => data,
                    Message::Close(_) => break,
                    _ => continue,
                };
                match data.first() {
                    Some(1 | 2) if output_pipe.write_all(&data[1..]).await.is_err() => break,
                    Some(3) => break,
                    _ => {}
                }
            }
        });
        Ok(TtyExec { output: Box::new(output_end), input: Box::new(input_end), resize: TtyResize(frames) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_message_is_kubernetes_terminal_size() {
        let frame = size_frame(120, 40);
        assert_eq!(frame[0], 4);
        let size: serde_json::Value = serde_json::from_slice(&frame[1..]).expect("json");
        assert_eq!(size, serde_json::json!({"Width": 120, "Height": 40}));
    }
}
