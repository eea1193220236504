//! Issue 33 (4), on the one real Node: `helm upgrade` to a new image tag. With one replica
//! (`replicas=1`; two replicas need two real Nodes, which this cluster does not have — their
//! anti-affinity leaves the second Pending and the rolling update could not proceed), the
//! PodDisruptionBudget refuses the eviction of the only replica; the upgrade replaces it; the new
//! Pod takes the Lease over (a new holder, one more transition), writes nothing that was written
//! already (the served Node's podCIDR keeps its single writer) and serves a new Node.

use std::process::Command;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, ListParams};

use crate::harness::{
    CONTROLLER_REPOSITORY, CONTROLLER_SELECTOR, Cluster, NODE_NAME, all_served, lease_holder_pod,
    pod_cidr_writers, repo_root, run_status, wait_for,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_hands_the_lease_over_and_honours_the_pdb() {
    let cluster = Cluster::up("upgrade");
    let started = std::time::Instant::now();
    let client = cluster.client().await;
    cluster.helm_install(&["--set=replicas=1"]);
    let old_pod = lease_holder_pod(&client).await;
    let served = all_served(&client, "the Node served", 1).await;
    let writers = pod_cidr_writers(&client).await;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let before = leases
        .get("nodeipam-controller")
        .await
        .unwrap()
        .spec
        .unwrap();

    eprintln!("{:?}: eviction", started.elapsed());
    // The PodDisruptionBudget (minAvailable 1): the only replica cannot be evicted.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    // (Through kubectl: kube's client retries a 429 until its retries run out.)
    let eviction = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{old_pod}","namespace":"kube-system"}}}}"#
    );
    let mut evict = Command::new("kubectl");
    evict
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["create", "--raw"])
        .arg(format!(
            "/api/v1/namespaces/kube-system/pods/{old_pod}/eviction"
        ))
        .args(["-f", "-"]);
    let (status, _, stderr) = run_status(evict, Some(&eviction));
    assert_ne!(
        status,
        Some(0),
        "the eviction of the only replica was allowed"
    );
    assert!(
        stderr.contains("disruption budget"),
        "the eviction was refused for another reason: {stderr}"
    );
    eprintln!("{:?}: tag + helm upgrade", started.elapsed());
    // A new tag of the image (the same contents, as a rebuilt release would be loaded), then
    // `helm upgrade` to it.
    let new_tag = format!("{}-upgrade", cluster.controller_tag());
    cluster.ctr(&[
        "images",
        "tag",
        &format!("{CONTROLLER_REPOSITORY}:{}", cluster.controller_tag()),
        &format!("{CONTROLLER_REPOSITORY}:{new_tag}"),
    ]);
    let chart = repo_root().join("charts/nodeipam");
    cluster.helm(&[
        "upgrade",
        "nodeipam",
        chart.to_str().unwrap(),
        "--namespace=kube-system",
        "--reuse-values",
        &format!("--set=image.tag={new_tag}"),
    ]);
    eprintln!("{:?}: upgraded", started.elapsed());
    let new_pod = wait_for("a Pod of the new tag holding the Lease", || async {
        let holder = lease_holder_pod(&client).await;
        let pod = pods.get(&holder).await.ok()?;
        let image = pod.spec?.containers.first()?.image.clone()?;
        image.ends_with(&format!(":{new_tag}")).then_some(holder)
    })
    .await;
    assert_ne!(new_pod, old_pod);
    wait_for("the old Pod gone", || async {
        let list = pods
            .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
            .await
            .ok()?;
        list.items
            .iter()
            .all(|p| p.metadata.name.as_deref() != Some(old_pod.as_str()))
            .then_some(())
    })
    .await;
    let after = leases
        .get("nodeipam-controller")
        .await
        .unwrap()
        .spec
        .unwrap();
    assert_ne!(after.holder_identity, before.holder_identity);
    assert_eq!(
        after.lease_transitions.unwrap_or(0),
        before.lease_transitions.unwrap_or(0) + 1,
        "one hand-over: {before:?} -> {after:?}"
    );

    eprintln!("{:?}: handed over", started.elapsed());
    // Nothing written twice; a new Node is served by the new leader.
    assert_eq!(
        all_served(&client, "the Node still served", 1).await,
        served
    );
    assert_eq!(pod_cidr_writers(&client).await, writers);
    cluster.cluster_sh(&["hollow", "add", "hollow-0"]);
    let now = all_served(&client, "hollow-0 served after the upgrade", 2).await;
    assert_eq!(now[NODE_NAME], served[NODE_NAME]);
    cluster.down();
}
