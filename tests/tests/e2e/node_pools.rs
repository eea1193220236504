//! `--cidr-allocator-type=CloudAllocator` end to end: the real controller against the sandbox,
//! with node-pool rules keyed on the AKS fixture's `agentpool` label
//! (`fixtures/nodes/03-aks-kubenet-3nodes.json`; AKS's node-pool machinery sets it, newer AKS also
//! `kubernetes.azure.com/agentpool`).
//!
//! - mixed pools: the controller's CIDRs equal `plan`'s for the same NodeList and flags, big-pool
//!   Nodes get /23s first fit, small-pool ones /26s, default ones /24s exactly where the range
//!   allocator puts them; a restart with other rules keeps every podCIDR (no PATCH) and `plan`
//!   reports the size mismatches;
//! - exhaustion of large blocks while small ones still fit: `CIDRNotAvailable`, small Nodes keep
//!   being served, the big Node is served once deletions free an aligned /23 (no restart);
//! - mask labels: a Node labelled within the range gets that size, an out-of-range label gets a
//!   `NodeCIDRMaskLabelInvalid` Warning and no PATCH until the label is fixed;
//! - dual-stack (the kind fixture): sizes per family, all or nothing when IPv6 runs out.
//!
//! Each test ends with the invariant check on the grid (mixed sizes), including each sized
//! Node's prefix lengths.
#![allow(clippy::unwrap_used)]

use crate::common;

use std::collections::BTreeMap;

use common::{
    WAIT, events_with_reason, fast_config, init_tracing, ipam, masks, node_like, node_patches,
    pod_cidrs, spawn, template_node, unserved, used, view,
};
use nodeipam::controller::RunSummary;
use nodeipam::node_pools::{LabelRange, MASK_LABEL_IPV4, MaskRule, NodePools, RuleOrigin, Sizing};
use nodeipam::plan::{plan, plan_with_sizing};
use nodeipam::reasons;
use nodeipam_core::IpamConfig;
use nodeipam_tests::invariants::{ClusterSpec, assert_invariants, name_of, pod_cidrs_of};
use nodeipam_tests::sandbox::{PatchType, Sandbox, SandboxHandle, fixture};
use serde_json::{Value, json};

const AKS: &str = "03-aks-kubenet-3nodes.json";

/// Rules as `--node-cidr-mask-size-rule` gives them, in order.
fn rules(texts: &[&str]) -> NodePools {
    NodePools {
        rules: texts
            .iter()
            .enumerate()
            .map(|(i, t)| MaskRule::parse(t, RuleOrigin::Flag { index: i + 1 }).unwrap())
            .collect(),
        ..NodePools::default()
    }
}

/// An AKS fixture Node renamed `name`, without podCIDRs, in node pool `pool` (its `agentpool`
/// label, as AKS sets it).
fn aks_node(name: &str, pool: &str) -> Value {
    let mut node = node_like(&template_node(AKS), name);
    node["metadata"]["labels"]["agentpool"] = json!(pool);
    node
}

/// The checker's view of the configuration: each cluster CIDR on its grid.
fn spec(ipam: &IpamConfig, sizing: &Sizing) -> ClusterSpec {
    let clusters: Vec<(String, u8)> = sizing
        .sets()
        .iter()
        .map(|s| (s.cluster_cidr.to_string(), s.grid_mask))
        .collect();
    let services: Vec<String> = ipam.service_cidrs.iter().map(ToString::to_string).collect();
    let clusters: Vec<(&str, u8)> = clusters.iter().map(|(c, m)| (c.as_str(), *m)).collect();
    let services: Vec<&str> = services.iter().map(String::as_str).collect();
    ClusterSpec::new(&clusters, &services)
}

fn check_end(sb: &SandboxHandle, spec: &ClusterSpec, unservable: &[&str], summary: &RunSummary) {
    assert_invariants(&sb.nodes(), spec, unservable, Some(&view(summary)));
}

fn nodelist(items: Vec<Value>) -> Value {
    json!({"apiVersion": "v1", "kind": "NodeList", "metadata": {}, "items": items})
}

