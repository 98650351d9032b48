//! TCP connection resets: every accepted connection is registered with a switch that, when
//! thrown, makes its next read or write fail and closes its socket with `SO_LINGER 0` (a TCP
//! RST: the client sees `connection reset by peer`), mid-request or mid-stream (a watch, an
//! exec/attach WebSocket, a log follow). Owns the registry and the stream wrapper the TLS
//! listener hands axum; which requests to reset is decided in `faults.rs`.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::server::TlsStream;

/// One connection's switch.
#[derive(Default)]
struct Switch {
    thrown: AtomicBool,
    /// The path of the latest request on the connection.
    path: Mutex<String>,
    reader: AtomicWaker,
    writer: AtomicWaker,
}

impl Switch {
    fn throw(&self) {
        self.thrown.store(true, Ordering::SeqCst);
        self.reader.wake();
        self.writer.wake();
    }
}

/// The open connections, by peer address.
#[derive(Default)]
pub(crate) struct Connections {
    open: Mutex<HashMap<SocketAddr, Arc<Switch>>>,
}

impl Connections {
    /// Track `stream` from `peer` until it is dropped.
    pub(crate) fn track(self: &Arc<Self>, stream: TlsStream<TcpStream>, peer: SocketAddr) -> Resettable {
        let switch = Arc::new(Switch::default());
        self.open.lock().unwrap_or_else(|e| e.into_inner()).insert(peer, switch.clone());
        Resettable { inner: stream, switch, peer, connections: self.clone() }
    }

    /// Reset the connection from `peer`: whether it was open.
    pub(crate) fn reset(&self, peer: SocketAddr) -> bool {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.get(&peer).inspect(|switch| switch.throw()).is_some()
    }

    /// Remember `path` as the latest request of the connection from `peer`.
    pub(crate) fn note(&self, peer: SocketAddr, path: &str) {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(switch) = open.get(&peer) {
            *switch.path.lock().unwrap_or_else(|e| e.into_inner()) = path.to_string();
        }
    }

    /// Reset every open connection but `except`'s (with `prefix`: those whose latest request
    /// path starts with it): the latest request path of each.
    pub(crate) fn reset_all(&self, except: Option<SocketAddr>, prefix: Option<&str>) -> Vec<String> {
        let open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        open.iter()
            .filter(|(peer, _)| Some(**peer) != except)
            .map(|(_, switch)| (switch, switch.path.lock().unwrap_or_else(|e| e.into_inner()).clone()))
            .filter(|(_, path)| prefix.is_none_or(|p| path.starts_with(p)))
            .map(|(switch, path)| {
                switch.throw();
                path
            })
            .collect()
    }
}

/// An accepted TLS connection that a thrown switch resets.
pub(crate) struct Resettable {
    inner: TlsStream<TcpStream>,
    switch: Arc<Switch>,
    peer: SocketAddr,
    connections: Arc<Connections>,
}

impl Resettable {
    /// The switch was thrown: from now on every call fails, and closing sends an RST.
    fn reset(&self) -> io::Error {
        let _ = self.inner.get_ref().0.set_zero_linger();
        io::Error::new(io::ErrorKind::ConnectionReset, "connection reset by fake-kube")
    }
}

impl Drop for Resettable {
    fn drop(&mut self) {
        let mut open = self.connections.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.get(&self.peer).is_some_and(|s| Arc::ptr_eq(s, &self.switch)) {
            open.remove(&self.peer);
        }
    }
}

impl AsyncRead for Resettable {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.switch.reader.register(cx.waker());
        if self.switch.thrown.load(Ordering::SeqCst) {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for Resettable {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.switch.writer.register(cx.waker());
        if self.switch.thrown.load(Ordering::SeqCst) {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.switch.writer.register(cx.waker());
        if self.switch.thrown.load(Ordering::SeqCst) {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.switch.thrown.load(Ordering::SeqCst) {
            return Poll::Ready(Err(self.reset()));
        }
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
