//! Reshaping the backing sets for one ClusterCIDR range (see [`super`]): a range on the set that
//! contains it (re-gridded when its blocks are finer), or a new set covering it and every set it
//! contains. Planned on the sets as they are ([`plan_range`]: only the new set is built); the
//! caller installs the result without copying the sets it keeps ([`slots`],
//! [`nodeipam_core::Pool::splice`]).
//!
//! Carrying a set over to a finer grid is exact for what the allocator knows: a coarse block that
//! was allocated only for CIDRs finer than it (a Node's /26 in a set of /24 blocks) marks only
//! those CIDRs on the new grid, so its status counts and a later release are exact. A coarse
//! block no known CIDR explains stays allocated whole (never hand out what may be held).

use nodeipam_core::{AllocError, Cidr, CidrSet, MAX_BLOCK_BITS, Slot, storage_words_for};

/// What hosting one range changes in the backing sets ([`plan_range`]): the sets at `replaced`
/// (indices of the sets given, ascending; empty: none) give way to `set`, which takes the place
/// of the first of them (or goes last when none is replaced).
#[derive(Debug)]
pub(super) struct Change {
    /// Indices of the sets replaced.
    pub(super) replaced: Vec<usize>,
    /// The set that replaces them.
    pub(super) set: CidrSet<Vec<u64>>,
}

/// What the backing sets `sets` (disjoint, any order) need to host `range` handing out blocks
/// of `mask` bits (prefix length): `None` when a set contains `range` on a grid at least as fine
/// as `mask`; otherwise the [`Change`] after which exactly one set contains `range` on such a
/// grid, every address allocated before still allocated. `known` is every CIDR the allocator
/// holds for a Node or reserves (service CIDRs): what a carried-over coarse block is refined
/// to. Reads `sets` only: the new set is built from them, no set is copied whole, so hosting a
/// range costs the sets it touches, not every set.
///
/// # Errors
/// [`AllocError::TooManyBlocks`] when the set needed would have more than 2^24 blocks
/// ([`MAX_BLOCK_BITS`]); [`AllocError::InvalidNodeMaskSize`] for a `mask` shorter than the
/// range's prefix.
pub(super) fn plan_range(
    sets: &[CidrSet<Vec<u64>>],
    range: Cidr,
    mask: u8,
    service_cidrs: &[Cidr],
    known: &[Cidr],
) -> Result<Option<Change>, AllocError> {
    if mask < range.prefix_len() || mask > range.family().max_prefix_len() {
        return Err(AllocError::InvalidNodeMaskSize {
            cluster_cidr: range,
            node_mask_size: mask,
        });
    }
    if let Some(index) = sets.iter().position(|s| s.cluster_cidr().contains(&range)) {
        return match sets.get(index) {
            Some(set) if mask > set.node_mask_size() => Ok(Some(Change {
                replaced: vec![index],
                set: regrown(set.cluster_cidr(), mask, &[set], service_cidrs, known)?,
            })),
            _ => Ok(None),
        };
    }
    // Every set `range` overlaps lies inside it (CIDRs nest or are disjoint).
    let replaced: Vec<usize> = sets
        .iter()
        .enumerate()
        .filter(|(_, s)| range.contains(&s.cluster_cidr()))
        .map(|(i, _)| i)
        .collect();
    let contained: Vec<&CidrSet<Vec<u64>>> = replaced.iter().filter_map(|i| sets.get(*i)).collect();
    let grid = contained
        .iter()
        .map(|s| s.node_mask_size())
        .fold(mask, u8::max);
    let set = regrown(range, grid, &contained, service_cidrs, known)?;
    Ok(Some(Change { replaced, set }))
}

/// The list of sets after `changes` (each planned on the same `count` sets, disjoint from one
/// another: [`plan_range`] of ranges of different families), as [`Slot`]s for
/// [`nodeipam_core::Pool::splice`]: every set kept in place, each change's set at the place of
/// the first set it replaces, those replacing none last (in `changes` order).
pub(super) fn slots(count: usize, changes: Vec<Change>) -> Vec<Slot<Vec<u64>>> {
    let mut at_first: Vec<Option<CidrSet<Vec<u64>>>> = (0..count).map(|_| None).collect();
    let mut replaced = vec![false; count];
    let mut last = Vec::new();
    for change in changes {
        for index in &change.replaced {
            if let Some(r) = replaced.get_mut(*index) {
                *r = true;
            }
        }
        match change.replaced.first().and_then(|i| at_first.get_mut(*i)) {
            Some(place) => *place = Some(change.set),
            None => last.push(change.set),
        }
    }
    let mut slots = Vec::with_capacity(count + last.len());
    for (index, (new, gone)) in at_first.into_iter().zip(replaced).enumerate() {
        match new {
            Some(set) => slots.push(Slot::New(set)),
            None if !gone => slots.push(Slot::Kept(index)),
            None => {}
        }
    }
    slots.extend(last.into_iter().map(Slot::New));
    slots
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
