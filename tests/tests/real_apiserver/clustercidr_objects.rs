//! ClusterCIDR objects (issue 18 §2) on the real kube-apiserver with the CRD installed
//! (`deploy/crds/clustercidrs.yaml`) and `overlays/cluster-cidrs`' RBAC, the controller running
//! as its ServiceAccount (a token from the real TokenRequest API) with
//! `--cidr-allocator-type=MultiCIDRRangeAllocator`: fixture 05's four AWS Nodes, two served by the
//! flag CIDR and two waiting; a ClusterCIDR created serves the two without a restart and gets the
//! finalizer and its status; a restart writes nothing (every `resourceVersion` unchanged); deleted,
//! the ClusterCIDR stays until its last Node is gone. kube-apiserver's audit log shows the
//! ClusterCIDR calls and not one 403. And each verb of the ClusterCIDR rules is needed: taken
//! away in turn, the controller's request that needs it is answered 403.

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use nodeipam::controller::ControllerConfig;
use nodeipam::controller::cluster_cidrs::{self, FINALIZER};
use serde_json::{Value, json};

use super::common::{fast_config, init_tracing, ipam, masks, spawn_with_client};
use super::{create_fixture_nodes, pod_cidrs_and_versions as nodes_state};

/// The controller with ClusterCIDRs on (`--cidr-allocator-type=MultiCIDRRangeAllocator`) and a
/// flag CIDR (`10.244.0.0/23`, /24 blocks) full after two Nodes; a waiting Node retried after at
/// most `retry_max_delay`.
fn config(retry_max_delay: Duration) -> ControllerConfig {
    let mut config = fast_config(ipam("10.244.0.0/23", "", masks(Some(24), None, None)));
    config.watch_cluster_cidr_objects = true;
    config.retry_max_delay = retry_max_delay;
    config
}

/// ClusterCIDR `grow` as `kubectl apply` sends it: `10.245.0.0/23` in /24 blocks, no selector.
fn grow_object() -> DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "ClusterCIDR",
        "metadata": {"name": "grow"},
        "spec": {"ipv4": "10.245.0.0/23", "perNodeHostBits": 8},
    }))
    .unwrap()
}

fn unserved(state: &BTreeMap<String, (Vec<String>, String)>) -> Vec<String> {
    state
        .iter()
        .filter(|(_, (cidrs, _))| cidrs.is_empty())
        .map(|(name, _)| name.clone())
        .collect()
}

