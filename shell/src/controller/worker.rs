//! The pipeline: watcher task (list+watch → store → queue) and allocator task (queue → decide →
//! PATCH/events/metrics). The allocator task is the only code that writes.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, Client, Resource};
use nodeipam_core::Cidr;
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::backoff::RetryBackoff;
use super::{CONTROLLER_NAME, ControllerConfig, Health, RunSummary, WorkQueue, WriteLimiter};
use crate::reconcile::{Action, Allocator, Decision, EventKind, EventSpec, MetricEvent, NodeView};
use crate::{Error, metric_names, metrics as m};

type Shared = Arc<Mutex<Allocator>>;

/// Start-up skip events waiting for their Node's first reconcile (keyed by Node name).
type StartupEvents = Arc<Mutex<BTreeMap<String, Vec<EventSpec>>>>;

fn lock(allocator: &Shared) -> std::sync::MutexGuard<'_, Allocator> {
    allocator.lock().unwrap_or_else(PoisonError::into_inner)
}

/// Runs watcher + allocator until `stop` becomes true; returns the final state.
pub(super) async fn pipeline(
    config: ControllerConfig,
    client: Client,
    stop: watch::Receiver<bool>,
) -> Result<RunSummary, Error> {
    let allocator: Shared = Arc::new(Mutex::new(
        Allocator::new(&config.ipam).map_err(Error::Pool)?,
    ));
    for cluster in &config.ipam.cluster_cidrs {
        if cluster.host_bits_were_set {
            tracing::warn!(cluster_cidr = %cluster.cluster_cidr, "--cluster-cidr had host bits set; using the network address");
        }
    }
    let queue = Arc::new(WorkQueue::new());
    let startup_events: StartupEvents = Arc::new(Mutex::new(BTreeMap::new()));
    let api: Api<Node> = Api::all(client.clone());
    let (store, writer) = reflector::store::<Node>();
    let recorder = Recorder::new(
        client.clone(),
        Reporter {
            controller: CONTROLLER_NAME.to_owned(),
            instance: config.instance.clone(),
        },
    );
    let worker = Worker {
        api: api.clone(),
        store: store.clone(),
        allocator: allocator.clone(),
        queue: queue.clone(),
        recorder,
        limiter: WriteLimiter::new(config.kube_api_qps, config.kube_api_burst),
        health: config.health.clone(),
        request_timeout: config.request_timeout,
        backoff: RetryBackoff::new(config.retry_min_delay, config.retry_max_delay),
        waiting: BTreeSet::new(),
        retries: JoinSet::new(),
        startup_events: startup_events.clone(),
    };

    let watch_task = tokio::spawn(watch_nodes(
        WatchTask {
            api,
            store,
            allocator: allocator.clone(),
            queue: queue.clone(),
            health: config.health.clone(),
            startup_events: startup_events.clone(),
        },
        writer,
        stop.clone(),
    ));
    let result = worker.run(stop).await;
    watch_task.abort();
    let _ = watch_task.await;
    result?;
    let allocator = lock(&allocator);
    Ok(RunSummary {
        pools: allocator.pool_stats(),
        held: allocator
            .known_names()
            .into_iter()
            .filter_map(|name| {
                let held = allocator.held(&name)?.to_vec();
                Some((name, held))
            })
            .collect(),
    })
}

/// What the watcher task shares with the allocator task.
struct WatchTask {
    api: Api<Node>,
    store: Store<Node>,
    allocator: Shared,
    queue: Arc<WorkQueue>,
    health: Health,
    startup_events: StartupEvents,
}

