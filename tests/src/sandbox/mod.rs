//! A sandbox Kubernetes API server for end-to-end, chaos and scale tests.
//!
//! It serves Nodes, `coordination.k8s.io/v1` Leases and `events.k8s.io/v1` (and core `v1`)
//! Events over plain HTTP/1.1 on `127.0.0.1`, and enforces the kube-apiserver rules a node IPAM
//! controller depends on, each citing its upstream source where it is implemented:
//! - a global, monotonically increasing resourceVersion; LIST with resourceVersion semantics,
//!   `limit`/`continue` served from consistent snapshots ([`list`]), selectors; WATCH from a
//!   resourceVersion, bookmarks, streaming lists with the `k8s.io/initial-events-end` bookmark,
//!   `410 Expired` for versions older than the (configurable) history ([`watch`]);
//! - list/watch options decoded and validated as `ValidateListOptions` ([`options`]), `Accept`
//!   negotiation with 406 ([`negotiate`]);
//! - writes through kube-apiserver's update rules ([`update`], [`mod@write`]): `409 Conflict` on a
//!   stale resourceVersion or a PUT uid precondition, `422 Invalid` for immutable metadata (a
//!   PATCH carrying another uid), Node podCIDR rules, finalizers; no-op writes keep their
//!   resourceVersion; strategic / merge / JSON patches; `metadata.managedFields` recorded as
//!   `Update` entries ([`fields`]). Server-side apply is not served (415): the controller never
//!   sends it;
//! - request deadlines as `WithRequestDeadline` sets them (the `timeout` query parameter, else
//!   60 s; WATCH exempt): nothing is run or committed past a request's deadline, however a fault
//!   holds it ([`deadline`]);
//! - `TokenReview` and `SubjectAccessReview` answered from a static table
//!   ([`SandboxHandle::set_access_table`], [`reviews`]), for delegated-auth tests;
//! - faults ([`FaultAction`]): errors, 429, hangs, delays, commit-then-fail and late writes
//!   (committed after the client got a timeout or lost its connection); dropped watches.
//!
//! For tests it offers the request log (every request, logged on arrival with its `User-Agent`,
//! a bounded ring: [`SandboxHandle::requests`]), what is still in flight
//! ([`SandboxHandle::in_flight`]), a commit observer that sees every committed write in order
//! ([`SandboxHandle::on_commit`]), Node counters ([`SandboxHandle::summary`]) and direct
//! mutations. Objects are stored serialized once and shared ([`object`]), so 50,000 real Nodes
//! ([`Replicas`]) fit comfortably. The `sandbox-apiserver` binary runs it as a process with the
//! same features behind flags and `/sandbox/...` admin endpoints (see its docs).
//!
//! ```no_run
//! # async fn demo() {
//! use nodeipam_tests::sandbox::{Sandbox, fixture};
//! let sandbox = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
//! let client = sandbox.client();
//! // … run the controller with `--master sandbox.url()` …
//! sandbox.shutdown().await;
//! # let _ = client;
//! # }
//! ```

mod actor_cluster_cidrs;
pub mod cluster_cidrs;
pub mod conn;
pub mod deadline;
pub mod faults;
pub mod fields;
pub mod list;
pub mod log;
pub mod negotiate;
pub mod nodes;
pub mod object;
pub mod options;
pub mod patch;
pub mod replicate;
pub mod resource;
pub mod reviews;
pub mod select;
pub mod server;
pub mod status;
pub mod store;
pub mod update;
pub mod validate;
pub mod watch;
pub mod write;

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use serde_json::Value;
use tokio::sync::watch as tokio_watch;

pub use faults::{FaultAction, FaultRule, LateAnswer};
pub use log::{LateWriteOutcome, RequestRecord};
pub use replicate::Replicas;
pub use resource::{Resource, Verb};
pub use reviews::{AccessTable, Subject};
pub use server::{InFlight, Summary};
pub use status::{ApiError, Cause};
pub use store::{ChangeType, Commit, CommitObserver, Key, NodeStats};
pub use write::PatchType;

