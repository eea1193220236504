//! Issue 33 (4): `helm upgrade` to a new image tag with the chart's defaults — two replicas — on
//! two real Nodes (`cluster.sh up --nodes 2`: the second Node a kubelet with its own containerd
//! in its own network namespace), one replica on each (their anti-affinity; the secure port is a
//! host port). Both Nodes get their podCIDRs from the leader and a busybox Pod on each gets an
//! address inside its Node's podCIDR. The PodDisruptionBudget as `kubectl drain` meets it: with
//! the standby's Node cordoned, the standby's eviction is allowed (two healthy, minAvailable 1),
//! its replacement cannot be placed, and the leader's eviction is refused. Then `helm upgrade`
//! to a new tag of the same image (the standby's Pod replaced first: the ReplicaSet's choice)
//! and `helm rollback` to the first release with the leader's Pod replaced first (the lowest
//! pod-deletion-cost): polled through each rollout, at least one replica is Ready and not being
//! deleted at every observation; the Lease ends with a Pod of the new tag, then of the old one
//! (one transition, then two at least); no Node's podCIDR changes and none is PATCHed twice
//! (kube-apiserver's audit log: each Node's podCIDR PATCHed exactly once by the controller over
//! the whole test); a Node registered after the rollouts is served.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use ipnet::IpNet;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Pod;
use kube::Client;
use kube::api::{Api, ListParams};

use crate::harness::{
    CONTROLLER_REPOSITORY, CONTROLLER_SELECTOR, CONTROLLER_USER, Cluster, all_served, node_name,
    pod_cidr_writers, pod_ready, repo_root, run_status, test_pod_address, wait_for,
};

/// The controller Pods as one poll saw them.
#[derive(Debug)]
struct Observation {
    /// Since the `helm upgrade` started.
    at: Duration,
    /// Every controller Pod.
    pods: Vec<Seen>,
    /// The Pod whose identity holds the Lease (`$POD_NAME_<pid>`).
    holder: Option<String>,
}

/// One controller Pod in an [`Observation`].
#[derive(Debug, PartialEq)]
struct Seen {
    name: String,
    /// Empty until it is scheduled.
    node: String,
    tag: String,
    /// What the PodDisruptionBudget counts: Ready and not being deleted.
    healthy: bool,
    restarts: i32,
}

impl Observation {
    fn healthy(&self) -> usize {
        self.pods.iter().filter(|p| p.healthy).count()
    }
}

fn tag(pod: &Pod) -> String {
    let image = pod
        .spec
        .as_ref()
        .and_then(|s| s.containers.first())
        .and_then(|c| c.image.clone())
        .unwrap_or_default();
    image
        .rsplit_once(':')
        .map(|(_, t)| t.to_owned())
        .unwrap_or(image)
}

fn healthy(pod: &Pod) -> bool {
    pod_ready(pod) && pod.metadata.deletion_timestamp.is_none()
}

fn node_of(pod: &Pod) -> String {
    pod.spec
        .as_ref()
        .and_then(|s| s.node_name.clone())
        .unwrap_or_default()
}

async fn controller_pods(client: &Client) -> Option<Vec<Pod>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    let list = pods
        .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
        .await
        .ok()?;
    Some(list.items)
}

async fn observe(client: &Client, started: Instant) -> Option<Observation> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let identity = leases
        .get("nodeipam-controller")
        .await
        .ok()?
        .spec?
        .holder_identity;
    let pods = controller_pods(client).await?;
    let holder = identity.and_then(|identity| {
        pods.iter().find_map(|pod| {
            let name = pod.metadata.name.clone()?;
            identity
                .strip_prefix(&format!("{name}_"))
                .is_some_and(|pid| pid.parse::<u32>().is_ok())
                .then_some(name)
        })
    });
    Some(Observation {
        at: started.elapsed(),
        pods: pods
            .iter()
            .map(|pod| Seen {
                name: pod.metadata.name.clone().unwrap_or_default(),
                node: node_of(pod),
                tag: tag(pod),
                healthy: healthy(pod),
                restarts: pod
                    .status
                    .as_ref()
                    .and_then(|s| s.container_statuses.as_ref())
                    .and_then(|c| c.first())
                    .map_or(0, |c| c.restart_count),
            })
            .collect(),
        holder,
    })
}

/// Waits until exactly two controller Pods exist, both healthy, on two Nodes, both of image
/// `tag`, one holding the Lease; returns (Node → Pod, the Lease holder).
async fn two_healthy_replicas(
    client: &Client,
    what: &str,
    tag: &str,
) -> (BTreeMap<String, String>, String) {
    wait_for(what, || async {
        let seen = observe(client, Instant::now()).await?;
        let on_nodes: BTreeMap<String, String> = seen
            .pods
            .iter()
            .filter(|p| p.healthy && p.tag == tag)
            .map(|p| (p.node.clone(), p.name.clone()))
            .collect();
        (seen.pods.len() == 2 && on_nodes.len() == 2)
            .then_some(())
            .and(seen.holder)
            .map(|holder| (on_nodes, holder))
    })
    .await
}

