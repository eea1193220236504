//! The write pipeline of the store: load, create, update (PUT), patch (strategic / merge / JSON)
//! and delete, with kube-apiserver's rules ([`super::update`] for updates). Server-side apply is
//! not served (see [`PatchType`]); every write records `Update` field ownership ([`fields`]).
//!
//! A write parses the stored JSON of the object it changes once, works on `serde_json::Value`s and
//! serializes the result once into a new [`StoredObject`] version.

use std::sync::Arc;

use serde_json::{Map, Value, json};

use super::fields::{self, ManagedEntry};
use super::object::StoredObject;
use super::patch;
use super::resource::Resource;
use super::status::{self, ApiError};
use super::store::{ChangeType, Key, Store, now_rfc3339};
use super::update::{self, Preconditions, meta_str};
use super::validate;
use super::{cluster_cidrs, nodes};

/// Patch body types the sandbox serves. Server-side apply (`application/apply-patch+yaml`) is not
/// one of them: the controller never sends it, and its request gets **415 UnsupportedMediaType**
/// like any other unknown patch type ([`ApiError::unsupported_media_type`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchType {
    /// `application/strategic-merge-patch+json`.
    Strategic,
    /// `application/merge-patch+json`.
    Merge,
    /// `application/json-patch+json`.
    Json,
}

impl PatchType {
    /// From a `Content-Type` header value.
    pub fn from_content_type(ct: &str) -> Option<Self> {
        match ct.split(';').next().unwrap_or("").trim() {
            "application/strategic-merge-patch+json" => Some(PatchType::Strategic),
            "application/merge-patch+json" => Some(PatchType::Merge),
            "application/json-patch+json" => Some(PatchType::Json),
            _ => None,
        }
    }
}

/// What a DELETE did.
#[derive(Debug)]
pub enum Deleted {
    /// Finalizers remain: the object got a `deletionTimestamp` (or already had one) and stays.
    Marked(Arc<StoredObject>),
    /// The object is gone; the `Status` of success kube-apiserver answers with.
    Removed(Value),
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

/// Set `metadata.resourceVersion` (and `managedFields` when there are entries) in `obj` and store
/// it as a version.
fn versioned(key: &Key, rv: u64, obj: &mut Value, managed: Vec<ManagedEntry>) -> Arc<StoredObject> {
    let m = meta(obj);
    m.insert("resourceVersion".into(), json!(rv.to_string()));
    if managed.is_empty() {
        m.remove("managedFields");
    } else {
        m.insert(
            "managedFields".into(),
            fields::render(&managed, key.res.api_version()),
        );
    }
    StoredObject::new(key.clone(), rv, obj, managed)
}

impl Store {
    /// Load initial objects (e.g. a fixture NodeList): system fields are reassigned (a missing
    /// uid or creationTimestamp is filled in, managedFields dropped), each object gets its own
    /// resourceVersion, no history.
    ///
    /// # Errors
    /// The first object that cannot be stored (not an object, missing name, duplicate).
    pub fn load(&mut self, res: Resource, items: &[Value]) -> Result<(), ApiError> {
        for item in items {
            self.load_one(res, item.clone())?;
        }
        self.end_load();
        Ok(())
    }

    /// End a load: the history starts after the loaded objects.
    pub fn end_load(&mut self) {
        self.compacted_rv = self.rv;
        self.history.clear();
        self.snapshots.clear();
    }

    /// Load one object (see [`Store::load`]); end the load with [`Store::end_load`].
    ///
    /// # Errors
    /// As [`Store::load`].
    pub fn load_one(&mut self, res: Resource, mut obj: Value) -> Result<(), ApiError> {
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
        let m = meta(&mut obj);
        m.remove("selfLink");
        m.insert("uid".into(), json!(uid));
        if !m.contains_key("creationTimestamp") {
            m.insert("creationTimestamp".into(), json!(now_rfc3339()));
        }
        if !ns.is_empty() {
            self.namespaces.insert(ns);
        }
        let stored = versioned(&key, self.rv, &mut obj, Vec::new());
        self.insert_loaded(stored);
        Ok(())
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

    /// POST: create an object; `manager` owns every field it sets.
    ///
    /// # Errors
    /// 400 (bad body, name), 404 (namespace), 409 AlreadyExists, 422 Invalid.
    pub fn create(
        &mut self,
        res: Resource,
        ns: &str,
        body: Value,
        manager: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
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
            nodes::convert(&mut obj);
        }
        if res == Resource::ClusterCidrs {
            cluster_cidrs::prepare_for_create(&mut obj);
        }
        let causes = validate::on_create(res, &obj, self.strict_cidrs);
        if !causes.is_empty() {
            return Err(ApiError::invalid(res, &name, causes));
        }
        let key = Key::new(res, if res.namespaced() { ns } else { "" }, &name);
        if self.objects.contains_key(&key) {
            return Err(ApiError::already_exists(res, &name));
        }
        let mut managed = Vec::new();
        fields::record_update(&mut managed, manager, &json!({}), &obj, &now_rfc3339());
        self.rv += 1;
        let stored = versioned(&key, self.rv, &mut obj, managed);
        self.commit(ChangeType::Added, Arc::clone(&stored), None, (None, &obj));
        Ok(stored)
    }

