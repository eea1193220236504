//! `--node-selector` end to end: the real controller against the sandbox, serving only the Nodes
//! labelled `example.com/cni=overlay` in a cluster where another CNI (`example.com/cni=kubenet`)
//! owns the others. Real Nodes from `fixtures/nodes/`: the AKS kubenet Nodes, holding
//! 10.244.0.0/24–10.244.2.0/24, are the other CNI's; the AWS Nodes (no podCIDRs) are ours.
//!
//! - no unselected Node is ever PATCHed or gets an event (the sandbox logs every request);
//! - the blocks unselected Nodes hold — at start-up, and written by their CNI while we run — are
//!   never handed to a selected Node;
//! - a Node that leaves the selection keeps its block (no release, no write) until it is
//!   deleted; a Node that enters it is served;
//! - `plan` on the same NodeList predicts the controller's assignments and shows the unselected
//!   Nodes as `ignore`;
//! - `/metrics`: the unselected Nodes are not counted as skipped, and the work duration of the
//!   queue items is observed once Nodes are served. (In the `metrics` binary: it reads the
//!   process's metrics recorder.)
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeSet;

use common::{
    WAIT, assert_no_cidr_handed_out_twice, fast_config, init_tracing, ipam, labelled,
    labelled_items, masks, node_like, node_patches, pod_cidrs, spawn, template_node, used,
};
use nodeipam::labels::NodeSelector;
use nodeipam::node_pools::NodePools;
use nodeipam::plan::plan_with_sizing;
use nodeipam_tests::invariants::name_of;
use nodeipam_tests::sandbox::{PatchType, Sandbox};
use serde_json::{Value, json};

const AKS: &str = "03-aks-kubenet-3nodes.json";
const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const KEY: &str = "example.com/cni";

fn nodelist(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
}

fn relabel(cni: &str) -> Value {
    json!({"metadata": {"labels": {KEY: cni}}})
}

/// The value of the series `series` (name and labels exactly as rendered), if exported.
fn series_value(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

#[tokio::test]
async fn unselected_nodes_are_never_written_and_their_blocks_never_reused() {
    init_tracing();
    let (metrics, _alone) = crate::recorder().await;
    let mut nodes = labelled_items(AKS, KEY, "kubenet");
    nodes.extend(labelled_items(AWS, KEY, "overlay"));
    // Two Nodes of the other CNI that have no podCIDRs yet: never ours to write.
    let aws = template_node(AWS);
    for name in ["kubenet-pending-1", "kubenet-pending-2"] {
        nodes.push(labelled(node_like(&aws, name), KEY, "kubenet"));
    }
    nodes.sort_by_key(name_of);
    let doc = nodelist(nodes);
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let pools = NodePools {
        node_selector: NodeSelector::parse(&format!("{KEY}=overlay")).unwrap(),
        ..NodePools::default()
    };
    let sizing = pools.sizing(&ipam).unwrap();

    let listed = nodeipam::nodelist::parse_nodes(&doc.to_string()).unwrap();
    let predicted = plan_with_sizing(&ipam, sizing.clone(), &listed).unwrap();
    let ignored: BTreeSet<String> = predicted
        .nodes
        .iter()
        .filter(|n| n.action == "ignore")
        .map(|n| n.name.clone())
        .collect();
    assert_eq!(ignored.len(), 5, "{predicted:?}");
    assert!(predicted.all_served());

    let sb = Sandbox::start(doc).await;
    let mut config = fast_config(ipam);
    config.sizing = sizing;
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    let served_now = |sb: &nodeipam_tests::sandbox::SandboxHandle| {
        predicted
            .nodes
            .iter()
            .filter(|n| n.action == "assign")
            .all(|n| !pod_cidrs(sb, &n.name).is_empty())
    };
    assert!(sb.wait_until(WAIT, served_now).await);
    for node in &predicted.nodes {
        if node.action == "assign" {
            assert_eq!(pod_cidrs(&sb, &node.name), node.pod_cidrs, "{}", node.name);
        }
    }
    // The kubenet Nodes' blocks were occupied, not handed out: the AWS Nodes got .3 to .6.
    assert_eq!(used(&controller.health), vec![7]);
    // Served Nodes' queue items were timed; no Node counts as skipped.
    let text = metrics.render();
    let duration = nodeipam::metric_names::WORKQUEUE_WORK_DURATION_SECONDS;
    let timed = series_value(&text, &format!("{duration}_count")).unwrap_or_default();
    assert!(timed >= 4.0, "{duration}_count {timed}:\n{text}");
    assert!(series_value(&text, &format!("{duration}_sum")).is_some_and(|s| s > 0.0));
    assert_eq!(
        series_value(&text, nodeipam::metric_names::SKIPPED_NODES),
        Some(0.0)
    );
    assert!(
        !text.contains(nodeipam::metric_names::SKIPPED_NODES_TOTAL),
        "{text}"
    );

    // A Node of the other CNI written while we run: occupied as soon as it is seen …
    sb.create_node(labelled(
        json!({"apiVersion": "v1", "kind": "Node",
               "metadata": {"name": "kubenet-late", "labels": {}},
               "spec": {"podCIDR": "10.244.7.0/24", "podCIDRs": ["10.244.7.0/24"]}}),
        KEY,
        "kubenet",
    ))
    .unwrap();
    let health = controller.health.clone();
    assert!(sb.wait_until(WAIT, |_| used(&health) == vec![8]).await);
    // … so the next Node of ours skips it (the cursor stands at 10.244.7.0).
    sb.create_node(labelled(node_like(&aws, "overlay-new"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "overlay-new").is_empty())
            .await
    );
    assert_eq!(pod_cidrs(&sb, "overlay-new"), ["10.244.8.0/24"]);

    // A served Node leaves the selection: it keeps its block, nothing is released or written.
    let leaving = "ip-10-1-1-15.eu-central-1.compute.internal";
    let its_block = pod_cidrs(&sb, leaving);
    sb.patch_node(leaving, PatchType::Merge, &relabel("kubenet"))
        .unwrap();
    // An unselected Node without podCIDRs enters it: served like a new Node.
    sb.patch_node("kubenet-pending-1", PatchType::Merge, &relabel("overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "kubenet-pending-1").is_empty())
            .await
    );
    assert_eq!(pod_cidrs(&sb, "kubenet-pending-1"), ["10.244.9.0/24"]);
    assert_eq!(used(&controller.health), vec![10]);
    assert_eq!(pod_cidrs(&sb, leaving), its_block);
    // Its deletion releases, as for any Node.
    sb.delete_node(leaving).unwrap();
    assert!(sb.wait_until(WAIT, |_| used(&health) == vec![9]).await);
    let summary = controller.stop().await;
    assert_eq!(summary.pools[0].used_blocks, 9);

    // Never written: no PATCH, no event for a Node while it was not selected.
    let patched: BTreeSet<String> = node_patches(&sb).into_keys().collect();
    let mut want: BTreeSet<String> = predicted
        .nodes
        .iter()
        .filter(|n| n.action == "assign")
        .map(|n| n.name.clone())
        .collect();
    want.extend(["overlay-new".to_owned(), "kubenet-pending-1".to_owned()]);
    assert_eq!(patched, want);
    let regarding: BTreeSet<String> = sb
        .events()
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str().map(str::to_owned))
        .collect();
    for name in ignored.iter().chain(["kubenet-late".to_owned()].iter()) {
        assert!(!regarding.contains(name), "event about {name}");
    }
    assert_eq!(assert_no_cidr_handed_out_twice(&sb), want.len());
    assert!(pod_cidrs(&sb, "kubenet-pending-2").is_empty());
}
