//! The controller's view of a Node: [`SlimNode`], the only fields of a `v1` Node the allocator
//! reads (name, uid, resourceVersion, deletionTimestamp, labels, `spec.podCIDR(s)`), deserialized
//! straight from the API server's JSON — everything else (status, images, managedFields,
//! annotations) is skipped by the parser without being stored — and [`CachedNode`], the compact
//! copy the informer keeps per Node.
//!
//! A real Node is 5–15 kB of JSON; keeping whole `k8s_openapi` Nodes cost ~10 kB of memory per
//! Node (0.5 GB at 50,000 Nodes). A [`CachedNode`] is 88 bytes, with no heap allocation of its
//! own for a Node with a canonical uid and podCIDRs, plus the values of the few labels the
//! node-pool rules read (keys known at start-up, shared); a Node's other labels (typically 15–25)
//! are not kept.

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::sync::Arc;

use k8s_openapi::ClusterResourceScope;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Resource;
use serde::Deserialize;
use serde::de::IgnoredAny;

use crate::compact::{PodCidrTexts, Uid};
use crate::reconcile::{NodeName, NodeView};

/// A `v1` Node with only what the node IPAM controller reads. Deserializes from a Node's JSON;
/// every other field is skipped. `metadata` holds only `name`, `uid`, `resourceVersion` and
/// `labels`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(from = "NodeFields")]
pub struct SlimNode {
    /// `metadata` (name, uid, resourceVersion, labels only).
    pub metadata: ObjectMeta,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.podCIDR`, if set and not empty.
    pub pod_cidr: Option<String>,
    /// `spec.podCIDRs` (empty if unset).
    pub pod_cidrs: Vec<String>,
}

/// A Node's JSON as read: the fields [`SlimNode`] is built from, and `kind` (which `plan`'s
/// reader checks on list items; the informer ignores it). `metadata`, `spec` and `kind` may be
/// absent or `null`.
#[derive(Deserialize)]
pub(crate) struct NodeFields {
    #[serde(default)]
    pub(crate) kind: Option<String>,
    #[serde(default)]
    pub(crate) metadata: Option<MetaFields>,
    #[serde(default)]
    pub(crate) spec: Option<SpecFields>,
}

/// `metadata`, as far as [`SlimNode`] reads it.
#[derive(Deserialize, Default)]
#[serde(rename_all = "camelCase", default)]
pub(crate) struct MetaFields {
    name: Option<String>,
    uid: Option<String>,
    resource_version: Option<String>,
    deletion_timestamp: Option<IgnoredAny>,
    labels: Option<BTreeMap<String, String>>,
}

/// `spec`, as far as [`SlimNode`] reads it.
#[derive(Deserialize, Default)]
#[serde(default)]
pub(crate) struct SpecFields {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
}

impl From<NodeFields> for SlimNode {
    fn from(fields: NodeFields) -> SlimNode {
        let NodeFields { metadata, spec, .. } = fields;
        let metadata = metadata.unwrap_or_default();
        let spec = spec.unwrap_or_default();
        SlimNode {
            deleting: metadata.deletion_timestamp.is_some(),
            metadata: ObjectMeta {
                name: metadata.name,
                uid: metadata.uid,
                resource_version: metadata.resource_version,
                labels: metadata.labels,
                ..ObjectMeta::default()
            },
            pod_cidr: spec.pod_cidr.filter(|c| !c.is_empty()),
            pod_cidrs: spec.pod_cidrs.unwrap_or_default(),
        }
    }
}

impl SlimNode {
    /// The slim copy of a whole k8s-openapi Node (what deserializing its JSON gives).
    pub fn from_node(node: &k8s_openapi::api::core::v1::Node) -> SlimNode {
        let spec = node.spec.as_ref();
        SlimNode {
            metadata: ObjectMeta {
                name: node.metadata.name.clone(),
                uid: node.metadata.uid.clone(),
                resource_version: node.metadata.resource_version.clone(),
                labels: node.metadata.labels.clone(),
                ..ObjectMeta::default()
            },
            deleting: node.metadata.deletion_timestamp.is_some(),
            pod_cidr: spec
                .and_then(|s| s.pod_cidr.clone())
                .filter(|c| !c.is_empty()),
            pod_cidrs: spec.and_then(|s| s.pod_cidrs.clone()).unwrap_or_default(),
        }
    }

    /// `metadata.name`, or `""`.
    pub fn name(&self) -> &str {
        self.metadata.name.as_deref().unwrap_or_default()
    }

    /// The compact copy of `node` with every label, each key through `shared_key` (so the Nodes
    /// that have a key share one copy of it).
    pub fn with_all_labels(
        node: &SlimNode,
        mut shared_key: impl FnMut(&str) -> Arc<str>,
    ) -> CachedNode {
        let mut cached = CachedNode::of(node, &[]);
        if let Some(all) = &node.metadata.labels {
            cached.labels = all
                .iter()
                .map(|(k, v)| (shared_key(k), v.as_str().into()))
                .collect();
        }
        cached
    }

    /// The decision logic's view of this Node.
    pub fn view(&self) -> NodeView {
        NodeView {
            name: self.name().into(),
            pod_cidr: self.pod_cidr.clone(),
            pod_cidrs: self.pod_cidrs.clone(),
            deleting: self.deleting,
            uid: self.metadata.uid.clone(),
            labels: self.metadata.labels.clone().unwrap_or_default(),
        }
    }
}

impl Resource for SlimNode {
    type DynamicType = ();
    type Scope = ClusterResourceScope;

    fn kind(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("Node")
    }
    fn group(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("")
    }
    fn version(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("v1")
    }
    fn plural(_: &()) -> Cow<'_, str> {
        Cow::Borrowed("nodes")
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// What the informer cache keeps of one Node (its name is the cache key): no heap allocation for
/// a Node with a canonical uid and canonical podCIDRs (see [`crate::compact`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CachedNode {
    /// `metadata.uid` (`None` if the object had none, which a real API server never serves).
    pub uid: Option<Uid>,
    /// `spec.podCIDR` and `spec.podCIDRs`.
    pub pod_cidrs: PodCidrTexts,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// The labels among the watched keys that the Node has: `(key, value)`, keys in the order
    /// given to [`CachedNode::of`] (shared with it). Empty without node-pool rules. Every label,
    /// in key order, with [`CachedNode::with_all_labels`].
    pub labels: Box<[(Arc<str>, Box<str>)]>,
}

impl CachedNode {
    /// The compact copy of `node`, keeping only the labels whose keys are in `label_keys`.
    pub fn of(node: &SlimNode, label_keys: &[Arc<str>]) -> CachedNode {
        let labels = match &node.metadata.labels {
            Some(all) if !label_keys.is_empty() => label_keys
                .iter()
                .filter_map(|key| all.get(&**key).map(|v| (key.clone(), v.as_str().into())))
                .collect(),
            _ => Box::default(),
        };
        CachedNode {
            uid: node.metadata.uid.as_deref().map(Uid::new),
            pod_cidrs: PodCidrTexts::new(node.pod_cidr.as_deref(), &node.pod_cidrs),
            deleting: node.deleting,
            labels,
        }
    }

    /// The compact copy of `node` with every label, each key through `shared_key` (so the Nodes
    /// that have a key share one copy of it).
    pub fn with_all_labels(
        node: &SlimNode,
        mut shared_key: impl FnMut(&str) -> Arc<str>,
    ) -> CachedNode {
        let mut cached = CachedNode::of(node, &[]);
        if let Some(all) = &node.metadata.labels {
            cached.labels = all
                .iter()
                .map(|(k, v)| (shared_key(k), v.as_str().into()))
                .collect();
        }
        cached
    }

    /// The decision logic's view of this Node.
    pub fn view(&self, name: &NodeName) -> NodeView {
        NodeView {
            name: name.clone(),
            pod_cidr: self.pod_cidrs.pod_cidr(),
            pod_cidrs: self.pod_cidrs.pod_cidrs(),
            deleting: self.deleting,
            uid: self.uid.as_ref().map(ToString::to_string),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// Whether the Node has no podCIDR yet (it needs an allocation).
    pub fn needs_pod_cidrs(&self) -> bool {
        self.pod_cidrs.is_unset()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_items(file: &str) -> Vec<serde_json::Value> {
        let path = format!("{}/../fixtures/nodes/{file}", env!("CARGO_MANIFEST_DIR"));
        let text = std::fs::read_to_string(&path).expect("fixture readable");
        let list: serde_json::Value = serde_json::from_str(&text).expect("fixture is JSON");
        list["items"].as_array().expect("a NodeList").clone()
    }

    /// The per-Node cache entry stays as small as the module doc says (88 bytes on 64-bit
    /// targets), so 50,000 Nodes cost 4.4 MB of entries plus the map's overhead.
    #[test]
    #[cfg(target_pointer_width = "64")]
    fn cached_node_is_88_bytes() {
        assert_eq!(std::mem::size_of::<CachedNode>(), 88);
    }

    /// Every fixture Node reads into the same view through the slim type as through k8s-openapi's
    /// full `Node`.
    #[test]
    fn slim_view_equals_the_full_node_view_on_every_fixture() {
        let dir = format!("{}/../fixtures/nodes", env!("CARGO_MANIFEST_DIR"));
        let mut checked = 0;
        for entry in std::fs::read_dir(dir).expect("fixtures dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let file = path.file_name().and_then(|f| f.to_str()).expect("name");
            for item in fixture_items(file) {
                let full: k8s_openapi::api::core::v1::Node =
                    serde_json::from_value(item.clone()).expect("a Node");
                let slim: SlimNode = serde_json::from_value(item).expect("a slim Node");
                assert_eq!(slim.view(), NodeView::from_node(&full), "{file}");
                assert_eq!(SlimNode::from_node(&full), slim, "{file}");
                assert_eq!(slim.metadata.labels, full.metadata.labels, "{file}");
                assert_eq!(
                    slim.metadata.resource_version, full.metadata.resource_version,
                    "{file}"
                );
                let name: NodeName = slim.name().into();
                let all_keys: Vec<Arc<str>> = slim
                    .metadata
                    .labels
                    .iter()
                    .flatten()
                    .map(|(k, _)| k.as_str().into())
                    .collect();
                assert_eq!(
                    CachedNode::of(&slim, &all_keys).view(&name),
                    slim.view(),
                    "{file}"
                );
                checked += 1;
            }
        }
        assert!(checked >= 30, "only {checked} fixture Nodes");
    }

    /// With ClusterCIDRs every label is kept (any selector may read it), each key stored once
    /// for all the Nodes that have it (the AKS fixture's three Nodes, 19 labels each).
    #[test]
    fn with_all_labels_every_label_is_kept_and_keys_are_shared() {
        let cache = super::super::informer::NodeCache::with_all_labels();
        let cached: Vec<CachedNode> = fixture_items("03-aks-kubenet-3nodes.json")
            .into_iter()
            .map(|item| {
                let slim: SlimNode = serde_json::from_value(item).expect("a slim Node");
                let node = cache.compact_for_test(&slim);
                assert_eq!(node.view(&NodeName::from(slim.name())), slim.view());
                assert_eq!(node.labels.len(), 19);
                node
            })
            .collect();
        assert_eq!(cached.len(), 3);
        for (a, b) in cached[0].labels.iter().zip(cached[2].labels.iter()) {
            assert!(Arc::ptr_eq(&a.0, &b.0), "key {} is shared", a.0);
        }
    }

    /// The cache keeps only the watched labels (the AKS fixture's Nodes have 19).
    #[test]
    fn cache_keeps_only_the_watched_labels() {
        let item = fixture_items("03-aks-kubenet-3nodes.json")[0].clone();
        let slim: SlimNode = serde_json::from_value(item).expect("a slim Node");
        assert_eq!(slim.metadata.labels.as_ref().map(BTreeMap::len), Some(19));
        let keys: Vec<Arc<str>> = ["agentpool", "kubernetes.azure.com/agentpool"]
            .into_iter()
            .map(Into::into)
            .collect();
        let cached = CachedNode::of(&slim, &keys);
        assert_eq!(cached.labels.len(), 1);
        assert!(
            Arc::ptr_eq(&cached.labels[0].0, &keys[0]),
            "keys are shared"
        );
        let view = cached.view(&NodeName::from(slim.name()));
        assert_eq!(
            view.labels,
            BTreeMap::from([("agentpool".to_owned(), "agentpool".to_owned())])
        );
        assert!(CachedNode::of(&slim, &[]).labels.is_empty());
    }

    #[test]
    fn deletion_timestamp_and_empty_pod_cidr() {
        let node: SlimNode = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "n", "deletionTimestamp": "2026-01-01T00:00:00Z"},
            "spec": {"podCIDR": ""}
        }))
        .expect("parses");
        assert!(node.deleting);
        assert_eq!(node.pod_cidr, None);
        let bare: SlimNode = serde_json::from_value(serde_json::json!({})).expect("parses");
        assert_eq!(bare, SlimNode::default());
    }
}
