//! The controller: an informer (streaming or paged list, then watch) into a compact Node cache
//! and a work queue; start-up occupy of every existing podCIDR; then a dispatcher that decides
//! for each Node in queue order and runs the writes on up to `workers` concurrent tasks, through
//! a token bucket; leader election; health; graceful shutdown. Every long-lived task is
//! supervised: if one stops or panics, `/healthz` fails and [`run`] returns an error.
//!
//! Tests drive it in-process:
//!
//! ```no_run
//! # async fn demo() -> Result<(), nodeipam::Error> {
//! use nodeipam::controller::{ControllerConfig, client_for_url, run};
//! let ipam = nodeipam_core::config::validate("10.244.0.0/16", "", Default::default())
//!     .map_err(nodeipam::Error::Config)?;
//! let config = ControllerConfig::new(ipam);
//! let health = config.health.clone(); // readiness + pool usage, shared
//! let client = client_for_url("http://127.0.0.1:6443")?;
//! let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//! let task = tokio::spawn(run(config, client, async move { let _ = stopped.await; }));
//! // … wait for health.is_ready(), create/delete Nodes, check invariants …
//! let _ = stop.send(());
//! let summary = task.await.expect("joined")?;
//! # let _ = (health, summary);
//! # Ok(()) }
//! ```

mod backoff;
pub mod cluster_cidrs;
mod events;
mod gate;
pub mod in_doubt;
pub mod informer;
mod inherited;
mod limiter;
pub mod node;
pub mod oplog;
pub mod patch;
mod pipeline;
mod queue;
mod quiescence;
mod tasks;
mod waiters;
pub mod window;
pub mod worker;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use kube::Client;
use nodeipam_core::{Cidr, IpamConfig};
use tokio::sync::watch;

pub use crate::client::{client_for_url, client_from_flags};
pub use crate::health::{
    Health, metrics_router, router as health_router, serve as serve_health, serve_router,
};
pub use crate::leader::{LeaderElector, LeaderError, Leadership, LeaseConfig, WriteIntents};
pub use gate::WriteGate;
pub use in_doubt::InDoubtWrites;
pub use informer::InitialList;
pub use limiter::WriteLimiter;
pub use queue::WorkQueue;
#[doc(hidden)]
pub use quiescence::Quiescence;
pub use tasks::install_panic_hook;
pub(crate) use tasks::{OwnedTask, panic_text, panic_watch, stopped};

use crate::Error;
use crate::flags::ControllerFlags;
use crate::node_pools::Sizing;
use crate::reconcile::{Allocator, PoolStats};

/// Name of the controller (events' `reportingController`, field manager).
pub const CONTROLLER_NAME: &str = "nodeipam-controller";

/// Upstream's `cidrUpdateWorkers`: concurrent PATCHes of `spec.podCIDR(s)`.
pub const DEFAULT_WORKERS: usize = 30;

