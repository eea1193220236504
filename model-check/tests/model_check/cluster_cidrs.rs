//! The ClusterCIDR model (issue 32 item 3): ClusterCIDR objects with the controller's finalizer,
//! Nodes served from them, and a leader change, every interleaving up to a size.
//!
//! **What is real.** Every decision is the controller's own code: `reconcile::Allocator`
//! (`sync_cluster_cidrs` and `track_closing` through the controller's
//! [`nodeipam::controller::cluster_cidrs::sync_view`], `decide`, `decide_fresh`, `patch_outcome`,
//! `remove`, `startup_occupy`, `seed_write_in_doubt`, `pool_holders`, the closing fences), the
//! writer's per-object decision [`plan_writes`] (the fence observed, the holders counted,
//! `decide`, a removal marked `Removing` under the same lock) and its [`settle_fence`] on an
//! answer, and the JSON patches `decide` builds: the model's server reads their operations (the
//! `test` of `metadata.resourceVersion`, the finalizers set, the stamp) and applies them.
//!
//! **What is drawn**, as the controller and the API server do it:
//! - the API server: ClusterCIDR objects with a `resourceVersion`, our finalizer, a deletion
//!   timestamp (an object without finalizers goes at once, one whose last finalizer comes off
//!   goes then), the stamp annotation and a status; a JSON patch whose `test` fails is refused
//!   (422), a status merge patch whose `metadata.resourceVersion` is stale is refused (409), a
//!   write to a gone object 404s. Nodes with uids and a `grp` label (created, deleted, re-created,
//!   relabelled); a Node PATCH pinned to its uid. Every request (Node or ClusterCIDR) stays at the
//!   server until a step handles it, any number of steps later (no server deadline).
//! - the controller: one leader at a time with an epoch (`leaseTransitions`); its Node watch and
//!   ClusterCIDR watch deliver in order, late; its work queue; Nodes waiting for a block woken by
//!   a sync that brought capacity or opened a fence. The Node write path is drawn at the level the
//!   other model ([`super::model`]) proves: a PATCH at the server is a write that may still land,
//!   its intent is in the Lease, and a successor seeds it; the ClusterCIDR writer's `in_doubt` is
//!   the Nodes with a PATCH at the server. A leader change deposes the leader (its requests stay at
//!   the server, their answers are lost) and the successor lists and starts a new term, whose
//!   stamps carry its epoch.
//! - the writer: one task, so one request in flight per term (it awaits each answer, or gives up
//!   on it: the request stays at the server); it decides on any object in any order and sends
//!   the first write `plan_writes` returns (the controller sends the rest of a round's writes
//!   after it; a status decided on the answer's `resourceVersion` is the same status the next
//!   round decides). A stamp always changes the object (the controller's stamps carry a
//!   sequence number, so the value is new each time). The status interval and the token bucket
//!   only delay; delay is what the server's free order already draws.
//!
//! Sizes: the flag CIDR `10.0.0.0/26` in `/27` blocks (2 blocks); `pool-a` and `pool-b` both
//! `10.1.0.0/26` (`grp=a`, `grp=b`), `pool-c` `10.1.0.0/27` nested in them (`grp=c`), all `/27`
//! blocks; 2 Node names (the real Nodes of `fixtures/nodes/06-kvm-onprem-4nodes-no-podcidr.json`
//! with a `grp` label).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};

use json_patch::PatchOperation;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use nodeipam::cluster_cidr::status::{self, ClusterCidrStatus, FamilyUsage, PoolState};
use nodeipam::cluster_cidr::{ClusterCidrObject, ClusterCidrSpec};
use nodeipam::controller::cluster_cidrs::{
    FINALIZER, ObjectChange, Observed, STAMP_ANNOTATION, Settled, Term, Write, decide, plan_writes,
    settle_fence, sync_view,
};
use nodeipam::reconcile::{
    Action as Decided, Allocator, Decision, MetricEvent, Next, NodeName, NodeView, PatchOutcome,
};
use nodeipam_core::{Cidr, Family, IpamConfig, NodeMaskFlags};
use stateright::{Model, Property};

use super::model::{Alloc, name_of, names, uid_number, uid_text};

/// The pools' names, selectors (`grp` value) and IPv4 ranges.
pub const POOLS: [(&str, &str, &str); 3] = [
    ("pool-a", "a", "10.1.0.0/26"),
    ("pool-b", "b", "10.1.0.0/26"),
    ("pool-c", "c", "10.1.0.0/27"),
];

/// The `grp` label values a Node may carry (index = the model's label number).
pub const LABELS: [&str; 3] = ["a", "b", "c"];

/// Every `/27` block a Node can hold: the flag CIDR's two, then the pools' two.
pub const BLOCKS: [&str; 4] = ["10.0.0.0/27", "10.0.0.32/27", "10.1.0.0/27", "10.1.0.32/27"];

/// The switches: each re-introduces a bug the checker must find.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// Issue 32 item 1 (chaos seed 41789): the finalizer comes off on the holder count alone —
    /// no closing fence, no stamp (the writer decides a removal as if every closing object were
    /// fenced, and the allocator never learns which objects are closing).
    pub count_only: bool,
    /// Bug 11: a ClusterCIDR serves Nodes before the controller has seen its finalizer on it.
    pub serve_before_finalizer: bool,
}

