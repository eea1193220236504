//! ClusterCIDR objects (`nodeipam.io/v1alpha1`, `deploy/crds/clustercidrs.yaml`, issue 18): what
//! one says ([`ClusterCidrPool`]), whether a Node is one it serves, and in which order a Node's
//! pools are tried ([`serving_order`]). Pure functions: the controller feeds them the objects its
//! watch sees and the Node's labels.
//!
//! The order is KEP-2593's (kube-controller-manager's `MultiCIDRRangeAllocator`, alpha in
//! 1.25–1.28, `orderedMatchingClusterCIDRs` and its priority queue):
//! 1. the ClusterCIDRs whose node selector matches the Node, the one matching the **most
//!    requirements** first;
//! 2. then the one with the **fewest blocks** in all (the smaller of its families' counts);
//! 3. then the one with the **smaller blocks** (fewer per-node host bits);
//! 4. then — our tie-break, where upstream compared the selectors' serialised bytes and then the
//!    CIDR text — the **name**, so the order never depends on how a map iterates;
//! 5. after every selecting ClusterCIDR: the fallback pools, used only when no selecting one has a
//!    block — the flag CIDRs (`--cluster-cidr`) first, then the ClusterCIDRs without a node
//!    selector in the order above. (Upstream put the flag CIDRs and selector-less ClusterCIDRs in
//!    one catch-all list, in creation order.)
//!
//! A ClusterCIDR being deleted (`deletionTimestamp` set) serves no new Node, as upstream's
//! "terminating" sets; the blocks its Nodes hold stay theirs.
//!
//! Node selector semantics are core/v1's `NodeSelector` as the scheduler reads it
//! ([`crate::labels::terms`]): the terms are ORed, the requirements of one term ANDed; a term
//! with no requirement matches nothing. Upstream's allocator instead ANDed the requirements
//! of every term (its own TODO, kubernetes/kubernetes#116419); with one term — the only shape
//! upstream handled right — both agree. "Matching requirements" counts the requirements of the
//! matching term that has the most.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::NodeSelector;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use nodeipam_core::{Cidr, Family, MAX_BLOCK_BITS};
use serde::{Deserialize, Serialize};

use crate::labels::NodeSelectorTerms;

/// The finalizer the controller keeps on each valid ClusterCIDR while Nodes may hold its blocks.
pub const FINALIZER: &str = "nodeipam.io/cluster-cidr-finalizer";

/// A `nodeipam.io/v1alpha1` `ClusterCIDR` as read from the API server (the fields the controller
/// uses; the CRD's schema prunes anything else).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ClusterCidrObject {
    /// `metadata` (name, uid, generation, deletionTimestamp, finalizers).
    #[serde(default)]
    pub metadata: ObjectMeta,
    /// `spec`, immutable once created (the CRD's `self == oldSelf` rule).
    #[serde(default)]
    pub spec: ClusterCidrSpec,
}

/// A ClusterCIDR's `spec`, as the CRD declares it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterCidrSpec {
    /// The Nodes it serves; `None` makes it a fallback pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_selector: Option<NodeSelector>,
    /// Host bits of each Node's block (bits, 4 ..= the range's host bits).
    #[serde(default)]
    pub per_node_host_bits: i64,
    /// The IPv4 range, a canonical CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv4: Option<String>,
    /// The IPv6 range, a canonical CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ipv6: Option<String>,
}

/// Why a ClusterCIDR cannot be used as a pool. The CRD's admission rules refuse all of these, so
/// one is seen only with an older or edited CRD installed; the controller then leaves the object
/// out and says why (the message is meant for its `Invalid` condition and an event).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClusterCidrError {
    /// Neither `spec.ipv4` nor `spec.ipv6` is set.
    #[error("at least one of spec.ipv4 and spec.ipv6 must be set")]
    NoRange,
    /// A range is not a canonical CIDR of its family.
    #[error("spec.{field} {text:?} is not a canonical {family} CIDR with no host bits set")]
    Range {
        /// `ipv4` or `ipv6`.
        field: &'static str,
        /// The text as written.
        text: String,
        /// The family the field takes (shown as `IPv4` / `IPv6`).
        family: Family,
    },
    /// `spec.perNodeHostBits` is below 4 or leaves a range fewer than 1 or more than 2^24
    /// blocks.
    #[error(
        "spec.perNodeHostBits {host_bits} does not fit spec.{field} {range}: it must be at least 4, at most the range's host bits, and cut the range into at most 2^24 blocks"
    )]
    HostBits {
        /// The value as written.
        host_bits: i64,
        /// `ipv4` or `ipv6`.
        field: &'static str,
        /// The range.
        range: Cidr,
    },
    /// A node selector requirement is malformed.
    #[error("spec.nodeSelector: {0}")]
    Selector(String),
}

