//! The event sink: events about Nodes are handed to a bounded queue and written by one task of
//! their own, with a token bucket of their own — never inline in a reconcile, never from the
//! Node PATCHes' budget.
//!
//! Semantics follow client-go's event path as kube-controller-manager uses it
//! (`k8s.io/client-go/tools/record`): the recorder never blocks its caller (the broadcaster's
//! queue holds `maxQueuedEvents` = 1,000 and drops when full), and the `EventCorrelator`'s
//! `EventSourceObjectSpamFilter` passes, per source and involved object (kind, namespace, name,
//! uid, API version — not the reason or the message), a burst of 25 events refilled at one per
//! 5 minutes (`defaultSpamBurst`, `defaultSpamQPS = 1/300`). Our source is always this controller,
//! so the spam filter is per Node object: name and uid. client-go's aggregation of similar events
//! is not copied: kube-rs's `Recorder` already folds a repeat of the same event into the series
//! of the first (a PATCH of its count), and the spam filter bounds how often that happens.
//!
//! Both kinds of drop are counted in `node_ipam_controller_events_dropped_total{reason}`
//! (`spam_filter`, `queue_full`); events are best effort, as upstream's.

use std::sync::Arc;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::NoOpMiddleware;
use governor::state::keyed::HashMapStateStore;
use governor::{Quota, RateLimiter};
use k8s_openapi::api::core::v1::ObjectReference;
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use tokio::sync::mpsc;

use super::WriteLimiter;
use super::quiescence::{Outstanding, OutstandingItem};

use crate::metric_names;
use crate::reconcile::{EventKind, EventSpec, NodeName};

/// Events queued for writing at most (client-go's `maxQueuedEvents`); more are dropped.
pub const EVENT_QUEUE_CAPACITY: usize = 1000;
/// Events one Node may get at once before the spam filter holds them back (client-go's
/// `defaultSpamBurst`).
pub const SPAM_BURST: u32 = 25;
/// After the burst, one more event per Node per this period (client-go's `defaultSpamQPS`,
/// 1/300 per second).
pub const SPAM_REFILL: Duration = Duration::from_secs(300);
/// `retain_recent` (forgetting Nodes whose bucket is full again) runs once per this many checks,
/// so the filter's map does not keep every Node ever seen.
const SPAM_SWEEP_EVERY: u64 = 4096;

/// [`metric_names::LABEL_REASON`] of a drop by the spam filter.
pub const DROPPED_SPAM_FILTER: &str = "spam_filter";
/// [`metric_names::LABEL_REASON`] of a drop because the queue was full.
pub const DROPPED_QUEUE_FULL: &str = "queue_full";

/// The spam filter's key: the Node's name and uid (client-go's involved object).
type SpamKey = (NodeName, Option<Arc<str>>);

/// One event waiting to be written.
#[derive(Debug)]
pub struct PendingEvent {
    /// The Node it is about.
    pub node: NodeName,
    /// The Node's uid, if known.
    pub uid: Option<Arc<str>>,
    /// The event.
    pub event: EventSpec,
    /// Counted as outstanding ([`super::Quiescence`]) until written or dropped.
    _outstanding: OutstandingItem,
}

/// The reconciling side of the sink: [`EventSink::publish`] never waits.
pub struct EventSink<C: Clock = DefaultClock> {
    queue: mpsc::Sender<PendingEvent>,
    spam: RateLimiter<SpamKey, HashMapStateStore<SpamKey>, C, NoOpMiddleware<C::Instant>>,
    checks: std::sync::atomic::AtomicU64,
    /// Events queued or being written ([`super::Quiescence`]).
    outstanding: Outstanding,
}

impl EventSink {
    /// A sink queuing at most `capacity` events (at least 1), and the receiving end for
    /// [`write_events`].
    pub fn new(capacity: usize) -> (EventSink, mpsc::Receiver<PendingEvent>) {
        EventSink::with_clock(capacity, DefaultClock::default())
    }
}