/// Faults and external changes still allowed, each a number of times.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Budget {
    /// ClusterCIDR deletions (any pool).
    pub pool_deletes: u8,
    /// Node label changes.
    pub relabels: u8,
    /// Node deletions.
    pub node_deletes: u8,
    /// Node creations (a deleted name re-created: a new uid).
    pub node_creates: u8,
    /// Leader changes.
    pub leader_changes: u8,
    /// ClusterCIDR writes answered with no definite outcome (a 504, a timeout): the request
    /// stays at the server.
    pub unknowns: u8,
}

/// The model's size and switches.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Config {
    /// The pools present at the start (indices into [`POOLS`]) and whether each carries our
    /// finalizer already.
    pub pools: Vec<(u8, bool)>,
    /// The Nodes at the start: label (index into [`LABELS`]); `None` for a name not created yet.
    pub nodes: Vec<Option<u8>>,
    /// Faults.
    pub budget: Budget,
    /// Switches.
    pub bugs: Bugs,
}

/// One ClusterCIDR object in the API server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ServerPool {
    /// `metadata.resourceVersion` (per object; it only grows).
    pub rv: u8,
    /// Our finalizer is on it.
    pub finalizer: bool,
    /// `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The epoch of the term whose stamp it carries.
    pub stamp: Option<u8>,
    /// Its `status`, as JSON.
    pub status: Option<Arc<str>>,
}

/// One Node object in the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerNode {
    /// Its uid (model number).
    pub uid: u8,
    /// Its `grp` label (index into [`LABELS`]).
    pub label: u8,
    /// Its podCIDR block (index into [`BLOCKS`]), once set.
    pub block: Option<u8>,
}

/// A Node PATCH (pinned to `uid`) at the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct NodePatch {
    /// The sender's epoch.
    pub epoch: u8,
    /// Node name index.
    pub name: u8,
    /// The object it is pinned to.
    pub uid: u8,
    /// The block it writes.
    pub block: u8,
}

/// What a ClusterCIDR write does, read from the request `decide` built.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum PoolWriteKind {
    /// Sets `metadata.finalizers` (with ours or without it).
    Finalizers {
        /// Ours is in the list written.
        ours: bool,
    },
    /// Sets the stamp annotation to the sender's term.
    Stamp,
    /// Writes the status (JSON).
    Status(Arc<str>),
}

/// A ClusterCIDR write at the server.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct PoolPatch {
    /// The sender's epoch.
    pub epoch: u8,
    /// Pool index.
    pub pool: u8,
    /// The `resourceVersion` it tests (JSON patch) or carries as a precondition (status).
    pub tested_rv: u8,
    /// What it writes.
    pub kind: PoolWriteKind,
    /// The sender still waits for its answer (it gave up: `false`).
    pub awaited: bool,
    /// Whether it is a removal of our finalizer.
    pub removal: bool,
}

/// The leader's state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Leader {
    /// Its epoch (the Lease's `leaseTransitions` at its acquisition).
    pub epoch: u8,
    /// The allocator.
    pub alloc: Alloc,
    /// The Node informer's cache.
    pub nodes: BTreeMap<u8, ServerNode>,
    /// Node watch events not delivered yet: (name, object or deleted).
    pub node_watch: VecDeque<(u8, Option<ServerNode>)>,
    /// The ClusterCIDR view.
    pub pools: BTreeMap<u8, ServerPool>,
    /// ClusterCIDR watch events not delivered yet.
    pub pool_watch: VecDeque<(u8, Option<ServerPool>)>,
    /// The work queue.
    pub work: BTreeSet<u8>,
    /// Nodes waiting for a free block.
    pub waiting: BTreeSet<u8>,
}

/// The whole system.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// ClusterCIDR objects by pool index.
    pub pools: Vec<Option<ServerPool>>,
    /// Node objects by name index.
    pub nodes: Vec<Option<ServerNode>>,
    /// The next uid.
    pub next_uid: u8,
    /// Node PATCHes at the server.
    pub node_patches: Vec<NodePatch>,
    /// ClusterCIDR writes at the server.
    pub pool_patches: Vec<PoolPatch>,
    /// The leader.
    pub leader: Leader,
    /// Faults left.
    pub budget: Budget,
    /// Ghost: a violation seen at a commit (the property's text), for the always-properties.
    pub violation: Option<&'static str>,
    /// Ghost: the Nodes holding a block inside the ranges of a pool whose finalizer came off.
    pub violation_detail: Option<Arc<str>>,
}

/// A step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// The leader reconciles Node `.0`.
    Reconcile(u8),
    /// The leader's Node watch delivers its next event.
    DeliverNode,
    /// The leader's ClusterCIDR watch delivers its next event (a sync follows).
    DeliverPool,
    /// The writer decides on pool `.0` and sends its first write.
    Write(u8),
    /// The server handles Node PATCH `.0`.
    ServeNode(usize),
    /// The server handles ClusterCIDR write `.0`.
    ServePool(usize),
    /// ClusterCIDR write `.0` gets no definite answer; it stays at the server.
    Unknown(usize),
    /// A user deletes pool `.0`.
    DeletePool(u8),
    /// A user sets Node `.0`'s label to `.1`.
    Relabel(u8, u8),
    /// A user deletes Node `.0`.
    DeleteNode(u8),
    /// A user creates Node `.0` with label `.1`.
    CreateNode(u8, u8),
    /// The leader is deposed; a new term lists.
    LeaderChange,
}

