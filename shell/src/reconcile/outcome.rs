//! What a PATCH of `spec.podCIDR(s)` ended with ([`PatchOutcome`]) and the rule for each outcome:
//! an unknown outcome never releases; a write that can never apply releases; an applied one holds.

use std::time::Duration;

use nodeipam_core::Cidr;
use serde_json::{Value, json};

use super::{
    Action, Allocator, Decision, MetricEvent, Next, NodeView, PendingWrite, RecordState,
    assignment_failed, join,
};

/// Upstream's `cidrUpdateRetries`: after this many failed PATCHes in a row a `CIDRAssignmentFailed`
/// event is published (every failure is logged and counted).
pub const FAILED_PATCHES_BEFORE_EVENT: u32 = 3;

/// The strategic-merge patch that assigns `pod_cidrs` (upstream's `PatchNodeCIDRs` body), pinned
/// to the Node object `uid` when it is known: kube-apiserver then refuses to apply it to any other
/// object of that name (422 `metadata.uid: field is immutable`, from `rest.BeforeUpdate` →
/// `ValidateObjectMetaAccessorUpdate`), so a write that lands late can never reach a re-created
/// Node.
pub fn pod_cidrs_patch(pod_cidrs: &[Cidr], uid: Option<&str>) -> Value {
    let texts: Vec<String> = pod_cidrs.iter().map(Cidr::to_string).collect();
    let spec = json!({"podCIDR": texts.first(), "podCIDRs": texts});
    match uid {
        Some(uid) => json!({"metadata": {"uid": uid}, "spec": spec}),
        None => json!({"spec": spec}),
    }
}

/// How a PATCH of `spec.podCIDR(s)` ended, as far as the API server told us. Built by the
/// controller from the HTTP result (see `controller::patch::classify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PatchOutcome {
    /// 2xx: applied; the Node as the server returned it.
    Applied(NodeView),
    /// 404: no Node of that name (the object the write was for is gone).
    NotFound,
    /// The server refused the write for good and a write of the same body can never apply:
    /// 422 because podCIDRs are already set to other values (immutable), because the Node was
    /// replaced (`metadata.uid` differs), or because the value is invalid. Nothing was written.
    CannotApply {
        /// Which of the three.
        kind: CannotApplyKind,
        /// The server's message.
        message: String,
    },
    /// The server refused this attempt (400, 401, 403, …): nothing was written, but a later
    /// attempt may succeed.
    Refused {
        /// HTTP status.
        status: u16,
        /// The server's message.
        message: String,
    },
    /// The server asked to retry (409 Conflict, 429 TooManyRequests): nothing was written.
    RetryLater {
        /// HTTP status.
        status: u16,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The server's message.
        message: String,
    },
    /// Whether the write was applied is unknown: the client timed out, the connection closed
    /// after the request was sent, or the server answered 5xx/504. It may still land.
    Unknown {
        /// What happened.
        message: String,
    },
    /// The request was never sent (e.g. the connection could not be opened): nothing was written.
    NotSent {
        /// What happened.
        message: String,
    },
}

/// Why a PATCH can never apply (see [`PatchOutcome::CannotApply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CannotApplyKind {
    /// `spec.podCIDR(s)` already hold other values (422 on `spec.podCIDRs`).
    PodCidrsAlreadySet,
    /// The Node of that name is another object now (422 on `metadata.uid`).
    NodeReplaced,
    /// The server found the patch invalid for another reason (422).
    Invalid,
}

