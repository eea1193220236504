//! ClusterCIDR pools in the allocator (issue 18 §2): hosting, serving order on the fixtures' real
//! labels, re-gridding and supernets without handing an address out twice, deletion and removal
//! keeping what Nodes hold, and the status each pool reports.

use nodeipam_core::NodeMaskFlags;
use serde_json::json;

use super::super::{Action, Allocator, NodeView};
use super::*;
use crate::test_support::{
    allocator, assign, cidr, cluster_cidr_pool as pool, fixture_views as fixture, ipam_config,
    masters_spec, node_view as node,
};

/// Decides `view` and confirms an assignment; returns the podCIDRs it got (empty when it waits).
fn serve(a: &mut Allocator, view: &NodeView) -> Vec<Cidr> {
    assign(a, view).unwrap_or_default()
}

fn rows(a: &Allocator) -> Vec<(String, u8, u32)> {
    a.pool_stats()
        .iter()
        .map(|s| (s.cluster_cidr.to_string(), s.node_mask_size, s.used_blocks))
        .collect()
}

/// Fixture 08 (OpenShift on GCP, three masters, three workers, no podCIDRs): a ClusterCIDR
/// selecting `node-role.kubernetes.io/master` serves the masters with its /28s; the workers
/// (no matching selector) get the flag CIDR's /24s. The pool's status counts its own blocks.
#[test]
fn a_selector_pool_serves_the_labelled_fixture_nodes_and_the_flags_the_rest() {
    let mut a = allocator("10.128.0.0/16");
    let masters = pool("masters", masters_spec("10.200.0.0/24"));
    let sync = a.sync_cluster_cidrs(std::slice::from_ref(&masters));
    assert_eq!(
        sync,
        ClusterCidrSync {
            added: vec!["masters".into()],
            capacity_added: true,
            ..ClusterCidrSync::default()
        }
    );
    let mut got = Vec::new();
    for view in fixture("08-openshift-gcp-6nodes-no-podcidr-obfuscated-ips.json") {
        got.push((
            view.name.to_string(),
            crate::reconcile::join(&serve(&mut a, &view)),
        ));
    }
    let prefix = "ci-ln-d53y532-f76d1-2btqq-";
    let expected = [
        ("master-0", "10.200.0.0/28"),
        ("master-1", "10.200.0.16/28"),
        ("master-2", "10.200.0.32/28"),
        ("worker-b-7x8mw", "10.128.0.0/24"),
        ("worker-c-nmnbz", "10.128.1.0/24"),
        ("worker-d-bpnbd", "10.128.2.0/24"),
    ];
    let expected: Vec<(String, String)> = expected
        .iter()
        .map(|(n, c)| (format!("{prefix}{n}"), (*c).to_owned()))
        .collect();
    assert_eq!(got, expected);
    assert_eq!(
        a.cluster_cidr_state("masters"),
        Some(PoolState::Serving {
            usage: vec![(
                nodeipam_core::Family::V4,
                FamilyUsage {
                    capacity: 16,
                    used: 3,
                    free: 13
                }
            )]
        })
    );
    // One row per backing set: the flag CIDR's and the ClusterCIDR's (disjoint).
    assert_eq!(
        rows(&a),
        [
            ("10.128.0.0/16".into(), 24, 3),
            ("10.200.0.0/24".into(), 28, 3)
        ]
    );
    assert_eq!(a.cluster_cidr_state("nonexistent"), None);
    // The same view again changes nothing.
    let key = a.model_key();
    assert_eq!(a.sync_cluster_cidrs(&[masters]), ClusterCidrSync::default());
    assert_eq!(a.model_key(), key);
}