/// The ClusterCIDR model.
#[derive(Debug, Clone)]
pub struct Wing {
    /// Size and switches.
    pub config: Config,
}

fn cidr(text: &str) -> Cidr {
    Cidr::parse(text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

/// The flag CIDR `10.0.0.0/26` in `/27` blocks; the service CIDR outside it.
pub fn ipam() -> IpamConfig {
    let flags = NodeMaskFlags {
        node_cidr_mask_size: Some(27),
        ..NodeMaskFlags::default()
    };
    nodeipam_core::config::validate("10.0.0.0/26", "10.96.0.0/28", flags)
        .unwrap_or_else(|e| panic!("the model's configuration is valid: {e}"))
}

/// Block `b` as a CIDR.
pub fn block_cidr(b: u8) -> Cidr {
    cidr(BLOCKS[usize::from(b)])
}

fn block_of(c: &Cidr) -> u8 {
    (0..4u8).find(|b| block_cidr(*b) == *c).unwrap_or(u8::MAX)
}

/// Pool `p`'s range.
pub fn pool_range(p: u8) -> Cidr {
    cidr(POOLS[usize::from(p)].2)
}

fn pool_name(p: u8) -> &'static str {
    POOLS[usize::from(p)].0
}

/// Whether block `b` lies inside pool `p`'s range.
pub fn inside(b: u8, p: u8) -> bool {
    pool_range(p).contains(&block_cidr(b))
}

fn fixed_now() -> Timestamp {
    Timestamp::from_second(1_796_000_000).unwrap_or_else(|e| panic!("{e}"))
}

fn term(epoch: u8) -> Term {
    Term::new(u64::from(epoch), &format!("t{epoch}"))
}

fn spec(p: u8) -> &'static ClusterCidrSpec {
    static SPECS: OnceLock<Vec<ClusterCidrSpec>> = OnceLock::new();
    &SPECS.get_or_init(|| {
        POOLS
            .iter()
            .map(|(_, grp, range)| {
                serde_json::from_value(serde_json::json!({
                    "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                        {"key": "grp", "operator": "In", "values": [grp]}
                    ]}]},
                    "perNodeHostBits": 5,
                    "ipv4": range,
                }))
                .unwrap_or_else(|e| panic!("{e}"))
            })
            .collect()
    })[usize::from(p)]
}

/// Pool `p` as the controller reads the object `o`.
pub fn observed(p: u8, o: &ServerPool) -> Observed {
    Observed {
        object: ClusterCidrObject {
            metadata: ObjectMeta {
                name: Some(pool_name(p).to_owned()),
                uid: Some(format!("pool-uid-{p}")),
                generation: Some(1),
                resource_version: Some(o.rv.to_string()),
                finalizers: o.finalizer.then(|| vec![FINALIZER.to_owned()]),
                deletion_timestamp: o.deleting.then(|| Time(fixed_now())),
                annotations: o.stamp.map(|e| {
                    [(STAMP_ANNOTATION.to_owned(), term(e).stamp(1))]
                        .into_iter()
                        .collect()
                }),
                ..ObjectMeta::default()
            },
            spec: spec(p).clone(),
        },
        status: o
            .status
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok()),
    }
}

/// Node `name` as the object `node`.
fn view_of(name: u8, node: &ServerNode) -> NodeView {
    let mut view = names()[usize::from(name)].clone();
    view.uid = Some(uid_text(node.uid));
    view.labels
        .insert("grp".to_owned(), LABELS[usize::from(node.label)].to_owned());
    view.pod_cidr = node.block.map(|b| block_cidr(b).to_string());
    view.pod_cidrs = node
        .block
        .map(|b| vec![block_cidr(b).to_string()])
        .unwrap_or_default();
    view
}

/// Reads a write `decide` built into what the model's server applies.
fn read_write(w: &Write, epoch: u8) -> Option<(PoolWriteKind, u8, bool)> {
    match w {
        Write::Object { change, patch } => {
            let mut rv = None;
            let mut kind = None;
            for op in &patch.0 {
                match op {
                    PatchOperation::Test(t) if t.path.as_str() == "/metadata/resourceVersion" => {
                        rv = t.value.as_str().and_then(|v| v.parse::<u8>().ok());
                    }
                    PatchOperation::Add(a) if a.path.as_str() == "/metadata/finalizers" => {
                        let ours = a
                            .value
                            .as_array()
                            .is_some_and(|l| l.iter().any(|f| f.as_str() == Some(FINALIZER)));
                        kind = Some(PoolWriteKind::Finalizers { ours });
                    }
                    PatchOperation::Add(a)
                        if a.path.as_str().starts_with("/metadata/annotations") =>
                    {
                        let value = a
                            .value
                            .as_str()
                            .map(str::to_owned)
                            .or_else(|| a.value[STAMP_ANNOTATION].as_str().map(str::to_owned));
                        assert_eq!(
                            value.as_deref(),
                            Some(term(epoch).stamp(1).as_str()),
                            "the model renders stamps as its terms' first"
                        );
                        kind = Some(PoolWriteKind::Stamp);
                    }
                    other => panic!("an operation the model does not apply: {other:?}"),
                }
            }
            let removal = *change == ObjectChange::RemoveFinalizer;
            Some((kind?, rv?, removal))
        }
        Write::Status {
            wanted,
            resource_version,
        } => Some((
            PoolWriteKind::Status(serde_json::to_string(wanted).ok()?.into()),
            resource_version.parse().ok()?,
            false,
        )),
        Write::Invalid { .. } => None,
    }
}

