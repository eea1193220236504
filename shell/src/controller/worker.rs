//! The dispatcher and its workers: Node names come off the work queue in order, the decision for
//! each is made at once under the allocator's lock (so allocation order is the queue's order, as
//! with one worker), and the I/O it needs — the PATCH, a re-read, events — runs on one of at most
//! `workers` concurrent tasks (upstream's `cidrUpdateWorkers`, 30; with write intents a few more
//! Nodes are decided ahead and wait for one of them, see [`dispatch`]). A hung request occupies one
//! worker, not the controller. The queue never hands one Node name to two workers at once.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use kube::{Api, Client};
use nodeipam_core::Cidr;
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::backoff::RetryBackoff;
use super::events::EventSink;
use super::gate::WriteGate;
use super::in_doubt::InDoubtWrites;
use super::informer::NodeCache;
use super::node::SlimNode;
use super::patch;
use super::waiters::Waiters;
use super::window::WriteWindow;
use super::{CONTROLLER_NAME, Health, WorkQueue, WriteLimiter};
use crate::kube_error::is_client_broken;
use crate::reconcile::{
    Action, Allocator, Decision, EventSpec, MetricEvent, Next, NodeName, PatchOutcome, join,
};
use crate::{Error, metric_names, metrics as m};

/// A waiting Node's safety re-check comes after this many times the retry delay cap
/// (`ControllerConfig::retry_max_delay`, 30 s by default: 5 minutes).
///
/// Every free wakes a waiting Node at once (`Waiters`), so the re-check is only a safety net: it
/// bounds how long a Node could wait if capacity came back by a path that does not report a
/// release (none is known; a future one would be caught here instead of leaving Nodes unserved for
/// good). By default, at 10,000 waiting Nodes it costs ~33 local reconciles per second and,
/// through the per-Node spam filter, at most one event per Node per 5 minutes — the filter's own
/// refill.
pub const WAITING_RECHECK_FACTOR: u32 = 10;

/// Settings of the dispatcher.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Concurrent workers (API writes in flight), at least 1.
    pub workers: usize,
    /// How long one request may take.
    pub request_timeout: Duration,
    /// When writes may start.
    pub write_gate: WriteGate,
    /// Where each write's unknown outcome is recorded (a stopping leader waits them out).
    pub in_doubt: Arc<InDoubtWrites>,
    /// How long a waiting Node sleeps if no freed block wakes it (see [`WAITING_RECHECK_FACTOR`]).
    pub waiting_recheck: Duration,
    /// How long a deleted Node's blocks stay reserved for its name
    /// (`--deleted-node-cidr-quarantine`; [`Next::EndQuarantine`]).
    pub deletion_quarantine: Duration,
}

/// What the dispatcher and the workers share. Built as a struct literal by `pipeline::run`
/// (each field says what it is); the allocator has done its start-up occupy.
pub struct Shared {
    pub(super) client: Client,
    /// Nodes, through [`Shared::client`].
    pub(super) api: Api<SlimNode>,
    pub(super) allocator: Arc<Mutex<Allocator>>,
    pub(super) cache: Arc<NodeCache>,
    pub(super) queue: Arc<WorkQueue>,
    /// Events go here: queued, spam-filtered per Node, written by a task of their own.
    pub(super) events: EventSink,
    /// The Node writes' token bucket (`--kube-api-qps`, `--kube-api-burst`).
    pub(super) limiter: WriteLimiter,
    /// Bounds our writes ahead of the Node watch.
    pub(super) window: Arc<WriteWindow>,
    pub(super) health: Health,
    pub(super) backoff: Mutex<RetryBackoff>,
    /// Nodes waiting for a free block, woken one per freed block.
    pub(super) waiters: Mutex<Waiters>,
    /// Start-up skip events, published on each Node's first reconcile.
    pub(super) startup_events: Mutex<HashMap<NodeName, Vec<EventSpec>>>,
    /// Rate limit of the exhaustion warning, per cluster CIDR
    /// ([`super::oplog::EXHAUSTION_WARNING_INTERVAL`]).
    pub(super) exhaustion_log: Mutex<super::oplog::PerPoolRateLimit>,
    pub(super) settings: WorkerSettings,
    /// Set when the client can no longer send anything (its request buffer lost its worker).
    pub(super) broken: watch::Sender<Option<String>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

impl Shared {
    /// The decision for `name` as the informer shows it now (or its removal if it is gone).
    fn decide(&self, name: &NodeName) -> (Decision, Option<Box<str>>) {
        let cached = self.cache.get(name);
        let mut uid = None;
        let decision = self.decided(name, |allocator| match cached {
            Some((key, node)) => {
                uid = node.uid.as_ref().map(|u| u.to_string().into_boxed_str());
                let in_doubt = in_doubt(allocator, name);
                let decision = allocator.decide(&node.view(&key));
                log_settled(allocator, name, in_doubt, &decision, "the watch");
                decision
            }
            None => allocator.remove(name),
        });
        (decision, uid)
    }

