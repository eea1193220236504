//! Dropping the `run()` future is `kill -9`: every task the controller spawned stops with it — no
//! write is sent afterwards, and with leader election the Lease is not released (a release
//! would let a standby in at once, while a write the dead leader left in flight may still land).
//! Found by the chaos suite (seed 1028): an aborted leader's elector task lived on, saw its release
//! signal's sender dropped, released the Lease 0.4 s before the standby took over and listed, and
//! the dead leader's late write then landed on a block the new leader had given to another Node.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, agent, election, fast_config, init_tracing, ipam, late_write_then_hang, masks, node_like,
    pod_cidrs, spawn_as,
};
use nodeipam_tests::sandbox::{Resource, Sandbox, SandboxHandle, Verb, fixture};
use serde_json::{Value, json};

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const LATE: &str = "late";

fn sandbox_nodes() -> Value {
    let template = fixture(AWS)["items"][1].clone();
    json!({"kind": "NodeList", "apiVersion": "v1", "items": [node_like(&template, LATE)]})
}

/// The PATCH of LATE is applied late (after the kill); every re-send hangs.
fn hold_the_patch(sb: &SandboxHandle) {
    late_write_then_hang(sb, LATE, Duration::from_millis(900));
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
    let a = spawn_as(&sb, config("a"), "a");
    let ha = a.health.clone();
    assert!(sb.wait_until(WAIT, |_| ha.is_leading()).await);
    let b = spawn_as(&sb, config("b"), "b");
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().len() == 1)
            .await,
        "A never sent its PATCH"
    );
    a.abort().await;
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
    let _ = b.stop_outcome().await;
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
    let first = spawn_as(&sb, config.clone(), "first");
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().len() == 1)
            .await,
        "the first controller never sent its PATCH"
    );
    first.abort().await;
    let killed_at = sb.requests().len();
    sb.clear_faults();
    config.startup_write_fence = config.request_timeout;
    let second = spawn_as(&sb, config, "second");
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
    let _ = second.stop_outcome().await;
    sb.shutdown().await;
}
