//! Hostile ClusterCIDR objects end to end on the sandbox (issue 18 §2), with fixture 05 (four
//! AWS Nodes without podCIDRs) and a flag CIDR full after two: a ClusterCIDR `grow` serves the
//! other two, then an operator whose CRD lacks our rules (no CEL `self == oldSelf`, no OpenAPI
//! checks: [`SandboxHandle::drop_cluster_cidr_rules`]) edits its `spec` in place. Invariant: the
//! finalizer stays while a Node holds a block the object handed out, whatever its spec says now.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{
    WAIT, all_pod_cidrs, assert_all_served, assert_cluster_cidr, assert_no_cidr_handed_out_twice,
    cluster_cidr, cluster_cidr_writer_passed, condition_is, create_cluster_cidr,
    delete_cluster_cidr, delete_sentinel, four_aws_nodes, has_finalizer, ready_reason_is,
    served_from, spawn, unserved, with_cluster_cidrs,
};
use kube::api::{Patch, PatchParams};
use nodeipam_tests::sandbox::SandboxHandle;
use serde_json::{Value, json};

/// The controller with ClusterCIDRs on and a flag CIDR full after two Nodes, allocating.
async fn controller(sb: &SandboxHandle) -> common::Running {
    let running = spawn(sb, with_cluster_cidrs("10.10.0.0/23", None));
    running.wait_allocating(sb).await;
    running
}

/// The two Nodes served from `grow` (`10.20.0.0/23`, /24 blocks), its finalizer on; the running
/// controller.
async fn two_nodes_in_grow(sb: &SandboxHandle) -> (common::Running, Vec<String>) {
    let running = controller(sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).len() == 2).await);
    create_cluster_cidr(
        sb,
        "grow",
        json!({"ipv4": "10.20.0.0/23", "perNodeHostBits": 8}),
    )
    .await;
    assert_all_served(sb, "the waiting Nodes served from grow").await;
    assert_cluster_cidr(sb, "grow", "our finalizer on", has_finalizer).await;
    let holders = served_from(sb, "10.20.");
    assert_eq!(holders.len(), 2, "{:?}", all_pod_cidrs(sb));
    (running, holders)
}

