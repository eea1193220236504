//! HTTP front end: routing, request log, fault injection, and the admin endpoints.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{ConnectInfo, Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use tokio::sync::watch as tokio_watch;
use tokio_stream::wrappers::ReceiverStream;

use super::conn::ConnHandle;
use super::deadline::{self, DEFAULT_REQUEST_TIMEOUT_MAXIMUM};
use super::faults::{self, FaultAction, FaultRule, LateAnswer};
use super::log::{LateWriteOutcome, RequestLog, RequestRecord};
use super::negotiate;
use super::object::StoredObject;
use super::options::{ListOptions, query_bool};
use super::resource::{Resource, Target, Verb, parse_path};
use super::select::Selector;
use super::status::ApiError;
use super::store::{Key, Store};
use super::watch;
use super::write::{Deleted, PatchType};

/// Largest request body accepted (kube-apiserver's limit is 3 MiB for most writes).
const MAX_BODY_BYTES: usize = 3 * 1024 * 1024;

/// State shared by the server tasks and the handle.
#[derive(Debug)]
pub struct Shared {
    /// The objects.
    pub store: Mutex<Store>,
    /// Current resourceVersion, published after each write (wakes watches).
    pub rv_tx: tokio_watch::Sender<u64>,
    /// Bumped to end every open watch.
    pub drop_tx: tokio_watch::Sender<u64>,
    /// Set to `true` on shutdown.
    pub shutdown_tx: tokio_watch::Sender<bool>,
    /// Pending fault rules.
    pub faults: Mutex<Vec<FaultRule>>,
    /// Delay added to every response.
    pub delay: Mutex<Duration>,
    /// Request log.
    pub log: Mutex<RequestLog>,
    /// Idle time after which a watch with bookmarks gets a BOOKMARK.
    pub bookmark_interval: Duration,
    /// Whether `/sandbox/...` admin endpoints are served.
    pub admin: bool,
    /// Request counters for the summary.
    pub stats: Stats,
    /// Whether the WatchList feature is on (streaming lists; see [`super::options`]).
    pub watch_list: bool,
    /// Resource requests other than WATCH whose handling has not finished (answered, or
    /// abandoned by their client), and late writes not run yet.
    pub in_flight: InFlightCounters,
    /// Tokens and grants for TokenReview / SubjectAccessReview ([`super::reviews`]).
    pub access: Mutex<super::reviews::AccessTable>,
    /// Pause before each change a watch sends after its initial state.
    pub watch_event_delay: Duration,
}

/// What may still change the store on behalf of a request (see [`InFlight`]).
#[derive(Debug, Default)]
pub struct InFlightCounters {
    requests: Arc<AtomicUsize>,
    late_writes: Arc<AtomicUsize>,
}

/// Requests the sandbox is still working on ([`super::SandboxHandle::in_flight`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct InFlight {
    /// Resource requests other than WATCH that are still being handled (held by a delay or a
    /// fault, or running).
    pub requests: usize,
    /// Late writes ([`FaultAction::LateWrite`]) whose commit has not been tried yet.
    pub late_writes: usize,
}

impl InFlight {
    /// Nothing in flight: no request can change the store any more.
    pub fn is_idle(&self) -> bool {
        self.requests == 0 && self.late_writes == 0
    }
}

impl InFlightCounters {
    /// The counts now.
    pub fn get(&self) -> InFlight {
        InFlight {
            requests: self.requests.load(Ordering::SeqCst),
            late_writes: self.late_writes.load(Ordering::SeqCst),
        }
    }
}

/// Counts one request (or late write) while it lives: decremented on drop, so a handler future
/// cancelled by its client's disconnect is counted out too.
struct Counted(Arc<AtomicUsize>);

