//! ClusterCIDR objects at run time (issue 18 §2, `--cidr-allocator-type=MultiCIDRRangeAllocator`):
//! the list before start-up occupy, the watch that turns each change into
//! [`Allocator::sync_cluster_cidrs`] with the whole view, and the writer of finalizers, `/status`
//! and `ClusterCIDRInvalid` events ([`decide`] decides, this module sends).
//!
//! - **Listed first.** `list` runs before the Node informer's first list is occupied, so every
//!   existing podCIDR is occupied in the pool that contains it. The CRD not installed (404) is
//!   [`Error::ClusterCidrCrdMissing`], naming `kubectl apply -f deploy/crds/clustercidrs.yaml`;
//!   another failure is retried with the informer's backoff.
//! - **Watched.** `watch` runs kube-runtime's `watcher` over `Api<DynamicObject>` (the CRD is
//!   ours but the status type lives apart from
//!   [`ClusterCidrObject`](crate::cluster_cidr::ClusterCidrObject), so the objects are read
//!   generically and split); after each change the allocator gets the whole view under its lock
//!   and, when a pool brought capacity, every waiting Node is woken under the same lock (a Node
//!   that failed just before the sync is then already among the waiters; one deciding after it
//!   sees the new pool).
//! - **Written.** `write` (`writer.rs`) goes over every object when the view changes and at least
//!   every [`RECHECK_INTERVAL`] (so a finalizer is removed within about a second of the last
//!   holder leaving, whichever path freed the block), leader only (it runs only inside an
//!   allocating term), each write after the same write gate and token bucket as the Node PATCHes.
//!   A status is written at most once per [`STATUS_WRITE_INTERVAL`] per object. A closing
//!   ClusterCIDR's finalizer comes off only behind its fence
//!   ([`crate::reconcile::Fence`]): no timing makes a late removal harmless, the fence does.
//!
//! Why not `kube::runtime::finalizer`: it adds and removes the finalizer itself inside a
//! reconciler, with no way to pass the writes through the write gate (nothing may be written
//! before the start-up write fence or outside a sure Lease) or the token bucket; its JSON patches
//! (a `test` of the finalizer list) are the same idea as ours (a `test` of the resourceVersion).

mod decide;
mod writer;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt as _, watcher::Event};
use kube::{Api, Client};
use tokio::sync::{Notify, watch as tokio_watch};

pub use decide::{
    FINALIZER, Known, ObjectChange, Observed, STAMP_ANNOTATION, Term, Write, decide, observe_fence,
    status_patch,
};
pub(super) use writer::write;
pub use writer::{Planned, Settled, plan_writes, settle_fence};

use super::quiescence::Rounds;
use super::worker::Shared;
use crate::Error;
use crate::cluster_cidr::ClusterCidrPool;
use crate::reasons;
use crate::reconcile::{Allocator, NodeName};

/// How often every ClusterCIDR is looked at again without a change of the objects (a Node's
/// block freed may let a finalizer go).
pub const RECHECK_INTERVAL: Duration = Duration::from_secs(1);
/// At most one `/status` write per object this often.
pub const STATUS_WRITE_INTERVAL: Duration = Duration::from_secs(1);

/// `nodeipam.io/v1alpha1` `ClusterCIDR`, plural `clustercidrs` (`deploy/crds/clustercidrs.yaml`).
pub fn api_resource() -> ApiResource {
    ApiResource::from_gvk_with_plural(
        &GroupVersionKind::gvk("nodeipam.io", "v1alpha1", "ClusterCIDR"),
        "clustercidrs",
    )
}

/// The cluster-scoped ClusterCIDR API through `client`.
pub fn api(client: Client) -> Api<DynamicObject> {
    Api::all_with(client, &api_resource())
}

/// One object of the view: as observed, and why it cannot be a pool (`None`: it is one).
#[derive(Debug, Clone)]
struct Entry {
    observed: Observed,
    invalid: Option<String>,
}

