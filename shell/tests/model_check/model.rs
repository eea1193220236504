//! The model: an abstract API server (Nodes with uids, uid-pinned PATCHes, a watch per replica, a
//! Lease) and one or two controller replicas whose every decision is made by the controller's own
//! code — `reconcile::Allocator` (decide, decide_fresh, patch_outcome, remove, object_gone,
//! startup_occupy), `controller::in_doubt::InDoubtWrites` (record, pending) and
//! `controller::Leadership::may_start_write` (the Lease write fence). What the model draws itself
//! is the plumbing around them: the work queue, which answer a PATCH gets, when time passes.
//!
//! Time is abstract: one tick is one unit; the request timeout `T` is 1 tick, the lease duration
//! `L` 3 ticks, the renew deadline 2 ticks (`L > renew deadline`, as the controller validates).
//! Every time in the state is relative to now (ages and time left, capped where larger values
//! change nothing), so the state space is finite although time never stops. The controller's
//! functions take `Instant`s: the model hands them `BASE + 1000 s` as "now" and times relative to
//! it (all of them are invariant under a shift of time).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::OnceLock;
use std::time::Duration;

use nodeipam::controller::Leadership;
use nodeipam::controller::in_doubt::InDoubtWrites;
use nodeipam::reconcile::{
    Action as Decided, Allocator, CannotApplyKind, Decision, MetricEvent, Next, NodeName, NodeView,
    PatchOutcome,
};
use nodeipam_core::{Cidr, IpamConfig, NodeMaskFlags};
use stateright::{Model, Property};

/// The request timeout, ticks.
pub const T: u8 = 1;
/// The Lease duration, ticks.
pub const LEASE: u8 = 3;
/// The renew deadline, ticks: a leader that has not renewed for this long gives up.
pub const RENEW_DEADLINE: u8 = 2;
/// One tick, as a `Duration` for the controller's functions.
const TICK: Duration = Duration::from_secs(1);

/// Old behaviour re-introduced, one switch per bug of RELIABILITY.md that lies in the modelled
/// code. All off: today's code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
    /// Bug 1: the server's deadline for a PATCH was longer than the client's request timeout
    /// (`timeout=1s` sent for a 500 ms timeout): the server may commit one tick after the client
    /// (and every fence counting on `T`) gave up on it.
    pub b1_server_deadline_past_timeout: bool,
    /// Bug 2: without leader election a restarted controller listed (and allocated) at once,
    /// before its start-up write fence; only its writes waited for the fence.
    pub b2_list_before_startup_fence: bool,
    /// Bug 4: a killed leader's orphaned elector released the Lease (the standby took over at
    /// once, no lease-duration wait).
    pub b4_kill_releases_lease: bool,
    /// Bug 5: a decision that occupied a Node's podCIDRs carried no metric
    /// (`MetricEvent::Occupied` missing), so the pool figures were not published.
    pub b5_occupy_without_metric: bool,
    /// Bug 6: a decision on what the API server answered (GET, PATCH response) was not marked
    /// ahead of the informer: `decide_fresh` acted as `decide`, so an older informer copy of the
    /// name was acted on.
    pub b6_informer_behind_get: bool,
    /// Bug 9: a cleanly stopping leader released the Lease as soon as its in-flight requests had
    /// answered, with writes still in doubt.
    pub b9_release_with_write_in_doubt: bool,
    /// Bug 12: the worker checked the write gate *before* the write window and the token bucket
    /// (`controller/worker.rs` before commit `7444d26`), then sent the PATCH without checking it
    /// again. A write that passes the gate is queued ([`Replica::queued`]: it holds its window
    /// slot and waits for a token) and sent by a later [`Step::SendQueued`], gate unchecked, any
    /// number of ticks later. The token wait was not cut short by anything but the end of the
    /// process: a stop closed the window (a write still waiting for a *slot* was dropped, which
    /// the model's SIGTERM does to `to_write`) but the pipeline's wind-down let writes holding a
    /// slot finish, after a SIGTERM and after a lost Lease alike. So a queued write survives both;
    /// only `kill -9` drops it, and the process (the replica's incarnation) does not exit —
    /// release the Lease, restart — before its queued writes are sent.
    pub b12_gate_before_queue: bool,
}

/// How many of each fault (and of each environment change) a run may inject. Once all are
/// spent, faults have stopped: the liveness property looks at what the system settles to then.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Budget {
    /// Node creations (a name without a Node gets a new object, a new uid).
    pub creates: u8,
    /// Node deletions.
    pub deletes: u8,
    /// `kill -9` of a running replica.
    pub kills: u8,
    /// Graceful stops (SIGTERM) of a running replica.
    pub stops: u8,
    /// PATCH answers without a definite outcome: answered early (504, dropped connection) with the
    /// write still able to land, committed and then answered 5xx, or a request that hangs past
    /// its deadline without being handled.
    pub unknowns: u8,
    /// PATCHes refused with 409 Conflict (nothing written).
    pub conflicts: u8,
    /// Watches dropped, followed by a re-list.
    pub relists: u8,
    /// Another actor sets podCIDRs (see [`Step::Adopt`]).
    pub adopts: u8,
    /// Leaders whose renewals start failing (they give up at the renew deadline; the Lease is
    /// lost, not released). A running leader whose renewals do not fail renews every tick (the
    /// retry period is shorter than a tick).
    pub lease_losses: u8,
}

/// The model's size and switches.
#[derive(Debug, Clone)]
pub struct Config {
    /// Node names (at most `names().len()`).
    pub names: usize,
    /// Which of the names have a Node (without podCIDRs) at the start.
    pub initial_nodes: usize,
    /// Replicas: 2 with leader election; 1 without (a restart waits for the start-up fence).
    pub replicas: usize,
    /// Whether the replicas elect a leader through the Lease.
    pub leader_election: bool,
    /// PATCHes the server may hold at once (in flight, or late writes).
    pub max_in_flight: usize,
    /// The faults of a run.
    pub budget: Budget,
    /// Bugs re-introduced.
    pub bugs: Bugs,
}

