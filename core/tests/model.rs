#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test.
//! Property tests: `CidrSet` and `Pool` against a trivial model (a `BTreeSet` of allocated block
//! indices plus upstream's round-robin cursor), over random operation sequences on IPv4 and IPv6
//! sets of 1 … 2^16 blocks.

use std::collections::BTreeSet;

use nodeipam_core::{AllocError, Cidr, CidrSet, Family, Pool, storage_words_for};
use proptest::prelude::*;

/// The model: which blocks are allocated, and the next-candidate cursor.
#[derive(Debug, Clone, PartialEq)]
struct Model {
    block_count: u32,
    allocated: BTreeSet<u32>,
    cursor: u32,
}

impl Model {
    /// Upstream's AllocateNext: scan from the cursor, wrapping, one block at a time.
    fn allocate_next(&mut self) -> Option<(u32, u32)> {
        for tries in 0..self.block_count {
            let candidate = (self.cursor + tries) % self.block_count;
            if !self.allocated.contains(&candidate) {
                self.allocated.insert(candidate);
                self.cursor = (candidate + 1) % self.block_count;
                return Some((candidate, tries));
            }
        }
        None
    }
}

#[derive(Debug, Clone)]
enum Op {
    Allocate,
    /// Occupy a CIDR given as (block index, prefix delta): prefix = node_mask − delta (clamped),
    /// negative deltas make sub-block CIDRs.
    Occupy(u32, i8),
    Release(u32, i8),
    /// A CIDR outside the cluster CIDR or of the other family.
    Foreign(bool),
    Aligned(u8),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Allocate),
        3 => (any::<u32>(), -3i8..6).prop_map(|(i, d)| Op::Occupy(i, d)),
        3 => (any::<u32>(), -3i8..6).prop_map(|(i, d)| Op::Release(i, d)),
        1 => any::<bool>().prop_map(Op::Foreign),
        1 => (0u8..8).prop_map(Op::Aligned),
    ]
}

/// Cluster CIDR and node mask size for `block_bits` (0..=16) and a family.
fn shape(v6: bool, block_bits: u8, cluster_prefix: u8) -> (Cidr, u8) {
    let (addr, max): (std::net::IpAddr, u8) = if v6 {
        ("fd00:1234:5678::".parse().unwrap(), 128)
    } else {
        ("10.0.0.0".parse().unwrap(), 32)
    };
    let prefix = cluster_prefix.min(max - block_bits);
    (Cidr::new_masked(addr, prefix).unwrap(), prefix + block_bits)
}

/// The CIDR for an operand: a block index (mod block count) widened or narrowed by `delta` bits.
fn operand(set: &CidrSet<Vec<u64>>, index: u32, delta: i8) -> Cidr {
    let block = set.block_cidr(index % set.block_count()).unwrap();
    let max = block.family().max_prefix_len() as i16;
    let prefix = (set.node_mask_size() as i16 - delta as i16).clamp(0, max) as u8;
    Cidr::new_masked(block.network(), prefix).unwrap()
}

/// Blocks a CIDR covers according to upstream's getBeginningAndEndIndices, computed the slow way.
fn model_range(set: &CidrSet<Vec<u64>>, cidr: Cidr) -> std::ops::RangeInclusive<u32> {
    let cluster = set.cluster_cidr();
    if cidr.prefix_len() <= cluster.prefix_len() {
        return 0..=set.block_count() - 1;
    }
    let blocks: Vec<u32> = (0..set.block_count())
        .filter(|&i| set.block_cidr(i).unwrap().overlaps(&cidr))
        .collect();
    *blocks.first().unwrap()..=*blocks.last().unwrap()
}

fn check(set: &CidrSet<Vec<u64>>, model: &Model) -> Result<(), TestCaseError> {
    prop_assert_eq!(set.allocated_count(), model.allocated.len() as u32);
    prop_assert_eq!(
        set.free_count(),
        model.block_count - model.allocated.len() as u32
    );
    prop_assert_eq!(set.next_candidate(), model.cursor);
    // Full bit comparison for small sets; sampled for large ones.
    let step = (set.block_count() / 512).max(1);
    let mut i = 0;
    while i < set.block_count() {
        prop_assert_eq!(
            set.is_allocated(i).unwrap(),
            model.allocated.contains(&i),
            "block {}",
            i
        );
        i += step;
    }
    for &i in model.allocated.iter().take(64) {
        prop_assert!(set.is_allocated(i).unwrap());
    }
    Ok(())
}

