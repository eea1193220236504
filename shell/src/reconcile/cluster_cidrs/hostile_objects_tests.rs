//! Hostile ClusterCIDR objects against the finalizer rule ("no pool loses its finalizer while a
//! Node holds a block inside it", issue 18 §2): a restart that hosts the pools in another order
//! than the running controller did, and a spec edited in place (a CRD installed without the CEL
//! rule `self == oldSelf`). Each test asks the allocator for the pool's state and the writer's
//! pure [`decide`] for what it would write to the object carrying our finalizer.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::super::{Allocator, NodeView};
use super::*;
use crate::cluster_cidr::FINALIZER;
use crate::cluster_cidr::status::PoolState;
use crate::controller::cluster_cidrs::{Known, ObjectChange, Observed, Write, decide};
use crate::test_support::{
    assigned, cluster_cidr_object as object, cluster_cidr_pool, master, masters_spec,
    node_view as node,
};

/// The allocator all these tests start from: `--cluster-cidr=10.128.0.0/16` (fixture 08's
/// OpenShift cluster network).
fn allocator() -> Allocator {
    crate::test_support::allocator("10.128.0.0/16")
}

fn pool(name: &str, spec: Value, awaiting_finalizer: bool) -> ClusterCidrPool {
    let mut pool = cluster_cidr_pool(name, spec);
    pool.awaiting_finalizer = awaiting_finalizer;
    pool
}

/// Whether the writer, given the allocator's state of `name`, would take our finalizer off the
/// stored object (`spec`, our finalizer on, deleting or not).
fn finalizer_removed(a: &Allocator, name: &str, spec: Value, deleting: bool) -> bool {
    let mut stored = object(name, spec);
    stored.metadata = ObjectMeta {
        name: Some(name.to_owned()),
        resource_version: Some("7".to_owned()),
        generation: Some(1),
        finalizers: Some(vec![FINALIZER.to_owned()]),
        deletion_timestamp: deleting
            .then(|| Time(Timestamp::from_second(1_796_000_000).expect("time"))),
        ..ObjectMeta::default()
    };
    let Some(state) = a.cluster_cidr_state(name) else {
        // The writer skips a name the allocator does not know.
        return false;
    };
    // The fence of a writer whose stamp is on the object: only the holders decide.
    let known = Known {
        state,
        holders: a.pool_holders(name, &[]),
        invalid_announced: true,
        fence: Some(Fence::Fenced),
        next_stamp: "0/t.1".to_owned(),
        may_stamp: true,
    };
    let observed = Observed {
        object: stored,
        status: None,
    };
    decide(
        &observed,
        &known,
        Timestamp::from_second(1_796_000_001).expect("time"),
    )
    .iter()
    .any(|w| {
        matches!(
            w,
            Write::Object {
                change: ObjectChange::RemoveFinalizer,
                ..
            }
        )
    })
}

/// 62 disjoint pools `a00`…`a61` created after `z-early`, which serves two masters: with the
/// flag CIDR that is [`MAX_BACKING_SETS`] sets, so the 63rd (`a62`) is refused while running.
/// A restart lists all of them; hosting in name order would host `a62` and refuse `z-early` —
/// the pool whose blocks the masters hold — whose finalizer would then be removed at once
/// (refused = `Invalid`), and whose masters would be skipped as out of range.
#[test]
fn a_restart_hosts_again_the_pools_that_served_before_a_later_named_one_refused_while_running() {
    let mut running = allocator();
    let z = || pool("z-early", masters_spec("10.200.0.0/24"), false);
    assert_eq!(running.sync_cluster_cidrs(&[z()]).added, ["z-early"]);
    let held: Vec<Vec<Cidr>> = ["master-0", "master-1"]
        .iter()
        .map(|n| assigned(&mut running, &master(n)))
        .collect();
    let late = |awaiting_last: bool| -> Vec<ClusterCidrPool> {
        (0..63)
            .map(|i| {
                let spec = json!({"perNodeHostBits": 4, "ipv4": format!("10.{i}.0.0/24")});
                pool(&format!("a{i:02}"), spec, awaiting_last && i == 62)
            })
            .collect()
    };
    let mut all = late(false);
    all.push(z());
    let sync = running.sync_cluster_cidrs(&all);
    let refused: Vec<&str> = sync.refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(refused, ["a62"], "the 64-set limit, while running");
    assert!(!finalizer_removed(
        &running,
        "z-early",
        masters_spec("10.200.0.0/24"),
        false
    ));

    // Restart: `a62` never got our finalizer (it was refused), the others have it.
    let mut restarted = allocator();
    let mut all = late(true);
    all.push(z());
    let sync = restarted.sync_cluster_cidrs(&all);
    let refused: Vec<&str> = sync.refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(refused, ["a62"], "a restart refuses the same pool");
    let views: Vec<NodeView> = ["master-0", "master-1"]
        .iter()
        .zip(&held)
        .map(|(n, cidrs)| {
            let texts: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
            let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
            let mut view = node(n, &refs);
            view.labels
                .insert("node-role.kubernetes.io/master".into(), String::new());
            view
        })
        .collect();
    restarted.startup_occupy(&views);
    assert!(
        matches!(
            restarted.cluster_cidr_state("z-early"),
            Some(PoolState::Serving { .. })
        ),
        "{:?}",
        restarted.cluster_cidr_state("z-early")
    );
    assert!(!finalizer_removed(
        &restarted,
        "z-early",
        masters_spec("10.200.0.0/24"),
        false
    ));
}

