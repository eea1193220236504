//! The rules kube-apiserver applies to an update (PUT, every PATCH), one
//! function per rule, in the order kube-apiserver applies them. [`super::store::Store`] runs them
//! in that order (see `Store::commit_update`); each function cites the upstream code it follows
//! (paths are in `kubernetes/kubernetes`, `staging/src/k8s.io/…` for apiserver/apimachinery).
//!
//! 1. [`check_preconditions`] — the storage preconditions of a PUT (the body's `metadata.uid`).
//! 2. [`check_resource_version`] — optimistic concurrency on `metadata.resourceVersion`.
//! 3. [`prepare_metadata`] — `rest.BeforeUpdate`'s system-field resets (namespace, generation,
//!    uid when empty, creationTimestamp, deletionTimestamp, deletionGracePeriodSeconds).
//! 4. [`prepare_for_update`] — the Node strategies' `PrepareForUpdate` (main resource keeps the
//!    stored `status`, the `status` subresource keeps everything but `status`).
//! 5. [`validate_update`] — `validateCommonFields` + the strategy's `ValidateUpdate` (immutable
//!    metadata, no new finalizers while deleting, Node podCIDR rules …) ⇒ 422.
//! 6. [`is_no_op`] — the write is skipped (same resourceVersion) when only volatile fields differ.
//! 7. [`should_delete_during_update`] — the object goes away once its finalizers are emptied.

use serde_json::{Value, json};

use super::fields::ManagedEntry;
use super::resource::Resource;
use super::status::{ApiError, Cause};
use super::store::Key;
use super::validate;

/// `metav1.Preconditions` the storage layer checks before running an update.
///
/// kube-apiserver takes them from the PUT body only: `rest.defaultUpdatedObjectInfo.Preconditions`
/// (`apiserver/pkg/registry/rest/update.go`) returns `{UID: body.metadata.uid}` when the body sets
/// a uid; a PATCH has no body object (`DefaultUpdatedObjectInfo(nil, applyPatch…)` in
/// `apiserver/pkg/endpoints/handlers/patch.go`), so it has no preconditions and a uid in the
/// patch is caught by [`validate_update`] instead.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Preconditions {
    /// `metadata.uid` the stored object must have.
    pub uid: Option<String>,
    /// `metadata.resourceVersion` the stored object must have (DELETE options only).
    pub resource_version: Option<String>,
}

impl Preconditions {
    /// The preconditions of a PUT body: its non-empty `metadata.uid`.
    pub fn of_put_body(body: &Value) -> Self {
        Preconditions {
            uid: non_empty(meta_str(body, "uid")).map(str::to_owned),
            resource_version: None,
        }
    }

    /// The preconditions of a DELETE body (`DeleteOptions.preconditions`).
    pub fn of_delete_options(options: &Value) -> Self {
        let get = |f: &str| {
            options
                .pointer(&format!("/preconditions/{f}"))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        Preconditions {
            uid: get("uid"),
            resource_version: get("resourceVersion"),
        }
    }
}

fn non_empty(s: &str) -> Option<&str> {
    (!s.is_empty()).then_some(s)
}

/// `metadata.<field>` as a string (`""` when absent).
pub fn meta_str<'a>(obj: &'a Value, field: &str) -> &'a str {
    obj.get("metadata")
        .and_then(|m| m.get(field))
        .and_then(Value::as_str)
        .unwrap_or("")
}

fn meta_mut(obj: &mut Value) -> Option<&mut serde_json::Map<String, Value>> {
    if !obj.get("metadata").is_some_and(Value::is_object) {
        obj.as_object_mut()?
            .insert("metadata".into(), Value::Object(Default::default()));
    }
    obj.get_mut("metadata").and_then(Value::as_object_mut)
}