    /// Runs `decide` under the allocator's lock and, still under it, settles `name` among the
    /// waiting Nodes and wakes waiters for the blocks the decision freed: a block freed by
    /// another task can then never fall between a Node's failed allocation and its wait (the wake
    /// would be lost, and with no periodic retry the Node would sleep until the safety re-check).
    /// Every decision goes through here, whichever path made it.
    fn decided(
        &self,
        name: &NodeName,
        decide: impl FnOnce(&mut Allocator) -> Decision,
    ) -> Decision {
        let mut allocator = lock(&self.allocator);
        let decision = decide(&mut allocator);
        // A write intent stays in the Lease exactly while its Node's allocation is pending: once
        // it is not, no write of it can change anything (`leader::intents`).
        if let Some(intents) = &self.settings.write_gate.intents
            && !allocator.is_pending(name)
        {
            intents.settle(name);
        }
        let freed: usize = decision
            .metrics
            .iter()
            .map(|m| match m {
                MetricEvent::Released { blocks, .. } => *blocks as usize,
                _ => 0,
            })
            .sum();
        let still_waiting = decision.next == Next::WaitForFreeBlock;
        let took_block = matches!(decision.action, Action::Assign { .. });
        let mut waiters = lock(&self.waiters);
        let mut wake: Vec<NodeName> = waiters
            .settled(name, still_waiting, took_block)
            .into_iter()
            .collect();
        if freed > 0 {
            wake.extend(waiters.freed(freed));
        }
        drop(waiters);
        if !wake.is_empty() {
            let mut backoff = lock(&self.backoff);
            for waiter in wake {
                tracing::debug!(node = %waiter, freed_by = %name, "a block may be free: waking a waiting Node");
                backoff.reset(&waiter);
                self.queue.add_urgent(waiter);
            }
        }
        drop(allocator);
        decision
    }

    /// Whether `decision` needs no I/O (no event, no write, no retry): applied by the dispatcher.
    fn is_local(decision: &Decision) -> bool {
        decision.events.is_empty()
            && !matches!(decision.action, Action::Assign { .. })
            && matches!(decision.next, Next::Done)
    }

    /// Finishes a decision that needs no I/O ([`Shared::is_local`]) on the dispatcher: the same
    /// bookkeeping as any other ([`Shared::settle`]), then `name` is done in the queue.
    fn finish_local(&self, name: &NodeName, decision: &Decision) {
        self.settle(name, decision);
        self.queue.done(name);
    }

    /// Applies a decision's events and everything [`Shared::settle`] does (everything but its
    /// patch).
    fn apply(&self, name: &NodeName, uid: Option<&str>, decision: &Decision) {
        self.settle(name, decision);
        for event in &decision.events {
            self.publish(name, uid, event);
        }
    }