/// The objects the watch shows, by name, and what the writer remembers about them.
#[derive(Debug, Default)]
pub(super) struct ObjectView {
    view: Mutex<BTreeMap<String, Entry>>,
    /// The view changed: the writer looks at every object.
    changed: Notify,
    /// The writer's rounds, asked for and done ([`super::Quiescence`]).
    pub(super) rounds: Arc<Rounds>,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The object and status of `object`, and its `spec` parse error if it has one.
fn entry_of(object: &DynamicObject) -> (String, Entry) {
    let name = object.metadata.name.clone().unwrap_or_default();
    let read = crate::cluster_cidr::read_object(object.metadata.clone(), object.data.get("spec"));
    let status = object
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok());
    let observed = Observed {
        object: read.object,
        status,
    };
    (
        name,
        Entry {
            observed,
            invalid: read.pool.err(),
        },
    )
}

impl ObjectView {
    /// A view of `objects` (the list's).
    fn of(objects: &[DynamicObject]) -> ObjectView {
        let view = ObjectView::default();
        view.replace(objects);
        view
    }

    fn replace(&self, objects: &[DynamicObject]) {
        *lock(&self.view) = objects.iter().map(entry_of).collect();
    }

    fn apply(&self, object: &DynamicObject) {
        let (name, entry) = entry_of(object);
        lock(&self.view).insert(name, entry);
    }

    /// [`ObjectView::apply`] of a write's answer, unless the view's copy is no longer the one
    /// the write was decided on (`decided_rv`): the watch may have shown a newer version (a
    /// deletion) meanwhile, which an older answer must not replace.
    fn apply_answer(&self, decided_rv: Option<&str>, object: &DynamicObject) {
        let (name, entry) = entry_of(object);
        let mut view = lock(&self.view);
        if let Some(current) = view.get_mut(&name)
            && current.observed.object.metadata.resource_version.as_deref() == decided_rv
        {
            *current = entry;
        }
    }

    /// Every object of the view, name order (a copy: the writer awaits between objects).
    fn snapshot(&self) -> Vec<(String, Entry)> {
        lock(&self.view)
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect()
    }

    fn delete(&self, object: &DynamicObject) {
        lock(&self.view).remove(object.metadata.name.as_deref().unwrap_or_default());
    }

    /// Gives the allocator the whole view (the objects it refuses included: they are offered
    /// again on every sync). Logs what changed.
    /// Returns the sync and whether a closing fence let allocation in (a fence forgotten: the
    /// object gone or our finalizer off it).
    fn sync(&self, allocator: &mut Allocator) -> (crate::reconcile::ClusterCidrSync, bool) {
        let view = lock(&self.view);
        let (synced, opened) = sync_view(
            allocator,
            view.iter()
                .map(|(name, e)| (name.as_str(), &e.observed, e.invalid.is_some())),
        );
        let pools = view.values().filter(|e| e.invalid.is_none()).count();
        // Refusals alone are not logged: a refused pool is offered again every round (its
        // `ClusterCIDRInvalid` event and status say why, once).
        if !(synced.added.is_empty() && synced.removed.is_empty()) {
            tracing::info!(
                added = ?synced.added,
                removed = ?synced.removed,
                refused = ?synced.refused,
                pools,
                "ClusterCIDR pools synced"
            );
        }
        (synced, opened)
    }
}

/// Gives `allocator` the watch's whole view of the ClusterCIDR objects, each as `(name, object,
/// invalid)` (`invalid`: the object is not usable, see [`ClusterCidrPool::from_object`]): the
/// usable ones as pools ([`Allocator::sync_cluster_cidrs`]; one without our [`FINALIZER`] yet
/// serves no new Node), then the closing ones — carrying our finalizer and being deleted,
/// invalid, or refused by the allocator — to [`Allocator::track_closing`]. Returns the sync and
/// whether a closing fence let allocation in. The controller's one place for this (the model
/// check calls it too).
pub fn sync_view<'a>(
    allocator: &mut Allocator,
    view: impl IntoIterator<Item = (&'a str, &'a Observed, bool)>,
) -> (crate::reconcile::ClusterCidrSync, bool) {
    let view: Vec<(&str, &Observed, bool)> = view.into_iter().collect();
    let ours = |o: &Observed| {
        o.object
            .metadata
            .finalizers
            .iter()
            .flatten()
            .any(|f| f == FINALIZER)
    };
    let pools: Vec<ClusterCidrPool> = view
        .iter()
        .filter(|(_, _, invalid)| !invalid)
        .filter_map(|(_, o, _)| {
            let mut pool = ClusterCidrPool::from_object(&o.object).ok()?;
            pool.awaiting_finalizer = !ours(o);
            Some(pool)
        })
        .collect();
    let synced = allocator.sync_cluster_cidrs(&pools);
    let closing: Vec<String> = view
        .iter()
        .filter(|(name, o, invalid)| {
            ours(o)
                && (o.object.metadata.deletion_timestamp.is_some()
                    || *invalid
                    || synced.refused.iter().any(|(n, _)| n == name))
        })
        .map(|(name, _, _)| (*name).to_owned())
        .collect();
    let opened = allocator.track_closing(&closing);
    (synced, opened)
}

