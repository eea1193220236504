//! Leader election over a `coordination.k8s.io/v1` Lease with client-go's algorithm, and the
//! **write fence** that keeps a deposed leader's Node writes from overlapping its successor's.
//!
//! # Algorithm (client-go `tools/leaderelection`)
//!
//! Every try is client-go's `tryAcquireOrRenew` (`leaderelection.go`) over the Lease, as its
//! `resourcelock/leaselock.go` does it: GET the Lease; 404 ⇒ CREATE it naming us; otherwise, if
//! it may be taken, UPDATE (PUT) it carrying the `metadata.resourceVersion` we read, so a
//! concurrent writer makes our write fail with 409 (we lost the race; nothing is assumed).
//!
//! - **Observation.** As client-go's `observedRecord`/`observedTime`, we remember the Lease as we
//!   last read it and the *local monotonic* instant at which we first saw it in that state. It
//!   counts as changed when its `metadata.resourceVersion` or its `spec` differs (client-go compares
//!   the record only; counting any write as a change can only make us wait longer).
//! - **Validity** (`isLeaseValid`): a Lease held by someone else is valid until our observation
//!   instant + the Lease's own `leaseDurationSeconds`. Timestamps written by other machines
//!   (`renewTime`, `acquireTime`) are never compared with our clock: they only make a renewal
//!   visible as a change. Like client-go this tolerates any clock *offset* between machines, but
//!   assumes their clocks advance at about the same rate.
//! - **Taking** a Lease that names no holder, or whose holder's validity has run out: UPDATE with
//!   `holderIdentity` = us, `leaseDurationSeconds` = [`LeaseConfig::lease_duration`] in whole
//!   seconds, `acquireTime` = `renewTime` = now (`MicroTime`), `leaseTransitions` + 1. A Lease that
//!   already names us (e.g. our earlier write whose answer was lost) keeps its `acquireTime` and
//!   `leaseTransitions`, as client-go's `IsLeader` branch does. CREATE writes `leaseTransitions` 0.
//!   `spec.strategy` and `spec.preferredHolder` are left as found.
//! - **Renewing** (`renew`): every retry period the leader UPDATEs optimistically with the
//!   resourceVersion of its last write (client-go's fast path); on any failure it GETs and UPDATEs
//!   again (the slow path). `acquireTime` and `leaseTransitions` are kept.
//! - **Releasing** (`release` with `ReleaseOnCancel`): on shutdown, if we hold the Lease (or a
//!   write of ours with an unknown outcome may have made us its holder), UPDATE it with
//!   `holderIdentity` "" and `leaseDurationSeconds` 1, with the resourceVersion — only if it still
//!   names us. A standby takes a Lease without holder at its next try.
//! - Each request times out after `max(1 s, renew_deadline / 2)`, the timeout client-go gives the
//!   lock's client (`resourcelock/interface.go` `NewFromKubeconfig`: "a single hung request" must not
//!   force a leader loss).
//!
//! # Deliberate differences from client-go
//!
//! - **No jitter.** A standby tries every [`LeaseConfig::retry_period`] exactly (client-go waits
//!   up to 1.2 × the period, `wait.JitterUntil` with `JitterFactor`), counted from the start of the
//!   previous try, so a released Lease is taken within one retry period (plus one request's
//!   latency), and after a leader's `kill -9` within lease duration + retry period of its last
//!   renewal being observed.
//! - **Renew deadline counted from the last success.** The leader gives up ([`Leadership::Lost`])
//!   when no renewal has succeeded for `renew_deadline` since the *start* of the last successful
//!   one (client-go counts from the start of the failing round, up to one retry period later).
//!   Since `renew_deadline < lease_duration`, the loss is declared before the write fence passes.
//! - **A leader that reads a Lease not naming it loses at once** ([`LeaderError::Superseded`]),
//!   including a deleted Lease or one whose holder was emptied by someone else; client-go keeps
//!   retrying until the renew deadline and may re-create or re-take it.
//! - **No release after a loss**: a lost leader may still have writes in flight; releasing would let
//!   a standby in before the write fence has passed. The Lease simply expires.
//! - **Hostile Lease contents never panic.** Durations: a `leaseDurationSeconds` that is missing,
//!   zero or negative (kube-apiserver's `ValidateLeaseSpec` rejects ≤ 0, but old objects or other
//!   servers may hold anything) is read as **our configured lease duration**, not as expired:
//!   client-go would take such a Lease at once from a holder that may be alive; we give the holder
//!   a full lease duration from our observation of its last change. Any value in 1..=2³¹−1 s is
//!   honoured as written — shortening another holder's duration would void *its* write fence —
//!   and instant arithmetic is checked (an overflow means "valid while unchanged"). A negative
//!   `leaseTransitions` counts as 0 and the count saturates at 2³¹−1. A `holderIdentity` of any
//!   format is compared byte for byte; empty means no holder. A Lease whose JSON does not decode
//!   (e.g. a `renewTime` that is not a timestamp, which a conformant API server cannot store) is a
//!   failed read: a standby waits, a leader's renewal fails. A Lease without
//!   `metadata.resourceVersion` is never updated (that would be an unconditional write).
//!
//! # The write fence
//!
//! While leading, [`Leadership::Leading::write_fence`] is the local monotonic instant
//! `S + D`, where `S` is when the last *successful* acquire/renew try started (before its first
//! request was sent) and `D` is the `leaseDurationSeconds` we wrote (whole seconds). No other
//! elector running this algorithm can take the Lease before `S + D`:
//!
//! 1. our successful write `W` was sent after `S` and committed after that;
//! 2. a rival's takeover UPDATE carries the resourceVersion of the GET it decided on; if that GET
//!    read the Lease before `W` committed, that resourceVersion is older than `W`'s and the
//!    UPDATE fails with 409 (had it committed first, `W` would have failed instead). So a
//!    successful takeover follows a GET that returned `W`'s version of the Lease or a later one;
//! 3. that version has a resourceVersion the rival never saw before, so the rival's observation
//!    instant is at or after that GET's answer, after `S`; the rival takes the Lease only once `D`
//!    has elapsed since (the Lease says `leaseDurationSeconds: D`), i.e. after `S + D` (equal
//!    clock rates assumed, as client-go does). Comparing resourceVersions, not only the spec, keeps
//!    this true even if two renewals wrote identical specs.
//!
//! So a controller that **starts** a write only while `now + request_timeout < write_fence`, and
//! abandons every write after `request_timeout`, has finished (on its side) all its writes before
//! any successor can hold the Lease, even when it is partitioned from the API server or is deposed
//! without noticing. That is **liveness only**: a request the client abandoned may still be
//! applied by the API server at any later time (a stalled link, a re-armed timeout toward etcd).
//! Safety comes from the write intents ([`WriteIntents`]): every write's intent is in the Lease before
//! the write is sent, and a successor takes the Lease — by the same resourceVersion
//! precondition — with them. Not covered: writers that bypass the algorithm (deleting the Lease or
//! hand-editing its intents).
//!
//! The fence holds only while the Lease is not **released**: a release lets a standby in at once.
//! So the controller releases only after every write it sent whose outcome is unknown can no
//! longer be applied (its `in_doubt` module; at most one request timeout after the stop), and
//! keeps renewing until then.
//!
//! # Use
//!
//! ```no_run
//! # async fn demo(client: kube::Client) -> Result<(), nodeipam::leader::LeaderError> {
//! use std::time::Duration;
//! use nodeipam::leader::{LeaderElector, LeaseConfig, Leadership};
//! let config = LeaseConfig {
//!     namespace: "kube-system".into(),
//!     name: "nodeipam-controller".into(),
//!     identity: "pod-a_1".into(),
//!     lease_duration: Duration::from_secs(15),
//!     renew_deadline: Duration::from_secs(10),
//!     retry_period: Duration::from_secs(2),
//! };
//! let elector = LeaderElector::new(client, config)?;
//! let (state, mut leadership) = tokio::sync::watch::channel(Leadership::default());
//! let (release, released) = tokio::sync::oneshot::channel::<()>();
//! let election = tokio::spawn(elector.run(state, async move { let _ = released.await; }));
//! let _ = leadership.wait_for(Leadership::is_leading).await;
//! // … work; before each Node write:
//! let may_write = leadership
//!     .borrow()
//!     .may_start_write(tokio::time::Instant::now(), Duration::from_secs(10));
//! // On SIGTERM: stop taking work, finish in-flight writes, then release and wait:
//! let _ = release.send(());
//! if let Ok(outcome) = election.await {
//!     outcome?; // LeaderError::Release: the Lease expires instead
//! }
//! # let _ = may_write; Ok(()) }
//! ```

