//! Reading Nodes from `kubectl get nodes -o json` output (a `NodeList`, a `List` of Nodes, or a
//! single `Node`).
//!
//! [`read_nodes`] streams: it deserialises `items` one Node at a time into the controller's own
//! slim Node ([`SlimNode`], what the informer deserialises from the API server) and keeps of each
//! only the informer cache's compact entry ([`CachedNode`]: uid, podCIDRs, deleting, the watched
//! labels), so a NodeList of any size is never held whole (300,000 Nodes of several kB each
//! would take gigabytes as JSON values) and `plan` reads Nodes exactly as the controller does.
//! [`parse_nodes`] still gives k8s-openapi `Node`s, for callers that need whole objects.

use std::collections::HashMap;
use std::fmt;
use std::io::Read;
use std::sync::Arc;

use k8s_openapi::api::core::v1::Node;
use serde::Deserializer;
use serde::de::{self, DeserializeSeed, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use crate::Error;
use crate::controller::node::{CachedNode, MetaFields, NodeFields, SlimNode, SpecFields};
use crate::reconcile::{NodeName, NodeView};

/// One Node of the input: its name and the informer cache's compact entry for it
/// ([`CachedNode`], 88 bytes, with only the labels whose keys [`read_nodes`] was given).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InputNode {
    /// `metadata.name`.
    pub name: NodeName,
    /// What the controller's cache keeps of the Node.
    pub node: CachedNode,
}

impl InputNode {
    /// The compact copy of `node`, keeping only the labels whose keys are in `label_keys` (as
    /// the informer's cache does).
    pub fn of(node: &SlimNode, label_keys: &[Arc<str>]) -> InputNode {
        InputNode {
            name: node.name().into(),
            node: CachedNode::of(node, label_keys),
        }
    }

    /// [`InputNode::of`] a whole k8s-openapi Node (what [`read_nodes`] gives for its JSON).
    pub fn from_node(node: &Node, label_keys: &[Arc<str>]) -> InputNode {
        InputNode::of(&SlimNode::from_node(node), label_keys)
    }

    /// The allocator's view of this Node.
    pub fn view(&self) -> NodeView {
        self.node.view(&self.name)
    }

    /// Whether the Node has any podCIDR set.
    pub fn has_pod_cidrs(&self) -> bool {
        !self.node.needs_pod_cidrs()
    }
}

/// The `items` array (or `null`, read as absent), each element read as a [`SlimNode`] and
/// reduced at once to an [`InputNode`] in `out`.
struct ItemsSeed<'a> {
    out: &'a mut Vec<InputNode>,
    keys: &'a [Arc<str>],
}

impl<'de> DeserializeSeed<'de> for ItemsSeed<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_option(self)
    }
}

impl<'de> Visitor<'de> for ItemsSeed<'_> {
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
        deserializer.deserialize_seq(self)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        let mut index = 0usize;
        loop {
            let item = match seq.next_element::<NodeFields>() {
                Ok(Some(item)) => item,
                Ok(None) => return Ok(()),
                Err(e) => return Err(de::Error::custom(format!("items[{index}]: {e}"))),
            };
            if item.kind.as_deref().is_some_and(|k| k != "Node") {
                return Err(de::Error::custom(format!("items[{index}] is not a Node")));
            }
            self.out
                .push(InputNode::of(&SlimNode::from(item), self.keys));
            index += 1;
        }
    }
}

/// The top-level object: `kind`, `items` (streamed), and for a single Node its `metadata`/`spec`.
#[derive(Default)]
struct Document {
    kind: Option<String>,
    items: Option<Vec<InputNode>>,
    metadata: Option<MetaFields>,
    spec: Option<SpecFields>,
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
                    map.next_value_seed(ItemsSeed {
                        out: &mut items,
                        keys: self.keys,
                    })?;
                    doc.items = Some(items);
                }
                // Kept only for a single Node; a list's own metadata is small.
                "metadata" => doc.metadata = map.next_value()?,
                "spec" => doc.spec = map.next_value()?,
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(doc)
    }
}

/// Reads a NodeList (`kind: NodeList` or `List`, `items: [Node…]`) or a single Node from `reader`,
/// streaming (see the module documentation), in list order, with the same rules as
/// [`parse_nodes`]: every Node has a non-empty `metadata.name`, unique in the list. Of each
/// Node's labels only those whose keys are in `label_keys` are kept
/// ([`crate::node_pools::Sizing::label_keys`]: the node-pool rules' and `--node-selector`'s).
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
        "Node" => {
            let fields = NodeFields {
                kind: None,
                metadata: doc.metadata,
                spec: doc.spec,
            };
            vec![InputNode::of(&SlimNode::from(fields), &keys)]
        }
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
    /// [`InputNode::from_node`] of the whole Node each time.
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
            let nodes = parse_nodes(&text).expect("parses whole");
            let whole: Vec<NodeView> = nodes.iter().map(NodeView::from_node).collect();
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
                let shared: Vec<Arc<str>> = keys.iter().map(|k| k.as_str().into()).collect();
                let reduced: Vec<InputNode> = nodes
                    .iter()
                    .map(|n| InputNode::from_node(n, &shared))
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

    /// Watched labels: a repeated key keeps its last value, `null` labels are none; unwatched
    /// labels are not kept. A label that is not a string is an error naming the item, watched or
    /// not (the API never serves one; the informer reads Nodes the same way).
    #[test]
    fn labels_are_read_only_for_watched_keys() {
        let keys = ["b".to_owned(), "a".to_owned()];
        let nodes = read_nodes(
            br#"{"kind":"List","items":[
                {"metadata":{"name":"x","labels":{"a":"1","c":"unwatched","b":"2","a":"3"}}},
                {"metadata":{"name":"y","labels":null}},
                {"metadata":{"labels":{"b":"only"},"name":"z"}}]}"#
                .as_slice(),
            "-",
            &keys,
        )
        .expect("reads");
        let labels: Vec<Vec<(&str, &str)>> = nodes
            .iter()
            .map(|n| n.node.labels.iter().map(|(k, v)| (&**k, &**v)).collect())
            .collect();
        assert_eq!(
            labels,
            [vec![("b", "2"), ("a", "3")], vec![], vec![("b", "only")]]
        );
        assert!(
            Arc::ptr_eq(&nodes[0].node.labels[0].0, &nodes[2].node.labels[0].0),
            "keys are shared"
        );
        let error = read_nodes(
            br#"{"kind":"List","items":[{"metadata":{"name":"x","labels":{"a":7}}}]}"#.as_slice(),
            "-",
            &keys,
        )
        .expect_err("a watched label must be a string");
        assert!(error.to_string().contains("items[0]:"), "{error}");
        let unwatched = read_nodes(
            br#"{"kind":"List","items":[{"metadata":{"name":"x","labels":{"c":7}}}]}"#.as_slice(),
            "-",
            &keys,
        )
        .expect_err("every label must be a string");
        assert!(unwatched.to_string().contains("items[0]:"), "{unwatched}");
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
        assert!(single[0].node.deleting);
        assert_eq!(single[0].view().raw_pod_cidrs(), ["10.0.0.0/24"]);
    }
}