/// Lists the ClusterCIDRs (before the Nodes are occupied) and gives them to `allocator`. Retries
/// a failure other than the CRD missing, every `retry` at most, until `stop`.
///
/// # Errors
/// [`Error::ClusterCidrCrdMissing`] when the API server does not serve the resource (404).
pub(super) async fn list(
    api: &Api<DynamicObject>,
    allocator: &Mutex<Allocator>,
    retry: Duration,
    stop: &mut tokio_watch::Receiver<bool>,
) -> Result<Option<Arc<ObjectView>>, Error> {
    loop {
        match api.list(&kube::api::ListParams::default()).await {
            Ok(list) => {
                let view = ObjectView::of(&list.items);
                view.sync(&mut lock(allocator));
                tracing::info!(
                    cluster_cidrs = list.items.len(),
                    "ClusterCIDRs listed before start-up occupy"
                );
                return Ok(Some(Arc::new(view)));
            }
            Err(kube::Error::Api(status)) if status.code == 404 => {
                return Err(Error::ClusterCidrCrdMissing {
                    message: status.message.clone(),
                });
            }
            Err(e) => {
                tracing::warn!(error = %crate::kube_error::error_chain(&e), "listing ClusterCIDRs failed; retrying");
            }
        }
        tokio::select! {
            biased;
            () = super::stopped(stop) => return Ok(None),
            () = tokio::time::sleep(retry) => {}
        }
    }
}

/// Watches the ClusterCIDRs until aborted: each change re-syncs the allocator with the whole view
/// and, if a pool brought capacity, wakes every waiting Node. Errors are retried with the
/// watcher's default backoff (the view stays as it was meanwhile).
pub(super) async fn watch(api: Api<DynamicObject>, view: Arc<ObjectView>, shared: Arc<Shared>) {
    let mut init: Vec<DynamicObject> = Vec::new();
    let mut events = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
    while let Some(event) = events.next().await {
        let changed = match event {
            Ok(Event::Init) => {
                init.clear();
                false
            }
            Ok(Event::InitApply(object)) => {
                init.push(object);
                false
            }
            Ok(Event::InitDone) => {
                view.replace(&std::mem::take(&mut init));
                true
            }
            Ok(Event::Apply(object)) => {
                view.apply(&object);
                true
            }
            Ok(Event::Delete(object)) => {
                view.delete(&object);
                true
            }
            Err(e) => {
                tracing::warn!(error = %e, "watching ClusterCIDRs failed; retrying");
                false
            }
        };
        if changed {
            sync_and_wake(&view, &shared);
            // A backing set added (or dropped) shows in the pool gauges and health at once.
            shared.report_pool();
            view.rounds.want();
            view.changed.notify_one();
        }
    }
}

