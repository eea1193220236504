//! `/healthz` (process alive) and `/readyz` (initial sync done and allocating, or standing by
//! cleanly as a non-leader), plus a shared view of the pool for tests and diagnostics.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::reconcile::PoolStats;

/// Shared health state; clones share it.
#[derive(Debug, Clone, Default)]
pub struct Health {
    inner: Arc<HealthInner>,
}

#[derive(Debug, Default)]
struct HealthInner {
    ready: AtomicBool,
    leading: AtomicBool,
    pools: Mutex<Vec<PoolStats>>,
}

impl Health {
    /// A not-ready state.
    pub fn new() -> Health {
        Health::default()
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire)
    }

    /// Sets readiness.
    pub fn set_ready(&self, ready: bool) {
        self.inner.ready.store(ready, Ordering::Release);
    }

    /// Whether this instance is allocating (leader, or no leader election) and has finished
    /// its start-up occupy.
    pub fn is_leading(&self) -> bool {
        self.inner.leading.load(Ordering::Acquire)
    }

    /// Sets the leading flag.
    pub fn set_leading(&self, leading: bool) {
        self.inner.leading.store(leading, Ordering::Release);
    }

    /// The pool's capacity and usage after the last reconcile.
    pub fn pools(&self) -> Vec<PoolStats> {
        self.inner
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Records the pool's capacity and usage.
    pub fn set_pools(&self, pools: Vec<PoolStats>) {
        *self
            .inner
            .pools
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = pools;
    }
}

/// The probe routes: `GET /healthz` → 200 `ok`; `GET /readyz` → 200 `ok` or 503 `not ready`.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(|| async { "ok" }))
        .route(
            "/readyz",
            get(|State(health): State<Health>| async move {
                if health.is_ready() {
                    (StatusCode::OK, "ok")
                } else {
                    (StatusCode::SERVICE_UNAVAILABLE, "not ready")
                }
            }),
        )
        .with_state(health)
}

/// Serves the probes on `listener` until `shutdown` resolves.
///
/// # Errors
/// The server's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router(health))
        .with_graceful_shutdown(shutdown)
        .await
}
