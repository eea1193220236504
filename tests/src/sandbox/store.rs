//! The object store: objects, the global resourceVersion and the bounded change history that
//! watches and paginated lists read from. Reads are in [`super::list`], writes (create, update,
//! patch, delete with kube-apiserver's rules) in [`super::write`].
//!
//! Every object version is an `Arc<StoredObject>` ([`super::object`]) serialized once when written;
//! the store, list snapshots and the history share them. Every committed change goes through
//! `Store::commit`, which keeps the objects, the history, the Node counters and the commit
//! observers in step.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, OnceLock};

use bytes::Bytes;
use serde_json::Value;

use super::list::ListSnapshot;
use super::object::StoredObject;
use super::resource::Resource;

/// Key of a stored object: resource, namespace (`""` when cluster-scoped), name.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// The resource.
    pub res: Resource,
    /// Namespace, `""` for cluster-scoped objects.
    pub ns: String,
    /// Name.
    pub name: String,
}

impl Key {
    /// A key.
    pub fn new(res: Resource, ns: &str, name: &str) -> Self {
        Key {
            res,
            ns: ns.to_owned(),
            name: name.to_owned(),
        }
    }
}

/// Watch event type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeType {
    /// `ADDED`.
    Added,
    /// `MODIFIED`.
    Modified,
    /// `DELETED`.
    Deleted,
}

impl ChangeType {
    /// The watch event `type` string.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeType::Added => "ADDED",
            ChangeType::Modified => "MODIFIED",
            ChangeType::Deleted => "DELETED",
        }
    }
}

/// One committed change, as the watch history keeps it.
#[derive(Debug)]
pub struct Change {
    /// Event type.
    pub kind: ChangeType,
    /// Object after the change (for DELETED: the last state, with the deletion's resourceVersion).
    pub object: Arc<StoredObject>,
    /// Object before the change (`None` for ADDED).
    pub prev: Option<Arc<StoredObject>>,
    /// The watch line of this change with its own event type, built once for all watchers.
    line: OnceLock<Bytes>,
}

impl Change {
    /// resourceVersion of the change.
    pub fn rv(&self) -> u64 {
        self.object.rv()
    }

    /// Key of the changed object.
    pub fn key(&self) -> &Key {
        self.object.key()
    }

    /// `{"type":"<kind>","object":<object>}\n`, built on first use and shared.
    pub fn line(&self) -> Bytes {
        self.line
            .get_or_init(|| super::watch::event_line(self.kind.as_str(), &self.object))
            .clone()
    }
}

/// One committed write, as a commit observer sees it ([`Store::on_commit`]).
#[derive(Debug, Clone, Copy)]
pub struct Commit<'a> {
    /// The resource written.
    pub resource: Resource,
    /// The object's key.
    pub key: &'a Key,
    /// What the write was, as a watch reports it.
    pub change: ChangeType,
    /// The resourceVersion of the write (the store's resourceVersion right after it).
    pub resource_version: u64,
    /// The object before the write (`None` for a create).
    pub before: Option<&'a Value>,
    /// The object after the write, as stored (for a deletion: its last state, carrying the
    /// deletion's resourceVersion).
    pub after: &'a Value,
}

/// A commit observer: called for every committed write, in commit order, under the store lock.
pub type CommitObserver = Arc<dyn Fn(&Commit<'_>) + Send + Sync>;

/// The registered observers (a newtype for `Debug`).
#[derive(Default)]
pub(super) struct Observers(Vec<(u64, CommitObserver)>, u64);

impl std::fmt::Debug for Observers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Observers({})", self.0.len())
    }
}

/// Node counters the summary reads without walking the Nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeStats {
    /// Nodes stored.
    pub nodes: usize,
    /// Nodes with at least one `spec.podCIDRs` entry.
    pub with_pod_cidrs: usize,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    pub(super) rv: u64,
    pub(super) objects: BTreeMap<Key, Arc<StoredObject>>,
    pub(super) history: VecDeque<Arc<Change>>,
    /// Watches and lists may start at any resourceVersion `>= compacted_rv`.
    pub(super) compacted_rv: u64,
    pub(super) history_limit: usize,
    pub(super) namespaces: BTreeSet<String>,
    pub(super) uid_seq: u64,
    /// Snapshots of recent paginated lists, newest last (see [`super::list`]).
    pub(super) snapshots: VecDeque<Arc<ListSnapshot>>,
    pub(super) node_stats: NodeStats,
    pub(super) observers: Observers,
    /// Node podCIDRs validated strictly (see [`super::nodes::validate`]).
    pub(super) strict_cidrs: bool,
    /// ClusterCIDR updates checked by the CRD's rules (`false`: a CRD installed without them,
    /// see [`super::SandboxHandle::drop_cluster_cidr_rules`]).
    pub(super) cluster_cidr_rules: bool,
}