    /// The bookkeeping every decision gets, whether it needs I/O or not (the dispatcher's no-I/O
    /// path and [`Shared::apply`] both come here): its metrics; after a pool change, the pool
    /// figures (gauges, health) and, for a freed block, the exhaustion warning's rate limit;
    /// its log line; and its next step (backoff reset or a re-queue).
    fn settle(&self, name: &NodeName, decision: &Decision) {
        let mut pool_changed = false;
        for metric in &decision.metrics {
            m::apply(metric);
            match metric {
                MetricEvent::Released { cluster_cidr, .. } => {
                    pool_changed = true;
                    lock(&self.exhaustion_log).reset(*cluster_cidr);
                }
                MetricEvent::Allocated { .. }
                | MetricEvent::Occupied { .. }
                | MetricEvent::NodeSkipped { .. } => {
                    pool_changed = true;
                }
                _ => {}
            }
        }
        match &decision.action {
            Action::Skip { reason } if !decision.events.is_empty() => {
                tracing::warn!(node = %name, %reason, "skipping Node");
            }
            Action::Fail { reason } => {
                tracing::debug!(node = %name, %reason, "no pod CIDR available for the Node; waiting for one to be freed");
                self.warn_exhausted(name, reason, decision);
            }
            Action::KeepTrying { reason, .. } => {
                tracing::warn!(node = %name, %reason, "writing spec.podCIDRs did not succeed");
            }
            // A Node occupied with a diagnostic finding (R08, R10, R11), e.g. a podCIDR with
            // host bits written by another party while the controller runs.
            Action::Keep { pod_cidrs } => {
                for event in &decision.events {
                    tracing::warn!(node = %name, pod_cidrs = %join(pod_cidrs), reason = event.reason, note = %event.note, "Node's podCIDRs kept with a diagnostic finding");
                }
            }
            Action::Released { pod_cidrs } if !pod_cidrs.is_empty() => {
                tracing::info!(node = %name, pod_cidrs = %join(pod_cidrs), "released pod CIDRs");
            }
            _ => {}
        }
        // Waiting Nodes were settled and woken when the decision was made (`decided`).
        if pool_changed {
            self.report_pool();
        }
        match decision.next {
            Next::Done => {
                if !matches!(decision.action, Action::Assign { .. }) {
                    lock(&self.backoff).reset(name);
                }
            }
            Next::RetryBackoff => self.retry_later(name),
            Next::RetryAfter(delay) => {
                metrics::counter!(metric_names::WORKQUEUE_RETRIES_TOTAL).increment(1);
                self.queue.add_after(name.clone(), delay);
            }
            // Woken by a freed block; the slow re-check is only a safety net
            // (`WAITING_RECHECK_FACTOR`).
            Next::WaitForFreeBlock => {
                metrics::counter!(metric_names::WORKQUEUE_RETRIES_TOTAL).increment(1);
                self.queue
                    .add_after(name.clone(), self.settings.waiting_recheck);
            }
            // Handled by the caller: it re-reads the Node.
            Next::Reread => {}
            // The shell only times the quarantine: the name is reconciled again when it is over,
            // and the allocator decides (released if the Node is still gone).
            Next::EndQuarantine => {
                tracing::info!(node = %name, quarantine = ?self.settings.deletion_quarantine, "Node deleted: its pod CIDRs stay reserved for its name for the quarantine");
                self.queue
                    .add_after(name.clone(), self.settings.deletion_quarantine);
            }
        }
    }

    /// The exhaustion warning: at most one per cluster CIDR per
    /// [`super::oplog::EXHAUSTION_WARNING_INTERVAL`], naming the pool, its usage, how many Nodes
    /// wait and this Node; a failure that is not an exhaustion warns every time. When several
    /// cluster CIDRs of a family are exhausted at once, each one's limit is checked (a block freed
    /// in any of them resets its own) and the first that is due is named.
    fn warn_exhausted(&self, name: &NodeName, reason: &str, decision: &Decision) {
        let exhausted: Vec<Cidr> = decision
            .metrics
            .iter()
            .filter_map(|m| match m {
                MetricEvent::Exhausted { cluster_cidr } => Some(*cluster_cidr),
                _ => None,
            })
            .collect();
        if exhausted.is_empty() {
            tracing::warn!(node = %name, %reason, "no pod CIDR could be allocated for the Node");
            return;
        }
        let due = {
            let mut log = lock(&self.exhaustion_log);
            let now = Instant::now();
            let due: Vec<(Cidr, u64)> = exhausted
                .iter()
                .filter_map(|c| log.check(*c, now).map(|suppressed| (*c, suppressed)))
                .collect();
            due.first().copied()
        };
        let Some((cluster_cidr, suppressed)) = due else {
            return;
        };
        let stats = lock(&self.allocator)
            .pool_stats()
            .into_iter()
            .find(|s| s.cluster_cidr == cluster_cidr);
        let waiting = lock(&self.waiters).len().max(1);
        tracing::warn!(
            %cluster_cidr,
            capacity = stats.map_or(0, |s| s.capacity_blocks),
            used = stats.map_or(0, |s| s.used_blocks),
            free = stats.map_or(0, |s| s.free_blocks),
            waiting,
            node = %name,
            suppressed,
            %reason,
            "cluster CIDR exhausted: Nodes wait for a pod CIDR until one is freed"
        );
    }

    /// Publishes the pool figures (gauges, health) as the allocator has them now. Read and
    /// published under the allocator's lock: two workers reporting at once would otherwise publish
    /// in either order, and the older figures could stay published for good (found by the chaos
    /// suite, seed 1672: usage 6 blocks below the Nodes' after settling).
    pub(super) fn report_pool(&self) {
        let allocator = lock(&self.allocator);
        let pools = allocator.pool_stats();
        m::set_pool_gauges(&pools, allocator.skipped_count());
        self.health.set_pools(pools);
    }

    fn retry_later(&self, name: &NodeName) {
        let delay = lock(&self.backoff).next_delay(name);
        metrics::counter!(metric_names::WORKQUEUE_RETRIES_TOTAL).increment(1);
        tracing::debug!(node = %name, ?delay, "retrying later");
        self.queue.add_after(name.clone(), delay);
    }

