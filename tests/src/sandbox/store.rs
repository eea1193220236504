//! The object store: objects, the global resourceVersion, the bounded change history that watches
//! and paginated lists read from, and the write pipeline (create/update/patch/apply/delete) with
//! kube-apiserver's rules.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use serde_json::{Map, Value, json};

use super::fields::{self, ManagedEntry};
use super::nodes;
use super::patch;
use super::resource::Resource;
use super::select::Selector;
use super::status::{self, ApiError};
use super::update::{self, Preconditions, meta_str};
use super::validate;

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

/// One committed change.
#[derive(Debug, Clone)]
pub struct Change {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Object key.
    pub key: Key,
    /// Event type.
    pub kind: ChangeType,
    /// Object after the change (for DELETED: the last state, with the deletion's resourceVersion).
    pub object: Value,
    /// Object before the change (`None` for ADDED).
    pub prev: Option<Value>,
}

#[derive(Debug, Clone)]
struct Stored {
    value: Value,
    managed: Vec<ManagedEntry>,
}

/// How the field ownership of a write is recorded.
pub enum Ownership {
    /// A non-apply write by this manager.
    Update(String),
    /// Entries already computed by server-side apply.
    Applied(Vec<ManagedEntry>),
}

/// Patch body types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
    /// `application/apply-patch+yaml` (JSON bodies only).
    Apply,
}

impl PatchType {
    /// From a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            "application/apply-patch+yaml" | "application/apply-patch+json" => {
                Some(PatchType::Apply)
            }
            _ => None,
        }
    }
}

/// List query parameters.
#[derive(Debug, Clone, Default)]
pub struct ListParams {
    /// `resourceVersion`.
    pub resource_version: Option<String>,
    /// `resourceVersionMatch`.
    pub resource_version_match: Option<String>,
    /// `limit` (0 = none).
    pub limit: usize,
    /// `continue`.
    pub continue_token: Option<String>,
    /// Label and field selectors.
    pub selector: Selector,
}

/// The store.
#[derive(Debug)]
pub struct Store {
    rv: u64,
    objects: BTreeMap<Key, Stored>,
    history: VecDeque<Change>,
    /// Watches and lists may start at any resourceVersion `>= compacted_rv`.
    compacted_rv: u64,
    history_limit: usize,
    namespaces: BTreeSet<String>,
    uid_seq: u64,
}

/// Current time as RFC 3339 with seconds (`metav1.Time`).
pub fn now_rfc3339() -> String {
    jiff::Timestamp::now()
        .round(jiff::Unit::Second)
        .map(|t| t.to_string())
        .unwrap_or_default()
}

fn meta(obj: &mut Value) -> &mut Map<String, Value> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj["metadata"] = json!({});
    }
    match obj.get_mut("metadata") {
        Some(Value::Object(m)) => m,
        _ => unreachable!("metadata was just made an object"),
    }
}

fn finalizers_empty(obj: &Value) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty)
}

fn to_hex(s: &str) -> String {
    s.bytes().map(|b| format!("{b:02x}")).collect()
}

fn from_hex(s: &str) -> Option<String> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let bytes: Option<Vec<u8>> = (0..s.len())
        .step_by(2)
        .map(|i| s.get(i..i + 2).and_then(|h| u8::from_str_radix(h, 16).ok()))
        .collect();
    String::from_utf8(bytes?).ok()
}

impl Store {
    /// An empty store; `history_limit` bounds the kept change history.
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

    /// Make a namespace exist.
    pub fn add_namespace(&mut self, ns: &str) {
        self.namespaces.insert(ns.to_owned());
    }

    /// Drop the whole change history: every resourceVersion before now becomes too old (410).
    pub fn compact(&mut self) {
        self.history.clear();
        self.compacted_rv = self.rv;
    }