    /// Current object or 404.
    fn existing(&self, key: &Key) -> Result<Arc<StoredObject>, ApiError> {
        self.objects
            .get(key)
            .cloned()
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
    ) -> Result<Arc<StoredObject>, ApiError> {
        Self::check_kind(key.res, &body)?;
        let body_name = meta_str(&body, "name");
        if body_name != key.name {
            return Err(ApiError::bad_request(format!(
                "the name of the object ({body_name}) does not match the name on the URL ({})",
                key.name
            )));
        }
        let preconditions = Preconditions::of_put_body(&body);
        let old = self.existing(key)?;
        let old_value = old.to_value();
        self.commit_update(
            key,
            &preconditions,
            (&old, old_value),
            body,
            subresource,
            manager,
        )
    }

    /// PATCH: apply a patch of the given type to the stored object, then the update rules.
    ///
    /// As kube-apiserver's `patcher.applyPatch` (`apiserver/pkg/endpoints/handlers/patch.go`), a
    /// patch has no storage preconditions: a `metadata.uid` in the patch replaces the stored one
    /// in the patched object and is refused as an immutable-field change (**422 Invalid**, see
    /// [`update::validate_update`]). A patch of a missing object is **404 NotFound**
    /// (`createNewObject` of the json/smp patchers).
    ///
    /// # Errors
    /// 404, 409 (stale resourceVersion), 422, 400.
    pub fn patch(
        &mut self,
        key: &Key,
        ty: PatchType,
        body: &Value,
        subresource: Option<&str>,
        manager: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let res = key.res;
        let old = self.existing(key)?;
        let old_value = old.to_value();
        let mut doc = old_value.clone();
        match ty {
            PatchType::Strategic => patch::strategic_merge(res, &mut doc, body)?,
            PatchType::Merge => {
                if !body.is_object() {
                    return Err(ApiError::bad_request("merge patch must be a JSON object"));
                }
                patch::merge_patch(&mut doc, body);
            }
            PatchType::Json => patch::json_patch(res, &key.name, &mut doc, body)?,
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
            &Preconditions::default(),
            (&old, old_value),
            doc,
            subresource,
            manager,
        )
    }

    /// The update pipeline shared by PUT and PATCH: the rules of [`super::update`] in
    /// kube-apiserver's order (`Store.Update` in `apiserver/pkg/registry/generic/registry/
    /// store.go`), then the field ownership (`manager` takes what the write changed), the no-op
    /// check and the write. `old` is the stored version and its parsed value.
    fn commit_update(
        &mut self,
        key: &Key,
        preconditions: &Preconditions,
        old: (&Arc<StoredObject>, Value),
        candidate: Value,
        subresource: Option<&str>,
        manager: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let res = key.res;
        let (old, old_value) = old;
        let mut new = candidate;
        if !new.is_object() {
            return Err(ApiError::bad_request(
                "the body of the request must be a JSON object",
            ));
        }
        update::check_preconditions(key, &old_value, preconditions)?;
        update::check_resource_version(key, &new, &old_value)?;
        update::prepare_metadata(key, &mut new, &old_value)?;
        update::prepare_for_update(res, subresource, &mut new, &old_value);
        let causes = if res == Resource::ClusterCidrs && !self.cluster_cidr_rules {
            validate::object_meta_update(&new, &old_value)
        } else {
            update::validate_update(res, &new, &old_value, self.strict_cidrs)
        };
        if !causes.is_empty() {
            return Err(ApiError::invalid(res, &key.name, causes));
        }
        let mut managed = old.managed().to_vec();
        fields::record_update(&mut managed, manager, &old_value, &new, &now_rfc3339());
        if update::is_no_op(&new, &old_value, &managed, old.managed()) {
            return Ok(Arc::clone(old));
        }
        self.rv += 1;
        let kind = if update::should_delete_during_update(&new) {
            ChangeType::Deleted
        } else {
            ChangeType::Modified
        };
        let stored = versioned(key, self.rv, &mut new, managed);
        self.commit(
            kind,
            Arc::clone(&stored),
            Some(Arc::clone(old)),
            (Some(&old_value), &new),
        );
        Ok(stored)
    }

