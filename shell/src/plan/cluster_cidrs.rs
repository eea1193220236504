//! `plan --cluster-cidrs FILE`: ClusterCIDR objects as the allocator would host them, and one
//! row per ClusterCIDR after the plan.
//!
//! FILE is JSON: the output of `kubectl get clustercidrs -o json` (a `List`, or a
//! `ClusterCIDRList`, with `items`) or one `ClusterCIDR` object. (YAML is not read: the NodeList
//! input is JSON too, and neither needs a YAML parser.) Each object is checked as the controller
//! checks it ([`ClusterCidrPool::from_object`]); one that fails is shown as `invalid` with the
//! reason and left out of the plan, as the controller leaves it out.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

use crate::Error;
use crate::cluster_cidr::status::{FamilyUsage, PoolState};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::cluster_cidr::{ClusterCidrObject, ClusterCidrPool, ReadObject, read_object};
use crate::reconcile::{Allocator, ClusterCidrSync};

/// The ClusterCIDRs read from a `--cluster-cidrs` file: the usable ones, and the others with why.
#[derive(Debug, Clone, Default)]
pub struct ClusterCidrInput {
    /// Objects that passed [`ClusterCidrPool::from_object`], file order.
    pub pools: Vec<ClusterCidrPool>,
    /// Objects that did not: name and the reason (their `Invalid` condition's message).
    pub invalid: Vec<(String, String)>,
}

impl ClusterCidrInput {
    /// Every label key the pools' selectors read (sorted, no duplicates).
    pub fn label_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .pools
            .iter()
            .flat_map(ClusterCidrPool::label_keys)
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }
}

/// A List or one object.
#[derive(Deserialize)]
struct Document {
    #[serde(default)]
    kind: Option<String>,
    #[serde(default)]
    items: Option<Vec<serde_json::Value>>,
    #[serde(flatten)]
    object: serde_json::Value,
}

/// Reads a `--cluster-cidrs` file (see the module docs).
///
/// # Errors
/// [`Error::Read`] if it cannot be read; [`Error::InvalidClusterCidrs`] if it is not JSON, or
/// neither a List with `items` nor a `ClusterCIDR`. An object that is malformed (a spec field of
/// the wrong type, metadata that is not an object's) is listed invalid alone, as the controller
/// marks it ([`crate::cluster_cidr::read_object`], the one reader).
pub fn read_cluster_cidrs(reader: impl Read, path: &str) -> Result<ClusterCidrInput, Error> {
    let document: Document = serde_json::from_reader(io::BufReader::new(reader)).map_err(|e| {
        if e.is_io() {
            Error::Read {
                path: path.to_owned(),
                source: io::Error::other(e.to_string()),
            }
        } else {
            Error::InvalidClusterCidrs(format!("{path}: {e}"))
        }
    })?;
    let kind = document.kind.unwrap_or_default();
    let objects = match (kind.as_str(), document.items) {
        ("List" | "ClusterCIDRList", Some(items)) => items,
        ("ClusterCIDR", None) => vec![document.object],
        _ => {
            return Err(Error::InvalidClusterCidrs(format!(
                "{path}: expected a List of ClusterCIDRs (kubectl get clustercidrs -o json) or one ClusterCIDR, found kind {kind:?}"
            )));
        }
    };
    let mut input = ClusterCidrInput::default();
    for item in &objects {
        let metadata = item.get("metadata").cloned().unwrap_or_default();
        let read = match serde_json::from_value::<ObjectMeta>(metadata) {
            Ok(metadata) => read_object(metadata, item.get("spec")),
            Err(e) => ReadObject {
                object: ClusterCidrObject::default(),
                pool: Err(format!("metadata: {e}")),
            },
        };
        let name = read.object.metadata.name.clone().unwrap_or_default();
        match read.pool {
            Ok(pool) => input.pools.push(pool),
            Err(message) => input.invalid.push((name, message)),
        }
    }
    Ok(input)
}

