//! The `pool_order` target: a `Pool` of several cluster CIDRs per family (issue 18 §1,
//! `Pool::from_sets`) against the order rule, decided from the pool's own state before each call.

use std::collections::BTreeSet;

use nodeipam_core::{
    AllocError, BlockRequest, Cidr, CidrSet, Family, MAX_CLUSTER_CIDRS, Placement, Pool,
};

use super::{Bytes, MAX_OPS, masked_cidr, trace};

type Storage = Vec<u64>;
type Sets = Pool<Storage, MAX_CLUSTER_CIDRS>;

/// Per set: allocated count and cursor.
fn snapshot(pool: &Sets) -> Vec<(u32, u32)> {
    pool.sets()
        .iter()
        .map(|s| (s.allocated_count(), s.next_candidate()))
        .collect()
}

/// Whether `set` has an entirely free aligned block of `prefix_len` bits, found by walking the
/// aligned positions with `allocated_in` (not the search the pool uses).
fn has_room(set: &CidrSet<Storage>, prefix_len: u8) -> bool {
    let cluster = set.cluster_cidr();
    let step_bits = set.cluster_cidr().family().max_prefix_len() - prefix_len;
    let count = 1u64 << (prefix_len - cluster.prefix_len());
    (0..count).any(|i| {
        let network = cluster.network_bits() | (u128::from(i) << step_bits);
        let block = masked_cidr(cluster.family(), network, prefix_len);
        set.allocated_in(block) == Ok(0)
    })
}

/// Bytes: a set count byte (1 ..= 5 sets), per set a byte (bit 0: IPv6; bits 1–2: the grid has
/// 2^0 … 2^3 blocks; the set is `10.<i>.0.0/24` or `fd00:<i>::/120`), then operations of three
/// bytes each: `kind` (bit 0: release the node at index `kind >> 1`; else allocate, bit 1:
/// first fit), the IPv4 and the IPv6 size byte (the request is the family's grid coarsened by
/// `byte % 3` bits, never past the cluster prefix).
pub fn run_pool_order(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let set_count = usize::from(bytes.u8() % 5) + 1;
    let mut sets = Vec::new();
    for index in 0..set_count {
        let spec = bytes.u8();
        let (text, prefix) = if spec & 1 == 1 {
            (format!("fd00:{index}::/120"), 120)
        } else {
            (format!("10.{index}.0.0/24"), 24)
        };
        let cluster: Cidr = text.parse().expect("harness CIDR");
        let grid = prefix + (spec >> 1) % 4;
        let words = nodeipam_core::storage_words_for(prefix, grid);
        sets.push(CidrSet::new(cluster, grid, vec![0u64; words]).expect("harness set"));
    }
    let mut pool: Sets = Pool::from_sets(sets).expect("disjoint sets");
    let families: Vec<Family> = pool.families().to_vec();
    let mut nodes: Vec<Vec<Cidr>> = Vec::new();
    let mut step = 0usize;
    while !bytes.is_empty() && step < MAX_OPS {
        step += 1;
        let (kind, d4, d6) = (bytes.u8(), bytes.u8(), bytes.u8());
        if kind & 1 == 1 && !nodes.is_empty() {
            let node = nodes.swap_remove(usize::from(kind >> 1) % nodes.len());
            let released = pool.release_node(&node);
            trace(&format!("{step} release"), &(&node, &released));
            assert!(released.is_ok(), "{step}: release {node:?}: {released:?}");
            continue;
        }
        let placement = if kind & 2 == 2 {
            Placement::FirstFit
        } else {
            Placement::NextFromCursor
        };
        // Valid in every set of the family: at most its finest grid, at least the prefix.
        let requests: Vec<BlockRequest> = families
            .iter()
            .map(|family| {
                let grid = pool.sets_of(*family).map(|s| s.node_mask_size()).min();
                let prefix = pool.set_for(*family).map(|s| s.cluster_cidr().prefix_len());
                let d = if *family == Family::V4 { d4 } else { d6 } % 3;
                let prefix_len = grid.unwrap_or(0).saturating_sub(d).max(prefix.unwrap_or(0));
                BlockRequest {
                    prefix_len,
                    placement,
                }
            })
            .collect();
        let expected: Vec<Option<usize>> = families
            .iter()
            .zip(&requests)
            .map(|(family, request)| {
                pool.sets().iter().position(|s| {
                    s.cluster_cidr().family() == *family && has_room(s, request.prefix_len)
                })
            })
            .collect();
        let before = snapshot(&pool);
        let result = pool.allocate_node_blocks(&requests);
        trace(&format!("{step} allocate"), &(&requests, &result));
        match result {
            Ok(blocks) => {
                assert!(
                    expected.iter().all(Option::is_some),
                    "{step}: allocated although a family is full"
                );
                for ((block, want), request) in blocks.iter().zip(&expected).zip(&requests) {
                    let want = want.and_then(|i| pool.sets().get(i)).expect("expected set");
                    assert!(
                        want.cluster_cidr().contains(&block.cidr),
                        "{step}: {} is not from {}, the first set with room",
                        block.cidr,
                        want.cluster_cidr()
                    );
                    assert_eq!(block.cidr.prefix_len(), request.prefix_len, "{step}");
                    assert!(
                        !nodes.iter().flatten().any(|c| c.overlaps(&block.cidr)),
                        "{step}: {} handed out twice",
                        block.cidr
                    );
                }
                nodes.push(blocks.iter().map(|b| b.cidr).collect());
            }
            Err(error) => {
                let full = families
                    .iter()
                    .zip(&expected)
                    .find(|(_, e)| e.is_none())
                    .map(|(f, _)| *f);
                let Some(family) = full else {
                    panic!("{step}: refused with room in every family: {error}");
                };
                let count = pool.sets_of(family).count();
                match error {
                    AllocError::Exhausted { cluster_cidr } => {
                        assert_eq!(count, 1, "{step}");
                        assert_eq!(
                            Some(cluster_cidr),
                            pool.set_for(family).map(CidrSet::cluster_cidr)
                        );
                    }
                    AllocError::ClusterCidrsExhausted {
                        family: f,
                        count: c,
                        ..
                    } => {
                        assert_eq!((f, usize::from(c)), (family, count), "{step}");
                    }
                    other => panic!("{step}: unexpected {other}"),
                }
                assert_eq!(
                    before,
                    snapshot(&pool),
                    "{step}: a refused call changed a set"
                );
            }
        }
        let held: BTreeSet<Cidr> = nodes.iter().flatten().copied().collect();
        for set in pool.sets() {
            let blocks: u32 = held
                .iter()
                .filter(|c| set.cluster_cidr().contains(c))
                .map(|c| 1u32 << (set.node_mask_size() - c.prefix_len()))
                .sum();
            assert_eq!(
                set.allocated_count(),
                blocks,
                "{step}: {}",
                set.cluster_cidr()
            );
        }
    }
}
