//! Validation of object metadata, Leases and Events (the parts of kube-apiserver's rules that a
//! controller can trip over).

use serde_json::Value;

use super::resource::Resource;
use super::status::Cause;

/// RFC 1123 DNS subdomain, as `metadata.name` of Nodes, Leases and Events must be.
pub fn is_dns_subdomain(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 253
        && s.split('.').all(|label| {
            !label.is_empty()
                && label
                    .bytes()
                    .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !label.starts_with('-')
                && !label.ends_with('-')
        })
}

fn str_at<'a>(obj: &'a Value, ptr: &str) -> &'a str {
    obj.pointer(ptr).and_then(Value::as_str).unwrap_or("")
}

/// Validate a Lease (`ValidateLeaseSpec`).
pub fn lease(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if let Some(d) = obj.pointer("/spec/leaseDurationSeconds")
        && d.as_i64().is_none_or(|d| d <= 0)
    {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.leaseDurationSeconds",
            format!("Invalid value: {d}: must be greater than 0"),
        ));
    }
    if let Some(t) = obj.pointer("/spec/leaseTransitions")
        && t.as_i64().is_none_or(|t| t < 0)
    {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.leaseTransitions",
            format!("Invalid value: {t}: must be greater than or equal to 0"),
        ));
    }
    causes
}

/// Validate an `events.k8s.io/v1` Event on create (`ValidateEventCreate` for v1 events).
pub fn event(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let required = [
        ("/eventTime", "eventTime"),
        ("/reportingController", "reportingController"),
        ("/reportingInstance", "reportingInstance"),
        ("/action", "action"),
        ("/reason", "reason"),
    ];
    for (ptr, field) in required {
        if obj
            .pointer(ptr)
            .is_none_or(|v| v.is_null() || v.as_str() == Some(""))
        {
            causes.push(Cause::new("FieldValueRequired", field, "Required value"));
        }
    }
    let note = str_at(obj, "/note");
    if note.len() > 1024 {
        causes.push(Cause::new(
            "FieldValueTooLong",
            "note",
            "Too long: may not be more than 1024 bytes",
        ));
    }
    let ty = str_at(obj, "/type");
    if ty != "Normal" && ty != "Warning" {
        causes.push(Cause::new(
            "FieldValueNotSupported",
            "type",
            format!("Unsupported value: {ty:?}: supported values: \"Normal\", \"Warning\""),
        ));
    }
    if str_at(obj, "/reportingController").len() > 128 {
        causes.push(Cause::new(
            "FieldValueTooLong",
            "reportingController",
            "Too long: may not be more than 128 bytes",
        ));
    }
    if str_at(obj, "/reportingInstance").len() > 128 {
        causes.push(Cause::new(
            "FieldValueTooLong",
            "reportingInstance",
            "Too long: may not be more than 128 bytes",
        ));
    }
    causes.extend(event_namespace(obj, "/regarding/namespace"));
    causes
}

/// Validate a core `v1` Event on create.
pub fn core_event(obj: &Value) -> Vec<Cause> {
    event_namespace(obj, "/involvedObject/namespace")
}

fn event_namespace(obj: &Value, ptr: &str) -> Vec<Cause> {
    let ns = str_at(obj, "/metadata/namespace");
    let involved = str_at(obj, ptr);
    let field = ptr.trim_start_matches('/').replace('/', ".");
    if involved.is_empty() {
        if !matches!(ns, "" | "default" | "kube-system") {
            return vec![Cause::new(
                "FieldValueInvalid",
                field,
                format!("Invalid value: {ns:?}: does not match event.namespace"),
            )];
        }
    } else if involved != ns {
        return vec![Cause::new(
            "FieldValueInvalid",
            field,
            format!("Invalid value: {involved:?}: does not match event.namespace"),
        )];
    }
    Vec::new()
}

/// Per-resource validation on create (`strict_cidrs`: see [`super::nodes::validate`]).
pub fn on_create(res: Resource, obj: &Value, strict_cidrs: bool) -> Vec<Cause> {
    match res {
        Resource::Nodes => super::nodes::validate(obj, strict_cidrs),
        Resource::Leases => lease(obj),
        Resource::Events => event(obj),
        Resource::CoreEvents => core_event(obj),
        Resource::ClusterCidrs => super::cluster_cidrs::validate(obj),
    }
}