/// Watches Nodes into the store; on the first complete list runs the start-up occupy, then
/// queues every Node; afterwards queues every changed or deleted Node (and, after a re-list,
/// every Node known to the store or the allocator).
async fn watch_nodes(
    task: WatchTask,
    writer: reflector::store::Writer<Node>,
    mut stop: watch::Receiver<bool>,
) {
    let WatchTask {
        api,
        store,
        allocator,
        queue,
        health,
        startup_events,
    } = task;
    let stream = watcher(api, watcher::Config::default())
        .default_backoff()
        .reflect(writer);
    let mut stream = std::pin::pin!(stream);
    let mut started = false;
    loop {
        let event = tokio::select! {
            () = super::stopped(&mut stop) => return,
            event = stream.next() => event,
        };
        let Some(event) = event else { return };
        match event {
            Ok(watcher::Event::InitDone) => {
                let mut nodes: Vec<Arc<Node>> = store.state();
                nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                let mut names: BTreeSet<String> = nodes
                    .iter()
                    .filter_map(|n| n.metadata.name.clone())
                    .collect();
                if !started {
                    started = true;
                    let views: Vec<NodeView> =
                        nodes.iter().map(|n| NodeView::from_node(n)).collect();
                    let decisions = lock(&allocator).startup_occupy(&views);
                    let skipped = decisions
                        .iter()
                        .filter(|(_, d)| matches!(d.action, Action::Skip { .. }))
                        .count();
                    tracing::info!(
                        nodes = nodes.len(),
                        occupied = decisions.len() - skipped,
                        skipped,
                        "start-up occupy done; allocating"
                    );
                    // Skip events are published by the allocator task when it reconciles the
                    // Node; record metrics now.
                    for (name, decision) in &decisions {
                        for metric in &decision.metrics {
                            m::apply(metric);
                        }
                        if let Action::Skip { reason } = &decision.action {
                            tracing::warn!(node = %name, %reason, "skipping Node");
                        }
                    }
                    {
                        let allocator = lock(&allocator);
                        m::set_pool_gauges(&allocator.pool_stats(), allocator.skipped_count());
                        health.set_pools(allocator.pool_stats());
                    }
                    health.set_ready(true);
                    // Report start-up skips as events on the first reconcile of each Node.
                    for (name, decision) in decisions {
                        if !decision.events.is_empty() {
                            startup_events
                                .lock()
                                .unwrap_or_else(PoisonError::into_inner)
                                .insert(name, decision.events);
                        }
                    }
                } else {
                    names.extend(lock(&allocator).known_names());
                }
                for name in names {
                    queue.push(name).await;
                }
            }
            Ok(watcher::Event::Apply(node) | watcher::Event::Delete(node)) => {
                if started && let Some(name) = node.metadata.name.clone() {
                    queue.push(name).await;
                }
            }
            Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
            Err(error) => {
                tracing::warn!(%error, "Node watch error; retrying with backoff");
            }
        }
    }
}

struct Worker {
    api: Api<Node>,
    store: Store<Node>,
    allocator: Shared,
    queue: Arc<WorkQueue>,
    recorder: Recorder,
    limiter: WriteLimiter,
    health: Health,
    request_timeout: Duration,
    /// Per-Node retry delays (reset on success).
    backoff: RetryBackoff,
    /// Nodes waiting for a free block (re-queued as soon as one is released).
    waiting: BTreeSet<String>,
    retries: JoinSet<()>,
    startup_events: StartupEvents,
}

impl Worker {
    async fn run(mut self, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
        loop {
            let name = tokio::select! {
                biased;
                () = super::stopped(&mut stop) => break,
                name = self.queue.pop() => name,
            };
            // Not cancelled by `stop`: an in-flight PATCH finishes.
            self.reconcile(&name).await;
            while self.retries.try_join_next().is_some() {}
            let allocator = lock(&self.allocator);
            let pools = allocator.pool_stats();
            m::set_pool_gauges(&pools, allocator.skipped_count());
            self.health.set_pools(pools);
        }
        self.retries.abort_all();
        Ok(())
    }

