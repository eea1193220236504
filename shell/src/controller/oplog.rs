//! Small pure helpers for the lines an operator reads: which leadership change to log, and a
//! per-pool rate limit for the exhaustion warning (one Node after another failing on a full
//! pool would otherwise log one warning per Node and retry).

use std::collections::HashMap;
use std::time::Duration;

use nodeipam_core::Cidr;
use tokio::time::Instant;

use crate::leader::Leadership;

/// How often the exhaustion warning of one cluster CIDR is repeated while it stays exhausted.
pub const EXHAUSTION_WARNING_INTERVAL: Duration = Duration::from_secs(60);

/// At most one warning per cluster CIDR per interval; counts what it suppressed.
#[derive(Debug)]
pub struct PerPoolRateLimit {
    interval: Duration,
    /// Per pool: when the last warning was let through, and failures suppressed since.
    last: HashMap<Cidr, (Instant, u64)>,
}

impl PerPoolRateLimit {
    /// A limit of one warning per `interval` per pool.
    pub fn new(interval: Duration) -> PerPoolRateLimit {
        PerPoolRateLimit {
            interval,
            last: HashMap::new(),
        }
    }

    /// An exhaustion of `pool` at `now`: `Some(suppressed)` if a warning is due (the first one
    /// at once, then one per interval; `suppressed` = failures not warned about since the last),
    /// `None` if this one is suppressed.
    pub fn check(&mut self, pool: Cidr, now: Instant) -> Option<u64> {
        match self.last.get_mut(&pool) {
            Some((at, suppressed)) if now.saturating_duration_since(*at) < self.interval => {
                *suppressed += 1;
                None
            }
            Some((at, suppressed)) => {
                let count = *suppressed;
                *at = now;
                *suppressed = 0;
                Some(count)
            }
            None => {
                self.last.insert(pool, (now, 0));
                Some(0)
            }
        }
    }

    /// `pool` has a free block again: its next exhaustion warns at once.
    pub fn reset(&mut self, pool: Cidr) {
        self.last.remove(&pool);
    }
}

/// The line to log when leadership goes from `before` to `after` (`None`: nothing new). `lease` is
/// `namespace/name`.
pub fn leadership_line(
    before: Option<&Leadership>,
    after: &Leadership,
    lease: &str,
) -> Option<String> {
    match (before, after) {
        (Some(Leadership::Standby { holder: old }), Leadership::Standby { holder: new })
            if old == new =>
        {
            None
        }
        (
            _,
            Leadership::Standby {
                holder: Some(holder),
            },
        ) => Some(format!(
            "standing by: Lease {lease} is held by {holder}; this replica takes over when it is released or expires"
        )),
        (_, Leadership::Standby { holder: None }) => {
            Some(format!("standing by: trying to acquire Lease {lease}"))
        }
        (Some(Leadership::Leading { .. }), Leadership::Leading { .. }) => None,
        (_, Leadership::Leading { .. }) => Some(format!("acquired Lease {lease}: leading")),
        (_, Leadership::Lost) => Some(format!("lost Lease {lease}: stopped allocating")),
        (_, Leadership::Stopped) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cidr(text: &str) -> Cidr {
        Cidr::parse(text).expect("CIDR")
    }

    /// First exhaustion warns at once; then one per interval per pool, with the count of the
    /// suppressed ones; pools are independent; a reset warns at once again.
    #[test]
    fn exhaustion_warnings_are_rate_limited_per_pool() {
        let mut limit = PerPoolRateLimit::new(Duration::from_secs(60));
        let v4 = cidr("10.244.0.0/16");
        let v6 = cidr("fd00::/56");
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        assert_eq!(limit.check(v4, at(0)), Some(0));
        assert_eq!(limit.check(v4, at(1)), None);
        assert_eq!(limit.check(v4, at(59)), None);
        assert_eq!(
            limit.check(v6, at(59)),
            Some(0),
            "another pool warns on its own"
        );
        assert_eq!(
            limit.check(v4, at(60)),
            Some(2),
            "two suppressed since the last warning"
        );
        assert_eq!(limit.check(v4, at(61)), None);
        limit.reset(v4);
        assert_eq!(limit.check(v4, at(62)), Some(0));
    }

    #[test]
    fn leadership_changes_are_logged_once_each() {
        let lease = "kube-system/nodeipam-controller";
        let standby = Leadership::Standby { holder: None };
        let held = Leadership::Standby {
            holder: Some("other_1".to_owned()),
        };
        let leading = Leadership::Leading {
            write_fence: Instant::now(),
        };
        assert_eq!(
            leadership_line(None, &standby, lease).as_deref(),
            Some("standing by: trying to acquire Lease kube-system/nodeipam-controller")
        );
        assert!(
            leadership_line(Some(&standby), &held, lease)
                .is_some_and(|l| l.contains("held by other_1"))
        );
        assert_eq!(leadership_line(Some(&held), &held.clone(), lease), None);
        assert!(
            leadership_line(Some(&held), &leading, lease).is_some_and(|l| l.contains("leading"))
        );
        assert_eq!(
            leadership_line(Some(&leading), &leading.clone(), lease),
            None,
            "renewals are quiet"
        );
        assert!(leadership_line(Some(&leading), &Leadership::Lost, lease).is_some());
        assert_eq!(
            leadership_line(Some(&leading), &Leadership::Stopped, lease),
            None
        );
    }
}