/// The cluster: `10.0.0.0/24` in `/26` blocks, the service CIDR `10.0.0.0/26` inside it, so
/// three blocks can be allocated (`10.0.0.64/26`, `.128`, `.192`).
pub fn ipam() -> IpamConfig {
    match nodeipam_core::config::validate("10.0.0.0/24", "10.0.0.0/26", flags()) {
        Ok(config) => config,
        Err(e) => panic!("the model's configuration is valid: {e}"),
    }
}

fn flags() -> NodeMaskFlags {
    NodeMaskFlags {
        node_cidr_mask_size: Some(26),
        ..NodeMaskFlags::default()
    }
}

/// The Nodes the model's names stand for: the real Nodes of
/// `fixtures/nodes/06-kvm-onprem-4nodes-no-podcidr.json` (names, labels); the model gives each
/// object its own uid and podCIDRs.
pub fn names() -> &'static [NodeView] {
    static NODES: OnceLock<Vec<NodeView>> = OnceLock::new();
    NODES.get_or_init(|| {
        let path = format!(
            "{}/../fixtures/nodes/06-kvm-onprem-4nodes-no-podcidr.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"));
        let nodes = nodeipam::nodelist::parse_nodes(&text).unwrap_or_else(|e| panic!("{e}"));
        nodes.iter().map(NodeView::from_node).collect()
    })
}

fn name_of(i: u8) -> NodeName {
    names()[usize::from(i)].name.clone()
}

fn index_of(name: &str) -> u8 {
    names()
        .iter()
        .position(|n| &*n.name == name)
        .and_then(|i| u8::try_from(i).ok())
        .unwrap_or(u8::MAX)
}

/// The uid of the model's object number `n` (uuid text, as the API server writes them).
fn uid_text(n: u8) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

fn uid_number(text: &str) -> Option<u8> {
    text.strip_prefix("00000000-0000-4000-8000-")
        .and_then(|hex| u8::from_str_radix(hex, 16).ok())
}

/// Block `b` (1..=3) as a CIDR.
pub fn block_cidr(b: u8) -> Cidr {
    let text = format!("10.0.0.{}/26", u32::from(b) * 64);
    match Cidr::parse(&text) {
        Ok(c) => c,
        Err(e) => panic!("{text}: {e}"),
    }
}

fn block_of(cidr: &Cidr) -> u8 {
    (1..=3u8).find(|b| block_cidr(*b) == *cidr).unwrap_or(0)
}

/// "Now" for the controller's functions: every time in the state is relative to it.
fn now() -> tokio::time::Instant {
    static BASE: OnceLock<tokio::time::Instant> = OnceLock::new();
    *BASE.get_or_init(tokio::time::Instant::now) + Duration::from_secs(1000)
}

fn ticks(n: u8) -> Duration {
    TICK * u32::from(n)
}

/// A Node object in the API server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ServerNode {
    /// Its uid (model number).
    pub uid: u8,
    /// Its podCIDR block, once set.
    pub block: Option<u8>,
    /// Ghost: how many times `block` changed value (podCIDRs are immutable: at most once).
    pub changes: u8,
}

/// A change the watch delivers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WatchEvent {
    /// The Node object as it is after a change.
    Upsert(u8, ServerNode),
    /// The Node object `uid` of name `.0` was deleted.
    Delete(u8, u8),
}

/// What the server did with a PATCH, kept until the client reads the answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ServerResult {
    /// 2xx, with the Node as it is now.
    Applied(ServerNode),
    /// 404.
    NotFound,
    /// 422: podCIDRs already set to other values.
    AlreadySet,
    /// 422: the name belongs to another object (the uid precondition).
    Replaced,
    /// 409: refused, nothing written.
    Conflict,
}

/// One PATCH of `spec.podCIDRs` (pinned to `uid`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Patch {
    /// The replica that sent it and the process incarnation (a restarted replica is a new one).
    pub replica: u8,
    /// Incarnation of the replica that sent it.
    pub incarnation: u8,
    /// Node name index.
    pub name: u8,
    /// The object the PATCH is pinned to.
    pub uid: u8,
    /// The block it writes.
    pub block: u8,
    /// Ticks before the server's deadline; `None` once the server has handled it or given it up.
    pub server_left: Option<u8>,
    /// What the server did (until the client reads it).
    pub result: Option<ServerResult>,
    /// Ticks before the client gives up; `None` once the client has its outcome (or is gone).
    pub client_left: Option<u8>,
}

/// A replica's phase.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not running (killed, stopped or exited); it restarts as a new incarnation.
    Down,
    /// Running, not leading (trying to acquire the Lease).
    Standby,
    /// Without leader election: restarted, waiting `left` ticks (the start-up write fence)
    /// before it lists.
    Fencing {
        /// Ticks left.
        left: u8,
    },
    /// Allocating.
    Leading,
    /// SIGTERM: in-flight PATCHes finish; then the Lease is held while writes are in doubt.
    Stopping,
}

/// The allocator, compared and hashed by [`Allocator::model_key`].
#[derive(Clone)]
pub struct Alloc(pub Allocator, String);

impl Alloc {
    fn new(a: Allocator) -> Alloc {
        let key = a.model_key();
        Alloc(a, key)
    }
    fn rekey(&mut self) {
        self.1 = self.0.model_key();
    }
}

impl fmt::Debug for Alloc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.1)
    }
}
impl PartialEq for Alloc {
    fn eq(&self, other: &Self) -> bool {
        self.1 == other.1
    }
}
impl Eq for Alloc {}
impl Hash for Alloc {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.1.hash(state);
    }
}

