//! The decision logic, pure and synchronous: an index of Nodes → the pod CIDRs they hold, plus the
//! [`Pool`]. Each call takes plain data (a [`NodeView`]) and returns a [`Decision`]: the action,
//! the strategic-merge patch to send (if any), the events and the metric updates. The controller
//! is the only code that holds a client; it applies decisions (linkerd policy-controller style).
//!
//! Rules (kube-controller-manager's range allocator, with the fixes of DESIGN.md §2):
//! - at start-up every existing podCIDR is occupied before anything is allocated
//!   ([`Allocator::startup_occupy`]);
//! - a Node whose podCIDRs cannot be occupied is **skipped** with a Warning event and a metric,
//!   never fatal; whatever part of its ranges overlaps a cluster CIDR stays reserved;
//! - a Node without podCIDRs gets one block per cluster CIDR, all or nothing, held as *pending*
//!   until the PATCH is confirmed ([`Allocator::confirm`]) or abandoned ([`Allocator::abort`]);
//! - when a Node is gone its blocks are released, except blocks that another Node's podCIDR (or a
//!   service CIDR) still overlaps.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use nodeipam_core::{AllocError, Cidr, CidrSet, IpamConfig, Pool, storage_words_for};
use serde_json::{Value, json};

use crate::reasons;

/// What the decision logic needs from a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.name`.
    pub name: String,
    /// `spec.podCIDR` text, if set.
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs` texts (empty if unset; pre-1.16 Nodes have only `podCIDR`).
    pub pod_cidrs: Vec<String>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.uid`, to tell a re-created Node from a stale view of the same one.
    pub uid: Option<String>,
}

impl NodeView {
    /// Extracts the fields the allocator reads. A Node without a name gets `""`.
    pub fn from_node(node: &Node) -> NodeView {
        let spec = node.spec.as_ref();
        NodeView {
            name: node.metadata.name.clone().unwrap_or_default(),
            pod_cidr: spec
                .and_then(|s| s.pod_cidr.clone())
                .filter(|s| !s.is_empty()),
            pod_cidrs: spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default(),
            deleting: node.metadata.deletion_timestamp.is_some(),
            uid: node.metadata.uid.clone(),
        }
    }

    /// The podCIDRs as the API defines them: `spec.podCIDRs`, or `[spec.podCIDR]` when only the
    /// older field is set.
    pub fn raw_pod_cidrs(&self) -> Vec<String> {
        if self.pod_cidrs.is_empty() {
            self.pod_cidr.iter().cloned().collect()
        } else {
            self.pod_cidrs.clone()
        }
    }

    /// Whether the Node has any podCIDR set.
    pub fn has_pod_cidrs(&self) -> bool {
        self.pod_cidr.is_some() || !self.pod_cidrs.is_empty()
    }
}

/// Why a Node's existing podCIDRs could not be occupied.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipKind {
    /// Unparsable, more than two, the same family twice, or `podCIDR ≠ podCIDRs[0]`.
    Invalid,
    /// Outside every cluster CIDR (or larger than it), or of a family with no cluster CIDR.
    OutOfRange,
    /// Overlaps another Node's podCIDR, or a service CIDR.
    Conflict,
}

impl SkipKind {
    /// The bounded metric label value.
    pub fn metric_label(self) -> &'static str {
        match self {
            SkipKind::Invalid => "invalid",
            SkipKind::OutOfRange => "out_of_range",
            SkipKind::Conflict => "conflict",
        }
    }

    /// The event reason (one of [`crate::reasons`]).
    pub fn event_reason(self) -> &'static str {
        match self {
            SkipKind::Invalid => reasons::POD_CIDR_INVALID,
            SkipKind::OutOfRange => reasons::POD_CIDR_OUT_OF_RANGE,
            SkipKind::Conflict => reasons::POD_CIDR_CONFLICT,
        }
    }
}

