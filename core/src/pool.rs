//! `Pool`: the allocator over all cluster CIDRs (one [`CidrSet`] per cluster CIDR, flag order).
//!
//! A family may have several cluster CIDRs (`--cluster-cidr=10.244.0.0/16,10.245.0.0/16,…`): they
//! are used in flag order, a block coming from a later one only when every earlier one of the
//! family has no free block of the size asked for. Dual-stack stays all or nothing across the
//! families. With one cluster CIDR per family every method behaves as kube-controller-manager's
//! range allocator (one `CidrSet` per family).

use heapless::Vec;

use crate::cidr::{Cidr, Family};
use crate::cidr_set::{
    Allocation, BlockAllocation, BlockRequest, CidrSet, PoolRange, RangeCandidate,
};
use crate::error::AllocError;

/// The pod CIDRs allocated to one node: one [`Allocation`] per address family, in the order of
/// [`Pool::families`] (the first cluster CIDR's family first), so `allocations[0].cidr` is the
/// node's `spec.podCIDR`.
pub type NodeAllocation = Vec<Allocation, 2>;

/// The pod CIDRs allocated to one node by [`Pool::allocate_node_blocks`]: one [`BlockAllocation`]
/// per address family, in the order of [`Pool::families`].
pub type NodeBlocks = Vec<BlockAllocation, 2>;

/// One place in the list of sets [`Pool::splice`] builds.
#[derive(Debug)]
pub enum Slot<S> {
    /// The pool's current set at this index ([`Pool::sets`]), moved, not copied.
    Kept(usize),
    /// A new set.
    New(CidrSet<S>),
}

/// The allocator for a whole cluster: one [`CidrSet`] per cluster CIDR, flag order, at most `N`
/// (a compile-time capacity, as `heapless::Vec`'s: the sets live inline, so an edge agent with
/// array storage pays only for the sets it can hold). The default `N = 2` is one IPv4 plus one
/// IPv6 cluster CIDR (kube-controller-manager's limit); [`Pool::from_sets`] takes several per
/// family, in any `N`.
///
/// Every method is total and a method that returns `Err` changes nothing.
#[derive(Debug, Clone)]
pub struct Pool<S, const N: usize = 2> {
    sets: Vec<CidrSet<S>, N>,
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> Pool<S, 2> {
    /// Makes a pool from its sets, in flag order: one set, or one per family (for several per
    /// family, [`Pool::from_sets`]).
    ///
    /// # Errors
    /// [`AllocError::DuplicateFamily`] if both sets have the same family (a dual-stack cluster has
    /// one IPv4 and one IPv6 cluster CIDR).
    pub fn new(first: CidrSet<S>, second: Option<CidrSet<S>>) -> Result<Self, AllocError> {
        let mut sets = Vec::new();
        if let Some(second) = second {
            if second.cluster_cidr().family() == first.cluster_cidr().family() {
                return Err(AllocError::DuplicateFamily {
                    family: first.cluster_cidr().family(),
                });
            }
            // Capacity is 2: neither push can fail.
            let _ = sets.push(first);
            let _ = sets.push(second);
        } else {
            let _ = sets.push(first);
        }
        Ok(Pool { sets })
    }
}

impl<S: AsRef<[u64]> + AsMut<[u64]>, const N: usize> Pool<S, N> {
    /// Makes a pool from its sets in flag order, any number per family up to `N` in all. Within a
    /// family the sets are used in this order ([`Pool::allocate_node_blocks`]).
    ///
    /// `N` must be at least 1 (checked at compile time).
    ///
    /// # Errors
    /// [`AllocError::NoClusterCidr`] for no set; [`AllocError::TooManyClusterCidrs`] for more
    /// than `N`; [`AllocError::ClusterCidrsOverlap`] naming the first two sets (flag order) that
    /// share an address.
    pub fn from_sets(sets: impl IntoIterator<Item = CidrSet<S>>) -> Result<Self, AllocError> {
        const {
            assert!(
                N >= 1,
                "a Pool must be able to hold at least one cluster CIDR"
            )
        };
        let mut held: Vec<CidrSet<S>, N> = Vec::new();
        let mut count = 0usize;
        for set in sets {
            count += 1;
            // Past the capacity the rest is only counted (and dropped) for the error.
            let _ = held.push(set);
        }
        if count == 0 {
            return Err(AllocError::NoClusterCidr);
        }
        if count > N {
            return Err(AllocError::TooManyClusterCidrs { count, max: N });
        }
        for (index, later) in held.iter().enumerate() {
            let later_cidr = later.cluster_cidr();
            if let Some(earlier) = held
                .iter()
                .take(index)
                .find(|earlier| earlier.cluster_cidr().overlaps(&later_cidr))
            {
                return Err(AllocError::ClusterCidrsOverlap {
                    first: earlier.cluster_cidr(),
                    second: later_cidr,
                });
            }
        }
        Ok(Pool { sets: held })
    }

    /// The sets in flag order (1 ..= `N`).
    pub fn sets(&self) -> &[CidrSet<S>] {
        &self.sets
    }

