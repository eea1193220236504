//! The decision logic, pure and synchronous: an index of Nodes → the pod CIDRs reserved for them,
//! plus the [`Pool`]. Each call takes plain data (a [`NodeView`], or a [`PatchOutcome`]) and
//! returns a [`Decision`]: the action, the strategic-merge patch to send (if any), the events, the
//! metric updates and what to do next. The controller is the only code that holds a client; it
//! applies decisions (linkerd policy-controller style).
//!
//! Rules (kube-controller-manager's range allocator, `pkg/controller/nodeipam/ipam/range_allocator.go`,
//! with the fixes listed in docs/kcm-differences.md):
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
//!   unusable gets nothing until the label changes (one Warning event);
//! - a Node `--node-selector` does not select ([`Sizing::serves`]) is **not served**
//!   ([`Action::NotServed`]): never written, no event, not counted as skipped or waiting. What
//!   its podCIDRs cover is occupied all the same — checked and reserved as for any Node, so a
//!   served Node can never be given a block it holds — and a Node that leaves the selection
//!   keeps what it holds (a reservation whose write may still land included: nothing is
//!   released, nothing is sent). A Node that enters the selection is served like a new Node (its
//!   diagnostic or skip events come then). Its deletion releases as for any Node.

use std::collections::HashMap;

use nodeipam_core::{AllocError, Cidr, CidrSet, FreeBlock, IpamConfig, Pool, storage_words_for};

use crate::compact::Uid;
use crate::node_pools::Sizing;
use crate::reasons;

mod allocate;
mod cluster_cidrs;
mod decision;
pub mod diagnostics;
mod existing;
mod outcome;
mod quarantine;
mod release;

pub use cluster_cidrs::{ClusterCidrSync, Fence, Holders, MAX_BACKING_SETS};
pub use decision::{
    Action, Decision, EventKind, EventSpec, MetricEvent, Next, NodeName, NodeView, SkipKind,
};
pub use outcome::{CannotApplyKind, FAILED_PATCHES_BEFORE_EVENT, PatchOutcome, pod_cidrs_patch};
pub use release::uncovered_runs;

use cluster_cidrs::Hosting;
use decision::informer_behind;

/// Capacity and usage of one cluster CIDR, in grid blocks (the `*_blocks` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolStats {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// The grid block prefix length, bits: the finest size a Node can get (the node CIDR mask
    /// size without node-pool rules). The `*_blocks` fields count blocks of this size.
    pub node_mask_size: u8,
    /// Total grid blocks.
    pub capacity_blocks: u32,
    /// Allocated or reserved grid blocks (Nodes served or not, pending patches, service CIDRs,
    /// skipped Nodes).
    pub used_blocks: u32,
    /// Free grid blocks.
    pub free_blocks: u32,
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
    /// The Node object `uid` was deleted while holding `held`: the blocks stay reserved for its
    /// name until the deletion quarantine ends ([`Allocator::remove`] again), so a Node of that
    /// name re-created with them (`kubectl replace --force`, a restore) keeps them, and one
    /// re-created without podCIDRs gets them back ([`Allocator::set_deletion_quarantine`]).
    Quarantined,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct SkipInfo {
    raw: Vec<String>,
    kind: SkipKind,
    reason: String,
}

/// One Node's entry in the allocator's index: 64 bytes on 64-bit targets (the index is a hash
/// table of these, keyed by name, with about twice as many buckets as Nodes after growth: every
/// byte here is ~0.5 MiB at 150,000 Nodes), plus the held CIDRs' block.
#[derive(Debug, Clone)]
struct NodeRecord {
    /// What the record reserves in the pool: one block per cluster CIDR for a Node we allocated
    /// or that has podCIDRs, any number for a skipped one. A boxed slice (16 bytes, allocated to
    /// the exact length), not a `Vec` (24).
    held: Box<[Cidr]>,
    state: RecordState,
    uid: Option<Uid>,
    /// The record was last decided on what the API server answered (a GET, a PATCH response),
    /// which can be newer than the informer's copy: until the informer shows this object
    /// ([`NodeRecord::uid`]), its copies of other objects of the name, and its deletions, may be
    /// older, so they are checked with a GET instead of acted on ([`Next::Reread`]).
    ahead_of_informer: bool,
    /// The Node was selected by `--node-selector` when last decided on (its skip, if any, is
    /// counted and reported only then).
    served: bool,
}

impl NodeRecord {
    fn is_for(&self, uid: Option<&str>) -> bool {
        Uid::same(self.uid.as_ref(), uid)
    }

