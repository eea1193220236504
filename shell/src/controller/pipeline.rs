//! One allocating term: informer → (first complete list) start-up occupy → dispatcher and
//! workers, supervised. Ends when `stop` becomes true (clean) or when any of its long-lived tasks
//! stops or panics, or the client breaks (an error: the process must not live on half-alive).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use kube::runtime::events::{Recorder, Reporter};
use kube::{Api, Client};
use tokio::sync::watch;

use super::backoff::RetryBackoff;
use super::events::{self, EVENT_QUEUE_CAPACITY, EventSink};
use super::in_doubt::InDoubtWrites;
use super::informer::{self, InformerSettings, NodeCache, SyncState};
use super::oplog::{EXHAUSTION_WARNING_INTERVAL, PerPoolRateLimit};
use super::waiters::Waiters;
use super::window::{WRITES_AHEAD_OF_WATCH, WriteWindow};
use super::worker::{self, Shared, WorkerSettings, WriteGate};
use super::{CONTROLLER_NAME, ControllerConfig, OwnedTask, RunSummary, WorkQueue, WriteLimiter};
use crate::reconcile::{Action, Allocator, EventSpec, NodeName};
use crate::{Error, metrics as m};

/// Runs informer + workers until `stop`; returns the final state. Every write's unknown outcome
/// is recorded in `in_doubt` (see [`InDoubtWrites`]).
pub(super) async fn run(
    config: ControllerConfig,
    client: Client,
    mut stop: watch::Receiver<bool>,
    write_gate: WriteGate,
    in_doubt: Arc<InDoubtWrites>,
) -> Result<RunSummary, Error> {
    let allocator = super::build_allocator(&config)?;
    let cache = Arc::new(NodeCache::with_label_keys(&allocator.sizing().label_keys()));
    let allocator = Arc::new(Mutex::new(allocator));
    let health = config.health.clone();
    // The start-up write fence holds back the first list too: a write the previous process left
    // in flight may land until then, and a list taken earlier would show its block free — which
    // the allocator could reserve for another Node at once and PATCH there once the fence opens.
    // A list taken after the fence shows every such write that will ever land. (Found by the
    // chaos suite.)
    if tokio::time::Instant::now() < write_gate.not_before {
        tokio::select! {
            biased;
            () = super::stopped(&mut stop) => {
                let allocator = allocator.lock().unwrap_or_else(PoisonError::into_inner);
                return Ok(RunSummary { pools: allocator.pool_stats(), held: Default::default() });
            }
            () = tokio::time::sleep_until(write_gate.not_before) => {}
        }
    }
    let queue = Arc::new(WorkQueue::new());
    let window = Arc::new(WriteWindow::new(WRITES_AHEAD_OF_WATCH));
    let (synced_tx, mut synced) = watch::channel(SyncState::default());
    let (broken_tx, mut broken) = watch::channel::<Option<String>>(None);
    let mut panicked = super::panic_watch();
    let mut informer_task = OwnedTask::spawn(informer::run(
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
        stop.clone(),
        broken_tx.clone(),
    ));
    let summary = |allocator: &Mutex<Allocator>| {
        let allocator = allocator.lock().unwrap_or_else(PoisonError::into_inner);
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
    };

    // Nothing is allocated before every existing podCIDR is occupied.
    let synced_ok = tokio::select! {
        biased;
        () = super::stopped(&mut stop) => false,
        why = broken.wait_for(Option::is_some) => {
            let why = why.ok().and_then(|w| w.clone()).unwrap_or_default();
            informer_task.abort();
            return Err(task_failed(&health, "the Kubernetes client", why));
        }
        why = panicked.wait_for(Option::is_some) => {
            let why = why.ok().and_then(|w| w.clone()).unwrap_or_default();
            informer_task.abort();
            return Err(task_failed(&health, "a task", format!("panicked: {why}")));
        }
        // Err: the informer ended (its sender is gone); its handle says why, below.
        synced = synced.wait_for(|s| s.lists > 0) => synced.is_ok(),
    };
    if !synced_ok {
        if !*stop.borrow() {
            // The informer ended before its first list: a broken client, or a panic.
            if let Some(why) = broken.borrow().clone() {
                informer_task.abort();
                return Err(task_failed(&health, "the Kubernetes client", why));
            }
            let joined = (&mut informer_task).await;
            return Err(task_failed(
                &health,
                "the Node informer",
                joined_reason(joined),
            ));
        }
        informer_task.abort();
        let _ = informer_task.await;
        return Ok(summary(&allocator));
    }
    let startup_events = startup_occupy(&allocator, &cache, &health, &config.ipam);
    health.set_ready(true);

    // Events are written by a task of their own, from a bounded queue, with a token bucket of
    // their own (the same `--kube-api-qps`/`--kube-api-burst` figures): they never wait for, nor
    // spend, the Node PATCHes' budget.
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
        client: client.clone(),
        allocator: allocator.clone(),
        cache: cache.clone(),
        queue: queue.clone(),
        events,
        limiter: WriteLimiter::new(config.kube_api_qps, config.kube_api_burst),
        window: window.clone(),
        health: health.clone(),
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
        },
        broken: broken_tx,
    });
    let gauges = OwnedTask::spawn(refresh_largest_free(allocator.clone()));
    let mut dispatcher = OwnedTask::spawn(worker::dispatch(shared, stop.clone()));
    // Which task ended the term (its handle must not be polled again).
    let mut informer_done = false;
    let mut dispatcher_done = false;
    let outcome = tokio::select! {
        biased;
        () = super::stopped(&mut stop) => Ok(()),
        joined = &mut informer_task => {
            informer_done = true;
            Err(Ended::Informer(joined))
        }
        joined = &mut dispatcher => {
            dispatcher_done = true;
            Err(Ended::Dispatcher(joined))
        }
        why = broken.wait_for(Option::is_some) => {
            Err(Ended::Failed("the Kubernetes client", why.ok().and_then(|w| w.clone()).unwrap_or_default()))
        }
        why = panicked.wait_for(Option::is_some) => {
            Err(Ended::Failed("a task", format!("panicked: {}", why.ok().and_then(|w| w.clone()).unwrap_or_default())))
        }
    };
    // The informer and the dispatcher also end on `stop`, and on a multi-threaded runtime the
    // stop can reach them (and they can end) between the select's poll of `stopped` and its poll
    // of their handles: such an ending is the clean shutdown, not a failure. (Found by the chaos
    // suite: a clean shutdown reported "the Node informer stopped unexpectedly: returned ()".)
    let stop_requested = *stop.borrow();
    let client_broken = broken.borrow().is_some();
    let outcome = match outcome {
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
    };
    // Stop taking work; let the in-flight writes finish (each bounded by the request timeout);
    // writes not yet sent are not sent (they would wait for the watch, which stops now).
    queue.shut_down();
    window.close();
    gauges.abort();
    // Events still queued are not written: a stop does not wait for them (best effort, as
    // client-go's broadcaster on shutdown).
    event_writer.abort();
    if !informer_done {
        informer_task.abort();
        let _ = informer_task.await;
    }
    if !dispatcher_done {
        if outcome.is_err() {
            dispatcher.abort();
        }
        let _ = dispatcher.await;
    }
    // The Node cache and the queue go before the summary is built (at 50,000 Nodes each is
    // several MB; the summary copies every held name).
    drop(cache);
    drop(queue);
    match outcome {
        Ok(()) => Ok(summary(&allocator)),
        Err((task, reason)) => Err(task_failed(&health, task, reason)),
    }
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
/// each Node's first reconcile. The Node diagnostics ([`crate::diagnostics::node_findings`]) are
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
    let mut events = HashMap::new();
    let (mut occupied, mut skipped, mut other_size) = (0usize, 0usize, 0usize);
    // Nodes `--node-selector` does not select: not waiting, not skipped, no findings.
    let mut not_served = 0usize;
    let mut findings: Vec<crate::diagnostics::Finding> = Vec::new();
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
            findings.extend(crate::diagnostics::node_findings(ipam, &view));
        }
        for (name, decision) in allocator.startup_occupy(std::slice::from_ref(&view)) {
            for metric in &decision.metrics {
                m::apply(metric);
            }
            match &decision.action {
                Action::Skip { reason } => {
                    tracing::warn!(node = %name, %reason, "skipping Node");
                    skipped += 1;
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
