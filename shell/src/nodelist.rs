//! Reading Nodes from `kubectl get nodes -o json` output (a `NodeList`, a `List` of Nodes, or a
//! single `Node`).
//!
//! [`read_nodes`] streams: it deserialises `items` one Node at a time straight into the few fields
//! the allocator reads ([`InputNode`]), so a NodeList of any size is never held whole (300,000
//! Nodes of several kB each would take gigabytes as JSON values). [`parse_nodes`] still gives
//! k8s-openapi `Node`s, for callers that need whole objects.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::Error;
use crate::compact::{PodCidrTexts, Uid};
use crate::reconcile::{NodeName, NodeView};

/// One Node of the input, reduced to what the allocator reads (`metadata.name`, `metadata.uid`,
/// `metadata.deletionTimestamp` set or not, the labels the node-pool rules read, `spec.podCIDR`,
/// `spec.podCIDRs`). 72 bytes plus the name; the uid inline when it is a canonical UUID, the
/// podCIDRs (compact, [`PodCidrTexts`]) only for Nodes that have them, the label values only for
/// Nodes that carry a watched label.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputNode {
    /// `metadata.name`.
    pub name: NodeName,
    /// `metadata.uid` (compact: 16 bytes inline for a canonical UUID).
    pub uid: Option<Uid>,
    /// Whether `metadata.deletionTimestamp` is set.
    pub deleting: bool,
    /// `spec.podCIDR` (non-empty) and `spec.podCIDRs`, when either is set (never
    /// [`PodCidrTexts::Unset`]).
    pub pod_cidrs: Option<Box<PodCidrTexts>>,
    /// The labels among the watched keys ([`read_nodes`]'s `label_keys`) that the Node has:
    /// `(key, value)`, keys in the order given and shared between Nodes. Empty without node-pool
    /// rules.
    pub labels: Box<[(Arc<str>, Box<str>)]>,
}

impl InputNode {
    /// The allocator's view of this Node.
    pub fn view(&self) -> NodeView {
        let (pod_cidr, pod_cidrs) = match &self.pod_cidrs {
            Some(cidrs) => (cidrs.pod_cidr(), cidrs.pod_cidrs()),
            None => (None, Vec::new()),
        };
        NodeView {
            name: self.name.clone(),
            pod_cidr,
            pod_cidrs,
            deleting: self.deleting,
            uid: self.uid.as_ref().map(ToString::to_string),
            labels: self
                .labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    /// The reduced copy of a whole Node's view, keeping only the labels with these keys (what
    /// [`read_nodes`] gives for the same Node and keys).
    pub fn from_view(view: NodeView, label_keys: &[String]) -> InputNode {
        let has = view.has_pod_cidrs();
        let labels = label_keys
            .iter()
            .filter_map(|key| {
                view.labels
                    .get(key)
                    .map(|value| (Arc::from(key.as_str()), value.as_str().into()))
            })
            .collect();
        InputNode {
            uid: view.uid.as_deref().map(Uid::new),
            deleting: view.deleting,
            pod_cidrs: has
                .then(|| Box::new(PodCidrTexts::new(view.pod_cidr.as_deref(), &view.pod_cidrs))),
            name: view.name,
            labels,
        }
    }

    /// Whether the Node has any podCIDR set.
    pub fn has_pod_cidrs(&self) -> bool {
        self.pod_cidrs.is_some()
    }
}

/// `metadata`, as far as we read it.
#[derive(Default)]
struct Metadata {
    name: Option<String>,
    uid: Option<String>,
    deleting: bool,
    labels: Vec<(Arc<str>, Box<str>)>,
}

/// `metadata` (or `null`), reading only the labels whose keys are in `keys`: the other labels'
/// keys are compared in the reader's buffer and their values skipped, so a Node's 15–25 labels
/// cost nothing unless a rule reads them.
#[derive(Clone, Copy)]
struct MetadataSeed<'a> {
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for MetadataSeed<'_> {
    type Value = Option<Metadata>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for MetadataSeed<'_> {
    type Value = Option<Metadata>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("object metadata")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut metadata = Metadata::default();
        while let Some(key) = map.next_key::<MetadataField>()? {
            match key {
                MetadataField::Name => metadata.name = map.next_value()?,
                MetadataField::Uid => metadata.uid = map.next_value()?,
                MetadataField::DeletionTimestamp => {
                    metadata.deleting = map.next_value::<Option<IgnoredAny>>()?.is_some();
                }
                MetadataField::Labels if !self.keys.is_empty() => {
                    metadata.labels = map.next_value_seed(LabelsSeed { keys: self.keys })?;
                }
                MetadataField::Labels | MetadataField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(Some(metadata))
    }
}

/// The `metadata` fields we read.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum MetadataField {
    Name,
    Uid,
    DeletionTimestamp,
    Labels,
    #[serde(other)]
    Other,
}

/// `metadata.labels` (or `null`): the `(key, value)` of each label whose key is in `keys`, in
/// the order of `keys` (the last one wins if a key is repeated).
struct LabelsSeed<'a> {
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for LabelsSeed<'_> {
    type Value = Vec<(Arc<str>, Box<str>)>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for LabelsSeed<'_> {
    type Value = Vec<(Arc<str>, Box<str>)>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a map of label keys to values")
    }
    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        Ok(Vec::new())
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_map(self)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut found: Vec<(usize, Box<str>)> = Vec::new();
        while let Some(index) = map.next_key_seed(WatchedKey { keys: self.keys })? {
            match index {
                Some(index) => {
                    let value = map.next_value::<String>()?.into_boxed_str();
                    found.retain(|(i, _)| *i != index);
                    found.push((index, value));
                }
                None => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        found.sort_by_key(|(index, _)| *index);
        Ok(found
            .into_iter()
            .filter_map(|(index, value)| Some((self.keys.get(index)?.clone(), value)))
            .collect())
    }
}

