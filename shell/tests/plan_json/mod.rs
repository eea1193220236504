//! Reading the report of `nodeipam-controller plan -o json` in the binary's tests (`plan.rs`,
//! `cli.rs`): the rows of one of its lists (`nodes`, `pools`, `clusterCIDRs`) cut down to the
//! columns a test compares.
#![allow(dead_code)]

use serde_json::Value;

/// The rows of the report's list `list` (panics if it is not an array).
pub fn rows<'a>(json: &'a Value, list: &str) -> &'a [Value] {
    json[list]
        .as_array()
        .unwrap_or_else(|| panic!("{list} is not an array: {json}"))
}

/// Field `key` of `row` as text (`""` where it is absent or not a string).
pub fn text(row: &Value, key: &str) -> String {
    row[key].as_str().unwrap_or_default().to_owned()
}

/// Field `key` of `row` as a number (`0` where it is absent or not a number).
pub fn number(row: &Value, key: &str) -> u64 {
    row[key].as_u64().unwrap_or_default()
}

/// The first podCIDR of a `nodes` row (`""` if it has none).
pub fn first_pod_cidr(node: &Value) -> String {
    node["podCIDRs"][0].as_str().unwrap_or_default().to_owned()
}

/// Each `pools` row as `(clusterCIDR, column, used)`, `column` being a number column
/// (`capacity`, `nodeMaskSize` …).
pub fn pools(json: &Value, column: &str) -> Vec<(String, u64, u64)> {
    rows(json, "pools")
        .iter()
        .map(|p| (text(p, "clusterCIDR"), number(p, column), number(p, "used")))
        .collect()
}
