//! Patch types: JSON merge patch (RFC 7386), JSON patch (RFC 6902) and a strategic merge patch
//! that covers what Nodes, Leases and Events need.
//!
//! Strategic merge coverage (apimachinery `strategicpatch` semantics):
//! - maps merge recursively; `null` deletes a key; `$patch: replace` replaces a map, `$patch: delete`
//!   deletes it; `$retainKeys` keeps only the listed keys;
//! - lists without a patch strategy (e.g. `spec.taints`) are replaced atomically;
//! - lists of scalars with `patchStrategy: merge` (`spec.podCIDRs`, `metadata.finalizers`) are a
//!   de-duplicated union, ordered like apimachinery's `mergeSlice` + `normalizeElementOrder`
//!   (items present in the patch keep patch order and come before server-only items unless the
//!   server list orders them); an empty patch list leaves the server list unchanged;
//!   `$deleteFromPrimitiveList/<key>` removes items, `$setElementOrder/<key>` reorders;
//! - lists of maps with a merge key (`status.conditions`/`status.addresses` by `type`,
//!   `metadata.ownerReferences` by `uid`, `status.volumesAttached` by `name`) merge element-wise by
//!   that key, `$patch: delete` inside an element removes it.
//!
//! Not covered: `$patch: merge` on lists of maps with `$patch: replace` directives nested in list
//! elements, retainKeys on lists, and the schema of types other than Node/Lease/Event.

use serde_json::{Map, Value};

use super::resource::Resource;
use super::status::ApiError;

/// The patch strategy of a list field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ListStrategy {
    /// Atomic list: the patch value replaces it.
    Replace,
    /// `patchStrategy: merge` on a list of scalars.
    MergePrimitive,
    /// `patchStrategy: merge` with `patchMergeKey`.
    MergeKey(&'static str),
}

fn list_strategy(res: Resource, path: &[String]) -> ListStrategy {
    let p: Vec<&str> = path.iter().map(String::as_str).collect();
    match (res, p.as_slice()) {
        (_, ["metadata", "finalizers"]) => ListStrategy::MergePrimitive,
        (_, ["metadata", "ownerReferences"]) => ListStrategy::MergeKey("uid"),
        (Resource::Nodes, ["spec", "podCIDRs"]) => ListStrategy::MergePrimitive,
        (Resource::Nodes, ["status", "conditions"]) => ListStrategy::MergeKey("type"),
        (Resource::Nodes, ["status", "addresses"]) => ListStrategy::MergeKey("type"),
        (Resource::Nodes, ["status", "volumesAttached"]) => ListStrategy::MergeKey("name"),
        _ => ListStrategy::Replace,
    }
}

/// Apply a strategic merge patch `patch` to `doc` for resource `res`.
///
/// # Errors
/// 400 BadRequest if the patch is not a JSON object or a directive is malformed.
pub fn strategic_merge(res: Resource, doc: &mut Value, patch: &Value) -> Result<(), ApiError> {
    let Value::Object(p) = patch else {
        return Err(ApiError::bad_request(
            "strategic merge patch must be a JSON object",
        ));
    };
    if !doc.is_object() {
        *doc = Value::Object(Map::new());
    }
    if let Value::Object(d) = doc {
        merge_map(res, d, p, &mut Vec::new())?;
    }
    Ok(())
}

fn is_directive(k: &str) -> bool {
    k.starts_with('$')
}

fn strip_directives(v: &Value) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !is_directive(k))
                .map(|(k, v)| (k.clone(), strip_directives(v)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(strip_directives).collect()),
        other => other.clone(),
    }
}

