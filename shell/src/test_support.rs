//! Helpers shared by the crate's unit tests (compiled only for `cargo test`).

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use nodeipam_core::{Cidr, IpamConfig, NodeMaskFlags};
use serde_json::{Value, json};

use crate::cluster_cidr::{ClusterCidrObject, ClusterCidrPool};
use crate::reconcile::{Action, Allocator, NodeView};

pub(crate) mod cluster_cidr_model;

/// A log sink a test's `tracing` subscriber writes into; read it back through `.text()`.
#[derive(Clone, Default)]
pub(crate) struct LogBuffer(Arc<Mutex<Vec<u8>>>);

impl LogBuffer {
    /// Everything written so far, as UTF-8.
    pub(crate) fn text(&self) -> String {
        let bytes = self.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        String::from_utf8(bytes).expect("utf-8")
    }
}

impl std::io::Write for LogBuffer {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Runs `f` with a plain-text tracing subscriber writing into a buffer; returns what `f` logged.
pub(crate) fn logged(f: impl FnOnce()) -> String {
    let buffer = LogBuffer::default();
    let writer = buffer.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .finish();
    with_test_subscriber(subscriber, f);
    buffer.text()
}

/// Runs `f` with `subscriber` as this thread's default, safe beside other tests running in
/// parallel. `tracing` caches each callsite's interest process-wide, and with no dispatcher
/// registered it asks the *registering thread's* default: a callsite first reached by a test
/// running without a subscriber was cached as "never", and a capturing test on another thread
/// then lost its events (a worker test failed once in a full `cargo test` run, passing alone).
/// So a global default is installed once that is interested in every callsite "sometimes" and
/// enables nothing itself: no callsite is ever cached as "never", and each event asks the
/// emitting thread's default.
pub(crate) fn with_test_subscriber(
    subscriber: impl tracing::Subscriber + Send + Sync + 'static,
    f: impl FnOnce(),
) {
    static ANCHOR: std::sync::Once = std::sync::Once::new();
    ANCHOR.call_once(|| {
        // Fails only if a global default exists already, which anchors the cache as well.
        let _ = tracing::subscriber::set_global_default(InterestAnchor);
        tracing::callsite::rebuild_interest_cache();
    });
    tracing::subscriber::with_default(subscriber, f);
}

/// The global default of the crate's unit tests ([`with_test_subscriber`]).
struct InterestAnchor;

impl tracing::Subscriber for InterestAnchor {
    fn register_callsite(
        &self,
        _: &'static tracing::Metadata<'static>,
    ) -> tracing::subscriber::Interest {
        tracing::subscriber::Interest::sometimes()
    }
    fn enabled(&self, _: &tracing::Metadata<'_>) -> bool {
        false
    }
    fn new_span(&self, _: &tracing::span::Attributes<'_>) -> tracing::span::Id {
        tracing::span::Id::from_u64(1)
    }
    fn record(&self, _: &tracing::span::Id, _: &tracing::span::Record<'_>) {}
    fn record_follows_from(&self, _: &tracing::span::Id, _: &tracing::span::Id) {}
    fn event(&self, _: &tracing::Event<'_>) {}
    fn enter(&self, _: &tracing::span::Id) {}
    fn exit(&self, _: &tracing::span::Id) {}
}

/// The view of a Node `name` holding `pod_cidrs` (uid `uid-<name>`, no labels, not deleting).
pub(crate) fn node_view(name: &str, pod_cidrs: &[&str]) -> NodeView {
    NodeView {
        name: name.into(),
        pod_cidr: pod_cidrs.first().map(|s| (*s).to_owned()),
        pod_cidrs: pod_cidrs.iter().map(|s| (*s).to_owned()).collect(),
        deleting: false,
        uid: Some(format!("uid-{name}")),
        labels: BTreeMap::new(),
    }
}

/// `text` parsed as a CIDR (a test's own literal: panics if it is not one).
pub(crate) fn cidr(text: &str) -> Cidr {
    Cidr::parse(text).expect("test CIDR")
}

/// The validated flags `--cluster-cidr=cluster --service-cluster-ip-range=service` with `masks`
/// (panics if a test's flags are invalid).
pub(crate) fn ipam_config(cluster: &str, service: &str, masks: NodeMaskFlags) -> IpamConfig {
    nodeipam_core::config::validate(cluster, service, masks).expect("valid test config")
}

/// The allocator for `--cluster-cidr=cluster`: default mask sizes, no service CIDR, no pools.
pub(crate) fn allocator(cluster: &str) -> Allocator {
    Allocator::new(&ipam_config(cluster, "", NodeMaskFlags::default())).expect("pool")
}

/// The views of every Node of `fixtures/nodes/<file>` (real NodeLists), in list order.
pub(crate) fn fixture_views(file: &str) -> Vec<NodeView> {
    let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(&path).expect("fixture readable");
    let nodes = crate::nodelist::parse_nodes(&text).expect("fixture is a NodeList");
    nodes.iter().map(NodeView::from_node).collect()
}

/// A ClusterCIDR object named `name` with `spec` (no other metadata, no status).
pub(crate) fn cluster_cidr_object(name: &str, spec: Value) -> ClusterCidrObject {
    serde_json::from_value(json!({"metadata": {"name": name}, "spec": spec})).expect("parses")
}

/// The pool read from [`cluster_cidr_object`]`(name, spec)` (panics if the spec is invalid).
pub(crate) fn cluster_cidr_pool(name: &str, spec: Value) -> ClusterCidrPool {
    ClusterCidrPool::from_object(&cluster_cidr_object(name, spec)).expect("a valid ClusterCIDR")
}

/// The spec of a pool for the Nodes labelled `node-role.kubernetes.io/master` (fixture 08's
/// masters) with /28 blocks of `ipv4`.
pub(crate) fn masters_spec(ipv4: &str) -> Value {
    json!({
        "perNodeHostBits": 4,
        "ipv4": ipv4,
        "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
            {"key": "node-role.kubernetes.io/master", "operator": "Exists"}]}]},
    })
}

/// The view of Node `name` without podCIDRs, labelled `node-role.kubernetes.io/master` (as
/// fixture 08's masters are).
pub(crate) fn master(name: &str) -> NodeView {
    let mut view = node_view(name, &[]);
    view.labels
        .insert("node-role.kubernetes.io/master".into(), String::new());
    view
}

/// Decides `view`: an assignment is confirmed (asserted) and its podCIDRs returned; any other
/// action is handed back.
pub(crate) fn assign(a: &mut Allocator, view: &NodeView) -> Result<Vec<Cidr>, Action> {
    match a.decide(view).action {
        Action::Assign { pod_cidrs, .. } => {
            assert!(a.confirm(&view.name, &pod_cidrs));
            Ok(pod_cidrs)
        }
        other => Err(other),
    }
}

/// [`assign`], which must assign: the confirmed podCIDRs (panics with the action otherwise).
pub(crate) fn assigned(a: &mut Allocator, view: &NodeView) -> Vec<Cidr> {
    assign(a, view).unwrap_or_else(|other| panic!("{} was not assigned: {other:?}", view.name))
}
