//! The deletion quarantine (issue 31, item 2): the blocks of a deleted Node stay reserved for
//! its name for a while, so that a Node of that name created again at once (`kubectl replace
//! --force`, a restore) finds them still its own instead of given to a waiting Node. Pure
//! decisions; the shell times the quarantine (`--deleted-node-cidr-quarantine`) and calls
//! [`Allocator::remove`] again when it is over.
//!
//! What it protects is liveness and parity with kube-controller-manager, whose waiting Node
//! retries on a backoff by which time the re-created Node is usually seen. Safety does not rest
//! on it: a quarantine that ends early (too short, a re-list, a restart) leaves exactly today's
//! race, in which the re-created Node shows podCIDRs another Node was given and is skipped as a
//! conflict with a Warning event — never two Nodes kept on one block.

use super::{Action, Allocator, Decision, MetricEvent, Next, NodeView, PendingWrite, RecordState};

impl Allocator {
    /// The quarantine of `name`'s blocks, when [`Allocator::remove`] is not to release them
    /// yet: the quarantine is on and the record holds podCIDRs the Node showed
    /// ([`RecordState::Held`]). A pending allocation is released at once as before (the Node
    /// never showed it; a re-created Node is given a block anew), and so is a record already
    /// quarantined (its quarantine is over).
    pub(super) fn quarantine(&mut self, name: &str) -> Option<Decision> {
        if !self.deletion_quarantine {
            return None;
        }
        let record = self.nodes.get_mut(name)?;
        if record.state != RecordState::Held || record.held.is_empty() {
            return None;
        }
        record.state = RecordState::Quarantined;
        let pod_cidrs = record.held.to_vec();
        self.quarantine_names.insert(name.into());
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        self.label_refusals.remove(name);
        Some(Decision::new(Action::Quarantined { pod_cidrs }).then(Next::EndQuarantine))
    }

    /// A Node without podCIDRs seen while its name's quarantine holds blocks: the same blocks
    /// again (a pending allocation for this object, written as any other), if they are what it
    /// would be given now — one per family of the flag CIDRs, in their order, of the sizes its
    /// labels select. `None` otherwise (other sizes, a mask label that cannot be used, ClusterCIDR
    /// pools in use: their selectors decide the pool): the caller releases the quarantine and
    /// allocates as for any Node.
    pub(super) fn give_back(&mut self, node: &NodeView) -> Option<Decision> {
        if self.cluster_cidrs.active {
            return None;
        }
        let masks = self.sizing.resolve(&node.labels).ok()?;
        let requests = self.flag_requests(&masks);
        let families = self.flag_families();
        let record = self.nodes.get_mut(&node.name)?;
        let fits =
            record.held.len() == requests.len()
                && record.held.len() == families.len()
                && record.held.iter().zip(&requests).zip(&families).all(
                    |((cidr, request), family)| {
                        cidr.prefix_len() == request.prefix_len && cidr.family() == *family
                    },
                );
        if record.state != RecordState::Quarantined || !fits {
            return None;
        }
        record.state = RecordState::Pending(PendingWrite::default());
        record.uid = node.uid.as_deref().map(Into::into);
        record.ahead_of_informer = false;
        let pod_cidrs = record.held.to_vec();
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        self.label_refusals.remove(&node.name);
        Some(Decision::assign(pod_cidrs, node.uid.as_deref()))
    }

    /// Ends every quarantine (of another name) that overlaps what `name`'s record now holds: a
    /// Node showing those podCIDRs has the stronger claim. Blocks `name` holds stay allocated;
    /// the rest of each quarantine is released. Returns the release metrics. Looks through the
    /// quarantines only (`quarantine_names`, cleaned of ended ones here), never every record.
    pub(super) fn end_quarantines_under(&mut self, name: &str) -> Vec<MetricEvent> {
        if self.quarantine_names.is_empty() {
            return Vec::new();
        }
        let nodes = &self.nodes;
        self.quarantine_names.retain(|q| {
            nodes
                .get(q)
                .is_some_and(|r| r.state == RecordState::Quarantined)
        });
        let Some(held) = self.nodes.get(name).map(|r| r.held.clone()) else {
            return Vec::new();
        };
        let ended: Vec<super::NodeName> = self
            .quarantine_names
            .iter()
            .filter(|other| &***other != name)
            .filter(|other| {
                self.nodes
                    .get(*other)
                    .is_some_and(|r| r.held.iter().any(|q| held.iter().any(|h| h.overlaps(q))))
            })
            .cloned()
            .collect();
        for other in &ended {
            self.quarantine_names.remove(other);
        }
        ended.iter().flat_map(|other| self.forget(other)).collect()
    }
}
