//! Many copies of one real Node, for scale runs: `count` Nodes named `<prefix>-<i>`
//! (`i` = 0…count−1) from one Node of a fixture, each with its own uid and without podCIDRs, loaded
//! one at a time (the copies are never all in memory as `serde_json::Value`s).

use std::path::Path;

use serde_json::Value;

/// `count` copies of `template` named `<prefix>-<i>` (see the module doc).
#[derive(Debug, Clone, PartialEq)]
pub struct Replicas {
    /// The Node copied.
    pub template: Value,
    /// Name prefix.
    pub prefix: String,
    /// Number of copies.
    pub count: usize,
}

/// The metadata fields the API server sets itself, which a create request built from a stored
/// Node must not carry over: `uid`, `resourceVersion`, `creationTimestamp`, `managedFields`,
/// `generation`, the deletion fields and `selfLink`.
pub const SERVER_SET_METADATA: [&str; 8] = [
    "uid",
    "resourceVersion",
    "creationTimestamp",
    "managedFields",
    "generation",
    "deletionTimestamp",
    "deletionGracePeriodSeconds",
    "selfLink",
];

/// `node` without the [`SERVER_SET_METADATA`] fields; everything else (name, spec with any
/// podCIDRs, status) kept. A value without an object `metadata` is returned unchanged.
pub fn without_server_set_metadata(node: &Value) -> Value {
    let mut node = node.clone();
    if let Some(meta) = node.get_mut("metadata").and_then(Value::as_object_mut) {
        for key in SERVER_SET_METADATA {
            meta.remove(key);
        }
    }
    node
}

/// A new Node from `template`: named `name` (also its `kubernetes.io/hostname` label when the
/// template has one), without the [`SERVER_SET_METADATA`] fields and without `spec.podCIDR` and
/// `spec.podCIDRs` (the store fills in a fresh uid and creationTimestamp).
pub fn renamed_node(template: &Value, name: &str) -> Value {
    let mut node = without_server_set_metadata(template);
    if let Some(meta) = node.get_mut("metadata").and_then(Value::as_object_mut) {
        meta.insert("name".into(), Value::String(name.to_owned()));
        if let Some(labels) = meta.get_mut("labels").and_then(Value::as_object_mut)
            && labels.contains_key("kubernetes.io/hostname")
        {
            labels.insert(
                "kubernetes.io/hostname".into(),
                Value::String(name.to_owned()),
            );
        }
    }
    if let Some(spec) = node.get_mut("spec").and_then(Value::as_object_mut) {
        spec.remove("podCIDR");
        spec.remove("podCIDRs");
    }
    node
}

/// Errors reading a `--replicate` argument.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ReplicateError {
    /// Not `FILE:INDEX:COUNT[:PREFIX]`.
    #[error("expected FILE:INDEX:COUNT[:PREFIX], got {0:?}")]
    Syntax(String),
    /// The file cannot be read or is not JSON.
    #[error("cannot load {path}: {reason}")]
    File {
        /// The file.
        path: String,
        /// Why.
        reason: String,
    },
    /// The file has no Node at that index.
    #[error("{path} has no items[{index}] ({len} items)")]
    Index {
        /// The file.
        path: String,
        /// Requested index.
        index: usize,
        /// Items in the file.
        len: usize,
    },
}

impl Replicas {
    /// The `i`-th copy: [`renamed_node`] of the template, named `<prefix>-<i>`.
    pub fn node(&self, i: usize) -> Value {
        renamed_node(&self.template, &format!("{}-{i}", self.prefix))
    }

    /// Parse `FILE:INDEX:COUNT[:PREFIX]` (the `--replicate` flag): `items[INDEX]` of the NodeList
    /// in FILE, COUNT copies, names `<PREFIX>-<i>`; `default_prefix` when PREFIX is omitted (a
    /// PREFIX of digits only is read as COUNT).
    ///
    /// # Errors
    /// [`ReplicateError`] for bad syntax, an unreadable file or a missing index.
    pub fn parse_arg(arg: &str, default_prefix: &str) -> Result<Self, ReplicateError> {
        let syntax = || ReplicateError::Syntax(arg.to_owned());
        let mut parts: Vec<&str> = arg.rsplitn(4, ':').collect();
        parts.reverse();
        let is_num = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        let (file, index, count, prefix) = match parts.as_slice() {
            [f, i, c, p] if is_num(i) && is_num(c) && !is_num(p) => (*f, *i, *c, *p),
            [f, i, c, p] if is_num(c) && is_num(p) => {
                (&arg[..f.len() + 1 + i.len()], *c, *p, default_prefix)
            }
            [f, i, c] if is_num(i) && is_num(c) => (*f, *i, *c, default_prefix),
            _ => return Err(syntax()),
        };
        let index: usize = index.parse().map_err(|_| syntax())?;
        let count: usize = count.parse().map_err(|_| syntax())?;
        let doc = read_json(Path::new(file))?;
        let items = doc.get("items").and_then(Value::as_array);
        let template =
            items
                .and_then(|a| a.get(index))
                .cloned()
                .ok_or_else(|| ReplicateError::Index {
                    path: file.to_owned(),
                    index,
                    len: items.map_or(0, Vec::len),
                })?;
        Ok(Replicas {
            template,
            prefix: prefix.to_owned(),
            count,
        })
    }
}

fn read_json(path: &Path) -> Result<Value, ReplicateError> {
    let err = |reason: String| ReplicateError::File {
        path: path.display().to_string(),
        reason,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fixture_path() -> String {
        format!(
            "{}/../fixtures/nodes/05-aws-4nodes-no-podcidr.json",
            env!("CARGO_MANIFEST_DIR")
        )
    }

    #[test]
    fn copies_are_renamed_without_uid_and_pod_cidrs() {
        let r = Replicas::parse_arg(&format!("{}:1:3", fixture_path()), "node").expect("parses");
        assert_eq!((r.prefix.as_str(), r.count), ("node", 3));
        let original = r.template.clone();
        let copy = r.node(2);
        assert_eq!(copy["metadata"]["name"], "node-2");
        assert!(copy["metadata"].get("uid").is_none());
        assert!(copy["spec"].get("podCIDR").is_none() && copy["spec"].get("podCIDRs").is_none());
        assert_eq!(
            copy["status"], original["status"],
            "the real Node's status is kept"
        );
        if original["metadata"]["labels"]
            .get("kubernetes.io/hostname")
            .is_some()
        {
            assert_eq!(
                copy["metadata"]["labels"]["kubernetes.io/hostname"],
                "node-2"
            );
        }
        let named = Replicas::parse_arg(&format!("{}:0:10:aws", fixture_path()), "node")
            .expect("with prefix");
        assert_eq!((named.prefix.as_str(), named.count), ("aws", 10));
    }

    #[test]
    fn bad_arguments_are_reported() {
        let p = fixture_path();
        assert!(matches!(
            Replicas::parse_arg("just-a-file", "n"),
            Err(ReplicateError::Syntax(_))
        ));
        assert!(matches!(
            Replicas::parse_arg(&format!("{p}:9:3"), "n"),
            Err(ReplicateError::Index {
                index: 9,
                len: 4,
                ..
            })
        ));
        assert!(matches!(
            Replicas::parse_arg("/nonexistent.json:0:3", "n"),
            Err(ReplicateError::File { .. })
        ));
    }
}