    fn next_uid(&mut self) -> String {
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

    fn record(&mut self, key: Key, kind: ChangeType, object: Value, prev: Option<Value>) {
        self.history.push_back(Change {
            rv: self.rv,
            key,
            kind,
            object,
            prev,
        });
        while self.history.len() > self.history_limit {
            if let Some(old) = self.history.pop_front() {
                self.compacted_rv = old.rv;
            }
        }
    }

    /// Load initial objects (e.g. a fixture NodeList): system fields are reassigned, no history.
    ///
    /// # Errors
    /// The first object that cannot be stored (missing name, duplicate).
    pub fn load(&mut self, res: Resource, items: &[Value]) -> Result<(), ApiError> {
        for item in items {
            let mut obj = item.clone();
            if !obj.is_object() {
                return Err(ApiError::bad_request("list item is not an object"));
            }
            obj["apiVersion"] = json!(res.api_version());
            obj["kind"] = json!(res.kind());
            let name = meta_str(&obj, "name").to_owned();
            let ns = if res.namespaced() {
                meta_str(&obj, "namespace").to_owned()
            } else {
                String::new()
            };
            if name.is_empty() {
                return Err(ApiError::bad_request("list item has no metadata.name"));
            }
            let key = Key::new(res, &ns, &name);
            if self.objects.contains_key(&key) {
                return Err(ApiError::already_exists(res, &name));
            }
            if res == Resource::Nodes {
                nodes::normalize(&mut obj);
            }
            self.rv += 1;
            let uid = if meta_str(&obj, "uid").is_empty() {
                self.next_uid()
            } else {
                meta_str(&obj, "uid").to_owned()
            };
            let rv = self.rv;
            let m = meta(&mut obj);
            m.remove("managedFields");
            m.remove("selfLink");
            m.insert("uid".into(), json!(uid));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            if !m.contains_key("creationTimestamp") {
                m.insert("creationTimestamp".into(), json!(now_rfc3339()));
            }
            if !ns.is_empty() {
                self.namespaces.insert(ns);
            }
            self.objects.insert(
                key,
                Stored {
                    value: obj,
                    managed: Vec::new(),
                },
            );
        }
        self.compacted_rv = self.rv;
        self.history.clear();
        Ok(())
    }

    /// One object.
    pub fn get(&self, key: &Key) -> Option<&Value> {
        self.objects.get(key).map(|s| &s.value)
    }

    /// All objects of a resource (optionally one namespace), in key order.
    pub fn objects(&self, res: Resource, ns: Option<&str>) -> Vec<Value> {
        self.objects
            .iter()
            .filter(|(k, _)| k.res == res && ns.is_none_or(|n| k.ns == n))
            .map(|(_, s)| s.value.clone())
            .collect()
    }

    /// The state of one resource at `rv` (undoing history newer than `rv`).
    fn snapshot_at(&self, res: Resource, rv: u64) -> Result<BTreeMap<Key, Value>, ApiError> {
        if rv < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.compacted_rv
            )));
        }
        let mut state: BTreeMap<Key, Value> = self
            .objects
            .iter()
            .filter(|(k, _)| k.res == res)
            .map(|(k, s)| (k.clone(), s.value.clone()))
            .collect();
        for c in self.history.iter().rev().take_while(|c| c.rv > rv) {
            if c.key.res != res {
                continue;
            }
            match &c.prev {
                Some(p) => {
                    state.insert(c.key.clone(), p.clone());
                }
                None => {
                    state.remove(&c.key);
                }
            }
        }
        Ok(state)
    }

    /// LIST with resourceVersion semantics, pagination and selectors; returns a `*List` object.
    ///
    /// # Errors
    /// 410 Expired for a continue token or exact resourceVersion older than the history,
    /// 504 for a resourceVersion from the future, 400 for malformed parameters.
    pub fn list(&self, res: Resource, ns: Option<&str>, p: &ListParams) -> Result<Value, ApiError> {
        let (snapshot_rv, after): (u64, Option<(String, String)>) = match &p.continue_token {
            Some(tok) if !tok.is_empty() => {
                let decoded = from_hex(tok)
                    .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                let mut parts = decoded.splitn(3, '/');
                let rv: u64 = parts
                    .next()
                    .and_then(|r| r.parse().ok())
                    .ok_or_else(|| ApiError::bad_request("continue key is not valid"))?;
                let kns = parts.next().unwrap_or("").to_owned();
                let kname = parts.next().unwrap_or("").to_owned();
                if rv < self.compacted_rv {
                    return Err(ApiError::expired(
                        "The provided continue parameter is too old to display a consistent list result. You can start a new list without the continue parameter, or use the continue token in this response to retrieve the remainder of the results. Continuing with the provided token results in an inconsistent list - objects that were created, modified, or deleted between the time the first chunk was returned and now may show up in the list.",
                    ));
                }
                (rv, Some((kns, kname)))
            }
            _ => {
                let requested = match p.resource_version.as_deref() {
                    None | Some("") => None,
                    Some(s) => Some(s.parse::<u64>().map_err(|_| {
                        ApiError::bad_request(format!("invalid resource version: {s}"))
                    })?),
                };
                match (requested, p.resource_version_match.as_deref()) {
                    (Some(r), Some("Exact")) => {
                        if r > self.rv {
                            return Err(ApiError::timeout(format!(
                                "Too large resource version: {r}, current: {}",
                                self.rv
                            )));
                        }
                        (r, None)
                    }
                    (Some(r), _) if r > self.rv => {
                        return Err(ApiError::timeout(format!(
                            "Too large resource version: {r}, current: {}",
                            self.rv
                        )));
                    }
                    _ => (self.rv, None),
                }
            }
        };
        let state = self.snapshot_at(res, snapshot_rv)?;
        let mut items: Vec<(&Key, &Value)> = state
            .iter()
            .filter(|(k, _)| ns.is_none_or(|n| k.ns == n))
            .filter(|(k, _)| {
                after.as_ref().is_none_or(|(ans, aname)| {
                    (k.ns.as_str(), k.name.as_str()) > (ans.as_str(), aname.as_str())
                })
            })
            .filter(|(_, v)| p.selector.matches(v))
            .collect();
        let mut list_meta = json!({"resourceVersion": snapshot_rv.to_string()});
        if p.limit > 0 && items.len() > p.limit {
            let remaining = items.len() - p.limit;
            items.truncate(p.limit);
            if let Some((k, _)) = items.last() {
                list_meta["continue"] =
                    json!(to_hex(&format!("{snapshot_rv}/{}/{}", k.ns, k.name)));
            }
            if p.selector.is_empty() {
                list_meta["remainingItemCount"] = json!(remaining);
            }
        }
        let items: Vec<Value> = items
            .into_iter()
            .map(|(_, v)| {
                let mut v = v.clone();
                if let Value::Object(m) = &mut v {
                    m.remove("apiVersion");
                    m.remove("kind");
                }
                v
            })
            .collect();
        Ok(
            json!({"kind": res.list_kind(), "apiVersion": res.api_version(), "metadata": list_meta, "items": items}),
        )
    }

    /// Changes after `rv` of one resource (optionally one namespace).
    ///
    /// # Errors
    /// 410 Expired when `rv` is older than the kept history.
    pub fn changes_since(
        &self,
        res: Resource,
        ns: Option<&str>,
        rv: u64,
    ) -> Result<Vec<Change>, ApiError> {
        if rv < self.compacted_rv {
            return Err(ApiError::expired(format!(
                "too old resource version: {rv} ({})",
                self.compacted_rv
            )));
        }
        Ok(self
            .history
            .iter()
            .filter(|c| c.rv > rv && c.key.res == res && ns.is_none_or(|n| c.key.ns == n))
            .cloned()
            .collect())
    }

    fn check_kind(res: Resource, obj: &Value) -> Result<(), ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        if let Some(k) = obj.get("kind").and_then(Value::as_str)
            && !k.is_empty()
            && k != res.kind()
        {
            return Err(ApiError::bad_request(format!(
                "the kind of the object ({k}) does not match the resource ({})",
                res.kind()
            )));
        }
        if let Some(a) = obj.get("apiVersion").and_then(Value::as_str)
            && !a.is_empty()
            && a != res.api_version()
        {
            return Err(ApiError::bad_request(format!(
                "the API version in the data ({a}) does not match the expected API version ({})",
                res.api_version()
            )));
        }
        Ok(())
    }

    /// POST: create an object.
    ///
    /// # Errors
    /// 400 (bad body, name), 404 (namespace), 409 AlreadyExists, 422 Invalid.
    pub fn create(
        &mut self,
        res: Resource,
        ns: &str,
        body: Value,
        ownership: Ownership,
    ) -> Result<Value, ApiError> {
        Self::check_kind(res, &body)?;
        let mut obj = body;
        obj["apiVersion"] = json!(res.api_version());
        obj["kind"] = json!(res.kind());
        if res.namespaced() {
            let body_ns = meta_str(&obj, "namespace");
            if !body_ns.is_empty() && body_ns != ns {
                return Err(ApiError::bad_request(
                    "the namespace of the provided object does not match the namespace sent on the request",
                ));
            }
            if !self.namespaces.contains(ns) {
                return Err(ApiError::namespace_not_found(ns));
            }
        }
        let mut name = meta_str(&obj, "name").to_owned();
        if name.is_empty() {
            let generate = meta_str(&obj, "generateName").to_owned();
            if generate.is_empty() {
                return Err(ApiError::invalid(
                    res,
                    "",
                    vec![status::Cause::new(
                        "FieldValueRequired",
                        "metadata.name",
                        "Required value: name or generateName is required",
                    )],
                ));
            }
            name = format!(
                "{generate}{:05x}",
                (self.rv.wrapping_mul(2654435761)) & 0xfffff
            );
        }
        if !validate::is_dns_subdomain(&name) {
            return Err(ApiError::invalid(
                res,
                &name,
                vec![status::Cause::new(
                    "FieldValueInvalid",
                    "metadata.name",
                    format!(
                        "Invalid value: {name:?}: a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
                    ),
                )],
            ));
        }
        if !meta_str(&obj, "resourceVersion").is_empty() {
            return Err(ApiError::bad_request(
                "resourceVersion should not be set on objects to be created",
            ));
        }
        let uid = self.next_uid();
        {
            let m = meta(&mut obj);
            m.insert("name".into(), json!(name));
            if res.namespaced() {
                m.insert("namespace".into(), json!(ns));
            } else {
                m.remove("namespace");
            }
            for f in [
                "deletionTimestamp",
                "deletionGracePeriodSeconds",
                "managedFields",
                "selfLink",
                "generation",
            ] {
                m.remove(f);
            }
            m.insert("uid".into(), json!(uid));
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        }
        if res == Resource::Nodes {
            nodes::normalize(&mut obj);
        }
        let causes = validate::on_create(res, &obj);
        if !causes.is_empty() {
            return Err(ApiError::invalid(res, &name, causes));
        }
        let key = Key::new(res, if res.namespaced() { ns } else { "" }, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &name));
        }
        let now = now_rfc3339();
        let managed = match ownership {
            Ownership::Update(m) => {
                let mut entries = Vec::new();
                fields::record_update(&mut entries, &m, &json!({}), &obj, &now);
                entries
            }
            Ownership::Applied(e) => e,
        };
        self.rv += 1;
        let m = meta(&mut obj);
        m.insert("resourceVersion".into(), json!(self.rv.to_string()));
        if !managed.is_empty() {
            m.insert(
                "managedFields".into(),
                fields::render(&managed, res.api_version()),
            );
        }
        self.objects.insert(
            key.clone(),
            Stored {
                value: obj.clone(),
                managed,
            },
        );
        self.record(key, ChangeType::Added, obj.clone(), None);
        Ok(obj)
    }

    /// Current object or 404.
    fn existing(&self, key: &Key) -> Result<&Stored, ApiError> {
        self.objects
            .get(key)
            .ok_or_else(|| ApiError::not_found(key.res, &key.name))
    }

    /// PUT: replace an object.
    ///
    /// Runs the update rules of [`super::update`] with the body's uid as a storage precondition
    /// (a PUT whose `metadata.uid` differs from the stored one is **409 Conflict**, see
    /// [`update::check_preconditions`]).
    ///
    /// # Errors
    /// 400 (kind, name), 404, 409 Conflict (stale resourceVersion / uid precondition), 422 Invalid.
    pub fn update(
        &mut self,
        key: &Key,
        body: Value,
        subresource: Option<&str>,
        manager: &str,
    ) -> Result<Value, ApiError> {
        Self::check_kind(key.res, &body)?;
        let body_name = meta_str(&body, "name");
        if body_name != key.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        let preconditions = Preconditions::of_put_body(&body);
        self.commit_update(
            key,
            &preconditions,
            body,
            subresource,
            Ownership::Update(manager.to_owned()),
        )
    }

    /// PATCH: apply a patch of the given type to the stored object, then the update rules.
    ///
    /// As kube-apiserver's `patcher.applyPatch` (`apiserver/pkg/endpoints/handlers/patch.go`), a
    /// patch has no storage preconditions: a `metadata.uid` in the patch replaces the stored one
    /// in the patched object and is refused as an immutable-field change (**422 Invalid**, see
    /// [`update::validate_update`]). A non-apply patch of a missing object is **404 NotFound**
    /// (`createNewObject` of the json/smp patchers); an apply patch of a missing object creates
    /// it, unless it names a uid (**409 Conflict** `uid mismatch: the provided object specified
    /// uid X, and no existing object was found`).
    ///
    /// # Errors
    /// 404, 409 (stale resourceVersion, apply conflict, uid on create), 422, 400.
    pub fn patch(
        &mut self,
        key: &Key,
        ty: PatchType,
        body: &Value,
        subresource: Option<&str>,
        manager: &str,
        force: bool,
    ) -> Result<Value, ApiError> {
        let res = key.res;
        let none = Preconditions::default();
        if ty == PatchType::Apply {
            Self::check_kind(res, body)?;
            if body.get("apiVersion").and_then(Value::as_str).is_none()
                || body.get("kind").and_then(Value::as_str).is_none()
            {
                return Err(ApiError::bad_request(
                    "apiVersion and kind must be set in an apply patch",
                ));
            }
            let body_name = meta_str(body, "name");
            if !body_name.is_empty() && body_name != key.name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({})",
                    key.name
                )));
            }
            let now = now_rfc3339();
            let Some(stored) = self.objects.get(key) else {
                let uid = meta_str(body, "uid");
                if !uid.is_empty() {
                    return Err(ApiError::conflict(
                        res,
                        &key.name,
                        format!(
                            "uid mismatch: the provided object specified uid {uid}, and no existing object was found"
                        ),
                    ));
                }
                let mut entries = Vec::new();
                let mut seed = json!({"metadata": {"name": key.name}});
                let obj = fields::apply(&mut entries, manager, force, &seed, body, &now)
                    .map_err(|c| ApiError::apply_conflict(res, &key.name, &c))?;
                seed = obj;
                seed["metadata"]["name"] = json!(key.name);
                return self.create(res, &key.ns, seed, Ownership::Applied(entries));
            };
            let mut entries = stored.managed.clone();
            let live = stored.value.clone();
            let new = fields::apply(&mut entries, manager, force, &live, body, &now)
                .map_err(|c| ApiError::apply_conflict(res, &key.name, &c))?;
            return self.commit_update(key, &none, new, subresource, Ownership::Applied(entries));
        }
        let mut doc = self.existing(key)?.value.clone();
        match ty {
            PatchType::Strategic => patch::strategic_merge(res, &mut doc, body)?,
            PatchType::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut doc, body);
            }
            PatchType::Json => patch::json_patch(res, &key.name, &mut doc, body)?,
            PatchType::Apply => {}
        }
        // `checkName` in patch.go: the patched object must keep the URL's name.
        if meta_str(&doc, "name") != key.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({}) does not match the name on the URL ({})",
                meta_str(&doc, "name"),
                key.name
            )));
        }
        self.commit_update(
            key,
            &none,
            doc,
            subresource,
            Ownership::Update(manager.to_owned()),
        )
    }

    /// The update pipeline shared by PUT, PATCH and apply: the rules of [`super::update`] in
    /// kube-apiserver's order (`Store.Update` in `apiserver/pkg/registry/generic/registry/
    /// store.go`), then the field ownership, the no-op check and the write.
    fn commit_update(
        &mut self,
        key: &Key,
        preconditions: &Preconditions,
        candidate: Value,
        subresource: Option<&str>,
        ownership: Ownership,
    ) -> Result<Value, ApiError> {
        let res = key.res;
        let old = self.existing(key)?.clone();
        let mut new = candidate;
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        update::check_preconditions(key, &old.value, preconditions)?;
        update::check_resource_version(key, &new, &old.value)?;
        update::prepare_metadata(key, &mut new, &old.value)?;
        update::prepare_for_update(res, subresource, &mut new, &old.value);
        let causes = update::validate_update(res, &new, &old.value);
        if !causes.is_empty() {
            return Err(ApiError::invalid(res, &key.name, causes));
        }
        let managed = self.managed_after(&old, &new, ownership);
        if update::is_no_op(&new, &old.value, &managed, &old.managed) {
            return Ok(old.value);
        }
        if update::should_delete_during_update(&new) {
            self.rv += 1;
            meta(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
            self.objects.remove(key);
            self.record(
                key.clone(),
                ChangeType::Deleted,
                new.clone(),
                Some(old.value),
            );
            return Ok(new);
        }
        self.rv += 1;
        {
            let rv = self.rv;
            let m = meta(&mut new);
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            if !managed.is_empty() {
                m.insert(
                    "managedFields".into(),
                    fields::render(&managed, res.api_version()),
                );
            }
        }
        self.objects.insert(
            key.clone(),
            Stored {
                value: new.clone(),
                managed,
            },
        );
        self.record(
            key.clone(),
            ChangeType::Modified,
            new.clone(),
            Some(old.value),
        );
        Ok(new)
    }

    /// Field ownership after a write (`metadata.managedFields`): a non-apply write takes the
    /// fields it changed ([`fields::record_update`]); an apply has computed its entries already.
    fn managed_after(&self, old: &Stored, new: &Value, ownership: Ownership) -> Vec<ManagedEntry> {
        match ownership {
            Ownership::Update(manager) => {
                let mut e = old.managed.clone();
                fields::record_update(&mut e, &manager, &old.value, new, &now_rfc3339());
                e
            }
            Ownership::Applied(e) => e,
        }
    }

    /// DELETE: remove an object, or mark it (`deletionTimestamp`) while finalizers remain.
    ///
    /// Returns `(object or Status, removed_now)`.
    ///
    /// # Errors
    /// 404, 409 for failed `preconditions` (uid, resourceVersion) in the DeleteOptions body.
    pub fn delete(&mut self, key: &Key, options: &Value) -> Result<(Value, bool), ApiError> {
        let res = key.res;
        let old = self.existing(key)?.clone();
        update::check_preconditions(key, &old.value, &Preconditions::of_delete_options(options))?;
        let mut new = old.value.clone();
        if !finalizers_empty(&old.value) {
            if old.value.pointer("/metadata/deletionTimestamp").is_some() {
                return Ok((old.value, false));
            }
            self.rv += 1;
            let rv = self.rv;
            let m = meta(&mut new);
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            m.insert("resourceVersion".into(), json!(rv.to_string()));
            self.objects.insert(
                key.clone(),
                Stored {
                    value: new.clone(),
                    managed: old.managed,
                },
            );
            self.record(
                key.clone(),
                ChangeType::Modified,
                new.clone(),
                Some(old.value),
            );
            return Ok((new, false));
        }
        self.rv += 1;
        meta(&mut new).insert("resourceVersion".into(), json!(self.rv.to_string()));
        self.objects.remove(key);
        let uid = meta_str(&new, "uid").to_owned();
        self.record(key.clone(), ChangeType::Deleted, new, Some(old.value));
        Ok((status::success_status(res, &key.name, &uid), true))
    }
}
