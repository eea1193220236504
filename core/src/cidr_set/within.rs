//! Allocation within part of a set: one pool's CIDR inside a larger address space.
//!
//! Several pools can share one address space (a [`CidrSet`] over the outermost CIDR, on the grid of
//! the finest block any of them hands out), e.g. a pool of /26 blocks for labelled Nodes inside the
//! default 10.244.0.0/16 of /24 blocks — KEP-2593's overlapping `ClusterCIDR`s. Each pool then
//! allocates through a [`PoolRange`]: its own CIDR inside the set and its own round-robin cursor.
//! Because every pool marks the one shared bitmap, no address is ever handed out twice, whichever
//! pool it is taken through.
//!
//! A range equal to the set's cluster CIDR, with the set's cursor, allocates exactly what
//! [`CidrSet::allocate_block`] allocates (same block, tries and cursor move), so the one-pool case
//! keeps kube-controller-manager's order.
//!
//! Growing or re-gridding an address space (a new pool that is a supernet of it, or hands out
//! finer blocks) is a new set: [`CidrSet::occupy_allocations_of`] carries every allocated address
//! of the old set over.

use super::{BlockAllocation, BlockRequest, CidrSet, Placement, aligned_runs, range_mask};
use crate::cidr::Cidr;
use crate::error::AllocError;

/// One pool's part of a [`CidrSet`]: a CIDR that overlaps the set's cluster CIDR (the grid blocks
/// it covers are the pool's; a supernet of the cluster CIDR covers the whole set), and the pool's
/// own round-robin cursor, an offset in grid blocks from the range's first block.
///
/// A range holds no reference to its set: every method that takes one re-derives its blocks from
/// the set it is given, so a range used on another set is never out of bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct PoolRange {
    cidr: Cidr,
    cursor: u32,
}

impl PoolRange {
    /// A range over `cidr` with its cursor at the range's first block.
    pub const fn new(cidr: Cidr) -> Self {
        PoolRange { cidr, cursor: 0 }
    }

    /// A range over `cidr` with its cursor `cursor` grid blocks past the range's first block
    /// (wrapped into the range when used).
    pub const fn with_cursor(cidr: Cidr, cursor: u32) -> Self {
        PoolRange { cidr, cursor }
    }

    /// The pool's CIDR.
    pub const fn cidr(&self) -> Cidr {
        self.cidr
    }

    /// The round-robin cursor: grid blocks past the range's first block where the next
    /// [`Placement::NextFromCursor`] search starts.
    pub const fn cursor(&self) -> u32 {
        self.cursor
    }
}

/// Where a request would be placed within a range: found by [`CidrSet::find_block_within`],
/// taken by [`CidrSet::take_block_within`] (which checks again that the blocks are free).
///
/// Finding first and taking later lets a caller make one decision across several sets (a
/// dual-stack Node's IPv4 and IPv6 blocks, all or nothing) without changing any set until every
/// one has a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct RangeCandidate {
    range_cidr: Cidr,
    prefix_len: u8,
    placement: Placement,
    first: u32,
    group: u32,
    tries: u32,
}

impl RangeCandidate {
    /// Index of the first grid block that would be taken.
    pub fn first_block_index(&self) -> u32 {
        self.first
    }

    /// Grid blocks it covers: 2^(node mask size − prefix length).
    pub fn block_count(&self) -> u32 {
        self.group
    }

    /// Aligned candidate positions skipped before this one, counted from where the search
    /// started (the range's rounded-up cursor, wrapping within the range, or the range's start).
    pub fn tries(&self) -> u32 {
        self.tries
    }
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> CidrSet<S> {
    /// The first and last grid block of `range` in this set, and the range's effective CIDR (its
    /// own CIDR, or the cluster CIDR for a supernet).
    fn range_blocks(&self, range: &PoolRange) -> Result<(u32, u32, Cidr), AllocError> {
        let (first, last) = self.block_range(range.cidr)?;
        let cidr = if range.cidr.prefix_len() <= self.cluster_cidr.prefix_len() {
            self.cluster_cidr
        } else {
            range.cidr
        };
        Ok((first, last, cidr))
    }

    /// [`CidrSet::range_blocks`] plus the size, in grid blocks, of an aligned block of
    /// `prefix_len` bits, checked to fit between the range's prefix and the grid. Then the range
    /// spans a whole number of such blocks and its first grid block is a multiple of the size.
    fn range_groups(
        &self,
        range: &PoolRange,
        prefix_len: u8,
    ) -> Result<(u32, u32, Cidr, u32), AllocError> {
        let (low, high, range_cidr) = self.range_blocks(range)?;
        if prefix_len < range_cidr.prefix_len() {
            return Err(AllocError::BlockLargerThanRange {
                prefix_len,
                range: range_cidr,
            });
        }
        if prefix_len > self.node_mask_size {
            return Err(AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr: self.cluster_cidr,
                node_mask_size: self.node_mask_size,
            });
        }
        Ok((
            low,
            high,
            range_cidr,
            1u32 << (self.node_mask_size - prefix_len),
        ))
    }

