//! How late a tokio runtime runs its timers: a task that asks to wake every [`TICK`] and
//! records by how much each wake-up came late (seed 10207, RELIABILITY.md).
//!
//! A controller replica's leader elector renews on a timer (every retry period, 200–300 ms in the
//! chaos plans) and gives the Lease up when no renewal has succeeded for the renew deadline
//! (1.5–2 s). On a runtime that cannot run its tasks for longer than the renew deadline minus the
//! retry period, the leader loses the Lease with no fault of the plan involved. This watchdog
//! shares the runtime with the code it watches over, so its lateness is what that code's timers
//! saw (a wake-up is late by at least the timer's 1 ms rounding).

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use tokio::runtime::Handle;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep_until};

/// How often the watchdog asks to wake.
pub const TICK: Duration = Duration::from_millis(50);
/// Wake-ups at least this late are kept, with their time, for [`Watchdog::worst_within`].
pub const NOTABLE: Duration = Duration::from_millis(100);
/// At most this many notable wake-ups are kept (the oldest are dropped first).
const NOTABLE_KEPT: usize = 256;

/// A summary of the wake-ups so far.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lateness {
    /// Wake-ups seen.
    pub ticks: u64,
    /// The latest wake-up: by how much it missed its time.
    pub max: Duration,
    /// When that wake-up was due, counted from the watchdog's start.
    pub max_at: Duration,
    /// Wake-ups at least 250 ms late.
    pub over_250ms: u64,
    /// Wake-ups at least 1 s late.
    pub over_1s: u64,
}

impl Lateness {
    /// Merges `other` into these figures (the maximum of both maxima, the counts summed); the
    /// `max_at` of a merge is the one of the larger maximum.
    pub fn merge(&mut self, other: &Lateness) {
        if other.max > self.max {
            self.max = other.max;
            self.max_at = other.max_at;
        }
        self.ticks += other.ticks;
        self.over_250ms += other.over_250ms;
        self.over_1s += other.over_1s;
    }

    fn record(&mut self, late: Duration, at: Duration) {
        self.ticks += 1;
        if late > self.max {
            self.max = late;
            self.max_at = at;
        }
        if late >= Duration::from_millis(250) {
            self.over_250ms += 1;
        }
        if late >= Duration::from_secs(1) {
            self.over_1s += 1;
        }
    }
}

impl fmt::Display for Lateness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} ticks of {} ms, up to {} ms late (at {:.1} s), {} ≥ 250 ms, {} ≥ 1 s",
            self.ticks,
            TICK.as_millis(),
            self.max.as_millis(),
            self.max_at.as_secs_f64(),
            self.over_250ms,
            self.over_1s
        )
    }
}

#[derive(Debug)]
struct Shared {
    started: Instant,
    /// When the next wake-up is due (a wake-up not yet run is late too).
    next_due: Instant,
    summary: Lateness,
    /// `(due, late)` of the last wake-ups at least [`NOTABLE`] late, oldest first.
    notable: VecDeque<(Instant, Duration)>,
}

/// A watchdog task on one runtime; stops when dropped.
#[derive(Debug)]
pub struct Watchdog {
    shared: Arc<Mutex<Shared>>,
    task: JoinHandle<()>,
}

impl Watchdog {
    /// Starts a watchdog on the runtime of the current task.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn start() -> Watchdog {
        Watchdog::start_on(&Handle::current())
    }

    /// Starts a watchdog on the runtime `handle` belongs to.
    pub fn start_on(handle: &Handle) -> Watchdog {
        let started = Instant::now();
        let shared = Arc::new(Mutex::new(Shared {
            started,
            next_due: started + TICK,
            summary: Lateness::default(),
            notable: VecDeque::new(),
        }));
        let task = handle.spawn(tick(shared.clone()));
        Watchdog { shared, task }
    }

    /// The wake-ups so far.
    pub fn lateness(&self) -> Lateness {
        self.shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .summary
    }

    /// The latest wake-up due within `window` before now, including one due and not yet run
    /// (late by now − due); zero if none was at least [`NOTABLE`] late.
    pub fn worst_within(&self, window: Duration) -> Duration {
        let now = Instant::now();
        let shared = self.shared.lock().unwrap_or_else(PoisonError::into_inner);
        let since = now.checked_sub(window).unwrap_or(shared.started);
        let pending = now.saturating_duration_since(shared.next_due);
        shared
            .notable
            .iter()
            .filter(|(due, _)| *due >= since)
            .map(|(_, late)| *late)
            .chain(std::iter::once(pending))
            .max()
            .filter(|late| *late >= NOTABLE)
            .unwrap_or_default()
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn tick(shared: Arc<Mutex<Shared>>) {
    let mut due = Instant::now() + TICK;
    loop {
        shared
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .next_due = due;
        sleep_until(due).await;
        let now = Instant::now();
        let late = now.saturating_duration_since(due);
        {
            let mut s = shared.lock().unwrap_or_else(PoisonError::into_inner);
            let at = due.saturating_duration_since(s.started);
            s.summary.record(late, at);
            if late >= NOTABLE {
                if s.notable.len() == NOTABLE_KEPT {
                    s.notable.pop_front();
                }
                s.notable.push_back((due, late));
            }
        }
        due = now + TICK;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A runtime whose only worker is blocked (a synchronous section inside a task) runs the
    /// watchdog's wake-up late by about that long. (Lower bounds only: a loaded machine can make
    /// any wake-up later, never earlier.)
    #[test]
    fn a_blocked_runtime_shows_as_late_wake_ups() {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap_or_else(|e| panic!("runtime: {e}"));
        runtime.block_on(async {
            let watchdog = Watchdog::start();
            tokio::time::sleep(TICK * 2).await;
            let before = watchdog.lateness();
            // Hold the only worker for 600 ms, as a synchronous section would: the next wake-up
            // was due at most one tick after the sleep above ended.
            std::thread::sleep(Duration::from_millis(600));
            assert!(
                watchdog.worst_within(Duration::from_secs(10)) >= Duration::from_millis(500),
                "a wake-up due and not yet run counts"
            );
            for _ in 0..100 {
                if watchdog.lateness().ticks > before.ticks {
                    break;
                }
                tokio::time::sleep(TICK).await;
            }
            let after = watchdog.lateness();
            assert!(after.max >= Duration::from_millis(500), "{after}");
            assert!(after.over_250ms >= 1, "{after}");
            assert!(watchdog.worst_within(Duration::from_secs(10)) >= Duration::from_millis(500));
            let mut merged = Lateness::default();
            merged.merge(&after);
            merged.merge(&before);
            assert_eq!(merged.max, after.max);
            assert_eq!(merged.ticks, after.ticks + before.ticks);
        });
    }
}
