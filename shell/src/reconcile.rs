//! The decision logic, pure and synchronous: an index of Nodes → the pod CIDRs reserved for them,
//! plus the [`Pool`]. Each call takes plain data (a [`NodeView`], or a [`PatchOutcome`]) and
//! returns a [`Decision`]: the action, the strategic-merge patch to send (if any), the events, the
//! metric updates and what to do next. The controller is the only code that holds a client; it
//! applies decisions (linkerd policy-controller style).
//!
//! Rules (kube-controller-manager's range allocator, `pkg/controller/nodeipam/ipam/range_allocator.go`,
//! with the fixes listed in README "Where we differ"):
//! - at start-up every existing podCIDR is occupied before anything is allocated
//!   ([`Allocator::startup_occupy`]); upstream once handed out 27 duplicates in an 800-Node cluster
//!   by allocating first;
//! - a Node whose podCIDRs cannot be occupied is **skipped** with a Warning event and a metric,
//!   never fatal; whatever part of its ranges overlaps a cluster CIDR stays reserved;
//! - a Node without podCIDRs gets one block per cluster CIDR, all or nothing, held as *pending*
//!   until the API server is known to have applied the PATCH, or known never to apply it
//!   ([`Allocator::patch_outcome`]). Every PATCH names the Node object it was decided for
//!   (`metadata.uid`), so it can never land on a later Node of the same name;
//! - **an unknown outcome never releases** (a timeout, a dropped connection, a 5xx): the API
//!   server may still apply the write after the client gave up, so the block stays reserved and
//!   the same CIDRs are sent again until the outcome is definite: the Node shows them (done), the
//!   Node shows other podCIDRs (podCIDRs are immutable once set, so ours can never land: release),
//!   the Node object is gone (release), or the server refuses the write for good (422: release).
//!   Upstream keeps the reservation only for a server timeout and releases on a client timeout;
//! - when a Node is gone its blocks are released, except blocks that another Node's podCIDR (or a
//!   service CIDR) still overlaps;
//! - with node-pool sizes ([`Sizing`], `CloudAllocator`) each cluster CIDR is counted in grid
//!   blocks (the finest configured size) and a Node without podCIDRs gets the size its labels
//!   select: coarser than the default first fit, the default or finer round-robin from the cursor
//!   (exactly the range allocator's order when there are no rules). A Node whose mask label is
//!   unusable gets nothing until the label changes (one Warning event).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use nodeipam_core::{
    AllocError, BlockRequest, Cidr, CidrSet, FreeBlock, IpamConfig, Placement, Pool,
    storage_words_for,
};
use serde_json::{Value, json};

use crate::compact::Uid;
use crate::node_pools::{MaskSource, NodeMask, Sizing};
use crate::reasons;

/// A Node name, shared between the allocator's index, the informer cache and the work queue (one
/// allocation per Node name, however many places refer to it).
pub type NodeName = Arc<str>;

/// Upstream's `cidrUpdateRetries`: after this many failed PATCHes in a row a `CIDRAssignmentFailed`
/// event is published (every failure is logged and counted).
pub const FAILED_PATCHES_BEFORE_EVENT: u32 = 3;

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

    /// The podCIDRs parsed as kube-controller-manager reads them ([`Cidr::parse_sloppy`]: host
    /// bits and leading zeros allowed), or `None` if any is not a CIDR.
    fn parsed_pod_cidrs(&self) -> Option<Vec<Cidr>> {
        self.raw_pod_cidrs()
            .iter()
            .map(|t| Cidr::parse_sloppy(t).ok().map(|(c, _)| c))
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
    /// ([`Allocator::decide_fresh`], or [`Allocator::object_gone`] for the record's uid on 404):
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
        /// The bounded error label ([`PatchOutcome::metric_label`]).
        error: &'static str,
    },
}

/// The outcome of one decision: what to do, what to write, what to report, what next.
#[derive(Debug, Clone, PartialEq)]
pub struct Decision {
    /// What was decided.
    pub action: Action,
    /// Strategic-merge patch for the Node (`{"metadata":{"uid":…},"spec":{"podCIDR":…,"podCIDRs":[…]}}`),
    /// for [`Action::Assign`].
    pub patch: Option<Value>,
    /// Events to publish on the Node.
    pub events: Vec<EventSpec>,
    /// Metric updates.
    pub metrics: Vec<MetricEvent>,
    /// What the controller does next with this Node.
    pub next: Next,
}

impl Decision {
    fn new(action: Action) -> Decision {
        Decision {
            action,
            patch: None,
            events: Vec::new(),
            metrics: Vec::new(),
            next: Next::Done,
        }
    }

    /// Assign `pod_cidrs` to the Node object `uid`: the action and its patch.
    fn assign(pod_cidrs: Vec<Cidr>, uid: Option<&str>) -> Decision {
        let mut decision = Decision::new(Action::Assign {
            pod_cidrs: pod_cidrs.clone(),
        });
        decision.patch = Some(pod_cidrs_patch(&pod_cidrs, uid));
        decision
    }

