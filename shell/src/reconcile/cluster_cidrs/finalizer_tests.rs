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