    /// Whether the record counts as a skipped Node (metric, [`Allocator::skipped_count`]).
    fn counts_as_skipped(&self) -> bool {
        self.served && matches!(self.state, RecordState::Skipped(_))
    }
}

/// The allocator state: the pool and who holds what. `Clone` copies the whole state (`plan`
/// copies it per pass; the model checker, `model-check/tests/model_check.rs`, branches on it).
#[derive(Debug, Clone)]
pub struct Allocator {
    /// The backing sets: one per `--cluster-cidr` entry, flag order (several per family: issue
    /// 18 §1); once ClusterCIDRs are hosted, reshaped to cover them too (disjoint, see
    /// [`cluster_cidrs`]).
    pool: Pool<Vec<u64>, MAX_BACKING_SETS>,
    /// The ClusterCIDR pools and every pool's range ([`Allocator::sync_cluster_cidrs`]).
    cluster_cidrs: Hosting,
    service_cidrs: Vec<Cidr>,
    nodes: HashMap<NodeName, NodeRecord>,
    /// Served records in [`RecordState::Skipped`] (kept in step by [`Allocator::put`],
    /// [`Allocator::take`] and [`Allocator::set_served`]).
    skipped: usize,
    /// Per-Node mask sizes and the grid of each cluster CIDR.
    sizing: Sizing,
    /// Nodes without podCIDRs refused for their mask label: the object (uid) and the reason last
    /// reported, so the event is published once per reason, not on every reconcile.
    label_refusals: HashMap<NodeName, (Option<Box<str>>, String)>,
    /// Bumped whenever what the Nodes hold changes ([`Allocator::put`], [`Allocator::take`]).
    holdings_generation: u64,
    /// The clauses of [`Allocator::space_holders`] computed at `holdings_generation`, one per
    /// cluster CIDR asked about. While the pool is full nothing is held anew, so every further
    /// failure reuses them instead of looking through every record again (O(1) per failing Node
    /// and exhausted cluster CIDR, not O(held)).
    space_holders_memo: Option<(u64, Vec<(Cidr, String)>)>,
    /// Records [`Allocator::space_holders`] has looked through, in total (its cost, for tests).
    space_holders_visited: u64,
    /// Whether the deletion of a Node holding podCIDRs quarantines them for its name
    /// ([`Allocator::set_deletion_quarantine`]).
    deletion_quarantine: bool,
    /// Every name quarantined since it was last cleaned (a superset of the records in
    /// [`RecordState::Quarantined`], cleaned lazily), so that a Node's occupy looks through the
    /// quarantines, not every record: O(1) at start-up and whenever none is running.
    quarantine_names: std::collections::HashSet<NodeName>,
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
        let sets = config
            .cluster_cidrs
            .iter()
            .map(|c| {
                let grid = sizing
                    .set_of(c.cluster_cidr)
                    .map_or(c.node_mask_size, |s| s.grid_mask);
                let words = storage_words_for(c.cluster_cidr.prefix_len(), grid);
                CidrSet::new(c.cluster_cidr, grid, vec![0u64; words])
            })
            .collect::<Result<Vec<_>, _>>()?;
        let mut pool = Pool::from_sets(sets)?;
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
            cluster_cidrs: Hosting::default(),
            holdings_generation: 0,
            space_holders_memo: None,
            space_holders_visited: 0,
            deletion_quarantine: false,
            quarantine_names: std::collections::HashSet::new(),
        })
    }

    /// Turns the deletion quarantine on or off (off when built; the controller turns it on with
    /// a non-zero `--deleted-node-cidr-quarantine`). While on, [`Allocator::remove`] of a Node
    /// holding podCIDRs keeps them reserved for its name ([`Action::Quarantined`],
    /// [`Next::EndQuarantine`]) until `remove` is called for the name again, when the shell's
    /// timer ends the quarantine.
    ///
    /// The quarantine is for liveness and behaviour parity only: `kubectl replace --force` (or a
    /// restore) deletes a Node and creates it again with the same podCIDRs; without it a Node
    /// waiting for a block is woken by the deletion and given that block before the watch shows
    /// the re-created Node, which then holds a block another Node was given — reported as a
    /// conflict ([`SkipKind::Conflict`]), never kept twice. Safety never rests on its length:
    /// if it ends before the re-created Node is seen, that is exactly what happens, as without it.
    pub fn set_deletion_quarantine(&mut self, on: bool) {
        self.deletion_quarantine = on;
    }

    /// The per-Node sizes this allocator applies.
    pub fn sizing(&self) -> &Sizing {
        &self.sizing
    }

    /// The largest free aligned block of each cluster CIDR (flag order; per backing set as
    /// [`Allocator::pool_stats`]), `None` when it is full
    /// (see [`CidrSet::largest_free_block`] for the cost).
    pub fn largest_free_blocks(&self) -> Vec<(Cidr, Option<FreeBlock>)> {
        self.pool
            .sets()
            .iter()
            .map(|set| (set.cluster_cidr(), set.largest_free_block()))
            .collect()
    }

    /// Capacity and usage per cluster CIDR, flag order; once ClusterCIDRs are hosted, per backing
    /// set (disjoint, so nothing is counted twice: a set may cover several pools, see
    /// [`Allocator::sync_cluster_cidrs`]), the flag CIDRs' sets (or the sets that replaced them)
    /// first.
    pub fn pool_stats(&self) -> Vec<PoolStats> {
        self.pool
            .sets()
            .iter()
            .map(|set| PoolStats {
                cluster_cidr: set.cluster_cidr(),
                node_mask_size: set.node_mask_size(),
                capacity_blocks: set.block_count(),
                used_blocks: set.allocated_count(),
                free_blocks: set.free_count(),
            })
            .collect()
    }

    /// The CIDRs reserved for Node `name` (held, pending or the reserved part of a skipped Node).
    pub fn held(&self, name: &str) -> Option<&[Cidr]> {
        self.nodes
            .get(name)
            .filter(|r| r.state != RecordState::Gone)
            .map(|r| &*r.held)
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

    /// Number of served Nodes currently skipped.
    pub fn skipped_count(&self) -> usize {
        self.skipped
    }

    /// Stores `record` for `name` (replacing none: callers [`Allocator::take`] first).
    fn put(&mut self, name: NodeName, record: NodeRecord) {
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        if record.counts_as_skipped() {
            self.skipped += 1;
        }
        if let Some(old) = self.nodes.insert(name, record)
            && old.counts_as_skipped()
        {
            self.skipped -= 1;
        }
    }

    /// Marks `name`'s record (if any) served or not, keeping the skipped count in step.
    fn set_served(&mut self, name: &str, served: bool) {
        if let Some(record) = self.nodes.get_mut(name) {
            let before = record.counts_as_skipped();
            record.served = served;
            match (before, record.counts_as_skipped()) {
                (false, true) => self.skipped += 1,
                (true, false) => self.skipped -= 1,
                _ => {}
            }
        }
    }

    /// Removes and returns `name`'s record.
    fn take(&mut self, name: &str) -> Option<NodeRecord> {
        let record = self.nodes.remove(name)?;
        self.holdings_generation = self.holdings_generation.wrapping_add(1);
        if record.counts_as_skipped() {
            self.skipped -= 1;
        }
        Some(record)
    }

    /// Makes room for `additional` more Node records at once (e.g. every Node of a list about to
    /// be occupied and allocated), so the index is not grown, old and new table side by side,
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
        if !self.sizing.serves(&node.labels) {
            return self.not_served_without_pod_cidrs(node);
        }
        self.set_served(&node.name, true);
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
                    return Decision::assign(record.held.to_vec(), uid);
                }
                // podCIDRs cannot be removed once set: a stale view of the same Node (e.g. the
                // informer has not delivered our own PATCH yet). Nothing to do.
                RecordState::Held if same_object && uid.is_some() => {
                    return Decision::new(Action::Keep {
                        pod_cidrs: record.held.to_vec(),
                    });
                }
                RecordState::Gone if same_object => {
                    return Decision::new(Action::Skip {
                        reason: "the API server says this Node object is gone; waiting for the watch to catch up".to_owned(),
                    });
                }
                // A deleted Node of this name left blocks in quarantine: a re-created one
                // without podCIDRs gets them back when they are what it would be given.
                RecordState::Quarantined if !node.deleting => {
                    if let Some(decision) = self.give_back(node) {
                        return decision;
                    }
                    released = self.forget(&node.name);
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

    /// Everything that decides this allocator's future answers, as canonical text: the pool (every
    /// set's bitmap, counts and next-candidate cursor), the ClusterCIDR pools with every range's
    /// cursor, each record (sorted by name: CIDRs held, state, uid, ahead of the informer,
    /// served) and the mask-label refusals. A pending write's failure count only decides when its
    /// event is published, so it is cut at
    /// [`FAILED_PATCHES_BEFORE_EVENT`] + 1. Caches that change no answer (the exhaustion reason's
    /// memo, its cost counter) are left out. Two allocators with equal keys answer every call
    /// alike. For the model checker (`model-check/tests/model_check.rs`), which identifies states by it;
    /// not used by the controller, and not an API: it exists only in the shell's tests and with
    /// the `model-check` feature, which only the model check's package turns on.
    #[cfg(any(test, feature = "model-check"))]
    #[doc(hidden)]
    pub fn model_key(&self) -> String {
        use std::fmt::Write as _;
        let mut key = format!("{:?}|{:?}|", self.pool, self.cluster_cidrs);
        let mut names: Vec<&NodeName> = self.nodes.keys().collect();
        names.sort();
        for name in names {
            let Some(record) = self.nodes.get(name) else {
                continue;
            };
            let state = match &record.state {
                RecordState::Pending(p) => format!(
                    "P{}{}",
                    p.failures.min(FAILED_PATCHES_BEFORE_EVENT + 1),
                    if p.maybe_sent { "?" } else { "" }
                ),
                other => format!("{other:?}"),
            };
            let _ = write!(
                key,
                "{name}:{}:{state}:{:?}:{}:{};",
                join(&record.held),
                record.uid,
                record.ahead_of_informer,
                record.served
            );
        }
        let mut refusals: Vec<_> = self.label_refusals.iter().collect();
        refusals.sort_by(|a, b| a.0.cmp(b.0));
        let _ = write!(key, "{refusals:?}");
        key
    }

    /// A Node without podCIDRs that `--node-selector` does not select: nothing is allocated or
    /// written. What its record holds for this object stays (a reservation whose write may still
    /// land; a stale view of a Node that has podCIDRs); a record of an earlier object of the
    /// name is released, as for a served Node.
    fn not_served_without_pod_cidrs(&mut self, node: &NodeView) -> Decision {
        self.label_refusals.remove(&node.name);
        let uid = node.uid.as_deref();
        let keep = self.nodes.get(&node.name).is_some_and(|record| {
            record.is_for(uid)
                && match record.state {
                    RecordState::Pending(_) | RecordState::Gone => true,
                    RecordState::Held => uid.is_some(),
                    RecordState::Skipped(_) | RecordState::Quarantined => false,
                }
        });
        let released = if keep {
            self.set_served(&node.name, false);
            Vec::new()
        } else {
            self.forget(&node.name)
        };
        Decision::new(Action::NotServed {
            held: self
                .held(&node.name)
                .map(<[Cidr]>::to_vec)
                .unwrap_or_default(),
        })
        .after_metrics(released)
    }

    /// `decision` (about a Node with podCIDRs, its record already updated) made quiet for a Node
    /// not served: the record is marked so, and of the decision only what changed in the pool
    /// stays (its occupy and release metrics) — no event, no skip metric.
    fn not_served(&mut self, name: &str, decision: Decision) -> Decision {
        self.set_served(name, false);
        let mut quiet = Decision::new(Action::NotServed {
            held: self.held(name).map(<[Cidr]>::to_vec).unwrap_or_default(),
        });
        quiet.metrics = decision
            .metrics
            .into_iter()
            .filter(|m| {
                matches!(
                    m,
                    MetricEvent::Occupied { .. } | MetricEvent::Released { .. }
                )
            })
            .collect();
        quiet
    }

    /// The cluster CIDR `cidr` lies in (the first it overlaps, flag order).
    fn cluster_cidr_of(&self, cidr: Cidr) -> Option<Cidr> {
        self.pool
            .set_index_of(cidr)
            .and_then(|index| self.pool.sets().get(index))
            .map(|set| set.cluster_cidr())
    }

    /// Of a Node's podCIDRs, those of a family that has cluster CIDRs but lying outside all of
    /// them (e.g. from a `--cluster-cidr` entry removed since): such a Node is skipped as out of
    /// range, and start-up counts them per family.
    pub fn outside_cluster_cidrs(&self, pod_cidrs: &[Cidr]) -> Vec<Cidr> {
        pod_cidrs
            .iter()
            .copied()
            .filter(|c| self.pool.set_for(c.family()).is_some())
            .filter(|c| self.pool.set_index_of(*c).is_none())
            .collect()
    }
}

fn deleting_reason() -> String {
    "the Node is being deleted (deletionTimestamp is set): no pod CIDR is allocated to it"
        .to_owned()
}

/// CIDRs as comma-separated text (`10.244.1.0/24,fd00:10:244:1::/64`), for messages.
pub(crate) fn join(cidrs: &[Cidr]) -> String {
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

#[cfg(test)]
mod tests;

#[cfg(test)]
mod node_pool_tests;

#[cfg(test)]
mod selector_tests;

#[cfg(test)]
mod flag_cidrs_tests;

#[cfg(test)]
mod flag_cidrs_hostile_tests;

#[cfg(test)]
mod mapped_tests;

#[cfg(test)]
mod quarantine_tests;
