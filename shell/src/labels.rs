//! Kubernetes labels: the one home for what a label key and value may be, for the string form of
//! a label selector, and for matching a Node's labels.
//!
//! - **Validation** ([`validate_key`], [`validate_value`], [`InvalidLabel`]): apimachinery's
//!   `validateLabelKey` (`IsQualifiedName`) and `validateLabelValue` (`IsValidLabelValue`),
//!   `pkg/util/validation/validation.go`. A key is `[prefix/]name`: the prefix a lower-case DNS
//!   subdomain (RFC 1123) of at most 253 characters, the name at most 63 alphanumerics, `-`, `_`,
//!   `.`, starting and ending alphanumeric. A value is empty or such a name. Every reader of a
//!   label key or value (`--node-selector`, a node-pool rule, a ClusterCIDR's node selector)
//!   checks it here, with one wording.
//! - **The string form** ([`selector`]: [`NodeSelector`], `--node-selector`): apimachinery's
//!   `labels.Parse` into kube-rs [`Expression`]s.
//! - **Matching**: kube-rs's [`SelectorExt::matches`](kube::core::SelectorExt::matches) on
//!   [`Expression`]s, apimachinery's semantics (`!=` and `notin` hold for a Node without the
//!   key). A node-pool rule's
//!   `KEY=VALUE` is [`Expression::Equal`]'s rule ([`has_label`]); a core/v1 `NodeSelector` (a
//!   ClusterCIDR's) is read by [`terms`] into [`NodeSelectorTerms`]: its `In`, `NotIn`,
//!   `Exists`, `DoesNotExist` requirements as kube-rs [`Expression`]s, `Gt`/`Lt` and
//!   `matchFields` on `metadata.name` (which a label selector cannot say) beside them.

use std::collections::BTreeMap;

use kube::core::Expression;

pub mod selector;
pub mod terms;

pub use selector::{NodeSelector, SelectorError};
pub use terms::NodeSelectorTerms;

/// Why a label key or value is refused. The message names the key (and value) and the rule it
/// breaks, in apimachinery's words.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum InvalidLabel {
    /// A key is not a qualified name.
    #[error("invalid label key {key:?}: {why}")]
    Key {
        /// The key as written.
        key: String,
        /// The rule it breaks.
        why: &'static str,
    },
    /// A value is not a label value.
    #[error("invalid label value {value:?} for key {key:?}: {why}")]
    Value {
        /// The key the value belongs to.
        key: String,
        /// The value as written.
        value: String,
        /// The rule it breaks.
        why: &'static str,
    },
}

/// The longest label name or value (apimachinery `validation.LabelValueMaxLength`).
const NAME_MAX: usize = 63;
/// The longest key prefix (`validation.DNS1123SubdomainMaxLength`).
const PREFIX_MAX: usize = 253;

/// apimachinery's `qualifiedNameFmt` for the name part: alphanumerics, `-`, `_`, `.`, starting
/// and ending alphanumeric, at most 63 characters.
fn check_name(name: &str) -> Result<(), &'static str> {
    if name.len() > NAME_MAX {
        return Err("must be no more than 63 characters");
    }
    let bytes = name.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return Err("name part must be non-empty");
    };
    if !first.is_ascii_alphanumeric() || !last.is_ascii_alphanumeric() {
        return Err("must start and end with an alphanumeric character");
    }
    if !bytes
        .iter()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
    {
        return Err("must consist of alphanumeric characters, '-', '_' or '.'");
    }
    Ok(())
}

/// apimachinery's `IsDNS1123Subdomain`: lower-case labels of alphanumerics and `-` (starting
/// and ending alphanumeric) joined by `.`, at most 253 characters.
fn check_prefix(prefix: &str) -> Result<(), &'static str> {
    if prefix.is_empty() {
        return Err("prefix part must be non-empty");
    }
    if prefix.len() > PREFIX_MAX {
        return Err("prefix part must be no more than 253 characters");
    }
    let label_ok = |label: &str| {
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        let bytes = label.as_bytes();
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes.iter().all(|b| alnum(b) || *b == b'-')
    };
    if prefix.split('.').all(label_ok) {
        Ok(())
    } else {
        Err("prefix part must be a lowercase DNS subdomain (RFC 1123)")
    }
}

/// apimachinery's `validateLabelKey` (`IsQualifiedName`): `[prefix/]name`.
///
/// # Errors
/// [`InvalidLabel::Key`] naming the rule the key breaks.
pub fn validate_key(key: &str) -> Result<(), InvalidLabel> {
    let checked = match key.split_once('/') {
        None => check_name(key),
        Some((prefix, name)) if !name.contains('/') => check_prefix(prefix).and(check_name(name)),
        Some(_) => Err("a qualified name has at most one '/'"),
    };
    checked.map_err(|why| InvalidLabel::Key {
        key: key.to_owned(),
        why,
    })
}