/// Rule 1: the storage preconditions hold for the stored object, else **409 Conflict**.
///
/// Matches `storage.Preconditions.Check` (`apiserver/pkg/storage/interfaces.go`), called by the
/// etcd3 store's `GuaranteedUpdate`/`conditionalDelete` (`apiserver/pkg/storage/etcd3/store.go`)
/// before the update function runs: a mismatch is a storage `InvalidObj` error
/// (`NewInvalidObjError`, `apiserver/pkg/storage/errors.go`), which `InterpretUpdateError` /
/// `InterpretDeleteError` (`apiserver/pkg/storage/errors/storage.go`) turn into
/// `NewConflict(resource, name, storageErr)`; the message therefore carries the storage error's
/// text, e.g. `Operation cannot be fulfilled on nodes "n": StorageError: invalid object, Code: 4,
/// Key: /registry/minions/n, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in
/// precondition: X, UID in object meta: Y`.
///
/// # Errors
/// 409 Conflict when the uid or resourceVersion differs.
pub fn check_preconditions(
    key: &Key,
    current: &Value,
    pre: &Preconditions,
) -> Result<(), ApiError> {
    if let Some(uid) = &pre.uid {
        let have = meta_str(current, "uid");
        if uid != have {
            return Err(ApiError::storage_precondition(
                key,
                &format!(
                    "Precondition failed: UID in precondition: {uid}, UID in object meta: {have}"
                ),
            ));
        }
    }
    if let Some(rv) = &pre.resource_version {
        let have = meta_str(current, "resourceVersion");
        if rv != have {
            return Err(ApiError::storage_precondition(
                key,
                &format!(
                    "Precondition failed: ResourceVersion in precondition: {rv}, ResourceVersion in object meta: {have}"
                ),
            ));
        }
    }
    Ok(())
}

/// Rule 2: optimistic concurrency on `metadata.resourceVersion`.
///
/// Matches `Store.Update`'s update function (`apiserver/pkg/registry/generic/registry/store.go`):
/// without a resourceVersion the write is unconditional when the strategy allows it
/// (`AllowUnconditionalUpdate`: Nodes and Events yes, Leases no ⇒ **422** `metadata.resourceVersion:
/// Invalid value: 0: must be specified for an update`, kind = the qualified resource); a
/// resourceVersion other than the stored one is **409 Conflict** with `OptimisticLockErrorMsg`.
/// A PATCH is applied to the stored object, so it carries the stored resourceVersion unless the
/// patch sets one.
///
/// # Errors
/// 409 Conflict (stale) or 422 Invalid (missing where required).
pub fn check_resource_version(key: &Key, new: &Value, current: &Value) -> Result<(), ApiError> {
    let want = meta_str(new, "resourceVersion");
    if want.is_empty() {
        if key.res.allow_unconditional_update() {
            return Ok(());
        }
        return Err(ApiError::invalid_qualified(
            &key.res.qualified_plural(),
            key.res.group(),
            key.res.plural(),
            &key.name,
            vec![Cause::new(
                "FieldValueInvalid",
                "metadata.resourceVersion",
                "Invalid value: 0: must be specified for an update",
            )],
        ));
    }
    if want != meta_str(current, "resourceVersion") {
        return Err(ApiError::stale(key.res, &key.name));
    }
    Ok(())
}

/// Rule 3: system metadata an update cannot set.
///
/// Matches `rest.BeforeUpdate` (`apiserver/pkg/registry/rest/update.go`):
/// - the namespace must match the request's (`EnsureObjectNamespaceMatchesRequestNamespace`,
///   `rest/meta.go`: empty ⇒ the request's, cluster-scoped ⇒ cleared, other ⇒ **400**);
/// - `generation` is the stored one;
/// - `uid` is filled from the stored object **only when empty** (a different uid stays and is
///   rejected by [`validate_update`]);
/// - `creationTimestamp` is the stored one; `deletionTimestamp` is the stored one when set;
///   `deletionGracePeriodSeconds` is the stored one when the update omits it.
///
/// Also drops what the sandbox computes itself: `managedFields` (the field manager owns them),
/// `selfLink`, and sets `name`, `apiVersion`, `kind` (the update handler's `checkName` has already
/// rejected a different name).
///
/// # Errors
/// 400 BadRequest for a namespace that does not match the URL.
pub fn prepare_metadata(key: &Key, new: &mut Value, old: &Value) -> Result<(), ApiError> {
    let res = key.res;
    if let Some(o) = new.as_object_mut() {
        o.insert("apiVersion".into(), json!(res.api_version()));
        o.insert("kind".into(), json!(res.kind()));
    }
    let no_meta = serde_json::Map::new();
    let old_meta = old
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&no_meta);
    let Some(m) = meta_mut(new) else {
        return Err(ApiError::bad_request(
            "the body of the request must be a JSON object",
        ));
    };
    let ns = m.get("namespace").and_then(Value::as_str).unwrap_or("");
    if res.namespaced() {
        if ns.is_empty() {
            m.insert("namespace".into(), json!(key.ns));
        } else if ns != key.ns {
            return Err(ApiError::bad_request(
                "the namespace of the provided object does not match the namespace sent on the request",
            ));
        }
    } else {
        m.remove("namespace");
    }
    m.insert("name".into(), json!(key.name));
    let copy = |m: &mut serde_json::Map<String, Value>, f: &str| match old_meta.get(f) {
        Some(v) => m.insert(f.into(), v.clone()),
        None => m.remove(f),
    };
    copy(m, "generation");
    if m.get("uid")
        .and_then(Value::as_str)
        .is_none_or(str::is_empty)
    {
        copy(m, "uid");
    }
    copy(m, "creationTimestamp");
    if old_meta.get("deletionTimestamp").is_some() {
        copy(m, "deletionTimestamp");
    }
    if old_meta.get("deletionGracePeriodSeconds").is_some()
        && m.get("deletionGracePeriodSeconds")
            .is_none_or(Value::is_null)
    {
        copy(m, "deletionGracePeriodSeconds");
    }
    m.remove("managedFields");
    m.remove("selfLink");
    Ok(())
}