use log::RequestLog;
use server::{Shared, Stats};
use store::Store;

/// Field manager used for writes made through [`SandboxHandle`] mutations.
pub const TEST_ACTOR: &str = "sandbox-test-actor";

/// Options of a sandbox.
#[derive(Debug, Clone)]
pub struct SandboxOptions {
    /// Port on 127.0.0.1 (0 = pick a free one).
    pub port: u16,
    /// Changes kept for watches and paginated lists; older resourceVersions get 410.
    pub history_limit: usize,
    /// A watch with `allowWatchBookmarks` gets a BOOKMARK after this much idle time.
    pub bookmark_interval: Duration,
    /// Serve the `/sandbox/...` admin endpoints.
    pub admin_endpoints: bool,
    /// Requests kept in the request log (a ring: the oldest are dropped first).
    pub request_log_limit: usize,
    /// Largest request body (bytes) the request log keeps; larger bodies are logged as
    /// `body: None` with their `body_size`.
    pub request_body_limit: usize,
    /// kube-apiserver's `WatchList` feature (on by default since 1.34): streaming lists
    /// (`sendInitialEvents=true` watches) are served. `false` answers them as a server with the
    /// feature off does: **422 Invalid** `ListOptions.meta.k8s.io "" is invalid:
    /// sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList
    /// feature gate is enabled` (`ValidateListOptions`, see [`options`]) — so a client's fallback
    /// to a paged LIST can be tested.
    pub watch_list: bool,
    /// Copies of real Nodes loaded after the initial NodeList ([`Replicas`]).
    pub replicas: Vec<Replicas>,
    /// Delay added to every response from the start (see [`SandboxHandle::set_delay`]).
    pub delay: Duration,
    /// Pause before each change a watch sends after its initial state (0 = none): a watch
    /// stream that delivers at most about one change per pause, as a slow link or a starved
    /// watch-cache goroutine does, so that a client writing faster than it is told of its writes
    /// falls behind the history and gets `410 Gone`.
    pub watch_event_delay: Duration,
    /// kube-apiserver's `StrictIPCIDRValidation` (beta and on by default since 1.36): Node
    /// podCIDRs with host bits, leading 0s or an IPv4-mapped IPv6 address are refused (422).
    /// `false` stores them as a server before 1.36 (or with the gate off) does — the only way a
    /// Node with a non-canonical podCIDR can still appear while a controller runs — except leading
    /// 0s in an IPv4 address, which the sandbox's parser never reads (load such Nodes initially).
    pub strict_cidr_validation: bool,
}

impl Default for SandboxOptions {
    fn default() -> Self {
        SandboxOptions {
            port: 0,
            history_limit: 1000,
            bookmark_interval: Duration::from_secs(5),
            admin_endpoints: false,
            request_log_limit: log::DEFAULT_REQUEST_LOG_CAPACITY,
            request_body_limit: log::DEFAULT_REQUEST_BODY_LIMIT,
            watch_list: true,
            replicas: Vec::new(),
            delay: Duration::ZERO,
            watch_event_delay: Duration::ZERO,
            strict_cidr_validation: true,
        }
    }
}

/// Errors starting a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The initial state is not a usable NodeList.
    #[error("initial NodeList rejected: {0}")]
    Initial(#[source] ApiError),
    /// Binding 127.0.0.1 failed.
    #[error("cannot bind 127.0.0.1:{port}")]
    Bind {
        /// Requested port.
        port: u16,
        /// Cause.
        #[source]
        source: std::io::Error,
    },
}

/// Entry point: [`Sandbox::start`].
#[derive(Debug)]
pub struct Sandbox;

