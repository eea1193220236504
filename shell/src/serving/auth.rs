//! Delegated authentication and authorization of requests to the secure port, as
//! kube-controller-manager's delegating authenticator and authorizer do it — asked of the API
//! server, cached briefly:
//!
//! 1. A path in `--authorization-always-allow-paths` ([`AlwaysAllowPaths`], kcm's default
//!    `/healthz,/readyz,/livez`) is served to anyone, without looking at credentials.
//! 2. Any other request needs `Authorization: Bearer <token>`; without one it gets **401** (kcm
//!    would pass it on as `system:anonymous` and ask a SubjectAccessReview for that user, which
//!    RBAC denies unless someone bound that user or `system:unauthenticated`; we refuse outright,
//!    so no binding can open `/metrics` to anonymous clients).
//! 3. The token goes to the API server as a `TokenReview` (`authentication.k8s.io/v1`); not
//!    authenticated → **401**. The answer, either way, is cached for [`CacheTtls::token`]
//!    (kcm: `--authentication-token-webhook-cache-ttl`, default 10 s,
//!    `k8s.io/apiserver/pkg/server/options/authentication.go` `NewDelegatingAuthenticationOptions`;
//!    `authenticatorfactory/delegating.go` uses it for success and failure), keyed by the token's
//!    SHA-256, never the token itself.
//! 4. The user (name, uid, groups, extra) and the request go to a `SubjectAccessReview`
//!    (`authorization.k8s.io/v1`) with `nonResourceAttributes {path, verb}`, the verb being the
//!    lower-cased HTTP method (`GET` → `get`), as kube-apiserver's `RequestInfo` names the verb of a
//!    non-resource request (`k8s.io/apiserver/pkg/endpoints/request/requestinfo.go`
//!    `NewRequestInfo`). Denied → **403** with the reviewer's reason. Allowed answers are cached
//!    for [`CacheTtls::allowed`], denied ones for [`CacheTtls::denied`] (kcm: 10 s each,
//!    `authorization.go` `NewDelegatingAuthorizationOptions`), keyed by the whole review spec as
//!    the webhook authorizer does.
//! 5. **The reviewer is unreachable** (connection refused, timeout after [`REVIEW_TIMEOUT`] — kcm's
//!    `TokenRequestTimeout` — or an error status): the request is **denied**, never allowed — 401
//!    when the TokenReview failed, 500 when the SubjectAccessReview failed (kcm's
//!    `WithAuthentication` answers 401 on an authenticator error; `WithAuthorization` answers 500 on
//!    an authorizer error) — and nothing is cached, so the next request asks again. Each failure
//!    logs one warning naming the review.
//!
//! Error answers are `Status` objects as kube-apiserver writes them (`reason` `Unauthorized`,
//! `Forbidden`, `InternalError`).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec, UserInfo};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::Client;
use kube::api::{Api, PostParams};
use tokio::time::Instant;

pub use crate::flags::serving::AlwaysAllowPaths;

/// Longest wait for one TokenReview or SubjectAccessReview (kcm's `TokenRequestTimeout`, 10 s).
pub const REVIEW_TIMEOUT: Duration = Duration::from_secs(10);

/// Most answers each cache keeps; when full, expired entries go first, then the oldest.
pub const CACHE_CAPACITY: usize = 4096;

/// How long review answers are reused (kcm's defaults: 10 s each).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheTtls {
    /// A TokenReview answer, authenticated or not.
    pub token: Duration,
    /// An allowing SubjectAccessReview answer.
    pub allowed: Duration,
    /// A denying SubjectAccessReview answer.
    pub denied: Duration,
}

impl Default for CacheTtls {
    fn default() -> Self {
        CacheTtls {
            token: Duration::from_secs(10),
            allowed: Duration::from_secs(10),
            denied: Duration::from_secs(10),
        }
    }
}

/// What [`DelegatedAuth::check`] decided for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Serve it. `user` is `None` for an always-allowed path.
    Allowed {
        /// The authenticated user name.
        user: Option<String>,
    },
    /// 401: no bearer token, or the TokenReview did not authenticate it.
    Unauthenticated,
    /// 401: the TokenReview could not be made; the message says why.
    AuthenticationUnavailable(String),
    /// 403: the SubjectAccessReview did not allow it.
    Forbidden {
        /// The user name.
        user: String,
        /// The SubjectAccessReview verb.
        verb: String,
        /// The reviewer's reason (may be empty).
        reason: String,
    },
    /// 500: the SubjectAccessReview could not be made; the message says why.
    AuthorizationUnavailable(String),
}

