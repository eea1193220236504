//! The ClusterCIDR writer: each round goes over every object of the view and, per object,
//! decides its writes under the allocator's lock ([`plan`]: the fence observed, the holders
//! counted, [`decide`] called, a removal marked [`Fence::Removing`] before the lock is released),
//! then per write decides whether it may go ([`may_go`]: the status interval, the event published
//! instead), transmits it ([`transmit`]: the token bucket, the write gate, the request) and settles
//! the fence from its answer ([`settle`]). Nothing here waits for time to make a write harmless:
//! a removal's outcome is known from an answer or from the object seen at another
//! `resourceVersion`, and until then no block overlapping the object's ranges is handed out.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::runtime::events::Recorder;
use kube::{Api, Error as KubeError};
use tokio::time::Instant;

use super::decide::{Known, ObjectChange, Term, Write, decide, observe_fence, status_patch};
use super::{ClusterCidrs, Entry, FINALIZER, RECHECK_INTERVAL, STATUS_WRITE_INTERVAL};
use super::{lock, publish_invalid, sync_and_wake, wake_all};
use crate::cluster_cidr::ClusterCidrPool;
use crate::cluster_cidr::status::PoolState;
use crate::controller::worker::Shared;
use crate::reconcile::{Allocator, Fence, NodeName};

/// What the writer remembers between rounds.
#[derive(Debug, Default)]
struct WriterMemory {
    /// When each object's status was last written.
    status_written: BTreeMap<String, Instant>,
    /// `(uid, generation)` of the invalid objects whose event was published.
    announced: HashSet<(String, i64)>,
    /// Stamp values made so far (each stamp's value is new: [`Term::stamp`]).
    stamps: u64,
}

/// Writes finalizers, stamps, statuses and events until aborted (see the module docs). `term`
/// names this allocating term in the stamps.
pub(in crate::controller) async fn write(
    api: Api<DynamicObject>,
    view: Arc<ClusterCidrs>,
    shared: Arc<Shared>,
    recorder: Recorder,
    term: Term,
) {
    let mut memory = WriterMemory::default();
    loop {
        let round = view.rounds.start();
        // A pool refused for `MAX_BACKING_SETS` waits for a set to be freed, which the last Node
        // leaving a gone pool's set does without any ClusterCIDR event: offered again each round.
        if lock(&shared.allocator).cluster_cidrs_refused() {
            sync_and_wake(&view, &shared);
            shared.report_pool();
        }
        for (name, entry) in view.snapshot() {
            let writes = plan(&shared, (&name, &entry), &mut memory, &term);
            // The version the next write of this object is decided on: the observed one, or the
            // answer to our own write just before (only our change lies between them).
            let mut rv = resource_version(&entry);
            for write in writes {
                let Some(request) =
                    may_go(&shared, &recorder, &mut memory, (&name, &entry), write).await
                else {
                    continue;
                };
                let answer = transmit(&api, &shared, &name, &request, &rv).await;
                if let Some(next) = settle(&view, &shared, (&name, &entry), &request, answer, &term)
                {
                    rv = next;
                }
            }
        }
        view.rounds.finish(round);
        tokio::select! {
            () = view.changed.notified() => {}
            () = tokio::time::sleep(RECHECK_INTERVAL) => {}
        }
    }
}

fn resource_version(entry: &Entry) -> String {
    let meta = &entry.observed.object.metadata;
    meta.resource_version.clone().unwrap_or_default()
}

