//! A core/v1 `NodeSelector` (a ClusterCIDR's `spec.nodeSelector`) as the scheduler reads it
//! (`k8s.io/component-helpers/scheduling/corev1/nodeaffinity`): the terms are ORed, the
//! requirements of one term ANDed; `In`/`NotIn`/`Exists`/`DoesNotExist` on labels (kube-rs
//! [`Expression`]s, matched by [`SelectorExt::matches`]), `Gt`/`Lt` comparing a label as an
//! integer; `matchFields` only on `metadata.name` with `In`/`NotIn`; a term with no requirement
//! matches nothing.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{NodeSelector, NodeSelectorRequirement};
use kube::core::{Expression, SelectorExt};

use super::{key_of, validate_key, validate_value};

/// One requirement of a node selector term, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Requirement {
    /// `In`, `NotIn`, `Exists` or `DoesNotExist` on a label.
    Label(Expression),
    /// `Gt` (`Greater`) or `Lt` (`Less`): the label read as an integer.
    LabelCompare(String, Ordering, i64),
    /// `matchFields` on `metadata.name`: `In` (`true`) or `NotIn` (`false`), names as written.
    NameIn(Vec<String>, bool),
}

impl Requirement {
    fn holds(&self, labels: &BTreeMap<String, String>, node_name: &str) -> bool {
        match self {
            Requirement::Label(expression) => expression.matches(labels),
            Requirement::LabelCompare(key, ordering, bound) => labels
                .get(key)
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v.cmp(bound) == *ordering),
            Requirement::NameIn(names, inside) => names.iter().any(|n| n == node_name) == *inside,
        }
    }

    fn of_label(r: &NodeSelectorRequirement) -> Result<Requirement, String> {
        validate_key(&r.key).map_err(|e| e.to_string())?;
        let values = r.values.clone().unwrap_or_default();
        for value in &values {
            validate_value(&r.key, value).map_err(|e| e.to_string())?;
        }
        let one_integer = || match values.as_slice() {
            [v] => v
                .parse::<i64>()
                .map_err(|_| format!("{} {}: {v:?} is not an integer", r.key, r.operator)),
            _ => Err(format!("{} {} takes exactly one value", r.key, r.operator)),
        };
        let no_values = |expression| {
            if values.is_empty() {
                Ok(Requirement::Label(expression))
            } else {
                Err(format!("{} {} takes no values", r.key, r.operator))
            }
        };
        let some_values = |expression: fn(String, BTreeSet<String>) -> Expression| {
            if values.is_empty() {
                Err(format!("{} {} needs values", r.key, r.operator))
            } else {
                let set = values.iter().cloned().collect();
                Ok(Requirement::Label(expression(r.key.clone(), set)))
            }
        };
        match r.operator.as_str() {
            "In" => some_values(Expression::In),
            "NotIn" => some_values(Expression::NotIn),
            "Exists" => no_values(Expression::Exists(r.key.clone())),
            "DoesNotExist" => no_values(Expression::DoesNotExist(r.key.clone())),
            "Gt" => Ok(Requirement::LabelCompare(
                r.key.clone(),
                Ordering::Greater,
                one_integer()?,
            )),
            "Lt" => Ok(Requirement::LabelCompare(
                r.key.clone(),
                Ordering::Less,
                one_integer()?,
            )),
            other => Err(format!("{}: unknown operator {other:?}", r.key)),
        }
    }

    fn of_field(r: &NodeSelectorRequirement) -> Result<Requirement, String> {
        if r.key != "metadata.name" {
            return Err(format!(
                "matchFields supports only metadata.name, not {:?}",
                r.key
            ));
        }
        let values = r.values.clone().unwrap_or_default();
        match (r.operator.as_str(), values.len()) {
            ("In", 1..) => Ok(Requirement::NameIn(values, true)),
            ("NotIn", 1..) => Ok(Requirement::NameIn(values, false)),
            (operator, _) => Err(format!(
                "matchFields on metadata.name supports In and NotIn with values, not {operator:?}"
            )),
        }
    }

    /// The label key it reads (`None` for `matchFields`).
    fn label_key(&self) -> Option<&str> {
        match self {
            Requirement::Label(expression) => Some(key_of(expression)),
            Requirement::LabelCompare(key, ..) => Some(key),
            Requirement::NameIn(..) => None,
        }
    }

    /// kubectl's label-selector spelling: kube-rs's rendering of an [`Expression`] (`role in
    /// (a,b)`, values sorted; `gpu`; `!spot`), `rank>3`, `metadata.name in (n1)`.
    fn summary(&self) -> String {
        match self {
            Requirement::Label(expression) => expression.to_string(),
            Requirement::LabelCompare(key, Ordering::Greater, bound) => format!("{key}>{bound}"),
            Requirement::LabelCompare(key, _, bound) => format!("{key}<{bound}"),
            Requirement::NameIn(names, inside) => format!(
                "metadata.name {} ({})",
                if *inside { "in" } else { "notin" },
                names.join(",")
            ),
        }
    }
}

/// A checked core/v1 `NodeSelector`: its terms, each a list of requirements.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSelectorTerms {
    terms: Vec<Vec<Requirement>>,
}