/// Everything [`run`] needs besides the client and the shutdown signal.
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// Validated cluster/service CIDRs and mask sizes.
    pub ipam: IpamConfig,
    /// Per-Node mask sizes and each cluster CIDR's grid (`CloudAllocator` rules and mask labels,
    /// from [`crate::node_pools::NodePools::sizing`] against `ipam`); the range allocator's
    /// ([`Sizing::range_allocator`]) in [`ControllerConfig::new`].
    pub sizing: Sizing,
    /// Writes per second (token bucket refill).
    pub kube_api_qps: f64,
    /// Token bucket size.
    pub kube_api_burst: u32,
    /// `Some` to allocate only while holding the Lease.
    pub leader_election: Option<LeaseConfig>,
    /// Readiness and pool usage, shared with the probe server (and tests).
    pub health: Health,
    /// Test-only: whether the running term has nothing in hand ([`Quiescence`]; not part of the
    /// controller's contract).
    #[doc(hidden)]
    pub quiescence: Quiescence,
    /// Events' `reportingInstance` (e.g. the pod name).
    pub instance: Option<String>,
    /// How long one request may take, client and server side (default 10 s).
    pub request_timeout: Duration,
    /// First retry delay after a failure (default 250 ms).
    pub retry_min_delay: Duration,
    /// Retry delay cap (default 30 s). A Node waiting for a free block is woken by the release
    /// instead; its safety re-check comes after 10 × this (`worker::WAITING_RECHECK_FACTOR`).
    pub retry_max_delay: Duration,
    /// Concurrent writes (default [`DEFAULT_WORKERS`]).
    pub workers: usize,
    /// How the informer gets its initial state (default: streaming list, falling back to a paged
    /// LIST).
    pub initial_list: InitialList,
    /// Without leader election: nothing is listed, allocated or written until this long after
    /// start-up, so a write the previous process left in flight has passed its server-side
    /// deadline first (default 0 in [`ControllerConfig::new`]; the request timeout when built
    /// from flags).
    pub startup_write_fence: Duration,
    /// Without leader election (`leader_election` `None`): the Lease that keeps the write intents
    /// (`leader::intents`), taken at once at start-up ([`LeaderElector::taking_over_at_once`]) —
    /// the same fence as with leader election, without waiting for an earlier process's lease.
    /// `None` (the default of [`ControllerConfig::new`]): no intents are kept, and safety after a
    /// restart rests on `startup_write_fence` (a timing assumption). Built from flags it is the
    /// `--leader-elect-resource-*` Lease.
    pub fence_lease: Option<LeaseConfig>,
    /// `--cidr-allocator-type=MultiCIDRRangeAllocator`: list and watch the `nodeipam.io`
    /// ClusterCIDR objects and serve their pools beside the flag CIDRs ([`cluster_cidrs`]), and
    /// keep every Node label (their node selectors may read any). Default `false`: nothing
    /// about ClusterCIDRs is read or written.
    pub watch_cluster_cidr_objects: bool,
    /// `--deleted-node-cidr-quarantine`: how long the blocks of a deleted Node stay reserved for
    /// its name before a waiting Node may take them (default
    /// [`DEFAULT_DELETION_QUARANTINE`]; zero releases them at once). For liveness only: see
    /// [`Allocator::set_deletion_quarantine`].
    pub deletion_quarantine: Duration,
    /// Test-only (issue 30, the chaos suite's check that it catches the design before the write
    /// intents): `true` keeps no write intents in the Lease — no intent is recorded before a
    /// PATCH, none is inherited — so safety rests on the deadlines again. Never set by the binary.
    #[doc(hidden)]
    pub write_intents_off: bool,
}

/// The default `--deleted-node-cidr-quarantine`, 10 s: `kubectl replace --force` creates the Node
/// again one request after its deletion completes (milliseconds), and a restore or a scripted
/// delete-and-create within a few seconds; 10 s covers those and the watch's delivery of the
/// re-created Node under load, while a freed block still reaches a waiting Node within about
/// 11 s (a new Node's kubelet takes longer than that to come up).
pub const DEFAULT_DELETION_QUARANTINE: Duration = Duration::from_secs(10);

impl ControllerConfig {
    /// Defaults: 20 qps, burst 30, no leader election, 10 s request timeout, retries 250 ms→30 s,
    /// 30 workers, streaming list, no start-up write fence, no ClusterCIDRs, a deleted Node's
    /// blocks quarantined for [`DEFAULT_DELETION_QUARANTINE`].
    pub fn new(ipam: IpamConfig) -> ControllerConfig {
        ControllerConfig {
            sizing: Sizing::range_allocator(&ipam),
            ipam,
            kube_api_qps: 20.0,
            kube_api_burst: 30,
            leader_election: None,
            health: Health::new(),
            quiescence: Quiescence::default(),
            instance: None,
            request_timeout: Duration::from_secs(10),
            retry_min_delay: Duration::from_millis(250),
            retry_max_delay: Duration::from_secs(30),
            workers: DEFAULT_WORKERS,
            deletion_quarantine: DEFAULT_DELETION_QUARANTINE,
            initial_list: InitialList::Streaming,
            startup_write_fence: Duration::ZERO,
            fence_lease: None,
            watch_cluster_cidr_objects: false,
            write_intents_off: false,
        }
    }

