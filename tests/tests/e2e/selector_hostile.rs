//! `--node-selector` against hostile Nodes (the hostile tester's pass over issue 21), the real
//! controller against the sandbox, real Nodes from `fixtures/nodes/`: the AKS kubenet Nodes
//! (10.244.0.0/24–10.244.2.0/24) belong to another CNI, the AWS Nodes (no podCIDRs) are ours.
//!
//! - unselected Nodes with garbage, duplicate and out-of-range podCIDRs: no event, no write, and
//!   what they hold inside the cluster CIDR is never handed out;
//! - a Node leaves the selection while its PATCH keeps failing (500, outcome unknown): the
//!   writes stop once the controller sees the label, and the block it may still get stays
//!   reserved;
//! - a Node deleted and re-created under the same name, unselected → selected and selected →
//!   unselected;
//! - a restart after a SIGTERM-like stop and after an abort (kill -9 of the task): the next
//!   controller occupies the unselected Nodes' blocks before handing any out.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::{
    WAIT, fast_config, init_tracing, ipam, labelled, labelled_items, masks, node_event_count,
    node_like, node_patches, pod_cidrs, spawn, template_node,
};
use nodeipam::labels::NodeSelector;
use nodeipam::node_pools::{NodePools, Sizing};
use nodeipam_core::IpamConfig;
use nodeipam_tests::invariants::name_of;
use nodeipam_tests::sandbox::{FaultAction, FaultRule, PatchType, Resource, Sandbox, Verb};
use serde_json::{Value, json};

const AKS: &str = "03-aks-kubenet-3nodes.json";
const AWS: &str = "05-aws-4nodes-no-podcidr.json";
const KEY: &str = "example.com/cni";
/// The reason of the event a decision that gives a Node no block emits.
const NOT_AVAILABLE: &str = nodeipam::reasons::CIDR_NOT_AVAILABLE;

fn with_pod_cidrs(mut node: Value, cidrs: &[&str]) -> Value {
    node["spec"]["podCIDR"] = json!(cidrs[0]);
    node["spec"]["podCIDRs"] = json!(cidrs);
    node
}

fn relabel(cni: &str) -> Value {
    json!({"metadata": {"labels": {KEY: cni}}})
}

fn patch_count(sb: &nodeipam_tests::sandbox::SandboxHandle, name: &str) -> usize {
    node_patches(sb).get(name).map_or(0, Vec::len)
}

/// Every live Node's podCIDRs, by CIDR: the Nodes holding it.
fn holders(sb: &nodeipam_tests::sandbox::SandboxHandle) -> BTreeMap<String, BTreeSet<String>> {
    let mut out: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for node in sb.nodes() {
        for cidr in node["spec"]["podCIDRs"].as_array().into_iter().flatten() {
            out.entry(cidr.as_str().unwrap_or_default().to_owned())
                .or_default()
                .insert(name_of(&node));
        }
    }
    out
}

/// No CIDR the controller wrote is held by two live Nodes.
fn assert_written_cidrs_unique(sb: &nodeipam_tests::sandbox::SandboxHandle) {
    let holders = holders(sb);
    for (name, patches) in node_patches(sb) {
        for (status, body) in patches {
            if status != Some(200) {
                continue;
            }
            let sent = body
                .as_ref()
                .and_then(|b| b["spec"]["podCIDRs"].as_array().cloned());
            for cidr in sent.into_iter().flatten() {
                let cidr = cidr.as_str().unwrap_or_default();
                let held = holders.get(cidr).cloned().unwrap_or_default();
                assert!(
                    held.len() <= 1,
                    "{cidr} written to {name} is held by {held:?}"
                );
            }
        }
    }
}