fn merge_map(
    res: Resource,
    doc: &mut Map<String, Value>,
    patch: &Map<String, Value>,
    path: &mut Vec<String>,
) -> Result<(), ApiError> {
    if let Some(d) = patch.get("$patch") {
        match d.as_str() {
            Some("replace") => {
                *doc = match strip_directives(&Value::Object(patch.clone())) {
                    Value::Object(m) => m,
                    _ => Map::new(),
                };
                return Ok(());
            }
            Some("merge") => {}
            Some("delete") => {
                doc.clear();
                return Ok(());
            }
            _ => return Err(ApiError::bad_request(format!("unknown patch type: {d}"))),
        }
    }
    let mut orders: Vec<(String, Vec<Value>)> = Vec::new();
    for (k, v) in patch {
        if let Some(list_key) = k.strip_prefix("$setElementOrder/") {
            let Value::Array(order) = v else {
                return Err(ApiError::bad_request(format!("{k} must be a list")));
            };
            orders.push((list_key.to_owned(), order.clone()));
            continue;
        }
        if let Some(list_key) = k.strip_prefix("$deleteFromPrimitiveList/") {
            let Value::Array(remove) = v else {
                return Err(ApiError::bad_request(format!("{k} must be a list")));
            };
            if let Some(Value::Array(items)) = doc.get_mut(list_key) {
                items.retain(|i| !remove.contains(i));
            }
            continue;
        }
        if is_directive(k) {
            continue;
        }
        path.push(k.clone());
        match v {
            Value::Null => {
                doc.remove(k);
            }
            Value::Object(pm) => {
                if pm.get("$patch").and_then(Value::as_str) == Some("delete") {
                    doc.remove(k);
                } else {
                    let entry = doc
                        .entry(k.clone())
                        .or_insert_with(|| Value::Object(Map::new()));
                    if !entry.is_object() {
                        *entry = Value::Object(Map::new());
                    }
                    if let Value::Object(dm) = entry {
                        merge_map(res, dm, pm, path)?;
                    }
                }
            }
            Value::Array(pa) => {
                let merged = match (list_strategy(res, path), doc.get(k)) {
                    (ListStrategy::Replace, _) | (_, None) | (_, Some(Value::Null)) => {
                        let stripped: Vec<Value> = pa
                            .iter()
                            .filter(|e| e.get("$patch").and_then(Value::as_str) != Some("delete"))
                            .map(strip_directives)
                            .collect();
                        stripped
                    }
                    (ListStrategy::MergePrimitive, Some(Value::Array(orig))) => {
                        merge_primitive_list(orig, pa)
                    }
                    (ListStrategy::MergeKey(key), Some(Value::Array(orig))) => {
                        merge_keyed_list(res, orig, pa, key, path)?
                    }
                    (_, Some(_)) => pa.iter().map(strip_directives).collect(),
                };
                doc.insert(k.clone(), Value::Array(merged));
            }
            scalar => {
                doc.insert(k.clone(), scalar.clone());
            }
        }
        path.pop();
    }
    if let Some(Value::Array(keep)) = patch.get("$retainKeys") {
        let keep: Vec<&str> = keep.iter().filter_map(Value::as_str).collect();
        doc.retain(|k, _| keep.contains(&k.as_str()));
    }
    for (list_key, order) in orders {
        if let Some(Value::Array(items)) = doc.get_mut(&list_key) {
            let key = match list_strategy(res, &[path.clone(), vec![list_key.clone()]].concat()) {
                ListStrategy::MergeKey(k) => Some(k),
                _ => None,
            };
            let pos = |v: &Value| {
                order.iter().position(|o| match key {
                    Some(k) => o.get(k) == v.get(k),
                    None => o == v,
                })
            };
            // Stable sort: ordered items first in `order`'s order, others keep their place after.
            let mut indexed: Vec<(usize, usize, Value)> = items
                .drain(..)
                .enumerate()
                .map(|(i, v)| (pos(&v).unwrap_or(usize::MAX), i, v))
                .collect();
            indexed.sort_by_key(|(p, i, _)| (*p, *i));
            items.extend(indexed.into_iter().map(|(_, _, v)| v));
        }
    }
    Ok(())
}

/// apimachinery `mergeSortedSlice`: interleave server-only items (in server order) with patch
/// items (in patch order); a server item goes first only when both are in the server list and
/// the server item is earlier there.
fn merge_sorted<F: Fn(&Value, &Value) -> bool>(
    left: Vec<Value>,
    right: Vec<Value>,
    server: &[Value],
    same: F,
) -> Vec<Value> {
    let index = |v: &Value| server.iter().position(|s| same(s, v));
    let mut out = Vec::with_capacity(left.len() + right.len());
    let (mut l, mut r) = (left.into_iter().peekable(), right.into_iter().peekable());
    loop {
        match (l.peek(), r.peek()) {
            (None, None) => break,
            (Some(_), None) => out.extend(l.by_ref()),
            (None, Some(_)) => out.extend(r.by_ref()),
            (Some(a), Some(b)) => {
                let left_first = matches!((index(a), index(b)), (Some(ia), Some(ib)) if ia < ib);
                let next = if left_first { l.next() } else { r.next() };
                out.extend(next);
            }
        }
    }
    out
}

fn merge_primitive_list(orig: &[Value], patch: &[Value]) -> Vec<Value> {
    if patch.is_empty() {
        return orig.to_vec();
    }
    let mut patch_items: Vec<Value> = Vec::new();
    for p in patch {
        if !patch_items.contains(p) {
            patch_items.push(p.clone());
        }
    }
    let mut server_only: Vec<Value> = Vec::new();
    for o in orig {
        if !patch_items.contains(o) && !server_only.contains(o) {
            server_only.push(o.clone());
        }
    }
    merge_sorted(server_only, patch_items, orig, |a, b| a == b)
}