/// Current time as RFC 3339 with seconds (`metav1.Time`).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

impl Store {
    /// An empty store; `history_limit` bounds the kept change history (at least 1).
    pub fn new(history_limit: usize) -> Self {
        Store {
            rv: 1,
            objects: BTreeMap::new(),
            history: VecDeque::new(),
            compacted_rv: 1,
            history_limit: history_limit.max(1),
            namespaces: ["default", "kube-system", "kube-public", "kube-node-lease"]
                .into_iter()
                .map(str::to_owned)
                .collect(),
            uid_seq: 0,
            snapshots: VecDeque::new(),
            node_stats: NodeStats::default(),
            observers: Observers::default(),
            strict_cidrs: true,
            cluster_cidr_rules: true,
        }
    }

    /// Current resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.rv
    }

    /// Oldest resourceVersion a watch or an exact list may start from.
    pub fn compacted_rv(&self) -> u64 {
        self.compacted_rv
    }

    /// Node counters.
    pub fn node_stats(&self) -> NodeStats {
        self.node_stats
    }

    /// Make a namespace exist.
    pub fn add_namespace(&mut self, ns: &str) {
        self.namespaces.insert(ns.to_owned());
    }

    /// Drop the whole change history: every resourceVersion before now becomes too old (410).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
        self.snapshots.clear();
    }

    /// A new uid: `5a4db0c1-PPPP-4NNN-8NNN-NNNNNNNNNNNN` (PPPP from the process id, N a counter).
    pub(super) fn next_uid(&mut self) -> String {
        self.uid_seq += 1;
        let n = self.uid_seq;
        let salt = std::process::id() as u64;
        format!(
            "5a4db0c1-{:04x}-4{:03x}-8{:03x}-{:012x}",
            salt & 0xffff,
            (n >> 12) & 0xfff,
            n & 0xfff,
            n
        )
    }

    fn count(&mut self, obj: &StoredObject, sign: isize) {
        if obj.resource() != Resource::Nodes {
            return;
        }
        let add = |n: &mut usize| *n = n.saturating_add_signed(sign);
        add(&mut self.node_stats.nodes);
        if obj.pod_cidr_count() > 0 {
            add(&mut self.node_stats.with_pod_cidrs);
        }
    }

    /// Store an object without a change record (initial load).
    pub(super) fn insert_loaded(&mut self, obj: Arc<StoredObject>) {
        self.count(&obj, 1);
        if let Some(old) = self.objects.insert(obj.key().clone(), obj) {
            self.count(&old, -1);
        }
    }

    /// Register a commit observer: from now on `f` is called for every committed write (create,
    /// update, patch, delete — not the initial load), in commit order, synchronously under
    /// the store lock, before the writer gets its answer and before any watcher sees the change.
    /// So `f` sees every state the store passes through. It must be quick and must not use the
    /// sandbox (its handle or its API: the store is locked). Returns an id for
    /// [`Store::remove_commit_observer`].
    pub fn on_commit(&mut self, f: CommitObserver) -> u64 {
        self.observers.1 += 1;
        let id = self.observers.1;
        self.observers.0.push((id, f));
        id
    }

    /// Unregister a commit observer; `false` if there is none with this id.
    pub fn remove_commit_observer(&mut self, id: u64) -> bool {
        let before = self.observers.0.len();
        self.observers.0.retain(|(i, _)| *i != id);
        self.observers.0.len() != before
    }

    /// Commit one change at the current resourceVersion (the caller has bumped `self.rv` and
    /// built `object` at it from `values.1`, the object before being `values.0`): tell the
    /// observers, store or remove the object, append the change to the history (dropping the
    /// oldest beyond the limit, which moves `compacted_rv`), update the counters.
    pub(super) fn commit(
        &mut self,
        kind: ChangeType,
        object: Arc<StoredObject>,
        prev: Option<Arc<StoredObject>>,
        values: (Option<&Value>, &Value),
    ) {
        if !self.observers.0.is_empty() {
            let commit = Commit {
                resource: object.resource(),
                key: object.key(),
                change: kind,
                resource_version: object.rv(),
                before: values.0,
                after: values.1,
            };
            for (_, f) in &self.observers.0 {
                f(&commit);
            }
        }
        if let Some(p) = &prev {
            self.count(p, -1);
        }
        match kind {
            ChangeType::Deleted => {
                self.objects.remove(object.key());
            }
            ChangeType::Added | ChangeType::Modified => {
                self.count(&object, 1);
                self.objects
                    .insert(object.key().clone(), Arc::clone(&object));
            }
        }
        self.history.push_back(Arc::new(Change {
            kind,
            object,
            prev,
            line: OnceLock::new(),
        }));
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv();
            }
        }
        let compacted = self.compacted_rv;
        self.snapshots.retain(|s| s.rv() >= compacted);
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<&Arc<StoredObject>> {
        self.objects.get(key)
    }

    /// The stored objects of a resource (optionally one namespace), in key order.
    pub fn stored(
        &self,
        res: Resource,
        ns: Option<&str>,
    ) -> impl Iterator<Item = &Arc<StoredObject>> + '_ {
        let start = Key::new(res, ns.unwrap_or(""), "");
        let ns = ns.map(str::to_owned);
        self.objects
            .range(start..)
            .take_while(move |(k, _)| k.res == res && ns.as_deref().is_none_or(|n| k.ns == n))
            .map(|(_, o)| o)
    }

    /// All objects of a resource (optionally one namespace), in key order, parsed (for tests).
    pub fn objects(&self, res: Resource, ns: Option<&str>) -> Vec<Value> {
        self.stored(res, ns).map(|o| o.to_value()).collect()
    }

    /// Changes after `rv` of one resource (optionally one namespace), oldest first.
    ///
    /// # Errors
    /// 410 Expired when `rv` is older than the kept history.
    pub fn changes_since(
        &self,
        res: Resource,
        ns: Option<&str>,
        rv: u64,
    ) -> Result<Vec<Arc<Change>>, super::status::ApiError> {
        if rv < self.compacted_rv {
            return Err(super::status::ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.compacted_rv
            )));
        }
        let first = self.history.partition_point(|c| c.rv() <= rv);
        Ok(self
            .history
            .range(first..)
            .filter(|c| c.key().res == res && ns.is_none_or(|n| c.key().ns == n))
            .cloned()
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn node(name: &str, rv: u64, cidrs: &[&str]) -> Arc<StoredObject> {
        let v = json!({"metadata": {"name": name, "resourceVersion": rv.to_string()},
            "spec": {"podCIDRs": cidrs}});
        StoredObject::new(Key::new(Resource::Nodes, "", name), rv, &v, Vec::new())
    }

    #[test]
    fn commits_keep_counters_history_and_compaction_in_step() {
        let mut s = Store::new(2);
        s.insert_loaded(node("a", 2, &[]));
        s.rv = 2;
        s.compacted_rv = 2;
        assert_eq!(
            s.node_stats(),
            NodeStats {
                nodes: 1,
                with_pod_cidrs: 0
            }
        );
        let before = Arc::clone(s.get(&Key::new(Resource::Nodes, "", "a")).expect("a"));
        s.rv = 3;
        let v = json!({});
        s.commit(
            ChangeType::Modified,
            node("a", 3, &["10.0.0.0/24"]),
            Some(before),
            (None, &v),
        );
        s.rv = 4;
        s.commit(ChangeType::Added, node("b", 4, &[]), None, (None, &v));
        assert_eq!(
            s.node_stats(),
            NodeStats {
                nodes: 2,
                with_pod_cidrs: 1
            }
        );
        let b = Arc::clone(s.get(&Key::new(Resource::Nodes, "", "b")).expect("b"));
        s.rv = 5;
        s.commit(ChangeType::Deleted, node("b", 5, &[]), Some(b), (None, &v));
        assert_eq!(
            s.node_stats(),
            NodeStats {
                nodes: 1,
                with_pod_cidrs: 1
            }
        );
        // Limit 2: the first change fell out, so resourceVersion 3 is the oldest usable.
        assert_eq!(s.compacted_rv(), 3);
        assert!(s.changes_since(Resource::Nodes, None, 2).is_err());
        let rvs: Vec<u64> = s
            .changes_since(Resource::Nodes, None, 3)
            .expect("kept")
            .iter()
            .map(|c| c.rv())
            .collect();
        assert_eq!(rvs, [4, 5]);
        let line = s.history[0].line();
        let ev: Value = serde_json::from_slice(&line).expect("json line");
        assert_eq!(
            (ev["type"].as_str(), ev["object"]["kind"].as_str()),
            (Some("ADDED"), Some("Node"))
        );
    }
}
