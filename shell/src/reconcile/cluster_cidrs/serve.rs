//! Allocation once ClusterCIDRs are hosted: a Node without podCIDRs tries its pools in
//! [`serving_order`]; each pool finds one block per family in its ranges (all or nothing), and
//! only when every family has one are the blocks taken.

use nodeipam_core::{AllocError, BlockAllocation, BlockRequest, Cidr, Placement, RangeCandidate};

use super::super::{Action, Allocator, Decision, Next, NodeView};
use crate::cluster_cidr::{FINALIZER, PoolChoice, serving_order};
use crate::node_pools::NodeMask;

/// Where one family's block would come from: the backing set, the range (flag index or
/// `(pool index, range index)`), and the candidate.
#[derive(Debug, Clone, Copy)]
struct Found {
    set_index: usize,
    range: RangeRef,
    candidate: RangeCandidate,
}

/// A range of [`super::Hosting`].
#[derive(Debug, Clone, Copy)]
enum RangeRef {
    Flag(usize),
    Pool(usize, usize),
}

impl Allocator {
    /// [`Allocator::allocate`] once ClusterCIDRs are hosted: the first pool of the Node's
    /// [`serving_order`] with a block in every family it has serves (for the flag CIDRs: sizes
    /// from the node-pool rules, placement and order as without ClusterCIDRs; for a ClusterCIDR:
    /// its own block size, round-robin within each range from the range's cursor). When none has,
    /// the Node waits with today's reason and event for the flag CIDRs, naming the ClusterCIDRs
    /// tried as well. An unusable mask label leaves the flag CIDRs out; the Node is refused for
    /// it only when no ClusterCIDR serves it either.
    pub(in super::super) fn allocate_through_pools(&mut self, node: &NodeView) -> Decision {
        let order: Vec<Option<usize>> = {
            let pools: Vec<_> = self
                .cluster_cidrs
                .hosted
                .iter()
                .map(|h| h.pool.clone())
                .collect();
            serving_order(&pools, &node.labels, &node.name)
                .into_iter()
                .map(|choice| match choice {
                    PoolChoice::Flags => None,
                    PoolChoice::ClusterCidr(pool) => pools.iter().position(|p| p.name == pool.name),
                })
                .collect()
        };
        let masks = self.sizing.resolve(&node.labels);
        let mut flag_error = None;
        let mut tried = Vec::new();
        for choice in order {
            let found = match (choice, &masks) {
                (Some(pool), _) => {
                    if let Some(hosted) = self.cluster_cidrs.hosted.get(pool) {
                        if hosted.pool.awaiting_finalizer {
                            return Self::wait_for_finalizer(&hosted.pool.name);
                        }
                        tried.push(hosted.pool.name.clone());
                    }
                    self.find_in_pool(pool).ok()
                }
                (None, Ok(masks)) => match self.find_in_flags(masks) {
                    Ok(found) => Some(found),
                    Err(error) => {
                        flag_error = Some(error);
                        None
                    }
                },
                (None, Err(_)) => None,
            };
            if let Some(found) = found {
                if let Some(closing) = self.closing_under(&found) {
                    return Self::wait_for_fence(&closing);
                }
                self.label_refusals.remove(&node.name);
                let blocks = self.take_found(&found);
                return self.assigned(node, &blocks);
            }
        }
        let masks = match masks {
            Ok(masks) => masks,
            Err(error) => return self.refuse_mask_label(node, &error.to_string()),
        };
        self.label_refusals.remove(&node.name);
        let also = if tried.is_empty() {
            String::new()
        } else {
            format!(
                "; no free block in ClusterCIDR(s) {} either (all or nothing within one)",
                tried.join(", ")
            )
        };
        let error = flag_error.unwrap_or(AllocError::NoClusterCidr);
        self.not_available(node, &error, &masks, &also)
    }

    /// A Node whose turn reaches a ClusterCIDR that does not carry the controller's finalizer yet
    /// waits for it (no event, no metric: the finalizer is the controller's next write), and is
    /// woken when the pool starts serving ([`super::ClusterCidrSync::capacity_added`]).
    fn wait_for_finalizer(pool: &str) -> Decision {
        Decision::new(Action::Fail {
            reason: format!(
                "ClusterCIDR {pool} comes first for this Node but does not carry the finalizer \
                 {FINALIZER} yet; waiting for it"
            ),
        })
        .then(Next::WaitForFreeBlock)
    }

    /// A Node whose block would overlap the ranges of a closing ClusterCIDR whose finalizer's
    /// removal may still land ([`super::Fence`]) waits until its outcome is known (no event, no
    /// metric: the writer's next answer or observation settles it) and is woken then. It does not
    /// pass on to a later pool: its answer stays the one it gets without the race.
    fn wait_for_fence(pool: &str) -> Decision {
        Decision::new(Action::Fail {
            reason: format!(
                "the block found overlaps ClusterCIDR {pool}, whose finalizer {FINALIZER} may be \
                 coming off (a removal in flight or in doubt, or not yet fenced in this term); \
                 waiting for its outcome"
            ),
        })
        .then(Next::WaitForFreeBlock)
    }

