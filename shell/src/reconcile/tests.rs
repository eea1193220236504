//! Table-style tests of the decision logic: each compares the produced action, patch, events and
//! metrics with the expected ones, and checks nothing else was emitted.

use super::*;
use serde_json::json;
use std::time::Duration;

use nodeipam_core::NodeMaskFlags;

use crate::test_support::{
    allocator, cidr, fixture_views as fixture, ipam_config as config, node_view as node,
};

fn used(allocator: &Allocator) -> Vec<u32> {
    allocator
        .pool_stats()
        .iter()
        .map(|s| s.used_blocks)
        .collect()
}

/// The index entry stays as small as [`NodeRecord`]'s doc says: 64 bytes on 64-bit targets
/// (a `Vec` of held CIDRs made it 72), so 262,144 buckets (150,000 Nodes) cost 16 MiB of entries.
#[test]
#[cfg(target_pointer_width = "64")]
fn node_record_is_64_bytes() {
    assert_eq!(std::mem::size_of::<NodeRecord>(), 64);
}

#[test]
fn assigns_in_order_with_upstream_patch() {
    let mut a = allocator("10.244.0.0/16");
    let d = a.decide(&node("n1", &[]));
    assert_eq!(
        d,
        Decision {
            action: Action::Assign {
                pod_cidrs: vec![cidr("10.244.0.0/24")],
                uid: Some("uid-n1".to_owned()),
            },
            events: vec![],
            metrics: vec![MetricEvent::Allocated {
                cluster_cidr: cidr("10.244.0.0/16"),
                tries: 0,
                blocks: 1,
            }],
            next: Next::Done,
        }
    );
    assert_eq!(
        d.patch(),
        Some(json!({
            "metadata":{"uid":"uid-n1"},
            "spec":{"podCIDR":"10.244.0.0/24","podCIDRs":["10.244.0.0/24"]}
        }))
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
    assert_eq!(again.patch(), first.patch());
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
            pod_cidrs: vec![cidr("10.244.1.0/24")],
            uid: Some("uid-n1".to_owned()),
        }
    );
}

