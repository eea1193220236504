//! How far the controller's own writes may run ahead of its Node watch.
//!
//! The API server keeps a bounded history of changes for watches (kube-apiserver's watch cache:
//! at least `--default-watch-cache-size`, 100, changes per resource). A watcher more changes
//! behind than that is answered `410 Gone` and must list every Node again — for 50,000 Nodes
//! hundreds of megabytes of JSON, during which further writes make the new watch fall behind too.
//! Without a bound, 30 concurrent writers can produce changes faster than one watch stream is
//! read on a busy machine (measured: twelve 410s and re-lists in a row at 50,000 Nodes against a
//! 1,000-change history).
//!
//! So a write takes a slot of the [`WriteWindow`] before it is sent and keeps it until the watch
//! has delivered the change it made: the slot is released once the informer has seen a
//! resourceVersion at least the one the API server answered the write with (watch events arrive
//! in resourceVersion order, and a consistent list includes every write acknowledged before it).
//! At most [`WRITES_AHEAD_OF_WATCH`] of our changes are then ever unseen, so the watch can only
//! fall behind by that many changes plus other writers' — never by a 410 of our own making. The
//! watch stream itself is never delayed: only writes wait.
//!
//! resourceVersions are compared as integers, as kube-apiserver's etcd storage defines them
//! (`storage.APIObjectVersioner`). A write answered without an integer resourceVersion, or
//! without a definite answer, releases its slot at once. A slot whose change the watch has not
//! delivered within [`UNSEEN_EXPIRY`] (a broken watch being re-opened) is released with a
//! warning, so a stalled watch slows writes down but cannot stop them for good.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Writes that may be in flight or applied but not yet seen on the watch: half the smallest
/// history kube-apiserver keeps per resource (`--default-watch-cache-size` 100), so other writers'
/// changes have room too. Above the 30 concurrent writes upstream runs, so it does not slow a
/// healthy watch down.
pub const WRITES_AHEAD_OF_WATCH: usize = 50;

/// An applied write whose change the watch has not delivered within this long releases its slot
/// anyway (with a warning).
pub const UNSEEN_EXPIRY: Duration = Duration::from_secs(60);

/// The bound on writes ahead of the watch (see the module documentation). Shared by the
/// informer (which reports what it has seen) and the workers (which take slots).
pub struct WriteWindow {
    slots: Arc<Semaphore>,
    state: Mutex<State>,
    size: usize,
}

#[derive(Default)]
struct State {
    /// The highest resourceVersion the informer has applied (a list, an event, a bookmark).
    seen: u64,
    /// Applied writes not yet seen, by the resourceVersion they were answered with.
    unseen: BTreeMap<u64, Vec<(Instant, OwnedSemaphorePermit)>>,
}

/// A slot of the window, held by one write (see [`WriteWindow::enter`]).
pub struct Slot(OwnedSemaphorePermit);

