//! `TokenReview` (`POST /apis/authentication.k8s.io/v1/tokenreviews`) and
//! `SubjectAccessReview` (`POST /apis/authorization.k8s.io/v1/subjectaccessreviews`), answered
//! from a small static [`AccessTable`] — enough for end-to-end tests of the controller's
//! delegated authentication and authorization (`nodeipam::serving`): tokens map to users, and
//! RBAC-like grants say which user or group may use which verb on which non-resource URL.
//!
//! The rules kube-apiserver applies that matter here:
//! - a TokenReview without `spec.token` is **400** BadRequest ("token is required for TokenReview
//!   in authentication", `pkg/registry/authentication/tokenreview/storage.go`); an unknown token is
//!   201 with `status.authenticated: false` and an `error`;
//! - a SubjectAccessReview needs exactly one of `resourceAttributes` / `nonResourceAttributes` and
//!   a user or a group, else **422** Invalid (`pkg/apis/authorization/validation`
//!   `ValidateSubjectAccessReviewSpec`); the answer is 201 with `status.allowed` and a `reason`;
//! - non-resource URL rules match as RBAC's `NonResourceURLs` do (exact, or a prefix ending in
//!   `*`; verb `*` matches every verb: `pkg/apis/rbac/v1/evaluation_helpers.go`
//!   `NonResourceURLMatches`, `VerbMatches`); resource attributes are never allowed here.
//!
//! Both endpoints only answer POST (405 otherwise) and are logged like every other request.

use serde_json::{Value, json};

use super::status::{ApiError, Cause};

/// Path of the TokenReview collection.
pub const TOKEN_REVIEWS: &str = "/apis/authentication.k8s.io/v1/tokenreviews";
/// Path of the SubjectAccessReview collection.
pub const SUBJECT_ACCESS_REVIEWS: &str = "/apis/authorization.k8s.io/v1/subjectaccessreviews";

/// The user a token authenticates as.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReviewUser {
    /// `status.user.username`.
    pub username: String,
    /// `status.user.uid`.
    pub uid: String,
    /// `status.user.groups` (`system:authenticated` is added, as kube-apiserver does).
    pub groups: Vec<String>,
}

/// Who a grant is for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject {
    /// A user name.
    User(String),
    /// A group name.
    Group(String),
}

/// One RBAC-like rule: `subject` may `verb` (or `*`) the non-resource URL `path` (exact, or a
/// prefix when it ends in `*`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    /// Who.
    pub subject: Subject,
    /// `get`, `post`, … or `*`.
    pub verb: String,
    /// `/metrics`, `/debug/*`, `*`.
    pub path: String,
}

/// Tokens and grants. Empty by default: every token is rejected, nothing is allowed.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessTable {
    tokens: Vec<(String, ReviewUser)>,
    grants: Vec<Grant>,
}

impl AccessTable {
    /// An empty table.
    pub fn new() -> AccessTable {
        AccessTable::default()
    }

    /// `token` authenticates as `username` with `groups`.
    pub fn token(mut self, token: &str, username: &str, groups: &[&str]) -> AccessTable {
        let mut groups: Vec<String> = groups.iter().map(|g| (*g).to_owned()).collect();
        groups.push("system:authenticated".to_owned());
        self.tokens.push((
            token.to_owned(),
            ReviewUser {
                username: username.to_owned(),
                uid: format!("uid-{username}"),
                groups,
            },
        ));
        self
    }

    /// `subject` may `verb` `path`.
    pub fn allow(mut self, subject: Subject, verb: &str, path: &str) -> AccessTable {
        self.grants.push(Grant {
            subject,
            verb: verb.to_owned(),
            path: path.to_owned(),
        });
        self
    }

    /// The user of `token`, if any.
    pub fn user(&self, token: &str) -> Option<&ReviewUser> {
        self.tokens.iter().find(|(t, _)| t == token).map(|(_, u)| u)
    }

    /// Whether `user`/`groups` may `verb` the non-resource `path`.
    pub fn allows(&self, user: &str, groups: &[String], verb: &str, path: &str) -> bool {
        self.grants.iter().any(|g| {
            let subject = match &g.subject {
                Subject::User(name) => name == user,
                Subject::Group(name) => groups.contains(name),
            };
            let verb_ok = g.verb == "*" || g.verb == verb;
            let path_ok = match g.path.strip_suffix('*') {
                Some(prefix) => path.starts_with(prefix),
                None => g.path == path,
            };
            subject && verb_ok && path_ok
        })
    }
}

/// Whether `path` is one of the two review endpoints.
pub fn is_review_path(path: &str) -> bool {
    path == TOKEN_REVIEWS || path == SUBJECT_ACCESS_REVIEWS
}

/// Answers a request to a review endpoint: the review with its `status` filled in (HTTP 201), or
/// the error kube-apiserver would give.
///
/// # Errors
/// 405 for a method other than POST, 400 for a body that is not JSON or a TokenReview without a
/// token, 422 for an invalid SubjectAccessReview spec.
pub fn answer(
    table: &AccessTable,
    method: &str,
    path: &str,
    body: &[u8],
) -> Result<Value, ApiError> {
    if method != "POST" {
        return Err(ApiError::method_not_allowed(format!(
            "the server does not allow this method on the requested resource ({method} {path})"
        )));
    }
    let mut review: Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not JSON: {e}")))?;
    if !review.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    let status = if path == TOKEN_REVIEWS {
        review["apiVersion"] = json!("authentication.k8s.io/v1");
        review["kind"] = json!("TokenReview");
        token_review_status(table, &review)?
    } else {
        review["apiVersion"] = json!("authorization.k8s.io/v1");
        review["kind"] = json!("SubjectAccessReview");
        subject_access_review_status(table, &review)?
    };
    review["status"] = status;
    if review.get("metadata").is_none_or(Value::is_null) {
        review["metadata"] = json!({});
    }
    Ok(review)
}