/// apimachinery's `validateLabelValue` (`IsValidLabelValue`): empty, or a name.
///
/// # Errors
/// [`InvalidLabel::Value`] naming the key and the rule the value breaks.
pub fn validate_value(key: &str, value: &str) -> Result<(), InvalidLabel> {
    if value.is_empty() {
        return Ok(());
    }
    check_name(value).map_err(|why| InvalidLabel::Value {
        key: key.to_owned(),
        value: value.to_owned(),
        why,
    })
}

/// Whether `labels` has label `key` equal to `value`: [`Expression::Equal`]'s rule (a node-pool
/// rule's `KEY=VALUE`), without building the expression for every Node.
pub fn has_label(labels: &BTreeMap<String, String>, key: &str, value: &str) -> bool {
    labels.get(key).is_some_and(|v| v == value)
}

/// The label key an expression reads.
pub fn key_of(expression: &Expression) -> &str {
    match expression {
        Expression::In(key, _)
        | Expression::NotIn(key, _)
        | Expression::Equal(key, _)
        | Expression::NotEqual(key, _)
        | Expression::Exists(key)
        | Expression::DoesNotExist(key) => key,
    }
}

/// The longest key prefix apimachinery accepts: 253 characters, four DNS labels.
#[cfg(test)]
pub(crate) fn longest_key_prefix() -> String {
    [
        "a".repeat(63),
        "b".repeat(63),
        "c".repeat(63),
        "d".repeat(61),
    ]
    .join(".")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use kube::core::SelectorExt;

    use super::*;

    /// apimachinery's key and value rules, each with the message it gives (one wording for every
    /// reader of a label).
    #[test]
    fn keys_and_values_follow_apimachinery() {
        let prefix = longest_key_prefix();
        for good in [
            "x",
            "kubernetes.io/os",
            "0.1.2.domain/99",
            "a_b.c-d",
            &"k".repeat(63),
            &format!("{prefix}/{}", "n".repeat(63)),
        ] {
            assert_eq!(validate_key(good), Ok(()), "{good}");
        }
        let bad: &[(&str, &str)] = &[
            ("", "name part must be non-empty"),
            ("a/", "name part must be non-empty"),
            ("/x", "prefix part must be non-empty"),
            ("-x", "must start and end with an alphanumeric character"),
            ("x-", "must start and end with an alphanumeric character"),
            (
                "x@y",
                "must consist of alphanumeric characters, '-', '_' or '.'",
            ),
            (
                "k\u{e9}y",
                "must consist of alphanumeric characters, '-', '_' or '.'",
            ),
            (
                "Example.com/x",
                "prefix part must be a lowercase DNS subdomain (RFC 1123)",
            ),
            (
                "a..b/x",
                "prefix part must be a lowercase DNS subdomain (RFC 1123)",
            ),
            (
                "-a.b/x",
                "prefix part must be a lowercase DNS subdomain (RFC 1123)",
            ),
            ("a/b/c", "a qualified name has at most one '/'"),
        ];
        for (key, why) in bad {
            assert_eq!(
                validate_key(key),
                Err(InvalidLabel::Key {
                    key: (*key).to_owned(),
                    why
                }),
                "{key:?}"
            );
        }
        let long = "k".repeat(64);
        assert_eq!(
            validate_key(&long).unwrap_err().to_string(),
            format!("invalid label key {long:?}: must be no more than 63 characters")
        );
        assert_eq!(
            validate_key(&format!("{prefix}e/n"))
                .unwrap_err()
                .to_string(),
            format!(
                "invalid label key \"{prefix}e/n\": prefix part must be no more than 253 characters"
            )
        );
        for good in ["", "v", "a.b_c-d", &"v".repeat(63)] {
            assert_eq!(validate_value("k", good), Ok(()), "{good:?}");
        }
        for bad in ["-v", "v_", "a:b", "a b", &"v".repeat(64)] {
            assert!(
                matches!(validate_value("k", bad), Err(InvalidLabel::Value { .. })),
                "{bad:?}"
            );
        }
        assert_eq!(
            validate_value("pool", "big!").unwrap_err().to_string(),
            "invalid label value \"big!\" for key \"pool\": must start and end with an alphanumeric character"
        );
    }

    /// [`has_label`] is [`Expression::Equal`]'s rule, the empty value included.
    #[test]
    fn has_label_is_kube_rs_equal() {
        let labels: BTreeMap<String, String> = [("pool", "big"), ("empty", "")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        for (key, value) in [
            ("pool", "big"),
            ("pool", "small"),
            ("pool", ""),
            ("empty", ""),
            ("empty", "x"),
            ("absent", ""),
            ("absent", "x"),
        ] {
            let equal = Expression::Equal(key.to_owned(), value.to_owned());
            assert_eq!(
                has_label(&labels, key, value),
                equal.matches(&labels),
                "{key}={value}"
            );
        }
        assert!(has_label(&labels, "pool", "big") && has_label(&labels, "empty", ""));
        assert!(!has_label(&labels, "absent", ""));
    }
}
