//! The Node informer: a consistent initial state, then a watch, into a compact cache
//! ([`NodeCache`]) and the work queue. Its stream is always read: applying an event is a map
//! update and a queue add (neither waits), so our own writes can never hold back the watch and
//! make it fall behind the server's history (`410 Gone`).
//!
//! Initial state, cheapest consistent first (client-go's reflector does the same since 1.32):
//! 1. a **streaming list**: `WATCH ?sendInitialEvents=true&resourceVersionMatch=NotOlderThan`
//!    with `resourceVersion` unset, which kube-apiserver answers with the current state (a
//!    consistent read) as ADDED events, then a BOOKMARK annotated `k8s.io/initial-events-end`;
//! 2. where the server refuses that (4xx: older servers, or the WatchList feature disabled), a
//!    **paged LIST** (`limit=500`, `resourceVersion` unset: a consistent read), then a WATCH from
//!    the list's resourceVersion. The choice is remembered for the life of the process.
//!
//! Why not kube-rs's `watcher`: its streaming list asks for `resourceVersion=0` — the API
//! server's cache, "any" freshness — and a stale initial state can hide a podCIDR that the
//! previous leader wrote a moment ago, so the block would look free and be handed out twice.
//!
//! On `410 Gone` (the watch fell behind the server's history) the informer re-lists and queues
//! every Node that was or is listed (level-triggered: a reconcile of an unchanged Node is a no-op).
//! Any other watch `ERROR` event also ends in a re-list, after a backoff (client-go's reflector:
//! the error ends `ListAndWatch`, which runs again after its backoff); a watch that merely ends or
//! goes silent is re-opened from the last resourceVersion.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};
use futures::{Stream, StreamExt};
use kube::Api;
use kube::api::{ListParams, WatchEvent, WatchParams};
use tokio::sync::watch;

use super::node::{CachedNode, SlimNode};
use super::queue::WorkQueue;
use super::window::WriteWindow;
use crate::kube_error::{error_chain, is_client_broken};
use crate::reconcile::NodeName;

/// Page size of the fallback LIST (client-go's pager default).
pub const LIST_PAGE_SIZE: u32 = 500;
/// `timeoutSeconds` of every WATCH (the API server ends the stream then; we watch again).
pub const WATCH_TIMEOUT_SECONDS: u32 = 290;
/// A watch that delivers nothing (no event, no bookmark) for this long past its timeout is
/// considered dead and re-opened.
const WATCH_IDLE_GRACE: Duration = Duration::from_secs(30);

/// The informer's copy of every Node: name → [`CachedNode`].
#[derive(Default)]
pub struct NodeCache {
    nodes: Mutex<HashMap<NodeName, CachedNode>>,
    /// The label keys a [`CachedNode`] keeps (those the node-pool rules read).
    label_keys: Vec<std::sync::Arc<str>>,
    /// `Some`: every label is kept (ClusterCIDR node selectors may read any label, and objects
    /// come at run time); each key is stored once here and shared by the Nodes that have it.
    all_label_keys: Option<Mutex<std::collections::HashSet<std::sync::Arc<str>>>>,
}

impl NodeCache {
    /// An empty cache that keeps no labels.
    pub fn new() -> NodeCache {
        NodeCache::default()
    }

    /// An empty cache that keeps the labels with these keys (and no others) of every Node.
    pub fn with_label_keys(keys: &[String]) -> NodeCache {
        NodeCache {
            nodes: Mutex::default(),
            label_keys: keys.iter().map(|k| k.as_str().into()).collect(),
            all_label_keys: None,
        }
    }

    /// An empty cache that keeps every label of every Node (`MultiCIDRRangeAllocator`: the
    /// ClusterCIDRs' node selectors, known only at run time, may read any of them).
    pub fn with_all_labels() -> NodeCache {
        NodeCache {
            all_label_keys: Some(Mutex::default()),
            ..NodeCache::default()
        }
    }