/// [`ObjectView::sync`] under the allocator's lock and, still under it, wakes every waiting
/// Node when a pool brought capacity, and queues the skipped Nodes the allocator asks to decide
/// again (their podCIDRs now lie in a pool).
fn sync_and_wake(view: &ObjectView, shared: &Shared) {
    let mut allocator = lock(&shared.allocator);
    let (synced, opened) = view.sync(&mut allocator);
    let woken = if synced.capacity_added || opened {
        lock(&shared.waiters).freed(usize::MAX)
    } else {
        Vec::new()
    };
    if !woken.is_empty() {
        tracing::info!(
            nodes = woken.len(),
            added = ?synced.added,
            "a ClusterCIDR brought capacity: waking every waiting Node"
        );
    }
    let mut backoff = lock(&shared.backoff);
    let recheck = synced.recheck.iter().map(|n| NodeName::from(n.as_str()));
    for name in woken.into_iter().chain(recheck) {
        backoff.reset(&name);
        shared.queue.add_urgent(name);
    }
}

/// Wakes every waiting Node (a closing fence let allocation in: a Node waiting on it may now be
/// served). Called under the allocator's lock, which is taken before the waiters' (as in
/// [`sync_and_wake`]).
fn wake_all(shared: &Shared, why: &str) {
    let woken = lock(&shared.waiters).freed(usize::MAX);
    if woken.is_empty() {
        return;
    }
    tracing::info!(nodes = woken.len(), "{why}: waking every waiting Node");
    let mut backoff = lock(&shared.backoff);
    for name in woken {
        backoff.reset(&name);
        shared.queue.add_urgent(name);
    }
}

/// The `ClusterCIDRInvalid` Warning event on the object.
async fn publish_invalid(recorder: &Recorder, entry: &Entry, message: &str, timeout: Duration) {
    let meta = &entry.observed.object.metadata;
    let name = meta.name.clone().unwrap_or_default();
    tracing::warn!(cluster_cidr = %name, reason = %message, "ClusterCIDR not used");
    let event = KubeEvent {
        type_: EventType::Warning,
        reason: reasons::CLUSTER_CIDR_INVALID.to_owned(),
        note: Some(format!(
            "ClusterCIDR {name} is not used for allocation: {message}"
        )),
        action: reasons::ACTION_SYNC_CLUSTER_CIDR.to_owned(),
        secondary: None,
    };
    let reference = ObjectReference {
        api_version: Some("nodeipam.io/v1alpha1".to_owned()),
        kind: Some("ClusterCIDR".to_owned()),
        name: Some(name.clone()),
        uid: meta.uid.clone(),
        ..ObjectReference::default()
    };
    match tokio::time::timeout(timeout, recorder.publish(&event, &reference)).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => {
            tracing::warn!(cluster_cidr = %name, error = %crate::kube_error::error_chain(&e), "publishing an event failed");
        }
        Err(_) => tracing::warn!(cluster_cidr = %name, "publishing an event timed out"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(rv: &str, deleting: bool) -> DynamicObject {
        let mut meta =
            serde_json::json!({"name": "grow", "resourceVersion": rv, "finalizers": [FINALIZER]});
        if deleting {
            meta["deletionTimestamp"] = "2026-12-02T17:00:00Z".into();
        }
        serde_json::from_value(serde_json::json!({
            "apiVersion": "nodeipam.io/v1alpha1",
            "kind": "ClusterCIDR",
            "metadata": meta,
            "spec": {"ipv4": "10.20.0.0/23", "perNodeHostBits": 8},
        }))
        .unwrap()
    }

    fn stored_rv(view: &ObjectView) -> (Option<String>, bool) {
        let view = lock(&view.view);
        let meta = &view["grow"].observed.object.metadata;
        (
            meta.resource_version.clone(),
            meta.deletion_timestamp.is_some(),
        )
    }

    /// A write's answer replaces the view's copy only if that is still the one the write was
    /// decided on: a deletion the watch showed meanwhile is not undone by an older answer (the
    /// finalizer would never be removed).
    #[test]
    fn an_answer_older_than_the_watch_does_not_replace_the_view() {
        let view = ObjectView::of(&[object("4", false)]);
        view.apply(&object("6", true));
        view.apply_answer(Some("4"), &object("5", false));
        assert_eq!(stored_rv(&view), (Some("6".to_owned()), true));
        view.apply_answer(Some("6"), &object("7", true));
        assert_eq!(stored_rv(&view), (Some("7".to_owned()), true));
        assert!(lock(&view.view)["grow"].invalid.is_none());
    }
}