impl<C: Clock> EventSink<C> {
    /// The count of events queued or being written (each counts until written or dropped).
    pub(super) fn outstanding(&self) -> Outstanding {
        self.outstanding.clone()
    }

    /// As [`EventSink::new`], the spam filter reading time from `clock` (tests).
    pub fn with_clock(capacity: usize, clock: C) -> (EventSink<C>, mpsc::Receiver<PendingEvent>) {
        let (queue, receiver) = mpsc::channel(capacity.max(1));
        let burst = std::num::NonZeroU32::new(SPAM_BURST).unwrap_or(std::num::NonZeroU32::MIN);
        let quota = Quota::with_period(SPAM_REFILL)
            .unwrap_or_else(|| Quota::per_second(std::num::NonZeroU32::MIN))
            .allow_burst(burst);
        let sink = EventSink {
            queue,
            spam: RateLimiter::hashmap_with_clock(quota, clock),
            checks: std::sync::atomic::AtomicU64::new(0),
            outstanding: Outstanding::default(),
        };
        (sink, receiver)
    }

    /// Queues `event` about Node `node` (object `uid`) for writing, unless the Node's spam
    /// filter holds it back or the queue is full (then it is dropped and counted). Never waits.
    /// Returns whether it was queued.
    pub fn publish(&self, node: &NodeName, uid: Option<&str>, event: &EventSpec) -> bool {
        let uid: Option<Arc<str>> = uid.map(Arc::from);
        let key = (node.clone(), uid.clone());
        let checks = self
            .checks
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        if checks % SPAM_SWEEP_EVERY == SPAM_SWEEP_EVERY - 1 {
            self.spam.retain_recent();
        }
        if self.spam.check_key(&key).is_err() {
            dropped(DROPPED_SPAM_FILTER);
            tracing::debug!(node = %node, reason = event.reason, "event held back by the per-Node spam filter");
            return false;
        }
        let pending = PendingEvent {
            node: node.clone(),
            uid,
            event: event.clone(),
            _outstanding: self.outstanding.item(),
        };
        match self.queue.try_send(pending) {
            Ok(()) => true,
            Err(mpsc::error::TrySendError::Full(_)) => {
                dropped(DROPPED_QUEUE_FULL);
                tracing::debug!(node = %node, reason = event.reason, "event queue full; event dropped");
                false
            }
            // The writer is gone (stopping): nothing to count.
            Err(mpsc::error::TrySendError::Closed(_)) => false,
        }
    }
}

fn dropped(reason: &'static str) {
    metrics::counter!(metric_names::EVENTS_DROPPED_TOTAL, metric_names::LABEL_REASON => reason)
        .increment(1);
}

/// Writes queued events one at a time, each after a token of `limiter` (the events' own bucket)
/// and bounded by `request_timeout`, until every [`EventSink`] is gone. A failed write is logged
/// and not retried (best effort, as client-go's sink after its retries).
pub async fn write_events(
    mut queue: mpsc::Receiver<PendingEvent>,
    recorder: Recorder,
    limiter: WriteLimiter,
    request_timeout: Duration,
) {
    while let Some(pending) = queue.recv().await {
        limiter.acquire_untracked().await;
        write_one(&recorder, &pending, request_timeout).await;
    }
}

async fn write_one(recorder: &Recorder, pending: &PendingEvent, request_timeout: Duration) {
    let event = &pending.event;
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
    let reference = ObjectReference {
        api_version: Some("v1".to_owned()),
        kind: Some("Node".to_owned()),
        name: Some(pending.node.to_string()),
        uid: pending.uid.as_deref().map(str::to_owned),
        ..ObjectReference::default()
    };
    let node = &pending.node;
    match tokio::time::timeout(request_timeout, recorder.publish(&kube_event, &reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(error)) => {
            tracing::warn!(node = %node, error = %crate::kube_error::error_chain(&error), reason = event.reason, "publishing an event failed");
        }
        Err(_) => {
            tracing::warn!(node = %node, reason = event.reason, "publishing an event timed out");
        }
    }
}