#[test]
fn podcidrs_written_by_another_actor_count_as_occupied_once() {
    // A Node that appears with podCIDRs while the controller runs (another allocator, an
    // operator, a write of a previous leader) marks its block used: the decision says so, so
    // the pool gauges and the allocations counter move as upstream's CidrSet.Occupy makes
    // them (found by the chaos suite: the usage gauge lagged the Nodes by 14 blocks).
    let mut a = allocator("10.244.0.0/16");
    let d = a.decide(&node("theirs", &["10.244.9.0/24"]));
    assert_eq!(
        d,
        Decision {
            action: Action::Keep {
                pod_cidrs: vec![cidr("10.244.9.0/24")]
            },
            events: vec![],
            metrics: vec![MetricEvent::Occupied {
                cluster_cidr: cidr("10.244.0.0/16"),
                blocks: 1
            }],
            next: Next::Done,
        }
    );
    assert_eq!(used(&a), vec![1]);
    // Seen again (a heartbeat): nothing newly used, nothing reported.
    let d = a.decide(&node("theirs", &["10.244.9.0/24"]));
    assert_eq!(d.metrics, vec![]);
    assert_eq!(used(&a), vec![1]);
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
    // Ours freed, theirs newly occupied: both move the pool gauges.
    assert_eq!(
        d.metrics,
        vec![
            MetricEvent::Released {
                cluster_cidr: cidr("10.244.0.0/16"),
                blocks: 1
            },
            MetricEvent::Occupied {
                cluster_cidr: cidr("10.244.0.0/16"),
                blocks: 1
            }
        ]
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
    assert_eq!(d.patch(), None);
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
            pod_cidrs: vec![cidr("10.0.0.0/31")],
            uid: Some("uid-c".to_owned()),
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
            pod_cidrs: vec![cidr("10.0.1.0/24")],
            uid: Some("uid-n".to_owned()),
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
        assert_eq!(d.patch(), None);
        assert_eq!(d.events.len(), 1, "{}", case.node.name);
        assert_eq!(d.events[0].reason, case.kind.event_reason());
        // The reserved part is reported as occupied (so the pool gauges move), then the skip.
        let occupied: u32 = d
            .metrics
            .iter()
            .map(|m| match m {
                MetricEvent::Occupied { blocks, .. } => *blocks,
                _ => 0,
            })
            .sum();
        assert_eq!(
            d.metrics.last(),
            Some(&MetricEvent::NodeSkipped { kind: case.kind })
        );
        assert_eq!(
            d.metrics
                .iter()
                .filter(|m| !matches!(m, MetricEvent::Occupied { .. }))
                .count(),
            1,
            "{}: {:?}",
            case.node.name,
            d.metrics
        );
        assert_eq!(used(&a), case.reserved, "{}", case.node.name);
        assert_eq!(
            occupied,
            case.reserved.iter().sum::<u32>(),
            "{}",
            case.node.name
        );
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
        d.patch(),
        Some(json!({
            "metadata":{"uid":"uid-new"},
            "spec":{"podCIDR":"10.244.3.0/24","podCIDRs":["10.244.3.0/24"]}
        }))
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
    // Kept in the Node's order; each family's block counted as occupied in its cluster CIDR.
    let mut kept = Decision::new(Action::Keep {
        pod_cidrs: vec![cidr("fd00::/110"), cidr("10.244.0.0/24")],
    });
    kept.metrics = vec![
        MetricEvent::Occupied {
            cluster_cidr: cidr("fd00::/104"),
            blocks: 1,
        },
        MetricEvent::Occupied {
            cluster_cidr: cidr("10.244.0.0/16"),
            blocks: 1,
        },
    ];
    // With the R10 finding's event (the family order), as every occupy of new podCIDRs has.
    kept.events = vec![EventSpec {
        kind: EventKind::Warning,
        reason: reasons::POD_CIDR_FAMILY_ORDER,
        note: "Node worker-1 has podCIDRs [fd00::/110,10.244.0.0/24] in the other family order than --cluster-cidr: kept (matched by family), but kube-controller-manager would refuse them, and spec.podCIDR is of the other family than on new Nodes".to_owned(),
        action: reasons::ACTION_OCCUPY,
    }];
    assert_eq!(decisions[0].1, kept);
    // A new Node gets IPv4 first (flag order), one block of each family.
    let d = a.decide(&node("worker-2", &[]));
    assert_eq!(
        d.patch(),
        Some(json!({
            "metadata":{"uid":"uid-worker-2"},
            "spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24","fd00::4:0/110"]}
        }))
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

/// A real AKS Node whose podCIDR was stored with leading zeros (`010.244.050.000/24`, as older
/// API servers accepted): kube-controller-manager reads it with ParseCIDRSloppy as
/// 10.244.50.0/24 and occupies it. So does the allocator — at start-up and when such a Node
/// shows up while it runs — and that block is never handed to another Node.
#[test]
fn pod_cidr_with_leading_zeros_is_occupied_as_decimal() {
    let nodes = fixture("03-aks-kubenet-3nodes.json");
    let mut sloppy = nodes[0].clone();
    sloppy.pod_cidr = Some("010.244.050.000/24".to_owned());
    sloppy.pod_cidrs = vec!["010.244.050.000/24".to_owned()];
    let held = vec![cidr("10.244.50.0/24")];
    for at_startup in [true, false] {
        let mut a = allocator("10.244.0.0/16");
        let decision = if at_startup {
            let mut decisions = a.startup_occupy(std::slice::from_ref(&sloppy));
            assert_eq!(decisions.len(), 1);
            decisions.remove(0).1
        } else {
            a.decide(&sloppy)
        };
        assert_eq!(
            decision,
            Decision {
                action: Action::Keep {
                    pod_cidrs: held.clone()
                },
                // R08, at start-up and while running alike.
                events: vec![EventSpec {
                    kind: EventKind::Warning,
                    reason: reasons::POD_CIDR_NOT_CANONICAL,
                    note: format!(
                        "Node {} has podCIDR \"010.244.050.000/24\", which is not canonical (leading zeros): the controller reads them as decimal, as kube-controller-manager does, and reserves 10.244.50.0/24, but a tool reading them as octal sees another range; write podCIDRs without leading zeros",
                        sloppy.name
                    ),
                    action: reasons::ACTION_OCCUPY,
                }],
                metrics: vec![MetricEvent::Occupied {
                    cluster_cidr: cidr("10.244.0.0/16"),
                    blocks: 1
                }],
                next: Next::Done,
            },
            "at start-up: {at_startup}"
        );
        // Seen again: nothing new (no second event).
        assert_eq!(
            a.decide(&sloppy),
            Decision::new(Action::Keep {
                pod_cidrs: held.clone()
            })
        );
        assert_eq!(a.held(&sloppy.name), Some(held.as_slice()));
        // Every other block goes to a new Node; 10.244.50.0/24 never does.
        for i in 0..255 {
            let d = a.decide(&node(&format!("new-{i}"), &[]));
            let Action::Assign { pod_cidrs, .. } = &d.action else {
                panic!("new-{i}: {:?}", d.action);
            };
            assert_ne!(pod_cidrs, &held, "new-{i}");
        }
        assert!(matches!(
            a.decide(&node("one-too-many", &[])).action,
            Action::Fail { .. }
        ));
    }
}

/// Once the pool is full, a failing Node's reason does not look through the held Nodes again
/// (it did once per failure: `plan` over 300,000 Nodes, 60,000 holding blocks, took 8 min):
/// 1,000 failures after 256 holders cost one pass over the records, until holdings change.
#[test]
fn failures_on_a_full_pool_do_not_rescan_the_holders() {
    let mut a = allocator("10.244.0.0/16");
    // A Node holding a range larger than a block, so the clause is not empty.
    a.decide(&node("wide", &["10.244.0.0/23"]));
    for i in 0..254 {
        let d = a.decide(&node(&format!("n{i}"), &[]));
        assert!(matches!(d.action, Action::Assign { .. }), "n{i}");
    }
    let records = a.nodes.len() as u64;
    assert_eq!(records, 255);
    let first = a.decide(&node("waiting-0", &[]));
    let Action::Fail { reason } = &first.action else {
        panic!("{:?}", first.action);
    };
    assert!(
        reason
            .ends_with("; blocks of 10.244.0.0/16 are held by Node wide (10.244.0.0/23: 2 blocks)"),
        "{reason}"
    );
    for i in 1..1000 {
        let d = a.decide(&node(&format!("waiting-{i}"), &[]));
        assert_eq!(d.action, first.action, "waiting-{i}");
    }
    assert_eq!(a.space_holders_visited, records);
    // A change of holdings (a Node gone) is seen: the freed block goes to the next Node, and
    // the clause is recomputed at the next failure.
    a.remove("n0");
    assert!(matches!(
        a.decide(&node("waiting-0", &[])).action,
        Action::Assign { .. }
    ));
    let d = a.decide(&node("waiting-1", &[]));
    assert_eq!(d.action, first.action);
    assert_eq!(a.space_holders_visited, 2 * records);
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
            pod_cidrs: vec![cidr("10.244.1.0/24")],
            uid: Some("uid-n1-second".to_owned()),
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
    let skip_kind = |d: &Decision| match (&d.action, d.metrics.last()) {
        (Action::Skip { .. }, Some(MetricEvent::NodeSkipped { kind })) => Some(*kind),
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

// ---- PATCH outcomes: an unknown outcome never releases --------------------------------------

fn unknown() -> PatchOutcome {
    PatchOutcome::Unknown {
        message: "no answer within 11s".to_owned(),
    }
}

fn forbidden() -> PatchOutcome {
    PatchOutcome::Refused {
        status: 403,
        message: "403 Forbidden: no".to_owned(),
    }
}

fn assigned(a: &mut Allocator, name: &str) -> Vec<Cidr> {
    match a.decide(&node(name, &[])).action {
        Action::Assign { pod_cidrs, .. } => pod_cidrs,
        other => panic!("expected an assignment, got {other:?}"),
    }
}

#[test]
fn an_unknown_outcome_keeps_the_block_and_sends_the_same_cidrs_again() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    let d = a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    assert_eq!(
        d,
        Decision {
            action: Action::KeepTrying {
                pod_cidrs: ours.clone(),
                reason: "outcome unknown: no answer within 11s; the write may still land, so 10.244.0.0/24 stays reserved and is sent again".to_owned(),
            },
            events: vec![],
            metrics: vec![MetricEvent::PatchFailed {
                error: "unknown_outcome"
            }],
            next: Next::RetryBackoff,
        }
    );
    assert!(a.is_maybe_sent("n1"));
    assert_eq!(used(&a), vec![1]);
    // The retry re-sends exactly the same body; nothing new is allocated.
    let again = a.decide(&node("n1", &[]));
    assert_eq!(again, Decision::assign(ours.clone(), Some("uid-n1")));
    // Another Node never gets the block in between.
    assert_ne!(assigned(&mut a, "n2"), ours);
    assert_eq!(used(&a), vec![2]);
}

#[test]
fn a_refusal_releases_only_when_no_earlier_attempt_can_land() {
    // First attempt refused outright: nothing can land, the block is free again.
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    let d = a.patch_outcome("n1", Some("uid-n1"), &ours, forbidden());
    assert_eq!(
        d.action,
        Action::Released {
            pod_cidrs: ours.clone()
        }
    );
    assert_eq!(d.next, Next::RetryBackoff);
    assert_eq!(
        d.metrics,
        vec![
            MetricEvent::PatchFailed { error: "refused" },
            MetricEvent::Released {
                cluster_cidr: cidr("10.244.0.0/16"),
                blocks: 1
            }
        ]
    );
    assert_eq!(d.events.len(), 1);
    assert_eq!(d.events[0].reason, reasons::CIDR_ASSIGNMENT_FAILED);
    assert_eq!(used(&a), vec![0]);

    // Unknown first, refused later: the first attempt may still land, so the block stays.
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let d = a.patch_outcome("n1", Some("uid-n1"), &ours, forbidden());
    assert!(matches!(d.action, Action::KeepTrying { .. }), "{d:?}");
    assert_eq!(d.next, Next::RetryBackoff);
    assert_eq!(used(&a), vec![1]);
    assert!(a.is_pending("n1"));
}

#[test]
fn cidr_assignment_failed_is_published_once_after_three_failures() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    let events: Vec<usize> = (0..5)
        .map(|_| {
            a.patch_outcome("n1", Some("uid-n1"), &ours, unknown())
                .events
                .len()
        })
        .collect();
    assert_eq!(events, vec![0, 0, 1, 0, 0]);
}

#[test]
fn retry_after_is_honoured_and_keeps_the_block() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    let d = a.patch_outcome(
        "n1",
        Some("uid-n1"),
        &ours,
        PatchOutcome::RetryLater {
            status: 429,
            retry_after: Some(Duration::from_secs(3)),
            message: "slow down".to_owned(),
        },
    );
    assert_eq!(d.next, Next::RetryAfter(Duration::from_secs(3)));
    assert_eq!(
        d.metrics,
        vec![MetricEvent::PatchFailed {
            error: "too_many_requests"
        }]
    );
    assert!(!a.is_maybe_sent("n1"), "a 429 wrote nothing");
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn applied_confirms_and_a_stale_view_afterwards_changes_nothing() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let d = a.patch_outcome(
        "n1",
        Some("uid-n1"),
        &ours,
        PatchOutcome::Applied(node("n1", &["10.244.0.0/24"])),
    );
    assert_eq!(
        d,
        Decision::new(Action::Keep {
            pod_cidrs: ours.clone()
        })
    );
    assert!(!a.is_pending("n1"));
    assert_eq!(
        a.decide(&node("n1", &[])),
        Decision::new(Action::Keep { pod_cidrs: ours })
    );
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn podcidrs_set_by_someone_else_release_ours_then_theirs_are_kept() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let d = a.patch_outcome(
        "n1",
        Some("uid-n1"),
        &ours,
        PatchOutcome::CannotApply {
            kind: CannotApplyKind::PodCidrsAlreadySet,
            message: "spec.podCIDRs: Forbidden".to_owned(),
        },
    );
    assert_eq!(
        d,
        Decision {
            action: Action::Released {
                pod_cidrs: ours.clone()
            },
            events: vec![],
            metrics: vec![
                MetricEvent::PatchFailed {
                    error: "pod_cidrs_already_set"
                },
                MetricEvent::Released {
                    cluster_cidr: cidr("10.244.0.0/16"),
                    blocks: 1
                }
            ],
            next: Next::Reread,
        }
    );
    // The re-read shows theirs: occupied, kept.
    let d = a.decide(&node("n1", &["10.244.9.0/24"]));
    assert_eq!(
        d.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.244.9.0/24")]
        }
    );
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn a_gone_node_releases_and_its_stale_copy_gets_nothing() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let d = a.patch_outcome("n1", Some("uid-n1"), &ours, PatchOutcome::NotFound);
    assert_eq!(
        d.action,
        Action::Released {
            pod_cidrs: ours.clone()
        }
    );
    assert_eq!(used(&a), vec![0]);
    // The informer still shows the deleted object: nothing is allocated to it.
    let d = a.decide(&node("n1", &[]));
    assert!(matches!(d.action, Action::Skip { .. }), "{d:?}");
    assert!(d.metrics.is_empty() && d.events.is_empty() && d.patch().is_none());
    assert_eq!(used(&a), vec![0]);
    // A new object of that name is served.
    let mut second = node("n1", &[]);
    second.uid = Some("uid-n1-second".to_owned());
    assert!(matches!(a.decide(&second).action, Action::Assign { .. }));
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn the_node_replaced_under_a_pending_write_frees_the_old_block() {
    // Writes are pinned to uid-n1, so none of them can reach the new object.
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let mut second = node("n1", &[]);
    second.uid = Some("uid-n1-second".to_owned());
    let d = a.decide(&second);
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.1.0/24")],
            uid: Some("uid-n1-second".to_owned()),
        }
    );
    assert_eq!(
        d.patch(),
        Some(json!({
            "metadata":{"uid":"uid-n1-second"},
            "spec":{"podCIDR":"10.244.1.0/24","podCIDRs":["10.244.1.0/24"]}
        }))
    );
    assert_eq!(used(&a), vec![1], "the old reservation was released");
    // The old write's late answer changes nothing now.
    let late = a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    assert!(matches!(late.action, Action::Skip { .. }), "{late:?}");
    assert!(a.is_pending("n1"));
    assert_eq!(used(&a), vec![1]);
}

