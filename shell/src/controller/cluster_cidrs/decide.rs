//! What the controller writes to one ClusterCIDR (issue 18 §2), as a pure function over plain
//! data: the finalizer added or removed, this term's stamp, the `/status` merge patch, the
//! `ClusterCIDRInvalid` event. The caller ([`super`]) owns the client, the write gate and the
//! limiter, and sends what [`decide`] returns (linkerd's policy-controller status index does the
//! same: the index decides, only the controller holds the client).
//!
//! The rules:
//! - a valid ClusterCIDR not being deleted gets the finalizer [`FINALIZER`], so that its deletion
//!   waits for the Nodes holding its blocks;
//! - a ClusterCIDR carrying our finalizer that is being deleted, or is invalid (an invalid one
//!   serves no Node; it got the finalizer as an earlier, valid generation — the spec is immutable,
//!   so only through a CRD without our rules), is *closing*: its [`Fence`] says whether a removal
//!   may still land ([`crate::reconcile::Fence`]). Unfenced, the first write is this term's
//!   *stamp* (the annotation [`STAMP_ANNOTATION`], tested on the `resourceVersion` observed):
//!   once committed, every write decided earlier (ours or an earlier leader's) tests a
//!   `resourceVersion` that is gone, and a writer decides a removal only on an object carrying
//!   its own stamp; it never stamps over a newer epoch's ([`Term::may_stamp`]). Fenced, the finalizer is removed only when nobody holds a block of it
//!   ([`Holders::none`]); the caller marks the fence [`Fence::Removing`] under the same lock;
//! - a removal whose outcome is unknown is sent again unchanged while it is still wanted, and
//!   fenced by a fresh stamp (a write that changes the `resourceVersion` it tests) when it is not;
//! - the status is written only when it would change something ([`status::needs_write`]), with
//!   the `resourceVersion` decided on as a precondition (a late one is refused once the object
//!   changed);
//! - an invalid ClusterCIDR gets one Warning event per generation (the caller remembers which).
//!
//! Every object write is a JSON patch ([`json_patch::Patch`], built here from operations) whose
//! first operation tests `metadata.resourceVersion`: the API server applies it only to the object
//! this decision was made on (422 otherwise, and the next round decides again on the newer
//! object), so a finalizer another client added or removed meanwhile is never overwritten.

use json_patch::jsonptr::PointerBuf;
use json_patch::{AddOperation, Patch, PatchOperation, TestOperation};
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::cluster_cidr::ClusterCidrObject;
use crate::cluster_cidr::status::{self, ClusterCidrStatus, PoolState};
use crate::reconcile::{Fence, Holders};

pub use crate::cluster_cidr::FINALIZER;

/// The annotation a writer stamps on a closing ClusterCIDR before it acts on it:
/// `<epoch>/<name>.<sequence>`, one allocating term's ([`Term`]).
pub const STAMP_ANNOTATION: &str = "nodeipam.io/writer-stamp";

/// One ClusterCIDR as the watch shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Its metadata and spec.
    pub object: ClusterCidrObject,
    /// Its stored `status` (`None` if it has none, or it does not parse as ours).
    pub status: Option<ClusterCidrStatus>,
}

/// What an object write changes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ObjectChange {
    /// [`FINALIZER`] added.
    AddFinalizer,
    /// [`FINALIZER`] removed.
    RemoveFinalizer,
    /// [`STAMP_ANNOTATION`] set to this term's next value.
    Stamp,
}

/// One write to a ClusterCIDR.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A JSON patch (RFC 6902) of the object, its first operation a `test` of the
    /// `resourceVersion` decided on.
    Object {
        /// What it changes.
        change: ObjectChange,
        /// The operations.
        patch: Patch,
    },
    /// A JSON merge patch of `/status`, rendered at send ([`status_patch`]).
    Status {
        /// The status written.
        wanted: ClusterCidrStatus,
        /// The `resourceVersion` it was decided on (its precondition).
        resource_version: String,
    },
    /// A Warning event `ClusterCIDRInvalid` on the object: why it is not used.
    Invalid {
        /// The reason's message.
        message: String,
    },
}

