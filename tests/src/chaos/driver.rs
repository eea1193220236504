//! Runs a [`Plan`]: a sandbox with the plan's initial Nodes, the monitors attached before
//! anything happens, the controller replicas in-process, the schedule, then the end phase
//! (faults cleared, controllers running, everything settled), the last controller stopped and
//! every check.

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use axum::http::HeaderValue;
use axum::http::header::USER_AGENT;
use ipnet::IpNet;
use nodeipam::controller::{ControllerConfig, Health, LeaderError, RunSummary};
use nodeipam_core::IpamConfig;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::checks::{AllocationMonitor, check_patches, pool_usage};
use super::phases::{PhaseTimes, SettleWait};
use super::plan::{Action, CHURN_LABEL, FINALIZER, NodeSpec, Plan, block, block_count, templates};
use super::pools::{finalizer_problems, spec_of_rows};
use super::process::ProcessRuntime;
use super::watchdog::{Lateness, Watchdog};
use crate::invariants::{ClusterSpec, ControllerView, check, name_of, pod_cidrs_of};
use crate::monitor::OverlapMonitor;
use crate::sandbox::{
    FaultAction, FaultRule, PatchType, Replicas, Resource, Sandbox, SandboxHandle, SandboxOptions,
    Verb,
};

/// How long the end phase may take to settle (debug build, shared cores: generous).
pub const SETTLE_TIMEOUT: Duration = Duration::from_secs(90);
/// How long the end phase waits for late writes (a delivered-late one: up to 60 s after it
/// arrived) before it clears the faults.
const LATE_WRITES_BEFORE_CLEAR: Duration = Duration::from_secs(65);
/// How often the end phase checks whether everything has settled.
const SETTLE_POLL: Duration = Duration::from_millis(50);
/// How long the end phase must find everything settled, at every check, before it stops the
/// controllers (the first check after this long ends it).
const SETTLE_CONFIRM: Duration = Duration::from_millis(200);
/// How long a clean stop may take (in-flight writes are bounded by the request timeout).
const STOP_TIMEOUT: Duration = Duration::from_secs(30);
/// A replica that exited after losing the Lease is replaced this much later (a pod restart).
const RESPAWN_DELAY: Duration = Duration::from_millis(200);
/// How many times the end phase may start over after the leader lost the Lease between the
/// settled check and its stop (`Driver::settle_and_stop`).
pub const MAX_RESETTLES: u32 = 3;
/// The longest renew deadline of the plans (`LeaseTiming`): a lost Lease is reported with how
/// late the runtime's timers were within this long before.
const LEASE_LOSS_WINDOW: Duration = Duration::from_secs(2);

/// What a seed that passed did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SeedReport {
    /// The seed.
    pub seed: u64,
    /// Nodes created over the run.
    pub nodes_created: usize,
    /// Nodes at the end.
    pub nodes_at_end: usize,
    /// Nodes with podCIDRs at the end.
    pub served: usize,
    /// Nodes that could not be served at the end (foreign podCIDRs; waiting for a block).
    pub unservable: usize,
    /// Node writes the overlap monitor checked.
    pub commits_checked: u64,
    /// podCIDR assignments the allocation monitor checked.
    pub allocations: u64,
    /// Node PATCHes in the request log.
    pub patches: usize,
    /// Late writes the sandbox ran (committed or refused).
    pub late_writes: usize,
    /// Fault rules added.
    pub faults: usize,
    /// Controller processes started.
    pub starts: u32,
    /// Controllers killed (`kill -9`).
    pub kills: u32,
    /// Wall time, ms.
    pub elapsed_ms: u128,
    /// Wall time of the end phase (faults cleared → settled the last time), ms.
    pub settle_ms: u128,
    /// How many times the end phase started over because the leader lost the Lease between the
    /// settled check and its stop (see [`MAX_RESETTLES`]).
    pub resettles: u32,
    /// Where the wall time went, phase by phase (start-up included, unlike `elapsed_ms`).
    pub phases: PhaseTimes,
    /// How late the replicas' runtimes ran a 50 ms timer ([`Watchdog`]), over every replica
    /// of the seed.
    pub timers: Lateness,
    /// The same for the runtime of the driver (the schedule, the end phase's checks), which the
    /// seeds of one test share.
    pub driver_timers: Lateness,
    /// What the driver did and saw (as in a [`SeedFailure`]).
    pub log: Vec<String>,
}

impl fmt::Display for SeedReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "seed {} ok: {} Nodes created, {} at the end ({} served, {} unservable), {} commits \
             checked ({} assignments), {} PATCHes, {} late writes, {} fault rules, {} starts, \
             {} kills, {} ms ({} ms to settle, {} re-settle(s)); phases: {}; timers: replicas' runtimes {}, \
             the driver's {}",
            self.seed,
            self.nodes_created,
            self.nodes_at_end,
            self.served,
            self.unservable,
            self.commits_checked,
            self.allocations,
            self.patches,
            self.late_writes,
            self.faults,
            self.starts,
            self.kills,
            self.elapsed_ms,
            self.settle_ms,
            self.resettles,
            self.phases,
            self.timers,
            self.driver_timers
        )
    }
}

/// A seed that failed: what was violated, the plan (to see the schedule) and the run log.
#[derive(Debug, Clone)]
pub struct SeedFailure {
    /// The seed.
    pub seed: u64,
    /// Every violation, in the order found.
    pub violations: Vec<String>,
    /// The plan, printed.
    pub plan: String,
    /// What the driver did and saw, with times since the start (ms).
    pub log: Vec<String>,
    /// The seed's ClusterCIDR variant ([`Plan::generate_with_cluster_cidrs`]) failed.
    pub cluster_cidrs: bool,
}

