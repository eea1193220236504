//! The de-duplicated, bounded work queue of Node names between the watcher and the allocator
//! task: an `embassy-sync` [`Channel`] (executor-agnostic, driven by tokio here) plus the set of
//! names currently queued, so a name is queued at most once however many events arrive.

use std::collections::HashSet;
use std::sync::{Mutex, PoisonError};

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

    /// Queues `name` unless it is already waiting; waits while the queue is full.
    pub async fn push(&self, name: String) {
        {
            let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
            if !queued.insert(name.clone()) {
                return;
            }
            metrics::gauge!(metric_names::WORKQUEUE_DEPTH).set(queued.len() as f64);
        }
        self.channel.send(name).await;
    }

    /// Takes the next name, waiting for one. Once taken, the name can be queued again (so an
    /// event that arrives during its reconcile is not lost).
    pub async fn pop(&self) -> String {
        let name = self.channel.receive().await;
        let mut queued = self.queued.lock().unwrap_or_else(PoisonError::into_inner);
        queued.remove(&name);
        metrics::gauge!(metric_names::WORKQUEUE_DEPTH).set(queued.len() as f64);
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

#[cfg(test)]
mod tests {
    use super::*;

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
}
