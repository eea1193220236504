//! Reshaping the backing sets for one ClusterCIDR range (see [`super`]): a range on the set that
//! contains it (re-gridded when its blocks are finer), or a new set covering it and every set it
//! contains. Works on a copy of the sets; the caller installs the result.
//!
//! Carrying a set over to a finer grid is exact for what the allocator knows: a coarse block that
//! was allocated only for CIDRs finer than it (a Node's /26 in a set of /24 blocks) marks only
//! those CIDRs on the new grid, so its status counts and a later release are exact. A coarse
//! block no known CIDR explains stays allocated whole (never hand out what may be held).

use nodeipam_core::{AllocError, Cidr, CidrSet, MAX_BLOCK_BITS, storage_words_for};

/// Makes the backing sets `sets` (disjoint, any order) host `range` handing out blocks of
/// `mask` bits (prefix length): afterwards exactly one set contains `range`, on a grid at least
/// as fine as `mask`, and every address allocated before is still allocated. `known` is every
/// CIDR the allocator holds for a Node or reserves (service CIDRs): what a carried-over coarse
/// block is refined to.
///
/// # Errors
/// [`AllocError::TooManyBlocks`] when the set needed would have more than 2^24 blocks
/// ([`MAX_BLOCK_BITS`]); [`AllocError::InvalidNodeMaskSize`] for a `mask` shorter than the
/// range's prefix. `sets` may then be partly changed: the caller drops its copy.
pub(super) fn host_range(
    sets: &mut Vec<CidrSet<Vec<u64>>>,
    range: Cidr,
    mask: u8,
    service_cidrs: &[Cidr],
    known: &[Cidr],
) -> Result<(), AllocError> {
    if mask < range.prefix_len() || mask > range.family().max_prefix_len() {
        return Err(AllocError::InvalidNodeMaskSize {
            cluster_cidr: range,
            node_mask_size: mask,
        });
    }
    if let Some(index) = sets.iter().position(|s| s.cluster_cidr().contains(&range)) {
        if let Some(set) = sets.get_mut(index)
            && mask > set.node_mask_size()
        {
            *set = regrown(set.cluster_cidr(), mask, &[&*set], service_cidrs, known)?;
        }
        return Ok(());
    }
    // Every set `range` overlaps lies inside it (CIDRs nest or are disjoint).
    let inside: Vec<usize> = sets
        .iter()
        .enumerate()
        .filter(|(_, s)| range.contains(&s.cluster_cidr()))
        .map(|(i, _)| i)
        .collect();
    let grid = inside
        .iter()
        .filter_map(|i| sets.get(*i))
        .map(CidrSet::node_mask_size)
        .fold(mask, u8::max);
    let contained: Vec<&CidrSet<Vec<u64>>> = inside.iter().filter_map(|i| sets.get(*i)).collect();
    let merged = regrown(range, grid, &contained, service_cidrs, known)?;
    let at = inside.first().copied().unwrap_or(sets.len());
    for index in inside.iter().rev() {
        sets.remove(*index);
    }
    sets.insert(at.min(sets.len()), merged);
    Ok(())
}

/// A new set over `cidr` on a grid of `grid` bits with every allocation of `old` carried over
/// (refined by `known`, see the module docs) and the service CIDRs reserved where they overlap
/// it.
fn regrown(
    cidr: Cidr,
    grid: u8,
    old: &[&CidrSet<Vec<u64>>],
    service_cidrs: &[Cidr],
    known: &[Cidr],
) -> Result<CidrSet<Vec<u64>>, AllocError> {
    // Checked before sizing the storage: a too-fine grid must not allocate 2^24 blocks' worth.
    if grid < cidr.prefix_len() || grid - cidr.prefix_len() > MAX_BLOCK_BITS {
        return Err(AllocError::TooManyBlocks {
            cluster_cidr: cidr,
            node_mask_size: grid,
        });
    }
    let words = storage_words_for(cidr.prefix_len(), grid);
    let mut set = CidrSet::new(cidr, grid, vec![0u64; words])?;
    for other in old {
        set.occupy_allocations_of(*other)?;
        refine(&mut set, other, known);
    }
    for service in service_cidrs.iter().filter(|s| s.overlaps(&cidr)) {
        // Overlaps the set: cannot fail.
        let _ = set.occupy(*service);
    }
    Ok(set)
}

/// On `set` (just carried over from `old`, on a finer grid): each block of `old` that was
/// allocated only because of CIDRs of `known` finer than it is released and those CIDRs occupied
/// again, so the new grid marks what they cover and no more. A block that a `known` CIDR at
/// least as coarse overlaps, or that none explains, is left whole.
fn refine(set: &mut CidrSet<Vec<u64>>, old: &CidrSet<Vec<u64>>, known: &[Cidr]) {
    let coarse = old.node_mask_size();
    if set.node_mask_size() <= coarse {
        return;
    }
    let inside = |c: &&Cidr| old.cluster_cidr().contains(c);
    let mut blocks: Vec<Cidr> = known
        .iter()
        .filter(inside)
        .filter(|c| c.prefix_len() > coarse)
        .filter_map(|c| Cidr::new_masked(c.network(), coarse).ok())
        .collect();
    blocks.sort_unstable_by_key(|b| b.network_bits());
    blocks.dedup();
    for block in blocks {
        let explained_whole = known
            .iter()
            .any(|c| c.prefix_len() <= coarse && c.overlaps(&block));
        if explained_whole {
            continue;
        }
        // Inside the set (it lies in `old`, which the new set covers): cannot fail.
        let _ = set.release(block);
        for cidr in known.iter().filter(|c| c.overlaps(&block)) {
            let _ = set.occupy(*cidr);
        }
    }
}