/// With a CRD that lacks the CEL rule `self == oldSelf`, an operator edits the ranges of a pool
/// whose blocks two masters hold (`10.20.0.0/23` → `10.30.0.0/23`), then deletes it: the masters
/// still hold blocks the object once handed out, so its finalizer must stay.
#[test]
fn a_spec_edited_in_place_keeps_the_finalizer_while_nodes_hold_blocks_of_the_old_ranges() {
    let mut a = allocator();
    let before = masters_spec("10.20.0.0/24");
    a.sync_cluster_cidrs(&[pool("grow", before, false)]);
    let held: Vec<Cidr> = ["master-0", "master-1"]
        .iter()
        .flat_map(|n| assigned(&mut a, &master(n)))
        .collect();
    assert!(
        held.iter().all(|c| c.to_string().starts_with("10.20.0.")),
        "{held:?}"
    );
    let edited = masters_spec("10.30.0.0/24");
    let mut deleting = pool("grow", edited.clone(), false);
    deleting.deleting = true;
    a.sync_cluster_cidrs(&[deleting]);
    assert!(
        matches!(
            a.cluster_cidr_state("grow"),
            Some(PoolState::Deleting { holders: 2, .. })
        ),
        "{:?}",
        a.cluster_cidr_state("grow")
    );
    assert!(!finalizer_removed(&a, "grow", edited, true));
    // Edited once more, now invalid (`perNodeHostBits: 200`): the controller leaves it out; the
    // masters are counted against the name for the writer's `Invalid` path.
    a.sync_cluster_cidrs(&[]);
    assert_eq!(a.pool_holders("grow", &[]).retired, 2);
    // The masters leave: now it may go.
    a.remove("master-0");
    a.remove("master-1");
    let mut deleting = pool("grow", masters_spec("10.30.0.0/24"), false);
    deleting.deleting = true;
    a.sync_cluster_cidrs(&[deleting]);
    assert!(finalizer_removed(
        &a,
        "grow",
        masters_spec("10.30.0.0/24"),
        true
    ));
}

/// At the [`MAX_BACKING_SETS`] limit `q` is refused; the pool `p` whose set it needs is deleted
/// and its last master leaves, so its finalizer goes and the watch shows it gone: that one sync
/// must host `q` (no later event may come to try again — the writer only reads the state).
#[test]
fn a_refused_pool_is_hosted_in_the_sync_that_frees_the_set_it_waits_for() {
    let mut a = allocator();
    let p = |deleting: bool| {
        let mut pool = pool("p", masters_spec("10.200.0.0/24"), false);
        pool.deleting = deleting;
        pool
    };
    let others: Vec<ClusterCidrPool> = (0..62)
        .map(|i| {
            let spec = json!({"perNodeHostBits": 4, "ipv4": format!("10.{i}.0.0/24")});
            pool(&format!("a{i:02}"), spec, false)
        })
        .collect();
    let q = pool(
        "q",
        json!({"perNodeHostBits": 4, "ipv4": "10.201.0.0/24"}),
        true,
    );
    let view = |p: Option<ClusterCidrPool>| -> Vec<ClusterCidrPool> {
        p.into_iter()
            .chain(others.iter().cloned())
            .chain([q.clone()])
            .collect()
    };
    let sync = a.sync_cluster_cidrs(&view(Some(p(false))));
    let refused: Vec<&str> = sync.refused.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(refused, ["q"]);
    assigned(&mut a, &master("master-0"));
    a.sync_cluster_cidrs(&view(Some(p(true))));
    assert!(matches!(
        a.cluster_cidr_state("p"),
        Some(PoolState::Deleting { holders: 1, .. })
    ));
    a.remove("master-0");
    // The finalizer removed, the object gone: the watch's next view has no `p`.
    let sync = a.sync_cluster_cidrs(&view(None));
    assert_eq!(sync.removed, ["p"]);
    assert_eq!(sync.added, ["q"], "refused: {:?}", sync.refused);
}
