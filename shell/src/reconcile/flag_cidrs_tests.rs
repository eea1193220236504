//! Several cluster CIDRs per family (issue 18 §1): the decisions compared whole, as in
//! `tests.rs`, on configurations with two IPv4 cluster CIDRs.

use super::*;
use nodeipam_core::NodeMaskFlags;
use serde_json::json;

use crate::test_support::{cidr, fixture_views as fixture, ipam_config, node_view as node};

fn allocator(cluster: &str, service: &str) -> Allocator {
    Allocator::new(&ipam_config(cluster, service, NodeMaskFlags::default())).expect("pool")
}

fn used(allocator: &Allocator) -> Vec<(String, u32)> {
    allocator
        .pool_stats()
        .iter()
        .map(|s| (s.cluster_cidr.to_string(), s.used_blocks))
        .collect()
}

/// The second IPv4 cluster CIDR serves only once the first is full; when both are, the Node
/// waits with one `CIDRNotAvailable` event naming both and an exhaustion metric for each; a
/// block freed in the first is used before what is left of the second.
#[test]
fn a_later_cluster_cidr_serves_only_when_the_earlier_ones_are_full() {
    let mut a = allocator("10.0.0.0/23,10.1.0.0/23", "");
    let mut assigned = Vec::new();
    for name in ["n1", "n2", "n3"] {
        let d = a.decide(&node(name, &[]));
        let Action::Assign { pod_cidrs, .. } = &d.action else {
            panic!("{name}: {d:?}");
        };
        assigned.push(pod_cidrs[0].to_string());
        assert!(a.confirm(name, pod_cidrs));
    }
    assert_eq!(assigned, ["10.0.0.0/24", "10.0.1.0/24", "10.1.0.0/24"]);
    // The block of the second CIDR is counted there.
    let d = a.decide(&node("n4", &[]));
    assert_eq!(
        d.metrics,
        [MetricEvent::Allocated {
            cluster_cidr: cidr("10.1.0.0/23"),
            tries: 0,
            blocks: 1,
        }]
    );
    assert!(a.confirm("n4", &[cidr("10.1.1.0/24")]));
    let reason = "no pod CIDR could be allocated: no free pod CIDR left in any of the 2 IPv4 cluster CIDRs (10.0.0.0/23, 10.1.0.0/23)";
    let d = a.decide(&node("n5", &[]));
    assert_eq!(
        d,
        Decision {
            action: Action::Fail {
                reason: reason.to_owned(),
            },
            events: vec![EventSpec {
                kind: EventKind::Warning,
                reason: reasons::CIDR_NOT_AVAILABLE,
                note: format!("Node n5: {reason}"),
                action: reasons::ACTION_ALLOCATE,
            }],
            metrics: vec![
                MetricEvent::Exhausted {
                    cluster_cidr: cidr("10.0.0.0/23"),
                },
                MetricEvent::Exhausted {
                    cluster_cidr: cidr("10.1.0.0/23"),
                },
            ],
            next: Next::WaitForFreeBlock,
        }
    );
    // n3 (second CIDR) and n2 (first) go: the next Node gets n2's block, in the first CIDR.
    let gone = a.remove("n3");
    assert_eq!(
        gone.metrics,
        [MetricEvent::Released {
            cluster_cidr: cidr("10.1.0.0/23"),
            blocks: 1,
        }]
    );
    a.remove("n2");
    let d = a.decide(&node("n5", &[]));
    assert_eq!(
        d.patch(),
        Some(json!({
            "metadata":{"uid":"uid-n5"},
            "spec":{"podCIDR":"10.0.1.0/24","podCIDRs":["10.0.1.0/24"]}
        }))
    );
    assert_eq!(
        used(&a),
        [("10.0.0.0/23".to_owned(), 2), ("10.1.0.0/23".to_owned(), 1)]
    );
}

/// Dual-stack with two IPv4 CIDRs: the IPv4 block comes from the second once the first is full,
/// the IPv6 one from the one IPv6 CIDR, in the flag's family order (IPv4 first: the first
/// entry's family is `spec.podCIDR`'s). Nothing is taken when IPv6 is full.
#[test]
fn dual_stack_with_two_ipv4_cidrs_is_all_or_nothing() {
    let config = nodeipam_core::config::validate(
        "10.0.0.0/24,fd00::/126,10.1.0.0/23",
        "",
        NodeMaskFlags {
            node_cidr_mask_size_ipv6: Some(127),
            ..NodeMaskFlags::default()
        },
    )
    .expect("valid");
    let mut a = Allocator::new(&config).expect("pool");
    let first = a.decide(&node("n1", &[]));
    let second = a.decide(&node("n2", &[]));
    let pod_cidrs = |d: &Decision| match &d.action {
        Action::Assign { pod_cidrs, .. } => pod_cidrs.iter().map(ToString::to_string).collect(),
        other => panic!("{other:?}"),
    };
    let first: Vec<String> = pod_cidrs(&first);
    let second: Vec<String> = pod_cidrs(&second);
    assert_eq!(first, ["10.0.0.0/24", "fd00::/127"]);
    assert_eq!(second, ["10.1.0.0/24", "fd00::2/127"]);
    let before = used(&a);
    let d = a.decide(&node("n3", &[]));
    assert!(
        matches!(&d.action, Action::Fail { reason } if reason.ends_with("no pod CIDR could be allocated: no free pod CIDR left in cluster CIDR fd00::/126")),
        "{d:?}"
    );
    assert_eq!(used(&a), before);
}

