//! The allocator's ClusterCIDR pools (issue 18 §2): [`Allocator::sync_cluster_cidrs`] takes the
//! watch's whole view of the ClusterCIDR objects, [`Allocator::cluster_cidr_state`] says what
//! each one's `status` should show.
//!
//! **One address space, several pools.** The allocator's [`nodeipam_core::Pool`] holds, per
//! family, a list of disjoint *backing sets* ([`nodeipam_core::CidrSet`]). Every pool — each
//! `--cluster-cidr` entry and each ClusterCIDR range — is a [`PoolRange`] (its CIDR and its own
//! round-robin cursor) inside exactly one backing set, so pools that overlap share one bitmap and
//! no address is handed out twice, whichever pool it is taken through. A ClusterCIDR range:
//! - inside a backing set: a range on it; when its blocks are finer than the set's grid, the set
//!   is re-gridded (a new set on the finer grid, [`nodeipam_core::CidrSet::occupy_allocations_of`]
//!   carrying every allocated address over; a coarse block held only for finer CIDRs — a Node's
//!   /26 on a /24 grid — is refined to them, one left whole when nothing the allocator holds
//!   explains it);
//! - a supernet of backing sets, or disjoint from all: a new set covering it, on the finest grid
//!   of the sets it contains and its own block size, with their allocations carried over.
//!
//! Service CIDRs are reserved in every new set they overlap. Sets never shrink while running: a
//! set created for a ClusterCIDR stays while any range lies in it or any Node holds a block in
//! it, and a re-gridded set keeps its finer grid, until restart. Without any ClusterCIDR the flag
//! CIDRs' sets are exactly today's (one per entry, on the node-pool grid) and allocation takes
//! today's path; from the first ClusterCIDR hosted on, the flag CIDRs are allocated through their
//! ranges as well (a range equal to its set with the set's cursor allocates what the set's own
//! search allocates), until restart.
//!
//! **"A Node holds a block from a ClusterCIDR"** means one of the CIDRs the allocator holds for it
//! (its podCIDRs, a pending allocation, or the reserved part of a skipped Node's ranges) lies
//! inside one of the ClusterCIDR's ranges. It is the only rule that survives a restart, since a
//! podCIDR does not name the pool it came from; so where ClusterCIDRs overlap (a selector pool
//! inside a fallback one), a block of the inner one counts for both. The finalizer rule (remove
//! it when no Node holds a block) uses it.
//!
//! **Which pool serves a Node** without podCIDRs: [`crate::cluster_cidr::serving_order`]; the first
//! pool that has a block in every family it has gives one block per family (all or nothing within
//! one ClusterCIDR). A ClusterCIDR with one family gives a single-family Node, as upstream's
//! `MultiCIDRRangeAllocator` did, even in a dual-stack cluster: the operator chose its ranges.

use nodeipam_core::{AllocError, Cidr, CidrSet, MAX_BLOCK_BITS, PoolRange};

use super::{Allocator, RecordState};
use crate::cluster_cidr::ClusterCidrPool;
use crate::cluster_cidr::status::{FamilyUsage, PoolState};

mod closing;
mod serve;
mod space;

pub use closing::{Fence, Holders};

/// At most this many backing sets (flag CIDRs and ClusterCIDRs together, after merging nested
/// ones): the allocator's [`nodeipam_core::Pool`] capacity. A ClusterCIDR that would need more is
/// refused (its `Invalid` condition says so).
pub const MAX_BACKING_SETS: usize = 64;

