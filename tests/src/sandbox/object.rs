//! One stored version of an object, kept compactly: its JSON is serialized once, when the version
//! is written, and the version is shared (`Arc`) by the store, list snapshots and the watch
//! history. A LIST page, a GET answer and a watch event copy those bytes; none serializes the
//! object again. A real AWS Node (fixture 05) is ~3 KB as JSON and ~16 KB as a `serde_json::Value`,
//! so 50,000 Nodes take ~150 MB here instead of ~800 MB.
//!
//! The bytes are the *list item* form — the object without `apiVersion` and `kind`, as
//! kube-apiserver encodes the items of a typed list — and the full form (GET, watch events) is that
//! with `{"apiVersion":…,"kind":…,` put in front.

use std::sync::Arc;

use bytes::Bytes;
use serde::ser::{Serialize, SerializeMap, Serializer};
use serde_json::{Map, Value};

use super::fields::ManagedEntry;
use super::resource::Resource;
use super::store::Key;

/// One version of an object (see the module doc).
#[derive(Debug)]
pub struct StoredObject {
    key: Key,
    rv: u64,
    uid: String,
    pod_cidr_count: usize,
    deleting: bool,
    managed: Vec<ManagedEntry>,
    item: Bytes,
}

/// Serializes an object map without its `apiVersion` and `kind` (no copy of the map).
struct WithoutTypeMeta<'a>(&'a Map<String, Value>);

impl Serialize for WithoutTypeMeta<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let fields = self
            .0
            .iter()
            .filter(|(k, _)| k.as_str() != "apiVersion" && k.as_str() != "kind");
        let mut map = serializer.serialize_map(None)?;
        for (k, v) in fields {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl StoredObject {
    /// Store `value` (the full object, its `metadata.resourceVersion` already `rv`) as version
    /// `rv` of `key` with field ownership `managed`. A value that is not a JSON object is stored as
    /// `{}` (the store only writes objects).
    pub fn new(key: Key, rv: u64, value: &Value, managed: Vec<ManagedEntry>) -> Arc<Self> {
        let empty = Map::new();
        let map = value.as_object().unwrap_or(&empty);
        let mut item = serde_json::to_vec(&WithoutTypeMeta(map)).unwrap_or_else(|_| b"{}".to_vec());
        // `to_vec` grows by doubling: do not keep up to twice the JSON for the object's life.
        item.shrink_to_fit();
        let meta = |f: &str| value.get("metadata").and_then(|m| m.get(f));
        Arc::new(StoredObject {
            uid: meta("uid")
                .and_then(Value::as_str)
                .unwrap_or_default()
                .to_owned(),
            deleting: meta("deletionTimestamp").is_some_and(|t| !t.is_null()),
            pod_cidr_count: value
                .pointer("/spec/podCIDRs")
                .and_then(Value::as_array)
                .map_or(0, Vec::len),
            key,
            rv,
            managed,
            item: Bytes::from(item),
        })
    }

    /// The object's key.
    pub fn key(&self) -> &Key {
        &self.key
    }

    /// Its resource.
    pub fn resource(&self) -> Resource {
        self.key.res
    }

    /// The resourceVersion of this version.
    pub fn rv(&self) -> u64 {
        self.rv
    }

    /// `metadata.uid`.
    pub fn uid(&self) -> &str {
        &self.uid
    }

    /// Number of `spec.podCIDRs` entries (Nodes; 0 for other resources).
    pub fn pod_cidr_count(&self) -> usize {
        self.pod_cidr_count
    }

    /// Whether `metadata.deletionTimestamp` is set.
    pub fn deleting(&self) -> bool {
        self.deleting
    }

    /// Field ownership (`metadata.managedFields`, already rendered into the JSON).
    pub fn managed(&self) -> &[ManagedEntry] {
        &self.managed
    }

    /// The list item JSON (no `apiVersion`/`kind`).
    pub fn item_json(&self) -> &[u8] {
        &self.item
    }

    /// Size of the stored JSON in bytes.
    pub fn json_len(&self) -> usize {
        self.item.len()
    }

    /// Append the full object JSON (with `apiVersion` and `kind`) to `out`.
    pub fn write_json(&self, out: &mut Vec<u8>) {
        let res = self.key.res;
        out.reserve(self.item.len() + 48);
        out.extend_from_slice(b"{\"apiVersion\":\"");
        out.extend_from_slice(res.api_version().as_bytes());
        out.extend_from_slice(b"\",\"kind\":\"");
        out.extend_from_slice(res.kind().as_bytes());
        out.push(b'"');
        match self.item.get(1..) {
            Some(rest) if self.item.len() > 2 => {
                out.push(b',');
                out.extend_from_slice(rest);
            }
            _ => out.push(b'}'),
        }
    }

    /// The full object JSON.
    pub fn to_json(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_json(&mut out);
        out
    }

    /// The full object as a `serde_json::Value` (parses the stored JSON: for writes, selectors and
    /// test inspection, not for serving reads).
    pub fn to_value(&self) -> Value {
        let mut v: Value =
            serde_json::from_slice(&self.item).unwrap_or_else(|_| Value::Object(Map::new()));
        if let Some(m) = v.as_object_mut() {
            m.insert("apiVersion".into(), Value::from(self.key.res.api_version()));
            m.insert("kind".into(), Value::from(self.key.res.kind()));
        }
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn item_and_full_json_round_trip() {
        let node = json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "n1", "uid": "u1", "resourceVersion": "7"},
            "spec": {"podCIDRs": ["10.0.0.0/24", "fd00::/64"]}});
        let obj = StoredObject::new(Key::new(Resource::Nodes, "", "n1"), 7, &node, Vec::new());
        let item: Value = serde_json::from_slice(obj.item_json()).expect("item json");
        assert!(item.get("apiVersion").is_none() && item.get("kind").is_none());
        assert_eq!(item["metadata"], node["metadata"]);
        let full: Value = serde_json::from_slice(&obj.to_json()).expect("full json");
        assert_eq!(full, node);
        assert_eq!(obj.to_value(), node);
        assert_eq!(
            (obj.uid(), obj.rv(), obj.pod_cidr_count(), obj.deleting()),
            ("u1", 7, 2, false)
        );
        let lease = StoredObject::new(
            Key::new(Resource::Leases, "ns", "l"),
            2,
            &json!({}),
            Vec::new(),
        );
        let full: Value = serde_json::from_slice(&lease.to_json()).expect("full json");
        assert_eq!(
            full,
            json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease"})
        );
    }
}