    /// The compact copy of `node` this cache keeps.
    fn compact(&self, node: &SlimNode) -> CachedNode {
        match &self.all_label_keys {
            Some(keys) => {
                let mut keys = keys.lock().unwrap_or_else(PoisonError::into_inner);
                CachedNode::with_all_labels(node, |key| match keys.get(key) {
                    Some(shared) => shared.clone(),
                    None => {
                        let shared: std::sync::Arc<str> = key.into();
                        keys.insert(shared.clone());
                        shared
                    }
                })
            }
            None => CachedNode::of(node, &self.label_keys),
        }
    }

    /// [`NodeCache::compact`], for the tests of [`CachedNode`].
    #[cfg(test)]
    pub(super) fn compact_for_test(&self, node: &SlimNode) -> CachedNode {
        self.compact(node)
    }

    fn nodes(&self) -> MutexGuard<'_, HashMap<NodeName, CachedNode>> {
        self.nodes.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cached Node of this name, with the cache's shared name.
    pub fn get(&self, name: &str) -> Option<(NodeName, CachedNode)> {
        self.nodes()
            .get_key_value(name)
            .map(|(k, v)| (k.clone(), v.clone()))
    }

    /// Number of Nodes cached.
    pub fn len(&self) -> usize {
        self.nodes().len()
    }

    /// Whether no Node is cached.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every cached Node's name, sorted.
    pub fn names(&self) -> Vec<NodeName> {
        let mut names: Vec<NodeName> = self.nodes().keys().cloned().collect();
        names.sort();
        names
    }

    /// Stores `node`; returns its name as the cache shares it (`None` for a Node without a name).
    pub(super) fn apply(&self, node: &SlimNode) -> Option<NodeName> {
        let name = node.name();
        if name.is_empty() {
            return None;
        }
        let cached = self.compact(node);
        let mut nodes = self.nodes();
        if let Some((key, value)) = nodes.get_key_value(name) {
            let key = key.clone();
            if *value != cached {
                nodes.insert(key.clone(), cached);
            }
            return Some(key);
        }
        let key: NodeName = name.into();
        nodes.insert(key.clone(), cached);
        Some(key)
    }

    /// Forgets the Node `name`; returns the shared name if it was cached.
    fn delete(&self, name: &str) -> Option<NodeName> {
        let mut nodes = self.nodes();
        let key = nodes.get_key_value(name).map(|(k, _)| k.clone())?;
        nodes.remove(name);
        Some(key)
    }

    /// Replaces the whole content with a fresh list; returns every name that was or is listed.
    fn replace(&self, fresh: HashMap<NodeName, CachedNode>) -> Vec<NodeName> {
        let mut nodes = self.nodes();
        let old = std::mem::take(&mut *nodes);
        let mut touched: Vec<NodeName> = old
            .into_keys()
            .filter(|name| !fresh.contains_key(name))
            .collect();
        touched.extend(fresh.keys().cloned());
        *nodes = fresh;
        touched.sort();
        touched
    }

    /// The shared name for `name` if it is cached already (so a re-list does not duplicate names).
    fn shared_name(&self, name: &str) -> NodeName {
        self.nodes()
            .get_key_value(name)
            .map(|(k, _)| k.clone())
            .unwrap_or_else(|| name.into())
    }
}

/// How the informer gets its initial state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitialList {
    /// Streaming list (`sendInitialEvents`), falling back to a paged LIST if the server refuses.
    Streaming,
    /// Paged LIST only.
    Paged,
}

/// Settings of [`run`].
#[derive(Debug, Clone)]
pub struct InformerSettings {
    /// How to get the initial state.
    pub initial_list: InitialList,
    /// First retry delay after a failed list or watch.
    pub retry_min_delay: Duration,
    /// Retry delay cap.
    pub retry_max_delay: Duration,
}

/// What [`run`] reports through its `synced` channel: how many complete lists it has applied
/// (0 until the first one) and how the last one was obtained.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SyncState {
    /// Complete initial lists applied so far (re-lists after `410 Gone` count too).
    pub lists: u64,
    /// Whether the last one was a streaming list.
    pub streamed: bool,
}