    /// Where `request` would go within `range`, without changing anything: the first entirely free
    /// aligned block of `request.prefix_len` bits inside the range, searched as
    /// `CidrSet::find_block` searches the whole set — from the range's cursor rounded up to the
    /// block's alignment, wrapping to the range's start ([`Placement::NextFromCursor`]), or from
    /// the range's start ([`Placement::FirstFit`]). Blocks outside the range are never returned.
    ///
    /// Cost: as [`CidrSet::allocate_block`], bounded by the range's words (the search stops at the
    /// range's end).
    ///
    /// # Errors
    /// - [`AllocError::FamilyMismatch`] / [`AllocError::OutOfRange`] if the range's CIDR shares no
    ///   address with the set's cluster CIDR;
    /// - [`AllocError::BlockLargerThanRange`] if `request.prefix_len` is shorter than the range's
    ///   prefix (the block would not fit inside the range);
    /// - [`AllocError::InvalidBlockPrefixLen`] if it is longer than the node mask size (the grid);
    /// - [`AllocError::Exhausted`] naming the range's CIDR if no aligned block of that size in the
    ///   range is entirely free.
    pub fn find_block_within(
        &self,
        range: &PoolRange,
        request: BlockRequest,
    ) -> Result<RangeCandidate, AllocError> {
        let BlockRequest {
            prefix_len,
            placement,
        } = request;
        let (low, high, range_cidr, group) = self.range_groups(range, prefix_len)?;
        let span = high - low + 1;
        let start_offset = match placement {
            Placement::FirstFit => 0,
            Placement::NextFromCursor => {
                // No overflow: the cursor is reduced below span ≤ 2^24 first.
                let rounded = (range.cursor % span).div_ceil(group) * group;
                if rounded >= span { 0 } else { rounded }
            }
        };
        let start = low + start_offset;
        let exhausted = AllocError::Exhausted {
            cluster_cidr: range_cidr,
        };
        let first = match self.find_free_aligned_between(start, high, group) {
            Some(first) => first,
            None if start > low => self
                .find_free_aligned_between(low, start - 1, group)
                .ok_or(exhausted)?,
            None => return Err(exhausted),
        };
        let skipped_blocks = if first >= start {
            first - start
        } else {
            span - start_offset + (first - low)
        };
        Ok(RangeCandidate {
            range_cidr: range.cidr,
            prefix_len,
            placement,
            first,
            group,
            tries: skipped_blocks / group,
        })
    }

    /// Takes a block found by [`CidrSet::find_block_within`] and, for
    /// [`Placement::NextFromCursor`], moves the range's cursor to the block's end (wrapping to the
    /// range's start). The set's own cursor ([`CidrSet::next_candidate`]) does not move.
    ///
    /// The candidate is checked again first, so a stale one (the set changed since, or it was
    /// found for another range or set) is refused rather than handing out a block twice.
    ///
    /// # Errors
    /// [`AllocError::StaleCandidate`] if the candidate was found for another range, no longer lies
    /// inside the range on this set, or any of its blocks is allocated; the errors of
    /// [`CidrSet::find_block_within`] for a range that does not fit this set. Nothing changes.
    pub fn take_block_within(
        &mut self,
        range: &mut PoolRange,
        candidate: RangeCandidate,
    ) -> Result<BlockAllocation, AllocError> {
        let (low, high, _) = self.range_blocks(range)?;
        let RangeCandidate {
            range_cidr,
            prefix_len,
            placement,
            first,
            group,
            tries,
        } = candidate;
        let fits = range_cidr == range.cidr
            && prefix_len <= self.node_mask_size
            && group == 1u32 << (self.node_mask_size - prefix_len)
            && first >= low
            && first % group == 0
            && first
                .checked_add(group - 1)
                .is_some_and(|last| last <= high);
        if !fits || self.count_free(first, first + (group - 1)) != group {
            return Err(AllocError::StaleCandidate { range: range.cidr });
        }
        self.take_range(first, group);
        if placement == Placement::NextFromCursor {
            let end = first - low + group;
            range.cursor = if end > high - low { 0 } else { end };
        }
        Ok(BlockAllocation {
            cidr: self.aligned_cidr(first, prefix_len),
            first_block_index: first,
            block_count: group,
            tries,
        })
    }