    /// From the validated IPAM config and the controller flags.
    pub fn from_flags(ipam: IpamConfig, flags: &ControllerFlags) -> ControllerConfig {
        let identity = instance_identity();
        let mut config = ControllerConfig::new(ipam);
        config.kube_api_qps = flags.kube_api_qps;
        config.kube_api_burst = flags.kube_api_burst;
        config.instance = Some(identity.clone());
        config.workers = flags.node_cidr_update_workers;
        config.deletion_quarantine = flags.deleted_node_cidr_quarantine;
        let lease = LeaseConfig {
            namespace: flags.leader_elect_resource_namespace.clone(),
            name: flags.leader_elect_resource_name.clone(),
            identity,
            lease_duration: flags.leader_elect_lease_duration,
            renew_deadline: flags.leader_elect_renew_deadline,
            retry_period: flags.leader_elect_retry_period,
        };
        if flags.leader_elect {
            config.leader_election = Some(lease);
        } else {
            config.fence_lease = Some(lease);
        }
        config
    }
}

/// `$POD_NAME`, else `$HOSTNAME`, else `nodeipam`, plus `_` and the process id.
fn instance_identity() -> String {
    let host = std::env::var("POD_NAME")
        .or_else(|_| std::env::var("HOSTNAME"))
        .unwrap_or_else(|_| "nodeipam".to_owned());
    format!("{host}_{}", std::process::id())
}

/// What a clean [`run`] leaves behind: the pool and who holds what.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RunSummary {
    /// Per cluster CIDR, flag order.
    pub pools: Vec<PoolStats>,
    /// Node name → CIDRs reserved for it (held, pending, or a skipped Node's reserved part).
    pub held: BTreeMap<String, Vec<Cidr>>,
}