/// A label key: its index in `keys`, or `None` for a key no rule reads (compared without being
/// copied).
struct WatchedKey<'a> {
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for WatchedKey<'_> {
    type Value = Option<usize>;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Self::Value, D::Error> {
        deserializer.deserialize_str(self)
    }
}

impl<'de> Visitor<'de> for WatchedKey<'_> {
    type Value = Option<usize>;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a label key")
    }
    fn visit_str<E: de::Error>(self, key: &str) -> Result<Self::Value, E> {
        Ok(self.keys.iter().position(|k| **k == *key))
    }
}

#[derive(Deserialize)]
struct Spec {
    #[serde(rename = "podCIDR")]
    pod_cidr: Option<String>,
    #[serde(rename = "podCIDRs")]
    pod_cidrs: Option<Vec<String>>,
}

/// An item of `items`: a Node as far as we read it (other fields are skipped unread).
#[derive(Default)]
struct Item {
    kind: Option<String>,
    metadata: Option<Metadata>,
    spec: Option<Spec>,
}

/// The `Item` fields we read.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "camelCase")]
enum ItemField {
    Kind,
    Metadata,
    Spec,
    #[serde(other)]
    Other,
}

/// One item of `items`, its metadata read with [`MetadataSeed`].
#[derive(Clone, Copy)]
struct ItemSeed<'a> {
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for ItemSeed<'_> {
    type Value = Item;
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Item, D::Error> {
        deserializer.deserialize_map(self)
    }
}

impl<'de> Visitor<'de> for ItemSeed<'_> {
    type Value = Item;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a Node")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Item, A::Error> {
        let mut item = Item::default();
        while let Some(key) = map.next_key::<ItemField>()? {
            match key {
                ItemField::Kind => item.kind = map.next_value()?,
                ItemField::Metadata => {
                    item.metadata = map.next_value_seed(MetadataSeed { keys: self.keys })?;
                }
                ItemField::Spec => item.spec = map.next_value()?,
                ItemField::Other => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(item)
    }
}

