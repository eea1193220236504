//! Table-style tests of the decision logic: each compares the produced action, patch, events and
//! metrics with the expected ones, and checks nothing else was emitted.

use super::*;
use nodeipam_core::NodeMaskFlags;

fn config(cluster: &str, service: &str, flags: NodeMaskFlags) -> IpamConfig {
    nodeipam_core::config::validate(cluster, service, flags).expect("valid test config")
}

fn allocator(cluster: &str) -> Allocator {
    Allocator::new(&config(cluster, "", NodeMaskFlags::default())).expect("pool")
}

fn cidr(text: &str) -> Cidr {
    Cidr::parse(text).expect("test CIDR")
}

fn node(name: &str, pod_cidrs: &[&str]) -> NodeView {
    NodeView {
        name: name.to_owned(),
        pod_cidr: pod_cidrs.first().map(|s| (*s).to_owned()),
        pod_cidrs: pod_cidrs.iter().map(|s| (*s).to_owned()).collect(),
        deleting: false,
        uid: Some(format!("uid-{name}")),
    }
}

fn fixture(file: &str) -> Vec<NodeView> {
    let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let nodes = crate::nodelist::parse_nodes(&text).expect("fixture is a NodeList");
    nodes.iter().map(NodeView::from_node).collect()
}

fn used(allocator: &Allocator) -> Vec<u32> {
    allocator.pool_stats().iter().map(|s| s.used).collect()
}

#[test]
fn assigns_in_order_with_upstream_patch() {
    let mut a = allocator("10.244.0.0/16");
    let d = a.decide(&node("n1", &[]));
    assert_eq!(
        d,
        Decision {
            action: Action::Assign {
                pod_cidrs: vec![cidr("10.244.0.0/24")]
            },
            patch: Some(json!({"spec":{"podCIDR":"10.244.0.0/24","podCIDRs":["10.244.0.0/24"]}})),
            events: vec![],
            metrics: vec![MetricEvent::Allocated {
                cluster_cidr: cidr("10.244.0.0/16"),
                tries: 0
            }],
        }
    );
    assert!(a.is_pending("n1"));
    assert!(a.confirm("n1", &[cidr("10.244.0.0/24")]));
    assert!(!a.is_pending("n1"));
    // Seeing the patched Node again is a no-op.
    let d = a.decide(&node("n1", &["10.244.0.0/24"]));
    assert_eq!(
        d,
        Decision::new(Action::Keep {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        })
    );
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn pending_allocation_is_resent_not_reallocated() {
    let mut a = allocator("10.244.0.0/16");
    let first = a.decide(&node("n1", &[]));
    let again = a.decide(&node("n1", &[]));
    assert_eq!(again.action, first.action);
    assert_eq!(again.patch, first.patch);
    assert!(again.metrics.is_empty() && again.events.is_empty());
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn abort_releases_the_pending_block() {
    let mut a = allocator("10.244.0.0/16");
    a.decide(&node("n1", &[]));
    let d = a.abort("n1");
    assert_eq!(
        d.metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 1
        }]
    );
    assert_eq!(used(&a), vec![0]);
    // Round-robin: the next allocation moves on, as upstream's cidrset does.
    let d = a.decide(&node("n1", &[]));
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.1.0/24")]
        }
    );
}

#[test]
fn observed_podcidrs_replace_a_pending_reservation() {
    // PATCH rejected because someone else set podCIDRs meanwhile: occupy theirs, free ours.
    let mut a = allocator("10.244.0.0/16");
    a.decide(&node("n1", &[]));
    let d = a.decide(&node("n1", &["10.244.7.0/24"]));
    assert_eq!(
        d.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.244.7.0/24")]
        }
    );
    assert_eq!(
        d.metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 1
        }]
    );
    assert_eq!(used(&a), vec![1]);
    assert_eq!(a.held("n1"), Some(&[cidr("10.244.7.0/24")][..]));
}