    /// Finds and takes a block within `range` in one step: [`CidrSet::find_block_within`] then
    /// [`CidrSet::take_block_within`]. With `range` over the whole cluster CIDR and its cursor at
    /// [`CidrSet::next_candidate`], returns what [`CidrSet::allocate_block`] returns.
    ///
    /// # Errors
    /// Those of [`CidrSet::find_block_within`]; nothing changes.
    pub fn allocate_block_within(
        &mut self,
        range: &mut PoolRange,
        request: BlockRequest,
    ) -> Result<BlockAllocation, AllocError> {
        let candidate = self.find_block_within(range, request)?;
        self.take_block_within(range, candidate)
    }

    /// How many aligned blocks of `prefix_len` bits inside `range` are entirely free: what the
    /// pool could still hand out at that size (its free capacity in its own block size). With
    /// [`CidrSet::allocated_in`] and the range's size this gives a pool's capacity / used / free.
    ///
    /// Cost: one read per bitmap word of the range.
    ///
    /// # Errors
    /// As [`CidrSet::find_block_within`] for the range and the prefix length (no
    /// [`AllocError::Exhausted`]: a full range gives 0).
    pub fn free_blocks_within(&self, range: &PoolRange, prefix_len: u8) -> Result<u32, AllocError> {
        let (low, high, _, group) = self.range_groups(range, prefix_len)?;
        let mut free = 0;
        if group <= 64 {
            for word_index in low / 64..=high / 64 {
                let bits = self.word(0, word_index) & range_mask(word_index, low, high);
                free += aligned_runs(bits, group).count_ones();
            }
        } else {
            // Each group is group / 64 whole words, all of them free or not.
            let mut start = low;
            while start <= high {
                let first_word = start / 64;
                if (first_word..first_word + group / 64).all(|w| self.word(0, w) == u64::MAX) {
                    free += 1;
                }
                start = match start.checked_add(group) {
                    Some(next) => next,
                    None => break,
                };
            }
        }
        Ok(free)
    }

    /// Occupies in this set every address that `other` has allocated, where the two overlap, and
    /// returns how many of this set's blocks changed from free to allocated. For moving an
    /// address space to a new set (a larger outer CIDR, or a finer grid) without losing a block:
    /// a block of `other` marks every block of this set it overlaps (a finer block of `other`
    /// marks its whole containing block here, as [`CidrSet::occupy`] does). Allocated blocks of
    /// `other` outside this set's cluster CIDR are skipped; `other`'s cursor is not copied.
    ///
    /// Cost: one read per bitmap word of `other`, one range update per run of allocated blocks.
    ///
    /// # Errors
    /// [`AllocError::FamilyMismatch`] or [`AllocError::OutOfRange`] if the two cluster CIDRs share
    /// no address; nothing changes.
    pub fn occupy_allocations_of<T: AsRef<[u64]> + AsMut<[u64]>>(
        &mut self,
        other: &CidrSet<T>,
    ) -> Result<u32, AllocError> {
        // Checks the family and the overlap.
        self.block_range(other.cluster_cidr)?;
        let own_first = self.cluster_cidr.network_bits();
        let own_last = own_first
            | host_mask(
                self.cluster_cidr.family().max_prefix_len(),
                self.cluster_cidr.prefix_len(),
            );
        let other_block_hosts = host_mask(
            other.cluster_cidr.family().max_prefix_len(),
            other.node_mask_size,
        );
        let mut changed = 0;
        let words = other.block_count.div_ceil(64);
        for word_index in 0..words {
            let valid = range_mask(word_index, 0, other.block_count - 1);
            let mut allocated = !other.word(0, word_index) & valid;
            while allocated != 0 {
                let run_start = allocated.trailing_zeros();
                let run_len = (allocated >> run_start).trailing_ones();
                let run_mask = if run_len >= 64 {
                    u64::MAX
                } else {
                    ((1u64 << run_len) - 1) << run_start
                };
                allocated &= !run_mask;
                let first_block = word_index * 64 + run_start;
                let last_block = first_block + (run_len - 1);
                let first_address = other.block_network(first_block);
                let last_address = other.block_network(last_block) | other_block_hosts;
                if last_address < own_first || first_address > own_last {
                    continue;
                }
                let shift = u32::from(self.block_shift);
                let begin = (first_address.max(own_first) - own_first)
                    .checked_shr(shift)
                    .unwrap_or(0) as u32;
                let end = (last_address.min(own_last) - own_first)
                    .checked_shr(shift)
                    .unwrap_or(0) as u32;
                let newly = self.set_range(begin, end.min(self.block_count - 1), false);
                self.allocated_count += newly;
                changed += newly;
            }
        }
        Ok(changed)
    }

