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
//!   ours but the status type lives apart from [`ClusterCidrObject`], so the objects are read
//!   generically and split); after each change the allocator gets the whole view under its lock
//!   and, when a pool brought capacity, every waiting Node is woken under the same lock (a Node
//!   that failed just before the sync is then already among the waiters; one deciding after it
//!   sees the new pool).
//! - **Written.** `write` goes over every object when the view changes and at least every
//!   [`RECHECK_INTERVAL`] (so a finalizer is removed within about a second of the last holder
//!   leaving, whichever path freed the block), leader only (it runs only inside an allocating
//!   term), each write after the same write gate and token bucket as the Node PATCHes. A status is
//!   written at most once per [`STATUS_WRITE_INTERVAL`] per object.
//!
//! Why not `kube::runtime::finalizer`: it adds and removes the finalizer itself inside a
//! reconciler, with no way to pass the writes through the write gate (nothing may be written
//! before the start-up write fence or outside a sure Lease) or the token bucket; its JSON patches
//! (a `test` of the finalizer list) are the same idea as ours (a `test` of the resourceVersion).

mod decide;

use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::jiff::Timestamp;
use kube::api::{ApiResource, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::runtime::events::{Event as KubeEvent, EventType, Recorder};
use kube::runtime::watcher;
use kube::runtime::{WatchStreamExt as _, watcher::Event};
use kube::{Api, Client};
use nodeipam_core::Cidr;
use tokio::sync::{Notify, watch as tokio_watch};

pub use decide::{FINALIZER, Known, Observed, Write, decide};

use super::worker::Shared;
use crate::Error;
use crate::cluster_cidr::status::PoolState;
use crate::cluster_cidr::{ClusterCidrObject, ClusterCidrPool};
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
pub(super) struct ClusterCidrs {
    view: Mutex<BTreeMap<String, Entry>>,
    /// The view changed: the writer looks at every object.
    changed: Notify,
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The object and status of `object`, and its `spec` parse error if it has one.
fn entry_of(object: &DynamicObject) -> (String, Entry) {
    let name = object.metadata.name.clone().unwrap_or_default();
    let spec = object.data.get("spec").cloned().unwrap_or_default();
    let (spec, parse_error) = match serde_json::from_value(spec) {
        Ok(spec) => (spec, None),
        Err(e) => (Default::default(), Some(format!("spec: {e}"))),
    };
    let status = object
        .data
        .get("status")
        .and_then(|s| serde_json::from_value(s.clone()).ok());
    let observed = Observed {
        object: ClusterCidrObject {
            metadata: object.metadata.clone(),
            spec,
        },
        status,
    };
    let invalid = match parse_error {
        Some(e) => Some(e),
        None => ClusterCidrPool::from_object(&observed.object)
            .err()
            .map(|e| e.to_string()),
    };
    (name, Entry { observed, invalid })
}

impl ClusterCidrs {
    /// A view of `objects` (the list's).
    fn of(objects: &[DynamicObject]) -> ClusterCidrs {
        let view = ClusterCidrs::default();
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

    /// [`ClusterCidrs::apply`] of a write's answer, unless the view's copy is no longer the one
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

    fn delete(&self, object: &DynamicObject) {
        lock(&self.view).remove(object.metadata.name.as_deref().unwrap_or_default());
    }

    /// Gives the allocator the whole view (the objects it refuses included: they are offered
    /// again on every sync). Logs what changed.
    fn sync(&self, allocator: &mut Allocator) -> crate::reconcile::ClusterCidrSync {
        let view = lock(&self.view);
        let pools: Vec<ClusterCidrPool> = view
            .values()
            .filter(|e| e.invalid.is_none())
            .filter_map(|e| {
                let mut pool = ClusterCidrPool::from_object(&e.observed.object).ok()?;
                pool.awaiting_finalizer = !e
                    .observed
                    .object
                    .metadata
                    .finalizers
                    .iter()
                    .flatten()
                    .any(|f| f == FINALIZER);
                Some(pool)
            })
            .collect();
        // A refused pool stays in the view as valid: it is offered again on every sync (a set may
        // have been freed since); its `Invalid` state comes from the allocator
        // (`cluster_cidr_state`).
        let synced = allocator.sync_cluster_cidrs(&pools);
        // Refusals alone are not logged: a refused pool is offered again every round (its
        // `ClusterCIDRInvalid` event and status say why, once).
        if !(synced.added.is_empty() && synced.removed.is_empty()) {
            tracing::info!(
                added = ?synced.added,
                removed = ?synced.removed,
                refused = ?synced.refused,
                pools = pools.len(),
                "ClusterCIDR pools synced"
            );
        }
        synced
    }
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
) -> Result<Option<Arc<ClusterCidrs>>, Error> {
    loop {
        match api.list(&kube::api::ListParams::default()).await {
            Ok(list) => {
                let view = ClusterCidrs::of(&list.items);
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
pub(super) async fn watch(api: Api<DynamicObject>, view: Arc<ClusterCidrs>, shared: Arc<Shared>) {
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
            view.changed.notify_one();
        }
    }
}

/// [`ClusterCidrs::sync`] under the allocator's lock and, still under it, wakes every waiting
/// Node when a pool brought capacity, and queues the skipped Nodes the allocator asks to decide
/// again (their podCIDRs now lie in a pool).
fn sync_and_wake(view: &ClusterCidrs, shared: &Shared) {
    let mut allocator = lock(&shared.allocator);
    let synced = view.sync(&mut allocator);
    let woken = if synced.capacity_added {
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

/// What the writer remembers between rounds.
#[derive(Debug, Default)]
struct WriterMemory {
    /// When each object's status was last written.
    status_written: BTreeMap<String, tokio::time::Instant>,
    /// `(uid, generation)` of the invalid objects whose event was published.
    announced: HashSet<(String, i64)>,
}

/// Writes finalizers, statuses and events until aborted (see the module docs).
pub(super) async fn write(
    api: Api<DynamicObject>,
    view: Arc<ClusterCidrs>,
    shared: Arc<Shared>,
    recorder: Recorder,
) {
    let mut memory = WriterMemory::default();
    loop {
        // A pool refused for `MAX_BACKING_SETS` waits for a set to be freed, which the last Node
        // leaving a gone pool's set does without any ClusterCIDR event: offered again each round.
        if lock(&shared.allocator).cluster_cidrs_refused() {
            sync_and_wake(&view, &shared);
            shared.report_pool();
        }
        let entries: Vec<(String, Entry)> = lock(&view.view)
            .iter()
            .map(|(n, e)| (n.clone(), e.clone()))
            .collect();
        for (name, entry) in entries {
            let Some(known) = known(&shared, &name, &entry, &memory) else {
                continue;
            };
            for write in decide(&entry.observed, &known, Timestamp::now()) {
                send(
                    &api,
                    &view,
                    &shared,
                    &recorder,
                    &mut memory,
                    (&name, &entry),
                    write,
                )
                .await;
            }
        }
        tokio::select! {
            () = view.changed.notified() => {}
            () = tokio::time::sleep(RECHECK_INTERVAL) => {}
        }
    }
}

/// The object's state (invalid, or the allocator's), whether a write in doubt holds a block in
/// its ranges, and whether its invalid event was published. `None`: the allocator does not know
/// it (yet).
fn known(shared: &Shared, name: &str, entry: &Entry, memory: &WriterMemory) -> Option<Known> {
    let meta = &entry.observed.object.metadata;
    let announced_key = (
        meta.uid.clone().unwrap_or_default(),
        meta.generation.unwrap_or(0),
    );
    if let Some(message) = &entry.invalid {
        return Some(Known {
            state: PoolState::Invalid {
                message: message.clone(),
            },
            write_in_doubt: false,
            invalid_announced: memory.announced.contains(&announced_key),
            retired_holders: lock(&shared.allocator).cluster_cidr_retired_holders(name),
        });
    }
    let pool = ClusterCidrPool::from_object(&entry.observed.object).ok()?;
    let ranges: Vec<Cidr> = [pool.ipv4, pool.ipv6].into_iter().flatten().collect();
    let now = tokio::time::Instant::now();
    let allocator = lock(&shared.allocator);
    let state = allocator.cluster_cidr_state(name)?;
    let write_in_doubt = shared
        .settings
        .in_doubt
        .deadlines()
        .iter()
        .filter(|(_, until)| *until > now)
        .any(|(node, _)| {
            allocator
                .held(node)
                .is_some_and(|held| held.iter().any(|c| ranges.iter().any(|r| r.overlaps(c))))
        });
    Some(Known {
        state,
        write_in_doubt,
        // A pool the allocator refuses is announced once per generation too.
        invalid_announced: memory.announced.contains(&announced_key),
        retired_holders: allocator.cluster_cidr_retired_holders(name),
    })
}

/// Sends one write after the write gate and a token (events after neither: they have their own
/// budget in the event writer, and one per invalid generation is all this sends). A patched
/// object answered replaces the view's copy (if that is still the one decided on, and the
/// object is not gone), so the next round decides on it even before the watch shows it.
async fn send(
    api: &Api<DynamicObject>,
    view: &ClusterCidrs,
    shared: &Shared,
    recorder: &Recorder,
    memory: &mut WriterMemory,
    (name, entry): (&str, &Entry),
    write: Write,
) {
    let timeout = shared.settings.request_timeout;
    let request = match write {
        Write::Invalid { message } => {
            publish_invalid(recorder, entry, &message, timeout).await;
            let meta = &entry.observed.object.metadata;
            memory.announced.insert((
                meta.uid.clone().unwrap_or_default(),
                meta.generation.unwrap_or(0),
            ));
            return;
        }
        Write::Status { patch, .. } => {
            let now = tokio::time::Instant::now();
            if memory
                .status_written
                .get(name)
                .is_some_and(|at| now.duration_since(*at) < STATUS_WRITE_INTERVAL)
            {
                return;
            }
            memory.status_written.insert(name.to_owned(), now);
            Request::Status(patch)
        }
        Write::Finalizers { add, patch } => Request::Finalizers(add, patch),
    };
    shared.limiter.acquire().await;
    // The write gate after the token bucket, right before the request (see the Node writes in
    // `worker.rs`: a gate passed before a wait no longer says the Lease is ours).
    if !shared.settings.write_gate.wait().await {
        return;
    }
    let params = PatchParams {
        field_manager: Some(super::CONTROLLER_NAME.to_owned()),
        ..PatchParams::default()
    };
    let sent = match &request {
        Request::Status(patch) => {
            tokio::time::timeout(
                timeout,
                api.patch_status(name, &params, &Patch::Merge(patch)),
            )
            .await
        }
        Request::Finalizers(_, patch) => {
            let Ok(patch) = serde_json::from_value::<json_patch::Patch>(patch.clone()) else {
                return;
            };
            tokio::time::timeout(timeout, api.patch(name, &params, &Patch::Json::<()>(patch))).await
        }
    };
    match sent {
        Ok(Ok(object)) => {
            if let Request::Finalizers(add, _) = request {
                tracing::info!(
                    cluster_cidr = name,
                    finalizer = FINALIZER,
                    added = add,
                    "ClusterCIDR finalizer {}",
                    if add {
                        "added"
                    } else {
                        "removed: no Node holds a block of it"
                    }
                );
            }
            let still_there = object.metadata.deletion_timestamp.is_none()
                || object
                    .metadata
                    .finalizers
                    .as_ref()
                    .is_some_and(|f| !f.is_empty());
            if still_there {
                let decided_rv = entry.observed.object.metadata.resource_version.as_deref();
                view.apply_answer(decided_rv, &object);
            }
        }
        Ok(Err(e)) => {
            tracing::info!(cluster_cidr = name, error = %crate::kube_error::error_chain(&e), "a ClusterCIDR write failed (the next round decides again)");
        }
        Err(_) => {
            tracing::info!(
                cluster_cidr = name,
                "a ClusterCIDR write timed out (the next round decides again)"
            );
        }
    }
}

/// A write [`send`] makes.
enum Request {
    Status(serde_json::Value),
    Finalizers(bool, serde_json::Value),
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

    fn stored_rv(view: &ClusterCidrs) -> (Option<String>, bool) {
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
        let view = ClusterCidrs::of(&[object("4", false)]);
        view.apply(&object("6", true));
        view.apply_answer(Some("4"), &object("5", false));
        assert_eq!(stored_rv(&view), (Some("6".to_owned()), true));
        view.apply_answer(Some("6"), &object("7", true));
        assert_eq!(stored_rv(&view), (Some("7".to_owned()), true));
        assert!(lock(&view.view)["grow"].invalid.is_none());
    }
}
