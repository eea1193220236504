//! Several cluster CIDRs per family against hostile Nodes (issue 18 §1): podCIDRs that span two
//! cluster CIDRs, that sit in a later one, or that two Nodes share across CIDRs. The invariant
//! checked: no block any Node still holds is handed to another Node.

use super::*;

use crate::test_support::{allocator, cidr, node_view as node};

/// Fixture 03 (AKS kubenet: 10.244.0.0/24, .1.0/24, .2.0/24) with its first Node's podCIDR
/// widened to `wide`.
fn fixture_03_with_first(wide: &str) -> Vec<NodeView> {
    let path = format!(
        "{}/../fixtures/nodes/03-aks-kubenet-3nodes.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let mut list: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    list["items"][0]["spec"]["podCIDR"] = wide.into();
    list["items"][0]["spec"]["podCIDRs"] = serde_json::json!([wide]);
    let nodes = crate::nodelist::parse_nodes(&list.to_string()).expect("fixture is a NodeList");
    nodes.iter().map(NodeView::from_node).collect()
}

/// Allocates to fresh Nodes until the pool is full; returns what was handed out.
fn drain(a: &mut Allocator) -> Vec<Cidr> {
    let mut out = Vec::new();
    for i in 0..1024 {
        let name = format!("new-{i}");
        let d = a.decide(&node(&name, &[]));
        let Action::Assign { pod_cidrs, .. } = &d.action else {
            break;
        };
        assert!(a.confirm(&name, pod_cidrs));
        out.extend(pod_cidrs.iter().copied());
    }
    out
}

/// A /15 podCIDR spanning both cluster CIDRs (10.244.0.0/16, 10.245.0.0/16), beside two Nodes
/// whose /24s it overlaps: when the wide Node goes, the /24s the other two still hold are never
/// handed out again.
#[test]
fn a_pod_cidr_spanning_two_cluster_cidrs_leaves_the_overlapped_nodes_their_blocks() {
    let nodes = fixture_03_with_first("10.244.0.0/15");
    let mut a = allocator("10.244.0.0/16,10.245.0.0/16");
    let decisions = a.startup_occupy(&nodes);
    assert_eq!(decisions.len(), 3);
    a.remove(&nodes[0].name);
    let handed = drain(&mut a);
    assert!(!handed.is_empty(), "the wide Node's blocks came back");
    for held in ["10.244.2.0/24", "10.244.0.0/24"] {
        assert!(
            !handed.contains(&cidr(held)),
            "{held} is still on a fixture Node but was handed out again"
        );
    }
}

/// Fixture 13 (kind dual-stack: 10.244.0.0/24, fd00:10:244::/64) plus a second Node with the same
/// IPv6 podCIDR and an IPv4 one (10.245.1.0/24) in the second IPv4 cluster CIDR: the second is skipped, its IPv4
/// block still reserved; when the first Node goes, neither block the second holds is handed out.
#[test]
fn a_pod_cidr_shared_across_nodes_of_different_cluster_cidrs_is_never_handed_out() {
    let path = format!(
        "{}/../fixtures/nodes/13-kind-dualstack-single-node-abridged.json",
        env!("CARGO_MANIFEST_DIR")
    );
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let mut list: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
    let mut second = list["items"][0].clone();
    second["metadata"]["name"] = "second".into();
    second["metadata"]["uid"] = "uid-second".into();
    second["spec"]["podCIDR"] = "10.245.1.0/24".into();
    second["spec"]["podCIDRs"] = serde_json::json!(["10.245.1.0/24", "fd00:10:244::/64"]);
    list["items"].as_array_mut().expect("items").push(second);
    let nodes: Vec<NodeView> = crate::nodelist::parse_nodes(&list.to_string())
        .expect("a NodeList")
        .iter()
        .map(NodeView::from_node)
        .collect();
    // Two IPv4 /24s in the first CIDR, so new Nodes reach the second; 8 IPv6 /64s.
    let mut a = allocator("10.244.0.0/23,fd00:10:244::/61,10.245.0.0/16");
    let decisions = a.startup_occupy(&nodes);
    assert!(
        matches!(decisions[1].1.action, Action::Skip { .. }),
        "{decisions:?}"
    );
    a.remove(&nodes[0].name);
    let handed = drain(&mut a);
    // Seven Nodes (the IPv6 /64s but the held one), the last five from 10.245.0.0/16.
    assert_eq!(handed.len(), 14, "{handed:?}");
    for held in ["fd00:10:244::/64", "10.245.1.0/24"] {
        assert!(
            !handed.iter().any(|c| c.overlaps(&cidr(held))),
            "{held} is still on Node second but was handed out again: {handed:?}"
        );
    }
}
