#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test.
//! Property tests: `CidrSet` and `Pool` against a trivial model (a `BTreeSet` of allocated block
//! indices plus upstream's round-robin cursor), over random operation sequences on IPv4 and IPv6
//! sets of 1 … 2^16 blocks.

use std::collections::BTreeSet;

use nodeipam_core::{
    AllocError, BlockRequest, Cidr, CidrSet, Family, Placement, Pool, storage_words_for,
};
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

    fn group_free(&self, start: u32, group: u32) -> bool {
        (start..start + group).all(|i| !self.allocated.contains(&i))
    }

    /// Aligned blocks of `group` blocks, scanned one aligned position at a time: from the cursor
    /// rounded up to the alignment, wrapping (cursor := end of the block), or from 0 (cursor kept).
    /// Returns (first block, aligned positions skipped).
    fn allocate_block(&mut self, group: u32, from_cursor: bool) -> Option<(u32, u32)> {
        let positions = self.block_count / group;
        let start = if from_cursor {
            self.cursor.div_ceil(group) % positions
        } else {
            0
        };
        for tries in 0..positions {
            let first = (start + tries) % positions * group;
            if self.group_free(first, group) {
                self.allocated.extend(first..first + group);
                if from_cursor {
                    self.cursor = (first + group) % self.block_count;
                }
                return Some((first, tries));
            }
        }
        None
    }

    /// The largest free aligned block (lowest of that size): (first block, blocks).
    fn largest_free(&self) -> Option<(u32, u32)> {
        let mut group = self.block_count;
        while group >= 1 {
            if let Some(first) = (0..self.block_count)
                .step_by(group as usize)
                .find(|&first| self.group_free(first, group))
            {
                return Some((first, group));
            }
            group /= 2;
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
    /// `allocate_block` of node_mask − delta bits; `true` = from the cursor, `false` = first fit.
    Block(u8, bool),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => Just(Op::Allocate),
        3 => (any::<u32>(), -3i8..6).prop_map(|(i, d)| Op::Occupy(i, d)),
        3 => (any::<u32>(), -3i8..6).prop_map(|(i, d)| Op::Release(i, d)),
        1 => any::<bool>().prop_map(Op::Foreign),
        1 => (0u8..8).prop_map(Op::Aligned),
        3 => (0u8..5, any::<bool>()).prop_map(|(d, c)| Op::Block(d, c)),
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
    if set.block_count() <= 4096 {
        let largest = set
            .largest_free_block()
            .map(|b| (b.first_block_index, b.block_count));
        prop_assert_eq!(largest, model.largest_free());
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
            Op::Block(delta, from_cursor) => {
                let prefix_len = mask.saturating_sub(delta);
                let placement = if from_cursor {
                    Placement::NextFromCursor
                } else {
                    Placement::FirstFit
                };
                let before = (set.allocated_count(), set.next_candidate());
                let result = set.allocate_block(BlockRequest {
                    prefix_len,
                    placement,
                });
                if prefix_len < cluster.prefix_len() {
                    let is_invalid =
                        matches!(result, Err(AllocError::InvalidBlockPrefixLen { .. }));
                    prop_assert!(is_invalid);
                    prop_assert_eq!(before, (set.allocated_count(), set.next_candidate()));
                    continue;
                }
                let group = 1u32 << (mask - prefix_len);
                match (result, model.allocate_block(group, from_cursor)) {
                    (Ok(got), Some((first, tries))) => {
                        prop_assert_eq!(got.first_block_index, first);
                        prop_assert_eq!(got.tries, tries);
                        prop_assert_eq!(got.block_count, group);
                        prop_assert_eq!(got.cidr.prefix_len(), prefix_len);
                        prop_assert_eq!(
                            got.cidr.network(),
                            set.block_cidr(first).unwrap().network()
                        );
                    }
                    (Err(AllocError::Exhausted { cluster_cidr }), None) => {
                        prop_assert_eq!(cluster_cidr, cluster);
                        prop_assert_eq!(before, (set.allocated_count(), set.next_candidate()));
                    }
                    (got, want) => prop_assert!(false, "block: got {:?}, model {:?}", got, want),
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

    /// A one-grid-block request from the cursor is `allocate_next`, step for step, whatever else
    /// happened to the set before (occupy, release, aligned blocks).
    #[test]
    fn one_block_from_cursor_equals_allocate_next(
        v6 in any::<bool>(),
        block_bits in 0u8..=10,
        setup in prop::collection::vec((any::<u32>(), 0i8..4, any::<bool>()), 0..40),
        steps in 1usize..200,
    ) {
        let (cluster, mask) = shape(v6, block_bits, 20);
        let mut a = CidrSet::new(cluster, mask, vec![0u64; storage_words_for(cluster.prefix_len(), mask)]).unwrap();
        for (index, delta, occupy) in setup {
            let cidr = operand(&a, index, delta);
            if occupy { a.occupy(cidr).unwrap(); } else { a.release(cidr).unwrap(); }
            if index % 3 == 0 { let _ = a.allocate_next(); }
        }
        let mut b = a.clone();
        for _ in 0..steps {
            let next = a.allocate_next();
            let block = b.allocate_block(BlockRequest { prefix_len: mask, placement: Placement::NextFromCursor });
            match (next, block) {
                (Ok(n), Ok(k)) => {
                    prop_assert_eq!((n.cidr, n.block_index, n.tries), (k.cidr, k.first_block_index, k.tries));
                }
                (Err(e), Err(f)) => prop_assert_eq!(e, f),
                (n, k) => prop_assert!(false, "{:?} vs {:?}", n, k),
            }
            prop_assert_eq!(a.next_candidate(), b.next_candidate());
            prop_assert_eq!(a.allocated_count(), b.allocated_count());
        }
    }

    /// Sized dual-stack allocation is all or nothing: a failure changes neither set.
    #[test]
    fn sized_dual_stack_pool_never_leaks(
        ops in prop::collection::vec((0u8..4, 0u8..4, any::<bool>(), any::<Option<u8>>()), 1..150),
    ) {
        let v4: Cidr = "10.0.0.0/22".parse().unwrap();
        let v6: Cidr = "fd00::/118".parse().unwrap();
        let s4 = CidrSet::new(v4, 28, vec![0u64; storage_words_for(22, 28)]).unwrap();
        let s6 = CidrSet::new(v6, 123, vec![0u64; storage_words_for(118, 123)]).unwrap();
        let mut pool = Pool::new(s4, Some(s6)).unwrap();
        let mut nodes: Vec<[Cidr; 2]> = Vec::new();
        let blocks = |pool: &Pool<Vec<u64>>, c: &Cidr| -> u32 {
            let set = pool.set_for(c.family()).unwrap();
            let (first, last) = set.block_range(*c).unwrap();
            last - first + 1
        };
        for (d4, d6, first_fit, release) in ops {
            if let Some(k) = release.filter(|_| !nodes.is_empty()) {
                let node = nodes.swap_remove(k as usize % nodes.len());
                pool.release_node(&node).unwrap();
            } else {
                let placement = if first_fit { Placement::FirstFit } else { Placement::NextFromCursor };
                let requests = [
                    BlockRequest { prefix_len: 28 - d4, placement },
                    BlockRequest { prefix_len: 123 - d6, placement },
                ];
                let before: Vec<(u32, u32)> = pool.sets().iter().map(|s| (s.allocated_count(), s.next_candidate())).collect();
                match pool.allocate_node_blocks(&requests) {
                    Ok(got) => {
                        prop_assert_eq!(got[0].cidr.prefix_len(), 28 - d4);
                        prop_assert_eq!(got[1].cidr.prefix_len(), 123 - d6);
                        for n in &nodes {
                            prop_assert!(!n.iter().any(|c| c.overlaps(&got[0].cidr) || c.overlaps(&got[1].cidr)));
                        }
                        nodes.push([got[0].cidr, got[1].cidr]);
                    }
                    Err(AllocError::Exhausted { .. }) => {
                        let after: Vec<(u32, u32)> = pool.sets().iter().map(|s| (s.allocated_count(), s.next_candidate())).collect();
                        prop_assert_eq!(before, after);
                    }
                    Err(e) => prop_assert!(false, "unexpected {:?}", e),
                }
            }
            for (i, set) in pool.sets().iter().enumerate() {
                let held: u32 = nodes.iter().map(|n| blocks(&pool, &n[i])).sum();
                prop_assert_eq!(set.allocated_count(), held);
            }
        }
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
