//! Field ownership (`metadata.managedFields`) of writes.
//!
//! Every write the sandbox serves is a non-apply write (create, update, patch; server-side apply
//! is refused with 415, see [`super::write::PatchType`]), so every entry is an `Update` entry.
//! Ownership is tracked per manager on leaf paths: scalars and lists (atomic) under every
//! top-level field except `apiVersion`, `kind` and `metadata` (of which only `labels`,
//! `annotations`, `finalizers` and `ownerReferences` are tracked). The rule, as
//! structured-merge-diff applies it to an update: manager M takes every leaf the write changed
//! (M/Update owns it, every other entry loses it); leaves that disappear lose all owners.
//!
//! Not covered: list element ownership (`k:`/`v:` keys): lists are atomic leaves here.

use std::collections::{BTreeMap, BTreeSet};

use serde_json::{Map, Value, json};

/// A field path from the object root, e.g. `["spec", "holderIdentity"]`.
pub type FieldPath = Vec<String>;

/// One `metadata.managedFields` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ManagedEntry {
    /// Field manager name.
    pub manager: String,
    /// RFC 3339 time of the last change of this entry.
    pub time: String,
    /// Owned leaf paths (scalars and atomic lists).
    pub fields: BTreeSet<FieldPath>,
}

fn tracked(path: &[String]) -> bool {
    match path.first().map(String::as_str) {
        None | Some("apiVersion") | Some("kind") => false,
        Some("metadata") => matches!(
            path.get(1).map(String::as_str),
            Some("labels" | "annotations" | "finalizers" | "ownerReferences")
        ),
        Some(_) => true,
    }
}

