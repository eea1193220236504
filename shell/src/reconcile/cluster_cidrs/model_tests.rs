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

use super::super::{Action, Allocator};
use crate::cluster_cidr::status::PoolState;
use crate::cluster_cidr::{ClusterCidrObject, ClusterCidrPool};
use crate::test_support::node_view;

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
    let mut body = json!({"perNodeHostBits": host_bits.max(4), "ipv4": range});
    if spec.selector {
        body["nodeSelector"] = json!({"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "role", "operator": "In", "values": ["a"]}]}]});
    }
    let object: ClusterCidrObject =
        serde_json::from_value(json!({"metadata": {"name": format!("p{index}")}, "spec": body}))
            .expect("parses");
    ClusterCidrPool::from_object(&object).expect("valid")
}

/// The model's view: pools given to the allocator (name → pool, deleting or not).
struct World {
    allocator: Allocator,
    pools: BTreeMap<usize, ClusterCidrPool>,
    held: BTreeMap<String, Vec<Cidr>>,
}

impl World {
    fn sync(&mut self) {
        let pools: Vec<ClusterCidrPool> = self.pools.values().cloned().collect();
        let before: Vec<_> = self
            .held
            .keys()
            .map(|n| self.allocator.held(n).map(<[Cidr]>::to_vec))
            .collect();
        self.allocator.sync_cluster_cidrs(&pools);
        let after: Vec<_> = self
            .held
            .keys()
            .map(|n| self.allocator.held(n).map(<[Cidr]>::to_vec))
            .collect();
        assert_eq!(before, after, "a sync changed what Nodes hold");
    }

    fn step(&mut self, op: &Op, specs: &[Spec]) {
        match *op {
            Op::Add(i) => {
                self.pools.insert(i, pool_of(i, &specs[i]));
                self.sync();
            }
            Op::Delete(i) => {
                if let Some(pool) = self.pools.get_mut(&i) {
                    pool.deleting = true;
                }
                self.sync();
            }
            Op::Remove(i) => {
                self.pools.remove(&i);
                self.sync();
            }
            Op::Allocate { node, labelled } => self.allocate(node, labelled),
            Op::Release(node) => {
                let name = format!("n{node}");
                self.allocator.remove(&name);
                self.held.remove(&name);
            }
        }
    }

    fn allocate(&mut self, node: u8, labelled: bool) {
        let name = format!("n{node}");
        if self.held.contains_key(&name) {
            return;
        }
        let mut view = node_view(&name, &[]);
        if labelled {
            view.labels.insert("role".into(), "a".into());
        }
        let d = self.allocator.decide(&view);
        if let Action::Assign { pod_cidrs, .. } = d.action {
            assert!(self.allocator.confirm(&name, &pod_cidrs));
            for cidr in &pod_cidrs {
                let flag = Cidr::parse(FLAG_CIDR).expect("flag");
                let from_flags = flag.overlaps(cidr) && cidr.prefix_len() == 24;
                let from_pool = self.pools.values().filter(|p| !p.deleting).any(|p| {
                    p.ipv4.is_some_and(|r| {
                        r.overlaps(cidr)
                            && cidr.prefix_len() >= r.prefix_len()
                            && p.node_mask_size(r) == cidr.prefix_len()
                    })
                });
                assert!(from_flags || from_pool, "{cidr} from no live pool");
            }
            self.held.insert(name, pod_cidrs);
        }
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
        for pool in self.pools.values() {
            self.check_state(pool);
        }
    }

    /// The pool's usage recounted from the model: blocks of its size in its range that any
    /// held CIDR overlaps.
    fn check_state(&self, pool: &ClusterCidrPool) {
        let Some(state) = self.allocator.cluster_cidr_state(&pool.name) else {
            panic!("{} unknown", pool.name);
        };
        let (usage, holders) = match state {
            PoolState::Serving { usage } => (usage, None),
            PoolState::Deleting { usage, holders } => (usage, Some(holders)),
            PoolState::Invalid { message } => {
                // Every spec here fits 2^24 blocks and 64 sets.
                panic!("{} refused: {message}", pool.name)
            }
        };
        let Some(range) = pool.ipv4 else { return };
        let mask = pool.node_mask_size(range);
        let count = 1u32 << (mask - range.prefix_len());
        let step = 1u32 << (32 - mask);
        let base = match range.network() {
            std::net::IpAddr::V4(a) => u32::from(a),
            std::net::IpAddr::V6(_) => return,
        };
        let used = (0..count)
            .filter(|i| {
                let block = Cidr::new(std::net::Ipv4Addr::from(base + i * step).into(), mask)
                    .expect("block");
                self.held.values().flatten().any(|c| c.overlaps(&block))
            })
            .count() as u64;
        assert_eq!(usage[0].1.used, used, "{} used", pool.name);
        assert_eq!(usage[0].1.capacity, u64::from(count));
        assert_eq!(usage[0].1.free, u64::from(count) - used);
        if let Some(holders) = holders {
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
        let config = nodeipam_core::config::validate(FLAG_CIDR, "", NodeMaskFlags::default())
            .expect("valid");
        let mut world = World {
            allocator: Allocator::new(&config).expect("pool"),
            pools: BTreeMap::new(),
            held: BTreeMap::new(),
        };
        for op in &ops {
            world.step(op, &specs);
            world.check();
        }
    }
}