/// Three AKS Nodes with /24s (kept), plus Nodes of three pools without podCIDRs, all listed when
/// the controller starts: it serves them in name order, as `plan` does in list order.
#[tokio::test]
async fn aks_mixed_pools_match_plan_and_survive_a_restart_with_other_rules() {
    init_tracing();
    let mut items: Vec<Value> = fixture(AKS)["items"].as_array().unwrap().clone();
    let pools_of = [
        ("aks-agentpool-11223344-vmss000003", "agentpool"),
        ("aks-agentpool-11223344-vmss000004", "agentpool"),
        ("aks-bigpool-11223344-vmss000000", "bigpool"),
        ("aks-bigpool-11223344-vmss000001", "bigpool"),
        ("aks-small-11223344-vmss000000", "small"),
        ("aks-small-11223344-vmss000001", "small"),
        ("aks-small-11223344-vmss000002", "small"),
    ];
    items.extend(pools_of.iter().map(|(name, pool)| aks_node(name, pool)));
    items.sort_by_key(name_of);
    let doc = nodelist(items);
    let ipam = ipam("10.244.0.0/16", "10.0.0.0/16", masks(None, None, None));
    let pools = rules(&["agentpool=bigpool:ipv4=23", "agentpool=small:ipv4=26"]);
    let sizing = pools.sizing(&ipam).unwrap();

    let nodes = nodeipam::nodelist::parse_nodes(&doc.to_string()).unwrap();
    let predicted = plan_with_sizing(&ipam, sizing.clone(), &nodes).unwrap();
    let predicted: BTreeMap<String, (&str, Vec<String>)> = predicted
        .nodes
        .iter()
        .map(|n| (n.name.clone(), (n.action, n.pod_cidrs.clone())))
        .collect();
    // The default pool lands where the range allocator would put it (same order, same blocks).
    let range = plan(&ipam, &nodes).unwrap();
    for node in range.nodes.iter().filter(|n| n.name.contains("agentpool")) {
        assert_eq!(predicted[&node.name].1, node.pod_cidrs, "{}", node.name);
    }
    let want: BTreeMap<&str, &str> = [
        ("aks-agentpool-11223344-vmss000003", "10.244.3.0/24"),
        ("aks-agentpool-11223344-vmss000004", "10.244.4.0/24"),
        ("aks-bigpool-11223344-vmss000000", "10.244.6.0/23"),
        ("aks-bigpool-11223344-vmss000001", "10.244.8.0/23"),
        // Round-robin from the cursor, which the second default /24 left at 10.244.5.0.
        ("aks-small-11223344-vmss000000", "10.244.5.0/26"),
        ("aks-small-11223344-vmss000001", "10.244.5.64/26"),
        ("aks-small-11223344-vmss000002", "10.244.5.128/26"),
    ]
    .into();
    for (name, cidr) in &want {
        assert_eq!(
            predicted[*name],
            ("assign", vec![(*cidr).to_owned()]),
            "{name}"
        );
    }

    let sb = Sandbox::start(doc).await;
    let mut config = fast_config(ipam.clone());
    config.sizing = sizing.clone();
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "unserved: {:?}",
        unserved(&sb)
    );
    let summary = controller.stop().await;
    for node in sb.nodes() {
        let name = name_of(&node);
        assert_eq!(
            pod_cidrs_of(&node),
            predicted[&name].1,
            "Node {name}: controller vs plan"
        );
    }
    // 3 + 2 existing/default /24s (4 blocks each), 2 /23s (8 each), 3 /26s (1 each).
    assert_eq!(summary.pools[0].node_mask_size, 26);
    assert_eq!(summary.pools[0].used_blocks, 5 * 4 + 2 * 8 + 3);
    let patches = node_patches(&sb);
    assert_eq!(
        patches.len(),
        want.len(),
        "one PATCH per new Node: {patches:?}"
    );
    let mut spec = spec(&ipam, &sizing);
    for (name, pool) in pools_of {
        let size = match pool {
            "bigpool" => 23,
            "small" => 26,
            _ => 24,
        };
        spec = spec.expect_sizes(name, Some(size), None);
    }
    check_end(&sb, &spec, &[], &summary);

    // Restart with the big pool at /22 and the default pool at /25: every Node keeps what it has
    // (no PATCH), plan reports the mismatches, and a new big Node gets a /22.
    sb.clear_requests();
    let other = rules(&["agentpool=bigpool:ipv4=22", "agentpool=agentpool:ipv4=25"]);
    let other_sizing = other.sizing(&ipam).unwrap();
    let now = nodeipam::nodelist::parse_nodes(&nodelist(sb.nodes()).to_string()).unwrap();
    let replanned = plan_with_sizing(&ipam, other_sizing.clone(), &now).unwrap();
    let big = replanned
        .nodes
        .iter()
        .find(|n| n.name == "aks-bigpool-11223344-vmss000000")
        .unwrap();
    assert_eq!(big.action, "keep");
    assert_eq!(
        big.reason.as_deref(),
        Some(
            "keeps its podCIDRs (they cannot change once set): 10.244.6.0/23 is a /23 but --node-cidr-mask-size-rule #1 \"agentpool=bigpool:ipv4=22\" asks for /22"
        )
    );
    let mut config = fast_config(ipam.clone());
    config.sizing = other_sizing.clone();
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    sb.create_node(aks_node("aks-bigpool-11223344-vmss000002", "bigpool"))
        .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "unserved: {:?}",
        unserved(&sb)
    );
    let summary = controller.stop().await;
    assert_eq!(
        pod_cidrs(&sb, "aks-bigpool-11223344-vmss000002"),
        ["10.244.12.0/22"]
    );
    let patches = node_patches(&sb);
    assert_eq!(
        patches.keys().collect::<Vec<_>>(),
        ["aks-bigpool-11223344-vmss000002"],
        "only the new Node is written after the restart"
    );
    // Counted on the new grid (/25: the agentpool rule's size).
    assert_eq!(other_sizing.sets()[0].grid_mask, 25);
    let mut spec = spec.expect_sizes("aks-bigpool-11223344-vmss000002", Some(22), None);
    spec.cluster_cidrs[0].1 = 25;
    check_end(&sb, &spec, &[], &summary);
    sb.shutdown().await;
}

