//! `Pool`: the allocator over all cluster CIDRs (one [`CidrSet`] per cluster CIDR, flag order).

use heapless::Vec;

use crate::cidr::{Cidr, Family};
use crate::cidr_set::{Allocation, CidrSet};
use crate::error::AllocError;

/// The pod CIDRs allocated to one node: one [`Allocation`] per cluster CIDR, in the configured
/// (flag) order, so `allocations[0].cidr` is the node's `spec.podCIDR`.
pub type NodeAllocation = Vec<Allocation, 2>;

/// The allocator for a whole cluster: one [`CidrSet`] per cluster CIDR — one for single-stack, one
/// IPv4 plus one IPv6 (either order) for dual-stack.
///
/// Every method is total and a method that returns `Err` changes nothing.
#[derive(Debug, Clone)]
pub struct Pool<S> {
    sets: Vec<CidrSet<S>, 2>,
}

impl<S: AsRef<[u64]> + AsMut<[u64]>> Pool<S> {
    /// Makes a pool from its sets, in flag order.
    ///
    /// # Errors
    /// [`AllocError::NoClusterCidr`] for no set; [`AllocError::DuplicateFamily`] if both sets have
    /// the same family (a dual-stack cluster has one IPv4 and one IPv6 cluster CIDR).
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

    /// The sets in flag order (1 or 2).
    pub fn sets(&self) -> &[CidrSet<S>] {
        &self.sets
    }

    /// The set for `family`, if one is configured.
    pub fn set_for(&self, family: Family) -> Option<&CidrSet<S>> {
        self.sets
            .iter()
            .find(|set| set.cluster_cidr().family() == family)
    }

    fn set_for_mut(&mut self, family: Family) -> Option<&mut CidrSet<S>> {
        self.sets
            .iter_mut()
            .find(|set| set.cluster_cidr().family() == family)
    }

    /// Whether the pool is dual-stack (two cluster CIDRs).
    pub fn is_dual_stack(&self) -> bool {
        self.sets.len() == 2
    }

    /// Allocates one block from every set, in flag order (round-robin within each set, as
    /// [`CidrSet::allocate_next`]). All or nothing: if any set is exhausted, no set changes.
    /// (Upstream's range allocator, on the second family's failure, releases the first block into
    /// the wrong set and leaks it; we check every set before touching any.)
    ///
    /// # Errors
    /// [`AllocError::Exhausted`] naming the first exhausted cluster CIDR.
    pub fn allocate_node(&mut self) -> Result<NodeAllocation, AllocError> {
        if let Some(full) = self.sets.iter().find(|set| set.free_count() == 0) {
            return Err(AllocError::Exhausted {
                cluster_cidr: full.cluster_cidr(),
            });
        }
        let mut allocations = Vec::new();
        for set in self.sets.iter_mut() {
            // free_count > 0 was checked for every set above, so this succeeds.
            let allocation = set.allocate_next()?;
            let _ = allocations.push(allocation);
        }
        Ok(allocations)
    }

    /// Checks a node's podCIDRs against the pool without changing anything: at most two, at most
    /// one per family, each matched to the set of **its family** (not its index: a node written
    /// IPv6-first is recognised against an IPv4-first config) and overlapping that cluster CIDR.
    ///
    /// # Errors
    /// [`AllocError::TooManyCidrs`], [`AllocError::DuplicateFamily`],
    /// [`AllocError::NoClusterCidrForFamily`], [`AllocError::OutOfRange`].
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
            let set = self
                .set_for(cidr.family())
                .ok_or(AllocError::NoClusterCidrForFamily { cidr: *cidr })?;
            set.block_range(*cidr)?;
        }
        Ok(())
    }

    /// Occupies a node's existing podCIDRs (start-up sync, or a node seen with CIDRs already set).
    /// Checked first as [`Pool::check_node`]; then each CIDR is occupied in its family's set.
    /// Returns the number of blocks that were free before (0 when already occupied: idempotent).
    ///
    /// # Errors
    /// As [`Pool::check_node`]; nothing changes.
    pub fn occupy_node(&mut self, pod_cidrs: &[Cidr]) -> Result<u32, AllocError> {
        self.check_node(pod_cidrs)?;
        let mut changed = 0;
        for cidr in pod_cidrs {
            if let Some(set) = self.set_for_mut(cidr.family()) {
                changed += set.occupy(*cidr)?;
            }
        }
        Ok(changed)
    }

    /// Releases a node's podCIDRs (the node is gone). Checked as [`Pool::check_node`]. Returns the
    /// number of blocks that were allocated before.
    ///
    /// # Errors
    /// As [`Pool::check_node`]; nothing changes.
    pub fn release_node(&mut self, pod_cidrs: &[Cidr]) -> Result<u32, AllocError> {
        self.check_node(pod_cidrs)?;
        let mut changed = 0;
        for cidr in pod_cidrs {
            if let Some(set) = self.set_for_mut(cidr.family()) {
                changed += set.release(*cidr)?;
            }
        }
        Ok(changed)
    }

    /// Occupies one CIDR in the set of its family (for reserving the part of a bad node's range
    /// that overlaps ours). Returns blocks newly occupied.
    ///
    /// # Errors
    /// [`AllocError::NoClusterCidrForFamily`] or [`AllocError::OutOfRange`]; nothing changes.
    pub fn occupy(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        self.set_for_mut(cidr.family())
            .ok_or(AllocError::NoClusterCidrForFamily { cidr })?
            .occupy(cidr)
    }

    /// Releases one CIDR in the set of its family. Returns blocks newly freed.
    ///
    /// # Errors
    /// [`AllocError::NoClusterCidrForFamily`] or [`AllocError::OutOfRange`]; nothing changes.
    pub fn release(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        self.set_for_mut(cidr.family())
            .ok_or(AllocError::NoClusterCidrForFamily { cidr })?
            .release(cidr)
    }

    /// Reserves the part of each cluster CIDR that a service CIDR overlaps, so no node gets a block
    /// holding service IPs (kube-controller-manager does this with `--service-cluster-ip-range`).
    /// A service CIDR of a family with no set, or overlapping nothing, reserves nothing: `Ok(0)`.
    /// Returns the number of blocks newly reserved.
    ///
    /// # Errors
    /// [`AllocError::ServiceCidrFillsClusterCidr`] if the reservation would leave that set with no
    /// free block — a configuration error to report at start-up; nothing changes.
    pub fn reserve_service_cidr(&mut self, service_cidr: Cidr) -> Result<u32, AllocError> {
        let Some(set) = self.set_for_mut(service_cidr.family()) else {
            return Ok(0);
        };
        let Ok((begin, end)) = set.block_range(service_cidr) else {
            return Ok(0);
        };
        let span = end - begin + 1;
        let free_in_range = span - set.allocated_in(service_cidr)?;
        if free_in_range >= set.free_count() {
            return Err(AllocError::ServiceCidrFillsClusterCidr {
                service_cidr,
                cluster_cidr: set.cluster_cidr(),
            });
        }
        set.occupy(service_cidr)
    }
}
