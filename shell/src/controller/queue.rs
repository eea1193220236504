//! The work queue of Node names between the informer and the workers, with client-go
//! `workqueue` semantics (`k8s.io/client-go/util/workqueue/queue.go`):
//! - a name is queued at most once however many events arrive for it (the *dirty* set);
//! - a name handed out by [`WorkQueue::get`] is *processing* until [`WorkQueue::done`]; adding it
//!   meanwhile only marks it dirty, and `done` queues it again — so one Node name is never in two
//!   workers at once, and an event that arrives during its reconcile is not lost;
//! - [`WorkQueue::add_after`] queues a name after a delay (retries), keeping only the earliest
//!   pending delay per name;
//! - the time from [`WorkQueue::get`] to [`WorkQueue::done`] is observed as the work duration
//!   (client-go's `workqueue_work_duration_seconds`, processing start times kept per name, here
//!   [`metric_names::WORKQUEUE_WORK_DURATION_SECONDS`]);
//! - it is unbounded: adding never waits, so the informer always keeps reading its watch stream.
//!   Its size is bounded by the number of distinct Node names anyway.
//!
//! One addition of ours: an *urgent* lane ([`WorkQueue::add_urgent`]), served before the ordinary
//! one. Deletions (they release blocks) and Nodes woken because a block was freed go there, so a
//! freed block reaches a waiting Node without queuing behind thousands of other names (issue 15,
//! item 2: at 2,000 waiting Nodes the deletion waited 47–98 s at the back of one FIFO). The
//! ordinary lane keeps its FIFO order, so allocation order is unchanged.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metric_names;
use crate::reconcile::NodeName;

/// Capacity (names) above which a drained queue gives its room back.
const SHRINK_ABOVE: usize = 1024;

/// A de-duplicated FIFO of Node names with per-name exclusivity and delayed adds.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    /// Woken by every change a waiting [`WorkQueue::get`] may care about.
    changed: Notify,
}

#[derive(Default)]
struct State {
    /// Names ready to be handed out, in order.
    ready: VecDeque<NodeName>,
    /// Urgent names ready to be handed out, in order, before any of `ready`.
    urgent: VecDeque<NodeName>,
    /// Processing names added urgently meanwhile: `done` queues them in the urgent lane.
    urgent_after_done: HashSet<NodeName>,
    /// Names that need processing (ready, or processing and to be queued again when done).
    dirty: HashSet<NodeName>,
    /// Names handed out and not yet done, with when each was handed out.
    processing: HashMap<NodeName, Instant>,
    /// Delayed adds: (due, sequence, name), earliest first.
    delayed: BinaryHeap<Reverse<(Instant, u64, NodeName)>>,
    /// The earliest pending delayed add per name (later ones for the same name are dropped).
    due: HashMap<NodeName, Instant>,
    next_sequence: u64,
    shutting_down: bool,
}

impl State {
    fn add(&mut self, name: NodeName) -> bool {
        if self.shutting_down || self.dirty.contains(&name) {
            return false;
        }
        self.dirty.insert(name.clone());
        if self.processing.contains_key(&name) {
            return false;
        }
        self.ready.push_back(name);
        true
    }

    /// Queues `name` in the urgent lane (moving it there if it waits in the ordinary one).
    fn add_urgent(&mut self, name: NodeName) -> bool {
        if self.shutting_down {
            return false;
        }
        if self.processing.contains_key(&name) {
            self.dirty.insert(name.clone());
            self.urgent_after_done.insert(name);
            return false;
        }
        if self.dirty.contains(&name) {
            if self.urgent.contains(&name) {
                return false;
            }
            // Waiting in the ordinary lane: take it out (a scan, but only for a name that is
            // queued there; deletions and wakes are rare next to ordinary adds).
            if let Some(at) = self.ready.iter().position(|n| *n == name) {
                self.ready.remove(at);
            }
        }
        self.dirty.insert(name.clone());
        self.urgent.push_back(name);
        true
    }

    /// The next name to hand out: urgent ones first.
    fn pop_next(&mut self) -> Option<NodeName> {
        self.urgent.pop_front().or_else(|| self.ready.pop_front())
    }

    /// Names ready to be handed out, both lanes.
    fn ready_len(&self) -> usize {
        self.ready.len() + self.urgent.len()
    }

    /// Moves every delayed add that is due at `now` into the ready queue.
    fn promote_due(&mut self, now: Instant) {
        while let Some(Reverse((due, _, _))) = self.delayed.peek() {
            if *due > now {
                break;
            }
            let Some(Reverse((due, _, name))) = self.delayed.pop() else {
                break;
            };
            // Only the earliest delayed add per name is live; others were superseded.
            if self.due.get(&name) == Some(&due) {
                self.due.remove(&name);
                self.add(name);
            }
        }
    }