    /// Rebuilds the pool's list of sets in the order of `slots` without copying a kept set:
    /// [`Slot::Kept`]`(i)` moves the current set `i` (indices of [`Pool::sets`]) to that place,
    /// [`Slot::New`] puts a new set there; a current set no slot keeps is dropped. Hosting one
    /// more range among many large sets thus costs the sets it changes, not every set.
    ///
    /// # Errors
    /// Changes nothing and returns [`AllocError::NoClusterCidr`] for no slot,
    /// [`AllocError::TooManyClusterCidrs`] for more than `N`, [`AllocError::InvalidSetIndex`]
    /// for an index past the sets or kept twice, [`AllocError::ClusterCidrsOverlap`] for two
    /// resulting sets that share an address.
    pub fn splice(&mut self, slots: impl IntoIterator<Item = Slot<S>>) -> Result<(), AllocError> {
        let mut held: Vec<Slot<S>, N> = Vec::new();
        let mut count = 0usize;
        for slot in slots {
            count += 1;
            let _ = held.push(slot);
        }
        if count == 0 {
            return Err(AllocError::NoClusterCidr);
        }
        if count > N {
            return Err(AllocError::TooManyClusterCidrs { count, max: N });
        }
        let mut kept = [false; N];
        for slot in &held {
            if let Slot::Kept(index) = slot {
                match kept.get_mut(*index) {
                    Some(seen) if *index < self.sets.len() && !*seen => *seen = true,
                    _ => return Err(AllocError::InvalidSetIndex { index: *index }),
                }
            }
        }
        let cidr_of = |slot: &Slot<S>| match slot {
            Slot::Kept(index) => self.sets.get(*index).map(CidrSet::cluster_cidr),
            Slot::New(set) => Some(set.cluster_cidr()),
        };
        // The kept sets are disjoint already (the pool's invariant): each new set is checked
        // against every other slot, so the check costs the sets times the new ones.
        for (index, new) in held.iter().enumerate() {
            let Slot::New(new) = new else {
                continue;
            };
            let new_cidr = new.cluster_cidr();
            if let Some(other) = held
                .iter()
                .enumerate()
                .filter(|(other, _)| *other != index)
                .filter_map(|(_, slot)| cidr_of(slot))
                .find(|other| other.overlaps(&new_cidr))
            {
                return Err(AllocError::ClusterCidrsOverlap {
                    first: other,
                    second: new_cidr,
                });
            }
        }
        let mut old: Vec<Option<CidrSet<S>>, N> = core::mem::take(&mut self.sets)
            .into_iter()
            .map(Some)
            .collect();
        for slot in held {
            let set = match slot {
                Slot::Kept(index) => old.get_mut(index).and_then(Option::take),
                Slot::New(set) => Some(set),
            };
            // Checked above: every kept index names a set, once; at most `N` slots.
            if let Some(set) = set {
                let _ = self.sets.push(set);
            }
        }
        Ok(())
    }

    /// The first set (flag order) for `family`, if one is configured: with one cluster CIDR per
    /// family, the family's set.
    pub fn set_for(&self, family: Family) -> Option<&CidrSet<S>> {
        self.sets_of(family).next()
    }

    /// The sets of `family`, flag order.
    pub fn sets_of(&self, family: Family) -> impl Iterator<Item = &CidrSet<S>> {
        self.sets
            .iter()
            .filter(move |set| set.cluster_cidr().family() == family)
    }

    /// The index in [`Pool::sets`] of the first set (flag order) that `cidr` shares an address
    /// with, if any. A podCIDR that lies in a cluster CIDR has exactly one such set (the sets do
    /// not overlap); a wider one may overlap several.
    pub fn set_index_of(&self, cidr: Cidr) -> Option<usize> {
        self.sets
            .iter()
            .position(|set| set.block_range(cidr).is_ok())
    }

    /// The address families of the pool in flag order: the first set's, then the other one's if
    /// some set has it. [`Pool::allocate_node_blocks`] takes one request per family in this
    /// order, and a node's podCIDRs come in it.
    pub fn families(&self) -> Vec<Family, 2> {
        let mut families: Vec<Family, 2> = Vec::new();
        for set in &self.sets {
            let family = set.cluster_cidr().family();
            if !families.contains(&family) {
                // Two families exist: the push cannot fail.
                let _ = families.push(family);
            }
        }
        families
    }

    /// Whether the pool is dual-stack (cluster CIDRs of both families).
    pub fn is_dual_stack(&self) -> bool {
        self.families().len() == 2
    }

    /// The error for `family` having no set with room: [`AllocError::Exhausted`] naming its one
    /// cluster CIDR, or [`AllocError::ClusterCidrsExhausted`] for several.
    fn family_exhausted(&self, family: Family) -> AllocError {
        let mut sets = self.sets_of(family);
        let Some(first) = sets.next() else {
            return AllocError::NoClusterCidr;
        };
        let (count, last) = sets.fold((1u8, first), |(n, _), set| (n.saturating_add(1), set));
        if count == 1 {
            AllocError::Exhausted {
                cluster_cidr: first.cluster_cidr(),
            }
        } else {
            AllocError::ClusterCidrsExhausted {
                family,
                first: first.cluster_cidr(),
                last: last.cluster_cidr(),
                count,
            }
        }
    }

    /// The error for `cidr` overlapping no set of its family: [`AllocError::NoClusterCidrForFamily`]
    /// without one, [`AllocError::OutOfRange`] naming the family's one cluster CIDR, or
    /// [`AllocError::OutsideClusterCidrs`] for several.
    fn outside(&self, cidr: Cidr) -> AllocError {
        match self.family_exhausted(cidr.family()) {
            AllocError::Exhausted { cluster_cidr } => AllocError::OutOfRange { cidr, cluster_cidr },
            AllocError::ClusterCidrsExhausted {
                first, last, count, ..
            } => AllocError::OutsideClusterCidrs {
                cidr,
                first,
                last,
                count,
            },
            _ => AllocError::NoClusterCidrForFamily { cidr },
        }
    }

