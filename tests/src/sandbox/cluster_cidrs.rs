//! `nodeipam.io/v1alpha1` `ClusterCIDR` objects, served as kube-apiserver serves the custom
//! resource of `deploy/crds/clustercidrs.yaml` (issue 18): the apiextensions-apiserver strategies
//! for a CRD with a `status` subresource, its structural schema (unknown fields pruned) and the
//! CRD's admission rules (OpenAPI schema and CEL), each reported as a 422 cause.
//!
//! The strategies (`apiextensions-apiserver/pkg/registry/customresource/strategy.go` and
//! `status_strategy.go`):
//! - create: `status` is dropped (only the subresource writes it) and `metadata.generation` is 1;
//! - update of the main resource: the stored `status` is kept, and `metadata.generation` goes up
//!   by one when anything outside `metadata` changed;
//! - update of `/status`: everything but `status` is the stored object's;
//! - a strategic merge patch is refused with 415 (custom resources have no patch strategies; the
//!   server's handler does that, see `server.rs`);
//! - a DELETE held by finalizers bumps `metadata.generation` with the `deletionTimestamp`
//!   (`markAsDeleting` in `apiserver/pkg/registry/generic/registry/store.go`, for any object
//!   whose generation is set; `write.rs`).
//!
//! A CEL rule's cause reads `FIELD: Invalid value: MESSAGE` for an object and `FIELD: Invalid
//! value: "TEXT": MESSAGE` for a string, as kube-apiserver v1.36 prints them.
//!
//! The real server is the judge: `real_apiserver`'s `crd` tests replay the same requests on both
//! servers and compare the answers (tests/FIDELITY.md).

use std::net::{Ipv4Addr, Ipv6Addr};

use serde_json::{Map, Value, json};

use super::status::Cause;

/// The fields the schema declares, per object path (`""` the object, `"spec"`, …); everything
/// else is pruned, as a structural schema without `x-kubernetes-preserve-unknown-fields` does.
fn known_fields(path: &str) -> &'static [&'static str] {
    match path {
        "" => &["apiVersion", "kind", "metadata", "spec", "status"],
        "spec" => &["nodeSelector", "perNodeHostBits", "ipv4", "ipv6"],
        "spec.nodeSelector" => &["nodeSelectorTerms"],
        "term" => &["matchExpressions", "matchFields"],
        "requirement" => &["key", "operator", "values"],
        "status" => &["conditions", "ipv4", "ipv6"],
        "condition" => &[
            "type",
            "status",
            "observedGeneration",
            "lastTransitionTime",
            "reason",
            "message",
        ],
        "capacity" => &["capacity", "used", "free"],
        _ => &[],
    }
}

fn prune_object(value: &mut Value, path: &str) {
    if let Some(map) = value.as_object_mut() {
        let known = known_fields(path);
        map.retain(|k, _| known.contains(&k.as_str()));
    }
}

fn prune_each(list: Option<&mut Value>, path: &str, each: impl Fn(&mut Value)) {
    if let Some(items) = list.and_then(Value::as_array_mut) {
        for item in items {
            prune_object(item, path);
            each(item);
        }
    }
}

/// Drops every field the schema does not declare (outside `metadata`).
pub fn prune(obj: &mut Value) {
    prune_object(obj, "");
    if let Some(spec) = obj.get_mut("spec") {
        prune_object(spec, "spec");
        if let Some(selector) = spec.get_mut("nodeSelector") {
            prune_object(selector, "spec.nodeSelector");
            prune_each(selector.get_mut("nodeSelectorTerms"), "term", |term| {
                for list in ["matchExpressions", "matchFields"] {
                    prune_each(term.get_mut(list), "requirement", |_| {});
                }
            });
        }
    }
    if let Some(status) = obj.get_mut("status") {
        prune_object(status, "status");
        prune_each(status.get_mut("conditions"), "condition", |_| {});
        for family in ["ipv4", "ipv6"] {
            if let Some(capacity) = status.get_mut(family) {
                prune_object(capacity, "capacity");
            }
        }
    }
}

fn metadata(obj: &mut Value) -> Option<&mut Map<String, Value>> {
    obj.get_mut("metadata").and_then(Value::as_object_mut)
}

/// `PrepareForCreate`: no `status` on create, `metadata.generation` 1; unknown fields pruned.
pub fn prepare_for_create(obj: &mut Value) {
    prune(obj);
    if let Some(map) = obj.as_object_mut() {
        map.remove("status");
    }
    if let Some(m) = metadata(obj) {
        m.insert("generation".into(), json!(1));
    }
}