#[test]
fn exhausted_pool_fails_with_cidr_not_available_then_recovers() {
    let mut a = Allocator::new(&config(
        "10.0.0.0/30",
        "",
        NodeMaskFlags {
            node_cidr_mask_size: Some(31),
            ..NodeMaskFlags::default()
        },
    ))
    .expect("pool");
    a.decide(&node("a", &[]));
    a.decide(&node("b", &[]));
    let d = a.decide(&node("c", &[]));
    assert!(matches!(d.action, Action::Fail { .. }), "{d:?}");
    assert_eq!(d.patch, None);
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].reason, reasons::CIDR_NOT_AVAILABLE);
    assert_eq!(d.events[0].kind, EventKind::Warning);
    assert_eq!(
        d.metrics,
        vec![MetricEvent::Exhausted {
            cluster_cidr: cidr("10.0.0.0/30")
        }]
    );
    a.remove("a");
    let d = a.decide(&node("c", &[]));
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.0.0.0/31")]
        }
    );
}

#[test]
fn deleting_node_keeps_its_cidrs_and_gets_none() {
    let mut a = allocator("10.244.0.0/16");
    let mut n = node("old", &["10.244.3.0/24"]);
    n.deleting = true;
    assert!(matches!(a.decide(&n).action, Action::Keep { .. }));
    let mut fresh = node("new", &[]);
    fresh.deleting = true;
    assert!(matches!(a.decide(&fresh).action, Action::Skip { .. }));
    assert_eq!(used(&a), vec![1]);
    a.remove("old");
    assert_eq!(used(&a), vec![0]);
}

#[test]
fn block_stays_reserved_while_another_node_overlaps_it() {
    // After a node-mask change (/27 → /24), two old /27s share one /24 block.
    let mut a = allocator("10.244.0.0/16");
    a.startup_occupy(&[
        node("x", &["10.244.5.0/27"]),
        node("y", &["10.244.5.32/27"]),
    ]);
    assert_eq!(used(&a), vec![1]);
    let d = a.remove("x");
    assert!(d.metrics.is_empty(), "block still held by y: {d:?}");
    assert_eq!(used(&a), vec![1]);
    let d = a.remove("y");
    assert_eq!(
        d.metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 1
        }]
    );
    assert_eq!(used(&a), vec![0]);
}

#[test]
fn larger_old_cidr_releases_only_uncovered_blocks() {
    // An old /22 (4 blocks) and a /24 inside it on another node (a conflict, kept reserved).
    let mut a = allocator("10.244.0.0/16");
    let decisions = a.startup_occupy(&[
        node("big", &["10.244.8.0/22"]),
        node("small", &["10.244.9.0/24"]),
    ]);
    assert!(matches!(decisions[1].1.action, Action::Skip { .. }));
    assert_eq!(used(&a), vec![4]);
    let d = a.remove("big");
    assert_eq!(
        d.metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 3
        }]
    );
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn service_cidr_blocks_are_never_allocated_or_released() {
    let mut a = Allocator::new(&config(
        "10.0.0.0/16",
        "10.0.0.0/24",
        NodeMaskFlags::default(),
    ))
    .expect("pool");
    let d = a.decide(&node("n", &[]));
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.0.1.0/24")]
        }
    );
    // A Node that (wrongly) holds the service block is kept; releasing it keeps the block.
    a.decide(&node("odd", &["10.0.0.0/24"]));
    let d = a.remove("odd");
    assert!(d.metrics.is_empty());
    assert_eq!(used(&a), vec![2]);
}

