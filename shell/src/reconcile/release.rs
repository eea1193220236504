//! Release: a Node gone, or a reservation that can never be written, gives its blocks back —
//! except blocks another Node's podCIDR or a service CIDR still overlaps.

use nodeipam_core::Cidr;

#[cfg(doc)]
use super::Next;
use super::{Action, Allocator, Decision, MetricEvent, NodeRecord, RecordState, informer_behind};

impl Allocator {
    /// Node `name` is gone (the informer delivered its deletion, or it is no longer listed):
    /// releases every block it held, except blocks another Node's podCIDR or a service CIDR still
    /// overlaps. Unknown names release nothing.
    ///
    /// With the deletion quarantine on ([`Allocator::set_deletion_quarantine`]), a Node that held
    /// its podCIDRs (`RecordState::Held`) releases nothing yet: its blocks stay reserved for its
    /// name ([`Action::Quarantined`], [`Next::EndQuarantine`]), and the next `remove` of the name
    /// (the shell's timer) releases them. A Node of the name seen meanwhile ends the quarantine
    /// its own way (keeps or gets back the blocks, or releases them), and so does another Node
    /// that shows podCIDRs overlapping them (see `Allocator::observe_existing`).
    ///
    /// While the record is ahead of the informer (decided on a newer answer of the API server),
    /// the deletion may be of an earlier object of the name: nothing is released, and the
    /// decision says to check with a GET ([`super::Next::Reread`], then [`Allocator::object_gone`] on
    /// 404).
    pub fn remove(&mut self, name: &str) -> Decision {
        if self
            .nodes
            .get(name)
            .is_some_and(|r| r.ahead_of_informer && r.state != RecordState::Gone)
        {
            return informer_behind();
        }
        if let Some(decision) = self.quarantine(name) {
            return decision;
        }
        self.release_record(name)
    }

    /// Forgets `name`'s record and releases what it held (see [`Allocator::remove`]).
    pub(super) fn release_record(&mut self, name: &str) -> Decision {
        let held = self
            .nodes
            .get(name)
            .filter(|r| r.state != RecordState::Gone)
            .map(|r| r.held.to_vec())
            .unwrap_or_default();
        let metrics = self.forget(name);
        self.label_refusals.remove(name);
        Decision::new(Action::Released { pod_cidrs: held }).after_metrics(metrics)
    }

    /// The API server says the Node object `uid` of this name is gone (a GET or PATCH got 404, or
    /// the name now belongs to another object) although the informer may still show it: releases
    /// its blocks (writes pinned to that uid can never apply) and remembers the object as gone, so
    /// the informer's stale copy gets nothing allocated.
    pub fn object_gone(&mut self, name: &str, uid: Option<&str>) -> Decision {
        let decision = self.release_record(name);
        self.put(
            name.into(),
            NodeRecord {
                held: Box::default(),
                state: RecordState::Gone,
                uid: uid.map(Into::into),
                ahead_of_informer: false,
                served: true,
            },
        );
        decision
    }

    /// Removes `name`'s record and releases what it held; returns the release metrics.
    pub(super) fn forget(&mut self, name: &str) -> Vec<MetricEvent> {
        match self.take(name) {
            Some(record) => self.release_cidrs(&record.held),
            None => Vec::new(),
        }
    }

    /// Releases `cidrs` (already removed from the index) except for blocks that another record or
    /// a service CIDR still overlaps. Returns one metric per cluster CIDR that freed blocks.
    fn release_cidrs(&mut self, cidrs: &[Cidr]) -> Vec<MetricEvent> {
        let mut metrics: Vec<MetricEvent> = Vec::new();
        // Each cluster CIDR a CIDR overlaps (one, unless it is wider than a cluster CIDR).
        let overlapping: Vec<(usize, Cidr)> = cidrs
            .iter()
            .flat_map(|cidr| {
                self.pool
                    .sets()
                    .iter()
                    .enumerate()
                    .filter(move |(_, set)| set.cluster_cidr().overlaps(cidr))
                    .map(move |(index, _)| (index, *cidr))
            })
            .collect();
        for (set_index, cidr) in &overlapping {
            let Some(set) = self.pool.sets().get(*set_index) else {
                continue;
            };
            let Ok((begin, end)) = set.block_range(*cidr) else {
                continue;
            };
            let cluster_cidr = set.cluster_cidr();
            let mut covered: Vec<(u32, u32)> = self
                .nodes
                .values()
                .flat_map(|r| r.held.iter())
                .chain(self.service_cidrs.iter())
                .filter(|c| c.family() == cidr.family())
                .filter_map(|c| set.block_range(*c).ok())
                .filter(|(b, e)| *b <= end && *e >= begin)
                .collect();
            let mut blocks = 0;
            for (first, last) in uncovered_runs(begin, end, &mut covered) {
                blocks += self
                    .pool
                    .release_blocks_at(*set_index, first, last)
                    .unwrap_or(0);
            }
            if blocks > 0 {
                metrics.push(MetricEvent::Released {
                    cluster_cidr,
                    blocks,
                });
            }
        }
        metrics
    }
}

/// The runs of block indices in `begin..=end` that no range in `covered` (inclusive block-index
/// ranges, any order, may overlap each other or stick out of `begin..=end`) touches, in order.
/// Sorts `covered` in place.
pub fn uncovered_runs(begin: u32, end: u32, covered: &mut [(u32, u32)]) -> Vec<(u32, u32)> {
    covered.sort_unstable();
    let mut runs = Vec::new();
    let mut next = begin;
    for &(b, e) in covered.iter() {
        if next > end {
            break;
        }
        if e < next {
            continue;
        }
        if b > next {
            runs.push((next, b.saturating_sub(1).min(end)));
        }
        if e == u32::MAX {
            return runs;
        }
        next = next.max(e + 1);
    }
    if next <= end {
        runs.push((next, end));
    }
    runs
}
