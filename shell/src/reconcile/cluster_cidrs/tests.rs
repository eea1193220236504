//! ClusterCIDR pools in the allocator (issue 18 §2): hosting, serving order on the fixtures' real
//! labels, re-gridding and supernets without handing an address out twice, deletion and removal
//! keeping what Nodes hold, and the status each pool reports.

use nodeipam_core::NodeMaskFlags;
use serde_json::{Value, json};

use super::super::{Action, Allocator, NodeView};
use super::*;
use crate::cluster_cidr::ClusterCidrObject;
use crate::test_support::node_view as node;

fn allocator(cluster: &str) -> Allocator {
    let config = nodeipam_core::config::validate(cluster, "", NodeMaskFlags::default())
        .expect("valid test config");
    Allocator::new(&config).expect("pool")
}

fn pool(name: &str, spec: Value) -> ClusterCidrPool {
    let object: ClusterCidrObject =
        serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("parses");
    ClusterCidrPool::from_object(&object).expect("a valid ClusterCIDR")
}

fn cidr(text: &str) -> Cidr {
    Cidr::parse(text).expect("test CIDR")
}

fn fixture(file: &str) -> Vec<NodeView> {
    let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let nodes = crate::nodelist::parse_nodes(&text).expect("fixture is a NodeList");
    nodes.iter().map(NodeView::from_node).collect()
}

/// Decides `view` and confirms an assignment; returns the podCIDRs it got (empty when it waits).
fn serve(a: &mut Allocator, view: &NodeView) -> Vec<Cidr> {
    let d = a.decide(view);
    match d.action {
        Action::Assign { pod_cidrs, .. } => {
            assert!(a.confirm(&view.name, &pod_cidrs));
            pod_cidrs
        }
        _ => Vec::new(),
    }
}

fn rows(a: &Allocator) -> Vec<(String, u8, u32)> {
    a.pool_stats()
        .iter()
        .map(|s| (s.cluster_cidr.to_string(), s.node_mask_size, s.used_blocks))
        .collect()
}

/// Fixture 08 (OpenShift on GCP, three masters, three workers, no podCIDRs): a ClusterCIDR
/// selecting `node-role.kubernetes.io/master` serves the masters with its /28s; the workers
/// (no matching selector) get the flag CIDR's /24s. The pool's status counts its own blocks.
#[test]
fn a_selector_pool_serves_the_labelled_fixture_nodes_and_the_flags_the_rest() {
    let mut a = allocator("10.128.0.0/16");
    let masters = pool(
        "masters",
        json!({
            "perNodeHostBits": 4,
            "ipv4": "10.200.0.0/24",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]},
        }),
    );
    let sync = a.sync_cluster_cidrs(std::slice::from_ref(&masters));
    assert_eq!(
        sync,
        ClusterCidrSync {
            added: vec!["masters".into()],
            capacity_added: true,
            ..ClusterCidrSync::default()
        }
    );
    let mut got = Vec::new();
    for view in fixture("08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json") {
        got.push((
            view.name.to_string(),
            crate::reconcile::join(&serve(&mut a, &view)),
        ));
    }
    let prefix = "ci-ln-d53y532-f76d1-2btqq-";
    let expected = [
        ("master-0", "10.200.0.0/28"),
        ("master-1", "10.200.0.16/28"),
        ("master-2", "10.200.0.32/28"),
        ("worker-b-7x8mw", "10.128.0.0/24"),
        ("worker-c-nmnbz", "10.128.1.0/24"),
        ("worker-d-bpnbd", "10.128.2.0/24"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(n, c)| (format!("{prefix}{n}"), (*c).to_owned()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        a.cluster_cidr_state("masters"),
        Some(PoolState::Serving {
            usage: vec![(
                nodeipam_core::Family::V4,
                FamilyUsage {
                    capacity: 16,
                    used: 3,
                    free: 13
                }
            )]
        })
    );
    // One row per backing set: the flag CIDR's and the ClusterCIDR's (disjoint).
    assert_eq!(
        rows(&a),
        [
            ("10.128.0.0/16".into(), 24, 3),
            ("10.200.0.0/24".into(), 28, 3)
        ]
    );
    assert_eq!(a.cluster_cidr_state("nonexistent"), None);
    // The same view again changes nothing.
    let key = a.model_key();
    assert_eq!(a.sync_cluster_cidrs(&[masters]), ClusterCidrSync::default());
    assert_eq!(a.model_key(), key);
}

/// A ClusterCIDR inside the flag CIDR with finer blocks re-grids the flag CIDR's set: what the
/// flag CIDR handed out stays allocated, the flag path keeps its round-robin where it was, and
/// it skips the /24 in which the pool handed out a /26 (one bitmap).
#[test]
fn a_finer_pool_inside_the_flag_cidr_regrids_and_shares_one_bitmap() {
    let mut a = allocator("10.0.0.0/21");
    assert_eq!(serve(&mut a, &node("old", &[])), [cidr("10.0.0.0/24")]);
    let fine = pool(
        "fine",
        json!({"perNodeHostBits": 6, "ipv4": "10.0.4.0/23",
               "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "role", "operator": "In", "values": ["master"]}]}]}}),
    );
    assert!(a.sync_cluster_cidrs(&[fine]).capacity_added);
    assert_eq!(rows(&a), [("10.0.0.0/21".into(), 26, 4)]);
    // Fixture 05: workers -15 and -34, master -41, worker -42; then one more Node.
    let mut got = Vec::new();
    let mut views = fixture("05-aws-4nodes-no-podcidr.json");
    views.push(node("extra", &[]));
    for view in &views {
        got.extend(serve(&mut a, view));
    }
    assert_eq!(
        got,
        [
            cidr("10.0.1.0/24"),
            cidr("10.0.2.0/24"),
            cidr("10.0.4.0/26"),
            cidr("10.0.3.0/24"),
            cidr("10.0.5.0/24"),
        ]
    );
    assert_eq!(rows(&a), [("10.0.0.0/21".into(), 26, 21)]);
}
