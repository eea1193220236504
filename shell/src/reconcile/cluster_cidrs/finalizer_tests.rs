//! A ClusterCIDR serves new Nodes only once the controller has seen its finalizer on it
//! (`ClusterCidrPool::awaiting_finalizer`): found by the chaos suite's ClusterCIDR variant (seed
//! 3), where a pool deleted before its finalizer was on went away at once while the controller
//! kept handing out its blocks.

use super::super::{Action, Next};
use super::*;
use crate::cluster_cidr::FINALIZER;
use crate::test_support::{
    allocator, assigned, cluster_cidr_pool, master, masters_spec, node_view as node,
};

fn masters_pool(awaiting_finalizer: bool) -> ClusterCidrPool {
    let mut pool = cluster_cidr_pool("masters", masters_spec("10.200.0.0/24"));
    pool.awaiting_finalizer = awaiting_finalizer;
    pool
}

#[test]
fn a_pool_without_its_finalizer_is_hosted_but_serves_no_node_until_the_finalizer_is_seen() {
    let mut a = allocator("10.128.0.0/16");
    let sync = a.sync_cluster_cidrs(&[masters_pool(true)]);
    assert_eq!(sync.added, vec!["masters".to_owned()]);
    assert!(!sync.capacity_added, "nothing can be served from it yet");
    // A master waits for the pool (neither served from it nor passed on to the flag CIDR);
    // a worker, whose order does not reach the pool, is served from the flag CIDR meanwhile.
    let waiting = a.decide(&master("master-0"));
    assert!(
        matches!(&waiting.action, Action::Fail { reason } if reason.contains(FINALIZER)),
        "{waiting:?}"
    );
    assert_eq!(waiting.next, Next::WaitForFreeBlock);
    assert!(waiting.events.is_empty() && waiting.metrics.is_empty());
    let worker = assigned(&mut a, &node("worker-0", &[]));
    assert_eq!(worker, vec![Cidr::parse("10.128.0.0/24").expect("cidr")]);
    let sync = a.sync_cluster_cidrs(&[masters_pool(false)]);
    assert!(sync.added.is_empty());
    assert!(
        sync.capacity_added,
        "the pool started serving: waiting Nodes are woken"
    );
    let first = assigned(&mut a, &master("master-0"));
    assert_eq!(first, vec![Cidr::parse("10.200.0.0/28").expect("cidr")]);
    let again = a.sync_cluster_cidrs(&[masters_pool(false)]);
    assert!(!again.capacity_added, "the same view again brings nothing");
}

/// Found by the ClusterCIDR model check (issue 32 item 3): a Node waiting for a pool's finalizer
/// waited for good when the pool went away before the finalizer was on (deleted at once, no
/// finalizer to hold it) or started being deleted: nothing woke it, though its serving order now
/// passes that pool by.
#[test]
fn a_node_waiting_for_a_finalizer_is_woken_when_that_pool_goes_or_starts_being_deleted() {
    for gone in [true, false] {
        let mut a = allocator("10.128.0.0/16");
        a.sync_cluster_cidrs(&[masters_pool(true)]);
        assert_eq!(a.decide(&master("master-0")).next, Next::WaitForFreeBlock);
        let view = if gone {
            Vec::new()
        } else {
            let mut deleting = masters_pool(true);
            deleting.deleting = true;
            vec![deleting]
        };
        let sync = a.sync_cluster_cidrs(&view);
        assert!(
            sync.capacity_added,
            "gone: {gone}: the waiting master now goes on to the flag CIDR: it must be woken"
        );
        let served = assigned(&mut a, &master("master-0"));
        assert_eq!(served, vec![Cidr::parse("10.128.0.0/24").expect("cidr")]);
    }
}

/// Chaos seed 41789's shape (issue 32 item 1): `pool-2` and `pool-3` share `10.200.0.0/24`;
/// `pool-3` is being deleted and holds nothing. While its fence is not `Fenced` (unfenced in
/// this term, or a removal of ours in flight or in doubt) no block of the shared range is handed
/// out, even through `pool-2`: the master waits, and is served once the fence opens. The holder
/// count read by the removal can then not be outrun by an allocation.
#[test]
fn no_block_inside_a_closing_pool_is_handed_out_until_its_fence_opens() {
    let mut a = allocator("10.128.0.0/16");
    let mut closing = masters_pool(false);
    closing.name = "pool-3".to_owned();
    closing.deleting = true;
    let mut serving = masters_pool(false);
    serving.name = "pool-2".to_owned();
    a.sync_cluster_cidrs(&[serving, closing]);
    assert!(!a.track_closing(&["pool-3".to_owned()]));
    assert_eq!(a.fence("pool-3"), Some(&Fence::Unfenced));
    let waiting = a.decide(&master("master-0"));
    assert!(
        matches!(&waiting.action, Action::Fail { reason } if reason.contains("pool-3")),
        "{waiting:?}"
    );
    assert_eq!(waiting.next, Next::WaitForFreeBlock);
    assert!(waiting.events.is_empty() && waiting.metrics.is_empty());
    assert_eq!(a.held("master-0"), None, "nothing reserved while it waits");
    // A worker is served from the flag CIDR meanwhile: only the closing range is shut.
    assert_eq!(
        assigned(&mut a, &node("worker-0", &[])),
        vec![Cidr::parse("10.128.0.0/24").expect("cidr")]
    );
    // Our stamp seen: the master is served from pool-2, inside pool-3's range, and pool-3 now
    // has a holder.
    assert!(
        a.set_fence("pool-3", Fence::Fenced),
        "opened: wake the waiters"
    );
    let first = assigned(&mut a, &master("master-0"));
    assert_eq!(first, vec![Cidr::parse("10.200.0.0/28").expect("cidr")]);
    assert_eq!(
        a.pool_holders("pool-3", &[]),
        Holders {
            records: 1,
            in_doubt: 0,
            retired: 0
        }
    );
    // A removal decided (after the master left): nothing more inside until its outcome is known.
    a.remove("master-0");
    assert!(a.pool_holders("pool-3", &[]).none());
    assert!(!a.set_fence(
        "pool-3",
        Fence::Removing {
            tested_rv: "7".to_owned()
        }
    ));
    let waiting = a.decide(&master("master-1"));
    assert_eq!(waiting.next, Next::WaitForFreeBlock, "{waiting:?}");
    // The object gone: forgotten, and allocation goes on.
    assert!(a.track_closing(&[]));
    assert_eq!(a.fence("pool-3"), None);
    assigned(&mut a, &master("master-1"));
}

/// The holder rule's one home counts a Node whose write is in doubt only when its reservation
/// lies inside the pool's ranges, and a Node held elsewhere never.
#[test]
fn holders_count_in_doubt_writes_inside_the_ranges_only() {
    let mut a = allocator("10.128.0.0/16");
    a.sync_cluster_cidrs(&[masters_pool(false)]);
    let master = master("master-0");
    assert!(matches!(a.decide(&master).action, Action::Assign { .. }));
    assert!(matches!(
        a.decide(&node("worker-0", &[])).action,
        Action::Assign { .. }
    ));
    let in_doubt = [
        super::super::NodeName::from("master-0"),
        super::super::NodeName::from("worker-0"),
    ];
    assert_eq!(
        a.pool_holders("masters", &in_doubt),
        Holders {
            records: 1,
            in_doubt: 1,
            retired: 0
        }
    );
    assert_eq!(a.pool_holders("nonexistent", &in_doubt), Holders::default());
}
