//! Reading Nodes from `kubectl get nodes -o json` output (a `NodeList`, a `List` of Nodes, or a
//! single `Node`) with k8s-openapi's types.

use std::collections::HashMap;

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::Error;

/// Parses a NodeList (`kind: NodeList` or `List`, `items: [Node…]`) or a single Node, in order.
/// Items without `apiVersion`/`kind` (as the API server lists them) are accepted.
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
