//! Paused-time tests of [`DelegatedAuth`] against an in-process reviewer (a `tower::service_fn`
//! behind `kube::Client`: no sockets, so the cache TTLs are tested exactly).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};

use http::{HeaderValue, Request, Response};
use http_body_util::BodyExt;
use kube::client::Body;
use serde_json::{Value, json};

use super::*;

/// How the fake reviewer answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Mode {
    /// Token `good` is user `alice` (group `ops`), `nobody` is authenticated without rights; only
    /// `alice` may `get` `/metrics`.
    Normal,
    /// Every review gets 500.
    Broken,
    /// No review is ever answered.
    Hang,
}

#[derive(Debug, Default)]
struct Reviewer {
    log: Vec<(String, Value)>,
}

fn client(reviewer: Arc<Mutex<Reviewer>>, mode: Arc<Mutex<Mode>>) -> Client {
    let service = tower::service_fn(move |request: Request<Body>| {
        let reviewer = reviewer.clone();
        let mode = mode.clone();
        async move {
            let path = request.uri().path().to_owned();
            let bytes = request
                .into_body()
                .collect()
                .await
                .map(|b| b.to_bytes().to_vec())
                .unwrap_or_default();
            let body: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
            reviewer
                .lock()
                .expect("lock")
                .log
                .push((path.clone(), body.clone()));
            let mode = *mode.lock().expect("lock");
            if mode == Mode::Hang {
                std::future::pending::<()>().await;
            }
            let (code, answer) = if mode == Mode::Broken {
                (
                    500,
                    json!({"kind":"Status","apiVersion":"v1","status":"Failure","code":500,"reason":"InternalError","message":"etcd is down"}),
                )
            } else if path.ends_with("/tokenreviews") {
                let token = body["spec"]["token"].as_str().unwrap_or("");
                let status = match token {
                    "good" => {
                        json!({"authenticated": true, "user": {"username": "alice", "uid": "u-1", "groups": ["ops", "system:authenticated"]}})
                    }
                    "nobody" => {
                        json!({"authenticated": true, "user": {"username": "bob", "groups": ["system:authenticated"]}})
                    }
                    _ => json!({"authenticated": false, "error": "invalid bearer token"}),
                };
                let mut review = body.clone();
                review["status"] = status;
                (201, review)
            } else {
                let allowed = body["spec"]["user"] == "alice"
                    && body["spec"]["nonResourceAttributes"]
                        == json!({"path": "/metrics", "verb": "get"});
                let mut review = body.clone();
                review["status"] = if allowed {
                    json!({"allowed": true, "reason": "RBAC: allowed"})
                } else {
                    json!({"allowed": false, "reason": "no RBAC policy matched"})
                };
                (201, review)
            };
            let response = Response::builder()
                .status(code)
                .header("content-type", "application/json")
                .body(Body::from(answer.to_string().into_bytes()))
                .expect("response");
            Ok::<_, Infallible>(response)
        }
    });
    Client::new(service, "default")
}

struct Fixture {
    auth: DelegatedAuth,
    reviewer: Arc<Mutex<Reviewer>>,
    mode: Arc<Mutex<Mode>>,
}

impl Fixture {
    fn new() -> Fixture {
        let reviewer = Arc::new(Mutex::new(Reviewer::default()));
        let mode = Arc::new(Mutex::new(Mode::Normal));
        let c = client(reviewer.clone(), mode.clone());
        let auth = DelegatedAuth::new(
            c.clone(),
            c,
            AlwaysAllowPaths::parse(crate::serving::DEFAULT_ALWAYS_ALLOW_PATHS).expect("paths"),
            CacheTtls::default(),
        );
        Fixture {
            auth,
            reviewer,
            mode,
        }
    }

    fn set_mode(&self, mode: Mode) {
        *self.mode.lock().expect("lock") = mode;
    }