/// `PrepareForUpdate` of the main resource (`subresource` `None`) or of `/status`; unknown
/// fields pruned.
pub fn prepare_for_update(subresource: Option<&str>, new: &mut Value, old: &Value) {
    prune(new);
    let Some(map) = new.as_object_mut() else {
        return;
    };
    if subresource == Some("status") {
        let status = map.remove("status");
        let mut stored = old.clone();
        if let Some(stored_map) = stored.as_object_mut() {
            match status {
                Some(status) => stored_map.insert("status".into(), status),
                None => stored_map.remove("status"),
            };
        }
        // The status write keeps the metadata it was sent with only where the update pipeline
        // already checked it (resourceVersion, uid); the rest is the stored object's.
        for field in ["resourceVersion", "uid"] {
            if let Some(v) = new.pointer(&format!("/metadata/{field}")).cloned()
                && let Some(m) = metadata(&mut stored)
            {
                m.insert(field.into(), v);
            }
        }
        *new = stored;
        return;
    }
    match old.get("status") {
        Some(status) => {
            map.insert("status".into(), status.clone());
        }
        None => {
            map.remove("status");
        }
    }
    let outside_metadata = |v: &Value| -> Value {
        let mut copy = v.clone();
        if let Some(m) = copy.as_object_mut() {
            m.remove("metadata");
        }
        copy
    };
    let generation = old
        .pointer("/metadata/generation")
        .and_then(Value::as_i64)
        .unwrap_or(0);
    let next = if outside_metadata(new) == outside_metadata(old) {
        generation
    } else {
        generation + 1
    };
    if let Some(m) = metadata(new) {
        m.insert("generation".into(), json!(next));
    }
}

/// An IPv4 or IPv6 CIDR as CEL's `isCIDR` reads it (Go's `netip.ParsePrefix`: no leading zeros,
/// no zone, no IPv4-mapped IPv6) with no host bits set, of the family `v4`. `None` when it is
/// not one.
fn canonical_prefix_len(text: &str, v4: bool) -> Option<u8> {
    let (address, length) = text.split_once('/')?;
    if length.is_empty() || (length.len() > 1 && length.starts_with('0')) {
        return None;
    }
    let length: u8 = length.parse().ok()?;
    if v4 {
        let ip: Ipv4Addr = address.parse().ok()?;
        let net = ipnet::Ipv4Net::new(ip, length).ok()?;
        (net.network() == ip).then_some(length)
    } else {
        let ip: Ipv6Addr = address.parse().ok()?;
        if ip.to_ipv4_mapped().is_some() || address.contains('.') {
            return None;
        }
        let net = ipnet::Ipv6Net::new(ip, length).ok()?;
        (net.network() == ip).then_some(length)
    }
}

const OPERATORS: [&str; 6] = ["In", "NotIn", "Exists", "DoesNotExist", "Gt", "Lt"];

fn requirement_causes(requirement: &Value, path: &str, causes: &mut Vec<Cause>) {
    let key = requirement.get("key").and_then(Value::as_str);
    let operator = requirement.get("operator").and_then(Value::as_str);
    if key.is_none() {
        causes.push(Cause::new(
            "FieldValueRequired",
            format!("{path}.key"),
            "Required value",
        ));
    }
    let Some(operator) = operator else {
        causes.push(Cause::new(
            "FieldValueRequired",
            format!("{path}.operator"),
            "Required value",
        ));
        return;
    };
    if !OPERATORS.contains(&operator) {
        let supported: Vec<String> = OPERATORS.iter().map(|o| format!("{o:?}")).collect();
        causes.push(Cause::new(
            "FieldValueNotSupported",
            format!("{path}.operator"),
            format!(
                "Unsupported value: {operator:?}: supported values: {}",
                supported.join(", ")
            ),
        ));
        return;
    }
    let values = requirement
        .get("values")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let rules = [
        (
            matches!(operator, "In" | "NotIn") == (values > 0),
            "In and NotIn need values; Exists and DoesNotExist take none",
        ),
        (
            !matches!(operator, "Gt" | "Lt") || values == 1,
            "Gt and Lt take exactly one value",
        ),
        (
            !matches!(operator, "Exists" | "DoesNotExist") || values == 0,
            "Exists and DoesNotExist take no values",
        ),
    ];
    for (holds, message) in rules {
        if !holds {
            causes.push(Cause::new(
                "FieldValueInvalid",
                path.to_owned(),
                format!("Invalid value: {message}"),
            ));
        }
    }
}

