//! The Lease record's rules: how long a record read stays valid, who it names, and the specs we
//! write to create, claim (take over or renew) and release it (client-go's `leaselock.go` and
//! `leaderelection.go`, with the differences the parent module lists), and our observation of it.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use tokio::time::Instant;

/// How long a record read from the Lease stays valid after we observed it change: its
/// `leaseDurationSeconds` when in 1 ..= 2³¹−1, else (missing, zero, negative) `configured`.
pub fn record_lease_duration(spec: Option<&LeaseSpec>, configured: Duration) -> Duration {
    match spec.and_then(|s| s.lease_duration_seconds) {
        Some(seconds) => u64::try_from(seconds)
            .ok()
            .filter(|s| *s > 0)
            .map_or(configured, Duration::from_secs),
        None => configured,
    }
}

/// The Lease's holder: its `holderIdentity` unless missing or empty.
pub(super) fn holder_of(spec: Option<&LeaseSpec>) -> Option<&str> {
    spec.and_then(|s| s.holder_identity.as_deref())
        .filter(|h| !h.is_empty())
}

/// `leaseTransitions` as read: missing or negative counts as 0.
pub(super) fn transitions_of(spec: &LeaseSpec) -> i32 {
    spec.lease_transitions.unwrap_or(0).max(0)
}

/// The spec of a Lease we CREATE (client-go `tryAcquireOrRenew`'s new record).
pub(super) fn created_spec(identity: &str, seconds: i32, now: Timestamp) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(identity.to_owned()),
        lease_duration_seconds: Some(seconds),
        acquire_time: Some(MicroTime(now)),
        renew_time: Some(MicroTime(now)),
        lease_transitions: Some(0),
        ..LeaseSpec::default()
    }
}

/// The spec we UPDATE to hold `old`: a renewal if `old` names us (acquire time and transitions
/// kept), a takeover otherwise (acquired now, transitions + 1, saturating). Other fields are kept.
pub(super) fn claimed_spec(
    old: &LeaseSpec,
    identity: &str,
    seconds: i32,
    now: Timestamp,
) -> LeaseSpec {
    let ours = holder_of(Some(old)) == Some(identity);
    let mut spec = old.clone();
    spec.holder_identity = Some(identity.to_owned());
    spec.lease_duration_seconds = Some(seconds);
    spec.renew_time = Some(MicroTime(now));
    if ours {
        spec.acquire_time = old.acquire_time.clone().or(Some(MicroTime(now)));
        spec.lease_transitions = Some(transitions_of(old));
    } else {
        spec.acquire_time = Some(MicroTime(now));
        spec.lease_transitions = Some(transitions_of(old).saturating_add(1));
    }
    spec
}

/// The spec that releases `old` (client-go `release`): no holder, 1 s, times now, transitions kept.
pub(super) fn released_spec(old: &LeaseSpec, now: Timestamp) -> LeaseSpec {
    let mut spec = old.clone();
    spec.holder_identity = Some(String::new());
    spec.lease_duration_seconds = Some(1);
    spec.acquire_time = Some(MicroTime(now));
    spec.renew_time = Some(MicroTime(now));
    spec.lease_transitions = Some(transitions_of(old));
    spec
}

/// The Lease as we last saw it change (client-go's `observedRecord` + `observedTime`).
#[derive(Debug, Clone)]
pub(super) struct Observation {
    pub(super) resource_version: Option<String>,
    pub(super) spec: Option<LeaseSpec>,
    /// Local instant at which we first read it in this state.
    pub(super) since: Instant,
}

impl Observation {
    /// The observation after reading `lease` at `now`: unchanged (same resourceVersion and spec)
    /// keeps its instant, anything else starts a new one.
    pub(super) fn after_read(
        previous: Option<Observation>,
        lease: &Lease,
        now: Instant,
    ) -> Observation {
        let resource_version = lease.metadata.resource_version.clone();
        match previous {
            Some(seen) if seen.resource_version == resource_version && seen.spec == lease.spec => {
                seen
            }
            _ => Observation {
                resource_version,
                spec: lease.spec.clone(),
                since: now,
            },
        }
    }

    /// Whether another holder's claim is still valid at `now` (client-go `isLeaseValid`):
    /// `now < since + record duration`; an overflowing sum is valid.
    pub(super) fn is_valid(&self, now: Instant, configured: Duration) -> bool {
        let duration = record_lease_duration(self.spec.as_ref(), configured);
        self.since
            .checked_add(duration)
            .is_none_or(|until| now < until)
    }
}