/// One family's blocks of a ClusterCIDR after the plan, in blocks of its own size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanRange {
    /// The range (canonical CIDR text).
    pub cidr: String,
    /// Blocks in the range.
    pub capacity: u64,
    /// Blocks not entirely free.
    pub used: u64,
    /// Blocks entirely free.
    pub free: u64,
}

/// One ClusterCIDR after the plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PlanClusterCidr {
    /// `metadata.name`.
    pub name: String,
    /// `spec.perNodeHostBits` (`None` for an invalid object).
    #[serde(rename = "perNodeHostBits")]
    pub per_node_host_bits: Option<u8>,
    /// [`ClusterCidrPool::selector_summary`] (`None` for an invalid object).
    pub selector: Option<String>,
    /// `serving`, `deleting` (serves no new Node), `invalid` (the object fails the CRD's rules)
    /// or `refused` (valid, but the allocator cannot host it).
    pub state: &'static str,
    /// Why, for `invalid` and `refused`.
    pub reason: Option<String>,
    /// Per family it has, IPv4 first.
    pub ranges: Vec<PlanRange>,
}

/// The ClusterCIDR rows after a plan: one per object, hosted ones first (name order), then the
/// refused and the invalid ones.
pub(super) fn rows(
    allocator: &Allocator,
    input: &ClusterCidrInput,
    sync: &ClusterCidrSync,
) -> Vec<PlanClusterCidr> {
    let mut rows: Vec<PlanClusterCidr> = allocator
        .cluster_cidr_pools()
        .into_iter()
        .map(|pool| {
            let (state, usage) = match allocator.cluster_cidr_state(&pool.name) {
                Some(PoolState::Serving { usage }) => ("serving", usage),
                Some(PoolState::Deleting { usage, .. }) => ("deleting", usage),
                _ => ("refused", Vec::new()),
            };
            let ranges = [pool.ipv4, pool.ipv6]
                .into_iter()
                .flatten()
                .map(|range| {
                    let u = usage
                        .iter()
                        .find(|(family, _)| *family == range.family())
                        .map_or(FamilyUsage::default(), |(_, u)| *u);
                    PlanRange {
                        cidr: range.to_string(),
                        capacity: u.capacity,
                        used: u.used,
                        free: u.free,
                    }
                })
                .collect();
            PlanClusterCidr {
                name: pool.name.clone(),
                per_node_host_bits: Some(pool.per_node_host_bits),
                selector: Some(pool.selector_summary()),
                state,
                reason: None,
                ranges,
            }
        })
        .collect();
    let unusable = |state, (name, reason): &(String, String)| PlanClusterCidr {
        name: name.clone(),
        per_node_host_bits: None,
        selector: None,
        state,
        reason: Some(reason.clone()),
        ranges: Vec::new(),
    };
    rows.extend(sync.refused.iter().map(|r| unusable("refused", r)));
    rows.extend(input.invalid.iter().map(|r| unusable("invalid", r)));
    rows
}