fn selector_causes(selector: &Value, causes: &mut Vec<Cause>) {
    let path = "spec.nodeSelector.nodeSelectorTerms";
    let Some(terms) = selector.get("nodeSelectorTerms").and_then(Value::as_array) else {
        causes.push(Cause::new("FieldValueRequired", path, "Required value"));
        return;
    };
    for (t, term) in terms.iter().enumerate() {
        for list in ["matchExpressions", "matchFields"] {
            let requirements = term.get(list).and_then(Value::as_array);
            for (r, requirement) in requirements.into_iter().flatten().enumerate() {
                requirement_causes(requirement, &format!("{path}[{t}].{list}[{r}]"), causes);
            }
        }
    }
}

/// The CRD's admission rules for a ClusterCIDR (create and update): `spec` required, with
/// `perNodeHostBits` (4..=128) and at least one of `ipv4` / `ipv6`, each a canonical CIDR of its
/// family; the block no larger than the range and at most 2^24 blocks; the node selector's
/// requirement shapes. Each broken rule is one cause, with the CRD's message.
pub fn validate(obj: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let Some(spec) = obj.get("spec").filter(|s| s.is_object()) else {
        causes.push(Cause::new("FieldValueRequired", "spec", "Required value"));
        return causes;
    };
    let host_bits = spec.get("perNodeHostBits").and_then(Value::as_i64);
    match host_bits {
        None => causes.push(Cause::new(
            "FieldValueRequired",
            "spec.perNodeHostBits",
            "Required value",
        )),
        Some(bits) if bits < 4 => causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.perNodeHostBits",
            format!(
                "Invalid value: {bits}: spec.perNodeHostBits in body should be greater than or equal to 4"
            ),
        )),
        Some(bits) if bits > 128 => causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.perNodeHostBits",
            format!(
                "Invalid value: {bits}: spec.perNodeHostBits in body should be less than or equal to 128"
            ),
        )),
        Some(_) => {}
    }
    let mut prefixes = Vec::new();
    for (family, v4, width, example) in [
        ("ipv4", true, 32i64, "10.245.0.0/16"),
        ("ipv6", false, 128, "fd00:10:245::/56"),
    ] {
        let Some(text) = spec.get(family).and_then(Value::as_str) else {
            continue;
        };
        match canonical_prefix_len(text, v4) {
            Some(length) => prefixes.push((family, width, i64::from(length))),
            None => causes.push(Cause::new(
                "FieldValueInvalid",
                format!("spec.{family}"),
                format!(
                    "Invalid value: {text:?}: must be a canonical {} CIDR (e.g. {example}) with no host bits set",
                    if v4 { "IPv4" } else { "IPv6" }
                ),
            )),
        }
    }
    let object_rule = |message: String| {
        Cause::new(
            "FieldValueInvalid",
            "spec",
            format!("Invalid value: {message}"),
        )
    };
    if spec.get("ipv4").is_none() && spec.get("ipv6").is_none() {
        causes.push(object_rule(
            "at least one of ipv4 and ipv6 must be set".to_owned(),
        ));
    }
    if let Some(bits) = host_bits {
        for (family, width, length) in prefixes {
            if bits > width - length {
                causes.push(object_rule(format!(
                    "perNodeHostBits must not exceed the host bits of {family} ({width} minus its prefix length)"
                )));
            }
            if width - bits - length > 24 {
                causes.push(object_rule(format!(
                    "{family} cut into blocks of perNodeHostBits host bits gives more than 2^24 blocks"
                )));
            }
        }
    }
    if let Some(selector) = spec.get("nodeSelector") {
        selector_causes(selector, &mut causes);
    }
    causes
}

