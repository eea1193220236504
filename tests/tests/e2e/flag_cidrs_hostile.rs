//! Several cluster CIDRs per family (issue 18 §1) against a hostile operator, end to end on the
//! sandbox with a real fixture (05: four AWS Nodes without podCIDRs):
//! - `--cluster-cidr` re-ordered between restarts, a CIDR inserted in the middle, a CIDR removed
//!   and put back: nothing is written to a Node that has podCIDRs, every pool row counts its
//!   Nodes again, and no block is handed out twice;
//! - `kill -9` with a PATCH from the second cluster CIDR in flight (applied after the kill), then
//!   a restart with the CIDRs in the other order: the block the dead controller wrote is not
//!   handed to another Node.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::time::Duration;

use common::{
    WAIT, all_pod_cidrs, assert_no_cidr_handed_out_twice, check_end_state, fast_config,
    init_tracing, ipam, late_write_then_hang, masks, node_like, node_patches, pod_cidrs, spawn,
    spawn_as, template_node, unserved,
};
use nodeipam::controller::RunSummary;
use nodeipam_tests::sandbox::{Sandbox, SandboxHandle, fixture};

const FIXTURE: &str = "05-aws-4nodes-no-podcidr.json";

/// `(cluster CIDR, used blocks)` per pool row of a run, flag order.
fn pool_rows(summary: &RunSummary) -> Vec<(String, u32)> {
    summary
        .pools
        .iter()
        .map(|p| (p.cluster_cidr.to_string(), p.used_blocks))
        .collect()
}

/// Runs the controller on `cluster` until it is ready and has had time to act, stops it, and
/// returns its summary; asserts that it wrote to no Node.
async fn restart_writes_nothing(sb: &SandboxHandle, cluster: &str) -> RunSummary {
    sb.clear_requests();
    let config = ipam(cluster, "", masks(None, None, None));
    let running = spawn(sb, fast_config(config.clone()));
    running.wait_allocating(sb).await;
    let summary = running.stop().await;
    assert!(
        node_patches(sb).is_empty(),
        "--cluster-cidr={cluster}: PATCHes {:?}",
        node_patches(sb)
    );
    let orphans: Vec<String> = all_pod_cidrs(sb)
        .into_iter()
        .filter(|(_, cidrs)| {
            !cidrs.iter().any(|c| {
                config.cluster_cidrs.iter().any(|cc| {
                    nodeipam_core::Cidr::parse(c).is_ok_and(|c| cc.cluster_cidr.contains(&c))
                })
            })
        })
        .map(|(name, _)| name)
        .collect();
    let orphans: Vec<&str> = orphans.iter().map(String::as_str).collect();
    check_end_state(sb, &config, &orphans, &summary);
    summary
}