/// The ClusterCIDR table: name, state, host bits, selector, then one line per range.
pub(super) fn write_table(out: &mut impl Write, rows: &[PlanClusterCidr]) -> io::Result<()> {
    if rows.is_empty() {
        return Ok(());
    }
    writeln!(out)?;
    writeln!(
        out,
        "{:24}  {:8}  {:9}  {:24}  {:>10}  {:>10}  {:>10}  SELECTOR / REASON",
        "CLUSTERCIDR", "STATE", "HOSTBITS", "RANGE", "CAPACITY", "USED", "FREE"
    )?;
    for row in rows {
        let name = super::escape_controls(&row.name);
        let bits = row
            .per_node_host_bits
            .map_or_else(|| "-".to_owned(), |b| b.to_string());
        let note = row
            .selector
            .as_deref()
            .or(row.reason.as_deref())
            .unwrap_or("-");
        let note = super::escape_controls(note);
        if row.ranges.is_empty() {
            writeln!(
                out,
                "{name:24}  {:8}  {bits:9}  {:24}  {:>10}  {:>10}  {:>10}  {note}",
                row.state, "-", "-", "-", "-"
            )?;
        }
        for (i, range) in row.ranges.iter().enumerate() {
            let (name, note) = if i == 0 {
                (name.as_ref(), note.as_ref())
            } else {
                ("", "")
            };
            writeln!(
                out,
                "{name:24}  {:8}  {bits:9}  {:24}  {:>10}  {:>10}  {:>10}  {note}",
                row.state, range.cidr, range.capacity, range.used, range.free
            )?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(text: &str) -> Result<ClusterCidrInput, Error> {
        read_cluster_cidrs(text.as_bytes(), "test.json")
    }

    /// The committed List, one object alone, and what is refused: another kind, not JSON.
    #[test]
    fn a_list_or_one_object_is_read_and_anything_else_refused() {
        let path = format!(
            "{}/../fixtures/clustercidrs/openshift-gcp-pools.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let input = read(&std::fs::read_to_string(&path).expect("fixture")).expect("a List");
        let names: Vec<&str> = input.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["masters", "zone-b", "retired", "overflow"]);
        assert_eq!(input.invalid.len(), 1);
        assert_eq!(input.invalid[0].0, "too-small-blocks");
        assert_eq!(
            input.label_keys(),
            [
                "node-role.kubernetes.io/master",
                "node-role.kubernetes.io/worker",
                "topology.kubernetes.io/zone"
            ]
        );
        let one = read(
            r#"{"apiVersion":"nodeipam.io/v1alpha1","kind":"ClusterCIDR",
                "metadata":{"name":"one"},"spec":{"perNodeHostBits":8,"ipv6":"fd00:1::/112"}}"#,
        )
        .expect("one object");
        assert_eq!(one.pools.len(), 1);
        assert_eq!(one.pools[0].selector_summary(), "(none: fallback)");
        for bad in [r#"{"kind":"NodeList","items":[]}"#, "ipv4: 10.0.0.0/8"] {
            assert!(
                matches!(read(bad), Err(Error::InvalidClusterCidrs(_))),
                "{bad}: {:?}",
                read(bad)
            );
        }
    }

    /// One reader (issue 32 item 6): a malformed object — a spec field of the wrong type — is
    /// listed invalid alone, with the controller's message, and the others of the file are used
    /// (plan failed the whole file on it before).
    #[test]
    fn a_malformed_object_is_invalid_alone_as_the_controller_marks_it() {
        let input = read(
            r#"{"kind":"List","items":[
                {"metadata":{"name":"bad"},"spec":{"perNodeHostBits":"eight","ipv4":"10.9.0.0/16"}},
                {"metadata":{"name":"good"},"spec":{"perNodeHostBits":8,"ipv4":"10.8.0.0/16"}}]}"#,
        )
        .expect("the file is read");
        let names: Vec<&str> = input.pools.iter().map(|p| p.name.as_str()).collect();
        assert_eq!(names, ["good"]);
        assert_eq!(input.invalid.len(), 1, "{:?}", input.invalid);
        assert_eq!(input.invalid[0].0, "bad");
        let controller = read_object(
            serde_json::from_value(serde_json::json!({"name": "bad"})).expect("metadata"),
            Some(&serde_json::json!({"perNodeHostBits": "eight", "ipv4": "10.9.0.0/16"})),
        );
        assert_eq!(
            controller.pool.err().as_deref(),
            Some(input.invalid[0].1.as_str())
        );
        let one = read(
            r#"{"kind":"ClusterCIDR","metadata":{"name":"x"},"spec":{"perNodeHostBits":"eight"}}"#,
        )
        .expect("one malformed object is read as invalid");
        assert_eq!(one.invalid.len(), 1);
    }
}
