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

use super::decide::{
    Known, ObjectChange, Observed, Term, Write, decide, observe_fence, status_patch,
};
use super::{Entry, FINALIZER, ObjectView, RECHECK_INTERVAL, STATUS_WRITE_INTERVAL};
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
    view: Arc<ObjectView>,
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
    let meta = &entry.observed.object.metadata;
    let announced = memory.announced.contains(&(
        meta.uid.clone().unwrap_or_default(),
        meta.generation.unwrap_or(0),
    ));
    let planned = plan_writes(
        &mut lock(&shared.allocator),
        (name, &entry.observed, entry.invalid.as_deref()),
        &in_doubt,
        (term, next_stamp),
        announced,
        Timestamp::now(),
    );
    if planned.opened {
        wake_all(shared, "a ClusterCIDR's closing fence let allocation in");
    }
    planned.writes
}

/// What [`plan_writes`] decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Planned {
    /// The object's writes, in order ([`decide`]).
    pub writes: Vec<Write>,
    /// Observing the object moved its fence so that allocation may go where it could not (the
    /// caller wakes the waiting Nodes).
    pub opened: bool,
}

/// One object's writes, decided on `allocator` (the caller holds its lock throughout): the
/// object's fence brought up to date with `observed` ([`observe_fence`]), its holders counted
/// ([`Allocator::pool_holders`], `in_doubt` naming the Nodes whose write may still land),
/// [`decide`] called, and a removal decided marked [`Fence::Removing`] before the caller releases
/// the lock — so no block inside its ranges can be handed out between the count and the
/// removal's outcome. `invalid`: why the object is not usable, if it is not; `next_stamp`: the
/// value a stamp written now carries; `announced`: its invalid event for this generation was
/// published; `now`: the time a condition that changes status gets. Empty when the allocator
/// does not know a valid object (yet).
pub fn plan_writes(
    allocator: &mut Allocator,
    (name, observed, invalid): (&str, &Observed, Option<&str>),
    in_doubt: &[NodeName],
    (term, next_stamp): (&Term, String),
    announced: bool,
    now: Timestamp,
) -> Planned {
    let fence = allocator
        .fence(name)
        .map(|fence| observe_fence(fence, &observed.object, term));
    let opened = fence
        .as_ref()
        .is_some_and(|fence| allocator.set_fence(name, fence.clone()));
    let state = match invalid {
        Some(message) => PoolState::Invalid {
            message: message.to_owned(),
        },
        None => {
            let known = ClusterCidrPool::from_object(&observed.object)
                .ok()
                .and_then(|_| allocator.cluster_cidr_state(name));
            let Some(state) = known else {
                return Planned {
                    writes: Vec::new(),
                    opened,
                };
            };
            state
        }
    };
    let known = Known {
        state,
        holders: allocator.pool_holders(name, in_doubt),
        invalid_announced: announced,
        fence,
        next_stamp,
        may_stamp: term.may_stamp(&observed.object),
    };
    let writes = decide(observed, &known, now);
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
        let tested_rv = observed
            .object
            .metadata
            .resource_version
            .clone()
            .unwrap_or_default();
        allocator.set_fence(name, Fence::Removing { tested_rv });
    }
    Planned { writes, opened }
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
    view: &ObjectView,
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
            let settled = Settled::Applied(&answered.observed.object);
            if settle_fence(&mut lock(&shared.allocator), name, removal, settled, term) {
                wake_all(shared, "a ClusterCIDR's closing fence let allocation in");
            }
            object.metadata.resource_version
        }
        Answer::Refused(code) => {
            if settle_fence(
                &mut lock(&shared.allocator),
                name,
                removal,
                Settled::Refused(code),
                term,
            ) {
                wake_all(shared, "a ClusterCIDR's finalizer is gone");
            }
            None
        }
        Answer::Unknown => None,
    }
}

/// How one write to a ClusterCIDR ended, for [`settle_fence`].
#[derive(Debug, Clone, Copy)]
pub enum Settled<'a> {
    /// Applied: the object as stored after it.
    Applied(&'a crate::cluster_cidr::ClusterCidrObject),
    /// Refused for good with this HTTP status (a 4xx other than 429).
    Refused(u16),
    /// No definite answer: it may still apply.
    Unknown,
}

/// Moves the fence of ClusterCIDR `name` (if it is closing) on a write's answer: an applied
/// write's object is an observation ([`observe_fence`]); a removal (`removal`) refused for good
/// can never apply — 404: the object is gone, nothing left to protect ([`Fence::Fenced`]); any
/// other refusal: back to [`Fence::Unfenced`] until the object shows this term's stamp again;
/// an unknown outcome leaves the fence as it is (a removal stays [`Fence::Removing`]). Returns
/// whether allocation may now go where it could not (the caller wakes waiting Nodes).
pub fn settle_fence(
    allocator: &mut Allocator,
    name: &str,
    removal: bool,
    answer: Settled<'_>,
    term: &Term,
) -> bool {
    match answer {
        Settled::Applied(object) => match allocator.fence(name) {
            Some(fence) => {
                let fence = observe_fence(fence, object, term);
                allocator.set_fence(name, fence)
            }
            None => false,
        },
        Settled::Refused(code) if removal => {
            let fence = if code == 404 {
                Fence::Fenced
            } else {
                Fence::Unfenced
            };
            allocator.set_fence(name, fence)
        }
        Settled::Refused(_) | Settled::Unknown => false,
    }
}
