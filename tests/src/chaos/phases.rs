//! Where a seed's wall time goes: the driver adds the time of each phase of a run here
//! ([`PhaseTimes`], in every [`super::SeedReport`]), and the end phase's wait is split by what it
//! was waiting for ([`SettleWait`]). `many_seeds` prints the mean over a run, which is the
//! profile RELIABILITY.md summarises ("Seeds per minute").

use std::fmt;
use std::time::Duration;

/// What the end phase was waiting for at one check (the first condition that failed, in the
/// order `chaos::driver` checks them), or that it was confirming a settled state.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SettleWait {
    /// A late write the sandbox has not yet run (committed or refused).
    LateWrites,
    /// No replica is leading (with leader election: the Lease is held by a gone replica, or
    /// not yet taken).
    NoLeader,
    /// The leader is not ready (its first list is not done).
    LeaderNotReady,
    /// Nodes without podCIDRs while no cluster CIDR can be full, or with free blocks.
    Unserved,
    /// The leader's pool usage differs from the blocks the Nodes hold.
    Usage,
    /// A ClusterCIDR being deleted that no Node holds a block of still has the controller's
    /// finalizer, or a live one lacks it (the ClusterCIDR variant).
    Finalizers,
    /// Settled once; waiting to see it settled again.
    Confirm,
}

impl SettleWait {
    /// Every kind, in display order.
    pub const ALL: [SettleWait; 7] = [
        SettleWait::LateWrites,
        SettleWait::NoLeader,
        SettleWait::LeaderNotReady,
        SettleWait::Unserved,
        SettleWait::Usage,
        SettleWait::Finalizers,
        SettleWait::Confirm,
    ];

    /// A short name for reports.
    pub fn label(self) -> &'static str {
        match self {
            SettleWait::LateWrites => "late writes",
            SettleWait::NoLeader => "no leader",
            SettleWait::LeaderNotReady => "leader not ready",
            SettleWait::Unserved => "unserved",
            SettleWait::Usage => "usage",
            SettleWait::Finalizers => "finalizers",
            SettleWait::Confirm => "confirm",
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// The wall time of each phase of one seed (or the sum over many: [`PhaseTimes::add`]). The
/// phases follow one another, so they add up to the seed's wall time.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PhaseTimes {
    /// Building the initial Nodes, starting the sandbox, attaching the monitors.
    pub start: Duration,
    /// The schedule's gaps (`Step::gap`, drawn by the plan), supervising the replicas meanwhile.
    pub gaps: Duration,
    /// Waiting (at most 2 s each) until a PATCH got the late write a kill, stop or Lease loss
    /// fires first.
    pub late_write_waits: Duration,
    /// Clean stops of controllers during the schedule (a `Stop`; the quiescent point's stops).
    pub stops: Duration,
    /// Waiting for the sandbox to be idle at a quiescent point.
    pub idle_waits: Duration,
    /// Everything else the schedule's actions did (API calls, kills, starts).
    pub actions: Duration,
    /// The end phase: faults cleared → settled, split by what it waited for
    /// (indexed by [`SettleWait`]).
    pub settle: [Duration; 7],
    /// Stopping the last controllers cleanly (standbys, then the leader).
    pub final_stop: Duration,
    /// The final checks (end state, request log).
    pub checks: Duration,
    /// Detaching the monitors and shutting the sandbox down.
    pub shutdown: Duration,
}

impl PhaseTimes {
    /// Adds `d` to the end-phase time spent on `wait`.
    pub fn add_settle(&mut self, wait: SettleWait, d: Duration) {
        self.settle[wait.index()] += d;
    }

    /// The whole end phase.
    pub fn settle_total(&self) -> Duration {
        self.settle.iter().sum()
    }

    /// The sum of every phase.
    pub fn total(&self) -> Duration {
        self.start
            + self.gaps
            + self.late_write_waits
            + self.stops
            + self.idle_waits
            + self.actions
            + self.settle_total()
            + self.final_stop
            + self.checks
            + self.shutdown
    }

    /// Adds `other`'s times to these (to sum a run).
    pub fn add(&mut self, other: &PhaseTimes) {
        self.start += other.start;
        self.gaps += other.gaps;
        self.late_write_waits += other.late_write_waits;
        self.stops += other.stops;
        self.idle_waits += other.idle_waits;
        self.actions += other.actions;
        for (mine, theirs) in self.settle.iter_mut().zip(other.settle) {
            *mine += theirs;
        }
        self.final_stop += other.final_stop;
        self.checks += other.checks;
        self.shutdown += other.shutdown;
    }

    /// These times divided by `count` (the mean of a sum over `count` seeds; `count` 0 gives
    /// zeros).
    pub fn mean(&self, count: u32) -> PhaseTimes {
        let div = |d: Duration| d.checked_div(count).unwrap_or_default();
        PhaseTimes {
            start: div(self.start),
            gaps: div(self.gaps),
            late_write_waits: div(self.late_write_waits),
            stops: div(self.stops),
            idle_waits: div(self.idle_waits),
            actions: div(self.actions),
            settle: self.settle.map(div),
            final_stop: div(self.final_stop),
            checks: div(self.checks),
            shutdown: div(self.shutdown),
        }
    }
}

impl fmt::Display for PhaseTimes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let ms = |d: Duration| d.as_millis();
        write!(
            f,
            "start {} ms, gaps {} ms, late-write waits {} ms, stops {} ms, idle waits {} ms, \
             actions {} ms, settle {} ms (",
            ms(self.start),
            ms(self.gaps),
            ms(self.late_write_waits),
            ms(self.stops),
            ms(self.idle_waits),
            ms(self.actions),
            ms(self.settle_total()),
        )?;
        for (i, wait) in SettleWait::ALL.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            write!(f, "{sep}{} {}", wait.label(), ms(self.settle[wait.index()]))?;
        }
        write!(
            f,
            "), final stop {} ms, checks {} ms, shutdown {} ms",
            ms(self.final_stop),
            ms(self.checks),
            ms(self.shutdown)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_add_up_and_average() {
        let ms = Duration::from_millis;
        let mut one = PhaseTimes {
            start: ms(10),
            gaps: ms(3000),
            stops: ms(400),
            final_stop: ms(1000),
            ..PhaseTimes::default()
        };
        one.add_settle(SettleWait::NoLeader, ms(2000));
        one.add_settle(SettleWait::Confirm, ms(200));
        assert_eq!(one.settle_total(), ms(2200));
        assert_eq!(one.total(), ms(6610));
        let mut sum = PhaseTimes::default();
        sum.add(&one);
        sum.add(&one);
        assert_eq!(sum.total(), ms(13_220));
        assert_eq!(sum.mean(2), one);
        assert_eq!(sum.mean(0), PhaseTimes::default());
        let text = one.to_string();
        assert!(text.contains("no leader 2000"), "{text}");
        assert!(text.contains("settle 2200 ms"), "{text}");
    }
}
