//! Late writes: the API server answers a PATCH with a timeout (or drops the connection) and
//! applies it a moment later — as kube-apiserver may, since a request keeps running after its
//! client gave up. Every state the server passes through is checked ([`OverlapMonitor`]).
//!
//! The pool is arranged so that the write in doubt holds the only free block and another Node is
//! waiting for one. The controller before this change re-read the Node after the timeout, saw no
//! podCIDRs, released the block and gave it to the waiting Node a millisecond later; when the late
//! write landed, two Nodes held one CIDR (the monitor's violation). Now the block stays reserved
//! until the outcome is definite, and the same CIDRs are sent again.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, check_end_state, events_with_reason, fast_config, init_tracing, ipam,
    late_write_first_patch, late_write_then_hang, masks, node_event_count, node_like, node_patches,
    pod_cidrs, spawn, unserved,
};
use nodeipam::reasons;
use nodeipam_tests::monitor::OverlapMonitor;
use nodeipam_tests::sandbox::{
    FaultAction, FaultRule, LateAnswer, LateWriteOutcome, Resource, Sandbox, SandboxHandle, Verb,
    fixture,
};
use serde_json::{Value, json};

const AWS: &str = "05-aws-4nodes-no-podcidr.json";
/// Holds the first of the two blocks from the start (a real Node of fixture 05, with a podCIDR).
const KEPT: &str = "kept";
/// Its PATCH is answered early and applied late.
const LATE: &str = "late";
/// Waits for a block.
const WAITING: &str = "waiting";
/// Created once everything settled, to mark that the dispatcher got past what came before.
const SENTINEL: &str = "zz-sentinel";

/// 10.30.0.0/23 in /24s: two blocks. KEPT holds 10.30.0.0/24, so 10.30.1.0/24 is the only one
/// left; LATE comes before WAITING in the queue (names in order), so LATE gets it and WAITING
/// waits for a block from the start.
fn sandbox_nodes(names: &[&str]) -> Value {
    let template = fixture(AWS)["items"][1].clone();
    let mut kept = node_like(&template, KEPT);
    kept["spec"]["podCIDR"] = json!("10.30.0.0/24");
    kept["spec"]["podCIDRs"] = json!(["10.30.0.0/24"]);
    let mut items = vec![kept];
    items.extend(names.iter().map(|n| node_like(&template, n)));
    json!({"kind": "NodeList", "apiVersion": "v1", "items": items})
}

fn late_write_outcomes(sb: &SandboxHandle, name: &str) -> Vec<Option<LateWriteOutcome>> {
    sb.requests_of(Verb::Patch, Resource::Nodes)
        .into_iter()
        .filter(|r| r.name.as_deref() == Some(name))
        .map(|r| r.late_write)
        .collect()
}

/// The write in doubt is answered (timeout or a dropped connection) long before it is applied;
/// meanwhile another Node needs a block and the pool has none but that one.
async fn late_write_never_gives_its_block_to_another_node(answer: LateAnswer) {
    init_tracing();
    let sb = Sandbox::start(sandbox_nodes(&[LATE, WAITING])).await;
    let monitor = OverlapMonitor::attach(&sb);
    let ipam = ipam("10.30.0.0/23", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    // The server applies the write 1.5 s after it arrived: within the request's own deadline
    // (the request timeout, which every PATCH sends as `timeout=`), as a real server can.
    config.request_timeout = Duration::from_secs(2);
    // LATE's own retry comes well after WAITING could have taken a released block (a released
    // block wakes the waiting Nodes at once): the schedule in which the old controller handed the
    // block out twice.
    config.retry_min_delay = Duration::from_millis(400);
    config.retry_max_delay = Duration::from_secs(1);
    late_write_first_patch(&sb, LATE, Duration::from_millis(1500), answer);
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().is_empty())
            .await,
        "the late-write fault never fired"
    );

    // LATE ends with the block it was given; WAITING waits (the pool is full) and says why.
    assert!(
        sb.wait_until(WAIT, |sb| {
            pod_cidrs(sb, LATE) == ["10.30.1.0/24"]
                && !events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE).is_empty()
                && late_write_outcomes(sb, LATE)
                    .iter()
                    .all(|o| !matches!(o, Some(LateWriteOutcome::Pending)))
        })
        .await,
        "LATE {:?}, WAITING {:?}, late writes {:?}",
        pod_cidrs(&sb, LATE),
        pod_cidrs(&sb, WAITING),
        late_write_outcomes(&sb, LATE)
    );
    // A Node created now waits too (the pool is full): its CIDRNotAvailable means the dispatcher
    // decided it, so it decided before it LATE's last update (on the watch before SENTINEL's
    // creation) and any WAITING woken by a block freed (woken Nodes go to the urgent lane,
    // served first). The allocator's holdings at stop show such a decision, however late its
    // PATCH would arrive.
    sb.create_node(node_like(&fixture(AWS)["items"][1], SENTINEL))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| node_event_count(
            sb,
            SENTINEL,
            reasons::CIDR_NOT_AVAILABLE
        ) > 0)
            .await,
        "{SENTINEL} not decided: {:?}",
        pod_cidrs(&sb, SENTINEL)
    );
    monitor.assert_clean();
    assert_eq!(unserved(&sb), [WAITING, SENTINEL]);
    assert_eq!(pod_cidrs(&sb, KEPT), ["10.30.0.0/24"]);
    let sent: Vec<Value> = node_patches(&sb)[LATE]
        .iter()
        .map(|(_, body)| body.as_ref().unwrap()["spec"]["podCIDRs"].clone())
        .collect();
    assert!(
        sent.iter().all(|c| *c == json!(["10.30.1.0/24"])),
        "LATE was only ever sent its own block: {sent:?}"
    );
    assert!(
        !node_patches(&sb).contains_key(WAITING),
        "WAITING was never sent a block"
    );
    let summary = controller.stop().await;
    assert_eq!(summary.pools[0].used_blocks, 2);
    assert_eq!(
        summary.held.get(WAITING),
        None,
        "nothing is reserved for WAITING"
    );
    monitor.assert_clean();
    sb.shutdown().await;
}

