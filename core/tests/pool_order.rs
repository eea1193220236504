#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test.
//! Property tests of the order rule for several cluster CIDRs per family (issue 18 §1), against
//! a model computed from the pool's own state before each call:
//! - a family's block comes from its **first set (flag order) that has a free aligned block of
//!   the requested size**: a later cluster CIDR only when every earlier one is full for that size;
//! - all or nothing across families: when any family has no such block the call fails naming it
//!   (`Exhausted` for a family of one set, `ClusterCidrsExhausted` for several) and no set changes
//!   (counts and cursors);
//! - no block is handed out twice, and each set's count is what the nodes hold in it;
//! - with one set per family, `Pool::from_sets` at capacity 8 answers exactly as `Pool::new`.

use nodeipam_core::{
    AllocError, BlockRequest, Cidr, CidrSet, Family, MAX_CLUSTER_CIDRS, Placement, Pool,
    storage_words_for,
};
use proptest::prelude::*;

type Sets = Pool<Vec<u64>, MAX_CLUSTER_CIDRS>;

/// One configured cluster CIDR: its family, and `bits` — the grid has 2^bits blocks.
#[derive(Debug, Clone, Copy)]
struct Spec {
    v6: bool,
    bits: u8,
}

/// IPv4 CIDRs are `10.<i>.0.0/24` cut into /(24+bits); IPv6 `fd00:<i>::/120` into /(120+bits).
fn make_set(spec: Spec, index: usize) -> CidrSet<Vec<u64>> {
    let (text, prefix) = if spec.v6 {
        (format!("fd00:{index}::/120"), 120)
    } else {
        (format!("10.{index}.0.0/24"), 24)
    };
    let cidr: Cidr = text.parse().unwrap();
    let grid = prefix + spec.bits;
    CidrSet::new(cidr, grid, vec![0u64; storage_words_for(prefix, grid)]).unwrap()
}

/// Per set (flag order): allocated count and cursor.
fn snapshot(pool: &Sets) -> Vec<(u32, u32)> {
    pool.sets()
        .iter()
        .map(|s| (s.allocated_count(), s.next_candidate()))
        .collect()
}

/// Whether `set` has an entirely free aligned block of `prefix_len` bits.
fn fits(set: &CidrSet<Vec<u64>>, prefix_len: u8) -> bool {
    set.largest_free_block()
        .is_some_and(|b| b.cidr.prefix_len() <= prefix_len)
}

