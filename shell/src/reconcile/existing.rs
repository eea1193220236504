//! A Node that already has podCIDRs: the checks its podCIDRs must pass to be kept (well-formed,
//! in range, no overlap with a service CIDR or another Node), occupying them, or skipping the Node.

use nodeipam_core::{AllocError, Cidr};

use super::{
    Action, Allocator, Decision, EventKind, EventSpec, MetricEvent, NodeName, NodeRecord, NodeView,
    PendingWrite, RecordState, SkipInfo, SkipKind, join, truncate_note,
};
use crate::reasons;

impl Allocator {
    /// Start-up: occupies the podCIDRs of every Node that has them, in name order (stable),
    /// before any allocation: where two Nodes contest a block, the first by name keeps it, in the
    /// controller (its cache lists names sorted) and in `plan` (which occupies its Nodes one at a
    /// time in this same order) alike, whatever order a file lists them in. Nodes without
    /// podCIDRs are left for [`Allocator::decide`]. Returns one decision per Node that has
    /// podCIDRs (Keep, or Skip with its event and metric), in the order given.
    pub fn startup_occupy(&mut self, nodes: &[NodeView]) -> Vec<(NodeName, Decision)> {
        let mut order: Vec<(usize, &NodeView)> = nodes
            .iter()
            .filter(|n| n.has_pod_cidrs())
            .enumerate()
            .collect();
        order.sort_by(|a, b| a.1.name.cmp(&b.1.name));
        let mut decided: Vec<(usize, (NodeName, Decision))> = order
            .into_iter()
            .map(|(i, n)| (i, (n.name.clone(), self.observe_existing(n))))
            .collect();
        decided.sort_by_key(|(i, _)| *i);
        decided.into_iter().map(|(_, d)| d).collect()
    }

    /// The [`MetricEvent::Occupied`] for `blocks` blocks of `cidr` newly marked used.
    fn occupied_metric(&self, cidr: Cidr, blocks: u32) -> Option<MetricEvent> {
        self.cluster_cidr_of(cidr)
            .map(|cluster_cidr| MetricEvent::Occupied {
                cluster_cidr,
                blocks,
            })
    }

    /// The diagnostic findings for a Node with podCIDRs: [`crate::diagnostics::node_findings_in`]
    /// against the flag CIDRs (flag order; the backing sets once ClusterCIDRs reshape them are
    /// not the configuration), except that a Node whose podCIDRs all came from ClusterCIDRs may
    /// lack a family on purpose (a single-family ClusterCIDR serves it): no missing-family
    /// finding for it. The one entry point for a Node's findings: its events, the controller's
    /// start-up warnings and `plan` all read them here. Call it once the ClusterCIDRs are synced.
    pub fn node_findings(&self, node: &NodeView) -> Vec<crate::diagnostics::Finding> {
        let cluster_cidrs: Vec<Cidr> = self.sizing.sets().iter().map(|s| s.cluster_cidr).collect();
        let from_pools = node
            .parsed_pod_cidrs()
            .is_some_and(|p| !p.is_empty() && p.iter().all(|c| self.is_cluster_cidr_block(*c)));
        crate::diagnostics::node_findings_in(&cluster_cidrs, node)
            .into_iter()
            .filter(|f| {
                !(from_pools && matches!(f, crate::diagnostics::Finding::MissingFamily { .. }))
            })
            .collect()
    }

    /// The events of [`Allocator::node_findings`].
    fn node_finding_events(&self, node: &NodeView) -> Vec<EventSpec> {
        self.node_findings(node)
            .iter()
            .filter_map(crate::diagnostics::Finding::event)
            .collect()
    }

    /// Occupies a Node's existing podCIDRs, or skips it; a Node occupied anew carries its
    /// diagnostic events (R08, R10, R11). A Node `--node-selector` does not select is occupied
    /// (or skipped) all the same, quietly ([`Action::NotServed`]); when it enters the selection
    /// its events come as for a Node seen anew.
    pub(super) fn observe_existing(&mut self, node: &NodeView) -> Decision {
        let served = self.sizing.serves(&node.labels);
        let decision = self.observe_existing_as(node, served);
        if served {
            decision
        } else {
            self.not_served(&node.name, decision)
        }
    }