/// What is known about one ClusterCIDR besides the object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// The allocator's (or, for an object the allocator was not given, `Invalid`).
    pub state: PoolState,
    /// Who holds a block of it ([`crate::reconcile::Allocator::pool_holders`]).
    pub holders: Holders,
    /// The `ClusterCIDRInvalid` event for this generation was already published.
    pub invalid_announced: bool,
    /// Its fence, if it is closing ([`crate::reconcile::Allocator::fence`], after
    /// [`observe_fence`]).
    pub fence: Option<Fence>,
    /// The value a stamp written now would carry (this term's, never used before).
    pub next_stamp: String,
    /// Whether this term may stamp the object ([`Term::may_stamp`]).
    pub may_stamp: bool,
}

/// One allocating term's identity in [`STAMP_ANNOTATION`]: an epoch and a name, stamped as
/// `<epoch>/<name>.<sequence>`. The name is unique per term (a process that leads again starts a
/// new term with a fresh allocator). A writer never stamps over a stamp of a newer epoch
/// ([`Term::may_stamp`]): with epochs that grow with every Lease acquisition, a deposed leader
/// cannot take a ClusterCIDR back from its successor, whatever it still believes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Term {
    epoch: u64,
    name: String,
}

impl Term {
    /// The term `name` of `epoch`.
    pub fn new(epoch: u64, name: &str) -> Term {
        Term {
            epoch,
            name: name.to_owned(),
        }
    }

    /// The term's name (unique to one allocating term).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A term name for a new allocating term, epoch 0 (no order between terms): `instance` (the
    /// replica's identity, if any) and 64 random bits (the standard library's per-process random
    /// hash keys and the clock), so two terms — of two replicas, or one replica leading twice —
    /// never share a name.
    pub fn fresh(instance: Option<&str>) -> Term {
        use std::hash::{BuildHasher as _, Hasher as _};
        let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        hasher.write_u128(since_epoch.as_nanos());
        let random = hasher.finish();
        Term::new(
            0,
            &format!("{}-{random:016x}", instance.unwrap_or("nodeipam")),
        )
    }

    fn prefix(&self) -> String {
        format!("{}/{}.", self.epoch, self.name)
    }

    /// The stamp value number `sequence` of this term.
    pub fn stamp(&self, sequence: u64) -> String {
        format!("{}{sequence}", self.prefix())
    }

    /// Whether `object` carries a stamp of this term.
    pub fn stamped(&self, object: &ClusterCidrObject) -> bool {
        stamp_of(object).is_some_and(|s| s.starts_with(&self.prefix()))
    }

    /// Whether this term may stamp `object`: it has no stamp, or one whose epoch is not newer
    /// than ours (a stamp not in our format counts as epoch 0).
    pub fn may_stamp(&self, object: &ClusterCidrObject) -> bool {
        stamp_of(object)
            .and_then(|s| s.split_once('/'))
            .and_then(|(epoch, _)| epoch.parse::<u64>().ok())
            .is_none_or(|epoch| epoch <= self.epoch)
    }
}

fn stamp_of(object: &ClusterCidrObject) -> Option<&str> {
    object
        .metadata
        .annotations
        .as_ref()?
        .get(STAMP_ANNOTATION)
        .map(String::as_str)
}

/// The fence of a closing ClusterCIDR after observing it as `object` (the watch's view, or a
/// write's answer): our finalizer off it — a removal committed, nothing left to protect —
/// or this term's stamp on it with no removal of ours pending: [`Fence::Fenced`]; a removal of
/// ours testing another `resourceVersion`: it can never commit (a `resourceVersion` once
/// replaced never comes back), so fenced if the stamp is still ours; someone else's stamp:
/// [`Fence::Unfenced`] (a newer term writes there).
pub fn observe_fence(fence: &Fence, object: &ClusterCidrObject, term: &Term) -> Fence {
    let has_ours = object
        .metadata
        .finalizers
        .iter()
        .flatten()
        .any(|f| f == FINALIZER);
    if !has_ours {
        return Fence::Fenced;
    }
    let ours = term.stamped(object);
    let rv = object
        .metadata
        .resource_version
        .as_deref()
        .unwrap_or_default();
    match fence {
        Fence::Removing { tested_rv, .. } if tested_rv == rv => fence.clone(),
        _ if ours => Fence::Fenced,
        _ => Fence::Unfenced,
    }
}

