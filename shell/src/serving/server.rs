//! The HTTPS accept loop: TLS (tokio-rustls) then HTTP/1.1 (hyper) into an axum [`Router`], one
//! task per connection. Bounded so that a scanner or a slow client cannot exhaust the process:
//! at most [`MAX_CONNECTIONS`] connections at once (further ones wait in the kernel's backlog), a
//! TLS handshake must finish within [`HANDSHAKE_TIMEOUT`], request headers must arrive within
//! [`HEADER_READ_TIMEOUT`]. A failed handshake or connection is logged at debug level and
//! dropped; it never stops the server.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_rustls::TlsAcceptor;

/// Connections served at once.
pub const MAX_CONNECTIONS: usize = 64;

/// Longest TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// Longest wait for a request's headers (also bounds an idle keep-alive connection).
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `router` over TLS on `listener` until `shutdown` resolves (connections in progress are
/// dropped with the runtime). Accept errors (e.g. out of file descriptors) are logged and retried
/// after a pause, as axum's own `serve` does.
pub async fn serve(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let acceptor = TlsAcceptor::from(tls);
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
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
                tracing::warn!(%error, "secure port: accept failed; retrying in 1s");
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        let acceptor = acceptor.clone();
        let router = router.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => tls,
                Ok(Err(error)) => {
                    tracing::debug!(%peer, %error, "secure port: TLS handshake failed");
                    return;
                }
                Err(_) => {
                    tracing::debug!(%peer, "secure port: TLS handshake timed out");
                    return;
                }
            };
            let served = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(HEADER_READ_TIMEOUT)
                .serve_connection(TokioIo::new(tls), TowerToHyperService::new(router))
                .await;
            if let Err(error) = served {
                tracing::debug!(%peer, %error, "secure port: connection ended with an error");
            }
        });
    }
}