fn input_node(metadata: Option<Metadata>, spec: Option<Spec>) -> InputNode {
    let metadata = metadata.unwrap_or_default();
    let (pod_cidr, pod_cidrs) = match spec {
        Some(spec) => (
            spec.pod_cidr.filter(|s| !s.is_empty()),
            spec.pod_cidrs.unwrap_or_default(),
        ),
        None => (None, Vec::new()),
    };
    let pod_cidrs = (pod_cidr.is_some() || !pod_cidrs.is_empty())
        .then(|| Box::new(PodCidrTexts::new(pod_cidr.as_deref(), &pod_cidrs)));
    InputNode {
        name: metadata.name.unwrap_or_default().into(),
        uid: metadata.uid.as_deref().map(Uid::new),
        deleting: metadata.deleting,
        pod_cidrs,
        labels: metadata.labels.into_boxed_slice(),
    }
}

/// The `items` array, read element by element into `out`.
struct ItemsSeed<'a> {
    out: &'a mut Vec<InputNode>,
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_seq(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an items array")
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        let seed = ItemSeed { keys: self.keys };
        loop {
            let item = match seq.next_element_seed(seed) {
                Ok(Some(item)) => item,
                Ok(None) => return Ok(()),
                Err(e) => return Err(de::Error::custom(format!("items[{index}]: {e}"))),
            };
            if item.kind.as_deref().is_some_and(|k| k != "Node") {
                return Err(de::Error::custom(format!("items[{index}] is not a Node")));
            }
            self.out.push(input_node(item.metadata, item.spec));
            index += 1;
        }
    }
}

/// The top-level object: `kind`, `items` (streamed), and for a single Node its `metadata`/`spec`.
#[derive(Default)]
struct Document {
    kind: Option<String>,
    items: Option<Vec<InputNode>>,
    metadata: Option<Metadata>,
    spec: Option<Spec>,
}

struct DocumentVisitor<'a> {
    keys: &'a [Arc<str>],
}

impl<'de> Visitor<'de> for DocumentVisitor<'_> {
    type Value = Document;
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a NodeList, a List of Nodes or a Node")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Document, A::Error> {
        let mut doc = Document::default();
        while let Some(key) = map.next_key::<String>()? {
            match key.as_str() {
                "kind" => doc.kind = map.next_value::<Option<String>>()?,
                "items" => {
                    let mut items = Vec::new();
                    map.next_value_seed(NullableItems {
                        out: &mut items,
                        keys: self.keys,
                    })?;
                    doc.items = Some(items);
                }
                // Kept only for a single Node; a list's own metadata is small.
                "metadata" => {
                    doc.metadata = map.next_value_seed(MetadataSeed { keys: self.keys })?
                }
                "spec" => doc.spec = map.next_value::<Option<Spec>>()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(doc)
    }
}

/// `items`, which may also be `null` (read as absent).
struct NullableItems<'a> {
    out: &'a mut Vec<InputNode>,
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for NullableItems<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for NullableItems<'_> {
    type Value = ();
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an items array")
    }
    fn visit_none<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        ItemsSeed {
            out: self.out,
            keys: self.keys,
        }
        .deserialize(deserializer)
    }
}