fn specs() -> impl Strategy<Value = Vec<Spec>> {
    prop::collection::vec(
        (any::<bool>(), 0u8..=3).prop_map(|(v6, bits)| Spec { v6, bits }),
        1..=5,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The order rule and all-or-nothing, over random configurations (1–5 sets, either family,
    /// any interleaving) and random allocate / release sequences with per-node sizes.
    #[test]
    fn later_cidr_only_when_earlier_ones_are_full(
        specs in specs(),
        ops in prop::collection::vec((0u8..3, 0u8..3, any::<bool>(), any::<Option<u8>>()), 1..120),
    ) {
        let mut pool: Sets = Pool::from_sets(specs.iter().enumerate().map(|(i, s)| make_set(*s, i))).unwrap();
        let families: Vec<Family> = pool.families().to_vec();
        let mut nodes: Vec<Vec<Cidr>> = Vec::new();
        for (d4, d6, first_fit, release) in ops {
            if let Some(k) = release.filter(|_| !nodes.is_empty()) {
                let node = nodes.swap_remove(k as usize % nodes.len());
                pool.release_node(&node).unwrap();
            } else {
                let placement = if first_fit { Placement::FirstFit } else { Placement::NextFromCursor };
                // Per family: a size between the family's finest grid less d and its coarsest set.
                let requests: Vec<BlockRequest> = families.iter().map(|family| {
                    let sets: Vec<&CidrSet<Vec<u64>>> = pool.sets_of(*family).collect();
                    let grid = sets[0].node_mask_size();
                    let coarsest = sets.iter().map(|s| s.cluster_cidr().prefix_len()).max().unwrap();
                    let d = if *family == Family::V4 { d4 } else { d6 };
                    let grid_min = sets.iter().map(|s| s.node_mask_size()).min().unwrap();
                    // Valid in every set of the family: at most the finest grid of them, at least
                    // every set's prefix.
                    let prefix_len = grid_min.saturating_sub(d).max(coarsest).min(grid);
                    BlockRequest { prefix_len, placement }
                }).collect();
                // The model: per family, the first set (flag order) with room for the request.
                let expected: Vec<Option<usize>> = families.iter().zip(&requests).map(|(family, r)| {
                    pool.sets().iter().position(|s| s.cluster_cidr().family() == *family && fits(s, r.prefix_len))
                }).collect();
                let before = snapshot(&pool);
                match pool.allocate_node_blocks(&requests) {
                    Ok(got) => {
                        prop_assert!(expected.iter().all(Option::is_some), "allocated although a family is full: {:?}", expected);
                        prop_assert_eq!(got.len(), families.len());
                        for ((block, want), request) in got.iter().zip(&expected).zip(&requests) {
                            let want = &pool.sets()[want.unwrap()];
                            prop_assert!(want.cluster_cidr().contains(&block.cidr),
                                "{} is not from {}, the first set with room", block.cidr, want.cluster_cidr());
                            prop_assert_eq!(block.cidr.prefix_len(), request.prefix_len);
                            for held in nodes.iter().flatten() {
                                prop_assert!(!held.overlaps(&block.cidr), "{} handed out twice", block.cidr);
                            }
                        }
                        nodes.push(got.iter().map(|b| b.cidr).collect());
                    }
                    Err(error) => {
                        let full = families.iter().zip(&expected).find(|(_, e)| e.is_none());
                        prop_assert!(full.is_some(), "refused with room everywhere: {:?}", error);
                        let (family, _) = full.unwrap();
                        let count = pool.sets_of(*family).count();
                        match error {
                            AllocError::Exhausted { cluster_cidr } => {
                                prop_assert_eq!(count, 1);
                                prop_assert_eq!(Some(cluster_cidr), pool.set_for(*family).map(CidrSet::cluster_cidr));
                            }
                            AllocError::ClusterCidrsExhausted { family: f, count: c, first, last } => {
                                prop_assert_eq!(f, *family);
                                prop_assert_eq!(usize::from(c), count);
                                prop_assert_eq!(Some(first), pool.sets_of(f).next().map(CidrSet::cluster_cidr));
                                prop_assert_eq!(Some(last), pool.sets_of(f).last().map(CidrSet::cluster_cidr));
                            }
                            other => prop_assert!(false, "unexpected {:?}", other),
                        }
                        prop_assert_eq!(before, snapshot(&pool), "a refused call changed a set");
                    }
                }
            }
            for set in pool.sets() {
                let held: u32 = nodes.iter().flatten()
                    .filter(|c| set.cluster_cidr().contains(c))
                    .map(|c| 1u32 << (set.node_mask_size() - c.prefix_len()))
                    .sum();
                prop_assert_eq!(set.allocated_count(), held, "{}", set.cluster_cidr());
            }
        }
    }

    /// One set per family: a capacity-8 pool built by `from_sets` answers every call exactly as
    /// the two-set `Pool::new` (the behaviour before several CIDRs per family existed).
    #[test]
    fn one_set_per_family_is_unchanged(
        v4_bits in 0u8..=4,
        v6: Option<u8>,
        v6_first: bool,
        ops in prop::collection::vec((0u8..3, any::<bool>(), any::<Option<u8>>()), 1..120),
    ) {
        let v4 = Spec { v6: false, bits: v4_bits };
        let build_old = || {
            let a = make_set(v4, 0);
            match v6 {
                None => Pool::new(a, None).unwrap(),
                Some(bits) => {
                    let b = make_set(Spec { v6: true, bits: bits % 5 }, 0);
                    if v6_first { Pool::new(b, Some(a)).unwrap() } else { Pool::new(a, Some(b)).unwrap() }
                }
            }
        };
        let mut old = build_old();
        let mut new: Sets = Pool::from_sets(build_old().sets().iter().cloned()).unwrap();
        let mut nodes: Vec<Vec<Cidr>> = Vec::new();
        for (d, first_fit, release) in ops {
            if let Some(k) = release.filter(|_| !nodes.is_empty()) {
                let node = nodes.swap_remove(k as usize % nodes.len());
                prop_assert_eq!(old.release_node(&node), new.release_node(&node));
            } else if d == 0 && !first_fit {
                let (a, b) = (old.allocate_node(), new.allocate_node());
                prop_assert_eq!(&a, &b);
                if let Ok(a) = a { nodes.push(a.iter().map(|x| x.cidr).collect()); }
            } else {
                let placement = if first_fit { Placement::FirstFit } else { Placement::NextFromCursor };
                let requests: Vec<BlockRequest> = old.sets().iter().map(|s| BlockRequest {
                    prefix_len: s.node_mask_size().saturating_sub(d).max(s.cluster_cidr().prefix_len()),
                    placement,
                }).collect();
                let (a, b) = (old.allocate_node_blocks(&requests), new.allocate_node_blocks(&requests));
                prop_assert_eq!(&a, &b);
                if let Ok(a) = a { nodes.push(a.iter().map(|x| x.cidr).collect()); }
            }
            let old_state: Vec<(u32, u32)> = old.sets().iter().map(|s| (s.allocated_count(), s.next_candidate())).collect();
            prop_assert_eq!(old_state, snapshot(&new));
        }
    }
}