/// What a running (listing) replica holds.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Running {
    /// The allocator.
    pub alloc: Alloc,
    /// The informer's cache: name → object.
    pub cache: BTreeMap<u8, ServerNode>,
    /// Watch events not delivered yet, in order.
    pub watch: VecDeque<WatchEvent>,
    /// The work queue.
    pub work: BTreeSet<u8>,
    /// Nodes waiting for a freed block.
    pub waiting: BTreeSet<u8>,
    /// Names whose next step is a GET (`Next::Reread`).
    pub reread: BTreeSet<u8>,
    /// Assigned writes waiting for the write gate: name → (uid, block).
    pub to_write: BTreeMap<u8, (u8, u8)>,
    /// Writes in doubt: name → ticks until the last may land (`InDoubtWrites`).
    pub in_doubt: BTreeMap<u8, u8>,
    /// The published pool usage (gauge), blocks.
    pub gauge: u32,
    /// Without leader election: ticks before writes may start (`WriteGate::not_before`).
    pub fence_left: u8,
}

/// One replica.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Replica {
    /// Phase.
    pub phase: Phase,
    /// Process incarnation.
    pub incarnation: u8,
    /// While listing/leading/stopping.
    pub run: Option<Running>,
    /// Bug 12 only ([`Bugs::b12_gate_before_queue`], always empty without it): writes of this
    /// incarnation that passed the write gate and wait for a token: name → (uid, block). Kept
    /// when the Lease is lost (the process winds down, its workers finish), dropped by `kill -9`.
    pub queued: BTreeMap<u8, (u8, u8)>,
}

/// The Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Holder: replica and incarnation (a restarted process is a new identity).
    pub holder: Option<(u8, u8)>,
    /// Ticks since the holder's last renewal (capped at [`LEASE`]).
    pub age: u8,
    /// The holder's renewals fail from now on (Lease updates hang, reads fail): a fault.
    pub failing: bool,
}

/// The whole state.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct State {
    /// Nodes by name index.
    pub nodes: Vec<Option<ServerNode>>,
    /// The next uid.
    pub next_uid: u8,
    /// PATCHes in flight or late.
    pub patches: Vec<Patch>,
    /// The Lease (leader election only).
    pub lease: Lease,
    /// Replicas.
    pub replicas: Vec<Replica>,
    /// Faults left.
    pub budget: Budget,
}

/// A step.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Step {
    /// Time passes one tick.
    Tick,
    /// A Node is created under name `.0`.
    Create(u8),
    /// Node `.0` is deleted.
    Delete(u8),
    /// Replica `.0` (down) starts again.
    Restart(u8),
    /// Replica `.0` takes the Lease (or, without election, starts after its fence) and lists.
    Acquire(u8),
    /// The leader's renewals start failing (fault).
    LeaseFault,
    /// Replica `.0` reconciles Node `.1` as its informer shows it.
    Reconcile(u8, u8),
    /// Replica `.0` sends the PATCH assigned to Node `.1` (the write gate is open). With bug 12
    /// the write is queued instead ([`Replica::queued`]).
    StartWrite(u8, u8),
    /// Bug 12: replica `.0` sends its queued PATCH for Node `.1` without checking the gate again.
    SendQueued(u8, u8),
    /// Replica `.0` GETs Node `.1` and decides on the answer.
    Reread(u8, u8),
    /// The server handles PATCH `.0` (commits or refuses it).
    Serve(usize),
    /// The server refuses PATCH `.0` with 409 (fault).
    Conflict(usize),
    /// The client of PATCH `.0` reads the server's answer.
    Answer(usize),
    /// The client of PATCH `.0` gets no definite answer (504 or a dropped connection, before or
    /// after the server handled it; fault).
    AnswerUnknown(usize),
    /// The client of PATCH `.0` times out (its `T` has passed).
    ClientTimeout(usize),
    /// Replica `.0`'s informer gets its next watch event.
    Deliver(u8),
    /// Replica `.0`'s watch is dropped; it lists again.
    Relist(u8),
    /// `kill -9` of replica `.0`.
    Kill(u8),
    /// SIGTERM to replica `.0`.
    Stop(u8),
    /// Stopping replica `.0` releases the Lease and exits.
    Release(u8),
    /// Another actor sets Node `.0`'s podCIDRs to block `.1` (fault). Only where no controller
    /// allocation can collide with it, as the chaos suite's other writer: no PATCH in flight, no
    /// Node can be created any more, every other Node has podCIDRs, and the block and the Node are
    /// free in every running replica's pool.
    Adopt(u8, u8),
}

/// The model.
#[derive(Debug, Clone)]
pub struct NodeIpam {
    /// Size and switches.
    pub config: Config,
}

impl NodeIpam {
    fn view(&self, name: u8, node: &ServerNode) -> NodeView {
        let mut view = names()[usize::from(name)].clone();
        view.uid = Some(uid_text(node.uid));
        view.pod_cidr = node.block.map(|b| block_cidr(b).to_string());
        view.pod_cidrs = node
            .block
            .map(|b| vec![block_cidr(b).to_string()])
            .unwrap_or_default();
        view
    }

    fn fresh(&self, a: &mut Allocator, view: &NodeView) -> Decision {
        if self.config.bugs.b6_informer_behind_get {
            a.decide(view)
        } else {
            a.decide_fresh(view)
        }
    }

    /// A replica lists: a new allocator, start-up occupy, every Node queued.
    fn list(&self, s: &State, fence_left: u8) -> Running {
        let mut a = match Allocator::new(&ipam()) {
            Ok(a) => a,
            Err(e) => panic!("allocator: {e}"),
        };
        let mut cache = BTreeMap::new();
        let mut views = Vec::new();
        for (i, n) in s.nodes.iter().enumerate() {
            if let Some(n) = n {
                let i = u8::try_from(i).unwrap_or(u8::MAX);
                cache.insert(i, *n);
                views.push(self.view(i, n));
            }
        }
        let _ = a.startup_occupy(&views);
        let gauge = used(&a);
        Running {
            alloc: Alloc::new(a),
            work: cache.keys().copied().collect(),
            cache,
            watch: VecDeque::new(),
            waiting: BTreeSet::new(),
            reread: BTreeSet::new(),
            to_write: BTreeMap::new(),
            in_doubt: BTreeMap::new(),
            gauge,
            fence_left,
        }
    }

