//! The decision logic with node-pool sizes (`CloudAllocator`): whole decisions compared, as in
//! `tests.rs`, on Nodes carrying the AKS fixture's labels.
#![allow(clippy::unwrap_used)]

use super::*;
use serde_json::json;

use crate::node_pools::{LabelRange, MaskRule, NodePools, RuleOrigin};
use crate::test_support::{assigned, cidr};
use nodeipam_core::NodeMaskFlags;

fn config(cluster: &str) -> IpamConfig {
    nodeipam_core::config::validate(cluster, "", NodeMaskFlags::default()).unwrap()
}

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

fn allocator(cluster: &str, pools: &NodePools) -> Allocator {
    let config = config(cluster);
    Allocator::with_sizing(&config, pools.sizing(&config).unwrap()).unwrap()
}

/// The AKS fixture's first Node (`agentpool=agentpool`, 19 labels), renamed, without podCIDRs,
/// its `agentpool` label set to `pool`.
fn aks_node(name: &str, pool: &str) -> NodeView {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../fixtures/nodes/03-aks-kubenet-3nodes.json"
    );
    let nodes = crate::nodelist::parse_nodes(&std::fs::read_to_string(path).unwrap()).unwrap();
    let mut view = NodeView::from_node(&nodes[0]);
    view.name = name.into();
    view.uid = Some(format!("uid-{name}"));
    view.pod_cidr = None;
    view.pod_cidrs.clear();
    view.labels.insert("agentpool".to_owned(), pool.to_owned());
    view
}

fn used(a: &Allocator) -> Vec<u32> {
    a.pool_stats().iter().map(|s| s.used_blocks).collect()
}

/// A big pool (/23, coarser than the default: first fit), the default pool (/24, round-robin
/// from the cursor) and a small pool (/26, finer: round-robin from the cursor), on a /26 grid.
#[test]
fn mixed_pools_from_the_aks_labels() {
    let pools = rules(&["agentpool=bigpool:ipv4=23", "agentpool=small:ipv4=26"]);
    let mut a = allocator("10.244.0.0/16", &pools);
    let stats = a.pool_stats();
    assert_eq!(
        (stats[0].node_mask_size, stats[0].capacity_blocks),
        (26, 1024),
        "grid /26"
    );
    let d = a.decide(&aks_node("agentpool-0", "agentpool"));
    assert_eq!(
        d,
        Decision {
            action: Action::Assign {
                pod_cidrs: vec![cidr("10.244.0.0/24")],
                uid: Some("uid-agentpool-0".to_owned()),
            },
            events: vec![],
            // A /24 on the /26 grid: 4 grid blocks, counted as upstream's CidrSet counts blocks.
            metrics: vec![MetricEvent::Allocated {
                cluster_cidr: cidr("10.244.0.0/16"),
                tries: 0,
                blocks: 4,
            }],
            next: Next::Done,
        }
    );
    assert_eq!(
        d.patch(),
        Some(json!({
            "metadata": {"uid": "uid-agentpool-0"},
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]}
        }))
    );
    assert!(a.confirm("agentpool-0", &[cidr("10.244.0.0/24")]));
    let order = [
        ("big-0", "bigpool", "10.244.2.0/23"), // first fit: 0–3 used, 4–7 free, 8 aligned
        ("small-0", "small", "10.244.1.0/26"), // cursor 4
        ("agentpool-1", "agentpool", "10.244.4.0/24"), // cursor 5 → 8 (2.0/23 taken) → 16
        ("big-1", "bigpool", "10.244.6.0/23"), // first fit: 0–7 used, 8–15 used, 16–23 used
        ("small-1", "small", "10.244.5.0/26"), // cursor 20
        ("big-2", "bigpool", "10.244.8.0/23"),
    ];
    for (name, pool, want) in order {
        assert_eq!(
            assigned(&mut a, &aks_node(name, pool)),
            vec![cidr(want)],
            "{name}"
        );
    }
    // 4 + 8 + 1 + 4 + 8 + 1 + 8 grid blocks.
    assert_eq!(used(&a), vec![34]);
    // Removing a big Node frees its 8 grid blocks; the next big Node gets them back (first fit).
    assert_eq!(
        a.remove("big-0").metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 8
        }]
    );
    assert_eq!(
        assigned(&mut a, &aks_node("big-3", "bigpool")),
        vec![cidr("10.244.2.0/23")]
    );
}

/// Without rules a CloudAllocator allocates exactly as the range allocator: same decisions for
/// the same history, on the AKS fixture's Nodes.
#[test]
fn no_rules_is_the_range_allocator() {
    let config = config("10.244.0.0/20");
    let mut range = Allocator::new(&config).unwrap();
    let mut cloud =
        Allocator::with_sizing(&config, NodePools::default().sizing(&config).unwrap()).unwrap();
    let existing: Vec<NodeView> = {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/../fixtures/nodes/03-aks-kubenet-3nodes.json"
        );
        let nodes = crate::nodelist::parse_nodes(&std::fs::read_to_string(path).unwrap()).unwrap();
        nodes.iter().map(NodeView::from_node).collect()
    };
    assert_eq!(
        range.startup_occupy(&existing),
        cloud.startup_occupy(&existing)
    );
    for i in 0..20 {
        let node = aks_node(&format!("n{i}"), "agentpool");
        assert_eq!(range.decide(&node), cloud.decide(&node), "n{i}");
        if i % 3 == 0 {
            assert_eq!(range.remove("n0"), cloud.remove("n0"));
        }
    }
    assert_eq!(range.pool_stats(), cloud.pool_stats());
}

