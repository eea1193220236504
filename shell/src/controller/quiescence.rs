//! A test-only signal: whether the running controller has, for now, nothing left to do — no Node
//! ready in the work queue, none being decided or written (a name is *processing* from the
//! dispatcher's `get` until its worker is done, its PATCH answered or timed out), no event queued
//! or being written, and the ClusterCIDR writer between rounds with no change it has not looked
//! at (issue 34). End-to-end tests wait for it before a negative assertion ("a restart writes
//! nothing") instead of sleeping: every write the controller decides on what it has seen is sent
//! before it is quiet.
//!
//! What it does not cover, by design: changes the informers have received but not yet queued
//! (a test makes no change of its own before waiting), and retries delayed to later
//! ([`Quiescence::is_quiet`] does not wait for them; a waiting Node always has one).
//!
//! Not part of the controller's contract: `#[doc(hidden)]`, and compiled in always — a cargo
//! feature turned on by the test crate would build the library twice in `.ci/run` (with and
//! without it), which is what issue 34 wants less of. Its cost when nobody looks: a few atomic
//! counters, touched once per event and once per ClusterCIDR round.

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use super::WorkQueue;

/// A cheap, cloneable handle on the running term's activity ([`ControllerConfig::quiescence`]:
/// the controller fills it when a term starts allocating and empties it when the term ends).
///
/// [`ControllerConfig::quiescence`]: super::ControllerConfig::quiescence
#[doc(hidden)]
#[derive(Debug, Clone, Default)]
pub struct Quiescence {
    term: Arc<Mutex<Option<Term>>>,
}

/// The parts of one allocating term that can have work in hand.
struct Term {
    queue: Arc<WorkQueue>,
    events: Outstanding,
    rounds: Option<Arc<Rounds>>,
}

impl std::fmt::Debug for Term {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Term")
            .field("ready", &self.queue.len())
            .field("processing", &self.queue.processing())
            .field("events", &self.events.count())
            .field("rounds", &self.rounds)
            .finish()
    }
}

impl Quiescence {
    /// Whether a term is allocating and has nothing in hand (see the module docs). `false` when
    /// no term runs (not yet started, standing by, or stopped).
    pub fn is_quiet(&self) -> bool {
        let term = self.term.lock().unwrap_or_else(PoisonError::into_inner);
        term.as_ref().is_some_and(|term| {
            term.queue.is_empty()
                && term.queue.processing() == 0
                && term.events.count() == 0
                && term.rounds.as_ref().is_none_or(|r| r.caught_up())
        })
    }

    /// A term started allocating with these parts.
    pub(super) fn started(
        &self,
        queue: Arc<WorkQueue>,
        events: Outstanding,
        rounds: Option<Arc<Rounds>>,
    ) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = Some(Term {
            queue,
            events,
            rounds,
        });
    }

    /// The term ended.
    pub(super) fn ended(&self) {
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = None;
    }
}

/// A count of work items not finished yet: each [`Outstanding::item`] counts until dropped.
#[derive(Debug, Clone, Default)]
pub(super) struct Outstanding(Arc<AtomicUsize>);

impl Outstanding {
    /// One more item, counted until the guard is dropped.
    pub(super) fn item(&self) -> OutstandingItem {
        self.0.fetch_add(1, Ordering::AcqRel);
        OutstandingItem(self.0.clone())
    }

    fn count(&self) -> usize {
        self.0.load(Ordering::Acquire)
    }
}

/// One counted item of an [`Outstanding`]; uncounted when dropped.
#[derive(Debug)]
pub(super) struct OutstandingItem(Arc<AtomicUsize>);

impl Drop for OutstandingItem {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The ClusterCIDR writer's rounds: how many were asked for (one at start, one per change the
/// watch applied), how many of those a finished round covered, and whether one is running.
#[derive(Debug)]
pub(super) struct Rounds {
    wanted: AtomicU64,
    covered: AtomicU64,
    running: AtomicBool,
}

impl Default for Rounds {
    /// The first round is owed from the start.
    fn default() -> Rounds {
        Rounds {
            wanted: AtomicU64::new(1),
            covered: AtomicU64::new(0),
            running: AtomicBool::new(false),
        }
    }
}

impl Rounds {
    /// A change the writer must look at (called before it is woken).
    pub(super) fn want(&self) {
        self.wanted.fetch_add(1, Ordering::AcqRel);
    }

    /// A round starts: returns what it covers (pass it to [`Rounds::finish`]).
    pub(super) fn start(&self) -> u64 {
        self.running.store(true, Ordering::Release);
        self.wanted.load(Ordering::Acquire)
    }

    /// The round that started with `covers` ended.
    pub(super) fn finish(&self, covers: u64) {
        self.covered.fetch_max(covers, Ordering::AcqRel);
        self.running.store(false, Ordering::Release);
    }

    fn caught_up(&self) -> bool {
        !self.running.load(Ordering::Acquire)
            && self.covered.load(Ordering::Acquire) >= self.wanted.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::NodeName;

    #[test]
    fn a_round_covers_only_the_changes_asked_for_before_it_started() {
        let rounds = Rounds::default();
        assert!(!rounds.caught_up(), "the first round is owed");
        let covers = rounds.start();
        assert!(!rounds.caught_up(), "a round is running");
        rounds.want();
        rounds.finish(covers);
        assert!(!rounds.caught_up(), "a change came during the round");
        let covers = rounds.start();
        rounds.finish(covers);
        assert!(rounds.caught_up());
    }

    #[tokio::test]
    async fn quiet_needs_a_term_no_queued_or_processing_node_and_no_outstanding_event() {
        let quiescence = Quiescence::default();
        assert!(!quiescence.is_quiet(), "no term runs");
        let queue = Arc::new(WorkQueue::new());
        let events = Outstanding::default();
        quiescence.started(queue.clone(), events.clone(), None);
        assert!(quiescence.is_quiet());
        queue.add(NodeName::from("a"));
        assert!(!quiescence.is_quiet(), "a Node is ready");
        let a = queue.get().await.expect("queued");
        assert!(!quiescence.is_quiet(), "a Node is processing");
        queue.done(&a);
        assert!(quiescence.is_quiet());
        let item = events.item();
        assert!(!quiescence.is_quiet(), "an event is outstanding");
        drop(item);
        assert!(quiescence.is_quiet());
        quiescence.ended();
        assert!(!quiescence.is_quiet(), "the term ended");
    }
}