    /// Allocates one block per family, in the order of [`Pool::families`]: from the family's
    /// first set (flag order) that has a free block, round-robin within it as
    /// [`CidrSet::allocate_next`]. All or nothing: if any family has no free block, no set
    /// changes. (Upstream's range allocator, on the second family's failure, releases the first
    /// block into the wrong set and leaks it; we check every family before touching any set.)
    ///
    /// # Errors
    /// [`AllocError::Exhausted`] naming the first exhausted family's cluster CIDR, or
    /// [`AllocError::ClusterCidrsExhausted`] when that family has several.
    pub fn allocate_node(&mut self) -> Result<NodeAllocation, AllocError> {
        let mut chosen: Vec<usize, 2> = Vec::new();
        for family in self.families() {
            let index = self
                .sets
                .iter()
                .position(|set| set.cluster_cidr().family() == family && set.free_count() > 0)
                .ok_or_else(|| self.family_exhausted(family))?;
            let _ = chosen.push(index);
        }
        let mut allocations = Vec::new();
        for index in chosen {
            if let Some(set) = self.sets.get_mut(index) {
                // free_count > 0 was checked for this set above, so this succeeds.
                let allocation = set.allocate_next()?;
                let _ = allocations.push(allocation);
            }
        }
        Ok(allocations)
    }

