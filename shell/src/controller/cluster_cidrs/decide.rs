//! What the controller writes to one ClusterCIDR (issue 18 §2), as a pure function over plain
//! data: the finalizer added or removed, the `/status` merge patch, the `ClusterCIDRInvalid`
//! event. The caller ([`super`]) owns the client, the write gate and the limiter, and sends what
//! [`decide`] returns (linkerd's policy-controller status index does the same: the index decides,
//! only the controller holds the client).
//!
//! The rules:
//! - a valid ClusterCIDR not being deleted gets the finalizer [`FINALIZER`], so that its deletion
//!   waits for the Nodes holding its blocks;
//! - once `deletionTimestamp` is set, the finalizer is removed only when the allocator reports no
//!   Node holding a block of it (`PoolState::Deleting { holders: 0 }`) **and** no write whose
//!   outcome is unknown (maybe applied) puts a block inside its ranges; an invalid ClusterCIDR
//!   serves no Node, so its finalizer (if an earlier, valid generation got one — the spec is
//!   immutable, so only with a CRD without our rules) is removed once no Node holds a block of
//!   the ranges an earlier generation was hosted with ([`Known::retired_holders`]);
//! - the status is written only when it would change something ([`status::needs_write`]);
//! - an invalid ClusterCIDR gets one Warning event per generation (the caller remembers which).
//!
//! Every finalizer write is a JSON patch whose first operation tests `metadata.resourceVersion`:
//! the API server applies it only to the object this decision was made on (422 otherwise, and
//! the next round decides again on the newer object), so a finalizer another client added or
//! removed meanwhile is never overwritten.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use crate::cluster_cidr::ClusterCidrObject;
use crate::cluster_cidr::status::{self, ClusterCidrStatus, PoolState};

pub use crate::cluster_cidr::FINALIZER;

/// One ClusterCIDR as the watch shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observed {
    /// Its metadata and spec.
    pub object: ClusterCidrObject,
    /// Its stored `status` (`None` if it has none, or it does not parse as ours).
    pub status: Option<ClusterCidrStatus>,
}

/// One write to a ClusterCIDR.
#[derive(Debug, Clone, PartialEq)]
pub enum Write {
    /// A JSON patch of the object (its `metadata.finalizers`), guarded by a `test` of its
    /// `resourceVersion`.
    Finalizers {
        /// `true`: [`FINALIZER`] added; `false`: removed.
        add: bool,
        /// The JSON patch (RFC 6902) to send.
        patch: Value,
    },
    /// A JSON merge patch of `/status`.
    Status {
        /// The status written.
        wanted: ClusterCidrStatus,
        /// `{"status": …}`.
        patch: Value,
    },
    /// A Warning event `ClusterCIDRInvalid` on the object: why it is not used.
    Invalid {
        /// The reason's message.
        message: String,
    },
}

/// What is known about one ClusterCIDR besides the object: its state and whether a write in
/// doubt may put a block inside its ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Known {
    /// The allocator's (or, for an object the allocator was not given, `Invalid`).
    pub state: PoolState,
    /// Some Node's write whose outcome is unknown holds a block inside the ClusterCIDR's ranges.
    pub write_in_doubt: bool,
    /// The `ClusterCIDRInvalid` event for this generation was already published.
    pub invalid_announced: bool,
    /// Nodes holding a block inside ranges the allocator once hosted under this name and no
    /// longer does (its spec edited in place through a CRD without our rules,
    /// [`crate::reconcile::Allocator::cluster_cidr_retired_holders`]): an invalid object keeps
    /// our finalizer while this is not 0.
    pub retired_holders: usize,
}