impl Sandbox {
    /// Start a sandbox on `127.0.0.1:0` with `initial` (a `NodeList` document) as its Nodes.
    ///
    /// # Panics
    /// If the NodeList is not loadable or no port can be bound (test setup errors);
    /// use [`Sandbox::try_start`] to handle them.
    pub async fn start(initial: Value) -> SandboxHandle {
        match Self::try_start(initial, SandboxOptions::default()).await {
            Ok(h) => h,
            Err(e) => panic!("sandbox failed to start: {e}"),
        }
    }

    /// Start a sandbox with options.
    ///
    /// # Errors
    /// [`StartError`] when the NodeList is not loadable or binding fails.
    pub async fn try_start(
        initial: Value,
        options: SandboxOptions,
    ) -> Result<SandboxHandle, StartError> {
        let mut store = Store::new(options.history_limit);
        store.strict_cidrs = options.strict_cidr_validation;
        let items: Vec<Value> = match &initial {
            Value::Null => Vec::new(),
            Value::Array(a) => a.clone(),
            other => match other.get("items") {
                Some(Value::Array(a)) => a.clone(),
                Some(Value::Null) | None
                    if other.get("kind").and_then(Value::as_str) == Some("Node") =>
                {
                    vec![other.clone()]
                }
                Some(Value::Null) | None => Vec::new(),
                Some(_) => {
                    return Err(StartError::Initial(ApiError::bad_request(
                        "items is not a list",
                    )));
                }
            },
        };
        store
            .load(Resource::Nodes, &items)
            .map_err(StartError::Initial)?;
        for r in &options.replicas {
            for i in 0..r.count {
                store
                    .load_one(Resource::Nodes, r.node(i))
                    .map_err(StartError::Initial)?;
            }
        }
        store.end_load();
        let rv = store.resource_version();
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", options.port))
            .await
            .map_err(|source| StartError::Bind {
                port: options.port,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Bind {
            port: options.port,
            source,
        })?;
        let shared = Arc::new(Shared {
            store: Mutex::new(store),
            rv_tx: tokio_watch::Sender::new(rv),
            drop_tx: tokio_watch::Sender::new(0),
            shutdown_tx: tokio_watch::Sender::new(false),
            faults: Mutex::new(Vec::new()),
            delay: Mutex::new(options.delay),
            log: Mutex::new(RequestLog::new(
                options.request_log_limit,
                options.request_body_limit,
            )),
            bookmark_interval: options.bookmark_interval,
            admin: options.admin_endpoints,
            stats: Stats::default(),
            watch_list: options.watch_list,
            in_flight: Default::default(),
            access: Mutex::new(reviews::AccessTable::default()),
            watch_event_delay: options.watch_event_delay,
        });
        let app = axum::Router::new()
            .fallback(server::handle)
            .with_state(Arc::clone(&shared))
            .into_make_service_with_connect_info::<conn::ConnHandle>();
        let listener = conn::KillableListener::new(listener);
        let mut shutdown_rx = shared.shutdown_tx.subscribe();
        let task = tokio::spawn(async move {
            let signal = async move {
                let _ = shutdown_rx.wait_for(|s| *s).await;
            };
            if let Err(e) = axum::serve(listener, app)
                .with_graceful_shutdown(signal)
                .await
            {
                tracing::error!(error = %e, "sandbox server stopped");
            }
        });
        Ok(SandboxHandle {
            addr,
            shared,
            task: Mutex::new(Some(task)),
        })
    }
}

/// Read a fixture NodeList from `fixtures/nodes/` of the repository.
///
/// # Panics
/// If the file is missing or not JSON (a test setup error).
pub fn fixture(file_name: &str) -> Value {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../fixtures/nodes")
        .join(file_name);
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read fixture {}: {e}", path.display()));
    serde_json::from_str(&text)
        .unwrap_or_else(|e| panic!("fixture {} is not JSON: {e}", path.display()))
}

/// A running sandbox: its address, direct state access, mutations, faults and the request log.
#[derive(Debug)]
pub struct SandboxHandle {
    addr: SocketAddr,
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SandboxHandle {
    /// Listening address (always 127.0.0.1).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Base URL, e.g. `http://127.0.0.1:41234` (what `--master` takes).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// A kubeconfig document (YAML) pointing at the sandbox, no credentials.
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {url}\ncontexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: sandbox\n    namespace: default\ncurrent-context: sandbox\nusers:\n- name: sandbox\n  user: {{}}\npreferences: {{}}\n",
            url = self.url()
        )
    }

