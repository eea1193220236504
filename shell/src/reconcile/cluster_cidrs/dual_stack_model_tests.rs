//! Property test, dual-stack: ClusterCIDRs with an IPv4 range, an IPv6 range or both (nested in,
//! supernets of or disjoint from the flag CIDRs), added, deleted and removed between random
//! allocations, releases and Nodes arriving with podCIDRs of their own (inside a flag CIDR, inside
//! a pool's range, or outside every range: skipped until a pool covers them). After every step:
//! - a block handed out overlaps no other Node's podCIDRs (kept, skipped or handed out);
//! - all or nothing within one pool: a Node's blocks all come from one source (the flag CIDRs, or
//!   one live ClusterCIDR), one per family of that source, of its block size;
//! - nothing lost: the allocator holds for each Node handed blocks, or kept, exactly its CIDRs;
//! - a sync never changes what those Nodes hold;
//! - each pool's usage equals a recount over everything the allocator holds.
//!
//! Block sizes run from 4 to 10 host bits (cut to what each range holds): coarser and finer than
//! the Nodes' own /24 and /120 podCIDRs, so re-gridding a set under a podCIDR finer than its grid
//! is exercised (the recount is exact only because that is refined: see [`super`]).

use std::collections::BTreeMap;

use nodeipam_core::{Cidr, NodeMaskFlags};
use proptest::prelude::*;
use serde_json::json;

use super::super::{Action, Allocator};
use crate::cluster_cidr::ClusterCidrPool;
use crate::test_support::cluster_cidr_model::{
    PoolChange, Pools, check_usage, model_pool, node_name, serve_new, sync_keeping, taken_from,
};
use crate::test_support::{cidr, ipam_config, node_view};

const FLAGS: &str = "10.0.0.0/22,fd00::/118";
const V4: [&str; 6] = [
    "10.0.0.0/21",
    "10.0.2.0/23",
    "10.0.1.0/24",
    "10.0.4.0/22",
    "10.0.8.0/23",
    "10.0.0.0/20",
];
const V6: [&str; 6] = [
    "fd00::/117",
    "fd00::200/119",
    "fd00::100/120",
    "fd00::400/118",
    "fd00::800/119",
    "fd00::/116",
];
/// podCIDRs Nodes may arrive with.
const OWN: [&str; 6] = [
    "10.0.1.0/24",
    "10.0.5.0/24",
    "10.0.9.0/24",
    "fd00::100/120",
    "fd00::500/120",
    "fd00::900/120",
];

#[derive(Debug, Clone)]
struct Spec {
    v4: Option<usize>,
    v6: Option<usize>,
    host_bits: u8,
    selector: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Delete(usize),
    Remove(usize),
    Allocate { node: u8, labelled: bool },
    Arrive { node: u8, own: Vec<usize> },
    Release(u8),
}

fn spec() -> impl Strategy<Value = Spec> {
    (
        proptest::option::of(0..V4.len()),
        proptest::option::of(0..V6.len()),
        4u8..=10,
        any::<bool>(),
    )
        .prop_map(|(v4, v6, host_bits, selector)| Spec {
            v4: v4.or(if v6.is_none() { Some(0) } else { None }),
            v6,
            host_bits,
            selector,
        })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..4).prop_map(Op::Add),
        1 => (0usize..4).prop_map(Op::Delete),
        1 => (0usize..4).prop_map(Op::Remove),
        5 => (0u8..20, any::<bool>()).prop_map(|(node, labelled)| Op::Allocate { node, labelled }),
        2 => (0u8..20, proptest::collection::vec(0..OWN.len(), 1..=2))
            .prop_map(|(node, own)| Op::Arrive { node, own }),
        3 => (0u8..20).prop_map(Op::Release),
    ]
}

fn pool_of(index: usize, spec: &Spec) -> ClusterCidrPool {
    // At most the host bits of each range the pool has.
    let fits = [spec.v4.map(|i| V4[i]), spec.v6.map(|i| V6[i])]
        .into_iter()
        .flatten()
        .map(|r| {
            let c = cidr(r);
            c.family().max_prefix_len() - c.prefix_len()
        })
        .min()
        .unwrap_or(8);
    let mut body = json!({"perNodeHostBits": spec.host_bits.min(fits)});
    if let Some(i) = spec.v4 {
        body["ipv4"] = json!(V4[i]);
    }
    if let Some(i) = spec.v6 {
        body["ipv6"] = json!(V6[i]);
    }
    model_pool(index, body, spec.selector)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Assigned,
    Kept,
    Skipped,
}