impl PatchOutcome {
    /// The bounded `error` label of `node_ipam_controller_patch_failures_total`.
    pub fn metric_label(&self) -> &'static str {
        match self {
            PatchOutcome::Applied(_) => "none",
            PatchOutcome::NotFound => "not_found",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::PodCidrsAlreadySet,
                ..
            } => "pod_cidrs_already_set",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::NodeReplaced,
                ..
            } => "node_replaced",
            PatchOutcome::CannotApply {
                kind: CannotApplyKind::Invalid,
                ..
            } => "invalid",
            PatchOutcome::Refused { .. } => "refused",
            PatchOutcome::RetryLater { status: 429, .. } => "too_many_requests",
            PatchOutcome::RetryLater { .. } => "conflict",
            PatchOutcome::Unknown { .. } => "unknown_outcome",
            PatchOutcome::NotSent { .. } => "not_sent",
        }
    }

    /// One line describing the failure (empty for [`PatchOutcome::Applied`]).
    pub fn describe(&self) -> String {
        match self {
            PatchOutcome::Applied(_) => String::new(),
            PatchOutcome::NotFound => "the Node is gone (404)".to_owned(),
            PatchOutcome::CannotApply { message, .. } => format!("refused (422): {message}"),
            PatchOutcome::Refused { status, message } => format!("refused ({status}): {message}"),
            PatchOutcome::RetryLater {
                status, message, ..
            } => format!("retry later ({status}): {message}"),
            PatchOutcome::Unknown { message } => format!("outcome unknown: {message}"),
            PatchOutcome::NotSent { message } => format!("not sent: {message}"),
        }
    }
}

/// The write a [`PatchOutcome`] is about: the PATCH of Node `name` (object `uid`) assigning
/// `pod_cidrs`.
#[derive(Debug, Clone, Copy)]
struct Write<'a> {
    name: &'a str,
    uid: Option<&'a str>,
    pod_cidrs: &'a [Cidr],
}

impl Allocator {
    /// The PATCH of Node `name` (object `uid`) assigning `pod_cidrs` ended with `outcome`. If the
    /// reservation it was sent for is no longer pending (the Node was deleted or replaced
    /// meanwhile), only an applied write matters: the Node is decided on as the server returned it.
    /// Each outcome's rule is one function below.
    pub fn patch_outcome(
        &mut self,
        name: &str,
        uid: Option<&str>,
        pod_cidrs: &[Cidr],
        outcome: PatchOutcome,
    ) -> Decision {
        let write = Write {
            name,
            uid,
            pod_cidrs,
        };
        let Some(pending) = self.pending_write(write) else {
            return match outcome {
                PatchOutcome::Applied(view) => self.decide_fresh(&view),
                _ => Decision::new(Action::Skip {
                    reason: "the reservation this write was for is gone".to_owned(),
                }),
            };
        };
        let failed = MetricEvent::PatchFailed {
            error: outcome.metric_label(),
        };
        match outcome {
            PatchOutcome::Applied(view) => self.write_applied(write, &view),
            PatchOutcome::NotFound => self.object_gone(name, uid).after_metrics(vec![failed]),
            PatchOutcome::CannotApply { kind, message } => {
                self.write_cannot_apply(write, kind, &message, failed)
            }
            PatchOutcome::Refused { ref message, .. } if !pending.maybe_sent => {
                self.write_refused(write, message, failed)
            }
            other => self.keep_trying(write, pending, &other, failed),
        }
    }

    /// The pending write's history, if `write` is what the record for its name still waits on
    /// (same object, same CIDRs, still pending).
    fn pending_write(&self, write: Write<'_>) -> Option<PendingWrite> {
        let record = self.nodes.get(write.name)?;
        match record.state {
            RecordState::Pending(pending)
                if record.is_for(write.uid) && *record.held == *write.pod_cidrs =>
            {
                Some(pending)
            }
            _ => None,
        }
    }

    /// 2xx: the Node as the server returned it shows our CIDRs on our object (held), or something
    /// else (decided on afresh).
    fn write_applied(&mut self, write: Write<'_>, view: &NodeView) -> Decision {
        if view.uid.as_deref() == write.uid
            && view.parsed_pod_cidrs().as_deref() == Some(write.pod_cidrs)
        {
            if let Some(record) = self.nodes.get_mut(write.name) {
                record.state = RecordState::Held;
            }
            Decision::new(Action::Keep {
                pod_cidrs: write.pod_cidrs.to_vec(),
            })
        } else {
            self.decide_fresh(view)
        }
    }