    /// (TokenReviews, SubjectAccessReviews) asked so far.
    fn counts(&self) -> (usize, usize) {
        let log = &self.reviewer.lock().expect("lock").log;
        let tokens = log
            .iter()
            .filter(|(p, _)| p == "/apis/authentication.k8s.io/v1/tokenreviews")
            .count();
        let reviews = log
            .iter()
            .filter(|(p, _)| p == "/apis/authorization.k8s.io/v1/subjectaccessreviews")
            .count();
        assert_eq!(tokens + reviews, log.len(), "only reviews: {log:?}");
        (tokens, reviews)
    }

    fn last_body(&self) -> Value {
        self.reviewer
            .lock()
            .expect("lock")
            .log
            .last()
            .map(|(_, b)| b.clone())
            .unwrap_or(Value::Null)
    }

    async fn check(&self, method: Method, path: &str, token: Option<&str>) -> Verdict {
        let mut headers = HeaderMap::new();
        if let Some(token) = token {
            headers.insert(
                header::AUTHORIZATION,
                HeaderValue::from_str(&format!("Bearer {token}")).expect("header"),
            );
        }
        self.auth.check(&method, path, &headers).await
    }
}

#[tokio::test(start_paused = true)]
async fn always_allowed_paths_and_missing_tokens_ask_nobody() {
    let f = Fixture::new();
    for path in ["/healthz", "/readyz", "/livez"] {
        assert_eq!(
            f.check(Method::GET, path, None).await,
            Verdict::Allowed { user: None },
            "{path}"
        );
        // A token on an always-allowed path is not even looked at.
        assert_eq!(
            f.check(Method::GET, path, Some("garbage")).await,
            Verdict::Allowed { user: None }
        );
    }
    assert_eq!(
        f.check(Method::GET, "/metrics", None).await,
        Verdict::Unauthenticated
    );
    assert_eq!(
        f.check(Method::GET, "/healthz/extra", None).await,
        Verdict::Unauthenticated,
        "exact paths only"
    );
    assert_eq!(f.counts(), (0, 0));
}

#[tokio::test(start_paused = true)]
async fn allowed_answers_are_cached_for_ten_seconds() {
    let f = Fixture::new();
    let allowed = Verdict::Allowed {
        user: Some("alice".to_owned()),
    };
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        allowed
    );
    assert_eq!(f.counts(), (1, 1));
    let review = f.last_body();
    assert_eq!(review["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(review["kind"], "SubjectAccessReview");
    assert_eq!(
        review["spec"],
        json!({"user": "alice", "uid": "u-1", "groups": ["ops", "system:authenticated"],
               "nonResourceAttributes": {"path": "/metrics", "verb": "get"}})
    );
    tokio::time::advance(Duration::from_millis(9_900)).await;
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        allowed
    );
    assert_eq!(f.counts(), (1, 1), "both answers reused within 10 s");
    tokio::time::advance(Duration::from_millis(200)).await;
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        allowed
    );
    assert_eq!(f.counts(), (2, 2), "asked again after 10 s");
}

#[tokio::test(start_paused = true)]
async fn denials_are_cached_and_name_the_user_and_verb() {
    let f = Fixture::new();
    let forbidden = |verb: &str| Verdict::Forbidden {
        user: "bob".to_owned(),
        verb: verb.to_owned(),
        reason: "no RBAC policy matched".to_owned(),
    };
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("nobody")).await,
        forbidden("get")
    );
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("nobody")).await,
        forbidden("get")
    );
    assert_eq!(f.counts(), (1, 1));
    // Another verb is another question (the verb is the lower-cased method).
    assert_eq!(
        f.check(Method::POST, "/metrics", Some("nobody")).await,
        forbidden("post")
    );
    assert_eq!(f.counts(), (1, 2));
    assert_eq!(
        f.last_body()["spec"]["nonResourceAttributes"],
        json!({"path": "/metrics", "verb": "post"})
    );
    // Alice may get /metrics but not post to it.
    assert_eq!(
        f.check(Method::POST, "/metrics", Some("good")).await,
        Verdict::Forbidden {
            user: "alice".to_owned(),
            verb: "post".to_owned(),
            reason: "no RBAC policy matched".to_owned(),
        }
    );
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("nobody")).await,
        forbidden("get")
    );
    assert_eq!(f.counts(), (3, 4));
}

