//! A ClusterCIDR's `status` as the controller writes it (a JSON merge patch of `/status`): the
//! conditions `Ready` and `Invalid`, and per family the pool's blocks of its own size — capacity,
//! used (not entirely free) and free (entirely free), the CRD's `status.ipv4` / `status.ipv6`.
//!
//! Conditions follow the API conventions (`metav1.Condition`): `lastTransitionTime` changes only
//! when a condition's `status` changes, `observedGeneration` is the object's generation the
//! controller acted on. [`status`] is pure: the caller supplies the time and the previous status,
//! and sends nothing when [`needs_write`] says the stored status already says the same.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use nodeipam_core::Family;
use serde::{Deserialize, Serialize};

/// The blocks of one family of a pool, in blocks of the pool's own size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FamilyUsage {
    /// Blocks in the range.
    pub capacity: u64,
    /// Blocks not entirely free (held by a Node, a service CIDR, or — where pools overlap — in
    /// part by another pool's block).
    pub used: u64,
    /// Blocks entirely free: `capacity − used`.
    pub free: u64,
}

/// What the controller makes of a ClusterCIDR now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PoolState {
    /// Valid, not being deleted: it serves Nodes. `usage` per family it has.
    Serving {
        /// Usage per family (flag order of families is not implied: IPv4 first if both).
        usage: Vec<(Family, FamilyUsage)>,
    },
    /// Being deleted: serves no new Node; `holders` Nodes still hold blocks from it (the
    /// finalizer stays until that is 0).
    Deleting {
        /// Usage per family.
        usage: Vec<(Family, FamilyUsage)>,
        /// Nodes holding a block of it.
        holders: usize,
    },
    /// Not usable: the message of its [`super::ClusterCidrError`].
    Invalid {
        /// Why.
        message: String,
    },
}

/// The `status` a ClusterCIDR should have, as stored by the API server.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterCidrStatus {
    /// `Ready` and `Invalid`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
    /// IPv4 usage, when the pool has an IPv4 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<FamilyUsage>,
    /// IPv6 usage, when the pool has an IPv6 range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<FamilyUsage>,
}

/// `(type, status, reason, message)` of the two conditions for `state`.
fn conditions_of(state: &PoolState) -> [(&'static str, bool, &'static str, String); 2] {
    let exhausted = |usage: &[(Family, FamilyUsage)]| {
        usage
            .iter()
            .filter(|(_, u)| u.free == 0)
            .map(|(family, _)| family.to_string())
            .collect::<Vec<_>>()
    };
    let valid = ("Invalid", false, "Valid", "the spec is usable".to_owned());
    match state {
        PoolState::Invalid { message } => [
            (
                "Ready",
                false,
                "Invalid",
                "not used for allocation: see the Invalid condition".to_owned(),
            ),
            ("Invalid", true, "InvalidSpec", message.clone()),
        ],
        PoolState::Deleting { holders, .. } => [
            (
                "Ready",
                false,
                "Deleting",
                format!(
                    "being deleted: serves no new Node; {holders} Node(s) still hold blocks from it (the finalizer stays until none does)"
                ),
            ),
            valid,
        ],
        PoolState::Serving { usage } => {
            let full = exhausted(usage);
            let ready = if full.is_empty() {
                ("Ready", true, "Serving", "serving Nodes".to_owned())
            } else {
                (
                    "Ready",
                    false,
                    "Exhausted",
                    format!(
                        "no free block in {}: Nodes it serves are given the next pool in order",
                        full.join(" and ")
                    ),
                )
            };
            [ready, valid]
        }
    }
}

/// The status for `state`, given the stored one (`previous`, `None` if it has none), the object's
/// `generation` and the time now. A condition whose `status` is unchanged keeps its
/// `lastTransitionTime`; a new one gets `now` cut to whole seconds, as the API stores a
/// `metav1.Time` (so a status read back compares equal).
pub fn status(
    state: &PoolState,
    previous: Option<&ClusterCidrStatus>,
    generation: i64,
    now: Timestamp,
) -> ClusterCidrStatus {
    let now = Timestamp::from_second(now.as_second()).unwrap_or(now);
    let conditions = conditions_of(state)
        .into_iter()
        .map(|(type_, holds, reason, message)| {
            let status = if holds { "True" } else { "False" };
            let since = previous
                .and_then(|p| p.conditions.iter().find(|c| c.type_ == type_))
                .filter(|c| c.status == status)
                .map_or(Time(now), |c| c.last_transition_time.clone());
            Condition {
                type_: type_.to_owned(),
                status: status.to_owned(),
                reason: reason.to_owned(),
                message,
                observed_generation: Some(generation),
                last_transition_time: since,
            }
        })
        .collect();
    let usage = match state {
        PoolState::Serving { usage } | PoolState::Deleting { usage, .. } => usage.as_slice(),
        PoolState::Invalid { .. } => &[],
    };
    let of = |family| usage.iter().find(|(f, _)| *f == family).map(|(_, u)| *u);
    ClusterCidrStatus {
        conditions,
        ipv4: of(Family::V4),
        ipv6: of(Family::V6),
    }
}