/// `ValidateObjectMetaAccessorUpdate` (`apimachinery/pkg/api/validation/objectmeta.go`): the
/// metadata rules of every update, in upstream's order — no new finalizers while the object is
/// being deleted (`ValidateNoNewFinalizers`), then `ValidateImmutableField` for `uid`,
/// `creationTimestamp`, `deletionTimestamp`, `deletionGracePeriodSeconds` (`name`, `namespace` and
/// `generation` are already forced equal by the handlers and `update::prepare_metadata`).
pub fn object_meta_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    if old.pointer("/metadata/deletionTimestamp").is_some() {
        let list = |v: &Value| -> Vec<String> {
            v.pointer("/metadata/finalizers")
                .and_then(Value::as_array)
                .map(|a| {
                    a.iter()
                        .filter_map(Value::as_str)
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default()
        };
        let old_f = list(old);
        let mut extra: Vec<String> = list(new)
            .into_iter()
            .filter(|f| !old_f.contains(f))
            .collect();
        extra.sort();
        extra.dedup();
        if !extra.is_empty() {
            // Go's `%#v` of a `[]string`.
            let go_list: Vec<String> = extra.iter().map(|f| format!("{f:?}")).collect();
            causes.push(Cause::new(
                "FieldValueForbidden",
                "metadata.finalizers",
                format!(
                    "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers []string{{{}}}",
                    go_list.join(", ")
                ),
            ));
        }
    }
    for field in [
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
    ] {
        let now = new.get("metadata").and_then(|m| m.get(field));
        let before = old.get("metadata").and_then(|m| m.get(field));
        let absent = |v: Option<&Value>| v.is_none_or(|v| v.is_null() || v.as_str() == Some(""));
        if absent(now) && absent(before) || now == before {
            continue;
        }
        // `field.Invalid(path, newValue, "field is immutable")`: the value as Go prints it
        // (JSON for strings/named types, `null` for a nil pointer).
        let shown = match now {
            None => "null".to_owned(),
            Some(v) => v.to_string(),
        };
        causes.push(Cause::new(
            "FieldValueInvalid",
            format!("metadata.{field}"),
            format!("Invalid value: {shown}: field is immutable"),
        ));
    }
    causes
}

/// The strategy's `ValidateUpdate` of each resource, causes in upstream's order:
/// - Nodes (`nodeStrategy.ValidateUpdate`, `pkg/registry/core/node/strategy.go`): `ValidateNode`
///   then `ValidateNodeUpdate` = [`object_meta_update`] + the podCIDR/providerID change rules
///   (`pkg/apis/core/validation/validation.go`);
/// - Leases (`ValidateLeaseUpdate`, `pkg/apis/coordination/validation/validation.go`):
///   [`object_meta_update`] + the spec rules;
/// - `events.k8s.io/v1` Events (`ValidateEventUpdate`, `pkg/apis/core/validation/events.go`): the
///   event rules + [`object_meta_update`] (strict validation of the v1 API);
/// - core `v1` Events: the legacy event rules only.
///
/// `strict_cidrs`: see [`super::nodes::validate`].
pub fn on_update(res: Resource, new: &Value, old: &Value, strict_cidrs: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    match res {
        Resource::Nodes => {
            causes.extend(super::nodes::validate(new, strict_cidrs));
            causes.extend(object_meta_update(new, old));
            causes.extend(super::nodes::validate_update(new, old));
        }
        Resource::Leases => {
            causes.extend(object_meta_update(new, old));
            causes.extend(lease(new));
        }
        Resource::Events => {
            causes.extend(event(new));
            causes.extend(object_meta_update(new, old));
        }
        Resource::CoreEvents => causes.extend(core_event(new)),
        Resource::ClusterCidrs => {
            causes.extend(object_meta_update(new, old));
            causes.extend(super::cluster_cidrs::validate_update(new, old));
        }
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_subdomain() {
        for ok in ["a", "node-1.example.com", "ip-10-0-10-170.ec2.internal"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "A", "-a", "a..b", "a_b"] {
            assert!(!is_dns_subdomain(bad), "{bad}");
        }
    }
}
