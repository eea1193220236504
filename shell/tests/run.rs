//! `run(config, client, shutdown)` driven in-process, without an API server.

mod hang_up;

use std::time::Duration;

use nodeipam::Error;
use nodeipam::controller::{ControllerConfig, client_for_url, run};
use nodeipam_core::NodeMaskFlags;

fn config(cluster: &str, service: &str) -> ControllerConfig {
    let ipam = nodeipam_core::config::validate(cluster, service, NodeMaskFlags::default())
        .expect("valid flags");
    ControllerConfig::new(ipam)
}

#[tokio::test]
async fn service_cidr_filling_the_cluster_cidr_fails_before_any_request() {
    let client = client_for_url("http://127.0.0.1:1").expect("client");
    let result = run(config("10.0.0.0/24", "10.0.0.0/16"), client, async {}).await;
    assert!(matches!(result, Err(Error::Pool(_))), "{result:?}");
}

#[tokio::test]
async fn unreachable_api_server_is_not_ready_and_stops_cleanly() {
    let (url, mut connections) = hang_up::start().await;
    let client = client_for_url(&url).expect("client");
    let config = config("10.244.0.0/16", "");
    let health = config.health.clone();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(run(config, client, async move {
        let _ = stopped.await;
    }));
    // A second connection: the controller handled a failed request and tried again (the client
    // has no retries of its own), so readiness had its chance to go wrong on a failed list.
    hang_up::wait_for(&mut connections, 2).await;
    assert!(!health.is_ready(), "no initial list yet");
    assert!(health.is_leading());
    let _ = stop.send(());
    let summary = tokio::time::timeout(Duration::from_secs(10), task)
        .await
        .expect("stops within 10 s")
        .expect("joined")
        .expect("clean stop");
    assert_eq!(summary.pools.len(), 1);
    assert_eq!(summary.pools[0].used_blocks, 0);
    assert!(summary.held.is_empty());
    assert!(!health.is_ready());
}

/// A client stack whose request handling panics, as kube's did for a `--master` without a
/// scheme: the request buffer's worker task dies and every later request fails the same way.
struct PanickingService;

impl tower::Service<http::Request<kube::client::Body>> for PanickingService {
    type Response = http::Response<kube::client::Body>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Self::Response, Self::Error>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, _: http::Request<kube::client::Body>) -> Self::Future {
        panic!("the client stack broke (test)")
    }
}

/// The controller must not live on half-alive (retrying forever with `/healthz` at 200) when its
/// client cannot send anything any more: it fails its health check and `run` returns an error.
#[tokio::test]
async fn a_broken_client_fails_health_and_stops_the_controller() {
    let client = kube::Client::new(PanickingService, "default");
    let config = config("10.244.0.0/16", "");
    let health = config.health.clone();
    let result = tokio::time::timeout(
        Duration::from_secs(30),
        run(config, client, std::future::pending()),
    )
    .await
    .expect("run returns instead of retrying forever");
    match result {
        Err(Error::TaskFailed { task, reason }) => {
            assert_eq!(task, "the Kubernetes client");
            assert!(reason.contains("buffer"), "{reason}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    assert!(!health.is_alive(), "/healthz fails");
    assert!(!health.is_ready());
    assert_eq!(
        Error::TaskFailed {
            task: "",
            reason: String::new()
        }
        .exit_code(),
        1
    );
}