    async fn reconcile(&mut self, name: &str) {
        let Some(node) = self.store.get(&ObjectRef::new(name)) else {
            let decision = lock(&self.allocator).remove(name);
            self.backoff.reset(name);
            self.waiting.remove(name);
            self.finish(name, None, decision).await;
            return;
        };
        let startup_events = self
            .startup_events
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name)
            .unwrap_or_default();
        for event in &startup_events {
            self.publish(&node, event).await;
        }
        let decision = lock(&self.allocator).decide(&NodeView::from_node(&node));
        let action = decision.action.clone();
        let patch = decision.patch.clone();
        self.finish(name, Some(&node), decision).await;
        match (action, patch) {
            (Action::Assign { pod_cidrs }, Some(patch)) => {
                self.patch(name, &node, pod_cidrs, patch).await;
            }
            (Action::Fail { .. }, _) => {
                self.waiting.insert(name.to_owned());
                self.retry_later(name);
            }
            _ => {
                self.backoff.reset(name);
                self.waiting.remove(name);
            }
        }
    }

    /// PATCHes `spec.podCIDR(s)`; on anything but a clean success re-reads the Node to decide.
    async fn patch(
        &mut self,
        name: &str,
        node: &Node,
        pod_cidrs: Vec<Cidr>,
        patch: serde_json::Value,
    ) {
        self.limiter.acquire().await;
        let params = PatchParams::default();
        let result = tokio::time::timeout(
            self.request_timeout,
            self.api.patch(name, &params, &Patch::Strategic(patch)),
        )
        .await;
        let failure = match result {
            Ok(Ok(updated)) => {
                let view = NodeView::from_node(&updated);
                let confirmed = lock(&self.allocator).confirm(name, &pod_cidrs);
                if !confirmed {
                    let decision = lock(&self.allocator).decide(&view);
                    self.finish(name, Some(&updated), decision).await;
                }
                tracing::info!(node = %name, pod_cidrs = ?view.raw_pod_cidrs(), "assigned pod CIDRs");
                self.backoff.reset(name);
                self.waiting.remove(name);
                return;
            }
            Ok(Err(kube::Error::Api(status))) => {
                format!("HTTP {}: {}", status.code, status.message)
            }
            Ok(Err(error)) => error.to_string(),
            Err(_) => format!("no answer within {:?}", self.request_timeout),
        };
        metrics::counter!(metric_names::PATCH_FAILURES_TOTAL, metric_names::LABEL_ERROR => "patch")
            .increment(1);
        tracing::warn!(node = %name, error = %failure, "PATCH of spec.podCIDRs failed; re-reading the Node");
        // A failure or timeout is not definite: the write may have landed. Re-read.
        self.limiter.acquire().await;
        let reread = tokio::time::timeout(self.request_timeout, self.api.get_opt(name)).await;
        match reread {
            Ok(Ok(Some(current))) => {
                let view = NodeView::from_node(&current);
                if view.has_pod_cidrs() {
                    // Ours landed, or someone else set them: occupy what the Node has.
                    let decision = lock(&self.allocator).decide(&view);
                    self.finish(name, Some(&current), decision).await;
                    self.backoff.reset(name);
                } else {
                    // Definite failure: give the block back, report, retry later.
                    let decision = lock(&self.allocator).abort(name);
                    self.finish(name, None, decision).await;
                    self.publish(
                        node,
                        &EventSpec {
                            kind: EventKind::Warning,
                            reason: crate::reasons::CIDR_ASSIGNMENT_FAILED,
                            note: format!("Node {name}: updating spec.podCIDRs failed: {failure}"),
                            action: crate::reasons::ACTION_PATCH,
                        },
                    )
                    .await;
                    self.retry_later(name);
                }
            }
            Ok(Ok(None)) => {
                let decision = lock(&self.allocator).remove(name);
                self.finish(name, None, decision).await;
                self.backoff.reset(name);
            }
            Ok(Err(error)) => {
                tracing::warn!(node = %name, %error, "re-reading the Node failed; keeping the reservation and retrying");
                self.retry_later(name);
            }
            Err(_) => {
                tracing::warn!(node = %name, "re-reading the Node timed out; keeping the reservation and retrying");
                self.retry_later(name);
            }
        }
    }

    /// Applies a decision's metrics and events; wakes Nodes waiting for a block if any was freed.
    async fn finish(&mut self, name: &str, node: Option<&Node>, decision: Decision) {
        let mut freed = false;
        for metric in &decision.metrics {
            m::apply(metric);
            if matches!(metric, MetricEvent::Released { .. }) {
                freed = true;
            }
        }
        if let Action::Skip { reason } = &decision.action
            && !decision.events.is_empty()
        {
            tracing::warn!(node = %name, %reason, "skipping Node");
        }
        if let Some(node) = node {
            for event in &decision.events {
                self.publish(node, event).await;
            }
        }
        if freed {
            let waiting = std::mem::take(&mut self.waiting);
            for waiter in waiting {
                if waiter != name {
                    self.backoff.reset(&waiter);
                    let queue = self.queue.clone();
                    self.retries.spawn(async move { queue.push(waiter).await });
                }
            }
        }
    }

    async fn publish(&self, node: &Node, event: &EventSpec) {
        self.limiter.acquire().await;
        let kube_event = KubeEvent {
            type_: match event.kind {
                EventKind::Normal => EventType::Normal,
                EventKind::Warning => EventType::Warning,
            },
            reason: event.reason.to_owned(),
            note: Some(event.note.clone()),
            action: event.action.to_owned(),
            secondary: None,
        };
        let reference = node.object_ref(&());
        match tokio::time::timeout(
            self.request_timeout,
            self.recorder.publish(&kube_event, &reference),
        )
        .await
        {
            Ok(Ok(())) => {}
            Ok(Err(error)) => {
                tracing::warn!(%error, reason = event.reason, "publishing an event failed")
            }
            Err(_) => tracing::warn!(reason = event.reason, "publishing an event timed out"),
        }
    }

    /// Re-queues `name` after its next backoff delay.
    fn retry_later(&mut self, name: &str) {
        let delay = self.backoff.next_delay(name);
        metrics::counter!(metric_names::WORKQUEUE_RETRIES_TOTAL).increment(1);
        tracing::debug!(node = %name, ?delay, "retrying later");
        let queue = self.queue.clone();
        let name = name.to_owned();
        self.retries
            .spawn(async move { queue.push_after(name, delay).await });
    }
}