/// An operator takes every finalizer off ClusterCIDR `name` by hand (a JSON merge patch).
async fn strip_finalizers(sb: &SandboxHandle, name: &str) {
    let api = nodeipam::controller::cluster_cidrs::api(sb.client());
    api.patch(
        name,
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
}

/// Edits `grow`'s spec with a JSON merge patch (accepted: the rules are dropped).
async fn edit_spec(sb: &SandboxHandle, spec: Value) {
    sb.drop_cluster_cidr_rules();
    let api = nodeipam::controller::cluster_cidrs::api(sb.client());
    api.patch(
        "grow",
        &PatchParams::default(),
        &Patch::Merge(json!({"spec": spec})),
    )
    .await
    .unwrap();
}

/// Deleted after the edit: stays while the two Nodes hold their blocks, goes once they left.
async fn held_until_the_nodes_leave(sb: &SandboxHandle, holders: &[String]) {
    delete_cluster_cidr(sb, "grow").await;
    // A writer round decided `grow` on a view holding its deletion before writing the sentinel's
    // status.
    cluster_cidr_writer_passed(sb, "zz-after-delete", "10.251.0.0/24").await;
    assert!(
        has_finalizer(cluster_cidr(sb, "grow").await.as_ref()),
        "two Nodes hold blocks of grow's old range, yet its finalizer went: {:?}",
        cluster_cidr(sb, "grow").await
    );
    gone_once_the_nodes_leave(sb, holders).await;
}

/// The Nodes holding blocks of `grow` (already deleted) leave: it goes.
async fn gone_once_the_nodes_leave(sb: &SandboxHandle, holders: &[String]) {
    for name in holders {
        sb.delete_node(name).unwrap();
    }
    assert_cluster_cidr(sb, "grow", "gone once its Nodes left", |o| o.is_none()).await;
}

/// The range moved (`10.20.0.0/23` → `10.30.0.0/23`): a valid pool of other ranges now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_range_edited_in_place_keeps_the_finalizer_while_nodes_hold_the_old_blocks() {
    let sb = four_aws_nodes().await;
    let (running, holders) = two_nodes_in_grow(&sb).await;
    edit_spec(&sb, json!({"ipv4": "10.30.0.0/23"})).await;
    held_until_the_nodes_leave(&sb, &holders).await;
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// The spec made invalid (`perNodeHostBits: 200`): the object is `Invalid` now, but the Nodes
/// still hold what it handed out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spec_made_invalid_in_place_keeps_the_finalizer_while_nodes_hold_its_blocks() {
    let sb = four_aws_nodes().await;
    let (running, holders) = two_nodes_in_grow(&sb).await;
    edit_spec(&sb, json!({"perNodeHostBits": 200})).await;
    assert_cluster_cidr(&sb, "grow", "Invalid", |o| {
        condition_is(o, "Invalid", "True")
    })
    .await;
    assert!(
        has_finalizer(cluster_cidr(&sb, "grow").await.as_ref()),
        "Invalid now, but two Nodes hold its blocks: {:?}",
        cluster_cidr(&sb, "grow").await
    );
    // Its status shows no usage of a pool it no longer is, and is written once, not every
    // round (a merge patch that leaves the old `ipv4` in place never matches what is wanted).
    assert_cluster_cidr(&sb, "grow", "no IPv4 usage in its status", |o| {
        o.is_some_and(|o| o["status"].get("ipv4").is_none())
    })
    .await;
    sb.clear_requests();
    // Pacing, not settling: past the one-status-write-per-object interval, so a round that wants
    // `grow`'s status again writes it; the sentinel's status then proves such a round decided
    // `grow` (the writer goes in name order, each write sent before the next object).
    tokio::time::sleep(nodeipam::controller::cluster_cidrs::STATUS_WRITE_INTERVAL).await;
    cluster_cidr_writer_passed(&sb, "zz-sentinel", "10.250.0.0/24").await;
    let status_writes = sb
        .requests()
        .iter()
        .filter(|r| r.method == "PATCH" && r.path.ends_with("/clustercidrs/grow/status"))
        .count();
    assert_eq!(status_writes, 0, "a settled status is written again");
    held_until_the_nodes_leave(&sb, &holders).await;
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// A label change that brings a waiting Node under a selector pool with free blocks: it is
/// served from that pool without waiting for its retry (its safety re-check is 10 minutes away,
/// the retry at most 60 s: only the Node's update can serve it within the test).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiting_node_labelled_into_a_selector_pool_is_served_from_it() {
    let sb = four_aws_nodes().await;
    create_cluster_cidr(
        &sb,
        "extra",
        json!({
            "ipv4": "10.50.0.0/23",
            "perNodeHostBits": 8,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "example.com/pool", "operator": "In", "values": ["extra"]}
            ]}]},
        }),
    )
    .await;
    let mut config = with_cluster_cidrs("10.10.0.0/23", None);
    config.retry_max_delay = std::time::Duration::from_secs(60);
    let running = spawn(&sb, config);
    running.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).len() == 2
            && !common::events_with_reason(sb, "CIDRNotAvailable").is_empty())
            .await,
        "{:?}",
        all_pod_cidrs(&sb)
    );
    let waiting = unserved(&sb);
    // Past the first retries: the next is far away (pacing for the positive check below, which
    // only a far retry makes meaningful; nothing is asserted negative after it).
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    sb.patch_node(
        &waiting[0],
        nodeipam_tests::sandbox::PatchType::Merge,
        &json!({"metadata": {"labels": {"example.com/pool": "extra"}}}),
    )
    .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !unserved(sb).contains(&waiting[0]))
            .await,
        "{} labelled into `extra` still waits: {:?}",
        waiting[0],
        all_pod_cidrs(&sb)
    );
    let got = common::pod_cidrs(&sb, &waiting[0]);
    assert!(got.len() == 1 && got[0].starts_with("10.50."), "{got:?}");
    assert_eq!(unserved(&sb), vec![waiting[1].clone()]);
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// Restarts with a ClusterCIDR being deleted while two Nodes hold its blocks: the new process
/// (its allocator empty until start-up occupy) keeps the finalizer, and serves no new Node from
/// the pool; it lets the object go once the Nodes leave.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_during_a_held_deletion_keeps_the_finalizer() {
    let sb = four_aws_nodes().await;
    let (first, holders) = two_nodes_in_grow(&sb).await;
    delete_cluster_cidr(&sb, "grow").await;
    assert_cluster_cidr(&sb, "grow", "Ready: Deleting", |o| {
        ready_reason_is(o, "Deleting")
    })
    .await;
    // `kill -9`: the run() future dropped.
    first.abort().await;
    let second = controller(&sb).await;
    // The restarted writer decided `grow` (listed before start-up occupy) before `zz`'s status.
    cluster_cidr_writer_passed(&sb, "zz-sentinel", "10.250.0.0/24").await;
    assert!(
        has_finalizer(cluster_cidr(&sb, "grow").await.as_ref()),
        "the restarted controller let go of a pool two Nodes hold blocks of: {:?}",
        cluster_cidr(&sb, "grow").await
    );
    assert_cluster_cidr(&sb, "grow", "Ready: Deleting after the restart", |o| {
        ready_reason_is(o, "Deleting")
    })
    .await;
    gone_once_the_nodes_leave(&sb, &holders).await;
    let _ = second.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// An operator strips our finalizer by hand from `grow` being deleted while two Nodes hold its