/// The writes one object needs, decided under the allocator's lock: its fence brought up to
/// date with the object as observed, its holders counted, and a removal decided marked
/// [`Fence::Removing`] before the lock is released (so no block inside its ranges can be handed
/// out between the count and the removal's outcome).
fn plan(
    shared: &Shared,
    (name, entry): (&str, &Entry),
    memory: &mut WriterMemory,
    term: &Term,
) -> Vec<Write> {
    // A Node write that may still land (its outcome unknown) counts as a holder: with write
    // intents, every Node whose intent is in the Lease (whenever its write may arrive; an
    // inherited one included); without them, the writes in doubt whose deadline is ahead (a
    // timing assumption, see `controller::ControllerConfig::fence_lease`).
    let in_doubt: Vec<NodeName> = match &shared.settings.write_gate.intents {
        Some(intents) => intents.nodes().into_iter().map(NodeName::from).collect(),
        None => {
            let now = Instant::now();
            shared
                .settings
                .in_doubt
                .deadlines()
                .into_iter()
                .filter(|(_, until)| *until > now)
                .map(|(node, _)| node)
                .collect()
        }
    };
    memory.stamps += 1;
    let next_stamp = term.stamp(memory.stamps);
    let may_stamp = term.may_stamp(&entry.observed.object);
    let mut allocator = lock(&shared.allocator);
    let fence = allocator
        .fence(name)
        .map(|fence| observe_fence(fence, &entry.observed.object, term));
    if let Some(fence) = &fence
        && allocator.set_fence(name, fence.clone())
    {
        wake_all(shared, "a ClusterCIDR's closing fence let allocation in");
    }
    let Some(mut known) = known(
        &allocator,
        (name, entry),
        memory,
        &in_doubt,
        (fence, next_stamp),
    ) else {
        return Vec::new();
    };
    known.may_stamp = may_stamp;
    let writes = decide(&entry.observed, &known, Timestamp::now());
    let removes = writes.iter().any(|w| {
        matches!(
            w,
            Write::Object {
                change: ObjectChange::RemoveFinalizer,
                ..
            }
        )
    });
    if removes {
        allocator.set_fence(
            name,
            Fence::Removing {
                tested_rv: resource_version(entry),
            },
        );
    }
    writes
}

/// The object's state (invalid, or the allocator's), its holders, whether its invalid event was
/// published, its fence and the next stamp. `None`: the allocator does not know it (yet).
fn known(
    allocator: &Allocator,
    (name, entry): (&str, &Entry),
    memory: &WriterMemory,
    in_doubt: &[NodeName],
    (fence, next_stamp): (Option<Fence>, String),
) -> Option<Known> {
    let meta = &entry.observed.object.metadata;
    let announced_key = (
        meta.uid.clone().unwrap_or_default(),
        meta.generation.unwrap_or(0),
    );
    let state = match &entry.invalid {
        Some(message) => PoolState::Invalid {
            message: message.clone(),
        },
        None => {
            ClusterCidrPool::from_object(&entry.observed.object).ok()?;
            allocator.cluster_cidr_state(name)?
        }
    };
    Some(Known {
        state,
        holders: allocator.pool_holders(name, in_doubt),
        // A pool the allocator refuses is announced once per generation too.
        invalid_announced: memory.announced.contains(&announced_key),
        fence,
        next_stamp,
        may_stamp: true,
    })
}

/// A write [`transmit`] sends.
enum Request {
    /// A JSON patch of the object.
    Object(ObjectChange, json_patch::Patch),
    /// A merge patch of `/status`, rendered at send with the then current `resourceVersion`.
    Status(crate::cluster_cidr::status::ClusterCidrStatus),
}

/// Whether `write` goes to the API server: an event is published here instead (it has its own
/// budget in the event writer, and one per invalid generation is all this sends); a status goes
/// at most once per [`STATUS_WRITE_INTERVAL`] per object.
async fn may_go(
    shared: &Shared,
    recorder: &Recorder,
    memory: &mut WriterMemory,
    (name, entry): (&str, &Entry),
    write: Write,
) -> Option<Request> {
    match write {
        Write::Invalid { message } => {
            let timeout = shared.settings.request_timeout;
            publish_invalid(recorder, entry, &message, timeout).await;
            let meta = &entry.observed.object.metadata;
            memory.announced.insert((
                meta.uid.clone().unwrap_or_default(),
                meta.generation.unwrap_or(0),
            ));
            None
        }
        Write::Status { wanted, .. } => {
            let now = Instant::now();
            if memory
                .status_written
                .get(name)
                .is_some_and(|at| now.duration_since(*at) < STATUS_WRITE_INTERVAL)
            {
                return None;
            }
            memory.status_written.insert(name.to_owned(), now);
            Some(Request::Status(wanted))
        }
        Write::Object { change, patch } => Some(Request::Object(change, patch)),
    }
}