#[cfg(test)]
mod tests {
    use governor::clock::FakeRelativeClock;
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

    use super::*;
    use crate::reasons;

    fn not_available(node: &str) -> EventSpec {
        EventSpec {
            kind: EventKind::Warning,
            reason: reasons::CIDR_NOT_AVAILABLE,
            note: format!("Node {node}: no free block"),
            action: reasons::ACTION_ALLOCATE,
        }
    }

    fn dropped_count(handle: &PrometheusHandle, reason: &str) -> u64 {
        let prefix = format!(
            "{}{{{}=\"{reason}\"}} ",
            metric_names::EVENTS_DROPPED_TOTAL,
            metric_names::LABEL_REASON
        );
        handle
            .render()
            .lines()
            .find_map(|line| line.strip_prefix(&prefix)?.parse().ok())
            .unwrap_or(0)
    }

    /// client-go's spam filter: 25 events per Node at once, then one per 5 minutes; Nodes (and
    /// a re-created Node, a new uid) have their own buckets; the reason does not matter.
    #[test]
    fn spam_filter_passes_a_burst_of_25_per_node_then_one_per_5_minutes() {
        let clock = FakeRelativeClock::default();
        let (sink, mut queued) = EventSink::with_clock(10_000, clock.clone());
        let a: NodeName = "a".into();
        let b: NodeName = "b".into();
        let passed = (0..100)
            .filter(|_| sink.publish(&a, Some("uid-a"), &not_available("a")))
            .count();
        assert_eq!(passed, 25);
        assert!(
            sink.publish(&b, Some("uid-b"), &not_available("b")),
            "b has its own bucket"
        );
        assert!(
            sink.publish(&a, Some("uid-a2"), &not_available("a")),
            "a re-created Node (new uid) has its own bucket"
        );
        let mut other_reason = not_available("a");
        other_reason.reason = reasons::CIDR_ASSIGNMENT_FAILED;
        assert!(
            !sink.publish(&a, Some("uid-a"), &other_reason),
            "per object, not per reason"
        );

        clock.advance(SPAM_REFILL - Duration::from_secs(1));
        assert!(!sink.publish(&a, Some("uid-a"), &not_available("a")));
        clock.advance(Duration::from_secs(1));
        assert!(
            sink.publish(&a, Some("uid-a"), &not_available("a")),
            "one refilled"
        );
        assert!(!sink.publish(&a, Some("uid-a"), &not_available("a")));

        let mut count = 0;
        while queued.try_recv().is_ok() {
            count += 1;
        }
        assert_eq!(count, 25 + 1 + 1 + 1, "queued exactly what passed");
    }

    /// A full queue drops (never waits) and counts each drop by reason.
    #[test]
    fn a_full_queue_drops_and_counts_and_never_waits() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        metrics::with_local_recorder(&recorder, || {
            let (sink, mut queued) = EventSink::with_clock(3, FakeRelativeClock::default());
            let passed = (0..10)
                .filter(|i| {
                    let node: NodeName = format!("n{i}").into();
                    sink.publish(&node, None, &not_available(&node))
                })
                .count();
            assert_eq!(passed, 3);
            let a: NodeName = "n0".into();
            drop(queued.try_recv());
            // n0's spam bucket still has tokens; the queue has room for one again.
            assert!(sink.publish(&a, None, &not_available("n0")));
            for _ in 0..30 {
                sink.publish(&"spammy".into(), None, &not_available("spammy"));
            }
        });
        assert_eq!(dropped_count(&handle, DROPPED_QUEUE_FULL), 7 + 30 - 5);
        assert_eq!(dropped_count(&handle, DROPPED_SPAM_FILTER), 5);
    }
}
