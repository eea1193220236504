//! The client-side token bucket for API writes (`--kube-api-qps`, `--kube-api-burst`), built on
//! `governor` (GCRA, equivalent to a token bucket). Its saturation is exported as
//! `node_ipam_controller_rate_limiter_use`.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::metric_names;

type Limiter<C> = RateLimiter<NotKeyed, InMemoryState, C, StateInformationMiddleware>;

/// A token bucket: `burst` tokens, refilled at `qps` per second.
///
/// The bucket reads time from `C` (`governor`'s default, quanta, in production); waiting is done
/// with the tokio timer. Tests pass a clock they control (see [`WriteLimiter::with_clock`]).
pub struct WriteLimiter<C: Clock = DefaultClock> {
    limiter: Limiter<C>,
    burst: u32,
}

impl WriteLimiter {
    /// A full bucket. `qps` ≤ 0 or not finite is treated as 1 per second; `burst` 0 as 1.
    pub fn new(qps: f64, burst: u32) -> WriteLimiter {
        WriteLimiter::with_clock(qps, burst, DefaultClock::default())
    }
}

impl<C: Clock> WriteLimiter<C> {
    /// A full bucket reading time from `clock`; `qps` and `burst` as in [`WriteLimiter::new`].
    pub fn with_clock(qps: f64, burst: u32, clock: C) -> WriteLimiter<C> {
        let qps = if qps.is_finite() && qps > 0.0 {
            qps
        } else {
            1.0
        };
        let period = Duration::from_secs_f64(1.0 / qps).max(Duration::from_nanos(1));
        let burst_nz = NonZeroU32::new(burst).unwrap_or(NonZeroU32::MIN);
        let quota = Quota::with_period(period)
            .unwrap_or_else(|| Quota::per_second(NonZeroU32::MIN))
            .allow_burst(burst_nz);
        WriteLimiter {
            limiter: RateLimiter::direct_with_clock(quota, clock)
                .with_middleware::<StateInformationMiddleware>(),
            burst: burst_nz.get(),
        }
    }

    /// Takes a token if one is available now, returning the bucket's saturation afterwards
    /// (0 = full, 1 = empty); otherwise takes nothing and returns how long until one is.
    pub fn try_acquire(&self) -> Result<f64, Duration> {
        match self.limiter.check() {
            Ok(snapshot) => {
                let remaining = snapshot.remaining_burst_capacity().min(self.burst);
                Ok(1.0 - f64::from(remaining) / f64::from(self.burst))
            }
            Err(not_until) => Err(not_until.wait_time_from(self.limiter.clock().now())),
        }
    }

    /// Waits for a token, then records the bucket's saturation (0 = full, 1 = empty) as
    /// `node_ipam_controller_rate_limiter_use`.
    pub async fn acquire(&self) {
        let saturation = self.acquire_untracked().await;
        metrics::gauge!(metric_names::RATE_LIMITER_USE).set(saturation);
    }

    /// Waits for a token and returns the bucket's saturation afterwards, exporting nothing (the
    /// event writer's own bucket, which is not the write budget that gauge describes).
    pub async fn acquire_untracked(&self) -> f64 {
        loop {
            match self.try_acquire() {
                Ok(saturation) => return saturation,
                Err(wait) => tokio::time::sleep(wait).await,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use governor::clock::{Clock, FakeRelativeClock};
    use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

    use super::WriteLimiter;
    use crate::metric_names;

    /// Reads `governor` time from tokio's clock, so `start_paused` tests control the bucket.
    #[derive(Debug, Clone, Copy, Default)]
    struct TokioClock;

    impl Clock for TokioClock {
        type Instant = std::time::Instant;
        fn now(&self) -> std::time::Instant {
            tokio::time::Instant::now().into_std()
        }
    }

    const QPS: f64 = 10.0;
    const BURST: u32 = 4;
    const PERIOD: Duration = Duration::from_millis(100);

    #[test]
    fn burst_passes_at_once_then_one_token_per_period() {
        let clock = FakeRelativeClock::default();
        let limiter = WriteLimiter::with_clock(QPS, BURST, clock.clone());
        for _ in 0..BURST {
            assert!(limiter.try_acquire().is_ok());
        }
        assert_eq!(limiter.try_acquire(), Err(PERIOD));
        clock.advance(PERIOD / 2);
        assert_eq!(limiter.try_acquire(), Err(PERIOD / 2));
        clock.advance(PERIOD / 2);
        assert_eq!(limiter.try_acquire(), Ok(1.0));
        assert_eq!(limiter.try_acquire(), Err(PERIOD));
    }

    #[test]
    fn saturation_rises_with_use_and_recovers_with_time() {
        let clock = FakeRelativeClock::default();
        let limiter = WriteLimiter::with_clock(QPS, BURST, clock.clone());
        let used: Vec<_> = (0..BURST).map(|_| limiter.try_acquire()).collect();
        assert_eq!(used, [Ok(0.25), Ok(0.5), Ok(0.75), Ok(1.0)]);
        // Two periods refill two tokens; taking one leaves one of four.
        clock.advance(PERIOD * 2);
        assert_eq!(limiter.try_acquire(), Ok(0.75));
        // A long idle refills the bucket, never beyond `burst`.
        clock.advance(Duration::from_secs(60));
        assert_eq!(limiter.try_acquire(), Ok(0.25));
    }

    #[test]
    fn bad_settings_fall_back_to_one_per_second_and_burst_one() {
        for qps in [0.0, -3.0, f64::NAN, f64::INFINITY] {
            let clock = FakeRelativeClock::default();
            let limiter = WriteLimiter::with_clock(qps, 0, clock.clone());
            assert_eq!(limiter.try_acquire(), Ok(1.0), "qps {qps}");
            assert_eq!(
                limiter.try_acquire(),
                Err(Duration::from_secs(1)),
                "qps {qps}"
            );
        }
    }

    fn rate_limiter_use(handle: &PrometheusHandle) -> Option<f64> {
        handle.render().lines().find_map(|line| {
            line.strip_prefix(metric_names::RATE_LIMITER_USE)?
                .strip_prefix(' ')?
                .parse()
                .ok()
        })
    }

    #[tokio::test(start_paused = true)]
    async fn acquire_waits_one_period_after_the_burst_and_exports_saturation() {
        let recorder = PrometheusBuilder::new().build_recorder();
        let handle = recorder.handle();
        // A current-thread runtime: every `acquire` below records on this thread.
        let _guard = metrics::set_default_local_recorder(&recorder);
        let limiter = WriteLimiter::with_clock(QPS, BURST, TokioClock);
        let start = tokio::time::Instant::now();

        let mut seen = Vec::new();
        for _ in 0..BURST {
            limiter.acquire().await;
            seen.push(rate_limiter_use(&handle));
        }
        assert_eq!(start.elapsed(), Duration::ZERO, "the burst does not wait");
        assert_eq!(seen, [Some(0.25), Some(0.5), Some(0.75), Some(1.0)]);

        limiter.acquire().await;
        assert_eq!(start.elapsed(), PERIOD, "the next write waits 1/qps");
        assert_eq!(rate_limiter_use(&handle), Some(1.0));

        // Idle time refills the bucket; the gauge recovers on the next write.
        tokio::time::advance(PERIOD * 3).await;
        limiter.acquire().await;
        assert_eq!(start.elapsed(), PERIOD * 4);
        assert_eq!(rate_limiter_use(&handle), Some(0.5));
    }
}
