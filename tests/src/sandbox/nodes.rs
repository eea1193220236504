//! Node rules of kube-apiserver: `spec.podCIDR`/`spec.podCIDRs` conversion and validation.

use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::{Value, json};

use super::status::Cause;

const CHANGE_FORBIDDEN: &str = "node updates may not change podCIDR except from \"\" to valid";

/// The v1 → internal conversion of a written Node (`Convert_v1_NodeSpec_To_core_NodeSpec`,
/// `pkg/apis/core/v1/conversion.go`): when both `podCIDR` and `podCIDRs` are given and `podCIDR`
/// is not `podCIDRs[0]`, `podCIDR` is authoritative ("for compatibility with older clients"):
/// `podCIDRs` becomes `[podCIDR]` — so such a write is not refused, it stores one CIDR, and a
/// write of `podCIDRs` alone over a stored `podCIDR` changes nothing (measured against
/// kube-apiserver v1.36.3: `tests/FIDELITY.md`). Then [`normalize`].
pub fn convert(node: &mut Value) {
    if let Some(spec) = node.get_mut("spec").and_then(Value::as_object_mut) {
        let single = spec.get("podCIDR").and_then(Value::as_str).unwrap_or("");
        let first = spec
            .get("podCIDRs")
            .and_then(Value::as_array)
            .and_then(|l| l.first());
        if let Some(first) = first
            && !single.is_empty()
            && first.as_str() != Some(single)
        {
            let single = single.to_owned();
            spec.insert("podCIDRs".into(), json!([single]));
        }
    }
    normalize(node);
}

/// The two fields made consistent where one is missing: a lone `podCIDR` becomes
/// `podCIDRs: [podCIDR]`, a lone `podCIDRs` fills `podCIDR` with its first entry. Alone (without
/// [`convert`]) for the initial NodeList only: it is loaded as stored, so states a real server
/// could never serve (`podCIDR` ≠ `podCIDRs[0]`) stay available to the hostile-input tests.
pub fn normalize(node: &mut Value) {
    let Some(spec) = node.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    let single = spec
        .get("podCIDR")
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_owned();
    let list_empty = spec
        .get("podCIDRs")
        .and_then(Value::as_array)
        .is_none_or(Vec::is_empty);
    if !single.is_empty() && list_empty {
        spec.insert("podCIDRs".into(), json!([single]));
    } else if single.is_empty() && !list_empty {
        let first = spec
            .get("podCIDRs")
            .and_then(Value::as_array)
            .and_then(|l| l.first())
            .cloned()
            .unwrap_or(Value::Null);
        spec.insert("podCIDR".into(), first);
    }
    if spec
        .get("podCIDRs")
        .and_then(Value::as_array)
        .is_some_and(Vec::is_empty)
    {
        spec.remove("podCIDRs");
    }
    if spec
        .get("podCIDR")
        .is_some_and(|v| v.as_str() == Some("") || v.is_null())
    {
        spec.remove("podCIDR");
    }
}

fn pod_cidrs(node: &Value) -> Vec<Value> {
    node.pointer("/spec/podCIDRs")
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default()
}

/// Parse like Go's `netutils.ParseCIDRSloppy`: host bits may be set.
fn parse_cidr(s: &str) -> Option<IpNet> {
    let (addr, len) = s.split_once('/')?;
    let addr: IpAddr = addr.parse().ok()?;
    let len: u8 = len.parse().ok()?;
    IpNet::new(addr, len).ok()
}