async fn grow(api: &Api<DynamicObject>) -> Option<Value> {
    api.get_opt("grow")
        .await
        .unwrap()
        .map(|o| serde_json::to_value(o).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cidr_objects_on_the_real_server() {
    const SA_USER: &str = "system:serviceaccount:kube-system:nodeipam-controller";
    init_tracing();
    let (cluster, audit_log, _audit_dir) = super::start_audited().await;
    let admin = cluster.admin_client().await.unwrap();
    super::crd::install(&admin).await;
    let applied =
        super::apply_rbac(&admin, &super::deploy::rendered("overlays/cluster-cidrs")).await;
    assert!(applied.contains(&"ClusterRole".to_owned()));
    let token = super::request_token(&admin, "kube-system", "nodeipam-controller").await;
    let client = super::client_as(&cluster, "nodeipam-sa", &token).await;

    let nodes: Api<Node> = Api::all(admin.clone());
    create_fixture_nodes(&nodes, "05-aws-4nodes-no-podcidr.json").await;
    // The safety re-check of a waiting Node only after 10 minutes: the wake serves them.
    let config = config(Duration::from_secs(60));
    let running = spawn_with_client(client.clone(), config.clone());
    assert!(
        super::wait_for(|| async { unserved(&nodes_state(&nodes).await).len() == 2 }).await,
        "two Nodes served by the flag CIDR"
    );
    let waiting = unserved(&nodes_state(&nodes).await);

    let api = cluster_cidrs::api(admin.clone());
    api.create(&PostParams::default(), &grow_object())
        .await
        .unwrap();
    assert!(
        super::wait_for(|| async { unserved(&nodes_state(&nodes).await).is_empty() }).await,
        "the waiting Nodes were not served from the ClusterCIDR: {:?}",
        nodes_state(&nodes).await
    );
    let state = nodes_state(&nodes).await;
    for name in &waiting {
        assert!(state[name].0[0].starts_with("10.245."), "{name}: {state:?}");
    }
    let finalized = super::wait_for(|| async {
        grow(&api).await.is_some_and(|o| {
            o["metadata"]["finalizers"] == json!([FINALIZER])
                && o["status"]["ipv4"] == json!({"capacity": 2, "used": 2, "free": 0})
        })
    })
    .await;
    assert!(finalized, "finalizer and status: {:?}", grow(&api).await);
    let _ = running.stop().await;

    // A restart writes nothing: no Node and not the ClusterCIDR.
    let before = (nodes_state(&nodes).await, grow(&api).await.unwrap());
    let running = spawn_with_client(client.clone(), config);
    assert!(super::wait_for(|| async { running.health.is_ready() }).await);
    // Kept: no sound marker for the Node half (a Node's write runs on its own task after its
    // decision; nothing the controller does later is ordered after that write's arrival).
    tokio::time::sleep(std::time::Duration::from_secs(2)).await;
    let after = (nodes_state(&nodes).await, grow(&api).await.unwrap());
    assert_eq!(before.0, after.0, "Nodes written after a restart");
    assert_eq!(
        before.1["metadata"]["resourceVersion"], after.1["metadata"]["resourceVersion"],
        "the ClusterCIDR written after a restart"
    );

    // Deleted: held until the last Node holding one of its blocks is gone.
    api.delete("grow", &DeleteParams::default()).await.unwrap();
    nodes
        .delete(&waiting[0], &DeleteParams::default())
        .await
        .unwrap();
    let deleting = super::wait_for(|| async {
        grow(&api).await.is_some_and(|o| {
            o["status"]["conditions"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|c| {
                    c["reason"] == "Deleting"
                        && c["message"].as_str().is_some_and(|m| m.contains("1 Node"))
                })
        })
    })
    .await;
    assert!(deleting, "{:?}", grow(&api).await);
    nodes
        .delete(&waiting[1], &DeleteParams::default())
        .await
        .unwrap();
    assert!(
        super::wait_for(|| async { grow(&api).await.is_none() }).await,
        "the ClusterCIDR stayed after its last Node left: {:?}",
        grow(&api).await
    );
    let _ = running.stop().await;

    let calls = super::audited(&audit_log, SA_USER);
    let forbidden: Vec<&(String, String, u16)> = calls.iter().filter(|c| c.2 == 403).collect();
    assert!(forbidden.is_empty(), "403s: {forbidden:?}");
    for verb in ["list", "watch", "patch"] {
        assert!(
            calls
                .iter()
                .any(|(v, target, _)| v == verb && target == "nodeipam.io/clustercidrs"),
            "no {verb} of clustercidrs by {SA_USER}"
        );
    }
}

/// The audit log's completed requests by `user` on ClusterCIDRs answered 403:
/// `(verb, "clustercidrs" or "clustercidrs/status")`.
fn forbidden_cluster_cidr_calls(path: &std::path::Path, user: &str) -> Vec<(String, String)> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .filter(|e| {
            e["stage"] == "ResponseComplete"
                && e["user"]["username"] == user
                && e["objectRef"]["apiGroup"] == "nodeipam.io"
                && e["responseStatus"]["code"] == 403
        })
        .map(|e| {
            let resource = e["objectRef"]["resource"].as_str().unwrap_or_default();
            let target = match e["objectRef"]["subresource"].as_str() {
                Some(sub) => format!("{resource}/{sub}"),
                None => resource.to_owned(),
            };
            (e["verb"].as_str().unwrap_or_default().to_owned(), target)
        })
        .collect()
}

/// `overlays/cluster-cidrs`' RBAC documents with `verb` taken from the rule on `resource` of the
/// ClusterCIDR ClusterRole, every object renamed with `suffix` and bound to ServiceAccount
/// `account`.
fn variant(docs: &[Value], resource: &str, verb: &str, suffix: &str, account: &str) -> Vec<Value> {
    let mut out = Vec::new();
    for doc in docs {
        let kind = doc["kind"].as_str().unwrap_or_default();
        if !["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"].contains(&kind) {
            continue;
        }
        let mut doc = doc.clone();
        if kind == "ClusterRole" && doc["metadata"]["name"] == "nodeipam-controller-cluster-cidrs" {
            for rule in doc["rules"].as_array_mut().unwrap() {
                if rule["resources"] == json!([resource]) {
                    let verbs: Vec<Value> = rule["verbs"]
                        .as_array()
                        .unwrap()
                        .iter()
                        .filter(|v| *v != verb)
                        .cloned()
                        .collect();
                    rule["verbs"] = Value::Array(verbs);
                }
            }
            doc["rules"]
                .as_array_mut()
                .unwrap()
                .retain(|r| !r["verbs"].as_array().unwrap().is_empty());
        }
        let name = format!("{}-{suffix}", doc["metadata"]["name"].as_str().unwrap());
        doc["metadata"]["name"] = json!(name);
        if doc["roleRef"].is_object() {
            let role = format!("{}-{suffix}", doc["roleRef"]["name"].as_str().unwrap());
            doc["roleRef"]["name"] = json!(role);
        }
        for subject in doc["subjects"].as_array_mut().into_iter().flatten() {
            subject["name"] = json!(account);
        }
        out.push(doc);
    }
    out
}

/// Each verb of the ClusterCIDR rules (`list`, `watch`, `patch` on `clustercidrs`, `patch` on
/// `clustercidrs/status`) taken away in turn, under a ServiceAccount of its own: the controller's
/// request that needs it is answered 403 by the real server (audit log). With all of them,
/// [`cluster_cidr_objects_on_the_real_server`] sees none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cluster_cidr_rbac_rules_are_each_needed_on_the_real_server() {
    init_tracing();
    let (cluster, audit_log, _audit_dir) = super::start_audited().await;
    let admin = cluster.admin_client().await.unwrap();
    super::crd::install(&admin).await;
    let rendered = super::deploy::rendered("overlays/cluster-cidrs");
    let api = cluster_cidrs::api(admin.clone());
    let object = grow_object();
    api.create(&PostParams::default(), &object).await.unwrap();
    let accounts: Api<k8s_openapi::api::core::v1::ServiceAccount> =
        Api::namespaced(admin.clone(), "kube-system");
    let mut missing = Vec::new();
    let cases = [
        ("clustercidrs", "list"),
        ("clustercidrs", "watch"),
        ("clustercidrs", "patch"),
        ("clustercidrs/status", "patch"),
    ];
    for (i, (resource, verb)) in cases.into_iter().enumerate() {
        // A fresh object each time: its finalizer and status are still to be written.
        if i > 0 {
            let mut fresh = object.clone();
            fresh.metadata.name = Some(format!("grow-{i}"));
            api.create(&PostParams::default(), &fresh).await.unwrap();
        }
        let account = format!("nodeipam-cc{i}");
        let sa: k8s_openapi::api::core::v1::ServiceAccount =
            serde_json::from_value(json!({"metadata": {"name": account}})).unwrap();
        accounts.create(&PostParams::default(), &sa).await.unwrap();
        super::apply_rbac(
            &admin,
            &variant(&rendered, resource, verb, &format!("cc{i}"), &account),
        )
        .await;
        let token = super::request_token(&admin, "kube-system", &account).await;
        let client = super::client_as(&cluster, &account, &token).await;
        let running = spawn_with_client(client, config(Duration::from_millis(500)));
        let user = format!("system:serviceaccount:kube-system:{account}");
        let wanted = (verb.to_owned(), resource.to_owned());
        let denied = super::wait_for(|| {
            let found = forbidden_cluster_cidr_calls(&audit_log, &user).contains(&wanted);
            async move { found }
        })
        .await;
        running.abort().await;
        eprintln!("`{verb}` on {resource} taken away: 403 seen = {denied}");
        if !denied {
            missing.push(format!("{verb} {resource}"));
        }
    }
    assert!(missing.is_empty(), "no 403 without: {missing:?}");
}