/// Reads a NodeList (`kind: NodeList` or `List`, `items: [Node…]`) or a single Node from `reader`,
/// streaming (see the module documentation), in list order, with the same rules as
/// [`parse_nodes`]: every Node has a non-empty `metadata.name`, unique in the list. Of each
/// Node's labels only those whose keys are in `label_keys` are kept
/// ([`crate::node_pools::Sizing::label_keys`]; none without node-pool rules).
///
/// # Errors
/// [`Error::InvalidNodeList`] naming the item that failed; [`Error::Read`] (`path`) if reading
/// fails.
pub fn read_nodes<R: Read>(
    reader: R,
    path: &str,
    label_keys: &[String],
) -> Result<Vec<InputNode>, Error> {
    let keys: Vec<Arc<str>> = label_keys.iter().map(|k| Arc::from(k.as_str())).collect();
    let mut deserializer = serde_json::Deserializer::from_reader(std::io::BufReader::new(reader));
    let doc = deserializer
        .deserialize_map(DocumentVisitor { keys: &keys })
        .and_then(|doc| deserializer.end().map(|()| doc))
        .map_err(|e| match e.classify() {
            serde_json::error::Category::Io => Error::Read {
                path: path.to_owned(),
                source: std::io::Error::other(e.to_string()),
            },
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                Error::InvalidNodeList(format!("not JSON: {e}"))
            }
            serde_json::error::Category::Data => Error::InvalidNodeList(e.to_string()),
        })?;
    let kind = doc.kind.unwrap_or_default();
    let nodes = match kind.as_str() {
        "NodeList" | "List" => doc
            .items
            .ok_or_else(|| Error::InvalidNodeList(format!("{kind} without an items array")))?,
        "Node" => vec![input_node(doc.metadata, doc.spec)],
        other => {
            return Err(Error::InvalidNodeList(format!(
                "expected kind NodeList, List or Node, found {other:?}"
            )));
        }
    };
    check_names(nodes.iter().map(|n| &*n.name))?;
    Ok(nodes)
}

/// Every name non-empty and unique: the first offending item in list order is reported, as a
/// scan in order would. Memory: one index per Node (sorted), not a map of names.
fn check_names<'a>(names: impl Iterator<Item = &'a str> + Clone) -> Result<(), Error> {
    let list: Vec<&str> = names.collect();
    let first_empty = list.iter().position(|n| n.is_empty());
    let mut order: Vec<u32> = (0..list.len() as u32).collect();
    order.sort_by(|a, b| list[*a as usize].cmp(list[*b as usize]).then(a.cmp(b)));
    // For each name held more than once: (second occurrence, first occurrence).
    let mut first_duplicate: Option<(usize, usize)> = None;
    let mut group_start = 0;
    for i in 1..order.len() {
        let (prev, cur) = (order[i - 1] as usize, order[i] as usize);
        if list[prev] != list[cur] {
            group_start = i;
            continue;
        }
        if i == group_start + 1 && !list[cur].is_empty() {
            let candidate = (cur, order[group_start] as usize);
            if first_duplicate.is_none_or(|(second, _)| candidate.0 < second) {
                first_duplicate = Some(candidate);
            }
        }
    }
    match (first_empty, first_duplicate) {
        (Some(empty), dup) if dup.is_none_or(|(second, _)| empty < second) => Err(
            Error::InvalidNodeList(format!("items[{empty}] has no metadata.name")),
        ),
        (_, Some((second, first))) => Err(Error::InvalidNodeList(format!(
            "items[{second}]: duplicate Node name {:?} (also items[{first}])",
            list[second]
        ))),
        _ => Ok(()),
    }
}

/// Parses a NodeList (`kind: NodeList` or `List`, `items: [Node…]`) or a single Node, in order,
/// into whole k8s-openapi `Node`s. Items without `apiVersion`/`kind` (as the API server lists
/// them) are accepted.
///
/// Every Node must have a non-empty `metadata.name`, unique in the list: an API server never
/// lists two Nodes of one name, and the allocator keys its reservations by name (two Nodes
/// called `a` made `plan` free the first one's kept block and assign it again).
///
/// # Errors
/// [`Error::InvalidNodeList`] for anything else, naming the item that failed.
pub fn parse_nodes(text: &str) -> Result<Vec<Node>, Error> {
    let nodes = parse_items(text)?;
    let mut seen: HashMap<&str, usize> = HashMap::with_capacity(nodes.len());
    for (index, node) in nodes.iter().enumerate() {
        let name = node.metadata.name.as_deref().unwrap_or("");
        if name.is_empty() {
            return Err(Error::InvalidNodeList(format!(
                "items[{index}] has no metadata.name"
            )));
        }
        if let Some(first) = seen.insert(name, index) {
            return Err(Error::InvalidNodeList(format!(
                "items[{index}]: duplicate Node name {name:?} (also items[{first}])"
            )));
        }
    }
    Ok(nodes)
}

