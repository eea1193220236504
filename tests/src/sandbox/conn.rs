//! Connections that a handler can drop: the listener wraps every accepted TCP stream with a kill
//! switch, and each request carries its connection's switch ([`ConnHandle`], as axum
//! `ConnectInfo`). Once a handler has [`ConnHandle::kill`]ed its connection, every read and write
//! on it fails, so hyper writes nothing more and closes the socket: the client sees the connection
//! closed before any answer — a transport error, not an HTTP status (used by
//! [`super::LateAnswer::DropConnection`]).

use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::task::{Context, Poll};

use axum::extract::connect_info::Connected;
use axum::serve::{IncomingStream, Listener};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};

/// A TCP listener whose connections can be dropped by their handlers.
#[derive(Debug)]
pub struct KillableListener {
    inner: TcpListener,
}

impl KillableListener {
    /// Wrap a bound listener.
    pub fn new(inner: TcpListener) -> Self {
        KillableListener { inner }
    }
}

/// An accepted connection with its kill switch.
#[derive(Debug)]
pub struct KillableStream {
    inner: TcpStream,
    killed: Arc<AtomicBool>,
}

/// The kill switch of the connection a request arrived on.
#[derive(Debug, Clone)]
pub struct ConnHandle(Arc<AtomicBool>);

impl ConnHandle {
    /// Make every further read and write on the connection fail: hyper drops it without
    /// writing the answer it is given.
    pub fn kill(&self) {
        self.0.store(true, Ordering::SeqCst);
    }
}

impl Connected<IncomingStream<'_, KillableListener>> for ConnHandle {
    fn connect_info(stream: IncomingStream<'_, KillableListener>) -> Self {
        ConnHandle(Arc::clone(&stream.io().killed))
    }
}

impl Listener for KillableListener {
    type Io = KillableStream;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        loop {
            match self.inner.accept().await {
                Ok((inner, addr)) => {
                    let _ = inner.set_nodelay(true);
                    let killed = Arc::new(AtomicBool::new(false));
                    return (KillableStream { inner, killed }, addr);
                }
                // As axum's own listener: accept errors (e.g. too many open files) are transient.
                Err(e) => {
                    tracing::error!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
    }

    fn local_addr(&self) -> io::Result<Self::Addr> {
        self.inner.local_addr()
    }
}

fn aborted() -> io::Error {
    io::Error::new(
        io::ErrorKind::ConnectionAborted,
        "connection dropped by a sandbox fault",
    )
}

impl KillableStream {
    fn killed(&self) -> bool {
        self.killed.load(Ordering::SeqCst)
    }
}

impl AsyncRead for KillableStream {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.killed() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl AsyncWrite for KillableStream {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        if self.killed() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.killed() {
            return Poll::Ready(Err(aborted()));
        }
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
