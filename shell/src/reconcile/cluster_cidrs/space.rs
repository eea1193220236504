//! Reshaping the backing sets for one ClusterCIDR range (see [`super`]): a range on the set that
//! contains it (re-gridded when its blocks are finer), or a new set covering it and every set it
//! contains. Works on a copy of the sets; the caller installs the result.

use nodeipam_core::{AllocError, Cidr, CidrSet, MAX_BLOCK_BITS, storage_words_for};

use super::lies_inside;

/// Makes the backing sets `sets` (disjoint, any order) host `range` handing out blocks of
/// `mask` bits (prefix length): afterwards exactly one set contains `range`, on a grid at least
/// as fine as `mask`, and every address allocated before is still allocated.
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
) -> Result<(), AllocError> {
    if mask < range.prefix_len() || mask > range.family().max_prefix_len() {
        return Err(AllocError::InvalidNodeMaskSize {
            cluster_cidr: range,
            node_mask_size: mask,
        });
    }
    if let Some(index) = sets
        .iter()
        .position(|s| lies_inside(range, s.cluster_cidr()))
    {
        if let Some(set) = sets.get_mut(index)
            && mask > set.node_mask_size()
        {
            *set = regrown(set.cluster_cidr(), mask, &[&*set], service_cidrs)?;
        }
        return Ok(());
    }
    // Every set `range` overlaps lies inside it (CIDRs nest or are disjoint).
    let inside: Vec<usize> = sets
        .iter()
        .enumerate()
        .filter(|(_, s)| lies_inside(s.cluster_cidr(), range))
        .map(|(i, _)| i)
        .collect();
    let grid = inside
        .iter()
        .filter_map(|i| sets.get(*i))
        .map(CidrSet::node_mask_size)
        .fold(mask, u8::max);
    let contained: Vec<&CidrSet<Vec<u64>>> = inside.iter().filter_map(|i| sets.get(*i)).collect();
    let merged = regrown(range, grid, &contained, service_cidrs)?;
    let at = inside.first().copied().unwrap_or(sets.len());
    for index in inside.iter().rev() {
        sets.remove(*index);
    }
    sets.insert(at.min(sets.len()), merged);
    Ok(())
}

/// A new set over `cidr` on a grid of `grid` bits with every allocation of `old` carried over
/// and the service CIDRs reserved where they overlap it.
fn regrown(
    cidr: Cidr,
    grid: u8,
    old: &[&CidrSet<Vec<u64>>],
    service_cidrs: &[Cidr],
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
    }
    for service in service_cidrs.iter().filter(|s| s.overlaps(&cidr)) {
        // Overlaps the set: cannot fail.
        let _ = set.occupy(*service);
    }
    Ok(set)
}