#[test]
fn deleting_a_node_with_a_write_in_doubt_releases_its_block() {
    let mut a = allocator("10.244.0.0/16");
    let ours = assigned(&mut a, "n1");
    a.patch_outcome("n1", Some("uid-n1"), &ours, unknown());
    let mut deleting = node("n1", &[]);
    deleting.deleting = true;
    let d = a.decide(&deleting);
    assert!(matches!(d.action, Action::Skip { .. }), "{d:?}");
    assert_eq!(used(&a), vec![1], "kept until the object is gone");
    let d = a.remove("n1");
    assert_eq!(d.action, Action::Released { pod_cidrs: ours });
    assert_eq!(used(&a), vec![0]);
}

#[test]
fn exhaustion_names_the_node_holding_the_whole_cluster_cidr() {
    let mut a = allocator("10.244.0.0/16");
    let d = a.decide(&node("whole", &["0.0.0.0/0"]));
    assert!(matches!(d.action, Action::Skip { .. }));
    let d = a.decide(&node("n1", &[]));
    let Action::Fail { reason } = &d.action else {
        panic!("expected a failure: {d:?}");
    };
    assert!(
        reason.contains("held by Node whole (0.0.0.0/0, skipped: 256 blocks)"),
        "{reason}"
    );
    assert_eq!(d.events.len(), 1);
    assert!(d.events[0].note.contains("Node whole"), "{:?}", d.events[0]);
    assert_eq!(d.next, Next::WaitForFreeBlock);
}