#[tokio::test(start_paused = true)]
async fn rejected_tokens_are_cached_too() {
    let f = Fixture::new();
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("forged")).await,
        Verdict::Unauthenticated
    );
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("forged")).await,
        Verdict::Unauthenticated
    );
    assert_eq!(f.counts(), (1, 0), "no SubjectAccessReview for a bad token");
    tokio::time::advance(Duration::from_secs(11)).await;
    assert_eq!(
        f.check(Method::GET, "/metrics", Some("forged")).await,
        Verdict::Unauthenticated
    );
    assert_eq!(f.counts(), (2, 0));
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_reviewer_denies_and_is_asked_again() {
    let f = Fixture::new();
    f.set_mode(Mode::Broken);
    assert!(matches!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        Verdict::AuthenticationUnavailable(m) if m.contains("500") && m.contains("etcd is down")
    ));
    assert!(matches!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        Verdict::AuthenticationUnavailable(_)
    ));
    assert_eq!(f.counts(), (2, 0), "errors are not cached");
    // Token reviewed (and cached) while healthy; then authorization breaks.
    f.set_mode(Mode::Normal);
    assert!(matches!(
        f.check(Method::GET, "/healthz", None).await,
        Verdict::Allowed { .. }
    ));
    let _ = f.check(Method::GET, "/other", Some("good")).await;
    f.set_mode(Mode::Broken);
    assert!(matches!(
        f.check(Method::GET, "/metrics", Some("good")).await,
        Verdict::AuthorizationUnavailable(m) if m.contains("SubjectAccessReview")
    ));
    // Health stays open whatever the reviewer does.
    assert_eq!(
        f.check(Method::GET, "/readyz", None).await,
        Verdict::Allowed { user: None }
    );
}

#[tokio::test(start_paused = true)]
async fn a_hanging_reviewer_times_out_after_ten_seconds() {
    let f = Fixture::new();
    f.set_mode(Mode::Hang);
    let started = Instant::now();
    let verdict = f.check(Method::GET, "/metrics", Some("good")).await;
    assert!(
        matches!(&verdict, Verdict::AuthenticationUnavailable(m) if m.contains("no answer")),
        "{verdict:?}"
    );
    assert_eq!(started.elapsed(), REVIEW_TIMEOUT);
}

#[test]
fn always_allow_paths_follow_kcm_rules() {
    let paths = AlwaysAllowPaths::parse("/healthz, readyz,/debug/*,,/").expect("valid");
    for (path, allowed) in [
        ("/healthz", true),
        ("healthz", true),
        ("/readyz", true),
        ("/debug/pprof/heap", true),
        ("/debug/", true),
        ("/debug", false),
        ("/", true),
        ("/metrics", false),
        ("/healthz/ping", false),
    ] {
        assert_eq!(paths.allows(path), allowed, "{path}");
    }
    assert!(
        AlwaysAllowPaths::parse("/*")
            .expect("valid")
            .allows("/anything")
    );
    for bad in ["/a*/b", "*x", "/a**"] {
        assert!(AlwaysAllowPaths::parse(bad).is_err(), "{bad}");
    }
    assert_eq!(AlwaysAllowPaths::parse(""), Ok(AlwaysAllowPaths::default()));
}

#[test]
fn bearer_tokens_are_read_as_kube_apiserver_reads_them() {
    let token = |value: &str| {
        let mut headers = HeaderMap::new();
        headers.insert(
            header::AUTHORIZATION,
            HeaderValue::from_str(value).expect("header"),
        );
        bearer_token(&headers).map(str::to_owned)
    };
    assert_eq!(token("Bearer abc").as_deref(), Some("abc"));
    assert_eq!(token("bearer abc").as_deref(), Some("abc"));
    assert_eq!(token("  BEARER abc  ").as_deref(), Some("abc"));
    assert_eq!(token("Bearer abc extra").as_deref(), Some("abc"));
    assert_eq!(token("Bearer "), None);
    assert_eq!(token("Bearer"), None);
    assert_eq!(token("Basic YWxpY2U6c2VjcmV0"), None);
    assert_eq!(bearer_token(&HeaderMap::new()), None);
}
