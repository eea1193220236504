//! A standby's health (issue 15, item 6): `/readyz` says not ready while the standby cannot read
//! the Lease (its last answered Lease request is older than the lease duration), and ready again
//! once it can; `leader_election_master_status{name=<Lease name>}` is 0 on a standby, 1 once it
//! leads, 0 after it stopped. Before the fix a standby whose Lease reads all failed stayed ready,
//! and a standby's `/metrics` was empty. (In the `metrics` binary: it reads the process's metrics
//! recorder.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{WAIT, fast_config, init_tracing, ipam, masks, spawn};
use nodeipam::controller::serve_health as serve;
use nodeipam::leader::{LeaderElector, Leadership, LeaseConfig};
use nodeipam_tests::sandbox::{FaultAction, FaultRule, Resource, Sandbox, Verb};
use serde_json::Value;
use tokio::sync::{oneshot, watch};

const NAMESPACE: &str = "kube-system";
const LEASE: &str = "nodeipam-controller";
const LEASE_DURATION: Duration = Duration::from_secs(2);

fn status_line(text: &str) -> Option<String> {
    text.lines()
        .find(|l| l.starts_with("leader_election_master_status{"))
        .map(str::to_owned)
}

/// `GET /readyz` from the probe server at `address`: status and body.
async fn readyz(address: std::net::SocketAddr) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(address).await.unwrap();
    stream
        .write_all(b"GET /readyz HTTP/1.1\r\nHost: probe\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).await.unwrap();
    let status = answer
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("no status line: {answer}"));
    let body = answer
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_owned())
        .unwrap_or_default();
    (status, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_that_cannot_read_the_lease_is_not_ready_and_the_leader_gauge_says_who_leads() {
    init_tracing();
    let (metrics, _alone) = crate::recorder().await;
    let sb = Sandbox::start(Value::Null).await;

    // Another replica holds the Lease (renewing with its last write's resourceVersion: UPDATEs
    // only, so failing Lease GETs do not touch it).
    let other = LeaderElector::new(
        kube::Client::try_from(sb.kube_config()).unwrap(),
        LeaseConfig {
            namespace: NAMESPACE.to_owned(),
            name: LEASE.to_owned(),
            identity: "other".to_owned(),
            lease_duration: LEASE_DURATION,
            renew_deadline: Duration::from_millis(1500),
            retry_period: Duration::from_millis(200),
        },
    )
    .unwrap();
    let (state, mut other_state) = watch::channel(Leadership::default());
    let (release_other, released) = oneshot::channel::<()>();
    let other_task = tokio::spawn(other.run(state, async move {
        let _ = released.await;
    }));
    tokio::time::timeout(WAIT, other_state.wait_for(Leadership::is_leading))
        .await
        .expect("the other replica leads")
        .unwrap();

    let mut config = fast_config(ipam("10.30.0.0/22", "", masks(None, None, None)));
    config.leader_election = Some(LeaseConfig {
        namespace: NAMESPACE.to_owned(),
        name: LEASE.to_owned(),
        identity: "standby".to_owned(),
        lease_duration: LEASE_DURATION,
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    });
    let controller = spawn(&sb, config);
    let health = controller.health.clone();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let probes = listener.local_addr().unwrap();
    let (stop_probes, probes_stopped) = oneshot::channel::<()>();
    let probe_server = tokio::spawn(serve(listener, health.clone(), async move {
        let _ = probes_stopped.await;
    }));
    assert!(
        sb.wait_until(WAIT, |_| health.is_ready()).await,
        "the standby is ready once it has read the Lease"
    );
    assert_eq!(readyz(probes).await.0, 200);
    assert!(!health.is_leading());
    assert_eq!(
        status_line(&metrics.render()).as_deref(),
        Some(r#"leader_election_master_status{name="nodeipam-controller"} 0"#),
        "a standby's /metrics says it stands by"
    );

    // The API server stops answering Lease reads.
    sb.inject(FaultRule::new(
        Verb::Get,
        Resource::Leases,
        1_000_000,
        FaultAction::Status(503),
    ));
    assert!(
        sb.wait_until(WAIT, |_| !health.is_ready()).await,
        "a standby that cannot read the Lease is not ready"
    );
    let (status, body) = readyz(probes).await;
    assert_eq!(status, 503);
    assert!(
        body.starts_with("not ready: the Lease could not be read for "),
        "{body}"
    );
    assert!(health.is_alive(), "not ready, but alive: nothing failed");
    assert!(!health.is_leading());
    assert!(
        other_state.borrow().is_leading(),
        "the holder kept renewing meanwhile"
    );

    // Reads work again: ready again.
    sb.clear_faults();
    assert!(
        sb.wait_until(WAIT, |_| health.is_ready()).await,
        "ready again once the Lease is read"
    );

    // The holder releases the Lease: the standby leads, and says so.
    let _ = release_other.send(());
    other_task.await.unwrap().unwrap();
    assert!(
        sb.wait_until(WAIT, |_| health.is_leading() && health.is_ready())
            .await,
        "the standby took over"
    );
    // Set by the task that logs leadership changes: bounded wait, not a race.
    let leading = r#"leader_election_master_status{name="nodeipam-controller"} 1"#;
    assert!(
        sb.wait_until(WAIT, |_| status_line(&metrics.render()).as_deref()
            == Some(leading))
            .await,
        "the leader's gauge is 1: {:?}",
        status_line(&metrics.render())
    );
    let _ = controller.stop().await;
    assert_eq!(
        status_line(&metrics.render()).as_deref(),
        Some(r#"leader_election_master_status{name="nodeipam-controller"} 0"#),
        "a stopped leader no longer leads"
    );
    let _ = stop_probes.send(());
    let _ = probe_server.await;
    sb.shutdown().await;
}