impl Wing {
    /// A new term with `epoch` lists the server: the ClusterCIDRs first (synced), then the
    /// Nodes (start-up occupy), then the inherited Node writes seeded, every Node queued.
    fn list(&self, s: &State, epoch: u8) -> Leader {
        let mut a = Allocator::new(&ipam()).unwrap_or_else(|e| panic!("allocator: {e}"));
        let pools: BTreeMap<u8, ServerPool> = s
            .pools
            .iter()
            .enumerate()
            .filter_map(|(p, o)| Some((u8::try_from(p).ok()?, o.clone()?)))
            .collect();
        let nodes: BTreeMap<u8, ServerNode> = s
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| Some((u8::try_from(i).ok()?, (*n)?)))
            .collect();
        self.sync(&mut a, &pools);
        let views: Vec<NodeView> = nodes.iter().map(|(i, n)| view_of(*i, n)).collect();
        let _ = a.startup_occupy(&views);
        // The inherited intents (the Lease holds every PATCH still at the server).
        for p in &s.node_patches {
            if let Some(node) = nodes
                .get(&p.name)
                .filter(|n| n.uid == p.uid && n.block.is_none())
            {
                let _ = a.seed_write_in_doubt(&view_of(p.name, node), &[block_cidr(p.block)]);
            }
        }
        Leader {
            epoch,
            alloc: Alloc::new(a),
            work: nodes.keys().copied().collect(),
            nodes,
            node_watch: VecDeque::new(),
            pools,
            pool_watch: VecDeque::new(),
            waiting: BTreeSet::new(),
        }
    }

    /// The controller's sync of its ClusterCIDR view (`sync_view`), with the switches. Returns
    /// whether waiting Nodes are woken, and the Nodes to decide again.
    fn sync(&self, a: &mut Allocator, pools: &BTreeMap<u8, ServerPool>) -> (bool, Vec<String>) {
        let observed: Vec<(u8, Observed)> = pools
            .iter()
            .map(|(p, o)| {
                let mut o = o.clone();
                if self.config.bugs.serve_before_finalizer {
                    o.finalizer = true;
                }
                (*p, observed(*p, &o))
            })
            .collect();
        let (synced, opened) =
            sync_view(a, observed.iter().map(|(p, o)| (pool_name(*p), o, false)));
        if self.config.bugs.count_only {
            a.track_closing(&[]);
        }
        (synced.capacity_added || opened, synced.recheck)
    }

    /// The worker's bookkeeping for a decision about Node `name`: an assignment is sent at once
    /// (its intent's Lease write and the gate are the other model's), freed blocks wake the
    /// waiting Nodes, a re-read is a GET handled at once.
    fn apply(&self, s: &mut State, name: u8, d: Decision) {
        let freed = d
            .metrics
            .iter()
            .any(|m| matches!(m, MetricEvent::Released { blocks, .. } if *blocks > 0));
        let leader = &mut s.leader;
        leader.alloc.rekey();
        if d.next == Next::WaitForFreeBlock {
            leader.waiting.insert(name);
        } else {
            leader.waiting.remove(&name);
        }
        if freed {
            let woken: Vec<u8> = std::mem::take(&mut leader.waiting).into_iter().collect();
            leader.work.extend(woken);
        }
        if let Decided::Assign { pod_cidrs, uid } = &d.action {
            let uid = uid.as_deref().and_then(uid_number).unwrap_or(u8::MAX);
            let block = pod_cidrs.first().map_or(u8::MAX, block_of);
            s.node_patches.push(NodePatch {
                epoch: leader.epoch,
                name,
                uid,
                block,
            });
            return;
        }
        match d.next {
            Next::Done | Next::WaitForFreeBlock => {}
            Next::RetryBackoff | Next::RetryAfter(_) | Next::EndQuarantine => {
                leader.work.insert(name);
            }
            Next::Reread => {
                let d = match s.nodes[usize::from(name)] {
                    Some(node) => leader.alloc.get().decide_fresh(&view_of(name, &node)),
                    None => {
                        let uid = leader.alloc.0.record_uid(&name_of(name));
                        leader
                            .alloc
                            .get()
                            .object_gone(&name_of(name), uid.as_deref())
                    }
                };
                self.apply(s, name, d);
            }
        }
    }

    fn wake(leader: &mut Leader, wake: bool, recheck: &[String]) {
        if wake {
            let woken: Vec<u8> = std::mem::take(&mut leader.waiting).into_iter().collect();
            leader.work.extend(woken);
        }
        for name in recheck {
            if let Some(i) = names().iter().position(|n| *n.name == **name) {
                leader.work.insert(u8::try_from(i).unwrap_or(u8::MAX));
            }
        }
    }

    fn push_pool_event(s: &mut State, p: u8) {
        let e = s.pools[usize::from(p)].clone();
        s.leader.pool_watch.push_back((p, e));
    }

    fn push_node_event(s: &mut State, name: u8) {
        let e = s.nodes[usize::from(name)];
        s.leader.node_watch.push_back((name, e));
    }

    /// The Nodes whose write may still land: a PATCH at the server (its intent is in the Lease).
    fn in_doubt(s: &State) -> Vec<NodeName> {
        let names: BTreeSet<u8> = s.node_patches.iter().map(|p| p.name).collect();
        names.into_iter().map(name_of).collect()
    }

    /// The writer's decision on pool `p` (on `a`, which it changes: the fence).
    fn plan(&self, s: &State, a: &mut Allocator, p: u8) -> (Vec<Write>, bool) {
        let Some(o) = s.leader.pools.get(&p) else {
            return (Vec::new(), false);
        };
        let observed = observed(p, o);
        let in_doubt = Self::in_doubt(s);
        let t = term(s.leader.epoch);
        if self.config.bugs.count_only {
            // The writer before the closing fence: counted, and removed when nobody held.
            let Some(state) = a.cluster_cidr_state(pool_name(p)) else {
                return (Vec::new(), false);
            };
            let closing = o.finalizer && o.deleting;
            let known = nodeipam::controller::cluster_cidrs::Known {
                state,
                holders: a.pool_holders(pool_name(p), &in_doubt),
                invalid_announced: false,
                fence: closing.then_some(nodeipam::reconcile::Fence::Fenced),
                next_stamp: t.stamp(1),
                may_stamp: true,
            };
            return (decide(&observed, &known, fixed_now()), false);
        }
        let planned = plan_writes(
            a,
            (pool_name(p), &observed, None),
            &in_doubt,
            (&t, t.stamp(1)),
            false,
            fixed_now(),
        );
        (planned.writes, planned.opened)
    }

    /// Whether the writer would do anything for pool `p` now.
    fn writer_acts(&self, s: &State, p: u8) -> bool {
        let mut a = (*s.leader.alloc.0).clone();
        let before = a.model_key();
        let (writes, _) = self.plan(s, &mut a, p);
        writes
            .iter()
            .any(|w| read_write(w, s.leader.epoch).is_some())
            || a.model_key() != before
    }

    /// One step.
    pub fn step(&self, last: &State, step: Step) -> State {
        let mut s = last.clone();
        match step {
            Step::Reconcile(name) => {
                s.leader.work.remove(&name);
                let d = match s.leader.nodes.get(&name) {
                    Some(node) => s.leader.alloc.get().decide(&view_of(name, node)),
                    None => s.leader.alloc.get().remove(&name_of(name)),
                };
                self.apply(&mut s, name, d);
            }
            Step::DeliverNode => {
                if let Some((name, e)) = s.leader.node_watch.pop_front() {
                    match e {
                        Some(node) => s.leader.nodes.insert(name, node),
                        None => s.leader.nodes.remove(&name),
                    };
                    s.leader.work.insert(name);
                }
            }
            Step::DeliverPool => {
                if let Some((p, e)) = s.leader.pool_watch.pop_front() {
                    match e {
                        Some(o) => s.leader.pools.insert(p, o),
                        None => s.leader.pools.remove(&p),
                    };
                    let pools = s.leader.pools.clone();
                    let (wake, recheck) = self.sync(s.leader.alloc.get(), &pools);
                    s.leader.alloc.rekey();
                    Self::wake(&mut s.leader, wake, &recheck);
                }
            }
            Step::Write(p) => {
                let mut a = (*s.leader.alloc.0).clone();
                let (writes, opened) = self.plan(&s, &mut a, p);
                s.leader.alloc = Alloc::new(a);
                Self::wake(&mut s.leader, opened, &[]);
                let epoch = s.leader.epoch;
                if let Some((kind, tested_rv, removal)) =
                    writes.iter().find_map(|w| read_write(w, epoch))
                {
                    s.pool_patches.push(PoolPatch {
                        epoch,
                        pool: p,
                        tested_rv,
                        kind,
                        awaited: true,
                        removal,
                    });
                }
            }
            Step::ServeNode(i) => {
                let p = s.node_patches.remove(i);
                let outcome = match s.nodes[usize::from(p.name)] {
                    None => PatchOutcome::NotFound,
                    Some(node) if node.uid != p.uid => PatchOutcome::CannotApply {
                        kind: nodeipam::reconcile::CannotApplyKind::NodeReplaced,
                        message: "metadata.uid: field is immutable".to_owned(),
                    },
                    Some(node) if node.block.is_some_and(|b| b != p.block) => {
                        PatchOutcome::CannotApply {
                            kind: nodeipam::reconcile::CannotApplyKind::PodCidrsAlreadySet,
                            message: "spec.podCIDRs: may not change once set".to_owned(),
                        }
                    }
                    Some(mut node) => {
                        if node.block.is_none() {
                            node.block = Some(p.block);
                            s.nodes[usize::from(p.name)] = Some(node);
                            Self::push_node_event(&mut s, p.name);
                            let covered = block_cidr(p.block).overlaps(&cidr("10.0.0.0/26"))
                                || (0..3u8).any(|q| {
                                    s.pools[usize::from(q)].is_some() && inside(p.block, q)
                                });
                            if !covered && s.violation.is_none() {
                                s.violation = Some(STRAY);
                                s.violation_detail = Some(
                                    format!("{} ← {}", name_of(p.name), block_cidr(p.block)).into(),
                                );
                            }
                        }
                        PatchOutcome::Applied(view_of(p.name, &node))
                    }
                };
                if p.epoch == s.leader.epoch {
                    let d = s.leader.alloc.get().patch_outcome(
                        &name_of(p.name),
                        Some(&uid_text(p.uid)),
                        &[block_cidr(p.block)],
                        outcome,
                    );
                    self.apply(&mut s, p.name, d);
                }
            }
            Step::ServePool(i) => self.serve_pool(&mut s, i),
            Step::Unknown(i) => {
                s.budget.unknowns -= 1;
                s.pool_patches[i].awaited = false;
            }
            Step::DeletePool(p) => {
                s.budget.pool_deletes -= 1;
                let slot = &mut s.pools[usize::from(p)];
                if let Some(o) = slot.as_mut() {
                    if o.finalizer {
                        o.deleting = true;
                        o.rv += 1;
                    } else {
                        *slot = None;
                    }
                }
                Self::push_pool_event(&mut s, p);
            }
            Step::Relabel(name, label) => {
                s.budget.relabels -= 1;
                if let Some(n) = s.nodes[usize::from(name)].as_mut() {
                    n.label = label;
                }
                Self::push_node_event(&mut s, name);
            }
            Step::DeleteNode(name) => {
                s.budget.node_deletes -= 1;
                s.nodes[usize::from(name)] = None;
                Self::push_node_event(&mut s, name);
            }
            Step::CreateNode(name, label) => {
                s.budget.node_creates -= 1;
                s.nodes[usize::from(name)] = Some(ServerNode {
                    uid: s.next_uid,
                    label,
                    block: None,
                });
                s.next_uid += 1;
                Self::push_node_event(&mut s, name);
            }
            Step::LeaderChange => {
                s.budget.leader_changes -= 1;
                for p in &mut s.pool_patches {
                    p.awaited = false;
                }
                let epoch = s.leader.epoch + 1;
                s.leader = self.list(&s, epoch);
            }
        }
        s
    }

    fn serve_pool(&self, s: &mut State, i: usize) {
        let w = s.pool_patches.remove(i);
        let p = w.pool;
        let answer = match s.pools[usize::from(p)].as_mut() {
            None => Err(404),
            Some(o) if o.rv != w.tested_rv => Err(match w.kind {
                PoolWriteKind::Status(_) => 409,
                _ => 422,
            }),
            Some(o) => {
                match &w.kind {
                    PoolWriteKind::Finalizers { ours } => o.finalizer = *ours,
                    PoolWriteKind::Stamp => o.stamp = Some(w.epoch),
                    PoolWriteKind::Status(status) => o.status = Some(status.clone()),
                }
                o.rv += 1;
                let after = o.clone();
                if w.removal && !after.finalizer {
                    self.check_removal(s, p);
                }
                if after.deleting && !after.finalizer {
                    s.pools[usize::from(p)] = None;
                }
                Self::push_pool_event(s, p);
                Ok(after)
            }
        };
        if !(w.awaited && w.epoch == s.leader.epoch) {
            return;
        }
        let t = term(w.epoch);
        let observed_after = answer.as_ref().ok().map(|o| observed(p, o));
        let settled = match (&answer, &observed_after) {
            (Ok(_), Some(o)) => Settled::Applied(&o.object),
            (Err(code), _) => Settled::Refused(*code),
            (Ok(_), None) => Settled::Unknown,
        };
        let a = s.leader.alloc.get();
        let opened = if self.config.bugs.count_only {
            false
        } else {
            settle_fence(a, pool_name(p), w.removal, settled, &t)
        };
        s.leader.alloc.rekey();
        // An applied write's answer replaces the view's copy if that is still the one decided on.
        if let Ok(after) = answer
            && s.leader.pools.get(&p).is_some_and(|o| o.rv == w.tested_rv)
            && (!after.deleting || after.finalizer)
        {
            s.leader.pools.insert(p, after);
        }
        Self::wake(&mut s.leader, opened, &[]);
    }

    /// At the commit of a removal of our finalizer from pool `p`: no Node may hold a block inside
    /// its ranges, and no PATCH that may still land may write one there.
    fn check_removal(&self, s: &mut State, p: u8) {
        let mut holders: Vec<String> = s
            .nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| {
                let b = (*n)?.block?;
                inside(b, p).then(|| format!("{} holds {}", short(i), block_cidr(b)))
            })
            .collect();
        holders.extend(s.node_patches.iter().filter_map(|np| {
            let may_land =
                s.nodes[usize::from(np.name)].is_some_and(|n| n.uid == np.uid && n.block.is_none());
            (may_land && inside(np.block, p)).then(|| {
                format!(
                    "a PATCH {} ← {} is at the server",
                    short(usize::from(np.name)),
                    block_cidr(np.block)
                )
            })
        }));
        if !holders.is_empty() && s.violation.is_none() {
            s.violation = Some(FINALIZER_OFF);
            s.violation_detail = Some(format!("{}: {}", pool_name(p), holders.join(", ")).into());
        }
    }

    fn progress_steps(&self, s: &State, out: &mut Vec<Step>) {
        let l = &s.leader;
        for name in &l.work {
            out.push(Step::Reconcile(*name));
        }
        if !l.node_watch.is_empty() {
            out.push(Step::DeliverNode);
        }
        if !l.pool_watch.is_empty() {
            out.push(Step::DeliverPool);
        }
        // The writer is one task: it awaits each request's answer (or gives up on it) before it
        // decides the next.
        let busy = s
            .pool_patches
            .iter()
            .any(|w| w.awaited && w.epoch == l.epoch);
        if !busy {
            for p in l.pools.keys() {
                out.push(Step::Write(*p));
            }
        }
        for i in 0..s.node_patches.len() {
            out.push(Step::ServeNode(i));
        }
        for i in 0..s.pool_patches.len() {
            out.push(Step::ServePool(i));
        }
    }

    fn fault_steps(&self, s: &State, out: &mut Vec<Step>) {
        let b = &s.budget;
        if b.unknowns > 0 {
            for (i, w) in s.pool_patches.iter().enumerate() {
                if w.awaited {
                    out.push(Step::Unknown(i));
                }
            }
        }
        if b.pool_deletes > 0 {
            for (p, o) in s.pools.iter().enumerate() {
                if o.as_ref().is_some_and(|o| !o.deleting) {
                    out.push(Step::DeletePool(u8::try_from(p).unwrap_or(u8::MAX)));
                }
            }
        }
        for (i, n) in s.nodes.iter().enumerate() {
            let i = u8::try_from(i).unwrap_or(u8::MAX);
            match n {
                Some(n) => {
                    if b.relabels > 0 {
                        for label in 0..3u8 {
                            if label != n.label {
                                out.push(Step::Relabel(i, label));
                            }
                        }
                    }
                    if b.node_deletes > 0 {
                        out.push(Step::DeleteNode(i));
                    }
                }
                None if b.node_creates > 0 => {
                    for label in 0..3u8 {
                        out.push(Step::CreateNode(i, label));
                    }
                }
                None => {}
            }
        }
        if b.leader_changes > 0 {
            out.push(Step::LeaderChange);
        }
    }

    /// Nothing left to do but faults: no request at the server, the leader's watches and work
    /// queue empty, and its writer has nothing to write.
    pub fn quiescent(&self, s: &State) -> bool {
        let l = &s.leader;
        s.node_patches.is_empty()
            && s.pool_patches.is_empty()
            && l.work.is_empty()
            && l.node_watch.is_empty()
            && l.pool_watch.is_empty()
            && l.pools.keys().all(|p| !self.writer_acts(s, *p))
    }
}

