//! Shared helpers of the end-to-end tests: run the real controller (`nodeipam::controller::run`)
//! in-process against a sandbox, stop it, and turn its summary into the invariant checker's view.
#![allow(clippy::unwrap_used, dead_code)]

use std::collections::BTreeMap;
use std::time::Duration;

use axum::http::{HeaderValue, header::USER_AGENT};
use nodeipam::controller::{ControllerConfig, Health, Quiescence, RunSummary, run};
use nodeipam::leader::LeaseConfig;
use nodeipam::plan::PlanReport;
use nodeipam_core::{IpamConfig, NodeMaskFlags};
use nodeipam_tests::invariants::{ClusterSpec, ControllerView, Report, assert_invariants};
use nodeipam_tests::sandbox::{FaultAction, FaultRule, LateAnswer, Resource, SandboxHandle, Verb};
use serde_json::Value;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// How long a test waits for a cause before it fails (a liveness deadline, never a bound on
/// speed: a passing test stops waiting at the cause). Generous — 2 shared cores, a debug build,
/// six tests at a time (`.cargo/config.toml`): at 20 s, `rbac`'s wait for the Event series PATCH
/// and other waits failed now and then at load averages of 14–17.
pub const WAIT: Duration = Duration::from_secs(60);

/// `RUST_LOG=nodeipam=debug cargo test … -- --nocapture` shows the controller's logs.
pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("off")),
        )
        .with_test_writer()
        .try_init();
}

/// Validated IPAM config, as the binary builds it from its flags.
pub fn ipam(cluster: &str, service: &str, masks: NodeMaskFlags) -> IpamConfig {
    nodeipam_core::config::validate(cluster, service, masks)
        .unwrap_or_else(|e| panic!("config {cluster} / {service}: {e}"))
}

/// Mask flags: `(--node-cidr-mask-size, -ipv4, -ipv6)`.
pub fn masks(single: Option<u8>, v4: Option<u8>, v6: Option<u8>) -> NodeMaskFlags {
    NodeMaskFlags {
        node_cidr_mask_size: single,
        node_cidr_mask_size_ipv4: v4,
        node_cidr_mask_size_ipv6: v6,
    }
}

/// The checker's view of the configuration (from the validated config, texts re-parsed by
/// `ipnet`).
pub fn spec_of(ipam: &IpamConfig) -> ClusterSpec {
    nodeipam_tests::chaos::cluster_spec(ipam)
}

/// A config for tests: fast retries (20 ms → 500 ms), 2 s request timeout, 1000 qps / burst 1000
/// (so the token bucket never paces a test unless it asks to), and no deletion quarantine
/// (`--deleted-node-cidr-quarantine=0`: these tests check what a deletion releases at once; the
/// quarantine's own tests set it, `e2e::freed_block`'s `replace_force_*`).
pub fn fast_config(ipam: IpamConfig) -> ControllerConfig {
    let mut config = ControllerConfig::new(ipam);
    config.deletion_quarantine = Duration::ZERO;
    config.kube_api_qps = 1000.0;
    config.kube_api_burst = 1000;
    config.retry_min_delay = Duration::from_millis(20);
    config.retry_max_delay = Duration::from_millis(500);
    config.request_timeout = Duration::from_secs(2);
    config
}

/// A controller running in-process.
pub struct Running {
    /// Its readiness / pool view.
    pub health: Health,
    /// Whether it has nothing in hand ([`Running::wait_quiet`]).
    quiescence: Quiescence,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<RunSummary, nodeipam::Error>>,
}

/// Starts `run(config, client, shutdown)` on the sandbox.
pub fn spawn(sb: &SandboxHandle, config: ControllerConfig) -> Running {
    // The controller's own client configuration (no automatic retries, our User-Agent), not the
    // sandbox's convenience client: kube's retry layer would re-send a PATCH that timed out and
    // hide the very outcomes these tests are about.
    let client = nodeipam::controller::client_for_url(&sb.url())
        .unwrap_or_else(|e| panic!("client for the sandbox: {e}"));
    spawn_with_client(client, config)
}