    /// First index in `from..=last` of an aligned run of `group` free blocks lying entirely in
    /// `from..=last`. `from` must be a multiple of `group`.
    fn find_free_aligned_between(&self, from: u32, last: u32, group: u32) -> Option<u32> {
        if from > last {
            return None;
        }
        if group == 1 {
            // One grid block: the plain next-free search (a run of one is any free block).
            return self.find_free_from(from).filter(|&first| first <= last);
        }
        self.find_free_aligned_upto(from, last, group)
            .filter(|&first| first.checked_add(group - 1).is_some_and(|end| end <= last))
    }
}

/// The host part of a prefix: `max − prefix_len` low bits set (all 128 for a /0 IPv6).
fn host_mask(max_prefix_len: u8, prefix_len: u8) -> u128 {
    let host_bits = u32::from(max_prefix_len.saturating_sub(prefix_len));
    u128::MAX.checked_shr(128 - host_bits).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::cidr_set::tests::{cidr, set};
    use proptest::prelude::*;
    use std::format;
    use std::vec;
    use std::vec::Vec;

    fn request(prefix_len: u8, placement: Placement) -> BlockRequest {
        BlockRequest {
            prefix_len,
            placement,
        }
    }

    /// KEP-2593's overlapping pools: the default 10.244.0.0/16 of /24 blocks and a pool of /26
    /// blocks for labelled Nodes at 10.244.128.0/20, sharing one set on a /26 grid. Neither pool
    /// ever takes an address the other holds, and each keeps its own round-robin order.
    #[test]
    fn overlapping_pools_share_one_address_space() {
        let mut space = set("10.244.0.0/16", 26);
        let mut default = PoolRange::new(cidr("10.244.0.0/16"));
        let mut labelled = PoolRange::new(cidr("10.244.128.0/20"));
        let small = request(26, Placement::NextFromCursor);
        let big = request(24, Placement::NextFromCursor);
        let a = space.allocate_block_within(&mut labelled, small).unwrap();
        assert_eq!(a.cidr, cidr("10.244.128.0/26"));
        assert_eq!(labelled.cursor(), 1);
        let b = space.allocate_block_within(&mut default, big).unwrap();
        assert_eq!(b.cidr, cidr("10.244.0.0/24"));
        // The default pool reaches the labelled range: 10.244.128.0/24 holds the /26 above, so
        // the /24 after 10.244.127.0/24 is 10.244.129.0/24.
        let mut default_at_127 = PoolRange::with_cursor(cidr("10.244.0.0/16"), 127 * 4);
        let c = space
            .allocate_block_within(&mut default_at_127, big)
            .unwrap();
        assert_eq!(c.cidr, cidr("10.244.127.0/24"));
        let d = space
            .allocate_block_within(&mut default_at_127, big)
            .unwrap();
        assert_eq!((d.cidr, d.tries), (cidr("10.244.129.0/24"), 1));
        // The labelled pool goes on inside its own range, skipping the /24 the default pool took.
        for want in ["10.244.128.64/26", "10.244.128.128/26", "10.244.128.192/26"] {
            let got = space.allocate_block_within(&mut labelled, small).unwrap();
            assert_eq!(got.cidr, cidr(want));
        }
        let e = space.allocate_block_within(&mut labelled, small).unwrap();
        assert_eq!((e.cidr, e.tries), (cidr("10.244.130.0/26"), 4));
        // 1 + 3 + 1 /26s of the labelled pool, three /24s of the default pool.
        assert_eq!(space.allocated_count(), 5 + 3 * 4);
        // 16 /24s in the /20: 10.244.128.0/24 (four /26s), 10.244.129.0/24 (the default pool's)
        // and 10.244.130.0/24 (one /26) are not free.
        assert_eq!(space.free_blocks_within(&labelled, 24), Ok(16 - 3));
        assert_eq!(space.free_blocks_within(&labelled, 26), Ok(64 - 4 - 4 - 1));
    }

    #[test]
    fn a_range_reports_its_own_exhaustion_and_bad_requests() {
        let mut space = set("10.0.0.0/24", 28);
        let mut range = PoolRange::new(cidr("10.0.0.0/26"));
        for _ in 0..4 {
            space
                .allocate_block_within(&mut range, request(28, Placement::FirstFit))
                .unwrap();
        }
        assert_eq!(
            space.allocate_block_within(&mut range, request(28, Placement::NextFromCursor)),
            Err(AllocError::Exhausted {
                cluster_cidr: cidr("10.0.0.0/26")
            })
        );
        assert_eq!(space.free_count(), 12, "the rest of the set is untouched");
        assert_eq!(
            space.find_block_within(&range, request(25, Placement::FirstFit)),
            Err(AllocError::BlockLargerThanRange {
                prefix_len: 25,
                range: cidr("10.0.0.0/26")
            })
        );
        assert!(matches!(
            space.find_block_within(&range, request(29, Placement::FirstFit)),
            Err(AllocError::InvalidBlockPrefixLen { .. })
        ));
        let elsewhere = PoolRange::new(cidr("10.1.0.0/26"));
        assert!(matches!(
            space.find_block_within(&elsewhere, request(28, Placement::FirstFit)),
            Err(AllocError::OutOfRange { .. })
        ));
        let v6 = PoolRange::new(cidr("fd00::/64"));
        assert!(matches!(
            space.find_block_within(&v6, request(28, Placement::FirstFit)),
            Err(AllocError::FamilyMismatch { .. })
        ));
        // A supernet of the cluster CIDR is the whole set.
        let mut all = PoolRange::new(cidr("10.0.0.0/8"));
        let got = space
            .allocate_block_within(&mut all, request(26, Placement::NextFromCursor))
            .unwrap();
        assert_eq!(got.cidr, cidr("10.0.0.64/26"));
    }

    #[test]
    fn a_stale_candidate_is_refused_and_changes_nothing() {
        let mut space = set("10.0.0.0/24", 28);
        let mut range = PoolRange::new(cidr("10.0.0.0/24"));
        let candidate = space
            .find_block_within(&range, request(27, Placement::NextFromCursor))
            .unwrap();
        space.occupy(cidr("10.0.0.16/28")).unwrap();
        let before = (space.allocated_count(), range);
        assert_eq!(
            space.take_block_within(&mut range, candidate),
            Err(AllocError::StaleCandidate {
                range: cidr("10.0.0.0/24")
            })
        );
        assert_eq!((space.allocated_count(), range), before);
        // A candidate offered for one range is not taken through another.
        let mut other = PoolRange::new(cidr("10.0.0.128/25"));
        let fresh = space
            .find_block_within(&range, request(28, Placement::FirstFit))
            .unwrap();
        assert!(matches!(
            space.take_block_within(&mut other, fresh),
            Err(AllocError::StaleCandidate { .. })
        ));
        assert!(space.take_block_within(&mut range, fresh).is_ok());
    }

    /// Growing an address space: a /20 of /24 blocks moved into a /19 on a /26 grid keeps every
    /// allocated address, and blocks of a finer old grid mark their containing block.
    #[test]
    fn occupy_allocations_of_carries_every_address_over() {
        let mut old = set("10.244.0.0/20", 24);
        for text in [
            "10.244.0.0/24",
            "10.244.1.0/24",
            "10.244.7.0/24",
            "10.244.15.0/24",
        ] {
            old.occupy(cidr(text)).unwrap();
        }
        let mut grown = set("10.244.0.0/19", 26);
        assert_eq!(grown.occupy_allocations_of(&old), Ok(4 * 4));
        for text in [
            "10.244.0.0/24",
            "10.244.1.0/24",
            "10.244.7.0/24",
            "10.244.15.0/24",
        ] {
            assert_eq!(grown.allocated_in(cidr(text)), Ok(4), "{text}");
        }
        assert_eq!(grown.allocated_in(cidr("10.244.16.0/20")), Ok(0));
        // Coarser target: a /26 of a /26 grid marks its whole /24.
        let mut fine = set("10.244.0.0/24", 26);
        fine.occupy(cidr("10.244.0.64/26")).unwrap();
        let mut coarse = set("10.244.0.0/22", 24);
        assert_eq!(coarse.occupy_allocations_of(&fine), Ok(1));
        assert_eq!(coarse.allocated_in(cidr("10.244.0.0/24")), Ok(1));
        // Shrinking: only the overlap is carried; no shared address is an error.
        let mut part = set("10.244.0.0/23", 24);
        assert_eq!(part.occupy_allocations_of(&old), Ok(2));
        let mut apart = set("10.9.0.0/16", 24);
        assert!(matches!(
            apart.occupy_allocations_of(&old),
            Err(AllocError::OutOfRange { .. })
        ));
        assert_eq!(apart.allocated_count(), 0);
    }

    // ----- models ----------------------------------------------------------------------------

    /// A plain `Vec<bool>` allocator (true = allocated), searched position by position.
    struct Model {
        allocated: Vec<bool>,
    }

    impl Model {
        fn find(
            &self,
            low: u32,
            high: u32,
            group: u32,
            cursor: u32,
            placement: Placement,
        ) -> Option<(u32, u32)> {
            let span = high - low + 1;
            let start_offset = match placement {
                Placement::FirstFit => 0,
                Placement::NextFromCursor => {
                    let rounded = (cursor % span).div_ceil(group) * group;
                    if rounded >= span { 0 } else { rounded }
                }
            };
            let positions = span / group;
            (0..positions)
                .map(|k| (start_offset / group + k) % positions)
                .enumerate()
                .find(|&(_, p)| {
                    let first = low + p * group;
                    (first..first + group).all(|i| !self.allocated[i as usize])
                })
                .map(|(tries, p)| (low + p * group, tries as u32))
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Allocate {
            range: usize,
            bits_below_grid: u8,
            first_fit: bool,
        },
        Occupy {
            block: u32,
            bits: u8,
        },
        Release {
            block: u32,
            bits: u8,
        },
    }

    fn ops() -> impl Strategy<Value = Vec<Op>> {
        proptest::collection::vec(
            prop_oneof![
                6 => (0usize..3, 0u8..4, any::<bool>()).prop_map(|(range, bits_below_grid, first_fit)| Op::Allocate { range, bits_below_grid, first_fit }),
                1 => (0u32..256, 0u8..4).prop_map(|(block, bits)| Op::Occupy { block, bits }),
                2 => (0u32..256, 0u8..4).prop_map(|(block, bits)| Op::Release { block, bits }),
            ],
            1..200,
        )
    }

    proptest! {
        /// Three pools over one 10.0.0.0/16 set on a /24 grid (256 blocks): the whole set, a /18
        /// and a /20 inside it. Every allocation within a range is the model's (same block, same
        /// tries), lies inside its range, never overlaps an allocated block, and free counts
        /// agree.
        #[test]
        fn ranges_match_the_model(ops in ops(), cursors in proptest::array::uniform3(0u32..300)) {
            let mut space = set("10.0.0.0/16", 24);
            let mut model = Model { allocated: vec![false; 256] };
            let mut ranges = [
                PoolRange::with_cursor(cidr("10.0.0.0/16"), cursors[0]),
                PoolRange::with_cursor(cidr("10.0.64.0/18"), cursors[1]),
                PoolRange::with_cursor(cidr("10.0.48.0/20"), cursors[2]),
            ];
            let bounds = [(0u32, 255u32), (64, 127), (48, 63)];
            for op in ops {
                match op {
                    Op::Allocate { range, bits_below_grid, first_fit } => {
                        let placement = if first_fit { Placement::FirstFit } else { Placement::NextFromCursor };
                        let prefix_len = 24 - bits_below_grid;
                        let (low, high) = bounds[range];
                        let group = 1u32 << bits_below_grid;
                        let want = model.find(low, high, group, ranges[range].cursor(), placement);
                        let got = space.allocate_block_within(&mut ranges[range], request(prefix_len, placement));
                        match (want, got) {
                            (Some((first, tries)), Ok(got)) => {
                                prop_assert_eq!((got.first_block_index, got.tries, got.block_count), (first, tries, group));
                                for i in first..first + group {
                                    model.allocated[i as usize] = true;
                                }
                                if !first_fit {
                                    let end = first - low + group;
                                    prop_assert_eq!(ranges[range].cursor(), if end > high - low { 0 } else { end });
                                }
                            }
                            (None, Err(AllocError::Exhausted { cluster_cidr })) => {
                                prop_assert_eq!(cluster_cidr, ranges[range].cidr());
                            }
                            (want, got) => prop_assert!(false, "model {:?}, set {:?}", want, got),
                        }
                    }
                    Op::Occupy { block, bits } | Op::Release { block, bits } => {
                        let group = 1u32 << bits;
                        let first = block / group * group;
                        let target = space.block_cidr(first).unwrap();
                        let target = Cidr::from_parts(target.family(), target.network_bits(), 24 - bits);
                        let occupy = matches!(op, Op::Occupy { .. });
                        if occupy { space.occupy(target).unwrap(); } else { space.release(target).unwrap(); }
                        for i in first..first + group {
                            model.allocated[i as usize] = occupy;
                        }
                    }
                }
                let allocated = model.allocated.iter().filter(|&&a| a).count() as u32;
                prop_assert_eq!(space.allocated_count(), allocated);
                for (range, &(low, high)) in ranges.iter().zip(&bounds) {
                    for bits in 0u8..4 {
                        let group = 1u32 << bits;
                        let want = (low..=high).step_by(group as usize)
                            .filter(|&f| (f..f + group).all(|i| !model.allocated[i as usize]))
                            .count() as u32;
                        prop_assert_eq!(space.free_blocks_within(range, 24 - bits), Ok(want));
                    }
                }
            }
        }

        /// A range over the whole cluster CIDR with the set's cursor is `allocate_block` exactly.
        #[test]
        fn the_whole_range_is_allocate_block(ops in ops()) {
            let mut plain = set("10.0.0.0/16", 24);
            let mut ranged = plain.clone();
            let mut whole = PoolRange::new(cidr("10.0.0.0/16"));
            for op in ops {
                match op {
                    Op::Allocate { bits_below_grid, first_fit, .. } => {
                        let placement = if first_fit { Placement::FirstFit } else { Placement::NextFromCursor };
                        let req = request(24 - bits_below_grid, placement);
                        let a = plain.allocate_block(req);
                        let b = ranged.allocate_block_within(&mut whole, req);
                        prop_assert_eq!(a, b);
                        prop_assert_eq!(plain.next_candidate(), whole.cursor());
                    }
                    Op::Occupy { block, .. } => {
                        let c = plain.block_cidr(block).unwrap();
                        plain.occupy(c).unwrap();
                        ranged.occupy(c).unwrap();
                    }
                    Op::Release { block, .. } => {
                        let c = plain.block_cidr(block).unwrap();
                        plain.release(c).unwrap();
                        ranged.release(c).unwrap();
                    }
                }
            }
            prop_assert_eq!(plain.allocated_count(), ranged.allocated_count());
        }

        /// Re-gridding: after `occupy_allocations_of`, a block of the new set is allocated exactly
        /// when it overlaps an allocated block of the old one (both sets inside 10.0.0.0/12).
        #[test]
        fn occupy_allocations_of_matches_overlap(
            old_prefix in 16u8..20, old_grid_extra in 0u8..6, new_prefix in 12u8..20,
            new_grid_extra in 0u8..8, taken in proptest::collection::vec(0u32..64, 0..40),
        ) {
            let old_cluster = format!("10.0.0.0/{old_prefix}");
            let mut old = set(&old_cluster, old_prefix + old_grid_extra);
            for block in taken {
                if block < old.block_count() {
                    let c = old.block_cidr(block).unwrap();
                    old.occupy(c).unwrap();
                }
            }
            let new_cluster = format!("10.0.0.0/{new_prefix}");
            let mut new = set(&new_cluster, new_prefix + new_grid_extra);
            let changed = new.occupy_allocations_of(&old).unwrap();
            prop_assert_eq!(changed, new.allocated_count());
            for block in 0..new.block_count() {
                let c = new.block_cidr(block).unwrap();
                let overlapping = if c.overlaps(&old.cluster_cidr()) { old.allocated_in(c).unwrap() } else { 0 };
                prop_assert_eq!(new.is_allocated(block).unwrap(), overlapping > 0, "block {}", c);
            }
        }
    }
}