/// The property "no Node gets a block outside the flag CIDRs and every existing ClusterCIDR".
pub const STRAY: &str =
    "a Node's block lies in the flag CIDRs or a ClusterCIDR that exists at its commit";
/// The property "our finalizer never comes off while …".
pub const FINALIZER_OFF: &str = "our finalizer never comes off while a Node holds a block of the pool's ranges or a write into them may still land";

/// `n0`, `n1`, … for traces.
pub fn short(i: usize) -> String {
    format!("n{i}")
}

/// Why a quiescent state is not settled right (`None`: it is): every Node has a block the leader
/// holds for it; every pool carries our finalizer, and one being deleted is gone unless a Node
/// holds a block inside its range (all blocks are the pools' size, so the Nodes holding a block
/// inside it are its used blocks); every pool's stored status is the status of its Nodes' counts
/// (the controller's own `status::status` of the usage, and for a deleting pool the holders,
/// counted from the server's Nodes).
pub fn settled_wrong(s: &State) -> Option<String> {
    let a = &s.leader.alloc.0;
    for (i, n) in s.nodes.iter().enumerate() {
        let Some(n) = n else { continue };
        let Some(b) = n.block else {
            return Some(format!("Node {} has no podCIDRs", short(i)));
        };
        let name = name_of(u8::try_from(i).unwrap_or(u8::MAX));
        if a.held(&name) != Some(&[block_cidr(b)][..]) {
            return Some(format!(
                "the leader holds {:?} for Node {} which has {}",
                a.held(&name),
                short(i),
                block_cidr(b)
            ));
        }
    }
    for (p, o) in s.pools.iter().enumerate() {
        let Some(o) = o else { continue };
        let p = u8::try_from(p).unwrap_or(u8::MAX);
        if !o.finalizer {
            return Some(format!("{} lacks our finalizer", pool_name(p)));
        }
        let range = pool_range(p);
        let capacity = 1u64 << (27 - range.prefix_len());
        let used = s
            .nodes
            .iter()
            .flatten()
            .filter(|n| n.block.is_some_and(|b| inside(b, p)))
            .count() as u64;
        let usage = vec![(
            Family::V4,
            FamilyUsage {
                capacity,
                used,
                free: capacity - used,
            },
        )];
        let stored: Option<ClusterCidrStatus> = o
            .status
            .as_deref()
            .and_then(|s| serde_json::from_str(s).ok());
        if o.deleting && used == 0 {
            return Some(format!(
                "{} is still being deleted with no Node holding a block of it",
                pool_name(p)
            ));
        }
        let state = if o.deleting {
            PoolState::Deleting {
                usage,
                holders: usize::try_from(used).unwrap_or(usize::MAX),
            }
        } else {
            PoolState::Serving { usage }
        };
        let want = status::status(&state, stored.as_ref(), 1, fixed_now());
        if stored.as_ref() != Some(&want) {
            return Some(format!(
                "{}'s status {:?} is not its Nodes' ({used} of {capacity} blocks)",
                pool_name(p),
                stored.map(|s| s.ipv4)
            ));
        }
    }
    None
}