/// Four Nodes served from 10.10.0.0/23 and 10.20.0.0/23 (two each). Then restarts with: the
/// order reversed; a CIDR inserted in the middle; the first CIDR removed (its two Nodes out of
/// range); the first CIDR back. No restart writes to a Node, each counts every Node in the pool
/// that holds its block, and the Node added last is served from a block nobody holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reordered_inserted_removed_and_returned_cidrs_move_nothing() {
    init_tracing();
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    let start = ipam("10.10.0.0/23,10.20.0.0/23", "", masks(None, None, None));
    let first = spawn(&sb, fast_config(start.clone()));
    first.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let summary = first.stop().await;
    check_end_state(&sb, &start, &[], &summary);
    let held = all_pod_cidrs(&sb);

    let reversed = restart_writes_nothing(&sb, "10.20.0.0/23,10.10.0.0/23").await;
    assert_eq!(
        pool_rows(&reversed),
        [
            ("10.20.0.0/23".to_owned(), 2),
            ("10.10.0.0/23".to_owned(), 2)
        ]
    );
    let inserted = restart_writes_nothing(&sb, "10.10.0.0/23,10.15.0.0/24,10.20.0.0/23").await;
    assert_eq!(
        pool_rows(&inserted),
        [
            ("10.10.0.0/23".to_owned(), 2),
            ("10.15.0.0/24".to_owned(), 0),
            ("10.20.0.0/23".to_owned(), 2)
        ]
    );
    let removed = restart_writes_nothing(&sb, "10.20.0.0/23").await;
    assert_eq!(pool_rows(&removed), [("10.20.0.0/23".to_owned(), 2)]);
    let returned = restart_writes_nothing(&sb, "10.20.0.0/23,10.10.0.0/23").await;
    assert_eq!(
        pool_rows(&returned),
        [
            ("10.20.0.0/23".to_owned(), 2),
            ("10.10.0.0/23".to_owned(), 2)
        ]
    );
    assert_eq!(all_pod_cidrs(&sb), held, "every Node keeps its podCIDRs");

    // With every block of both CIDRs held, a new Node waits; with a third CIDR it gets that one.
    sb.create_node(node_like(&template_node(FIXTURE), "newcomer"))
        .unwrap();
    sb.clear_requests();
    let last = ipam(
        "10.20.0.0/23,10.10.0.0/23,10.30.0.0/24",
        "",
        masks(None, None, None),
    );
    let running = spawn(&sb, fast_config(last.clone()));
    running.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let summary = running.stop().await;
    assert_eq!(pod_cidrs(&sb, "newcomer"), ["10.30.0.0/24"]);
    assert_eq!(node_patches(&sb).keys().collect::<Vec<_>>(), ["newcomer"]);
    check_end_state(&sb, &last, &[], &summary);
    sb.shutdown().await;
}

/// The first cluster CIDR full (two Nodes), a third Node's PATCH with a block of the second CIDR
/// is in flight when the controller is killed, and lands after the kill. Restarted with the
/// CIDRs in the other order (the second now first) and one more Node: that Node gets another
/// block of the (now first) CIDR, never the one the dead controller wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_while_allocating_from_the_second_cidr_then_reordered_flags() {
    init_tracing();
    let template = template_node(FIXTURE);
    let sb = Sandbox::start(serde_json::json!({
        "kind": "NodeList", "apiVersion": "v1",
        "items": [node_like(&template, "a"), node_like(&template, "b")],
    }))
    .await;
    let before = ipam("10.10.0.0/23,10.20.0.0/22", "", masks(None, None, None));
    let mut config = fast_config(before.clone());
    config.request_timeout = Duration::from_secs(1);
    let first = spawn_as(&sb, config.clone(), "first");
    first.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    // The third Node's first PATCH is applied 900 ms late (its answer: a dropped connection);
    // every re-send hangs.
    late_write_then_hang(&sb, "late", Duration::from_millis(900));
    sb.create_node(node_like(&template, "late")).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| sb.pending_faults().len() == 1)
            .await,
        "the first controller never sent its PATCH of late"
    );
    first.abort().await;
    sb.clear_faults();
    sb.create_node(node_like(&template, "after")).unwrap();

    let after = ipam("10.20.0.0/22,10.10.0.0/23", "", masks(None, None, None));
    let mut config = fast_config(after.clone());
    config.request_timeout = Duration::from_secs(1);
    config.startup_write_fence = config.request_timeout;
    let second = spawn_as(&sb, config, "second");
    second.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "{:?}",
        all_pod_cidrs(&sb)
    );
    let summary = second.stop().await;
    assert_eq!(pod_cidrs(&sb, "late"), ["10.20.0.0/24"]);
    assert_eq!(pod_cidrs(&sb, "after"), ["10.20.1.0/24"]);
    assert_no_cidr_handed_out_twice(&sb);
    check_end_state(&sb, &after, &[], &summary);
    assert_eq!(
        pool_rows(&summary),
        [
            ("10.20.0.0/22".to_owned(), 2),
            ("10.10.0.0/23".to_owned(), 2)
        ]
    );
    sb.shutdown().await;
}
