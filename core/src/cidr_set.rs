//! `CidrSet`: one cluster CIDR cut into equal node blocks, tracked in a hierarchical bitmap.
//!
//! Layout of the caller-supplied storage (`[u64]` words), level 0 first:
//! - level 0: one bit per block, **1 = free**, block `i` at word `i / 64`, bit `i % 64`; bits past
//!   the block count are 0 (never free);
//! - level k+1: one bit per word of level k, 1 = that word has a free bit;
//! - levels are added until one has a single word (at most 4 levels for 2^24 blocks).
//!
//! Finding the next free block at or after a cursor is then a few `trailing_zeros` per level:
//! O(log₆₄ n). Occupying or releasing a range touches each affected word once.

use crate::cidr::Cidr;
use crate::error::AllocError;

mod blocks;
mod within;

pub use blocks::{BlockAllocation, BlockRequest, FreeBlock, Placement};
pub use within::{PoolRange, RangeCandidate};

/// The largest number of blocks a set may hold: 2^24 (a /8 cut into /32s, or a /40 into /64s).
pub const MAX_BLOCK_BITS: u8 = 24;

/// The most summary levels a set uses (2^24 blocks → 4 levels of 2^18, 2^12, 2^6 and 1 words).
const MAX_LEVELS: usize = 4;

/// Words needed at each level for `block_count` blocks, and the number of levels.
const fn level_words(block_count: u32) -> ([u32; MAX_LEVELS], usize) {
    let mut words = [0u32; MAX_LEVELS];
    let mut count = if block_count == 0 { 1 } else { block_count };
    let mut level = 0;
    loop {
        let w = count.div_ceil(64);
        words[level] = w;
        level += 1;
        if w <= 1 || level == MAX_LEVELS {
            return (words, level);
        }
        count = w;
    }
}

/// The number of `u64` words of storage a [`CidrSet`] of `block_count` blocks needs (bitmap plus
/// summary levels). `block_count` above 2^24 is clamped to 2^24.
///
/// For 65,536 blocks this is 1,041 words (8,328 bytes); for 256 blocks, 5 words.
pub const fn storage_words(block_count: u32) -> usize {
    let clamped = if block_count > 1 << MAX_BLOCK_BITS {
        1 << MAX_BLOCK_BITS
    } else {
        block_count
    };
    let (words, levels) = level_words(clamped);
    let mut total = 0usize;
    let mut i = 0;
    while i < levels {
        total += words[i] as usize;
        i += 1;
    }
    total
}

/// The number of `u64` words a [`CidrSet`] needs for a cluster prefix of `cluster_prefix_len` bits
/// cut into blocks of `node_mask_size` bits: `storage_words(2^(node_mask_size − cluster_prefix_len))`.
/// Usable in array lengths: `[u64; storage_words_for(16, 24)]`. Returns the 2^24-block size when the
/// difference exceeds 24, and 1 when `node_mask_size < cluster_prefix_len` (such a set is rejected
/// by [`CidrSet::new`] anyway).
pub const fn storage_words_for(cluster_prefix_len: u8, node_mask_size: u8) -> usize {
    if node_mask_size < cluster_prefix_len {
        return 1;
    }
    let bits = node_mask_size - cluster_prefix_len;
    if bits > MAX_BLOCK_BITS {
        return storage_words(1 << MAX_BLOCK_BITS);
    }
    storage_words(1 << bits)
}

/// The result of a successful [`CidrSet::allocate_next`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct Allocation {
    /// The allocated block as a CIDR of the node mask size.
    pub cidr: Cidr,
    /// Its index in the set (0-based, address order).
    pub block_index: u32,
    /// Allocated blocks skipped from the next-candidate cursor before a free one was found
    /// (upstream's `cidrset_allocation_tries_per_request` observation).
    pub tries: u32,
}

/// The result of a successful [`CidrSet::allocate_aligned`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct AlignedAllocation {
    /// The allocated range as a CIDR of the requested prefix length.
    pub cidr: Cidr,
    /// Index of its first block.
    pub first_block_index: u32,
    /// Number of blocks it covers: 2^(node mask size − prefix length).
    pub block_count: u32,
}

