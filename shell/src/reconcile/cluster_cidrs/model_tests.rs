//! Property test: random overlapping ClusterCIDRs (nested in the flag CIDR, supernets of it,
//! disjoint; varied block sizes; with and without a selector) added, marked deleting and removed
//! between random allocations and releases, against a naive model (the `BTreeMap` of what each
//! Node was given). After every step:
//! - no two Nodes hold overlapping CIDRs;
//! - nothing is lost: the allocator holds for each Node exactly what the model says;
//! - a sync never changes what any Node holds;
//! - every block handed out lies in the flag CIDR (a /24) or in a live pool's range, of its size;
//! - each hosted pool's `cluster_cidr_state` usage equals a recount over the model's holdings,
//!   and a deleting pool's holders the number of Nodes holding a CIDR inside its range.

use std::collections::BTreeMap;

use nodeipam_core::{Cidr, NodeMaskFlags};
use proptest::prelude::*;
use serde_json::json;

use super::super::Allocator;
use crate::cluster_cidr::ClusterCidrPool;
use crate::test_support::cluster_cidr_model::{
    PoolChange, Pools, check_usage, model_pool, node_name, serve_new, sync_keeping, taken_from,
};
use crate::test_support::{cidr, ipam_config};

const FLAG_CIDR: &str = "10.0.0.0/22";

/// Ranges around the flag CIDR: supernets, nested, disjoint.
const RANGES: [&str; 9] = [
    "10.0.0.0/19",
    "10.0.0.0/20",
    "10.0.0.0/21",
    "10.0.0.0/22",
    "10.0.1.0/24",
    "10.0.2.0/23",
    "10.0.4.0/22",
    "10.0.8.0/22",
    "10.0.12.0/24",
];

#[derive(Debug, Clone)]
struct Spec {
    range: usize,
    host_bits: u8,
    selector: bool,
}

#[derive(Debug, Clone)]
enum Op {
    Add(usize),
    Delete(usize),
    Remove(usize),
    Allocate { node: u8, labelled: bool },
    Release(u8),
}

fn spec() -> impl Strategy<Value = Spec> {
    (0..RANGES.len(), 5u8..=10, any::<bool>()).prop_map(|(range, host_bits, selector)| Spec {
        range,
        host_bits,
        selector,
    })
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        2 => (0usize..4).prop_map(Op::Add),
        1 => (0usize..4).prop_map(Op::Delete),
        1 => (0usize..4).prop_map(Op::Remove),
        6 => (0u8..24, any::<bool>()).prop_map(|(node, labelled)| Op::Allocate { node, labelled }),
        3 => (0u8..24).prop_map(Op::Release),
    ]
}

fn pool_of(index: usize, spec: &Spec) -> ClusterCidrPool {
    let range = RANGES[spec.range];
    let prefix: u8 = range[range.find('/').unwrap_or(0) + 1..]
        .parse()
        .unwrap_or(32);
    let host_bits = spec.host_bits.min(32 - prefix);
    let body = json!({"perNodeHostBits": host_bits.max(4), "ipv4": range});
    model_pool(index, body, spec.selector)
}

/// The model's view: pools given to the allocator (deleting or not) and what each Node was
/// given.
struct World {
    allocator: Allocator,
    pools: Pools,
    held: BTreeMap<String, Vec<Cidr>>,
}

impl World {
    fn change(&mut self, change: PoolChange) {
        self.pools.apply(change);
        let names: Vec<&String> = self.held.keys().collect();
        sync_keeping(&mut self.allocator, &self.pools, &names);
    }

    fn step(&mut self, op: &Op, specs: &[Spec]) {
        match *op {
            Op::Add(i) => self.change(PoolChange::Add(i, pool_of(i, &specs[i]))),
            Op::Delete(i) => self.change(PoolChange::Delete(i)),
            Op::Remove(i) => self.change(PoolChange::Remove(i)),
            Op::Allocate { node, labelled } => self.allocate(node, labelled),
            Op::Release(node) => {
                let name = node_name(node);
                self.allocator.remove(&name);
                self.held.remove(&name);
            }
        }
    }

    fn allocate(&mut self, node: u8, labelled: bool) {
        let name = node_name(node);
        if self.held.contains_key(&name) {
            return;
        }
        let Some(pod_cidrs) = serve_new(&mut self.allocator, &name, labelled) else {
            return;
        };
        for block in &pod_cidrs {
            let from_flags = taken_from(*block, cidr(FLAG_CIDR), 24);
            let from_pool = self.pools.live().any(|p| {
                p.ipv4
                    .is_some_and(|r| taken_from(*block, r, p.node_mask_size(r)))
            });
            assert!(from_flags || from_pool, "{block} from no live pool");
        }
        self.held.insert(name, pod_cidrs);
    }

    fn check(&self) {
        let all: Vec<(&String, &Cidr)> = self
            .held
            .iter()
            .flat_map(|(n, cs)| cs.iter().map(move |c| (n, c)))
            .collect();
        for (i, (n, c)) in all.iter().enumerate() {
            for (m, d) in &all[i + 1..] {
                assert!(!c.overlaps(d), "{n} {c} overlaps {m} {d}");
            }
        }
        for (name, cidrs) in &self.held {
            assert_eq!(self.allocator.held(name), Some(&cidrs[..]), "{name} lost");
        }
        let held: Vec<Cidr> = self.held.values().flatten().copied().collect();
        for pool in self.pools.iter() {
            // A deleting pool's holders: the Nodes holding a CIDR inside its range.
            let Some(holders) = check_usage(&self.allocator, pool, &held) else {
                continue;
            };
            let Some(range) = pool.ipv4 else { continue };
            let recount = self
                .held
                .values()
                .filter(|cs| {
                    cs.iter()
                        .any(|c| c.prefix_len() >= range.prefix_len() && range.overlaps(c))
                })
                .count();
            assert_eq!(holders, recount, "{} holders", pool.name);
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]
    #[test]
    fn pools_come_and_go_without_losing_or_doubling_a_block(
        specs in proptest::collection::vec(spec(), 4),
        ops in proptest::collection::vec(op(), 1..48),
    ) {
        let config = ipam_config(FLAG_CIDR, "", NodeMaskFlags::default());
        let mut world = World {
            allocator: Allocator::new(&config).expect("pool"),
            pools: Pools::default(),
            held: BTreeMap::new(),
        };
        for op in &ops {
            world.step(op, &specs);
            world.check();
        }
    }
}