/// A ClusterCIDR checked and ready to serve: its ranges, block size and node selector.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterCidrPool {
    /// `metadata.name`.
    pub name: String,
    /// The IPv4 range, if any.
    pub ipv4: Option<Cidr>,
    /// The IPv6 range, if any.
    pub ipv6: Option<Cidr>,
    /// Host bits of each Node's block (bits).
    pub per_node_host_bits: u8,
    /// Whether `deletionTimestamp` is set: it then serves no new Node.
    pub deleting: bool,
    /// Whether the controller has yet to see its [`FINALIZER`] on the object: until then the pool
    /// serves no new Node, so no Node gets a block from a ClusterCIDR whose deletion would not
    /// wait for it (upstream's `MultiCIDRRangeAllocator` likewise added its finalizer before it
    /// put a ClusterCIDR into its CIDR map); a Node whose serving order reaches it waits for the
    /// finalizer instead of going to a later pool (at start-up the finalizers of ClusterCIDRs
    /// created before the controller are written first). [`ClusterCidrPool::from_object`] leaves it `false`
    /// (the steady state, which `plan` shows); the controller sets it from `metadata.finalizers`.
    pub awaiting_finalizer: bool,
    /// `None`: no node selector (a fallback pool).
    terms: Option<NodeSelectorTerms>,
}

fn range(
    text: Option<&str>,
    field: &'static str,
    family: Family,
) -> Result<Option<Cidr>, ClusterCidrError> {
    let Some(text) = text else {
        return Ok(None);
    };
    let refused = || ClusterCidrError::Range {
        field,
        text: text.to_owned(),
        family,
    };
    // An IPv4-mapped IPv6 range is refused as the CRD's `isCIDR` refuses it.
    let cidr = Cidr::parse(text).map_err(|_| refused())?;
    if cidr.family() != family || (family == Family::V6 && text.contains('.')) {
        return Err(refused());
    }
    Ok(Some(cidr))
}

/// One ClusterCIDR object as read from its JSON ([`read_object`]).
#[derive(Debug, Clone, PartialEq)]
pub struct ReadObject {
    /// The object (its spec empty when the spec does not have the CRD's shape).
    pub object: ClusterCidrObject,
    /// The pool it is, or why it is not usable (the message for its `Invalid` condition).
    pub pool: Result<ClusterCidrPool, String>,
}

/// Reads one ClusterCIDR object from its `metadata` and its `spec` as JSON (`None`: no spec): a
/// spec without the CRD's shape (a field of the wrong type) is not usable, like one that breaks
/// the CRD's rules ([`ClusterCidrPool::from_object`]). The one reader of ClusterCIDR objects:
/// the controller's watch and `plan --cluster-cidrs` both read them here, so a malformed object
/// is marked invalid alone and the others are used.
pub fn read_object(metadata: ObjectMeta, spec: Option<&serde_json::Value>) -> ReadObject {
    let spec = spec.cloned().unwrap_or_default();
    let (spec, malformed) = match serde_json::from_value::<ClusterCidrSpec>(spec) {
        Ok(spec) => (spec, None),
        Err(e) => (ClusterCidrSpec::default(), Some(format!("spec: {e}"))),
    };
    let object = ClusterCidrObject { metadata, spec };
    let pool = match malformed {
        Some(message) => Err(message),
        None => ClusterCidrPool::from_object(&object).map_err(|e| e.to_string()),
    };
    ReadObject { object, pool }
}

impl ClusterCidrPool {
    /// Checks `object` as the CRD's rules do (a controller does not trust that the installed CRD
    /// is ours): ranges canonical and of their family, at least one, `perNodeHostBits` at least 4
    /// and cutting each range into 1 ..= 2^24 blocks, node selector requirements well formed.
    ///
    /// # Errors
    /// The first broken rule, as a [`ClusterCidrError`].
    pub fn from_object(object: &ClusterCidrObject) -> Result<ClusterCidrPool, ClusterCidrError> {
        let spec = &object.spec;
        let ipv4 = range(spec.ipv4.as_deref(), "ipv4", Family::V4)?;
        let ipv6 = range(spec.ipv6.as_deref(), "ipv6", Family::V6)?;
        if ipv4.is_none() && ipv6.is_none() {
            return Err(ClusterCidrError::NoRange);
        }
        let host_bits = spec.per_node_host_bits;
        for (field, cidr) in [("ipv4", ipv4), ("ipv6", ipv6)] {
            let Some(cidr) = cidr else { continue };
            let range_host_bits = i64::from(cidr.family().max_prefix_len() - cidr.prefix_len());
            if host_bits < 4
                || host_bits > range_host_bits
                || range_host_bits - host_bits > i64::from(MAX_BLOCK_BITS)
            {
                return Err(ClusterCidrError::HostBits {
                    host_bits,
                    field,
                    range: cidr,
                });
            }
        }
        let terms = match &spec.node_selector {
            None => None,
            Some(selector) => {
                Some(NodeSelectorTerms::from_api(selector).map_err(ClusterCidrError::Selector)?)
            }
        };
        Ok(ClusterCidrPool {
            name: object.metadata.name.clone().unwrap_or_default(),
            ipv4,
            ipv6,
            // Checked above: 4 ..= 128.
            per_node_host_bits: u8::try_from(host_bits).unwrap_or(u8::MAX),
            deleting: object.metadata.deletion_timestamp.is_some(),
            awaiting_finalizer: false,
            terms,
        })
    }