/// One cluster CIDR cut into `2^(node_mask_size − cluster prefix)` equal blocks, each free or
/// allocated. Matches kube-controller-manager's `cidrset` semantics (allocation order, occupy and
/// release ranges, counts), with O(log₆₄ n) search instead of a bit-by-bit scan.
///
/// `S` is the bitmap storage: anything that is `AsRef<[u64]> + AsMut<[u64]>` with at least
/// [`storage_words`]`(block_count)` words — a `[u64; N]` array on an edge agent, a `Vec<u64>` or
/// `Box<[u64]>` in a std program, or a `&mut [u64]` borrowed from a static.
///
/// Every method is total: no panics, no overflow, and a method that returns `Err` has changed
/// nothing (the set is checked first and mutated last).
#[derive(Debug, Clone)]
pub struct CidrSet<S> {
    cluster_cidr: Cidr,
    node_mask_size: u8,
    /// Host bits of a block: family width − node mask size (0 ..= 128); block `i` starts at
    /// the cluster network + `i << block_shift`.
    block_shift: u8,
    block_count: u32,
    allocated_count: u32,
    next_candidate: u32,
    /// Start word of each level in `storage`; `level_start[levels]` is the end.
    level_start: [u32; MAX_LEVELS + 1],
    levels: u8,
    storage: S,
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> CidrSet<S> {
    /// Makes a set with every block free and the next-candidate cursor at block 0.
    ///
    /// `node_mask_size` is the prefix length of each node block, in bits. The storage's first
    /// [`storage_words`] words are overwritten; extra words are left alone.
    ///
    /// # Errors
    /// - [`AllocError::InvalidNodeMaskSize`] if `node_mask_size` is below the cluster prefix length
    ///   or above 32 (IPv4) / 128 (IPv6);
    /// - [`AllocError::TooManyBlocks`] if the set would have more than 2^24 blocks (upstream allows
    ///   2^16 for IPv6; we allow 2^24 for both families);
    /// - [`AllocError::StorageTooSmall`] if `storage` has fewer words than needed.
    pub fn new(cluster_cidr: Cidr, node_mask_size: u8, mut storage: S) -> Result<Self, AllocError> {
        let cluster_prefix_len = cluster_cidr.prefix_len();
        if node_mask_size < cluster_prefix_len
            || node_mask_size > cluster_cidr.family().max_prefix_len()
        {
            return Err(AllocError::InvalidNodeMaskSize {
                cluster_cidr,
                node_mask_size,
            });
        }
        let block_bits = node_mask_size - cluster_prefix_len;
        if block_bits > MAX_BLOCK_BITS {
            return Err(AllocError::TooManyBlocks {
                cluster_cidr,
                node_mask_size,
            });
        }
        let block_count = 1u32 << block_bits;
        let needed_words = storage_words(block_count);
        let provided_words = storage.as_ref().len();
        if provided_words < needed_words {
            return Err(AllocError::StorageTooSmall {
                needed_words,
                provided_words,
            });
        }
        let (words, levels) = level_words(block_count);
        let mut level_start = [0u32; MAX_LEVELS + 1];
        for level in 0..levels {
            level_start[level + 1] = level_start[level] + words[level];
        }
        for level in levels..MAX_LEVELS {
            level_start[level + 1] = level_start[level];
        }
        // Mark `count` bits free at each level: the blocks, then one bit per word below.
        let bitmap = storage.as_mut();
        let mut count = block_count;
        for level in 0..levels {
            let start = level_start[level] as usize;
            let end = level_start[level + 1] as usize;
            if let Some(level_words) = bitmap.get_mut(start..end) {
                fill_low_bits(level_words, count);
            }
            count = count.div_ceil(64);
        }
        Ok(CidrSet {
            cluster_cidr,
            node_mask_size,
            block_shift: cluster_cidr.family().max_prefix_len() - node_mask_size,
            block_count,
            allocated_count: 0,
            next_candidate: 0,
            level_start,
            levels: levels as u8,
            storage,
        })
    }

    /// The cluster CIDR this set cuts up.
    pub fn cluster_cidr(&self) -> Cidr {
        self.cluster_cidr
    }

    /// The prefix length of each block, in bits (`--node-cidr-mask-size`).
    pub fn node_mask_size(&self) -> u8 {
        self.node_mask_size
    }

    /// The number of blocks: 2^(node mask size − cluster prefix length), 1 ..= 2^24.
    pub fn block_count(&self) -> u32 {
        self.block_count
    }

    /// The number of allocated (or occupied) blocks.
    pub fn allocated_count(&self) -> u32 {
        self.allocated_count
    }

    /// The number of free blocks: `block_count − allocated_count`.
    pub fn free_count(&self) -> u32 {
        self.block_count - self.allocated_count
    }

    /// The block index where the next round-robin search starts.
    pub fn next_candidate(&self) -> u32 {
        self.next_candidate
    }

    /// Gives the storage back.
    pub fn into_storage(self) -> S {
        self.storage
    }

    /// Allocates the first free block at or after the next-candidate cursor, wrapping around, and
    /// moves the cursor to the block after it. This is kube-controller-manager's round-robin order
    /// exactly (`CidrSet.AllocateNext`), so the same history hands out the same CIDRs.
    ///
    /// # Errors
    /// [`AllocError::Exhausted`] if no block is free; the cursor does not move.
    pub fn allocate_next(&mut self) -> Result<Allocation, AllocError> {
        if self.allocated_count >= self.block_count {
            return Err(AllocError::Exhausted {
                cluster_cidr: self.cluster_cidr,
            });
        }
        let cursor = self.next_candidate;
        // Fast path: a free block in the cursor's own bitmap word (the first step of
        // `find_free_from`, without the call and the level loop).
        let in_cursor_word = self.word(0, cursor / 64) & (u64::MAX << (cursor % 64));
        let found = if in_cursor_word != 0 {
            (cursor & !63) | in_cursor_word.trailing_zeros()
        } else {
            match self.find_free_wrapping(cursor) {
                Some(index) => index,
                // Unreachable while the counts match the bitmap; report exhaustion, change nothing.
                None => {
                    return Err(AllocError::Exhausted {
                        cluster_cidr: self.cluster_cidr,
                    });
                }
            }
        };
        let tries = if found >= cursor {
            found - cursor
        } else {
            self.block_count - cursor + found
        };
        self.mark_used(found);
        self.allocated_count += 1;
        self.next_candidate = if found + 1 >= self.block_count {
            0
        } else {
            found + 1
        };
        Ok(Allocation {
            cidr: self.block_cidr_unchecked(found),
            block_index: found,
            tries,
        })
    }

    /// Allocates an aligned range of `2^(node_mask_size − prefix_len)` consecutive blocks — a CIDR
    /// of `prefix_len` bits — at the lowest free aligned position (first fit from block 0). Used
    /// for per-node-pool mask sizes (cloud-provider-azure). Does not move the round-robin cursor.
    ///
    /// Cost: skips full words through the summary levels; at most one read per bitmap word
    /// (n/64) in the worst, fragmented case.
    ///
    /// # Errors
    /// - [`AllocError::InvalidBlockPrefixLen`] if `prefix_len` is below the cluster prefix length or
    ///   above the node mask size;
    /// - [`AllocError::Exhausted`] if no aligned range of that size is entirely free.
    pub fn allocate_aligned(&mut self, prefix_len: u8) -> Result<AlignedAllocation, AllocError> {
        if prefix_len < self.cluster_cidr.prefix_len() || prefix_len > self.node_mask_size {
            return Err(AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr: self.cluster_cidr,
                node_mask_size: self.node_mask_size,
            });
        }
        let group = 1u32 << (self.node_mask_size - prefix_len);
        let first = self.find_free_aligned(group).ok_or(AllocError::Exhausted {
            cluster_cidr: self.cluster_cidr,
        })?;
        let changed = self.set_range(first, first + (group - 1), false);
        self.allocated_count += changed;
        let cidr = Cidr::from_parts(
            self.cluster_cidr.family(),
            self.block_network(first),
            prefix_len,
        );
        Ok(AlignedAllocation {
            cidr,
            first_block_index: first,
            block_count: group,
        })
    }