use std::future::Future;
use std::pin::pin;
use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::time::{Instant, sleep_until, timeout_at};

mod intents;
mod record;
mod timing;

pub use intents::{
    INTENT_BATCH, INTENT_CREDIT_CAP, IntentsUnreadable, MAX_WRITE_INTENTS, PendingIntents,
    WRITE_INTENTS_ANNOTATION, WriteIntent, WriteIntents, early_write_due, intents_of,
};
pub use record::record_lease_duration;
use record::{Observation, claimed_spec, created_spec, holder_of, released_spec};
pub use timing::{JITTER_FACTOR, TimingRule, check_timing};

/// Where the Lease is, who we are, and the election's timing (kube-controller-manager's
/// `--leader-elect-*` flags; defaults there 15 s / 10 s / 2 s).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseConfig {
    /// Namespace of the Lease (`--leader-elect-resource-namespace`).
    pub namespace: String,
    /// Name of the Lease (`--leader-elect-resource-name`).
    pub name: String,
    /// Our `holderIdentity`; must be unique per process (e.g. pod name + process id).
    pub identity: String,
    /// How long a standby waits after observing the Lease's last change before taking it. Written
    /// as whole seconds (the fraction is dropped), 1 s ..= 2³¹−1 s.
    pub lease_duration: Duration,
    /// How long the leader keeps failing to renew before it gives up, counted from the start of
    /// its last successful renewal. Shorter than `lease_duration`.
    pub renew_deadline: Duration,
    /// Time between the starts of two tries (acquire or renew). `renew_deadline` must exceed
    /// [`JITTER_FACTOR`] × this.
    pub retry_period: Duration,
}