#[test]
fn uncovered_runs_of_block_ranges() {
    type Runs = Vec<(u32, u32)>;
    let cases: [(u32, u32, Runs, Runs); 7] = [
        (0, 9, vec![], vec![(0, 9)]),
        (0, 9, vec![(0, 9)], vec![]),
        (0, 9, vec![(3, 4)], vec![(0, 2), (5, 9)]),
        (0, 9, vec![(5, 20), (0, 1)], vec![(2, 4)]),
        (5, 9, vec![(0, 6), (8, 8)], vec![(7, 7), (9, 9)]),
        (0, 9, vec![(2, 3), (3, 5), (4, 4)], vec![(0, 1), (6, 9)]),
        (0, 9, vec![(12, 15)], vec![(0, 9)]),
    ];
    for (begin, end, mut covered, want) in cases {
        assert_eq!(
            uncovered_runs(begin, end, &mut covered),
            want,
            "{begin}..={end} minus {covered:?}"
        );
    }
    assert_eq!(uncovered_runs(0, 9, &mut [(0, u32::MAX)]), vec![]);
}

/// Found by the chaos suite (seed 1118): a write pinned to the first object of a name is refused
/// (the Node was re-created), the GET shows the second object, the write to it gets no answer —
/// and then the informer, still behind, shows the first object again, then its deletion. Neither
/// may release the block of the write in doubt (it can still land on the second object), nor
/// assign the first object anything.
#[test]
fn an_informer_behind_a_get_cannot_release_a_write_in_doubt() {
    let mut a = allocator("10.244.0.0/16");
    let mut first = node("n1", &[]);
    first.uid = Some("uid-first".to_owned());
    let mut second = node("n1", &[]);
    second.uid = Some("uid-second".to_owned());
    let d = a.decide(&first);
    let Action::Assign {
        pod_cidrs: to_first,
        ..
    } = d.action
    else {
        panic!("{d:?}")
    };
    let refused = a.patch_outcome(
        "n1",
        Some("uid-first"),
        &to_first,
        PatchOutcome::CannotApply {
            kind: CannotApplyKind::NodeReplaced,
            message: "metadata.uid: field is immutable".to_owned(),
        },
    );
    assert_eq!(refused.next, Next::Reread);
    // The GET shows the second object: it gets a block; its write gets no answer.
    let d = a.decide_fresh(&second);
    let Action::Assign {
        pod_cidrs: to_second,
        ..
    } = d.action
    else {
        panic!("{d:?}")
    };
    a.patch_outcome("n1", Some("uid-second"), &to_second, unknown());
    assert_eq!(used(&a), vec![1]);
    // The informer's older copy of the first object: nothing changes, read the Node again.
    let stale = a.decide(&first);
    assert!(matches!(stale.action, Action::Skip { .. }), "{stale:?}");
    assert_eq!((stale.patch(), stale.next), (None, Next::Reread));
    assert_eq!(stale.metrics, vec![]);
    assert_eq!(a.held("n1"), Some(to_second.as_slice()));
    // The informer's deletion of the first object: nothing released, read the Node again.
    let gone = a.remove("n1");
    assert_eq!(gone.next, Next::Reread);
    assert_eq!(gone.metrics, vec![]);
    assert_eq!(used(&a), vec![1]);
    // The informer catches up: the same CIDRs are sent to the second object again.
    let d = a.decide(&second);
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: to_second.clone(),
            uid: Some("uid-second".to_owned()),
        }
    );
    // Caught up, the informer is trusted again: a third object of the name replaces the second
    // (writes pinned to uid-second cannot reach it), so its block is released.
    let mut third = node("n1", &[]);
    third.uid = Some("uid-third".to_owned());
    let d = a.decide(&third);
    assert!(matches!(d.action, Action::Assign { .. }), "{d:?}");
    assert_eq!(used(&a), vec![1]);
    assert_ne!(a.held("n1"), Some(to_second.as_slice()));
}

