//! Writes in doubt: PATCHes of `spec.podCIDR(s)` that ended without a definite outcome (a dropped
//! connection, a 5xx or 504 answered early, no answer in time — [`PatchOutcome::Unknown`]), which
//! the API server may still apply until the request's own deadline (`timeout=`, the request
//! timeout, counted from when the server received it).
//!
//! The allocator keeps such a write's block reserved (see `reconcile`), so this replica never
//! hands it out twice. Another replica would: after a clean stop the Lease is released, and a
//! standby that takes it, lists and sees the Node without podCIDRs gives the block to another
//! Node — and then the late write lands (issue 15, item 1). So a stopping leader keeps the Lease,
//! renewing it, until every write it has in doubt can no longer land ([`InDoubtWrites::pending`]).
//!
//! A write's deadline is counted from when its answer (or the dropped connection) reached us: the
//! server received the request before that, so its own deadline (receipt + request timeout) is not
//! later. A write is settled early when a later PATCH of the same Node was applied, or refused
//! because the Node's podCIDRs are already set: `spec.podCIDRs` cannot change once set, so the
//! write in doubt can then only repeat the value or be refused.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use tokio::time::Instant;

use crate::reconcile::{CannotApplyKind, NodeName, PatchOutcome};

/// The writes in doubt of one allocating term, per Node: the latest instant until which one of
/// them may still be applied. Shared by the workers (which record outcomes) and the stop path
/// (which waits them out before releasing the Lease).
#[derive(Debug, Default)]
pub struct InDoubtWrites {
    until: Mutex<HashMap<NodeName, Instant>>,
}

/// What a stopping leader waits for: how many Nodes have a write in doubt, and until when the last
/// of those writes may land.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Pending {
    /// Nodes with a write in doubt whose deadline has not passed.
    pub writes: usize,
    /// The latest of their deadlines (local monotonic time).
    pub until: Instant,
}

impl InDoubtWrites {
    /// No write in doubt.
    pub fn new() -> InDoubtWrites {
        InDoubtWrites::default()
    }

    /// Records how a PATCH of `name` ended, `answered_at` being when its answer (or the error)
    /// reached us and `request_timeout` the `timeout=` it was sent with. An unknown outcome keeps
    /// the Node in doubt until `answered_at + request_timeout` (the latest of its writes'); an
    /// applied write, or a refusal because the podCIDRs are already set, settles it; any other
    /// outcome changes nothing (an earlier write may still land).
    pub fn record(
        &self,
        name: &NodeName,
        answered_at: Instant,
        request_timeout: Duration,
        outcome: &PatchOutcome,
    ) {
        let mut until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        match outcome {
            PatchOutcome::Unknown { .. } => {
                // Saturating: an overflow (never with a validated timeout) waits as long as time
                // goes.
                let deadline = answered_at
                    .checked_add(request_timeout)
                    .unwrap_or(answered_at + Duration::from_secs(86_400 * 365));
                let entry = until.entry(name.clone()).or_insert(deadline);
                *entry = (*entry).max(deadline);
            }
            PatchOutcome::Applied(_)
            | PatchOutcome::CannotApply {
                kind: CannotApplyKind::PodCidrsAlreadySet,
                ..
            } => {
                until.remove(name);
            }
            _ => {}
        }
    }

    /// Every Node with a write in doubt and the latest instant one of its writes may land (expired
    /// ones included, until settled), sorted by name. For the model checker
    /// (`model-check/tests/model_check.rs`), which carries this state from step to step.
    #[doc(hidden)]
    pub fn deadlines(&self) -> Vec<(NodeName, Instant)> {
        let until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<(NodeName, Instant)> =
            until.iter().map(|(name, at)| (name.clone(), *at)).collect();
        all.sort();
        all
    }

    /// The writes in doubt whose deadline is after `now` (`None`: nothing can land any more).
    pub fn pending(&self, now: Instant) -> Option<Pending> {
        let until = self.until.lock().unwrap_or_else(PoisonError::into_inner);
        let live = until.values().filter(|deadline| **deadline > now);
        let writes = live.clone().count();
        let latest = live.max().copied()?;
        Some(Pending {
            writes,
            until: latest,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reconcile::CannotApplyKind;

    fn unknown() -> PatchOutcome {
        PatchOutcome::Unknown {
            message: "connection closed before the answer".to_owned(),
        }
    }

    fn name(n: &str) -> NodeName {
        NodeName::from(n)
    }

    #[tokio::test(start_paused = true)]
    async fn an_unknown_outcome_is_pending_until_its_deadline_and_the_latest_counts() {
        let writes = InDoubtWrites::new();
        let t = Duration::from_secs(10);
        let start = Instant::now();
        assert_eq!(writes.pending(start), None);
        writes.record(&name("a"), start, t, &unknown());
        writes.record(&name("b"), start + Duration::from_secs(3), t, &unknown());
        writes.record(&name("a"), start + Duration::from_secs(1), t, &unknown());
        assert_eq!(
            writes.pending(start + Duration::from_secs(5)),
            Some(Pending {
                writes: 2,
                until: start + Duration::from_secs(13)
            })
        );
        assert_eq!(
            writes.pending(start + Duration::from_secs(12)),
            Some(Pending {
                writes: 1,
                until: start + Duration::from_secs(13)
            }),
            "a's last write may land until 11 s: passed"
        );
        assert_eq!(writes.pending(start + Duration::from_secs(13)), None);
    }

    #[tokio::test(start_paused = true)]
    async fn only_a_set_pod_cidr_settles_a_write_in_doubt() {
        let writes = InDoubtWrites::new();
        let t = Duration::from_secs(2);
        let now = Instant::now();
        for n in [
            "applied",
            "already-set",
            "refused",
            "retry",
            "gone",
            "replaced",
        ] {
            writes.record(&name(n), now, t, &unknown());
        }
        let view = crate::reconcile::NodeView {
            name: name("applied"),
            pod_cidr: Some("10.244.0.0/24".to_owned()),
            pod_cidrs: vec!["10.244.0.0/24".to_owned()],
            deleting: false,
            uid: Some("uid-applied".to_owned()),
            labels: Default::default(),
        };
        writes.record(&name("applied"), now, t, &PatchOutcome::Applied(view));
        writes.record(
            &name("already-set"),
            now,
            t,
            &PatchOutcome::CannotApply {
                kind: CannotApplyKind::PodCidrsAlreadySet,
                message: "field is immutable".to_owned(),
            },
        );
        writes.record(
            &name("refused"),
            now,
            t,
            &PatchOutcome::Refused {
                status: 403,
                message: "forbidden".to_owned(),
            },
        );
        writes.record(
            &name("retry"),
            now,
            t,
            &PatchOutcome::RetryLater {
                status: 429,
                retry_after: None,
                message: "slow down".to_owned(),
            },
        );
        writes.record(&name("gone"), now, t, &PatchOutcome::NotFound);
        writes.record(
            &name("replaced"),
            now,
            t,
            &PatchOutcome::CannotApply {
                kind: CannotApplyKind::NodeReplaced,
                message: "uid mismatch".to_owned(),
            },
        );
        assert_eq!(
            writes.pending(now).map(|p| p.writes),
            Some(4),
            "refused, retry, gone and replaced may still see their first write land"
        );
    }
}
