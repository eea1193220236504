//! The one home of the election's timing rules: client-go's `NewLeaderElector` checks
//! (`leaderelection.go`) and what a Lease can hold. [`super::LeaseConfig::validate`] and the
//! `--leader-elect-*` flags' validation both apply [`check_timing`], each naming the rule in its
//! own terms (the config's fields, the flags).

use std::time::Duration;

/// client-go's `JitterFactor`: `renew_deadline` must exceed this many retry periods
/// (`leaderelection.go` `NewLeaderElector`).
pub const JITTER_FACTOR: f64 = 1.2;

/// The timing rule a lease duration, renew deadline and retry period break (the first, in the
/// order [`check_timing`] checks them).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TimingRule {
    /// The lease duration is not 1 ..= 2³¹−1 whole seconds (`spec.leaseDurationSeconds` is an
    /// int32 of seconds).
    LeaseDurationRange,
    /// The renew deadline is zero.
    RenewDeadlineZero,
    /// The retry period is zero.
    RetryPeriodZero,
    /// The renew deadline is not shorter than the lease duration.
    RenewDeadlineNotBelowLease,
    /// The renew deadline does not exceed [`JITTER_FACTOR`] × the retry period.
    RenewDeadlineNotAboveJitteredRetry,
}

/// Checks `lease_duration` > `renew_deadline` > [`JITTER_FACTOR`] × `retry_period` > 0, and a
/// lease duration of 1 ..= 2³¹−1 whole seconds.
///
/// # Errors
/// The first [`TimingRule`] broken.
pub fn check_timing(
    lease_duration: Duration,
    renew_deadline: Duration,
    retry_period: Duration,
) -> Result<(), TimingRule> {
    if lease_duration < Duration::from_secs(1) || lease_duration.as_secs() > i32::MAX as u64 {
        return Err(TimingRule::LeaseDurationRange);
    }
    if renew_deadline.is_zero() {
        return Err(TimingRule::RenewDeadlineZero);
    }
    if retry_period.is_zero() {
        return Err(TimingRule::RetryPeriodZero);
    }
    if renew_deadline >= lease_duration {
        return Err(TimingRule::RenewDeadlineNotBelowLease);
    }
    if renew_deadline.as_secs_f64() <= JITTER_FACTOR * retry_period.as_secs_f64() {
        return Err(TimingRule::RenewDeadlineNotAboveJitteredRetry);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each rule at its edge: kcm's defaults pass; one step over each bound is refused with that
    /// rule.
    #[test]
    fn timing_rules_at_their_edges() {
        let s = Duration::from_secs_f64;
        assert_eq!(check_timing(s(15.0), s(10.0), s(2.0)), Ok(()));
        assert_eq!(
            check_timing(Duration::from_secs(i32::MAX as u64), s(10.0), s(2.0)),
            Ok(())
        );
        assert_eq!(check_timing(s(1.0), s(0.5), s(0.4)), Ok(()));
        let cases = [
            ((0.9, 0.5, 0.1), TimingRule::LeaseDurationRange),
            ((2_147_483_648.0, 10.0, 2.0), TimingRule::LeaseDurationRange),
            ((15.0, 0.0, 2.0), TimingRule::RenewDeadlineZero),
            ((15.0, 10.0, 0.0), TimingRule::RetryPeriodZero),
            ((15.0, 15.0, 2.0), TimingRule::RenewDeadlineNotBelowLease),
            (
                (15.0, 12.0, 10.0),
                TimingRule::RenewDeadlineNotAboveJitteredRetry,
            ),
            (
                (1.0, 0.5, 0.5),
                TimingRule::RenewDeadlineNotAboveJitteredRetry,
            ),
        ];
        for ((lease, renew, retry), rule) in cases {
            assert_eq!(
                check_timing(s(lease), s(renew), s(retry)),
                Err(rule),
                "{lease} {renew} {retry}"
            );
        }
    }
}
