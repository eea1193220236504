//! The secure port end to end: the real controller allocating against the sandbox, its
//! `/metrics` and probes served by `nodeipam::serving` over HTTPS, with TokenReviews and
//! SubjectAccessReviews answered by the sandbox from a static table:
//! no token → 401, a token the API server rejects → 401, a token without permission → 403, an
//! allowed token → the metrics text; the health paths open to anyone; an unreachable reviewer
//! denies (401 / 500) while health stays open; certificate files are served as given and
//! re-read when rotated.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::secure;

use std::time::Duration;

use common::{fast_config, init_tracing, ipam, spawn};
use nodeipam::controller::Health;
use nodeipam::serving::{CacheTtls, DelegatedAuth};
use nodeipam_tests::sandbox::{AccessTable, Sandbox, SandboxHandle, Subject, fixture};
use serde_json::Value;

/// The cluster CIDR of the test that reads the metrics: used by no other test of the suite.
const OWN_CLUSTER_CIDR: &str = "10.243.0.0/16";

const PROMETHEUS: &str = "system:serviceaccount:monitoring:prometheus";

fn access_table() -> AccessTable {
    AccessTable::new()
        .token("prometheus-token", PROMETHEUS, &["system:serviceaccounts"])
        .token("nosy-token", "system:serviceaccount:default:nosy", &[])
        .allow(Subject::User(PROMETHEUS.to_owned()), "get", "/metrics")
}

/// (TokenReviews, SubjectAccessReviews) the sandbox received, with their bodies.
fn reviews(sb: &SandboxHandle) -> (Vec<Value>, Vec<Value>) {
    let log = sb.requests();
    let bodies = |path: &str| {
        log.iter()
            .filter(|r| r.path == path)
            .map(|r| {
                assert_eq!(r.method, "POST");
                assert_eq!(r.status, Some(201), "{r:?}");
                r.body.clone().unwrap_or(Value::Null)
            })
            .collect::<Vec<_>>()
    };
    (
        bodies(nodeipam_tests::sandbox::reviews::TOKEN_REVIEWS),
        bodies(nodeipam_tests::sandbox::reviews::SUBJECT_ACCESS_REVIEWS),
    )
}

#[tokio::test]
async fn no_token_401_forbidden_403_allowed_metrics_and_open_health() {
    init_tracing();
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    sb.set_access_table(access_table());
    let _ = secure::metrics_handle();
    // The recorder is the process's, and the e2e suite's other controllers run beside this one
    // and write the same series: a cluster CIDR that no other test uses keeps the count below
    // this controller's own (with six test threads, 10.244.0.0/16 read 92 instead of 4).
    let controller = spawn(
        &sb,
        fast_config(ipam(OWN_CLUSTER_CIDR, "", Default::default())),
    );
    controller.wait_allocating(&sb).await;
    assert!(
        sb.wait_until(common::WAIT, |sb| common::unserved(sb).is_empty())
            .await,
        "every Node gets a podCIDR"
    );
    let serving = secure::resolve(&["--bind-address=127.0.0.1"], &sb.client()).await;
    let server = secure::start(serving, controller.health.clone(), None).await;

    for path in ["/healthz", "/readyz", "/livez"] {
        let answer = secure::get(&server, path, None).await;
        assert_eq!((answer.status, answer.body.as_str()), (200, "ok"), "{path}");
    }
    assert_eq!(reviews(&sb), (vec![], vec![]), "health asks no reviewer");

    let anonymous = secure::get(&server, "/metrics", None).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    assert_eq!(anonymous.reason(), "Unauthorized");
    assert!(!anonymous.body.contains("node_ipam"), "{anonymous:?}");
    assert_eq!(
        reviews(&sb),
        (vec![], vec![]),
        "no token, nothing to review"
    );

    let forged = secure::get(&server, "/metrics", Some("forged-token")).await;
    assert_eq!(forged.status, 401, "{forged:?}");
    let (tokens, sars) = reviews(&sb);
    assert_eq!(tokens.len(), 1);
    assert_eq!(tokens[0]["spec"]["token"], "forged-token");
    assert!(sars.is_empty(), "a rejected token is not authorized");

    let nosy = secure::get(&server, "/metrics", Some("nosy-token")).await;
    assert_eq!(nosy.status, 403, "{nosy:?}");
    assert_eq!(nosy.reason(), "Forbidden");
    assert!(
        nosy.body.contains(
            r#"User \"system:serviceaccount:default:nosy\" cannot get path \"/metrics\""#
        ),
        "{nosy:?}"
    );
    assert!(!nosy.body.contains("node_ipam"));

    let allowed = secure::get(&server, "/metrics", Some("prometheus-token")).await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert!(
        allowed.body.contains(&format!(
            "node_ipam_controller_cidrset_cidrs_allocations_total{{clusterCIDR=\"{OWN_CLUSTER_CIDR}\"}} 4"
        )),
        "the metrics of the allocations: {}",
        allowed.body
    );
    let (tokens, sars) = reviews(&sb);
    let last = sars.last().unwrap();
    assert_eq!(last["apiVersion"], "authorization.k8s.io/v1");
    assert_eq!(last["spec"]["user"], PROMETHEUS);
    assert_eq!(
        last["spec"]["groups"],
        serde_json::json!(["system:serviceaccounts", "system:authenticated"])
    );
    assert_eq!(
        last["spec"]["nonResourceAttributes"],
        serde_json::json!({"path": "/metrics", "verb": "get"})
    );
    assert!(last["spec"].get("resourceAttributes").is_none());
    assert_eq!((tokens.len(), sars.len()), (3, 2));

    // Allowed to read /metrics is not allowed anywhere else (and unknown paths are not revealed
    // before authorization).
    let elsewhere = secure::get(&server, "/debug/pprof", Some("prometheus-token")).await;
    assert_eq!(elsewhere.status, 403, "{elsewhere:?}");
    let post = secure::request(&server, "POST", "/metrics", Some("prometheus-token")).await;
    assert_eq!(post.status, 403, "POST is verb post: {post:?}");

    drop(server);
    let _ = controller.stop().await;
    sb.shutdown().await;
}

