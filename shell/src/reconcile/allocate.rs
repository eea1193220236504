//! A Node without podCIDRs: one block per cluster CIDR of the sizes its labels select, where each
//! goes (placement), and the reasons given when none can be had.

use nodeipam_core::{AllocError, BlockAllocation, BlockRequest, Cidr, Family, Placement};

use super::{
    Action, Allocator, Decision, EventKind, EventSpec, MetricEvent, Next, NodeRecord, NodeView,
    PendingWrite, RecordState, SkipKind, truncate_note,
};
use crate::node_pools::{MaskSource, NodeMask};
use crate::reasons;

impl Allocator {
    /// For a Node that keeps `pod_cidrs`: a sentence naming each podCIDR whose size differs from
    /// the size its labels select now (podCIDRs cannot change once set, so it keeps them), or
    /// `None` when they agree (or its mask label is unusable).
    pub fn size_mismatch(&self, node: &NodeView, pod_cidrs: &[Cidr]) -> Option<String> {
        let masks = self.sizing.resolve(&node.labels).ok()?;
        let differences: Vec<String> = pod_cidrs
            .iter()
            // A block of a ClusterCIDR's own size came from that pool: no mismatch.
            .filter(|cidr| !self.is_cluster_cidr_block(**cidr))
            .filter_map(|cidr| {
                let index = self
                    .sizing
                    .sets()
                    .iter()
                    .position(|s| s.cluster_cidr.family() == cidr.family())?;
                let want = masks.get(index)?;
                (want.prefix_len != cidr.prefix_len()).then(|| {
                    format!(
                        "{cidr} is a /{} but {} asks for /{}",
                        cidr.prefix_len(),
                        self.sizing.describe(want.source),
                        want.prefix_len
                    )
                })
            })
            .collect();
        if differences.is_empty() {
            return None;
        }
        Some(format!(
            "keeps its podCIDRs (they cannot change once set): {}",
            differences.join("; ")
        ))
    }

    /// `plan` only: [`Allocator::decide`] for a Node the allocator does not know, keeping no record
    /// of an assignment (its blocks, of the sizes its labels select, stay allocated in the pool and
    /// count as used). `plan` never releases, and an exhaustion reason names only records holding a
    /// range coarser than any size the configuration gives (`space_holders`), which an assigned
    /// block never is, so the plan is the same while 300,000 assigned Nodes cost no index entries.
    pub fn assign_untracked(&mut self, node: &NodeView) -> Decision {
        let decision = self.decide(node);
        if matches!(decision.action, Action::Assign { .. }) {
            let _ = self.take(&node.name);
        }
        decision
    }

    /// Allocates one block per cluster CIDR for a Node without podCIDRs (no record for it), of
    /// the sizes its labels select. Once a ClusterCIDR is hosted, through the pools in the Node's
    /// serving order ([`Allocator::allocate_through_pools`]).
    pub(super) fn allocate(&mut self, node: &NodeView) -> Decision {
        if self.cluster_cidrs.active {
            return self.allocate_through_pools(node);
        }
        let masks = match self.sizing.resolve(&node.labels) {
            Ok(masks) => masks,
            Err(error) => return self.refuse_mask_label(node, &error.to_string()),
        };
        self.label_refusals.remove(&node.name);
        let requests = self.flag_requests(&masks);
        match self.pool.allocate_node_blocks(&requests) {
            Ok(blocks) => self.assigned(node, &blocks),
            Err(error) => self.not_available(node, &error, &masks, ""),
        }
    }

    /// One request per family of the flag CIDRs (their family order), of the size `masks` (one
    /// per flag CIDR, the same for every cluster CIDR of a family) selects: the family's first
    /// one is taken.
    pub(super) fn flag_requests(&self, masks: &[NodeMask]) -> Vec<BlockRequest> {
        self.flag_families()
            .iter()
            .filter_map(|family| {
                let (set, mask) = self
                    .sizing
                    .sets()
                    .iter()
                    .zip(masks)
                    .find(|(set, _)| set.cluster_cidr.family() == *family)?;
                Some(BlockRequest {
                    prefix_len: mask.prefix_len,
                    placement: self.placement(set.cluster_cidr, mask.prefix_len),
                })
            })
            .collect()
    }

    /// The families of the flag CIDRs, flag order (the first entry's family first).
    pub(super) fn flag_families(&self) -> Vec<Family> {
        let mut families = Vec::new();
        for set in self.sizing.sets() {
            if !families.contains(&set.cluster_cidr.family()) {
                families.push(set.cluster_cidr.family());
            }
        }
        families
    }