/// Why an attempt at the initial state failed.
enum InitialError {
    /// The server does not serve streaming lists: use a paged LIST.
    StreamingUnsupported(String),
    /// Anything else: retry after a backoff.
    Failed(String),
    /// Stop was requested.
    Stopped,
    /// The client can no longer send anything.
    Broken(String),
}

impl InitialError {
    fn from_kube(error: &kube::Error) -> InitialError {
        if is_client_broken(error) {
            InitialError::Broken(error_chain(error))
        } else {
            InitialError::Failed(error_chain(error))
        }
    }
}

/// An initial state: the Nodes, the resourceVersion to watch from, and (streaming) the open
/// watch stream that continues after it.
type Initial = (
    HashMap<NodeName, CachedNode>,
    String,
    Option<WatchStream>,
    bool,
);

type WatchStream = std::pin::Pin<Box<dyn Stream<Item = kube::Result<WatchEvent<SlimNode>>> + Send>>;

/// Where the informer puts what it reads.
pub struct Outputs {
    /// Every Node, compact.
    pub cache: std::sync::Arc<NodeCache>,
    /// Every Node name that changed (or was listed).
    pub queue: std::sync::Arc<WorkQueue>,
    /// Told how far the watch has got, so our writes never run further ahead.
    pub window: std::sync::Arc<WriteWindow>,
}

/// Runs the informer until `stop` becomes true: initial state into the cache (then every name
/// queued, and `synced` bumped), then the watch. API failures are logged and retried with
/// backoff, as client-go's reflector does; it returns early only when the client itself is broken
/// (after reporting why on `broken`).
pub async fn run(
    api: Api<SlimNode>,
    outputs: Outputs,
    synced: watch::Sender<SyncState>,
    settings: InformerSettings,
    stop: watch::Receiver<bool>,
    broken: watch::Sender<Option<String>>,
) {
    let mut informer = Informer {
        api,
        outputs,
        synced,
        stop,
        broken,
        mode: settings.initial_list,
        delay: Backoff::new(settings.retry_min_delay, settings.retry_max_delay),
    };
    while let Some((resource_version, stream)) = informer.list().await {
        if let Step::Stop = informer.watch(resource_version, stream).await {
            return;
        }
    }
}

/// The informer's state across its phases ([`Informer::list`], [`Informer::watch`]).
struct Informer {
    api: Api<SlimNode>,
    outputs: Outputs,
    synced: watch::Sender<SyncState>,
    stop: watch::Receiver<bool>,
    broken: watch::Sender<Option<String>>,
    /// How the next initial state is taken (a refused streaming list switches to paged for good).
    mode: InitialList,
    delay: Backoff,
}

/// What the watch phase needs next.
enum Step {
    /// Open the watch again from the last resourceVersion.
    Reopen,
    /// Take a new initial state (410 Gone, or a watch error).
    Relist,
    /// Stop was requested, or the client is broken (reported).
    Stop,
}

impl Informer {
    /// A consistent initial state, retried with backoff, published ([`Informer::publish`]): the
    /// resourceVersion to watch from and, after a streaming list, its open stream. `None` on stop
    /// or a broken client (reported on `broken`).
    async fn list(&mut self) -> Option<(String, Option<WatchStream>)> {
        loop {
            let mut stop_listing = self.stop.clone();
            let initial = tokio::select! {
                biased;
                () = super::stopped(&mut self.stop) => return None,
                initial = initial_state(&self.api, &self.outputs.cache, self.mode, &mut stop_listing) => initial,
            };
            match initial {
                Ok(initial) => return Some(self.publish(initial)),
                Err(InitialError::Stopped) => return None,
                Err(InitialError::Broken(why)) => {
                    let _ = self.broken.send(Some(why));
                    return None;
                }
                Err(InitialError::StreamingUnsupported(why)) => {
                    tracing::warn!(error = %why, "the API server does not serve streaming lists (sendInitialEvents); using a paged LIST from now on");
                    self.mode = InitialList::Paged;
                }
                Err(InitialError::Failed(why)) => {
                    let wait = self.delay.next();
                    tracing::warn!(error = %why, retry_in = ?wait, "listing Nodes failed");
                    if sleep_or_stop(wait, &mut self.stop).await {
                        return None;
                    }
                }
            }
        }
    }