impl fmt::Display for SeedFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "chaos seed {} FAILED with {} violation(s); reproduce with\n  {}CHAOS_SEED={} cargo test -p nodeipam-tests --test chaos fixed_seeds -- --nocapture",
            self.seed,
            self.violations.len(),
            if self.cluster_cidrs {
                "CHAOS_CLUSTER_CIDRS=1 "
            } else {
                ""
            },
            self.seed
        )?;
        for v in self.violations.iter().take(50) {
            writeln!(f, "  - {v}")?;
        }
        if self.violations.len() > 50 {
            writeln!(f, "  … and {} more", self.violations.len() - 50)?;
        }
        writeln!(f, "plan:\n{}", self.plan)?;
        writeln!(f, "run log:")?;
        for line in &self.log {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

/// Generates the plan of `seed` and runs it.
///
/// # Errors
/// [`SeedFailure`] with every violation found.
pub async fn run_seed(seed: u64) -> Result<SeedReport, SeedFailure> {
    run_plan(&Plan::generate(seed)).await
}

/// Runs `seed`'s plan, or with `cluster_cidrs` its ClusterCIDR variant
/// ([`Plan::generate_with_cluster_cidrs`]).
pub async fn run_seed_variant(seed: u64, cluster_cidrs: bool) -> Result<SeedReport, SeedFailure> {
    run_plan(&Plan::of_seed(seed, cluster_cidrs)).await
}

/// `CHAOS_NO_WRITE_INTENTS=1`: run the controllers as before issue 30, without write intents
/// (`ControllerConfig::write_intents_off`; without leader election no Lease and the start-up
/// write fence) — to show the suite finds what the intents prevent (RELIABILITY.md).
pub fn write_intents_off() -> bool {
    std::env::var("CHAOS_NO_WRITE_INTENTS").is_ok_and(|v| v.trim() == "1")
}

/// What a test of the driver itself makes happen besides the plan (all off for a seed).
#[derive(Debug, Default)]
struct Hooks {
    /// Once, after the settled check: stop the standbys, fail every Lease request until the
    /// leader has given the Lease up, then clear the faults (the leader losing the Lease between
    /// the settled check and its stop, as in seed 10207).
    lease_fails_after_settled: bool,
}

/// How a clean stop of a replica ended.
enum Stopped {
    /// It ran to the end: its summary.
    Summary(RunSummary),
    /// With leader election, it ended with a lost Lease (noted in the log).
    LostLease,
    /// It failed, panicked or did not stop (a violation, noted).
    Failed,
}

/// A controller process: `run()` on a runtime of its own ([`ProcessRuntime`]; dropping the
/// replica ends every task left on it, as a process's exit would).
struct Replica {
    id: u32,
    health: Health,
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<RunSummary, nodeipam::Error>>,
    /// How late the replica's runtime runs timers (what its Lease timers see).
    watchdog: Watchdog,
    /// Held only to be dropped with the replica.
    _runtime: ProcessRuntime,
}

struct Driver<'p> {
    plan: &'p Plan,
    sb: SandboxHandle,
    ipam: IpamConfig,
    spec: ClusterSpec,
    replicas: Vec<Replica>,
    next_id: u32,
    started: Instant,
    /// How late the driver's runtime runs timers.
    watchdog: Watchdog,
    hooks: Hooks,
    log: Vec<String>,
    violations: Vec<String>,
    respawn_at: Option<Instant>,
    report: SeedReport,
    /// The last oracle count, reused while the store has not changed.
    oracle: Option<OracleCount>,
    /// The ClusterCIDR variant's oracle: at a resourceVersion and for the leader's pool rows
    /// (CIDR, grid), the blocks the Nodes and service CIDRs cover per row.
    pool_oracle: Option<PoolOracle>,
}

/// The ClusterCIDR variant's oracle count: at a resourceVersion, for the leader's pool rows
/// (CIDR, grid), the blocks in use per row.
type PoolOracle = (u64, Vec<(String, u8)>, Vec<u64>);

/// What the oracle counted at one resourceVersion.
struct OracleCount {
    resource_version: u64,
    /// `(used, capacity)` per cluster CIDR ([`pool_usage`]).
    usage: Vec<(u64, u128)>,
    /// Up to 10 Nodes without podCIDRs.
    unserved: Vec<String>,
}

/// The invariant checker's view ([`ClusterSpec`]: cluster CIDRs with their node mask sizes and
/// the service CIDRs, as text re-parsed by `ipnet`) of a validated configuration.
pub fn cluster_spec(ipam: &IpamConfig) -> ClusterSpec {
    let clusters: Vec<(String, u8)> = ipam
        .cluster_cidrs
        .iter()
        .map(|c| (c.cluster_cidr.to_string(), c.node_mask_size))
        .collect();
    let services: Vec<String> = ipam.service_cidrs.iter().map(ToString::to_string).collect();
    let clusters: Vec<(&str, u8)> = clusters.iter().map(|(c, m)| (c.as_str(), *m)).collect();
    let services: Vec<&str> = services.iter().map(String::as_str).collect();
    ClusterSpec::new(&clusters, &services)
}

/// The invariant checker's view ([`ControllerView`]: pool usage per cluster CIDR and the CIDRs
/// held per Node, as text) of a controller's run summary.
pub fn controller_view(summary: &RunSummary) -> ControllerView {
    ControllerView {
        used: summary
            .pools
            .iter()
            .map(|p| (p.cluster_cidr.to_string(), u64::from(p.used_blocks)))
            .collect(),
        held: summary
            .held
            .iter()
            .map(|(n, c)| (n.clone(), c.iter().map(ToString::to_string).collect()))
            .collect(),
    }
}

/// The Node the actor creates for `spec`: a copy of its real template, renamed (see
/// [`Replicas::node`]), with the spec's podCIDRs and finalizer.
///
/// # Panics
/// If `spec.template` is not an index into [`templates`].
pub fn build_node(spec: &NodeSpec) -> Value {
    let template = &templates()[spec.template];
    let (prefix, index) = match spec.name.rsplit_once('-') {
        Some((p, i)) if i.bytes().all(|b| b.is_ascii_digit()) && !i.is_empty() => {
            (p.to_owned(), i.parse::<usize>().unwrap_or(0))
        }
        _ => (spec.name.clone(), 0),
    };
    let mut node = Replicas {
        template: template.node.clone(),
        prefix,
        count: index + 1,
    }
    .node(index);
    node["metadata"]["name"] = json!(spec.name);
    if !spec.pod_cidrs.is_empty() {
        node["spec"]["podCIDR"] = json!(spec.pod_cidrs[0]);
        node["spec"]["podCIDRs"] = json!(spec.pod_cidrs);
    }
    if spec.finalizer {
        node["metadata"]["finalizers"] = json!([FINALIZER]);
    }
    node
}

/// A client as the controller builds it for `--master` (no retries, its User-Agent), with the
/// replica's identity appended to the User-Agent so the request log tells processes apart.
fn replica_client(url: &str, identity: &str) -> kube::Client {
    let mut config = match nodeipam::client::config_for_url(url) {
        Ok(c) => c,
        Err(e) => panic!("client config for the sandbox: {e}"),
    };
    let agent = format!("{} {identity}", nodeipam::client::USER_AGENT_VALUE);
    config.headers.retain(|(name, _)| name != USER_AGENT);
    match HeaderValue::from_str(&agent) {
        Ok(v) => config.headers.push((USER_AGENT, v)),
        Err(e) => panic!("user agent {agent:?}: {e}"),
    }
    match kube::Client::try_from(config) {
        Ok(c) => c,
        Err(e) => panic!("kube client for the sandbox: {e}"),
    }
}