/// A podCIDR outside both IPv4 cluster CIDRs (its CIDR removed from the flag) is skipped as out
/// of range with a reason naming both; one in the second CIDR is kept and counted there; a
/// service CIDR is reserved in the cluster CIDR it overlaps, whichever it is.
#[test]
fn existing_pod_cidrs_are_matched_to_the_cluster_cidr_that_holds_them() {
    let mut a = allocator("10.0.0.0/23,10.1.0.0/23", "10.1.1.0/25");
    assert_eq!(
        used(&a),
        [("10.0.0.0/23".to_owned(), 0), ("10.1.0.0/23".to_owned(), 1)]
    );
    // A skipped Node's range covering both cluster CIDRs is reserved in each, counted per CIDR
    // (10.1.1.0/24 is the service CIDR's already).
    let wide = a.decide(&node("wide", &["10.0.0.0/15"]));
    assert_eq!(
        wide.metrics,
        [
            MetricEvent::Occupied {
                cluster_cidr: cidr("10.0.0.0/23"),
                blocks: 2,
            },
            MetricEvent::Occupied {
                cluster_cidr: cidr("10.1.0.0/23"),
                blocks: 1,
            },
            MetricEvent::NodeSkipped {
                kind: SkipKind::OutOfRange,
            },
        ]
    );
    // Its deletion gives back what no service CIDR covers, per CIDR.
    let gone = a.remove("wide");
    assert_eq!(
        gone.metrics,
        [
            MetricEvent::Released {
                cluster_cidr: cidr("10.0.0.0/23"),
                blocks: 2,
            },
            MetricEvent::Released {
                cluster_cidr: cidr("10.1.0.0/23"),
                blocks: 1,
            },
        ]
    );
    let kept = a.decide(&node("in-second", &["10.1.0.0/24"]));
    assert_eq!(
        kept.metrics,
        [MetricEvent::Occupied {
            cluster_cidr: cidr("10.1.0.0/23"),
            blocks: 1,
        }]
    );
    let reason = "its podCIDRs cannot be used with this configuration: 10.9.0.0/24 is outside all 2 IPv4 cluster CIDRs (10.0.0.0/23, 10.1.0.0/23)";
    let skipped = a.decide(&node("removed", &["10.9.0.0/24"]));
    assert_eq!(
        skipped,
        Decision {
            action: Action::Skip {
                reason: reason.to_owned(),
            },
            events: vec![EventSpec {
                kind: EventKind::Warning,
                reason: reasons::POD_CIDR_OUT_OF_RANGE,
                note: format!("Node removed skipped by the node IPAM controller: {reason}"),
                action: reasons::ACTION_OCCUPY,
            }],
            metrics: vec![MetricEvent::NodeSkipped {
                kind: SkipKind::OutOfRange,
            }],
            next: Next::Done,
        }
    );
    assert_eq!(
        a.outside_cluster_cidrs(&[cidr("10.9.0.0/24"), cidr("10.0.1.0/24"), cidr("fd00::/64")]),
        [cidr("10.9.0.0/24")],
        "only podCIDRs of a configured family that no cluster CIDR holds"
    );
    assert_eq!(
        used(&a),
        [("10.0.0.0/23".to_owned(), 0), ("10.1.0.0/23".to_owned(), 2)]
    );
}

/// A real fixture (03, AKS kubenet: three Nodes with 10.244.x.0/24) under a flag that lists a new
/// CIDR first and theirs second: every podCIDR is kept and occupied in the second, and new Nodes
/// are served from the first.
#[test]
fn fixture_pod_cidrs_are_kept_in_a_later_cluster_cidr() {
    let mut a = allocator("10.245.0.0/16,10.244.0.0/16", "");
    let nodes = fixture("03-aks-kubenet-3nodes.json");
    let decisions = a.startup_occupy(&nodes);
    assert_eq!(decisions.len(), 3);
    assert!(
        decisions
            .iter()
            .all(|(_, d)| matches!(d.action, Action::Keep { .. })),
        "{decisions:?}"
    );
    assert_eq!(
        used(&a),
        [
            ("10.245.0.0/16".to_owned(), 0),
            ("10.244.0.0/16".to_owned(), 3)
        ]
    );
    let d = a.decide(&node("new", &[]));
    assert!(
        matches!(&d.action, Action::Assign { pod_cidrs, .. } if pod_cidrs == &[cidr("10.245.0.0/24")]),
        "{d:?}"
    );
}