#[tokio::test]
async fn late_write_after_a_timeout_never_gives_its_block_to_another_node() {
    late_write_never_gives_its_block_to_another_node(LateAnswer::Timeout {
        after: Duration::from_millis(100),
    })
    .await;
}

#[tokio::test]
async fn late_write_after_a_dropped_connection_never_gives_its_block_to_another_node() {
    late_write_never_gives_its_block_to_another_node(LateAnswer::DropConnection).await;
}

/// The Node the write in doubt was for is deleted and re-created under the same name before the
/// write is applied. The write names the old object's uid, so the server refuses it (422) on the
/// new object; the new object gets its own allocation and the old block is free again.
#[tokio::test]
async fn late_write_cannot_land_on_a_recreated_node_of_the_same_name() {
    init_tracing();
    let sb = Sandbox::start(sandbox_nodes(&[LATE])).await;
    let monitor = OverlapMonitor::attach(&sb);
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.request_timeout = Duration::from_secs(2);
    late_write_first_patch(
        &sb,
        LATE,
        Duration::from_millis(1500),
        LateAnswer::DropConnection,
    );
    // Hold every later PATCH of LATE until the late write has had its turn, so the re-created
    // object is still without podCIDRs when the late write is applied.
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            100,
            FaultAction::Delay(Duration::from_millis(2500)),
        )
        .named(LATE),
    );
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| !late_write_outcomes(sb, LATE).is_empty())
            .await
    );
    let old_uid = sb.node(LATE).unwrap()["metadata"]["uid"].clone();
    sb.delete_node(LATE).unwrap();
    let template = fixture(AWS)["items"][1].clone();
    sb.create_node(node_like(&template, LATE)).unwrap();
    let new_uid = sb.node(LATE).unwrap()["metadata"]["uid"].clone();
    assert_ne!(old_uid, new_uid);
    sb.clear_faults();

    assert!(
        sb.wait_until(WAIT, |sb| {
            !pod_cidrs(sb, LATE).is_empty()
                && matches!(
                    late_write_outcomes(sb, LATE).first(),
                    Some(Some(LateWriteOutcome::Failed { .. }))
                )
        })
        .await,
        "late writes {:?}, LATE {:?}",
        late_write_outcomes(&sb, LATE),
        pod_cidrs(&sb, LATE)
    );
    match late_write_outcomes(&sb, LATE).first() {
        Some(Some(LateWriteOutcome::Failed { code, message, .. })) => {
            assert_eq!(*code, 422, "{message}");
            assert!(message.contains("metadata.uid"), "{message}");
        }
        other => panic!("the late write was not refused: {other:?}"),
    }
    let summary = controller.stop().await;
    monitor.assert_clean();
    // The old object's block went back to the pool; the new object holds exactly one.
    assert_eq!(summary.pools[0].used_blocks, 2, "{summary:?}");
    sb.shutdown().await;
}

/// A controller is killed (`kill -9`: its task aborted) while its PATCH of LATE is held by the
/// server, which applies it 1.5 s after it arrived — within its deadline (`timeout=2s`). A second
/// controller starts at once, without leader election, so it waits one request timeout (2 s)
/// before it writes. Found by the chaos suite (seed 2): the second controller listed the Nodes at
/// once, saw LATE without podCIDRs, and reserved LATE's block for another Node (`another` comes
/// first in the queue); when the late write landed before the fence, the block was already the
/// other Node's, and it was PATCHed there after the fence: two Nodes with one CIDR. Now nothing is
/// listed (so nothing is allocated) before the fence.
#[tokio::test]
async fn a_restarted_controller_does_not_allocate_before_its_start_up_fence() {
    init_tracing();
    let sb = Sandbox::start(sandbox_nodes(&[LATE])).await;
    let monitor = OverlapMonitor::attach(&sb);
    let ipam = ipam("10.30.0.0/22", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.request_timeout = Duration::from_secs(2);
    // Its re-sends hang until the kill, so LATE still has no podCIDRs then.
    late_write_then_hang(&sb, LATE, Duration::from_millis(1500));
    let first = spawn(&sb, config.clone());
    assert!(
        sb.wait_until(WAIT, |sb| late_write_outcomes(sb, LATE).len() >= 2)
            .await,
        "the first controller never sent its PATCH twice"
    );
    first.abort().await;
    sb.clear_faults();
    assert!(pod_cidrs(&sb, LATE).is_empty());
    // A Node that sorts before LATE, so the second controller reconciles it first.
    let template = fixture(AWS)["items"][1].clone();
    sb.create_node(node_like(&template, "another")).unwrap();
    // As `ControllerConfig::from_flags` does without leader election.
    config.startup_write_fence = config.request_timeout;
    let second = spawn(&sb, config);
    assert!(
        sb.wait_until(WAIT, |sb| {
            !pod_cidrs(sb, LATE).is_empty() && !pod_cidrs(sb, "another").is_empty()
        })
        .await,
        "LATE {:?}, another {:?}",
        pod_cidrs(&sb, LATE),
        pod_cidrs(&sb, "another")
    );
    let summary = second.stop().await;
    monitor.assert_clean();
    assert_eq!(
        pod_cidrs(&sb, LATE),
        ["10.30.1.0/24"],
        "the late write landed"
    );
    check_end_state(&sb, &ipam, &[], &summary);
    sb.shutdown().await;
}