/// 10.244.0.0/22 on a /26 grid holds the AKS fixture's three /24s (12 grid blocks): no /23 is
/// left, four /26s are. The big Node waits with `CIDRNotAvailable` while the small ones are
/// served; deleting two /24s frees the aligned 10.244.0.0/23 and the big Node gets it.
#[tokio::test]
async fn large_blocks_exhaust_while_small_ones_still_fit() {
    init_tracing();
    let sb = Sandbox::start(fixture(AKS)).await;
    let ipam = ipam("10.244.0.0/22", "", masks(None, None, None));
    let pools = rules(&["agentpool=bigpool:ipv4=23", "agentpool=small:ipv4=26"]);
    let sizing = pools.sizing(&ipam).unwrap();
    let mut config = fast_config(ipam.clone());
    config.sizing = sizing.clone();
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    let health = controller.health.clone();
    assert_eq!(used(&health), [12]);

    sb.create_node(aks_node("big-0", "bigpool")).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| {
            events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE)
                .iter()
                .any(|(n, ty, note)| {
                    n == "big-0" && ty == "Warning" && note.contains("no free aligned /23")
                })
        })
        .await,
        "no CIDRNotAvailable event for big-0: {:?}",
        events_with_reason(&sb, reasons::CIDR_NOT_AVAILABLE)
    );
    for i in 0..4 {
        sb.create_node(aks_node(&format!("small-{i}"), "small"))
            .unwrap();
    }
    assert!(
        sb.wait_until(WAIT, |sb| (0..4).all(|i| !pod_cidrs(
            sb,
            &format!("small-{i}")
        )
        .is_empty()))
            .await,
        "small Nodes not served while the big one waits"
    );
    let mut smalls: Vec<String> = (0..4)
        .flat_map(|i| pod_cidrs(&sb, &format!("small-{i}")))
        .collect();
    smalls.sort();
    assert_eq!(
        smalls,
        [
            "10.244.3.0/26",
            "10.244.3.128/26",
            "10.244.3.192/26",
            "10.244.3.64/26"
        ]
    );
    assert!(pod_cidrs(&sb, "big-0").is_empty());
    assert!(
        !node_patches(&sb).contains_key("big-0"),
        "no PATCH for big-0"
    );

    sb.delete_node("aks-agentpool-11223344-vmss000000").unwrap(); // 10.244.1.0/24
    sb.delete_node("aks-agentpool-11223344-vmss000002").unwrap(); // 10.244.0.0/24
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "big-0").is_empty())
            .await,
        "big-0 not served after an aligned /23 was freed"
    );
    assert_eq!(pod_cidrs(&sb, "big-0"), ["10.244.0.0/23"]);
    let summary = controller.stop().await;
    assert_eq!(summary.pools[0].used_blocks, 16);
    let mut spec = spec(&ipam, &sizing).expect_sizes("big-0", Some(23), None);
    for i in 0..4 {
        spec = spec.expect_sizes(&format!("small-{i}"), Some(26), None);
    }
    check_end(&sb, &spec, &[], &summary);
    sb.shutdown().await;
}

