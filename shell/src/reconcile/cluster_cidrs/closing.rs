//! The holder rule and the closing fence of a ClusterCIDR's finalizer (issue 32 items 1 and 2).
//!
//! **The holder rule, one home.** A Node *holds a block of ClusterCIDR P* when one of the CIDRs the
//! allocator holds for it (its podCIDRs, a pending allocation, the reserved part of a skipped
//! Node's ranges) lies inside ([`Cidr::contains`]) one of P's hosted ranges or a range once hosted
//! under P's name ([`super::Hosting::retired`]). [`Allocator::pool_holders`] counts them; the
//! status (`Deleting, N Node(s)`) and the finalizer's removal both read that count.
//!
//! **The closing fence.** The writer counts the holders under the allocator's lock, then sends
//! the removal later (after the token bucket and the write gate), and the API server may apply it
//! later still (a queue, a slow etcd: any delay). So the count alone proves nothing at the commit.
//! What does: while a ClusterCIDR carrying our finalizer is being deleted (or is invalid), the
//! allocator hands out no block overlapping its ranges unless its [`Fence`] is
//! [`Fence::Fenced`] — nothing of ours that could remove the finalizer may land, and nothing an
//! earlier leader sent may either. The writer moves the fence under the same lock as the count:
//! a removal decided is [`Fence::Removing`] before the lock is released, and it stays so until its
//! outcome is known (an answer, or the object seen at another `resourceVersion` — the removal
//! tests the one it was decided on, and a `resourceVersion` once replaced never comes back). No
//! step waits for time to pass.

use std::collections::BTreeMap;

use nodeipam_core::Cidr;

use super::super::{Allocator, NodeName, RecordState};

/// Who holds a block of one ClusterCIDR ([`Allocator::pool_holders`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Holders {
    /// Nodes (records not gone) holding a CIDR inside one of its hosted ranges or a range retired
    /// under its name: the status's `N Node(s)`.
    pub records: usize,
    /// Of the Nodes the caller named as having a write whose outcome is unknown (it may still
    /// land), those whose reservation lies inside those ranges.
    pub in_doubt: usize,
    /// Nodes holding a CIDR inside a range retired under its name (hosted before its spec was
    /// edited through a CRD without our rules): what keeps an invalid object's finalizer.
    pub retired: usize,
}

impl Holders {
    /// Nobody holds a block and no write in doubt may put one there.
    pub fn none(&self) -> bool {
        self.records == 0 && self.in_doubt == 0 && self.retired == 0
    }
}

/// Whether a write that could take our finalizer off a closing ClusterCIDR may still land, as the
/// writer of this allocating term knows it. While it is anything but [`Fence::Fenced`], no block
/// overlapping the ClusterCIDR's ranges is handed out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fence {
    /// No write of this term has committed on the object since it was seen closing: a removal an
    /// earlier leader (or an earlier term of this process) sent may still land. The writer's
    /// next write to it is a `resourceVersion`-tested stamp of this term.
    Unfenced,
    /// This term's stamp is on the object as last observed, and no removal of ours is in flight
    /// or in doubt: every earlier write tests a `resourceVersion` that is gone, and a removal is
    /// decided only under the allocator's lock.
    Fenced,
    /// A removal of ours, testing `tested_rv`, was decided (always from [`Fence::Fenced`]) and its
    /// outcome is not known.
    Removing {
        /// The `resourceVersion` the removal's JSON patch tests.
        tested_rv: String,
    },
}

impl Fence {
    /// Whether blocks overlapping the ClusterCIDR's ranges may be handed out.
    pub fn lets_allocate(&self) -> bool {
        matches!(self, Fence::Fenced)
    }
}

impl Allocator {
    /// Who holds a block of ClusterCIDR `name` (see the module docs): `in_doubt` names the Nodes
    /// whose write may still land. All zero for a name the allocator never hosted.
    pub fn pool_holders(&self, name: &str, in_doubt: &[NodeName]) -> Holders {
        let retired: Vec<Cidr> = self.retired_ranges(name).collect();
        let all: Vec<Cidr> = self
            .hosted_ranges(name)
            .chain(retired.iter().copied())
            .collect();
        let inside = |held: &[Cidr], ranges: &[Cidr]| {
            held.iter()
                .any(|c| ranges.iter().any(|range| range.contains(c)))
        };
        let holding = |ranges: &[Cidr]| {
            self.nodes
                .values()
                .filter(|r| r.state != RecordState::Gone && inside(&r.held, ranges))
                .count()
        };
        Holders {
            records: if all.is_empty() { 0 } else { holding(&all) },
            in_doubt: in_doubt
                .iter()
                .filter(|n| self.held(n).is_some_and(|held| inside(held, &all)))
                .count(),
            retired: if retired.is_empty() {
                0
            } else {
                holding(&retired)
            },
        }
    }

    /// The ClusterCIDRs whose finalizer is closing: `closing` names every one that carries our
    /// finalizer and is being deleted or is invalid, in the caller's current view. A name new
    /// here starts [`Fence::Unfenced`]; a name no longer listed is forgotten (its object gone, or
    /// our finalizer off it). Returns whether allocation may now go where it could not.
    pub fn track_closing(&mut self, closing: &[String]) -> bool {
        let fences = &mut self.cluster_cidrs.fences;
        let mut opened = false;
        fences.retain(|name, fence| {
            let keep = closing.contains(name);
            opened |= !keep && !fence.lets_allocate();
            keep
        });
        for name in closing {
            fences.entry(name.clone()).or_insert(Fence::Unfenced);
        }
        opened
    }

    /// The fence of closing ClusterCIDR `name` (`None`: not closing).
    pub fn fence(&self, name: &str) -> Option<&Fence> {
        self.cluster_cidrs.fences.get(name)
    }

    /// Sets the fence of closing ClusterCIDR `name` (ignored for a name not closing). Returns
    /// whether allocation inside its ranges became allowed (the caller wakes waiting Nodes).
    pub fn set_fence(&mut self, name: &str, fence: Fence) -> bool {
        let Some(current) = self.cluster_cidrs.fences.get_mut(name) else {
            return false;
        };
        let opened = !current.lets_allocate() && fence.lets_allocate();
        *current = fence;
        opened
    }

    /// Every range no block may overlap now, with its ClusterCIDR's name: the hosted and retired
    /// ranges of each closing ClusterCIDR whose fence does not let allocation in.
    pub(super) fn closed_ranges(&self) -> Vec<(&str, Cidr)> {
        self.cluster_cidrs
            .fences
            .iter()
            .filter(|(_, fence)| !fence.lets_allocate())
            .flat_map(|(name, _)| {
                self.hosted_ranges(name)
                    .chain(self.retired_ranges(name))
                    .map(move |range| (name.as_str(), range))
            })
            .collect()
    }

    fn hosted_ranges(&self, name: &str) -> impl Iterator<Item = Cidr> + '_ {
        self.cluster_cidrs
            .get(name)
            .into_iter()
            .flat_map(|h| h.ranges.iter().map(|r| r.cidr()))
    }

    fn retired_ranges<'a>(&'a self, name: &'a str) -> impl Iterator<Item = Cidr> + 'a {
        self.cluster_cidrs
            .retired
            .iter()
            .filter(move |(n, _)| n == name)
            .map(|(_, range)| *range)
    }
}

/// The fences of the closing ClusterCIDRs, by name.
pub(super) type Fences = BTreeMap<String, Fence>;