/// How a request ended.
enum Answer {
    /// Applied: the object as stored after it.
    Applied(Box<DynamicObject>),
    /// Refused for good (a 4xx other than 429: the request was judged and will never apply).
    Refused(u16),
    /// Unknown (timeout, 5xx, 429, a dropped connection) — or never sent (the write gate
    /// closed): it may still apply, or not.
    Unknown,
}

/// Sends one request after a token and the write gate (right before the request: a gate passed
/// before a wait no longer says the Lease is ours). `rv`: the status's precondition.
async fn transmit(
    api: &Api<DynamicObject>,
    shared: &Shared,
    name: &str,
    request: &Request,
    rv: &str,
) -> Answer {
    shared.limiter.acquire().await;
    if !shared.settings.write_gate.wait().await {
        return Answer::Unknown;
    }
    let params = PatchParams {
        field_manager: Some(crate::controller::CONTROLLER_NAME.to_owned()),
        ..PatchParams::default()
    };
    let timeout = shared.settings.request_timeout;
    let sent = match request {
        Request::Status(wanted) => {
            let patch = status_patch(wanted, rv);
            tokio::time::timeout(
                timeout,
                api.patch_status(name, &params, &Patch::Merge(&patch)),
            )
            .await
        }
        Request::Object(_, patch) => {
            tokio::time::timeout(
                timeout,
                api.patch(name, &params, &Patch::Json::<()>(patch.clone())),
            )
            .await
        }
    };
    match sent {
        Ok(Ok(object)) => Answer::Applied(Box::new(object)),
        Ok(Err(KubeError::Api(status)))
            if (400..500).contains(&status.code) && status.code != 429 =>
        {
            tracing::info!(cluster_cidr = name, code = status.code, message = %status.message, "a ClusterCIDR write was refused (the next round decides again)");
            Answer::Refused(status.code)
        }
        Ok(Err(e)) => {
            tracing::info!(cluster_cidr = name, error = %crate::kube_error::error_chain(&e), "a ClusterCIDR write failed, outcome unknown (the next round decides again)");
            Answer::Unknown
        }
        Err(_) => {
            tracing::info!(
                cluster_cidr = name,
                "a ClusterCIDR write timed out, outcome unknown (the next round decides again)"
            );
            Answer::Unknown
        }
    }
}

/// What `answer` says: an applied write's object replaces the view's copy (if that is still the
/// one decided on, and the object is not gone) and moves the fence as an observation; a removal
/// refused for good can never apply (the fence falls back to [`Fence::Unfenced`] until the
/// object shows this term's stamp again); an unknown outcome leaves the fence as it is (a
/// removal stays [`Fence::Removing`]). Returns the `resourceVersion` the next write of this
/// round is decided on, when ours applied.
fn settle(
    view: &ClusterCidrs,
    shared: &Shared,
    (name, entry): (&str, &Entry),
    request: &Request,
    answer: Answer,
    term: &Term,
) -> Option<String> {
    let removal = matches!(request, Request::Object(ObjectChange::RemoveFinalizer, _));
    match answer {
        Answer::Applied(object) => {
            if let Request::Object(change, _) = request
                && *change != ObjectChange::Stamp
            {
                let add = *change == ObjectChange::AddFinalizer;
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
            let (_, answered) = super::entry_of(&object);
            let mut allocator = lock(&shared.allocator);
            if let Some(fence) = allocator.fence(name) {
                let fence = observe_fence(fence, &answered.observed.object, term);
                if allocator.set_fence(name, fence) {
                    wake_all(shared, "a ClusterCIDR's closing fence let allocation in");
                }
            }
            object.metadata.resource_version
        }
        Answer::Refused(code) => {
            if removal {
                // 404: the object is gone (nothing left to protect); else the removal was judged
                // and refused: it can never apply.
                let fence = if code == 404 {
                    Fence::Fenced
                } else {
                    Fence::Unfenced
                };
                let mut allocator = lock(&shared.allocator);
                if allocator.set_fence(name, fence) {
                    wake_all(shared, "a ClusterCIDR's finalizer is gone");
                }
            }
            None
        }
        Answer::Unknown => None,
    }
}