impl LeaseConfig {
    /// Checks client-go's `NewLeaderElector` rules ([`check_timing`]: every duration > 0, lease
    /// duration > renew deadline > [`JITTER_FACTOR`] × retry period; non-empty identity) and what
    /// a Lease can hold (a lease duration of 1 ..= 2³¹−1 whole seconds, non-empty name and
    /// namespace).
    ///
    /// # Errors
    /// [`LeaderError::InvalidConfig`] naming the first broken rule.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let invalid = |message: String| Err(LeaderError::InvalidConfig(message));
        if self.name.trim().is_empty() || self.namespace.trim().is_empty() {
            return invalid("the Lease name and namespace must not be empty".to_owned());
        }
        if self.identity.is_empty() {
            return invalid("the holder identity must not be empty".to_owned());
        }
        let (lease, renew, retry) = (self.lease_duration, self.renew_deadline, self.retry_period);
        match check_timing(lease, renew, retry) {
            Ok(()) => Ok(()),
            Err(TimingRule::LeaseDurationRange) => invalid(format!(
                "lease duration {}s must be between 1s and {}s (whole seconds in an int32)",
                lease.as_secs_f64(),
                i32::MAX
            )),
            Err(TimingRule::RenewDeadlineZero | TimingRule::RetryPeriodZero) => {
                invalid("renew deadline and retry period must be greater than zero".to_owned())
            }
            Err(TimingRule::RenewDeadlineNotBelowLease) => invalid(format!(
                "renew deadline {renew:?} must be shorter than the lease duration {lease:?}"
            )),
            Err(TimingRule::RenewDeadlineNotAboveJitteredRetry) => invalid(format!(
                "renew deadline {renew:?} must exceed {JITTER_FACTOR} × the retry period {retry:?}"
            )),
        }
    }

    /// The `spec.leaseDurationSeconds` we write: whole seconds of
    /// [`lease_duration`](Self::lease_duration), saturated to an int32.
    pub fn lease_duration_seconds(&self) -> i32 {
        i32::try_from(self.lease_duration.as_secs()).unwrap_or(i32::MAX)
    }

    /// Timeout of each Lease request: `max(1 s, renew_deadline / 2)` (client-go
    /// `resourcelock/interface.go` `NewFromKubeconfig`).
    pub fn request_timeout(&self) -> Duration {
        (self.renew_deadline / 2).max(Duration::from_secs(1))
    }

    fn describe(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// What the elector knows about its leadership, published on the `watch` channel given to
/// [`LeaderElector::run`]. `Lost` and `Stopped` are final.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// Not leading (yet). `holder` is the non-empty `holderIdentity` of the Lease at our last
    /// successful read (`None`: not read yet, no Lease, or no holder).
    Standby {
        /// The holder named by the Lease, as read.
        holder: Option<String>,
    },
    /// Leading. Updated after every successful renewal.
    Leading {
        /// Local monotonic instant until which no other elector can hold the Lease: start of the
        /// last successful acquire/renew try + the written `leaseDurationSeconds` (see the module
        /// doc). Start a write only while `now + request_timeout < write_fence`
        /// ([`Leadership::may_start_write`]).
        write_fence: Instant,
    },
    /// Was leading and no longer is: no renewal succeeded for the renew deadline, or the Lease
    /// names someone else. The Lease is not released. kube-controller-manager exits then.
    Lost,
    /// [`LeaderElector::run`] ended on shutdown; the Lease was released if we held it.
    Stopped,
}