    /// The worker's bookkeeping for a decision (`controller/worker.rs`: `decided` wakes waiting
    /// Nodes when blocks were freed; `settle` publishes the pool after a pool change and queues
    /// the next step; `carry_out` writes an assignment or re-reads).
    fn apply(&self, run: &mut Running, name: u8, mut d: Decision) {
        if self.config.bugs.b5_occupy_without_metric {
            d.metrics
                .retain(|m| !matches!(m, MetricEvent::Occupied { .. }));
        }
        let freed = d
            .metrics
            .iter()
            .any(|m| matches!(m, MetricEvent::Released { blocks, .. } if *blocks > 0));
        let pool_changed = d.metrics.iter().any(|m| {
            matches!(
                m,
                MetricEvent::Released { .. }
                    | MetricEvent::Allocated { .. }
                    | MetricEvent::Occupied { .. }
                    | MetricEvent::NodeSkipped { .. }
            )
        });
        run.alloc.rekey();
        if d.next == Next::WaitForFreeBlock {
            run.waiting.insert(name);
        } else {
            run.waiting.remove(&name);
        }
        if freed {
            let woken: Vec<u8> = std::mem::take(&mut run.waiting).into_iter().collect();
            run.work.extend(woken);
        }
        if pool_changed {
            run.gauge = used(&run.alloc.0);
        }
        if let Decided::Assign { pod_cidrs, uid } = &d.action {
            let uid = uid.as_deref().and_then(uid_number).unwrap_or(u8::MAX);
            let block = pod_cidrs.first().map_or(0, block_of);
            run.to_write.insert(name, (uid, block));
            return;
        }
        match d.next {
            Next::Done | Next::WaitForFreeBlock => {}
            Next::RetryBackoff | Next::RetryAfter(_) | Next::EndQuarantine => {
                run.work.insert(name);
            }
            Next::Reread => {
                run.reread.insert(name);
            }
        }
    }

    fn busy(s: &State, r: u8, run: &Running, name: u8) -> bool {
        run.to_write.contains_key(&name)
            || run.reread.contains(&name)
            || s.replicas[usize::from(r)].queued.contains_key(&name)
            || s.patches.iter().any(|p| {
                p.replica == r
                    && p.incarnation == s.replicas[usize::from(r)].incarnation
                    && p.name == name
                    && p.client_left.is_some()
            })
    }

    /// Whether replica `r` may start a write now: without election, after the start-up fence;
    /// with it, [`Leadership::may_start_write`] on the Lease as last renewed.
    fn gate_open(&self, s: &State, r: u8, run: &Running) -> bool {
        if !self.config.leader_election {
            return run.fence_left == 0;
        }
        if s.lease.holder != Some((r, s.replicas[usize::from(r)].incarnation)) {
            return false;
        }
        let renewed = now() - ticks(s.lease.age);
        let leading = Leadership::Leading {
            write_fence: renewed + ticks(LEASE),
        };
        leading.may_start_write(now(), ticks(T))
    }

    /// `InDoubtWrites::record` on the replica's writes in doubt, carried from step to step.
    fn record_in_doubt(run: &mut Running, name: u8, outcome: &PatchOutcome) {
        let writes = InDoubtWrites::new();
        let unknown = PatchOutcome::Unknown {
            message: "carried".to_owned(),
        };
        for (n, left) in &run.in_doubt {
            // A write recorded `left` ticks before its deadline was answered `T - left` ago.
            let answered = now() + ticks(*left) - ticks(T);
            writes.record(&name_of(*n), answered, ticks(T), &unknown);
        }
        writes.record(&name_of(name), now(), ticks(T), outcome);
        run.in_doubt = writes
            .deadlines()
            .into_iter()
            .filter(|(_, at)| *at > now())
            .map(|(n, at)| {
                let left = (at - now()).as_secs();
                (index_of(&n), u8::try_from(left).unwrap_or(u8::MAX))
            })
            .collect();
    }

    /// `InDoubtWrites::pending(now)` on the replica's writes in doubt.
    fn in_doubt_pending(run: &Running) -> bool {
        let writes = InDoubtWrites::new();
        let unknown = PatchOutcome::Unknown {
            message: "carried".to_owned(),
        };
        for (n, left) in &run.in_doubt {
            writes.record(
                &name_of(*n),
                now() + ticks(*left) - ticks(T),
                ticks(T),
                &unknown,
            );
        }
        writes.pending(now()).is_some()
    }

    fn outcome(&self, name: u8, result: Option<ServerResult>) -> PatchOutcome {
        match result {
            None => PatchOutcome::Unknown {
                message: "no definite answer".to_owned(),
            },
            Some(ServerResult::Applied(node)) => PatchOutcome::Applied(self.view(name, &node)),
            Some(ServerResult::NotFound) => PatchOutcome::NotFound,
            Some(ServerResult::AlreadySet) => PatchOutcome::CannotApply {
                kind: CannotApplyKind::PodCidrsAlreadySet,
                message: "spec.podCIDRs: may not change once set".to_owned(),
            },
            Some(ServerResult::Replaced) => PatchOutcome::CannotApply {
                kind: CannotApplyKind::NodeReplaced,
                message: "metadata.uid: field is immutable".to_owned(),
            },
            Some(ServerResult::Conflict) => PatchOutcome::RetryLater {
                status: 409,
                retry_after: None,
                message: "conflict".to_owned(),
            },
        }
    }

    /// The client of patch `i` has its outcome.
    fn answer(&self, s: &mut State, i: usize, result: Option<ServerResult>) {
        let p = s.patches[i];
        s.patches[i].client_left = None;
        let r = usize::from(p.replica);
        let replica = &mut s.replicas[r];
        if replica.incarnation != p.incarnation {
            return;
        }
        let phase = replica.phase;
        let Some(run) = replica.run.as_mut() else {
            return;
        };
        let outcome = self.outcome(p.name, result);
        Self::record_in_doubt(run, p.name, &outcome);
        let uid = uid_text(p.uid);
        let d = run.alloc.0.patch_outcome(
            &name_of(p.name),
            Some(&uid),
            &[block_cidr(p.block)],
            outcome,
        );
        self.apply(run, p.name, d);
        if phase == Phase::Stopping {
            // The window is closed: nothing more is written or read.
            run.to_write.clear();
            run.reread.clear();
            run.work.clear();
        }
    }