/// What was decided for a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// The Node keeps the podCIDRs it has (now occupied in the pool).
    Keep {
        /// Its podCIDRs, in the Node's order.
        pod_cidrs: Vec<Cidr>,
    },
    /// The Node gets these podCIDRs (reserved as pending; send [`Decision::patch`]).
    Assign {
        /// One per cluster CIDR, flag order.
        pod_cidrs: Vec<Cidr>,
    },
    /// Nothing is done for the Node (its podCIDRs cannot be occupied, or it is being deleted).
    Skip {
        /// One sentence saying why.
        reason: String,
    },
    /// The Node needs podCIDRs and none could be allocated (pool exhausted); retry later.
    Fail {
        /// One sentence saying why.
        reason: String,
    },
    /// The Node's reservation was released (Node gone, or patch abandoned).
    Released {
        /// The CIDRs that were held for it.
        pod_cidrs: Vec<Cidr>,
    },
}

/// Severity of an event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Informational.
    Normal,
    /// Something an operator should look at.
    Warning,
}

/// An event to publish on the Node the decision is about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventSpec {
    /// Severity.
    pub kind: EventKind,
    /// One of [`crate::reasons`].
    pub reason: &'static str,
    /// Human-readable message (≤ 1 kB).
    pub note: String,
    /// One of the `ACTION_*` constants of [`crate::reasons`].
    pub action: &'static str,
}

/// A metric update, applied by the controller (see [`crate::metric_names`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricEvent {
    /// A block was allocated in `cluster_cidr` after skipping `tries` used blocks.
    Allocated {
        /// The cluster CIDR (label).
        cluster_cidr: Cidr,
        /// Used blocks skipped by the search.
        tries: u32,
    },
    /// `blocks` blocks were released in `cluster_cidr`.
    Released {
        /// The cluster CIDR (label).
        cluster_cidr: Cidr,
        /// Blocks that became free.
        blocks: u32,
    },
    /// An allocation found `cluster_cidr` exhausted.
    Exhausted {
        /// The cluster CIDR (label).
        cluster_cidr: Cidr,
    },
    /// A Node was skipped.
    NodeSkipped {
        /// Why.
        kind: SkipKind,
    },
}

/// The outcome of one decision: what to do, what to write, what to report.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What was decided.
    pub action: Action,
    /// Strategic-merge patch for the Node (`{"spec":{"podCIDR":…,"podCIDRs":[…]}}`), for
    /// [`Action::Assign`].
    pub patch: Option<Value>,
    /// Events to publish on the Node.
    pub events: Vec<EventSpec>,
    /// Metric updates.
    pub metrics: Vec<MetricEvent>,
}

impl Decision {
    fn new(action: Action) -> Decision {
        Decision {
            action,
            patch: None,
            events: Vec::new(),
            metrics: Vec::new(),
        }
    }
}

/// The strategic-merge patch that assigns `pod_cidrs` (upstream's `PatchNodeCIDRs` body).
pub fn pod_cidrs_patch(pod_cidrs: &[Cidr]) -> Value {
    let texts: Vec<String> = pod_cidrs.iter().map(Cidr::to_string).collect();
    json!({"spec": {"podCIDR": texts.first(), "podCIDRs": texts}})
}

/// Capacity and usage of one cluster CIDR, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// The node block prefix length, bits.
    pub node_mask_size: u8,
    /// Total blocks.
    pub capacity: u32,
    /// Allocated or reserved blocks (Nodes, pending patches, service CIDRs, skipped Nodes).
    pub used: u32,
    /// Free blocks.
    pub free: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RecordState {
    /// The Node has these podCIDRs (confirmed).
    Held,
    /// Allocated by us, PATCH not confirmed yet.
    Pending,
    /// The Node's podCIDRs could not be occupied; `held` is whatever overlapped our ranges.
    Skipped {
        raw: Vec<String>,
        kind: SkipKind,
        reason: String,
    },
}