impl Default for Leadership {
    /// `Standby { holder: None }`: the state before the first try.
    fn default() -> Self {
        Leadership::Standby { holder: None }
    }
}

impl Leadership {
    /// Whether this is [`Leadership::Leading`].
    pub fn is_leading(&self) -> bool {
        matches!(self, Leadership::Leading { .. })
    }

    /// The write fence while leading, else `None`.
    pub fn write_fence(&self) -> Option<Instant> {
        match self {
            Leadership::Leading { write_fence } => Some(*write_fence),
            _ => None,
        }
    }

    /// Whether a write that starts at `now` and is abandoned after `request_timeout` surely ends
    /// before any other elector can hold the Lease: leading and `now + request_timeout <
    /// write_fence`. An overflowing sum is `false`.
    pub fn may_start_write(&self, now: Instant, request_timeout: Duration) -> bool {
        self.write_fence()
            .zip(now.checked_add(request_timeout))
            .is_some_and(|(fence, done_by)| done_by < fence)
    }
}

/// A Lease request that failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The API server answered with an error status, or the client failed.
    #[error(transparent)]
    Kube(#[from] kube::Error),
    /// No answer within the request timeout ([`LeaseConfig::request_timeout`]); the request
    /// may still have been applied.
    #[error("no answer within {0:?}")]
    TimedOut(Duration),
    /// The Lease came without `metadata.resourceVersion`; updating it would be unconditional.
    #[error("the Lease has no metadata.resourceVersion; refusing an unconditional update")]
    MissingResourceVersion,
}

impl RequestError {
    fn status_code(&self) -> Option<u16> {
        match self {
            RequestError::Kube(kube::Error::Api(status)) => Some(status.code),
            _ => None,
        }
    }

    fn is_not_found(&self) -> bool {
        self.status_code() == Some(404)
    }
}

/// Why leader election stopped with an error.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum LeaderError {
    /// The [`LeaseConfig`] breaks a rule; the message names it.
    #[error("leader election: {0}")]
    InvalidConfig(String),
    /// Leading, no renewal succeeded for the renew deadline (client-go: "failed to renew lease").
    #[error(
        "leader election: lost the Lease {lease}: no successful renewal for {renew_deadline:?}"
    )]
    RenewDeadlineExceeded {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The configured renew deadline.
        renew_deadline: Duration,
        /// The last renewal failure, if a request failed (none if the deadline cut it short).
        #[source]
        last_error: Option<RequestError>,
    },
    /// Leading, we read the Lease and it no longer names us.
    #[error(
        "leader election: lost the Lease {lease}: it now names {}",
        holder.as_deref().map_or_else(|| "nobody".to_owned(), |h| format!("{h:?}"))
    )]
    Superseded {
        /// `namespace/name` of the Lease.
        lease: String,
        /// The holder it names; `None` if it names nobody or was deleted.
        holder: Option<String>,
    },
    /// On shutdown, the Lease we held could not be released; it expires after the lease duration.
    #[error("leader election: releasing the Lease {lease} failed")]
    Release {
        /// `namespace/name` of the Lease.
        lease: String,
        /// Why.
        #[source]
        source: RequestError,
    },
}

impl LeaderError {
    /// A bounded, stable label for metrics (`error="…"`).
    pub fn metric_label(&self) -> &'static str {
        match self {
            LeaderError::InvalidConfig(_) => "leader_election_config",
            LeaderError::RenewDeadlineExceeded { .. } => "leader_renew_deadline_exceeded",
            LeaderError::Superseded { .. } => "leader_superseded",
            LeaderError::Release { .. } => "leader_release",
        }
    }
}

/// A standby's try.
enum Acquire {
    /// We hold the Lease now.
    Acquired,
    /// Not ours; `holder` as read.
    Standby { holder: Option<String> },
}

/// A leader's try.
enum Renew {
    Renewed,
    /// The Lease no longer names us.
    Superseded {
        holder: Option<String>,
    },
    Failed(RequestError),
}

