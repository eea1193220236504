//! `--node-selector` in the decision logic: a Node not selected is never written, gets no event
//! and is not counted as skipped, while what its podCIDRs cover stays occupied (so a served Node
//! can never be given it). Real Nodes from `fixtures/nodes/`, with a label added: the AWS Nodes
//! (no podCIDRs) are ours (`example.com/cni=overlay`), the AKS kubenet Nodes (10.244.0-2.0/24)
//! belong to another CNI.

use super::*;
use crate::labels::NodeSelector;
use crate::test_support::cidr;

const OURS: (&str, &str) = ("example.com/cni", "overlay");
const OTHER: (&str, &str) = ("example.com/cni", "kubenet");

fn allocator() -> Allocator {
    let config = nodeipam_core::config::validate("10.244.0.0/16", "", Default::default())
        .expect("valid test config");
    let selector = NodeSelector::parse("example.com/cni=overlay").expect("selector");
    let sizing = Sizing::range_allocator(&config).with_node_selector(selector);
    Allocator::with_sizing(&config, sizing).expect("pool")
}

fn fixture(file: &str, label: (&str, &str)) -> Vec<NodeView> {
    let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let nodes = crate::nodelist::parse_nodes(&text).expect("fixture is a NodeList");
    nodes
        .iter()
        .map(|node| relabel(NodeView::from_node(node), label))
        .collect()
}

fn relabel(mut view: NodeView, (key, value): (&str, &str)) -> NodeView {
    view.labels.insert(key.to_owned(), value.to_owned());
    view
}

/// The AWS Nodes without podCIDRs, ours.
fn ours() -> Vec<NodeView> {
    fixture("05-aws-4nodes-no-podcidr.json", OURS)
}

/// The AKS Nodes holding 10.244.1.0/24, 10.244.2.0/24 and 10.244.0.0/24, another CNI's.
fn theirs() -> Vec<NodeView> {
    fixture("03-aks-kubenet-3nodes.json", OTHER)
}

fn used(allocator: &Allocator) -> u32 {
    allocator.pool_stats()[0].used_blocks
}

/// Nothing is written, reported or counted: no patch, no event, no metric but the pool's own.
fn assert_quiet(decision: &Decision) {
    assert!(decision.patch().is_none(), "{decision:?}");
    assert!(decision.events.is_empty(), "{decision:?}");
    assert!(
        decision.metrics.iter().all(|m| matches!(
            m,
            MetricEvent::Occupied { .. } | MetricEvent::Released { .. }
        )),
        "{decision:?}"
    );
    assert_eq!(decision.next, Next::Done);
}

#[test]
fn a_selected_node_is_served_as_without_a_selector() {
    let mut a = allocator();
    let node = &ours()[0];
    let decision = a.decide(node);
    assert_eq!(
        decision.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.0.0/24")],
            uid: node.uid.clone(),
        }
    );
    assert!(decision.patch().is_some());
    assert_eq!(used(&a), 1);
}

#[test]
fn an_unselected_node_without_pod_cidrs_gets_nothing() {
    let mut a = allocator();
    for node in fixture("05-aws-4nodes-no-podcidr.json", OTHER) {
        let decision = a.decide(&node);
        assert_eq!(decision.action, Action::NotServed { held: vec![] });
        assert_quiet(&decision);
        assert!(decision.metrics.is_empty());
        // Deciding again changes nothing.
        assert_eq!(a.decide(&node), decision);
    }
    // Without labels at all: not selected either.
    let mut bare = ours()[0].clone();
    bare.labels.clear();
    assert_eq!(a.decide(&bare).action, Action::NotServed { held: vec![] });
    assert_eq!(used(&a), 0);
    assert!(a.known_names().is_empty());
}

/// The safety rule: an unselected Node's podCIDRs are occupied (start-up and later), quietly, so
/// the served Nodes get the blocks around them.
#[test]
fn an_unselected_node_holding_a_block_keeps_it_occupied() {
    let mut a = allocator();
    let theirs = theirs();
    let decisions = a.startup_occupy(&theirs);
    for ((_, decision), node) in decisions.iter().zip(&theirs) {
        assert_eq!(
            decision.action,
            Action::NotServed {
                held: node.parsed_pod_cidrs().expect("fixture podCIDRs")
            }
        );
        assert_quiet(decision);
        assert!(matches!(
            decision.metrics.as_slice(),
            [MetricEvent::Occupied { blocks: 1, .. }]
        ));
    }
    assert_eq!(used(&a), 3);
    let assigned: Vec<Cidr> = ours()
        .iter()
        .flat_map(|node| match a.decide(node).action {
            Action::Assign { pod_cidrs, .. } => pod_cidrs,
            other => panic!("{other:?}"),
        })
        .collect();
    assert_eq!(
        assigned,
        [
            "10.244.3.0/24",
            "10.244.4.0/24",
            "10.244.5.0/24",
            "10.244.6.0/24"
        ]
        .map(cidr)
    );
    // A later unselected Node written by its own CNI is occupied the same way.
    let late = relabel(
        crate::test_support::node_view("late", &["10.244.7.0/24"]),
        OTHER,
    );
    let decision = a.decide(&late);
    assert_eq!(
        decision.action,
        Action::NotServed {
            held: vec![cidr("10.244.7.0/24")]
        }
    );
    assert_quiet(&decision);
    assert_eq!(used(&a), 8);
}