    /// Marks every block that `cidr` overlaps as allocated and returns how many were free before
    /// (already-allocated blocks are not counted again: occupy is idempotent). A CIDR larger than a
    /// block covers several blocks; a smaller one marks its containing block. Matches
    /// kube-controller-manager's `CidrSet.Occupy` (with its 2020 fix against double counting).
    ///
    /// # Errors
    /// [`AllocError::FamilyMismatch`] or [`AllocError::OutOfRange`] if `cidr` shares no address
    /// with the cluster CIDR; nothing changes.
    pub fn occupy(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        let (begin, end) = self.block_range(cidr)?;
        let changed = self.set_range(begin, end, false);
        self.allocated_count += changed;
        Ok(changed)
    }

    /// Marks every block that `cidr` overlaps as free and returns how many were allocated before
    /// (release is idempotent). Ranges as for [`CidrSet::occupy`]. The cursor does not move.
    ///
    /// # Errors
    /// [`AllocError::FamilyMismatch`] or [`AllocError::OutOfRange`]; nothing changes.
    pub fn release(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        let (begin, end) = self.block_range(cidr)?;
        let changed = self.set_range(begin, end, true);
        self.allocated_count -= changed.min(self.allocated_count);
        Ok(changed)
    }

    /// Marks blocks `first..=last` (block indices) free and returns how many were allocated
    /// before — for callers that track which blocks other holders still cover and release only
    /// the rest. The cursor does not move.
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] if `first > last` or `last ≥ block_count` (reported
    /// for `last`, or for `first` when it exceeds `last`); nothing changes.
    pub fn release_blocks(&mut self, first: u32, last: u32) -> Result<u32, AllocError> {
        if last >= self.block_count || first > last {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index: if first > last { first } else { last },
                block_count: self.block_count,
            });
        }
        let changed = self.set_range(first, last, true);
        self.allocated_count -= changed.min(self.allocated_count);
        Ok(changed)
    }

    /// Whether block `block_index` is allocated.
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] if `block_index ≥ block_count`.
    pub fn is_allocated(&self, block_index: u32) -> Result<bool, AllocError> {
        if block_index >= self.block_count {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index,
                block_count: self.block_count,
            });
        }
        Ok(!self.is_free(block_index))
    }

    /// How many blocks overlapped by `cidr` are allocated (0 ..= the range's block count).
    ///
    /// # Errors
    /// [`AllocError::FamilyMismatch`] or [`AllocError::OutOfRange`].
    pub fn allocated_in(&self, cidr: Cidr) -> Result<u32, AllocError> {
        let (begin, end) = self.block_range(cidr)?;
        let span = end - begin + 1;
        Ok(span - self.count_free(begin, end))
    }

    /// The block `block_index` as a CIDR of the node mask size (block 0 starts at the cluster
    /// CIDR's network address).
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] if `block_index ≥ block_count`.
    pub fn block_cidr(&self, block_index: u32) -> Result<Cidr, AllocError> {
        if block_index >= self.block_count {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index,
                block_count: self.block_count,
            });
        }
        Ok(self.block_cidr_unchecked(block_index))
    }

    /// The inclusive range of block indices `(first, last)` that `cidr` overlaps: every block when
    /// `cidr` is as large as the cluster CIDR or larger; otherwise the blocks holding its first and
    /// last address (one block when `cidr` is a block or smaller). This is kube-controller-manager's
    /// `getBeginningAndEndIndices`.
    ///
    /// # Errors
    /// [`AllocError::FamilyMismatch`] if the families differ, [`AllocError::OutOfRange`] if the two
    /// ranges do not overlap.
    pub fn block_range(&self, cidr: Cidr) -> Result<(u32, u32), AllocError> {
        if cidr.family() != self.cluster_cidr.family() {
            return Err(AllocError::FamilyMismatch {
                cidr,
                cluster_cidr: self.cluster_cidr,
            });
        }
        if !cidr.overlaps(&self.cluster_cidr) {
            return Err(AllocError::OutOfRange {
                cidr,
                cluster_cidr: self.cluster_cidr,
            });
        }
        if cidr.prefix_len() <= self.cluster_cidr.prefix_len() {
            return Ok((0, self.block_count - 1));
        }
        // cidr lies inside the cluster CIDR: its network maps to its first block by shifting off
        // the block's host part (first < block_count ≤ 2^24). A CIDR no larger than a block lies
        // in that one block; a larger one covers 2^(node mask − its prefix) aligned blocks
        // (fewer than 2^24: its prefix is longer than the cluster's). The same as mapping its
        // last address, with one `u128` shift instead of two.
        let base = self.cluster_cidr.network_bits();
        let offset = cidr.network_bits() - base;
        let first = offset.checked_shr(u32::from(self.block_shift)).unwrap_or(0) as u32;
        if cidr.prefix_len() >= self.node_mask_size {
            return Ok((first, first));
        }
        let span = 1u32 << (self.node_mask_size - cidr.prefix_len());
        Ok((first, first + (span - 1)))
    }

    // ----- internals -------------------------------------------------------------------------

    fn block_network(&self, block_index: u32) -> u128 {
        let shift = u32::from(self.block_shift);
        self.cluster_cidr.network_bits() | u128::from(block_index).checked_shl(shift).unwrap_or(0)
    }

    fn block_cidr_unchecked(&self, block_index: u32) -> Cidr {
        Cidr::from_parts(
            self.cluster_cidr.family(),
            self.block_network(block_index),
            self.node_mask_size,
        )
    }

    // Levels are always < MAX_LEVELS here; `get` instead of indexing keeps a bounds-check panic
    // out of the code (a level past the end reads like a word past the storage: empty).

    fn word(&self, level: usize, index: u32) -> u64 {
        let Some(&start) = self.level_start.get(level) else {
            return 0;
        };
        let at = start as usize + index as usize;
        self.storage.as_ref().get(at).copied().unwrap_or(0)
    }

    fn word_mut(&mut self, level: usize, index: u32) -> Option<&mut u64> {
        let at = *self.level_start.get(level)? as usize + index as usize;
        self.storage.as_mut().get_mut(at)
    }

    fn level_len(&self, level: usize) -> u32 {
        match (self.level_start.get(level), self.level_start.get(level + 1)) {
            (Some(&start), Some(&end)) => end - start,
            _ => 0,
        }
    }

    fn is_free(&self, block_index: u32) -> bool {
        self.word(0, block_index / 64) >> (block_index % 64) & 1 == 1
    }

    /// The first free block at or after `from`, else the first from block 0: `allocate_next`'s
    /// search once the cursor's own word is full. Kept out of line so the common case stays small.
    #[cold]
    #[inline(never)]
    fn find_free_wrapping(&self, from: u32) -> Option<u32> {
        self.find_free_from(from).or_else(|| self.find_free_from(0))
    }

    /// The first free block with index ≥ `from`, if any. O(levels).
    fn find_free_from(&self, from: u32) -> Option<u32> {
        // `levels` ≤ MAX_LEVELS by construction; the `min` lets the compiler see it.
        let levels = usize::from(self.levels).min(MAX_LEVELS);
        let mut level = 0;
        let mut index = from;
        // Climb until a word at or after `index` has a set bit.
        loop {
            if level >= levels {
                return None;
            }
            let word_index = index / 64;
            if word_index >= self.level_len(level) {
                return None;
            }
            let bits = self.word(level, word_index) & (u64::MAX << (index % 64));
            if bits != 0 {
                index = word_index * 64 + bits.trailing_zeros();
                break;
            }
            index = word_index + 1;
            level += 1;
        }
        // Descend: each set summary bit names a word below with a free bit.
        while level > 0 {
            level -= 1;
            let bits = self.word(level, index);
            if bits == 0 {
                return None;
            }
            index = index * 64 + bits.trailing_zeros();
        }
        Some(index)
    }

    /// First index of an aligned run of `group` (a power of two ≤ block_count) free blocks, lowest
    /// first.
    fn find_free_aligned(&self, group: u32) -> Option<u32> {
        self.find_free_aligned_from(0, group)
    }

    /// First index ≥ `from` of an aligned run of `group` (a power of two ≤ block_count) free
    /// blocks. `from` must be a multiple of `group`: then the aligned start of the group holding
    /// the first free block at or after `from` is itself ≥ `from`.
    fn find_free_aligned_from(&self, from: u32, group: u32) -> Option<u32> {
        self.find_free_aligned_upto(from, self.block_count.saturating_sub(1), group)
    }

    /// As [`CidrSet::find_free_aligned_from`], but gives up once the search passes block `last`
    /// (a run found may still start or end past `last`: the caller checks), so a search confined
    /// to a range never walks the rest of the set.
    fn find_free_aligned_upto(&self, mut from: u32, last: u32, group: u32) -> Option<u32> {
        loop {
            if from >= self.block_count || from > last {
                return None;
            }
            let free = self.find_free_from(from)?;
            if group <= 64 {
                let word_index = free / 64;
                let bits = self.word(0, word_index) & (u64::MAX << (free % 64 / group * group));
                let runs = aligned_runs(bits, group);
                if runs != 0 {
                    return Some(word_index * 64 + runs.trailing_zeros());
                }
                from = (word_index + 1) * 64;
            } else {
                let start = free / group * group;
                let words = group / 64;
                let first_word = start / 64;
                let mut all_free = true;
                for w in first_word..first_word + words {
                    if self.word(0, w) != u64::MAX {
                        all_free = false;
                        break;
                    }
                }
                if all_free {
                    return Some(start);
                }
                from = start + group;
            }
        }
    }

    /// Number of free blocks in `begin..=end` (indices < block_count).
    fn count_free(&self, begin: u32, end: u32) -> u32 {
        let mut total = 0;
        let mut word_index = begin / 64;
        let last_word = end / 64;
        while word_index <= last_word {
            total += (self.word(0, word_index) & range_mask(word_index, begin, end)).count_ones();
            word_index += 1;
        }
        total
    }

    /// Sets blocks `begin..=end` free (`free = true`) or allocated, updating the summaries, and
    /// returns how many blocks changed state.
    fn set_range(&mut self, begin: u32, end: u32, free: bool) -> u32 {
        let mut changed = 0;
        let mut word_index = begin / 64;
        let last_word = end / 64;
        while word_index <= last_word {
            let mask = range_mask(word_index, begin, end);
            changed += self.update_word(0, word_index, mask, free);
            word_index += 1;
        }
        changed
    }

    fn mark_used(&mut self, block_index: u32) {
        let word_index = block_index / 64;
        let bit = 1u64 << (block_index % 64);
        // Fast path: the word keeps a free block, so no summary level changes (what
        // `update_word` would conclude after the same store).
        if let Some(word) = self.word_mut(0, word_index)
            && *word & !bit != 0
        {
            *word &= !bit;
            return;
        }
        self.mark_used_emptying(word_index, bit);
    }

    /// `mark_used` when the word becomes empty (once per 64 allocations in a fill): the summary
    /// levels change too.
    #[cold]
    #[inline(never)]
    fn mark_used_emptying(&mut self, word_index: u32, bit: u64) {
        self.update_word(0, word_index, bit, false);
    }

    /// Sets (`free`) or clears the `mask` bits of one word at `level`, propagating "word became
    /// empty / non-empty" to the summary levels above. Returns the number of bits that changed.
    fn update_word(&mut self, level: usize, word_index: u32, mask: u64, free: bool) -> u32 {
        // `levels` ≤ MAX_LEVELS by construction; the `min` lets the compiler see it.
        let levels = usize::from(self.levels).min(MAX_LEVELS);
        let Some(word) = self.word_mut(level, word_index) else {
            return 0;
        };
        let before = *word;
        let after = if free { before | mask } else { before & !mask };
        *word = after;
        let changed = (before ^ after).count_ones();
        let (mut was_empty, mut is_empty) = (before == 0, after == 0);
        let mut child = word_index;
        let mut up = level + 1;
        while was_empty != is_empty && up < levels {
            let parent_index = child / 64;
            let bit = 1u64 << (child % 64);
            let Some(parent) = self.word_mut(up, parent_index) else {
                break;
            };
            let before = *parent;
            let after = if is_empty {
                before & !bit
            } else {
                before | bit
            };
            *parent = after;
            was_empty = before == 0;
            is_empty = after == 0;
            child = parent_index;
            up += 1;
        }
        changed
    }
}