#[tokio::test]
async fn hostile_nodes_around_the_selection() {
    init_tracing();
    let aks: Vec<Value> = labelled_items(AKS, KEY, "kubenet");
    let aws: Vec<Value> = labelled_items(AWS, KEY, "overlay");
    let template = template_node(AWS);
    let mut nodes = aks.clone();
    nodes.extend(aws.clone());
    // Unselected Nodes with podCIDRs no controller of ours would accept.
    let dup_of = aks[0]["spec"]["podCIDRs"][0].as_str().unwrap().to_owned();
    nodes.push(with_pod_cidrs(
        labelled(node_like(&template, "kubenet-garbage"), KEY, "kubenet"),
        &["not-a-cidr"],
    ));
    nodes.push(with_pod_cidrs(
        labelled(node_like(&template, "kubenet-dup"), KEY, "kubenet"),
        &[&dup_of],
    ));
    nodes.push(with_pod_cidrs(
        labelled(node_like(&template, "kubenet-outside"), KEY, "kubenet"),
        &["192.168.7.0/24"],
    ));
    nodes.push(with_pod_cidrs(
        labelled(node_like(&template, "kubenet-hostbits"), KEY, "kubenet"),
        &["10.244.3.7/24"],
    ));
    nodes.sort_by_key(name_of);
    let unselected: Vec<String> = nodes
        .iter()
        .filter(|n| n["metadata"]["labels"][KEY] == "kubenet")
        .map(name_of)
        .collect();
    let sb = Sandbox::start(
        json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}),
    )
    .await;
    let config = || {
        let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
        let mut config = fast_config(ipam.clone());
        config.sizing = selecting(&ipam);
        config
    };
    let controller = spawn(&sb, config());
    controller.wait_allocating(&sb).await;
    let aws_names: Vec<String> = aws.iter().map(name_of).collect();
    assert!(
        sb.wait_until(WAIT, |sb| aws_names
            .iter()
            .all(|n| !pod_cidrs(sb, n).is_empty()))
            .await
    );
    // 10.244.0–2 (AKS) and 10.244.3.0/24 (host bits, read as ParseCIDR's network) are held.
    for name in &aws_names {
        for cidr in pod_cidrs(&sb, name) {
            assert!(
                ![
                    "10.244.0.0/24",
                    "10.244.1.0/24",
                    "10.244.2.0/24",
                    "10.244.3.0/24"
                ]
                .contains(&cidr.as_str()),
                "{name} got {cidr}"
            );
        }
    }

    // Leaves the selection while its PATCH fails with an unknown outcome.
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1000, FaultAction::Status(500))
            .named("mid-write"),
    );
    sb.create_node(labelled(node_like(&template, "mid-write"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| patch_count(sb, "mid-write") >= 2)
            .await
    );
    sb.patch_node("mid-write", PatchType::Merge, &relabel("kubenet"))
        .unwrap();
    // What it was sent (and may still get) is not handed to the next Node.
    let sent: Vec<String> =
        node_patches(&sb)["mid-write"][0].1.as_ref().unwrap()["spec"]["podCIDRs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c.as_str().unwrap().to_owned())
            .collect();
    // Pacing, kept: a write in flight lands before the count (too short a wait can only fail the
    // check below, not pass it).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let writes_when_seen = patch_count(&sb, "mid-write");
    sb.create_node(labelled(node_like(&template, "after-mid"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "after-mid").is_empty())
            .await
    );
    assert_ne!(pod_cidrs(&sb, "after-mid"), sent);
    // Kept: `after-mid` served shows the relabel was decided, but what this guards against is a
    // later retry of `mid-write` writing; decided right, that retry leaves no trace to wait for.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        patch_count(&sb, "mid-write"),
        writes_when_seen,
        "written after leaving the selection"
    );
    sb.clear_faults();

    // Re-created under the same name: an unselected Node with a block comes back selected and
    // without podCIDRs (served: a fresh block), a selected one comes back unselected (never written).
    let aks0 = name_of(&aks[0]);
    sb.delete_node(&aks0).unwrap();
    sb.create_node(labelled(node_like(&aks[0], &aks0), KEY, "overlay"))
        .unwrap();
    let first_aws = aws_names[0].clone();
    let before = patch_count(&sb, &first_aws);
    sb.delete_node(&first_aws).unwrap();
    sb.create_node(labelled(node_like(&aws[0], &first_aws), KEY, "kubenet"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, &aks0).is_empty())
            .await
    );
    // kubenet-dup still holds the AKS Node's old block: it is not handed out again.
    assert_ne!(pod_cidrs(&sb, &aks0), std::slice::from_ref(&dup_of));
    let _ = controller.stop().await;

    // Restarts: after a stop, and after an abort; each time a new Node is served beside the
    // unselected holders.
    let controller = spawn(&sb, config());
    controller.wait_allocating(&sb).await;
    sb.create_node(labelled(node_like(&template, "after-stop"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "after-stop").is_empty())
            .await
    );
    controller.abort().await;
    let controller = spawn(&sb, config());
    controller.wait_allocating(&sb).await;
    sb.create_node(labelled(node_like(&template, "after-kill"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "after-kill").is_empty())
            .await
    );
    let _ = controller.stop().await;

    assert_eq!(
        patch_count(&sb, &first_aws),
        before,
        "the re-created unselected Node was written"
    );
    assert!(pod_cidrs(&sb, &first_aws).is_empty());
    for name in &unselected {
        if *name != aks0 {
            assert_eq!(patch_count(&sb, name), 0, "unselected {name} was written");
        }
    }
    let regarding: BTreeSet<String> = sb
        .events()
        .iter()
        .filter_map(|e| e["regarding"]["name"].as_str().map(str::to_owned))
        .collect();
    // (mid-write had its failed-write event while it was selected.)
    for name in unselected.iter().chain([first_aws.clone()].iter()) {
        if *name != aks0 {
            assert!(!regarding.contains(name), "event about unselected {name}");
        }
    }
    assert_written_cidrs_unique(&sb);
    // Held only by kubenet-dup and the old AKS Node before; now only kubenet-dup.
    assert_eq!(
        holders(&sb)[&dup_of],
        BTreeSet::from(["kubenet-dup".to_owned()])
    );
    // (After a restart mid-write's block is free again: its write never ran.)
    assert_ne!(pod_cidrs(&sb, "after-mid"), sent);
}