impl NodeSelectorTerms {
    /// Checks every requirement of `selector`: label keys and values ([`super::validate_key`],
    /// [`super::validate_value`]), the operator and the number of values it takes, `matchFields`
    /// only on `metadata.name` with `In`/`NotIn`.
    ///
    /// # Errors
    /// The first malformed requirement, in words naming its key and operator.
    pub fn from_api(selector: &NodeSelector) -> Result<NodeSelectorTerms, String> {
        let terms = selector
            .node_selector_terms
            .iter()
            .map(|term| {
                let labels = term.match_expressions.iter().flatten();
                let fields = term.match_fields.iter().flatten();
                labels
                    .map(Requirement::of_label)
                    .chain(fields.map(Requirement::of_field))
                    .collect::<Result<Vec<_>, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(NodeSelectorTerms { terms })
    }

    /// How many requirements the Node (`labels`, `node_name`) meets, counting the matching term
    /// with the most; `None` when no term matches (a term without requirements never does).
    pub fn matching_requirements(
        &self,
        labels: &BTreeMap<String, String>,
        node_name: &str,
    ) -> Option<usize> {
        self.terms
            .iter()
            .filter(|term| !term.is_empty() && term.iter().all(|r| r.holds(labels, node_name)))
            .map(Vec::len)
            .max()
    }

    /// The label keys the requirements read, in term order (duplicates kept).
    pub fn label_keys(&self) -> impl Iterator<Item = &str> {
        self.terms
            .iter()
            .flatten()
            .filter_map(Requirement::label_key)
    }

    /// The selector in one line, in kubectl's label-selector spelling: requirements of a term
    /// joined by ` & `, terms by ` | `.
    pub fn summary(&self) -> String {
        self.terms
            .iter()
            .map(|term| {
                term.iter()
                    .map(Requirement::summary)
                    .collect::<Vec<_>>()
                    .join(" & ")
            })
            .collect::<Vec<_>>()
            .join(" | ")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use serde_json::json;

    use super::*;

    fn terms(selector: serde_json::Value) -> Result<NodeSelectorTerms, String> {
        NodeSelectorTerms::from_api(&serde_json::from_value(selector).unwrap())
    }

    /// The label operators are kube-rs expressions (apimachinery's matching: `NotIn` and
    /// `DoesNotExist` hold without the key); `Gt`/`Lt` and `metadata.name` beside them; the terms
    /// ORed, the best term counted, an empty term matching nothing.
    #[test]
    fn core_v1_terms_match_as_the_scheduler_reads_them() {
        let selector = terms(json!({"nodeSelectorTerms": [
            {"matchExpressions": [
                {"key": "pool", "operator": "In", "values": ["b", "a", "b"]},
                {"key": "spot", "operator": "DoesNotExist"},
                {"key": "zone", "operator": "NotIn", "values": ["z9"]},
                {"key": "max-pods", "operator": "Gt", "values": ["100"]},
            ]},
            {"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["n2", "n1"]}]},
            {},
        ]}))
        .unwrap();
        let labels = |pairs: &[(&str, &str)]| -> BTreeMap<String, String> {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect()
        };
        let good = labels(&[("pool", "a"), ("max-pods", "110")]);
        assert_eq!(selector.matching_requirements(&good, "n0"), Some(4));
        for (key, value) in [
            ("pool", "c"),
            ("spot", ""),
            ("zone", "z9"),
            ("max-pods", "100"),
            ("max-pods", "many"),
        ] {
            let mut changed = good.clone();
            changed.insert(key.to_owned(), value.to_owned());
            assert_eq!(
                selector.matching_requirements(&changed, "n0"),
                None,
                "{key}={value}"
            );
            assert_eq!(
                selector.matching_requirements(&changed, "n1"),
                Some(1),
                "{key}={value}: the name term still matches"
            );
        }
        assert_eq!(
            selector.label_keys().collect::<Vec<_>>(),
            ["pool", "spot", "zone", "max-pods"]
        );
        assert_eq!(
            selector.summary(),
            "pool in (a,b) & !spot & zone notin (z9) & max-pods>100 | metadata.name in (n2,n1) | "
        );
    }

    /// Malformed requirements are refused, naming the key and the operator; label keys and values
    /// by [`super::super::validate_key`]'s wording.
    #[test]
    fn malformed_requirements_are_refused_in_words() {
        let one = |requirement: serde_json::Value| {
            terms(json!({"nodeSelectorTerms": [{"matchExpressions": [requirement]}]}))
        };
        let cases = [
            (json!({"key": "a", "operator": "In"}), "a In needs values"),
            (
                json!({"key": "a", "operator": "Exists", "values": ["x"]}),
                "a Exists takes no values",
            ),
            (
                json!({"key": "a", "operator": "Gt", "values": ["ten"]}),
                "a Gt: \"ten\" is not an integer",
            ),
            (
                json!({"key": "a", "operator": "Lt", "values": ["1", "2"]}),
                "a Lt takes exactly one value",
            ),
            (
                json!({"key": "a", "operator": "Matches", "values": ["x"]}),
                "a: unknown operator \"Matches\"",
            ),
            (
                json!({"key": "-bad-", "operator": "Exists"}),
                "invalid label key \"-bad-\": must start and end with an alphanumeric character",
            ),
            (
                json!({"key": "a", "operator": "In", "values": ["x y"]}),
                "invalid label value \"x y\" for key \"a\": must consist of alphanumeric characters, '-', '_' or '.'",
            ),
        ];
        for (requirement, message) in cases {
            assert_eq!(
                one(requirement.clone()),
                Err(message.to_owned()),
                "{requirement}"
            );
        }
        assert_eq!(
            terms(json!({"nodeSelectorTerms": [{"matchFields": [
                {"key": "metadata.uid", "operator": "In", "values": ["x"]}]}]})),
            Err("matchFields supports only metadata.name, not \"metadata.uid\"".to_owned())
        );
    }
}