    /// Allocates one block per family, `requests[i]` for the `i`-th of [`Pool::families`], each
    /// placed as [`CidrSet::allocate_block`] places it, **in the family's first set (flag order)
    /// that has a free aligned block of the requested size**: a later cluster CIDR serves only
    /// when every earlier one of the family is full for that size. All or nothing: every family
    /// is searched first and only then are the blocks taken, so if any family has no such block,
    /// no set changes (no block, no cursor). With each request's prefix length equal to the node
    /// mask size and [`crate::Placement::NextFromCursor`] this gives what
    /// [`Pool::allocate_node`] gives.
    ///
    /// # Errors
    /// [`AllocError::RequestCountMismatch`] unless there is one request per family; the first
    /// failing set's [`AllocError::InvalidBlockPrefixLen`]; for a family with no free block of
    /// the size, [`AllocError::Exhausted`] (one cluster CIDR) or
    /// [`AllocError::ClusterCidrsExhausted`] (several).
    pub fn allocate_node_blocks(
        &mut self,
        requests: &[BlockRequest],
    ) -> Result<NodeBlocks, AllocError> {
        let families = self.families();
        if requests.len() != families.len() {
            return Err(AllocError::RequestCountMismatch {
                requests: requests.len(),
                sets: families.len(),
            });
        }
        let mut candidates: Vec<_, 2> = Vec::new();
        for (family, request) in families.iter().zip(requests) {
            let mut found = None;
            for (index, set) in self.sets.iter().enumerate() {
                if set.cluster_cidr().family() != *family {
                    continue;
                }
                match set.find_block(*request) {
                    Ok(candidate) => {
                        found = Some((index, candidate));
                        break;
                    }
                    Err(AllocError::Exhausted { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            let candidate = found.ok_or_else(|| self.family_exhausted(*family))?;
            // At most two families: the push cannot fail.
            let _ = candidates.push(candidate);
        }
        let mut blocks = Vec::new();
        for (index, candidate) in candidates {
            if let Some(set) = self.sets.get_mut(index) {
                let _ = blocks.push(set.take_block(candidate));
            }
        }
        Ok(blocks)
    }

    /// Checks a node's podCIDRs against the pool without changing anything: at most two, at most
    /// one per family, each matched to the sets of **its family** (not its index: a node written
    /// IPv6-first is recognised against an IPv4-first config) and overlapping one of them.
    ///
    /// # Errors
    /// [`AllocError::TooManyCidrs`], [`AllocError::DuplicateFamily`],
    /// [`AllocError::NoClusterCidrForFamily`], [`AllocError::OutOfRange`] (the family has one
    /// cluster CIDR) or [`AllocError::OutsideClusterCidrs`] (several).
    pub fn check_node(&self, pod_cidrs: &[Cidr]) -> Result<(), AllocError> {
        if pod_cidrs.len() > 2 {
            return Err(AllocError::TooManyCidrs {
                count: pod_cidrs.len(),
            });
        }
        if let [a, b] = pod_cidrs
            && a.family() == b.family()
        {
            return Err(AllocError::DuplicateFamily { family: a.family() });
        }
        for cidr in pod_cidrs {
            if self.set_index_of(*cidr).is_none() {
                return Err(self.outside(*cidr));
            }
        }
        Ok(())
    }

    /// Checks a node's podCIDRs as [`Pool::check_node`] does, then that each lies **within** the
    /// cluster CIDR it overlaps: the rule for podCIDRs a node may keep. [`Pool::check_node`]
    /// accepts a podCIDR wider than its cluster CIDR (it overlaps the whole set, and upstream's
    /// `CidrSet.Occupy` occupies it), but such a podCIDR does not lie in the cluster CIDR. The
    /// [`Pool::check_node`] errors come first, so a node failing both gets that error.
    ///
    /// # Errors
    /// As [`Pool::check_node`]; then [`AllocError::WiderThanClusterCidr`] for the first podCIDR
    /// (in the node's order) whose prefix is shorter than that of the first cluster CIDR it
    /// overlaps.
    pub fn check_node_within(&self, pod_cidrs: &[Cidr]) -> Result<(), AllocError> {
        self.check_node(pod_cidrs)?;
        for cidr in pod_cidrs {
            if let Some(set) = self.set_index_of(*cidr).and_then(|i| self.sets.get(i))
                && cidr.prefix_len() < set.cluster_cidr().prefix_len()
            {
                return Err(AllocError::WiderThanClusterCidr {
                    cidr: *cidr,
                    cluster_cidr: set.cluster_cidr(),
                });
            }
        }
        Ok(())
    }

    /// Occupies a node's existing podCIDRs (start-up sync, or a node seen with CIDRs already set).
    /// Checked first as [`Pool::check_node`]; then each CIDR is occupied in every set it overlaps.
    /// Returns the number of blocks that were free before (0 when already occupied: idempotent).
    ///
    /// # Errors
    /// As [`Pool::check_node`]; nothing changes.
    pub fn occupy_node(&mut self, pod_cidrs: &[Cidr]) -> Result<u32, AllocError> {
        self.check_node(pod_cidrs)?;
        let mut changed = 0;
        for cidr in pod_cidrs {
            changed += self.occupy(*cidr)?;
        }
        Ok(changed)
    }

    /// Releases a node's podCIDRs (the node is gone). Checked as [`Pool::check_node`]; each CIDR
    /// is released in every set it overlaps. Returns the number of blocks that were allocated
    /// before.
    ///
    /// # Errors
    /// As [`Pool::check_node`]; nothing changes.
    pub fn release_node(&mut self, pod_cidrs: &[Cidr]) -> Result<u32, AllocError> {
        self.check_node(pod_cidrs)?;
        let mut changed = 0;
        for cidr in pod_cidrs {
            changed += self.release(*cidr)?;
        }
        Ok(changed)
    }

    /// Occupies one CIDR in every set of its family it overlaps (for reserving the part of a bad
    /// node's range that overlaps ours). Returns blocks newly occupied.
    ///
    /// # Errors
    /// [`AllocError::NoClusterCidrForFamily`], [`AllocError::OutOfRange`] or
    /// [`AllocError::OutsideClusterCidrs`] when it overlaps no set; nothing changes.
    pub fn occupy(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        self.update_overlapping(cidr, CidrSet::occupy)
    }

    /// Releases one CIDR in every set of its family it overlaps. Returns blocks newly freed.
    ///
    /// # Errors
    /// As [`Pool::occupy`]; nothing changes.
    pub fn release(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        self.update_overlapping(cidr, CidrSet::release)
    }

    /// `update` (occupy or release) applied to every set `cidr` overlaps, blocks changed summed.
    fn update_overlapping(
        &mut self,
        cidr: Cidr,
        update: fn(&mut CidrSet<S>, Cidr) -> Result<u32, AllocError>,
    ) -> Result<u32, AllocError> {
        if self.set_index_of(cidr).is_none() {
            return Err(self.outside(cidr));
        }
        let mut changed = 0;
        for set in self.sets.iter_mut() {
            // Only sets the CIDR overlaps: there the update cannot fail.
            if set.block_range(cidr).is_ok() {
                changed += update(set, cidr).unwrap_or(0);
            }
        }
        Ok(changed)
    }

    /// Releases blocks `first..=last` (block indices) of the first set of `family`; see
    /// [`CidrSet::release_blocks`] and, for any set, [`Pool::release_blocks_at`]. Returns blocks
    /// newly freed.
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] for a bad range; `Ok(0)` if no set has `family`.
    pub fn release_blocks(
        &mut self,
        family: Family,
        first: u32,
        last: u32,
    ) -> Result<u32, AllocError> {
        match self
            .sets
            .iter()
            .position(|s| s.cluster_cidr().family() == family)
        {
            Some(index) => self.release_blocks_at(index, first, last),
            None => Ok(0),
        }
    }

    /// Releases blocks `first..=last` (block indices) of set `set_index` (flag order, as
    /// [`Pool::sets`]); see [`CidrSet::release_blocks`]. Returns blocks newly freed.
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] for a bad range; `Ok(0)` if there is no such set.
    pub fn release_blocks_at(
        &mut self,
        set_index: usize,
        first: u32,
        last: u32,
    ) -> Result<u32, AllocError> {
        match self.sets.get_mut(set_index) {
            Some(set) => set.release_blocks(first, last),
            None => Ok(0),
        }
    }

    /// Takes, in set `set_index` (as [`Pool::sets`]), a block found there by
    /// [`CidrSet::find_block_within`] for `range`, moving the range's cursor: see
    /// [`CidrSet::take_block_within`], which checks the candidate again (a stale one is refused,
    /// never handed out twice). For a caller that decides across several sets first (one
    /// ClusterCIDR's IPv4 and IPv6 ranges, all or nothing) and takes afterwards.
    ///
    /// # Errors
    /// [`AllocError::StaleCandidate`] naming the range when there is no set `set_index`; the
    /// errors of [`CidrSet::take_block_within`]. Nothing changes.
    pub fn take_block_within_at(
        &mut self,
        set_index: usize,
        range: &mut PoolRange,
        candidate: RangeCandidate,
    ) -> Result<BlockAllocation, AllocError> {
        match self.sets.get_mut(set_index) {
            Some(set) => set.take_block_within(range, candidate),
            None => Err(AllocError::StaleCandidate {
                range: range.cidr(),
            }),
        }
    }

    /// Reserves the part of every cluster CIDR that a service CIDR overlaps, so no node gets a
    /// block holding service IPs (kube-controller-manager does this with
    /// `--service-cluster-ip-range` for its one cluster CIDR per family). A service CIDR of a
    /// family with no set, or overlapping nothing, reserves nothing: `Ok(0)`. Returns the number
    /// of blocks newly reserved, over every set.
    ///
    /// # Errors
    /// [`AllocError::ServiceCidrFillsClusterCidr`] naming the first set (flag order) the
    /// reservation would leave with no free block — a configuration error to report at
    /// start-up; every set is checked first, so nothing changes.
    pub fn reserve_service_cidr(&mut self, service_cidr: Cidr) -> Result<u32, AllocError> {
        for set in &self.sets {
            let Ok((begin, end)) = set.block_range(service_cidr) else {
                continue;
            };
            let span = end - begin + 1;
            let free_in_range = span - set.allocated_in(service_cidr)?;
            if free_in_range >= set.free_count() {
                return Err(AllocError::ServiceCidrFillsClusterCidr {
                    service_cidr,
                    cluster_cidr: set.cluster_cidr(),
                });
            }
        }
        let mut reserved = 0;
        for set in self.sets.iter_mut() {
            if set.block_range(service_cidr).is_ok() {
                reserved += set.occupy(service_cidr)?;
            }
        }
        Ok(reserved)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use crate::cidr_set::storage_words_for;
    use std::vec;
    use std::vec::Vec as StdVec;

    fn cidr(text: &str) -> Cidr {
        Cidr::parse(text).unwrap()
    }

    fn set(cluster: &str, mask: u8) -> CidrSet<StdVec<u64>> {
        let c = cidr(cluster);
        CidrSet::new(c, mask, vec![0; storage_words_for(c.prefix_len(), mask)]).unwrap()
    }

    /// A candidate found in one set is taken there (the range's cursor moves, the set's does not);
    /// a wrong set index, or the same candidate again, is refused and changes nothing.
    #[test]
    fn take_block_within_at_takes_a_found_block_once() {
        let mut pool: Pool<StdVec<u64>, 4> =
            Pool::from_sets([set("127.10.0.0/16", 24), set("127.11.0.0/16", 26)]).unwrap();
        let mut range = PoolRange::new(cidr("127.11.4.0/24"));
        let request = BlockRequest {
            prefix_len: 26,
            placement: crate::Placement::NextFromCursor,
        };
        let candidate = pool.sets()[1].find_block_within(&range, request).unwrap();
        assert_eq!(
            pool.take_block_within_at(7, &mut range, candidate),
            Err(AllocError::StaleCandidate {
                range: cidr("127.11.4.0/24")
            })
        );
        let block = pool.take_block_within_at(1, &mut range, candidate).unwrap();
        assert_eq!(block.cidr, cidr("127.11.4.0/26"));
        assert_eq!((range.cursor(), pool.sets()[1].next_candidate()), (1, 0));
        assert_eq!(
            pool.take_block_within_at(1, &mut range, candidate),
            Err(AllocError::StaleCandidate {
                range: cidr("127.11.4.0/24")
            })
        );
        assert_eq!(pool.sets()[1].allocated_count(), 1);
    }

    #[test]
    fn check_node_within_refuses_a_pod_cidr_wider_than_its_cluster_cidr() {
        let pool = Pool::new(set("127.123.0.0/16", 24), Some(set("fd00:7f::/48", 64))).unwrap();
        // Overlaps the whole cluster CIDR: check_node (and occupy) accept it, as upstream does.
        assert_eq!(pool.check_node(&[cidr("127.122.0.0/15")]), Ok(()));
        assert_eq!(
            pool.check_node_within(&[cidr("127.122.0.0/15")]),
            Err(AllocError::WiderThanClusterCidr {
                cidr: cidr("127.122.0.0/15"),
                cluster_cidr: cidr("127.123.0.0/16"),
            })
        );
        // The cluster CIDR itself, and a block in it, lie within it.
        assert_eq!(pool.check_node_within(&[cidr("127.123.0.0/16")]), Ok(()));
        assert_eq!(
            pool.check_node_within(&[cidr("127.123.4.0/24"), cidr("fd00:7f:0:4::/64")]),
            Ok(())
        );
        // The first wide podCIDR in the node's order is named.
        assert_eq!(
            pool.check_node_within(&[cidr("127.123.4.0/24"), cidr("fd00::/16")]),
            Err(AllocError::WiderThanClusterCidr {
                cidr: cidr("fd00::/16"),
                cluster_cidr: cidr("fd00:7f::/48"),
            })
        );
        // check_node's errors come first.
        assert_eq!(
            pool.check_node_within(&[cidr("127.122.0.0/15"), cidr("127.200.0.0/24")]),
            Err(AllocError::DuplicateFamily { family: Family::V4 })
        );
        assert!(matches!(
            pool.check_node_within(&[cidr("127.122.0.0/15"), cidr("fd01::/64")]),
            Err(AllocError::OutOfRange { .. })
        ));
    }

    #[test]
    fn service_cidr_is_skipped() {
        let mut pool = Pool::new(set("127.123.234.0/24", 30), None).unwrap();
        assert_eq!(
            pool.reserve_service_cidr(cidr("127.123.234.0/26")).unwrap(),
            16
        );
        let first = pool.allocate_node().unwrap();
        assert_eq!(first[0].cidr, cidr("127.123.234.64/30"));
        assert_eq!(first[0].tries, 16);
        // A service CIDR of another family or outside the cluster reserves nothing.
        assert_eq!(pool.reserve_service_cidr(cidr("fd00::/112")).unwrap(), 0);
        assert_eq!(pool.reserve_service_cidr(cidr("10.96.0.0/12")).unwrap(), 0);
        // One that covers all that is left is a configuration error and changes nothing.
        let before = pool.sets()[0].allocated_count();
        assert!(matches!(
            pool.reserve_service_cidr(cidr("127.123.234.0/24")),
            Err(AllocError::ServiceCidrFillsClusterCidr { .. })
        ));
        assert_eq!(pool.sets()[0].allocated_count(), before);
    }

    #[test]
    fn dual_stack_is_all_or_nothing() {
        let mut pool = Pool::new(set("10.0.0.0/16", 24), Some(set("fd00::/120", 121))).unwrap();
        let a = pool.allocate_node().unwrap();
        assert_eq!(
            (a[0].cidr, a[1].cidr),
            (cidr("10.0.0.0/24"), cidr("fd00::/121"))
        );
        let b = pool.allocate_node().unwrap();
        assert_eq!(
            (b[0].cidr, b[1].cidr),
            (cidr("10.0.1.0/24"), cidr("fd00::80/121"))
        );
        let v4_before = pool.sets()[0].allocated_count();
        let cursor_before = pool.sets()[0].next_candidate();
        assert_eq!(
            pool.allocate_node(),
            Err(AllocError::Exhausted {
                cluster_cidr: cidr("fd00::/120")
            })
        );
        assert_eq!(pool.sets()[0].allocated_count(), v4_before, "no IPv4 leak");
        assert_eq!(pool.sets()[0].next_candidate(), cursor_before);
        // Releasing one node's IPv6 block serves the next node.
        pool.release_node(&[cidr("fd00::80/121"), cidr("10.0.1.0/24")])
            .unwrap();
        let c = pool.allocate_node().unwrap();
        assert_eq!(
            (c[0].cidr, c[1].cidr),
            (cidr("10.0.2.0/24"), cidr("fd00::80/121"))
        );
    }

    #[test]
    fn sized_dual_stack_is_all_or_nothing() {
        use crate::cidr_set::Placement::{FirstFit, NextFromCursor};
        let request = |prefix_len, placement| BlockRequest {
            prefix_len,
            placement,
        };
        // IPv4 /16 on a /26 grid, IPv6 /120 on a /122 grid (4 blocks).
        let mut pool = Pool::new(set("10.244.0.0/16", 26), Some(set("fd00::/120", 122))).unwrap();
        let big = [request(23, FirstFit), request(121, FirstFit)];
        let a = pool.allocate_node_blocks(&big).unwrap();
        assert_eq!(
            (a[0].cidr, a[1].cidr),
            (cidr("10.244.0.0/23"), cidr("fd00::/121"))
        );
        let small = [request(26, NextFromCursor), request(122, NextFromCursor)];
        let b = pool.allocate_node_blocks(&small).unwrap();
        assert_eq!(
            (b[0].cidr, b[1].cidr),
            (cidr("10.244.2.0/26"), cidr("fd00::80/122"))
        );
        // IPv6 has one free /122 but no /121 left: nothing changes in the IPv4 set either.
        let before = (
            pool.sets()[0].allocated_count(),
            pool.sets()[0].next_candidate(),
        );
        assert_eq!(
            pool.allocate_node_blocks(&big),
            Err(AllocError::Exhausted {
                cluster_cidr: cidr("fd00::/120")
            })
        );
        assert_eq!(
            (
                pool.sets()[0].allocated_count(),
                pool.sets()[0].next_candidate()
            ),
            before
        );
        assert_eq!(
            pool.allocate_node_blocks(&small[..1]),
            Err(AllocError::RequestCountMismatch {
                requests: 1,
                sets: 2
            })
        );
        let c = pool.allocate_node_blocks(&small).unwrap();
        assert_eq!(c[1].cidr, cidr("fd00::c0/122"));
        assert_eq!(pool.sets()[1].free_count(), 0);
    }

    /// A pool of several cluster CIDRs per family (capacity 8, as the shell's).
    fn pool_of(sets: &[(&str, u8)]) -> Pool<StdVec<u64>, 8> {
        Pool::from_sets(sets.iter().map(|(c, mask)| set(c, *mask))).unwrap()
    }

    /// Issue 18 §1: within a family the sets serve in flag order — the second only while the
    /// first has no free block — and a block freed in the first is used again before the second.
    #[test]
    fn several_per_family_serve_in_flag_order() {
        let mut pool = pool_of(&[
            ("10.0.0.0/30", 31),
            ("fd00::/126", 127),
            ("10.1.0.0/30", 31),
        ]);
        assert_eq!(pool.families().as_slice(), [Family::V4, Family::V6]);
        assert!(pool.is_dual_stack());
        let a = pool.allocate_node().unwrap();
        let b = pool.allocate_node().unwrap();
        assert_eq!(
            (a[0].cidr, b[0].cidr),
            (cidr("10.0.0.0/31"), cidr("10.0.0.2/31"))
        );
        assert_eq!(
            (a[1].cidr, b[1].cidr),
            (cidr("fd00::/127"), cidr("fd00::2/127"))
        );
        // IPv6 is full and has one set: the old error, and the IPv4 sets do not change.
        let before: StdVec<u32> = pool.sets().iter().map(|s| s.allocated_count()).collect();
        assert_eq!(
            pool.allocate_node(),
            Err(AllocError::Exhausted {
                cluster_cidr: cidr("fd00::/126")
            })
        );
        let after: StdVec<u32> = pool.sets().iter().map(|s| s.allocated_count()).collect();
        assert_eq!(before, after);
        pool.release_node(&[cidr("fd00::/127")]).unwrap();
        // The first IPv4 set is full: the next IPv4 block comes from the second.
        let c = pool.allocate_node().unwrap();
        assert_eq!(
            (c[0].cidr, c[1].cidr),
            (cidr("10.1.0.0/31"), cidr("fd00::/127"))
        );
        // Freed in the first set: used again before the rest of the second.
        pool.release_node(&[cidr("10.0.0.2/31"), cidr("fd00::/127")])
            .unwrap();
        let d = pool.allocate_node().unwrap();
        assert_eq!(d[0].cidr, cidr("10.0.0.2/31"));
        pool.release_node(&[cidr("fd00::2/127")]).unwrap();
        let e = pool.allocate_node().unwrap();
        assert_eq!(e[0].cidr, cidr("10.1.0.2/31"));
        // Both IPv4 sets full: the error names the family's first and last set.
        pool.release_node(&[cidr("fd00::/127")]).unwrap();
        let error = pool.allocate_node().unwrap_err();
        assert_eq!(
            error,
            AllocError::ClusterCidrsExhausted {
                family: Family::V4,
                first: cidr("10.0.0.0/30"),
                last: cidr("10.1.0.0/30"),
                count: 2,
            }
        );
        assert_eq!(
            std::format!("{error}"),
            "no free pod CIDR left in any of the 2 IPv4 cluster CIDRs (10.0.0.0/30, 10.1.0.0/30)"
        );
    }

    /// The order rule is per size: a Node needing a larger block than the first set has free
    /// gets it from the second, while smaller blocks still come from the first.
    #[test]
    fn order_is_by_the_size_asked_for() {
        use crate::cidr_set::Placement::{FirstFit, NextFromCursor};
        let mut pool = pool_of(&[("10.0.0.0/24", 26), ("10.1.0.0/24", 26)]);
        let small = [BlockRequest {
            prefix_len: 26,
            placement: NextFromCursor,
        }];
        let big = [BlockRequest {
            prefix_len: 25,
            placement: FirstFit,
        }];
        // 10.0.0.0/26 and 10.0.0.128/26 taken: the first set has two free /26s, no free /25.
        pool.occupy(cidr("10.0.0.0/26")).unwrap();
        pool.occupy(cidr("10.0.0.128/26")).unwrap();
        assert_eq!(
            pool.allocate_node_blocks(&big).unwrap()[0].cidr,
            cidr("10.1.0.0/25")
        );
        assert_eq!(
            pool.allocate_node_blocks(&small).unwrap()[0].cidr,
            cidr("10.0.0.64/26")
        );
        assert_eq!(
            pool.allocate_node_blocks(&small[..0]),
            Err(AllocError::RequestCountMismatch {
                requests: 0,
                sets: 1
            })
        );
    }

    /// `splice` moves the kept sets (their allocations come along), places new ones, drops the
    /// rest, and changes nothing when it refuses.
    #[test]
    fn splice_moves_kept_sets_places_new_ones_and_refuses_whole() {
        let mut pool = Pool::<StdVec<u64>, 4>::from_sets([
            set("10.0.0.0/16", 24),
            set("10.1.0.0/16", 24),
            set("fd00::/48", 64),
        ])
        .expect("pool");
        assert_eq!(pool.occupy(cidr("10.1.7.0/24")), Ok(1));
        let cidrs = |p: &Pool<StdVec<u64>, 4>| -> StdVec<Cidr> {
            p.sets().iter().map(CidrSet::cluster_cidr).collect()
        };
        let before = cidrs(&pool);
        for bad in [
            StdVec::from([Slot::Kept(0), Slot::Kept(0)]),
            StdVec::from([Slot::Kept(3)]),
            StdVec::from([Slot::Kept(0), Slot::New(set("10.0.128.0/17", 24))]),
            StdVec::new(),
        ] {
            assert!(pool.splice(bad).is_err());
            assert_eq!(cidrs(&pool), before, "a refused splice changes nothing");
        }
        pool.splice([
            Slot::New(set("10.2.0.0/16", 24)),
            Slot::Kept(1),
            Slot::Kept(2),
        ])
        .expect("splice");
        assert_eq!(
            cidrs(&pool),
            [cidr("10.2.0.0/16"), cidr("10.1.0.0/16"), cidr("fd00::/48")]
        );
        assert_eq!(
            pool.occupy(cidr("10.1.7.0/24")),
            Ok(0),
            "the kept set came with its allocations"
        );
        assert_eq!(
            pool.splice((0..5).map(|_| Slot::New(set("10.9.0.0/16", 24))))
                .err(),
            Some(AllocError::TooManyClusterCidrs { count: 5, max: 4 })
        );
    }

    #[test]
    fn from_sets_refuses_overlaps_too_many_and_none() {
        assert_eq!(
            Pool::<StdVec<u64>, 8>::from_sets([
                set("10.0.0.0/16", 24),
                set("fd00::/48", 64),
                set("10.0.128.0/17", 24)
            ])
            .err(),
            Some(AllocError::ClusterCidrsOverlap {
                first: cidr("10.0.0.0/16"),
                second: cidr("10.0.128.0/17"),
            })
        );
        assert_eq!(
            Pool::<StdVec<u64>, 2>::from_sets([
                set("10.0.0.0/16", 24),
                set("10.1.0.0/16", 24),
                set("10.2.0.0/16", 24)
            ])
            .err(),
            Some(AllocError::TooManyClusterCidrs { count: 3, max: 2 })
        );
        assert_eq!(
            Pool::<StdVec<u64>, 8>::from_sets(std::iter::empty()).err(),
            Some(AllocError::NoClusterCidr)
        );
        // Two of one family are fine through from_sets (Pool::new keeps refusing them).
        assert!(
            Pool::<StdVec<u64>, 2>::from_sets([set("10.0.0.0/16", 24), set("10.1.0.0/16", 24)])
                .is_ok()
        );
    }

    /// A service CIDR reserves its part of every cluster CIDR it overlaps; one that would fill
    /// any of them is refused before anything changes.
    #[test]
    fn service_cidr_is_reserved_in_every_set() {
        let mut pool = pool_of(&[
            ("10.0.0.0/24", 26),
            ("10.0.1.0/24", 26),
            ("10.0.2.0/24", 26),
        ]);
        // 10.0.0.0/23 covers the first two sets whole: it would fill the first.
        assert_eq!(
            pool.reserve_service_cidr(cidr("10.0.0.0/23")),
            Err(AllocError::ServiceCidrFillsClusterCidr {
                service_cidr: cidr("10.0.0.0/23"),
                cluster_cidr: cidr("10.0.0.0/24"),
            })
        );
        assert!(pool.sets().iter().all(|s| s.allocated_count() == 0));
        assert_eq!(pool.reserve_service_cidr(cidr("10.0.1.0/25")).unwrap(), 2);
        assert_eq!(pool.reserve_service_cidr(cidr("10.0.2.192/26")).unwrap(), 1);
        let counts: StdVec<u32> = pool.sets().iter().map(|s| s.allocated_count()).collect();
        assert_eq!(counts, [0, 2, 1]);
    }

    /// Node checks find the set a podCIDR lies in, whichever of the family's sets it is; one
    /// outside every set of its family names them all; a wide one is occupied in each set it
    /// overlaps.
    #[test]
    fn node_checks_across_sets() {
        let mut pool = pool_of(&[
            ("10.0.0.0/24", 26),
            ("10.0.1.0/24", 26),
            ("fd00::/120", 122),
        ]);
        assert_eq!(
            pool.check_node_within(&[cidr("10.0.1.64/26"), cidr("fd00::40/122")]),
            Ok(())
        );
        let outside = AllocError::OutsideClusterCidrs {
            cidr: cidr("10.9.0.0/26"),
            first: cidr("10.0.0.0/24"),
            last: cidr("10.0.1.0/24"),
            count: 2,
        };
        assert_eq!(pool.check_node(&[cidr("10.9.0.0/26")]), Err(outside));
        assert_eq!(
            std::format!("{outside}"),
            "10.9.0.0/26 is outside all 2 IPv4 cluster CIDRs (10.0.0.0/24, 10.0.1.0/24)"
        );
        assert_eq!(
            pool.check_node(&[cidr("fd01::/122")]),
            Err(AllocError::OutOfRange {
                cidr: cidr("fd01::/122"),
                cluster_cidr: cidr("fd00::/120"),
            })
        );
        assert_eq!(
            pool.check_node_within(&[cidr("10.0.0.0/23")]),
            Err(AllocError::WiderThanClusterCidr {
                cidr: cidr("10.0.0.0/23"),
                cluster_cidr: cidr("10.0.0.0/24"),
            })
        );
        assert_eq!(pool.set_index_of(cidr("10.0.1.128/26")), Some(1));
        assert_eq!(pool.occupy(cidr("10.0.0.0/23")).unwrap(), 8);
        assert_eq!(pool.release(cidr("10.0.1.0/24")).unwrap(), 4);
        assert_eq!(pool.release_blocks_at(0, 0, 3).unwrap(), 4);
        assert_eq!(pool.release_blocks_at(7, 0, 3).unwrap(), 0);
        assert!(pool.sets().iter().all(|s| s.allocated_count() == 0));
    }

    #[test]
    fn occupy_node_matches_by_family() {
        // k0s fixture 12: podCIDRs IPv6 first, against an IPv4-first config.
        let mut pool = Pool::new(set("10.244.0.0/16", 24), Some(set("fd00::/104", 110))).unwrap();
        let node = [cidr("fd00::/110"), cidr("10.244.0.0/24")];
        assert_eq!(pool.occupy_node(&node).unwrap(), 2);
        assert_eq!(pool.occupy_node(&node).unwrap(), 0, "idempotent");
        let next = pool.allocate_node().unwrap();
        assert_eq!(next[0].cidr, cidr("10.244.1.0/24"));
        assert_eq!(next[1].cidr, cidr("fd00::4:0/110"));
    }

    #[test]
    fn bad_node_cidrs_change_nothing() {
        let mut pool = Pool::new(set("10.244.0.0/16", 24), None).unwrap();
        let cases: &[(&[&str], AllocError)] = &[
            (
                &["10.244.0.0/24", "10.244.1.0/24"],
                AllocError::DuplicateFamily { family: Family::V4 },
            ),
            (
                &["10.244.0.0/24", "fd00::/64"],
                AllocError::NoClusterCidrForFamily {
                    cidr: cidr("fd00::/64"),
                },
            ),
            (
                &["10.32.0.0/24"],
                AllocError::OutOfRange {
                    cidr: cidr("10.32.0.0/24"),
                    cluster_cidr: cidr("10.244.0.0/16"),
                },
            ),
            (
                &["10.244.0.0/24", "10.244.1.0/24", "10.244.2.0/24"],
                AllocError::TooManyCidrs { count: 3 },
            ),
        ];
        for (cidrs, want) in cases {
            let parsed: StdVec<Cidr> = cidrs.iter().map(|c| cidr(c)).collect();
            assert_eq!(pool.occupy_node(&parsed), Err(*want), "{cidrs:?}");
            assert_eq!(pool.release_node(&parsed), Err(*want), "{cidrs:?}");
            assert_eq!(pool.sets()[0].allocated_count(), 0);
        }
        assert_eq!(
            Pool::new(set("10.0.0.0/16", 24), Some(set("10.1.0.0/16", 24))).err(),
            Some(AllocError::DuplicateFamily { family: Family::V4 })
        );
    }
}