/// On a full pool (10.244.0.0/22: four /24s), the blocks a selected waiting Node would get next
/// are held by unselected Nodes: a duplicate holder (the AKS Node's block, still held by
/// `kubenet-dup` after the AKS Node is deleted) and a Node that left the selection while its
/// write was in doubt. The waiting Node gets a block only when its last holder is deleted.
#[tokio::test]
async fn a_waiting_node_never_gets_a_block_an_unselected_node_holds() {
    init_tracing();
    let aks: Vec<Value> = labelled_items(AKS, KEY, "kubenet");
    let template = template_node(AWS);
    let dup_of = aks[0]["spec"]["podCIDRs"][0].as_str().unwrap().to_owned();
    let mut nodes = aks.clone();
    nodes.push(with_pod_cidrs(
        labelled(node_like(&template, "kubenet-dup"), KEY, "kubenet"),
        &[&dup_of],
    ));
    nodes.push(labelled(node_like(&template, "m"), KEY, "overlay"));
    nodes.sort_by_key(name_of);
    let sb = Sandbox::start(
        json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": nodes}),
    )
    .await;
    sb.inject(
        FaultRule::new(Verb::Patch, Resource::Nodes, 1000, FaultAction::Status(500)).named("m"),
    );
    let ipam = ipam("10.244.0.0/22", "", masks(None, None, None));
    let mut config = fast_config(ipam.clone());
    config.sizing = selecting(&ipam);
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(sb.wait_until(WAIT, |sb| patch_count(sb, "m") >= 2).await);
    let sent = node_patches(&sb)["m"][0].1.as_ref().unwrap()["spec"]["podCIDRs"].clone();
    assert_eq!(sent, json!(["10.244.3.0/24"]));
    sb.patch_node("m", PatchType::Merge, &relabel("kubenet"))
        .unwrap();
    // Pacing, kept: a write in flight lands before the count (too short a wait can only fail the
    // test below, not pass it; that check runs after the controller stopped).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let m_writes = patch_count(&sb, "m");

    sb.create_node(labelled(node_like(&template, "w"), KEY, "overlay"))
        .unwrap();
    // Its CIDRNotAvailable is what the decision on `w` emits when it gives no block: decided.
    assert!(
        sb.wait_until(WAIT, |sb| node_event_count(sb, "w", NOT_AVAILABLE) > 0)
            .await
    );
    assert!(pod_cidrs(&sb, "w").is_empty(), "{:?}", pod_cidrs(&sb, "w"));
    // The AKS Node goes; kubenet-dup still holds its block.
    sb.delete_node(&name_of(&aks[0])).unwrap();
    // The deletion is queued before `probe` (one watch, in order) in the urgent lane, served
    // first: `probe`'s CIDRNotAvailable means the deletion was decided. One event task publishes
    // in decision order, so a `w` event after that one was decided after the deletion.
    sb.create_node(labelled(node_like(&template, "probe"), KEY, "overlay"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| node_event_count(sb, "probe", NOT_AVAILABLE) > 0)
            .await
    );
    let seen = node_event_count(&sb, "w", NOT_AVAILABLE);
    assert!(
        sb.wait_until(WAIT, |sb| node_event_count(sb, "w", NOT_AVAILABLE) > seen)
            .await,
        "w not decided again: {:?}",
        pod_cidrs(&sb, "w")
    );
    assert!(pod_cidrs(&sb, "w").is_empty(), "{:?}", pod_cidrs(&sb, "w"));
    sb.delete_node("probe").unwrap();
    sb.delete_node("kubenet-dup").unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "w").is_empty())
            .await
    );
    assert_eq!(pod_cidrs(&sb, "w"), std::slice::from_ref(&dup_of));
    // m's block (its write may still land) waits for m's deletion.
    sb.create_node(labelled(node_like(&template, "w2"), KEY, "overlay"))
        .unwrap();
    // Decided (its CIDRNotAvailable), as for `w`.
    assert!(
        sb.wait_until(WAIT, |sb| node_event_count(sb, "w2", NOT_AVAILABLE) > 0)
            .await
    );
    assert!(
        pod_cidrs(&sb, "w2").is_empty(),
        "{:?}",
        pod_cidrs(&sb, "w2")
    );
    sb.delete_node("m").unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "w2").is_empty())
            .await
    );
    assert_eq!(pod_cidrs(&sb, "w2"), ["10.244.3.0/24"]);
    let _ = controller.stop().await;
    assert_eq!(
        patch_count(&sb, "m"),
        m_writes,
        "m written after leaving the selection"
    );
    for node in &aks {
        assert_eq!(patch_count(&sb, &name_of(node)), 0);
    }
    assert_eq!(patch_count(&sb, "kubenet-dup"), 0);
    assert_written_cidrs_unique(&sb);
}

/// The sizing of `ipam` with `--node-selector` set to `KEY=overlay` (as `main` builds it).
fn selecting(ipam: &IpamConfig) -> Sizing {
    NodePools {
        node_selector: NodeSelector::parse(&format!("{KEY}=overlay")).unwrap(),
        ..NodePools::default()
    }
    .sizing(ipam)
    .unwrap()
}
