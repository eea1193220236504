//! One allocating term: informer → (first complete list) start-up occupy → dispatcher and
//! workers, supervised. Ends when `stop` becomes true (clean) or when any of its long-lived tasks
//! stops or panics, or the client breaks (an error: the process must not live on half-alive).

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::watch;

use super::backoff::RetryBackoff;
use super::cluster_cidrs;
use super::events::{self, EVENT_QUEUE_CAPACITY, EventSink};
use super::gate::WriteGate;
use super::in_doubt::InDoubtWrites;
use super::informer::{self, InformerSettings, NodeCache, SyncState};
use super::oplog::{EXHAUSTION_WARNING_INTERVAL, PerPoolRateLimit};
use super::waiters::Waiters;
use super::window::{WRITES_AHEAD_OF_WATCH, WriteWindow};
use super::worker::{self, Shared, WorkerSettings};
use super::{CONTROLLER_NAME, ControllerConfig, OwnedTask, RunSummary, WorkQueue, WriteLimiter};
use crate::reconcile::{Action, Allocator, EventSpec, NodeName};
use crate::{Error, metrics as m};

/// Runs informer + workers until `stop`; returns the final state. Every write's unknown outcome
/// is recorded in `in_doubt` (see [`InDoubtWrites`]). `allocator` is fresh (built from `config`).
///
/// Phases: wait for the write fence; start the informer; wait for its first complete list; occupy
/// every existing podCIDR; start the event writer, the gauges and the dispatcher; supervise until
/// stop or a failure; wind down (in-flight writes finish, nothing new is sent).
pub(super) async fn run(
    config: ControllerConfig,
    allocator: Allocator,
    client: Client,
    mut stop: watch::Receiver<bool>,
    write_gate: WriteGate,
    in_doubt: Arc<InDoubtWrites>,
) -> Result<RunSummary, Error> {
    let cache = Arc::new(if config.watch_cluster_cidr_objects {
        NodeCache::with_all_labels()
    } else {
        NodeCache::with_label_keys(&allocator.sizing().label_keys())
    });
    let allocator = Arc::new(Mutex::new(allocator));
    let health = config.health.clone();
    if !wait_for_write_fence(&write_gate, &mut stop).await {
        let pools = lock(&allocator).pool_stats();
        return Ok(RunSummary {
            pools,
            held: BTreeMap::new(),
        });
    }
    // The ClusterCIDRs before the Nodes: every existing podCIDR is occupied in its pool.
    let cluster_cidrs = if config.watch_cluster_cidr_objects {
        let listed = cluster_cidrs::list(
            &cluster_cidrs::api(client.clone()),
            &allocator,
            config
                .retry_max_delay
                .min(std::time::Duration::from_secs(5)),
            &mut stop,
        )
        .await
        .inspect_err(|e| health.set_failed(e.to_string()))?;
        match listed {
            Some(view) => Some(view),
            None => return Ok(summary(&allocator)),
        }
    } else {
        None
    };
    let mut feed = Feed::start(&config, &client, cache, stop.clone());
    if !feed.wait_for_first_list(&mut stop, &health).await? {
        return Ok(summary(&allocator));
    }
    let startup_events = startup_occupy(&allocator, &feed.cache, &health, &config.ipam);
    if let Some(intents) = &write_gate.intents {
        let inherited =
            super::inherited::seed_inherited_intents(&allocator, &feed.cache, intents, &health);
        if inherited != Default::default() {
            tracing::info!(
                reserved = inherited.reserved,
                settled = inherited.settled,
                conflicting = inherited.conflicting,
                "resolved the write intents inherited with the Lease"
            );
        }
    }
    health.set_ready(true);
    let mut workers = Workers::start(
        &config,
        client,
        &allocator,
        &feed,
        startup_events,
        (write_gate, in_doubt),
        stop.clone(),
    );
    config.quiescence.started(
        feed.queue.clone(),
        workers.shared.events.outstanding(),
        cluster_cidrs.as_ref().map(|view| view.rounds.clone()),
    );
    // Dropped (aborted) before the wind-down: nothing more is written to ClusterCIDRs then.
    let cluster_cidr_tasks =
        cluster_cidrs.map(|view| ClusterCidrTasks::start(&config, &workers.shared, view));
    let mut signals = Signals {
        stop,
        broken: feed.broken.clone(),
        panicked: feed.panicked.clone(),
    };
    let Supervised { outcome, done } =
        supervise(&mut feed.informer, &mut workers.dispatcher, &mut signals).await;
    config.quiescence.ended();
    drop(cluster_cidr_tasks);
    let outcome = judge(
        outcome,
        *signals.stop.borrow(),
        signals.broken.borrow().is_some(),
    );
    wind_down(feed, workers, done, outcome.is_err()).await;
    match outcome {
        Ok(()) => Ok(summary(&allocator)),
        Err((task, reason)) => Err(task_failed(&health, task, reason)),
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The final state: the pools and who holds what.
fn summary(allocator: &Mutex<Allocator>) -> RunSummary {
    let allocator = lock(allocator);
    RunSummary {
        pools: allocator.pool_stats(),
        held: allocator
            .known_names()
            .into_iter()
            .filter_map(|name| {
                let held = allocator.held(&name)?.to_vec();
                Some((name.to_string(), held))
            })
            .collect(),
    }
}

/// The start-up write fence holds back the first list too: a write the previous process left in
/// flight may land until then, and a list taken earlier would show its block free — which the
/// allocator could reserve for another Node at once and PATCH there once the fence opens. A list
/// taken after the fence shows every such write that will ever land. (Found by the chaos suite.)
/// `false` if stop came first.
async fn wait_for_write_fence(gate: &WriteGate, stop: &mut watch::Receiver<bool>) -> bool {
    if tokio::time::Instant::now() >= gate.not_before {
        return true;
    }
    tokio::select! {
        biased;
        () = super::stopped(stop) => false,
        () = tokio::time::sleep_until(gate.not_before) => true,
    }
}

/// The informer's task, what it fills, and the term's failure signals.
struct Feed {
    cache: Arc<NodeCache>,
    queue: Arc<WorkQueue>,
    window: Arc<WriteWindow>,
    informer: OwnedTask<()>,
    synced: watch::Receiver<SyncState>,
    /// Set (by the informer or a worker) when the client can no longer send anything.
    broken_tx: watch::Sender<Option<String>>,
    broken: watch::Receiver<Option<String>>,
    /// Set by the panic hook when any task panics.
    panicked: watch::Receiver<Option<String>>,
}

impl Feed {
    /// Starts the informer into `cache` and a fresh queue and write window.
    fn start(
        config: &ControllerConfig,
        client: &Client,
        cache: Arc<NodeCache>,
        stop: watch::Receiver<bool>,
    ) -> Feed {
        let queue = Arc::new(WorkQueue::new());
        let window = Arc::new(WriteWindow::new(WRITES_AHEAD_OF_WATCH));
        let (synced_tx, synced) = watch::channel(SyncState::default());
        let (broken_tx, broken) = watch::channel::<Option<String>>(None);
        let panicked = super::panic_watch();
        let informer = OwnedTask::spawn(informer::run(
            Api::all(client.clone()),
            informer::Outputs {
                cache: cache.clone(),
                queue: queue.clone(),
                window: window.clone(),
            },
            synced_tx,
            InformerSettings {
                initial_list: config.initial_list,
                retry_min_delay: config
                    .retry_min_delay
                    .max(std::time::Duration::from_millis(100)),
                retry_max_delay: config.retry_max_delay,
            },
            stop,
            broken_tx.clone(),
        ));
        Feed {
            cache,
            queue,
            window,
            informer,
            synced,
            broken_tx,
            broken,
            panicked,
        }
    }

    /// Nothing is allocated before every existing podCIDR is occupied: waits for the informer's
    /// first complete list. `Ok(false)`: stop came first (the informer is stopped).
    ///
    /// # Errors
    /// [`Error::TaskFailed`] if the client broke, a task panicked, or the informer ended first.
    async fn wait_for_first_list(
        &mut self,
        stop: &mut watch::Receiver<bool>,
        health: &super::Health,
    ) -> Result<bool, Error> {
        let synced_ok = tokio::select! {
            biased;
            () = super::stopped(stop) => false,
            why = self.broken.wait_for(Option::is_some) => {
                let why = why.ok().and_then(|w| w.clone()).unwrap_or_default();
                self.informer.abort();
                return Err(task_failed(health, "the Kubernetes client", why));
            }
            why = self.panicked.wait_for(Option::is_some) => {
                let why = why.ok().and_then(|w| w.clone()).unwrap_or_default();
                self.informer.abort();
                return Err(task_failed(health, "a task", format!("panicked: {why}")));
            }
            // Err: the informer ended (its sender is gone); its handle says why, below.
            synced = self.synced.wait_for(|s| s.lists > 0) => synced.is_ok(),
        };
        if synced_ok {
            return Ok(true);
        }
        if !*stop.borrow() {
            // The informer ended before its first list: a broken client, or a panic.
            if let Some(why) = self.broken.borrow().clone() {
                self.informer.abort();
                return Err(task_failed(health, "the Kubernetes client", why));
            }
            let joined = (&mut self.informer).await;
            return Err(task_failed(
                health,
                "the Node informer",
                joined_reason(joined),
            ));
        }
        self.informer.abort();
        let _ = (&mut self.informer).await;
        Ok(false)
    }
}

/// The ClusterCIDR watch and writer ([`cluster_cidrs`]), started with the workers; aborted when
/// dropped.
struct ClusterCidrTasks {
    _watch: OwnedTask<()>,
    _writer: OwnedTask<()>,
}

/// The ClusterCIDR writer's term: a new name for every allocating term, so its stamps tell its
/// writes from every earlier term's (see `cluster_cidrs::Term`), ordered by the epoch of our
/// holding of the Lease (its `leaseTransitions`, [`crate::leader::WriteIntents::epoch`]) where the
/// write intents keep one — a deposed leader then never stamps over its successor's stamp.
fn writer_term(config: &ControllerConfig, shared: &Shared) -> cluster_cidrs::Term {
    let fresh = cluster_cidrs::Term::fresh(config.instance.as_deref());
    match shared
        .settings
        .write_gate
        .intents
        .as_ref()
        .and_then(|i| i.epoch())
    {
        Some(epoch) => cluster_cidrs::Term::new(epoch, fresh.name()),
        None => fresh,
    }
}

impl ClusterCidrTasks {
    fn start(
        config: &ControllerConfig,
        shared: &Arc<Shared>,
        view: Arc<cluster_cidrs::ObjectView>,
    ) -> ClusterCidrTasks {
        let api = cluster_cidrs::api(shared.client.clone());
        let recorder = Recorder::new(
            shared.client.clone(),
            Reporter {
                controller: CONTROLLER_NAME.to_owned(),
                instance: config.instance.clone(),
            },
        );
        ClusterCidrTasks {
            _watch: OwnedTask::spawn(cluster_cidrs::watch(
                api.clone(),
                view.clone(),
                shared.clone(),
            )),
            _writer: OwnedTask::spawn(cluster_cidrs::write(
                api,
                view,
                shared.clone(),
                recorder,
                writer_term(config, shared),
            )),
        }
    }
}

/// The tasks started once the pool is occupied.
struct Workers {
    /// What the dispatcher and the workers share (the ClusterCIDR tasks use it too).
    shared: Arc<Shared>,
    dispatcher: OwnedTask<Result<(), Error>>,
    event_writer: OwnedTask<()>,
    gauges: OwnedTask<()>,
}

impl Workers {
    /// Starts the event writer, the largest-free-block gauges and the dispatcher.
    fn start(
        config: &ControllerConfig,
        client: Client,
        allocator: &Arc<Mutex<Allocator>>,
        feed: &Feed,
        startup_events: HashMap<NodeName, Vec<EventSpec>>,
        (write_gate, in_doubt): (WriteGate, Arc<InDoubtWrites>),
        stop: watch::Receiver<bool>,
    ) -> Workers {
        // Events are written by a task of their own, from a bounded queue, with a token bucket of
        // their own (the same `--kube-api-qps`/`--kube-api-burst` figures): they never wait for,
        // nor spend, the Node PATCHes' budget.
        let (events, queued_events) = EventSink::new(EVENT_QUEUE_CAPACITY);
        let event_writer = OwnedTask::spawn(events::write_events(
            queued_events,
            Recorder::new(
                client.clone(),
                Reporter {
                    controller: CONTROLLER_NAME.to_owned(),
                    instance: config.instance.clone(),
                },
            ),
            WriteLimiter::new(config.kube_api_qps, config.kube_api_burst),
            config.request_timeout,
        ));
        let shared = Arc::new(Shared {
            api: Api::all(client.clone()),
            client,
            allocator: allocator.clone(),
            cache: feed.cache.clone(),
            queue: feed.queue.clone(),
            events,
            limiter: WriteLimiter::new(config.kube_api_qps, config.kube_api_burst),
            window: feed.window.clone(),
            health: config.health.clone(),
            backoff: Mutex::new(RetryBackoff::new(
                config.retry_min_delay,
                config.retry_max_delay,
            )),
            waiters: Mutex::new(Waiters::new()),
            startup_events: Mutex::new(startup_events),
            exhaustion_log: Mutex::new(PerPoolRateLimit::new(EXHAUSTION_WARNING_INTERVAL)),
            settings: WorkerSettings {
                workers: config.workers,
                request_timeout: config.request_timeout,
                write_gate,
                in_doubt,
                waiting_recheck: config
                    .retry_max_delay
                    .saturating_mul(worker::WAITING_RECHECK_FACTOR),
                deletion_quarantine: config.deletion_quarantine,
            },
            broken: feed.broken_tx.clone(),
        });
        let gauges = OwnedTask::spawn(refresh_largest_free(allocator.clone()));
        let dispatcher = OwnedTask::spawn(worker::dispatch(shared.clone(), stop));
        Workers {
            shared,
            dispatcher,
            event_writer,
            gauges,
        }
    }
}

/// What ends a term besides its tasks: stop, a broken client, a panic anywhere.
struct Signals {
    stop: watch::Receiver<bool>,
    broken: watch::Receiver<Option<String>>,
    panicked: watch::Receiver<Option<String>>,
}

/// How supervision ended.
struct Supervised {
    outcome: Result<(), Ended>,
    done: Done,
}

/// Which task handles [`supervise`] has awaited to their end (they must not be polled again).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Done {
    informer: bool,
    dispatcher: bool,
}

/// Waits for the first of: stop, the informer's or the dispatcher's end, a broken client, a
/// panic.
async fn supervise(
    informer: &mut OwnedTask<()>,
    dispatcher: &mut OwnedTask<Result<(), Error>>,
    signals: &mut Signals,
) -> Supervised {
    let mut done = Done::default();
    let outcome = tokio::select! {
        biased;
        () = super::stopped(&mut signals.stop) => Ok(()),
        joined = informer => {
            done.informer = true;
            Err(Ended::Informer(joined))
        }
        joined = dispatcher => {
            done.dispatcher = true;
            Err(Ended::Dispatcher(joined))
        }
        why = signals.broken.wait_for(Option::is_some) => {
            Err(Ended::Failed("the Kubernetes client", why.ok().and_then(|w| w.clone()).unwrap_or_default()))
        }
        why = signals.panicked.wait_for(Option::is_some) => {
            Err(Ended::Failed("a task", format!("panicked: {}", why.ok().and_then(|w| w.clone()).unwrap_or_default())))
        }
    };
    Supervised { outcome, done }
}

/// Whether a term's end is the clean shutdown or a failure (which task, why). The informer and
/// the dispatcher also end on `stop`, and on a multi-threaded runtime the stop can reach them
/// (and they can end) between the select's poll of `stopped` and its poll of their handles: such
/// an ending is the clean shutdown, not a failure. (Found by the chaos suite: a clean shutdown
/// reported "the Node informer stopped unexpectedly: returned ()".)
fn judge(
    outcome: Result<(), Ended>,
    stop_requested: bool,
    client_broken: bool,
) -> Result<(), (&'static str, String)> {
    match outcome {
        Ok(()) => Ok(()),
        Err(Ended::Informer(Ok(()))) if stop_requested && !client_broken => Ok(()),
        Err(Ended::Informer(joined)) => Err(("the Node informer", joined_reason(joined))),
        Err(Ended::Dispatcher(Ok(Ok(())))) if stop_requested => Ok(()),
        Err(Ended::Dispatcher(joined)) => Err((
            "the workers",
            match joined {
                Ok(Ok(())) => "stopped".to_owned(),
                Ok(Err(e)) => e.to_string(),
                Err(e) => e.to_string(),
            },
        )),
        Err(Ended::Failed(task, reason)) => Err((task, reason)),
    }
}

/// Stops taking work and lets the in-flight writes finish (each bounded by the request timeout;
/// after a failure the dispatcher is aborted instead); writes not yet sent are not sent (they
/// would wait for the watch, which stops now). Events still queued are not written: a stop does
/// not wait for them (best effort, as client-go's broadcaster on shutdown). The Node cache and
/// the queue go before the caller builds the summary (at 50,000 Nodes each is several MB; the
/// summary copies every held name).
async fn wind_down(feed: Feed, workers: Workers, done: Done, failed: bool) {
    let Feed {
        cache,
        queue,
        window,
        informer,
        ..
    } = feed;
    let Workers {
        shared: _,
        dispatcher,
        event_writer,
        gauges,
    } = workers;
    queue.shut_down();
    window.close();
    gauges.abort();
    event_writer.abort();
    if !done.informer {
        informer.abort();
        let _ = informer.await;
    }
    if !done.dispatcher {
        if failed {
            dispatcher.abort();
        }
        let _ = dispatcher.await;
    }
    drop(cache);
    drop(queue);
}

/// Which long-lived task ended an allocating term first (see `run`).
enum Ended {
    /// The informer's task ended.
    Informer(Result<(), tokio::task::JoinError>),
    /// The dispatcher's task ended.
    Dispatcher(Result<Result<(), Error>, tokio::task::JoinError>),
    /// The client broke or a task panicked: which, and why.
    Failed(&'static str, String),
}

fn joined_reason<T: std::fmt::Debug>(joined: Result<T, tokio::task::JoinError>) -> String {
    match joined {
        Ok(value) => format!("returned {value:?}"),
        Err(e) if e.is_panic() => format!("panicked: {}", panic_message(e)),
        Err(e) => e.to_string(),
    }
}

fn panic_message(error: tokio::task::JoinError) -> String {
    match error.try_into_panic() {
        Ok(payload) => super::panic_text(payload.as_ref()),
        Err(e) => e.to_string(),
    }
}

fn task_failed(health: &super::Health, task: &'static str, reason: String) -> Error {
    health.set_failed(format!("{task} stopped unexpectedly: {reason}"));
    Error::TaskFailed { task, reason }
}

/// How often the largest-free-block gauge is recomputed. It is not updated on every allocation:
/// on a 2^24-block set the search takes up to milliseconds (see
/// `CidrSet::largest_free_block`), under the allocator's lock.
const LARGEST_FREE_REFRESH: std::time::Duration = std::time::Duration::from_secs(5);

/// Sets the largest-free-block gauges now and every [`LARGEST_FREE_REFRESH`] (until aborted).
async fn refresh_largest_free(allocator: Arc<Mutex<Allocator>>) {
    loop {
        let largest = allocator
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .largest_free_blocks();
        m::set_largest_free_gauges(&largest);
        tokio::time::sleep(LARGEST_FREE_REFRESH).await;
    }
}

/// Occupies every cached Node's podCIDRs (sorted by name: the first Node to claim a block keeps
/// it); records the metrics and logs now, returns the skip and diagnostic events to publish on
/// each Node's first reconcile. The Node diagnostics ([`Allocator::node_findings`]) are
/// logged as one warning per kind. One Node at a time: only the sorted names and the findings are
/// held, never a copy of every Node or of every decision (at 50,000 Nodes those copies were
/// ~30 MB at once).
fn startup_occupy(
    allocator: &Mutex<Allocator>,
    cache: &NodeCache,
    health: &super::Health,
    ipam: &nodeipam_core::IpamConfig,
) -> HashMap<NodeName, Vec<EventSpec>> {
    let names = cache.names();
    let mut allocator = allocator.lock().unwrap_or_else(PoisonError::into_inner);
    // Every listed Node gets a record (occupied now, or allocated next): size the index for all of
    // them at once, so it is not grown by doubling, old and new table side by side, while the
    // first allocations fill it (at 150,000 Nodes the old table was ~11 MiB of the peak).
    allocator.reserve_nodes(names.len());
    let mut events = HashMap::new();
    let (mut occupied, mut skipped, mut other_size) = (0usize, 0usize, 0usize);
    // Nodes `--node-selector` does not select: not waiting, not skipped, no findings.
    let mut not_served = 0usize;
    let mut findings: Vec<crate::diagnostics::Finding> = Vec::new();
    let mut outside = crate::diagnostics::OutsideClusterCidrs::default();
    for name in &names {
        let Some((name, node)) = cache.get(name) else {
            continue;
        };
        if node.needs_pod_cidrs() {
            // A view (allocations) only when a selector has something to read.
            let selecting = !allocator.sizing().node_selector().selects_all();
            not_served +=
                usize::from(selecting && !allocator.sizing().serves(&node.view(&name).labels));
            continue;
        }
        let view = node.view(&name);
        if allocator.sizing().serves(&view.labels) {
            findings.extend(allocator.node_findings(&view));
        }
        for (name, decision) in allocator.startup_occupy(std::slice::from_ref(&view)) {
            for metric in &decision.metrics {
                m::apply(metric);
            }
            match &decision.action {
                Action::Skip { reason } => {
                    tracing::warn!(node = %name, %reason, "skipping Node");
                    skipped += 1;
                    outside.observe(&allocator, &view);
                }
                Action::NotServed { .. } => not_served += 1,
                Action::Keep { pod_cidrs } => {
                    occupied += 1;
                    if let Some(reason) = allocator.size_mismatch(&view, pod_cidrs) {
                        other_size += 1;
                        tracing::info!(node = %name, %reason, "Node keeps a pod CIDR of another size than its node pool's");
                    }
                }
                _ => occupied += 1,
            }
            if !decision.events.is_empty() {
                events.insert(name, decision.events);
            }
        }
    }
    // The per-Node findings' events come with each Node's occupy decision (above); here they are
    // summarized in one warning per kind.
    for line in crate::diagnostics::summarize(&findings) {
        tracing::warn!("{line}");
    }
    // Nodes left outside by a cluster CIDR removed from --cluster-cidr: one line per family.
    let cluster_cidrs: Vec<_> = ipam.cluster_cidrs.iter().map(|c| c.cluster_cidr).collect();
    for line in outside.lines(&cluster_cidrs) {
        tracing::warn!("{line}");
    }
    let pools = allocator.pool_stats();
    m::set_pool_gauges(&pools, allocator.skipped_count());
    for pool in &pools {
        tracing::info!(
            cluster_cidr = %pool.cluster_cidr,
            capacity = pool.capacity_blocks,
            used = pool.used_blocks,
            free = pool.free_blocks,
            "pool after start-up occupy"
        );
    }
    health.set_pools(pools);
    tracing::info!(
        nodes = names.len(),
        occupied,
        skipped,
        waiting = names.len() - occupied - skipped - not_served,
        not_served,
        other_size,
        "start-up occupy done; allocating"
    );
    events
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Signals that nothing has set yet; the senders are handed back to set them.
    #[allow(clippy::type_complexity)]
    fn signals() -> (
        Signals,
        (
            watch::Sender<bool>,
            watch::Sender<Option<String>>,
            watch::Sender<Option<String>>,
        ),
    ) {
        let (stop_tx, stop) = watch::channel(false);
        let (broken_tx, broken) = watch::channel(None);
        let (panicked_tx, panicked) = watch::channel(None);
        (
            Signals {
                stop,
                broken,
                panicked,
            },
            (stop_tx, broken_tx, panicked_tx),
        )
    }

    /// [`supervise`], failing the test if it has not ended within 10 s.
    async fn ended(
        informer: &mut OwnedTask<()>,
        dispatcher: &mut OwnedTask<Result<(), Error>>,
        signals: &mut Signals,
    ) -> Supervised {
        tokio::time::timeout(
            std::time::Duration::from_secs(10),
            supervise(informer, dispatcher, signals),
        )
        .await
        .expect("supervision ends")
    }

    fn worker_failed(reason: &str) -> Error {
        Error::TaskFailed {
            task: "a node CIDR update worker",
            reason: reason.to_owned(),
        }
    }

    /// The informer and the dispatcher end on stop too; such an ending is the clean shutdown,
    /// anything else ends the term with an error naming the task (the chaos suite once saw a
    /// clean shutdown reported as "the Node informer stopped unexpectedly: returned ()").
    #[test]
    fn a_task_ending_on_stop_is_the_clean_shutdown_and_otherwise_a_failure() {
        let informer_ended = || Err(Ended::Informer(Ok(())));
        assert_eq!(judge(informer_ended(), true, false), Ok(()));
        assert_eq!(
            judge(informer_ended(), false, false),
            Err(("the Node informer", "returned ()".to_owned()))
        );
        // Stop was asked for, but the informer ended because the client broke: a failure.
        assert!(judge(informer_ended(), true, true).is_err());
        let dispatcher_ended = || Err(Ended::Dispatcher(Ok(Ok(()))));
        assert_eq!(judge(dispatcher_ended(), true, false), Ok(()));
        assert_eq!(
            judge(dispatcher_ended(), false, false),
            Err(("the workers", "stopped".to_owned()))
        );
        // A worker that panicked is a failure even while stopping.
        assert_eq!(
            judge(
                Err(Ended::Dispatcher(Ok(Err(worker_failed("boom"))))),
                true,
                false
            ),
            Err((
                "the workers",
                "a node CIDR update worker stopped unexpectedly: boom".to_owned()
            ))
        );
        assert_eq!(
            judge(
                Err(Ended::Failed("the Kubernetes client", "closed".to_owned())),
                true,
                false
            ),
            Err(("the Kubernetes client", "closed".to_owned()))
        );
    }

    /// A dispatcher task that panics ends supervision at once, as a failure of "the workers"
    /// carrying the panic; the informer's handle is left for the wind-down to stop.
    #[tokio::test]
    async fn supervision_ends_on_a_panicking_dispatcher() {
        let (mut signals, _senders) = signals();
        let mut informer = OwnedTask::spawn(std::future::pending::<()>());
        let mut dispatcher = OwnedTask::spawn(async {
            if std::hint::black_box(true) {
                panic!("a worker bug");
            }
            Ok::<(), Error>(())
        });
        let Supervised { outcome, done } =
            ended(&mut informer, &mut dispatcher, &mut signals).await;
        assert_eq!(
            done,
            Done {
                informer: false,
                dispatcher: true
            }
        );
        match judge(outcome, false, false) {
            Err(("the workers", reason)) => assert!(reason.contains("panic"), "{reason}"),
            other => panic!("expected a failure of the workers, got {other:?}"),
        }
        assert!(!informer.is_finished());
    }

    /// Stop ends supervision cleanly without waiting for either task; a broken client or a
    /// panic anywhere (the panic hook's channel) ends it as a failure naming the cause.
    #[tokio::test]
    async fn supervision_ends_on_stop_a_broken_client_or_a_panic() {
        for signal in ["stop", "broken", "panicked"] {
            let (mut signals, (stop, broken, panicked)) = signals();
            let mut informer = OwnedTask::spawn(std::future::pending::<()>());
            let mut dispatcher = OwnedTask::spawn(std::future::pending::<Result<(), Error>>());
            match signal {
                "stop" => stop.send_replace(true),
                "broken" => broken
                    .send_replace(Some("buffer closed".to_owned()))
                    .is_some(),
                _ => panicked
                    .send_replace(Some("oops at x.rs:1".to_owned()))
                    .is_some(),
            };
            let Supervised { outcome, done } =
                ended(&mut informer, &mut dispatcher, &mut signals).await;
            assert_eq!(done, Done::default(), "{signal}");
            let judged = judge(outcome, signal == "stop", signal == "broken");
            let expected = match signal {
                "stop" => Ok(()),
                "broken" => Err(("the Kubernetes client", "buffer closed".to_owned())),
                _ => Err(("a task", "panicked: oops at x.rs:1".to_owned())),
            };
            assert_eq!(judged, expected, "{signal}");
        }
    }
}