struct World {
    allocator: Allocator,
    pools: Pools,
    nodes: BTreeMap<String, (Vec<Cidr>, Kind)>,
}

impl World {
    fn change(&mut self, change: PoolChange) {
        self.pools.apply(change);
        let tracked: Vec<&String> = self
            .nodes
            .iter()
            .filter(|(_, (_, kind))| *kind != Kind::Skipped)
            .map(|(n, _)| n)
            .collect();
        let sync = sync_keeping(&mut self.allocator, &self.pools, &tracked);
        assert!(sync.refused.is_empty(), "{sync:?}");
    }

    fn step(&mut self, op: &Op, specs: &[Spec]) {
        match op {
            Op::Add(i) => self.change(PoolChange::Add(*i, pool_of(*i, &specs[*i]))),
            Op::Delete(i) => self.change(PoolChange::Delete(*i)),
            Op::Remove(i) => self.change(PoolChange::Remove(*i)),
            Op::Allocate { node, labelled } => self.allocate(*node, *labelled),
            Op::Arrive { node, own } => self.arrive(*node, own),
            Op::Release(node) => {
                let name = node_name(*node);
                self.allocator.remove(&name);
                self.nodes.remove(&name);
            }
        }
    }

    fn arrive(&mut self, node: u8, own: &[usize]) {
        let name = node_name(node);
        if self.nodes.contains_key(&name) {
            return;
        }
        let texts: Vec<&str> = own.iter().map(|i| OWN[*i]).collect();
        let d = self.allocator.decide(&node_view(&name, &texts));
        let kind = match d.action {
            Action::Keep { .. } => Kind::Kept,
            Action::Skip { .. } => Kind::Skipped,
            other => panic!("{name} {texts:?}: {other:?}"),
        };
        self.nodes
            .insert(name, (texts.iter().map(|t| cidr(t)).collect(), kind));
    }

    fn allocate(&mut self, node: u8, labelled: bool) {
        let name = node_name(node);
        if self.nodes.contains_key(&name) {
            return;
        }
        let Some(pod_cidrs) = serve_new(&mut self.allocator, &name, labelled) else {
            return;
        };
        self.check_one_source(&pod_cidrs);
        for (other, (theirs, _)) in &self.nodes {
            for mine in &pod_cidrs {
                assert!(
                    !theirs.iter().any(|t| t.overlaps(mine)),
                    "{name} got {mine}, overlapping {other} {theirs:?}"
                );
            }
        }
        self.nodes.insert(name, (pod_cidrs, Kind::Assigned));
    }

    /// The blocks come from the flag CIDRs (both families, /24 and /120) or from one live pool
    /// (each of its families, its size).
    fn check_one_source(&self, got: &[Cidr]) {
        let flags = [(cidr("10.0.0.0/22"), 24), (cidr("fd00::/118"), 120)];
        let from_flags = got.len() == 2
            && got
                .iter()
                .all(|b| flags.iter().any(|(r, m)| taken_from(*b, *r, *m)));
        let from_pool = self.pools.live().any(|p| {
            let ranges: Vec<Cidr> = [p.ipv4, p.ipv6].into_iter().flatten().collect();
            got.len() == ranges.len()
                && got.iter().all(|b| {
                    ranges
                        .iter()
                        .any(|r| taken_from(*b, *r, p.node_mask_size(*r)))
                })
        });
        assert!(from_flags || from_pool, "{got:?} from no single source");
    }

    fn check(&self) {
        for (name, (cidrs, kind)) in &self.nodes {
            if *kind != Kind::Skipped {
                assert_eq!(self.allocator.held(name), Some(&cidrs[..]), "{name} lost");
            }
        }
        let held: Vec<Cidr> = self
            .nodes
            .keys()
            .filter_map(|n| self.allocator.held(n))
            .flatten()
            .copied()
            .collect();
        for pool in self.pools.iter() {
            check_usage(&self.allocator, pool, &held);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]
    #[test]
    fn dual_stack_pools_with_arriving_nodes_never_hand_out_a_held_address(
        specs in proptest::collection::vec(spec(), 4),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let masks = NodeMaskFlags {
            node_cidr_mask_size_ipv4: Some(24),
            node_cidr_mask_size_ipv6: Some(120),
            ..NodeMaskFlags::default()
        };
        let config = ipam_config(FLAGS, "", masks);
        let mut world = World {
            allocator: Allocator::new(&config).expect("pool"),
            pools: Pools::default(),
            nodes: BTreeMap::new(),
        };
        for op in &ops {
            world.step(op, &specs);
            world.check();
        }
    }
}