/// The GET that follows an informer copy that may be stale: a 404 releases the record's object
/// (writes pinned to its uid can never apply); another uid releases it and allocates afresh.
#[test]
fn the_get_after_a_stale_informer_copy_settles_it() {
    let mut a = allocator("10.244.0.0/16");
    let mut second = node("n1", &[]);
    second.uid = Some("uid-second".to_owned());
    let d = a.decide_fresh(&second);
    let Action::Assign {
        pod_cidrs: ours, ..
    } = d.action
    else {
        panic!("{d:?}")
    };
    a.patch_outcome("n1", Some("uid-second"), &ours, unknown());
    assert_eq!(a.remove("n1").next, Next::Reread);
    assert_eq!(a.record_uid("n1").as_deref(), Some("uid-second"));
    let d = a.object_gone("n1", Some("uid-second"));
    assert_eq!(d.action, Action::Released { pod_cidrs: ours });
    assert_eq!(used(&a), vec![0]);
}

/// The one rule for which Node object a decision's events name (issue 34): an assignment names
/// the object it was decided on, whatever uid the caller had (a cached or earlier one); any other
/// decision names the caller's.
#[test]
fn events_name_the_assigned_object_else_the_known_uid() {
    let mut a = allocator("10.244.0.0/16");
    let assign = a.decide(&node("n1", &[]));
    assert_eq!(assign.subject_uid(Some("uid-cached")), Some("uid-n1"));
    assert_eq!(assign.subject_uid(None), Some("uid-n1"));
    assert!(a.confirm("n1", &[cidr("10.244.0.0/24")]));
    let keep = a.decide(&node("n1", &["10.244.0.0/24"]));
    assert!(matches!(keep.action, Action::Keep { .. }));
    assert_eq!(keep.subject_uid(Some("uid-cached")), Some("uid-cached"));
    let no_uid = Decision::assign(vec![cidr("10.244.1.0/24")], None);
    assert_eq!(no_uid.subject_uid(Some("uid-known")), Some("uid-known"));
}