    fn push_event(s: &mut State, e: WatchEvent) {
        for replica in &mut s.replicas {
            if let Some(run) = replica.run.as_mut() {
                run.watch.push_back(e);
            }
        }
    }

    fn kill(&self, s: &mut State, r: u8, release: bool) {
        let replica = &mut s.replicas[usize::from(r)];
        replica.phase = Phase::Down;
        replica.run = None;
        replica.queued.clear();
        for p in &mut s.patches {
            if p.replica == r && p.incarnation == replica.incarnation {
                p.client_left = None;
            }
        }
        if release && s.lease.holder == Some((r, replica.incarnation)) {
            s.lease.holder = None;
        }
        s.patches
            .retain(|p| p.server_left.is_some() || p.client_left.is_some());
    }

    /// Replica `r` sends the PATCH `(uid, block)` for Node `name`. Its client waits for the
    /// answer while the replica runs; a write sent after the replica's term ended (bug 12: a lost
    /// Lease) has no one left to read the answer.
    fn send(&self, s: &mut State, r: u8, name: u8, (uid, block): (u8, u8)) {
        let replica = &s.replicas[usize::from(r)];
        let server = if self.config.bugs.b1_server_deadline_past_timeout {
            T + 1
        } else {
            T
        };
        s.patches.push(Patch {
            replica: r,
            incarnation: replica.incarnation,
            name,
            uid,
            block,
            server_left: Some(server),
            result: None,
            client_left: replica.run.is_some().then_some(T),
        });
    }

    /// Whether a tick now lets a PATCH's deadline pass before the server handled it (the request
    /// hung: a fault, spent from [`Budget::unknowns`]).
    fn drops_write(s: &State) -> bool {
        s.patches
            .iter()
            .any(|p| p.server_left == Some(1) && p.result.is_none())
    }

    fn progress_steps(&self, s: &State, out: &mut Vec<Step>) {
        let le = self.config.leader_election;
        let any_client_expired = s.patches.iter().any(|p| p.client_left == Some(0));
        if !any_client_expired && (!Self::drops_write(s) || s.budget.unknowns > 0) {
            out.push(Step::Tick);
        }
        for (r, replica) in s.replicas.iter().enumerate() {
            let r = u8::try_from(r).unwrap_or(u8::MAX);
            let me = Some((r, replica.incarnation));
            // Bug 12: a queued write is sent whatever the replica's phase (a lost Lease ends the
            // term, not the worker); the process exits only after that.
            if s.patches.len() < self.config.max_in_flight {
                for name in replica.queued.keys() {
                    out.push(Step::SendQueued(r, *name));
                }
            }
            let winding_down = !replica.queued.is_empty();
            match replica.phase {
                Phase::Down if winding_down => {}
                Phase::Down => out.push(Step::Restart(r)),
                Phase::Standby => {
                    let free =
                        s.lease.holder.is_none() || (s.lease.holder != me && s.lease.age >= LEASE);
                    if le && free {
                        out.push(Step::Acquire(r));
                    }
                }
                Phase::Fencing { left: 0 } => out.push(Step::Acquire(r)),
                Phase::Fencing { .. } => {}
                Phase::Leading | Phase::Stopping => {
                    let Some(run) = &replica.run else { continue };
                    if !run.watch.is_empty() {
                        out.push(Step::Deliver(r));
                    }
                    if replica.phase == Phase::Stopping {
                        let waiting = s.patches.iter().any(|p| {
                            p.replica == r
                                && p.incarnation == replica.incarnation
                                && p.client_left.is_some()
                        });
                        let hold = !self.config.bugs.b9_release_with_write_in_doubt
                            && Self::in_doubt_pending(run)
                            && (!le || s.lease.holder == me);
                        if !waiting && !hold && !winding_down {
                            out.push(Step::Release(r));
                        }
                        continue;
                    }
                    for name in &run.work {
                        if !Self::busy(s, r, run, *name) {
                            out.push(Step::Reconcile(r, *name));
                        }
                    }
                    for name in &run.reread {
                        out.push(Step::Reread(r, *name));
                    }
                    // With bug 12 passing the gate only queues the write: no PATCH is held yet.
                    let room = s.patches.len() < self.config.max_in_flight
                        || self.config.bugs.b12_gate_before_queue;
                    if room && self.gate_open(s, r, run) {
                        for name in run.to_write.keys() {
                            out.push(Step::StartWrite(r, *name));
                        }
                    }
                }
            }
        }
        for (i, p) in s.patches.iter().enumerate() {
            if p.server_left.is_some_and(|l| l >= 1) && p.result.is_none() {
                out.push(Step::Serve(i));
            }
            if p.result.is_some() && p.client_left.is_some() {
                out.push(Step::Answer(i));
            }
            if p.client_left == Some(0) {
                out.push(Step::ClientTimeout(i));
            }
        }
    }

