//! LIST/WATCH query options, decoded, defaulted and validated as kube-apiserver does before it
//! lists or watches (`listOpts` in `apiserver/pkg/endpoints/handlers/get.go`):
//!
//! 1. `DecodeParameters` into `metainternalversion.ListOptions`: booleans are true unless `0` or
//!    `false` (any case) (`Convert_Slice_string_To_bool` / `_To_Pointer_bool`,
//!    `apimachinery/pkg/runtime/conversion.go`), integers must parse (else **400**);
//! 2. `SetListOptionsDefaults` (`apimachinery/pkg/apis/meta/internalversion/defaults.go`): with the
//!    WatchList feature on, a watch with resourceVersion `""` or `"0"` and neither
//!    `sendInitialEvents` nor `resourceVersionMatch` becomes `sendInitialEvents=true`,
//!    `resourceVersionMatch=NotOlderThan`;
//! 3. `ValidateListOptions` (`apimachinery/pkg/apis/meta/internalversion/validation/
//!    validation.go`), errors ⇒ **422** `ListOptions.meta.k8s.io "" is invalid: …`.
//!
//! kube-apiserver enables WatchList by default since 1.34 (`apiserver/pkg/features/
//! kube_features.go`); [`super::SandboxOptions::watch_list`] turns it off, and then a
//! streaming-list request (`sendInitialEvents` on a watch) is the 422 `sendInitialEvents:
//! Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is
//! enabled` a 1.33 server gives, which makes clients fall back to a paged LIST.

use std::collections::HashMap;
use std::time::Duration;

use super::list::ListParams;
use super::resource::Resource;
use super::select::Selector;
use super::status::{ApiError, Cause};

/// `metainternalversion.ListOptions` as decoded from the query.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ListOptions {
    /// `watch`.
    pub watch: bool,
    /// `resourceVersion` (`None` when absent).
    pub resource_version: Option<String>,
    /// `resourceVersionMatch` (`None` when absent or empty).
    pub resource_version_match: Option<String>,
    /// `sendInitialEvents` (`None` when absent).
    pub send_initial_events: Option<bool>,
    /// `allowWatchBookmarks`.
    pub allow_watch_bookmarks: bool,
    /// `limit` (≤ 0 = none).
    pub limit: i64,
    /// `continue`.
    pub continue_token: Option<String>,
    /// `timeoutSeconds`.
    pub timeout_seconds: Option<i64>,
}

/// Go's query boolean: true unless `0` or `false` (any case).
pub fn query_bool(v: &str) -> bool {
    !(v == "0" || v.eq_ignore_ascii_case("false"))
}

fn query_int(v: &str) -> Result<i64, ApiError> {
    v.parse::<i64>().map_err(|_| {
        ApiError::bad_request(format!("strconv.ParseInt: parsing {v:?}: invalid syntax"))
    })
}

fn forbidden(field: &str, detail: &str) -> Cause {
    Cause::new("FieldValueForbidden", field, format!("Forbidden: {detail}"))
}

fn not_supported(field: &str, value: &str, allowed: &[&str]) -> Cause {
    let allowed: Vec<String> = allowed.iter().map(|a| format!("{a:?}")).collect();
    Cause::new(
        "FieldValueNotSupported",
        field,
        format!(
            "Unsupported value: {value:?}: supported values: {}",
            allowed.join(", ")
        ),
    )
}

impl ListOptions {
    /// Decode the query (step 1).
    ///
    /// # Errors
    /// 400 for an integer that does not parse.
    pub fn from_query(q: &HashMap<String, String>) -> Result<Self, ApiError> {
        let non_empty = |k: &str| q.get(k).filter(|v| !v.is_empty()).cloned();
        Ok(ListOptions {
            watch: q.get("watch").is_some_and(|v| query_bool(v)),
            resource_version: q.get("resourceVersion").cloned(),
            resource_version_match: non_empty("resourceVersionMatch"),
            send_initial_events: q.get("sendInitialEvents").map(|v| query_bool(v)),
            allow_watch_bookmarks: q.get("allowWatchBookmarks").is_some_and(|v| query_bool(v)),
            limit: q
                .get("limit")
                .map(|v| query_int(v))
                .transpose()?
                .unwrap_or(0),
            continue_token: non_empty("continue"),
            timeout_seconds: q.get("timeoutSeconds").map(|v| query_int(v)).transpose()?,
        })
    }