/// A ClusterCIDR inside the flag CIDR with finer blocks re-grids the flag CIDR's set: what the
/// flag CIDR handed out stays allocated, the flag path keeps its round-robin where it was, and
/// it skips the /24 in which the pool handed out a /26 (one bitmap).
#[test]
fn a_finer_pool_inside_the_flag_cidr_regrids_and_shares_one_bitmap() {
    let mut a = allocator("10.0.0.0/21");
    assert_eq!(serve(&mut a, &node("old", &[])), [cidr("10.0.0.0/24")]);
    let fine = pool(
        "fine",
        json!({"perNodeHostBits": 6, "ipv4": "10.0.4.0/23",
               "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "role", "operator": "In", "values": ["master"]}]}]}}),
    );
    assert!(a.sync_cluster_cidrs(&[fine]).capacity_added);
    assert_eq!(rows(&a), [("10.0.0.0/21".into(), 26, 4)]);
    // Fixture 05: workers -15 and -34, master -41, worker -42; then one more Node.
    let mut got = Vec::new();
    let mut views = fixture("05-aws-4nodes-no-podcidr.json");
    views.push(node("extra", &[]));
    for view in &views {
        got.extend(serve(&mut a, view));
    }
    assert_eq!(
        got,
        [
            cidr("10.0.1.0/24"),
            cidr("10.0.2.0/24"),
            cidr("10.0.4.0/26"),
            cidr("10.0.3.0/24"),
            cidr("10.0.5.0/24"),
        ]
    );
    assert_eq!(rows(&a), [("10.0.0.0/21".into(), 26, 21)]);
}

/// A ClusterCIDR that is a supernet of the flag CIDR: one new set covers both, the flag
/// CIDR's allocation carried over; the flag CIDR serves first (the ClusterCIDR has no selector:
/// a fallback after the flags), then the ClusterCIDR, which skips the flag CIDR's blocks. Every
/// block of the /22 is handed out exactly once.
#[test]
fn a_supernet_pool_carries_the_flag_allocations_over_and_hands_each_block_out_once() {
    let mut a = allocator("10.0.2.0/23");
    assert_eq!(serve(&mut a, &node("early", &[])), [cidr("10.0.2.0/24")]);
    let wide = pool("wide", json!({"perNodeHostBits": 8, "ipv4": "10.0.0.0/22"}));
    a.sync_cluster_cidrs(&[wide]);
    assert_eq!(rows(&a), [("10.0.0.0/22".into(), 24, 1)]);
    let mut got = Vec::new();
    for i in 0..4 {
        got.extend(serve(&mut a, &node(&format!("n{i}"), &[])));
    }
    assert_eq!(
        got,
        [
            cidr("10.0.3.0/24"),
            cidr("10.0.0.0/24"),
            cidr("10.0.1.0/24"),
        ]
    );
    let d = a.decide(&node("late", &[]));
    let Action::Fail { reason } = &d.action else {
        panic!("{d:?}");
    };
    assert_eq!(
        reason,
        "no pod CIDR could be allocated: no free pod CIDR left in cluster CIDR 10.0.2.0/23; no free block in ClusterCIDR(s) wide either (all or nothing within one)"
    );
    assert_eq!(
        a.cluster_cidr_state("wide"),
        Some(PoolState::Serving {
            usage: vec![(
                nodeipam_core::Family::V4,
                FamilyUsage {
                    capacity: 4,
                    used: 4,
                    free: 0
                }
            )]
        })
    );
}

/// A Node skipped because its podCIDR lies outside every cluster CIDR: once a ClusterCIDR covers
/// it, the part is reserved at once (no other Node can get it), the sync lists it for a new
/// decision, and that decision keeps it.
#[test]
fn an_out_of_range_node_is_reserved_and_kept_once_a_pool_covers_it() {
    let mut a = allocator("10.0.0.0/16");
    let outside = node("outside", &["10.99.0.0/24"]);
    assert!(matches!(a.decide(&outside).action, Action::Skip { .. }));
    let extra = pool(
        "extra",
        json!({"perNodeHostBits": 8, "ipv4": "10.99.0.0/23"}),
    );
    let sync = a.sync_cluster_cidrs(&[extra]);
    assert_eq!(sync.recheck, ["outside"]);
    // A Node holding the whole flag CIDR, so the next one is served by the pool (a fallback
    // after the flags): it gets the pool's only other /24.
    a.decide(&node("filler", &["10.0.0.0/16"]));
    assert_eq!(serve(&mut a, &node("new", &[])), [cidr("10.99.1.0/24")]);
    let d = a.decide(&outside);
    assert_eq!(
        d.action,
        Action::Keep {
            pod_cidrs: vec![cidr("10.99.0.0/24")]
        }
    );
    assert_eq!(a.held("outside"), Some(&[cidr("10.99.0.0/24")][..]));
}

/// A ClusterCIDR being deleted serves no new Node and reports how many Nodes hold its blocks;
/// once gone from the watch it is no longer hosted, yet its Nodes keep their blocks and its set
/// stays (one pool row) until the last of them is gone.
#[test]
fn deletion_and_removal_never_change_what_nodes_hold() {
    let mut a = allocator("10.0.0.0/24");
    let extra = pool(
        "extra",
        json!({"perNodeHostBits": 8, "ipv4": "10.1.0.0/23"}),
    );
    a.sync_cluster_cidrs(std::slice::from_ref(&extra));
    assert_eq!(serve(&mut a, &node("a", &[])), [cidr("10.0.0.0/24")]);
    assert_eq!(serve(&mut a, &node("b", &[])), [cidr("10.1.0.0/24")]);
    let mut ending = extra.clone();
    ending.deleting = true;
    let sync = a.sync_cluster_cidrs(std::slice::from_ref(&ending));
    assert_eq!(sync, ClusterCidrSync::default());
    let Some(PoolState::Deleting { holders, usage }) = a.cluster_cidr_state("extra") else {
        panic!("{:?}", a.cluster_cidr_state("extra"));
    };
    assert_eq!((holders, usage[0].1.used), (1, 1));
    // Not served from a pool being deleted, although it has a free block.
    assert_eq!(serve(&mut a, &node("c", &[])), []);
    let sync = a.sync_cluster_cidrs(&[]);
    assert_eq!(sync.removed, ["extra"]);
    assert_eq!(a.cluster_cidr_state("extra"), None);
    assert_eq!(a.held("b"), Some(&[cidr("10.1.0.0/24")][..]));
    assert_eq!(
        rows(&a),
        [("10.0.0.0/24".into(), 24, 1), ("10.1.0.0/23".into(), 24, 1)]
    );
    // b seen again: kept, not out of range.
    assert!(matches!(
        a.decide(&node("b", &["10.1.0.0/24"])).action,
        Action::Keep { .. }
    ));
    a.remove("b");
    a.sync_cluster_cidrs(&[]);
    assert_eq!(rows(&a), [("10.0.0.0/24".into(), 24, 1)]);
}

/// A ClusterCIDR whose blocks would cut the set it lies in into more than 2^24 blocks is refused
/// with a message for its Invalid condition; the allocator is unchanged and it is tried again on
/// the next sync.
#[test]
fn a_pool_the_allocator_cannot_host_is_refused_and_changes_nothing() {
    let mut a = allocator("fd00::/48");
    let key = a.model_key();
    let tiny = pool("tiny", json!({"perNodeHostBits": 4, "ipv6": "fd00::/120"}));
    let sync = a.sync_cluster_cidrs(std::slice::from_ref(&tiny));
    assert_eq!(sync.added, Vec::<String>::new());
    assert_eq!(
        sync.refused,
        [(
            "tiny".to_owned(),
            "cannot be hosted by the allocator: cluster CIDR fd00::/48 cut into /124 blocks gives 2^76 blocks; at most 2^24 are supported".to_owned()
        )]
    );
    assert!(!sync.capacity_added);
    assert!(matches!(
        a.cluster_cidr_state("tiny"),
        Some(PoolState::Invalid { .. })
    ));
    // Only the refusal is remembered: the sets and records are as before.
    let sets = |key: &str| key[..key.find('|').unwrap_or(key.len())].to_owned();
    assert_eq!(sets(&a.model_key()), sets(&key));
    assert_eq!(a.sync_cluster_cidrs(&[tiny]).refused.len(), 1);
}

/// All or nothing within one ClusterCIDR: a dual-stack pool whose IPv6 range is full serves no
/// Node (nothing is taken from its IPv4 range); the Node goes to the next pool in order.
#[test]
fn a_dual_stack_pool_serves_both_families_or_none() {
    let mut a = allocator("10.0.0.0/24,fd00:1::/64");
    let both = pool(
        "both",
        json!({"perNodeHostBits": 8, "ipv4": "10.1.0.0/23", "ipv6": "fd00:2::/120",
               "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "role", "operator": "Exists"}]}]}}),
    );
    a.sync_cluster_cidrs(&[both]);
    let mut worker = node("w1", &[]);
    worker.labels.insert("role".into(), "worker".into());
    assert_eq!(
        serve(&mut a, &worker),
        [cidr("10.1.0.0/24"), cidr("fd00:2::/120")]
    );
    let mut second = node("w2", &[]);
    second.labels.insert("role".into(), "worker".into());
    // The pool's IPv6 range (one /120) is full: the flags serve, the pool's IPv4 stays free.
    assert_eq!(
        serve(&mut a, &second),
        [cidr("10.0.0.0/24"), cidr("fd00:1::/64")]
    );
    let Some(PoolState::Serving { usage }) = a.cluster_cidr_state("both") else {
        panic!();
    };
    assert_eq!(usage[0].1.used, 1);
}

/// A single-family ClusterCIDR in a dual-stack cluster gives single-family Nodes, as upstream's
/// MultiCIDRRangeAllocator did: such a Node seen at start-up is kept without the missing-family
/// (R11) event, which a single-family podCIDR from the flag CIDR still gets. An IPv6-only
/// ClusterCIDR added to an IPv4-only cluster does not make its Nodes "missing IPv6" either.
#[test]
fn single_family_pools_do_not_make_nodes_missing_a_family() {
    let mut a = allocator("10.0.0.0/16,fd00:1::/56");
    let v4 = pool(
        "v4",
        json!({"perNodeHostBits": 8, "ipv4": "10.9.0.0/16",
               "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "role", "operator": "In", "values": ["master"]}]}]}}),
    );
    a.sync_cluster_cidrs(&[v4]);
    let decisions = a.startup_occupy(&[
        node("pooled", &["10.9.3.0/24"]),
        node("flagged", &["10.0.3.0/24"]),
    ]);
    let reasons: Vec<(String, Vec<&str>)> = decisions
        .iter()
        .map(|(name, d)| {
            assert!(matches!(d.action, Action::Keep { .. }), "{name}: {d:?}");
            (
                name.to_string(),
                d.events.iter().map(|e| e.reason).collect(),
            )
        })
        .collect();
    assert_eq!(reasons[0], ("pooled".to_owned(), vec![]));
    assert_eq!(reasons[1].0, "flagged");
    assert_eq!(reasons[1].1.len(), 1, "{reasons:?}");

    let mut b = allocator("10.0.0.0/16");
    let v6 = pool("v6", json!({"perNodeHostBits": 64, "ipv6": "fd00:9::/56"}));
    b.sync_cluster_cidrs(&[v6]);
    let decisions = b.startup_occupy(&[node("v4-node", &["10.0.1.0/24"])]);
    assert_eq!(decisions[0].1.events, []);
    // A fallback pool serves only when the flags have no block: this Node gets IPv4 alone.
    assert_eq!(serve(&mut b, &node("fresh", &[])), [cidr("10.0.0.0/24")]);
}

/// A service CIDR is reserved in every new backing set it overlaps: a ClusterCIDR covering it
/// never hands out its addresses (its status counts them as used).
#[test]
fn a_service_cidr_stays_reserved_in_a_new_pool() {
    let config = ipam_config("10.0.0.0/16", "10.9.0.0/24", NodeMaskFlags::default());
    let mut a = Allocator::new(&config).expect("pool");
    let services = pool(
        "services-near",
        json!({"perNodeHostBits": 8, "ipv4": "10.9.0.0/23"}),
    );
    a.sync_cluster_cidrs(&[services]);
    a.decide(&node("filler", &["10.0.0.0/16"]));
    assert_eq!(serve(&mut a, &node("n", &[])), [cidr("10.9.1.0/24")]);
    assert_eq!(serve(&mut a, &node("m", &[])), []);
    let Some(PoolState::Serving { usage }) = a.cluster_cidr_state("services-near") else {
        panic!();
    };
    assert_eq!((usage[0].1.used, usage[0].1.free), (2, 0));
}

/// Re-gridding is exact for what Nodes hold: a kept /26 that marked its whole /24 on the flag
/// CIDR's grid marks only itself on the pool's /26 grid, so the pool counts one block used, hands
/// out the rest of that /24, and the Node's release frees it all.
#[test]
fn a_regrid_refines_a_coarse_block_to_the_finer_cidr_it_stands_for() {
    let mut a = allocator("10.0.0.0/22");
    assert!(matches!(
        a.decide(&node("fine", &["10.0.1.64/26"])).action,
        Action::Keep { .. }
    ));
    assert_eq!(rows(&a), [("10.0.0.0/22".into(), 24, 1)]);
    let quarter = pool(
        "quarters",
        json!({"perNodeHostBits": 6, "ipv4": "10.0.1.0/24",
               "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                   {"key": "role", "operator": "Exists"}]}]}}),
    );
    a.sync_cluster_cidrs(&[quarter]);
    assert_eq!(rows(&a), [("10.0.0.0/22".into(), 26, 1)]);
    let used = |a: &Allocator| match a.cluster_cidr_state("quarters") {
        Some(PoolState::Serving { usage }) => usage[0].1.used,
        other => panic!("{other:?}"),
    };
    assert_eq!(used(&a), 1);
    let mut labelled = node("q", &[]);
    labelled.labels.insert("role".into(), "x".into());
    assert_eq!(serve(&mut a, &labelled), [cidr("10.0.1.0/26")]);
    a.remove("fine");
    assert_eq!(used(&a), 1);
    assert_eq!(rows(&a), [("10.0.0.0/22".into(), 26, 1)]);
}
