//! An in-process Lease API for the elector's paused-time tests: one Lease, GET / POST / PUT with
//! kube-apiserver's answers (404 NotFound, 409 AlreadyExists, 409 Conflict on a stale
//! resourceVersion, 422 for a spec `ValidateLeaseSpec` rejects or a time that is not a
//! `MicroTime`), a request log, per-client faults and per-client latency (half before the request
//! takes effect, half before the answer arrives). Served through
//! `tower::service_fn`, so no socket is involved and tokio's paused clock stays exact.

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http::{Method, Request, Response};
use http_body_util::BodyExt;
use kube::Client;
use kube::client::Body;
use serde_json::{Value, json};
use tokio::time::Instant;

/// Namespace and name every test uses.
pub const NAMESPACE: &str = "kube-system";
pub const NAME: &str = "nodeipam";
const COLLECTION: &str = "/apis/coordination.k8s.io/v1/namespaces/kube-system/leases";

/// What a fault rule does to a matching request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Answer with this status, without running the request.
    Status(u16),
    /// Never answer (the client's timeout decides).
    Hang,
    /// Run the request, then never answer.
    CommitThenHang,
}

#[derive(Debug)]
struct Rule {
    agent: String,
    method: Option<Method>,
    times: usize,
    fault: Fault,
}

/// One request as received.
#[derive(Debug, Clone)]
pub struct Logged {
    /// When it was sent (paused clock).
    pub at: Instant,
    /// Which client sent it (the name given to [`FakeApi::client`]).
    pub agent: String,
    pub method: Method,
    /// JSON body of writes.
    pub body: Option<Value>,
    /// Status answered; `None` while pending or never answered.
    pub status: Option<u16>,
}

#[derive(Debug, Default)]
struct State {
    lease: Option<Value>,
    resource_version: u64,
    log: Vec<Logged>,
    rules: Vec<Rule>,
    latency: HashMap<String, Duration>,
}

/// The fake server; clones share it.
#[derive(Debug, Clone, Default)]
pub struct FakeApi(Arc<Mutex<State>>);

