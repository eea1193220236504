//! A ClusterCIDR serves new Nodes only once the controller has seen its finalizer on it
//! (`ClusterCidrPool::awaiting_finalizer`): found by the chaos suite's ClusterCIDR variant (seed
//! 3), where a pool deleted before its finalizer was on went away at once while the controller
//! kept handing out its blocks.

use serde_json::json;

use super::super::{Action, Allocator, Next};
use super::*;
use crate::cluster_cidr::ClusterCidrObject;
use crate::cluster_cidr::FINALIZER;
use crate::test_support::node_view as node;

fn masters_pool(awaiting_finalizer: bool) -> ClusterCidrPool {
    let object: ClusterCidrObject = serde_json::from_value(json!({
        "metadata": {"name": "masters"},
        "spec": {
            "perNodeHostBits": 4,
            "ipv4": "10.200.0.0/24",
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]},
        },
    }))
    .expect("parses");
    let mut pool = ClusterCidrPool::from_object(&object).expect("a valid ClusterCIDR");
    pool.awaiting_finalizer = awaiting_finalizer;
    pool
}

fn master(name: &str) -> crate::reconcile::NodeView {
    let mut view = node(name, &[]);
    view.labels
        .insert("node-role.kubernetes.io/master".into(), String::new());
    view
}

fn assigned(a: &mut Allocator, view: &crate::reconcile::NodeView) -> Vec<Cidr> {
    match a.decide(view).action {
        Action::Assign { pod_cidrs, .. } => {
            assert!(a.confirm(&view.name, &pod_cidrs));
            pod_cidrs
        }
        other => panic!("{} was not assigned: {other:?}", view.name),
    }
}

#[test]
fn a_pool_without_its_finalizer_is_hosted_but_serves_no_node_until_the_finalizer_is_seen() {
    let config = nodeipam_core::config::validate(
        "10.128.0.0/16",
        "",
        nodeipam_core::NodeMaskFlags::default(),
    )
    .expect("valid test config");
    let mut a = Allocator::new(&config).expect("pool");
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