/// All tracked leaves of `obj` with their values.
pub fn leaves(obj: &Value) -> BTreeMap<FieldPath, Value> {
    fn walk(v: &Value, path: &mut FieldPath, out: &mut BTreeMap<FieldPath, Value>) {
        match v {
            Value::Object(m)
                if !(path.len() == 2 && path[0] == "metadata" && path[1] == "finalizers") =>
            {
                for (k, child) in m {
                    path.push(k.clone());
                    walk(child, path, out);
                    path.pop();
                }
            }
            Value::Null => {}
            other => {
                if tracked(path) {
                    out.insert(path.clone(), other.clone());
                }
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(obj, &mut Vec::new(), &mut out);
    out
}

/// The tracked leaf at `path` in `obj`, if there is one (as [`leaves`] would list it).
fn leaf_at<'a>(obj: &'a Value, path: &[String]) -> Option<&'a Value> {
    if !tracked(path) {
        return None;
    }
    let mut cur = obj;
    for seg in path {
        cur = cur.as_object()?.get(seg)?;
    }
    let finalizers = path.len() == 2 && path[0] == "metadata" && path[1] == "finalizers";
    match cur {
        Value::Null => None,
        Value::Object(_) if !finalizers => None,
        leaf => Some(leaf),
    }
}

/// Tracked leaves of `new` whose value differs from `old`'s (`old` = the same place in the old
/// object), walking only the subtrees that differ.
fn changed_leaves(
    old: Option<&Value>,
    new: &Value,
    path: &mut FieldPath,
    out: &mut BTreeSet<FieldPath>,
) {
    if old == Some(new) {
        return;
    }
    match new {
        Value::Object(m)
            if !(path.len() == 2 && path[0] == "metadata" && path[1] == "finalizers") =>
        {
            let old_map = old.and_then(Value::as_object);
            for (k, child) in m {
                path.push(k.clone());
                changed_leaves(old_map.and_then(|o| o.get(k)), child, path, out);
                path.pop();
            }
        }
        Value::Null => {}
        _ => {
            if tracked(path) {
                out.insert(path.clone());
            }
        }
    }
}

/// Record a write by `manager` that turned `old` into `new`.
///
/// Cost: the subtrees that differ plus one lookup per owned path (not a walk of both objects).
pub fn record_update(
    entries: &mut Vec<ManagedEntry>,
    manager: &str,
    old: &Value,
    new: &Value,
    now: &str,
) {
    let mut changed: BTreeSet<FieldPath> = BTreeSet::new();
    changed_leaves(Some(old), new, &mut Vec::new(), &mut changed);
    for e in entries.iter_mut() {
        e.fields
            .retain(|p| leaf_at(new, p).is_some() && !changed.contains(p));
    }
    if !changed.is_empty() {
        match entries.iter_mut().find(|e| e.manager == manager) {
            Some(e) => {
                e.fields.extend(changed);
                e.time = now.to_owned();
            }
            None => entries.push(ManagedEntry {
                manager: manager.to_owned(),
                time: now.to_owned(),
                fields: changed,
            }),
        }
    }
    entries.retain(|e| !e.fields.is_empty());
}

/// Render entries as `metadata.managedFields` (`fieldsType: FieldsV1`).
pub fn render(entries: &[ManagedEntry], api_version: &str) -> Value {
    let list: Vec<Value> = entries
        .iter()
        .map(|e| {
            let mut root = Map::new();
            for p in &e.fields {
                let mut cur = &mut root;
                for seg in p {
                    let next = cur
                        .entry(format!("f:{seg}"))
                        .or_insert_with(|| Value::Object(Map::new()));
                    if !next.is_object() {
                        *next = Value::Object(Map::new());
                    }
                    match next {
                        Value::Object(m) => cur = m,
                        _ => break,
                    }
                }
            }
            json!({
                "manager": e.manager,
                "operation": "Update",
                "apiVersion": api_version,
                "time": e.time,
                "fieldsType": "FieldsV1",
                "fieldsV1": Value::Object(root),
            })
        })
        .collect();
    Value::Array(list)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The diff walk of `record_update` finds exactly the leaves whose value changed (the
    /// definition over [`leaves`]).
    #[test]
    fn changed_leaves_match_the_leaf_definition() {
        let old = json!({"metadata": {"labels": {"a": "1", "b": "2"}, "finalizers": ["x"]},
            "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [{"key": "k"}], "x": {"y": 1}}});
        let new = json!({"metadata": {"labels": {"a": "1", "c": "3"}, "finalizers": ["x", "y"]},
            "spec": {"podCIDRs": ["10.0.0.0/24"], "taints": [], "x": 5, "z": null}});
        let mut got = BTreeSet::new();
        changed_leaves(Some(&old), &new, &mut Vec::new(), &mut got);
        let before = leaves(&old);
        let want: BTreeSet<FieldPath> = leaves(&new)
            .into_iter()
            .filter(|(p, v)| before.get(p) != Some(v))
            .map(|(p, _)| p)
            .collect();
        assert_eq!(got, want);
        assert_eq!(got.len(), 4, "{got:?}");
        for (p, v) in leaves(&new) {
            assert_eq!(leaf_at(&new, &p), Some(&v), "{p:?}");
        }
        assert_eq!(leaf_at(&new, &["spec".into(), "z".into()]), None);
        assert_eq!(leaf_at(&old, &["spec".into(), "x".into()]), None);
    }

    #[test]
    fn update_takes_ownership_and_removal_frees() {
        let mut entries = Vec::new();
        let live = json!({"spec": {}});
        let a = json!({"spec": {"holderIdentity": "a", "renewTime": "t1"}});
        record_update(&mut entries, "a", &live, &a, "now");
        let b = json!({"spec": {"holderIdentity": "b", "renewTime": "t1"}});
        record_update(&mut entries, "b", &a, &b, "now");
        let owned = |m: &str| -> Vec<FieldPath> {
            entries
                .iter()
                .filter(|e| e.manager == m)
                .flat_map(|e| e.fields.iter().cloned())
                .collect()
        };
        let path = |leaf: &str| vec!["spec".to_owned(), leaf.to_owned()];
        assert_eq!(owned("a"), [path("renewTime")]);
        assert_eq!(owned("b"), [path("holderIdentity")]);
        record_update(&mut entries, "c", &b, &live, "now");
        assert!(entries.is_empty());
    }
}
