//! ClusterCIDR objects (issue 18 §2) on the real kube-apiserver with the CRD installed
//! (`deploy/crds/clustercidrs.yaml`) and `overlays/cluster-cidrs`' RBAC, the controller running
//! as its ServiceAccount (a token from the real TokenRequest API) with
//! `--cidr-allocator-type=MultiCIDRRangeAllocator`: fixture 05's four AWS Nodes, two served by the
//! flag CIDR and two waiting; a ClusterCIDR created serves the two without a restart and gets the
//! finalizer and its status; a restart writes nothing (every `resourceVersion` unchanged); deleted,
//! the ClusterCIDR stays until its last Node is gone. kube-apiserver's audit log shows the
//! ClusterCIDR calls and not one 403.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, DeleteParams, DynamicObject, PostParams};
use kube::{Client, ResourceExt};
use nodeipam::controller::cluster_cidrs::{self, FINALIZER};
use nodeipam_tests::sandbox::fixture;
use serde_json::{Value, json};

use super::common::{fast_config, init_tracing, ipam, masks, spawn_with_client};

/// Name → (podCIDRs, resourceVersion) of every Node.
async fn nodes_state(nodes: &Api<Node>) -> BTreeMap<String, (Vec<String>, String)> {
    nodes
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| {
            let rv = n.resource_version().unwrap_or_default();
            let cidrs = n.spec.and_then(|s| s.pod_cidrs).unwrap_or_default();
            (n.metadata.name.unwrap_or_default(), (cidrs, rv))
        })
        .collect()
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
    let path = cluster.kubeconfig("nodeipam-sa", &token).unwrap();
    let client = Client::try_from(
        nodeipam::client::config_from_kubeconfig(&path)
            .await
            .unwrap(),
    )
    .unwrap();

    let nodes: Api<Node> = Api::all(admin.clone());
    for item in fixture("05-aws-4nodes-no-podcidr.json")["items"]
        .as_array()
        .unwrap()
    {
        let node: Node = serde_json::from_value(super::creatable(item)).unwrap();
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let mut config = fast_config(ipam("10.244.0.0/23", "", masks(Some(24), None, None)));
    config.cluster_cidrs = true;
    // The safety re-check of a waiting Node only after 10 minutes: the wake serves them.
    config.retry_max_delay = std::time::Duration::from_secs(60);
    let running = spawn_with_client(client.clone(), config.clone());
    assert!(
        super::wait_for(|| async { unserved(&nodes_state(&nodes).await).len() == 2 }).await,
        "two Nodes served by the flag CIDR"
    );
    let waiting = unserved(&nodes_state(&nodes).await);

    let api = cluster_cidrs::api(admin.clone());
    let object: DynamicObject = serde_json::from_value(json!({
        "apiVersion": "nodeipam.io/v1alpha1",
        "kind": "ClusterCIDR",
        "metadata": {"name": "grow"},
        "spec": {"ipv4": "10.245.0.0/23", "perNodeHostBits": 8},
    }))
    .unwrap();
    api.create(&PostParams::default(), &object).await.unwrap();
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