/// The update rules: [`validate`], then the CEL transition rule `self == oldSelf` on `spec`.
pub fn validate_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = validate(new);
    if new.get("spec") != old.get("spec") {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec",
            "Invalid value: spec is immutable; create a new ClusterCIDR instead",
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(spec: Value) -> Value {
        json!({"apiVersion": "nodeipam.io/v1alpha1", "kind": "ClusterCIDR",
               "metadata": {"name": "p"}, "spec": spec})
    }

    #[test]
    fn canonical_cidrs_as_cel_reads_them() {
        for (text, v4, want) in [
            ("10.245.0.0/16", true, Some(16)),
            ("10.245.0.1/16", true, None),
            ("010.245.0.0/16", true, None),
            ("10.245.0.0", true, None),
            ("10.245.0.0/016", true, None),
            ("fd00::/64", true, None),
            ("fd00:10:245::/48", false, Some(48)),
            ("10.0.0.0/8", false, None),
            ("::ffff:10.0.0.0/104", false, None),
            ("fd00::1/64", false, None),
        ] {
            assert_eq!(canonical_prefix_len(text, v4), want, "{text}");
        }
    }

    /// The refusals the real server gives for the CRD's rules (real_apiserver's crd test), one
    /// rule each.
    #[test]
    fn each_rule_refuses_what_the_real_server_refuses() {
        let cases = [
            (
                json!({"perNodeHostBits": 8}),
                "at least one of ipv4 and ipv6",
            ),
            (json!({"ipv4": "10.247.0.0/16"}), "Required value"),
            (
                json!({"perNodeHostBits": 8, "ipv4": "10.247.0.1/16"}),
                "canonical IPv4 CIDR",
            ),
            (
                json!({"perNodeHostBits": 3, "ipv4": "10.247.0.0/16"}),
                "greater than or equal to 4",
            ),
            (
                json!({"perNodeHostBits": 9, "ipv4": "10.247.0.0/24"}),
                "must not exceed the host bits of ipv4",
            ),
            (
                json!({"perNodeHostBits": 80, "ipv6": "fd00::/64"}),
                "must not exceed the host bits of ipv6",
            ),
            (
                json!({"perNodeHostBits": 4, "ipv4": "32.0.0.0/3"}),
                "more than 2^24 blocks",
            ),
            (
                json!({"perNodeHostBits": 64, "ipv6": "fd00::/39"}),
                "more than 2^24 blocks",
            ),
            (
                json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "In"}]}]}}),
                "In and NotIn need values",
            ),
            (
                json!({"perNodeHostBits": 8, "ipv4": "10.247.0.0/16", "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [{"key": "a", "operator": "Matches", "values": ["x"]}]}]}}),
                "Unsupported value: \"Matches\"",
            ),
        ];
        for (spec, expected) in cases {
            let causes = validate(&object(spec.clone()));
            assert!(
                causes.iter().any(|c| c.message.contains(expected)),
                "{spec}: {causes:?} lacks {expected:?}"
            );
        }
        for spec in [
            json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16"}),
            json!({"perNodeHostBits": 4, "ipv4": "16.0.0.0/4"}),
            json!({"perNodeHostBits": 6, "ipv4": "10.246.0.0/20", "ipv6": "fd00:10:246::/104",
                   "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [
                       {"key": "kubernetes.azure.com/mode", "operator": "Exists"}]}]}}),
        ] {
            assert_eq!(validate(&object(spec.clone())), Vec::new(), "{spec}");
        }
    }

    #[test]
    fn strategies_keep_status_and_spec_apart_and_count_generations() {
        let mut created = object(json!({"perNodeHostBits": 8, "ipv4": "10.245.0.0/16", "x": 1}));
        created["status"] = json!({"ipv4": {"free": 3}});
        created["extra"] = json!(true);
        prepare_for_create(&mut created);
        assert_eq!(created.get("status"), None, "create cannot set status");
        assert_eq!(created.get("extra"), None, "unknown fields pruned");
        assert_eq!(created["spec"].get("x"), None);
        assert_eq!(created["metadata"]["generation"], 1);

        let mut status_write = created.clone();
        status_write["status"] = json!({"ipv4": {"capacity": 256, "used": 1, "free": 255}});
        status_write["spec"]["ipv4"] = json!("10.9.0.0/16");
        status_write["metadata"]["labels"] = json!({"a": "b"});
        prepare_for_update(Some("status"), &mut status_write, &created);
        assert_eq!(status_write["spec"], created["spec"], "/status keeps spec");
        assert_eq!(status_write["metadata"].get("labels"), None);
        assert_eq!(status_write["status"]["ipv4"]["free"], 255);
        assert_eq!(status_write["metadata"]["generation"], 1);

        let mut labelled = status_write.clone();
        labelled["metadata"]["labels"] = json!({"a": "b"});
        labelled["status"] = json!({"ipv4": {"free": 0}});
        prepare_for_update(None, &mut labelled, &status_write);
        assert_eq!(
            labelled["status"], status_write["status"],
            "main resource keeps status"
        );
        assert_eq!(
            labelled["metadata"]["generation"], 1,
            "metadata only: same generation"
        );

        let mut respecced = labelled.clone();
        respecced["spec"]["perNodeHostBits"] = json!(9);
        prepare_for_update(None, &mut respecced, &labelled);
        assert_eq!(respecced["metadata"]["generation"], 2);
        assert!(
            validate_update(&respecced, &labelled)
                .iter()
                .any(|c| c.message.contains("spec is immutable"))
        );
    }
}