/// No free /23 left while /26 blocks are: the big Node fails with CIDRNotAvailable and waits for
/// a free block, the small ones keep being served, and a release lets the big one in.
#[test]
fn large_blocks_exhaust_while_small_ones_still_fit() {
    let pools = rules(&["agentpool=bigpool:ipv4=23", "agentpool=small:ipv4=26"]);
    // 10.244.0.0/22: 16 grid blocks of /26, room for two /23s.
    let mut a = allocator("10.244.0.0/22", &pools);
    assert_eq!(
        assigned(&mut a, &aks_node("small-0", "small")),
        vec![cidr("10.244.0.0/26")]
    );
    assert_eq!(
        assigned(&mut a, &aks_node("big-0", "bigpool")),
        vec![cidr("10.244.2.0/23")]
    );
    let d = a.decide(&aks_node("big-1", "bigpool"));
    let want_reason = "no pod CIDR could be allocated: no free pod CIDR left in cluster CIDR 10.244.0.0/22 (no free aligned /23 as --node-cidr-mask-size-rule #1 \"agentpool=bigpool:ipv4=23\" asks; 7 of 16 /26 blocks are free, the largest free block is 10.244.1.0/24)";
    assert_eq!(
        d,
        Decision {
            action: Action::Fail {
                reason: want_reason.to_owned()
            },
            events: vec![EventSpec {
                kind: EventKind::Warning,
                reason: reasons::CIDR_NOT_AVAILABLE,
                note: format!("Node big-1: {want_reason}"),
                action: reasons::ACTION_ALLOCATE,
            }],
            metrics: vec![MetricEvent::Exhausted {
                cluster_cidr: cidr("10.244.0.0/22")
            }],
            next: Next::WaitForFreeBlock,
        }
    );
    assert_eq!(
        a.held("big-1"),
        None,
        "nothing reserved for the failed Node"
    );
    // Small Nodes are still served, one grid block each.
    for (name, want) in [
        ("small-1", "10.244.0.64/26"),
        ("small-2", "10.244.0.128/26"),
    ] {
        assert_eq!(assigned(&mut a, &aks_node(name, "small")), vec![cidr(want)]);
    }
    // The big Node's retry fails again until the /23 at 10.244.2.0 is freed.
    assert!(matches!(
        a.decide(&aks_node("big-1", "bigpool")).action,
        Action::Fail { .. }
    ));
    a.remove("big-0");
    assert_eq!(
        assigned(&mut a, &aks_node("big-1", "bigpool")),
        vec![cidr("10.244.2.0/23")]
    );
}

/// An unknown write outcome of a /23 keeps both its grid blocks (/24: the default is the finest
/// size here) reserved and re-sends the same CIDR; a definite refusal (422) releases exactly those.
#[test]
fn unknown_outcome_of_a_large_block_never_releases() {
    let pools = rules(&["agentpool=bigpool:ipv4=23"]);
    let mut a = allocator("10.244.0.0/16", &pools);
    let big = aks_node("big-0", "bigpool");
    let Action::Assign { pod_cidrs, .. } = a.decide(&big).action else {
        panic!("expected an assignment");
    };
    assert_eq!(pod_cidrs, vec![cidr("10.244.0.0/23")]);
    let unknown = PatchOutcome::Unknown {
        message: "timed out".to_owned(),
    };
    let d = a.patch_outcome("big-0", Some("uid-big-0"), &pod_cidrs, unknown);
    assert!(matches!(d.action, Action::KeepTrying { .. }), "{d:?}");
    assert_eq!(used(&a), vec![2]);
    // The retry re-sends the same /23; another big Node gets the next one.
    assert_eq!(
        a.decide(&big),
        Decision::assign(pod_cidrs.clone(), Some("uid-big-0"))
    );
    assert_eq!(
        assigned(&mut a, &aks_node("big-1", "bigpool")),
        vec![cidr("10.244.2.0/23")]
    );
    let refused = PatchOutcome::CannotApply {
        kind: CannotApplyKind::PodCidrsAlreadySet,
        message: "spec.podCIDRs: Forbidden".to_owned(),
    };
    let d = a.patch_outcome("big-0", Some("uid-big-0"), &pod_cidrs, refused);
    assert_eq!(
        d.metrics,
        vec![
            MetricEvent::PatchFailed {
                error: "pod_cidrs_already_set"
            },
            MetricEvent::Released {
                cluster_cidr: cidr("10.244.0.0/16"),
                blocks: 2
            }
        ]
    );
    assert_eq!(used(&a), vec![2], "only big-1's /23 is left");
}

