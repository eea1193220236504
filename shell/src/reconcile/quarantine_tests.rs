//! The deletion quarantine (issue 31, item 2), decision by decision: a Node deleted and created
//! again at once with its podCIDRs (`kubectl replace --force`) keeps its block although a Node
//! waits for one.

use super::*;

use crate::test_support::{allocator, cidr, node_view as node};

/// Pool of two blocks; `a` and `b` served, `c` waiting (the setting). Quarantine on.
fn two_blocks_a_b_served_c_waiting() -> Allocator {
    let mut a = allocator("10.244.0.0/23");
    a.set_deletion_quarantine(true);
    for name in ["a", "b"] {
        let d = a.decide(&node(name, &[]));
        let Action::Assign { pod_cidrs, .. } = d.action else {
            panic!("{name}: {d:?}");
        };
        let texts: Vec<String> = pod_cidrs.iter().map(ToString::to_string).collect();
        let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
        assert!(matches!(
            a.decide(&node(name, &texts)).action,
            Action::Keep { .. }
        ));
    }
    assert_eq!(a.decide(&node("c", &[])).next, Next::WaitForFreeBlock);
    a
}

/// `name` re-created: a new object (another uid), with `pod_cidrs`.
fn recreated(name: &str, pod_cidrs: &[&str]) -> NodeView {
    NodeView {
        uid: Some(format!("uid-{name}-2")),
        ..node(name, pod_cidrs)
    }
}

#[test]
fn a_deleted_nodes_block_is_quarantined_not_released() {
    let mut a = two_blocks_a_b_served_c_waiting();
    let d = a.remove("a");
    assert_eq!(
        d,
        Decision::new(Action::Quarantined {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        })
        .then(Next::EndQuarantine)
    );
    // No release metric: nothing wakes `c`, and `c` finds no block if it is reconciled anyway.
    assert!(d.metrics.is_empty());
    assert_eq!(a.held("a"), Some(&[cidr("10.244.0.0/24")][..]));
    assert_eq!(a.decide(&node("c", &[])).next, Next::WaitForFreeBlock);
    // A second deletion of the name (a re-list) does not start it again: the quarantine's end
    // is the next `remove`, which releases and wakes `c`.
    let d = a.remove("a");
    assert_eq!(
        d.action,
        Action::Released {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        }
    );
    assert_eq!(
        d.metrics,
        [MetricEvent::Released {
            cluster_cidr: cidr("10.244.0.0/23"),
            blocks: 1
        }]
    );
    assert_eq!(a.held("a"), None);
    let d = a.decide(&node("c", &[]));
    assert_eq!(
        d.action,
        Action::Assign {
            pod_cidrs: vec![cidr("10.244.0.0/24")],
            uid: Some("uid-c".to_owned())
        }
    );
}

/// `kubectl replace --force`: deleted, then created again with its podCIDRs before the
/// quarantine ends. It keeps them; `c` still waits; the quarantine's end finds the name
/// present and changes nothing.
#[test]
fn a_node_recreated_with_its_pod_cidrs_keeps_them() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.remove("a");
    let d = a.decide(&recreated("a", &["10.244.0.0/24"]));
    assert_eq!(
        d,
        Decision::new(Action::Keep {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        })
    );
    assert_eq!(a.record_uid("a").as_deref(), Some("uid-a-2"));
    assert_eq!(a.decide(&node("c", &[])).next, Next::WaitForFreeBlock);
    // The re-created Node is deleted for real later: quarantined again, then released.
    assert!(matches!(a.remove("a").action, Action::Quarantined { .. }));
    assert!(matches!(a.remove("a").action, Action::Released { .. }));
}

/// A Node re-created without podCIDRs (a restore that dropped `spec`) gets its old block back,
/// written to the new object; `c` still waits.
#[test]
fn a_node_recreated_without_pod_cidrs_gets_its_block_back() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.remove("a");
    let d = a.decide(&recreated("a", &[]));
    assert_eq!(
        d,
        Decision::assign(vec![cidr("10.244.0.0/24")], Some("uid-a-2"))
    );
    assert!(d.metrics.is_empty(), "nothing was freed or allocated anew");
    assert!(a.is_pending("a"));
    assert_eq!(a.decide(&node("c", &[])).next, Next::WaitForFreeBlock);
    // Not quarantined any more: its pending write is released at once if it goes again.
    assert!(matches!(a.remove("a").action, Action::Released { .. }));
}

/// Re-created with other podCIDRs (a range of its own outside the pool's blocks it held): the
/// quarantine ends, the old block is freed, and `c` can have it.
#[test]
fn a_node_recreated_with_other_pod_cidrs_ends_the_quarantine() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.remove("a");
    let d = a.decide(&recreated("a", &["10.244.1.0/25"]));
    // 10.244.1.0/25 is b's: a conflict, as for any Node.
    assert!(matches!(d.action, Action::Skip { .. }), "{d:?}");
    assert!(d.metrics.contains(&MetricEvent::Released {
        cluster_cidr: cidr("10.244.0.0/23"),
        blocks: 1
    }));
    assert!(matches!(
        a.decide(&node("c", &[])).action,
        Action::Assign { .. }
    ));
}

/// A quarantine never outweighs a Node that shows the block: another Node with those podCIDRs
/// (written by someone else) keeps them, the quarantine ends, and the deleted Node's name
/// re-created with them is the conflict.
#[test]
fn another_node_showing_a_quarantined_block_keeps_it() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.remove("a");
    let d = a.decide(&node("x", &["10.244.0.0/24"]));
    assert_eq!(
        d.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.244.0.0/24")]
        }
    );
    assert_eq!(a.held("a"), None, "the quarantine ended");
    let d = a.decide(&recreated("a", &["10.244.0.0/24"]));
    assert!(
        matches!(&d.action, Action::Skip { reason } if reason.contains("held by Node x")),
        "{d:?}"
    );
}

/// The quarantine ended before the re-created Node was seen (too short, a restart): `c` got the
/// block, and the re-created Node showing it is reported as a conflict — never kept twice.
/// Safety does not depend on the quarantine's length.
#[test]
fn a_quarantine_that_ends_early_leaves_a_reported_conflict() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.remove("a");
    a.remove("a");
    assert!(matches!(
        a.decide(&node("c", &[])).action,
        Action::Assign { .. }
    ));
    let d = a.decide(&recreated("a", &["10.244.0.0/24"]));
    assert!(
        matches!(&d.action, Action::Skip { reason } if reason.contains("held by Node c")),
        "{d:?}"
    );
    assert_eq!(
        d.events.iter().map(|e| e.reason).collect::<Vec<_>>(),
        [reasons::POD_CIDR_CONFLICT]
    );
}

/// Off (`--deleted-node-cidr-quarantine=0`, and the allocator's default): released at once.
#[test]
fn without_the_quarantine_a_deletion_releases_at_once() {
    let mut a = two_blocks_a_b_served_c_waiting();
    a.set_deletion_quarantine(false);
    assert!(matches!(a.remove("a").action, Action::Released { .. }));
}

/// A pending allocation (never shown by the Node) is released at once, quarantine or not.
#[test]
fn a_pending_allocation_is_not_quarantined() {
    let mut a = allocator("10.244.0.0/23");
    a.set_deletion_quarantine(true);
    assert!(matches!(
        a.decide(&node("p", &[])).action,
        Action::Assign { .. }
    ));
    assert!(matches!(a.remove("p").action, Action::Released { .. }));
}
