//! Health, readiness and the Prometheus endpoint.
//!
//! - `/healthz` and `/livez`: 200 `ok` while every long-lived task (informer, workers, leader
//!   election, this server) runs; 500 naming the task once one has stopped or panicked (the
//!   process then exits non-zero — a liveness probe sees the failure either way).
//! - `/readyz`: 200 once the Nodes are synced and this replica is either allocating (leading, or
//!   no leader election) or a healthy standby (it could take over); 503 before the first sync,
//!   while shutting down, and after a failure. With leader election, also 503 while the replica
//!   cannot read the Lease: no Lease request of its own was answered with the Lease's state (2xx,
//!   404, 409; see `LeaderElector::lease_contact`) within the last lease duration — a standby
//!   that cannot reach the API server could not take over, and cannot tell who leads (issue 15,
//!   item 6). A leader never gets there: it gives the Lease up after the renew deadline, which is
//!   shorter.
//! - `/metrics` (on `--metrics-bind-address`): the Prometheus text of the process's recorder.
//!
//! The plain ports are served by the secure port's accept loop without TLS ([`serve_router`]).

use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::watch;
use tokio::time::Instant;

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
    lease: Mutex<Option<LeaseContact>>,
}

/// The leader elector's last contact about the Lease, and how old it may be for `/readyz`.
#[derive(Debug)]
struct LeaseContact {
    last: watch::Receiver<Option<Instant>>,
    max_age: Duration,
}

impl Health {
    /// A live, not-ready state.
    pub fn new() -> Health {
        Health::default()
    }

    /// Whether `/readyz` answers 200: ready, not failed, and (with leader election) the Lease
    /// read within its lease duration ([`Health::lease_unread_for`]).
    pub fn is_ready(&self) -> bool {
        self.not_ready_reason().is_none()
    }

    /// Why `/readyz` answers 503, if it does.
    pub fn not_ready_reason(&self) -> Option<String> {
        if let Some(failure) = self.failure() {
            return Some(format!("failed: {failure}"));
        }
        if !self.inner.ready.load(Ordering::Acquire) {
            return Some("not synced, or stopping".to_owned());
        }
        self.lease_unread_for(Instant::now()).map(|age| match age {
            Some(age) => format!(
                "the Lease could not be read for {} ms (longer than the lease duration)",
                age.as_millis()
            ),
            None => "the Lease has not been read yet".to_owned(),
        })
    }

    /// From now on, readiness also needs the Lease to have been read (as `contact` reports:
    /// `LeaderElector::lease_contact`) within `max_age` (the lease duration).
    pub fn watch_lease_contact(
        &self,
        contact: watch::Receiver<Option<Instant>>,
        max_age: Duration,
    ) {
        *self
            .inner
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(LeaseContact {
            last: contact,
            max_age,
        });
    }

    /// `None` if readiness does not depend on the Lease or it was read within its max age at
    /// `now`; `Some(None)` if it was never read; `Some(Some(age))` if its last read is older.
    pub fn lease_unread_for(&self, now: Instant) -> Option<Option<Duration>> {
        let lease = self
            .inner
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let contact = lease.as_ref()?;
        let last = *contact.last.borrow();
        match last {
            None => Some(None),
            Some(at) => {
                let age = now.saturating_duration_since(at);
                (age > contact.max_age).then_some(Some(age))
            }
        }
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

async fn readyz(State(health): State<Health>) -> (StatusCode, String) {
    match health.not_ready_reason() {
        None => (StatusCode::OK, "ok".to_owned()),
        Some(reason) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {reason}"),
        ),
    }
}

/// The probe routes: `GET /healthz`, `/livez` → 200 `ok` or 500 `failed: …`; `GET /readyz` → 200
/// `ok` or 503 `not ready: <why>`.
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

/// Serves `router` over plain HTTP on `listener` until `shutdown` resolves, with the secure
/// port's bounds (at most 64 connections at once, request headers within 30 s, idle connections
/// closed then: [`crate::http_server`]).
///
/// # Errors
/// None today (accept errors are logged and retried); the `Result` keeps the callers' shape.
pub async fn serve_router(
    listener: tokio::net::TcpListener,
    router: Router,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    crate::http_server::serve_plain(listener, router, shutdown).await;
    Ok(())
}

/// Serves the probes ([`router`]) on `listener` until `shutdown` resolves ([`serve_router`]).
///
/// # Errors
/// As [`serve_router`].
pub async fn serve(
    listener: tokio::net::TcpListener,
    health: Health,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    serve_router(listener, router(health), shutdown).await
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Issue 15, item 6: a standby that cannot read the Lease is not ready once its last read is
    /// older than the lease duration, and ready again after the next read.
    #[tokio::test(start_paused = true)]
    async fn readiness_needs_a_lease_read_within_the_lease_duration() {
        let health = Health::new();
        health.set_ready(true);
        assert!(
            health.is_ready(),
            "without leader election the Lease plays no part"
        );
        let lease_duration = Duration::from_secs(15);
        let (contact, last) = watch::channel(None);
        health.watch_lease_contact(last, lease_duration);
        assert!(!health.is_ready(), "never read");
        assert_eq!(
            health.not_ready_reason().as_deref(),
            Some("the Lease has not been read yet")
        );
        contact.send_replace(Some(Instant::now()));
        assert!(health.is_ready());
        tokio::time::advance(lease_duration).await;
        assert!(health.is_ready(), "exactly the lease duration old");
        tokio::time::advance(Duration::from_millis(1)).await;
        assert!(!health.is_ready(), "older than the lease duration");
        assert_eq!(
            health.not_ready_reason().as_deref(),
            Some("the Lease could not be read for 15001 ms (longer than the lease duration)")
        );
        contact.send_replace(Some(Instant::now()));
        assert!(health.is_ready(), "read again");
        health.set_failed("the Node informer stopped");
        assert!(!health.is_ready());
    }
}