#[derive(Debug, Clone)]
struct NodeRecord {
    held: Vec<Cidr>,
    state: RecordState,
    uid: Option<String>,
}

/// The allocator state: the pool and who holds what.
#[derive(Debug)]
pub struct Allocator {
    pool: Pool<Vec<u64>>,
    service_cidrs: Vec<Cidr>,
    nodes: HashMap<String, NodeRecord>,
}

impl Allocator {
    /// Builds the pool from a validated configuration (one set per cluster CIDR, storage sized
    /// exactly) and reserves the service CIDRs.
    ///
    /// # Errors
    /// [`AllocError::ServiceCidrFillsClusterCidr`] when a service CIDR leaves a cluster CIDR no free
    /// block (a configuration error); other [`AllocError`]s cannot happen for a validated config.
    pub fn new(config: &IpamConfig) -> Result<Allocator, AllocError> {
        let mut sets = config.cluster_cidrs.iter().map(|c| {
            let words = storage_words_for(c.cluster_cidr.prefix_len(), c.node_mask_size);
            CidrSet::new(c.cluster_cidr, c.node_mask_size, vec![0u64; words])
        });
        let first = sets.next().ok_or(AllocError::NoClusterCidr)??;
        let second = sets.next().transpose()?;
        let mut pool = Pool::new(first, second)?;
        for service_cidr in &config.service_cidrs {
            pool.reserve_service_cidr(*service_cidr)?;
        }
        Ok(Allocator {
            pool,
            service_cidrs: config.service_cidrs.iter().copied().collect(),
            nodes: HashMap::new(),
        })
    }