    fn rv(&self) -> &str {
        self.resource_version.as_deref().unwrap_or("")
    }

    /// `SetListOptionsDefaults` (step 2).
    pub fn set_defaults(&mut self, watch_list: bool) {
        if !watch_list
            || self.send_initial_events.is_some()
            || self.resource_version_match.is_some()
        {
            return;
        }
        if self.watch && matches!(self.rv(), "" | "0") {
            self.send_initial_events = Some(true);
            self.resource_version_match = Some("NotOlderThan".to_owned());
        }
    }

    /// `ValidateListOptions` (step 3): the causes, in upstream's order.
    pub fn validate(&self, watch_list: bool) -> Vec<Cause> {
        let mut causes = Vec::new();
        let m = self.resource_version_match.as_deref();
        if self.watch {
            if self.send_initial_events.is_some() {
                if m != Some("NotOlderThan") {
                    causes.push(forbidden(
                        "resourceVersionMatch",
                        "sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
                    ));
                }
                if !watch_list {
                    causes.push(forbidden(
                        "sendInitialEvents",
                        "sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
                    ));
                }
            }
            if let Some(m) = m {
                if self.send_initial_events.is_none() {
                    causes.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
                    ));
                }
                if m != "NotOlderThan" {
                    causes.push(not_supported("resourceVersionMatch", m, &["NotOlderThan"]));
                }
                if self.continue_token.is_some() {
                    causes.push(forbidden(
                        "resourceVersionMatch",
                        "resourceVersionMatch is forbidden when continue is provided",
                    ));
                }
            }
            return causes;
        }
        if let Some(m) = m {
            if self.rv().is_empty() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden unless resourceVersion is provided",
                ));
            }
            if self.continue_token.is_some() {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch is forbidden when continue is provided",
                ));
            }
            if m != "Exact" && m != "NotOlderThan" {
                causes.push(not_supported(
                    "resourceVersionMatch",
                    m,
                    &["Exact", "NotOlderThan", ""],
                ));
            }
            if m == "Exact" && self.rv() == "0" {
                causes.push(forbidden(
                    "resourceVersionMatch",
                    "resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
                ));
            }
        }
        if self.send_initial_events.is_some() {
            causes.push(forbidden(
                "sendInitialEvents",
                "sendInitialEvents is forbidden for list",
            ));
        }
        causes
    }

    /// Decode, default and validate (steps 1–3).
    ///
    /// # Errors
    /// 400 (decoding), 422 Invalid (validation).
    pub fn parse(q: &HashMap<String, String>, watch_list: bool) -> Result<Self, ApiError> {
        let mut o = Self::from_query(q)?;
        o.set_defaults(watch_list);
        let causes = o.validate(watch_list);
        if !causes.is_empty() {
            return Err(ApiError::invalid_qualified(
                "ListOptions.meta.k8s.io",
                "meta.k8s.io",
                "ListOptions",
                "",
                causes,
            ));
        }
        Ok(o)
    }

    /// The parameters of a LIST.
    ///
    /// # Errors
    /// 400 for a resourceVersion together with a continue token (`storage.ValidateListOptions`,
    /// `apiserver/pkg/storage/interfaces.go`: `specifying resource version is not allowed when
    /// using continue`, unless it is `0`).
    pub fn list_params(&self, selector: Selector) -> Result<ListParams, ApiError> {
        if self.continue_token.is_some() && !matches!(self.rv(), "" | "0") {
            return Err(ApiError::bad_request(
                "specifying resource version is not allowed when using continue",
            ));
        }
        Ok(ListParams {
            resource_version: self.resource_version.clone(),
            resource_version_match: self.resource_version_match.clone(),
            limit: usize::try_from(self.limit).unwrap_or(0),
            continue_token: self.continue_token.clone(),
            selector,
        })
    }

    /// The parameters of a WATCH.
    pub fn watch_params(
        &self,
        resource: Resource,
        namespace: Option<String>,
        selector: Selector,
    ) -> super::watch::WatchParams {
        super::watch::WatchParams {
            resource,
            namespace,
            resource_version: self.resource_version.clone(),
            bookmarks: self.allow_watch_bookmarks,
            send_initial_events: self.send_initial_events,
            timeout: self
                .timeout_seconds
                .and_then(|t| u64::try_from(t).ok())
                .filter(|t| *t > 0)
                .map(Duration::from_secs),
            selector,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(s: &str) -> HashMap<String, String> {
        form_urlencoded::parse(s.as_bytes()).into_owned().collect()
    }

    /// Query → the 422 message (or `ok`), with WatchList on and off.
    #[test]
    fn validation_table() {
        let prefix = "ListOptions.meta.k8s.io \"\" is invalid: ";
        let cases: [(&str, bool, &str); 14] = [
            ("watch=1&resourceVersion=5", true, "ok"),
            ("watch=1", true, "ok"),
            (
                "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
                true,
                "ok",
            ),
            (
                "watch=1&sendInitialEvents=true",
                true,
                "resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan",
            ),
            (
                "watch=1&resourceVersion=5&resourceVersionMatch=NotOlderThan",
                true,
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden for watch unless sendInitialEvents is provided",
            ),
            (
                "watch=1&sendInitialEvents=true&resourceVersionMatch=Exact",
                true,
                "[resourceVersionMatch: Forbidden: sendInitialEvents requires setting resourceVersionMatch to NotOlderThan, resourceVersionMatch: Unsupported value: \"Exact\": supported values: \"NotOlderThan\"]",
            ),
            (
                "watch=1&sendInitialEvents=true&resourceVersionMatch=NotOlderThan&allowWatchBookmarks=true",
                false,
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for watch unless the WatchList feature gate is enabled",
            ),
            ("watch=1", false, "ok"),
            ("limit=500", true, "ok"),
            (
                "resourceVersionMatch=NotOlderThan",
                true,
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden unless resourceVersion is provided",
            ),
            (
                "resourceVersion=0&resourceVersionMatch=Exact",
                true,
                "resourceVersionMatch: Forbidden: resourceVersionMatch \"exact\" is forbidden for resourceVersion \"0\"",
            ),
            (
                "resourceVersion=3&resourceVersionMatch=Newest",
                true,
                "resourceVersionMatch: Unsupported value: \"Newest\": supported values: \"Exact\", \"NotOlderThan\", \"\"",
            ),
            (
                "sendInitialEvents=false",
                true,
                "sendInitialEvents: Forbidden: sendInitialEvents is forbidden for list",
            ),
            (
                "continue=abc&resourceVersion=3&resourceVersionMatch=Exact",
                true,
                "resourceVersionMatch: Forbidden: resourceVersionMatch is forbidden when continue is provided",
            ),
        ];
        for (q, watch_list, want) in cases {
            let got = match ListOptions::parse(&query(q), watch_list) {
                Ok(_) => "ok".to_owned(),
                Err(e) => {
                    assert_eq!((e.code, e.reason), (422, "Invalid"), "{q}");
                    e.message
                        .strip_prefix(prefix)
                        .unwrap_or(&e.message)
                        .to_owned()
                }
            };
            assert_eq!(got, want, "{q} (WatchList {watch_list})");
        }
    }

    #[test]
    fn decoding_and_defaults() {
        let o = ListOptions::parse(&query("watch=yes&allowWatchBookmarks=True"), true).expect("ok");
        assert!(o.watch && o.allow_watch_bookmarks);
        assert_eq!(
            (o.send_initial_events, o.resource_version_match.as_deref()),
            (Some(true), Some("NotOlderThan")),
            "a legacy watch becomes a streaming one with WatchList"
        );
        let o = ListOptions::parse(&query("watch=1&resourceVersion=0"), false).expect("ok");
        assert_eq!(o.send_initial_events, None);
        let o = ListOptions::parse(&query("watch=false&resourceVersion=7"), true).expect("ok");
        assert!(!o.watch);
        let e = ListOptions::parse(&query("limit=ten"), true).expect_err("bad int");
        assert_eq!(
            (e.code, e.message.as_str()),
            (400, "strconv.ParseInt: parsing \"ten\": invalid syntax")
        );
        let o = ListOptions::parse(&query("continue=t&resourceVersion=4"), true).expect("valid");
        assert_eq!(
            o.list_params(Selector::default())
                .map(|_| ())
                .map_err(|e| e.message),
            Err("specifying resource version is not allowed when using continue".to_owned())
        );
    }
}