/// Runs leader election for one Lease; see the module doc.
#[derive(Debug)]
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    lease_seconds: i32,
    request_timeout: Duration,
    /// The Lease as last read or written (its metadata carries the resourceVersion for UPDATEs).
    last_seen: Option<Lease>,
    observation: Option<Observation>,
    /// A write of ours may have made us the holder without our knowing (it timed out or was
    /// cancelled, or the server failed after committing): release checks on shutdown.
    maybe_holding: bool,
    /// When the API server last answered a Lease request of ours with the Lease's state (see
    /// [`LeaderElector::lease_contact`]).
    contact: watch::Sender<Option<Instant>>,
    /// The write intents every Lease write of ours carries (see [`intents`]); `None`: the Lease
    /// carries none (an elector guarding nothing but itself, as in the unit tests).
    intents: Option<Arc<WriteIntents>>,
    /// Take the Lease at the first try, whoever holds it ([`LeaderElector::taking_over_at_once`]).
    take_at_once: bool,
}

impl LeaderElector {
    /// An elector for the Lease `config.namespace/config.name`, using `client` for its requests.
    ///
    /// # Errors
    /// [`LeaderError::InvalidConfig`] if `config` breaks a rule of [`LeaseConfig::validate`].
    pub fn new(client: Client, config: LeaseConfig) -> Result<Self, LeaderError> {
        config.validate()?;
        Ok(LeaderElector {
            api: Api::namespaced(client, &config.namespace),
            lease_seconds: config.lease_duration_seconds(),
            request_timeout: config.request_timeout(),
            config,
            last_seen: None,
            observation: None,
            maybe_holding: false,
            contact: watch::Sender::new(None),
            intents: None,
            take_at_once: false,
        })
    }

    /// Takes the Lease at the first try, without waiting for its holder's lease to expire: for a
    /// replica that runs **without leader election** and keeps the Lease only as the home of its
    /// write intents ([`LeaderElector::with_write_intents`]). The takeover is still a
    /// resourceVersion-preconditioned UPDATE that carries the intents it read along, so an earlier
    /// process's writes are inherited and that process can record no new one (it loses the Lease
    /// at its next write); nothing about safety waits for time.
    #[must_use]
    pub fn taking_over_at_once(mut self) -> Self {
        self.take_at_once = true;
        self
    }

    /// Keeps `intents` in the Lease: every UPDATE (acquire, renew, release) writes them, a write
    /// is made before the next renewal when they call for one ([`intents::early_write_due`]), and
    /// a Lease is taken over with the intents it holds (see [`WriteIntents`]). A Lease whose intents cannot be read is not taken.
    #[must_use]
    pub fn with_write_intents(mut self, intents: Arc<WriteIntents>) -> Self {
        self.intents = Some(intents);
        self
    }

    /// The local monotonic instant at which the API server last told us the Lease's state: a
    /// Lease request of ours answered 2xx, `404 Not Found` (there is no Lease) or `409 Conflict`
    /// (someone else wrote it first). `None` before the first such answer. A transport error, a
    /// timeout or any other status (403, 5xx, …) is not contact: the replica cannot tell who leads.
    /// `/readyz` uses it (see `Health::watch_lease_contact`).
    pub fn lease_contact(&self) -> watch::Receiver<Option<Instant>> {
        self.contact.subscribe()
    }

    /// Tries to acquire the Lease every retry period until it succeeds, then renews it every retry
    /// period, publishing each change on `state`, until `shutdown` resolves or leadership is lost.
    ///
    /// On shutdown (at any point, cancelling a request in flight) the Lease is released if we hold
    /// it or may hold it, then [`Leadership::Stopped`] is published. Resolve `shutdown` only once
    /// every write guarded by the Lease has finished: after the release a standby may take over
    /// within one retry period. Releasing is bounded by the renew deadline.
    ///
    /// # Errors
    /// - [`LeaderError::RenewDeadlineExceeded`] / [`LeaderError::Superseded`]: leadership lost
    ///   ([`Leadership::Lost`] is published first; the Lease is not released);
    /// - [`LeaderError::Release`]: shutdown while holding, and the release failed (the Lease then
    ///   expires after the lease duration).
    ///
    /// Failed requests while standing by are logged and retried, never returned.
    pub async fn run(
        mut self,
        state: watch::Sender<Leadership>,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), LeaderError> {
        let mut shutdown = pin!(shutdown);
        let lease = self.config.describe();
        tracing::info!(%lease, identity = %self.config.identity, "trying to acquire the Lease");
        // Acquire: one try per retry period, counted from the start of the previous try.
        let acquired_at = loop {
            let started = Instant::now();
            let outcome = tokio::select! {
                biased;
                () = &mut shutdown => return self.stop(&state, false).await,
                outcome = self.try_acquire() => outcome,
            };
            match outcome {
                Acquire::Acquired => break started,
                Acquire::Standby { holder } => {
                    state.send_if_modified(|current| {
                        let next = Leadership::Standby { holder };
                        let changed = *current != next;
                        *current = next;
                        changed
                    });
                }
            }
            let next_try = started
                .checked_add(self.config.retry_period)
                .unwrap_or(started);
            tokio::select! {
                biased;
                () = &mut shutdown => return self.stop(&state, false).await,
                () = sleep_until(next_try) => {}
            }
        };
        tracing::info!(%lease, identity = %self.config.identity, "acquired the Lease");
        self.lead(acquired_at, &state, shutdown).await
    }