    /// DELETE: remove an object, or mark it (`deletionTimestamp`) while finalizers remain.
    ///
    /// # Errors
    /// 404, 409 for failed `preconditions` (uid, resourceVersion) in the DeleteOptions body
    /// ([`update::check_preconditions`]).
    pub fn delete(&mut self, key: &Key, options: &Value) -> Result<Deleted, ApiError> {
        let res = key.res;
        let old = self.existing(key)?;
        let old_value = old.to_value();
        update::check_preconditions(key, &old_value, &Preconditions::of_delete_options(options))?;
        let mut new = old_value.clone();
        if !finalizers_empty(&old_value) {
            if old.deleting() {
                return Ok(Deleted::Marked(old));
            }
            self.rv += 1;
            let m = meta(&mut new);
            // `markAsDeleting`: an object that counts generations gets a new one.
            if let Some(generation) = m.get("generation").and_then(Value::as_i64)
                && generation > 0
            {
                m.insert("generation".into(), json!(generation + 1));
            }
            m.insert("deletionTimestamp".into(), json!(now_rfc3339()));
            m.insert("deletionGracePeriodSeconds".into(), json!(0));
            let stored = versioned(key, self.rv, &mut new, old.managed().to_vec());
            self.commit(
                ChangeType::Modified,
                Arc::clone(&stored),
                Some(old),
                (Some(&old_value), &new),
            );
            return Ok(Deleted::Marked(stored));
        }
        self.rv += 1;
        let uid = old.uid().to_owned();
        let stored = versioned(key, self.rv, &mut new, old.managed().to_vec());
        self.commit(
            ChangeType::Deleted,
            stored,
            Some(old),
            (Some(&old_value), &new),
        );
        Ok(Deleted::Removed(status::success_status(
            res, &key.name, &uid,
        )))
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::sandbox::store::{Commit, CommitObserver};

    type Seen = Vec<(ChangeType, u64, Option<Value>, Value)>;

    fn observe(store: &mut Store) -> Arc<Mutex<Seen>> {
        let seen: Arc<Mutex<Seen>> = Arc::default();
        let sink = Arc::clone(&seen);
        let f: CommitObserver = Arc::new(move |c: &Commit<'_>| {
            assert_eq!(
                c.key.name,
                c.after["metadata"]["name"].as_str().unwrap_or("")
            );
            if let Ok(mut s) = sink.lock() {
                s.push((
                    c.change,
                    c.resource_version,
                    c.before.map(|b| b["spec"].clone()),
                    c.after["spec"].clone(),
                ));
            }
        });
        store.on_commit(f);
        seen
    }

    #[test]
    fn observers_see_every_commit_in_order_with_before_and_after() {
        let mut store = Store::new(100);
        let seen = observe(&mut store);
        let key = Key::new(Resource::Nodes, "", "n1");
        let node = json!({"metadata": {"name": "n1", "finalizers": ["f"]}, "spec": {}});
        let created = store
            .create(Resource::Nodes, "", node, "t")
            .expect("create");
        let cidrs = json!({"spec": {"podCIDRs": ["10.0.0.0/24"]}});
        store
            .patch(&key, PatchType::Strategic, &cidrs, None, "t")
            .expect("patch");
        // A no-op and a refused write are not commits.
        store
            .patch(&key, PatchType::Strategic, &cidrs, None, "t")
            .expect("no-op");
        // Both fields: `podCIDRs` alone would be overruled by the stored `podCIDR` (the v1
        // conversion makes it authoritative) and be a no-op.
        let other = json!({"spec": {"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.1.0/24"]}});
        assert!(
            store
                .patch(&key, PatchType::Merge, &other, None, "t")
                .is_err()
        );
        assert!(matches!(
            store.delete(&key, &json!({})),
            Ok(Deleted::Marked(_))
        ));
        let release = json!({"metadata": {"finalizers": null}});
        store
            .patch(&key, PatchType::Merge, &release, None, "t")
            .expect("finalizers removed");
        assert!(store.get(&key).is_none());
        let seen = seen.lock().map(|s| s.clone()).unwrap_or_default();
        let with = json!({"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24"]});
        let first = created.rv();
        assert_eq!(
            seen,
            [
                (ChangeType::Added, first, None, json!({})),
                (
                    ChangeType::Modified,
                    first + 1,
                    Some(json!({})),
                    with.clone()
                ),
                (
                    ChangeType::Modified,
                    first + 2,
                    Some(with.clone()),
                    with.clone()
                ),
                (ChangeType::Deleted, first + 3, Some(with.clone()), with),
            ]
        );
        assert!(store.remove_commit_observer(1));
        assert!(!store.remove_commit_observer(1));
    }
}
