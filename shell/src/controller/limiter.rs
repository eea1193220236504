//! The client-side token bucket for API writes (`--kube-api-qps`, `--kube-api-burst`), built on
//! `governor` (GCRA, equivalent to a token bucket). Its saturation is exported as
//! `node_ipam_controller_rate_limiter_use`.

use std::num::NonZeroU32;
use std::time::Duration;

use governor::clock::DefaultClock;
use governor::middleware::StateInformationMiddleware;
use governor::state::{InMemoryState, NotKeyed};
use governor::{Quota, RateLimiter};

use crate::metric_names;

type Limiter = RateLimiter<NotKeyed, InMemoryState, DefaultClock, StateInformationMiddleware>;

/// A token bucket: `burst` tokens, refilled at `qps` per second.
pub struct WriteLimiter {
    limiter: Limiter,
    burst: u32,
}

impl WriteLimiter {
    /// A full bucket. `qps` ≤ 0 or not finite is treated as 1 per second; `burst` 0 as 1.
    pub fn new(qps: f64, burst: u32) -> WriteLimiter {
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
            limiter: RateLimiter::direct(quota).with_middleware::<StateInformationMiddleware>(),
            burst: burst_nz.get(),
        }
    }

    /// Waits for a token, then records the bucket's saturation (0 = full, 1 = empty).
    pub async fn acquire(&self) {
        let snapshot = self.limiter.until_ready().await;
        let remaining = snapshot.remaining_burst_capacity().min(self.burst);
        let saturation = 1.0 - f64::from(remaining) / f64::from(self.burst);
        metrics::gauge!(metric_names::RATE_LIMITER_USE).set(saturation);
    }
}
