//! The Nodes waiting for a free block, in the order they started waiting, and who is woken when
//! blocks are freed.
//!
//! A waiting Node is not retried on a timer: each freed block wakes the longest-waiting Node that
//! has not been offered it yet ([`Waiters::freed`]). A woken Node that does not take a block (its
//! own pool is still full, the block went to a Node reconciled first, it was deleted meanwhile)
//! passes its wake to the next waiter in order ([`Waiters::settled`]), so a freed block is offered
//! to every waiter once before its wake ends, and never two at a time. This replaces the old
//! "wake every waiter" plus a retry of each every 250 ms–30 s: with 2,000 waiting, those retries and
//! their events took the whole write budget (issue 15, item 2).

use std::collections::{BTreeMap, HashMap, HashSet};

use crate::reconcile::NodeName;

/// Waiting Nodes in order, and the woken ones whose wake is not yet used.
#[derive(Debug, Default)]
pub struct Waiters {
    /// Not woken, by the sequence number of their first wait.
    asleep: BTreeMap<u64, NodeName>,
    /// Every waiting Node (asleep or woken) and its sequence number.
    seq_of: HashMap<NodeName, u64>,
    /// Woken and not yet reconciled.
    woken: HashSet<NodeName>,
    next_seq: u64,
}

impl Waiters {
    /// No Node waits.
    pub fn new() -> Waiters {
        Waiters::default()
    }

    /// Nodes waiting (asleep or woken).
    pub fn len(&self) -> usize {
        self.seq_of.len()
    }

    /// `count` blocks were freed: wakes the first `count` Nodes asleep, longest waiting first.
    /// Returns the Nodes to reconcile now.
    pub fn freed(&mut self, count: usize) -> Vec<NodeName> {
        self.wake_after(None, count)
    }

    /// `name` was reconciled: `still_waiting` if it found no free block again, `took_block` if it
    /// was given one. A woken Node that took no block passes its wake on to the next Node asleep
    /// after it in order (the Node to reconcile now is returned). A waiting Node keeps its place;
    /// a Node that no longer waits (served, deleted, skipped) leaves the list.
    pub fn settled(
        &mut self,
        name: &NodeName,
        still_waiting: bool,
        took_block: bool,
    ) -> Option<NodeName> {
        let was_woken = self.woken.remove(name);
        let seq = if still_waiting {
            let seq = match self.seq_of.get(name) {
                Some(seq) => *seq,
                None => {
                    let seq = self.next_seq;
                    self.next_seq += 1;
                    self.seq_of.insert(name.clone(), seq);
                    seq
                }
            };
            self.asleep.insert(seq, name.clone());
            Some(seq)
        } else {
            let seq = self.seq_of.remove(name);
            if let Some(seq) = seq {
                self.asleep.remove(&seq);
            }
            seq
        };
        if !was_woken || took_block {
            return None;
        }
        self.wake_after(seq, 1).pop()
    }

    fn wake_after(&mut self, after: Option<u64>, count: usize) -> Vec<NodeName> {
        let range = match after {
            Some(seq) => self
                .asleep
                .range((std::ops::Bound::Excluded(seq), std::ops::Bound::Unbounded)),
            None => self.asleep.range(..),
        };
        let picked: Vec<(u64, NodeName)> = range
            .take(count)
            .map(|(seq, name)| (*seq, name.clone()))
            .collect();
        picked
            .into_iter()
            .map(|(seq, name)| {
                self.asleep.remove(&seq);
                self.woken.insert(name.clone());
                name
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(name: &str) -> NodeName {
        name.into()
    }

    fn names(list: &[NodeName]) -> Vec<&str> {
        list.iter().map(|n| &**n).collect()
    }

    fn waiting(w: &mut Waiters, list: &[&str]) {
        for name in list {
            assert_eq!(w.settled(&n(name), true, false), None);
        }
    }

    #[test]
    fn a_free_wakes_the_longest_waiting_nodes_one_per_block() {
        let mut w = Waiters::new();
        waiting(&mut w, &["a", "b", "c", "d"]);
        // A retry of `b` while asleep keeps its place.
        waiting(&mut w, &["b"]);
        assert_eq!(names(&w.freed(1)), ["a"]);
        assert_eq!(names(&w.freed(2)), ["b", "c"], "a is already woken");
        assert_eq!(w.settled(&n("a"), false, true), None, "a took the block");
        assert_eq!(w.len(), 3);
        assert!(w.freed(0).is_empty());
    }

    /// A woken Node that takes no block hands the wake to the next in order, and keeps its own
    /// place; the wake ends after the last waiter.
    #[test]
    fn an_unused_wake_passes_to_the_next_waiter_once_around() {
        let mut w = Waiters::new();
        waiting(&mut w, &["a", "b", "c"]);
        assert_eq!(names(&w.freed(1)), ["a"]);
        assert_eq!(
            w.settled(&n("a"), true, false),
            Some(n("b")),
            "a still waits"
        );
        assert_eq!(
            w.settled(&n("b"), false, false),
            Some(n("c")),
            "b was deleted"
        );
        assert_eq!(w.settled(&n("c"), true, false), None, "every waiter tried");
        assert_eq!(w.len(), 2);
        // A later free starts from the front again: a keeps its place before c.
        assert_eq!(names(&w.freed(5)), ["a", "c"]);
    }

    /// A reconcile of a Node that was not woken (a watch update, the safety re-check) does not
    /// wake anyone; a Node that stops waiting leaves the order.
    #[test]
    fn only_woken_nodes_pass_wakes_on() {
        let mut w = Waiters::new();
        waiting(&mut w, &["a", "b"]);
        assert_eq!(w.settled(&n("a"), false, true), None);
        assert_eq!(w.settled(&n("x"), false, false), None, "never waited");
        assert_eq!(names(&w.freed(3)), ["b"]);
        assert!(w.freed(1).is_empty(), "b is woken already");
        assert_eq!(w.settled(&n("b"), false, true), None);
        assert_eq!(w.len(), 0);
    }
}