    /// Puts an initial state in the cache, queues every Node that was or is listed, moves the
    /// write window and bumps `synced`.
    fn publish(
        &mut self,
        (fresh, resource_version, stream, streamed): Initial,
    ) -> (String, Option<WatchStream>) {
        self.delay.reset();
        let count = fresh.len();
        let touched = self.outputs.cache.replace(fresh);
        self.outputs.queue.reserve(touched.len());
        for name in touched {
            self.outputs.queue.add(name);
        }
        // A consistent list includes every write acknowledged before it.
        self.outputs.window.seen(&resource_version);
        tracing::info!(
            nodes = count,
            streamed,
            %resource_version,
            "listed Nodes; watching"
        );
        self.synced.send_modify(|state| {
            state.lists += 1;
            state.streamed = streamed;
        });
        (resource_version, stream)
    }

    /// Watches from `resource_version` (on `stream` if the streaming list left one open),
    /// re-opening the watch as often as needed, until a re-list is needed or stop.
    async fn watch(
        &mut self,
        mut resource_version: String,
        mut stream: Option<WatchStream>,
    ) -> Step {
        loop {
            let open = match stream.take() {
                Some(open) => open,
                None => match self.open_watch(&resource_version).await {
                    Ok(open) => open,
                    Err(Step::Reopen) => continue,
                    Err(step) => return step,
                },
            };
            match self.follow(open, &mut resource_version).await {
                Step::Reopen => {}
                step => return step,
            }
        }
    }

    /// Opens a WATCH from `resource_version`. `Err(Step::Reopen)` after a failure and its
    /// backoff.
    async fn open_watch(&mut self, resource_version: &str) -> Result<WatchStream, Step> {
        let params = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
        let opened = tokio::select! {
            biased;
            () = super::stopped(&mut self.stop) => return Err(Step::Stop),
            opened = self.api.watch(&params, resource_version) => opened,
        };
        match opened {
            Ok(open) => Ok(Box::pin(open) as WatchStream),
            Err(kube::Error::Api(status)) if status.code == 410 => {
                tracing::info!(%resource_version, "the watch fell behind the API server's history (410 Gone); listing again");
                Err(Step::Relist)
            }
            Err(error) => {
                if is_client_broken(&error) {
                    let _ = self.broken.send(Some(error_chain(&error)));
                    return Err(Step::Stop);
                }
                let wait = self.delay.next();
                tracing::warn!(error = %error_chain(&error), retry_in = ?wait, "watching Nodes failed");
                if sleep_or_stop(wait, &mut self.stop).await {
                    return Err(Step::Stop);
                }
                Err(Step::Reopen)
            }
        }
    }