    /// 422: no attempt of this body can ever apply (podCIDRs are immutable once set, the object
    /// is another one, or the value is refused), earlier ones included: release, then read the
    /// Node. Only an invalid value gets an event (the other two are someone else's write).
    fn write_cannot_apply(
        &mut self,
        write: Write<'_>,
        kind: CannotApplyKind,
        message: &str,
        failed: MetricEvent,
    ) -> Decision {
        let released = self.forget(write.name);
        let mut decision = Decision::new(Action::Released {
            pod_cidrs: write.pod_cidrs.to_vec(),
        })
        .then(Next::Reread)
        .after_metrics(released);
        decision.metrics.insert(0, failed);
        if kind == CannotApplyKind::Invalid {
            decision
                .events
                .push(assignment_failed(write.name, write.pod_cidrs, message));
        }
        decision
    }

    /// Refused (400, 401, 403, …) and no earlier attempt may have landed: definitely not written,
    /// so the block is freed and the Node allocated again after its backoff.
    fn write_refused(&mut self, write: Write<'_>, message: &str, failed: MetricEvent) -> Decision {
        let released = self.forget(write.name);
        let mut decision = Decision::new(Action::Released {
            pod_cidrs: write.pod_cidrs.to_vec(),
        })
        .then(Next::RetryBackoff)
        .after_metrics(released);
        decision.metrics.insert(0, failed);
        decision
            .events
            .push(assignment_failed(write.name, write.pod_cidrs, message));
        decision
    }

    /// Unknown outcome, not sent, retry later, or refused after an attempt in doubt: the
    /// reservation is kept and the same CIDRs are sent again (after `Retry-After` when the server
    /// gave one); the event comes after [`FAILED_PATCHES_BEFORE_EVENT`] failures in a row.
    fn keep_trying(
        &mut self,
        write: Write<'_>,
        mut pending: PendingWrite,
        outcome: &PatchOutcome,
        failed: MetricEvent,
    ) -> Decision {
        pending.failures = pending.failures.saturating_add(1);
        if matches!(outcome, PatchOutcome::Unknown { .. }) {
            pending.maybe_sent = true;
        }
        if let Some(record) = self.nodes.get_mut(write.name) {
            record.state = RecordState::Pending(pending);
        }
        let next = match outcome {
            PatchOutcome::RetryLater {
                retry_after: Some(after),
                ..
            } => Next::RetryAfter(*after),
            _ => Next::RetryBackoff,
        };
        let reason = if pending.maybe_sent {
            format!(
                "{}; the write may still land, so {} stays reserved and is sent again",
                outcome.describe(),
                join(write.pod_cidrs)
            )
        } else {
            format!(
                "{}; sending {} again",
                outcome.describe(),
                join(write.pod_cidrs)
            )
        };
        let mut decision = Decision::new(Action::KeepTrying {
            pod_cidrs: write.pod_cidrs.to_vec(),
            reason,
        })
        .then(next);
        decision.metrics.push(failed);
        if pending.failures == FAILED_PATCHES_BEFORE_EVENT {
            decision.events.push(assignment_failed(
                write.name,
                write.pod_cidrs,
                &outcome.describe(),
            ));
        }
        decision
    }

    /// The PATCH definitely failed and no earlier attempt can land: releases Node `name`'s pending
    /// reservation (if any), so the next attempt allocates again. Held and skipped records are
    /// left alone. (`plan` and tests; the controller uses [`Allocator::patch_outcome`].)
    pub fn abort(&mut self, name: &str) -> Decision {
        if !self.is_pending(name) {
            return Decision::new(Action::Released {
                pod_cidrs: Vec::new(),
            });
        }
        self.release_record(name)
    }

    /// The PATCH assigning `pod_cidrs` to Node `name` succeeded: the pending reservation becomes
    /// held. Returns false (and changes nothing) if `name` had no such pending reservation.
    pub fn confirm(&mut self, name: &str, pod_cidrs: &[Cidr]) -> bool {
        match self.nodes.get_mut(name) {
            Some(record)
                if matches!(record.state, RecordState::Pending(_))
                    && *record.held == *pod_cidrs =>
            {
                record.state = RecordState::Held;
                true
            }
            _ => false,
        }
    }
}
