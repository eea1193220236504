//! Health, readiness and the Prometheus endpoint.
//!
//! - `/healthz` and `/livez`: 200 `ok` while every long-lived task (informer, workers, leader
//!   election, this server) runs; 500 naming the task once one has stopped or panicked (the
//!   process then exits non-zero — a liveness probe sees the failure either way).
//! - `/readyz`: 200 once the Nodes are synced and this replica is either allocating (leading, or
//!   no leader election) or a healthy standby (it could take over); 503 before the first sync,
//!   while shutting down, and after a failure.
//! - `/metrics` (on `--metrics-bind-address`): the Prometheus text of the process's recorder.

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;

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
    failure: Mutex<Option<String>>,
    pools: Mutex<Vec<PoolStats>>,
}

impl Health {
    /// A live, not-ready state.
    pub fn new() -> Health {
        Health::default()
    }

    /// Whether `/readyz` answers 200.
    pub fn is_ready(&self) -> bool {
        self.inner.ready.load(Ordering::Acquire) && self.failure().is_none()
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

    /// Records that a long-lived task failed: `/healthz` fails from now on (the first failure is
    /// kept).
    pub fn set_failed(&self, reason: impl Into<String>) {
        let mut failure = self
            .inner
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if failure.is_none() {
            *failure = Some(reason.into());
        }
        self.set_ready(false);
    }

    /// Why `/healthz` fails, if it does.
    pub fn failure(&self) -> Option<String> {
        self.inner
            .failure
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Whether `/healthz` answers 200.
    pub fn is_alive(&self) -> bool {
        self.failure().is_none()
    }

    /// The pool's capacity and usage after the last change.
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

async fn healthz(State(health): State<Health>) -> (StatusCode, String) {
    match health.failure() {
        None => (StatusCode::OK, "ok".to_owned()),
        Some(reason) => (
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("failed: {reason}"),
        ),
    }
}

async fn readyz(State(health): State<Health>) -> (StatusCode, &'static str) {
    if health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready")
    }
}

/// The probe routes: `GET /healthz`, `/livez` → 200 `ok` or 500 `failed: …`; `GET /readyz` → 200
/// `ok` or 503 `not ready`.
pub fn router(health: Health) -> Router {
    Router::new()
        .route("/healthz", get(healthz))
        .route("/livez", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(health)
}

/// `GET /metrics` → the Prometheus text of `handle`.
pub fn metrics_router(handle: PrometheusHandle) -> Router {
    Router::new().route(
        "/metrics",
        get(move || {
            let handle = handle.clone();
            async move { handle.render() }
        }),
    )
}

/// Serves `router` on `listener` until `shutdown` resolves.
///
/// # Errors
/// The server's I/O error.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(shutdown)
        .await
}

/// Serves the probes ([`router`]) on `listener` until `shutdown` resolves.
///
/// # Errors
/// The server's I/O error.
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(health), shutdown).await
}