fn merge_keyed_list(
    res: Resource,
    orig: &[Value],
    patch: &[Value],
    key: &str,
    path: &mut Vec<String>,
) -> Result<Vec<Value>, ApiError> {
    let mut result: Vec<Value> = orig.to_vec();
    let mut patch_keys: Vec<Value> = Vec::new();
    for p in patch {
        let Some(pk) = p.get(key).cloned() else {
            return Err(ApiError::bad_request(format!(
                "map in list {} has no merge key {key}",
                path.join(".")
            )));
        };
        let delete = p.get("$patch").and_then(Value::as_str) == Some("delete");
        let pos = result.iter().position(|o| o.get(key) == Some(&pk));
        match (pos, delete) {
            (Some(i), true) => {
                result.remove(i);
            }
            (None, true) => {}
            (Some(i), false) => {
                if let (Some(Value::Object(om)), Value::Object(pm)) = (result.get_mut(i), p) {
                    merge_map(res, om, pm, path)?;
                }
                patch_keys.push(pk);
            }
            (None, false) => {
                result.push(strip_directives(p));
                patch_keys.push(pk);
            }
        }
    }
    let (in_patch, server_only): (Vec<Value>, Vec<Value>) = result
        .into_iter()
        .partition(|v| v.get(key).is_some_and(|k| patch_keys.contains(k)));
    let mut in_patch_ordered = Vec::new();
    for k in &patch_keys {
        if let Some(v) = in_patch.iter().find(|v| v.get(key) == Some(k))
            && !in_patch_ordered.contains(v)
        {
            in_patch_ordered.push(v.clone());
        }
    }
    Ok(merge_sorted(server_only, in_patch_ordered, orig, |a, b| {
        a.get(key) == b.get(key)
    }))
}

/// Apply an RFC 7386 JSON merge patch.
pub fn merge_patch(doc: &mut Value, patch: &Value) {
    json_patch::merge(doc, patch);
}

/// Apply an RFC 6902 JSON patch.
///
/// # Errors
/// 400 BadRequest if the body is not a patch, 422 if an operation fails (as kube-apiserver does).
pub fn json_patch(
    res: Resource,
    name: &str,
    doc: &mut Value,
    patch: &Value,
) -> Result<(), ApiError> {
    let ops: json_patch::Patch = serde_json::from_value(patch.clone())
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    json_patch::patch(doc, &ops).map_err(|e| {
        ApiError::invalid(
            res,
            name,
            vec![super::status::Cause::new(
                "FieldValueInvalid",
                "",
                e.to_string(),
            )],
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn smp(res: Resource, mut doc: Value, patch: Value) -> Value {
        strategic_merge(res, &mut doc, &patch).expect("patch applies");
        doc
    }

    #[test]
    fn primitive_merge_list_cases() {
        let cases = [
            (
                json!({}),
                json!({"spec":{"podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":["a"]}}),
            ),
            (
                json!({"spec":{"podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":["a","b"]}}),
                json!({"spec":{"podCIDRs":["a","b"]}}),
            ),
            // apimachinery puts new patch items before server-only items.
            (
                json!({"spec":{"podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":["b"]}}),
                json!({"spec":{"podCIDRs":["b","a"]}}),
            ),
            (
                json!({"spec":{"podCIDRs":["a","b"]}}),
                json!({"spec":{"podCIDRs":["b"]}}),
                json!({"spec":{"podCIDRs":["a","b"]}}),
            ),
            (
                json!({"spec":{"podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":[]}}),
                json!({"spec":{"podCIDRs":["a"]}}),
            ),
            (
                json!({"spec":{"podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":null}}),
                json!({"spec":{}}),
            ),
            (
                json!({"spec":{"podCIDRs":["a","b"]}}),
                json!({"spec":{"$deleteFromPrimitiveList/podCIDRs":["a"]}}),
                json!({"spec":{"podCIDRs":["b"]}}),
            ),
            (
                json!({"spec":{"taints":[{"key":"a"}]}}),
                json!({"spec":{"taints":[{"key":"b"}]}}),
                json!({"spec":{"taints":[{"key":"b"}]}}),
            ),
            (
                json!({"metadata":{"finalizers":["x","y"]}}),
                json!({"metadata":{"finalizers":null}}),
                json!({"metadata":{}}),
            ),
            (
                json!({"spec":{"a":1,"b":2}}),
                json!({"spec":{"$patch":"replace","c":3}}),
                json!({"spec":{"c":3}}),
            ),
        ];
        for (doc, patch, want) in cases {
            assert_eq!(
                smp(Resource::Nodes, doc.clone(), patch.clone()),
                want,
                "doc {doc} patch {patch}"
            );
        }
    }

    #[test]
    fn keyed_list_merges_by_type() {
        let doc = json!({"status":{"conditions":[{"type":"Ready","status":"False"},{"type":"Mem","status":"False"}]}});
        let patch = json!({"status":{"conditions":[{"type":"Ready","status":"True"},{"type":"Disk","status":"False"}]}});
        let got = smp(Resource::Nodes, doc, patch);
        let types: Vec<&str> = got["status"]["conditions"]
            .as_array()
            .map(|a| a.iter().filter_map(|c| c["type"].as_str()).collect())
            .unwrap_or_default();
        // apimachinery: a new patch item is placed before the remaining server-only items.
        assert_eq!(types, ["Ready", "Disk", "Mem"]);
        assert_eq!(got["status"]["conditions"][0]["status"], "True");
    }

    #[test]
    fn lease_null_deletes_fields() {
        let doc = json!({"spec":{"holderIdentity":"a","renewTime":"t","leaseTransitions":1}});
        let patch = json!({"spec":{"holderIdentity":null,"renewTime":null}});
        assert_eq!(
            smp(Resource::Leases, doc, patch),
            json!({"spec":{"leaseTransitions":1}})
        );
    }
}