#[cfg(test)]
mod tests {
    use tokio::time::Instant;

    use super::*;

    /// A worker whose client points nowhere: `retry_later` never talks to the API.
    fn worker(retry_min_delay: Duration, retry_max_delay: Duration) -> Worker {
        let ipam = nodeipam_core::config::validate("10.244.0.0/16", "", Default::default())
            .expect("valid config");
        let client = super::super::client_for_url("http://127.0.0.1:9").expect("client");
        let (store, _writer) = reflector::store::<Node>();
        Worker {
            api: Api::all(client.clone()),
            store,
            allocator: Arc::new(Mutex::new(Allocator::new(&ipam).expect("pool"))),
            queue: Arc::new(WorkQueue::new()),
            recorder: Recorder::new(
                client,
                Reporter {
                    controller: CONTROLLER_NAME.to_owned(),
                    instance: None,
                },
            ),
            limiter: WriteLimiter::new(1.0, 1),
            health: Health::new(),
            request_timeout: Duration::from_secs(10),
            backoff: RetryBackoff::new(retry_min_delay, retry_max_delay),
            waiting: BTreeSet::new(),
            retries: JoinSet::new(),
            startup_events: Arc::default(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn retries_are_requeued_on_a_capped_exponential_schedule() {
        let second = Duration::from_secs(1);
        let mut worker = worker(second, second * 8);
        let start = Instant::now();
        let mut due = Duration::ZERO;
        for delay in [1, 2, 4, 8, 8] {
            worker.retry_later("node-a");
            assert_eq!(worker.queue.pop().await, "node-a");
            due += second * delay;
            assert_eq!(start.elapsed(), due, "retry after {delay}s");
        }
        // What every success path does: the next failure starts over at the minimum.
        worker.backoff.reset("node-a");
        worker.retry_later("node-a");
        assert_eq!(worker.queue.pop().await, "node-a");
        assert_eq!(start.elapsed(), due + second);
    }

    #[tokio::test(start_paused = true)]
    async fn each_node_retries_on_its_own_schedule() {
        let second = Duration::from_secs(1);
        let mut worker = worker(second, second * 60);
        worker.retry_later("node-a"); // 1 s
        assert_eq!(worker.queue.pop().await, "node-a");
        let start = Instant::now();
        worker.retry_later("node-a"); // 2 s
        worker.retry_later("node-b"); // 1 s: its first failure
        assert_eq!(worker.queue.pop().await, "node-b");
        assert_eq!(start.elapsed(), second);
        assert_eq!(worker.queue.pop().await, "node-a");
        assert_eq!(start.elapsed(), second * 2);
    }
}