/// The strict half of `IsValidCIDRForLegacyField` (apimachinery `pkg/util/validation/ip.go`,
/// `parseCIDR` with strict validation; feature gate `StrictIPCIDRValidation`, beta and on by
/// default since Kubernetes 1.36, and `ValidateNode` passes no old values to spare): what
/// `netip.ParsePrefix` refuses after the sloppy parse succeeded, in upstream's order. (Leading 0s
/// in an IPv4 octet already fail the sloppy parse here — Rust's parser refuses them — so they get
/// the "must be a valid CIDR value" message, same code, reason and field.)
fn strict_cidr_problem(text: &str, net: &IpNet) -> Option<&'static str> {
    let len = text.rsplit_once('/').map_or("", |(_, len)| len);
    if len.len() > 1 && len.starts_with('0') {
        return Some("must not have leading 0s in IP or prefix length");
    }
    if let IpNet::V6(v6) = net
        && v6.addr().to_ipv4_mapped().is_some()
    {
        return Some("must not have an IPv4-mapped IPv6 address");
    }
    (net.addr() != net.network()).then_some("must not have bits set beyond the prefix length")
}

/// `ValidateNode` (spec part): podCIDRs entries valid (with `strict_cidrs`, as kube-apiserver 1.36
/// by default: no host bits, no leading 0s, no IPv4-mapped IPv6; without it, as a server before
/// 1.36 or with `StrictIPCIDRValidation` off: any CIDR the sloppy parse reads), at most one per
/// family, at most two, and `podCIDR == podCIDRs[0]` (always true after [`convert`]).
pub fn validate(node: &Value, strict_cidrs: bool) -> Vec<Cause> {
    let mut causes = Vec::new();
    let cidrs = pod_cidrs(node);
    let mut families = Vec::new();
    for (i, c) in cidrs.iter().enumerate() {
        let text = c.as_str().unwrap_or_default();
        match parse_cidr(text) {
            Some(net) => {
                families.push(matches!(net, IpNet::V4(_)));
                if let Some(problem) = strict_cidrs
                    .then(|| strict_cidr_problem(text, &net))
                    .flatten()
                {
                    causes.push(Cause::new(
                        "FieldValueInvalid",
                        format!("spec.podCIDRs[{i}]"),
                        format!("Invalid value: {c}: {problem}"),
                    ));
                }
            }
            None => causes.push(Cause::new(
                "FieldValueInvalid",
                format!("spec.podCIDRs[{i}]"),
                format!("Invalid value: {c}: must be a valid CIDR value, (e.g. 10.9.8.0/24 or 2001:db8::/64)"),
            )),
        }
    }
    if causes.is_empty() && cidrs.len() > 1 {
        let dual = cidrs.len() == 2 && families.first() != families.get(1);
        if !dual {
            causes.push(Cause::new(
                "FieldValueInvalid",
                "spec.podCIDRs",
                format!(
                    "Invalid value: {}: may specify no more than one CIDR for each IP family",
                    Value::Array(cidrs.clone())
                ),
            ));
        }
    }
    if let (Some(first), Some(single)) = (cidrs.first(), node.pointer("/spec/podCIDR"))
        && first != single
    {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.podCIDR",
            format!(
                "Invalid value: {single}: must match the first entry of spec.podCIDRs ({first})"
            ),
        ));
    }
    causes
}

