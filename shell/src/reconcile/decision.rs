//! The decision types: what the allocator reads from a Node ([`NodeView`]) and what it returns
//! ([`Decision`]: the action, the events, the metric updates and what to do next; the patch an
//! assignment writes follows from its action, [`Decision::patch`]).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use nodeipam_core::Cidr;
use serde_json::Value;

use super::outcome::pod_cidrs_patch;
use crate::reasons;

/// A Node name, shared between the allocator's index, the informer cache and the work queue (one
/// allocation per Node name, however many places refer to it).
pub type NodeName = Arc<str>;

/// What the decision logic needs from a Node.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeView {
    /// `metadata.name`.
    pub name: NodeName,
    /// `spec.podCIDR` text, if set.
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs` texts (empty if unset; pre-1.16 Nodes have only `podCIDR`).
    pub pod_cidrs: Vec<String>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `metadata.uid`: which Node object this is (a re-created Node of the same name has another).
    pub uid: Option<String>,
    /// `metadata.labels` — all of them ([`NodeView::from_node`]) or only those the node-pool
    /// rules read (the controller's cache keeps no others).
    pub labels: BTreeMap<String, String>,
}

impl NodeView {
    /// Extracts the fields the allocator reads. A Node without a name gets `""`.
    pub fn from_node(node: &Node) -> NodeView {
        let spec = node.spec.as_ref();
        NodeView {
            name: node.metadata.name.as_deref().unwrap_or_default().into(),
            pod_cidr: spec
                .and_then(|s| s.pod_cidr.clone())
                .filter(|s| !s.is_empty()),
            pod_cidrs: spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default(),
            deleting: node.metadata.deletion_timestamp.is_some(),
            uid: node.metadata.uid.clone(),
            labels: node.metadata.labels.clone().unwrap_or_default(),
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

    /// The podCIDRs parsed as kube-controller-manager and every Go reader of the Node read them
    /// ([`Cidr::parse_pod_cidr`]: host bits and leading zeros allowed, an IPv4-mapped IPv6
    /// network read as IPv4), or `None` if any is not a CIDR.
    pub(super) fn parsed_pod_cidrs(&self) -> Option<Vec<Cidr>> {
        self.raw_pod_cidrs()
            .iter()
            .map(|t| Cidr::parse_pod_cidr(t).ok().map(|(c, _)| c))
            .collect()
    }
}

/// Why a Node is skipped: its existing podCIDRs could not be occupied, or (without podCIDRs) its
/// mask label cannot be used.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SkipKind {
    /// Unparsable, more than two, the same family twice, or `podCIDR ≠ podCIDRs[0]`.
    Invalid,
    /// Outside every cluster CIDR (or larger than it), or of a family with no cluster CIDR.
    OutOfRange,
    /// Overlaps another Node's podCIDR, or a service CIDR.
    Conflict,
    /// No podCIDRs, and its node CIDR mask label is not a size it may ask for
    /// (`--allow-node-mask-label`, `--node-mask-label-range`).
    MaskLabel,
}

impl SkipKind {
    /// The bounded metric label value.
    pub fn metric_label(self) -> &'static str {
        match self {
            SkipKind::Invalid => "invalid",
            SkipKind::OutOfRange => "out_of_range",
            SkipKind::Conflict => "conflict",
            SkipKind::MaskLabel => "mask_label",
        }
    }

    /// The event reason (one of [`crate::reasons`]).
    pub fn event_reason(self) -> &'static str {
        match self {
            SkipKind::Invalid => reasons::POD_CIDR_INVALID,
            SkipKind::OutOfRange => reasons::POD_CIDR_OUT_OF_RANGE,
            SkipKind::Conflict => reasons::POD_CIDR_CONFLICT,
            SkipKind::MaskLabel => reasons::NODE_CIDR_MASK_LABEL_INVALID,
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
        /// `metadata.uid` of the Node object they are for (the PATCH is pinned to it), or `None`
        /// for a Node without one.
        uid: Option<String>,
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
    /// The Node's reservation was released (Node gone, or a write that can never apply).
    Released {
        /// The CIDRs that were held for it.
        pod_cidrs: Vec<Cidr>,
    },
    /// The Node was deleted while holding `pod_cidrs`: they stay reserved for its name for the
    /// deletion quarantine ([`super::Allocator::set_deletion_quarantine`]), then are released.
    Quarantined {
        /// The CIDRs held for the name.
        pod_cidrs: Vec<Cidr>,
    },
    /// The Node is not selected by `--node-selector`: nothing is written, no event is published
    /// and it is counted neither as skipped nor as waiting. What it holds stays occupied.
    NotServed {
        /// The CIDRs reserved for it: its podCIDRs (or the part of them that could be
        /// occupied), or a reservation made while it was served. Empty if none.
        held: Vec<Cidr>,
    },
    /// A PATCH did not get a definite answer, or was refused for now: the reservation is kept
    /// and the same CIDRs are sent again ([`Decision::next`] says when).
    KeepTrying {
        /// The CIDRs reserved for the Node.
        pod_cidrs: Vec<Cidr>,
        /// One sentence saying what happened.
        reason: String,
    },
}

/// What the controller does with a Node after applying a decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Next {
    /// Nothing until the Node changes.
    Done,
    /// Read the Node from the API server (GET) and decide again on what it shows
    /// ([`super::Allocator::decide_fresh`], or [`super::Allocator::object_gone`] for the record's uid on 404):
    /// the informer's copy may be older than what a write was just refused for, or than what an
    /// earlier GET showed.
    Reread,
    /// Reconcile again after the Node's next backoff delay.
    RetryBackoff,
    /// Reconcile again after this delay (the server's `Retry-After`).
    RetryAfter(Duration),
    /// Wait until a freed block wakes the Node (the longest-waiting first), with a slow safety
    /// re-check.
    WaitForFreeBlock,
    /// The deleted Node's blocks are quarantined: when the quarantine's time is up
    /// (`--deleted-node-cidr-quarantine`, timed by the shell), reconcile the name again; if it is
    /// still gone, [`super::Allocator::remove`] then releases them.
    EndQuarantine,
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
        /// Grid blocks of `cluster_cidr` the allocated pod CIDR covers (1 without node-pool
        /// sizes): what `node_ipam_controller_cidrset_cidrs_allocations_total` adds, in the same
        /// unit as [`MetricEvent::Occupied`] and [`MetricEvent::Released`].
        blocks: u32,
    },
    /// `blocks` blocks of `cluster_cidr` became used because a Node shows podCIDRs that were free
    /// in the pool (start-up, a Node written by another actor, or a Node re-observed after it was
    /// released). Counted in `node_ipam_controller_cidrset_cidrs_allocations_total` as upstream's `CidrSet.Occupy` does (one
    /// per block newly marked used; blocks already used are not counted again).
    Occupied {
        /// The cluster CIDR (label).
        cluster_cidr: Cidr,
        /// Blocks newly marked used (grid blocks of the cluster CIDR).
        blocks: u32,
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
    /// A PATCH of `spec.podCIDR(s)` failed.
    PatchFailed {
        /// The bounded error label ([`super::PatchOutcome::metric_label`]).
        error: &'static str,
    },
}

/// The outcome of one decision: what to do (and so what to write), what to report, what next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What was decided.
    pub action: Action,
    /// Events to publish on the Node.
    pub events: Vec<EventSpec>,
    /// Metric updates.
    pub metrics: Vec<MetricEvent>,
    /// What the controller does next with this Node.
    pub next: Next,
}

impl Decision {
    pub(super) fn new(action: Action) -> Decision {
        Decision {
            action,
            events: Vec::new(),
            metrics: Vec::new(),
            next: Next::Done,
        }
    }

    /// Assign `pod_cidrs` to the Node object `uid`.
    pub(super) fn assign(pod_cidrs: Vec<Cidr>, uid: Option<&str>) -> Decision {
        Decision::new(Action::Assign {
            pod_cidrs,
            uid: uid.map(str::to_owned),
        })
    }

    /// For [`Action::Assign`]: the strategic-merge patch its CIDRs and uid make
    /// (`{"metadata":{"uid":…},"spec":{"podCIDR":…,"podCIDRs":[…]}}`), built by
    /// [`pod_cidrs_patch`], the one builder of the body `controller::patch::assign_pod_cidrs`
    /// sends. Derived from the action, never stored: what a decision writes has one source.
    pub fn patch(&self) -> Option<Value> {
        match &self.action {
            Action::Assign { pod_cidrs, uid } => Some(pod_cidrs_patch(pod_cidrs, uid.as_deref())),
            _ => None,
        }
    }

    /// The Node object this decision's events are about, after a re-read or a write: an
    /// assignment's `uid` (the object it was decided on, fresher than any cached copy), else
    /// `known`, the uid the caller had. The one rule the worker follows wherever it publishes a
    /// decision's events.
    pub fn subject_uid<'a>(&'a self, known: Option<&'a str>) -> Option<&'a str> {
        match &self.action {
            Action::Assign { uid: Some(uid), .. } => Some(uid),
            _ => known,
        }
    }

    pub(super) fn then(mut self, next: Next) -> Decision {
        self.next = next;
        self
    }

    /// Puts `metrics` before the decision's own (what happened first is reported first).
    pub(super) fn after_metrics(mut self, mut metrics: Vec<MetricEvent>) -> Decision {
        metrics.append(&mut self.metrics);
        self.metrics = metrics;
        self
    }
}

/// The decision for an informer copy that may be older than what the API server last told us
/// about the name: change nothing, read the Node (GET) and decide on that.
pub(super) fn informer_behind() -> Decision {
    Decision::new(Action::Skip {
        reason: "the informer's copy may be older than the API server's last answer for this name; reading the Node".to_owned(),
    })
    .then(Next::Reread)
}