    fn fault_steps(&self, s: &State, out: &mut Vec<Step>) {
        let b = s.budget;
        for (i, n) in s.nodes.iter().enumerate() {
            let i = u8::try_from(i).unwrap_or(u8::MAX);
            match n {
                None if b.creates > 0 => out.push(Step::Create(i)),
                Some(_) if b.deletes > 0 => out.push(Step::Delete(i)),
                _ => {}
            }
        }
        if self.config.leader_election
            && b.lease_losses > 0
            && !s.lease.failing
            && s.lease.holder.is_some()
        {
            out.push(Step::LeaseFault);
        }
        for (r, replica) in s.replicas.iter().enumerate() {
            let r = u8::try_from(r).unwrap_or(u8::MAX);
            let running = matches!(replica.phase, Phase::Leading | Phase::Stopping);
            if running && b.kills > 0 {
                out.push(Step::Kill(r));
            }
            if replica.phase == Phase::Leading && b.stops > 0 {
                out.push(Step::Stop(r));
            }
            if running && b.relists > 0 {
                out.push(Step::Relist(r));
            }
        }
        let none_queued = s.replicas.iter().all(|r| r.queued.is_empty());
        if b.adopts > 0 && b.creates == 0 && s.patches.is_empty() && none_queued {
            let bare: Vec<u8> = (0..s.nodes.len())
                .filter(|i| s.nodes[*i].is_some_and(|n| n.block.is_none()))
                .filter_map(|i| u8::try_from(i).ok())
                .collect();
            if let [name] = bare[..] {
                for block in 1..=3u8 {
                    let taken = s.nodes.iter().flatten().any(|n| n.block == Some(block));
                    let free_everywhere =
                        s.replicas.iter().filter_map(|r| r.run.as_ref()).all(|run| {
                            let a = &run.alloc.0;
                            !run.to_write.contains_key(&name)
                                && a.held(&name_of(name)).is_none()
                                && a.known_names().iter().all(|n| {
                                    a.held(n).is_none_or(|h| !h.contains(&block_cidr(block)))
                                })
                        });
                    if !taken && free_everywhere {
                        out.push(Step::Adopt(name, block));
                    }
                }
            }
        }
        for (i, p) in s.patches.iter().enumerate() {
            if p.client_left.is_some() && b.unknowns > 0 {
                out.push(Step::AnswerUnknown(i));
            }
            if p.server_left.is_some_and(|l| l >= 1) && p.result.is_none() && b.conflicts > 0 {
                out.push(Step::Conflict(i));
            }
        }
    }

