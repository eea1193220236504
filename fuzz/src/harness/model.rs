//! `SetModel`: the trivial model a `CidrSet` is compared with.

use std::collections::BTreeSet;

use nodeipam_core::{
    AlignedAllocation, AllocError, Allocation, BlockAllocation, BlockRequest, Cidr, Family,
    FreeBlock, Placement,
};

use super::{ip_bits, masked_cidr, span, width};

/// The trivial model of a `CidrSet`: the set of allocated block indices and upstream's
/// round-robin cursor (next allocation = first free index ≥ cursor, wrapping; cursor := found + 1
/// mod n; occupy/release/aligned allocation don't move it).
#[derive(Debug, Clone)]
pub struct SetModel {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// Node mask size, bits.
    pub node_mask_size: u8,
    /// 2^(node mask − cluster prefix).
    pub block_count: u32,
    /// Allocated block indices.
    pub allocated: BTreeSet<u32>,
    /// Next-candidate cursor.
    pub cursor: u32,
}

/// Ranges shorter than this are updated block by block in the model; longer ones in bulk.
const SHORT_RANGE: u32 = 1024;

impl SetModel {
    /// An empty model.
    pub fn new(cluster_cidr: Cidr, node_mask_size: u8) -> Self {
        let block_bits = node_mask_size - cluster_cidr.prefix_len();
        SetModel {
            cluster_cidr,
            node_mask_size,
            block_count: 1u32 << block_bits,
            allocated: BTreeSet::new(),
            cursor: 0,
        }
    }

    pub(super) fn family(&self) -> Family {
        self.cluster_cidr.family()
    }

    pub(super) fn shift(&self) -> u32 {
        u32::from(width(self.family()) - self.node_mask_size)
    }

    /// Block `index` as a CIDR (index < block_count).
    pub fn block_cidr(&self, index: u32) -> Cidr {
        let offset = u128::from(index).checked_shl(self.shift()).unwrap_or(0);
        let network = ip_bits(self.cluster_cidr.network()) + offset;
        masked_cidr(self.family(), network, self.node_mask_size)
    }

    pub(super) fn full(&self) -> bool {
        self.allocated.len() as u64 >= u64::from(self.block_count)
    }

    pub(super) fn free_count(&self) -> u32 {
        self.block_count - self.allocated.len() as u32
    }

    /// Upstream's `getBeginningAndEndIndices`, from address arithmetic.
    pub fn block_range(&self, cidr: Cidr) -> Result<(u32, u32), AllocError> {
        let cluster_cidr = self.cluster_cidr;
        if cidr.family() != cluster_cidr.family() {
            return Err(AllocError::FamilyMismatch { cidr, cluster_cidr });
        }
        let (a_first, a_last) = span(&cidr);
        let (c_first, c_last) = span(&cluster_cidr);
        if a_last < c_first || c_last < a_first {
            return Err(AllocError::OutOfRange { cidr, cluster_cidr });
        }
        if cidr.prefix_len() <= cluster_cidr.prefix_len() {
            return Ok((0, self.block_count - 1));
        }
        let shift = self.shift();
        let first = (a_first - c_first).checked_shr(shift).unwrap_or(0);
        let last = (a_last - c_first).checked_shr(shift).unwrap_or(0);
        Ok((first as u32, last as u32))
    }

    pub(super) fn first_free_from(&self, from: u32) -> Option<u32> {
        let mut index = from;
        for &allocated in self.allocated.range(from..) {
            if allocated != index {
                break;
            }
            index += 1;
        }
        (index < self.block_count).then_some(index)
    }

    /// What `allocate_next` must return, applied to the model.
    pub fn allocate_next(&mut self) -> Result<Allocation, AllocError> {
        let exhausted = AllocError::Exhausted {
            cluster_cidr: self.cluster_cidr,
        };
        if self.full() {
            return Err(exhausted);
        }
        let found = self
            .first_free_from(self.cursor)
            .or_else(|| self.first_free_from(0))
            .ok_or(exhausted)?;
        let tries = (found + self.block_count - self.cursor) % self.block_count;
        self.allocated.insert(found);
        self.cursor = (found + 1) % self.block_count;
        Ok(Allocation {
            cidr: self.block_cidr(found),
            block_index: found,
            tries,
        })
    }

