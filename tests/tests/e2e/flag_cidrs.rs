//! Several cluster CIDRs per family (issue 18 §1), end to end on the sandbox with a real fixture
//! (05: four AWS Nodes without podCIDRs):
//! - appending a cluster CIDR and restarting keeps every podCIDR (no PATCH for a Node that has
//!   them) and serves the Nodes that waited with `CIDRNotAvailable` from the new one at once —
//!   dual-stack, the IPv6 blocks all or nothing with the IPv4 ones;
//! - removing a cluster CIDR that Nodes hold never stops the controller: those Nodes keep their
//!   podCIDRs, are skipped with the out-of-range Warning event, and nothing is written to them.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{
    WAIT, all_pod_cidrs, check_end_state, events_with_reason, fast_config, init_tracing, ipam,
    masks, node_patches, pod_cidrs, spawn, unserved,
};
use nodeipam_tests::sandbox::{Sandbox, fixture};

const FIXTURE: &str = "05-aws-4nodes-no-podcidr.json";

/// A dual-stack cluster whose IPv4 range holds two /24s for four Nodes: two are served, two wait
/// with `CIDRNotAvailable` (and get no IPv6 block either: all or nothing). Restarted with a second
/// IPv4 CIDR appended, the two served Nodes are not written to and keep their podCIDRs; the two
/// waiting ones get blocks of the new CIDR, and IPv6 blocks from the one IPv6 CIDR.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appending_a_cluster_cidr_keeps_pod_cidrs_and_serves_the_waiting_nodes() {
    init_tracing();
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    let before = ipam("10.10.0.0/23,fd00:10::/62", "", masks(None, None, Some(64)));
    let first = spawn(&sb, fast_config(before.clone()));
    first.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| {
            unserved(sb).len() == 2
                && events_with_reason(sb, "CIDRNotAvailable")
                    .iter()
                    .map(|(node, _, _)| node.clone())
                    .collect::<std::collections::BTreeSet<_>>()
                    .len()
                    == 2
        })
        .await,
        "expected two Nodes served and two waiting with CIDRNotAvailable: {:?}",
        all_pod_cidrs(&sb)
    );
    let waiting = unserved(&sb);
    let summary = first.stop().await;
    // IPv6 all or nothing: only the two served Nodes hold IPv6 blocks.
    let used: Vec<(String, u32)> = summary
        .pools
        .iter()
        .map(|p| (p.cluster_cidr.to_string(), p.used_blocks))
        .collect();
    assert_eq!(
        used,
        [
            ("10.10.0.0/23".to_owned(), 2),
            ("fd00:10::/62".to_owned(), 2)
        ]
    );
    let held_before: Vec<(String, Vec<String>)> = all_pod_cidrs(&sb)
        .into_iter()
        .filter(|(_, cidrs)| !cidrs.is_empty())
        .collect();
    assert_eq!(held_before.len(), 2);

    sb.clear_requests();
    let after = ipam(
        "10.10.0.0/23,fd00:10::/62,10.20.0.0/23",
        "",
        masks(None, None, Some(64)),
    );
    let second = spawn(&sb, fast_config(after.clone()));
    second.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "the waiting Nodes were not served from the appended CIDR: {:?}",
        all_pod_cidrs(&sb)
    );
    let summary = second.stop().await;

    // 0 PATCHes for the Nodes that had podCIDRs; one (successful) for each waiting Node.
    let patches = node_patches(&sb);
    let mut patched: Vec<&String> = patches.keys().collect();
    patched.sort();
    let mut expected: Vec<&String> = waiting.iter().collect();
    expected.sort();
    assert_eq!(patched, expected, "PATCHes: {patches:?}");
    for (name, cidrs) in &held_before {
        assert_eq!(
            &pod_cidrs(&sb, name),
            cidrs,
            "Node {name} kept its podCIDRs"
        );
    }
    let mut new_v4: Vec<String> = Vec::new();
    for name in &waiting {
        let cidrs = pod_cidrs(&sb, name);
        assert_eq!(cidrs.len(), 2, "Node {name}: {cidrs:?}");
        assert!(cidrs[0].starts_with("10.20."), "Node {name}: {cidrs:?}");
        assert!(cidrs[1].starts_with("fd00:10:"), "Node {name}: {cidrs:?}");
        new_v4.push(cidrs[0].clone());
    }
    new_v4.sort();
    assert_eq!(new_v4, ["10.20.0.0/24", "10.20.1.0/24"]);
    // One pool row per cluster CIDR, flag order.
    let used: Vec<(String, u32, u32)> = summary
        .pools
        .iter()
        .map(|p| (p.cluster_cidr.to_string(), p.capacity_blocks, p.used_blocks))
        .collect();
    assert_eq!(
        used,
        [
            ("10.10.0.0/23".to_owned(), 2, 2),
            ("fd00:10::/62".to_owned(), 4, 4),
            ("10.20.0.0/23".to_owned(), 2, 2)
        ]
    );
    check_end_state(&sb, &after, &[], &summary);
}

/// Four Nodes served from two IPv4 CIDRs; restarted with the first removed (and another
/// appended): the Nodes holding blocks of the removed CIDR keep them, are skipped with one
/// `PodCIDROutOfRange` Warning event naming both remaining CIDRs, nothing is written to any
/// Node, and the controller keeps running (no crash loop).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_cluster_cidr_that_nodes_hold_never_crash_loops() {
    init_tracing();
    let sb = Sandbox::start(fixture(FIXTURE)).await;
    let before = ipam("10.10.0.0/23,10.20.0.0/23", "", masks(None, None, None));
    let first = spawn(&sb, fast_config(before.clone()));
    first.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let summary = first.stop().await;
    check_end_state(&sb, &before, &[], &summary);
    let held_before = all_pod_cidrs(&sb);
    let orphans: Vec<String> = held_before
        .iter()
        .filter(|(_, cidrs)| cidrs[0].starts_with("10.10."))
        .map(|(name, _)| name.clone())
        .collect();
    assert_eq!(orphans.len(), 2, "{held_before:?}");

    sb.clear_requests();
    let after = ipam("10.20.0.0/23,10.30.0.0/24", "", masks(None, None, None));
    let second = spawn(&sb, fast_config(after.clone()));
    second.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| events_with_reason(sb, "PodCIDROutOfRange").len()
            >= 2)
            .await,
        "no out-of-range events: {:?}",
        sb.events()
    );
    assert!(!second.is_finished(), "the controller stopped");
    let summary = second.stop().await;
    let mut events = events_with_reason(&sb, "PodCIDROutOfRange");
    events.sort();
    let named: Vec<&String> = events.iter().map(|(node, _, _)| node).collect();
    assert_eq!(named, orphans.iter().collect::<Vec<_>>());
    for (node, kind, note) in &events {
        assert_eq!(kind, "Warning");
        let cidr = &held_before.iter().find(|(n, _)| n == node).unwrap().1[0];
        assert!(
            note.contains(&format!(
                "{cidr} is outside all 2 IPv4 cluster CIDRs (10.20.0.0/23, 10.30.0.0/24)"
            )),
            "{note}"
        );
    }
    assert!(node_patches(&sb).is_empty(), "{:?}", node_patches(&sb));
    assert_eq!(
        all_pod_cidrs(&sb),
        held_before,
        "every Node keeps its podCIDRs"
    );
    let orphans: Vec<&str> = orphans.iter().map(String::as_str).collect();
    check_end_state(&sb, &after, &orphans, &summary);
}