/// The Eviction API for `pod` (through kubectl: kube's client retries a 429 until its retries
/// run out): (exit code, stderr).
fn evict(cluster: &Cluster, pod: &str) -> (Option<i32>, String) {
    let eviction = format!(
        r#"{{"apiVersion":"policy/v1","kind":"Eviction","metadata":{{"name":"{pod}","namespace":"kube-system"}}}}"#
    );
    let mut command = Command::new("kubectl");
    command
        .arg("--kubeconfig")
        .arg(cluster.kubeconfig())
        .args(["create", "--raw"])
        .arg(format!(
            "/api/v1/namespaces/kube-system/pods/{pod}/eviction"
        ))
        .args(["-f", "-"]);
    let (status, _, stderr) = run_status(command, Some(&eviction));
    (status, stderr)
}

/// The Lease's `leaseTransitions`.
async fn transitions(client: &Client) -> i32 {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let lease = leases.get("nodeipam-controller").await.unwrap();
    lease.spec.and_then(|s| s.lease_transitions).unwrap_or(0)
}

/// `helm ARGS` (an upgrade or a rollback), watched by a poll of the controller Pods and the
/// Lease every 200 ms until two healthy replicas of `tag` run on two Nodes: panics if a poll
/// found no healthy replica, or if the first replica to go was not the lowest
/// pod-deletion-cost's when one has a cost. Returns (Node → Pod, the Lease holder).
async fn rollout(
    cluster: &Cluster,
    client: &Client,
    helm: &[&str],
    tag: &str,
) -> (BTreeMap<String, String>, String) {
    let first_to_go = controller_pods(client)
        .await
        .unwrap()
        .into_iter()
        .filter(|pod| {
            pod.metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("controller.kubernetes.io/pod-deletion-cost"))
        })
        .find_map(|pod| pod.metadata.name);
    let started = Instant::now();
    let stop = Arc::new(AtomicBool::new(false));
    let poll = tokio::spawn({
        let client = client.clone();
        let stop = stop.clone();
        async move {
            let mut seen = Vec::new();
            while !stop.load(Ordering::SeqCst) {
                if let Some(observation) = observe(&client, started).await {
                    seen.push(observation);
                }
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            seen
        }
    });
    cluster.helm(helm);
    let (replicas, leader) = two_healthy_replicas(
        client,
        &format!(
            "two Ready replicas of {tag} on two Nodes after helm {}",
            helm[0]
        ),
        tag,
    )
    .await;
    stop.store(true, Ordering::SeqCst);
    let seen = poll.await.unwrap();
    eprintln!(
        "helm {} done in {:?}: {replicas:?}, leader {leader}; {} observations",
        helm[0],
        started.elapsed(),
        seen.len()
    );
    // The rollout as the poll saw it: each change of the Pods' state or of the Lease holder.
    let mut last = None;
    for observation in &seen {
        let now = (&observation.pods, &observation.holder);
        if last != Some(now) {
            eprintln!(
                "  {:?}: holder {:?}; {:?}",
                observation.at, observation.holder, observation.pods
            );
            last = Some(now);
        }
    }
    assert!(!seen.is_empty(), "the poll saw nothing");
    if let Some(gap) = seen.iter().find(|o| o.healthy() == 0) {
        panic!("no healthy replica at {:?} of the rollout: {gap:?}", gap.at);
    }
    if let Some(first_to_go) = first_to_go {
        let went = seen
            .iter()
            .flat_map(|o| &o.pods)
            .find(|p| p.tag != tag && !p.healthy)
            .map(|p| p.name.clone());
        assert_eq!(went, Some(first_to_go), "the first replica replaced");
    }
    (replicas, leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn helm_upgrade_of_two_replicas_on_two_nodes() {
    let cluster = Cluster::up_nodes("upgrade", 2);
    let started = Instant::now();
    let client = cluster.client().await;
    let old_tag = cluster.controller_tag();
    // As the README tells users: everything else the chart's defaults (two replicas).
    cluster.helm_install(&[]);
    let (replicas, leader) =
        two_healthy_replicas(&client, "two Ready replicas on two Nodes", &old_tag).await;
    eprintln!(
        "{:?}: replicas {replicas:?}, leader {leader}",
        started.elapsed()
    );
    let served = all_served(&client, "both Nodes served", 2).await;
    let writers = pod_cidr_writers(&client).await;

    // Both podCIDRs in use: a Pod on each Node gets its address from that Node's podCIDR.
    for index in 0..2 {
        let node = node_name(index);
        let pod_cidr: IpNet = served[&node][0].parse().unwrap();
        let address =
            test_pod_address(&client, &format!("podcidr-check-{index}"), Some(&node)).await;
        assert!(
            pod_cidr.contains(&address),
            "the test Pod on {node} has {address}, outside its podCIDR {pod_cidr}"
        );
        eprintln!("test Pod on {node}: {address} in {pod_cidr}");
    }

    // The PodDisruptionBudget (minAvailable 1), as `kubectl drain` meets it: the standby's Node
    // cordoned, the standby may be evicted (two healthy); its replacement has nowhere to go (the
    // leader's Node has a replica), so the leader may not.
    let (standby_node, standby) = replicas
        .iter()
        .find(|(_, pod)| **pod != leader)
        .map(|(node, pod)| (node.clone(), pod.clone()))
        .unwrap();
    cluster.kubectl(&["cordon", &standby_node], None);
    let (status, stderr) = evict(&cluster, &standby);
    assert_eq!(status, Some(0), "the standby's eviction: {stderr}");
    let (status, stderr) = evict(&cluster, &leader);
    assert_ne!(
        status,
        Some(0),
        "the eviction of the last healthy replica was allowed"
    );
    assert!(
        stderr.contains("disruption budget"),
        "the eviction was refused for another reason: {stderr}"
    );
    cluster.kubectl(&["uncordon", &standby_node], None);
    let (_, still) =
        two_healthy_replicas(&client, "the standby replaced after the uncordon", &old_tag).await;
    assert_eq!(
        still, leader,
        "the leader changed though it was not evicted"
    );

    // A new tag of the image on both Nodes (the same contents, as a rebuilt release would be
    // loaded), then `helm upgrade` to it. Which old replica goes first is the ReplicaSet's
    // choice (here the standby: the replacement above is the more recently Ready).
    let new_tag = format!("{old_tag}-upgrade");
    cluster.ctr_each_node(&[
        "images",
        "tag",
        &format!("{CONTROLLER_REPOSITORY}:{old_tag}"),
        &format!("{CONTROLLER_REPOSITORY}:{new_tag}"),
    ]);
    let chart = repo_root().join("charts/nodeipam");
    let before = transitions(&client).await;
    let (upgraded, new_leader) = rollout(
        &cluster,
        &client,
        &[
            "upgrade",
            "nodeipam",
            chart.to_str().unwrap(),
            "--namespace=kube-system",
            "--reuse-values",
            &format!("--set=image.tag={new_tag}"),
        ],
        &new_tag,
    )
    .await;
    assert!(!replicas.values().any(|pod| *pod == new_leader));
    let after = transitions(&client).await;
    assert!(
        after > before,
        "no hand-over: {before} -> {after} transitions"
    );
    eprintln!("{:?}: upgraded: {upgraded:?}", started.elapsed());

    // `helm rollback` to the first release, the leader's Pod first this time (the lowest
    // pod-deletion-cost goes first): it hands the Lease to the new-tag standby, which hands it
    // to an old-tag Pod when its own turn comes — two more transitions at least.
    cluster.kubectl(
        &[
            "-n",
            "kube-system",
            "annotate",
            "pod",
            &new_leader,
            "controller.kubernetes.io/pod-deletion-cost=-1",
        ],
        None,
    );
    let before = transitions(&client).await;
    let (rolled_back, old_leader) = rollout(
        &cluster,
        &client,
        &["rollback", "nodeipam", "1", "--namespace=kube-system"],
        &old_tag,
    )
    .await;
    assert!(!upgraded.values().any(|pod| *pod == old_leader));
    let after = transitions(&client).await;
    assert!(
        after >= before + 2,
        "the leader went first, so two hand-overs: {before} -> {after} transitions"
    );
    eprintln!("{:?}: rolled back: {rolled_back:?}", started.elapsed());

    // Nothing written twice; a new Node is served by the new leader, and each Node's podCIDR
    // was PATCHed once, by the controller, over the whole test.
    assert_eq!(
        all_served(&client, "both Nodes still served", 2).await,
        served
    );
    assert_eq!(pod_cidr_writers(&client).await, writers);
    cluster.cluster_sh(&["hollow", "add", "hollow-0"]);
    let now = all_served(&client, "hollow-0 served after the rollout", 3).await;
    let patches = wait_for("the audit log's PATCH of hollow-0", || async {
        let patches = cluster.pod_cidr_patches(CONTROLLER_USER);
        patches.contains_key("hollow-0").then_some(patches)
    })
    .await;
    let once: BTreeMap<String, usize> = now.keys().map(|node| (node.clone(), 1)).collect();
    assert_eq!(patches, once, "podCIDR PATCHes per Node");
    cluster.down();
}