/// The writes `observed` needs now, given what is `known` about it, at `now`. In order:
/// finalizer, status, event; empty when nothing needs writing.
pub fn decide(observed: &Observed, known: &Known, now: Timestamp) -> Vec<Write> {
    let meta = &observed.object.metadata;
    let finalizers = meta.finalizers.clone().unwrap_or_default();
    let has_ours = finalizers.iter().any(|f| f == FINALIZER);
    let deleting = meta.deletion_timestamp.is_some();
    let mut writes = Vec::new();
    let rv = meta.resource_version.clone().unwrap_or_default();
    match (&known.state, deleting, has_ours) {
        (PoolState::Serving { .. }, false, false) => {
            let mut with = finalizers.clone();
            with.push(FINALIZER.to_owned());
            writes.push(Write::Finalizers {
                add: true,
                patch: finalizers_patch(&rv, &with),
            });
        }
        (PoolState::Deleting { holders: 0, .. }, true, true) if !known.write_in_doubt => {
            writes.push(remove_ours(&rv, &finalizers));
        }
        (PoolState::Invalid { .. }, _, true) if known.retired_holders == 0 => {
            writes.push(remove_ours(&rv, &finalizers));
        }
        _ => {}
    }
    // An object about to go needs no status.
    let going = deleting
        && writes
            .iter()
            .any(|w| matches!(w, Write::Finalizers { add: false, .. }))
        && finalizers.len() == 1;
    if !going {
        let generation = meta.generation.unwrap_or(0);
        let wanted = status::status(&known.state, observed.status.as_ref(), generation, now);
        if status::needs_write(observed.status.as_ref(), &wanted) {
            writes.push(Write::Status {
                patch: status::status_patch(&wanted),
                wanted,
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

fn remove_ours(rv: &str, finalizers: &[String]) -> Write {
    let without: Vec<String> = finalizers
        .iter()
        .filter(|f| *f != FINALIZER)
        .cloned()
        .collect();
    Write::Finalizers {
        add: false,
        patch: finalizers_patch(rv, &without),
    }
}

/// `test` the resourceVersion, then set `metadata.finalizers` to `finalizers` (an `add` of an
/// object member replaces it, RFC 6902 §4.1).
fn finalizers_patch(rv: &str, finalizers: &[String]) -> Value {
    json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": rv},
        {"op": "add", "path": "/metadata/finalizers", "value": finalizers},
    ])
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
            write_in_doubt: false,
            invalid_announced: false,
            retired_holders: 0,
        }
    }

    fn deleting(holders: usize) -> PoolState {
        PoolState::Deleting {
            usage: usage(),
            holders,
        }
    }

    /// The finalizer writes only, as `(add, patch)`.
    fn finalizer_writes(writes: &[Write]) -> Vec<(bool, Value)> {
        writes
            .iter()
            .filter_map(|w| match w {
                Write::Finalizers { add, patch } => Some((*add, patch.clone())),
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

    #[test]
    fn a_serving_cluster_cidr_gets_the_finalizer_beside_others_and_its_status_once() {
        let o = observed(&["example.com/keep"], false);
        let serving = known(PoolState::Serving { usage: usage() });
        let writes = decide(&o, &serving, now());
        assert_eq!(
            finalizer_writes(&writes),
            [(
                true,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/finalizers", "value": ["example.com/keep", FINALIZER]},
                ])
            )]
        );
        assert!(matches!(writes.last(), Some(Write::Status { .. })));
        assert_eq!(writes.len(), 2, "nothing else: {writes:?}");
        // With the finalizer and the status stored: nothing to write.
        let done = with_status(observed(&["example.com/keep", FINALIZER], false), &writes);
        assert_eq!(decide(&done, &serving, now()), []);
    }

    #[test]
    fn the_finalizer_stays_while_a_node_holds_a_block_or_a_write_is_in_doubt() {
        let o = observed(&[FINALIZER], true);
        for holders in [1, 7] {
            let writes = decide(&o, &known(deleting(holders)), now());
            assert_eq!(finalizer_writes(&writes), [], "{holders} holders");
        }
        let in_doubt = Known {
            write_in_doubt: true,
            ..known(deleting(0))
        };
        assert_eq!(finalizer_writes(&decide(&o, &in_doubt, now())), []);
        // The last holder gone, nothing in doubt: removed, guarded by the resourceVersion, and no
        // status written to an object about to go.
        assert_eq!(
            decide(&o, &known(deleting(0)), now()),
            [Write::Finalizers {
                add: false,
                patch: json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/finalizers", "value": []},
                ])
            }]
        );
    }

    #[test]
    fn a_deleted_cluster_cidr_without_our_finalizer_gets_none_back() {
        let o = observed(&["example.com/keep"], true);
        let writes = decide(&o, &known(deleting(0)), now());
        assert_eq!(finalizer_writes(&writes), []);
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
        assert_eq!(finalizer_writes(&writes), []);
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
        // One that has our finalizer keeps it while Nodes hold blocks of the ranges an earlier
        // generation was hosted with (its spec edited through a CRD without our rules)…
        let held = observed(&[FINALIZER], false);
        let retired = Known {
            retired_holders: 2,
            ..announced.clone()
        };
        assert_eq!(finalizer_writes(&decide(&held, &retired, now())), []);
        // … and loses it once none does: it serves no Node.
        assert_eq!(
            finalizer_writes(&decide(&held, &announced, now())),
            [(
                false,
                json!([
                    {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
                    {"op": "add", "path": "/metadata/finalizers", "value": []},
                ])
            )]
        );
    }
}