/// `--allow-node-mask-label` with `--node-mask-label-range=ipv4=22-26`: a Node labelled /25 gets
/// a /25; one labelled /20 gets a `NodeCIDRMaskLabelInvalid` Warning and no PATCH, and is served
/// once its label is fixed (the informer sees the label change).
#[tokio::test]
async fn mask_labels_within_the_range_are_honoured_others_wait_for_a_fix() {
    init_tracing();
    let sb = Sandbox::start(fixture(AKS)).await;
    let ipam = ipam("10.244.0.0/16", "10.0.0.0/16", masks(None, None, None));
    let pools = NodePools {
        allow_mask_label: true,
        label_range: LabelRange {
            ipv4: Some((22, 26)),
            ipv6: None,
        },
        ..rules(&["agentpool=bigpool:ipv4=23"])
    };
    let sizing = pools.sizing(&ipam).unwrap();
    let mut config = fast_config(ipam.clone());
    config.sizing = sizing.clone();
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;

    let mut labelled = aks_node("labelled", "bigpool");
    labelled["metadata"]["labels"][MASK_LABEL_IPV4] = json!("25");
    sb.create_node(labelled).unwrap();
    let mut bad = aks_node("bad-label", "agentpool");
    bad["metadata"]["labels"][MASK_LABEL_IPV4] = json!("20");
    sb.create_node(bad).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "labelled").is_empty()
            && events_with_reason(sb, reasons::NODE_CIDR_MASK_LABEL_INVALID)
                .iter()
                .any(|(n, ty, _)| n == "bad-label" && ty == "Warning"))
            .await,
        "events: {:?}",
        sb.events()
    );
    // The label wins over the bigpool rule's /23.
    assert_eq!(pod_cidrs(&sb, "labelled"), ["10.244.3.0/25"]);
    assert!(pod_cidrs(&sb, "bad-label").is_empty());
    assert!(!node_patches(&sb).contains_key("bad-label"));

    sb.patch_node(
        "bad-label",
        PatchType::Merge,
        &json!({"metadata": {"labels": {MASK_LABEL_IPV4: "24"}}}),
    )
    .unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| !pod_cidrs(sb, "bad-label").is_empty())
            .await,
        "bad-label not served after its label was fixed"
    );
    let summary = controller.stop().await;
    assert_eq!(
        events_with_reason(&sb, reasons::NODE_CIDR_MASK_LABEL_INVALID).len(),
        1,
        "one event for one bad label"
    );
    let spec = spec(&ipam, &sizing)
        .expect_sizes("labelled", Some(25), None)
        .expect_sizes("bad-label", Some(24), None);
    check_end(&sb, &spec, &[], &summary);
    sb.shutdown().await;
}

/// The kind dual-stack fixture's Node keeps its /24 + /64. A rule on `kubernetes.io/os=linux`
/// gives new Nodes a /23 and a /62; fd00:10:244::/60 holds three /62s beside the kept /64, so
/// the fourth Node fails on IPv6 and takes no IPv4 block either (all or nothing).
#[tokio::test]
async fn dual_stack_sizes_are_all_or_nothing() {
    init_tracing();
    let file = "13-kind-dualstack-single-node-abridged.json";
    let sb = Sandbox::start(fixture(file)).await;
    let template = template_node(file);
    let ipam = ipam(
        "10.244.0.0/16,fd00:10:244::/60",
        "",
        masks(None, None, None),
    );
    let pools = rules(&["kubernetes.io/os=linux:ipv4=23,ipv6=62"]);
    let sizing = pools.sizing(&ipam).unwrap();
    let mut config = fast_config(ipam.clone());
    config.sizing = sizing.clone();
    let controller = spawn(&sb, config);
    controller.wait_allocating(&sb).await;
    let health = controller.health.clone();
    // Grids /24 and /64: the kept Node holds one block of each.
    assert_eq!(used(&health), [1, 1]);
    for i in 0..3 {
        sb.create_node(node_like(&template, &format!("dual-{i}")))
            .unwrap();
    }
    assert!(sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await);
    let mut spec = spec(&ipam, &sizing);
    for i in 0..3 {
        let name = format!("dual-{i}");
        let cidrs = pod_cidrs(&sb, &name);
        assert_eq!(cidrs.len(), 2, "{name}: {cidrs:?}");
        spec = spec.expect_sizes(&name, Some(23), Some(62));
    }
    assert_eq!(
        pod_cidrs(&sb, "dual-0"),
        ["10.244.2.0/23", "fd00:10:244:4::/62"]
    );
    assert!(sb.wait_until(WAIT, |_| used(&health) == [7, 13]).await);
    sb.create_node(node_like(&template, "dual-3")).unwrap();
    assert!(
        sb.wait_until(WAIT, |sb| {
            events_with_reason(sb, reasons::CIDR_NOT_AVAILABLE)
                .iter()
                .any(|(n, _, note)| n == "dual-3" && note.contains("fd00:10:244::/60"))
        })
        .await
    );
    assert_eq!(used(&health), [7, 13], "no IPv4 block taken for dual-3");
    let summary = controller.stop().await;
    check_end(&sb, &spec, &["dual-3"], &summary);
    sb.shutdown().await;
}