/// What [`Allocator::sync_cluster_cidrs`] changed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterCidrSync {
    /// ClusterCIDRs now hosted that were not before (name order).
    pub added: Vec<String>,
    /// ClusterCIDRs no longer hosted (name order). What Nodes hold from them stays theirs.
    pub removed: Vec<String>,
    /// ClusterCIDRs valid as objects that the allocator cannot host, with the message for their
    /// `Invalid` condition (e.g. a range whose blocks would cut a backing set into more than
    /// 2^24 blocks, or more than [`MAX_BACKING_SETS`] sets). Listed on every sync they are
    /// refused in; tried again on the next.
    pub refused: Vec<(String, String)>,
    /// New free capacity appeared (a ClusterCIDR that serves new Nodes was hosted, or a hosted
    /// one started serving: its finalizer seen), or a ClusterCIDR Nodes may be waiting for (its
    /// finalizer not seen yet) went away or started being deleted, so their serving order now
    /// passes it by: the controller wakes the Nodes waiting for a block.
    pub capacity_added: bool,
    /// Skipped Nodes (e.g. out of range) whose podCIDRs now overlap a backing set: what overlaps
    /// is now reserved for them; the controller decides them again (they may now be kept).
    pub recheck: Vec<String>,
}

/// One hosted ClusterCIDR.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct HostedPool {
    pub(super) pool: ClusterCidrPool,
    /// One per family the pool has, IPv4 first.
    pub(super) ranges: Vec<PoolRange>,
}

/// The allocator's hosting: the ClusterCIDRs it hosts (and the flag CIDRs' ranges once one is),
/// their fences and retired ranges. One word per thing: a *flag CIDR* is a `--cluster-cidr`
/// entry, a *ClusterCIDR* an object, a *backing set* a `CidrSet` of the allocator's pool.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct Hosting {
    /// Allocation goes through ranges (set when the first ClusterCIDR is hosted; until restart).
    pub(super) active: bool,
    /// One range per flag cluster CIDR ([`crate::node_pools::Sizing::sets`] order); used only
    /// when `active`.
    pub(super) flag_ranges: Vec<PoolRange>,
    /// Hosted ClusterCIDRs, name order.
    pub(super) hosted: Vec<HostedPool>,
    /// The pools of `hosted`, same order: the slice [`crate::cluster_cidr::serving_order`]
    /// takes, kept so that a Node's allocation does not copy every pool.
    pub(super) pools: Vec<ClusterCidrPool>,
    /// Refused at the last sync: name and message.
    pub(super) refused: Vec<(String, String)>,
    /// Ranges once hosted under a name that no longer hosts them (the object gone, or its spec
    /// edited in place through a CRD without the `self == oldSelf` rule), kept while a Node holds
    /// a block inside them: they count for [`Allocator::cluster_cidr_state`]'s holders of a pool
    /// of that name, so its finalizer stays until those Nodes leave too.
    pub(super) retired: Vec<(String, Cidr)>,
    /// The closing ClusterCIDRs' fences ([`Allocator::track_closing`]): no block overlapping the
    /// ranges of one that is not [`Fence::Fenced`] is handed out.
    pub(super) fences: closing::Fences,
}

impl Hosting {
    /// Every range (flag CIDRs' and ClusterCIDRs'), for re-scaling cursors when sets change.
    fn ranges_mut(&mut self) -> impl Iterator<Item = &mut PoolRange> {
        self.flag_ranges
            .iter_mut()
            .chain(self.hosted.iter_mut().flat_map(|h| h.ranges.iter_mut()))
    }

    /// The hosted ClusterCIDR `name`.
    pub(super) fn get(&self, name: &str) -> Option<&HostedPool> {
        self.hosted.iter().find(|h| h.pool.name == name)
    }
}

/// Whether two pools are hosted alike (same ranges and block size; selector and deletion may
/// differ and are taken over without touching the sets).
fn same_hosting(a: &ClusterCidrPool, b: &ClusterCidrPool) -> bool {
    a.ipv4 == b.ipv4 && a.ipv6 == b.ipv6 && a.per_node_host_bits == b.per_node_host_bits
}