fn token_review_status(table: &AccessTable, review: &Value) -> Result<Value, ApiError> {
    let token = review["spec"]["token"].as_str().unwrap_or("");
    if token.is_empty() {
        return Err(ApiError::bad_request(
            "token is required for TokenReview in authentication",
        ));
    }
    Ok(match table.user(token) {
        Some(user) => json!({
            "authenticated": true,
            "user": {"username": user.username, "uid": user.uid, "groups": user.groups},
        }),
        None => {
            json!({"authenticated": false, "error": "[invalid bearer token, token lookup failed]"})
        }
    })
}

fn subject_access_review_status(table: &AccessTable, review: &Value) -> Result<Value, ApiError> {
    let spec = &review["spec"];
    let resource = spec.get("resourceAttributes").filter(|v| !v.is_null());
    let non_resource = spec.get("nonResourceAttributes").filter(|v| !v.is_null());
    let user = spec["user"].as_str().unwrap_or("");
    let groups: Vec<String> = spec["groups"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let mut causes = Vec::new();
    if resource.is_some() == non_resource.is_some() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.resourceAttributes",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        ));
    }
    if user.is_empty() && groups.is_empty() {
        causes.push(Cause::new(
            "FieldValueInvalid",
            "spec.user",
            "at least one of user or group must be specified",
        ));
    }
    if !causes.is_empty() {
        return Err(ApiError::invalid_qualified(
            "SubjectAccessReview.authorization.k8s.io",
            "authorization.k8s.io",
            "SubjectAccessReview",
            "",
            causes,
        ));
    }
    let Some(attributes) = non_resource else {
        return Ok(json!({"allowed": false, "reason": "the sandbox grants no resource access"}));
    };
    let verb = attributes["verb"].as_str().unwrap_or("");
    let path = attributes["path"].as_str().unwrap_or("");
    Ok(if table.allows(user, &groups, verb, path) {
        json!({"allowed": true, "reason": format!("sandbox: {user:?} may {verb} {path}")})
    } else {
        json!({"allowed": false})
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> AccessTable {
        AccessTable::new()
            .token("t-prom", "system:serviceaccount:monitoring:prometheus", &[])
            .token("t-ops", "alice", &["ops"])
            .allow(
                Subject::User("system:serviceaccount:monitoring:prometheus".to_owned()),
                "get",
                "/metrics",
            )
            .allow(Subject::Group("ops".to_owned()), "*", "/debug/*")
    }

    fn post(path: &str, body: Value) -> Result<Value, ApiError> {
        answer(&table(), "POST", path, body.to_string().as_bytes())
    }

    #[test]
    fn token_reviews() {
        let ok = post(TOKEN_REVIEWS, json!({"spec": {"token": "t-ops"}})).expect("reviewed");
        assert_eq!(ok["kind"], "TokenReview");
        assert_eq!(ok["status"]["authenticated"], true);
        assert_eq!(ok["status"]["user"]["username"], "alice");
        assert_eq!(
            ok["status"]["user"]["groups"],
            json!(["ops", "system:authenticated"])
        );
        let bad = post(TOKEN_REVIEWS, json!({"spec": {"token": "forged"}})).expect("reviewed");
        assert_eq!(bad["status"]["authenticated"], false);
        let empty = post(TOKEN_REVIEWS, json!({"spec": {}})).expect_err("no token");
        assert_eq!(empty.code, 400);
        let get = answer(&table(), "GET", TOKEN_REVIEWS, b"").expect_err("POST only");
        assert_eq!(get.code, 405);
    }

    #[test]
    fn subject_access_reviews_match_rbac_non_resource_rules() {
        let sar = |user: &str, groups: Value, verb: &str, path: &str| {
            post(
                SUBJECT_ACCESS_REVIEWS,
                json!({"spec": {"user": user, "groups": groups,
                                "nonResourceAttributes": {"verb": verb, "path": path}}}),
            )
            .expect("reviewed")["status"]["allowed"]
                == true
        };
        let prom = "system:serviceaccount:monitoring:prometheus";
        assert!(sar(prom, json!([]), "get", "/metrics"));
        assert!(!sar(prom, json!([]), "post", "/metrics"));
        assert!(!sar(prom, json!([]), "get", "/metrics/extra"));
        assert!(!sar("alice", json!(["ops"]), "get", "/metrics"));
        assert!(sar("alice", json!(["ops"]), "delete", "/debug/pprof"));
        assert!(!sar("mallory", json!(["dev"]), "get", "/debug/pprof"));
        let both = post(
            SUBJECT_ACCESS_REVIEWS,
            json!({"spec": {"user": "alice", "nonResourceAttributes": {"verb": "get", "path": "/"},
                            "resourceAttributes": {"verb": "get", "resource": "nodes"}}}),
        )
        .expect_err("both attribute kinds");
        assert_eq!(both.code, 422);
        let nobody = post(
            SUBJECT_ACCESS_REVIEWS,
            json!({"spec": {"nonResourceAttributes": {"verb": "get", "path": "/metrics"}}}),
        )
        .expect_err("no user or group");
        assert_eq!(nobody.code, 422);
    }
}