    /// The state after `step`, or `None` when it is not enabled.
    pub fn step(&self, last: &State, step: Step) -> State {
        let mut s = last.clone();
        match step {
            Step::Tick => {
                if Self::drops_write(&s) {
                    s.budget.unknowns -= 1;
                }
                let holder_renews = !s.lease.failing
                    && s.lease.holder.is_some_and(|(r, inc)| {
                        let replica = &s.replicas[usize::from(r)];
                        replica.incarnation == inc
                            && matches!(replica.phase, Phase::Leading | Phase::Stopping)
                    });
                s.lease.age = if holder_renews {
                    0
                } else {
                    (s.lease.age + 1).min(LEASE)
                };
                for p in &mut s.patches {
                    p.server_left = match p.server_left {
                        Some(l) if l >= 1 && p.result.is_none() => Some(l - 1),
                        _ => None,
                    };
                    p.client_left = p.client_left.map(|l| l.saturating_sub(1));
                }
                s.patches
                    .retain(|p| p.server_left.is_some_and(|l| l >= 1) || p.client_left.is_some());
                for (r, replica) in s.replicas.iter_mut().enumerate() {
                    if let Phase::Fencing { left } = replica.phase {
                        replica.phase = Phase::Fencing {
                            left: left.saturating_sub(1),
                        };
                    }
                    if let Some(run) = replica.run.as_mut() {
                        run.fence_left = run.fence_left.saturating_sub(1);
                        run.in_doubt = run
                            .in_doubt
                            .iter()
                            .filter(|(_, l)| **l > 1)
                            .map(|(n, l)| (*n, l - 1))
                            .collect();
                    }
                    let r = u8::try_from(r).unwrap_or(u8::MAX);
                    let leading = matches!(replica.phase, Phase::Leading | Phase::Stopping);
                    if self.config.leader_election
                        && leading
                        && s.lease.holder == Some((r, replica.incarnation))
                        && s.lease.age >= RENEW_DEADLINE
                    {
                        // Lost: stops allocating, keeps no state, does not release. Its queued
                        // writes (bug 12) stay: the wind-down lets a worker holding a window slot
                        // finish.
                        replica.phase = Phase::Down;
                        replica.run = None;
                        let inc = replica.incarnation;
                        for p in &mut s.patches {
                            if p.replica == r && p.incarnation == inc {
                                p.client_left = None;
                            }
                        }
                    }
                }
                s.patches
                    .retain(|p| p.server_left.is_some() || p.client_left.is_some());
            }
            Step::Create(i) => {
                s.budget.creates -= 1;
                let node = ServerNode {
                    uid: s.next_uid,
                    block: None,
                    changes: 0,
                };
                s.next_uid += 1;
                s.nodes[usize::from(i)] = Some(node);
                Self::push_event(&mut s, WatchEvent::Upsert(i, node));
            }
            Step::Delete(i) => {
                s.budget.deletes -= 1;
                if let Some(node) = s.nodes[usize::from(i)].take() {
                    Self::push_event(&mut s, WatchEvent::Delete(i, node.uid));
                }
            }
            Step::Restart(r) => {
                let replica = &mut s.replicas[usize::from(r)];
                replica.incarnation = replica.incarnation.wrapping_add(1) % 4;
                if self.config.leader_election {
                    replica.phase = Phase::Standby;
                } else if self.config.bugs.b2_list_before_startup_fence {
                    let run = self.list(&s, T);
                    let replica = &mut s.replicas[usize::from(r)];
                    replica.phase = Phase::Leading;
                    replica.run = Some(run);
                } else {
                    replica.phase = Phase::Fencing { left: T };
                }
            }
            Step::Acquire(r) => {
                if self.config.leader_election {
                    s.lease = Lease {
                        holder: Some((r, s.replicas[usize::from(r)].incarnation)),
                        age: 0,
                        failing: false,
                    };
                }
                let run = self.list(&s, 0);
                let replica = &mut s.replicas[usize::from(r)];
                replica.phase = Phase::Leading;
                replica.run = Some(run);
            }
            Step::LeaseFault => {
                s.budget.lease_losses -= 1;
                s.lease.failing = true;
            }
            Step::Reconcile(r, name) => {
                let replica = &mut s.replicas[usize::from(r)];
                if let Some(run) = replica.run.as_mut() {
                    run.work.remove(&name);
                    let d = match run.cache.get(&name) {
                        Some(node) => run.alloc.0.decide(&self.view(name, node)),
                        None => run.alloc.0.remove(&name_of(name)),
                    };
                    self.apply(run, name, d);
                }
            }
            Step::StartWrite(r, name) => {
                let replica = &mut s.replicas[usize::from(r)];
                let write = replica
                    .run
                    .as_mut()
                    .and_then(|run| run.to_write.remove(&name));
                if let Some(write) = write {
                    if self.config.bugs.b12_gate_before_queue {
                        replica.queued.insert(name, write);
                    } else {
                        self.send(&mut s, r, name, write);
                    }
                }
            }
            Step::SendQueued(r, name) => {
                if let Some(write) = s.replicas[usize::from(r)].queued.remove(&name) {
                    self.send(&mut s, r, name, write);
                }
            }
            Step::Reread(r, name) => {
                let server = s.nodes[usize::from(name)];
                let replica = &mut s.replicas[usize::from(r)];
                if let Some(run) = replica.run.as_mut() {
                    run.reread.remove(&name);
                    let d = match server {
                        Some(node) => self.fresh(&mut run.alloc.0, &self.view(name, &node)),
                        None => {
                            let uid = run.alloc.0.record_uid(&name_of(name));
                            run.alloc.0.object_gone(&name_of(name), uid.as_deref())
                        }
                    };
                    self.apply(run, name, d);
                }
            }
            Step::Serve(i) => {
                let p = s.patches[i];
                let result = match s.nodes[usize::from(p.name)] {
                    None => ServerResult::NotFound,
                    Some(node) if node.uid != p.uid => ServerResult::Replaced,
                    Some(node) if node.block.is_some_and(|b| b != p.block) => {
                        ServerResult::AlreadySet
                    }
                    Some(node) if node.block == Some(p.block) => ServerResult::Applied(node),
                    Some(mut node) => {
                        node.block = Some(p.block);
                        node.changes += 1;
                        s.nodes[usize::from(p.name)] = Some(node);
                        Self::push_event(&mut s, WatchEvent::Upsert(p.name, node));
                        ServerResult::Applied(node)
                    }
                };
                let p = &mut s.patches[i];
                p.server_left = None;
                p.result = Some(result);
                if p.client_left.is_none() {
                    s.patches.remove(i);
                }
            }
            Step::Conflict(i) => {
                s.budget.conflicts -= 1;
                s.patches[i].server_left = None;
                s.patches[i].result = Some(ServerResult::Conflict);
            }
            Step::Answer(i) => {
                let result = s.patches[i].result;
                self.answer(&mut s, i, result);
                s.patches
                    .retain(|p| p.server_left.is_some_and(|l| l >= 1) || p.client_left.is_some());
            }
            Step::AnswerUnknown(i) => {
                s.budget.unknowns -= 1;
                self.answer(&mut s, i, None);
                s.patches
                    .retain(|p| p.server_left.is_some_and(|l| l >= 1) || p.client_left.is_some());
            }
            Step::ClientTimeout(i) => {
                self.answer(&mut s, i, None);
                s.patches
                    .retain(|p| p.server_left.is_some_and(|l| l >= 1) || p.client_left.is_some());
            }
            Step::Deliver(r) => {
                let replica = &mut s.replicas[usize::from(r)];
                if let Some(run) = replica.run.as_mut()
                    && let Some(e) = run.watch.pop_front()
                {
                    match e {
                        WatchEvent::Upsert(name, node) => {
                            run.cache.insert(name, node);
                            run.work.insert(name);
                        }
                        WatchEvent::Delete(name, _) => {
                            run.cache.remove(&name);
                            run.work.insert(name);
                        }
                    }
                }
            }
            Step::Relist(r) => {
                s.budget.relists -= 1;
                let listed: BTreeMap<u8, ServerNode> = s
                    .nodes
                    .iter()
                    .enumerate()
                    .filter_map(|(i, n)| n.map(|n| (u8::try_from(i).unwrap_or(u8::MAX), n)))
                    .collect();
                let replica = &mut s.replicas[usize::from(r)];
                if let Some(run) = replica.run.as_mut() {
                    run.watch.clear();
                    let old = std::mem::replace(&mut run.cache, listed);
                    for (name, node) in old.iter() {
                        if run.cache.get(name) != Some(node) {
                            run.work.insert(*name);
                        }
                    }
                    let changed: Vec<u8> = run
                        .cache
                        .iter()
                        .filter(|(n, node)| old.get(n) != Some(node))
                        .map(|(n, _)| *n)
                        .collect();
                    run.work.extend(changed);
                }
            }
            Step::Kill(r) => {
                s.budget.kills -= 1;
                self.kill(&mut s, r, self.config.bugs.b4_kill_releases_lease);
            }
            Step::Stop(r) => {
                s.budget.stops -= 1;
                let replica = &mut s.replicas[usize::from(r)];
                replica.phase = Phase::Stopping;
                if let Some(run) = replica.run.as_mut() {
                    run.work.clear();
                    run.to_write.clear();
                    run.reread.clear();
                    run.waiting.clear();
                }
            }
            Step::Release(r) => {
                self.kill(&mut s, r, true);
            }
            Step::Adopt(name, block) => {
                s.budget.adopts -= 1;
                if let Some(node) = s.nodes[usize::from(name)].as_mut() {
                    node.block = Some(block);
                    node.changes += 1;
                    let node = *node;
                    Self::push_event(&mut s, WatchEvent::Upsert(name, node));
                }
            }
        }
        s
    }