/// Runs the controller until `shutdown` resolves: (with leader election, wait for the Lease) →
/// list all Nodes → occupy every existing podCIDR → allocate for Nodes without podCIDRs, watching
/// for changes. On shutdown: stop taking work, finish the in-flight writes, keep the Lease until
/// no write answered without a definite outcome can still be applied (at most the request
/// timeout), release the Lease, return the final state.
///
/// # Errors
/// [`Error::Pool`] if a service CIDR fills a cluster CIDR; [`Error::LeaderElection`] if the Lease
/// cannot be managed; [`Error::LeadershipLost`] if this instance was leading and lost the Lease
/// (the caller should exit non-zero, as kube-controller-manager does); [`Error::TaskFailed`] if a
/// long-lived task stopped or panicked.
pub async fn run(
    config: ControllerConfig,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunSummary, Error> {
    // Fail fast on a configuration error, before taking a Lease.
    let allocator = build_allocator(&config)?;
    run_with_allocator(config, allocator, client, shutdown).await
}

/// [`run`] with the allocator already built from `config` ([`build_allocator`]; the binary builds
/// it while validating the flags, so a bad configuration exits 2 before anything starts, and it
/// is built once).
///
/// # Errors
/// As [`run`], but for the configuration errors that building the allocator reports.
pub async fn run_with_allocator(
    config: ControllerConfig,
    allocator: Allocator,
    client: Client,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<RunSummary, Error> {
    let mut allocator = allocator;
    allocator.set_deletion_quarantine(!config.deletion_quarantine.is_zero());
    let (stop_tx, stop_rx) = watch::channel(false);
    let _shutdown_waiter = {
        let stop_tx = stop_tx.clone();
        OwnedTask::spawn(async move {
            shutdown.await;
            let _ = stop_tx.send(true);
        })
    };
    let elected = match (config.leader_election.clone(), config.fence_lease.clone()) {
        (Some(lease), _) => Some((lease, Takeover::AfterExpiry)),
        (None, Some(lease)) => Some((lease, Takeover::AtOnce)),
        (None, None) => None,
    };
    match elected {
        None => run_unelected(config, allocator, client, stop_rx).await,
        Some(lease) => run_elected(config, lease, allocator, client, (stop_tx, stop_rx)).await,
    }
}

/// How a replica takes the Lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Takeover {
    /// Leader election: once the holder's lease has expired (client-go's rule).
    AfterExpiry,
    /// Without leader election, the Lease only keeps the write intents: at the first try.
    AtOnce,
}

/// Without leader election and without a fence Lease: one allocating term, its writes held back
/// by the start-up write fence. A write in doubt at the end is the next process's start-up write fence's to wait out.
async fn run_unelected(
    config: ControllerConfig,
    allocator: Allocator,
    client: Client,
    stop: watch::Receiver<bool>,
) -> Result<RunSummary, Error> {
    let health = config.health.clone();
    health.set_leading(true);
    let gate = WriteGate {
        not_before: tokio::time::Instant::now() + config.startup_write_fence,
        lease: None,
        write_duration: config.request_timeout,
        intents: None,
    };
    let in_doubt = Arc::new(InDoubtWrites::new());
    let summary = pipeline::run(config, allocator, client, stop, gate, in_doubt).await;
    health.set_ready(false);
    summary
}

/// With leader election, in phases: start the elector; stand by until leading (or stopped, or
/// the elector ends); lead one allocating term; step down (writes in doubt waited out, the Lease
/// released or lost).
async fn run_elected(
    mut config: ControllerConfig,
    (lease, takeover): (LeaseConfig, Takeover),
    allocator: Allocator,
    client: Client,
    (stop_tx, stop): (watch::Sender<bool>, watch::Receiver<bool>),
) -> Result<RunSummary, Error> {
    config.request_timeout = write_timeout(config.request_timeout, &lease);
    let health = config.health.clone();
    let intents_off = config.write_intents_off;
    let election = Election::start(&client, lease, (takeover, intents_off), &health)?;
    // A standby whose elector runs could take over: it counts as ready.
    health.set_ready(true);
    let election = match election.stand_by(stop.clone(), &health).await {
        Standby::Leading(election) => election,
        Standby::Ended(ended) => return ended,
    };
    tracing::info!(lease = %election.lease.name, identity = %election.lease.identity, "leading; allocating");
    health.set_ready(false);
    health.set_leading(true);
    let in_doubt = Arc::new(InDoubtWrites::new());
    let summary = election
        .lead(
            config,
            allocator,
            client,
            (&stop_tx, stop),
            in_doubt.clone(),
        )
        .await;
    health.set_leading(false);
    health.set_ready(false);
    election.step_down(&in_doubt, &health).await?;
    summary
}

/// The elector's task and its channels, from [`Election::start`] to [`Election::step_down`].
struct Election {
    lease: LeaseConfig,
    task: OwnedTask<Result<(), LeaderError>>,
    leadership: watch::Receiver<Leadership>,
    /// Asks the elector to release the Lease (only after every write has finished).
    release: tokio::sync::oneshot::Sender<()>,
    /// Standby, take-over and loss, one line each, and the leader gauge.
    log: tokio::task::JoinHandle<()>,
    /// The write intents the elector keeps in the Lease (see [`crate::leader::WriteIntents`]).
    intents: Arc<WriteIntents>,
}

/// How standing by ended.
enum Standby {
    /// This replica leads: allocate.
    Leading(Election),
    /// Stopped while standing by (`Ok`, nothing allocated), or the elector ended (`Err`).
    Ended(Result<RunSummary, Error>),
}

impl Election {
    /// Starts the elector (its Lease reads feed readiness, see [`Health::watch_lease_contact`])
    /// and the leadership log.
    fn start(
        client: &Client,
        lease: LeaseConfig,
        (takeover, intents_off): (Takeover, bool),
        health: &Health,
    ) -> Result<Election, Error> {
        let intents = Arc::new(WriteIntents::new());
        let mut elector =
            LeaderElector::new(client.clone(), lease.clone()).map_err(Error::LeaderElection)?;
        if !intents_off {
            elector = elector.with_write_intents(intents.clone());
        }
        if takeover == Takeover::AtOnce {
            elector = elector.taking_over_at_once();
        }
        // Not ready while the Lease cannot be read (an unreachable API server): see `health`.
        health.watch_lease_contact(elector.lease_contact(), lease.lease_duration);
        crate::metrics::set_leader_status(&lease.name, false);
        let (leadership_tx, leadership) = watch::channel(Leadership::default());
        let (release, release_rx) = tokio::sync::oneshot::channel::<()>();
        // The Lease is released only when asked to (after every write has finished), never
        // because the sender is gone: that is this future being dropped, with writes possibly in
        // flight.
        let task = OwnedTask::spawn(elector.run(leadership_tx, async move {
            if release_rx.await.is_err() {
                std::future::pending::<()>().await;
            }
        }));
        let log = spawn_leadership_log(leadership.clone(), &lease);
        Ok(Election {
            lease,
            task,
            leadership,
            release,
            log,
            intents,
        })
    }

    /// Waits until this replica leads, `stop` is set (the Lease is released if it was ever ours)
    /// or the elector ends (an error).
    async fn stand_by(mut self, mut stop: watch::Receiver<bool>, health: &Health) -> Standby {
        let mut leadership = self.leadership.clone();
        tokio::select! {
            biased;
            () = stopped(&mut stop) => {
                self.log.abort();
                let _ = self.release.send(());
                let _ = self.task.await;
                health.set_ready(false);
                Standby::Ended(Ok(RunSummary::default()))
            }
            joined = &mut self.task => {
                health.set_ready(false);
                let error = match joined {
                    Ok(Err(e)) => Error::LeaderElection(e),
                    Ok(Ok(())) => Error::TaskFailed { task: "leader election", reason: "stopped".to_owned() },
                    Err(e) => Error::TaskFailed { task: "leader election", reason: e.to_string() },
                };
                health.set_failed(error.to_string());
                Standby::Ended(Err(error))
            }
            _ = async { leadership.wait_for(Leadership::is_leading).await.is_ok() } => Standby::Leading(self),
        }
    }

    /// One allocating term while leading; it also stops when leadership is lost or the elector
    /// ends.
    async fn lead(
        &self,
        config: ControllerConfig,
        allocator: Allocator,
        client: Client,
        (stop_tx, stop): (&watch::Sender<bool>, watch::Receiver<bool>),
        in_doubt: Arc<InDoubtWrites>,
    ) -> Result<RunSummary, Error> {
        let gate = WriteGate {
            not_before: tokio::time::Instant::now(),
            lease: Some(self.leadership.clone()),
            write_duration: config.request_timeout,
            intents: (!config.write_intents_off).then(|| self.intents.clone()),
        };
        let stop_on_loss = {
            let stop_tx = stop_tx.clone();
            let mut leadership = self.leadership.clone();
            OwnedTask::spawn(async move {
                let _ = leadership.wait_for(|l| !l.is_leading()).await.is_ok();
                let _ = stop_tx.send(true);
            })
        };
        let summary = pipeline::run(config, allocator, client, stop, gate, in_doubt).await;
        stop_on_loss.abort();
        summary
    }

    /// After the term: keeps the Lease while a write in doubt can still land, then releases it.
    /// `Err` if the Lease was lost (or could not be managed) meanwhile.
    async fn step_down(self, in_doubt: &InDoubtWrites, health: &Health) -> Result<(), Error> {
        let Election {
            lease,
            task,
            mut leadership,
            release,
            log,
            intents: _,
        } = self;
        // Every write has been answered, but one answered without a definite outcome may still
        // be applied by the API server: the Lease stays ours (renewed) until none can land any
        // more.
        let lease_name = format!("{}/{}", lease.namespace, lease.name);
        hold_lease_for_writes_in_doubt(in_doubt, &mut leadership, &lease_name).await;
        log.abort();
        let lost = matches!(*leadership.borrow(), Leadership::Lost) || task.is_finished();
        let _ = release.send(());
        let released = task.await;
        crate::metrics::set_leader_status(&lease.name, false);
        match released {
            Ok(Ok(())) if !lost => tracing::info!("released the Lease"),
            Ok(Ok(())) => {}
            Ok(Err(LeaderError::Release { source, .. })) => {
                tracing::warn!(error = %source, "releasing the Lease failed; it expires instead");
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "lost the Lease; stopped allocating");
                health.set_failed(e.to_string());
                return Err(Error::LeaderElection(e));
            }
            Err(e) => {
                let error = Error::TaskFailed {
                    task: "leader election",
                    reason: e.to_string(),
                };
                health.set_failed(error.to_string());
                return Err(error);
            }
        }
        if lost {
            health.set_failed("leader election: lost the Lease");
            return Err(Error::LeadershipLost);
        }
        Ok(())
    }
}