    /// Carries out a decision that needs I/O — its requests once it holds one of the `io`
    /// permits (at most `workers` at once) — then marks `name` done in the queue.
    async fn carry_out(
        self: Arc<Self>,
        name: NodeName,
        uid: Option<Box<str>>,
        decision: Decision,
        io: Arc<Semaphore>,
    ) {
        let startup = lock(&self.startup_events).remove(&name);
        for event in startup.iter().flatten() {
            self.publish(&name, uid.as_deref(), event);
        }
        self.apply(&name, uid.as_deref(), &decision);
        let needs_io =
            matches!(decision.action, Action::Assign { .. }) || decision.next == Next::Reread;
        // Never closed: an error cannot happen, and would only mean no bound.
        let _io = if needs_io {
            io.acquire().await.ok()
        } else {
            None
        };
        if let Action::Assign {
            pod_cidrs,
            uid: write_uid,
        } = &decision.action
        {
            self.write(&name, write_uid.as_deref(), pod_cidrs.clone())
                .await;
        } else if decision.next == Next::Reread {
            self.check_with_server(&name).await;
        }
        self.queue.done(&name);
    }

    /// The informer's copy of `name` may be older than what the API server last answered for it:
    /// GETs the Node, decides on that, and writes what that decision assigns.
    async fn check_with_server(&self, name: &NodeName) {
        let record_uid = lock(&self.allocator).record_uid(name);
        let Some(decision) = self.reread(name, record_uid.as_deref()).await else {
            self.retry_later(name);
            return;
        };
        self.apply(name, decision.subject_uid(record_uid.as_deref()), &decision);
        match &decision.action {
            Action::Assign { pod_cidrs, uid } => {
                self.write(name, uid.as_deref(), pod_cidrs.clone()).await;
            }
            // Still behind after the GET (another change meanwhile): try again later.
            _ if decision.next == Next::Reread => self.retry_later(name),
            _ => {}
        }
    }

    /// PATCHes `pod_cidrs` to Node `name` (object `uid`) and applies what follows from the
    /// outcome: a re-read after a refusal, and the allocation for a replaced Node.
    async fn write(&self, name: &NodeName, uid: Option<&str>, mut pod_cidrs: Vec<Cidr>) {
        let mut uid: Option<String> = uid.map(str::to_owned);
        // At most a few rounds: a refusal leads to a re-read, whose decision may be a new
        // allocation (a re-created Node), whose write may be refused again; then backoff.
        for _round in 0..3 {
            // A slot of the write window first: our writes never run further ahead of the
            // watch than it can follow (no 410 of our own making).
            let Some(slot) = self.window.enter().await else {
                tracing::debug!(node = %name, "stopping: not writing");
                return;
            };
            self.limiter.acquire().await;
            // The write's intent in the Lease before anything is sent: whenever the PATCH
            // arrives, a successor knows it (issue 30; `leader::intents`).
            let gate = &self.settings.write_gate;
            if !gate.record_intent(name, uid.as_deref(), &pod_cidrs).await {
                self.window.written(slot, None);
                tracing::warn!(node = %name, "not writing: this replica no longer holds the Lease");
                return;
            }
            // The write gate last, with nothing to wait for between it and the request: the
            // window and the token bucket can hold a write for seconds, and a write let through
            // before them would reach the API server after the Lease could have passed to a
            // standby (bug 12, RELIABILITY.md) — harmless now that its intent is in the Lease,
            // but a leader that cannot renew should stop writing (liveness).
            if !gate.wait().await {
                self.window.written(slot, None);
                tracing::warn!(node = %name, "not writing: this replica no longer holds the Lease");
                return;
            }
            let patch::PatchResult {
                outcome,
                resource_version,
                broken,
            } = patch::assign_pod_cidrs(
                &self.client,
                CONTROLLER_NAME,
                name,
                (&pod_cidrs, uid.as_deref()),
                self.settings.request_timeout,
            )
            .await;
            self.window.written(slot, resource_version.as_deref());
            self.settings.in_doubt.record(
                name,
                Instant::now(),
                self.settings.request_timeout,
                &outcome,
            );
            if let Some(why) = broken {
                let _ = self.broken.send(Some(why));
            }
            if let PatchOutcome::Applied(_) = &outcome {
                tracing::info!(node = %name, pod_cidrs = %join(&pod_cidrs), "assigned pod CIDRs");
            }
            let decision = self.decided(name, |allocator| {
                allocator.patch_outcome(name, uid.as_deref(), &pod_cidrs, outcome)
            });
            self.apply(name, uid.as_deref(), &decision);
            if decision.next != Next::Reread {
                return;
            }
            let Some(decision) = self.reread(name, uid.as_deref()).await else {
                self.retry_later(name);
                return;
            };
            self.apply(name, decision.subject_uid(uid.as_deref()), &decision);
            match decision.action {
                Action::Assign {
                    pod_cidrs: next,
                    uid: next_uid,
                } => {
                    pod_cidrs = next;
                    uid = next_uid;
                }
                _ => return,
            }
        }
        self.retry_later(name);
    }