#[test]
fn skip_rules() {
    struct Case {
        cluster: &'static str,
        node: NodeView,
        kind: SkipKind,
        reserved: Vec<u32>,
    }
    let mut mismatch = node("m", &["10.244.1.0/24"]);
    mismatch.pod_cidr = Some("10.244.2.0/24".to_owned());
    let cases = [
        Case {
            cluster: "10.244.0.0/16",
            node: node("bad", &["***HIDDEN***/25"]),
            kind: SkipKind::Invalid,
            reserved: vec![0],
        },
        Case {
            cluster: "10.244.0.0/16",
            node: node("three", &["10.244.1.0/24", "fd00::/64", "10.244.2.0/24"]),
            kind: SkipKind::Invalid,
            reserved: vec![2],
        },
        Case {
            cluster: "10.244.0.0/16",
            node: node("twice", &["10.244.1.0/24", "10.244.2.0/24"]),
            kind: SkipKind::Invalid,
            reserved: vec![2],
        },
        Case {
            cluster: "10.244.0.0/16",
            node: mismatch,
            kind: SkipKind::Invalid,
            reserved: vec![1],
        },
        Case {
            cluster: "10.244.0.0/16",
            node: node("outside", &["10.42.0.0/24"]),
            kind: SkipKind::OutOfRange,
            reserved: vec![0],
        },
        Case {
            cluster: "10.244.0.0/16",
            node: node("dual", &["10.244.0.0/24", "fd00:10:244::/64"]),
            kind: SkipKind::OutOfRange,
            reserved: vec![1],
        },
    ];
    for case in cases {
        let mut a = allocator(case.cluster);
        let d = a.decide(&case.node);
        assert!(
            matches!(d.action, Action::Skip { .. }),
            "{}: {d:?}",
            case.node.name
        );
        assert_eq!(d.patch, None);
        assert_eq!(d.events.len(), 1, "{}", case.node.name);
        assert_eq!(d.events[0].reason, case.kind.event_reason());
        assert_eq!(
            d.metrics,
            vec![MetricEvent::NodeSkipped { kind: case.kind }]
        );
        assert_eq!(used(&a), case.reserved, "{}", case.node.name);
        assert_eq!(a.skipped_count(), 1);
        // Seen again: nothing new is emitted.
        let again = a.decide(&case.node);
        assert!(again.events.is_empty() && again.metrics.is_empty());
        // Gone: the reserved part is released.
        a.remove(&case.node.name);
        assert_eq!(used(&a).iter().sum::<u32>(), 0, "{}", case.node.name);
    }
}

#[test]
fn conflicting_node_is_skipped_and_range_stays_reserved() {
    let mut a = allocator("10.244.0.0/16");
    let decisions =
        a.startup_occupy(&[node("a", &["10.244.1.0/24"]), node("b", &["10.244.1.0/24"])]);
    assert!(matches!(decisions[0].1.action, Action::Keep { .. }));
    let (_, d) = &decisions[1];
    assert!(matches!(d.action, Action::Skip { .. }));
    assert_eq!(d.events[0].reason, reasons::POD_CIDR_CONFLICT);
    a.remove("a");
    assert_eq!(used(&a), vec![1], "b still overlaps the block");
}

#[test]
fn fixture_03_aks_is_kept_out_of_order() {
    let mut a = allocator("10.244.0.0/16");
    let nodes = fixture("03-aks-kubenet-3nodes.json");
    let decisions = a.startup_occupy(&nodes);
    let actions: Vec<Action> = decisions.into_iter().map(|(_, d)| d.action).collect();
    assert_eq!(
        actions,
        vec![
            Action::Keep {
                pod_cidrs: vec![cidr("10.244.1.0/24")]
            },
            Action::Keep {
                pod_cidrs: vec![cidr("10.244.2.0/24")]
            },
            Action::Keep {
                pod_cidrs: vec![cidr("10.244.0.0/24")]
            },
        ]
    );
    // The next Node gets the first free block after the cursor (0): 10.244.3.0/24.
    let d = a.decide(&node("new", &[]));
    assert_eq!(
        d.patch,
        Some(json!({"spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"]}}))
    );
}