    fn then(mut self, next: Next) -> Decision {
        self.next = next;
        self
    }

    /// Puts `metrics` before the decision's own (what happened first is reported first).
    fn after_metrics(mut self, mut metrics: Vec<MetricEvent>) -> Decision {
        metrics.append(&mut self.metrics);
        self.metrics = metrics;
        self
    }
}

/// The decision for an informer copy that may be older than what the API server last told us
/// about the name: change nothing, read the Node (GET) and decide on that.
fn informer_behind() -> Decision {
    Decision::new(Action::Skip {
        reason: "the informer's copy may be older than the API server's last answer for this name; reading the Node".to_owned(),
    })
    .then(Next::Reread)
}

/// The strategic-merge patch that assigns `pod_cidrs` (upstream's `PatchNodeCIDRs` body), pinned
/// to the Node object `uid` when it is known: kube-apiserver then refuses to apply it to any other
/// object of that name (422 `metadata.uid: field is immutable`, from `rest.BeforeUpdate` →
/// `ValidateObjectMetaAccessorUpdate`), so a write that lands late can never reach a re-created
/// Node.
pub fn pod_cidrs_patch(pod_cidrs: &[Cidr], uid: Option<&str>) -> Value {
    let texts: Vec<String> = pod_cidrs.iter().map(Cidr::to_string).collect();
    let spec = json!({"podCIDR": texts.first(), "podCIDRs": texts});
    match uid {
        Some(uid) => json!({"metadata": {"uid": uid}, "spec": spec}),
        None => json!({"spec": spec}),
    }
}

/// How a PATCH of `spec.podCIDR(s)` ended, as far as the API server told us. Built by the
/// controller from the HTTP result (see `controller::patch::classify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOutcome {
    /// 2xx: applied; the Node as the server returned it.
    Applied(NodeView),
    /// 404: no Node of that name (the object the write was for is gone).
    NotFound,
    /// The server refused the write for good and a write of the same body can never apply:
    /// 422 because podCIDRs are already set to other values (immutable), because the Node was
    /// replaced (`metadata.uid` differs), or because the value is invalid. Nothing was written.
    CannotApply {
        /// Which of the three.
        kind: CannotApplyKind,
        /// The server's message.
        message: String,
    },
    /// The server refused this attempt (400, 401, 403, …): nothing was written, but a later
    /// attempt may succeed.
    Refused {
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// The server asked to retry (409 Conflict, 429 TooManyRequests): nothing was written.
    RetryLater {
        /// HTTP status.
        status: u16,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The server's message.
        message: String,
    },
    /// Whether the write was applied is unknown: the client timed out, the connection closed
    /// after the request was sent, or the server answered 5xx/504. It may still land.
    Unknown {
        /// What happened.
        message: String,
    },
    /// The request was never sent (e.g. the connection could not be opened): nothing was written.
    NotSent {
        /// What happened.
        message: String,
    },
}

/// Why a PATCH can never apply (see [`PatchOutcome::CannotApply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CannotApplyKind {
    /// `spec.podCIDR(s)` already hold other values (422 on `spec.podCIDRs`).
    PodCidrsAlreadySet,
    /// The Node of that name is another object now (422 on `metadata.uid`).
    NodeReplaced,
    /// The server found the patch invalid for another reason (422).
    Invalid,
}

impl PatchOutcome {
    /// The bounded `error` label of `node_ipam_controller_patch_failures_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PatchOutcome::Applied(_) => "none",
            PatchOutcome::NotFound => "not_found",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::PodCidrsAlreadySet,
                ..
            } => "pod_cidrs_already_set",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::NodeReplaced,
                ..
            } => "node_replaced",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::Invalid,
                ..
            } => "invalid",
            PatchOutcome::Refused { .. } => "refused",
            PatchOutcome::RetryLater { status: 429, .. } => "too_many_requests",
            PatchOutcome::RetryLater { .. } => "conflict",
            PatchOutcome::Unknown { .. } => "unknown_outcome",
            PatchOutcome::NotSent { .. } => "not_sent",
        }
    }

    /// One line describing the failure (empty for [`PatchOutcome::Applied`]).
    pub fn describe(&self) -> String {
        match self {
            PatchOutcome::Applied(_) => String::new(),
            PatchOutcome::NotFound => "the Node is gone (404)".to_owned(),
            PatchOutcome::CannotApply { message, .. } => format!("refused (422): {message}"),
            PatchOutcome::Refused { status, message } => format!("refused ({status}): {message}"),
            PatchOutcome::RetryLater {
                status, message, ..
            } => format!("retry later ({status}): {message}"),
            PatchOutcome::Unknown { message } => format!("outcome unknown: {message}"),
            PatchOutcome::NotSent { message } => format!("not sent: {message}"),
        }
    }
}

/// Capacity and usage of one cluster CIDR, in blocks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// The block prefix length, bits: the grid (the finest size a Node can get; the node CIDR
    /// mask size without node-pool rules). Capacity, used and free count these blocks.
    pub node_mask_size: u8,
    /// Total blocks.
    pub capacity: u32,
    /// Allocated or reserved blocks (Nodes, pending patches, service CIDRs, skipped Nodes).
    pub used: u32,
    /// Free blocks.
    pub free: u32,
}