/// The User-Agent of a controller started with [`spawn_as`]: the controller's own, then `name`.
pub fn agent(name: &str) -> String {
    format!("{} {name}", nodeipam::client::USER_AGENT_VALUE)
}

/// Starts `run(config, client, shutdown)` on the sandbox with the controller's own client
/// configuration, its requests carrying `User-Agent: <controller's> <name>` ([`agent`]), so the
/// sandbox's request log tells the replicas apart.
pub fn spawn_as(sb: &SandboxHandle, config: ControllerConfig, name: &str) -> Running {
    let mut client_config = nodeipam::client::config_for_url(&sb.url()).unwrap();
    client_config.headers.retain(|(n, _)| n != USER_AGENT);
    client_config
        .headers
        .push((USER_AGENT, HeaderValue::from_str(&agent(name)).unwrap()));
    let client = kube::Client::try_from(client_config).unwrap();
    spawn_with_client(client, config)
}

/// Leader election as the e2e tests configure it on the Lease `kube-system/nodeipam-controller`:
/// 2 s Lease, 1.5 s renew deadline, 200 ms retry period.
pub fn election(identity: &str) -> LeaseConfig {
    LeaseConfig {
        namespace: "kube-system".to_owned(),
        name: "nodeipam-controller".to_owned(),
        identity: identity.to_owned(),
        lease_duration: Duration::from_secs(2),
        renew_deadline: Duration::from_millis(1500),
        retry_period: Duration::from_millis(200),
    }
}

/// Starts `run(config, client, shutdown)` with a client built by the caller (the real-server
/// tests: the controller's own kubeconfig loading).
pub fn spawn_with_client(client: kube::Client, config: ControllerConfig) -> Running {
    let health = config.health.clone();
    let quiescence = config.quiescence.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(run(config, client, async move {
        let _ = stopped.await;
    }));
    Running {
        health,
        quiescence,
        stop,
        task,
    }
}

impl Running {
    /// Waits (bounded) until the start-up occupy is done and it allocates.
    pub async fn wait_allocating(&self, sb: &SandboxHandle) {
        let health = self.health.clone();
        assert!(
            sb.wait_until(WAIT, |_| health.is_ready() && health.is_leading())
                .await,
            "controller did not become ready within {WAIT:?}"
        );
    }

    /// Waits (bounded) until the running term has nothing in hand
    /// (`nodeipam::controller::Quiescence`): no Node queued or being decided or written, no event
    /// outstanding, the ClusterCIDR writer caught up. Every write decided on what the controller
    /// has seen was sent and answered by then, so a negative check ("nothing was written") after
    /// it can fail; retries delayed to later are not waited for.
    pub async fn wait_quiet(&self, sb: &SandboxHandle) {
        let quiescence = self.quiescence.clone();
        assert!(
            sb.wait_until(WAIT, |_| quiescence.is_quiet()).await,
            "controller not quiet within {WAIT:?}"
        );
    }

    /// Whether the task ended (it should not before it is stopped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits (bounded) for the controller to stop on its own, and returns how it ended.
    pub async fn ended(self) -> Result<RunSummary, nodeipam::Error> {
        match tokio::time::timeout(WAIT, self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => panic!("controller task panicked: {e}"),
            Err(_) => panic!("controller did not stop by itself within {WAIT:?}"),
        }
    }

    /// `kill -9`: the task is aborted (every future dropped at once: in-flight requests are cut,
    /// nothing is released) and reaped.
    pub async fn abort(self) {
        self.task.abort();
        let _ = self.task.await;
    }

    /// Signals shutdown and returns the final summary (bounded).
    pub async fn stop(self) -> RunSummary {
        match self.stop_outcome().await {
            Ok(summary) => summary,
            Err(e) => panic!("controller returned an error: {e}"),
        }
    }

    /// Signals shutdown and returns how `run()` ended, error included (bounded; panics only if
    /// the task panicked or did not stop within [`WAIT`]).
    pub async fn stop_outcome(self) -> Result<RunSummary, nodeipam::Error> {
        let _ = self.stop.send(());
        match tokio::time::timeout(WAIT, self.task).await {
            Ok(Ok(result)) => result,
            Ok(Err(e)) => panic!("controller task panicked: {e}"),
            Err(_) => panic!("controller did not stop within {WAIT:?} of the shutdown signal"),
        }
    }
}