fn status(code: u16, reason: &str, message: &str) -> (u16, Value) {
    (
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn is_micro_time(v: &Value) -> bool {
    // `2026-01-02T03:04:05.123456Z`
    v.as_str().is_some_and(|s| {
        s.len() == 27
            && s.as_bytes()[19] == b'.'
            && s.ends_with('Z')
            && k8s_openapi::jiff::fmt::strtime::parse("%Y-%m-%dT%H:%M:%S%.fZ", s).is_ok()
    })
}

/// kube-apiserver's `ValidateLeaseSpec` plus the types a typed server enforces.
fn invalid(lease: &Value) -> Option<String> {
    let spec = lease.get("spec")?;
    if let Some(d) = spec.get("leaseDurationSeconds")
        && d.as_i64().is_none_or(|d| d <= 0 || d > i64::from(i32::MAX))
    {
        return Some(format!("spec.leaseDurationSeconds: Invalid value: {d}"));
    }
    if let Some(t) = spec.get("leaseTransitions")
        && t.as_i64().is_none_or(|t| t < 0 || t > i64::from(i32::MAX))
    {
        return Some(format!("spec.leaseTransitions: Invalid value: {t}"));
    }
    if let Some(h) = spec.get("holderIdentity")
        && !h.is_string()
    {
        return Some(format!("spec.holderIdentity: Invalid value: {h}"));
    }
    for field in ["acquireTime", "renewTime"] {
        if let Some(t) = spec.get(field)
            && !is_micro_time(t)
        {
            return Some(format!("spec.{field}: Invalid value: {t}"));
        }
    }
    None
}

impl FakeApi {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A kube client whose requests are logged (and faulted) as `agent`'s.
    pub fn client(&self, agent: &str) -> Client {
        let api = self.clone();
        let agent = agent.to_owned();
        let service = tower::service_fn(move |request: Request<Body>| {
            let api = api.clone();
            let agent = agent.clone();
            async move { Ok::<_, Infallible>(api.serve(&agent, request).await) }
        });
        Client::new(service, "default")
    }

    /// Store `lease` as is (no validation: hostile contents), with the next resourceVersion unless
    /// `keep_resource_version`; `None` deletes it.
    pub fn put_raw(&self, lease: Option<Value>, keep_resource_version: bool) {
        let mut state = self.state();
        state.resource_version += 1;
        let rv = state.resource_version.to_string();
        state.lease = lease.map(|mut l| {
            if !keep_resource_version {
                l["metadata"]["resourceVersion"] = json!(rv);
            }
            l
        });
    }

    /// Change the stored Lease's spec as an outside writer would (a new resourceVersion).
    pub fn edit_spec(&self, edit: impl FnOnce(&mut Value)) {
        let lease = self.lease();
        let mut lease = lease.expect("a Lease to edit");
        edit(&mut lease["spec"]);
        self.put_raw(Some(lease), false);
    }

    /// The stored Lease.
    pub fn lease(&self) -> Option<Value> {
        self.state().lease.clone()
    }

    /// `spec` of the stored Lease (`Null` if none).
    pub fn spec(&self) -> Value {
        self.lease()
            .and_then(|l| l.get("spec").cloned())
            .unwrap_or(Value::Null)
    }

    /// The request log.
    pub fn log(&self) -> Vec<Logged> {
        self.state().log.clone()
    }

    /// `agent`'s requests with `method`.
    pub fn requests(&self, agent: &str, method: Method) -> Vec<Logged> {
        self.log()
            .into_iter()
            .filter(|r| r.agent == agent && r.method == method)
            .collect()
    }

    /// `agent`'s round trip: its requests take effect `latency / 2` after they are sent and are
    /// answered `latency / 2` later.
    pub fn set_latency(&self, agent: &str, latency: Duration) {
        self.state().latency.insert(agent.to_owned(), latency);
    }

    /// Fault `agent`'s next `times` requests with `method` (`None`: any method).
    pub fn fault(&self, agent: &str, method: Option<Method>, times: usize, fault: Fault) {
        self.state().rules.push(Rule {
            agent: agent.to_owned(),
            method,
            times,
            fault,
        });
    }

    async fn serve(&self, agent: &str, request: Request<Body>) -> Response<Body> {
        let (parts, body) = request.into_parts();
        let bytes = body
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        let body: Option<Value> = serde_json::from_slice(&bytes).ok();
        let (index, fault, latency) = {
            let mut state = self.state();
            state.log.push(Logged {
                at: Instant::now(),
                agent: agent.to_owned(),
                method: parts.method.clone(),
                body: body.clone(),
                status: None,
            });
            let index = state.log.len() - 1;
            let fault = state
                .rules
                .iter_mut()
                .find(|r| {
                    r.times > 0
                        && r.agent == agent
                        && r.method.as_ref().is_none_or(|m| *m == parts.method)
                })
                .map(|r| {
                    r.times -= 1;
                    r.fault
                });
            state.rules.retain(|r| r.times > 0);
            let latency = state.latency.get(agent).copied().unwrap_or_default();
            (index, fault, latency)
        };
        let leg = latency / 2;
        if !leg.is_zero() {
            tokio::time::sleep(leg).await;
        }
        let (code, answer) = match fault {
            Some(Fault::Status(code)) => status(code, "InternalError", "injected fault"),
            Some(Fault::Hang) => std::future::pending().await,
            Some(Fault::CommitThenHang) => {
                let _ = self.apply(&parts.method, parts.uri.path(), body);
                std::future::pending().await
            }
            None => self.apply(&parts.method, parts.uri.path(), body),
        };
        if !leg.is_zero() {
            tokio::time::sleep(leg).await;
        }
        self.state().log[index].status = Some(code);
        let bytes = serde_json::to_vec(&answer).unwrap_or_default();
        let mut response = Response::new(Body::from(bytes));
        *response.status_mut() = http::StatusCode::from_u16(code).unwrap_or_default();
        response.headers_mut().insert(
            http::header::CONTENT_TYPE,
            http::HeaderValue::from_static("application/json"),
        );
        response
    }

    fn apply(&self, method: &Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let item = format!("{COLLECTION}/{NAME}");
        let mut state = self.state();
        match (method.as_str(), path) {
            ("GET", p) if p == item => match &state.lease {
                Some(lease) => (200, lease.clone()),
                None => status(404, "NotFound", "leases \"nodeipam\" not found"),
            },
            ("POST", COLLECTION) => {
                let Some(mut lease) = body else {
                    return status(400, "BadRequest", "no body");
                };
                if state.lease.is_some() {
                    return status(409, "AlreadyExists", "leases \"nodeipam\" already exists");
                }
                if let Some(message) = invalid(&lease) {
                    return status(422, "Invalid", &message);
                }
                state.resource_version += 1;
                lease["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
                state.lease = Some(lease.clone());
                (201, lease)
            }
            ("PUT", p) if p == item => {
                let Some(mut lease) = body else {
                    return status(400, "BadRequest", "no body");
                };
                let Some(current) = &state.lease else {
                    return status(404, "NotFound", "leases \"nodeipam\" not found");
                };
                // An UPDATE without resourceVersion is unconditional on a real server: the
                // elector must never send one (tests check the log), so refuse it loudly here.
                let sent = lease.pointer("/metadata/resourceVersion").cloned();
                if sent.is_none() {
                    return status(400, "BadRequest", "test fake: unconditional update");
                }
                if sent.as_ref() != current.pointer("/metadata/resourceVersion") {
                    return status(
                        409,
                        "Conflict",
                        "Operation cannot be fulfilled on leases.coordination.k8s.io \"nodeipam\": the object has been modified",
                    );
                }
                if let Some(message) = invalid(&lease) {
                    return status(422, "Invalid", &message);
                }
                state.resource_version += 1;
                lease["metadata"]["resourceVersion"] = json!(state.resource_version.to_string());
                state.lease = Some(lease.clone());
                (200, lease)
            }
            _ => status(404, "NotFound", &format!("{method} {path}")),
        }
    }
}