#[tokio::test]
async fn answers_are_cached_within_the_ttl() {
    init_tracing();
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    sb.set_access_table(access_table());
    let mut serving = secure::resolve(&["--bind-address=127.0.0.1"], &sb.client()).await;
    // A TTL no test run can outlast, so "within the TTL" does not depend on the machine's speed.
    let hour = Duration::from_secs(3600);
    serving.auth = DelegatedAuth::new(
        sb.client(),
        sb.client(),
        nodeipam::serving::AlwaysAllowPaths::parse("/healthz").unwrap(),
        CacheTtls {
            token: hour,
            allowed: hour,
            denied: hour,
        },
    );
    let server = secure::start(serving, Health::new(), None).await;
    for _ in 0..3 {
        assert_eq!(
            secure::get(&server, "/metrics", Some("prometheus-token"))
                .await
                .status,
            200
        );
        assert_eq!(
            secure::get(&server, "/metrics", Some("nosy-token"))
                .await
                .status,
            403
        );
    }
    let (tokens, sars) = reviews(&sb);
    assert_eq!(
        (tokens.len(), sars.len()),
        (2, 2),
        "one review of each kind per token"
    );
    // Revoking in the API server is not seen while cached (kcm's trade-off, 10 s by default).
    sb.set_access_table(AccessTable::new());
    assert_eq!(
        secure::get(&server, "/metrics", Some("prometheus-token"))
            .await
            .status,
        200
    );
    drop(server);
    sb.shutdown().await;
}