    /// The name of a closing ClusterCIDR one of `found`'s blocks overlaps ([`Allocator::closed_ranges`]).
    fn closing_under(&self, found: &[Found]) -> Option<String> {
        let closed = self.closed_ranges();
        if closed.is_empty() {
            return None;
        }
        found.iter().find_map(|one| {
            let set = self.pool.sets().get(one.set_index)?;
            let first = one.candidate.first_block_index();
            let last = first.checked_add(one.candidate.block_count().checked_sub(1)?)?;
            let (start, end) = (set.block_cidr(first).ok()?, set.block_cidr(last).ok()?);
            closed
                .iter()
                .find(|(_, range)| {
                    range.family() == start.family()
                        && start.network_bits() <= range.last_bits()
                        && range.network_bits() <= end.last_bits()
                })
                .map(|(name, _)| (*name).to_owned())
        })
    }

    /// One block per flag family, each from the family's first flag CIDR (flag order) with a
    /// free aligned block of the size asked: [`nodeipam_core::Pool::allocate_node_blocks`]'s
    /// rule, through the flag CIDRs' ranges.
    ///
    /// # Errors
    /// As `allocate_node_blocks`: [`AllocError::Exhausted`] naming the family's one flag CIDR or
    /// [`AllocError::ClusterCidrsExhausted`] for several; another error of the search as is.
    fn find_in_flags(&self, masks: &[NodeMask]) -> Result<Vec<Found>, AllocError> {
        let requests = self.flag_requests(masks);
        let mut found = Vec::new();
        for (family, request) in self.flag_families().into_iter().zip(requests) {
            let flags: Vec<(usize, Cidr)> = self
                .sizing
                .sets()
                .iter()
                .enumerate()
                .map(|(i, s)| (i, s.cluster_cidr))
                .filter(|(_, c)| c.family() == family)
                .collect();
            let mut hit = None;
            for (index, _) in &flags {
                match self.find_in_range(RangeRef::Flag(*index), request) {
                    Ok(one) => {
                        hit = Some(one);
                        break;
                    }
                    Err(AllocError::Exhausted { .. }) => {}
                    Err(error) => return Err(error),
                }
            }
            let Some(one) = hit else {
                return Err(match flags.as_slice() {
                    [(_, only)] => AllocError::Exhausted {
                        cluster_cidr: *only,
                    },
                    [(_, first), .., (_, last)] => AllocError::ClusterCidrsExhausted {
                        family,
                        first: *first,
                        last: *last,
                        count: u8::try_from(flags.len()).unwrap_or(u8::MAX),
                    },
                    [] => AllocError::NoClusterCidr,
                });
            };
            found.push(one);
        }
        Ok(found)
    }

    /// One block per range of hosted pool `pool`, in the flag CIDRs' family order (IPv4 first
    /// when the flags have no IPv6 first).
    ///
    /// # Errors
    /// The first range's search error (e.g. [`AllocError::Exhausted`] naming the range).
    fn find_in_pool(&self, pool: usize) -> Result<Vec<Found>, AllocError> {
        let hosted = self
            .cluster_cidrs
            .hosted
            .get(pool)
            .ok_or(AllocError::NoClusterCidr)?;
        let families = self.flag_families();
        let mut order: Vec<(usize, usize)> = hosted
            .ranges
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let rank = families
                    .iter()
                    .position(|f| *f == r.cidr().family())
                    .unwrap_or(families.len());
                (rank, i)
            })
            .collect();
        order.sort_unstable();
        order
            .into_iter()
            .map(|(_, i)| {
                let range = hosted.ranges.get(i).map(|r| r.cidr());
                let prefix_len = range.map_or(0, |r| hosted.pool.node_mask_size(r));
                let request = BlockRequest {
                    prefix_len,
                    placement: Placement::NextFromCursor,
                };
                self.find_in_range(RangeRef::Pool(pool, i), request)
            })
            .collect()
    }

    /// The candidate for `request` in range `range`, searched in the backing set it lies in.
    fn find_in_range(&self, range: RangeRef, request: BlockRequest) -> Result<Found, AllocError> {
        let pool_range = self.range(range).ok_or(AllocError::NoClusterCidr)?;
        let set_index = self
            .containing_set(pool_range.cidr())
            .ok_or(AllocError::NoClusterCidr)?;
        let set = self
            .pool
            .sets()
            .get(set_index)
            .ok_or(AllocError::NoClusterCidr)?;
        let candidate = set.find_block_within(&pool_range, request)?;
        Ok(Found {
            set_index,
            range,
            candidate,
        })
    }

    fn range(&self, range: RangeRef) -> Option<nodeipam_core::PoolRange> {
        match range {
            RangeRef::Flag(i) => self.cluster_cidrs.flag_ranges.get(i).copied(),
            RangeRef::Pool(p, i) => self
                .cluster_cidrs
                .hosted
                .get(p)
                .and_then(|h| h.ranges.get(i))
                .copied(),
        }
    }

    /// Takes every found block (one per family, in distinct sets or distinct families: none can
    /// be stale) and moves the ranges' cursors.
    fn take_found(&mut self, found: &[Found]) -> Vec<BlockAllocation> {
        let mut blocks = Vec::new();
        for one in found {
            let range = match one.range {
                RangeRef::Flag(i) => self.cluster_cidrs.flag_ranges.get_mut(i),
                RangeRef::Pool(p, i) => self
                    .cluster_cidrs
                    .hosted
                    .get_mut(p)
                    .and_then(|h| h.ranges.get_mut(i)),
            };
            let Some(range) = range else { continue };
            if let Ok(block) = self
                .pool
                .take_block_within_at(one.set_index, range, one.candidate)
            {
                blocks.push(block);
            }
        }
        blocks
    }
}
