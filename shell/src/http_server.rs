//! The accept loop of every port the controller serves: the secure port (TLS, [`serve_tls`],
//! which `serving` runs) and the plain `--metrics-bind-address` / `--health-probe-bind-address`
//! ports ([`serve_plain`], which `health` runs). HTTP/1.1
//! (hyper) into an axum [`Router`], one task per connection. Bounded the same way on every port,
//! so that a scanner, a slow client or a heap of idle connections cannot exhaust the process:
//! at most [`MAX_CONNECTIONS`] connections at once per port (further ones wait in the kernel's
//! backlog, holding no file descriptor of ours), a TLS handshake must finish within
//! [`HANDSHAKE_TIMEOUT`], request headers must arrive within [`HEADER_READ_TIMEOUT`] (which also
//! closes a connection that stays idle, before its first request or between two). Issue 31,
//! item 4: the plain ports had no bound, and 1,150 idle connections to the health port took every
//! descriptor of a process with `RLIMIT_NOFILE` 1024 — "Too many open files" when listing Nodes.
//! A failed handshake or connection is logged at debug level and dropped; it never stops the
//! server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Connections served at once, per port.
pub const MAX_CONNECTIONS: usize = 64;

/// Longest TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a request's headers (also bounds an idle keep-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// The bounds of one port's accept loop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Connections served at once; further ones wait in the kernel's backlog.
    pub max_connections: usize,
    /// Longest TLS handshake (unused on a plain port).
    pub handshake_timeout: Duration,
    /// Longest wait for a request's headers, from the connection's start or the end of the
    /// previous response.
    pub header_read_timeout: Duration,
}

impl Limits {
    /// What every port uses: [`MAX_CONNECTIONS`], [`HANDSHAKE_TIMEOUT`], [`HEADER_READ_TIMEOUT`].
    pub const DEFAULT: Limits = Limits {
        max_connections: MAX_CONNECTIONS,
        handshake_timeout: HANDSHAKE_TIMEOUT,
        header_read_timeout: HEADER_READ_TIMEOUT,
    };
}

/// Serves `router` over TLS on `listener` until `shutdown` resolves (connections in progress are
/// dropped with the runtime), within [`Limits::DEFAULT`]. Accept errors (e.g. out of file
/// descriptors) are logged and retried after a pause, as axum's own `serve` does.
pub async fn serve_tls(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    serve_with(listener, Some(tls), router, Limits::DEFAULT, shutdown).await;
}

/// Serves `router` over plain HTTP on `listener` until `shutdown` resolves, within the same
/// [`Limits::DEFAULT`] as the secure port.
pub async fn serve_plain(
    listener: TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    serve_with(listener, None, router, Limits::DEFAULT, shutdown).await;
}

/// The accept loop: TLS when `tls` is given, plain HTTP otherwise, bounded by `limits`.
pub async fn serve_with(
    listener: TcpListener,
    tls: Option<Arc<rustls::ServerConfig>>,
    router: Router,
    limits: Limits,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let port = if tls.is_some() {
        "secure port"
    } else {
        "plain port"
    };
    let acceptor = tls.map(TlsAcceptor::from);
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let Ok(permit) = permits.clone().acquire_owned().await else {
            return;
        };
        let accepted = tokio::select! {
            () = &mut shutdown => return,
            accepted = listener.accept() => accepted,
        };
        let (stream, peer) = match accepted {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, port, "accept failed; retrying in 1s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let Some(acceptor) = acceptor else {
                return http1(stream, router, limits, peer, port).await;
            };
            match tokio::time::timeout(limits.handshake_timeout, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => http1(tls, router, limits, peer, port).await,
                Ok(Err(error)) => tracing::debug!(%peer, %error, port, "TLS handshake failed"),
                Err(_) => tracing::debug!(%peer, port, "TLS handshake timed out"),
            }
        });
    }
}

/// Serves HTTP/1.1 requests on one connection until it ends or its headers time out.
async fn http1(
    io: impl AsyncRead + AsyncWrite + Unpin + Send + 'static,
    router: Router,
    limits: Limits,
    peer: std::net::SocketAddr,
    port: &'static str,
) {
    let served = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .serve_connection(TokioIo::new(io), TowerToHyperService::new(router))
        .await;
    if let Err(error) = served {
        tracing::debug!(%peer, %error, port, "connection ended with an error");
    }
}

#[cfg(test)]
mod tests;