    /// Capacity and usage per cluster CIDR, flag order.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pool
            .sets()
            .iter()
            .map(|set| PoolStats {
                cluster_cidr: set.cluster_cidr(),
                node_mask_size: set.node_mask_size(),
                capacity: set.block_count(),
                used: set.allocated_count(),
                free: set.free_count(),
            })
            .collect()
    }

    /// The CIDRs reserved for Node `name` (held, pending or the reserved part of a skipped Node).
    pub fn held(&self, name: &str) -> Option<&[Cidr]> {
        self.nodes.get(name).map(|r| r.held.as_slice())
    }

    /// Whether Node `name` has a pending (unconfirmed) allocation.
    pub fn is_pending(&self, name: &str) -> bool {
        self.nodes
            .get(name)
            .is_some_and(|r| r.state == RecordState::Pending)
    }

    /// Number of Nodes currently skipped.
    pub fn skipped_count(&self) -> usize {
        self.nodes
            .values()
            .filter(|r| matches!(r.state, RecordState::Skipped { .. }))
            .count()
    }

    /// Names of every Node the allocator holds something for (sorted).
    pub fn known_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.nodes.keys().cloned().collect();
        names.sort();
        names
    }

    /// Start-up: occupies the podCIDRs of every Node that has them, in list order, before any
    /// allocation. Nodes without podCIDRs are left for [`Allocator::decide`]. Returns one decision
    /// per Node that has podCIDRs (Keep, or Skip with its event and metric).
    pub fn startup_occupy(&mut self, nodes: &[NodeView]) -> Vec<(String, Decision)> {
        nodes
            .iter()
            .filter(|n| n.has_pod_cidrs())
            .map(|n| (n.name.clone(), self.observe_existing(n)))
            .collect()
    }

    /// Decides for one Node as seen now: occupy what it has (Keep/Skip), re-send a pending
    /// allocation, or allocate (Assign/Fail). Idempotent: seeing the same Node again changes
    /// nothing and emits nothing new.
    pub fn decide(&mut self, node: &NodeView) -> Decision {
        if node.has_pod_cidrs() {
            return self.observe_existing(node);
        }
        if let Some(record) = self.nodes.get(&node.name)
            && record.state == RecordState::Pending
        {
            let pod_cidrs = record.held.clone();
            let mut decision = Decision::new(Action::Assign {
                pod_cidrs: pod_cidrs.clone(),
            });
            decision.patch = Some(pod_cidrs_patch(&pod_cidrs));
            return decision;
        }
        if let Some(record) = self.nodes.get(&node.name)
            && record.state == RecordState::Held
            && record.uid.is_some()
            && record.uid == node.uid
        {
            // podCIDRs cannot be removed once set: this is a stale view of the same Node (e.g. the
            // watch has not delivered our own PATCH yet). Nothing to do.
            return Decision::new(Action::Keep {
                pod_cidrs: record.held.clone(),
            });
        }
        if node.deleting {
            return Decision::new(Action::Skip {
                reason: "the Node is being deleted (deletionTimestamp is set): no pod CIDR is allocated to it".to_owned(),
            });
        }
        let mut metrics = Vec::new();
        // A record for a Node that now has no podCIDRs belongs to an earlier object of that name.
        if let Some(record) = self.nodes.remove(&node.name) {
            metrics.extend(self.release_cidrs(&record.held));
        }
        let mut decision = match self.pool.allocate_node() {
            Ok(allocations) => {
                let pod_cidrs: Vec<Cidr> = allocations.iter().map(|a| a.cidr).collect();
                for allocation in &allocations {
                    if let Some(cluster_cidr) = self.cluster_cidr_of(allocation.cidr) {
                        metrics.push(MetricEvent::Allocated {
                            cluster_cidr,
                            tries: allocation.tries,
                        });
                    }
                }
                self.nodes.insert(
                    node.name.clone(),
                    NodeRecord {
                        held: pod_cidrs.clone(),
                        state: RecordState::Pending,
                        uid: node.uid.clone(),
                    },
                );
                let mut decision = Decision::new(Action::Assign {
                    pod_cidrs: pod_cidrs.clone(),
                });
                decision.patch = Some(pod_cidrs_patch(&pod_cidrs));
                decision
            }
            Err(error) => {
                if let AllocError::Exhausted { cluster_cidr } = error {
                    metrics.push(MetricEvent::Exhausted { cluster_cidr });
                }
                let reason = format!("no pod CIDR could be allocated: {error}");
                let mut decision = Decision::new(Action::Fail {
                    reason: reason.clone(),
                });
                decision.events.push(EventSpec {
                    kind: EventKind::Warning,
                    reason: reasons::CIDR_NOT_AVAILABLE,
                    note: format!("Node {}: {reason}", node.name),
                    action: reasons::ACTION_ALLOCATE,
                });
                decision
            }
        };
        let mut all = metrics;
        all.append(&mut decision.metrics);
        decision.metrics = all;
        decision
    }

    /// The PATCH assigning `pod_cidrs` to Node `name` succeeded: the pending reservation becomes
    /// held. Returns false (and changes nothing) if `name` had no such pending reservation.
    pub fn confirm(&mut self, name: &str, pod_cidrs: &[Cidr]) -> bool {
        match self.nodes.get_mut(name) {
            Some(record) if record.state == RecordState::Pending && record.held == pod_cidrs => {
                record.state = RecordState::Held;
                true
            }
            _ => false,
        }
    }

    /// The PATCH definitely failed: releases Node `name`'s pending reservation (if any), so the
    /// next attempt allocates again. Held and skipped records are left alone.
    pub fn abort(&mut self, name: &str) -> Decision {
        if !self.is_pending(name) {
            return Decision::new(Action::Released {
                pod_cidrs: Vec::new(),
            });
        }
        self.remove(name)
    }

    /// Node `name` is gone (delete event, or NotFound): releases every block it held, except blocks
    /// another Node's podCIDR or a service CIDR still overlaps. Unknown names release nothing.
    pub fn remove(&mut self, name: &str) -> Decision {
        let Some(record) = self.nodes.remove(name) else {
            return Decision::new(Action::Released {
                pod_cidrs: Vec::new(),
            });
        };
        let mut decision = Decision::new(Action::Released {
            pod_cidrs: record.held.clone(),
        });
        decision.metrics = self.release_cidrs(&record.held);
        decision
    }

    fn cluster_cidr_of(&self, cidr: Cidr) -> Option<Cidr> {
        self.pool
            .set_for(cidr.family())
            .map(|set| set.cluster_cidr())
    }

    /// Occupies a Node's existing podCIDRs, or skips it.
    fn observe_existing(&mut self, node: &NodeView) -> Decision {
        let raw = node.raw_pod_cidrs();
        let parsed: Option<Vec<Cidr>> = raw
            .iter()
            .map(|t| Cidr::parse_masked(t).ok().map(|(c, _)| c))
            .collect();
        if let Some(record) = self.nodes.get_mut(&node.name) {
            match &record.state {
                RecordState::Held | RecordState::Pending
                    if parsed.as_deref() == Some(record.held.as_slice()) =>
                {
                    // Seen again, or our own PATCH observed before its response: now confirmed.
                    record.state = RecordState::Held;
                    return Decision::new(Action::Keep {
                        pod_cidrs: record.held.clone(),
                    });
                }
                RecordState::Skipped {
                    raw: seen, reason, ..
                } if *seen == raw => {
                    return Decision::new(Action::Skip {
                        reason: reason.clone(),
                    });
                }
                _ => {}
            }
        }
        let mut metrics = Vec::new();
        if let Some(record) = self.nodes.remove(&node.name) {
            metrics.extend(self.release_cidrs(&record.held));
        }
        let mut decision = match self.check_existing(node, &raw) {
            Ok(pod_cidrs) => {
                for cidr in &pod_cidrs {
                    // check_existing ran Pool::check_node, so every CIDR overlaps its family's set.
                    let _ = self.pool.occupy(*cidr);
                }
                self.nodes.insert(
                    node.name.clone(),
                    NodeRecord {
                        held: pod_cidrs.clone(),
                        state: RecordState::Held,
                        uid: node.uid.clone(),
                    },
                );
                Decision::new(Action::Keep { pod_cidrs })
            }
            Err(skip) => {
                let mut held = Vec::new();
                for cidr in skip.reservable {
                    if self.pool.occupy(cidr).is_ok() {
                        held.push(cidr);
                    }
                }
                self.nodes.insert(
                    node.name.clone(),
                    NodeRecord {
                        held,
                        state: RecordState::Skipped {
                            raw,
                            kind: skip.kind,
                            reason: skip.reason.clone(),
                        },
                        uid: node.uid.clone(),
                    },
                );
                let mut decision = Decision::new(Action::Skip {
                    reason: skip.reason.clone(),
                });
                decision.events.push(EventSpec {
                    kind: EventKind::Warning,
                    reason: skip.kind.event_reason(),
                    note: format!(
                        "Node {} skipped by the node IPAM controller: {}",
                        node.name, skip.reason
                    ),
                    action: reasons::ACTION_OCCUPY,
                });
                decision
                    .metrics
                    .push(MetricEvent::NodeSkipped { kind: skip.kind });
                decision
            }
        };
        metrics.append(&mut decision.metrics);
        decision.metrics = metrics;
        decision
    }

    /// Checks a Node's podCIDRs: well-formed, in range, no overlap with another Node.
    fn check_existing(&self, node: &NodeView, raw: &[String]) -> Result<Vec<Cidr>, SkipReport> {
        let mut parsed = Vec::new();
        let mut bad = None;
        for (index, text) in raw.iter().enumerate() {
            // Not trimmed: the API server rejects podCIDRs with surrounding whitespace, and a CNI
            // reading the Node would not parse them either.
            match Cidr::parse_masked(text) {
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
            && Cidr::parse_masked(first_text).map(|(c, _)| c) != Ok(*first)
        {
            return Err(invalid(
                format!("spec.podCIDR {first_text:?} differs from spec.podCIDRs[0] {first}"),
                parsed,
            ));
        }
        if parsed.len() > 2 {
            return Err(invalid(
                format!(
                    "spec.podCIDRs has {} entries; at most 2 (one IPv4, one IPv6) are allowed",
                    parsed.len()
                ),
                parsed,
            ));
        }
        if let [a, b] = parsed.as_slice()
            && a.family() == b.family()
        {
            return Err(invalid(
                format!(
                    "spec.podCIDRs has two {} entries ({a}, {b}); at most one per family is allowed",
                    a.family()
                ),
                parsed,
            ));
        }
        if let Err(error) = self.pool.check_node(&parsed) {
            let reservable = parsed
                .iter()
                .copied()
                .filter(|c| {
                    self.pool
                        .set_for(c.family())
                        .is_some_and(|s| s.block_range(*c).is_ok())
                })
                .collect();
            return Err(SkipReport {
                kind: SkipKind::OutOfRange,
                reason: format!("its podCIDRs cannot be used with this configuration: {error}"),
                reservable,
            });
        }
        for cidr in &parsed {
            // Pool::check_node accepts a CIDR that covers the whole cluster CIDR (upstream's
            // Occupy does); such a podCIDR does not lie in the cluster CIDR, so it cannot be kept.
            if let Some(set) = self.pool.set_for(cidr.family())
                && cidr.prefix_len() < set.cluster_cidr().prefix_len()
            {
                return Err(SkipReport {
                    kind: SkipKind::OutOfRange,
                    reason: format!(
                        "its podCIDRs cannot be used with this configuration: {cidr} is larger than cluster CIDR {}",
                        set.cluster_cidr()
                    ),
                    reservable: parsed,
                });
            }
        }
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
        for cidr in &parsed {
            // Every record's held blocks are allocated in the pool, so a CIDR whose blocks are all
            // free overlaps no other Node: skip the scan (start-up over n Nodes stays ~linear;
            // collecting and sorting every record per Node took a minute for 10k Nodes).
            let surely_free = self
                .pool
                .set_for(cidr.family())
                .is_some_and(|set| matches!(set.allocated_in(*cidr), Ok(0)));
            if surely_free {
                continue;
            }
            // The least (name, CIDR) that overlaps, so the reason does not depend on map order.
            let holder = self
                .nodes
                .iter()
                .filter(|(name, _)| *name != &node.name)
                .flat_map(|(name, r)| r.held.iter().map(move |c| (name, c)))
                .filter(|(_, c)| c.overlaps(cidr))
                .min();
            if let Some((other, theirs)) = holder {
                return Err(SkipReport {
                    kind: SkipKind::Conflict,
                    reason: format!("podCIDR {cidr} overlaps {theirs} held by Node {other}"),
                    reservable: parsed,
                });
            }
        }
        Ok(parsed)
    }

    /// Releases `cidrs` (already removed from the index) except for blocks that another record or
    /// a service CIDR still overlaps. Returns one metric per cluster CIDR that freed blocks.
    fn release_cidrs(&mut self, cidrs: &[Cidr]) -> Vec<MetricEvent> {
        let mut metrics: Vec<MetricEvent> = Vec::new();
        for cidr in cidrs {
            let Some(set) = self.pool.set_for(cidr.family()) else {
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
            covered.sort_unstable();
            let mut runs = Vec::new();
            let mut next = begin;
            for (b, e) in covered {
                if b > next {
                    runs.push((next, b - 1));
                }
                if e >= next {
                    next = e.saturating_add(1);
                }
                if next > end {
                    break;
                }
            }
            if next <= end && next >= begin {
                runs.push((next, end));
            }
            let mut blocks = 0;
            for (first, last) in runs {
                blocks += self
                    .pool
                    .release_blocks(cidr.family(), first, last)
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

/// Why a Node is skipped, and which of its CIDRs to keep reserved.
struct SkipReport {
    kind: SkipKind,
    reason: String,
    reservable: Vec<Cidr>,
}

#[cfg(test)]
mod tests;