/// `e` with its causes (a lost Lease's last failed renewal request), or, for a renew deadline
/// that passed without any request failing, a note saying so (the leader's tries were not
/// answered in time, or not even made: a late timer).
fn with_causes(e: &nodeipam::Error) -> String {
    use std::error::Error as _;
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(&format!(": {c}"));
        cause = c.source();
    }
    if matches!(
        e,
        nodeipam::Error::LeaderElection(LeaderError::RenewDeadlineExceeded {
            last_error: None,
            ..
        })
    ) {
        text.push_str(" (no renewal request failed: none was answered in time, or made)");
    }
    text
}

/// For a log line about a lost Lease: how late the replica's runtime ran timers in the last
/// [`LEASE_LOSS_WINDOW`], if at all.
fn timers_late(watchdog: &Watchdog) -> String {
    let late = watchdog.worst_within(LEASE_LOSS_WINDOW);
    if late.is_zero() {
        String::new()
    } else {
        format!(
            " (its runtime's timers ran up to {} ms late in the last {} s)",
            late.as_millis(),
            LEASE_LOSS_WINDOW.as_secs()
        )
    }
}

fn is_leadership_error(e: &nodeipam::Error) -> bool {
    matches!(
        e,
        nodeipam::Error::LeadershipLost | nodeipam::Error::LeaderElection(_)
    )
}

/// Runs `plan` (see the module doc).
///
/// # Errors
/// [`SeedFailure`] with every violation found.
pub async fn run_plan(plan: &Plan) -> Result<SeedReport, SeedFailure> {
    run_plan_with(plan, Hooks::default()).await
}

async fn run_plan_with(plan: &Plan, hooks: Hooks) -> Result<SeedReport, SeedFailure> {
    let entered = Instant::now();
    let watchdog = Watchdog::start();
    let network = plan.network();
    let ipam = network.ipam();
    let spec = cluster_spec(&ipam);
    let items: Vec<Value> = plan.initial.iter().map(build_node).collect();
    let options = SandboxOptions {
        history_limit: plan.history_limit,
        watch_list: plan.streaming_list,
        request_log_limit: 1_000_000,
        bookmark_interval: Duration::from_secs(1),
        ..SandboxOptions::default()
    };
    let not_started = |why: String| SeedFailure {
        seed: plan.seed,
        violations: vec![format!("the sandbox did not start: {why}")],
        plan: plan.to_string(),
        log: Vec::new(),
        cluster_cidrs: plan.cluster_cidrs.is_some(),
    };
    // The API server is a process of its own too: its handlers (and the monitors they call
    // under the store lock) run on its own runtime. Dropped after the driver (declared first).
    let sandbox_runtime =
        ProcessRuntime::new("chaos-sandbox").map_err(|e| not_started(e.to_string()))?;
    let nodes = json!({"kind": "NodeList", "apiVersion": "v1", "items": items});
    let sb = match sandbox_runtime
        .handle()
        .spawn(Sandbox::try_start(nodes, options))
        .await
    {
        Ok(Ok(sb)) => sb,
        Ok(Err(e)) => return Err(not_started(e.to_string())),
        Err(e) => return Err(not_started(e.to_string())),
    };
    let overlap = OverlapMonitor::attach(&sb);
    let allocation = if plan.cluster_cidrs.is_some() {
        AllocationMonitor::attach_with_pools(&sb, spec.clone())
    } else {
        AllocationMonitor::attach(&sb, spec.clone())
    };
    let mut driver = Driver {
        plan,
        sb,
        ipam,
        spec,
        replicas: Vec::new(),
        next_id: 1,
        started: Instant::now(),
        watchdog,
        hooks,
        log: Vec::new(),
        violations: Vec::new(),
        respawn_at: None,
        oracle: None,
        pool_oracle: None,
        report: SeedReport {
            seed: plan.seed,
            nodes_created: plan.nodes_created(),
            ..SeedReport::default()
        },
    };
    for pool in plan.cluster_cidrs.iter().flat_map(|p| &p.initial) {
        let r = driver.sb.create_cluster_cidr(pool.object());
        driver.actor(&format!("create {}", pool.name), r);
    }
    driver.start_replicas();
    driver.report.phases.start = entered.elapsed();
    // The schedule's clock: a step is due its gap after the previous step was due, so neither
    // the timer's rounding (a sleep ends on the next millisecond tick or later) nor the actions'
    // own time adds up over hundreds of steps (they did: 0.2–0.5 s per seed past the plan). An
    // action that waits (for a late write to be taken, a stop, a quiescent point) restarts the
    // clock when it ends, so the steps after it keep their gaps, as before.
    let mut due = Instant::now();
    for (index, step) in plan.steps.iter().enumerate() {
        let at = Instant::now();
        due += step.gap;
        driver.pause_until(due).await;
        driver.report.phases.gaps += at.elapsed();
        let (at, waited) = (Instant::now(), driver.action_waits());
        driver.apply(index, &step.action).await;
        let waits = driver.action_waits().saturating_sub(waited);
        driver.report.phases.actions += at.elapsed().saturating_sub(waits);
        if !waits.is_zero() {
            due = Instant::now();
        }
    }
    let summary = driver.settle_and_stop().await;
    let at = Instant::now();
    driver.final_checks(summary.as_ref(), &overlap, &allocation);
    driver.report.phases.checks = at.elapsed();
    let at = Instant::now();
    overlap.detach(&driver.sb);
    allocation.detach(&driver.sb);
    driver.sb.shutdown().await;
    driver.report.phases.shutdown = at.elapsed();
    driver.report.elapsed_ms = driver.started.elapsed().as_millis();
    driver.report.driver_timers = driver.watchdog.lateness();
    let timers = format!(
        "timers: replicas' runtimes {}; the driver's {}",
        driver.report.timers, driver.report.driver_timers
    );
    driver.note(timers);
    if driver.violations.is_empty() {
        driver.report.log = driver.log;
        Ok(driver.report)
    } else {
        Err(SeedFailure {
            seed: plan.seed,
            violations: driver.violations,
            plan: plan.to_string(),
            log: driver.log,
            cluster_cidrs: plan.cluster_cidrs.is_some(),
        })
    }
}

