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

/// Per-resource validation on create.
pub fn on_create(res: Resource, obj: &Value) -> Vec<Cause> {
    match res {
        Resource::Nodes => super::nodes::validate(obj),
        Resource::Leases => lease(obj),
        Resource::Events => event(obj),
        Resource::CoreEvents => core_event(obj),
    }
}

/// Per-resource validation on update.
pub fn on_update(res: Resource, new: &Value, old: &Value) -> Vec<Cause> {
    match res {
        Resource::Nodes => super::nodes::validate_update(new, old),
        Resource::Leases => lease(new),
        Resource::Events => event(new),
        Resource::CoreEvents => core_event(new),
    }
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
