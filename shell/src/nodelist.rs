//! Reading Nodes from `kubectl get nodes -o json` output (a `NodeList`, a `List` of Nodes, or a
//! single `Node`) with k8s-openapi's types.

use k8s_openapi::api::core::v1::Node;
use serde_json::Value;

use crate::Error;

/// Parses a NodeList (`kind: NodeList` or `List`, `items: [Node…]`) or a single Node, in order.
/// Items without `apiVersion`/`kind` (as the API server lists them) are accepted.
///
/// # Errors
/// [`Error::InvalidNodeList`] for anything else, naming the item that failed.
pub fn parse_nodes(text: &str) -> Result<Vec<Node>, Error> {
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