    /// [`Allocator::observe_existing`] with the record marked `served` (or not).
    fn observe_existing_as(&mut self, node: &NodeView, served: bool) -> Decision {
        let raw = node.raw_pod_cidrs();
        let parsed = node.parsed_pod_cidrs();
        let uid = node.uid.as_deref();
        if let Some(record) = self.nodes.get_mut(&node.name) {
            let entering = served && !record.served;
            match &record.state {
                RecordState::Held | RecordState::Pending(_) | RecordState::Quarantined
                    if parsed.as_deref() == Some(&*record.held) =>
                {
                    // Seen again, or our own PATCH observed before its response: now confirmed.
                    // A Node re-created with the podCIDRs its deleted namesake held while they
                    // were quarantined (`kubectl replace --force`) keeps them.
                    record.state = RecordState::Held;
                    record.uid = uid.map(Into::into);
                    let mut decision = Decision::new(Action::Keep {
                        pod_cidrs: record.held.to_vec(),
                    });
                    self.set_served(&node.name, served);
                    if entering {
                        decision.events = self.node_finding_events(node);
                    }
                    return decision;
                }
                // An out-of-range skip stands only while the podCIDRs are still out of range
                // (a ClusterCIDR hosted since may cover them: then decided again below).
                RecordState::Skipped(info)
                    if info.raw == raw
                        && record.is_for(uid)
                        && !(info.kind == SkipKind::OutOfRange
                            && parsed
                                .as_deref()
                                .is_some_and(|p| self.pool.check_node_within(p).is_ok())) =>
                {
                    let (kind, reason) = (info.kind, info.reason.clone());
                    self.set_served(&node.name, served);
                    if entering {
                        return skip_reported(node, kind, reason);
                    }
                    return Decision::new(Action::Skip { reason });
                }
                _ => {}
            }
        }
        // Anything else held for this name can go: a pending write of ours can never land on a
        // Node that has podCIDRs (they are immutable), nor on another object (the uid pin).
        let released = self.forget(&node.name);
        let decision = match self.check_existing(node, &raw) {
            Ok(pod_cidrs) => self.occupy_existing(node, pod_cidrs),
            Err(skip) => self.skip_existing(node, raw, skip),
        };
        self.set_served(&node.name, served);
        // A quarantine never outweighs a Node that shows the blocks (see `quarantine`).
        let ended = self.end_quarantines_under(&node.name);
        decision.after_metrics(released).after_metrics(ended)
    }

    /// Reserves `pod_cidrs` for Node `node` as a write in doubt that a predecessor recorded in the
    /// Lease before sending it (a write intent, see `leader::intents`): its PATCH may still land at
    /// any time, so the blocks stay the Node's — and are sent to it again, as for any write in
    /// doubt (a pending record with `maybe_sent`) — until the outcome is definite. Call it
    /// after [`Allocator::startup_occupy`], before the first allocation, for a Node that is listed
    /// with the intent's uid and has no record (a Node occupied with its podCIDRs, or with another
    /// uid, or gone, can never take the write: nothing to reserve). `node` may already show
    /// podCIDRs that the allocator has not decided on yet (a watch event after the start-up
    /// occupy): they are not read here, and the reservation stands until that event is decided
    /// ([`Allocator::decide`] then occupies what the Node shows).
    ///
    /// Returns the metrics of the blocks occupied.
    ///
    /// # Errors
    /// Why the CIDRs cannot be reserved (the Node already has a record, they are outside every
    /// pool or overlap a service CIDR or another Node's): nothing is changed. The caller must
    /// report it: if that write lands, it lands on CIDRs this replica cannot hold for the Node.
    pub fn seed_write_in_doubt(
        &mut self,
        node: &NodeView,
        pod_cidrs: &[Cidr],
    ) -> Result<Vec<MetricEvent>, String> {
        if let Some(record) = self.nodes.get(&node.name) {
            return Err(format!(
                "Node {} already holds {}",
                node.name,
                join(&record.held)
            ));
        }
        self.check_in_pool(pod_cidrs).map_err(|skip| skip.reason)?;
        if let Some(service) = pod_cidrs
            .iter()
            .find_map(|c| self.service_cidrs.iter().find(|s| s.overlaps(c)))
        {
            return Err(format!("it overlaps service CIDR {service}"));
        }
        if let Some(reason) = self.overlap_with_other_node(node, pod_cidrs) {
            return Err(reason);
        }
        let mut occupied = Vec::new();
        for cidr in pod_cidrs {
            if let Ok(blocks @ 1..) = self.pool.occupy(*cidr) {
                occupied.extend(self.occupied_metric(*cidr, blocks));
            }
        }
        let served = self.sizing.serves(&node.labels);
        self.put(
            node.name.clone(),
            NodeRecord {
                held: pod_cidrs.into(),
                state: RecordState::Pending(PendingWrite {
                    failures: 0,
                    maybe_sent: true,
                }),
                uid: node.uid.as_deref().map(Into::into),
                ahead_of_informer: false,
                served,
            },
        );
        Ok(occupied)
    }