/// The Node-specific part of `ValidateNodeUpdate` (`pkg/apis/core/validation/validation.go`):
/// podCIDRs and providerID may go from empty to set, never change after. A different number of
/// podCIDRs is one `Forbidden` cause; otherwise each changed entry is one (upstream compares index
/// by index). The metadata part of `ValidateNodeUpdate` is `validate::object_meta_update`, and
/// `ValidateNode` ([`validate`]) runs before it (see `validate::on_update`).
pub fn validate_update(new: &Value, old: &Value) -> Vec<Cause> {
    let mut causes = Vec::new();
    let old_cidrs = pod_cidrs(old);
    if !old_cidrs.is_empty() {
        let new_cidrs = pod_cidrs(new);
        let forbidden = || {
            Cause::new(
                "FieldValueForbidden",
                "spec.podCIDRs",
                format!("Forbidden: {CHANGE_FORBIDDEN}"),
            )
        };
        if old_cidrs.len() != new_cidrs.len() {
            causes.push(forbidden());
        } else {
            for (a, b) in old_cidrs.iter().zip(&new_cidrs) {
                if a != b {
                    causes.push(forbidden());
                }
            }
        }
    }
    let old_provider = old
        .pointer("/spec/providerID")
        .and_then(Value::as_str)
        .unwrap_or("");
    let new_provider = new
        .pointer("/spec/providerID")
        .and_then(Value::as_str)
        .unwrap_or("");
    if !old_provider.is_empty() && old_provider != new_provider {
        causes.push(Cause::new(
            "FieldValueForbidden",
            "spec.providerID",
            "Forbidden: node updates may not change providerID except from \"\" to valid",
        ));
    }
    causes
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(spec: Value) -> Value {
        let mut n = json!({"metadata": {"name": "n"}, "spec": spec});
        convert(&mut n);
        n
    }

    #[test]
    fn validation_table() {
        let ok = [
            json!({}),
            json!({"podCIDR": "10.0.0.0/24"}),
            json!({"podCIDRs": ["10.0.0.0/24", "fd00::/64"]}),
            // podCIDR is authoritative: this stores ["10.0.1.0/24"].
            json!({"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.0.0/24"]}),
        ];
        for spec in ok {
            assert!(validate(&node(spec.clone()), true).is_empty(), "{spec}");
        }
        let bad = [
            json!({"podCIDRs": ["10.0.0.0/24", "10.0.1.0/24"]}),
            json!({"podCIDRs": ["10.0.0.0/24", "fd00::/64", "fd01::/64"]}),
            json!({"podCIDRs": ["***HIDDEN***/25"]}),
            json!({"podCIDRs": ["10.0.0.0/33"]}),
            // Strict CIDR validation (Kubernetes 1.36).
            json!({"podCIDRs": ["10.0.0.1/24"]}),
            json!({"podCIDRs": ["10.0.0.0/024"]}),
            json!({"podCIDRs": ["::ffff:10.0.0.0/120"]}),
            json!({"podCIDRs": ["fd00::1/64"]}),
        ];
        for spec in bad {
            assert!(!validate(&node(spec.clone()), true).is_empty(), "{spec}");
        }
    }

    #[test]
    fn update_rules() {
        let empty = node(json!({}));
        let one = node(json!({"podCIDRs": ["10.0.0.0/24"]}));
        let two = node(json!({"podCIDRs": ["10.0.0.0/24", "fd00::/64"]}));
        let other = node(json!({"podCIDRs": ["10.0.1.0/24"]}));
        assert!(validate_update(&one, &empty).is_empty());
        let swapped = node(json!({"podCIDRs": ["fd00::/64", "10.0.0.0/24"]}));
        assert_eq!(
            validate_update(&swapped, &two).len(),
            2,
            "one cause per changed entry"
        );
        assert!(validate_update(&one, &one).is_empty());
        assert!(!validate_update(&two, &one).is_empty());
        assert!(!validate_update(&other, &one).is_empty());
        assert!(!validate_update(&empty, &one).is_empty());
    }

    #[test]
    fn convert_fills_in_and_lets_pod_cidr_win() {
        let n = node(json!({"podCIDR": "10.0.0.0/24"}));
        assert_eq!(n["spec"]["podCIDRs"], json!(["10.0.0.0/24"]));
        let n = node(json!({"podCIDRs": ["fd00::/64"]}));
        assert_eq!(n["spec"]["podCIDR"], json!("fd00::/64"));
        let n = node(json!({"podCIDR": "10.0.1.0/24", "podCIDRs": ["10.0.0.0/24", "fd00::/64"]}));
        assert_eq!(
            n["spec"]["podCIDRs"],
            json!(["10.0.1.0/24"]),
            "podCIDR wins"
        );
        let n = node(json!({"podCIDR": "10.0.0.0/24", "podCIDRs": ["10.0.0.0/24", "fd00::/64"]}));
        assert_eq!(n["spec"]["podCIDRs"], json!(["10.0.0.0/24", "fd00::/64"]));
    }
}