/// Whether `wanted` differs from the stored status (a write would change something).
pub fn needs_write(stored: Option<&ClusterCidrStatus>, wanted: &ClusterCidrStatus) -> bool {
    stored != Some(wanted)
}

/// The JSON merge patch of `/status` that stores `wanted` (the whole status: a merge patch
/// replaces the conditions list as a whole). A family `wanted` has no usage for is `null`, which
/// removes it (RFC 7386): left out, an Invalid object (or one whose spec was edited to fewer
/// families) would keep the usage of what it no longer is, and since that never equals
/// `wanted`, [`needs_write`] would ask for the same write on every round.
pub fn status_patch(wanted: &ClusterCidrStatus) -> serde_json::Value {
    let mut status = serde_json::json!(wanted);
    if let Some(fields) = status.as_object_mut() {
        for family in ["ipv4", "ipv6"] {
            fields.entry(family).or_insert(serde_json::Value::Null);
        }
    }
    serde_json::json!({ "status": status })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn usage(capacity: u64, used: u64) -> FamilyUsage {
        FamilyUsage {
            capacity,
            used,
            free: capacity - used,
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_796_000_000 + seconds).unwrap()
    }

    fn condition<'a>(status: &'a ClusterCidrStatus, type_: &str) -> &'a Condition {
        status.conditions.iter().find(|c| c.type_ == type_).unwrap()
    }

    #[test]
    fn transitions_keep_their_time_until_the_status_changes() {
        let serving = PoolState::Serving {
            usage: vec![(Family::V4, usage(256, 3)), (Family::V6, usage(1 << 16, 3))],
        };
        let first = status(&serving, None, 1, at(0));
        assert_eq!(condition(&first, "Ready").status, "True");
        assert_eq!(condition(&first, "Invalid").status, "False");
        assert_eq!(first.ipv4, Some(usage(256, 3)));
        assert!(needs_write(None, &first));

        // The same state later: nothing to write.
        let again = status(&serving, Some(&first), 1, at(60));
        assert_eq!(again, first);
        assert!(!needs_write(Some(&first), &again));

        // More used: the counts change, the conditions' times do not.
        let busier = PoolState::Serving {
            usage: vec![
                (Family::V4, usage(256, 200)),
                (Family::V6, usage(1 << 16, 200)),
            ],
        };
        let later = status(&busier, Some(&first), 1, at(120));
        assert!(needs_write(Some(&first), &later));
        assert_eq!(condition(&later, "Ready").last_transition_time, Time(at(0)));

        // IPv4 full: Ready turns False now, naming the family.
        let full = PoolState::Serving {
            usage: vec![
                (Family::V4, usage(256, 256)),
                (Family::V6, usage(1 << 16, 256)),
            ],
        };
        let exhausted = status(&full, Some(&later), 1, at(180));
        let ready = condition(&exhausted, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Exhausted")
        );
        assert!(ready.message.contains("IPv4") && !ready.message.contains("IPv6"));
        assert_eq!(ready.last_transition_time, Time(at(180)));
    }

    #[test]
    fn a_status_read_back_from_the_server_needs_no_write() {
        let serving = PoolState::Serving {
            usage: vec![(Family::V4, usage(256, 3))],
        };
        let now = Timestamp::from_second(1_796_000_000).unwrap()
            + k8s_openapi::jiff::SignedDuration::from_millis(789);
        let wanted = status(&serving, None, 1, now);
        let stored: ClusterCidrStatus =
            serde_json::from_value(status_patch(&wanted)["status"].clone()).unwrap();
        assert!(!needs_write(Some(&stored), &wanted), "{stored:?}");
        assert!(!needs_write(
            Some(&stored),
            &status(&serving, Some(&stored), 1, now)
        ));
    }

    #[test]
    fn deleting_and_invalid_pools_say_why_they_serve_no_node() {
        let deleting = status(
            &PoolState::Deleting {
                usage: vec![(Family::V4, usage(16, 2))],
                holders: 2,
            },
            None,
            2,
            at(0),
        );
        let ready = condition(&deleting, "Ready");
        assert_eq!(
            (ready.status.as_str(), ready.reason.as_str()),
            ("False", "Deleting")
        );
        assert!(ready.message.contains("2 Node(s)"));
        assert_eq!(ready.observed_generation, Some(2));

        let invalid = status(
            &PoolState::Invalid {
                message: "at least one of spec.ipv4 and spec.ipv6 must be set".into(),
            },
            None,
            1,
            at(0),
        );
        assert_eq!(condition(&invalid, "Invalid").status, "True");
        assert_eq!(condition(&invalid, "Ready").status, "False");
        assert_eq!((invalid.ipv4, invalid.ipv6), (None, None));
        let patch = status_patch(&invalid);
        assert_eq!(patch["status"]["conditions"][1]["reason"], "InvalidSpec");
        // The usage an earlier, valid generation stored is removed, not left in place.
        assert_eq!(
            (&patch["status"]["ipv4"], &patch["status"]["ipv6"]),
            (&serde_json::Value::Null, &serde_json::Value::Null)
        );
        assert!(
            patch["status"]
                .as_object()
                .is_some_and(|s| s.contains_key("ipv4"))
        );
    }
}