    /// GETs Node `name` and decides on what the API server shows (`None` if the GET failed).
    async fn reread(&self, name: &NodeName, uid: Option<&str>) -> Option<Decision> {
        self.limiter.acquire().await;
        let get = async { read_outcome(self.api.get(name).await) };
        let read = tokio::time::timeout(self.settings.request_timeout, get).await;
        match read {
            Ok(Ok(Some(node))) => Some(self.decided(name, |allocator| {
                let in_doubt = in_doubt(allocator, name);
                let decision = allocator.decide_fresh(&node.view());
                log_settled(allocator, name, in_doubt, &decision, "a re-read");
                decision
            })),
            Ok(Ok(None)) => Some(self.decided(name, |allocator| allocator.object_gone(name, uid))),
            Ok(Err(error)) => {
                if is_client_broken(&error) {
                    let _ = self
                        .broken
                        .send(Some(crate::kube_error::error_chain(&error)));
                }
                tracing::warn!(node = %name, error = %crate::kube_error::error_chain(&error), "re-reading the Node failed; retrying later");
                None
            }
            Err(_) => {
                tracing::warn!(node = %name, "re-reading the Node timed out; retrying later");
                None
            }
        }
    }

    /// Hands `event` to the event sink (per-Node spam filter, bounded queue, a writer task with
    /// its own token bucket): never waits, never spends the PATCH budget.
    fn publish(&self, name: &NodeName, uid: Option<&str>, event: &EventSpec) {
        self.events.publish(name, uid, event);
    }
}

/// Takes Node names off the queue until `stop`, deciding for each in queue order and running
/// its I/O on at most `workers` concurrent tasks; then waits for the tasks in flight (each bounded
/// by the request timeout). A panicking task is reported as an error.
///
/// With write intents it decides up to `WriteGate::decide_ahead` Nodes more than it has workers
/// and records each assignment's intent at once (`WriteGate::record_ahead`): those Nodes wait
/// for a worker in decision order (a fair semaphore), and one Lease write commits the intents of
/// many of them (issue 30 item 5). Their blocks are reserved from the decision on, as a worker's
/// are; a stop sends none of them (the write window is closed first).
///
/// # Errors
/// [`Error::TaskFailed`] if a worker task panicked.
pub async fn dispatch(shared: Arc<Shared>, mut stop: watch::Receiver<bool>) -> Result<(), Error> {
    let workers = shared.settings.workers.max(1);
    let slots = Arc::new(Semaphore::new(
        workers.saturating_add(shared.settings.write_gate.decide_ahead()),
    ));
    let io = Arc::new(Semaphore::new(workers));
    let mut tasks: JoinSet<()> = JoinSet::new();
    let mut failure = None;
    loop {
        while let Some(joined) = tasks.try_join_next() {
            if let Err(e) = joined {
                failure = Some(e.to_string());
            }
        }
        if failure.is_some() {
            break;
        }
        let permit = tokio::select! {
            biased;
            () = super::stopped(&mut stop) => break,
            permit = slots.clone().acquire_owned() => match permit {
                Ok(permit) => permit,
                Err(_) => break,
            },
        };
        let name = tokio::select! {
            biased;
            () = super::stopped(&mut stop) => break,
            name = shared.queue.get() => match name {
                Some(name) => name,
                None => break,
            },
        };
        let (decision, uid) = shared.decide(&name);
        let has_startup_events = lock(&shared.startup_events).contains_key(&name);
        if Shared::is_local(&decision) && !has_startup_events {
            shared.finish_local(&name, &decision);
            continue;
        }
        if let Action::Assign {
            pod_cidrs,
            uid: write_uid,
        } = &decision.action
        {
            let gate = &shared.settings.write_gate;
            gate.record_ahead(&name, write_uid.as_deref(), pod_cidrs);
        }
        let shared = shared.clone();
        let io = io.clone();
        tasks.spawn(async move {
            shared.carry_out(name, uid, decision, io).await;
            drop(permit);
        });
    }
    // Finish what is in flight (a started PATCH is not abandoned).
    while let Some(joined) = tasks.join_next().await {
        if let Err(e) = joined {
            failure.get_or_insert_with(|| e.to_string());
        }
    }
    match failure {
        Some(reason) => Err(Error::TaskFailed {
            task: "a node CIDR update worker",
            reason,
        }),
        None => Ok(()),
    }
}

/// The CIDRs of Node `name`'s pending write whose outcome is unknown (it may have been applied
/// without us knowing), if it has one.
fn in_doubt(allocator: &Allocator, name: &NodeName) -> Option<Vec<Cidr>> {
    if allocator.is_maybe_sent(name) {
        allocator.held(name).map(<[Cidr]>::to_vec)
    } else {
        None
    }
}

/// Logs a write whose outcome was unknown ([`in_doubt`] before the decision) that `by` (the
/// watch, a re-read) now shows applied: the line the PATCH's own answer would have given.
fn log_settled(
    allocator: &Allocator,
    name: &NodeName,
    in_doubt: Option<Vec<Cidr>>,
    decision: &Decision,
    by: &str,
) {
    if let (Some(sent), Action::Keep { pod_cidrs }) = (in_doubt, &decision.action)
        && sent == *pod_cidrs
        && !allocator.is_pending(name)
    {
        tracing::info!(node = %name, pod_cidrs = %join(pod_cidrs), settled_by = by, "assigned pod CIDRs (the write's outcome was unknown; {by} shows it applied)");
    }
}

/// A re-read's GET as "the Node" / "no such Node" / failed. Not `kube::Api::get_opt`: it reads
/// any 404 as "no such object", where only kube-apiserver's NotFound about a Node says so
/// ([`super::patch::is_node_not_found`]); another 404 (a proxy's page) is a failed read, retried.
fn read_outcome<T>(got: Result<T, kube::Error>) -> Result<Option<T>, kube::Error> {
    match got {
        Ok(node) => Ok(Some(node)),
        Err(kube::Error::Api(status)) if super::patch::is_node_not_found(&status) => Ok(None),
        Err(error) => Err(error),
    }
}

#[cfg(test)]
mod tests {
    use nodeipam_core::NodeMaskFlags;