/// The checker's view of a run summary.
pub fn view(summary: &RunSummary) -> ControllerView {
    nodeipam_tests::chaos::controller_view(summary)
}

/// Ends a test: the docs/DESIGN.md §3 invariants over the sandbox's Nodes and the controller's summary.
pub fn check_end_state(
    sb: &SandboxHandle,
    ipam: &IpamConfig,
    unservable: &[&str],
    summary: &RunSummary,
) -> Report {
    assert_invariants(
        &sb.nodes(),
        &spec_of(ipam),
        unservable,
        Some(&view(summary)),
    )
}

/// Pool usage as the controller reports it (after its last reconcile), per cluster CIDR.
pub fn used(health: &Health) -> Vec<u32> {
    health.pools().iter().map(|p| p.used_blocks).collect()
}

/// Names of Nodes without podCIDRs.
pub fn unserved(sb: &SandboxHandle) -> Vec<String> {
    sb.nodes()
        .iter()
        .filter(|n| nodeipam_tests::invariants::pod_cidrs_of(n).is_empty())
        .map(nodeipam_tests::invariants::name_of)
        .collect()
}

/// podCIDRs of a Node (empty if none or gone).
pub fn pod_cidrs(sb: &SandboxHandle, name: &str) -> Vec<String> {
    sb.node(name)
        .map(|n| nodeipam_tests::invariants::pod_cidrs_of(&n))
        .unwrap_or_default()
}

