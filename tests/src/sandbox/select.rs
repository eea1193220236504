//! `labelSelector` and `fieldSelector` query parameters.
//!
//! Label selectors: `k=v`, `k==v`, `k!=v`, `k in (a,b)`, `k notin (a,b)`, `k`, `!k`.
//! Field selectors: `metadata.name` and `metadata.namespace` with `=`, `==`, `!=` (other fields
//! are rejected with 400, as kube-apiserver rejects unsupported field labels).

use serde_json::Value;

use super::status::ApiError;

#[derive(Debug, Clone, PartialEq, Eq)]
enum Req {
    Eq(String, String),
    Ne(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

/// A parsed label + field selector; the empty selector matches everything.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    labels: Vec<Req>,
    fields: Vec<Req>,
}

fn split_top(s: &str) -> Vec<String> {
    let mut parts = Vec::new();
    let mut depth = 0i32;
    let mut cur = String::new();
    for c in s.chars() {
        match c {
            '(' => depth += 1,
            ')' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(std::mem::take(&mut cur));
                continue;
            }
            _ => {}
        }
        cur.push(c);
    }
    parts.push(cur);
    parts
        .into_iter()
        .map(|p| p.trim().to_owned())
        .filter(|p| !p.is_empty())
        .collect()
}

fn parse_set(s: &str) -> Option<Vec<String>> {
    let inner = s.trim().strip_prefix('(')?.strip_suffix(')')?;
    Some(
        inner
            .split(',')
            .map(|v| v.trim().to_owned())
            .filter(|v| !v.is_empty())
            .collect(),
    )
}

fn parse_req(term: &str) -> Option<Req> {
    if let Some((k, v)) = term.split_once("!=") {
        return Some(Req::Ne(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, v)) = term.split_once("==") {
        return Some(Req::Eq(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, v)) = term.split_once('=') {
        return Some(Req::Eq(k.trim().to_owned(), v.trim().to_owned()));
    }
    if let Some((k, rest)) = term.split_once(" notin ") {
        return Some(Req::NotIn(k.trim().to_owned(), parse_set(rest)?));
    }
    if let Some((k, rest)) = term.split_once(" in ") {
        return Some(Req::In(k.trim().to_owned(), parse_set(rest)?));
    }
    if let Some(k) = term.strip_prefix('!') {
        return Some(Req::NotExists(k.trim().to_owned()));
    }
    if term.contains(' ') || term.contains('(') {
        return None;
    }
    Some(Req::Exists(term.to_owned()))
}

fn matches(req: &Req, get: &dyn Fn(&str) -> Option<String>) -> bool {
    match req {
        Req::Eq(k, v) => get(k).as_deref() == Some(v.as_str()),
        Req::Ne(k, v) => get(k).as_deref() != Some(v.as_str()),
        Req::In(k, vs) => get(k).is_some_and(|x| vs.contains(&x)),
        Req::NotIn(k, vs) => get(k).is_none_or(|x| !vs.contains(&x)),
        Req::Exists(k) => get(k).is_some(),
        Req::NotExists(k) => get(k).is_none(),
    }
}

impl Selector {
    /// Parse the two query parameters.
    ///
    /// # Errors
    /// 400 BadRequest for a malformed selector or an unsupported field label.
    pub fn parse(
        label_selector: Option<&str>,
        field_selector: Option<&str>,
    ) -> Result<Self, ApiError> {
        let mut sel = Selector::default();
        for term in split_top(label_selector.unwrap_or("")) {
            let req = parse_req(&term).ok_or_else(|| {
                ApiError::bad_request(format!("unable to parse requirement: {term:?}"))
            })?;
            sel.labels.push(req);
        }
        for term in split_top(field_selector.unwrap_or("")) {
            let req = parse_req(&term).ok_or_else(|| {
                ApiError::bad_request(format!("invalid field selector: {term:?}"))
            })?;
            let key = match &req {
                Req::Eq(k, _) | Req::Ne(k, _) => k.clone(),
                _ => {
                    return Err(ApiError::bad_request(format!(
                        "invalid selector: '{term}'; can't understand '{term}'"
                    )));
                }
            };
            if key != "metadata.name" && key != "metadata.namespace" {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {key}"
                )));
            }
            sel.fields.push(req);
        }
        Ok(sel)
    }

    /// Whether the selector is empty.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    /// Whether a stored object matches: without label requirements only its key is needed (no
    /// parse); otherwise its JSON is parsed.
    pub fn matches_object(&self, obj: &super::object::StoredObject) -> bool {
        if self.is_empty() {
            return true;
        }
        if self.labels.is_empty() {
            let key = obj.key();
            let get_field = |k: &str| match k {
                "metadata.name" => Some(key.name.clone()),
                "metadata.namespace" => Some(key.ns.clone()),
                _ => Some(String::new()),
            };
            return self.fields.iter().all(|r| matches(r, &get_field));
        }
        self.matches(&obj.to_value())
    }

    /// Whether `obj` matches.
    pub fn matches(&self, obj: &Value) -> bool {
        let labels = obj.pointer("/metadata/labels").and_then(Value::as_object);
        let get_label = |k: &str| {
            labels
                .and_then(|l| l.get(k))
                .and_then(Value::as_str)
                .map(str::to_owned)
        };
        let get_field = |k: &str| {
            let ptr = format!("/{}", k.replace('.', "/"));
            Some(
                obj.pointer(&ptr)
                    .and_then(Value::as_str)
                    .unwrap_or("")
                    .to_owned(),
            )
        };
        self.labels.iter().all(|r| matches(r, &get_label))
            && self.fields.iter().all(|r| matches(r, &get_field))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn selector_table() {
        let obj = json!({"metadata": {"name": "n1", "labels": {"a": "1", "b": "2"}}});
        let cases = [
            (Some("a=1"), None, true),
            (Some("a==1,b=2"), None, true),
            (Some("a!=1"), None, false),
            (Some("a in (1,3)"), None, true),
            (Some("a notin (1,3)"), None, false),
            (Some("c"), None, false),
            (Some("!c"), None, true),
            (None, Some("metadata.name=n1"), true),
            (None, Some("metadata.name!=n1"), false),
            (None, Some("metadata.name=n2"), false),
        ];
        for (l, f, want) in cases {
            let sel = Selector::parse(l, f).expect("parses");
            assert_eq!(sel.matches(&obj), want, "{l:?} {f:?}");
        }
        assert!(Selector::parse(None, Some("spec.podCIDR=x")).is_err());
    }
}