    use super::*;

    use crate::test_support::{logged, node_view as view};

    #[test]
    fn only_the_api_servers_not_found_about_a_node_reads_as_no_node() {
        use kube::core::Status;
        use kube::core::response::StatusDetails;
        let api = |status: Status| read_outcome::<()>(Err(kube::Error::Api(Box::new(status))));
        let mut not_found = Status::failure("nodes \"n\" not found", "NotFound").with_code(404);
        not_found.details = Some(StatusDetails {
            name: "n".to_owned(),
            group: String::new(),
            kind: "nodes".to_owned(),
            uid: String::new(),
            causes: Vec::new(),
            retry_after_seconds: 0,
        });
        assert!(matches!(api(not_found), Ok(None)));
        let proxy = Status::failure("404 page not found", "").with_code(404);
        assert!(
            matches!(api(proxy), Err(kube::Error::Api(_))),
            "a proxy's 404 is a failed read"
        );
        let bare = Status::failure("injected fault", "NotFound").with_code(404);
        assert!(
            matches!(api(bare), Err(kube::Error::Api(_))),
            "NotFound about nothing"
        );
        assert!(matches!(read_outcome::<u8>(Ok(7)), Ok(Some(7))));
    }

    /// A `Shared` around `allocator` whose client answers every request with 500 (the tests
    /// below make no request), an empty informer cache and a fresh queue.
    fn shared(allocator: Allocator) -> Shared {
        let service = tower::service_fn(|_request: http::Request<kube::client::Body>| async {
            Ok::<_, std::convert::Infallible>(
                http::Response::builder()
                    .status(500)
                    .body(kube::client::Body::empty())
                    .expect("response"),
            )
        });
        let client = Client::new(service, "default");
        let (events, _queued) = EventSink::new(16);
        Shared {
            api: Api::all(client.clone()),
            client,
            allocator: Arc::new(Mutex::new(allocator)),
            cache: Arc::new(NodeCache::new()),
            queue: Arc::new(WorkQueue::new()),
            events,
            limiter: WriteLimiter::new(100.0, 100),
            window: Arc::new(WriteWindow::new(8)),
            health: Health::new(),
            backoff: Mutex::new(RetryBackoff::new(
                Duration::from_millis(10),
                Duration::from_secs(1),
            )),
            waiters: Mutex::new(Waiters::new()),
            startup_events: Mutex::new(HashMap::new()),
            exhaustion_log: Mutex::new(super::super::oplog::PerPoolRateLimit::new(
                super::super::oplog::EXHAUSTION_WARNING_INTERVAL,
            )),
            settings: WorkerSettings {
                workers: 1,
                request_timeout: Duration::from_secs(1),
                write_gate: WriteGate {
                    not_before: Instant::now(),
                    lease: None,
                    write_duration: Duration::from_secs(1),
                    intents: None,
                },
                in_doubt: Arc::new(InDoubtWrites::new()),
                waiting_recheck: Duration::from_secs(10),
                deletion_quarantine: Duration::ZERO,
            },
            broken: watch::channel(None).0,
        }
    }

