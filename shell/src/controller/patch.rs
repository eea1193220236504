//! The one write this controller makes to a Node — the strategic-merge PATCH of
//! `spec.podCIDR(s)`, pinned to the Node's uid — and the classification of how it ended into a
//! [`PatchOutcome`] (what may have been written, what certainly was not).
//!
//! Every PATCH carries `timeout=<request timeout>`: kube-apiserver then gives up on the request
//! itself at that deadline (its `timeout` query parameter, `endpoints/handlers/rest.go`
//! `parseTimeout`), so a write whose answer we never saw stops being able to land soon after the
//! client gave up — which the leader-election write fence relies on.

use std::time::Duration;

use kube::Client;
use kube::api::{Patch, PatchParams};
use kube::core::Status;
use nodeipam_core::Cidr;
use serde_json::Value;

use super::node::SlimNode;
use crate::kube_error::{error_chain, is_client_broken, is_connect_error};
use crate::reconcile::{CannotApplyKind, PatchOutcome, pod_cidrs_patch};

/// How one PATCH ended.
#[derive(Debug, Clone, PartialEq)]
pub struct PatchResult {
    /// What the API server said, classified.
    pub outcome: PatchOutcome,
    /// `metadata.resourceVersion` of the Node the server returned (an applied write only).
    pub resource_version: Option<String>,
    /// `Some(why)` when the client itself is broken for good ([`crate::kube_error::is_client_broken`]).
    pub broken: Option<String>,
}

/// PATCHes Node `name`'s `spec.podCIDR(s)` to `pod_cidrs`, pinned to the Node object `uid` (the
/// body is [`pod_cidrs_patch`]: upstream's `PatchNodeCIDRs` body plus `metadata.uid`), as
/// [`patch_pod_cidrs`] does.
pub async fn assign_pod_cidrs(
    client: &Client,
    field_manager: &str,
    name: &str,
    (pod_cidrs, uid): (&[Cidr], Option<&str>),
    request_timeout: Duration,
) -> PatchResult {
    let body = pod_cidrs_patch(pod_cidrs, uid);
    patch_pod_cidrs(client, field_manager, name, &body, request_timeout).await
}

/// Sends the PATCH `body` to Node `name` and waits at most `request_timeout` for the answer (the
/// server is told the same deadline).
pub async fn patch_pod_cidrs(
    client: &Client,
    field_manager: &str,
    name: &str,
    body: &Value,
    request_timeout: Duration,
) -> PatchResult {
    let ended = |outcome, broken| PatchResult {
        outcome,
        resource_version: None,
        broken,
    };
    let request = match build_request(field_manager, name, body, request_timeout) {
        Ok(request) => request,
        Err(message) => return ended(PatchOutcome::NotSent { message }, None),
    };
    let wait = request_timeout;
    match tokio::time::timeout(wait, client.request::<SlimNode>(request)).await {
        Ok(Ok(node)) => PatchResult {
            outcome: PatchOutcome::Applied(node.view()),
            resource_version: node.metadata.resource_version,
            broken: None,
        },
        Ok(Err(error)) => {
            let broken = is_client_broken(&error).then(|| error_chain(&error));
            ended(classify_error(&error), broken)
        }
        Err(_) => ended(
            PatchOutcome::Unknown {
                message: format!("no answer within {wait:?}"),
            },
            None,
        ),
    }
}

/// The `timeout` query value for a request the client gives up on after `request_timeout`: whole
/// seconds as `10s`, anything else in milliseconds (`500ms`, `1500ms`; kube-apiserver reads it
/// with Go's `time.ParseDuration`, `endpoints/filters/request_deadline.go` `parseTimeout`). Never
/// longer than `request_timeout` (sub-millisecond parts are dropped; at least `1ms`), so the server
/// gives up no later than the client and the write fences that count on it. (Rounding a
/// sub-second timeout up to `1s` let a write land after a restarted controller's start-up fence.)
fn server_timeout(request_timeout: Duration) -> String {
    if request_timeout.subsec_nanos() == 0 && request_timeout.as_secs() > 0 {
        format!("{}s", request_timeout.as_secs())
    } else {
        format!("{}ms", request_timeout.as_millis().max(1))
    }
}

fn build_request(
    field_manager: &str,
    name: &str,
    body: &Value,
    request_timeout: Duration,
) -> Result<http::Request<Vec<u8>>, String> {
    let params = PatchParams {
        field_manager: Some(field_manager.to_owned()),
        ..PatchParams::default()
    };
    let request = kube::core::Request::new("/api/v1/nodes")
        .patch(name, &params, &Patch::Strategic(body))
        .map_err(|e| e.to_string())?;
    let (mut parts, body) = request.into_parts();
    // kube-core's query builder starts every query with `?&`; send a clean one.
    let uri = parts.uri.to_string().replacen("?&", "?", 1);
    let separator = if uri.contains('?') { '&' } else { '?' };
    let timeout = server_timeout(request_timeout);
    parts.uri = format!("{uri}{separator}timeout={timeout}")
        .parse()
        .map_err(|e: http::uri::InvalidUri| e.to_string())?;
    Ok(http::Request::from_parts(parts, body))
}