/// Logs standby, take-over and loss, one line each (renewals are quiet), and sets the leader
/// gauge, until aborted.
fn spawn_leadership_log(
    mut watch: watch::Receiver<Leadership>,
    lease: &LeaseConfig,
) -> tokio::task::JoinHandle<()> {
    let lease_path = format!("{}/{}", lease.namespace, lease.name);
    let lease_name = lease.name.clone();
    tokio::spawn(async move {
        let mut before: Option<Leadership> = None;
        loop {
            let now = watch.borrow_and_update().clone();
            crate::metrics::set_leader_status(&lease_name, now.is_leading());
            if let Some(line) = oplog::leadership_line(before.as_ref(), &now, &lease_path) {
                match now {
                    Leadership::Lost => tracing::warn!(lease = %lease_path, "{line}"),
                    _ => tracing::info!(lease = %lease_path, "{line}"),
                }
            }
            before = Some(now);
            if watch.changed().await.is_err() {
                return;
            }
        }
    })
}

/// A stopping leader's last duty before it releases the Lease (issue 15, item 1): while a write it
/// sent may still be applied by the API server ([`InDoubtWrites::pending`]), a standby must not
/// take over — it would list, see the Node without podCIDRs and hand the same block to another
/// Node. So the Lease is kept, and renewed by the elector, until the last such write's deadline
/// has passed: at most the request timeout after the last answer, so the wait is bounded by the
/// request timeout. Logs how many writes it waits for and until when. A Lease lost meanwhile ends
/// the wait: a deposed leader cannot hold it, and its successor is kept out until after those
/// deadlines by the write fence (see [`crate::leader`]).
async fn hold_lease_for_writes_in_doubt(
    in_doubt: &InDoubtWrites,
    leadership: &mut watch::Receiver<Leadership>,
    lease: &str,
) {
    let now = tokio::time::Instant::now();
    let Some(pending) = in_doubt.pending(now) else {
        return;
    };
    if !leadership.borrow().is_leading() {
        return;
    }
    let wait = pending.until.saturating_duration_since(now);
    let until = k8s_openapi::jiff::Timestamp::now()
        .checked_add(wait)
        .map(|t| t.to_string())
        .unwrap_or_default();
    tracing::info!(
        %lease,
        writes = pending.writes,
        %until,
        wait_ms = u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
        "keeping the Lease until writes in doubt can no longer be applied (a standby taking over now could hand their blocks out again)"
    );
    tokio::select! {
        () = tokio::time::sleep_until(pending.until) => {}
        _ = leadership.wait_for(|l| !l.is_leading()) => {
            tracing::warn!(%lease, "lost the Lease while waiting for writes in doubt");
        }
    }
}

/// The allocator for `config`: the grid of `config.sizing` fixed, the service CIDRs reserved.
///
/// # Errors
/// [`Error::Pool`] if a service CIDR fills a cluster CIDR (or `config.sizing` was not built from
/// `config.ipam`).
pub fn build_allocator(config: &ControllerConfig) -> Result<Allocator, Error> {
    Allocator::with_sizing(&config.ipam, config.sizing.clone()).map_err(Error::Pool)
}

/// The request timeout the workers use while leading: at most `lease duration − retry period −
/// max(retry period, 1 s)`, at least 1 s, so that after every renewal there is room to start writes
/// that end before the Lease could pass to a standby (see `leader`'s write fence).
pub fn write_timeout(request_timeout: Duration, election: &LeaseConfig) -> Duration {
    let margin = election.retry_period + election.retry_period.max(Duration::from_secs(1));
    let room = election.lease_duration.saturating_sub(margin);
    let effective = request_timeout.min(room).max(Duration::from_secs(1));
    if effective < request_timeout {
        tracing::info!(
            ?request_timeout,
            ?effective,
            lease_duration = ?election.lease_duration,
            retry_period = ?election.retry_period,
            "request timeout shortened to fit the Lease"
        );
    }
    effective
}