    /// Whether the pool serves Nodes without podCIDRs now: not being deleted and carrying the
    /// finalizer ([`ClusterCidrPool::awaiting_finalizer`]).
    pub fn serves_new_nodes(&self) -> bool {
        !self.deleting && !self.awaiting_finalizer
    }

    /// The range of `family`, if the pool has one.
    pub fn range_of(&self, family: Family) -> Option<Cidr> {
        match family {
            Family::V4 => self.ipv4,
            Family::V6 => self.ipv6,
        }
    }

    /// The node CIDR mask size (prefix length, bits) of its blocks in `range`.
    pub fn node_mask_size(&self, range: Cidr) -> u8 {
        range
            .family()
            .max_prefix_len()
            .saturating_sub(self.per_node_host_bits)
    }

    /// Blocks in all: the smaller of its families' block counts (KEP-2593's "max allocatable").
    pub fn block_count(&self) -> u32 {
        [self.ipv4, self.ipv6]
            .into_iter()
            .flatten()
            .map(|range| {
                let bits = self
                    .node_mask_size(range)
                    .saturating_sub(range.prefix_len());
                1u32 << bits.min(MAX_BLOCK_BITS)
            })
            .min()
            .unwrap_or(0)
    }

    /// Whether it has a node selector (otherwise it is a fallback pool).
    pub fn has_selector(&self) -> bool {
        self.terms.is_some()
    }

    /// How many requirements of its selector the Node (`labels`, `node_name`) meets, counting
    /// the matching term with the most; `None` when no term matches or it has no selector.
    pub fn matching_requirements(
        &self,
        labels: &BTreeMap<String, String>,
        node_name: &str,
    ) -> Option<usize> {
        self.terms
            .as_ref()?
            .matching_requirements(labels, node_name)
    }

    /// The label keys its selector reads (sorted, no duplicates): what a Node reader must keep of
    /// a Node's labels for [`serving_order`] to see them (`plan` keeps only the labels it needs).
    pub fn label_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self
            .terms
            .iter()
            .flat_map(NodeSelectorTerms::label_keys)
            .map(str::to_owned)
            .collect();
        keys.sort();
        keys.dedup();
        keys
    }

    /// Its node selector in one line, in kubectl's label-selector spelling (`role in (a,b)`,
    /// values sorted; `gpu`, `!spot`, `rank>3`, `metadata.name in (n1)`): requirements of a term
    /// joined by ` & `, terms by ` | ` ([`NodeSelectorTerms::summary`]); `(none: fallback)`
    /// without a selector.
    pub fn selector_summary(&self) -> String {
        self.terms
            .as_ref()
            .map_or_else(|| "(none: fallback)".to_owned(), NodeSelectorTerms::summary)
    }

    /// KEP-2593's tie-breaks after the matching count: fewest blocks, smaller blocks, then name.
    fn tie_break(&self) -> (u32, u8, &str) {
        (self.block_count(), self.per_node_host_bits, &self.name)
    }
}

/// One pool in a Node's [`serving_order`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolChoice<'a> {
    /// A ClusterCIDR.
    ClusterCidr(&'a ClusterCidrPool),
    /// The flag CIDRs (`--cluster-cidr`), the first fallback.
    Flags,
}

/// The pools to try for a Node without podCIDRs, in KEP-2593's order (see the module docs): the
/// ClusterCIDRs whose selector matches it, then the flag CIDRs, then the ClusterCIDRs without a
/// selector. Pools being deleted are left out; a pool still awaiting the controller's finalizer
/// ([`ClusterCidrPool::awaiting_finalizer`]) keeps its place, and the caller makes a Node whose
/// turn reaches it wait rather than pass it by. The caller takes the first that has a block in
/// every family it serves (all or nothing within one pool).
pub fn serving_order<'a>(
    pools: &'a [ClusterCidrPool],
    labels: &BTreeMap<String, String>,
    node_name: &str,
) -> Vec<PoolChoice<'a>> {
    let live = || pools.iter().filter(|p| !p.deleting);
    let mut selecting: Vec<(usize, &ClusterCidrPool)> = live()
        .filter_map(|p| Some((p.matching_requirements(labels, node_name)?, p)))
        .collect();
    selecting.sort_by(|(a_count, a), (b_count, b)| {
        b_count
            .cmp(a_count)
            .then_with(|| a.tie_break().cmp(&b.tie_break()))
    });
    let mut fallback: Vec<&ClusterCidrPool> = live().filter(|p| !p.has_selector()).collect();
    fallback.sort_by(|a, b| a.tie_break().cmp(&b.tie_break()));
    selecting
        .into_iter()
        .map(|(_, p)| PoolChoice::ClusterCidr(p))
        .chain(std::iter::once(PoolChoice::Flags))
        .chain(fallback.into_iter().map(PoolChoice::ClusterCidr))
        .collect()
}

pub mod status;

#[cfg(test)]
mod tests;