    /// Keeps a Node's podCIDRs that passed [`Allocator::check_existing`]: occupies them and holds
    /// them for the Node.
    fn occupy_existing(&mut self, node: &NodeView, pod_cidrs: Vec<Cidr>) -> Decision {
        let mut occupied = Vec::new();
        for cidr in &pod_cidrs {
            // check_existing ran Pool::check_node_within: every CIDR lies in its family's set.
            if let Ok(blocks @ 1..) = self.pool.occupy(*cidr) {
                occupied.extend(self.occupied_metric(*cidr, blocks));
            }
        }
        self.put(
            node.name.clone(),
            NodeRecord {
                held: pod_cidrs.as_slice().into(),
                state: RecordState::Held,
                uid: node.uid.as_deref().map(Into::into),
                ahead_of_informer: false,
                served: true,
            },
        );
        let mut decision = Decision::new(Action::Keep { pod_cidrs });
        decision.metrics = occupied;
        // The diagnostics of podCIDRs seen for the first time (R08, R10, R11), at start-up
        // or while running: a Node seen again with the same podCIDRs returned above.
        decision.events = self.node_finding_events(node);
        decision
    }

    /// Skips a Node whose podCIDRs (`raw`) failed [`Allocator::check_existing`]: whatever part of
    /// them overlaps our ranges stays reserved; one Warning event and one metric.
    fn skip_existing(&mut self, node: &NodeView, raw: Vec<String>, skip: SkipReport) -> Decision {
        let mut occupied = Vec::new();
        let mut held = Vec::new();
        for cidr in skip.reservable.iter().copied() {
            // Each cluster CIDR it overlaps, with the part of it there (the cluster CIDR itself
            // when it is wider), so each occupy is counted against its own cluster CIDR.
            let parts: Vec<Cidr> = self
                .pool
                .sets()
                .iter()
                .map(|set| set.cluster_cidr())
                .filter(|cluster| cluster.overlaps(&cidr))
                .map(|cluster| {
                    if cidr.prefix_len() <= cluster.prefix_len() {
                        cluster
                    } else {
                        cidr
                    }
                })
                .collect();
            for part in &parts {
                if let Ok(blocks @ 1..) = self.pool.occupy(*part) {
                    occupied.extend(self.occupied_metric(*part, blocks));
                }
            }
            if !parts.is_empty() {
                held.push(cidr);
            }
        }
        let decision = skip_reported(node, skip.kind, skip.reason.clone()).after_metrics(occupied);
        self.put(
            node.name.clone(),
            NodeRecord {
                held: held.into_boxed_slice(),
                state: RecordState::Skipped(Box::new(SkipInfo {
                    raw,
                    kind: skip.kind,
                    reason: skip.reason,
                })),
                uid: node.uid.as_deref().map(Into::into),
                ahead_of_informer: false,
                served: true,
            },
        );
        decision
    }

    /// Checks a Node's podCIDRs: well-formed, in range, no overlap with a service CIDR or another
    /// Node, in that order (the first failing check names the skip).
    fn check_existing(&self, node: &NodeView, raw: &[String]) -> Result<Vec<Cidr>, SkipReport> {
        let parsed = parse_existing(node, raw)?;
        self.check_in_pool(&parsed)?;
        // A podCIDR inside a service CIDR would give pods Service IPs: never kept.
        for cidr in &parsed {
            if let Some(service) = self.service_cidrs.iter().find(|s| s.overlaps(cidr)) {
                return Err(SkipReport {
                    kind: SkipKind::Conflict,
                    reason: format!("podCIDR {cidr} overlaps service CIDR {service}"),
                    reservable: parsed,
                });
            }
        }
        if let Some(reason) = self.overlap_with_other_node(node, &parsed) {
            return Err(SkipReport {
                kind: SkipKind::Conflict,
                reason,
                reservable: parsed,
            });
        }
        Ok(parsed)
    }

    /// The count, family and range rules are the core's
    /// ([`nodeipam_core::Pool::check_node_within`]), mapped to skip kinds: too many or the same
    /// family twice is invalid, anything else out of range. What overlaps our sets stays reserved.
    fn check_in_pool(&self, parsed: &[Cidr]) -> Result<(), SkipReport> {
        let Err(error) = self.pool.check_node_within(parsed) else {
            return Ok(());
        };
        let kind = match error {
            AllocError::TooManyCidrs { .. } | AllocError::DuplicateFamily { .. } => {
                SkipKind::Invalid
            }
            _ => SkipKind::OutOfRange,
        };
        let reservable = parsed
            .iter()
            .copied()
            .filter(|c| self.pool.set_index_of(*c).is_some())
            .collect();
        let reason = match kind {
            SkipKind::Invalid => format!("spec.podCIDRs {}: {error}", join(parsed)),
            _ => format!("its podCIDRs cannot be used with this configuration: {error}"),
        };
        Err(SkipReport {
            kind,
            reason,
            reservable,
        })
    }