    /// After a burst (every Node queued at start-up or after a re-list) the queue is drained:
    /// give back the room it no longer needs (at 50,000 Nodes the ready list and the dirty set
    /// held ~2 MB of empty capacity).
    fn shrink(&mut self) {
        if self.ready.capacity() > SHRINK_ABOVE {
            self.ready.shrink_to_fit();
        }
        if self.urgent.capacity() > SHRINK_ABOVE {
            self.urgent.shrink_to_fit();
        }
        if self.dirty.capacity() > SHRINK_ABOVE && self.dirty.len() < SHRINK_ABOVE / 2 {
            self.dirty.shrink_to_fit();
        }
    }

    fn next_due(&self) -> Option<Instant> {
        self.delayed.peek().map(|Reverse((due, _, _))| *due)
    }
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> WorkQueue {
        WorkQueue::default()
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn report_depth(state: &State) {
        metrics::gauge!(metric_names::WORKQUEUE_DEPTH).set(state.ready_len() as f64);
    }

    /// Makes room for `additional` more queued names at once (every Node of a list about to be
    /// queued), so the ready list and the dirty set are not grown by doubling while they are
    /// added: the ready list gets exactly the room asked for instead of the next power of two (at
    /// 150,000 Nodes 2.3 MiB instead of 4 MiB), and neither keeps an old copy beside the new one.
    /// Changes nothing else: what is queued, and in which order, is up to the adds that follow.
    pub fn reserve(&self, additional: usize) {
        let mut state = self.state();
        state.ready.reserve(additional);
        state.dirty.reserve(additional);
    }

    /// Queues `name` unless it is already waiting (or processing: then it is queued again when
    /// [`WorkQueue::done`]). Never waits. Ignored after [`WorkQueue::shut_down`].
    pub fn add(&self, name: NodeName) {
        let mut state = self.state();
        if state.add(name) {
            Self::report_depth(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Queues `name` ahead of every ordinary name (after earlier urgent ones): a deletion, or a
    /// Node woken because a block was freed. A name already queued in the ordinary lane moves to
    /// the urgent one; a processing name is queued urgently when [`WorkQueue::done`]. Never waits.
    /// Ignored after [`WorkQueue::shut_down`].
    pub fn add_urgent(&self, name: NodeName) {
        let mut state = self.state();
        if state.add_urgent(name) {
            Self::report_depth(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Queues `name` once `delay` has passed (tokio time). Until then events for it are still
    /// delivered at once. If an earlier delayed add of `name` is pending, this one is dropped.
    pub fn add_after(&self, name: NodeName, delay: Duration) {
        if delay.is_zero() {
            return self.add(name);
        }
        let due = Instant::now() + delay;
        let mut state = self.state();
        if state.shutting_down || state.due.get(&name).is_some_and(|d| *d <= due) {
            return;
        }
        state.due.insert(name.clone(), due);
        let sequence = state.next_sequence;
        state.next_sequence += 1;
        state.delayed.push(Reverse((due, sequence, name)));
        drop(state);
        // The waiting `get` may need to wake earlier than it planned.
        self.changed.notify_one();
    }

    /// Takes the next ready name, waiting for one (delayed adds become ready when due). The name
    /// is *processing* until [`WorkQueue::done`]. `None` once the queue is shut down.
    pub async fn get(&self) -> Option<NodeName> {
        loop {
            let changed = self.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let next_due = {
                let mut state = self.state();
                if state.shutting_down {
                    return None;
                }
                state.promote_due(Instant::now());
                if let Some(name) = state.pop_next() {
                    state.dirty.remove(&name);
                    state.processing.insert(name.clone(), Instant::now());
                    if state.ready_len() == 0 {
                        state.shrink();
                    }
                    Self::report_depth(&state);
                    return Some(name);
                }
                state.next_due()
            };
            match next_due {
                Some(due) => {
                    tokio::select! {
                        () = &mut changed => {}
                        () = tokio::time::sleep_until(due) => {}
                    }
                }
                None => changed.await,
            }
        }
    }

    /// `name`'s reconcile is over: if it was added meanwhile, it is queued again.
    pub fn done(&self, name: &NodeName) {
        let mut state = self.state();
        if let Some(started) = state.processing.remove(name) {
            metrics::histogram!(metric_names::WORKQUEUE_WORK_DURATION_SECONDS)
                .record(started.elapsed().as_secs_f64());
        }
        let urgent = state.urgent_after_done.remove(name);
        if state.dirty.contains(name) && !state.shutting_down {
            if urgent {
                state.urgent.push_back(name.clone());
            } else {
                state.ready.push_back(name.clone());
            }
            Self::report_depth(&state);
            drop(state);
            self.changed.notify_one();
        }
    }

    /// Stops handing out names: a waiting [`WorkQueue::get`] returns `None`, adds are ignored.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.changed.notify_waiters();
        self.changed.notify_one();
    }

    /// Names ready to be handed out now (both lanes).
    pub fn len(&self) -> usize {
        self.state().ready_len()
    }

    /// Whether no name is ready.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Names handed out and not yet done.
    pub fn processing(&self) -> usize {
        self.state().processing.len()
    }

    /// Delayed adds still pending.
    pub fn delayed(&self) -> usize {
        self.state().due.len()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use futures::poll;
    use tokio::time::{advance, timeout};

    use super::*;

    /// Far longer than anything in these tests; under paused time it costs nothing.
    const FOREVER: Duration = Duration::from_secs(24 * 3600);

    fn n(name: &str) -> NodeName {
        name.into()
    }

    async fn get(queue: &WorkQueue) -> NodeName {
        timeout(FOREVER, queue.get())
            .await
            .expect("a name is ready")
            .expect("not shut down")
    }

    #[tokio::test(start_paused = true)]
    async fn deduplicates_and_keeps_order() {
        let queue = WorkQueue::new();
        for name in ["a", "b", "a", "c", "b"] {
            queue.add(n(name));
        }
        assert_eq!(queue.len(), 3);
        for want in ["a", "b", "c"] {
            let got = get(&queue).await;
            assert_eq!(&*got, want);
            queue.done(&got);
        }
        assert!(queue.is_empty());
        assert!(
            timeout(FOREVER, queue.get()).await.is_err(),
            "no second delivery"
        );
    }

    /// A reserved burst: the ready list gets exactly the room asked for (one by one it grows to
    /// the next power of two, 1,024 here), and the adds that follow keep their order and
    /// de-duplication.
    #[tokio::test(start_paused = true)]
    async fn reserve_sizes_a_burst_exactly_and_changes_no_order() {
        let queue = WorkQueue::new();
        queue.reserve(1000);
        let names: Vec<NodeName> = (0..1000).map(|i| n(&format!("node-{i}"))).collect();
        for name in names.iter().chain(&names[..10]) {
            queue.add(name.clone());
        }
        {
            let state = queue.state();
            assert!(
                (1000..1024).contains(&state.ready.capacity()),
                "ready capacity {}",
                state.ready.capacity()
            );
            assert!(state.dirty.capacity() >= 1000);
        }
        assert_eq!(queue.len(), 1000);
        for want in &names {
            let got = get(&queue).await;
            assert_eq!(&got, want);
            queue.done(&got);
        }
        assert!(queue.is_empty());
    }

    /// One Node name is never handed to two workers at once; an add during processing is kept
    /// and delivered after `done`.
    #[tokio::test(start_paused = true)]
    async fn a_processing_name_is_held_back_until_done() {
        let queue = WorkQueue::new();
        queue.add(n("a"));
        let a = get(&queue).await;
        queue.add(n("a"));
        queue.add(n("b"));
        assert_eq!(&*get(&queue).await, "b", "a is still processing");
        assert!(
            timeout(FOREVER, queue.get()).await.is_err(),
            "a is not handed out twice"
        );
        queue.done(&a);
        assert_eq!(
            &*get(&queue).await,
            "a",
            "the add during processing is kept"
        );
    }

    /// Urgent names (deletions, woken waiters) go before every ordinary one, in their own
    /// order; an urgent add of a name queued in the ordinary lane moves it, without a second
    /// delivery; one added urgently while processing comes back urgently after `done`.
    #[tokio::test(start_paused = true)]
    async fn urgent_names_go_first_and_are_delivered_once() {
        let queue = WorkQueue::new();
        for i in 0..5 {
            queue.add(n(&format!("retry-{i}")));
        }
        queue.add_urgent(n("deleted"));
        queue.add_urgent(n("retry-3"));
        queue.add_urgent(n("deleted"));
        assert_eq!(queue.len(), 6, "retry-3 moved, not copied; deleted once");
        let order: Vec<NodeName> = {
            let mut order = Vec::new();
            for _ in 0..6 {
                let name = get(&queue).await;
                queue.done(&name);
                order.push(name);
            }
            order
        };
        let order: Vec<&str> = order.iter().map(|n| &**n).collect();
        assert_eq!(
            order,
            [
                "deleted", "retry-3", "retry-0", "retry-1", "retry-2", "retry-4"
            ]
        );
        assert!(timeout(FOREVER, queue.get()).await.is_err(), "nothing else");

        queue.add(n("a"));
        let a = get(&queue).await;
        queue.add(n("b"));
        queue.add_urgent(n("a"));
        queue.done(&a);
        assert_eq!(&*get(&queue).await, "a", "urgent again after done");
        assert_eq!(&*get(&queue).await, "b");
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_delivers_at_the_delay_not_before() {
        let queue = Arc::new(WorkQueue::new());
        let start = Instant::now();
        queue.add_after(n("a"), Duration::from_secs(5));
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.get().await })
        };
        advance(Duration::from_millis(4999)).await;
        assert!(!waiter.is_finished(), "not before the delay");
        let got = waiter.await.expect("joined").expect("a name");
        assert_eq!(&*got, "a");
        assert_eq!(start.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn the_earliest_delayed_add_wins_and_later_ones_are_dropped() {
        let queue = WorkQueue::new();
        let start = Instant::now();
        queue.add_after(n("a"), Duration::from_secs(10));
        queue.add_after(n("a"), Duration::from_secs(2));
        queue.add_after(n("a"), Duration::from_secs(7));
        assert_eq!(queue.delayed(), 1);
        let a = get(&queue).await;
        assert_eq!(start.elapsed(), Duration::from_secs(2));
        queue.done(&a);
        assert!(
            timeout(FOREVER, queue.get()).await.is_err(),
            "the superseded 10 s add does not fire"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn an_event_before_the_retry_is_delivered_at_once() {
        let queue = WorkQueue::new();
        queue.add_after(n("a"), Duration::from_secs(30));
        let start = Instant::now();
        queue.add(n("a"));
        let a = get(&queue).await;
        assert_eq!(start.elapsed(), Duration::ZERO);
        queue.done(&a);
        // The retry still fires (a harmless extra reconcile, as in client-go).
        let _ = get(&queue).await;
        assert_eq!(start.elapsed(), Duration::from_secs(30));
    }

    #[tokio::test(start_paused = true)]
    async fn a_waiting_get_wakes_for_an_earlier_delayed_add() {
        let queue = Arc::new(WorkQueue::new());
        queue.add_after(n("late"), Duration::from_secs(60));
        let start = Instant::now();
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.get().await })
        };
        tokio::task::yield_now().await;
        queue.add_after(n("soon"), Duration::from_secs(1));
        let got = waiter.await.expect("joined").expect("a name");
        assert_eq!(&*got, "soon");
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn shut_down_wakes_the_waiting_get_and_ignores_adds() {
        let queue = Arc::new(WorkQueue::new());
        let waiter = {
            let queue = queue.clone();
            tokio::spawn(async move { queue.get().await })
        };
        tokio::task::yield_now().await;
        let mut waiter = std::pin::pin!(waiter);
        assert!(poll!(&mut waiter).is_pending());
        queue.shut_down();
        assert_eq!(waiter.await.expect("joined"), None);
        queue.add(n("a"));
        assert!(queue.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn adding_never_waits_however_many_names() {
        let queue = WorkQueue::new();
        for i in 0..50_000 {
            queue.add(format!("node-{i}").into());
        }
        assert_eq!(queue.len(), 50_000);
        assert_eq!(&*get(&queue).await, "node-0");
    }

    /// The work duration (client-go's `workqueue_work_duration_seconds`) is the time from `get`
    /// to `done`, observed once per item, in client-go's buckets.
    #[tokio::test(start_paused = true)]
    async fn work_duration_is_observed_from_get_to_done() {
        let recorder = crate::metrics::prometheus_builder().build_recorder();
        let handle = recorder.handle();
        let _guard = metrics::set_default_local_recorder(&recorder);
        let queue = WorkQueue::new();
        queue.add(n("a"));
        let a = get(&queue).await;
        advance(Duration::from_millis(250)).await;
        queue.done(&a);
        // A name never handed out is not observed.
        queue.done(&n("b"));
        let text = handle.render();
        let value = |series: &str| {
            text.lines()
                .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
                .unwrap_or_else(|| panic!("{series} not in:\n{text}"))
                .to_owned()
        };
        let name = metric_names::WORKQUEUE_WORK_DURATION_SECONDS;
        assert_eq!(value(&format!("{name}_count")), "1");
        assert_eq!(value(&format!("{name}_sum")), "0.25");
        assert_eq!(value(&format!("{name}_bucket{{le=\"0.1\"}}")), "0");
        assert_eq!(value(&format!("{name}_bucket{{le=\"1\"}}")), "1");
        assert_eq!(value(&format!("{name}_bucket{{le=\"0.00000001\"}}")), "0");
    }
}