impl Model for Wing {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        let c = &self.config;
        let mut pools = vec![None; POOLS.len()];
        for (p, finalizer) in &c.pools {
            pools[usize::from(*p)] = Some(ServerPool {
                rv: 1,
                finalizer: *finalizer,
                deleting: false,
                stamp: None,
                status: None,
            });
        }
        let mut next_uid = 0;
        let nodes = c
            .nodes
            .iter()
            .map(|label| {
                label.map(|label| {
                    next_uid += 1;
                    ServerNode {
                        uid: next_uid - 1,
                        label,
                        block: None,
                    }
                })
            })
            .collect();
        let mut s = State {
            pools,
            nodes,
            next_uid,
            node_patches: Vec::new(),
            pool_patches: Vec::new(),
            leader: Leader {
                epoch: 0,
                alloc: Alloc::new(Allocator::new(&ipam()).unwrap_or_else(|e| panic!("{e}"))),
                nodes: BTreeMap::new(),
                node_watch: VecDeque::new(),
                pools: BTreeMap::new(),
                pool_watch: VecDeque::new(),
                work: BTreeSet::new(),
                waiting: BTreeSet::new(),
            },
            budget: c.budget,
            violation: None,
            violation_detail: None,
        };
        s.leader = self.list(&s, 1);
        // The statuses the writer gave the objects before the start (every write answered, its
        // watch event delivered): the runs begin where the controller had settled.
        for p in 0..u8::try_from(POOLS.len()).unwrap_or(u8::MAX) {
            let mut a = (*s.leader.alloc.0).clone();
            let (writes, _) = self.plan(&s, &mut a, p);
            for w in &writes {
                if let (Write::Status { wanted, .. }, Some(o)) =
                    (w, s.pools[usize::from(p)].as_mut())
                {
                    o.status = serde_json::to_string(wanted).ok().map(Into::into);
                    o.rv += 1;
                }
            }
        }
        s.leader = self.list(&s, 1);
        vec![s]
    }

    fn actions(&self, s: &State, out: &mut Vec<Step>) {
        if s.violation.is_some() {
            return;
        }
        self.progress_steps(s, out);
        self.fault_steps(s, out);
    }

    fn next_state(&self, last: &State, step: Step) -> Option<State> {
        let next = self.step(last, step);
        (next != *last).then_some(next)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        vec![
            Property::always("no two Nodes share a podCIDR", |_, s: &State| {
                let blocks: Vec<u8> = s.nodes.iter().flatten().filter_map(|n| n.block).collect();
                let distinct: BTreeSet<u8> = blocks.iter().copied().collect();
                distinct.len() == blocks.len()
            }),
            Property::always(FINALIZER_OFF, |_, s: &State| {
                s.violation != Some(FINALIZER_OFF)
            }),
            Property::always(STRAY, |_, s: &State| s.violation != Some(STRAY)),
            Property::always(
                "settled: every Node served, every pool finalized and its status = its Nodes' counts",
                |m: &Wing, s: &State| !m.quiescent(s) || settled_wrong(s).is_none(),
            ),
        ]
    }

    fn format_action(&self, step: &Step) -> String {
        let n = |i: &u8| short(usize::from(*i));
        match step {
            Step::Reconcile(i) => format!("reconcile {}", n(i)),
            Step::DeliverNode => "Node watch event delivered".to_owned(),
            Step::DeliverPool => "ClusterCIDR watch event delivered, sync".to_owned(),
            Step::Write(p) => format!("writer decides on {}, sends", pool_name(*p)),
            Step::ServeNode(i) => format!("server handles Node PATCH #{i}"),
            Step::ServePool(i) => format!("server handles ClusterCIDR write #{i}"),
            Step::Unknown(i) => format!("ClusterCIDR write #{i}: no definite answer"),
            Step::DeletePool(p) => format!("delete {}", pool_name(*p)),
            Step::Relabel(i, l) => format!("label {} grp={}", n(i), LABELS[usize::from(*l)]),
            Step::DeleteNode(i) => format!("delete {}", n(i)),
            Step::CreateNode(i, l) => format!("create {} grp={}", n(i), LABELS[usize::from(*l)]),
            Step::LeaderChange => "leader change: a new term lists".to_owned(),
        }
    }
}
