//! The model: an abstract API server (Nodes with uids, uid-pinned PATCHes that may be delivered
//! any number of steps after they were sent, a watch per replica, a Lease holding the write
//! intents) and one or two controller replicas whose every decision is made by the controller's
//! own code — `reconcile::Allocator` (decide, decide_fresh, patch_outcome, remove, object_gone,
//! startup_occupy, seed_write_in_doubt), `controller::in_doubt::InDoubtWrites` (record, pending)
//! and `controller::Leadership::may_start_write` (the Lease write gate). What the model draws
//! itself is the plumbing around them: the work queue, the intent log and the Lease writes that
//! carry it (`leader::intents::WriteIntents` and `controller::gate`: an intent recorded with the
//! assignment, Lease UPDATEs carrying the log, the PATCH only after a committed write holds its
//! intent, an intent settled once its Node's record is no longer pending; the successor's
//! `controller::inherited`), which answer a PATCH gets, when time passes.
//!
//! No server deadline (issue 30 dropped assumption A1): a PATCH the server has not handled stays
//! there, and may be handled at any later step, for as long as it can still change something (its
//! Node object, the uid it is pinned to, exists without podCIDRs). Safety therefore rests on the
//! Lease's compare-and-swap alone; time decides liveness only.
//!
//! Time is abstract: one tick is one unit; the request timeout `T` is 2 ticks, the lease duration
//! `L` 3 ticks, the renew deadline 2 ticks: renew deadline + request timeout > lease duration, as
//! with the defaults (10 s + 10 s > 15 s), so a write gate that forgets the request timeout opens
//! where the real one is shut. Every time in the state is relative to now (ages and time left,
//! capped where larger values change nothing), so the state space is finite although time never
//! stops. The controller's functions take `Instant`s: the model hands them `BASE + 1000 s` as
//! "now" and times relative to it (all of them are invariant under a shift of time).

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::fmt;
use std::hash::{Hash, Hasher};
use std::sync::{Arc, OnceLock};
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
pub const T: u8 = 2;
/// The Lease duration, ticks.
pub const LEASE: u8 = 3;
/// The renew deadline, ticks: a leader that has not renewed for this long gives up.
pub const RENEW_DEADLINE: u8 = 2;
/// One tick, as a `Duration` for the controller's functions.
const TICK: Duration = Duration::from_secs(1);

/// A write: (uid, block) of a Node name.
pub type Write = (u8, u8);

/// Old behaviour re-introduced, one switch per bug of RELIABILITY.md that lies in the modelled
/// code, and one per rule the write-intent fence relies on (issue 30). All off: today's code.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Bugs {
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
    /// The design before issue 30: writes fenced by time alone (the write gate, the hold before a
    /// release), no intents in the Lease: nothing is recorded, a PATCH waits for nothing but the
    /// gate, a successor inherits nothing.
    pub fence_only: bool,
    /// The PATCH is sent once its intent is recorded, before a Lease write holding it committed.
    pub send_before_intent_commits: bool,
    /// A takeover writes the Lease without the intents it read.
    pub takeover_drops_intents: bool,
    /// The successor allocates before it seeds the inherited intents: seeding is a later step
    /// ([`Step::Seed`]) and reconciles may come first.
    pub allocate_before_seeding: bool,
    /// An intent leaves the log when its PATCH is answered, whatever the answer (an unknown
    /// outcome leaves the record pending).
    pub intent_dropped_while_pending: bool,
    /// The PATCH does not pin `metadata.uid`: the server applies it to whatever object has the
    /// name when it handles it.
    pub patch_not_pinned_to_uid: bool,
    /// The write gate without the request timeout: `now < fence` instead of
    /// `now + timeout < fence` (`Leadership::may_start_write` called with a zero timeout).
    pub gate_ignores_timeout: bool,
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
    /// write still at the server (it may be handled at any later step), committed and then
    /// answered 5xx, or a client that times out on a request the server has not handled (it stays
    /// at the server, as late as it likes). A leader that loses the Lease or is killed with a
    /// PATCH unanswered leaves it at the server too, without spending this.
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
    /// Replicas: 2 with leader election; 1 without (a restart takes the Lease at once).
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