    /// Reads one watch stream until it ends, goes silent or fails.
    async fn follow(&mut self, mut open: WatchStream, resource_version: &mut String) -> Step {
        let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECONDS)) + WATCH_IDLE_GRACE;
        loop {
            let next = tokio::select! {
                biased;
                () = super::stopped(&mut self.stop) => return Step::Stop,
                next = tokio::time::timeout(idle, open.next()) => next,
            };
            let event = match next {
                Err(_) => {
                    tracing::warn!(?idle, "the Node watch went silent; watching again");
                    return Step::Reopen;
                }
                Ok(None) => return Step::Reopen,
                Ok(Some(Ok(event))) => event,
                Ok(Some(Err(error))) => {
                    if is_client_broken(&error) {
                        let _ = self.broken.send(Some(error_chain(&error)));
                        return Step::Stop;
                    }
                    tracing::warn!(error = %error_chain(&error), "reading the Node watch failed; watching again");
                    return Step::Reopen;
                }
            };
            if let Some(step) = self.apply(event, resource_version).await {
                return step;
            }
        }
    }

    /// Applies one watch event to the cache, the queue and the write window. `Some` when the
    /// watch cannot go on.
    async fn apply(
        &mut self,
        event: WatchEvent<SlimNode>,
        resource_version: &mut String,
    ) -> Option<Step> {
        match event {
            WatchEvent::Added(node) | WatchEvent::Modified(node) => {
                if let Some(name) = self.outputs.cache.apply(&node) {
                    self.outputs.queue.add(name);
                }
                if let Some(rv) = node.metadata.resource_version {
                    self.outputs.window.seen(&rv);
                    *resource_version = rv;
                }
                self.delay.reset();
            }
            WatchEvent::Deleted(node) => {
                // Urgent: a deletion frees blocks that waiting Nodes need now.
                if let Some(name) = self.outputs.cache.delete(node.name()) {
                    self.outputs.queue.add_urgent(name);
                }
                if let Some(rv) = node.metadata.resource_version {
                    self.outputs.window.seen(&rv);
                    *resource_version = rv;
                }
                self.delay.reset();
            }
            WatchEvent::Bookmark(bookmark) => {
                self.outputs
                    .window
                    .seen(&bookmark.metadata.resource_version);
                *resource_version = bookmark.metadata.resource_version;
            }
            WatchEvent::Error(status) if status.code == 410 => {
                tracing::info!(%resource_version, "the watch fell behind the API server's history (410 Gone); listing again");
                return Some(Step::Relist);
            }
            WatchEvent::Error(status) => {
                // Not 410: the server could not go on from this resourceVersion (a real
                // kube-apiserver without its watch cache answers a watch from exactly etcd's
                // compaction revision with 500 "PrevKv=nil", again on every re-open). Watching
                // again from the same version would loop; like client-go's reflector (the error
                // ends ListAndWatch, BackoffUntil calls it again), list again after a backoff.
                let wait = self.delay.next();
                tracing::warn!(code = status.code, message = %status.message, retry_in = ?wait, "the Node watch reported an error; listing again");
                if sleep_or_stop(wait, &mut self.stop).await {
                    return Some(Step::Stop);
                }
                return Some(Step::Relist);
            }
        }
        None
    }
}

/// Sleeps `wait` unless stop is requested first; returns whether it was.
async fn sleep_or_stop(wait: Duration, stop: &mut watch::Receiver<bool>) -> bool {
    tokio::select! {
        biased;
        () = super::stopped(stop) => true,
        () = tokio::time::sleep(wait) => false,
    }
}

async fn initial_state(
    api: &Api<SlimNode>,
    cache: &NodeCache,
    mode: InitialList,
    stop: &mut watch::Receiver<bool>,
) -> Result<Initial, InitialError> {
    match mode {
        InitialList::Streaming => streaming_list(api, cache, stop).await,
        InitialList::Paged => paged_list(api, cache).await,
    }
}

/// Whether a refused streaming-list request means "not supported here" (use a paged LIST) rather
/// than a passing failure: 400 BadRequest / 422 Invalid (the option is unknown or forbidden, as
/// kube-apiserver's `ValidateListOptions` answers without the WatchList feature), 404/405/406/415
/// and 501 (a server or proxy that does not serve such watches).
fn streaming_refused(code: u16) -> bool {
    matches!(code, 400 | 404 | 405 | 406 | 415 | 422 | 501)
}