    /// A client whose API server answers a PATCH of a Node after `delay` with `node` (a
    /// fixture Node) carrying the patched `spec.podCIDR(s)`, counting the PATCHes in `patches`
    /// and telling `arrived` when one comes in; any other request gets 500.
    fn patching_client(
        node: serde_json::Value,
        delay: Duration,
        arrived: Arc<tokio::sync::Notify>,
        patches: Arc<std::sync::atomic::AtomicUsize>,
    ) -> Client {
        let service = tower::service_fn(move |request: http::Request<kube::client::Body>| {
            let (mut node, arrived, patches) = (node.clone(), arrived.clone(), patches.clone());
            async move {
                if request.method() != http::Method::PATCH {
                    let refused = http::Response::builder()
                        .status(500)
                        .body(kube::client::Body::empty())
                        .expect("response");
                    return Ok::<_, std::convert::Infallible>(refused);
                }
                let body = http_body_util::BodyExt::collect(request.into_body())
                    .await
                    .expect("body")
                    .to_bytes();
                let patch: serde_json::Value = serde_json::from_slice(&body).expect("JSON");
                patches.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                arrived.notify_one();
                tokio::time::sleep(delay).await;
                node["spec"]["podCIDR"] = patch["spec"]["podCIDR"].clone();
                node["spec"]["podCIDRs"] = patch["spec"]["podCIDRs"].clone();
                node["metadata"]["resourceVersion"] = "2".into();
                let answer = serde_json::to_vec(&node).expect("JSON");
                Ok(http::Response::builder()
                    .status(200)
                    .header("content-type", "application/json")
                    .body(kube::client::Body::from(answer))
                    .expect("response"))
            }
        });
        Client::new(service, "default")
    }

    /// A worker stops on the stop signal with no write left in doubt: a PATCH already sent when
    /// stop comes is waited for (not abandoned), its answer is applied — the Node holds its
    /// block, nothing is pending — and `dispatch` returns `Ok`.
    #[tokio::test(start_paused = true)]
    async fn a_stop_waits_for_the_write_in_flight() {
        let fixture: serde_json::Value = serde_json::from_str(include_str!(
            "../../../fixtures/nodes/07-eks-2nodes-no-podcidr.json"
        ))
        .expect("fixture");
        let node = fixture["items"][0].clone();
        let name: NodeName = node["metadata"]["name"].as_str().expect("name").into();
        let config = nodeipam_core::config::validate("10.244.0.0/16", "", NodeMaskFlags::default())
            .expect("valid");
        let arrived = Arc::new(tokio::sync::Notify::new());
        let patches = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut shared = shared(Allocator::new(&config).expect("pool"));
        shared.client = patching_client(
            node.clone(),
            Duration::from_millis(300),
            arrived.clone(),
            patches.clone(),
        );
        let slim: SlimNode = serde_json::from_value(node).expect("Node");
        shared.cache.apply(&slim);
        shared.queue.add(name.clone());
        let shared = Arc::new(shared);
        let (stop, stopped) = watch::channel(false);
        let dispatcher = tokio::spawn(dispatch(shared.clone(), stopped));
        arrived.notified().await;
        stop.send_replace(true);
        let ended = dispatcher.await.expect("joined");
        assert!(ended.is_ok(), "{ended:?}");
        assert_eq!(patches.load(std::sync::atomic::Ordering::SeqCst), 1);
        let allocator = lock(&shared.allocator);
        assert_eq!(
            allocator.held(&name).map(<[Cidr]>::to_vec),
            Some(vec!["10.244.0.0/24".parse().expect("CIDR")]),
        );
        assert!(!allocator.is_pending(&name) && !allocator.is_maybe_sent(&name));
        assert!(shared.settings.in_doubt.pending(Instant::now()).is_none());
    }