impl Counted {
    fn new(counter: &Arc<AtomicUsize>) -> Self {
        counter.fetch_add(1, Ordering::SeqCst);
        Counted(Arc::clone(counter))
    }
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Counters of Node requests (for `GET /sandbox/summary`), counted when a request is received.
#[derive(Debug, Default)]
pub struct Stats {
    /// Node PATCH requests (main resource and `status`).
    pub patches: AtomicU64,
    /// Node LIST requests (every page).
    pub lists: AtomicU64,
    /// Node WATCH requests.
    pub watches: AtomicU64,
    /// `410 Gone` answers to Node LIST/WATCH requests and in-stream `ERROR 410` events.
    pub gone410: AtomicU64,
}

/// The cheap summary `GET /sandbox/summary` answers, so a benchmark can poll "all served" without
/// listing the Nodes: `{"nodes":N,"nodesWithPodCIDRs":M,"patches":P,"lists":L,"watches":W,
/// "gone410":G,"resourceVersion":RV}` (request counters as [`Stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Summary {
    /// Nodes stored.
    pub nodes: usize,
    /// Nodes with at least one `spec.podCIDRs` entry.
    #[serde(rename = "nodesWithPodCIDRs")]
    pub nodes_with_pod_cidrs: usize,
    /// Node PATCH requests received.
    pub patches: u64,
    /// Node LIST requests received (every page).
    pub lists: u64,
    /// Node WATCH requests received.
    pub watches: u64,
    /// 410 answers and in-stream ERROR 410 events on Node lists/watches.
    pub gone410: u64,
    /// Current resourceVersion.
    #[serde(rename = "resourceVersion")]
    pub resource_version: u64,
}

impl Shared {
    /// The summary (one short store lock).
    pub fn summary(&self) -> Summary {
        let (stats, rv) = {
            let store = self.store();
            (store.node_stats(), store.resource_version())
        };
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        Summary {
            nodes: stats.nodes,
            nodes_with_pod_cidrs: stats.with_pod_cidrs,
            patches: get(&self.stats.patches),
            lists: get(&self.stats.lists),
            watches: get(&self.stats.watches),
            gone410: get(&self.stats.gone410),
            resource_version: rv,
        }
    }
}