/// `events.k8s.io/v1` events with this reason: `(regarding Node name, type, note)`.
pub fn events_with_reason(sb: &SandboxHandle, reason: &str) -> Vec<(String, String, String)> {
    sb.events()
        .iter()
        .filter(|e| e["reason"].as_str() == Some(reason))
        .map(|e| {
            (
                e["regarding"]["name"]
                    .as_str()
                    .unwrap_or_default()
                    .to_owned(),
                e["type"].as_str().unwrap_or_default().to_owned(),
                e["note"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .collect()
}

/// One logged PATCH: `(status, body)`; status `None` = not answered (still in flight, or the
/// client gave up first).
pub type LoggedPatch = (Option<u16>, Option<Value>);

/// Node PATCH requests per Node name, in arrival order.
pub fn node_patches(sb: &SandboxHandle) -> BTreeMap<String, Vec<LoggedPatch>> {
    let mut out: BTreeMap<String, Vec<LoggedPatch>> = BTreeMap::new();
    for r in sb.requests_of(Verb::Patch, Resource::Nodes) {
        out.entry(r.name.clone().unwrap_or_default())
            .or_default()
            .push((r.status, r.body.clone()));
    }
    out
}

/// Asserts that no CIDR was ever written to two different Nodes by a successful PATCH, and
/// that every successful PATCH of one Node carried the same podCIDRs (a write whose outcome was
/// unknown is sent again, unchanged) — for runs without deletions, where a block may legitimately
/// be handed out again. Returns the number of Nodes patched successfully.
pub fn assert_no_cidr_handed_out_twice(sb: &SandboxHandle) -> usize {
    let mut owner: BTreeMap<String, String> = BTreeMap::new();
    let mut count = 0;
    for (name, patches) in node_patches(sb) {
        let sent = |body: &Option<Value>| {
            body.as_ref()
                .and_then(|b| b["spec"]["podCIDRs"].as_array().cloned())
                .unwrap_or_default()
        };
        let ok: Vec<Vec<Value>> = patches
            .iter()
            .filter(|(s, _)| *s == Some(200))
            .map(|(_, b)| sent(b))
            .collect();
        assert!(
            ok.windows(2).all(|w| w[0] == w[1]),
            "Node {name} was patched successfully with different podCIDRs: {ok:?}"
        );
        if let Some(cidrs) = ok.into_iter().next() {
            count += 1;
            for c in cidrs {
                let c = c.as_str().unwrap_or_default().to_owned();
                if let Some(prev) = owner.insert(c.clone(), name.clone()) {
                    panic!("{c} was handed out to {prev} and to {name}");
                }
            }
        }
    }
    count
}

/// A new Node derived from a real fixture Node: renamed, no podCIDRs, no server-set metadata
/// ([`renamed_node`](nodeipam_tests::sandbox::replicate::renamed_node)), no `spec.providerID`,
/// with `apiVersion: v1` and `kind: Node`.
pub fn node_like(template: &Value, name: &str) -> Value {
    let mut node = nodeipam_tests::sandbox::replicate::renamed_node(template, name);
    if let Some(spec) = node["spec"].as_object_mut() {
        spec.remove("providerID");
    }
    node["apiVersion"] = Value::String("v1".to_owned());
    node["kind"] = Value::String("Node".to_owned());
    node
}

/// Asserts that the controller's own accounting (per pool: cluster CIDR, capacity, used, in
/// blocks) equals `nodeipam plan`'s prediction for the same Nodes; `what` names the case.
pub fn assert_pools_match_plan(summary: &RunSummary, predicted: &PlanReport, what: &str) {
    let pools: Vec<(String, u32, u32)> = summary
        .pools
        .iter()
        .map(|p| (p.cluster_cidr.to_string(), p.capacity_blocks, p.used_blocks))
        .collect();
    let planned: Vec<(String, u32, u32)> = predicted
        .pools
        .iter()
        .map(|p| (p.cluster_cidr.clone(), p.capacity, p.used))
        .collect();
    assert_eq!(pools, planned, "{what}: pool figures vs plan");
}

/// Makes the first PATCH of Node `name` a late write: the sandbox answers it at once as `answer`
/// says (a timeout or a dropped connection) and applies it `commit_after` later, as
/// kube-apiserver may (a request keeps running after its client gave up).
pub fn late_write_first_patch(
    sb: &SandboxHandle,
    name: &str,
    commit_after: Duration,
    answer: LateAnswer,
) {
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1,
            FaultAction::LateWrite {
                commit_after,
                answer,
            },
        )
        .named(name),
    );
}

/// The first PATCH of Node `name` is applied `commit_after` late (its client sees a dropped
/// connection) and every re-send hangs for 10 s: the Node has no podCIDRs until the late write
/// lands — a kill or a stop with a write in flight.
pub fn late_write_then_hang(sb: &SandboxHandle, name: &str, commit_after: Duration) {
    late_write_first_patch(sb, name, commit_after, LateAnswer::DropConnection);
    sb.inject(
        FaultRule::new(
            Verb::Patch,
            Resource::Nodes,
            1000,
            FaultAction::Hang(Duration::from_secs(10)),
        )
        .named(name),
    );
}

/// Every Node's name and podCIDRs, sorted by name.
pub fn all_pod_cidrs(sb: &SandboxHandle) -> Vec<(String, Vec<String>)> {
    let mut out: Vec<(String, Vec<String>)> = sb
        .nodes()
        .iter()
        .map(|n| {
            let name = nodeipam_tests::invariants::name_of(n);
            let cidrs = pod_cidrs(sb, &name);
            (name, cidrs)
        })
        .collect();
    out.sort();
    out
}

/// The first Node of a fixture.
pub fn template_node(file: &str) -> Value {
    nodeipam_tests::sandbox::fixture(file)["items"][0].clone()
}

/// `node` with the label `key=value` added (or replaced).
pub fn labelled(mut node: Value, key: &str, value: &str) -> Value {
    node["metadata"]["labels"][key] = Value::from(value);
    node
}

/// Every Node of a fixture, each labelled `key=value` ([`labelled`]).
pub fn labelled_items(file: &str, key: &str, value: &str) -> Vec<Value> {
    nodeipam_tests::sandbox::fixture(file)["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| labelled(n.clone(), key, value))
        .collect()
}

/// A `nodeipam.io/v1alpha1` ClusterCIDR named `name` with `spec`, created through the API (as
/// `kubectl apply` would); the stored object.
pub async fn create_cluster_cidr(sb: &SandboxHandle, name: &str, spec: Value) -> Value {
    let api = nodeipam::controller::cluster_cidrs::api(sb.client());
    let object: kube::api::DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "ClusterCIDR",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    let created = api
        .create(&kube::api::PostParams::default(), &object)
        .await
        .unwrap_or_else(|e| panic!("creating ClusterCIDR {name}: {e}"));
    serde_json::to_value(created).unwrap()
}

/// The stored ClusterCIDR `name` (`None` once it is gone).
pub async fn cluster_cidr(sb: &SandboxHandle, name: &str) -> Option<Value> {
    let api = nodeipam::controller::cluster_cidrs::api(sb.client());
    api.get_opt(name)
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

/// Deletes ClusterCIDR `name` (held by its finalizers until they are removed).
pub async fn delete_cluster_cidr(sb: &SandboxHandle, name: &str) {
    let api = nodeipam::controller::cluster_cidrs::api(sb.client());
    api.delete(name, &kube::api::DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("deleting ClusterCIDR {name}: {e}"));
}

/// The `status` of condition `type_` of a ClusterCIDR object (`""` if it has none).
pub fn condition(object: &Value, type_: &str) -> (String, String) {
    object["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| c["type"] == type_)
        .map(|c| {
            (
                c["status"].as_str().unwrap_or_default().to_owned(),
                c["reason"].as_str().unwrap_or_default().to_owned(),
            )
        })
        .unwrap_or_default()
}

/// Polls `check` on ClusterCIDR `name` (its object, or `None` once gone) until it holds, at most
/// [`WAIT`]; whether it did.
pub async fn wait_cluster_cidr(
    sb: &SandboxHandle,
    name: &str,
    check: impl Fn(Option<&Value>) -> bool,
) -> bool {
    let deadline = tokio::time::Instant::now() + WAIT;
    loop {
        if check(cluster_cidr(sb, name).await.as_ref()) {
            return true;
        }
        if tokio::time::Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The controller with ClusterCIDRs on (what `--cidr-allocator-type=MultiCIDRRangeAllocator`
/// sets): [`fast_config`] for `--cluster-cidr=cluster_cidr`, IPv6 mask `v6_mask`.
pub fn with_cluster_cidrs(cluster_cidr: &str, v6_mask: Option<u8>) -> ControllerConfig {
    let mut config = fast_config(ipam(cluster_cidr, "", masks(None, None, v6_mask)));
    config.watch_cluster_cidr_objects = true;
    config
}

/// Whether the ClusterCIDR `object` (`None` once gone) carries our finalizer.
pub fn has_finalizer(object: Option<&Value>) -> bool {
    object.is_some_and(|o| {
        o["metadata"]["finalizers"].as_array().is_some_and(|f| {
            f.iter()
                .any(|f| f == nodeipam::controller::cluster_cidrs::FINALIZER)
        })
    })
}

/// Whether the ClusterCIDR `object` exists and its condition `type_` has status `status`
/// (`"True"`, `"False"`).
pub fn condition_is(object: Option<&Value>, type_: &str, status: &str) -> bool {
    object.is_some_and(|o| condition(o, type_).0 == status)
}

/// Whether the ClusterCIDR `object` exists and its condition `Ready` has reason `reason`
/// (`"Deleting"`, `"Exhausted"` …).
pub fn ready_reason_is(object: Option<&Value>, reason: &str) -> bool {
    object.is_some_and(|o| condition(o, "Ready").1 == reason)
}

/// One family's usage as a ClusterCIDR's status shows it, in blocks: `free` is the rest.
pub fn usage(capacity: u64, used: u64) -> Value {
    serde_json::json!({"capacity": capacity, "used": used, "free": capacity - used})
}

/// Waits (at most [`WAIT`]) until `check` holds on ClusterCIDR `name`; fails the test with
/// `what` and the object as stored otherwise.
pub async fn assert_cluster_cidr(
    sb: &SandboxHandle,
    name: &str,
    what: &str,
    check: impl Fn(Option<&Value>) -> bool,
) {
    if !wait_cluster_cidr(sb, name, check).await {
        panic!(
            "ClusterCIDR {name}: {what}: {:?}",
            cluster_cidr(sb, name).await
        );
    }
}

/// Waits (at most [`WAIT`]) until every Node has podCIDRs; fails the test with `what` and every
/// Node's podCIDRs otherwise.
pub async fn assert_all_served(sb: &SandboxHandle, what: &str) {
    assert!(
        sb.wait_until(WAIT, |sb| unserved(sb).is_empty()).await,
        "{what}: {:?}",
        all_pod_cidrs(sb)
    );
}

/// The Nodes whose first podCIDR starts with `prefix`.
pub fn served_from(sb: &SandboxHandle, prefix: &str) -> Vec<String> {
    all_pod_cidrs(sb)
        .into_iter()
        .filter(|(_, cidrs)| cidrs.first().is_some_and(|c| c.starts_with(prefix)))
        .map(|(name, _)| name)
        .collect()
}

/// The sandbox holding fixture 05's four AWS Nodes, none with podCIDRs (tracing on).
pub async fn four_aws_nodes() -> SandboxHandle {
    init_tracing();
    nodeipam_tests::sandbox::Sandbox::start(nodeipam_tests::sandbox::fixture(
        "05-aws-4nodes-no-podcidr.json",
    ))
    .await
}

/// A marker that the controller's ClusterCIDR writer has decided, after every change made before
/// this call, on every ClusterCIDR whose name sorts before `sentinel`: creates ClusterCIDR
/// `sentinel` (`range` in /24 blocks, or /64 for IPv6; a selector no Node matches, so it serves
/// no Node) and waits
/// (at most [`WAIT`]) until the controller wrote its status; fails the test otherwise.
///
/// Why it is causally after (shell/src/controller/cluster_cidrs.rs): the watch applies the events
/// in `resourceVersion` order, so a view holding `sentinel` holds every earlier change; each
/// writer round takes one snapshot of that view and goes over it in name order (a `BTreeMap`),
/// awaiting each write before deciding the next object, and the status a new object gets is sent
/// in the round that first decides it. So once `sentinel` has a status, a round has decided each
/// object sorting before it on the current view, and sent (the sandbox logs at arrival) whatever
/// it wanted to write there. `sentinel` must sort after every object the caller checks.
pub async fn cluster_cidr_writer_passed(sb: &SandboxHandle, sentinel: &str, range: &str) {
    let (family, host_bits) = if range.contains(':') {
        ("ipv6", 64)
    } else {
        ("ipv4", 8)
    };
    create_cluster_cidr(
        sb,
        sentinel,
        serde_json::json!({
            (family): range,
            "perNodeHostBits": host_bits,
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "example.com/sentinel", "operator": "In", "values": ["no-node-has-it"]}
            ]}]},
        }),
    )
    .await;
    assert_cluster_cidr(sb, sentinel, "the sentinel's status written", |o| {
        o.is_some_and(|o| !condition(o, "Ready").0.is_empty())
    })
    .await;
}

/// Deletes the sentinel of [`cluster_cidr_writer_passed`] and waits (at most [`WAIT`]) until it
/// is gone (it holds no block: its finalizer, if it got one, goes at once).
pub async fn delete_sentinel(sb: &SandboxHandle, sentinel: &str) {
    delete_cluster_cidr(sb, sentinel).await;
    assert_cluster_cidr(sb, sentinel, "the sentinel gone", |o| o.is_none()).await;
}

/// How many times the controller published an event with `reason` about Node `node`: the
/// `events.k8s.io/v1` Events regarding it, each counted with its series (kube-rs's `Recorder`
/// folds a repeat into the first event's `series.count`).
pub fn node_event_count(sb: &SandboxHandle, node: &str, reason: &str) -> u64 {
    sb.events()
        .iter()
        .filter(|e| e["reason"].as_str() == Some(reason) && e["regarding"]["name"] == node)
        .map(|e| e["series"]["count"].as_u64().unwrap_or(1))
        .sum()
}
