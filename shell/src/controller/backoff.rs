//! Per-Node retry delays for re-queued reconciles: capped exponential (`backon`, no jitter), from
//! `--retry-min-delay` doubling up to `--retry-max-delay`, forgotten on success.

use std::collections::HashMap;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

use crate::reconcile::NodeName;

/// Each Node's position in the schedule `min, 2·min, 4·min, …`, capped at `max`.
pub struct RetryBackoff {
    builder: ExponentialBuilder,
    attempts: HashMap<NodeName, ExponentialBackoff>,
}

impl RetryBackoff {
    /// No Node has failed yet; the first retry of any Node waits `min_delay`.
    pub fn new(min_delay: Duration, max_delay: Duration) -> RetryBackoff {
        RetryBackoff {
            builder: ExponentialBuilder::default()
                .with_min_delay(min_delay)
                .with_max_delay(max_delay)
                .with_factor(2.0)
                .without_max_times(),
            attempts: HashMap::new(),
        }
    }

    /// The delay before `name`'s next retry; advances its schedule.
    pub fn next_delay(&mut self, name: &NodeName) -> Duration {
        let backoff = self
            .attempts
            .entry(name.clone())
            .or_insert_with(|| self.builder.build());
        // Unreachable: the schedule has no limit on attempts or total delay.
        backoff.next().unwrap_or(Duration::from_secs(30))
    }

    /// Forgets `name`'s failures (success, deletion, a freed block): its next retry waits the
    /// minimum again.
    pub fn reset(&mut self, name: &str) {
        self.attempts.remove(name);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: Duration = Duration::from_secs(1);

    fn delays(backoff: &mut RetryBackoff, name: &str, count: usize) -> Vec<Duration> {
        let name: NodeName = name.into();
        (0..count).map(|_| backoff.next_delay(&name)).collect()
    }

    #[test]
    fn doubles_from_min_and_stops_at_max() {
        let cases = [
            // (min, max, expected first delays)
            (SECOND, SECOND * 10, vec![1, 2, 4, 8, 10, 10, 10]),
            (SECOND * 3, SECOND * 20, vec![3, 6, 12, 20, 20]),
            (SECOND * 5, SECOND * 5, vec![5, 5, 5]),
        ];
        for (min, max, expected) in cases {
            let mut backoff = RetryBackoff::new(min, max);
            let expected: Vec<_> = expected.into_iter().map(|s| SECOND * s).collect();
            assert_eq!(
                delays(&mut backoff, "n", expected.len()),
                expected,
                "min {min:?} max {max:?}"
            );
        }
    }

    #[test]
    fn stays_capped_after_many_failures() {
        let mut backoff = RetryBackoff::new(Duration::from_millis(100), SECOND * 60);
        let all = delays(&mut backoff, "n", 200);
        assert!(all.windows(2).all(|w| w[0] <= w[1]), "never decreases");
        assert!(all[20..].iter().all(|d| *d == SECOND * 60), "capped");
    }

    #[test]
    fn reset_restarts_from_min_and_nodes_are_independent() {
        let mut backoff = RetryBackoff::new(SECOND, SECOND * 10);
        assert_eq!(
            delays(&mut backoff, "a", 3),
            [SECOND, SECOND * 2, SECOND * 4]
        );
        assert_eq!(
            backoff.next_delay(&"b".into()),
            SECOND,
            "b has its own schedule"
        );
        backoff.reset("a");
        assert_eq!(delays(&mut backoff, "a", 2), [SECOND, SECOND * 2]);
        assert_eq!(
            backoff.next_delay(&"b".into()),
            SECOND * 2,
            "reset of a leaves b alone"
        );
        backoff.reset("never-failed");
    }
}