    /// Renews from `acquired_at` (start of the successful acquire try) until shutdown or loss.
    async fn lead(
        &mut self,
        acquired_at: Instant,
        state: &watch::Sender<Leadership>,
        mut shutdown: std::pin::Pin<&mut impl Future<Output = ()>>,
    ) -> Result<(), LeaderError> {
        let lease = self.config.describe();
        let mut last_renewed = acquired_at;
        let mut last_error: Option<RequestError> = None;
        state.send_replace(Leadership::Leading {
            write_fence: self.write_fence(last_renewed),
        });
        let mut next_try = acquired_at
            .checked_add(self.config.retry_period)
            .unwrap_or(acquired_at);
        loop {
            // Safe side on overflow: lose at once.
            let lost_at = last_renewed
                .checked_add(self.config.renew_deadline)
                .unwrap_or(last_renewed);
            if Instant::now() >= lost_at {
                tracing::warn!(%lease, renew_deadline = ?self.config.renew_deadline, "lost the Lease: renew deadline passed");
                state.send_replace(Leadership::Lost);
                return Err(LeaderError::RenewDeadlineExceeded {
                    lease,
                    renew_deadline: self.config.renew_deadline,
                    last_error,
                });
            }
            // A renewal is due at the retry period (it carries every intent recorded so far), or
            // earlier when the intents call for an early write (`intents::early_write_due`: a full
            // batch, or a writer waiting while credit remains; that write renews too) — unless
            // the last try failed: then the next waits for the retry period as usual.
            let intents = self.intents.clone().filter(|_| last_error.is_none());
            let early = async move {
                match intents {
                    Some(intents) => {
                        intents.due().await;
                        intents.early_write();
                    }
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                biased;
                () = &mut shutdown => return self.stop(state, true).await,
                () = sleep_until(next_try.min(lost_at)) => {}
                () = early => {}
            }
            if Instant::now() >= lost_at {
                continue;
            }
            let started = Instant::now();
            next_try = started
                .checked_add(self.config.retry_period)
                .unwrap_or(started);
            let outcome = tokio::select! {
                biased;
                () = &mut shutdown => return self.stop(state, true).await,
                outcome = timeout_at(lost_at, self.try_renew()) => outcome,
            };
            match outcome {
                Ok(Renew::Renewed) => {
                    last_renewed = started;
                    last_error = None;
                    state.send_replace(Leadership::Leading {
                        write_fence: self.write_fence(last_renewed),
                    });
                }
                Ok(Renew::Superseded { holder }) => {
                    tracing::warn!(%lease, ?holder, "lost the Lease: it names someone else");
                    state.send_replace(Leadership::Lost);
                    return Err(LeaderError::Superseded { lease, holder });
                }
                Ok(Renew::Failed(error)) => {
                    tracing::warn!(%lease, %error, "renewing the Lease failed; retrying");
                    last_error = Some(error);
                }
                // The deadline cut the try short: the loop top reports the loss.
                Err(_elapsed) => {}
            }
        }
    }

    /// The write fence for a successful try that started at `started`. Safe side on overflow: the
    /// try's start (no write allowed).
    fn write_fence(&self, started: Instant) -> Instant {
        let written = Duration::from_secs(u64::try_from(self.lease_seconds).unwrap_or(0));
        started.checked_add(written).unwrap_or(started)
    }

    /// Runs one request with the request timeout.
    async fn request<T>(
        &self,
        call: impl Future<Output = Result<T, kube::Error>>,
    ) -> Result<T, RequestError> {
        let result = match tokio::time::timeout(self.request_timeout, call).await {
            Ok(answer) => answer.map_err(RequestError::Kube),
            Err(_elapsed) => Err(RequestError::TimedOut(self.request_timeout)),
        };
        let answered = match &result {
            Ok(_) => true,
            Err(error) => matches!(error.status_code(), Some(404 | 409)),
        };
        if answered {
            self.contact.send_replace(Some(Instant::now()));
        }
        result
    }

    async fn get(&self) -> Result<Lease, RequestError> {
        self.request(self.api.get(&self.config.name)).await
    }

    /// UPDATE `read` (a Lease as the server returned it) with `spec`, conditional on its
    /// resourceVersion. Remembers the written Lease on success.
    async fn update(&mut self, read: &Lease, spec: LeaseSpec) -> Result<(), RequestError> {
        if read
            .metadata
            .resource_version
            .as_deref()
            .is_none_or(str::is_empty)
        {
            return Err(RequestError::MissingResourceVersion);
        }
        let mut lease = Lease {
            metadata: read.metadata.clone(),
            spec: Some(spec),
        };
        let carried = self.intents.as_ref().map(|intents| {
            let (generation, text) = intents.snapshot();
            lease
                .metadata
                .annotations
                .get_or_insert_with(Default::default)
                .insert(WRITE_INTENTS_ANNOTATION.to_owned(), text);
            generation
        });
        self.maybe_holding = true;
        let written = self
            .request(
                self.api
                    .replace(&self.config.name, &PostParams::default(), &lease),
            )
            .await?;
        if let (Some(intents), Some(generation)) = (&self.intents, carried) {
            intents.committed(generation);
        }
        self.remember(written);
        Ok(())
    }

    /// Note a Lease the server returned for our write.
    fn remember(&mut self, written: Lease) {
        self.observation = Some(Observation::after_read(
            self.observation.take(),
            &written,
            Instant::now(),
        ));
        self.last_seen = Some(written);
    }

    /// Note a Lease we read.
    fn observe(&mut self, read: &Lease) {
        self.observation = Some(Observation::after_read(
            self.observation.take(),
            read,
            Instant::now(),
        ));
        self.maybe_holding = holder_of(read.spec.as_ref()) == Some(self.config.identity.as_str());
        self.last_seen = Some(read.clone());
    }

    /// One standby try: client-go `tryAcquireOrRenew` without the fast path.
    async fn try_acquire(&mut self) -> Acquire {
        let lease = self.config.describe();
        let read = match self.get().await {
            Ok(read) => read,
            Err(error) if error.is_not_found() => return self.create().await,
            Err(error) => {
                tracing::warn!(%lease, %error, "reading the Lease failed");
                return Acquire::Standby { holder: None };
            }
        };
        self.observe(&read);
        let holder = holder_of(read.spec.as_ref()).map(str::to_owned);
        if let (Some(other), Some(seen)) = (&holder, &self.observation)
            && *other != self.config.identity
            && !self.take_at_once
            && seen.is_valid(Instant::now(), self.config.lease_duration)
        {
            tracing::debug!(%lease, holder = %other, "the Lease is held and valid");
            return Acquire::Standby { holder };
        }
        if let Some(intents) = &self.intents {
            // The intents of every write a predecessor may still land: ours to keep and resolve.
            match intents_of(&read) {
                Ok(inherited) => intents.inherit(inherited),
                Err(error) => {
                    tracing::error!(%lease, %error, "not taking the Lease");
                    return Acquire::Standby { holder };
                }
            }
        }
        let old = read.spec.clone().unwrap_or_default();
        let spec = claimed_spec(
            &old,
            &self.config.identity,
            self.lease_seconds,
            Timestamp::now(),
        );
        let epoch = spec.lease_transitions;
        match self.update(&read, spec).await {
            Ok(()) => {
                if let Some(intents) = &self.intents {
                    intents.set_epoch(epoch.map_or(0, |t| u64::try_from(t).unwrap_or(0)));
                }
                Acquire::Acquired
            }
            Err(error) => {
                if error.status_code() == Some(409) {
                    tracing::debug!(%lease, "another elector updated the Lease first");
                } else {
                    tracing::warn!(%lease, %error, "taking the Lease failed");
                }
                Acquire::Standby { holder }
            }
        }
    }

    /// CREATE the Lease naming us.
    async fn create(&mut self) -> Acquire {
        let carried = self.intents.as_ref().map(|intents| intents.snapshot());
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(self.config.name.clone()),
                namespace: Some(self.config.namespace.clone()),
                annotations: carried.as_ref().map(|(_, text)| {
                    [(WRITE_INTENTS_ANNOTATION.to_owned(), text.clone())]
                        .into_iter()
                        .collect()
                }),
                ..ObjectMeta::default()
            },
            spec: Some(created_spec(
                &self.config.identity,
                self.lease_seconds,
                Timestamp::now(),
            )),
        };
        self.maybe_holding = true;
        match self
            .request(self.api.create(&PostParams::default(), &lease))
            .await
        {
            Ok(written) => {
                if let (Some(intents), Some((generation, _))) = (&self.intents, carried) {
                    intents.committed(generation);
                    // A created Lease starts at leaseTransitions 0.
                    intents.set_epoch(0);
                }
                self.remember(written);
                Acquire::Acquired
            }
            Err(error) => {
                // 409 AlreadyExists: another elector created it first.
                if error.status_code() != Some(409) {
                    tracing::warn!(lease = %self.config.describe(), %error, "creating the Lease failed");
                }
                Acquire::Standby { holder: None }
            }
        }
    }

    /// One leader try: the optimistic UPDATE of our last write, else GET + UPDATE.
    async fn try_renew(&mut self) -> Renew {
        let identity = self.config.identity.clone();
        let now = Timestamp::now();
        if let Some(last) = self.last_seen.clone()
            && holder_of(last.spec.as_ref()) == Some(identity.as_str())
        {
            let old = last.spec.clone().unwrap_or_default();
            let spec = claimed_spec(&old, &identity, self.lease_seconds, now);
            match self.update(&last, spec).await {
                Ok(()) => return Renew::Renewed,
                Err(error) => {
                    tracing::debug!(lease = %self.config.describe(), %error, "optimistic renewal failed; reading the Lease");
                }
            }
        }
        let read = match self.get().await {
            Ok(read) => read,
            Err(error) if error.is_not_found() => return Renew::Superseded { holder: None },
            Err(error) => return Renew::Failed(error),
        };
        self.observe(&read);
        match holder_of(read.spec.as_ref()) {
            Some(holder) if holder == identity => {
                let old = read.spec.clone().unwrap_or_default();
                let spec = claimed_spec(&old, &identity, self.lease_seconds, Timestamp::now());
                match self.update(&read, spec).await {
                    Ok(()) => Renew::Renewed,
                    Err(error) => Renew::Failed(error),
                }
            }
            other => Renew::Superseded {
                holder: other.map(str::to_owned),
            },
        }
    }

    /// Shutdown: release if we (may) hold the Lease, publish `Stopped`.
    async fn stop(
        &mut self,
        state: &watch::Sender<Leadership>,
        leading: bool,
    ) -> Result<(), LeaderError> {
        let lease = self.config.describe();
        let result = if leading || self.maybe_holding {
            let deadline = Instant::now()
                .checked_add(self.config.renew_deadline)
                .unwrap_or_else(Instant::now);
            match timeout_at(deadline, self.release()).await {
                Ok(Ok(released)) => {
                    if released {
                        tracing::info!(%lease, "released the Lease");
                    }
                    Ok(())
                }
                Ok(Err(source)) => Err(LeaderError::Release { lease, source }),
                Err(_elapsed) => Err(LeaderError::Release {
                    lease,
                    source: RequestError::TimedOut(self.config.renew_deadline),
                }),
            }
        } else {
            Ok(())
        };
        state.send_replace(Leadership::Stopped);
        result
    }

    /// client-go `release`: UPDATE to no holder if the Lease names us. `Ok(false)`: it did not
    /// name us (or is gone), nothing to do.
    async fn release(&mut self) -> Result<bool, RequestError> {
        let identity = self.config.identity.clone();
        if let Some(last) = self.last_seen.clone()
            && holder_of(last.spec.as_ref()) == Some(identity.as_str())
        {
            let spec = released_spec(&last.spec.clone().unwrap_or_default(), Timestamp::now());
            match self.update(&last, spec).await {
                Ok(()) => {
                    self.maybe_holding = false;
                    return Ok(true);
                }
                Err(error) => {
                    tracing::debug!(lease = %self.config.describe(), %error, "releasing with our last write's version failed; reading the Lease");
                }
            }
        }
        let read = match self.get().await {
            Ok(read) => read,
            Err(error) if error.is_not_found() => return Ok(false),
            Err(error) => return Err(error),
        };
        self.observe(&read);
        if holder_of(read.spec.as_ref()) != Some(identity.as_str()) {
            return Ok(false);
        }
        let spec = released_spec(&read.spec.clone().unwrap_or_default(), Timestamp::now());
        self.update(&read, spec).await?;
        self.maybe_holding = false;
        Ok(true)
    }
}

#[cfg(test)]
mod tests;