/// The name of Node number `i` ([`names`]).
pub fn name_of(i: u8) -> NodeName {
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
pub fn uid_text(n: u8) -> String {
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// The model number of uid `text` ([`uid_text`]).
pub fn uid_number(text: &str) -> Option<u8> {
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

/// The API server's view of Node `name` as the object `node`.
fn view_of(name: u8, node: &ServerNode) -> NodeView {
    let mut view = names()[usize::from(name)].clone();
    view.uid = Some(uid_text(node.uid));
    view.pod_cidr = node.block.map(|b| block_cidr(b).to_string());
    view.pod_cidrs = node
        .block
        .map(|b| vec![block_cidr(b).to_string()])
        .unwrap_or_default();
    view
}

/// "Now" for the controller's functions: every time in the state is relative to it.
pub fn now() -> tokio::time::Instant {
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
    /// The server has not handled it yet: it may at any later step (no server deadline).
    pub at_server: bool,
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
    /// Running, not leading (trying to acquire the Lease; without leader election it takes it
    /// at once).
    Standby,
    /// Allocating.
    Leading,
    /// SIGTERM: in-flight PATCHes finish; then the Lease is held while writes are in doubt.
    Stopping,
}

/// The allocator, compared and hashed by [`Allocator::model_key`].
#[derive(Clone)]
pub struct Alloc(pub Arc<Allocator>, Arc<str>);

impl Alloc {
    /// Wraps `a`, keyed by its canonical state.
    pub fn new(a: Allocator) -> Alloc {
        let key = a.model_key();
        Alloc(Arc::new(a), key.into())
    }
    /// Recomputes the key after a change through [`Alloc::get`].
    pub fn rekey(&mut self) {
        let key = self.0.model_key();
        if *self.1 != *key {
            self.1 = key.into();
        }
    }
    /// The allocator to change: shared between states until then (a state is cloned at every
    /// step; the allocator is copied only when a step changes it).
    pub fn get(&mut self) -> &mut Allocator {
        Arc::make_mut(&mut self.0)
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
    /// Assigned writes waiting for their intent to commit and for the write gate: name → (uid,
    /// block).
    pub to_write: BTreeMap<u8, Write>,
    /// The intent log (`leader::intents::WriteIntents`): the intents this replica wants the Lease
    /// to hold, name → (uid, block). An assignment records one; one leaves when the Node's record
    /// is no longer pending; a takeover starts from the Lease's.
    pub intents: BTreeMap<u8, Write>,
    /// [`Bugs::allocate_before_seeding`] only (always empty without it): inherited intents not
    /// seeded yet.
    pub unseeded: BTreeMap<u8, Write>,
    /// Writes in doubt: name → ticks until the last may land (`InDoubtWrites`).
    pub in_doubt: BTreeMap<u8, u8>,
    /// The published pool usage (gauge), blocks.
    pub gauge: u32,
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
    pub queued: BTreeMap<u8, Write>,
}

/// The Lease.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Lease {
    /// Holder: replica and incarnation (a restarted process is a new identity).
    pub holder: Option<(u8, u8)>,
    /// Ticks since the holder's last renewal (capped at [`LEASE`]).
    pub age: u8,
    /// The holder's renewals fail from now on (Lease updates hang, reads fail): a fault.
    pub failing: bool,
    /// The write intents the Lease holds (`nodeipam.io/write-intents`): name → (uid, block).
    /// Only the holder's UPDATEs change them (renewals, [`Step::WriteLease`], the release),
    /// each
    /// preconditioned on the version it last wrote: the holder is the only writer between two
    /// takeovers, so "my version is current" is "I am the holder". A takeover is the same
    /// compare-and-swap on the version read and keeps them.
    pub intents: BTreeMap<u8, Write>,
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
    /// Replica `.0` takes the Lease (a compare-and-swap keeping its intents; without election at
    /// once), lists, and seeds the inherited intents as writes in doubt.
    Acquire(u8),
    /// The holder `.0` writes the Lease with the intents it recorded (`leader::intents`: the
    /// elector writes early when `early_write_due`, else its next renewal carries them; the model
    /// lets this step run at any moment the log has intents a committed write does not hold, which
    /// covers every moment the elector may choose; the write renews too). It commits unless the holder's Lease writes fail ([`Lease::failing`]).
    WriteLease(u8),
    /// [`Bugs::allocate_before_seeding`]: replica `.0` seeds the inherited intents now.
    Seed(u8),
    /// The leader's renewals start failing (fault).
    LeaseFault,
    /// Replica `.0` reconciles Node `.1` as its informer shows it.
    Reconcile(u8, u8),
    /// Replica `.0` sends the PATCH assigned to Node `.1` (a Lease write holding its intent has
    /// committed and the write gate is open). With bug 12 the write is queued instead
    /// ([`Replica::queued`]).
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
    /// The client of PATCH `.0` times out (its `T` has passed; a request not handled yet stays at
    /// the server).
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
        view_of(name, node)
    }

    fn fresh(&self, a: &mut Allocator, view: &NodeView) -> Decision {
        if self.config.bugs.b6_informer_behind_get {
            a.decide(view)
        } else {
            a.decide_fresh(view)
        }
    }

    /// A replica lists: a new allocator, start-up occupy, every Node queued.
    fn list(&self, s: &State) -> Running {
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
            intents: BTreeMap::new(),
            unseeded: BTreeMap::new(),
            in_doubt: BTreeMap::new(),
            gauge,
        }
    }

    /// The successor's seeding (`controller::inherited::seed_inherited_intents`), after its
    /// list and before its first allocation: each inherited intent whose Node is listed with the
    /// intent's uid and no podCIDRs gets its block reserved as a write in doubt
    /// ([`Allocator::seed_write_in_doubt`]), so it is sent again; any other intent is settled
    /// (the Node has podCIDRs, is gone or is another object: the late write can change nothing)
    /// and leaves the log. One that cannot be reserved (its block is held otherwise) stays, as in
    /// the controller, which reports it; the properties catch whatever it leads to.
    fn seed(run: &mut Running, inherited: &BTreeMap<u8, Write>) {
        for (name, (uid, block)) in inherited {
            let listed = run
                .cache
                .get(name)
                .filter(|node| node.uid == *uid && node.block.is_none());
            let Some(node) = listed else {
                run.intents.remove(name);
                continue;
            };
            let view = view_of(*name, node);
            let _ = run
                .alloc
                .get()
                .seed_write_in_doubt(&view, &[block_cidr(*block)]);
        }
        run.alloc.rekey();
        run.gauge = used(&run.alloc.0);
    }

    /// After a decision about Node `name`: its intent leaves the log (written with the next Lease
    /// write) once its record is no longer pending (`controller/worker.rs`, `decided`).
    fn settle(run: &mut Running, name: u8) {
        if !run.unseeded.contains_key(&name) && !run.alloc.0.is_pending(&name_of(name)) {
            run.intents.remove(&name);
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
            if !self.config.bugs.fence_only {
                run.intents.insert(name, (uid, block));
            }
            return;
        }
        Self::settle(run, name);
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

    /// Whether replica `r` may start a write now: it holds the Lease and, with election,
    /// [`Leadership::may_start_write`] on the Lease as last renewed (liveness only now: how soon a
    /// standby may take over).
    fn gate_open(&self, s: &State, r: u8) -> bool {
        if s.lease.holder != Some((r, s.replicas[usize::from(r)].incarnation)) {
            return false;
        }
        if !self.config.leader_election {
            return true;
        }
        let renewed = now() - ticks(s.lease.age);
        let leading = Leadership::Leading {
            write_fence: renewed + ticks(LEASE),
        };
        let timeout = if self.config.bugs.gate_ignores_timeout {
            Duration::ZERO
        } else {
            ticks(T)
        };
        leading.may_start_write(now(), timeout)
    }

    /// Whether the PATCH `write` of Node `name` may be sent as far as the intents go: a Lease
    /// write holding its intent committed (the Lease holds it; only its holder, the sender,
    /// writes it).
    fn intent_committed(&self, s: &State, name: u8, write: Write) -> bool {
        let b = self.config.bugs;
        b.fence_only || b.send_before_intent_commits || s.lease.intents.get(&name) == Some(&write)
    }

    /// Whether the holder `r` has intents the Lease does not hold yet (a write is due at once;
    /// removals wait for the next write).
    fn intents_dirty(s: &State, run: &Running) -> bool {
        run.intents
            .iter()
            .any(|(n, w)| s.lease.intents.get(n) != Some(w))
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
        let d = run.alloc.get().patch_outcome(
            &name_of(p.name),
            Some(&uid),
            &[block_cidr(p.block)],
            outcome,
        );
        self.apply(run, p.name, d);
        if self.config.bugs.intent_dropped_while_pending {
            run.intents.remove(&p.name);
        }
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
    }

    /// Replica `r` sends the PATCH `(uid, block)` for Node `name`. Its client waits for the
    /// answer while the replica runs; a write sent after the replica's term ended (bug 12: a lost
    /// Lease) has no one left to read the answer.
    fn send(&self, s: &mut State, r: u8, name: u8, (uid, block): Write) {
        let replica = &s.replicas[usize::from(r)];
        s.patches.push(Patch {
            replica: r,
            incarnation: replica.incarnation,
            name,
            uid,
            block,
            at_server: true,
            result: None,
            client_left: replica.run.is_some().then_some(T),
        });
    }

    /// Whether the next tick ends the Lease for its holder `r` (incarnation `inc`): its renewals
    /// fail and the renew deadline passes (it gives up, dropping its clients).
    fn gives_up_on_tick(&self, s: &State, r: u8, inc: u8) -> bool {
        let replica = &s.replicas[usize::from(r)];
        self.config.leader_election
            && s.lease.failing
            && s.lease.holder == Some((r, inc))
            && replica.incarnation == inc
            && matches!(replica.phase, Phase::Leading | Phase::Stopping)
            && (s.lease.age + 1).min(LEASE) >= RENEW_DEADLINE
    }

    /// Whether a tick now lets a client's wait run out on a request the server has not handled
    /// (a hung request: a fault, spent from [`Budget::unknowns`]; the request stays at the
    /// server). A client whose replica gives up at this tick waits no more: no fault.
    fn tick_hangs(&self, s: &State) -> bool {
        s.patches.iter().any(|p| {
            p.client_left == Some(1)
                && p.at_server
                && !self.gives_up_on_tick(s, p.replica, p.incarnation)
        })
    }

    /// Whether a PATCH nobody waits for can still change something if the server handles it: its
    /// Node object exists without podCIDRs (pinned: the object of its uid; not pinned: any object
    /// of the name, or one that may still be created). Others are dropped from the state: the
    /// server could only refuse them (404, 422 uid, 422 podCIDRs set) or repeat the podCIDRs.
    fn may_still_land(&self, s: &State, p: &Patch) -> bool {
        let pinned = !self.config.bugs.patch_not_pinned_to_uid;
        match s.nodes[usize::from(p.name)] {
            Some(node) => node.block.is_none() && (node.uid == p.uid || !pinned),
            None => !pinned && s.budget.creates > 0,
        }
    }

    /// Drops the PATCHes that are over: answered (or abandoned) and not at the server, or at the
    /// server, abandoned and unable to change anything ([`NodeIpam::may_still_land`]).
    fn prune(&self, s: &mut State) {
        let keep: Vec<bool> = s
            .patches
            .iter()
            .map(|p| p.client_left.is_some() || (p.at_server && self.may_still_land(s, p)))
            .collect();
        let mut keep = keep.into_iter();
        s.patches.retain(|_| keep.next().unwrap_or(true));
    }

    fn progress_steps(&self, s: &State, out: &mut Vec<Step>) {
        let le = self.config.leader_election;
        let any_client_expired = s.patches.iter().any(|p| p.client_left == Some(0));
        if !any_client_expired && (s.budget.unknowns > 0 || !self.tick_hangs(s)) {
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
                    if !le || free {
                        out.push(Step::Acquire(r));
                    }
                }
                Phase::Leading | Phase::Stopping => {
                    let Some(run) = &replica.run else { continue };
                    if !run.watch.is_empty() {
                        out.push(Step::Deliver(r));
                    }
                    if s.lease.holder == me && !s.lease.failing && Self::intents_dirty(s, run) {
                        out.push(Step::WriteLease(r));
                    }
                    if !run.unseeded.is_empty() {
                        out.push(Step::Seed(r));
                    }
                    if replica.phase == Phase::Stopping {
                        let waiting = s.patches.iter().any(|p| {
                            p.replica == r
                                && p.incarnation == replica.incarnation
                                && p.client_left.is_some()
                        });
                        let hold = !self.config.bugs.b9_release_with_write_in_doubt
                            && Self::in_doubt_pending(run)
                            && s.lease.holder == me;
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
                    if room && self.gate_open(s, r) {
                        for (name, write) in &run.to_write {
                            if self.intent_committed(s, *name, *write) {
                                out.push(Step::StartWrite(r, *name));
                            }
                        }
                    }
                }
            }
        }
        for (i, p) in s.patches.iter().enumerate() {
            if p.at_server {
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
            if p.at_server && b.conflicts > 0 {
                out.push(Step::Conflict(i));
            }
        }
    }

    /// The state after `step`, or `None` when it is not enabled.
    pub fn step(&self, last: &State, step: Step) -> State {
        let mut s = last.clone();
        match step {
            Step::Tick => {
                if self.tick_hangs(&s) {
                    s.budget.unknowns -= 1;
                }
                let holder_renews = !s.lease.failing
                    && s.lease.holder.is_some_and(|(r, inc)| {
                        let replica = &s.replicas[usize::from(r)];
                        replica.incarnation == inc
                            && matches!(replica.phase, Phase::Leading | Phase::Stopping)
                    });
                if holder_renews {
                    // A renewal is an UPDATE carrying the intent log as it is now.
                    let holder = s.lease.holder.map(|(r, _)| usize::from(r));
                    if let Some(run) = holder.and_then(|r| s.replicas[r].run.as_ref()) {
                        s.lease.intents = run.intents.clone();
                    }
                }
                if self.config.leader_election {
                    s.lease.age = if holder_renews {
                        0
                    } else {
                        (s.lease.age + 1).min(LEASE)
                    };
                }
                for p in &mut s.patches {
                    p.client_left = p.client_left.map(|l| l.saturating_sub(1));
                }
                for (r, replica) in s.replicas.iter_mut().enumerate() {
                    if let Some(run) = replica.run.as_mut() {
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
                        // finish. Its PATCHes still at the server stay there.
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
                replica.phase = Phase::Standby;
            }
            Step::Acquire(r) => {
                // The takeover: an UPDATE preconditioned on the version read, carrying the
                // intents read (the predecessor's writes that may still land).
                let inherited = if self.config.bugs.takeover_drops_intents {
                    BTreeMap::new()
                } else {
                    s.lease.intents.clone()
                };
                s.lease = Lease {
                    holder: Some((r, s.replicas[usize::from(r)].incarnation)),
                    age: 0,
                    failing: false,
                    intents: inherited.clone(),
                };
                let mut run = self.list(&s);
                run.intents = inherited.clone();
                if self.config.bugs.allocate_before_seeding {
                    run.unseeded = inherited;
                } else {
                    Self::seed(&mut run, &inherited);
                }
                let replica = &mut s.replicas[usize::from(r)];
                replica.phase = Phase::Leading;
                replica.run = Some(run);
            }
            Step::WriteLease(r) => {
                if let Some(run) = s.replicas[usize::from(r)].run.as_ref() {
                    s.lease.intents = run.intents.clone();
                    if self.config.leader_election {
                        s.lease.age = 0;
                    }
                }
            }
            Step::Seed(r) => {
                if let Some(run) = s.replicas[usize::from(r)].run.as_mut() {
                    let inherited = std::mem::take(&mut run.unseeded);
                    Self::seed(run, &inherited);
                }
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
                        Some(node) => run.alloc.get().decide(&self.view(name, node)),
                        None => run.alloc.get().remove(&name_of(name)),
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
                        Some(node) => self.fresh(run.alloc.get(), &self.view(name, &node)),
                        None => {
                            let uid = run.alloc.0.record_uid(&name_of(name));
                            run.alloc.get().object_gone(&name_of(name), uid.as_deref())
                        }
                    };
                    self.apply(run, name, d);
                }
            }
            Step::Serve(i) => {
                let p = s.patches[i];
                let pinned = !self.config.bugs.patch_not_pinned_to_uid;
                let result = match s.nodes[usize::from(p.name)] {
                    None => ServerResult::NotFound,
                    Some(node) if pinned && node.uid != p.uid => ServerResult::Replaced,
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
                p.at_server = false;
                p.result = Some(result);
            }
            Step::Conflict(i) => {
                s.budget.conflicts -= 1;
                s.patches[i].at_server = false;
                s.patches[i].result = Some(ServerResult::Conflict);
            }
            Step::Answer(i) => {
                let result = s.patches[i].result;
                self.answer(&mut s, i, result);
            }
            Step::AnswerUnknown(i) => {
                s.budget.unknowns -= 1;
                self.answer(&mut s, i, None);
            }
            Step::ClientTimeout(i) => {
                self.answer(&mut s, i, None);
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
                // The release is an UPDATE too: it carries the intent log.
                let me = Some((r, s.replicas[usize::from(r)].incarnation));
                if s.lease.holder == me
                    && let Some(run) = s.replicas[usize::from(r)].run.as_ref()
                {
                    s.lease.intents = run.intents.clone();
                }
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
        self.prune(&mut s);
        s
    }

    /// Whether the system has settled once faults stopped: no PATCH in flight or late, every
    /// replica up (no restart or stop under way), exactly one leader (holding the
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
                    if s.lease.holder != Some((r, replica.incarnation)) {
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
                        && run.unseeded.is_empty())
                    {
                        return false;
                    }
                }
                Phase::Down | Phase::Stopping => return false,
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
    if !run.intents.is_empty() {
        return Some(format!(
            "the leader keeps intents {:?} with every write resolved",
            run.intents
        ));
    }
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
                phase: Phase::Standby,
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
                intents: BTreeMap::new(),
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
            Step::Acquire(r) => format!("r{r}: takes the Lease at once, lists"),
            Step::Seed(r) => format!("r{r}: seeds the inherited intents"),
            Step::WriteLease(r) => format!("r{r}: Lease write with its intents commits"),
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