/// Rule 4: what a write to the main resource or to a subresource may change.
///
/// Matches the Node strategies (`pkg/registry/core/node/strategy.go`): `nodeStrategy.
/// PrepareForUpdate` keeps the stored `status` (a write to `/nodes/x` cannot change it);
/// `nodeStatusStrategy.PrepareForUpdate` keeps the stored `spec` (and, in the sandbox, all other
/// stored fields) for `/nodes/x/status`. Node objects then get the v1 podCIDR/podCIDRs
/// conversion ([`super::nodes::convert`]). ClusterCIDRs follow the custom resource strategies
/// ([`super::cluster_cidrs::prepare_for_update`]). Other resources have no subresources here.
pub fn prepare_for_update(res: Resource, subresource: Option<&str>, new: &mut Value, old: &Value) {
    if res == Resource::ClusterCidrs {
        super::cluster_cidrs::prepare_for_update(subresource, new, old);
        return;
    }
    if res != Resource::Nodes {
        return;
    }
    let keep_status = |target: &mut Value, from: &Value| match from.get("status") {
        // Most writes leave the status alone: no copy then.
        Some(s) if target.get("status") == Some(s) => {}
        Some(s) => {
            if let Some(o) = target.as_object_mut() {
                o.insert("status".into(), s.clone());
            }
        }
        None => {
            if let Some(o) = target.as_object_mut() {
                o.remove("status");
            }
        }
    };
    if subresource == Some("status") {
        let mut stored = old.clone();
        keep_status(&mut stored, new);
        if let Some(m) = meta_mut(&mut stored) {
            m.remove("managedFields");
            // The status write still carries the uid it was sent with (validated next).
            if let Some(uid) = new.pointer("/metadata/uid") {
                m.insert("uid".into(), uid.clone());
            }
            if let Some(rv) = new.pointer("/metadata/resourceVersion") {
                m.insert("resourceVersion".into(), rv.clone());
            }
        }
        *new = stored;
    } else {
        keep_status(new, old);
    }
    super::nodes::convert(new);
}

/// Rule 5: validation of the updated object, **422 Invalid** with every cause.
///
/// Matches `rest.ValidateUpdate` (`apiserver/pkg/registry/rest/update.go`): first
/// `validateCommonFields` ([`validate::object_meta_update`]), then the strategy's `ValidateUpdate`
/// ([`validate::on_update`]). For Nodes that is `ValidateNode` + `ValidateNodeUpdate`
/// (`pkg/apis/core/validation/validation.go`), and `ValidateNodeUpdate` starts with
/// `ValidateObjectMetaUpdate` — the same metadata rules again. So a Node update with another uid
/// lists `metadata.uid` **twice** in `details.causes` while the message names it once
/// (`ErrorList.ToAggregate` drops duplicate messages; `NewInvalid` keeps every cause).
///
/// `strict_cidrs`: see [`super::nodes::validate`].
pub fn validate_update(res: Resource, new: &Value, old: &Value, strict_cidrs: bool) -> Vec<Cause> {
    let mut causes = validate::object_meta_update(new, old);
    causes.extend(validate::on_update(res, new, old, strict_cidrs));
    causes
}