    /// Records `blocks` as the Node's pending allocation: the Assign decision with one
    /// allocation metric per block (labelled with its backing set).
    pub(super) fn assigned(&mut self, node: &NodeView, blocks: &[BlockAllocation]) -> Decision {
        let pod_cidrs: Vec<Cidr> = blocks.iter().map(|b| b.cidr).collect();
        let metrics = blocks
            .iter()
            .filter_map(|b| {
                self.cluster_cidr_of(b.cidr)
                    .map(|cluster_cidr| MetricEvent::Allocated {
                        cluster_cidr,
                        tries: b.tries,
                        blocks: b.block_count,
                    })
            })
            .collect();
        self.put(
            node.name.clone(),
            NodeRecord {
                held: pod_cidrs.as_slice().into(),
                state: RecordState::Pending(PendingWrite::default()),
                ahead_of_informer: false,
                served: true,
                uid: node.uid.as_deref().map(Into::into),
            },
        );
        let mut decision = Decision::assign(pod_cidrs, node.uid.as_deref());
        decision.metrics = metrics;
        decision
    }

    /// The flag CIDRs had no block (`error`): the Node waits, with the reason, the exhaustion
    /// metrics and one `CIDRNotAvailable` event. `also` is appended to the reason (the
    /// ClusterCIDRs tried as well; empty without them).
    pub(super) fn not_available(
        &mut self,
        node: &NodeView,
        error: &AllocError,
        masks: &[NodeMask],
        also: &str,
    ) -> Decision {
        let mut metrics = Vec::new();
        let mut reason = format!("no pod CIDR could be allocated: {error}");
        match *error {
            AllocError::Exhausted { cluster_cidr } => {
                metrics.push(MetricEvent::Exhausted { cluster_cidr });
                reason.push_str(&self.block_size_clause(cluster_cidr, masks, false));
                reason.push_str(&self.space_holders(cluster_cidr));
            }
            // Several cluster CIDRs of the family, all full for this size: each is counted as
            // exhausted and described, flag order.
            AllocError::ClusterCidrsExhausted { family, .. } => {
                let full: Vec<Cidr> = self
                    .sizing
                    .sets()
                    .iter()
                    .map(|set| set.cluster_cidr)
                    .filter(|cidr| cidr.family() == family)
                    .collect();
                for cluster_cidr in full {
                    metrics.push(MetricEvent::Exhausted { cluster_cidr });
                    reason.push_str(&self.block_size_clause(cluster_cidr, masks, true));
                    reason.push_str(&self.space_holders(cluster_cidr));
                }
            }
            _ => {}
        }
        reason.push_str(also);
        let mut decision = Decision::new(Action::Fail {
            reason: reason.clone(),
        })
        .then(Next::WaitForFreeBlock);
        decision.metrics = metrics;
        decision.events.push(EventSpec {
            kind: EventKind::Warning,
            reason: reasons::CIDR_NOT_AVAILABLE,
            note: truncate_note(format!("Node {}: {reason}", node.name)),
            action: reasons::ACTION_ALLOCATE,
        });
        decision
    }

    /// Blocks coarser than the default size go first fit (cloud-provider-azure's order, packing
    /// large blocks low); the default size and finer ones round-robin from the cursor, so without
    /// rules the order is the range allocator's.
    fn placement(&self, cluster_cidr: Cidr, prefix_len: u8) -> Placement {
        match self.sizing.set_for(cluster_cidr.family()) {
            Some(set) if prefix_len < set.default_mask => Placement::FirstFit,
            _ => Placement::NextFromCursor,
        }
    }

    /// A Node without podCIDRs whose mask label cannot be used: nothing is allocated until the
    /// label changes; the Warning event and the metric are emitted once per object and reason.
    pub(super) fn refuse_mask_label(&mut self, node: &NodeView, why: &str) -> Decision {
        let reason = format!("{why}; no pod CIDR is allocated until the label is fixed or removed");
        let uid: Option<Box<str>> = node.uid.as_deref().map(Into::into);
        let mut decision = Decision::new(Action::Skip {
            reason: reason.clone(),
        });
        let known = self
            .label_refusals
            .get(&node.name)
            .is_some_and(|(u, r)| *u == uid && *r == reason);
        if !known {
            decision.events.push(EventSpec {
                kind: EventKind::Warning,
                reason: SkipKind::MaskLabel.event_reason(),
                note: truncate_note(format!("Node {}: {reason}", node.name)),
                action: reasons::ACTION_ALLOCATE,
            });
            decision.metrics.push(MetricEvent::NodeSkipped {
                kind: SkipKind::MaskLabel,
            });
            self.label_refusals.insert(node.name.clone(), (uid, reason));
        }
        decision
    }