/// The writes `observed` needs now, given what is `known` about it, at `now`. In order:
/// finalizer or stamp, status, event; empty when nothing needs writing.
pub fn decide(observed: &Observed, known: &Known, now: Timestamp) -> Vec<Write> {
    let meta = &observed.object.metadata;
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let has_ours = finalizers.iter().any(|f| f == FINALIZER);
    let deleting = meta.deletion_timestamp.is_some();
    let mut writes = Vec::new();
    let rv = meta.resource_version.clone().unwrap_or_default();
    match (&known.state, deleting, has_ours, &known.fence) {
        (PoolState::Serving { .. }, false, false, _) => {
            let mut with = finalizers.clone();
            with.push(FINALIZER.to_owned());
            writes.push(Write::Object {
                change: ObjectChange::AddFinalizer,
                patch: finalizers_patch(&rv, &with),
            });
        }
        (_, _, true, Some(Fence::Unfenced)) if known.may_stamp => {
            writes.push(stamp(&rv, observed, known));
        }
        (_, _, true, Some(Fence::Fenced | Fence::Removing { .. })) => {
            if known.holders.none() {
                writes.push(remove_ours(&rv, &finalizers));
            } else if matches!(known.fence, Some(Fence::Removing { .. })) {
                // Our removal may still land, and it is no longer wanted: make it fail.
                writes.push(stamp(&rv, observed, known));
            }
        }
        _ => {}
    }
    // An object about to go needs no status.
    let going = deleting
        && writes.iter().any(|w| {
            matches!(
                w,
                Write::Object {
                    change: ObjectChange::RemoveFinalizer,
                    ..
                }
            )
        })
        && finalizers.len() == 1;
    if !going {
        let generation = meta.generation.unwrap_or(0);
        let mut state = known.state.clone();
        if let PoolState::Deleting { holders, .. } = &mut state {
            *holders = known.holders.records;
        }
        let wanted = status::status(&state, observed.status.as_ref(), generation, now);
        if status::needs_write(observed.status.as_ref(), &wanted) {
            writes.push(Write::Status {
                wanted,
                resource_version: rv.clone(),
            });
        }
    }
    if let PoolState::Invalid { message } = &known.state
        && !known.invalid_announced
        && !deleting
    {
        writes.push(Write::Invalid {
            message: message.clone(),
        });
    }
    writes
}

/// The `/status` merge patch of `wanted` with `resource_version` as its precondition (a
/// `metadata.resourceVersion` in a patch is checked at commit: 409 when the object changed).
pub fn status_patch(wanted: &ClusterCidrStatus, resource_version: &str) -> Value {
    let mut patch = status::status_patch(wanted);
    patch["metadata"] = json!({ "resourceVersion": resource_version });
    patch
}

fn remove_ours(rv: &str, finalizers: &[String]) -> Write {
    let without: Vec<String> = finalizers
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    Write::Object {
        change: ObjectChange::RemoveFinalizer,
        patch: finalizers_patch(rv, &without),
    }
}

fn pointer(tokens: &[&str]) -> PointerBuf {
    PointerBuf::from_tokens(tokens.iter().copied())
}

fn test_rv(rv: &str) -> PatchOperation {
    PatchOperation::Test(TestOperation {
        path: pointer(&["metadata", "resourceVersion"]),
        value: Value::String(rv.to_owned()),
    })
}

/// `test` the resourceVersion, then set `metadata.finalizers` to `finalizers` (an `add` of an
/// object member replaces it, RFC 6902 §4.1).
fn finalizers_patch(rv: &str, finalizers: &[String]) -> Patch {
    Patch(vec![
        test_rv(rv),
        PatchOperation::Add(AddOperation {
            path: pointer(&["metadata", "finalizers"]),
            value: json!(finalizers),
        }),
    ])
}