/// An unselected Node whose podCIDRs cannot be kept (here: overlapping another Node's) is not
/// skipped — no event, not counted — but what overlaps our range stays reserved.
#[test]
fn an_unselected_conflicting_node_is_not_counted_as_skipped() {
    let mut a = allocator();
    a.startup_occupy(&theirs());
    let clash = relabel(
        crate::test_support::node_view("clash", &["10.244.0.0/23"]),
        OTHER,
    );
    let decision = a.decide(&clash);
    assert_eq!(
        decision.action,
        Action::NotServed {
            held: vec![cidr("10.244.0.0/23")]
        }
    );
    assert_quiet(&decision);
    assert_eq!(a.skipped_count(), 0);
    assert_eq!(used(&a), 3);
    // Once it is selected, it is skipped as any Node would be: one event, one metric, counted.
    let entered = relabel(clash, OURS);
    let decision = a.decide(&entered);
    assert!(
        matches!(decision.action, Action::Skip { .. }),
        "{decision:?}"
    );
    assert_eq!(decision.events.len(), 1);
    assert_eq!(
        decision.metrics,
        vec![MetricEvent::NodeSkipped {
            kind: SkipKind::Conflict
        }]
    );
    assert_eq!(a.skipped_count(), 1);
    // And leaving the selection again stops counting it, keeping its range.
    let decision = a.decide(&relabel(entered, OTHER));
    assert_quiet(&decision);
    assert_eq!(a.skipped_count(), 0);
    assert_eq!(used(&a), 3);
}

/// A Node that leaves the selection keeps what it holds — a confirmed block, or a pending one
/// whose write may still land — and nothing is sent for it.
#[test]
fn a_node_leaving_the_selection_keeps_its_block() {
    let mut a = allocator();
    let nodes = ours();
    let pod_cidrs = match a.decide(&nodes[0]).action {
        Action::Assign { pod_cidrs, .. } => pod_cidrs,
        other => panic!("{other:?}"),
    };
    // Pending: the write may be in flight.
    let left = relabel(nodes[0].clone(), OTHER);
    let decision = a.decide(&left);
    assert_eq!(
        decision.action,
        Action::NotServed {
            held: pod_cidrs.clone()
        }
    );
    assert_quiet(&decision);
    assert!(decision.metrics.is_empty());
    assert!(a.is_pending(&nodes[0].name));
    assert_eq!(used(&a), 1);
    // Our write lands and the informer shows it, still unselected: held, nothing released.
    let mut written = left.clone();
    written.pod_cidrs = vec![pod_cidrs[0].to_string()];
    written.pod_cidr = Some(pod_cidrs[0].to_string());
    let decision = a.decide(&written);
    assert_eq!(
        decision.action,
        Action::NotServed {
            held: pod_cidrs.clone()
        }
    );
    assert_quiet(&decision);
    assert!(decision.metrics.is_empty());
    assert!(!a.is_pending(&nodes[0].name));
    // The next Node does not get that block.
    let next = a.decide(&nodes[1]);
    assert!(
        matches!(&next.action, Action::Assign { pod_cidrs: p, .. } if p == &[cidr("10.244.1.0/24")])
    );
    // Its deletion releases, as for any Node.
    let removed = a.remove(&nodes[0].name);
    assert_eq!(removed.action, Action::Released { pod_cidrs });
    assert_eq!(used(&a), 1);
}

/// A Node that enters the selection is served like a new Node: allocated if it has no
/// podCIDRs; kept with the events a Node seen anew gets if it has.
#[test]
fn a_node_entering_the_selection_is_served_like_a_new_node() {
    let mut a = allocator();
    let outside = fixture("05-aws-4nodes-no-podcidr.json", OTHER);
    assert_quiet(&a.decide(&outside[0]));
    let decision = a.decide(&relabel(outside[0].clone(), OURS));
    assert_eq!(
        decision.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.0.0/24")],
            uid: outside[0].uid.clone(),
        }
    );
    // A podCIDR with host bits (R08's finding) on an unselected Node: occupied quietly; the
    // finding's event comes when the Node is selected, once.
    let sloppy = relabel(
        crate::test_support::node_view("sloppy", &["10.244.9.1/24"]),
        OTHER,
    );
    let decision = a.decide(&sloppy);
    assert_quiet(&decision);
    assert_eq!(used(&a), 2);
    let served = relabel(sloppy, OURS);
    let decision = a.decide(&served);
    assert_eq!(
        decision.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.244.9.0/24")]
        }
    );
    assert_eq!(decision.events.len(), 1, "{decision:?}");
    assert!(decision.metrics.is_empty(), "occupied once: {decision:?}");
    assert!(a.decide(&served).events.is_empty());
    assert_eq!(used(&a), 2);
}