/// blocks (it goes at once), then re-creates `grow` with a wider range around the old one: the
/// new Nodes it serves never get the blocks the two still hold, before and after a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stripped_finalizer_and_a_re_created_wider_pool_hand_out_nothing_twice() {
    let sb = four_aws_nodes().await;
    let (first, holders) = two_nodes_in_grow(&sb).await;
    delete_cluster_cidr(&sb, "grow").await;
    strip_finalizers(&sb, "grow").await;
    assert_cluster_cidr(&sb, "grow", "gone without its finalizer", |o| o.is_none()).await;
    create_cluster_cidr(
        &sb,
        "grow",
        json!({"ipv4": "10.20.0.0/22", "perNodeHostBits": 8}),
    )
    .await;
    let template = common::template_node("05-aws-4nodes-no-podcidr.json");
    for i in 0..2 {
        let name = format!("ip-10-1-9-{i}.eu-central-1.compute.internal");
        sb.create_node(common::node_like(&template, &name)).unwrap();
    }
    assert_all_served(&sb, "the new Nodes served from the re-created grow").await;
    assert_no_cidr_handed_out_twice(&sb);
    let _ = first.stop().await;
    // Restarted: the four Nodes in 10.20.0.0/22 are occupied, the flag CIDR is full: two more
    // Nodes wait (each told so), nothing is handed out twice.
    let second = controller(&sb).await;
    for i in 2..4 {
        let name = format!("ip-10-1-9-{i}.eu-central-1.compute.internal");
        sb.create_node(common::node_like(&template, &name)).unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |sb| {
            let events = common::events_with_reason(sb, "CIDRNotAvailable");
            ["ip-10-1-9-2", "ip-10-1-9-3"]
                .iter()
                .all(|n| events.iter().any(|(node, _, _)| node.starts_with(n)))
        })
        .await,
        "{:?}",
        all_pod_cidrs(&sb)
    );
    assert_eq!(
        served_from(&sb, "10.20.").len(),
        4,
        "{:?}",
        all_pod_cidrs(&sb)
    );
    assert_eq!(unserved(&sb).len(), 2, "{:?}", all_pod_cidrs(&sb));
    assert!(holders.iter().all(|h| !unserved(&sb).contains(h)));
    let _ = second.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}

/// 64 backing sets (the flag CIDR, `grow` and 62 more pools): `q` is refused. `grow` is deleted
/// and its finalizer stripped by hand while two Nodes hold its blocks (its set stays: they hold
/// blocks in it); then they leave. Nothing about the ClusterCIDRs changes after that, yet the
/// set is free: `q` must be hosted (it gets our finalizer and `Invalid` False).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_pool_is_hosted_once_the_nodes_of_a_gone_pool_leave() {
    let sb = four_aws_nodes().await;
    let (running, holders) = two_nodes_in_grow(&sb).await;
    for i in 0..62 {
        let spec = json!({"ipv4": format!("10.{}.0.0/24", 100 + i), "perNodeHostBits": 8});
        create_cluster_cidr(&sb, &format!("a{i:02}"), spec).await;
    }
    create_cluster_cidr(
        &sb,
        "q",
        json!({"ipv4": "10.201.0.0/24", "perNodeHostBits": 8}),
    )
    .await;
    assert_cluster_cidr(&sb, "q", "refused: Invalid", |o| {
        condition_is(o, "Invalid", "True")
    })
    .await;
    delete_cluster_cidr(&sb, "grow").await;
    strip_finalizers(&sb, "grow").await;
    assert_cluster_cidr(&sb, "grow", "gone without its finalizer", |o| o.is_none()).await;
    // Refused too (64 sets): a round after `grow` went decided `q` (and sent any event it
    // wanted) before writing `zz`'s status. Gone again before a set is freed.
    cluster_cidr_writer_passed(&sb, "zz-sentinel", "10.250.0.0/24").await;
    delete_sentinel(&sb, "zz-sentinel").await;
    // Offered to the allocator every round while refused, announced once (a series counts
    // repeats of one event).
    let announced: u64 = sb
        .events()
        .iter()
        .filter(|e| e["reason"] == "ClusterCIDRInvalid" && e["regarding"]["name"] == "q")
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum();
    assert_eq!(announced, 1, "{:?}", sb.events());
    for name in &holders {
        sb.delete_node(name).unwrap();
    }
    assert_cluster_cidr(
        &sb,
        "q",
        "stays refused though the set it waits for is free",
        |o| has_finalizer(o) && condition_is(o, "Invalid", "False"),
    )
    .await;
    let _ = running.stop().await;
    assert_no_cidr_handed_out_twice(&sb);
}