/// How a failed request ended. Rules (the status codes kube-apiserver uses, and what they mean
/// for whether the write happened):
///
/// | answer | outcome |
/// |---|---|
/// | 404 NotFound about `nodes` (`details.kind`) | [`PatchOutcome::NotFound`] |
/// | any other 404 (no `Status`, another reason or kind: a proxy, a wrong route) | `Unknown`: nothing says the Node is gone, so its reservation is kept and the Node read again |
/// | 422 Invalid, cause on `spec.podCIDR(s)` | [`PatchOutcome::CannotApply`] `PodCidrsAlreadySet` (`ValidateNodeUpdate`: podCIDRs may only change from empty) |
/// | 422 Invalid, cause on `metadata.uid` | `CannotApply` `NodeReplaced` (`ValidateObjectMetaUpdate`: uid is immutable) |
/// | other 422 | `CannotApply` `Invalid` |
/// | 409 Conflict, 429 TooManyRequests | [`PatchOutcome::RetryLater`] (with `details.retryAfterSeconds`) |
/// | 408, 5xx (incl. 504 Timeout) | [`PatchOutcome::Unknown`]: the server may have applied it |
/// | other 4xx | [`PatchOutcome::Refused`] |
/// | connection could not be opened | [`PatchOutcome::NotSent`] |
/// | any other transport error, an unreadable 2xx body | `Unknown` |
pub fn classify_error(error: &kube::Error) -> PatchOutcome {
    match error {
        kube::Error::Api(status) => classify_status(status),
        kube::Error::Service(source) if is_connect_error(source.as_ref()) => {
            PatchOutcome::NotSent {
                message: error_chain(error),
            }
        }
        kube::Error::BuildRequest(_) => PatchOutcome::NotSent {
            message: error_chain(error),
        },
        _ => PatchOutcome::Unknown {
            message: error_chain(error),
        },
    }
}

/// Whether a 404 is kube-apiserver's answer for a Node that does not exist: reason `NotFound`
/// and `details.kind` `nodes` (what `errors.NewNotFound` sends; checked on the real server by
/// the fidelity suite's PATCH of a missing Node). Any other 404 — a proxy's page, a route that is
/// not served — says nothing about the Node, and reading it as "gone" would drop the record of a
/// Node that still exists (found by a hostile run). The re-read's GET follows the same rule.
pub fn is_node_not_found(status: &Status) -> bool {
    status.reason == "NotFound" && status.details.as_ref().is_some_and(|d| d.kind == "nodes")
}

/// The outcome an error `Status` from the API server stands for (see [`classify_error`]).
pub fn classify_status(status: &Status) -> PatchOutcome {
    let message = format!("{} {}: {}", status.code, status.reason, status.message);
    match status.code {
        404 if is_node_not_found(status) => PatchOutcome::NotFound,
        404 => PatchOutcome::Unknown {
            message: format!(
                "{message} (a 404 that is not kube-apiserver's NotFound for a Node: treated as unknown, the Node is read again)"
            ),
        },
        422 => {
            let fields: Vec<&str> = status
                .details
                .iter()
                .flat_map(|d| d.causes.iter())
                .map(|c| c.field.as_str())
                .collect();
            let kind = if fields.iter().any(|f| f.starts_with("metadata.uid")) {
                CannotApplyKind::NodeReplaced
            } else if fields.iter().any(|f| f.starts_with("spec.podCIDR")) {
                CannotApplyKind::PodCidrsAlreadySet
            } else {
                CannotApplyKind::Invalid
            };
            PatchOutcome::CannotApply { kind, message }
        }
        409 | 429 => PatchOutcome::RetryLater {
            status: status.code,
            retry_after: status
                .details
                .as_ref()
                .map(|d| d.retry_after_seconds)
                .filter(|s| *s > 0)
                .map(|s| Duration::from_secs(u64::from(s.min(600)))),
            message,
        },
        408 | 500..=599 => PatchOutcome::Unknown { message },
        400..=499 => PatchOutcome::Refused {
            status: status.code,
            message,
        },
        _ => PatchOutcome::Unknown { message },
    }
}

#[cfg(test)]
mod tests {
    use kube::core::response::{StatusCause, StatusDetails};

    use super::*;

