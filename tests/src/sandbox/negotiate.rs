//! Output media type negotiation (`Accept`), as kube-apiserver does it for resource requests.
//!
//! Matches `negotiation.NegotiateOutputMediaType` → `NegotiateMediaTypeOptions` +
//! `acceptMediaTypeOptions` (`apiserver/pkg/endpoints/handlers/negotiation/negotiate.go`), called
//! first by every resource handler (`ListResource` in `handlers/get.go`, create, update, patch,
//! delete): a missing header takes the first serializer; otherwise the clauses are tried in
//! goautoneg's order (q-value, then specific before wildcard, then more parameters first) and the
//! first clause that names a type the server produces (`type/subtype`, `type/*` or `*/*`) with
//! acceptable parameters wins. Parameters: `as`/`g`/`v` ask for a conversion (Table,
//! PartialObjectMetadata); `stream` must be `watch`; `sv` names a server version; `pretty`,
//! `export`, `profile` and unknown ones (e.g. `charset`) are ignored. No clause ⇒ **406
//! NotAcceptable** `only the following media types are accepted: …` (`NewNotAcceptableError`,
//! `negotiation/errors.go`).
//!
//! The sandbox produces JSON only, and no conversions: where kube-apiserver would also serve
//! YAML, protobuf, CBOR, a Table or PartialObjectMetadata, the sandbox answers 406 — in the same
//! shape, listing what it does produce — so a client that cannot live with JSON learns it at once.

use super::status::ApiError;

/// The media types the sandbox produces.
pub const PRODUCED: &[&str] = &["application/json"];

/// One `Accept` clause.
#[derive(Debug, Clone, PartialEq)]
struct Clause {
    ty: String,
    sub: String,
    q: f32,
    params: Vec<(String, String)>,
}

/// goautoneg's `ParseAccept`: comma-separated `type/subtype;k=v` clauses (`*` alone is `*/*`,
/// malformed ranges are skipped, `q` defaults to 1), sorted by q (highest first), then specific
/// type and subtype before wildcards, then more parameters first (a stable sort).
fn parse_accept(header: &str) -> Vec<Clause> {
    let mut out = Vec::new();
    for part in header.split(',') {
        let mut pieces = part.split(';');
        let range = pieces.next().unwrap_or("");
        let mut sp = range.split('/');
        let (ty, sub) = match (
            sp.next().map(str::trim),
            sp.next().map(str::trim),
            sp.next(),
        ) {
            (Some("*"), None, _) => ("*".to_owned(), "*".to_owned()),
            (Some(t), Some(s), None) => (t.to_owned(), s.to_owned()),
            _ => continue,
        };
        let mut clause = Clause {
            ty,
            sub,
            q: 1.0,
            params: Vec::new(),
        };
        for param in pieces {
            let Some((k, v)) = param.split_once('=') else {
                continue;
            };
            let k = k.trim();
            if k == "q" {
                clause.q = v.trim().parse().unwrap_or(0.0);
            } else {
                clause.params.push((k.to_owned(), v.trim().to_owned()));
            }
        }
        out.push(clause);
    }
    out.sort_by(|a, b| {
        b.q.total_cmp(&a.q)
            .then((a.ty == "*").cmp(&(b.ty == "*")))
            .then((a.sub == "*").cmp(&(b.sub == "*")))
            .then(b.params.len().cmp(&a.params.len()))
    });
    out
}

/// `acceptMediaTypeOptions` for the JSON serializer of a resource endpoint we serve.
fn params_acceptable(params: &[(String, String)]) -> bool {
    params.iter().all(|(k, v)| match k.as_str() {
        // A conversion (Table, PartialObjectMetadata…): not produced by the sandbox.
        "as" | "g" | "v" => false,
        "stream" => v.is_empty() || v == "watch",
        "sv" => v.is_empty(),
        _ => true,
    })
}

/// Check the `Accept` header of a resource request.
///
/// # Errors
/// 406 NotAcceptable when no clause names JSON (or a wildcard) with acceptable parameters.
pub fn negotiate(accept: Option<&str>) -> Result<(), ApiError> {
    let header = accept.unwrap_or("");
    if header.is_empty() {
        return Ok(());
    }
    let ok = parse_accept(header).iter().any(|c| {
        let type_ok = matches!(
            (c.ty.as_str(), c.sub.as_str()),
            ("application", "json") | ("application", "*") | ("*", "*")
        );
        type_ok && params_acceptable(&c.params)
    });
    if ok {
        Ok(())
    } else {
        Err(ApiError::not_acceptable(PRODUCED))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accept_table() {
        let served = [
            None,
            Some(""),
            Some("application/json"),
            Some("application/json;charset=utf-8"),
            Some("application/json; pretty=1"),
            Some("application/json;stream=watch"),
            Some("*/*"),
            Some("*"),
            Some("application/*"),
            Some("application/vnd.kubernetes.protobuf, */*"),
            Some("application/vnd.kubernetes.protobuf,application/json"),
            Some("application/json;as=Table;v=v1;g=meta.k8s.io,application/json"),
            Some("application/yaml;q=0.9, application/json;q=0.5"),
        ];
        for a in served {
            assert_eq!(negotiate(a), Ok(()), "{a:?}");
        }
        let refused = [
            "application/vnd.kubernetes.protobuf",
            "application/json;as=Table;v=v1;g=meta.k8s.io",
            "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1",
            "application/yaml",
            "text/html",
            "application/json;stream=other",
            "garbage",
        ];
        for a in refused {
            let e = negotiate(Some(a)).expect_err(a);
            assert_eq!(
                (e.code, e.reason, e.message.as_str()),
                (
                    406,
                    "NotAcceptable",
                    "only the following media types are accepted: application/json"
                ),
                "{a}"
            );
        }
    }

    #[test]
    fn clauses_sort_like_goautoneg() {
        let order: Vec<String> =
            parse_accept("*/*;q=0.5, application/*, application/json;a=1, text/plain;q=0.9")
                .into_iter()
                .map(|c| format!("{}/{}", c.ty, c.sub))
                .collect();
        assert_eq!(
            order,
            ["application/json", "application/*", "text/plain", "*/*"]
        );
    }
}