/// Rule 6: an update that changes nothing is not written: the stored object (and its
/// resourceVersion) is returned, no watch event is sent.
///
/// Matches the etcd3 store's `GuaranteedUpdate` (`apiserver/pkg/storage/etcd3/store.go`), which
/// returns without writing when the encoded new object is byte-equal to the stored one, together
/// with `fieldmanager.IgnoreManagedFieldsTimestampsTransformer` (called from `Store.Update`),
/// which makes a change of managedFields timestamps alone no change. Compared here: the objects
/// without `resourceVersion` and `managedFields`, and the field ownership without timestamps.
pub fn is_no_op(
    new: &Value,
    old: &Value,
    new_managed: &[ManagedEntry],
    old_managed: &[ManagedEntry],
) -> bool {
    let same_owners = new_managed.len() == old_managed.len()
        && new_managed
            .iter()
            .zip(old_managed)
            .all(|(x, y)| x.manager == y.manager && x.fields == y.fields);
    same_owners && equal_ignoring_volatile(new, old)
}

/// `a == b` except for `metadata.resourceVersion` and `metadata.managedFields`, without copying.
fn equal_ignoring_volatile(a: &Value, b: &Value) -> bool {
    let (Some(ao), Some(bo)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let keys_equal = |x: &serde_json::Map<String, Value>, y: &serde_json::Map<String, Value>| {
        x.iter()
            .all(|(k, v)| k == "metadata" || y.get(k) == Some(v))
            && y.keys().all(|k| k == "metadata" || x.contains_key(k))
    };
    if !keys_equal(ao, bo) {
        return false;
    }
    let empty = serde_json::Map::new();
    let am = ao
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let bm = bo
        .get("metadata")
        .and_then(Value::as_object)
        .unwrap_or(&empty);
    let volatile = |k: &str| k == "resourceVersion" || k == "managedFields";
    am.iter().all(|(k, v)| volatile(k) || bm.get(k) == Some(v))
        && bm.keys().all(|k| volatile(k) || am.contains_key(k))
}

/// Rule 7: an update of an object being deleted that leaves no finalizers removes it.
///
/// Matches `ShouldDeleteDuringUpdate` (`apiserver/pkg/registry/generic/registry/store.go`):
/// `deletionTimestamp` set and `finalizers` empty ⇒ `deleteWithoutFinalizers` (a DELETED event).
pub fn should_delete_during_update(new: &Value) -> bool {
    new.pointer("/metadata/deletionTimestamp").is_some()
        && new
            .pointer("/metadata/finalizers")
            .and_then(Value::as_array)
            .is_none_or(Vec::is_empty)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(meta: Value) -> Value {
        json!({"apiVersion": "v1", "kind": "Node", "metadata": meta, "spec": {}})
    }

    #[test]
    fn put_uid_precondition_is_a_storage_conflict() {
        let key = Key::new(Resource::Nodes, "", "n1");
        let stored = node(json!({"name": "n1", "uid": "ours", "resourceVersion": "7"}));
        assert_eq!(
            check_preconditions(&key, &stored, &Preconditions::default()),
            Ok(())
        );
        let same = Preconditions::of_put_body(&node(json!({"name": "n1", "uid": "ours"})));
        assert_eq!(check_preconditions(&key, &stored, &same), Ok(()));
        let other = Preconditions::of_put_body(&node(json!({"name": "n1", "uid": "theirs"})));
        let e = check_preconditions(&key, &stored, &other).expect_err("uid differs");
        assert_eq!((e.code, e.reason), (409, "Conflict"));
        assert_eq!(
            e.message,
            "Operation cannot be fulfilled on nodes \"n1\": StorageError: invalid object, Code: 4, Key: /registry/minions/n1, ResourceVersion: 0, AdditionalErrorMsg: Precondition failed: UID in precondition: theirs, UID in object meta: ours"
        );
    }

    #[test]
    fn uid_in_the_update_is_immutable_and_listed_twice_for_nodes() {
        let old = node(json!({"name": "n1", "uid": "ours", "creationTimestamp": "t"}));
        let mut new = node(json!({"name": "n1", "uid": "theirs"}));
        let key = Key::new(Resource::Nodes, "", "n1");
        prepare_metadata(&key, &mut new, &old).expect("prepared");
        assert_eq!(new["metadata"]["creationTimestamp"], "t");
        let causes = validate_update(Resource::Nodes, &new, &old, true);
        let fields: Vec<(&str, &str)> = causes
            .iter()
            .map(|c| (c.field.as_str(), c.message.as_str()))
            .collect();
        let uid = (
            "metadata.uid",
            "Invalid value: \"theirs\": field is immutable",
        );
        assert_eq!(fields, [uid, uid]);
        let e = ApiError::invalid(Resource::Nodes, "n1", causes);
        assert_eq!(
            e.message,
            "Node \"n1\" is invalid: metadata.uid: Invalid value: \"theirs\": field is immutable"
        );
        // No uid in the update: the stored one is used, nothing to report.
        let mut new = node(json!({"name": "n1"}));
        prepare_metadata(&key, &mut new, &old).expect("prepared");
        assert_eq!(new["metadata"]["uid"], "ours");
        assert!(validate_update(Resource::Nodes, &new, &old, true).is_empty());
    }

    #[test]
    fn metadata_rules_table() {
        let key = Key::new(Resource::Nodes, "", "n1");
        let deleting = node(json!({"name": "n1", "uid": "u", "deletionTimestamp": "t1",
            "deletionGracePeriodSeconds": 0, "finalizers": ["a"]}));
        let cases: [(Value, Value, &[&str]); 5] = [
            // New finalizer while deleting.
            (
                deleting.clone(),
                node(json!({"name": "n1", "finalizers": ["a", "b"]})),
                &["metadata.finalizers", "metadata.finalizers"],
            ),
            // Removing finalizers while deleting is fine; the deletion fields are kept.
            (
                deleting.clone(),
                node(json!({"name": "n1", "finalizers": []})),
                &[],
            ),
            // Setting a deletionTimestamp through an update is refused.
            (
                node(json!({"name": "n1", "uid": "u"})),
                node(json!({"name": "n1", "deletionTimestamp": "t2"})),
                &["metadata.deletionTimestamp", "metadata.deletionTimestamp"],
            ),
            // Changing the grace period of a deleting object is refused.
            (
                deleting.clone(),
                node(json!({"name": "n1", "finalizers": ["a"], "deletionGracePeriodSeconds": 30})),
                &[
                    "metadata.deletionGracePeriodSeconds",
                    "metadata.deletionGracePeriodSeconds",
                ],
            ),
            // creationTimestamp changes are ignored (reset to the stored one).
            (
                node(json!({"name": "n1", "uid": "u", "creationTimestamp": "c"})),
                node(json!({"name": "n1", "creationTimestamp": "other"})),
                &[],
            ),
        ];
        for (old, mut new, want) in cases {
            prepare_metadata(&key, &mut new, &old).expect("prepared");
            let got: Vec<String> = validate_update(Resource::Nodes, &new, &old, true)
                .into_iter()
                .map(|c| c.field)
                .collect();
            assert_eq!(got, want, "old {old} new {new}");
        }
        let finalizer = {
            let mut new = node(json!({"name": "n1", "finalizers": ["a", "b"]}));
            prepare_metadata(&key, &mut new, &deleting).expect("prepared");
            validate::object_meta_update(&new, &deleting)
                .remove(0)
                .message
        };
        assert_eq!(
            finalizer,
            "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{\"b\"}"
        );
    }

    #[test]
    fn resource_version_rules() {
        let stored = json!({"metadata": {"name": "l", "resourceVersion": "5"}});
        let node_key = Key::new(Resource::Nodes, "", "l");
        let lease_key = Key::new(Resource::Leases, "ns", "l");
        let none = json!({"metadata": {"name": "l"}});
        let stale = json!({"metadata": {"name": "l", "resourceVersion": "4"}});
        assert_eq!(check_resource_version(&node_key, &none, &stored), Ok(()));
        assert_eq!(check_resource_version(&node_key, &stored, &stored), Ok(()));
        assert_eq!(
            check_resource_version(&node_key, &stale, &stored).map_err(|e| e.code),
            Err(409)
        );
        let e = check_resource_version(&lease_key, &none, &stored).expect_err("required");
        assert_eq!(
            (e.code, e.message.as_str()),
            (
                422,
                "leases.coordination.k8s.io \"l\" is invalid: metadata.resourceVersion: Invalid value: 0: must be specified for an update"
            )
        );
    }

    #[test]
    fn no_op_ignores_resource_version_and_managed_fields_only() {
        let old = json!({"metadata": {"name": "n", "resourceVersion": "3", "managedFields": [1]},
            "spec": {"podCIDRs": ["10.0.0.0/24"]}});
        let same = json!({"metadata": {"name": "n"}, "spec": {"podCIDRs": ["10.0.0.0/24"]}});
        let label = json!({"metadata": {"name": "n", "labels": {"a": "b"}},
            "spec": {"podCIDRs": ["10.0.0.0/24"]}});
        assert!(is_no_op(&same, &old, &[], &[]));
        assert!(!is_no_op(&label, &old, &[], &[]));
        assert!(!is_no_op(
            &json!({"metadata": {"name": "n"}}),
            &old,
            &[],
            &[]
        ));
    }
}