impl Driver<'_> {
    /// The schedule's waits so far that are not the actions' own work (see [`PhaseTimes`]).
    fn action_waits(&self) -> Duration {
        let p = &self.report.phases;
        p.late_write_waits + p.stops + p.idle_waits
    }

    /// Adds how late a removed replica's runtime ran timers to the seed's figures.
    fn count_timers(&mut self, watchdog: &Watchdog) {
        self.report.timers.merge(&watchdog.lateness());
    }

    fn note(&mut self, text: impl Into<String>) {
        let ms = self.started.elapsed().as_secs_f64() * 1000.0;
        self.log.push(format!("[{ms:>8.1} ms] {}", text.into()));
    }

    /// A violation seen while running (also noted in the log, where its time is visible).
    fn violation(&mut self, text: impl Into<String>) {
        let text = text.into();
        self.note(format!("VIOLATION: {text}"));
        self.violations.push(text);
    }

    /// Starts a replica on a runtime of its own; `false` (a violation) if the runtime could not
    /// be built.
    fn spawn_replica(&mut self) -> bool {
        let id = self.next_id;
        self.next_id += 1;
        let identity = format!("chaos-replica-{id}");
        let mut config = ControllerConfig::new(self.ipam.clone());
        config.kube_api_qps = self.plan.kube_api_qps;
        config.kube_api_burst = self.plan.kube_api_burst;
        config.retry_min_delay = self.plan.retry_min_delay;
        config.retry_max_delay = self.plan.retry_max_delay;
        config.request_timeout = self.plan.request_timeout;
        config.workers = self.plan.workers;
        // The end-state checks expect a deleted Node's blocks released once the controller
        // settles; the deletion quarantine is tested on its own (`e2e::freed_block`).
        config.deletion_quarantine = Duration::ZERO;
        config.instance = Some(identity.clone());
        // `--cidr-allocator-type=MultiCIDRRangeAllocator` for the ClusterCIDR variant.
        config.watch_cluster_cidr_objects = self.plan.cluster_cidrs.is_some();
        config.leader_election = self.plan.leader_election(&identity);
        if write_intents_off() {
            // The design before issue 30 (`CHAOS_NO_WRITE_INTENTS`): no intents in the Lease;
            // without leader election no Lease at all, a restart waiting out the start-up write
            // fence (one request timeout: the plan's, as the Lease would make it).
            config.write_intents_off = true;
            if config.leader_election.is_none() {
                config.request_timeout = self.plan.effective_request_timeout();
                config.startup_write_fence = config.request_timeout;
            }
        } else {
            // As `ControllerConfig::from_flags` does without leader election: the write intents
            // live in the Lease, taken at once.
            config.fence_lease = self.plan.fence_lease(&identity);
        }
        let health = config.health.clone();
        let runtime = match ProcessRuntime::new(&identity) {
            Ok(r) => r,
            Err(e) => {
                self.violation(format!("no runtime for {identity}: {e}"));
                return false;
            }
        };
        let (stop, stopped) = oneshot::channel::<()>();
        let url = self.sb.url();
        let agent = identity.clone();
        // The client is built on the replica's runtime (its request buffer's task runs there),
        // as the process would build it at start-up.
        let task = runtime.handle().spawn(async move {
            let client = replica_client(&url, &agent);
            nodeipam::controller::run(config, client, async move {
                let _ = stopped.await;
            })
            .await
        });
        let watchdog = Watchdog::start_on(runtime.handle());
        self.report.starts += 1;
        let seq = self.sb.requests_received();
        self.note(format!("started {identity} (request #{seq} next)"));
        self.replicas.push(Replica {
            id,
            health,
            stop: Some(stop),
            task,
            watchdog,
            _runtime: runtime,
        });
        true
    }

    fn start_replicas(&mut self) {
        while self.replicas.len() < self.plan.replicas {
            if !self.spawn_replica() {
                break;
            }
        }
        self.respawn_at = None;
    }

    /// Reaps replicas that ended on their own; with leader election a replica that lost the
    /// Lease is expected to exit (and is replaced, as its pod would be restarted).
    async fn supervise(&mut self) {
        let mut i = 0;
        while i < self.replicas.len() {
            if !self.replicas[i].task.is_finished() {
                i += 1;
                continue;
            }
            let replica = self.replicas.remove(i);
            let joined = replica.task.await;
            let id = replica.id;
            self.count_timers(&replica.watchdog);
            match joined {
                Ok(Err(e)) if is_leadership_error(&e) => {
                    let late = timers_late(&replica.watchdog);
                    let e = with_causes(&e);
                    self.note(format!("chaos-replica-{id} exited: {e}{late}"));
                }
                Ok(Err(e)) => self.violation(format!("chaos-replica-{id} failed: {e}")),
                Ok(Ok(_)) => {
                    self.violation(format!("chaos-replica-{id} returned without being stopped"));
                }
                Err(e) => self.violation(format!("chaos-replica-{id} panicked: {e}")),
            }
            self.respawn_at
                .get_or_insert_with(|| Instant::now() + RESPAWN_DELAY);
        }
        if self.respawn_at.is_some_and(|at| Instant::now() >= at) {
            self.start_replicas();
        }
    }

    /// Waits until `until` (not at all if it has passed), reaping replicas meanwhile.
    async fn pause_until(&mut self, until: Instant) {
        loop {
            self.supervise().await;
            let now = Instant::now();
            if now >= until {
                return;
            }
            tokio::time::sleep((until - now).min(Duration::from_millis(20))).await;
        }
    }

    fn leader_index(&self) -> Option<usize> {
        self.replicas
            .iter()
            .position(|r| r.health.is_leading() && !r.task.is_finished())
    }

    /// `kill -9`: the task is aborted (every future dropped at once), then reaped.
    async fn kill(&mut self, why: &str) {
        let Some(index) = self
            .leader_index()
            .or((!self.replicas.is_empty()).then_some(0))
        else {
            self.note("kill: no controller is running");
            return;
        };
        let replica = self.replicas.remove(index);
        let leading = replica.health.is_leading();
        replica.task.abort();
        let joined = replica.task.await;
        self.count_timers(&replica.watchdog);
        match joined {
            Err(e) if e.is_cancelled() => {}
            Err(e) => self.violation(format!("chaos-replica-{} panicked: {e}", replica.id)),
            Ok(Ok(_)) => {}
            Ok(Err(e)) if is_leadership_error(&e) => {}
            Ok(Err(e)) => self.violation(format!("chaos-replica-{} failed: {e}", replica.id)),
        }
        self.report.kills += 1;
        let seq = self.sb.requests_received();
        self.note(format!(
            "killed chaos-replica-{} ({}){why} (request #{seq} next)",
            replica.id,
            if leading { "leading" } else { "not leading" }
        ));
    }

    /// Clean shutdown of replica `index`: its summary if it ran to the end.
    async fn stop_replica(&mut self, index: usize) -> Stopped {
        let mut replica = self.replicas.remove(index);
        let id = replica.id;
        if let Some(stop) = replica.stop.take() {
            let _ = stop.send(());
        }
        let joined = tokio::time::timeout(STOP_TIMEOUT, &mut replica.task).await;
        self.count_timers(&replica.watchdog);
        match joined {
            Ok(Ok(Ok(summary))) => {
                let seq = self.sb.requests_received();
                self.note(format!("stopped chaos-replica-{id} (request #{seq} next)"));
                Stopped::Summary(summary)
            }
            Ok(Ok(Err(e))) if is_leadership_error(&e) => {
                let late = timers_late(&replica.watchdog);
                let e = with_causes(&e);
                self.note(format!("stopped chaos-replica-{id}: {e}{late}"));
                Stopped::LostLease
            }
            Ok(Ok(Err(e))) => {
                self.violation(format!("chaos-replica-{id} failed while stopping: {e}"));
                Stopped::Failed
            }
            Ok(Err(e)) => {
                self.violation(format!("chaos-replica-{id} panicked: {e}"));
                Stopped::Failed
            }
            Err(_) => {
                replica.task.abort();
                self.violation(format!(
                    "chaos-replica-{id} did not stop within {STOP_TIMEOUT:?} of the shutdown signal"
                ));
                Stopped::Failed
            }
        }
    }

    fn actor<T>(&mut self, what: &str, result: Result<T, crate::sandbox::ApiError>) {
        if let Err(e) = result {
            self.note(format!("actor: {what}: {} {}", e.code, e.message));
        }
    }

    async fn apply(&mut self, index: usize, action: &Action) {
        match action {
            Action::Create(spec) | Action::CreateForeign(spec, _) => {
                let r = self.sb.create_node(build_node(spec));
                self.actor(&format!("create {}", spec.name), r);
            }
            Action::Delete(name) => {
                let r = self.sb.delete_node(name);
                self.actor(&format!("delete {name}"), r);
            }
            Action::Recreate(spec) => {
                let r = self.sb.delete_node(&spec.name);
                self.actor(&format!("delete {} (re-create)", spec.name), r);
                let r = self.sb.create_node(build_node(spec));
                self.actor(&format!("re-create {}", spec.name), r);
            }
            Action::Label { name, value } => {
                let patch = json!({"metadata": {"labels": {CHURN_LABEL: value.to_string()}}});
                let r = self.sb.patch_node(name, PatchType::Merge, &patch);
                self.actor(&format!("label {name}"), r);
            }
            Action::Heartbeat(name) => {
                let now = jiff::Timestamp::now()
                    .round(jiff::Unit::Second)
                    .unwrap_or_else(|_| jiff::Timestamp::now());
                let Some(node) = self.sb.node(name) else {
                    self.note(format!("actor: heartbeat {name}: gone"));
                    return;
                };
                let mut conditions = node["status"]["conditions"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for c in &mut conditions {
                    c["lastHeartbeatTime"] = json!(now.to_string());
                }
                let patch = json!({"status": {"conditions": conditions}});
                let r = self.sb.patch_node_status(name, PatchType::Merge, &patch);
                self.actor(&format!("heartbeat {name}"), r);
            }
            Action::RemoveFinalizer(name) => {
                let patch = json!({"metadata": {"finalizers": null}});
                let r = self.sb.patch_node(name, PatchType::Merge, &patch);
                self.actor(&format!("remove finalizer of {name}"), r);
            }
            Action::Fault(rule) => {
                self.sb.inject(rule.clone());
                self.report.faults += 1;
            }
            Action::CreateClusterCidr(pool) => {
                let r = self.sb.create_cluster_cidr(pool.object());
                self.actor(&format!("create {}", pool.name), r);
                self.note(format!("created {pool}"));
            }
            Action::DeleteClusterCidr(name) => {
                let r = self.sb.delete_cluster_cidr(name);
                self.actor(&format!("delete ClusterCIDR {name}"), r);
                self.note(format!("deleted ClusterCIDR {name}"));
            }
            Action::DropWatches => self.sb.drop_watches(),
            Action::Compact => self.sb.compact(),
            Action::SetDelay(d) => self.sb.set_delay(*d),
            Action::Kill { late_write } => {
                let why = self.fire_late_write(late_write.as_ref()).await;
                self.kill(&why).await;
            }
            Action::Stop { late_write } => {
                let why = self.fire_late_write(late_write.as_ref()).await;
                let index = self
                    .leader_index()
                    .or((!self.replicas.is_empty()).then_some(0));
                if let Some(index) = index {
                    self.note(format!(
                        "stopping chaos-replica-{}{why}",
                        self.replicas[index].id
                    ));
                    let at = Instant::now();
                    let _ = self.stop_replica(index).await;
                    self.report.phases.stops += at.elapsed();
                }
            }
            Action::Start => self.start_replicas(),
            Action::LoseLease { rules, late_write } => {
                let why = self.fire_late_write(late_write.as_ref()).await;
                for rule in rules {
                    self.sb.inject(rule.clone());
                    self.report.faults += 1;
                }
                self.note(format!(
                    "Lease requests fail: the leader is to lose the Lease{why}"
                ));
            }
            Action::AwaitFault(rule) => {
                let at = Instant::now();
                let fired = self.wait_until_fired(rule).await;
                self.report.phases.late_write_waits += at.elapsed();
                let ms = at.elapsed().as_millis();
                self.note(if fired {
                    format!("a delivered-late write is on the wire (taken after {ms} ms)")
                } else {
                    "no PATCH took the delivered-late write within 2 s".to_owned()
                });
            }
            Action::QuiesceAndAddForeign { count, first } => {
                self.quiesce_and_add_foreign(index, *count, *first).await;
            }
        }
    }

    /// Adds the late-write `rule` (if any) and waits (at most 2 s) until a PATCH got it; says
    /// which, for the log.
    async fn fire_late_write(&mut self, rule: Option<&FaultRule>) -> String {
        let Some(rule) = rule else {
            return String::new();
        };
        self.sb.inject(rule.clone());
        self.report.faults += 1;
        let (at, patches) = (Instant::now(), self.sb.summary().patches);
        let fired = self.wait_until_fired(rule).await;
        let waited = at.elapsed();
        self.report.phases.late_write_waits += waited;
        let ms = waited.as_millis();
        if fired {
            format!(" with a late write in flight (taken after {ms} ms)")
        } else {
            format!(
                " (no PATCH took the late write within 2 s: {} PATCH(es) meanwhile, {})",
                self.sb.summary().patches - patches,
                if self.leader_index().is_some() {
                    "a replica leading"
                } else {
                    "no replica leading"
                }
            )
        }
    }

    /// Waits (at most 2 s) until `rule` has fired at least once.
    async fn wait_until_fired(&mut self, rule: &FaultRule) -> bool {
        let until = Instant::now() + Duration::from_secs(2);
        while Instant::now() < until {
            if !self.sb.pending_faults().iter().any(|r| r == rule) {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        false
    }

    /// Waits (bounded) until the sandbox has no request or late write in flight.
    async fn wait_idle(&mut self, within: Duration) -> bool {
        let until = Instant::now() + within;
        loop {
            if self.sb.in_flight().is_idle() {
                return true;
            }
            if Instant::now() >= until {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// See [`Action::QuiesceAndAddForeign`].
    async fn quiesce_and_add_foreign(&mut self, step: usize, count: usize, first: usize) {
        let at = Instant::now();
        while !self.replicas.is_empty() {
            let _ = self.stop_replica(0).await;
        }
        self.report.phases.stops += at.elapsed();
        self.respawn_at = None;
        let at = Instant::now();
        let idle = self.wait_idle(Duration::from_secs(10)).await;
        self.report.phases.idle_waits += at.elapsed();
        if !idle {
            self.note(format!(
                "quiescent point: the sandbox is not idle ({:?}); no foreign Nodes added",
                self.sb.in_flight()
            ));
            self.start_replicas();
            return;
        }
        let mut rng = ChaCha8Rng::seed_from_u64(
            self.plan.seed ^ (u64::try_from(step).unwrap_or(0) << 32) ^ 0x5eed,
        );
        let mut taken: Vec<IpNet> = self
            .sb
            .nodes()
            .iter()
            .flat_map(pod_cidrs_of)
            .filter_map(|c| c.parse::<IpNet>().ok())
            .chain(self.spec.service_cidrs.iter().copied())
            .collect();
        let clusters = self.spec.cluster_cidrs.clone();
        for k in 0..count {
            let mut cidrs = Vec::new();
            for (cluster, mask) in &clusters {
                // A block, two blocks, or half a block.
                let prefix = match rng.random_range(0..10u32) {
                    0..=6 => *mask,
                    7..=8 => mask.saturating_sub(1).max(cluster.prefix_len()),
                    _ => *mask + 1,
                };
                let found = (0..200).find_map(|_| {
                    let index = rng.random_range(0..block_count(cluster, prefix));
                    let candidate = block(cluster, prefix, index)?;
                    let free = taken
                        .iter()
                        .all(|t| !(t.contains(&candidate) || candidate.contains(t)));
                    free.then_some(candidate)
                });
                if let Some(net) = found {
                    taken.push(net);
                    cidrs.push(net.to_string());
                }
            }
            if cidrs.len() != clusters.len() {
                self.note("quiescent point: no free space for a foreign Node");
                continue;
            }
            if cidrs.len() == 2 && rng.random_bool(0.3) {
                cidrs.reverse();
            }
            let spec = NodeSpec {
                name: format!("foreign-in-{}", first + k),
                template: rng.random_range(0..templates().len()),
                pod_cidrs: cidrs,
                finalizer: false,
            };
            self.note(format!(
                "quiescent point: foreign Node {} with podCIDRs {:?}",
                spec.name, spec.pod_cidrs
            ));
            let r = self.sb.create_node(build_node(&spec));
            self.actor(&format!("create {}", spec.name), r);
        }
        self.start_replicas();
    }

    /// The end phase: faults cleared, terminating Nodes let go, controllers running; waits until
    /// every late write has run, every servable Node is served (or the pool is full) and the
    /// leader's pool usage equals the blocks the Nodes hold, at every check (every 50 ms) for
    /// 200 ms; then stops the standbys and the leader. Returns the leader's summary.
    ///
    /// A leader may lose the Lease between the settled check and its own stop (its renewals did
    /// not succeed for the renew deadline — on a loaded machine, a late timer is enough; seed
    /// 10207, RELIABILITY.md). That is the loss invariant 4 expects at any time, not a fault, but
    /// it leaves no leader's summary for the end-state comparison: then new replicas are started
    /// and the end phase runs again (at most [`MAX_RESETTLES`] times; each is logged and counted
    /// in [`SeedReport::resettles`]). A seed that still ends without a leader's summary fails.
    async fn settle_and_stop(&mut self) -> Option<RunSummary> {
        // Writes delivered late (issue 30) land up to 60 s after they arrived: they run before
        // the faults are cleared, so a Node whose other PATCHes are refused until its late write
        // lands (an edge event) is still unserved when it lands.
        let at = Instant::now();
        let mut waited = false;
        while self.sb.in_flight().late_writes > 0 && at.elapsed() < LATE_WRITES_BEFORE_CLEAR {
            waited = true;
            self.supervise().await;
            tokio::time::sleep(SETTLE_POLL).await;
        }
        if waited {
            self.report
                .phases
                .add_settle(SettleWait::LateWrites, at.elapsed());
            let pending = self.sb.in_flight().late_writes;
            self.note(format!(
                "end phase: waited {} ms for late writes before clearing the faults ({pending} still pending)",
                at.elapsed().as_millis()
            ));
        }
        self.sb.clear_faults();
        self.sb.set_delay(Duration::ZERO);
        let terminating: Vec<String> = self
            .sb
            .nodes()
            .iter()
            .filter(|n| n["metadata"]["deletionTimestamp"].is_string())
            .map(name_of)
            .collect();
        for name in terminating {
            let patch = json!({"metadata": {"finalizers": null}});
            let r = self.sb.patch_node(&name, PatchType::Merge, &patch);
            self.actor(&format!("remove finalizer of {name}"), r);
        }
        self.note("end phase: faults cleared");
        let settle_started = Instant::now();
        loop {
            self.settle().await;
            if std::mem::take(&mut self.hooks.lease_fails_after_settled) {
                self.fail_lease_until_lost().await;
            }
            self.report.settle_ms = settle_started.elapsed().as_millis();
            let stopping = Instant::now();
            let (summary, lease_lost) = self.stop_all().await;
            self.report.phases.final_stop += stopping.elapsed();
            if summary.is_some()
                || !lease_lost
                || !self.violations.is_empty()
                || self.report.resettles >= MAX_RESETTLES
            {
                if summary.is_none() && self.violations.is_empty() {
                    self.violation("no leader's summary at the end");
                }
                return summary;
            }
            self.report.resettles += 1;
            self.note(
                "the leader lost the Lease after the settled check (expected at any time, \
                 invariant 4): starting new replicas and settling again",
            );
            self.start_replicas();
        }
    }

    /// [`Hooks::lease_fails_after_settled`]: the standbys stopped, every Lease request answered
    /// 500 until the leader's task has ended (bounded by [`STOP_TIMEOUT`]), the faults cleared.
    async fn fail_lease_until_lost(&mut self) {
        while let Some(index) = self.replicas.iter().position(|r| !r.health.is_leading()) {
            let _ = self.stop_replica(index).await;
        }
        for verb in [Verb::Get, Verb::Update, Verb::Create] {
            let rule = FaultRule::new(verb, Resource::Leases, 1_000_000, FaultAction::Status(500));
            self.sb.inject(rule);
        }
        self.note("hook: every Lease request fails from now on");
        let until = Instant::now() + STOP_TIMEOUT;
        while Instant::now() < until && self.replicas.iter().any(|r| !r.task.is_finished()) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.sb.clear_faults();
        self.note("hook: Lease faults cleared");
    }

    /// Waits until everything has settled (see [`Driver::settle_and_stop`]), or notes a
    /// violation after [`SETTLE_TIMEOUT`].
    async fn settle(&mut self) {
        let settle_started = Instant::now();
        if self.replicas.len() < self.plan.replicas && self.respawn_at.is_none() {
            self.start_replicas();
        }
        let until = Instant::now() + SETTLE_TIMEOUT;
        // Settled at every check since this instant (checks every SETTLE_POLL: a change is seen
        // within 50 ms instead of 200 ms, and the state must hold at every check of the
        // SETTLE_CONFIRM window, not only at its two ends).
        let mut settled_since: Option<Instant> = None;
        // What the last check waited for, and when it was made: the time until the next check
        // is counted against it (the time before the first check against what that one finds).
        let mut previous: Option<SettleWait> = None;
        let mut last = settle_started;
        loop {
            self.supervise().await;
            if self.replicas.len() < self.plan.replicas && self.respawn_at.is_none() {
                self.start_replicas();
            }
            let found = self.unsettled();
            let now = Instant::now();
            let current = found
                .as_ref()
                .map_or(SettleWait::Confirm, |(wait, _)| *wait);
            self.report
                .phases
                .add_settle(previous.unwrap_or(current), now - last);
            (previous, last) = (Some(current), now);
            match found {
                None if settled_since.is_some_and(|t| now - t >= SETTLE_CONFIRM) => break,
                None => {
                    settled_since.get_or_insert(now);
                }
                Some((_, why)) => {
                    settled_since = None;
                    if now >= until {
                        self.violation(format!(
                            "not settled {SETTLE_TIMEOUT:?} after the faults ended: {why}"
                        ));
                        break;
                    }
                }
            }
            tokio::time::sleep(SETTLE_POLL).await;
        }
        self.note("settled");
    }

    /// Stops every replica, standbys first, so the leader's summary is the last word. Returns
    /// that summary, and whether a replica ended with a lost Lease (the leader at the settled
    /// check may have lost it, and stepped down, before this looked at who leads).
    async fn stop_all(&mut self) -> (Option<RunSummary>, bool) {
        let mut summary = None;
        let mut lost = false;
        while let Some(index) = self
            .replicas
            .iter()
            .position(|r| !r.health.is_leading())
            .or((!self.replicas.is_empty()).then_some(0))
        {
            let leading = self.replicas[index].health.is_leading();
            let stopped = self.stop_replica(index).await;
            lost |= matches!(stopped, Stopped::LostLease);
            if leading {
                summary = match stopped {
                    Stopped::Summary(s) => Some(s),
                    Stopped::LostLease | Stopped::Failed => None,
                };
            }
        }
        (summary, lost)
    }

    /// `None` when settled, else what it waits for and why. Cheap checks first; the oracle (every Node read and
    /// counted) only when they pass, and only again after a write (reading hundreds of Nodes holds
    /// the store's lock, and a debug build on shared cores has little time to spare).
    fn unsettled(&mut self) -> Option<(SettleWait, String)> {
        let in_flight = self.sb.in_flight();
        if in_flight.late_writes > 0 {
            return Some((
                SettleWait::LateWrites,
                format!("{} late write(s) pending", in_flight.late_writes),
            ));
        }
        let Some(leader) = self.leader_index() else {
            return Some((SettleWait::NoLeader, "no replica is leading".to_owned()));
        };
        if !self.replicas[leader].health.is_ready() {
            return Some((
                SettleWait::LeaderNotReady,
                "the leader is not ready".to_owned(),
            ));
        }
        let summary = self.sb.summary();
        let unserved = summary.nodes.saturating_sub(summary.nodes_with_pod_cidrs);
        if self.plan.cluster_cidrs.is_some() {
            return self.unsettled_with_pools(leader, unserved, summary.resource_version);
        }
        // Only a cluster CIDR with fewer blocks than Nodes (and reserved blocks) can fill up.
        let might_be_full = self.spec.cluster_cidrs.iter().any(|(cluster, mask)| {
            block_count(cluster, *mask) < self.plan.nodes_created() as u128 + 64
        });
        if unserved > 0 && !might_be_full {
            return Some((SettleWait::Unserved, format!("{unserved} Node(s) unserved")));
        }
        let usage = match &self.oracle {
            Some(o) if o.resource_version == summary.resource_version => o.usage.clone(),
            _ => {
                let nodes = self.sb.nodes();
                let usage = pool_usage(&nodes, &self.spec);
                let names: Vec<String> = nodes
                    .iter()
                    .filter(|n| pod_cidrs_of(n).is_empty())
                    .map(name_of)
                    .take(10)
                    .collect();
                self.oracle = Some(OracleCount {
                    resource_version: summary.resource_version,
                    usage: usage.clone(),
                    unserved: names,
                });
                usage
            }
        };
        let full = usage
            .iter()
            .any(|(used, capacity)| u128::from(*used) >= *capacity);
        if unserved > 0 && !full {
            let names = self
                .oracle
                .as_ref()
                .map(|o| o.unserved.clone())
                .unwrap_or_default();
            return Some((
                SettleWait::Unserved,
                format!("{unserved} Node(s) unserved with free blocks, e.g. {names:?}"),
            ));
        }
        let controller: Vec<u64> = self.replicas[leader]
            .health
            .pools()
            .iter()
            .map(|p| u64::from(p.used_blocks))
            .collect();
        let oracle: Vec<u64> = usage.iter().map(|(used, _)| *used).collect();
        if controller != oracle {
            return Some((
                SettleWait::Usage,
                format!(
                    "the leader counts {controller:?} blocks in use, the Nodes hold {oracle:?}"
                ),
            ));
        }
        None
    }

    /// [`Driver::unsettled`] for the ClusterCIDR variant: the fallback pool has room for every
    /// Node, so any unserved one is waited for; the leader's usage is compared per backing
    /// address space (its pool rows, on its own grid); deletions its finalizer no longer needs to
    /// hold must have gone through.
    fn unsettled_with_pools(
        &mut self,
        leader: usize,
        unserved: usize,
        resource_version: u64,
    ) -> Option<(SettleWait, String)> {
        if unserved > 0 {
            return Some((
                SettleWait::Unserved,
                format!("{unserved} Node(s) unserved (the fallback ClusterCIDR has room)"),
            ));
        }
        let rows = self.replicas[leader].health.pools();
        let row_keys: Vec<(String, u8)> = rows
            .iter()
            .map(|p| (p.cluster_cidr.to_string(), p.node_mask_size))
            .collect();
        let controller: Vec<u64> = rows.iter().map(|p| u64::from(p.used_blocks)).collect();
        let oracle = match &self.pool_oracle {
            Some((rv, keys, used)) if *rv == resource_version && *keys == row_keys => used.clone(),
            _ => {
                let spec = spec_of_rows(&row_keys, &self.spec);
                let used: Vec<u64> = pool_usage(&self.sb.nodes(), &spec)
                    .iter()
                    .map(|(used, _)| *used)
                    .collect();
                self.pool_oracle = Some((resource_version, row_keys.clone(), used.clone()));
                used
            }
        };
        if controller != oracle {
            return Some((
                SettleWait::Usage,
                format!(
                    "the leader counts {controller:?} blocks in use in {row_keys:?}, the Nodes hold {oracle:?}"
                ),
            ));
        }
        let problems = finalizer_problems(&self.sb.cluster_cidrs(), &self.sb.nodes());
        problems
            .into_iter()
            .next()
            .map(|p| (SettleWait::Finalizers, p))
    }

    /// For the Nodes the violations name (at most 8): every podCIDR assignment committed and every
    /// PATCH logged, into the run log.
    fn dump_history(
        &mut self,
        records: &[crate::sandbox::RequestRecord],
        assignments: &[super::Assignment],
    ) {
        let mut names: Vec<String> = Vec::new();
        for v in &self.violations {
            for part in v.split("Node ").skip(1) {
                let name: String = part
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '.')
                    .collect();
                let name = name.trim_end_matches('.').to_owned();
                if !name.is_empty() && !names.contains(&name) && names.len() < 8 {
                    names.push(name);
                }
            }
        }
        for name in names {
            self.log.push(format!("history of Node {name}:"));
            for a in assignments.iter().filter(|a| a.name == name) {
                self.log.push(format!(
                    "    committed rv {} uid {} podCIDRs {:?}",
                    a.resource_version, a.uid, a.pod_cidrs
                ));
            }
            for (seq, r) in records.iter().enumerate() {
                if r.verb != Some(crate::sandbox::Verb::Patch)
                    || r.resource != Some(crate::sandbox::Resource::Nodes)
                    || r.name.as_deref() != Some(name.as_str())
                {
                    continue;
                }
                let body = r.body.clone().unwrap_or(Value::Null);
                let at_ms = r
                    .received
                    .saturating_duration_since(self.started.into_std())
                    .as_secs_f64()
                    * 1000.0;
                self.log.push(format!(
                    "    request #{seq} at {at_ms:.1} ms from {} uid {} podCIDRs {} query {:?}: status {:?}, late write {:?}",
                    r.user_agent.rsplit(' ').next().unwrap_or_default(),
                    body.pointer("/metadata/uid").and_then(Value::as_str).unwrap_or("-"),
                    body.pointer("/spec/podCIDRs").cloned().unwrap_or(Value::Null),
                    r.query,
                    r.status,
                    r.late_write
                ));
            }
        }
    }

    fn final_checks(
        &mut self,
        summary: Option<&RunSummary>,
        overlap: &OverlapMonitor,
        allocation: &AllocationMonitor,
    ) {
        for v in overlap.violations() {
            self.violations
                .push(format!("overlap at a committed write: {v}"));
        }
        for v in allocation.violations() {
            self.violations.push(format!("at a committed write: {v}"));
        }
        let nodes = self.sb.nodes();
        let variant = self.plan.cluster_cidrs.is_some();
        // The variant's oracle counts on the leader's backing address spaces (its grid).
        let spec = match summary {
            Some(s) if variant => {
                let rows: Vec<(String, u8)> = s
                    .pools
                    .iter()
                    .map(|p| (p.cluster_cidr.to_string(), p.node_mask_size))
                    .collect();
                spec_of_rows(&rows, &self.spec)
            }
            _ => self.spec.clone(),
        };
        if variant {
            for problem in finalizer_problems(&self.sb.cluster_cidrs(), &nodes) {
                self.violations.push(format!("end state: {problem}"));
            }
        }
        let usage = pool_usage(&nodes, &spec);
        let full = !variant
            && usage
                .iter()
                .any(|(used, capacity)| u128::from(*used) >= *capacity);
        let mut unservable: BTreeSet<String> = nodes
            .iter()
            .map(name_of)
            .filter(|n| n.starts_with("foreign-") && !n.starts_with("foreign-in-"))
            .collect();
        if full {
            unservable.extend(
                nodes
                    .iter()
                    .filter(|n| pod_cidrs_of(n).is_empty())
                    .map(name_of),
            );
        }
        let unservable_ref: Vec<&str> = unservable.iter().map(String::as_str).collect();
        let view = summary.map(controller_view);
        match check(&nodes, &spec, &unservable_ref, view.as_ref()) {
            Ok(report) => {
                self.report.served = report.served;
                self.report.unservable = report.unservable;
            }
            Err(violations) => {
                for v in violations {
                    self.violations.push(format!("end state: {v}"));
                }
            }
        }
        let records = self.sb.requests();
        let (violations, patches) = check_patches(
            &records,
            self.plan.effective_request_timeout(),
            nodeipam::controller::CONTROLLER_NAME,
        );
        for v in violations {
            self.violations.push(format!("request log: {v}"));
        }
        self.report.patches = patches;
        if !self.violations.is_empty() {
            self.dump_history(&records, &allocation.assignments());
        }
        self.report.late_writes = records.iter().filter(|r| r.late_write.is_some()).count();
        self.report.nodes_at_end = nodes.len();
        self.report.commits_checked = overlap.commits();
        self.report.allocations = allocation.allocations();
    }
}

#[cfg(test)]
mod tests;
