//! Issue 16 (7): secure serving delegates authentication and authorization to the real server.

use super::{
    WAIT, common, controller_client, creatable, secure, service_account_token, start, wait_for,
};

use common::{fast_config, init_tracing, ipam, masks, spawn_with_client};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, PostParams};
use nodeipam_tests::invariants::name_of;
use nodeipam_tests::sandbox::fixture;
use serde_json::json;

/// Issue 16 (7): the controller's secure port with authentication and authorization delegated to
/// the real kube-apiserver (TokenReview, SubjectAccessReview): a ServiceAccount token bound by RBAC
/// to `get` on the non-resource URL `/metrics` → 200 with the allocation metrics; another
/// ServiceAccount's real token without that permission → 403; a token the server never issued →
/// 401; no token → 401; `/healthz` open without a token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn secure_serving_delegates_to_the_real_server() {
    init_tracing();
    let cluster = start().await;
    let admin = cluster.admin_client().await.unwrap();
    let nodes: Api<Node> = Api::all(admin.clone());
    let template = fixture("05-aws-4nodes-no-podcidr.json")["items"][0].clone();
    let node: Node = serde_json::from_value(creatable(&template)).unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // RBAC as a Prometheus would get it: a ClusterRole for GET /metrics, bound to one account.
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    let role: ClusterRole = serde_json::from_value(json!({
        "metadata": {"name": "nodeipam-metrics-reader"},
        "rules": [{"nonResourceURLs": ["/metrics"], "verbs": ["get"]}]
    }))
    .unwrap();
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": "nodeipam-metrics-reader"},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "nodeipam-metrics-reader"},
        "subjects": [{"kind": "ServiceAccount", "name": "prometheus", "namespace": "default"}]
    }))
    .unwrap();
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let allowed_token = service_account_token(&admin, "prometheus").await;
    let nosy_token = service_account_token(&admin, "nosy").await;

    let _ = secure::metrics_handle();
    let client = controller_client(&cluster).await;
    let ipam = ipam("10.244.0.0/16", "", masks(None, None, None));
    let running = spawn_with_client(client.clone(), fast_config(ipam));
    let name = name_of(&template);
    let served = wait_for(|| async {
        nodes
            .get(&name)
            .await
            .ok()
            .and_then(|n| n.spec.and_then(|s| s.pod_cidrs))
            .is_some()
    })
    .await;
    assert!(served, "the Node was not served within {WAIT:?}");
    let serving = secure::resolve(&["--bind-address=127.0.0.1"], &client).await;
    let server = secure::start(serving, running.health.clone(), None).await;

    let health = secure::get(&server, "/healthz", None).await;
    assert_eq!((health.status, health.body.as_str()), (200, "ok"));
    let anonymous = secure::get(&server, "/metrics", None).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let forged = secure::get(&server, "/metrics", Some("not-a-token-the-server-issued")).await;
    assert_eq!(forged.status, 401, "{forged:?}");
    let nosy = secure::get(&server, "/metrics", Some(&nosy_token)).await;
    assert_eq!(nosy.status, 403, "{nosy:?}");
    assert!(
        nosy.body.contains(
            r#"User \"system:serviceaccount:default:nosy\" cannot get path \"/metrics\""#
        ),
        "{nosy:?}"
    );
    let allowed = secure::get(&server, "/metrics", Some(&allowed_token)).await;
    assert_eq!(allowed.status, 200, "{allowed:?}");
    assert!(
        allowed.body.contains(
            "node_ipam_controller_cidrset_cidrs_allocations_total{clusterCIDR=\"10.244.0.0/16\"}"
        ),
        "{}",
        allowed.body
    );
    eprintln!(
        "secure port against the real reviewers: no token {}, forged {}, without permission {} ({}), allowed {}",
        anonymous.status,
        forged.status,
        nosy.status,
        nosy.body.trim(),
        allowed.status
    );
    drop(server);
    running.stop().await;
}