impl Allocator {
    /// Replaces the allocator's ClusterCIDR pools with `pools`: the watch's whole current view,
    /// each already read with [`ClusterCidrPool::from_object`] (invalid objects left out by the
    /// caller). Idempotent: the same input again changes no pool (refused ones are listed again;
    /// a removed pool's backing set whose last Node has gone since is dropped). A name given twice
    /// counts once (the first). Pools are hosted in name order, those whose finalizer was seen
    /// first (`awaiting_finalizer` false: hosted before), each all or nothing across its
    /// families. Call it before [`Allocator::startup_occupy`], so the podCIDRs inside ClusterCIDR
    /// ranges are occupied there rather than skipped as out of range (if it comes later, those
    /// Nodes are listed in [`ClusterCidrSync::recheck`]).
    ///
    /// Never changes what any Node holds: a pool removed (or being deleted) keeps every block its
    /// Nodes hold, and its backing set stays while any Node holds a block in it (see the module
    /// docs). Skipped Nodes whose podCIDRs overlap a new set get that part reserved and are listed
    /// in [`ClusterCidrSync::recheck`].
    pub fn sync_cluster_cidrs(&mut self, pools: &[ClusterCidrPool]) -> ClusterCidrSync {
        let mut wanted: Vec<&ClusterCidrPool> = Vec::new();
        for pool in pools {
            if !wanted.iter().any(|w| w.name == pool.name) {
                wanted.push(pool);
            }
        }
        wanted.sort_by(|a, b| a.name.cmp(&b.name));
        let mut sync = ClusterCidrSync::default();
        // A hosted pool that starts serving (its finalizer seen) brings capacity too; one that
        // Nodes may wait for (no finalizer yet) and that goes or starts being deleted lets them
        // go on to the next pool (the model check found them waiting for good).
        let mut started_serving = false;
        let waited_for = |pool: &ClusterCidrPool| pool.awaiting_finalizer && !pool.deleting;
        // Removed, or re-created with other ranges: the old one goes first.
        let before = std::mem::take(&mut self.cluster_cidrs.hosted);
        for hosted in before {
            match wanted.iter().find(|w| w.name == hosted.pool.name) {
                Some(w) if same_hosting(w, &hosted.pool) => {
                    started_serving |= w.serves_new_nodes() && !hosted.pool.serves_new_nodes();
                    started_serving |= waited_for(&hosted.pool) && w.deleting;
                    self.cluster_cidrs.hosted.push(HostedPool {
                        pool: (*w).clone(),
                        ranges: hosted.ranges,
                    });
                }
                _ => {
                    started_serving |= waited_for(&hosted.pool);
                    let name = &hosted.pool.name;
                    for range in &hosted.ranges {
                        let entry = (name.clone(), range.cidr());
                        if !self.cluster_cidrs.retired.contains(&entry) {
                            self.cluster_cidrs.retired.push(entry);
                        }
                    }
                    sync.removed.push(name.clone());
                }
            }
        }
        self.retire_unheld();
        // Before hosting: a set freed by a removal makes room in this very sync (a pool refused
        // for `MAX_BACKING_SETS` may get no other event to be tried again).
        self.drop_unused_sets();
        self.cluster_cidrs.refused.clear();
        // Pools carrying our finalizer first: they were hosted before (a refused pool never gets
        // it), so a restart hosts them again even where a later-named pool was refused for
        // `MAX_BACKING_SETS` while running (hosting it instead would leave their Nodes out of
        // range and take their finalizer off). Stable: name order within each group.
        let mut to_host = wanted.clone();
        to_host.sort_by_key(|pool| pool.awaiting_finalizer);
        for pool in to_host {
            if self.cluster_cidrs.get(&pool.name).is_some() {
                continue;
            }
            self.activate_ranges();
            match self.host(pool) {
                Ok(()) => sync.added.push(pool.name.clone()),
                Err(error) => sync.refused.push((
                    pool.name.clone(),
                    format!("cannot be hosted by the allocator: {error}"),
                )),
            }
        }
        self.cluster_cidrs
            .hosted
            .sort_by(|a, b| a.pool.name.cmp(&b.pool.name));
        sync.removed.sort();
        self.cluster_cidrs.pools = self
            .cluster_cidrs
            .hosted
            .iter()
            .map(|h| h.pool.clone())
            .collect();
        self.cluster_cidrs.refused = sync.refused.clone();
        let added_serving = sync.added.iter().any(|name| {
            self.cluster_cidrs
                .get(name)
                .is_some_and(|h| h.pool.serves_new_nodes())
        });
        sync.capacity_added = added_serving || started_serving;
        if !sync.added.is_empty() {
            sync.recheck = self.reserve_for_skipped();
        }
        sync
    }

