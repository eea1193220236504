//! A panic in any task while the controller runs (with the process's panic hook installed, as
//! `main` does) fails `/healthz` and makes `run` return an error: no half-alive process. Its own
//! test binary, because the hook is process-wide.

mod hang_up;

use std::time::Duration;

use nodeipam::Error;
use nodeipam::controller::{ControllerConfig, client_for_url, install_panic_hook, run};
use nodeipam_core::NodeMaskFlags;

#[tokio::test]
async fn a_panicking_task_fails_health_and_stops_the_controller() {
    install_panic_hook();
    let ipam = nodeipam_core::config::validate("10.244.0.0/16", "", NodeMaskFlags::default())
        .expect("valid flags");
    let config = ControllerConfig::new(ipam);
    let health = config.health.clone();
    // Every connection is closed at once: the informer keeps retrying, as it should.
    let (url, mut connections) = hang_up::start().await;
    let client = client_for_url(&url).expect("client");
    let controller = tokio::spawn(run(config, client, std::future::pending()));
    // Its first request: `run` has started its supervised tasks.
    hang_up::wait_for(&mut connections, 1).await;
    assert!(health.is_alive());
    let _ = tokio::spawn(async { panic!("some task broke (test)") }).await;
    let result = tokio::time::timeout(Duration::from_secs(30), controller)
        .await
        .expect("run returns")
        .expect("joined");
    match result {
        Err(Error::TaskFailed { task, reason }) => {
            assert_eq!(task, "a task");
            assert!(reason.contains("some task broke (test)"), "{reason}");
        }
        other => panic!("expected TaskFailed, got {other:?}"),
    }
    assert!(!health.is_alive());
    assert!(
        health
            .failure()
            .is_some_and(|f| f.contains("some task broke")),
        "{:?}",
        health.failure()
    );
}
