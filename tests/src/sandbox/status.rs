//! API errors rendered as `meta/v1` `Status` objects, as kube-apiserver sends them.

use serde_json::{Value, json};

use super::resource::Resource;

/// One `details.causes[]` entry of a `Status` (a field-level validation or conflict cause).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    /// Machine-readable reason, e.g. `FieldValueInvalid`, `FieldValueForbidden`.
    pub reason: String,
    /// Human-readable message.
    pub message: String,
    /// JSON path of the field, e.g. `spec.podCIDRs[0]`.
    pub field: String,
}

impl Cause {
    /// A cause with the given reason, field path and message.
    pub fn new(reason: &str, field: impl Into<String>, message: impl Into<String>) -> Self {
        Self {
            reason: reason.to_owned(),
            message: message.into(),
            field: field.into(),
        }
    }
}

/// An error answer of the sandbox: HTTP code plus the `Status` body fields.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code (`Status.code`).
    pub code: u16,
    /// `Status.reason`, e.g. `NotFound`, `Conflict`, `Invalid`, `Expired`.
    pub reason: &'static str,
    /// `Status.message`.
    pub message: String,
    /// `details.name`, `details.group`, `details.kind` when the error concerns one object.
    pub target: Option<Box<(String, String, String)>>,
    /// `details.causes`.
    pub causes: Vec<Cause>,
    /// `Retry-After` header and `details.retryAfterSeconds`, in seconds.
    pub retry_after_secs: Option<u64>,
    /// `metadata.continue` of the Status (a 410 for an expired continue token carries one).
    pub continue_token: Option<String>,
}