#[tokio::test]
async fn an_unreachable_reviewer_denies_and_health_stays_open() {
    init_tracing();
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    sb.set_access_table(access_table());
    let dir = tempfile::tempdir().unwrap();
    // Nothing listens on port 1.
    let dead = dir.path().join("dead.kubeconfig");
    std::fs::write(
        &dead,
        "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: http://127.0.0.1:1\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user: {}\n",
    )
    .unwrap();
    let live = dir.path().join("live.kubeconfig");
    sb.write_kubeconfig(&live).unwrap();
    let dead_flag = |flag: &str| format!("--{flag}-kubeconfig={}", dead.display());
    let live_flag = |flag: &str| format!("--{flag}-kubeconfig={}", live.display());

    // TokenReview cannot be made: 401, as kcm's authentication filter answers an authenticator error.
    let no_authn = secure::resolve(
        &[
            "--bind-address=127.0.0.1",
            &dead_flag("authentication"),
            &live_flag("authorization"),
        ],
        &sb.client(),
    )
    .await;
    let server = secure::start(no_authn, Health::new(), None).await;
    let answer = secure::get(&server, "/metrics", Some("prometheus-token")).await;
    assert_eq!(answer.status, 401, "{answer:?}");
    let health = secure::get(&server, "/healthz", None).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok"));
    let again = secure::get(&server, "/metrics", Some("prometheus-token")).await;
    assert_eq!(again.status, 401, "failures are not cached as success");
    drop(server);

    // SubjectAccessReview cannot be made: 500, as kcm's authorization filter answers an error.
    let no_authz = secure::resolve(
        &[
            "--bind-address=127.0.0.1",
            &live_flag("authentication"),
            &dead_flag("authorization"),
        ],
        &sb.client(),
    )
    .await;
    let server = secure::start(no_authz, Health::new(), None).await;
    let answer = secure::get(&server, "/metrics", Some("prometheus-token")).await;
    assert_eq!(answer.status, 500, "{answer:?}");
    assert_eq!(answer.reason(), "InternalError");
    assert!(!answer.body.contains("node_ipam"));
    let (tokens, sars) = reviews(&sb);
    assert_eq!(
        (tokens.len(), sars.len()),
        (1, 0),
        "the live kubeconfig reviewed the token"
    );
    assert_eq!(
        secure::get(&server, "/readyz", None).await.status,
        503,
        "open, and honest: this Health was never made ready"
    );
    drop(server);

    // A kubeconfig that cannot be read stops start-up with exit status 2, naming the flag.
    let error = secure::try_resolve(
        &["--authentication-kubeconfig=/nonexistent/kubeconfig"],
        &sb.client(),
    )
    .await
    .expect_err("unreadable kubeconfig");
    assert_eq!(error.exit_code(), 2);
    assert!(
        error.to_string().contains("--authentication-kubeconfig"),
        "{error}"
    );
    sb.shutdown().await;
}

#[tokio::test]
async fn certificate_files_are_served_as_given() {
    init_tracing();
    let sb = Sandbox::start(fixture("05-aws-4nodes-no-podcidr.json")).await;
    let dir = tempfile::tempdir().unwrap();
    let pair = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    let cert = dir.path().join("tls.crt");
    let key = dir.path().join("tls.key");
    std::fs::write(&cert, pair.cert.pem()).unwrap();
    std::fs::write(&key, pair.signing_key.serialize_pem()).unwrap();
    let serving = secure::resolve(
        &[
            "--bind-address=127.0.0.1",
            &format!("--tls-cert-file={}", cert.display()),
            &format!("--tls-private-key-file={}", key.display()),
        ],
        &sb.client(),
    )
    .await;
    let nodeipam::serving::ServingCertificate::Files { files } = serving.certificate.clone() else {
        panic!("served from the files");
    };
    let health = Health::new();
    health.set_ready(true);
    let server = secure::start(serving, health, Some(pair.cert.der().clone())).await;
    let answer = secure::get(&server, "/readyz", None).await;
    assert_eq!((answer.status, answer.body.as_str()), (200, "ok"));

    // Rotated files (as cert-manager does) are served from the next handshake after a reload;
    // the periodic reload is `CertificateFiles::watch`, here called directly.
    let rotated = rcgen::generate_simple_self_signed(vec!["localhost".to_owned()]).unwrap();
    std::fs::write(&cert, rotated.cert.pem()).unwrap();
    std::fs::write(&key, rotated.signing_key.serialize_pem()).unwrap();
    assert!(secure::handshake_ok(&server).await, "not reloaded yet");
    assert!(files.reload().unwrap());
    let new_view = server.trusting(rotated.cert.der().clone());
    assert!(secure::handshake_ok(&new_view).await);
    assert_eq!(secure::get(&new_view, "/healthz", None).await.status, 200);
    assert!(
        !secure::handshake_ok(&server).await,
        "the old certificate is no longer served"
    );

    let error = secure::try_resolve(
        &[&format!("--tls-cert-file={}", cert.display())],
        &sb.client(),
    )
    .await
    .expect_err("a certificate without its key");
    assert_eq!(error.exit_code(), 2);
    assert!(
        error.to_string().contains("--tls-private-key-file"),
        "{error}"
    );
    drop(server);
    sb.shutdown().await;
}