/// Existing Nodes keep what they have, whatever their rule says now; a Node with a smaller
/// podCIDR inside another's big block is skipped and its grid block stays reserved when the big
/// one goes (overlap accounting on the grid).
#[test]
fn existing_sizes_are_kept_and_overlaps_counted_on_the_grid() {
    let pools = rules(&["agentpool=bigpool:ipv4=23", "agentpool=small:ipv4=26"]);
    let mut a = allocator("10.244.0.0/16", &pools);
    let mut old_big = aks_node("old-big", "small");
    old_big.pod_cidrs = vec!["10.244.4.0/23".to_owned()];
    // Named to sort after `old-big`: start-up occupies in name order.
    let mut inside = aks_node("small-inside", "small");
    inside.pod_cidrs = vec!["10.244.5.0/26".to_owned()];
    let decisions = a.startup_occupy(&[old_big.clone(), inside]);
    assert_eq!(
        decisions[0].1.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.244.4.0/23")]
        }
    );
    assert_eq!(
        a.size_mismatch(&old_big, &[cidr("10.244.4.0/23")])
            .as_deref(),
        Some(
            "keeps its podCIDRs (they cannot change once set): 10.244.4.0/23 is a /23 but --node-cidr-mask-size-rule #2 \"agentpool=small:ipv4=26\" asks for /26"
        )
    );
    assert!(matches!(decisions[1].1.action, Action::Skip { .. }));
    assert_eq!(used(&a), vec![8]);
    assert_eq!(
        a.remove("old-big").metrics,
        vec![MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 7
        }]
    );
    assert_eq!(used(&a), vec![1], "the skipped Node's /26 stays reserved");
}

/// Dual-stack: all or nothing across families with per-family sizes.
#[test]
fn dual_stack_sizes_are_all_or_nothing() {
    let pools = rules(&["agentpool=bigpool:ipv4=23,ipv6=121"]);
    let config = nodeipam_core::config::validate(
        "10.244.0.0/16,fd00::/120",
        "",
        NodeMaskFlags {
            node_cidr_mask_size_ipv6: Some(122),
            ..NodeMaskFlags::default()
        },
    )
    .unwrap();
    let mut a = Allocator::with_sizing(&config, pools.sizing(&config).unwrap()).unwrap();
    assert_eq!(
        assigned(&mut a, &aks_node("big-0", "bigpool")),
        vec![cidr("10.244.0.0/23"), cidr("fd00::/121")]
    );
    assert_eq!(
        assigned(&mut a, &aks_node("default-0", "agentpool")),
        vec![cidr("10.244.2.0/24"), cidr("fd00::80/122")]
    );
    let before = used(&a);
    let d = a.decide(&aks_node("big-1", "bigpool"));
    let Action::Fail { reason } = &d.action else {
        panic!("expected a failure: {d:?}");
    };
    assert!(reason.contains("cluster CIDR fd00::/120"), "{reason}");
    assert_eq!(used(&a), before, "the IPv4 block is not taken either");
    assert_eq!(
        assigned(&mut a, &aks_node("default-1", "agentpool")),
        vec![cidr("10.244.3.0/24"), cidr("fd00::c0/122")]
    );
}

/// A bad mask label: one Warning event per object and reason, nothing allocated, then served once
/// the label is fixed.
#[test]
fn unusable_mask_label_is_refused_once_then_served_when_fixed() {
    let pools = NodePools {
        allow_mask_label: true,
        label_range: LabelRange {
            ipv4: Some((23, 26)),
            ipv6: None,
        },
        ..rules(&["agentpool=small:ipv4=26"])
    };
    let mut a = allocator("10.244.0.0/16", &pools);
    let mut node = aks_node("labelled", "agentpool");
    node.labels.insert(
        crate::node_pools::MASK_LABEL_IPV4.to_owned(),
        "16".to_owned(),
    );
    let reason = "label nodeipam.io/node-cidr-mask-size-ipv4=16 asks for /16, outside the range a label may ask for (/23 to /26, --node-mask-label-range); no pod CIDR is allocated until the label is fixed or removed";
    assert_eq!(
        a.decide(&node),
        Decision {
            action: Action::Skip {
                reason: reason.to_owned()
            },
            events: vec![EventSpec {
                kind: EventKind::Warning,
                reason: reasons::NODE_CIDR_MASK_LABEL_INVALID,
                note: format!("Node labelled: {reason}"),
                action: reasons::ACTION_ALLOCATE,
            }],
            metrics: vec![MetricEvent::NodeSkipped {
                kind: SkipKind::MaskLabel
            }],
            next: Next::Done,
        }
    );
    let again = a.decide(&node);
    assert!(
        again.events.is_empty() && again.metrics.is_empty(),
        "{again:?}"
    );
    assert_eq!(used(&a), vec![0]);
    node.labels.insert(
        crate::node_pools::MASK_LABEL_IPV4.to_owned(),
        "23".to_owned(),
    );
    assert_eq!(assigned(&mut a, &node), vec![cidr("10.244.0.0/23")]);
}