    /// The reason a podCIDR of `node` cannot be kept because another Node holds an overlapping
    /// range, or `None`.
    fn overlap_with_other_node(&self, node: &NodeView, parsed: &[Cidr]) -> Option<String> {
        for cidr in parsed {
            // Every record's held blocks are allocated in the pool, so a CIDR whose blocks are all
            // free overlaps no other Node: skip the scan (start-up over n Nodes stays ~linear;
            // collecting and sorting every record per Node took a minute for 10k Nodes).
            let surely_free = self
                .pool
                .sets()
                .iter()
                .filter(|set| set.cluster_cidr().overlaps(cidr))
                .all(|set| matches!(set.allocated_in(*cidr), Ok(0)));
            if surely_free {
                continue;
            }
            // The least (name, CIDR) that overlaps, so the reason does not depend on map order.
            let holder = self
                .nodes
                .iter()
                .filter(|(name, r)| **name != node.name && r.state != RecordState::Quarantined)
                .flat_map(|(name, r)| r.held.iter().map(move |c| (name, c)))
                .filter(|(_, c)| c.overlaps(cidr))
                .min();
            if let Some((other, theirs)) = holder {
                return Some(format!(
                    "podCIDR {cidr} overlaps {theirs} held by Node {other}"
                ));
            }
        }
        None
    }
}

/// The skip of a Node whose podCIDRs cannot be occupied, as reported: one Warning event and
/// one metric.
fn skip_reported(node: &NodeView, kind: SkipKind, reason: String) -> Decision {
    let mut decision = Decision::new(Action::Skip {
        reason: reason.clone(),
    });
    decision.events.push(EventSpec {
        kind: EventKind::Warning,
        reason: kind.event_reason(),
        note: truncate_note(format!(
            "Node {} skipped by the node IPAM controller: {reason}",
            node.name
        )),
        action: reasons::ACTION_OCCUPY,
    });
    decision.metrics.push(MetricEvent::NodeSkipped { kind });
    decision
}

/// Parses a Node's podCIDRs (`raw`, [`NodeView::raw_pod_cidrs`]) as kube-controller-manager
/// does, and checks `spec.podCIDR` agrees with `spec.podCIDRs[0]`. A failure is
/// [`SkipKind::Invalid`], keeping reserved whatever did parse.
fn parse_existing(node: &NodeView, raw: &[String]) -> Result<Vec<Cidr>, SkipReport> {
    let mut parsed = Vec::new();
    let mut bad = None;
    for (index, text) in raw.iter().enumerate() {
        // Not trimmed: the API server rejects podCIDRs with surrounding whitespace, and a CNI
        // reading the Node would not parse them either. Leading zeros (`010.0.50.0/24`) are
        // read as decimal, as kube-controller-manager's ParseCIDRSloppy reads them, and an
        // IPv4-mapped IPv6 network (`::ffff:10.9.1.0/120`) is the IPv4 range Go reads
        // (`10.9.1.0/24`): the kubelet, kube-proxy and CNI plugins use that range.
        match Cidr::parse_pod_cidr(text) {
            Ok((cidr, _)) => parsed.push(cidr),
            Err(error) => {
                if bad.is_none() {
                    bad = Some(format!(
                        "spec.podCIDRs[{index}] {text:?} is not a valid CIDR ({error})"
                    ));
                }
            }
        }
    }
    let invalid = |reason: String, reservable: Vec<Cidr>| SkipReport {
        kind: SkipKind::Invalid,
        reason,
        reservable,
    };
    if let Some(reason) = bad {
        return Err(invalid(reason, parsed));
    }
    if let (Some(first_text), Some(first)) = (&node.pod_cidr, parsed.first())
        && !node.pod_cidrs.is_empty()
        && Cidr::parse_pod_cidr(first_text).map(|(c, _)| c) != Ok(*first)
    {
        return Err(invalid(
            format!("spec.podCIDR {first_text:?} differs from spec.podCIDRs[0] {first}"),
            parsed,
        ));
    }
    Ok(parsed)
}

/// Why a Node is skipped, and which of its CIDRs to keep reserved.
struct SkipReport {
    kind: SkipKind,
    reason: String,
    reservable: Vec<Cidr>,
}