#[test]
fn fixture_12_k0s_ipv6_first_against_ipv4_first_config() {
    let ipam = config(
        "10.244.0.0/16,fd00::/104",
        "",
        NodeMaskFlags {
            node_cidr_mask_size_ipv6: Some(110),
            ..NodeMaskFlags::default()
        },
    );
    let mut a = Allocator::new(&ipam).expect("pool");
    let decisions = a.startup_occupy(&fixture("12-k0s-dualstack-ipv6-primary-partial.json"));
    assert_eq!(decisions.len(), 1);
    assert_eq!(
        decisions[0].1,
        Decision::new(Action::Keep {
            pod_cidrs: vec![cidr("fd00::/110"), cidr("10.244.0.0/24")]
        })
    );
    // A new Node gets IPv4 first (flag order), one block of each family.
    let d = a.decide(&node("worker-2", &[]));
    assert_eq!(
        d.patch,
        Some(
            json!({"spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00::4:0/110"]}})
        )
    );
}

#[test]
fn fixture_11_mixed_skips_redacted_nodes() {
    let mut a = allocator("10.32.0.0/12");
    let nodes = fixture("11-mixed-bundle-7nodes-redacted-podcidr.json");
    let decisions = a.startup_occupy(&nodes);
    let skipped = decisions
        .iter()
        .filter(|(_, d)| matches!(d.action, Action::Skip { .. }))
        .count();
    assert_eq!(skipped, 5);
    assert!(
        decisions
            .iter()
            .filter(|(_, d)| matches!(d.action, Action::Skip { .. }))
            .all(|(_, d)| d.events.len() == 1 && d.events[0].reason == reasons::POD_CIDR_INVALID)
    );
    assert_eq!(a.skipped_count(), 5);
}

#[test]
fn fixture_20_gke_podcidr_only_is_kept() {
    let mut a = allocator("10.48.0.0/14");
    let nodes = fixture("20-gke-preemptible-single-node-podcidr.json");
    assert!(nodes[0].pod_cidrs.is_empty() && nodes[0].pod_cidr.is_some());
    let decisions = a.startup_occupy(&nodes);
    assert_eq!(
        decisions[0].1.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.48.10.0/24")]
        }
    );
}

#[test]
fn stale_view_of_a_patched_node_changes_nothing() {
    let mut a = allocator("10.244.0.0/16");
    a.decide(&node("n1", &[]));
    assert!(a.confirm("n1", &[cidr("10.244.0.0/24")]));
    // The store still shows the Node from before our PATCH.
    let d = a.decide(&node("n1", &[]));
    assert_eq!(
        d,
        Decision::new(Action::Keep {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        })
    );
    assert_eq!(used(&a), vec![1]);
    // A re-created Node of the same name (new uid) gets a fresh allocation; the old block is freed.
    let mut recreated = node("n1", &[]);
    recreated.uid = Some("uid-n1-second".to_owned());
    let d = a.decide(&recreated);
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.1.0/24")]
        }
    );
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn hostile_existing_cidrs_are_skipped_not_kept() {
    let mut a = Allocator::new(&config(
        "10.244.0.0/16",
        "10.244.128.0/20",
        NodeMaskFlags::default(),
    ))
    .expect("pool");
    let skip_kind = |d: &Decision| match (&d.action, d.metrics.as_slice()) {
        (Action::Skip { .. }, [MetricEvent::NodeSkipped { kind }]) => Some(*kind),
        _ => None,
    };
    // Inside a service CIDR: Service IPs would be handed to pods.
    let d = a.decide(&node("in-services", &["10.244.130.0/24"]));
    assert_eq!(skip_kind(&d), Some(SkipKind::Conflict), "{d:?}");
    // Larger than the cluster CIDR: not in it; the whole pool stays fenced off.
    let d = a.decide(&node("whole", &["10.0.0.0/8"]));
    assert_eq!(skip_kind(&d), Some(SkipKind::OutOfRange), "{d:?}");
    assert_eq!(used(&a), [256]);
    // Removing it frees everything but the service blocks.
    let _ = a.remove("whole");
    assert_eq!(used(&a), [16]);
    // Surrounding whitespace is not a CIDR the API (or a CNI) accepts.
    let d = a.decide(&node("spaces", &[" 10.244.1.0/24"]));
    assert_eq!(skip_kind(&d), Some(SkipKind::Invalid), "{d:?}");
}
