//! The de-duplicated, bounded work queue of Node names between the watcher and the allocator
//! task: an `embassy-sync` [`Channel`] (executor-agnostic, driven by tokio here) plus the set of
//! names currently queued, so a name is queued at most once however many events arrive.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::channel::Channel;

use crate::metric_names;

/// Queue capacity, in Node names. A full queue makes producers wait (backpressure on the watch).
pub const QUEUE_CAPACITY: usize = 1024;

/// A bounded FIFO of Node names with de-duplication.
pub struct WorkQueue {
    channel: Channel<CriticalSectionRawMutex, String, QUEUE_CAPACITY>,
    queued: Mutex<HashSet<String>>,
}

impl Default for WorkQueue {
    fn default() -> Self {
        WorkQueue::new()
    }
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> WorkQueue {
        WorkQueue {
            channel: Channel::new(),
            queued: Mutex::new(HashSet::new()),
        }
    }

    /// Queues `name` unless it is already waiting; waits while the queue is full (a name whose
    /// push is waiting counts as waiting). Cancel-safe: if this future is dropped before the name
    /// entered the channel, the name is forgotten, so a later push of it is not lost as a
    /// "duplicate".
    pub async fn push(&self, name: String) {
        {
            let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if !queued.insert(name.clone()) {
                return;
            }
            metrics::gauge!(metric_names::WORKQUEUE_DEPTH).set(queued.len() as f64);
        }
        let mut reservation = Reservation {
            queue: self,
            name: Some(name.clone()),
        };
        self.channel.send(name).await;
        reservation.name = None;
    }

    fn forget(&self, name: &str) {
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        queued.remove(name);
        metrics::gauge!(metric_names::WORKQUEUE_DEPTH).set(queued.len() as f64);
    }

    /// Waits `delay` (tokio time), then [`push`](WorkQueue::push)es `name`: a retry. Until then
    /// `name` is not queued, so events for it are still delivered at once.
    pub async fn push_after(&self, name: String, delay: Duration) {
        tokio::time::sleep(delay).await;
        self.push(name).await;
    }

    /// Takes the next name, waiting for one. Once taken, the name can be queued again (so an
    /// event that arrives during its reconcile is not lost).
    pub async fn pop(&self) -> String {
        let name = self.channel.receive().await;
        self.forget(&name);
        name
    }

    /// Names waiting.
    pub fn len(&self) -> usize {
        self.queued
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .len()
    }

    /// Whether no name is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A name recorded as queued whose send has not completed yet; dropping it un-records the name.
struct Reservation<'a> {
    queue: &'a WorkQueue,
    name: Option<String>,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        if let Some(name) = self.name.take() {
            self.queue.forget(&name);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::poll;
    use tokio::time::{Instant, advance, timeout};

    use super::*;

    /// Far longer than anything in these tests; under paused time it costs nothing.
    const FOREVER: Duration = Duration::from_secs(24 * 3600);

    #[tokio::test]
    async fn deduplicates_and_keeps_order() {
        let queue = WorkQueue::new();
        queue.push("a".into()).await;
        queue.push("b".into()).await;
        queue.push("a".into()).await;
        assert_eq!(queue.len(), 2);
        assert_eq!(queue.pop().await, "a");
        queue.push("a".into()).await;
        assert_eq!(queue.pop().await, "b");
        assert_eq!(queue.pop().await, "a");
        assert!(queue.is_empty());
    }

    /// A push cancelled while the queue is full must not leave the name marked as queued.
    #[tokio::test(start_paused = true)]
    async fn a_cancelled_push_does_not_swallow_later_pushes() {
        let queue = WorkQueue::new();
        for i in 0..QUEUE_CAPACITY {
            queue.push(format!("n{i}")).await;
        }
        let cancelled = timeout(Duration::from_secs(1), queue.push("late".into())).await;
        assert!(cancelled.is_err(), "the queue is full: the push must wait");
        assert_eq!(
            queue.len(),
            QUEUE_CAPACITY,
            "the cancelled name is forgotten"
        );
        assert_eq!(queue.pop().await, "n0");
        queue.push("late".into()).await;
        assert_eq!(queue.len(), QUEUE_CAPACITY);
        for i in 1..QUEUE_CAPACITY {
            assert_eq!(queue.pop().await, format!("n{i}"));
        }
        assert_eq!(queue.pop().await, "late");
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn a_name_queued_twice_is_delivered_once_while_pending() {
        let queue = WorkQueue::new();
        for _ in 0..3 {
            queue.push("a".into()).await;
        }
        assert_eq!(queue.pop().await, "a");
        assert!(queue.is_empty());
        assert!(
            timeout(FOREVER, queue.pop()).await.is_err(),
            "no second delivery"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_blocks_new_names_until_one_is_taken() {
        let queue = Arc::new(WorkQueue::new());
        for index in 0..QUEUE_CAPACITY {
            queue.push(format!("node-{index}")).await;
        }
        assert_eq!(queue.len(), QUEUE_CAPACITY);
        // A name already waiting is dropped at once, even when the queue is full.
        timeout(FOREVER, queue.push("node-7".into()))
            .await
            .expect("a duplicate never waits");

        let mut extra = tokio::spawn({
            let queue = queue.clone();
            async move { queue.push("extra".into()).await }
        });
        assert!(
            timeout(FOREVER, &mut extra).await.is_err(),
            "a new name waits while the queue is full"
        );

        assert_eq!(queue.pop().await, "node-0");
        timeout(FOREVER, &mut extra)
            .await
            .expect("a free slot lets the waiting producer in")
            .expect("joined");
        for index in 1..QUEUE_CAPACITY {
            assert_eq!(queue.pop().await, format!("node-{index}"));
        }
        assert_eq!(queue.pop().await, "extra", "FIFO behind the backlog");
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn push_after_delivers_at_the_delay_not_before() {
        let queue = WorkQueue::new();
        let delay = Duration::from_secs(5);
        let start = Instant::now();
        let retry = queue.push_after("a".into(), delay);
        let mut retry = std::pin::pin!(retry);
        assert!(poll!(&mut retry).is_pending(), "starts the timer");

        advance(delay - Duration::from_millis(1)).await;
        assert!(poll!(&mut retry).is_pending());
        assert!(queue.is_empty(), "not queued before the delay");

        advance(Duration::from_millis(1)).await;
        assert!(poll!(&mut retry).is_ready());
        assert_eq!(start.elapsed(), delay);
        assert_eq!(queue.pop().await, "a");
    }

    #[tokio::test(start_paused = true)]
    async fn push_after_of_a_pending_name_is_dropped() {
        let queue = WorkQueue::new();
        let retry = queue.push_after("a".into(), Duration::from_secs(1));
        let mut retry = std::pin::pin!(retry);
        assert!(poll!(&mut retry).is_pending());
        queue.push("a".into()).await;
        advance(Duration::from_secs(1)).await;
        assert!(poll!(&mut retry).is_ready());
        assert_eq!(queue.len(), 1, "the retry joined the pending entry");
        assert_eq!(queue.pop().await, "a");
        assert!(timeout(FOREVER, queue.pop()).await.is_err());
    }
}