    /// Per ClusterCIDR name: its [`PoolState`] for [`crate::cluster_cidr::status`] — per family the
    /// blocks of the pool's own size in its range (capacity, used = not entirely free, free), and
    /// for a pool being deleted the number of Nodes holding a block inside its ranges (see the
    /// module docs); [`PoolState::Invalid`] for one refused at the last sync; `None` for a name
    /// the allocator does not know.
    pub fn cluster_cidr_state(&self, name: &str) -> Option<PoolState> {
        if let Some((_, message)) = self.cluster_cidrs.refused.iter().find(|(n, _)| n == name) {
            return Some(PoolState::Invalid {
                message: message.clone(),
            });
        }
        let hosted = self.cluster_cidrs.get(name)?;
        let usage = hosted
            .ranges
            .iter()
            .map(|range| (range.cidr().family(), self.range_usage(&hosted.pool, range)))
            .collect();
        Some(if hosted.pool.deleting {
            PoolState::Deleting {
                usage,
                holders: self.pool_holders(name, &[]).records,
            }
        } else {
            PoolState::Serving { usage }
        })
    }

    /// Whether the last [`Allocator::sync_cluster_cidrs`] refused a ClusterCIDR (the controller
    /// then offers the view again on its next round: a Node leaving may have freed a set).
    pub fn cluster_cidrs_refused(&self) -> bool {
        !self.cluster_cidrs.refused.is_empty()
    }

    /// Names of the hosted ClusterCIDRs, name order.
    pub fn cluster_cidr_names(&self) -> Vec<String> {
        self.cluster_cidrs
            .hosted
            .iter()
            .map(|h| h.pool.name.clone())
            .collect()
    }

    /// The hosted ClusterCIDR pools, name order (as last given to
    /// [`Allocator::sync_cluster_cidrs`]).
    pub fn cluster_cidr_pools(&self) -> Vec<&ClusterCidrPool> {
        self.cluster_cidrs.hosted.iter().map(|h| &h.pool).collect()
    }

    /// Capacity / used / free of one range in blocks of the pool's own size.
    fn range_usage(&self, pool: &ClusterCidrPool, range: &PoolRange) -> FamilyUsage {
        let mask = pool.node_mask_size(range.cidr());
        let bits = mask
            .saturating_sub(range.cidr().prefix_len())
            .min(MAX_BLOCK_BITS);
        let capacity = 1u64 << bits;
        let free = self
            .containing_set(range.cidr())
            .and_then(|i| self.pool.sets().get(i))
            .and_then(|set| set.free_blocks_within(range, mask).ok())
            .map_or(0, u64::from);
        FamilyUsage {
            capacity,
            used: capacity.saturating_sub(free),
            free,
        }
    }

    /// Whether `cidr` lies inside a hosted ClusterCIDR's range and has that pool's block size
    /// (a block the pool may have handed out: its size differs from the flags' on purpose).
    pub(super) fn is_cluster_cidr_block(&self, cidr: Cidr) -> bool {
        self.cluster_cidr_block_of(cidr).is_some()
    }

    /// The hosted ClusterCIDR (first in name order) one of whose ranges `cidr` lies in with that
    /// pool's block size: the pool a block of that size there was taken through.
    pub fn cluster_cidr_block_of(&self, cidr: Cidr) -> Option<String> {
        self.cluster_cidrs
            .hosted
            .iter()
            .find(|h| {
                h.ranges.iter().any(|r| {
                    r.cidr().contains(&cidr) && h.pool.node_mask_size(r.cidr()) == cidr.prefix_len()
                })
            })
            .map(|h| h.pool.name.clone())
    }

    /// The index of the backing set `cidr` lies inside, if any.
    pub(super) fn containing_set(&self, cidr: Cidr) -> Option<usize> {
        self.pool
            .sets()
            .iter()
            .position(|set| set.cluster_cidr().contains(&cidr))
    }