/// `test` the resourceVersion, then set [`STAMP_ANNOTATION`] to `known.next_stamp` (the whole
/// annotations map when the object has none: an `add` needs its parent).
fn stamp(rv: &str, observed: &Observed, known: &Known) -> Write {
    let add = if observed.object.metadata.annotations.is_some() {
        AddOperation {
            path: pointer(&["metadata", "annotations", STAMP_ANNOTATION]),
            value: Value::String(known.next_stamp.clone()),
        }
    } else {
        AddOperation {
            path: pointer(&["metadata", "annotations"]),
            value: json!({ STAMP_ANNOTATION: known.next_stamp }),
        }
    };
    Write::Object {
        change: ObjectChange::Stamp,
        patch: Patch(vec![test_rv(rv), PatchOperation::Add(add)]),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
    use nodeipam_core::Family;

    use super::*;
    use crate::cluster_cidr::status::FamilyUsage;

    fn now() -> Timestamp {
        Timestamp::from_second(1_796_000_000).unwrap()
    }

    fn term() -> Term {
        Term::new(1, "t1")
    }

    fn observed(finalizers: &[&str], deleting: bool) -> Observed {
        Observed {
            object: ClusterCidrObject {
                metadata: ObjectMeta {
                    name: Some("pool-a".to_owned()),
                    resource_version: Some("42".to_owned()),
                    generation: Some(1),
                    finalizers: (!finalizers.is_empty())
                        .then(|| finalizers.iter().map(|f| (*f).to_owned()).collect()),
                    deletion_timestamp: deleting.then(|| Time(now())),
                    ..ObjectMeta::default()
                },
                ..ClusterCidrObject::default()
            },
            status: None,
        }
    }

    fn stamped(mut o: Observed, stamp: &str) -> Observed {
        o.object.metadata.annotations =
            Some([(STAMP_ANNOTATION.to_owned(), stamp.to_owned())].into());
        o
    }

    fn usage() -> Vec<(Family, FamilyUsage)> {
        vec![(
            Family::V4,
            FamilyUsage {
                capacity: 4,
                used: 1,
                free: 3,
            },
        )]
    }

    fn known(state: PoolState) -> Known {
        Known {
            state,
            holders: Holders::default(),
            invalid_announced: false,
            fence: None,
            next_stamp: "1/t1.7".to_owned(),
            may_stamp: true,
        }
    }

    fn closing(state: PoolState, fence: Fence, records: usize) -> Known {
        Known {
            fence: Some(fence),
            holders: Holders {
                records,
                ..Holders::default()
            },
            ..known(state)
        }
    }

    fn deleting(holders: usize) -> PoolState {
        PoolState::Deleting {
            usage: usage(),
            holders,
        }
    }

    /// The object writes only, as `(change, patch as JSON)`.
    fn object_writes(writes: &[Write]) -> Vec<(ObjectChange, Value)> {
        writes
            .iter()
            .filter_map(|w| match w {
                Write::Object { change, patch } => Some((*change, json!(patch))),
                _ => None,
            })
            .collect()
    }

    /// Stored the status `decide` wanted: the next round writes nothing more.
    fn with_status(mut o: Observed, writes: &[Write]) -> Observed {
        for w in writes {
            if let Write::Status { wanted, .. } = w {
                o.status = Some(wanted.clone());
            }
        }
        o
    }

    fn removal() -> (ObjectChange, Value) {
        (
            ObjectChange::RemoveFinalizer,
            json!([
                {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                {"op": "add", "path": "/metadata/finalizers", "value": []},
            ]),
        )
    }

    #[test]
    fn a_serving_cluster_cidr_gets_the_finalizer_beside_others_and_its_status_once() {
        let o = observed(&["example.com/keep"], false);
        let serving = known(PoolState::Serving { usage: usage() });
        let writes = decide(&o, &serving, now());
        assert_eq!(
            object_writes(&writes),
            [(
                ObjectChange::AddFinalizer,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/keep", FINALIZER]},
                ])
            )]
        );
        assert!(
            matches!(writes.last(), Some(Write::Status { resource_version, .. }) if resource_version == "42")
        );
        assert_eq!(writes.len(), 2, "nothing else: {writes:?}");
        // With the finalizer and the status stored: nothing to write.
        let done = with_status(observed(&["example.com/keep", FINALIZER], false), &writes);
        assert_eq!(decide(&done, &serving, now()), []);
    }

    #[test]
    fn an_unfenced_closing_cluster_cidr_is_stamped_first_and_loses_nothing() {
        // No Node holds a block, but a removal an earlier term sent may still land: stamp.
        let o = observed(&[FINALIZER], true);
        let writes = decide(&o, &closing(deleting(0), Fence::Unfenced, 0), now());
        assert_eq!(
            object_writes(&writes),
            [(
                ObjectChange::Stamp,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/annotations", "value": {STAMP_ANNOTATION: "1/t1.7"}},
                ])
            )]
        );
        // An object with annotations gets only the key added (escaped as RFC 6901 says).
        let annotated = stamped(o, "0/t0.3");
        let writes = decide(&annotated, &closing(deleting(0), Fence::Unfenced, 0), now());
        assert_eq!(
            object_writes(&writes),
            [(
                ObjectChange::Stamp,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/annotations/nodeipam.io~1writer-stamp", "value": "1/t1.7"},
                ])
            )]
        );
    }

    #[test]
    fn the_finalizer_stays_while_a_node_holds_a_block_or_a_write_is_in_doubt() {
        let o = stamped(observed(&[FINALIZER], true), "1/t1.1");
        for holders in [1, 7] {
            let writes = decide(
                &o,
                &closing(deleting(holders), Fence::Fenced, holders),
                now(),
            );
            assert_eq!(object_writes(&writes), [], "{holders} holders");
        }
        let in_doubt = Known {
            holders: Holders {
                in_doubt: 1,
                ..Holders::default()
            },
            ..closing(deleting(0), Fence::Fenced, 0)
        };
        assert_eq!(object_writes(&decide(&o, &in_doubt, now())), []);
        // The last holder gone, nothing in doubt, fenced: removed, guarded by the
        // resourceVersion, and no status written to an object about to go.
        let writes = decide(&o, &closing(deleting(0), Fence::Fenced, 0), now());
        assert_eq!(object_writes(&writes), [removal()]);
        assert_eq!(writes.len(), 1, "{writes:?}");
    }

    #[test]
    fn a_removal_in_doubt_is_sent_again_while_wanted_and_fenced_by_a_stamp_when_not() {
        let o = stamped(observed(&[FINALIZER], true), "1/t1.1");
        let removing = Fence::Removing {
            tested_rv: "42".to_owned(),
        };
        assert_eq!(
            object_writes(&decide(
                &o,
                &closing(deleting(0), removing.clone(), 0),
                now()
            )),
            [removal()]
        );
        // A Node now holds a block (a podCIDR seen): the removal must fail at the server.
        let writes = decide(&o, &closing(deleting(1), removing, 1), now());
        assert_eq!(
            object_writes(&writes),
            [(
                ObjectChange::Stamp,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/annotations/nodeipam.io~1writer-stamp", "value": "1/t1.7"},
                ])
            )]
        );
    }

    #[test]
    fn the_fence_follows_what_the_object_shows() {
        let term = term();
        let mine = stamped(observed(&[FINALIZER], true), "1/t1.1").object;
        let theirs = stamped(observed(&[FINALIZER], true), "1/t0.9").object;
        let t10 = stamped(observed(&[FINALIZER], true), "1/t10.1").object;
        assert_eq!(observe_fence(&Fence::Unfenced, &mine, &term), Fence::Fenced);
        assert_eq!(
            observe_fence(&Fence::Unfenced, &theirs, &term),
            Fence::Unfenced
        );
        // A prefix of another term's name is not ours.
        assert_eq!(
            observe_fence(&Fence::Unfenced, &t10, &term),
            Fence::Unfenced
        );
        assert_eq!(
            observe_fence(&Fence::Fenced, &theirs, &term),
            Fence::Unfenced
        );
        // A removal of ours stays in doubt while the object is at the version it tests…
        let removing = Fence::Removing {
            tested_rv: "42".to_owned(),
        };
        assert_eq!(observe_fence(&removing, &mine, &term), removing);
        // … and can never apply once it is at another one.
        let mut moved = mine.clone();
        moved.metadata.resource_version = Some("43".to_owned());
        assert_eq!(observe_fence(&removing, &moved, &term), Fence::Fenced);
        let mut restamped = theirs;
        restamped.metadata.resource_version = Some("43".to_owned());
        assert_eq!(observe_fence(&removing, &restamped, &term), Fence::Unfenced);
        // Our finalizer off: nothing left to protect.
        let gone = observed(&["example.com/keep"], true).object;
        assert_eq!(observe_fence(&removing, &gone, &term), Fence::Fenced);
    }

    #[test]
    fn a_term_never_stamps_over_a_newer_epoch() {
        let term = term();
        let newer = stamped(observed(&[FINALIZER], true), "2/t2.1");
        let older = stamped(observed(&[FINALIZER], true), "0/t0.5");
        let foreign = stamped(observed(&[FINALIZER], true), "kubectl was here");
        assert!(!term.may_stamp(&newer.object));
        assert!(term.may_stamp(&older.object));
        assert!(term.may_stamp(&foreign.object));
        assert!(term.may_stamp(&observed(&[FINALIZER], true).object));
        assert_eq!(term.stamp(3), "1/t1.3");
        // Deposed (a newer epoch's stamp on it): no stamp, no removal; nothing is allocated
        // beside it while it stays unfenced.
        let deposed = Known {
            may_stamp: false,
            ..closing(deleting(0), Fence::Unfenced, 0)
        };
        assert_eq!(object_writes(&decide(&newer, &deposed, now())), []);
    }

    #[test]
    fn a_status_carries_the_version_it_was_decided_on() {
        let o = observed(&[FINALIZER], false);
        let serving = known(PoolState::Serving { usage: usage() });
        let writes = decide(&o, &serving, now());
        let Some(Write::Status {
            wanted,
            resource_version,
        }) = writes.last()
        else {
            panic!("{writes:?}");
        };
        let patch = status_patch(wanted, resource_version);
        assert_eq!(patch["metadata"], json!({"resourceVersion": "42"}));
        assert_eq!(patch["status"]["ipv6"], Value::Null);
    }

    #[test]
    fn a_deleted_cluster_cidr_without_our_finalizer_gets_none_back() {
        let o = observed(&["example.com/keep"], true);
        let writes = decide(&o, &known(deleting(0)), now());
        assert_eq!(object_writes(&writes), []);
        // Still there (another finalizer holds it): its status says it is being deleted.
        assert!(matches!(writes.as_slice(), [Write::Status { .. }]));
    }

    #[test]
    fn an_invalid_cluster_cidr_gets_no_finalizer_its_status_and_one_event() {
        let o = observed(&[], false);
        let invalid = known(PoolState::Invalid {
            message: "at least one of spec.ipv4 and spec.ipv6 must be set".to_owned(),
        });
        let writes = decide(&o, &invalid, now());
        assert_eq!(object_writes(&writes), []);
        assert!(matches!(writes.first(), Some(Write::Status { .. })));
        assert_eq!(
            writes.last(),
            Some(&Write::Invalid {
                message: "at least one of spec.ipv4 and spec.ipv6 must be set".to_owned()
            })
        );
        let announced = Known {
            invalid_announced: true,
            ..invalid.clone()
        };
        assert_eq!(decide(&with_status(o, &writes), &announced, now()), []);
        // One that has our finalizer (closing, fenced) keeps it while Nodes hold blocks of the
        // ranges an earlier generation was hosted with (its spec edited through a CRD without our
        // rules)…
        let held = stamped(observed(&[FINALIZER], false), "1/t1.1");
        let retired = Known {
            fence: Some(Fence::Fenced),
            holders: Holders {
                records: 2,
                retired: 2,
                in_doubt: 0,
            },
            ..announced.clone()
        };
        assert_eq!(object_writes(&decide(&held, &retired, now())), []);
        // … and loses it once none does: it serves no Node.
        let free = Known {
            fence: Some(Fence::Fenced),
            ..announced
        };
        assert_eq!(object_writes(&decide(&held, &free, now())), [removal()]);
    }
}