    /// A Node deleted while its cluster CIDR is full: the dispatcher finishes the release without
    /// I/O, and must do the same bookkeeping `apply` does — the pool figures show the freed
    /// block, and the exhaustion warning's rate limit is reset so the next exhaustion is logged
    /// at once (the no-I/O path used to refresh the figures but keep the rate limit, so the
    /// warning after a freed block could stay suppressed for up to a minute).
    #[tokio::test]
    async fn a_release_without_io_settles_as_apply_does() {
        let config = nodeipam_core::config::validate("10.244.0.0/24", "", NodeMaskFlags::default())
            .expect("valid");
        let cluster_cidr = config.cluster_cidrs[0].cluster_cidr;
        let shared = shared(Allocator::new(&config).expect("pool"));
        let holder: NodeName = "a".into();
        let waiting: NodeName = "b".into();
        let kept = lock(&shared.allocator).decide(&view("a", &["10.244.0.0/24"]));
        shared.apply(&holder, None, &kept);
        let failed = shared.decided(&waiting, |a| a.decide(&view("b", &[])));
        assert!(matches!(failed.action, Action::Fail { .. }), "{failed:?}");
        // Logged (and rate-limited from now on).
        shared.apply(&waiting, None, &failed);
        assert_eq!(shared.health.pools()[0].free_blocks, 0);

        // "a" is not in the informer's cache: the decision is its release, with no I/O.
        let (released, uid) = shared.decide(&holder);
        assert_eq!(uid, None);
        assert!(Shared::is_local(&released), "{released:?}");
        shared.finish_local(&holder, &released);

        assert_eq!(shared.health.pools()[0].free_blocks, 1);
        assert_eq!(
            lock(&shared.exhaustion_log).check(cluster_cidr, Instant::now()),
            Some(0),
            "the next exhaustion warning is let through"
        );
    }

    /// Two IPv4 cluster CIDRs, both full: a block freed in the second lets the next exhaustion
    /// warning through at once (the limit was checked only for the first CIDR the decision
    /// named, so a freed block in the second left it suppressed for up to a minute).
    #[tokio::test]
    async fn a_block_freed_in_a_later_cluster_cidr_lets_the_exhaustion_warning_through() {
        let config = nodeipam_core::config::validate(
            "10.244.0.0/24,10.245.0.0/24",
            "",
            NodeMaskFlags::default(),
        )
        .expect("valid");
        let text = logged(|| {
            let shared = shared(Allocator::new(&config).expect("pool"));
            for (name, cidr) in [("a", "10.244.0.0/24"), ("b", "10.245.0.0/24")] {
                let kept = lock(&shared.allocator).decide(&view(name, &[cidr]));
                shared.apply(&name.into(), None, &kept);
            }
            let waiting: NodeName = "c".into();
            let fail = |shared: &Shared| {
                let failed = shared.decided(&waiting, |a| a.decide(&view("c", &[])));
                assert!(matches!(failed.action, Action::Fail { .. }), "{failed:?}");
                shared.apply(&waiting, None, &failed);
            };
            fail(&shared);
            fail(&shared);
            // "b" (in the second cluster CIDR) goes; "a" is put back at once.
            let released = lock(&shared.allocator).remove("b");
            shared.apply(&"b".into(), None, &released);
            let kept = lock(&shared.allocator).decide(&view("b2", &["10.245.0.0/24"]));
            shared.apply(&"b2".into(), None, &kept);
            fail(&shared);
        });
        let warnings = text.matches("cluster CIDR exhausted").count();
        assert_eq!(warnings, 2, "{text}");
    }

    /// The watch settling a write whose PATCH ended with an unknown outcome logs the assignment
    /// (it logged nothing: only an answered PATCH did); the watch showing other podCIDRs (another
    /// writer's) does not claim an assignment.
    #[test]
    fn a_write_settled_by_the_watch_is_logged() {
        let config = nodeipam_core::config::validate("10.244.0.0/16", "", NodeMaskFlags::default())
            .expect("valid");
        let text = logged(|| {
            let mut allocator = Allocator::new(&config).expect("pool");
            for (name, seen) in [("e", "10.244.0.0/24"), ("f", "10.244.7.0/24")] {
                let Action::Assign { pod_cidrs, .. } = allocator.decide(&view(name, &[])).action
                else {
                    panic!("assigns");
                };
                let unknown = PatchOutcome::Unknown {
                    message: "connection dropped".to_owned(),
                };
                allocator.patch_outcome(name, Some(&format!("uid-{name}")), &pod_cidrs, unknown);
                let name: NodeName = name.into();
                let doubt = in_doubt(&allocator, &name);
                assert_eq!(doubt.as_deref(), Some(pod_cidrs.as_slice()));
                let decision = allocator.decide(&view(&name, &[seen]));
                log_settled(&allocator, &name, doubt, &decision, "the watch");
            }
        });
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1, "{text}");
        assert!(
            lines[0].contains(
                "assigned pod CIDRs (the write's outcome was unknown; the watch shows it applied)"
            ),
            "{text}"
        );
        assert!(
            lines[0].contains("node=e") && lines[0].contains("pod_cidrs=10.244.0.0/24"),
            "{text}"
        );
    }
}
