//! Blocks of several grid blocks: per-Node mask sizes on one fixed grid (cloud-provider-azure's
//! `CloudAllocator`, whose Nodes of different node pools get blocks of different sizes from the
//! same cluster CIDR).
//!
//! The set's node mask size is the **grid**: the finest block any Node can get. A request for a
//! coarser prefix length takes `2^(grid − prefix_len)` consecutive grid blocks starting at a
//! multiple of that count — an aligned block, i.e. a real CIDR of that prefix length. The grid
//! never changes while the set lives: cloud-provider-azure re-grids its bitmap at run time
//! (`CidrSet.UpdateSubnetMaskSize`), rebuilding it from the Nodes' podCIDRs only, which drops the
//! service-CIDR reservation and counts a podCIDR twice when two Nodes' entries overlap.
//!
//! Two placements (see [`Placement`]): round-robin from the next-candidate cursor over aligned
//! positions of the block's own size — for one grid block exactly [`CidrSet::allocate_next`] —
//! and first fit from block 0 (the reference's `AllocateNextWithNodeMaskSize`). Both search
//! through the summary levels, never bit by bit.

use super::{CidrSet, aligned_runs};
use crate::cidr::Cidr;
use crate::error::AllocError;

/// Where [`CidrSet::allocate_block`] looks for a free aligned block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub enum Placement {
    /// Round-robin: the first entirely free aligned position at or after the next-candidate
    /// cursor rounded up to the block's alignment (`⌈cursor / g⌉ · g` for a block of `g` grid
    /// blocks), wrapping to block 0; the cursor then moves to the block's end (`first + g`, mod
    /// the block count). For a one-grid-block request this is [`CidrSet::allocate_next`] exactly
    /// (kube-controller-manager's `CidrSet.AllocateNext`).
    NextFromCursor,
    /// First fit: the lowest entirely free aligned position from block 0; the cursor does not
    /// move (cloud-provider-azure's `CidrSet.AllocateNextWithNodeMaskSize`).
    FirstFit,
}

/// One block request: a prefix length (bits) between the cluster prefix and the grid, and where
/// to place it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BlockRequest {
    /// Prefix length of the block, in bits (cluster prefix ..= the set's node mask size).
    pub prefix_len: u8,
    /// Where to look.
    pub placement: Placement,
}

/// The result of a successful [`CidrSet::allocate_block`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct BlockAllocation {
    /// The allocated block as a CIDR of the requested prefix length.
    pub cidr: Cidr,
    /// Index of its first grid block.
    pub first_block_index: u32,
    /// Grid blocks it covers: 2^(node mask size − prefix length).
    pub block_count: u32,
    /// Aligned candidate positions skipped before the one taken, counted from where the search
    /// started (the rounded-up cursor, wrapping, or block 0). For a one-grid-block request from
    /// the cursor these are the allocated blocks skipped: [`super::Allocation::tries`], upstream's
    /// `cidrset_allocation_tries_per_request` observation.
    pub tries: u32,
}

/// A free aligned block (see [`CidrSet::largest_free_block`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct FreeBlock {
    /// The block as a CIDR.
    pub cidr: Cidr,
    /// Index of its first grid block.
    pub first_block_index: u32,
    /// Grid blocks it covers (a power of two).
    pub block_count: u32,
}