fn parse_items(text: &str) -> Result<Vec<Node>, Error> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| Error::InvalidNodeList(format!("not JSON: {e}")))?;
    let kind = value.get("kind").and_then(Value::as_str).unwrap_or("");
    match kind {
        "NodeList" | "List" => {
            let items = value
                .get("items")
                .and_then(Value::as_array)
                .ok_or_else(|| Error::InvalidNodeList(format!("{kind} without an items array")))?;
            items
                .iter()
                .enumerate()
                .map(|(index, item)| {
                    if item
                        .get("kind")
                        .and_then(Value::as_str)
                        .is_some_and(|k| k != "Node")
                    {
                        return Err(Error::InvalidNodeList(format!(
                            "items[{index}] is not a Node"
                        )));
                    }
                    serde_json::from_value::<Node>(item.clone())
                        .map_err(|e| Error::InvalidNodeList(format!("items[{index}]: {e}")))
                })
                .collect()
        }
        "Node" => serde_json::from_value::<Node>(value)
            .map(|n| vec![n])
            .map_err(|e| Error::InvalidNodeList(e.to_string())),
        other => Err(Error::InvalidNodeList(format!(
            "expected kind NodeList, List or Node, found {other:?}"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture(name: &str) -> String {
        let path = format!("{}/../fixtures/nodes/{name}", env!("CARGO_MANIFEST_DIR"));
        std::fs::read_to_string(path).expect("fixture")
    }

    /// The streamed views equal the views of whole k8s-openapi Nodes, on every real fixture:
    /// without watched label keys (no labels kept), with every label key the fixture uses (all
    /// kept), and with two keys plus one no Node has (only those kept); equal to
    /// [`InputNode::from_view`] of the whole Node each time.
    #[test]
    fn streamed_views_match_whole_nodes_on_every_fixture() {
        let dir = format!("{}/../fixtures/nodes", env!("CARGO_MANIFEST_DIR"));
        let mut count = 0;
        let mut labelled = 0;
        for entry in std::fs::read_dir(dir).expect("fixtures dir") {
            let path = entry.expect("entry").path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            let name = path
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_owned();
            let text = fixture(&name);
            let whole: Vec<NodeView> = parse_nodes(&text)
                .expect("parses whole")
                .iter()
                .map(NodeView::from_node)
                .collect();
            let all_keys: Vec<String> = whole
                .iter()
                .flat_map(|v| v.labels.keys().cloned())
                .collect::<std::collections::BTreeSet<_>>()
                .into_iter()
                .collect();
            let some_keys: Vec<String> = all_keys
                .iter()
                .take(2)
                .cloned()
                .chain(["nodeipam.io/no-node-has-this".to_owned()])
                .collect();
            for keys in [Vec::new(), all_keys.clone(), some_keys] {
                let streamed = read_nodes(text.as_bytes(), &name, &keys).expect("streams");
                let reduced: Vec<InputNode> = whole
                    .iter()
                    .map(|v| InputNode::from_view(v.clone(), &keys))
                    .collect();
                assert_eq!(streamed, reduced, "{name} {keys:?}");
                let want: Vec<NodeView> = whole
                    .iter()
                    .map(|v| {
                        let mut v = v.clone();
                        v.labels.retain(|k, _| keys.contains(k));
                        v
                    })
                    .collect();
                let views: Vec<NodeView> = streamed.iter().map(InputNode::view).collect();
                assert_eq!(views, want, "{name} {keys:?}");
                labelled += views.iter().filter(|v| !v.labels.is_empty()).count();
            }
            count += 1;
        }
        assert!(count >= 10, "{count} fixtures");
        assert!(labelled >= 30, "only {labelled} labelled views");
    }

    /// Watched labels: a repeated key keeps its last value, `null` labels are none, a watched
    /// label that is not a string is an error naming the item; unwatched labels are not read.
    #[test]
    fn labels_are_read_only_for_watched_keys() {
        let keys = ["b".to_owned(), "a".to_owned()];
        let nodes = read_nodes(
            br#"{"kind":"List","items":[
                {"metadata":{"name":"x","labels":{"a":"1","c":{"not":"a string"},"b":"2","a":"3"}}},
                {"metadata":{"name":"y","labels":null}},
                {"metadata":{"labels":{"b":"only"},"name":"z"}}]}"#
                .as_slice(),
            "-",
            &keys,
        )
        .expect("reads");
        let labels: Vec<Vec<(&str, &str)>> = nodes
            .iter()
            .map(|n| n.labels.iter().map(|(k, v)| (&**k, &**v)).collect())
            .collect();
        assert_eq!(
            labels,
            [vec![("b", "2"), ("a", "3")], vec![], vec![("b", "only")]]
        );
        assert!(
            Arc::ptr_eq(&nodes[0].labels[0].0, &nodes[2].labels[0].0),
            "keys are shared"
        );
        let error = read_nodes(
            br#"{"kind":"List","items":[{"metadata":{"name":"x","labels":{"a":7}}}]}"#.as_slice(),
            "-",
            &keys,
        )
        .expect_err("a watched label must be a string");
        assert!(error.to_string().contains("items[0]:"), "{error}");
        let ignored = read_nodes(
            br#"{"kind":"List","items":[{"metadata":{"name":"x","labels":{"a":7}}}]}"#.as_slice(),
            "-",
            &[],
        )
        .expect("labels are not read without watched keys");
        assert!(ignored[0].labels.is_empty());
    }

    #[test]
    fn errors_name_the_item() {
        let cases = [
            (r#"{"kind":"PodList","items":[]}"#, "expected kind NodeList"),
            (r#"{"kind":"NodeList"}"#, "NodeList without an items array"),
            (
                r#"{"kind":"List","items":[{"kind":"Pod","metadata":{"name":"a"}}]}"#,
                "items[0] is not a Node",
            ),
            (
                r#"{"kind":"List","items":[{"metadata":{"name":"a"}},{"metadata":{"name":7}}]}"#,
                "items[1]:",
            ),
            (
                r#"{"kind":"List","items":[{"metadata":{"name":"a"}},{"metadata":{}}]}"#,
                "items[1] has no metadata.name",
            ),
            (
                r#"{"kind":"List","items":[{"metadata":{"name":"b"}},{"metadata":{"name":"a"}},{"metadata":{"name":"a"}},{"metadata":{"name":"b"}}]}"#,
                "items[2]: duplicate Node name \"a\" (also items[1])",
            ),
            (
                r#"{"kind":"List","items":[{"metadata":{"name":"a"}},{"metadata":{"name":"a"}},{"metadata":{}}]}"#,
                "items[1]: duplicate",
            ),
            ("{\"kind\":\"List\",\"items\":[", "EOF while parsing"),
            ("{\"kind\":", "not JSON"),
            ("[]", "NodeList"),
        ];
        for (text, want) in cases {
            let error = read_nodes(text.as_bytes(), "-", &[]).expect_err(text);
            assert!(error.to_string().contains(want), "{text}: {error}");
            assert_eq!(error.exit_code(), 2, "{text}");
        }
        let single = read_nodes(
            br#"{"kind":"Node","metadata":{"name":"n","deletionTimestamp":"2024-01-01T00:00:00Z"},"spec":{"podCIDR":"10.0.0.0/24"}}"#.as_slice(),
            "-",
            &[],
        )
        .expect("a single Node");
        assert_eq!(single.len(), 1);
        assert!(single[0].deleting);
        assert_eq!(single[0].view().raw_pod_cidrs(), ["10.0.0.0/24"]);
    }
}