    /// Forgets the retired ranges no Node (not gone) holds a block inside any more.
    fn retire_unheld(&mut self) {
        let nodes = &self.nodes;
        self.cluster_cidrs.retired.retain(|(_, range)| {
            nodes
                .values()
                .any(|r| r.state != RecordState::Gone && r.held.iter().any(|c| range.contains(c)))
        });
    }

    /// Before the first ClusterCIDR is hosted: one range per flag CIDR with its set's cursor, so
    /// allocation through the ranges continues today's round-robin where it stands.
    fn activate_ranges(&mut self) {
        if self.cluster_cidrs.active {
            return;
        }
        self.cluster_cidrs.flag_ranges = self
            .pool
            .sets()
            .iter()
            .map(|set| PoolRange::with_cursor(set.cluster_cidr(), set.next_candidate()))
            .collect();
        self.cluster_cidrs.active = true;
    }

    /// Hosts `pool` (all or nothing): plans the change of the backing sets for each of its
    /// ranges, then installs them.
    fn host(&mut self, pool: &ClusterCidrPool) -> Result<(), AllocError> {
        // Counted before any set is built: a refused pool is offered again on every round of the
        // controller, and a new set may be a 2 MiB bitmap (2^24 blocks).
        let count = self.sets_after_hosting(pool);
        if count > MAX_BACKING_SETS {
            return Err(AllocError::TooManyClusterCidrs {
                count,
                max: MAX_BACKING_SETS,
            });
        }
        let mut ranges = Vec::new();
        // What the records hold and the service CIDRs: what every allocated block stands for.
        let known: Vec<Cidr> = self
            .nodes
            .values()
            .flat_map(|r| r.held.iter().copied())
            .chain(self.service_cidrs.iter().copied())
            .collect();
        // Planned on the sets as they are (one range per family: the changes are disjoint), and
        // installed all or nothing without copying a set kept: hosting costs the sets it
        // touches, so hosting n pools grows linearly in n (issue 32 item 8).
        let mut changes = Vec::new();
        for range in [pool.ipv4, pool.ipv6].into_iter().flatten() {
            let planned = space::plan_range(
                self.pool.sets(),
                range,
                pool.node_mask_size(range),
                &self.service_cidrs,
                &known,
            )?;
            changes.extend(planned);
            ranges.push(PoolRange::new(range));
        }
        if !changes.is_empty() {
            let count = self.pool.sets().len();
            self.install_sets(space::slots(count, changes))?;
        }
        self.cluster_cidrs.hosted.push(HostedPool {
            pool: pool.clone(),
            ranges,
        });
        Ok(())
    }

    /// How many backing sets there would be with `pool` hosted, by [`space::plan_range`]'s rule
    /// on the CIDRs alone: a range inside a set adds none, any other replaces the sets inside it
    /// with one.
    fn sets_after_hosting(&self, pool: &ClusterCidrPool) -> usize {
        let mut cidrs: Vec<Cidr> = self.pool.sets().iter().map(CidrSet::cluster_cidr).collect();
        for range in [pool.ipv4, pool.ipv6].into_iter().flatten() {
            if !cidrs.iter().any(|set| set.contains(&range)) {
                cidrs.retain(|set| !range.contains(set));
                cidrs.push(range);
            }
        }
        cidrs.len()
    }