/// A pending write's history.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
struct PendingWrite {
    /// PATCHes that failed in a row.
    failures: u32,
    /// Whether any attempt ended without a definite answer (it may still land).
    maybe_sent: bool,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum RecordState {
    /// The Node has these podCIDRs (confirmed).
    Held,
    /// Allocated by us, the PATCH not known to be applied yet.
    Pending(PendingWrite),
    /// The Node's podCIDRs could not be occupied; `held` is whatever overlapped our ranges.
    Skipped(Box<SkipInfo>),
    /// The API server said the object `uid` is gone (404, or the name now belongs to another
    /// object) before the informer did: nothing is held, and the informer's stale copy of that
    /// object gets nothing allocated.
    Gone,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SkipInfo {
    raw: Vec<String>,
    kind: SkipKind,
    reason: String,
}

#[derive(Debug, Clone)]
struct NodeRecord {
    held: Vec<Cidr>,
    state: RecordState,
    uid: Option<Uid>,
    /// The record was last decided on what the API server answered (a GET, a PATCH response),
    /// which can be newer than the informer's copy: until the informer shows this object
    /// ([`NodeRecord::uid`]), its copies of other objects of the name, and its deletions, may be
    /// older, so they are checked with a GET instead of acted on ([`Next::Reread`]).
    ahead_of_informer: bool,
}

impl NodeRecord {
    fn is_for(&self, uid: Option<&str>) -> bool {
        Uid::same(self.uid.as_ref(), uid)
    }
}

/// The allocator state: the pool and who holds what.
#[derive(Debug)]
pub struct Allocator {
    pool: Pool<Vec<u64>>,
    service_cidrs: Vec<Cidr>,
    nodes: HashMap<NodeName, NodeRecord>,
    /// Records in [`RecordState::Skipped`] (kept in step by [`Allocator::put`]/[`Allocator::take`]).
    skipped: usize,
    /// Per-Node mask sizes and the grid of each cluster CIDR.
    sizing: Sizing,
    /// Nodes without podCIDRs refused for their mask label: the object (uid) and the reason last
    /// reported, so the event is published once per reason, not on every reconcile.
    label_refusals: HashMap<NodeName, (Option<Box<str>>, String)>,
    /// Bumped whenever what the Nodes hold changes ([`Allocator::put`], [`Allocator::take`]).
    holdings_generation: u64,
    /// The last clause of [`Allocator::space_holders`]: `(holdings_generation, cluster CIDR,
    /// clause)`. While the pool is full nothing is held anew, so every further failure reuses it
    /// instead of looking through every record again (O(1) per failing Node, not O(held)).
    space_holders_memo: Option<(u64, Cidr, String)>,
    /// Records [`Allocator::space_holders`] has looked through, in total (its cost, for tests).
    space_holders_visited: u64,
}

impl Allocator {
    /// Builds the pool from a validated configuration (one set per cluster CIDR, storage sized
    /// exactly) and reserves the service CIDRs: the range allocator, every Node gets the node CIDR
    /// mask size ([`Sizing::range_allocator`]).
    ///
    /// # Errors
    /// [`AllocError::ServiceCidrFillsClusterCidr`] when a service CIDR leaves a cluster CIDR no free
    /// block (a configuration error); other [`AllocError`]s cannot happen for a validated config.
    pub fn new(config: &IpamConfig) -> Result<Allocator, AllocError> {
        Allocator::with_sizing(config, Sizing::range_allocator(config))
    }

    /// As [`Allocator::new`], with per-Node sizes: each cluster CIDR's set is cut into its grid
    /// ([`crate::node_pools::SetSizing::grid_mask`]), fixed for the allocator's life.
    ///
    /// # Errors
    /// As [`Allocator::new`]; [`AllocError::InvalidNodeMaskSize`] or
    /// [`AllocError::TooManyBlocks`] for a sizing not built from this configuration.
    pub fn with_sizing(config: &IpamConfig, sizing: Sizing) -> Result<Allocator, AllocError> {
        let mut sets = config.cluster_cidrs.iter().map(|c| {
            let grid = sizing
                .set_for(c.cluster_cidr.family())
                .filter(|s| s.cluster_cidr == c.cluster_cidr)
                .map_or(c.node_mask_size, |s| s.grid_mask);
            let words = storage_words_for(c.cluster_cidr.prefix_len(), grid);
            CidrSet::new(c.cluster_cidr, grid, vec![0u64; words])
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
            skipped: 0,
            sizing,
            label_refusals: HashMap::new(),
            holdings_generation: 0,
            space_holders_memo: None,
            space_holders_visited: 0,
        })
    }

    /// The per-Node sizes this allocator applies.
    pub fn sizing(&self) -> &Sizing {
        &self.sizing
    }

    /// The largest free aligned block of each cluster CIDR (flag order), `None` when it is full
    /// (see [`CidrSet::largest_free_block`] for the cost).
    pub fn largest_free_blocks(&self) -> Vec<(Cidr, Option<FreeBlock>)> {
        self.pool
            .sets()
            .iter()
            .map(|set| (set.cluster_cidr(), set.largest_free_block()))
            .collect()
    }

    /// For a Node that keeps `pod_cidrs`: a sentence naming each podCIDR whose size differs from
    /// the size its labels select now (podCIDRs cannot change once set, so it keeps them), or
    /// `None` when they agree (or its mask label is unusable).
    pub fn size_mismatch(&self, node: &NodeView, pod_cidrs: &[Cidr]) -> Option<String> {
        let masks = self.sizing.resolve(&node.labels).ok()?;
        let differences: Vec<String> = pod_cidrs
            .iter()
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
        self.nodes
            .get(name)
            .filter(|r| r.state != RecordState::Gone)
            .map(|r| r.held.as_slice())
    }

    /// Whether Node `name` has a pending (not yet confirmed) allocation.
    pub fn is_pending(&self, name: &str) -> bool {
        self.nodes
            .get(name)
            .is_some_and(|r| matches!(r.state, RecordState::Pending(_)))
    }

    /// Whether Node `name` has a pending allocation whose write may have been applied without us
    /// knowing (an attempt ended with an unknown outcome).
    pub fn is_maybe_sent(&self, name: &str) -> bool {
        self.nodes
            .get(name)
            .is_some_and(|r| matches!(r.state, RecordState::Pending(p) if p.maybe_sent))
    }

    /// Number of Nodes currently skipped.
    pub fn skipped_count(&self) -> usize {
        self.skipped
    }

    /// Stores `record` for `name` (replacing none: callers [`Allocator::take`] first).
    fn put(&mut self, name: NodeName, record: NodeRecord) {
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        if matches!(record.state, RecordState::Skipped(_)) {
            self.skipped += 1;
        }
        if let Some(old) = self.nodes.insert(name, record)
            && matches!(old.state, RecordState::Skipped(_))
        {
            self.skipped -= 1;
        }
    }

    /// Removes and returns `name`'s record.
    fn take(&mut self, name: &str) -> Option<NodeRecord> {
        let record = self.nodes.remove(name)?;
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        if matches!(record.state, RecordState::Skipped(_)) {
            self.skipped -= 1;
        }
        Some(record)
    }

    /// Makes room for `additional` more Node records at once (e.g. the Nodes with podCIDRs of a
    /// list about to be occupied), so the index is not grown, old and new table side by side,
    /// while they are added (at 60,000 records that transient was ~6 MB).
    pub fn reserve_nodes(&mut self, additional: usize) {
        self.nodes.reserve(additional);
    }

    /// Names of every Node the allocator holds something for (sorted).
    pub fn known_names(&self) -> Vec<NodeName> {
        let mut names: Vec<NodeName> = self
            .nodes
            .iter()
            .filter(|(_, r)| r.state != RecordState::Gone)
            .map(|(name, _)| name.clone())
            .collect();
        names.sort();
        names
    }

    /// Start-up: occupies the podCIDRs of every Node that has them, in list order, before any
    /// allocation. Nodes without podCIDRs are left for [`Allocator::decide`]. Returns one decision
    /// per Node that has podCIDRs (Keep, or Skip with its event and metric).
    pub fn startup_occupy(&mut self, nodes: &[NodeView]) -> Vec<(NodeName, Decision)> {
        nodes
            .iter()
            .filter(|n| n.has_pod_cidrs())
            .map(|n| (n.name.clone(), self.observe_existing(n)))
            .collect()
    }

    /// Decides for one Node as seen now: occupy what it has (Keep/Skip), re-send a pending
    /// allocation, or allocate (Assign/Fail). Idempotent: seeing the same Node again changes
    /// nothing and emits nothing new. `node` is the informer's copy: while the name's record is
    /// ahead of the informer ([`Allocator::decide_fresh`]), a copy of another object changes
    /// nothing and the decision is [`Next::Reread`].
    pub fn decide(&mut self, node: &NodeView) -> Decision {
        if let Some(record) = self.nodes.get_mut(&node.name)
            && record.ahead_of_informer
        {
            if record.is_for(node.uid.as_deref()) {
                // The informer has caught up with what the API server told us.
                record.ahead_of_informer = false;
            } else {
                return informer_behind();
            }
        }
        self.decide_view(node)
    }

    /// [`Allocator::decide`] on a Node as the API server answered it (a GET, or the object a
    /// PATCH returned), which may be newer than the informer's copy: the record is marked ahead
    /// of the informer, so the informer's older copies of this name are checked with a GET
    /// instead of acted on until it shows this object. (A GET without `resourceVersion` is a
    /// quorum read: it shows at least every state observed before it was sent, so an object
    /// another uid replaced can never reappear in one.)
    pub fn decide_fresh(&mut self, node: &NodeView) -> Decision {
        let decision = self.decide_view(node);
        if let Some(record) = self.nodes.get_mut(&node.name)
            && record.state != RecordState::Gone
            && record.is_for(node.uid.as_deref())
        {
            record.ahead_of_informer = true;
        }
        decision
    }

    /// The uid of the Node object `name`'s record is for (`None` if there is no record or the
    /// Node had no uid), as the API server's text.
    pub fn record_uid(&self, name: &str) -> Option<String> {
        self.nodes
            .get(name)
            .and_then(|r| r.uid.as_ref())
            .map(ToString::to_string)
    }

    fn decide_view(&mut self, node: &NodeView) -> Decision {
        if node.has_pod_cidrs() {
            return self.observe_existing(node);
        }
        let uid = node.uid.as_deref();
        let mut released = Vec::new();
        if let Some(record) = self.nodes.get(&node.name) {
            let same_object = record.is_for(uid);
            match &record.state {
                RecordState::Pending(_) if same_object => {
                    if node.deleting {
                        // Our write may still land; the reservation goes when the object does.
                        return Decision::new(Action::Skip {
                            reason: deleting_reason(),
                        });
                    }
                    return Decision::assign(record.held.clone(), uid);
                }
                // podCIDRs cannot be removed once set: a stale view of the same Node (e.g. the
                // informer has not delivered our own PATCH yet). Nothing to do.
                RecordState::Held if same_object && uid.is_some() => {
                    return Decision::new(Action::Keep {
                        pod_cidrs: record.held.clone(),
                    });
                }
                RecordState::Gone if same_object => {
                    return Decision::new(Action::Skip {
                        reason: "the API server says this Node object is gone; waiting for the watch to catch up".to_owned(),
                    });
                }
                // Any other record belongs to an earlier object of this name (it had podCIDRs,
                // which cannot be removed, or another uid): that object is gone, and writes pinned
                // to its uid cannot reach this one.
                _ => released = self.forget(&node.name),
            }
        }
        if node.deleting {
            return Decision::new(Action::Skip {
                reason: deleting_reason(),
            })
            .after_metrics(released);
        }
        self.allocate(node).after_metrics(released)
    }

    /// The PATCH of Node `name` (object `uid`) assigning `pod_cidrs` ended with `outcome`. If the
    /// reservation it was sent for is no longer pending (the Node was deleted or replaced
    /// meanwhile), only an applied write matters: the Node is decided on as the server returned it.
    pub fn patch_outcome(
        &mut self,
        name: &str,
        uid: Option<&str>,
        pod_cidrs: &[Cidr],
        outcome: PatchOutcome,
    ) -> Decision {
        let pending = match self.nodes.get(name) {
            Some(record)
                if record.is_for(uid)
                    && record.held == pod_cidrs
                    && matches!(record.state, RecordState::Pending(_)) =>
            {
                match record.state {
                    RecordState::Pending(p) => Some(p),
                    _ => None,
                }
            }
            _ => None,
        };
        let Some(mut pending) = pending else {
            return match outcome {
                PatchOutcome::Applied(view) => self.decide_fresh(&view),
                _ => Decision::new(Action::Skip {
                    reason: "the reservation this write was for is gone".to_owned(),
                }),
            };
        };
        let failure = PatchOutcome::metric_label(&outcome);
        let failed = MetricEvent::PatchFailed { error: failure };
        match outcome {
            PatchOutcome::Applied(view) => {
                if view.uid.as_deref() == uid
                    && view.parsed_pod_cidrs().as_deref() == Some(pod_cidrs)
                {
                    if let Some(record) = self.nodes.get_mut(name) {
                        record.state = RecordState::Held;
                    }
                    Decision::new(Action::Keep {
                        pod_cidrs: pod_cidrs.to_vec(),
                    })
                } else {
                    self.decide_fresh(&view)
                }
            }
            PatchOutcome::NotFound => self.object_gone(name, uid).after_metrics(vec![failed]),
            PatchOutcome::CannotApply { kind, message } => {
                // No attempt of this body can ever apply (podCIDRs are immutable once set, the
                // object is another one, or the value is refused), earlier ones included.
                let released = self.forget(name);
                let mut decision = Decision::new(Action::Released {
                    pod_cidrs: pod_cidrs.to_vec(),
                })
                .then(Next::Reread)
                .after_metrics(released);
                decision.metrics.insert(0, failed);
                if kind == CannotApplyKind::Invalid {
                    decision
                        .events
                        .push(assignment_failed(name, pod_cidrs, &message));
                }
                decision
            }
            PatchOutcome::Refused { ref message, .. } if !pending.maybe_sent => {
                // Definitely not written, and no earlier attempt can land: free the block.
                let released = self.forget(name);
                let mut decision = Decision::new(Action::Released {
                    pod_cidrs: pod_cidrs.to_vec(),
                })
                .then(Next::RetryBackoff)
                .after_metrics(released);
                decision.metrics.insert(0, failed);
                decision
                    .events
                    .push(assignment_failed(name, pod_cidrs, message));
                decision
            }
            other => {
                pending.failures = pending.failures.saturating_add(1);
                if matches!(other, PatchOutcome::Unknown { .. }) {
                    pending.maybe_sent = true;
                }
                if let Some(record) = self.nodes.get_mut(name) {
                    record.state = RecordState::Pending(pending);
                }
                let next = match &other {
                    PatchOutcome::RetryLater {
                        retry_after: Some(after),
                        ..
                    } => Next::RetryAfter(*after),
                    _ => Next::RetryBackoff,
                };
                let reason = if pending.maybe_sent {
                    format!(
                        "{}; the write may still land, so {} stays reserved and is sent again",
                        other.describe(),
                        join(pod_cidrs)
                    )
                } else {
                    format!("{}; sending {} again", other.describe(), join(pod_cidrs))
                };
                let mut decision = Decision::new(Action::KeepTrying {
                    pod_cidrs: pod_cidrs.to_vec(),
                    reason,
                })
                .then(next);
                decision.metrics.push(failed);
                if pending.failures == FAILED_PATCHES_BEFORE_EVENT {
                    decision
                        .events
                        .push(assignment_failed(name, pod_cidrs, &other.describe()));
                }
                decision
            }
        }
    }

    /// The PATCH definitely failed and no earlier attempt can land: releases Node `name`'s pending
    /// reservation (if any), so the next attempt allocates again. Held and skipped records are
    /// left alone. (`plan` and tests; the controller uses [`Allocator::patch_outcome`].)
    pub fn abort(&mut self, name: &str) -> Decision {
        if !self.is_pending(name) {
            return Decision::new(Action::Released {
                pod_cidrs: Vec::new(),
            });
        }
        self.release_record(name)
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

    /// The PATCH assigning `pod_cidrs` to Node `name` succeeded: the pending reservation becomes
    /// held. Returns false (and changes nothing) if `name` had no such pending reservation.
    pub fn confirm(&mut self, name: &str, pod_cidrs: &[Cidr]) -> bool {
        match self.nodes.get_mut(name) {
            Some(record)
                if matches!(record.state, RecordState::Pending(_)) && record.held == pod_cidrs =>
            {
                record.state = RecordState::Held;
                true
            }
            _ => false,
        }
    }

    /// Node `name` is gone (the informer delivered its deletion, or it is no longer listed):
    /// releases every block it held, except blocks another Node's podCIDR or a service CIDR still
    /// overlaps. Unknown names release nothing.
    ///
    /// While the record is ahead of the informer (decided on a newer answer of the API server),
    /// the deletion may be of an earlier object of the name: nothing is released, and the
    /// decision says to check with a GET ([`Next::Reread`], then [`Allocator::object_gone`] on
    /// 404).
    pub fn remove(&mut self, name: &str) -> Decision {
        if self
            .nodes
            .get(name)
            .is_some_and(|r| r.ahead_of_informer && r.state != RecordState::Gone)
        {
            return informer_behind();
        }
        self.release_record(name)
    }

    /// Forgets `name`'s record and releases what it held (see [`Allocator::remove`]).
    fn release_record(&mut self, name: &str) -> Decision {
        let held = self
            .nodes
            .get(name)
            .filter(|r| r.state != RecordState::Gone)
            .map(|r| r.held.clone())
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
                held: Vec::new(),
                state: RecordState::Gone,
                uid: uid.map(Into::into),
                ahead_of_informer: false,
            },
        );
        decision
    }

    /// Removes `name`'s record and releases what it held; returns the release metrics.
    fn forget(&mut self, name: &str) -> Vec<MetricEvent> {
        match self.take(name) {
            Some(record) => self.release_cidrs(&record.held),
            None => Vec::new(),
        }
    }

    /// The [`MetricEvent::Occupied`] for `blocks` blocks of `cidr` newly marked used.
    fn occupied_metric(&self, cidr: Cidr, blocks: u32) -> Option<MetricEvent> {
        self.cluster_cidr_of(cidr)
            .map(|cluster_cidr| MetricEvent::Occupied {
                cluster_cidr,
                blocks,
            })
    }

    fn cluster_cidr_of(&self, cidr: Cidr) -> Option<Cidr> {
        self.pool
            .set_for(cidr.family())
            .map(|set| set.cluster_cidr())
    }

    /// Allocates one block per cluster CIDR for a Node without podCIDRs (no record for it), of
    /// the sizes its labels select.
    fn allocate(&mut self, node: &NodeView) -> Decision {
        let masks = match self.sizing.resolve(&node.labels) {
            Ok(masks) => masks,
            Err(error) => return self.refuse_mask_label(node, &error.to_string()),
        };
        self.label_refusals.remove(&node.name);
        let requests: Vec<BlockRequest> = self
            .pool
            .sets()
            .iter()
            .zip(&masks)
            .map(|(set, mask)| BlockRequest {
                prefix_len: mask.prefix_len,
                placement: self.placement(set.cluster_cidr(), mask.prefix_len),
            })
            .collect();
        match self.pool.allocate_node_blocks(&requests) {
            Ok(blocks) => {
                let pod_cidrs: Vec<Cidr> = blocks.iter().map(|b| b.cidr).collect();
                let metrics = blocks
                    .iter()
                    .filter_map(|b| {
                        self.cluster_cidr_of(b.cidr)
                            .map(|cluster_cidr| MetricEvent::Allocated {
                                cluster_cidr,
                                tries: b.tries,
                            })
                    })
                    .collect();
                self.put(
                    node.name.clone(),
                    NodeRecord {
                        held: pod_cidrs.clone(),
                        state: RecordState::Pending(PendingWrite::default()),
                        ahead_of_informer: false,
                        uid: node.uid.as_deref().map(Into::into),
                    },
                );
                let mut decision = Decision::assign(pod_cidrs, node.uid.as_deref());
                decision.metrics = metrics;
                decision
            }
            Err(error) => {
                let mut metrics = Vec::new();
                let mut reason = format!("no pod CIDR could be allocated: {error}");
                if let AllocError::Exhausted { cluster_cidr } = error {
                    metrics.push(MetricEvent::Exhausted { cluster_cidr });
                    reason.push_str(&self.block_size_clause(cluster_cidr, &masks));
                    reason.push_str(&self.space_holders(cluster_cidr));
                }
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
        }
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
    fn refuse_mask_label(&mut self, node: &NodeView, why: &str) -> Decision {
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
    /// was one grid block: then the cluster CIDR is simply full).
    fn block_size_clause(&self, cluster_cidr: Cidr, masks: &[NodeMask]) -> String {
        let Some(index) = self
            .pool
            .sets()
            .iter()
            .position(|s| s.cluster_cidr() == cluster_cidr)
        else {
            return String::new();
        };
        let (Some(set), Some(mask)) = (self.pool.sets().get(index), masks.get(index)) else {
            return String::new();
        };
        if mask.prefix_len == set.node_mask_size() && mask.source == MaskSource::Default {
            return String::new();
        }
        let largest = match set.largest_free_block() {
            Some(free) => format!("the largest free block is {}", free.cidr),
            None => "no block is free".to_owned(),
        };
        format!(
            " (no free aligned /{} as {} asks; {} of {} /{} blocks are free, {largest})",
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
        if let Some((generation, cidr, clause)) = &self.space_holders_memo
            && *generation == self.holdings_generation
            && *cidr == cluster_cidr
        {
            return clause.clone();
        }
        let clause = self.find_space_holders(cluster_cidr);
        self.space_holders_visited = self
            .space_holders_visited
            .saturating_add(self.nodes.len() as u64);
        self.space_holders_memo = Some((self.holdings_generation, cluster_cidr, clause.clone()));
        clause
    }

    /// [`Allocator::space_holders`] computed: one pass over every record.
    fn find_space_holders(&self, cluster_cidr: Cidr) -> String {
        let Some(set) = self.pool.set_for(cluster_cidr.family()) else {
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
                        c.family() == cluster_cidr.family() && c.prefix_len() < coarsest
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

    /// The events of [`crate::diagnostics::node_findings`] for `node` against this pool's cluster
    /// CIDRs (flag order).
    fn node_findings(&self, node: &NodeView) -> Vec<EventSpec> {
        let cluster_cidrs: Vec<Cidr> = self.pool.sets().iter().map(|s| s.cluster_cidr()).collect();
        crate::diagnostics::node_findings_in(&cluster_cidrs, node)
            .iter()
            .filter_map(crate::diagnostics::Finding::event)
            .collect()
    }

    /// Occupies a Node's existing podCIDRs, or skips it; a Node occupied anew carries its
    /// diagnostic events (R08, R10, R11).
    fn observe_existing(&mut self, node: &NodeView) -> Decision {
        let raw = node.raw_pod_cidrs();
        let parsed = node.parsed_pod_cidrs();
        let uid = node.uid.as_deref();
        if let Some(record) = self.nodes.get_mut(&node.name) {
            match &record.state {
                RecordState::Held | RecordState::Pending(_)
                    if parsed.as_deref() == Some(record.held.as_slice()) =>
                {
                    // Seen again, or our own PATCH observed before its response: now confirmed.
                    record.state = RecordState::Held;
                    record.uid = uid.map(Into::into);
                    return Decision::new(Action::Keep {
                        pod_cidrs: record.held.clone(),
                    });
                }
                RecordState::Skipped(info) if info.raw == raw && record.is_for(uid) => {
                    return Decision::new(Action::Skip {
                        reason: info.reason.clone(),
                    });
                }
                _ => {}
            }
        }
        // Anything else held for this name can go: a pending write of ours can never land on a
        // Node that has podCIDRs (they are immutable), nor on another object (the uid pin).
        let released = self.forget(&node.name);
        let decision = match self.check_existing(node, &raw) {
            Ok(pod_cidrs) => {
                let mut occupied = Vec::new();
                for cidr in &pod_cidrs {
                    // check_existing ran Pool::check_node, so every CIDR overlaps its family's set.
                    if let Ok(blocks @ 1..) = self.pool.occupy(*cidr) {
                        occupied.extend(self.occupied_metric(*cidr, blocks));
                    }
                }
                self.put(
                    node.name.clone(),
                    NodeRecord {
                        held: pod_cidrs.clone(),
                        state: RecordState::Held,
                        uid: uid.map(Into::into),
                        ahead_of_informer: false,
                    },
                );
                let mut decision = Decision::new(Action::Keep { pod_cidrs });
                decision.metrics = occupied;
                // The diagnostics of podCIDRs seen for the first time (R08, R10, R11), at start-up
                // or while running: a Node seen again with the same podCIDRs returned above.
                decision.events = self.node_findings(node);
                decision
            }
            Err(skip) => {
                let mut occupied = Vec::new();
                let mut held = Vec::new();
                for cidr in skip.reservable.iter().copied() {
                    if let Ok(blocks) = self.pool.occupy(cidr) {
                        held.push(cidr);
                        if blocks > 0 {
                            occupied.extend(self.occupied_metric(cidr, blocks));
                        }
                    }
                }
                let mut decision = Decision::new(Action::Skip {
                    reason: skip.reason.clone(),
                });
                decision.metrics = occupied;
                decision.events.push(EventSpec {
                    kind: EventKind::Warning,
                    reason: skip.kind.event_reason(),
                    note: truncate_note(format!(
                        "Node {} skipped by the node IPAM controller: {}",
                        node.name, skip.reason
                    )),
                    action: reasons::ACTION_OCCUPY,
                });
                decision
                    .metrics
                    .push(MetricEvent::NodeSkipped { kind: skip.kind });
                self.put(
                    node.name.clone(),
                    NodeRecord {
                        held,
                        state: RecordState::Skipped(Box::new(SkipInfo {
                            raw,
                            kind: skip.kind,
                            reason: skip.reason,
                        })),
                        uid: uid.map(Into::into),
                        ahead_of_informer: false,
                    },
                );
                decision
            }
        };
        decision.after_metrics(released)
    }

    /// Checks a Node's podCIDRs: well-formed, in range, no overlap with a service CIDR or another
    /// Node. The count and family rules are the core's ([`Pool::check_node`]), mapped to skip kinds.
    fn check_existing(&self, node: &NodeView, raw: &[String]) -> Result<Vec<Cidr>, SkipReport> {
        let mut parsed = Vec::new();
        let mut bad = None;
        for (index, text) in raw.iter().enumerate() {
            // Not trimmed: the API server rejects podCIDRs with surrounding whitespace, and a CNI
            // reading the Node would not parse them either. Leading zeros (`010.0.50.0/24`) are
            // read as decimal, as kube-controller-manager's ParseCIDRSloppy reads them.
            match Cidr::parse_sloppy(text) {
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
            && Cidr::parse_sloppy(first_text).map(|(c, _)| c) != Ok(*first)
        {
            return Err(invalid(
                format!("spec.podCIDR {first_text:?} differs from spec.podCIDRs[0] {first}"),
                parsed,
            ));
        }
        if let Err(error) = self.pool.check_node(&parsed) {
            let kind = match error {
                AllocError::TooManyCidrs { .. } | AllocError::DuplicateFamily { .. } => {
                    SkipKind::Invalid
                }
                _ => SkipKind::OutOfRange,
            };
            let reservable = parsed
                .iter()
                .copied()
                .filter(|c| {
                    self.pool
                        .set_for(c.family())
                        .is_some_and(|s| s.block_range(*c).is_ok())
                })
                .collect();
            let reason = match kind {
                SkipKind::Invalid => format!("spec.podCIDRs {}: {error}", join(&parsed)),
                _ => format!("its podCIDRs cannot be used with this configuration: {error}"),
            };
            return Err(SkipReport {
                kind,
                reason,
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
                .filter(|(name, _)| **name != node.name)
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
            let mut blocks = 0;
            for (first, last) in uncovered_runs(begin, end, &mut covered) {
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

fn deleting_reason() -> String {
    "the Node is being deleted (deletionTimestamp is set): no pod CIDR is allocated to it"
        .to_owned()
}

fn join(cidrs: &[Cidr]) -> String {
    cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn assignment_failed(name: &str, pod_cidrs: &[Cidr], why: &str) -> EventSpec {
    EventSpec {
        kind: EventKind::Warning,
        reason: reasons::CIDR_ASSIGNMENT_FAILED,
        note: truncate_note(format!(
            "Node {name}: writing spec.podCIDRs {} failed: {why}",
            join(pod_cidrs)
        )),
        action: reasons::ACTION_PATCH,
    }
}

/// events.k8s.io/v1 `note` is limited to 1 kB (`validation.go`: `NoteLengthLimit = 1024`).
fn truncate_note(mut note: String) -> String {
    const LIMIT: usize = 1024;
    if note.len() > LIMIT {
        let mut cut = LIMIT - 3;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
        note.push_str("...");
    }
    note
}

/// Why a Node is skipped, and which of its CIDRs to keep reserved.
struct SkipReport {
    kind: SkipKind,
    reason: String,
    reservable: Vec<Cidr>,
}

#[cfg(test)]
mod tests;

#[cfg(test)]
mod node_pool_tests;