    fn status(code: u16, reason: &str, fields: &[&str], retry_after: u32) -> Status {
        let mut status = Status::failure("message", reason).with_code(code);
        status.details = Some(StatusDetails {
            name: "n".to_owned(),
            group: String::new(),
            kind: "nodes".to_owned(),
            uid: String::new(),
            causes: fields
                .iter()
                .map(|f| StatusCause {
                    reason: "FieldValueInvalid".to_owned(),
                    message: "field is immutable".to_owned(),
                    field: (*f).to_owned(),
                })
                .collect(),
            retry_after_seconds: retry_after,
        });
        status
    }

    /// Every row of the table in [`classify_error`]'s documentation.
    #[test]
    fn status_codes_map_to_outcomes() {
        let label = |s: Status| classify_status(&s).metric_label();
        assert_eq!(label(status(404, "NotFound", &[], 0)), "not_found");
        // A 404 that is not the API server's NotFound for a Node says nothing about the Node.
        let mut proxy = Status::failure("404 page not found", "").with_code(404);
        assert_eq!(label(proxy.clone()), "unknown_outcome");
        proxy.reason = "NotFound".to_owned();
        assert_eq!(
            label(proxy),
            "unknown_outcome",
            "no details: not about a Node"
        );
        let mut route = status(404, "NotFound", &[], 0);
        if let Some(details) = route.details.as_mut() {
            details.kind = "leases".to_owned();
        }
        assert_eq!(label(route), "unknown_outcome");
        assert_eq!(
            label(status(422, "Invalid", &["spec.podCIDRs"], 0)),
            "pod_cidrs_already_set"
        );
        assert_eq!(
            label(status(422, "Invalid", &["spec.podCIDR"], 0)),
            "pod_cidrs_already_set"
        );
        assert_eq!(
            label(status(422, "Invalid", &["metadata.uid"], 0)),
            "node_replaced"
        );
        assert_eq!(
            label(status(422, "Invalid", &["spec.taints"], 0)),
            "invalid"
        );
        assert_eq!(label(status(409, "Conflict", &[], 0)), "conflict");
        assert_eq!(
            classify_status(&status(429, "TooManyRequests", &[], 7)),
            PatchOutcome::RetryLater {
                status: 429,
                retry_after: Some(Duration::from_secs(7)),
                message: "429 TooManyRequests: message".to_owned(),
            }
        );
        for code in [408, 500, 502, 503, 504] {
            assert_eq!(
                label(status(code, "x", &[], 0)),
                "unknown_outcome",
                "{code}"
            );
        }
        for code in [400, 401, 403, 405, 413, 415] {
            assert_eq!(label(status(code, "x", &[], 0)), "refused", "{code}");
        }
    }

    #[test]
    fn the_request_names_the_node_pins_the_uid_and_bounds_the_server_side() {
        let body = crate::reconcile::pod_cidrs_patch(
            &[nodeipam_core::Cidr::parse("10.0.0.0/24").expect("cidr")],
            Some("uid-1"),
        );
        let request = build_request(
            "nodeipam-controller",
            "node-a",
            &body,
            Duration::from_secs(10),
        )
        .expect("builds");
        assert_eq!(request.method(), http::Method::PATCH);
        assert_eq!(
            request.uri().to_string(),
            "/api/v1/nodes/node-a?fieldManager=nodeipam-controller&timeout=10s"
        );
        assert_eq!(
            request
                .headers()
                .get(http::header::CONTENT_TYPE)
                .and_then(|v| v.to_str().ok()),
            Some("application/strategic-merge-patch+json")
        );
        let sent: Value = serde_json::from_slice(request.body()).expect("JSON body");
        assert_eq!(
            sent,
            serde_json::json!({"metadata":{"uid":"uid-1"},"spec":{"podCIDR":"10.0.0.0/24","podCIDRs":["10.0.0.0/24"]}})
        );
    }

    /// Found by the chaos suite: a 500 ms request timeout was sent as `timeout=1s`, so the server
    /// could apply a write half a second after the client (and a restarted controller's start-up
    /// fence) had given up on it.
    #[test]
    fn the_server_is_never_given_longer_than_the_client_waits() {
        let body = crate::reconcile::pod_cidrs_patch(
            &[nodeipam_core::Cidr::parse("10.0.0.0/24").expect("cidr")],
            Some("uid-1"),
        );
        for (timeout, query) in [
            (Duration::from_millis(500), "timeout=500ms"),
            (Duration::from_millis(1500), "timeout=1500ms"),
            (Duration::from_secs(1), "timeout=1s"),
            (Duration::from_secs(10), "timeout=10s"),
            (Duration::from_micros(1500), "timeout=1ms"),
        ] {
            let request = build_request("m", "n", &body, timeout).expect("builds");
            assert!(
                request.uri().to_string().ends_with(&format!("&{query}")),
                "{timeout:?}: {}",
                request.uri()
            );
        }
    }
}