async fn streaming_list(
    api: &Api<SlimNode>,
    cache: &NodeCache,
    stop: &mut watch::Receiver<bool>,
) -> Result<Initial, InitialError> {
    let mut params = WatchParams::default().timeout(WATCH_TIMEOUT_SECONDS);
    params.send_initial_events = true;
    // resourceVersion unset (empty): the current state, a consistent read.
    let opened = api.watch(&params, "").await;
    let mut stream: WatchStream = match opened {
        Ok(stream) => Box::pin(stream),
        Err(kube::Error::Api(status)) if streaming_refused(status.code) => {
            return Err(InitialError::StreamingUnsupported(format!(
                "{} {}",
                status.code, status.message
            )));
        }
        Err(error) => return Err(InitialError::from_kube(&error)),
    };
    let mut fresh = HashMap::new();
    let idle = Duration::from_secs(u64::from(WATCH_TIMEOUT_SECONDS)) + WATCH_IDLE_GRACE;
    loop {
        let next = tokio::select! {
            biased;
            () = super::stopped(stop) => return Err(InitialError::Stopped),
            next = tokio::time::timeout(idle, stream.next()) => next,
        };
        match next {
            Err(_) | Ok(None) => {
                // A server that accepted the request but never ends the initial events does not
                // serve streaming lists as specified.
                return Err(InitialError::StreamingUnsupported(
                    "the watch ended before the initial-events-end bookmark".to_owned(),
                ));
            }
            Ok(Some(Ok(WatchEvent::Added(node) | WatchEvent::Modified(node)))) => {
                insert_fresh(&mut fresh, cache, &node);
            }
            Ok(Some(Ok(WatchEvent::Deleted(node)))) => {
                fresh.remove(node.name());
            }
            Ok(Some(Ok(WatchEvent::Bookmark(bookmark)))) => {
                if bookmark
                    .metadata
                    .annotations
                    .contains_key("k8s.io/initial-events-end")
                {
                    return Ok((
                        fresh,
                        bookmark.metadata.resource_version,
                        Some(stream),
                        true,
                    ));
                }
            }
            Ok(Some(Ok(WatchEvent::Error(status)))) if streaming_refused(status.code) => {
                return Err(InitialError::StreamingUnsupported(format!(
                    "{} {}",
                    status.code, status.message
                )));
            }
            Ok(Some(Ok(WatchEvent::Error(status)))) => {
                return Err(InitialError::Failed(format!(
                    "{} {}",
                    status.code, status.message
                )));
            }
            Ok(Some(Err(error))) => return Err(InitialError::from_kube(&error)),
        }
    }
}

async fn paged_list(api: &Api<SlimNode>, cache: &NodeCache) -> Result<Initial, InitialError> {
    let mut fresh = HashMap::new();
    let mut params = ListParams::default().limit(LIST_PAGE_SIZE);
    loop {
        let page = api
            .list(&params)
            .await
            .map_err(|e| InitialError::from_kube(&e))?;
        for node in &page.items {
            insert_fresh(&mut fresh, cache, node);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => {
                let resource_version = page
                    .metadata
                    .resource_version
                    .filter(|rv| !rv.is_empty())
                    .ok_or_else(|| {
                    InitialError::Failed("the Node list has no resourceVersion".to_owned())
                })?;
                return Ok((fresh, resource_version, None, false));
            }
        }
    }
}

fn insert_fresh(fresh: &mut HashMap<NodeName, CachedNode>, cache: &NodeCache, node: &SlimNode) {
    let name = node.name();
    if name.is_empty() {
        return;
    }
    fresh.insert(cache.shared_name(name), cache.compact(node));
}

/// Capped exponential retry delays with jitter (`backon`; kube-rs's watcher default is
/// 0.8 s → 30 s), restarted after a success.
struct Backoff {
    builder: ExponentialBuilder,
    current: ExponentialBackoff,
}

impl Backoff {
    fn new(min: Duration, max: Duration) -> Backoff {
        let builder = ExponentialBuilder::default()
            .with_min_delay(min)
            .with_max_delay(max.max(min))
            .with_factor(2.0)
            .with_jitter()
            .without_max_times();
        Backoff {
            current: builder.build(),
            builder,
        }
    }

    fn next(&mut self) -> Duration {
        // The schedule has no limit on attempts, so it never ends.
        self.current.next().unwrap_or(Duration::from_secs(30))
    }

    fn reset(&mut self) {
        self.current = self.builder.build();
    }
}
