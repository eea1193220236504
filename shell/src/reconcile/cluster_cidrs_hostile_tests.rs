//! Several cluster CIDRs per family against hostile Nodes (issue 18 §1): podCIDRs that span two
//! cluster CIDRs, that sit in a later one, or that two Nodes share across CIDRs. The invariant
//! checked: no block any Node still holds is handed to another Node.

use super::*;
use nodeipam_core::NodeMaskFlags;

use crate::test_support::node_view as node;

fn allocator(cluster: &str) -> Allocator {
    let config = nodeipam_core::config::validate(cluster, "", NodeMaskFlags::default())
        .expect("valid test config");
    Allocator::new(&config).expect("pool")
}

fn cidr(text: &str) -> Cidr {
    Cidr::parse(text).expect("test CIDR")
}

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
