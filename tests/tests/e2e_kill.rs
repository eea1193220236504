//! Dropping the `run()` future is `kill -9`: every task the controller spawned stops with it — no
//! write is sent afterwards, and with leader election the Lease is not released (a release
//! would let a standby in at once, while a write the dead leader left in flight may still land).
//! Found by the chaos suite (seed 1028): an aborted leader's elector task lived on, saw its release
//! signal's sender dropped, released the Lease 0.4 s before the standby took over and listed, and
//! the dead leader's late write then landed on a block the new leader had given to another Node.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use axum::http::{HeaderValue, header::USER_AGENT};
use common::{WAIT, fast_config, init_tracing, ipam, masks, node_like, pod_cidrs};
use nodeipam::controller::{ControllerConfig, Health, LeaderElection, RunSummary, run};
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, LateAnswer, Resource, Sandbox, SandboxHandle, Verb, fixture,
};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const LATE: &str = "late";

/// A controller whose requests carry `User-Agent: <controller's> <name>`.
struct Process {
    health: Health,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<RunSummary, nodeipam::Error>>,
}

fn agent(name: &str) -> String {
    format!("{} {name}", nodeipam::controller::client::USER_AGENT_VALUE)
}

fn start(sb: &SandboxHandle, config: ControllerConfig, name: &str) -> Process {
    let mut client_config = nodeipam::controller::client::config_for_url(&sb.url()).unwrap();
    client_config.headers.retain(|(n, _)| n != USER_AGENT);
    client_config
        .headers
        .push((USER_AGENT, HeaderValue::from_str(&agent(name)).unwrap()));
    let client = kube::Client::try_from(client_config).unwrap();
    let health = config.health.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run(config, client, async move {
        let _ = stopped.await;
    }));
    Process { health, stop, task }
}

fn election(identity: &str) -> LeaderElection {
    LeaderElection {
        namespace: "kube-system".to_owned(),
        name: "nodeipam-controller".to_owned(),
        identity: identity.to_owned(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    }
}

fn sandbox_nodes() -> Value {
    let template = fixture(AWS)["items"][1].clone();
    json!({"kind": "NodeList", "apiVersion": "v1", "items": [node_like(&template, LATE)]})
}

/// The PATCH of LATE is applied late (after the kill); every re-send hangs.
fn hold_the_patch(sb: &SandboxHandle) {
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::LateWrite {
                commit_after: Duration::from_millis(900),
                answer: LateAnswer::DropConnection,
            },
        )
        .named(LATE),
    );
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1000,
            FaultAction::Hang(Duration::from_secs(10)),
        )
        .named(LATE),
    );
}

/// Requests from `name` at or after position `from` of the log, as `verb resource`.
fn requests_from(sb: &SandboxHandle, name: &str, from: usize) -> Vec<String> {
    sb.requests()
        .into_iter()
        .skip(from)
        .filter(|r| r.user_agent == agent(name))
        .map(|r| format!("{} {:?} {:?}", r.verb_name, r.resource, r.name))
        .collect()
}

/// The leader is killed with its PATCH of LATE in flight. Its Lease is not released: the standby
/// takes over only once the Lease has expired, and the killed leader sends nothing afterwards.
#[tokio::test]
async fn a_killed_leader_neither_releases_its_lease_nor_writes_again() {
    init_tracing();
    let sb = Sandbox::start(sandbox_nodes()).await;
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    let config = |identity: &str| {
        let mut config = fast_config(ipam.clone());
        config.leader_election = Some(election(identity));
        config
    };
    hold_the_patch(&sb);
    let a = start(&sb, config("a"), "a");
    let ha = a.health.clone();
    assert!(sb.wait_until(WAIT, |_| ha.is_leading()).await);
    let b = start(&sb, config("b"), "b");
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().len() == 1)
            .await,
        "A never sent its PATCH"
    );
    a.task.abort();
    let _ = a.task.await;
    let killed_at = sb.requests().len();
    sb.clear_faults();
    let hb = b.health.clone();
    assert!(
        sb.wait_until(WAIT, |_| hb.is_leading()).await,
        "B never took over"
    );
    // Every Lease update names a holder: nobody released it.
    let holders: Vec<Value> = sb
        .requests_of(Verb::Update, Resource::Leases)
        .into_iter()
        .filter_map(|r| r.body.map(|b| b["spec"]["holderIdentity"].clone()))
        .collect();
    assert!(
        holders
            .iter()
            .all(|h| h.as_str().is_some_and(|h| !h.is_empty())),
        "the killed leader released the Lease: holders written {holders:?}"
    );
    assert_eq!(
        requests_from(&sb, "a", killed_at),
        Vec::<String>::new(),
        "the killed leader sent requests after the kill"
    );
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, LATE).is_empty())
            .await
    );
    let _ = b.stop.send(());
    let _ = b.task.await.unwrap();
    sb.shutdown().await;
}

/// Without leader election: a controller killed with its PATCH of LATE in flight sends nothing
/// more (its worker must not time out and send the PATCH again from beyond the grave).
#[tokio::test]
async fn a_killed_controller_writes_nothing_more() {
    init_tracing();
    let sb = Sandbox::start(sandbox_nodes()).await;
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.request_timeout = Duration::from_secs(1);
    hold_the_patch(&sb);
    let first = start(&sb, config.clone(), "first");
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().len() == 1)
            .await,
        "the first controller never sent its PATCH"
    );
    first.task.abort();
    let _ = first.task.await;
    let killed_at = sb.requests().len();
    sb.clear_faults();
    config.startup_write_fence = config.request_timeout;
    let second = start(&sb, config, "second");
    let health = second.health.clone();
    assert!(
        sb.wait_until(WAIT, |sb| health.is_ready()
            && !pod_cidrs(sb, LATE).is_empty())
            .await
    );
    assert_eq!(
        requests_from(&sb, "first", killed_at),
        Vec::<String>::new(),
        "the killed controller sent requests after the kill"
    );
    let _ = second.stop.send(());
    let _ = second.task.await.unwrap();
    sb.shutdown().await;
}