/// A bounded map whose entries expire.
#[derive(Debug)]
struct TtlCache<K, V> {
    entries: HashMap<K, (V, Instant)>,
}

impl<K: std::hash::Hash + Eq + Clone, V: Clone> TtlCache<K, V> {
    fn new() -> Self {
        TtlCache {
            entries: HashMap::new(),
        }
    }

    fn get(&self, key: &K, now: Instant) -> Option<V> {
        self.entries
            .get(key)
            .filter(|(_, expires)| *expires > now)
            .map(|(value, _)| value.clone())
    }

    fn insert(&mut self, key: K, value: V, expires: Instant, now: Instant) {
        if self.entries.len() >= CACHE_CAPACITY && !self.entries.contains_key(&key) {
            self.entries.retain(|_, (_, e)| *e > now);
            if self.entries.len() >= CACHE_CAPACITY
                && let Some(oldest) = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, e))| *e)
                    .map(|(k, _)| k.clone())
            {
                self.entries.remove(&oldest);
            }
        }
        self.entries.insert(key, (value, expires));
    }
}

/// Authentication and authorization of secure-port requests (see the module documentation).
/// Clones share the caches.
#[derive(Clone)]
pub struct DelegatedAuth {
    inner: Arc<Inner>,
}

struct Inner {
    tokens: Api<TokenReview>,
    reviews: Api<SubjectAccessReview>,
    always_allow: AlwaysAllowPaths,
    ttls: CacheTtls,
    /// SHA-256 of the token → the authenticated user (`None`: not authenticated).
    token_cache: Mutex<TtlCache<[u8; 32], Option<UserInfo>>>,
    /// JSON of the review spec → (allowed, reason).
    decision_cache: Mutex<TtlCache<String, (bool, String)>>,
}

impl std::fmt::Debug for DelegatedAuth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DelegatedAuth")
            .field("always_allow", &self.inner.always_allow)
            .field("ttls", &self.inner.ttls)
            .finish_non_exhaustive()
    }
}

fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The bearer token of `Authorization: Bearer <token>` (scheme case-insensitive; the token is the
/// next space-separated field, as kube-apiserver's `bearertoken` authenticator reads it).
pub fn bearer_token(headers: &HeaderMap) -> Option<&str> {
    let value = headers.get(header::AUTHORIZATION)?.to_str().ok()?.trim();
    let mut parts = value.split(' ');
    let scheme = parts.next()?;
    let token = parts.next()?;
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

impl DelegatedAuth {
    /// Reviews tokens with `authentication` and requests with `authorization` (usually both the
    /// controller's own client).
    pub fn new(
        authentication: Client,
        authorization: Client,
        always_allow: AlwaysAllowPaths,
        ttls: CacheTtls,
    ) -> DelegatedAuth {
        DelegatedAuth {
            inner: Arc::new(Inner {
                tokens: Api::all(authentication),
                reviews: Api::all(authorization),
                always_allow,
                ttls,
                token_cache: Mutex::new(TtlCache::new()),
                decision_cache: Mutex::new(TtlCache::new()),
            }),
        }
    }

    /// Decides one request: `method` and `path` as received, `headers` for the bearer token.
    pub async fn check(&self, method: &Method, path: &str, headers: &HeaderMap) -> Verdict {
        if self.inner.always_allow.allows(path) {
            return Verdict::Allowed { user: None };
        }
        let Some(token) = bearer_token(headers) else {
            return Verdict::Unauthenticated;
        };
        let user = match self.authenticate(token).await {
            Ok(Some(user)) => user,
            Ok(None) => return Verdict::Unauthenticated,
            Err(message) => return Verdict::AuthenticationUnavailable(message),
        };
        let verb = method.as_str().to_ascii_lowercase();
        let name = user.username.clone().unwrap_or_default();
        match self.authorize(user, path, &verb).await {
            Ok((true, _)) => Verdict::Allowed { user: Some(name) },
            Ok((false, reason)) => Verdict::Forbidden {
                user: name,
                verb,
                reason,
            },
            Err(message) => Verdict::AuthorizationUnavailable(message),
        }
    }

    /// The user a token belongs to (`Ok(None)`: not authenticated), from the cache or a
    /// TokenReview.
    async fn authenticate(&self, token: &str) -> Result<Option<UserInfo>, String> {
        let digest = ring::digest::digest(&ring::digest::SHA256, token.as_bytes());
        let mut key = [0u8; 32];
        key.copy_from_slice(digest.as_ref());
        let now = Instant::now();
        if let Some(user) = lock(&self.inner.token_cache).get(&key, now) {
            return Ok(user);
        }
        let review = TokenReview {
            spec: TokenReviewSpec {
                token: token.to_owned(),
                audiences: None,
            },
            ..TokenReview::default()
        };
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.inner.tokens.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| format!("TokenReview: no answer within {REVIEW_TIMEOUT:?}"))?
        .map_err(|e| format!("TokenReview: {}", crate::kube_error::error_chain(&e)))?;
        let status = answer.status.unwrap_or_default();
        let user = if status.authenticated == Some(true) {
            Some(status.user.unwrap_or_default())
        } else {
            None
        };
        let now = Instant::now();
        lock(&self.inner.token_cache).insert(key, user.clone(), now + self.inner.ttls.token, now);
        Ok(user)
    }

    /// Whether `user` may `verb` the non-resource `path`, and the reviewer's reason.
    async fn authorize(
        &self,
        user: UserInfo,
        path: &str,
        verb: &str,
    ) -> Result<(bool, String), String> {
        let spec = SubjectAccessReviewSpec {
            user: user.username,
            uid: user.uid,
            groups: user.groups,
            extra: user.extra,
            non_resource_attributes: Some(NonResourceAttributes {
                path: Some(path.to_owned()),
                verb: Some(verb.to_owned()),
            }),
            resource_attributes: None,
        };
        let key = serde_json::to_string(&spec).map_err(|e| e.to_string())?;
        let now = Instant::now();
        if let Some(decision) = lock(&self.inner.decision_cache).get(&key, now) {
            return Ok(decision);
        }
        let review = SubjectAccessReview {
            spec,
            ..SubjectAccessReview::default()
        };
        let answer = tokio::time::timeout(
            REVIEW_TIMEOUT,
            self.inner.reviews.create(&PostParams::default(), &review),
        )
        .await
        .map_err(|_| format!("SubjectAccessReview: no answer within {REVIEW_TIMEOUT:?}"))?
        .map_err(|e| {
            format!(
                "SubjectAccessReview: {}",
                crate::kube_error::error_chain(&e)
            )
        })?;
        let status = answer.status.unwrap_or_default();
        let allowed = status.allowed && status.denied != Some(true);
        let reason = status.reason.unwrap_or_default();
        let ttl = if allowed {
            self.inner.ttls.allowed
        } else {
            self.inner.ttls.denied
        };
        let now = Instant::now();
        lock(&self.inner.decision_cache).insert(key, (allowed, reason.clone()), now + ttl, now);
        Ok((allowed, reason))
    }
}

/// A kube-apiserver `Status` answer.
fn status_response(code: StatusCode, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "kind": "Status",
        "apiVersion": "v1",
        "metadata": {},
        "status": "Failure",
        "message": message,
        "reason": reason,
        "code": code.as_u16(),
    });
    (
        code,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The axum middleware: runs [`DelegatedAuth::check`] and either passes the request on or answers
/// 401/403/500.
pub async fn middleware(
    State(auth): State<DelegatedAuth>,
    request: Request,
    next: Next,
) -> Response {
    let path = request.uri().path().to_owned();
    let verdict = auth.check(request.method(), &path, request.headers()).await;
    match verdict {
        Verdict::Allowed { .. } => next.run(request).await,
        Verdict::Unauthenticated => {
            tracing::debug!(%path, "secure port: unauthenticated request refused (401)");
            status_response(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        }
        Verdict::AuthenticationUnavailable(message) => {
            tracing::warn!(%path, error = %message, "secure port: cannot authenticate the request; refused (401)");
            status_response(StatusCode::UNAUTHORIZED, "Unauthorized", "Unauthorized")
        }
        Verdict::Forbidden { user, verb, reason } => {
            tracing::debug!(%path, %user, %reason, "secure port: request forbidden (403)");
            let mut message = format!("forbidden: User {user:?} cannot {verb} path {path:?}");
            if !reason.is_empty() {
                message.push_str(": ");
                message.push_str(&reason);
            }
            status_response(StatusCode::FORBIDDEN, "Forbidden", &message)
        }
        Verdict::AuthorizationUnavailable(message) => {
            tracing::warn!(%path, error = %message, "secure port: cannot authorize the request; refused (500)");
            status_response(
                StatusCode::INTERNAL_SERVER_ERROR,
                "InternalError",
                "Internal Server Error: the request could not be authorized",
            )
        }
    }
}

#[cfg(test)]
mod tests;
