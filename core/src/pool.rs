//! `Pool`: the allocator over all cluster CIDRs (one [`CidrSet`] per cluster CIDR, flag order).

use heapless::Vec;

use crate::cidr::{Cidr, Family};
use crate::cidr_set::{Allocation, BlockAllocation, BlockRequest, CidrSet};
use crate::error::AllocError;

/// The pod CIDRs allocated to one node: one [`Allocation`] per cluster CIDR, in the configured
/// (flag) order, so `allocations[0].cidr` is the node's `spec.podCIDR`.
pub type NodeAllocation = Vec<Allocation, 2>;

/// The pod CIDRs allocated to one node by [`Pool::allocate_node_blocks`]: one [`BlockAllocation`]
/// per cluster CIDR, flag order.
pub type NodeBlocks = Vec<BlockAllocation, 2>;

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

    /// Allocates one block per set, `requests[i]` from set `i` (flag order), each placed as
    /// [`CidrSet::allocate_block`] places it. All or nothing: every set is searched first and only
    /// then are the blocks taken, so if any set has no free aligned block of the requested size,
    /// no set changes (no block, no cursor). With each request's prefix length equal to its set's
    /// node mask size and [`crate::Placement::NextFromCursor`] this gives what
    /// [`Pool::allocate_node`] gives.
    ///
    /// # Errors
    /// [`AllocError::RequestCountMismatch`] unless there is one request per set; otherwise the
    /// first failing set's [`AllocError::InvalidBlockPrefixLen`] or [`AllocError::Exhausted`].
    pub fn allocate_node_blocks(
        &mut self,
        requests: &[BlockRequest],
    ) -> Result<NodeBlocks, AllocError> {
        if requests.len() != self.sets.len() {
            return Err(AllocError::RequestCountMismatch {
                requests: requests.len(),
                sets: self.sets.len(),
            });
        }
        let mut candidates: Vec<_, 2> = Vec::new();
        for (set, request) in self.sets.iter().zip(requests) {
            // At most two sets: the push cannot fail.
            let _ = candidates.push(set.find_block(*request)?);
        }
        let mut blocks = Vec::new();
        for (set, candidate) in self.sets.iter_mut().zip(candidates) {
            let _ = blocks.push(set.take_block(candidate));
        }
        Ok(blocks)
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

    /// Checks a node's podCIDRs as [`Pool::check_node`] does, then that each lies **within** its
    /// family's cluster CIDR: the rule for podCIDRs a node may keep. [`Pool::check_node`] accepts a
    /// podCIDR wider than its cluster CIDR (it overlaps the whole set, and upstream's
    /// `CidrSet.Occupy` occupies it), but such a podCIDR does not lie in the cluster CIDR. The
    /// [`Pool::check_node`] errors come first, so a node failing both gets that error.
    ///
    /// # Errors
    /// As [`Pool::check_node`]; then [`AllocError::WiderThanClusterCidr`] for the first podCIDR
    /// (in the node's order) whose prefix is shorter than its cluster CIDR's.
    pub fn check_node_within(&self, pod_cidrs: &[Cidr]) -> Result<(), AllocError> {
        self.check_node(pod_cidrs)?;
        for cidr in pod_cidrs {
            if let Some(set) = self.set_for(cidr.family())
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

    /// Releases blocks `first..=last` (block indices) of the set of `family`; see
    /// [`CidrSet::release_blocks`]. Returns blocks newly freed.
    ///
    /// # Errors
    /// [`AllocError::BlockIndexOutOfRange`] for a bad range; `Ok(0)` if no set has `family`.
    pub fn release_blocks(
        &mut self,
        family: Family,
        first: u32,
        last: u32,
    ) -> Result<u32, AllocError> {
        match self.set_for_mut(family) {
            Some(set) => set.release_blocks(first, last),
            None => Ok(0),
        }
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