    /// What `allocate_aligned(prefix_len)` must return (first fit from 0), applied to the model.
    pub fn allocate_aligned(&mut self, prefix_len: u8) -> Result<AlignedAllocation, AllocError> {
        if prefix_len < self.cluster_cidr.prefix_len() || prefix_len > self.node_mask_size {
            return Err(AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr: self.cluster_cidr,
                node_mask_size: self.node_mask_size,
            });
        }
        let group = 1u64 << (self.node_mask_size - prefix_len);
        // Aligned candidates from 0; a candidate holding an allocated block is replaced by the
        // first aligned candidate after its last allocated block.
        let mut first = 0u64;
        if group == 1 {
            first = self.first_free_from(0).map_or(u64::MAX / 2, u64::from);
        }
        while first + group <= u64::from(self.block_count) {
            let candidate = first as u32..=(first + group - 1) as u32;
            match self.allocated.range(candidate).next_back() {
                Some(&allocated) => first = (u64::from(allocated) / group + 1) * group,
                None => break,
            }
        }
        if first + group > u64::from(self.block_count) {
            return Err(AllocError::Exhausted {
                cluster_cidr: self.cluster_cidr,
            });
        }
        let (first, group) = (first as u32, group as u32);
        self.mark(first, first + group - 1);
        let network = ip_bits(self.block_cidr(first).network());
        Ok(AlignedAllocation {
            cidr: masked_cidr(self.family(), network, prefix_len),
            first_block_index: first,
            block_count: group,
        })
    }

    /// The lowest multiple of `group` ≥ `start` (itself a multiple) whose `group` blocks are all
    /// free, jumping past the last allocated block of each rejected candidate.
    fn first_free_group_from(&self, start: u64, group: u64) -> Option<u32> {
        let mut first = start;
        while first + group <= u64::from(self.block_count) {
            let candidate = first as u32..=(first + group - 1) as u32;
            match self.allocated.range(candidate).next_back() {
                Some(&allocated) => first = (u64::from(allocated) / group + 1) * group,
                None => return Some(first as u32),
            }
        }
        None
    }

    /// Where `allocate_block(request)` must place the block — `(first, group, tries)` — without
    /// changing the model: from the cursor rounded up to the alignment (wrapping), or from 0.
    pub fn find_block(&self, request: BlockRequest) -> Result<(u32, u32, u32), AllocError> {
        let prefix_len = request.prefix_len;
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
        let group = 1u64 << (self.node_mask_size - prefix_len);
        let n = u64::from(self.block_count);
        let start = match request.placement {
            Placement::FirstFit => 0,
            Placement::NextFromCursor => (u64::from(self.cursor).div_ceil(group) * group) % n,
        };
        let first = self
            .first_free_group_from(start, group)
            .or_else(|| self.first_free_group_from(0, group))
            .ok_or(exhausted)?;
        let tries = ((u64::from(first) + n - start) % n) / group;
        Ok((first, group as u32, tries as u32))
    }

    /// Applies a placement found by [`SetModel::find_block`].
    pub fn take_block(&mut self, request: BlockRequest, found: (u32, u32, u32)) -> BlockAllocation {
        let (first, group, tries) = found;
        self.mark(first, first + group - 1);
        if request.placement == Placement::NextFromCursor {
            self.cursor =
                ((u64::from(first) + u64::from(group)) % u64::from(self.block_count)) as u32;
        }
        let network = ip_bits(self.block_cidr(first).network());
        BlockAllocation {
            cidr: masked_cidr(self.family(), network, request.prefix_len),
            first_block_index: first,
            block_count: group,
            tries,
        }
    }

    /// What `allocate_block(request)` must return, applied to the model.
    pub fn allocate_block(&mut self, request: BlockRequest) -> Result<BlockAllocation, AllocError> {
        let found = self.find_block(request)?;
        Ok(self.take_block(request, found))
    }

    /// What `largest_free_block()` must return: the lowest free aligned block of the largest size.
    pub fn largest_free_block(&self) -> Option<FreeBlock> {
        let mut group = u64::from(self.block_count);
        loop {
            if let Some(first) = self.first_free_group_from(0, group) {
                let prefix_len = self.node_mask_size - group.trailing_zeros() as u8;
                let network = ip_bits(self.block_cidr(first).network());
                return Some(FreeBlock {
                    cidr: masked_cidr(self.family(), network, prefix_len),
                    first_block_index: first,
                    block_count: group as u32,
                });
            }
            if group == 1 {
                return None;
            }
            group /= 2;
        }
    }

    /// Adds `first..=last` to the allocated set: one insert per block for short ranges, else a
    /// bulk build and a merge (range operations on 2^16 blocks stay cheap enough for the fuzzer).
    fn mark(&mut self, first: u32, last: u32) {
        if last - first < SHORT_RANGE {
            self.allocated.extend(first..=last);
        } else {
            let mut range: BTreeSet<u32> = (first..=last).collect();
            self.allocated.append(&mut range);
        }
    }

    /// Removes `first..=last` from the allocated set (per block for short ranges, else split and
    /// merge).
    fn unmark(&mut self, first: u32, last: u32) {
        if last - first < SHORT_RANGE {
            for index in first..=last {
                self.allocated.remove(&index);
            }
        } else {
            let mut from_first = self.allocated.split_off(&first);
            let mut after_last = from_first.split_off(&(last + 1));
            self.allocated.append(&mut after_last);
        }
    }

    /// What `occupy(cidr)` must return, applied to the model.
    pub fn occupy(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        let (first, last) = self.block_range(cidr)?;
        let before = self.allocated.len();
        self.mark(first, last);
        Ok((self.allocated.len() - before) as u32)
    }

    /// What `release(cidr)` must return, applied to the model.
    pub fn release(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        let (first, last) = self.block_range(cidr)?;
        let before = self.allocated.len();
        self.unmark(first, last);
        Ok((before - self.allocated.len()) as u32)
    }

    /// What `allocated_in(cidr)` must return.
    pub fn allocated_in(&self, cidr: Cidr) -> Result<u32, AllocError> {
        let (first, last) = self.block_range(cidr)?;
        Ok(self.allocated.range(first..=last).count() as u32)
    }

    /// What `is_allocated(index)` must return.
    pub fn is_allocated(&self, block_index: u32) -> Result<bool, AllocError> {
        if block_index >= self.block_count {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index,
                block_count: self.block_count,
            });
        }
        Ok(self.allocated.contains(&block_index))
    }

    /// What `block_cidr(index)` must return.
    pub fn checked_block_cidr(&self, block_index: u32) -> Result<Cidr, AllocError> {
        if block_index >= self.block_count {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index,
                block_count: self.block_count,
            });
        }
        Ok(self.block_cidr(block_index))
    }
}