impl WriteWindow {
    /// A window of `size` slots (at least 1).
    pub fn new(size: usize) -> WriteWindow {
        let size = size.max(1);
        WriteWindow {
            slots: Arc::new(Semaphore::new(size)),
            state: Mutex::new(State::default()),
            size,
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Waits for a free slot: fewer than the window's size of our writes are in flight or unseen.
    /// While waiting, slots unseen for longer than [`UNSEEN_EXPIRY`] are released. `None` once
    /// the window is closed ([`WriteWindow::close`]): the controller is stopping, write nothing.
    pub async fn enter(&self) -> Option<Slot> {
        loop {
            let acquire = self.slots.clone().acquire_owned();
            match tokio::time::timeout(UNSEEN_EXPIRY, acquire).await {
                Ok(Ok(permit)) => return Some(Slot(permit)),
                Ok(Err(_closed)) => return None,
                Err(_) => self.expire(Instant::now()),
            }
        }
    }

    /// The controller is stopping: writes waiting for a slot, and later ones, get none (and are
    /// not sent). Without this a stop would wait for the watch — which is stopped first — to
    /// deliver the writes holding the slots, up to [`UNSEEN_EXPIRY`] (found by the chaos suite:
    /// controllers that did not stop within 30 s of the signal).
    pub fn close(&self) {
        self.slots.close();
    }

    /// The write holding `slot` was answered: with the changed object's `resource_version` if it
    /// was applied (the slot is kept until the watch has delivered that change), `None` otherwise
    /// (released now).
    pub fn written(&self, slot: Slot, resource_version: Option<&str>) {
        let Some(version) = resource_version.and_then(|v| v.parse::<u64>().ok()) else {
            return;
        };
        let mut state = self.state();
        if version <= state.seen {
            return;
        }
        state
            .unseen
            .entry(version)
            .or_default()
            .push((Instant::now(), slot.0));
    }

    /// The informer has applied everything up to `resource_version` (a watch event or bookmark
    /// after the initial state, or the resourceVersion of a complete list): the writes it covers
    /// release their slots. Versions that are not integers are ignored.
    pub fn seen(&self, resource_version: &str) {
        let Ok(version) = resource_version.parse::<u64>() else {
            return;
        };
        let released = {
            let mut state = self.state();
            if version <= state.seen {
                return;
            }
            state.seen = version;
            let later = state.unseen.split_off(&(version + 1));
            std::mem::replace(&mut state.unseen, later)
        };
        drop(released);
    }

    /// Releases the slots of writes unseen since before `now − UNSEEN_EXPIRY`.
    fn expire(&self, now: Instant) {
        let mut expired = 0;
        {
            let mut state = self.state();
            for entries in state.unseen.values_mut() {
                let before = entries.len();
                entries.retain(|(at, _)| now.duration_since(*at) < UNSEEN_EXPIRY);
                expired += before - entries.len();
            }
            state.unseen.retain(|_, entries| !entries.is_empty());
        }
        if expired > 0 {
            tracing::warn!(
                expired,
                after = ?UNSEEN_EXPIRY,
                "the Node watch has not delivered our own writes; releasing their write slots"
            );
        }
    }

    /// Slots free now.
    pub fn available(&self) -> usize {
        self.slots.available_permits()
    }

    /// The window's size.
    pub fn size(&self) -> usize {
        self.size
    }
}

#[cfg(test)]
mod tests {
    use futures::poll;

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn a_write_holds_its_slot_until_the_watch_has_seen_its_version() {
        let window = WriteWindow::new(2);
        let a = window.enter().await.unwrap();
        let b = window.enter().await.unwrap();
        window.written(a, Some("10"));
        window.written(b, Some("11"));
        let mut third = std::pin::pin!(window.enter());
        assert!(poll!(&mut third).is_pending(), "both slots unseen");
        window.seen("9");
        assert!(poll!(&mut third).is_pending(), "9 covers neither write");
        window.seen("10");
        let c = third.await;
        assert_eq!(window.available(), 0, "11 is still unseen");
        window.seen("12");
        assert_eq!(window.available(), 1);
        drop(c);
        assert_eq!(window.available(), 2);
    }

    #[tokio::test(start_paused = true)]
    async fn a_write_the_watch_has_already_passed_or_without_a_version_releases_at_once() {
        let window = WriteWindow::new(1);
        window.seen("20");
        let slot = window.enter().await.unwrap();
        window.written(slot, Some("15"));
        assert_eq!(
            window.available(),
            1,
            "the watch delivered it before the answer came"
        );
        let slot = window.enter().await.unwrap();
        window.written(slot, None);
        assert_eq!(window.available(), 1, "not applied");
        let slot = window.enter().await.unwrap();
        window.written(slot, Some("not-a-number"));
        assert_eq!(window.available(), 1, "untracked");
        window.seen("also-not-a-number");
        window.seen("19");
        let slot = window.enter().await.unwrap();
        window.written(slot, Some("21"));
        assert_eq!(
            window.available(),
            0,
            "an older version does not move the mark back"
        );
        window.seen("21");
        assert_eq!(window.available(), 1);
    }

    #[tokio::test(start_paused = true)]
    async fn closing_the_window_frees_writers_waiting_for_a_slot() {
        let window = Arc::new(WriteWindow::new(1));
        let held = window.enter().await.unwrap();
        window.written(held, Some("7"));
        let waiting = tokio::spawn({
            let window = window.clone();
            async move { window.enter().await.is_none() }
        });
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished(), "the only slot is taken");
        window.close();
        assert!(waiting.await.unwrap(), "a closed window gives no slot");
        assert!(window.enter().await.is_none());
    }

    #[tokio::test(start_paused = true)]
    async fn an_unseen_write_is_released_after_the_expiry() {
        let window = WriteWindow::new(1);
        let slot = window.enter().await.unwrap();
        window.written(slot, Some("5"));
        let start = Instant::now();
        let _slot = window.enter().await.unwrap();
        assert_eq!(start.elapsed(), UNSEEN_EXPIRY);
    }
}
