//! IPv4-mapped podCIDRs (issue 31, item 1), decision by decision: a legacy Node's
//! `::ffff:10.9.1.0/120` reserves the IPv4 range Go reads, `10.9.1.0/24`.

use super::*;

use crate::test_support::{allocator, cidr, fixture_views, node_view as node};

/// A real AKS Node whose podCIDR is stored in IPv4-mapped IPv6 form
/// (`::ffff:10.244.50.0/120`, as servers before 1.36 accepted): Go's `net.ParseCIDR` (so kcm,
/// the kubelet, CNI plugins) reads it as the IPv4 range 10.244.50.0/24. It is kept and that range
/// reserved — at start-up and while running — with an R08 warning that names the IPv4 range
/// and says nothing of IPv6; the range never goes to another Node. Before, it was skipped as
/// "IPv6, no IPv6 cluster CIDR" and 10.244.50.0/24 was handed out.
#[test]
fn an_ipv4_mapped_pod_cidr_reserves_the_ipv4_range_go_reads() {
    let nodes = fixture_views("03-aks-kubenet-3nodes.json");
    for (written, held) in [
        ("::ffff:10.244.50.0/120", "10.244.50.0/24"),
        ("::ffff:10.244.50.60/126", "10.244.50.60/30"),
    ] {
        let mut legacy = nodes[0].clone();
        legacy.pod_cidr = Some(written.to_owned());
        legacy.pod_cidrs = vec![written.to_owned()];
        let held = vec![cidr(held)];
        for at_startup in [true, false] {
            let mut a = allocator("10.244.0.0/16");
            let decision = if at_startup {
                let mut decisions = a.startup_occupy(std::slice::from_ref(&legacy));
                assert_eq!(decisions.len(), 1);
                decisions.remove(0).1
            } else {
                a.decide(&legacy)
            };
            assert_eq!(
                decision,
                Decision {
                    action: Action::Keep {
                        pod_cidrs: held.clone()
                    },
                    events: vec![EventSpec {
                        kind: EventKind::Warning,
                        reason: reasons::POD_CIDR_NOT_CANONICAL,
                        note: format!(
                            "Node {} has podCIDR \"{written}\", which is not canonical (an IPv4 range in \"::ffff:\" mapped notation): Go's net.ParseCIDR, kube-controller-manager, the kubelet and CNI plugins read it as {h}, and the controller reserves {h}; write it as {h}",
                            legacy.name,
                            h = held[0]
                        ),
                        action: reasons::ACTION_OCCUPY,
                    }],
                    metrics: vec![MetricEvent::Occupied {
                        cluster_cidr: cidr("10.244.0.0/16"),
                        blocks: 1
                    }],
                    next: Next::Done,
                },
                "{written}, at start-up: {at_startup}"
            );
            assert!(!decision.events[0].note.contains("IPv6"));
            assert_eq!(
                a.decide(&legacy),
                Decision::new(Action::Keep {
                    pod_cidrs: held.clone()
                })
            );
            for i in 0..255 {
                let d = a.decide(&node(&format!("new-{i}"), &[]));
                let Action::Assign { pod_cidrs, .. } = &d.action else {
                    panic!("new-{i}: {:?}", d.action);
                };
                assert!(!pod_cidrs[0].overlaps(&held[0]), "new-{i}: {pod_cidrs:?}");
            }
            assert!(matches!(
                a.decide(&node("one-too-many", &[])).action,
                Action::Fail { .. }
            ));
        }
    }
}

/// A mapped podCIDR outside the cluster CIDRs is out of range as the IPv4 range it is, never
/// "IPv6"; a mapped prefix under /96 is ordinary IPv6, as for Go.
#[test]
fn mapped_pod_cidr_reasons_name_the_range_go_reads() {
    let mut a = allocator("10.244.0.0/16");
    let d = a.decide(&node("far", &["::ffff:192.168.0.0/120"]));
    let Action::Skip { reason } = &d.action else {
        panic!("{d:?}");
    };
    assert!(reason.contains("192.168.0.0/24"), "{reason}");
    assert!(!reason.contains("IPv6"), "{reason}");
    let d = a.decide(&node("short", &["::ffff:10.244.0.0/95"]));
    let Action::Skip { reason } = &d.action else {
        panic!("{d:?}");
    };
    assert!(reason.contains("::fffe:0:0/95"), "{reason}");
    // Two podCIDRs Go reads as IPv4: the same family twice.
    let d = a.decide(&node("twice", &["10.244.1.0/24", "::ffff:10.244.2.0/120"]));
    assert!(matches!(d.action, Action::Skip { .. }), "{d:?}");
    assert_eq!(
        d.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        [reasons::POD_CIDR_INVALID]
    );
}