/// Where a request would be placed: checked first, taken after every set of a pool agreed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Candidate {
    prefix_len: u8,
    placement: Placement,
    first: u32,
    group: u32,
    tries: u32,
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> CidrSet<S> {
    /// Allocates an aligned block of `request.prefix_len` bits — `2^(node mask size − prefix_len)`
    /// consecutive grid blocks — placed as `request.placement` says. With
    /// `prefix_len == node_mask_size` and [`Placement::NextFromCursor`] this returns exactly what
    /// [`CidrSet::allocate_next`] would (same block, tries and cursor move).
    ///
    /// Cost: a few `trailing_zeros` per summary level to reach each candidate word, at most one
    /// read per bitmap word (n/64) in the worst, fragmented case.
    ///
    /// # Errors
    /// - [`AllocError::InvalidBlockPrefixLen`] if `prefix_len` is below the cluster prefix length
    ///   or above the node mask size;
    /// - [`AllocError::Exhausted`] if no aligned block of that size is entirely free (smaller
    ///   blocks may still be); nothing changes, the cursor does not move.
    pub fn allocate_block(&mut self, request: BlockRequest) -> Result<BlockAllocation, AllocError> {
        let candidate = self.find_block(request)?;
        Ok(self.take_block(candidate))
    }

    /// The largest entirely free aligned block (the lowest one of that size), or `None` when every
    /// grid block is allocated. A block of that size can be allocated now; no larger one can.
    /// For an alert before a large-pool Node cannot be served.
    ///
    /// Cost: one aligned search per candidate size larger than 64 grid blocks, from the largest
    /// the free count allows, each as [`CidrSet::allocate_block`]; then one pass over the bitmap
    /// words holding a free block. Measured (release build, 2 shared cores): 21 ns for a /16 on a
    /// /26 grid; a few ms for 2^24 grid blocks with every other one allocated.
    pub fn largest_free_block(&self) -> Option<FreeBlock> {
        let free = self.free_count();
        if free == 0 {
            return None;
        }
        let block_bits = self.node_mask_size - self.cluster_cidr.prefix_len();
        // The largest power of two ≤ free: no larger aligned block can be entirely free.
        let mut bits = (31 - free.leading_zeros()) as u8;
        if bits > block_bits {
            bits = block_bits;
        }
        // Blocks larger than a bitmap word: one aligned search per size, largest first.
        while bits > 6 {
            let group = 1u32 << bits;
            if let Some(first) = self.find_free_aligned(group) {
                return Some(self.free_block(first, group));
            }
            bits -= 1;
        }
        // Blocks within a word: one pass over the words that have a free block, keeping the
        // largest aligned run (the lowest of that size), stopping early at the bound.
        let bound = 1u32 << bits;
        let mut best: Option<(u32, u32)> = None;
        let mut from = 0u32;
        while let Some(free) = self.find_free_from(from) {
            let word_index = free / 64;
            let word = self.word(0, word_index);
            let mut group = bound;
            while group > best.map_or(0, |(_, g)| g) {
                let runs = aligned_runs(word, group);
                if runs != 0 {
                    best = Some((word_index * 64 + runs.trailing_zeros(), group));
                    break;
                }
                group /= 2;
            }
            if best.is_some_and(|(_, g)| g == bound) {
                break;
            }
            from = (word_index + 1) * 64;
            if from >= self.block_count {
                break;
            }
        }
        best.map(|(first, group)| self.free_block(first, group))
    }

    fn free_block(&self, first: u32, group: u32) -> FreeBlock {
        FreeBlock {
            cidr: self.aligned_cidr(first, self.node_mask_size - group.trailing_zeros() as u8),
            first_block_index: first,
            block_count: group,
        }
    }

    /// Where `request` would go, without changing anything.
    pub(crate) fn find_block(&self, request: BlockRequest) -> Result<Candidate, AllocError> {
        let BlockRequest {
            prefix_len,
            placement,
        } = request;
        if prefix_len < self.cluster_cidr.prefix_len() || prefix_len > self.node_mask_size {
            return Err(AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr: self.cluster_cidr,
                node_mask_size: self.node_mask_size,
            });
        }
        let exhausted = AllocError::Exhausted {
            cluster_cidr: self.cluster_cidr,
        };
        let group = 1u32 << (self.node_mask_size - prefix_len);
        if self.free_count() < group {
            return Err(exhausted);
        }
        let start = match placement {
            Placement::FirstFit => 0,
            Placement::NextFromCursor => {
                // ⌈cursor / group⌉ · group, or 0 past the end (block_count is a multiple of
                // group). No overflow: cursor < block_count ≤ 2^24.
                let rounded = self.next_candidate.div_ceil(group) * group;
                if rounded >= self.block_count {
                    0
                } else {
                    rounded
                }
            }
        };
        let first = match self.find_free_aligned_from(start, group) {
            Some(first) => first,
            // Wrap: anything found from 0 lies below `start` (nothing free was found at or after it).
            None if start > 0 => self.find_free_aligned_from(0, group).ok_or(exhausted)?,
            None => return Err(exhausted),
        };
        let skipped_blocks = if first >= start {
            first - start
        } else {
            self.block_count - start + first
        };
        Ok(Candidate {
            prefix_len,
            placement,
            first,
            group,
            tries: skipped_blocks / group,
        })
    }

    /// Takes a block found by [`CidrSet::find_block`] on this set, unchanged since.
    pub(crate) fn take_block(&mut self, candidate: Candidate) -> BlockAllocation {
        let Candidate {
            prefix_len,
            placement,
            first,
            group,
            tries,
        } = candidate;
        self.take_range(first, group);
        if placement == Placement::NextFromCursor {
            let end = first + group;
            self.next_candidate = if end >= self.block_count { 0 } else { end };
        }
        BlockAllocation {
            cidr: self.aligned_cidr(first, prefix_len),
            first_block_index: first,
            block_count: group,
            tries,
        }
    }

    /// Marks grid blocks `first .. first + group` allocated and counts the ones that were free
    /// (one grid block: `allocate_next`'s single-bit update, the summaries touched only when its
    /// word empties).
    pub(super) fn take_range(&mut self, first: u32, group: u32) {
        if group == 1 {
            self.mark_used(first);
            self.allocated_count += 1;
        } else {
            let changed = self.set_range(first, first + (group - 1), false);
            self.allocated_count += changed;
        }
    }

    /// The CIDR of `prefix_len` bits starting at grid block `first`.
    pub(super) fn aligned_cidr(&self, first: u32, prefix_len: u8) -> Cidr {
        Cidr::from_parts(
            self.cluster_cidr.family(),
            self.block_network(first),
            prefix_len,
        )
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::cidr_set::tests::{cidr, set};

    fn first_fit(prefix_len: u8) -> BlockRequest {
        BlockRequest {
            prefix_len,
            placement: Placement::FirstFit,
        }
    }

    fn from_cursor(prefix_len: u8) -> BlockRequest {
        BlockRequest {
            prefix_len,
            placement: Placement::NextFromCursor,
        }
    }

    /// The vector (cloud-provider-azure's first-fit order): 10.244.0.0/16 on a /26 grid.
    #[test]
    fn reference_first_fit_vector() {
        let mut s = set("10.244.0.0/16", 26);
        let steps = [
            (24, "10.244.0.0/24", 0),
            (26, "10.244.1.0/26", 4),
            (24, "10.244.2.0/24", 2),
        ];
        for (prefix_len, want, tries) in steps {
            let got = s.allocate_block(first_fit(prefix_len)).unwrap();
            assert_eq!((got.cidr, got.tries), (cidr(want), tries), "/{prefix_len}");
        }
        assert_eq!(s.allocated_count(), 4 + 1 + 4);
        assert_eq!(s.next_candidate(), 0, "first fit leaves the cursor alone");
    }

    /// The same sequence round-robin from the cursor gives the same blocks here: the /24 at 0
    /// moves the cursor to 4, the /26 takes 4, the next /24 starts at ⌈5/4⌉·4 = 8.
    #[test]
    fn from_cursor_rounds_up_to_the_alignment() {
        let mut s = set("10.244.0.0/16", 26);
        let a = s.allocate_block(from_cursor(24)).unwrap();
        assert_eq!((a.cidr, s.next_candidate()), (cidr("10.244.0.0/24"), 4));
        let b = s.allocate_block(from_cursor(26)).unwrap();
        assert_eq!((b.cidr, s.next_candidate()), (cidr("10.244.1.0/26"), 5));
        let c = s.allocate_block(from_cursor(24)).unwrap();
        assert_eq!((c.cidr, c.tries), (cidr("10.244.2.0/24"), 0));
        assert_eq!(s.next_candidate(), 12);
        // Blocks 5–7 are left behind until the cursor wraps; a /26 from the cursor takes 12.
        assert_eq!(
            s.allocate_block(from_cursor(26)).unwrap().cidr,
            cidr("10.244.3.0/26")
        );
    }

    /// cloud-provider-azure `TestCIDRSetPartlyAllocatedWithNodeMastSize`: the whole set occupied,
    /// then the listed grid blocks freed, then one first-fit request.
    #[test]
    fn reference_partly_allocated_vectors() {
        type Case = (&'static str, u8, u8, &'static [u32], Option<&'static str>);
        let cases: &[Case] = &[
            ("127.123.234.0/30", 32, 31, &[0, 3], None),
            ("beef:1234::/30", 32, 31, &[0, 3], None),
            ("127.123.234.0/30", 32, 31, &[1, 2], None),
            ("127.123.234.0/30", 32, 31, &[2], None),
            (
                "127.123.234.0/30",
                32,
                31,
                &[2, 3],
                Some("127.123.234.2/31"),
            ),
            ("beef:1234::/30", 32, 31, &[2, 3], Some("beef:1236::/31")),
            (
                "127.123.234.0/30",
                32,
                31,
                &[0, 1, 2],
                Some("127.123.234.0/31"),
            ),
            ("beef:1234::/30", 32, 31, &[0, 1, 2], Some("beef:1234::/31")),
            (
                "10.244.0.0/16",
                20,
                17,
                &[8, 9, 10, 11, 12, 13, 14, 15],
                Some("10.244.128.0/17"),
            ),
            (
                "beef::/16",
                20,
                17,
                &[8, 9, 10, 11, 12, 13, 14, 15],
                Some("beef:8000::/17"),
            ),
            ("10.244.0.0/16", 20, 17, &[8, 9, 10, 11, 12, 13, 14], None),
            (
                "10.244.0.0/16",
                20,
                19,
                &[1, 3, 5, 7, 9, 11, 12, 13, 14],
                Some("10.244.192.0/19"),
            ),
            (
                "beef::/16",
                20,
                19,
                &[1, 3, 5, 7, 9, 11, 12, 13, 14],
                Some("beef:c000::/19"),
            ),
            ("10.244.0.0/16", 20, 19, &[1, 3, 5, 7, 9, 11, 13, 14], None),
        ];
        for (cluster, grid, prefix_len, free, want) in cases {
            let mut s = set(cluster, *grid);
            s.occupy(cidr(cluster)).unwrap();
            for &index in *free {
                s.release_blocks(index, index).unwrap();
            }
            let before = (s.allocated_count(), s.next_candidate());
            let got = s.allocate_block(first_fit(*prefix_len));
            match want {
                Some(want) => assert_eq!(got.unwrap().cidr, cidr(want), "{cluster} {free:?}"),
                None => {
                    assert_eq!(
                        got,
                        Err(AllocError::Exhausted {
                            cluster_cidr: cidr(cluster)
                        }),
                        "{cluster} {free:?}"
                    );
                    assert_eq!((s.allocated_count(), s.next_candidate()), before);
                }
            }
        }
    }

    /// cloud-provider-azure `TestCIDRSetFullyAllocatedWithNodeMaskSize`: one block covering the
    /// whole set, then round-robin after its release.
    #[test]
    fn whole_set_block_then_round_robin() {
        for cluster in ["127.123.234.0/30", "beef:1234::/30"] {
            let mut s = set(cluster, 30);
            let whole = s.allocate_block(first_fit(30)).unwrap();
            assert_eq!(whole.cidr, cidr(cluster));
            assert!(s.allocate_next().is_err());
            s.release(whole.cidr).unwrap();
            assert_eq!(s.allocate_next().unwrap().cidr, cidr(cluster));
        }
    }

    #[test]
    fn wrap_counts_tries_in_aligned_positions() {
        let mut s = set("10.0.0.0/24", 28); // 16 blocks, /26 = 4 blocks
        s.occupy(cidr("10.0.0.0/28")).unwrap(); // block 0
        // Cursor 0: position 0 is used, so 4 (one try).
        let a = s.allocate_block(from_cursor(26)).unwrap();
        assert_eq!((a.first_block_index, a.tries), (4, 1));
        s.occupy(cidr("10.0.0.128/25")).unwrap(); // blocks 8–15
        // Cursor 8: positions 8 and 12 are used, wrap to 0 (used), 4 (used) → exhausted.
        assert!(matches!(
            s.allocate_block(from_cursor(26)),
            Err(AllocError::Exhausted { .. })
        ));
        s.release(cidr("10.0.0.0/28")).unwrap();
        // Cursor 8: 8 and 12 used, wrap, 0 free: 2 tries.
        let b = s.allocate_block(from_cursor(26)).unwrap();
        assert_eq!((b.first_block_index, b.tries), (0, 2));
        assert_eq!(s.next_candidate(), 4);
        // A cursor rounded up past the end starts again at block 0.
        let mut t = set("10.0.0.0/24", 28);
        for _ in 0..13 {
            t.allocate_next().unwrap(); // blocks 0–12, cursor 13
        }
        assert!(matches!(
            t.allocate_block(from_cursor(26)),
            Err(AllocError::Exhausted { .. })
        ));
        t.release_blocks(0, 3).unwrap();
        let c = t.allocate_block(from_cursor(26)).unwrap();
        assert_eq!(
            (c.first_block_index, c.tries, t.next_candidate()),
            (0, 0, 4)
        );
        // A cursor inside a free aligned position rounds up past it: cursor 1 → start 4.
        let mut u = set("10.0.0.0/24", 28);
        u.allocate_next().unwrap();
        u.release_blocks(0, 0).unwrap();
        let d = u.allocate_block(from_cursor(26)).unwrap();
        assert_eq!(
            (d.first_block_index, d.tries, u.next_candidate()),
            (4, 0, 8)
        );
    }

    #[test]
    fn one_grid_block_from_cursor_is_allocate_next() {
        let mut a = set("10.0.0.0/26", 30); // 16 blocks
        let mut b = a.clone();
        a.occupy(cidr("10.0.0.4/30")).unwrap();
        b.occupy(cidr("10.0.0.4/30")).unwrap();
        for _ in 0..16 {
            let next = a.allocate_next();
            let block = b.allocate_block(from_cursor(30));
            match (next, block) {
                (Ok(n), Ok(k)) => {
                    assert_eq!(
                        (n.cidr, n.block_index, n.tries),
                        (k.cidr, k.first_block_index, k.tries)
                    );
                    assert_eq!(k.block_count, 1);
                }
                (Err(e), Err(f)) => assert_eq!(e, f),
                (n, k) => panic!("{n:?} vs {k:?}"),
            }
            assert_eq!(a.next_candidate(), b.next_candidate());
        }
    }

    #[test]
    fn bad_prefix_lengths_change_nothing() {
        let mut s = set("10.0.0.0/16", 26);
        for prefix_len in [15, 27, 0, 255] {
            for placement in [Placement::FirstFit, Placement::NextFromCursor] {
                assert_eq!(
                    s.allocate_block(BlockRequest {
                        prefix_len,
                        placement
                    }),
                    Err(AllocError::InvalidBlockPrefixLen {
                        prefix_len,
                        cluster_cidr: cidr("10.0.0.0/16"),
                        node_mask_size: 26
                    })
                );
            }
        }
        assert_eq!((s.allocated_count(), s.next_candidate()), (0, 0));
    }

    #[test]
    fn largest_free_block_tracks_fragmentation() {
        let mut s = set("10.244.0.0/16", 26); // 1024 blocks
        let whole = s.largest_free_block().unwrap();
        assert_eq!(
            (whole.cidr, whole.block_count),
            (cidr("10.244.0.0/16"), 1024)
        );
        s.occupy(cidr("10.244.0.0/26")).unwrap();
        assert_eq!(
            s.largest_free_block().unwrap().cidr,
            cidr("10.244.128.0/17")
        );
        // One used /26 in every /23: the largest free block is a /24.
        for i in 0..128u32 {
            s.occupy(s.block_cidr(i * 8).unwrap()).unwrap();
        }
        let largest = s.largest_free_block().unwrap();
        assert_eq!(
            (largest.cidr, largest.block_count),
            (cidr("10.244.1.0/24"), 4)
        );
        assert!(matches!(
            s.allocate_block(first_fit(23)),
            Err(AllocError::Exhausted { .. })
        ));
        assert_eq!(s.allocate_block(first_fit(24)).unwrap().cidr, largest.cidr);
        s.occupy(cidr("10.244.0.0/16")).unwrap();
        assert_eq!(s.largest_free_block(), None);
        // A one-block set, and a 2^24-block one.
        let mut one = set("10.0.0.0/16", 16);
        assert_eq!(one.largest_free_block().unwrap().block_count, 1);
        one.allocate_next().unwrap();
        assert_eq!(one.largest_free_block(), None);
        let mut huge = set("10.0.0.0/8", 32);
        huge.occupy(cidr("10.0.0.0/9")).unwrap();
        huge.allocate_next().unwrap(); // 10.128.0.0/32
        assert_eq!(
            huge.largest_free_block().unwrap().cidr,
            cidr("10.192.0.0/10")
        );
    }
}