impl ApiError {
    fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            code,
            reason,
            message: message.into(),
            target: None,
            causes: Vec::new(),
            retry_after_secs: None,
            continue_token: None,
        }
    }

    /// The same error with `metadata.continue` set.
    pub fn with_continue(mut self, token: String) -> Self {
        self.continue_token = Some(token);
        self
    }

    /// 504 `Timeout` for a resourceVersion newer than the store's, as
    /// `storage.NewTooLargeResourceVersionError` (`apiserver/pkg/storage/errors.go`) builds it:
    /// message `Timeout: Too large resource version: R, current: C`, `retryAfterSeconds: 1`
    /// (`Retry-After: 1`), one cause `ResourceVersionTooLarge`.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Timeout: Too large resource version: {requested}, current: {current}"),
        );
        e.retry_after_secs = Some(1);
        e.causes = vec![Cause::new(
            "ResourceVersionTooLarge",
            "",
            "Too large resource version",
        )];
        e
    }

    fn about(mut self, res: Resource, name: &str) -> Self {
        self.target = Some(Box::new((
            name.to_owned(),
            res.group().to_owned(),
            res.plural().to_owned(),
        )));
        self
    }

    /// 404 `NotFound`: `nodes "x" not found`.
    pub fn not_found(res: Resource, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", res.qualified_plural()),
        )
        .about(res, name)
    }

    /// 404 for a namespace that does not exist.
    pub fn namespace_not_found(ns: &str) -> Self {
        let mut e = Self::new(404, "NotFound", format!("namespaces \"{ns}\" not found"));
        e.target = Some(Box::new((
            ns.to_owned(),
            String::new(),
            "namespaces".to_owned(),
        )));
        e
    }

    /// 404 for a path the sandbox does not serve.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 `AlreadyExists` on create.
    pub fn already_exists(res: Resource, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", res.qualified_plural()),
        )
        .about(res, name)
    }

    /// 409 `Conflict` for a stale `metadata.resourceVersion` (optimistic concurrency).
    pub fn stale(res: Resource, name: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": the object has been modified; please apply your changes to the latest version and try again",
                res.qualified_plural()
            ),
        )
        .about(res, name)
    }

    /// 409 `Conflict` for a storage precondition (uid, resourceVersion) that does not hold.
    ///
    /// kube-apiserver's text is the storage error's (`StorageError.Error`,
    /// `apiserver/pkg/storage/errors.go`) wrapped by `NewConflict`: `Operation cannot be
    /// fulfilled on nodes "n": StorageError: invalid object, Code: 4, Key: /registry/minions/n,
    /// ResourceVersion: 0, AdditionalErrorMsg: <detail>`.
    pub fn storage_precondition(key: &super::store::Key, detail: &str) -> Self {
        let res = key.res;
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{}\": StorageError: invalid object, Code: 4, Key: {}, ResourceVersion: 0, AdditionalErrorMsg: {detail}",
                res.qualified_plural(),
                key.name,
                res.etcd_key(&key.ns, &key.name)
            ),
        )
        .about(res, &key.name)
    }

    /// 409 `Conflict` with a free-form cause: `Operation cannot be fulfilled on nodes "x": …`
    /// (`NewConflict`, `apimachinery/pkg/api/errors/errors.go`).
    pub fn conflict(res: Resource, name: &str, message: impl std::fmt::Display) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {message}",
                res.qualified_plural()
            ),
        )
        .about(res, name)
    }

    /// 422 `Invalid` with field causes: `Node "x" is invalid: spec.podCIDRs: Forbidden: …`.
    ///
    /// As `NewInvalid` (`apimachinery/pkg/api/errors/errors.go`): `details.causes` has every cause
    /// (duplicates too), the message lists each distinct `field: message` once
    /// (`ErrorList.ToAggregate`), bracketed when there are several.
    /// A custom resource's kind is shown with its group (`ClusterCIDR.nodeipam.io "x" is invalid`).
    pub fn invalid(res: Resource, name: &str, causes: Vec<Cause>) -> Self {
        let shown = if res.is_custom() {
            format!("{}.{}", res.kind(), res.group())
        } else {
            res.kind().to_owned()
        };
        Self::invalid_qualified(&shown, res.group(), res.kind(), name, causes)
    }

    /// 422 `Invalid` whose kind is given as text: `shown` is the `GroupKind` as the message prints
    /// it (e.g. `leases.coordination.k8s.io` when kube-apiserver uses the resource as the kind,
    /// `ListOptions.meta.k8s.io`), `group`/`kind` go to `details`.
    pub fn invalid_qualified(
        shown: &str,
        group: &str,
        kind: &str,
        name: &str,
        causes: Vec<Cause>,
    ) -> Self {
        let mut parts: Vec<String> = Vec::new();
        for c in &causes {
            let text = format!("{}: {}", c.field, c.message);
            if !parts.contains(&text) {
                parts.push(text);
            }
        }
        let message = match parts.len() {
            0 => format!("{shown} \"{name}\" is invalid"),
            1 => format!("{shown} \"{name}\" is invalid: {}", parts.join("")),
            _ => format!("{shown} \"{name}\" is invalid: [{}]", parts.join(", ")),
        };
        let mut e = Self::new(422, "Invalid", message);
        e.target = Some(Box::new((
            name.to_owned(),
            group.to_owned(),
            kind.to_owned(),
        )));
        e.causes = causes;
        e
    }

    /// 400 `BadRequest`.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 410 `Expired` (`Gone`): a resourceVersion or continue token older than the kept history.
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 405 `MethodNotAllowed`.
    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    /// 406 `NotAcceptable` for an `Accept` header naming nothing the server produces
    /// (`errNotAcceptable.Status`, `apiserver/pkg/endpoints/handlers/negotiation/errors.go`):
    /// `only the following media types are accepted: <types>`, no details.
    pub fn not_acceptable(produced: &[&str]) -> Self {
        Self::new(
            406,
            "NotAcceptable",
            format!(
                "only the following media types are accepted: {}",
                produced.join(", ")
            ),
        )
    }

    /// 415 `UnsupportedMediaType` for a PATCH whose content type is not one the sandbox serves,
    /// server-side apply (`application/apply-patch+yaml`) included. kube-apiserver's wording, with
    /// the list of media types the sandbox accepts (kube-apiserver's list also has apply).
    pub fn unsupported_media_type(content_type: &str) -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            format!(
                "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type:?})"
            ),
        )
    }

    /// 415 `UnsupportedMediaType` for a strategic merge patch of a custom resource (which has no
    /// patch strategies): kube-apiserver v1.36's message, word for word (checked against it by
    /// `real_apiserver`'s `crd` test), so it names `application/apply-patch+yaml`, which the sandbox
    /// itself refuses ([`ApiError::unsupported_media_type`]).
    pub fn unsupported_patch_of_custom_resource() -> Self {
        Self::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )
    }

    /// 500 `InternalError`.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 429 `TooManyRequests` with `Retry-After`.
    pub fn too_many_requests(retry_after_secs: u64) -> Self {
        let mut e = Self::new(
            429,
            "TooManyRequests",
            "the server has received too many requests and has asked us to try again later",
        );
        e.retry_after_secs = Some(retry_after_secs);
        e
    }

    /// 504 `Timeout`.
    pub fn timeout(message: impl Into<String>) -> Self {
        Self::new(504, "Timeout", message)
    }

    /// An error with an arbitrary code, for fault injection (reason chosen from the code).
    pub fn with_code(code: u16) -> Self {
        match code {
            400 => Self::bad_request("injected fault"),
            404 => Self::new(404, "NotFound", "injected fault"),
            409 => Self::new(409, "Conflict", "injected fault"),
            410 => Self::expired("injected fault"),
            429 => Self::too_many_requests(1),
            503 => Self::new(503, "ServiceUnavailable", "injected fault"),
            504 => Self::timeout("injected fault"),
            c => Self::new(
                c,
                "InternalError",
                "Internal error occurred: injected fault",
            ),
        }
    }

    /// The `Status` object (`kind: Status`, `apiVersion: v1`).
    pub fn to_status(&self) -> Value {
        let metadata = match &self.continue_token {
            Some(c) => json!({"continue": c}),
            None => json!({}),
        };
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": metadata,
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        if let Some(target) = &self.target {
            let (name, group, kind) = target.as_ref();
            details.insert("name".into(), json!(name));
            if !group.is_empty() {
                details.insert("group".into(), json!(group));
            }
            details.insert("kind".into(), json!(kind));
        }
        if !self.causes.is_empty() {
            let causes: Vec<Value> = self
                .causes
                .iter()
                .map(|c| {
                    let mut cause = json!({"reason": c.reason, "message": c.message});
                    // `StatusCause.Field` is `omitempty`.
                    if !c.field.is_empty() {
                        cause["field"] = json!(c.field);
                    }
                    cause
                })
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if let Some(secs) = self.retry_after_secs {
            details.insert("retryAfterSeconds".into(), json!(secs));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}

/// A `Status` of success, as returned by DELETE of an object removed at once.
pub fn success_status(res: Resource, name: &str, uid: &str) -> Value {
    let mut details = json!({"name": name, "kind": res.plural(), "uid": uid});
    if !res.group().is_empty() {
        details["group"] = json!(res.group());
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

impl ApiError {
    /// 413 `RequestEntityTooLarge`.
    pub fn new_too_large() -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            "Request entity too large: limit is 3145728",
        )
    }
}