fn run(v6: bool, block_bits: u8, cluster_prefix: u8, ops: Vec<Op>) -> Result<(), TestCaseError> {
    let (cluster, mask) = shape(v6, block_bits, cluster_prefix);
    let words = storage_words_for(cluster.prefix_len(), mask);
    let mut set = CidrSet::new(cluster, mask, vec![0u64; words]).unwrap();
    let mut model = Model {
        block_count: set.block_count(),
        allocated: BTreeSet::new(),
        cursor: 0,
    };
    for op in ops {
        match op {
            Op::Allocate => match (set.allocate_next(), model.allocate_next()) {
                (Ok(got), Some((index, tries))) => {
                    prop_assert_eq!(got.block_index, index);
                    prop_assert_eq!(got.tries, tries);
                    prop_assert_eq!(got.cidr, set.block_cidr(index).unwrap());
                }
                (Err(AllocError::Exhausted { cluster_cidr }), None) => {
                    prop_assert_eq!(cluster_cidr, cluster)
                }
                (got, want) => prop_assert!(false, "allocate: got {:?}, model {:?}", got, want),
            },
            Op::Occupy(index, delta) | Op::Release(index, delta) => {
                let cidr = operand(&set, index, delta);
                let range = model_range(&set, cidr);
                let occupy = matches!(op, Op::Occupy(..));
                let changed = if occupy {
                    set.occupy(cidr).unwrap()
                } else {
                    set.release(cidr).unwrap()
                };
                let mut want = 0;
                for i in range {
                    let flipped = if occupy {
                        model.allocated.insert(i)
                    } else {
                        model.allocated.remove(&i)
                    };
                    want += flipped as u32;
                }
                prop_assert_eq!(changed, want);
            }
            Op::Foreign(other_family) => {
                let before = (set.allocated_count(), set.next_candidate());
                let cidr = if other_family {
                    if v6 { "10.0.0.0/24" } else { "fd00::/64" }
                } else if v6 {
                    "fd01::/64"
                } else {
                    "192.0.2.0/24"
                };
                let cidr: Cidr = cidr.parse().unwrap();
                if cidr.overlaps(&cluster) {
                    // A short cluster prefix (e.g. ::/0) contains the "foreign" CIDR.
                    continue;
                }
                prop_assert!(set.occupy(cidr).is_err());
                prop_assert!(set.release(cidr).is_err());
                prop_assert_eq!(before, (set.allocated_count(), set.next_candidate()));
            }
            Op::Aligned(delta) => {
                let prefix = mask.saturating_sub(delta);
                let result = set.allocate_aligned(prefix);
                if prefix < cluster.prefix_len() {
                    let is_invalid =
                        matches!(result, Err(AllocError::InvalidBlockPrefixLen { .. }));
                    prop_assert!(is_invalid);
                    continue;
                }
                let group = 1u32 << (mask - prefix);
                let first_fit = (0..model.block_count)
                    .step_by(group as usize)
                    .find(|&s| (s..s + group).all(|i| !model.allocated.contains(&i)));
                match (result, first_fit) {
                    (Ok(got), Some(start)) => {
                        prop_assert_eq!(got.first_block_index, start);
                        prop_assert_eq!(got.block_count, group);
                        prop_assert_eq!(got.cidr.prefix_len(), prefix);
                        model.allocated.extend(start..start + group);
                    }
                    (Err(AllocError::Exhausted { .. }), None) => {}
                    (got, want) => prop_assert!(false, "aligned: got {:?}, model {:?}", got, want),
                }
            }
        }
        check(&set, &model)?;
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]

    #[test]
    fn small_sets_match_model(
        v6 in any::<bool>(),
        block_bits in 0u8..=8,
        cluster_prefix in 0u8..=120,
        ops in prop::collection::vec(op(), 1..300),
    ) {
        run(v6, block_bits, cluster_prefix, ops)?;
    }

    #[test]
    fn large_sets_match_model(
        v6 in any::<bool>(),
        block_bits in 9u8..=16,
        cluster_prefix in 8u8..=56,
        ops in prop::collection::vec(op(), 1..120),
    ) {
        run(v6, block_bits, cluster_prefix, ops)?;
    }

    /// Filling a set allocates every block exactly once in address order from the cursor.
    #[test]
    fn fill_hands_out_each_block_once(v6 in any::<bool>(), block_bits in 0u8..=16) {
        let (cluster, mask) = shape(v6, block_bits, 16);
        let mut set = CidrSet::new(cluster, mask, vec![0u64; storage_words_for(cluster.prefix_len(), mask)]).unwrap();
        for expected in 0..set.block_count() {
            let got = set.allocate_next().unwrap();
            prop_assert_eq!(got.block_index, expected);
            prop_assert_eq!(got.tries, 0);
        }
        let exhausted = matches!(set.allocate_next(), Err(AllocError::Exhausted { .. }));
        prop_assert!(exhausted);
    }

    /// Dual-stack pools never leak: after any sequence, each set's count equals what nodes hold.
    #[test]
    fn dual_stack_pool_never_leaks(
        v4_bits in 0u8..=6,
        v6_bits in 0u8..=6,
        ops in prop::collection::vec(any::<Option<u8>>(), 1..200),
    ) {
        let v4: Cidr = "10.0.0.0/16".parse().unwrap();
        let v6: Cidr = "fd00::/112".parse().unwrap();
        let s4 = CidrSet::new(v4, 16 + v4_bits, vec![0u64; storage_words_for(16, 16 + v4_bits)]).unwrap();
        let s6 = CidrSet::new(v6, 112 + v6_bits, vec![0u64; storage_words_for(112, 112 + v6_bits)]).unwrap();
        let mut pool = Pool::new(s6, Some(s4)).unwrap();
        let mut nodes: Vec<[Cidr; 2]> = Vec::new();
        for op in ops {
            match op {
                None => match pool.allocate_node() {
                    Ok(a) => {
                        prop_assert_eq!(a[0].cidr.family(), Family::V6);
                        prop_assert_eq!(a[1].cidr.family(), Family::V4);
                        for n in &nodes {
                            prop_assert!(!n.iter().any(|c| c.overlaps(&a[0].cidr) || c.overlaps(&a[1].cidr)));
                        }
                        nodes.push([a[0].cidr, a[1].cidr]);
                    }
                    Err(AllocError::Exhausted { .. }) => {
                        let full = pool.sets().iter().any(|s| s.free_count() == 0);
                        prop_assert!(full);
                    }
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                },
                Some(k) if !nodes.is_empty() => {
                    let node = nodes.swap_remove(k as usize % nodes.len());
                    // Release IPv4-first: matched by family, not order.
                    prop_assert_eq!(pool.release_node(&[node[1], node[0]]).unwrap(), 2);
                }
                Some(_) => {}
            }
            for set in pool.sets() {
                prop_assert_eq!(set.allocated_count(), nodes.len() as u32);
            }
        }
    }
}