    /// Write [`Self::kubeconfig_yaml`] to `path` (for `--kubeconfig`).
    ///
    /// # Errors
    /// I/O errors writing the file.
    pub fn write_kubeconfig(&self, path: &Path) -> std::io::Result<()> {
        std::fs::write(path, self.kubeconfig_yaml())
    }

    /// A `kube::Config` for the sandbox (default namespace `default`).
    ///
    /// # Panics
    /// Never in practice: the URL is always valid.
    pub fn kube_config(&self) -> kube::Config {
        let uri: axum::http::Uri = match self.url().parse() {
            Ok(u) => u,
            Err(e) => panic!("sandbox URL is always a valid URI: {e}"),
        };
        kube::Config::new(uri)
    }

    /// A `kube::Client` for the sandbox.
    ///
    /// # Panics
    /// If kube cannot build a client for a plain-http config (not expected).
    pub fn client(&self) -> kube::Client {
        match kube::Client::try_from(self.kube_config()) {
            Ok(c) => c,
            Err(e) => panic!("kube client for the sandbox: {e}"),
        }
    }

    fn store(&self) -> std::sync::MutexGuard<'_, Store> {
        self.shared.store()
    }

    /// Replace the table TokenReviews and SubjectAccessReviews are answered from (see
    /// [`reviews`]; empty at start: every token rejected, nothing allowed).
    pub fn set_access_table(&self, table: AccessTable) {
        *self
            .shared
            .access
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = table;
    }

    /// Current global resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.store().resource_version()
    }

    /// All Nodes, by name.
    pub fn nodes(&self) -> Vec<Value> {
        self.store().objects(Resource::Nodes, None)
    }

    /// One Node.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.store()
            .get(&Key::new(Resource::Nodes, "", name))
            .map(|o| o.to_value())
    }

    /// The summary `GET /sandbox/summary` answers (counts only, no Node is read).
    pub fn summary(&self) -> Summary {
        self.shared.summary()
    }

    /// Requests still being handled (every verb but WATCH, including those held by a delay or a
    /// fault) and late writes not yet tried: when both are zero and no client sends anything,
    /// nothing can change the store any more.
    pub fn in_flight(&self) -> InFlight {
        self.shared.in_flight.get()
    }

    /// Node counters (number of Nodes, Nodes with podCIDRs), without reading the Nodes.
    pub fn node_stats(&self) -> NodeStats {
        self.store().node_stats()
    }

    /// All `events.k8s.io/v1` Events (every namespace).
    pub fn events(&self) -> Vec<Value> {
        self.store().objects(Resource::Events, None)
    }

    /// All core `v1` Events (every namespace).
    pub fn core_events(&self) -> Vec<Value> {
        self.store().objects(Resource::CoreEvents, None)
    }

    /// All Leases (every namespace).
    pub fn leases(&self) -> Vec<Value> {
        self.store().objects(Resource::Leases, None)
    }

    /// One Lease.
    pub fn lease(&self, namespace: &str, name: &str) -> Option<Value> {
        self.store()
            .get(&Key::new(Resource::Leases, namespace, name))
            .map(|o| o.to_value())
    }

    /// Make a namespace exist (default, kube-system, kube-public, kube-node-lease always do).
    pub fn add_namespace(&self, ns: &str) {
        self.store().add_namespace(ns);
    }

    fn write<T>(&self, f: impl FnOnce(&mut Store) -> Result<T, ApiError>) -> Result<T, ApiError> {
        let r = f(&mut self.store());
        self.shared.notify();
        r
    }

    /// Create `object` of the cluster-scoped `resource` as an external actor would (field
    /// manager [`TEST_ACTOR`], ADDED event): the stored object.
    ///
    /// # Errors
    /// As the API: 409 AlreadyExists, 422 Invalid, 400.
    fn create_as_actor(&self, resource: Resource, object: Value) -> Result<Value, ApiError> {
        self.write(|s| {
            s.create(resource, "", object, TEST_ACTOR)
                .map(|o| o.to_value())
        })
    }

    /// Delete `name` of the cluster-scoped `resource` as an external actor would: the object
    /// marked with a `deletionTimestamp` while it has finalizers, else the Status of its removal.
    ///
    /// # Errors
    /// 404 NotFound.
    fn delete_as_actor(&self, resource: Resource, name: &str) -> Result<Value, ApiError> {
        self.write(|s| {
            s.delete(&Key::new(resource, "", name), &Value::Null)
                .map(|d| match d {
                    write::Deleted::Marked(o) => o.to_value(),
                    write::Deleted::Removed(status) => status,
                })
        })
    }

    /// Create a Node as an external actor would (ADDED event).
    ///
    /// # Errors
    /// As the API: 409 AlreadyExists, 422 Invalid, 400.
    pub fn create_node(&self, node: Value) -> Result<Value, ApiError> {
        self.create_as_actor(Resource::Nodes, node)
    }

    /// Delete a Node as an external actor would (marks it if it has finalizers).
    ///
    /// # Errors
    /// 404 NotFound.
    pub fn delete_node(&self, name: &str) -> Result<Value, ApiError> {
        self.delete_as_actor(Resource::Nodes, name)
    }

    /// Patch a Node (main resource: `status` changes are ignored, as the API does).
    ///
    /// # Errors
    /// As the API: 404, 409, 422, 400.
    pub fn patch_node(&self, name: &str, ty: PatchType, patch: &Value) -> Result<Value, ApiError> {
        self.write(|s| {
            s.patch(
                &Key::new(Resource::Nodes, "", name),
                ty,
                patch,
                None,
                TEST_ACTOR,
            )
            .map(|o| o.to_value())
        })
    }

    /// Patch a Node's `status` subresource (as a kubelet would).
    ///
    /// # Errors
    /// As the API.
    pub fn patch_node_status(
        &self,
        name: &str,
        ty: PatchType,
        patch: &Value,
    ) -> Result<Value, ApiError> {
        self.write(|s| {
            s.patch(
                &Key::new(Resource::Nodes, "", name),
                ty,
                patch,
                Some("status"),
                TEST_ACTOR,
            )
            .map(|o| o.to_value())
        })
    }

    /// Replace a Node (PUT semantics: `metadata.resourceVersion`, when set, must be current).
    ///
    /// # Errors
    /// As the API.
    pub fn update_node(&self, node: Value) -> Result<Value, ApiError> {
        let name = node
            .pointer("/metadata/name")
            .and_then(Value::as_str)
            .unwrap_or("")
            .to_owned();
        self.write(|s| {
            s.update(
                &Key::new(Resource::Nodes, "", &name),
                node,
                None,
                TEST_ACTOR,
            )
            .map(|o| o.to_value())
        })
    }

    /// Watch every committed write: `f` is called for each create, update, patch and
    /// delete (of any resource, whoever made it: API clients or this handle), in commit order,
    /// synchronously under the store lock — before the writer is answered and before any watcher
    /// sees the change — so it sees every state the server passes through (e.g. to check at each
    /// step that no two Nodes' podCIDRs overlap). The initial Nodes are not reported (read them
    /// with [`Self::nodes`] before registering). `f` must be quick and must not call into the
    /// sandbox (the store is locked: that would deadlock). Returns an id for
    /// [`Self::remove_commit_observer`].
    pub fn on_commit(&self, f: CommitObserver) -> u64 {
        self.store().on_commit(f)
    }

    /// Stop calling the commit observer `id`; `false` if there is none.
    pub fn remove_commit_observer(&self, id: u64) -> bool {
        self.store().remove_commit_observer(id)
    }

    /// Add a fault rule (rules are tried in insertion order).
    pub fn inject(&self, rule: FaultRule) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(rule);
    }

    /// Fail the next `times` requests of `verb` on `resource` with `action` (shorthand for
    /// [`Self::inject`]).
    pub fn fail_next(&self, verb: Verb, resource: Resource, times: usize, action: FaultAction) {
        self.inject(FaultRule::new(verb, resource, times, action));
    }

    /// Remaining (not yet fired) fault rules.
    pub fn pending_faults(&self) -> Vec<FaultRule> {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Remove all fault rules.
    pub fn clear_faults(&self) {
        self.shared
            .faults
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Delay every response by `d` (zero to stop).
    pub fn set_delay(&self, d: Duration) {
        *self
            .shared
            .delay
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = d;
    }

    /// End every open watch stream (clients see the stream close and must re-watch).
    pub fn drop_watches(&self) {
        self.shared.drop_tx.send_modify(|g| *g += 1);
    }

    /// Forget the change history: watches/continues from any earlier resourceVersion get 410.
    pub fn compact(&self) {
        self.store().compact();
    }

    /// The request log so far, in arrival order. Every request received is in it, answered or
    /// not: [`RequestRecord::status`] is `None` for a request still in flight and for one whose
    /// client gave up before the answer (e.g. during a [`FaultAction::Hang`] or
    /// [`FaultAction::CommitThenHang`]).
    pub fn requests(&self) -> Vec<RequestRecord> {
        self.shared.log().records()
    }

    /// Requests received so far (the sequence number the next one gets; a record's position in
    /// [`Self::requests`] is its sequence number as long as the log was neither cleared nor
    /// wrapped).
    pub fn requests_received(&self) -> u64 {
        self.shared.log().next_seq()
    }

    /// Logged requests with this verb on this resource (see [`SandboxHandle::requests`]).
    pub fn requests_of(&self, verb: Verb, resource: Resource) -> Vec<RequestRecord> {
        self.requests()
            .into_iter()
            .filter(|r| r.verb == Some(verb) && r.resource == Some(resource))
            .collect()
    }

    /// Empty the request log.
    pub fn clear_requests(&self) {
        self.shared.log().clear();
    }

    /// Wait until `cond(self)` holds, re-checking after every write, at most `timeout`.
    /// Returns whether it held.
    pub async fn wait_until(
        &self,
        timeout: Duration,
        mut cond: impl FnMut(&SandboxHandle) -> bool,
    ) -> bool {
        let mut rx = self.shared.rv_tx.subscribe();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            rx.borrow_and_update();
            if cond(self) {
                return true;
            }
            // Requests that are not writes (e.g. a watch starting) do not bump the
            // resourceVersion: re-check at least every 50 ms as well.
            let tick = tokio::time::Instant::now() + Duration::from_millis(50);
            tokio::select! {
                _ = rx.changed() => {}
                _ = tokio::time::sleep_until(tick.min(deadline)) => {}
            }
            if tokio::time::Instant::now() >= deadline {
                return cond(self);
            }
        }
    }

    /// Stop the server: open watches end, the listener closes.
    pub async fn shutdown(&self) {
        self.shared.shutdown_tx.send_replace(true);
        let task = self
            .task
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        if let Some(t) = task {
            let _ = tokio::time::timeout(Duration::from_secs(5), t).await;
        }
    }
}

impl Drop for SandboxHandle {
    fn drop(&mut self) {
        self.shared.shutdown_tx.send_replace(true);
    }
}