/// Sets the low `count` bits across `words` (level initialisation) and clears the rest.
fn fill_low_bits(words: &mut [u64], count: u32) {
    for (i, word) in words.iter_mut().enumerate() {
        let start = (i as u64) * 64;
        let count = u64::from(count);
        *word = if count >= start + 64 {
            u64::MAX
        } else if count > start {
            (1u64 << (count - start)) - 1
        } else {
            0
        };
    }
}

/// Bits of word `word_index` that fall in the block range `begin..=end`.
fn range_mask(word_index: u32, begin: u32, end: u32) -> u64 {
    let word_first = word_index * 64;
    let low = begin.saturating_sub(word_first);
    let high = if end < word_first + 63 {
        end - word_first
    } else {
        63
    };
    // low ≤ high ≤ 63.
    (u64::MAX << low) & (u64::MAX >> (63 - high))
}

/// Bits at multiples of `group` (≤ 64, a power of two) whose `group` bits starting there are all
/// set in `bits`.
fn aligned_runs(bits: u64, group: u32) -> u64 {
    let mut runs = bits;
    let mut width = 1;
    while width < group {
        runs &= runs >> width;
        width *= 2;
    }
    runs & group_starts(group)
}

/// A word with a bit at every multiple of `group` (a power of two ≤ 64).
fn group_starts(group: u32) -> u64 {
    match group {
        1 => u64::MAX,
        2 => 0x5555_5555_5555_5555,
        4 => 0x1111_1111_1111_1111,
        8 => 0x0101_0101_0101_0101,
        16 => 0x0001_0001_0001_0001,
        32 => 0x0000_0001_0000_0001,
        _ => 1,
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec;
    use std::vec::Vec;

    /// A CIDR from test text.
    pub(super) fn cidr(text: &str) -> Cidr {
        Cidr::parse(text).unwrap()
    }

    /// A fresh set over `cluster` cut into `/mask` blocks, on heap storage.
    pub(super) fn set(cluster: &str, mask: u8) -> CidrSet<Vec<u64>> {
        let c = cidr(cluster);
        CidrSet::new(c, mask, vec![0; storage_words_for(c.prefix_len(), mask)]).unwrap()
    }

    #[test]
    fn storage_sizes() {
        assert_eq!(storage_words(1), 1);
        assert_eq!(storage_words(64), 1);
        assert_eq!(storage_words(65), 3);
        assert_eq!(storage_words(256), 5);
        assert_eq!(storage_words(65_536), 1_024 + 16 + 1);
        assert_eq!(storage_words(1 << 24), 262_144 + 4_096 + 64 + 1);
        assert_eq!(storage_words_for(16, 24), 5);
        assert_eq!(storage_words_for(24, 16), 1);
    }

    /// Upstream's occupy/release counting vector (cidr_set_test.go, TestCIDRSetMetrics-style).
    #[test]
    fn occupy_release_counts_then_fill() {
        let mut s = set("10.42.0.0/16", 24);
        let steps: &[(&str, &str, u32)] = &[
            ("occupy", "10.42.5.0/24", 1),
            ("occupy", "10.42.9.0/24", 2),
            ("occupy", "10.42.8.0/22", 5),
            ("occupy", "10.42.9.0/24", 5),
            ("release", "10.42.9.0/24", 4),
            ("release", "10.42.9.0/24", 4),
            ("release", "10.42.4.0/22", 3),
        ];
        for (op, c, want) in steps {
            match *op {
                "occupy" => s.occupy(cidr(c)).unwrap(),
                _ => s.release(cidr(c)).unwrap(),
            };
            assert_eq!(s.allocated_count(), *want, "{op} {c}");
        }
        for i in 0..253 {
            s.allocate_next()
                .unwrap_or_else(|e| panic!("allocation {i}: {e}"));
        }
        assert_eq!(
            s.allocate_next(),
            Err(AllocError::Exhausted {
                cluster_cidr: cidr("10.42.0.0/16")
            })
        );
        assert_eq!(s.allocated_count(), 256);
    }

    #[test]
    fn ipv6_block_index_to_cidr() {
        let s = set("2001:db8:1234:ff00::/56", 72);
        assert_eq!(s.block_count(), 65_536);
        assert_eq!(
            s.block_cidr(15).unwrap(),
            cidr("2001:db8:1234:ff00:f00::/72")
        );
        assert_eq!(s.block_cidr(0).unwrap(), cidr("2001:db8:1234:ff00::/72"));
        assert_eq!(
            s.block_cidr(65_536),
            Err(AllocError::BlockIndexOutOfRange {
                block_index: 65_536,
                block_count: 65_536
            })
        );
        assert_eq!(
            s.block_range(cidr("2001:db8:1234:ff00:f00::/72")).unwrap(),
            (15, 15)
        );
    }

    #[test]
    fn round_robin_order_follows_cursor() {
        let mut s = set("10.0.0.0/28", 30); // 4 blocks
        let got: Vec<u32> = (0..4)
            .map(|_| s.allocate_next().unwrap().block_index)
            .collect();
        assert_eq!(got, [0, 1, 2, 3]);
        assert_eq!(s.next_candidate(), 0);
        s.release(cidr("10.0.0.4/30")).unwrap(); // block 1
        s.release(cidr("10.0.0.12/30")).unwrap(); // block 3
        assert_eq!(s.next_candidate(), 0, "release does not move the cursor");
        let a = s.allocate_next().unwrap();
        assert_eq!((a.block_index, a.tries), (1, 1));
        let b = s.allocate_next().unwrap();
        assert_eq!((b.block_index, b.tries), (3, 1));
        assert_eq!(s.next_candidate(), 0);
        // Wrap-around: free block 0, cursor at 2 after allocating block 1 again.
        s.release(cidr("10.0.0.0/30")).unwrap();
        s.release(cidr("10.0.0.4/30")).unwrap();
        assert_eq!(s.allocate_next().unwrap().block_index, 0);
        assert_eq!(s.allocate_next().unwrap().block_index, 1);
        s.release(cidr("10.0.0.0/30")).unwrap();
        let w = s.allocate_next().unwrap();
        assert_eq!(
            (w.block_index, w.tries),
            (0, 2),
            "wrapped from cursor 2 over blocks 2, 3"
        );
    }

    #[test]
    fn occupy_and_release_ranges() {
        let mut s = set("10.42.0.0/16", 24);
        // Larger than the cluster: every block.
        assert_eq!(s.occupy(cidr("10.0.0.0/8")).unwrap(), 256);
        assert_eq!(s.release(cidr("10.42.0.0/16")).unwrap(), 256);
        // Smaller than a block: the containing block.
        assert_eq!(s.occupy(cidr("10.42.7.128/25")).unwrap(), 1);
        assert!(s.is_allocated(7).unwrap());
        assert_eq!(s.allocated_in(cidr("10.42.0.0/20")).unwrap(), 1);
        // Out of range and wrong family change nothing.
        assert!(matches!(
            s.occupy(cidr("10.43.0.0/24")),
            Err(AllocError::OutOfRange { .. })
        ));
        assert!(matches!(
            s.occupy(cidr("fd00::/64")),
            Err(AllocError::FamilyMismatch { .. })
        ));
        assert_eq!(s.allocated_count(), 1);
        // A /8 in a /32-block set spans 2^24 blocks.
        let mut big = set("10.0.0.0/8", 32);
        assert_eq!(big.block_count(), 1 << 24);
        assert_eq!(big.occupy(cidr("10.128.0.0/9")).unwrap(), 1 << 23);
        assert_eq!(big.allocate_next().unwrap().cidr, cidr("10.0.0.0/32"));
        assert_eq!(big.free_count(), (1 << 23) - 1);
    }

    #[test]
    fn release_blocks_by_index() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(cidr("10.0.0.0/20")).unwrap(); // blocks 0..=15
        assert_eq!(s.release_blocks(3, 9).unwrap(), 7);
        assert_eq!(s.release_blocks(3, 9).unwrap(), 0);
        assert_eq!(s.allocated_count(), 9);
        assert!(s.is_allocated(2).unwrap() && !s.is_allocated(3).unwrap());
        assert!(s.release_blocks(9, 3).is_err());
        assert!(s.release_blocks(0, 256).is_err());
        assert_eq!(s.allocated_count(), 9);
    }

    #[test]
    fn aligned_allocation_is_first_fit_and_aligned() {
        let mut s = set("10.0.0.0/16", 24);
        s.occupy(cidr("10.0.1.0/24")).unwrap();
        // A /23 needs two aligned blocks: 0–1 is taken (block 1), so 2–3.
        let a = s.allocate_aligned(23).unwrap();
        assert_eq!(a.cidr, cidr("10.0.2.0/23"));
        assert_eq!((a.first_block_index, a.block_count), (2, 2));
        // A /24 first-fit takes block 0.
        assert_eq!(s.allocate_aligned(24).unwrap().cidr, cidr("10.0.0.0/24"));
        // A /17 (128 blocks, > 64) must skip 0–127 which is partly used.
        assert_eq!(s.allocate_aligned(17).unwrap().cidr, cidr("10.0.128.0/17"));
        assert!(matches!(
            s.allocate_aligned(17),
            Err(AllocError::Exhausted { .. })
        ));
        assert!(matches!(
            s.allocate_aligned(25),
            Err(AllocError::InvalidBlockPrefixLen { .. })
        ));
        assert_eq!(s.allocated_count(), 1 + 2 + 1 + 128);
        assert_eq!(s.allocate_aligned(18).unwrap().cidr, cidr("10.0.64.0/18"));
        assert_eq!(
            s.next_candidate(),
            0,
            "aligned allocation leaves the cursor alone"
        );
    }

    #[test]
    fn new_rejects_bad_shapes() {
        let c = cidr("10.0.0.0/16");
        assert!(matches!(
            CidrSet::new(c, 8, [0u64; 4]),
            Err(AllocError::InvalidNodeMaskSize { .. })
        ));
        assert!(matches!(
            CidrSet::new(c, 33, [0u64; 4]),
            Err(AllocError::InvalidNodeMaskSize { .. })
        ));
        assert!(matches!(
            CidrSet::new(cidr("fd00::/48"), 80, [0u64; 4]),
            Err(AllocError::TooManyBlocks { .. })
        ));
        assert_eq!(
            CidrSet::new(c, 24, [0u64; 4]).err(),
            Some(AllocError::StorageTooSmall {
                needed_words: 5,
                provided_words: 4
            })
        );
        // One block: the whole cluster CIDR.
        let mut one = CidrSet::new(c, 16, [0u64; 1]).unwrap();
        assert_eq!(one.allocate_next().unwrap().cidr, c);
        assert!(one.allocate_next().is_err());
        let mut all = CidrSet::new(cidr("::/0"), 0, [0u64; 1]).unwrap();
        assert_eq!(all.allocate_next().unwrap().cidr, cidr("::/0"));
    }
}