    /// For a request that found no free aligned block of its size in `cluster_cidr`: the size
    /// asked for, where it came from, and the largest block still free (empty when the request
    /// was one grid block: then the cluster CIDR is simply full). `named`: the clause names the
    /// cluster CIDR (for a family of several, each gets one clause).
    fn block_size_clause(&self, cluster_cidr: Cidr, masks: &[NodeMask], named: bool) -> String {
        let Some(index) = self
            .sizing
            .sets()
            .iter()
            .position(|s| s.cluster_cidr == cluster_cidr)
        else {
            return String::new();
        };
        let set = self
            .containing_set(cluster_cidr)
            .and_then(|i| self.pool.sets().get(i));
        let (Some(set), Some(mask)) = (set, masks.get(index)) else {
            return String::new();
        };
        if mask.prefix_len == set.node_mask_size() && mask.source == MaskSource::Default {
            return String::new();
        }
        let largest = match set.largest_free_block() {
            Some(free) => format!("the largest free block is {}", free.cidr),
            None => "no block is free".to_owned(),
        };
        let place = if named {
            format!(" in {cluster_cidr}")
        } else {
            String::new()
        };
        format!(
            " (no free aligned /{}{place} as {} asks; {} of {} /{} blocks are free, {largest})",
            mask.prefix_len,
            self.sizing.describe(mask.source),
            set.free_count(),
            set.block_count(),
            set.node_mask_size()
        )
    }

    /// For an exhausted cluster CIDR: names the Nodes holding a range larger than any size the
    /// configuration gives (e.g. a skipped Node whose podCIDR covers the whole cluster CIDR),
    /// largest first, at most three, as a clause to append to the reason (empty when every Node
    /// holds a block of a configured size). Looks through the records only when holdings changed
    /// since the last call for this cluster CIDR (see [`Allocator::space_holders_memo`]).
    fn space_holders(&mut self, cluster_cidr: Cidr) -> String {
        let generation = self.holdings_generation;
        if let Some((memo_generation, clauses)) = &self.space_holders_memo
            && *memo_generation == generation
            && let Some((_, clause)) = clauses.iter().find(|(cidr, _)| *cidr == cluster_cidr)
        {
            return clause.clone();
        }
        let clause = self.find_space_holders(cluster_cidr);
        self.space_holders_visited = self
            .space_holders_visited
            .saturating_add(self.nodes.len() as u64);
        match &mut self.space_holders_memo {
            Some((memo_generation, clauses)) if *memo_generation == generation => {
                clauses.push((cluster_cidr, clause.clone()));
            }
            memo => *memo = Some((generation, vec![(cluster_cidr, clause.clone())])),
        }
        clause
    }

    /// [`Allocator::space_holders`] computed: one pass over every record.
    fn find_space_holders(&self, cluster_cidr: Cidr) -> String {
        // The backing set it lies in (itself, until a ClusterCIDR reshapes the sets).
        let Some(set) = self
            .containing_set(cluster_cidr)
            .and_then(|i| self.pool.sets().get(i))
        else {
            return String::new();
        };
        let coarsest = self
            .sizing
            .set_for(cluster_cidr.family())
            .map_or(set.node_mask_size(), |s| s.coarsest_mask);
        let mut holders: Vec<(u64, &str, Cidr, bool)> = self
            .nodes
            .iter()
            .flat_map(|(name, record)| {
                let skipped = matches!(record.state, RecordState::Skipped(_));
                record
                    .held
                    .iter()
                    .filter(move |c| {
                        c.family() == cluster_cidr.family()
                            && c.prefix_len() < coarsest
                            && c.overlaps(&cluster_cidr)
                    })
                    .filter_map(move |c| {
                        let (first, last) = set.block_range(*c).ok()?;
                        let blocks = u64::from(last - first) + 1;
                        Some((blocks, &**name, *c, skipped))
                    })
            })
            .collect();
        if holders.is_empty() {
            return String::new();
        }
        holders.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
        let listed: Vec<String> = holders
            .iter()
            .take(3)
            .map(|(blocks, name, cidr, skipped)| {
                let state = if *skipped { ", skipped" } else { "" };
                format!("Node {name} ({cidr}{state}: {blocks} blocks)")
            })
            .collect();
        let more = holders.len().saturating_sub(3);
        let more = if more > 0 {
            format!(" and {more} more")
        } else {
            String::new()
        };
        format!(
            "; blocks of {cluster_cidr} are held by {}{more}",
            listed.join(", ")
        )
    }
}