impl Stats {
    fn count(&self, verb: Verb, resource: Resource) {
        if resource != Resource::Nodes {
            return;
        }
        let counter = match verb {
            Verb::Patch => &self.patches,
            Verb::List => &self.lists,
            Verb::Watch => &self.watches,
            _ => return,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

impl Shared {
    /// Lock the store (a poisoned lock is recovered: the store is always consistent between calls).
    pub fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.store.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Publish the current resourceVersion to watches.
    pub fn notify(&self) {
        let rv = self.store().resource_version();
        self.rv_tx.send_replace(rv);
    }

    /// Lock the request log.
    pub fn log(&self) -> std::sync::MutexGuard<'_, RequestLog> {
        self.log.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

fn json_response(code: u16, body: &Value) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, serde_json::to_string(body).unwrap_or_default()).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn raw_response(code: u16, body: Vec<u8>) -> Response {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let mut resp = (status, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

fn error_response(e: &ApiError) -> Response {
    let mut resp = json_response(e.code, &e.to_status());
    if let Some(secs) = e.retry_after_secs
        && let Ok(v) = HeaderValue::from_str(&secs.to_string())
    {
        resp.headers_mut().insert(header::RETRY_AFTER, v);
    }
    resp
}

fn query_map(query: &str) -> HashMap<String, String> {
    form_urlencoded::parse(query.as_bytes())
        .into_owned()
        .collect()
}

/// A boolean query parameter as kube-apiserver decodes it ([`query_bool`]); absent = false.
fn truthy(q: &HashMap<String, String>, k: &str) -> bool {
    q.get(k).is_some_and(|v| query_bool(v))
}

fn verb_of(method: &Method, target: &Target, q: &HashMap<String, String>) -> Option<Verb> {
    let item = target.name.is_some();
    Some(match (method.as_str(), item) {
        ("GET", true) => Verb::Get,
        ("GET", false) if truthy(q, "watch") => Verb::Watch,
        ("GET", false) => Verb::List,
        ("POST", false) => Verb::Create,
        ("PUT", true) => Verb::Update,
        ("PATCH", true) => Verb::Patch,
        ("DELETE", true) => Verb::Delete,
        ("DELETE", false) => Verb::DeleteCollection,
        _ => return None,
    })
}

async fn hold_until(shared: &Shared, at: tokio::time::Instant) {
    let mut shutdown = shared.shutdown_tx.subscribe();
    tokio::select! {
        _ = tokio::time::sleep_until(at) => {}
        _ = shutdown.wait_for(|s| *s) => {}
    }
}

async fn hold(shared: &Shared, d: Duration) {
    hold_until(shared, tokio::time::Instant::now() + d).await;
}

/// The single handler behind every path.
pub async fn handle(State(shared): State<Arc<Shared>>, req: Request) -> Response {
    let (parts, body) = req.into_parts();
    let conn = parts
        .extensions
        .get::<ConnectInfo<ConnHandle>>()
        .map(|c| c.0.clone());
    let method = parts.method.clone();
    let path = parts.uri.path().to_owned();
    let query = parts.uri.query().unwrap_or("").to_owned();
    let q = query_map(&query);
    let accept = parts
        .headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let user_agent = parts
        .headers
        .get(header::USER_AGENT)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let field_manager = q.get("fieldManager").cloned().unwrap_or_else(|| {
        let prefix = user_agent.split('/').next().unwrap_or("").trim();
        if prefix.is_empty() {
            "unknown".to_owned()
        } else {
            prefix.to_owned()
        }
    });
    let bytes = axum::body::to_bytes(body, MAX_BODY_BYTES).await;
    let mut rec = RequestRecord {
        verb: None,
        verb_name: "",
        method: method.to_string(),
        path: path.clone(),
        query: query.clone(),
        resource: None,
        namespace: None,
        name: None,
        content_type: content_type.clone(),
        field_manager: field_manager.clone(),
        body: match &bytes {
            Ok(b) => shared.log().keep_body(b),
            Err(_) => None,
        },
        body_size: bytes.as_ref().map_or(0, |b| b.len()),
        user_agent: user_agent.to_owned(),
        status: None,
        late_write: None,
        received: std::time::Instant::now(),
    };
    // Requests answered at once (no await before the answer) are logged with their status.
    let answer_now = |mut rec: RequestRecord, resp: Response| {
        rec.status = Some(resp.status().as_u16());
        shared.log().received(rec);
        resp
    };
    let Ok(bytes) = bytes else {
        return answer_now(rec, error_response(&ApiError::new_too_large()));
    };

    if let Some(resp) = non_resource(&shared, &method, &path, &bytes) {
        // Admin requests (e.g. a benchmark polling the summary) are not logged: they would
        // push the requests under test out of the ring.
        if path.starts_with("/sandbox/") {
            return resp;
        }
        return answer_now(rec, resp);
    }

    let Some(target) = parse_path(&path) else {
        return answer_now(rec, error_response(&ApiError::no_route(&path)));
    };
    rec.resource = Some(target.resource);
    rec.namespace = target.namespace.clone();
    rec.name = target.name.clone();
    let Some(verb) = verb_of(&method, &target, &q) else {
        let e = ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        ));
        return answer_now(rec, error_response(&e));
    };
    rec.verb = Some(verb);
    rec.verb_name = verb.as_str();
    shared.stats.count(verb, target.resource);

    // Log the request now: if the client gives up while it is delayed or held by a fault, the
    // connection drops and this future is cancelled, and the record stays without a status.
    let arrival = tokio::time::Instant::now();
    let _counted = (verb != Verb::Watch).then(|| Counted::new(&shared.in_flight.requests));
    let seq = shared.log().received(rec);
    let call = Call {
        verb,
        target,
        q,
        content_type,
        field_manager,
        bytes,
        accept,
    };
    match respond(&shared, &call, seq, arrival, conn.as_ref()).await {
        Answer::Sent(resp) => {
            shared.log().answered(seq, resp.status().as_u16());
            resp
        }
        Answer::Dropped(resp) => resp,
    }
}

/// A routed resource request, owned (a late write runs it on its own task).
#[derive(Debug, Clone)]
struct Call {
    verb: Verb,
    target: Target,
    q: HashMap<String, String>,
    content_type: Option<String>,
    field_manager: String,
    bytes: bytes::Bytes,
    accept: Option<String>,
}

impl Call {
    fn dispatch(&self, shared: &Arc<Shared>) -> Result<Reply, ApiError> {
        dispatch(shared, self)
    }
}

/// How a request was answered.
enum Answer {
    /// The response goes to the client.
    Sent(Response),
    /// The connection was killed: the response is never written (the log keeps no status).
    Dropped(Response),
}

/// The 504 kube-apiserver's timeout filter writes (`baseTimeoutWriter.timeout`,
/// `apiserver/pkg/server/filters/timeout.go`): `json.NewEncoder(w).Encode(&err.ErrStatus)` of
/// `NewTimeoutError("request did not complete within the allotted timeout", 0)` — a bare
/// `metav1.Status` (no `kind`/`apiVersion`), `details: {}`, a trailing newline, and no
/// Content-Type header, which Go's `net/http` sniffs as `text/plain; charset=utf-8`.
pub fn timeout_filter_response() -> Response {
    let body = "{\"metadata\":{},\"status\":\"Failure\",\"message\":\"Timeout: request did not complete within the allotted timeout\",\"reason\":\"Timeout\",\"details\":{},\"code\":504}\n";
    let mut resp = (StatusCode::GATEWAY_TIMEOUT, body).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// Run `call` at `at` on its own task (it survives the client's disconnect) and record the
/// outcome in the log entry `seq`. Past the request's `deadline` it is not run: the outcome is a
/// 504 Timeout failure, as kube-apiserver's handler gives up then.
fn spawn_late_commit(
    shared: &Arc<Shared>,
    call: Call,
    seq: u64,
    at: tokio::time::Instant,
    deadline: Option<tokio::time::Instant>,
) {
    shared.log().late_write(seq, LateWriteOutcome::Pending);
    // Counted out however the task ends (run, shutdown, or the runtime dropping it).
    let counted = Counted::new(&shared.in_flight.late_writes);
    let shared = Arc::clone(shared);
    tokio::spawn(async move {
        let _counted = counted;
        let mut shutdown = shared.shutdown_tx.subscribe();
        tokio::select! {
            _ = tokio::time::sleep_until(at) => {}
            _ = shutdown.wait_for(|s| *s) => return,
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            shared.log().late_write(
                seq,
                LateWriteOutcome::Failed {
                    code: 504,
                    reason: "Timeout".to_owned(),
                    message: "the request's deadline passed before the write was committed"
                        .to_owned(),
                },
            );
            return;
        }
        let outcome = match call.dispatch(&shared) {
            Ok(Reply::Object(_, o)) => LateWriteOutcome::Committed {
                resource_version: o.rv(),
            },
            Ok(_) => LateWriteOutcome::Committed {
                resource_version: shared.store().resource_version(),
            },
            Err(e) => LateWriteOutcome::Failed {
                code: e.code,
                reason: e.reason.to_owned(),
                message: e.message,
            },
        };
        shared.notify();
        shared.log().late_write(seq, outcome);
    });
}

/// Answer a routed resource request: late-write faults, delay, other faults, then the operation.
async fn respond(
    shared: &Arc<Shared>,
    call: &Call,
    seq: u64,
    arrival: tokio::time::Instant,
    conn: Option<&ConnHandle>,
) -> Answer {
    let target = &call.target;
    // Long-running requests (WATCH) have no deadline (`WithRequestDeadline` skips them).
    let deadline = if call.verb == Verb::Watch {
        None
    } else {
        match deadline::request_timeout(
            call.q.get("timeout").map(String::as_str),
            DEFAULT_REQUEST_TIMEOUT_MAXIMUM,
        ) {
            Ok(timeout) => Some(arrival + timeout),
            Err(message) => return Answer::Sent(error_response(&ApiError::bad_request(message))),
        }
    };
    let fault = {
        let mut rules = shared.faults.lock().unwrap_or_else(PoisonError::into_inner);
        faults::take(
            &mut rules,
            call.verb,
            target.resource,
            target.name.as_deref(),
        )
    };
    let late = match &fault {
        Some(FaultAction::LateWrite {
            commit_after,
            answer,
        }) => Some((*commit_after, *answer, deadline)),
        // Delivered late: no deadline can stop it (see the variant's doc).
        Some(FaultAction::DeliveredLate { after, answer }) => Some((*after, *answer, None)),
        _ => None,
    };
    if let Some((commit_after, answer, deadline)) = late {
        spawn_late_commit(shared, call.clone(), seq, arrival + commit_after, deadline);
        return match (answer, conn) {
            (LateAnswer::DropConnection, Some(conn)) => {
                conn.kill();
                Answer::Dropped(timeout_filter_response())
            }
            (LateAnswer::Timeout { after }, _) => {
                hold_until(shared, arrival + after).await;
                Answer::Sent(timeout_filter_response())
            }
            // Not served through the killable listener (not expected): time out at once.
            (LateAnswer::DropConnection, None) => Answer::Sent(timeout_filter_response()),
        };
    }
    let delay = *shared.delay.lock().unwrap_or_else(PoisonError::into_inner);
    if !delay.is_zero() {
        hold(shared, delay).await;
    }
    let early: Option<Response> = match &fault {
        Some(FaultAction::Status(code)) => Some(error_response(&ApiError::with_code(*code))),
        Some(FaultAction::WatchError(code)) => Some(json_response(
            200,
            &serde_json::json!({"type": "ERROR", "object": ApiError::with_code(*code).to_status()}),
        )),
        Some(FaultAction::TooManyRequests { retry_after_secs }) => Some(error_response(
            &ApiError::too_many_requests(*retry_after_secs),
        )),
        Some(FaultAction::Hang(d)) => {
            hold(shared, *d).await;
            Some(timeout_filter_response())
        }
        Some(FaultAction::Delay(d)) => {
            hold(shared, *d).await;
            None
        }
        _ => None,
    };
    if let Some(resp) = early {
        return Answer::Sent(resp);
    }
    // Held past its deadline: kube-apiserver's handler has given up; nothing is run.
    if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
        return Answer::Sent(timeout_filter_response());
    }

    let result = call.dispatch(shared);
    shared.notify();
    if let Err(e) = &result
        && e.code == 410
        && target.resource == Resource::Nodes
    {
        shared.stats.gone410.fetch_add(1, Ordering::Relaxed);
    }
    Answer::Sent(match result {
        Ok(Reply::Stream(rx)) => {
            let mut resp = Response::new(Body::from_stream(ReceiverStream::new(rx)));
            resp.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            resp
        }
        Ok(reply) => match &fault {
            Some(FaultAction::CommitThenStatus(c)) => error_response(&ApiError::with_code(*c)),
            Some(FaultAction::CommitThenHang(d)) => {
                hold(shared, *d).await;
                timeout_filter_response()
            }
            _ => reply.into_response(),
        },
        Err(e) => error_response(&e),
    })
}

/// The answer of a resource request.
enum Reply {
    /// A stored object (GET, writes): its stored JSON.
    Object(u16, Arc<StoredObject>),
    /// A built document (Status …).
    Json(u16, Value),
    /// Serialized JSON (a list page).
    Raw(u16, Vec<u8>),
    /// A watch stream.
    Stream(tokio::sync::mpsc::Receiver<Result<bytes::Bytes, std::io::Error>>),
}

impl Reply {
    fn into_response(self) -> Response {
        match self {
            Reply::Object(code, obj) => raw_response(code, obj.to_json()),
            Reply::Json(code, v) => json_response(code, &v),
            Reply::Raw(code, bytes) => raw_response(code, bytes),
            Reply::Stream(rx) => Response::new(Body::from_stream(ReceiverStream::new(rx))),
        }
    }
}

fn parse_body(bytes: &[u8]) -> Result<Value, ApiError> {
    if bytes.is_empty() {
        return Err(ApiError::bad_request("the request body is empty"));
    }
    serde_json::from_slice(bytes).map_err(|e| {
        ApiError::bad_request(format!("the body of the request could not be decoded: {e}"))
    })
}

/// Run a routed request. `call.accept` is negotiated first, as every kube-apiserver resource
/// handler does (see [`super::negotiate`]).
fn dispatch(shared: &Arc<Shared>, call: &Call) -> Result<Reply, ApiError> {
    let Call {
        verb,
        target,
        q,
        content_type,
        field_manager: manager,
        bytes,
        accept,
    } = call;
    let (verb, content_type) = (*verb, content_type.as_deref());
    negotiate::negotiate(accept.as_deref())?;
    let res = target.resource;
    if q.contains_key("dryRun") {
        return Err(ApiError::bad_request(
            "dryRun is not supported by the sandbox API server",
        ));
    }
    let ns = target.namespace.clone().unwrap_or_default();
    let key = || Key::new(res, &ns, target.name.as_deref().unwrap_or(""));
    let selector = || {
        Selector::parse(
            q.get("labelSelector").map(String::as_str),
            q.get("fieldSelector").map(String::as_str),
        )
    };
    match verb {
        Verb::Get => {
            let store = shared.store();
            store
                .get(&key())
                .cloned()
                .map(|o| Reply::Object(200, o))
                .ok_or_else(|| ApiError::not_found(res, &key().name))
        }
        Verb::List => {
            let params = ListOptions::parse(q, shared.watch_list)?.list_params(selector()?)?;
            let page = shared
                .store()
                .list(res, target.namespace.as_deref(), &params)?;
            Ok(Reply::Raw(200, page.to_json()))
        }
        Verb::Watch => {
            let params = ListOptions::parse(q, shared.watch_list)?.watch_params(
                res,
                target.namespace.clone(),
                selector()?,
            );
            watch::start(Arc::clone(shared), params).map(Reply::Stream)
        }
        Verb::Create => {
            let body = parse_body(bytes)?;
            shared
                .store()
                .create(res, &ns, body, manager)
                .map(|o| Reply::Object(201, o))
        }
        Verb::Update => {
            let body = parse_body(bytes)?;
            shared
                .store()
                .update(&key(), body, target.subresource.as_deref(), manager)
                .map(|o| Reply::Object(200, o))
        }
        Verb::Patch => {
            let ct = content_type.unwrap_or("");
            let ty = match PatchType::from_content_type(ct) {
                Some(PatchType::Strategic) if res.is_custom() => {
                    return Err(ApiError::unsupported_patch_of_custom_resource());
                }
                Some(ty) => ty,
                None => return Err(ApiError::unsupported_media_type(ct)),
            };
            let body = parse_body(bytes)?;
            let mut store = shared.store();
            let existed = store.get(&key()).is_some();
            store
                .patch(&key(), ty, &body, target.subresource.as_deref(), manager)
                .map(|o| Reply::Object(if existed { 200 } else { 201 }, o))
        }
        Verb::Delete => {
            let options = if bytes.is_empty() {
                json!({})
            } else {
                parse_body(bytes)?
            };
            shared.store().delete(&key(), &options).map(|d| match d {
                Deleted::Marked(o) => Reply::Object(200, o),
                Deleted::Removed(status) => Reply::Json(200, status),
            })
        }
        Verb::DeleteCollection => Err(ApiError::method_not_allowed(
            "deletecollection is not supported by the sandbox API server",
        )),
    }
}

/// `/version`, `/healthz`, `/api`, `/apis`, the review endpoints ([`super::reviews`]) and the
/// `/sandbox/...` admin endpoints.
fn non_resource(
    shared: &Arc<Shared>,
    method: &Method,
    path: &str,
    body: &[u8],
) -> Option<Response> {
    match path {
        "/version" => Some(json_response(
            200,
            &json!({"major": "1", "minor": "34", "gitVersion": "v1.34.0-sandbox", "platform": "linux/amd64"}),
        )),
        "/healthz" | "/readyz" | "/livez" => Some((StatusCode::OK, "ok").into_response()),
        "/api" => Some(json_response(
            200,
            &json!({"kind": "APIVersions", "versions": ["v1"], "serverAddressByClientCIDRs": []}),
        )),
        "/apis" => {
            let mut served: Vec<(&str, &str)> = Resource::ALL
                .iter()
                .filter(|r| !r.group().is_empty())
                .map(|r| (r.group(), r.version()))
                .collect();
            served.dedup();
            let groups: Vec<Value> = served
                .into_iter()
                .map(|(g, v)| json!({"name": g, "versions": [{"groupVersion": format!("{g}/{v}"), "version": v}], "preferredVersion": {"groupVersion": format!("{g}/{v}"), "version": v}}))
                .collect();
            Some(json_response(
                200,
                &json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": groups}),
            ))
        }
        p if super::reviews::is_review_path(p) => {
            let table = shared
                .access
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            Some(
                match super::reviews::answer(&table, method.as_str(), p, body) {
                    Ok(review) => json_response(201, &review),
                    Err(e) => error_response(&e),
                },
            )
        }
        p if p.starts_with("/sandbox/") && shared.admin => Some(admin(shared, method, p, body)),
        _ => None,
    }
}

fn parse_verb(s: &str) -> Option<Verb> {
    [
        Verb::Get,
        Verb::List,
        Verb::Watch,
        Verb::Create,
        Verb::Update,
        Verb::Patch,
        Verb::Delete,
        Verb::DeleteCollection,
    ]
    .into_iter()
    .find(|v| v.as_str() == s)
}

/// Parse an admin fault rule: `{"verb":"patch","resource":"nodes","name":"n1","times":2,
/// "status":500}` or with `"retryAfterSeconds":N`, `"hangMs":N`, `"delayMs":N`,
/// `"commitThenStatus":C`, `"commitThenHangMs":N`, `"watchError":C` or
/// `"lateWrite":{"commitAfterMs":N,"answer":"timeout","answerAfterMs":M}` /
/// `"lateWrite":{"commitAfterMs":N,"answer":"drop"}` /
/// `"deliveredLate":{"afterMs":N,"answer":"drop"}` instead of `status`.
///
/// # Errors
/// 400 for an unknown verb, resource or action, or a malformed late write.
pub fn parse_fault(v: &Value) -> Result<FaultRule, ApiError> {
    let verb = match v.get("verb").and_then(Value::as_str) {
        Some(s) => {
            Some(parse_verb(s).ok_or_else(|| ApiError::bad_request(format!("unknown verb {s}")))?)
        }
        None => None,
    };
    let resource = match v.get("resource").and_then(Value::as_str) {
        Some(s) => Some(
            Resource::ALL
                .into_iter()
                .find(|r| r.plural() == s || r.qualified_plural() == s)
                .ok_or_else(|| ApiError::bad_request(format!("unknown resource {s}")))?,
        ),
        None => None,
    };
    let n = |k: &str| v.get(k).and_then(Value::as_u64);
    let action = if let Some(c) = n("status") {
        FaultAction::Status(u16::try_from(c).map_err(|_| ApiError::bad_request("bad status"))?)
    } else if let Some(s) = n("retryAfterSeconds") {
        FaultAction::TooManyRequests {
            retry_after_secs: s,
        }
    } else if let Some(ms) = n("hangMs") {
        FaultAction::Hang(Duration::from_millis(ms))
    } else if let Some(ms) = n("delayMs") {
        FaultAction::Delay(Duration::from_millis(ms))
    } else if let Some(c) = n("commitThenStatus") {
        FaultAction::CommitThenStatus(
            u16::try_from(c).map_err(|_| ApiError::bad_request("bad status"))?,
        )
    } else if let Some(ms) = n("commitThenHangMs") {
        FaultAction::CommitThenHang(Duration::from_millis(ms))
    } else if let Some(c) = n("watchError") {
        FaultAction::WatchError(u16::try_from(c).map_err(|_| ApiError::bad_request("bad status"))?)
    } else if let Some(late) = v.get("deliveredLate") {
        let after = late
            .get("afterMs")
            .and_then(Value::as_u64)
            .map(Duration::from_millis)
            .ok_or_else(|| ApiError::bad_request("deliveredLate needs afterMs"))?;
        let answer = match late.get("answer").and_then(Value::as_str) {
            Some("timeout") => LateAnswer::Timeout {
                after: late
                    .get("answerAfterMs")
                    .and_then(Value::as_u64)
                    .map_or(Duration::ZERO, Duration::from_millis),
            },
            Some("drop") => LateAnswer::DropConnection,
            _ => {
                return Err(ApiError::bad_request(
                    "deliveredLate.answer must be \"timeout\" or \"drop\"",
                ));
            }
        };
        FaultAction::DeliveredLate { after, answer }
    } else if let Some(late) = v.get("lateWrite") {
        let ms = |k: &str| {
            late.get(k)
                .and_then(Value::as_u64)
                .map(Duration::from_millis)
        };
        let commit_after = ms("commitAfterMs")
            .ok_or_else(|| ApiError::bad_request("lateWrite needs commitAfterMs"))?;
        let answer = match late.get("answer").and_then(Value::as_str) {
            Some("timeout") => LateAnswer::Timeout {
                after: ms("answerAfterMs").unwrap_or(Duration::ZERO),
            },
            Some("drop") => LateAnswer::DropConnection,
            _ => {
                return Err(ApiError::bad_request(
                    "lateWrite.answer must be \"timeout\" or \"drop\"",
                ));
            }
        };
        FaultAction::LateWrite {
            commit_after,
            answer,
        }
    } else {
        return Err(ApiError::bad_request(
            "fault needs one of status, retryAfterSeconds, hangMs, delayMs, commitThenStatus, commitThenHangMs, watchError, lateWrite, deliveredLate",
        ));
    };
    Ok(FaultRule {
        verb,
        resource,
        name: v.get("name").and_then(Value::as_str).map(str::to_owned),
        times: n("times").unwrap_or(1) as usize,
        action,
    })
}

fn admin(shared: &Arc<Shared>, method: &Method, path: &str, body: &[u8]) -> Response {
    let result: Result<Value, ApiError> = match (method.as_str(), path) {
        ("GET", "/sandbox/requests") => serde_json::to_value(shared.log().records())
            .map_err(|e| ApiError::internal(e.to_string())),
        ("DELETE", "/sandbox/requests") => {
            shared.log().clear();
            Ok(json!({}))
        }
        ("POST", "/sandbox/faults") => parse_body(body).and_then(|v| parse_fault(&v)).map(|rule| {
            shared
                .faults
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .push(rule);
            json!({})
        }),
        ("DELETE", "/sandbox/faults") => {
            shared
                .faults
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clear();
            Ok(json!({}))
        }
        ("POST", "/sandbox/delay") => parse_body(body).map(|v| {
            let ms = v.get("ms").and_then(Value::as_u64).unwrap_or(0);
            *shared.delay.lock().unwrap_or_else(PoisonError::into_inner) =
                Duration::from_millis(ms);
            json!({})
        }),
        ("POST", "/sandbox/drop-watches") => {
            shared.drop_tx.send_modify(|g| *g += 1);
            Ok(json!({}))
        }
        ("POST", "/sandbox/compact") => {
            shared.store().compact();
            Ok(json!({}))
        }
        ("GET", "/sandbox/summary") => {
            serde_json::to_value(shared.summary()).map_err(|e| ApiError::internal(e.to_string()))
        }
        ("GET", "/sandbox/faults") => {
            let pending = shared
                .faults
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .iter()
                .map(|r| r.times)
                .sum::<usize>();
            Ok(json!({"pending": pending}))
        }
        _ => Err(ApiError::no_route(path)),
    };
    match result {
        Ok(v) => json_response(200, &v),
        Err(e) => error_response(&e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admin_fault_rules_parse() {
        let cases = [
            (json!({"status": 500}), FaultAction::Status(500)),
            (json!({"watchError": 500}), FaultAction::WatchError(500)),
            (
                json!({"lateWrite": {"commitAfterMs": 1500, "answer": "timeout", "answerAfterMs": 200}}),
                FaultAction::LateWrite {
                    commit_after: Duration::from_millis(1500),
                    answer: LateAnswer::Timeout {
                        after: Duration::from_millis(200),
                    },
                },
            ),
            (
                json!({"lateWrite": {"commitAfterMs": 10, "answer": "drop"}}),
                FaultAction::LateWrite {
                    commit_after: Duration::from_millis(10),
                    answer: LateAnswer::DropConnection,
                },
            ),
        ];
        for (mut body, action) in cases {
            body["verb"] = json!("patch");
            body["resource"] = json!("nodes");
            body["name"] = json!("n1");
            let rule = parse_fault(&body).expect("parses");
            assert_eq!(
                rule,
                FaultRule::new(Verb::Patch, Resource::Nodes, 1, action).named("n1")
            );
        }
        for bad in [
            json!({}),
            json!({"lateWrite": {"answer": "drop"}}),
            json!({"lateWrite": {"commitAfterMs": 1, "answer": "later"}}),
            json!({"verb": "frobnicate", "status": 500}),
        ] {
            assert_eq!(parse_fault(&bad).map_err(|e| e.code), Err(400), "{bad}");
        }
    }
}