    /// Replaces the backing sets with `slots` ([`nodeipam_core::Pool::splice`]: kept sets moved,
    /// not copied; checked disjoint and at most [`MAX_BACKING_SETS`]), re-scaling every range's
    /// cursor to its new set's grid.
    fn install_sets(
        &mut self,
        slots: Vec<nodeipam_core::Slot<Vec<u64>>>,
    ) -> Result<(), AllocError> {
        // Only a range inside a new set can change grid: the others keep their set.
        let new: Vec<(Cidr, u8)> = slots
            .iter()
            .filter_map(|slot| match slot {
                nodeipam_core::Slot::New(set) => Some((set.cluster_cidr(), set.node_mask_size())),
                nodeipam_core::Slot::Kept(_) => None,
            })
            .collect();
        let old: Vec<(Cidr, u8)> = self
            .pool
            .sets()
            .iter()
            .map(|s| (s.cluster_cidr(), s.node_mask_size()))
            .collect();
        self.pool.splice(slots)?;
        let grid_of = |table: &[(Cidr, u8)], cidr: Cidr| {
            table
                .iter()
                .find(|(set, _)| set.contains(&cidr))
                .map(|(_, grid)| *grid)
        };
        for range in self.cluster_cidrs.ranges_mut() {
            let Some(after) = grid_of(&new, range.cidr()) else {
                continue;
            };
            if let Some(before) = grid_of(&old, range.cidr())
                && after > before
            {
                let cursor = range.cursor().checked_shl(u32::from(after - before));
                *range = PoolRange::with_cursor(range.cidr(), cursor.unwrap_or(0));
            }
        }
        Ok(())
    }

    /// Drops the backing sets no range lies in and no record holds a block in (a removed pool's
    /// set once its last Node is gone; its only content is then service CIDR reservations).
    fn drop_unused_sets(&mut self) {
        let ranges: Vec<Cidr> = self
            .cluster_cidrs
            .flag_ranges
            .iter()
            .chain(
                self.cluster_cidrs
                    .hosted
                    .iter()
                    .flat_map(|h| h.ranges.iter()),
            )
            .map(PoolRange::cidr)
            .collect();
        let used = |set: &CidrSet<Vec<u64>>| {
            let cidr = set.cluster_cidr();
            ranges.iter().any(|r| cidr.contains(r))
                || self
                    .nodes
                    .values()
                    .any(|record| record.held.iter().any(|c| c.overlaps(&cidr)))
        };
        // Decided first: every watch event syncs, and the sets may be megabytes each (a
        // 2^24-block pool's bitmap is 2 MiB); the kept ones are moved, never copied.
        if !self.cluster_cidrs.active || self.pool.sets().iter().all(used) {
            return;
        }
        let keep: Vec<nodeipam_core::Slot<Vec<u64>>> = self
            .pool
            .sets()
            .iter()
            .enumerate()
            .filter(|(_, s)| used(s))
            .map(|(i, _)| nodeipam_core::Slot::Kept(i))
            .collect();
        if !keep.is_empty() {
            // Fewer disjoint sets than before: cannot fail.
            let _ = self.install_sets(keep);
        }
    }

    /// After sets were added: every skipped record's podCIDRs are occupied where they overlap a
    /// set (as [`Allocator::startup_occupy`] reserves a skipped Node's ranges) and the part is
    /// added to what the record holds. Returns the names whose holdings grew.
    fn reserve_for_skipped(&mut self) -> Vec<String> {
        let mut grown = Vec::new();
        let names: Vec<super::NodeName> = self
            .nodes
            .iter()
            .filter(|(_, r)| matches!(r.state, RecordState::Skipped(_)))
            .map(|(name, _)| name.clone())
            .collect();
        for name in names {
            let Some(record) = self.nodes.get(&name) else {
                continue;
            };
            let RecordState::Skipped(info) = &record.state else {
                continue;
            };
            let new: Vec<Cidr> = info
                .raw
                .iter()
                .filter_map(|text| Cidr::parse_pod_cidr(text).ok().map(|(c, _)| c))
                .filter(|c| !record.held.contains(c))
                .filter(|c| self.pool.set_index_of(*c).is_some())
                .collect();
            if new.is_empty() {
                continue;
            }
            for cidr in &new {
                let _ = self.pool.occupy(*cidr);
            }
            if let Some(record) = self.nodes.get_mut(&name) {
                let mut held = record.held.to_vec();
                held.extend(new);
                record.held = held.into_boxed_slice();
            }
            self.holdings_generation = self.holdings_generation.wrapping_add(1);
            grown.push(name.to_string());
        }
        grown.sort();
        grown
    }
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod finalizer_tests;

#[cfg(test)]
mod model_tests;

#[cfg(test)]
mod dual_stack_model_tests;

#[cfg(test)]
mod hostile_objects_tests;