    /// Whether the system has settled once faults stopped: no PATCH in flight or late, every
    /// replica up (no restart, start-up fence or stop under way), exactly one leader (holding the
    /// Lease, with election), and its watch, work queue, re-reads and writes all empty. The only
    /// steps left are then time passing and Lease renewals, which change nothing else (a missed
    /// renewal is a fault). A cheap structural test, so the property can run on every state.
    pub fn quiescent(&self, s: &State) -> bool {
        if !s.patches.is_empty() {
            return false;
        }
        let mut leaders = 0;
        for (r, replica) in s.replicas.iter().enumerate() {
            match replica.phase {
                Phase::Standby => {}
                Phase::Leading => {
                    leaders += 1;
                    let r = u8::try_from(r).unwrap_or(u8::MAX);
                    if self.config.leader_election
                        && s.lease.holder != Some((r, replica.incarnation))
                    {
                        return false;
                    }
                    let Some(run) = &replica.run else {
                        return false;
                    };
                    if !(run.watch.is_empty()
                        && replica.queued.is_empty()
                        && run.work.is_empty()
                        && run.reread.is_empty()
                        && run.to_write.is_empty()
                        && run.fence_left == 0)
                    {
                        return false;
                    }
                }
                Phase::Down | Phase::Fencing { .. } | Phase::Stopping => return false,
            }
        }
        leaders == 1
    }

    /// The leader at a quiescent state (leading, running).
    pub fn leader<'a>(&self, s: &'a State) -> Option<&'a Running> {
        s.replicas
            .iter()
            .filter(|r| r.phase == Phase::Leading)
            .find_map(|r| r.run.as_ref())
    }
}

fn used(a: &Allocator) -> u32 {
    a.pool_stats().iter().map(|p| p.used_blocks).sum()
}

/// Why a quiescent state is not settled right (`None`: it is).
pub fn settled_wrong(m: &NodeIpam, s: &State) -> Option<String> {
    let Some(run) = m.leader(s) else {
        return Some("no leader".to_owned());
    };
    let mut held_blocks = BTreeSet::new();
    for (i, n) in s.nodes.iter().enumerate() {
        let Some(n) = n else { continue };
        let Some(b) = n.block else {
            return Some(format!("Node {} has no podCIDRs", short(i)));
        };
        held_blocks.insert(b);
        let name = name_of(u8::try_from(i).unwrap_or(u8::MAX));
        if run.alloc.0.held(&name) != Some(&[block_cidr(b)][..]) {
            return Some(format!(
                "the leader holds {:?} for Node {} which has {}",
                run.alloc.0.held(&name),
                short(i),
                block_cidr(b)
            ));
        }
    }
    // The service CIDR's block is used for good.
    let want = u32::try_from(held_blocks.len()).unwrap_or(u32::MAX) + 1;
    let pool = used(&run.alloc.0);
    if pool != want {
        return Some(format!(
            "pool used {pool} blocks, Nodes + service CIDR hold {want}"
        ));
    }
    if run.gauge != pool {
        return Some(format!(
            "published usage {} but the pool uses {pool}",
            run.gauge
        ));
    }
    None
}

/// `n0`, `n1`, … for traces.
pub fn short(i: usize) -> String {
    format!("n{i}")
}

impl Model for NodeIpam {
    type State = State;
    type Action = Step;

    fn init_states(&self) -> Vec<State> {
        let c = &self.config;
        let mut nodes = vec![None; c.names];
        let mut next_uid = 0;
        for slot in nodes.iter_mut().take(c.initial_nodes) {
            *slot = Some(ServerNode {
                uid: next_uid,
                block: None,
                changes: 0,
            });
            next_uid += 1;
        }
        let replicas = (0..c.replicas)
            .map(|_| Replica {
                phase: if c.leader_election {
                    Phase::Standby
                } else {
                    Phase::Fencing { left: 0 }
                },
                incarnation: 0,
                run: None,
                queued: BTreeMap::new(),
            })
            .collect();
        vec![State {
            nodes,
            next_uid,
            patches: Vec::new(),
            lease: Lease {
                holder: None,
                age: LEASE,
                failing: false,
            },
            replicas,
            budget: c.budget,
        }]
    }

    fn actions(&self, s: &State, out: &mut Vec<Step>) {
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
            Property::always("podCIDRs never change once set", |_, s: &State| {
                s.nodes.iter().flatten().all(|n| n.changes <= 1)
            }),
            Property::always(
                "settled: every Node served, pool and gauge = blocks held",
                |m: &NodeIpam, s: &State| !m.quiescent(s) || settled_wrong(m, s).is_none(),
            ),
        ]
    }

    fn format_action(&self, step: &Step) -> String {
        let n = |i: &u8| short(usize::from(*i));
        match step {
            Step::Create(i) => format!("create {}", n(i)),
            Step::Delete(i) => format!("delete {}", n(i)),
            Step::Reconcile(r, i) => format!("r{r}: reconcile {}", n(i)),
            Step::StartWrite(r, i) if self.config.bugs.b12_gate_before_queue => {
                format!("r{r}: write gate passed for {}, waits for a token", n(i))
            }
            Step::StartWrite(r, i) => format!("r{r}: PATCH {}", n(i)),
            Step::SendQueued(r, i) => format!("r{r}: PATCH {} (gate not checked again)", n(i)),
            Step::Reread(r, i) => format!("r{r}: GET {}", n(i)),
            Step::Acquire(r) if self.config.leader_election => {
                format!("r{r}: takes the Lease, lists")
            }
            Step::Acquire(r) => format!("r{r}: start-up fence passed, lists"),
            Step::Restart(r) => format!("r{r}: restarts"),
            Step::LeaseFault => "the leader's Lease renewals start failing".to_owned(),
            Step::Deliver(r) => format!("r{r}: watch event delivered"),
            Step::Relist(r) => format!("r{r}: watch dropped, lists again"),
            Step::Kill(r) => format!("r{r}: kill -9"),
            Step::Stop(r) => format!("r{r}: SIGTERM"),
            Step::Release(r) => format!("r{r}: releases the Lease, exits"),
            Step::Adopt(i, b) => format!("another actor sets {} podCIDRs {}", n(i), block_cidr(*b)),
            Step::Tick => "tick".to_owned(),
            other => format!("{other:?}"),
        }
    }
}

impl Budget {
    /// No fault left.
    pub fn spent() -> Budget {
        Budget {
            creates: 0,
            deletes: 0,
            kills: 0,
            stops: 0,
            unknowns: 0,
            conflicts: 0,
            relists: 0,
            adopts: 0,
            lease_losses: 0,
        }
    }
}
