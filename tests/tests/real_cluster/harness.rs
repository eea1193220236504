//! The cluster the tests run on (`tests/cluster/cluster.sh`) and what they do with it: kubectl,
//! helm, the rendered `deploy/`, hollow Nodes, kube-controller-manager restarts, `plan`, scrapes
//! of the secure port.

use std::collections::BTreeMap;
use std::future::Future;
use std::io::Write;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::Client;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{Config, KubeConfigOptions, Kubeconfig};
use serde_json::json;

/// The Node `cluster.sh` registers, its address on the bridge `cluster.sh` creates, and the
/// cluster CIDR and service range given to the allocators. With `up --nodes N`, Node I (1…) is
/// [`node_name`]`(I)` at 10.99.0.(I+1), in its own network namespace.
pub(crate) const NODE_NAME: &str = "nodeipam-node-0";
pub(crate) const NODE_IP: &str = "10.99.0.1";
pub(crate) const CLUSTER_CIDR: &str = "10.244.0.0/16";
pub(crate) const SERVICE_CIDR: &str = "10.96.0.0/24";
/// The images `cluster.sh` builds and imports (the controller's tag is its version, in the state
/// folder's `controller-tag`).
pub(crate) const CONTROLLER_REPOSITORY: &str = "localhost/nodeipam-controller";
pub(crate) const BUSYBOX_IMAGE: &str = "localhost/nodeipam/busybox:1";
/// The controller's secure port (chart and deploy/ default).
pub(crate) const SECURE_PORT: u16 = 10260;
/// The controller Pods' label (chart and deploy/).
pub(crate) const CONTROLLER_SELECTOR: &str = "app.kubernetes.io/name=nodeipam-controller";
/// The controller's ServiceAccount, as kube-apiserver names its requests.
pub(crate) const CONTROLLER_USER: &str = "system:serviceaccount:kube-system:nodeipam-controller";
/// Liveness bounds only (a failure names what did not happen); never asserted as speeds.
pub(crate) const WAIT: Duration = Duration::from_secs(180);

/// The name of `cluster.sh`'s real Node `index` (0: [`NODE_NAME`]).
pub(crate) fn node_name(index: usize) -> String {
    format!("nodeipam-node-{index}")
}

pub(crate) fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// A running cluster (`cluster.sh up --no-controller`); `down` on drop, also when a test panics.
pub(crate) struct Cluster {
    state: PathBuf,
    logs: PathBuf,
    nodes: usize,
    torn_down: bool,
}

impl Cluster {
    /// A cluster whose Node has no podCIDR (kube-controller-manager's range allocator off).
    pub(crate) fn up(test: &str) -> Cluster {
        Cluster::start(test, &[], 1)
    }

    /// A cluster whose kube-controller-manager gets `kcm_flags` after its usual ones
    /// (`NODEIPAM_CLUSTER_KCM_ARGS`), e.g. its range allocator on.
    pub(crate) fn up_with_kcm(test: &str, kcm_flags: &[&str]) -> Cluster {
        Cluster::start(test, kcm_flags, 1)
    }

    /// A cluster of `nodes` real Nodes (`cluster.sh up --nodes`), none with a podCIDR.
    pub(crate) fn up_nodes(test: &str, nodes: usize) -> Cluster {
        Cluster::start(test, &[], nodes)
    }

    fn start(test: &str, kcm_flags: &[&str], nodes: usize) -> Cluster {
        let state = std::env::var_os("NODEIPAM_CLUSTER_DIR")
            .map_or_else(|| PathBuf::from("/var/tmp/nodeipam-cluster"), PathBuf::from);
        let logs = std::env::var_os("CARGO_TARGET_DIR")
            .map_or_else(|| repo_root().join("target"), PathBuf::from)
            .join("real-cluster-logs")
            .join(test);
        let _ = std::fs::remove_dir_all(&logs);
        let started = Instant::now();
        let status = cluster_sh()
            .args(["up", "--no-controller", "--nodes", &nodes.to_string()])
            .env("NODEIPAM_CLUSTER_DIR", &state)
            .env("NODEIPAM_CLUSTER_KEEP_LOGS", &logs)
            .env("NODEIPAM_CLUSTER_KCM_ARGS", kcm_flags.join(" "))
            .status()
            .unwrap();
        assert!(
            status.success(),
            "cluster.sh up failed ({status}); logs in {}",
            logs.display()
        );
        eprintln!("cluster up in {:?}", started.elapsed());
        Cluster {
            state,
            logs,
            nodes,
            torn_down: false,
        }
    }

    pub(crate) fn kubeconfig(&self) -> PathBuf {
        self.state.join("admin.kubeconfig")
    }

    fn state_file(&self, name: &str) -> String {
        std::fs::read_to_string(self.state.join(name))
            .unwrap()
            .trim()
            .to_owned()
    }

    pub(crate) fn controller_tag(&self) -> String {
        self.state_file("controller-tag")
    }

    /// The controller binary the image was built from (for `plan`, as an operator runs it).
    pub(crate) fn controller_bin(&self) -> PathBuf {
        PathBuf::from(self.state_file("controller-bin"))
    }

    /// build.sh's folder (helm, kubemark…).
    pub(crate) fn upstream_bin(&self) -> PathBuf {
        PathBuf::from(self.state_file("bin"))
    }

    pub(crate) async fn client(&self) -> Client {
        let kubeconfig = Kubeconfig::read_from(self.kubeconfig()).unwrap();
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .unwrap();
        Client::try_from(config).unwrap()
    }

    /// `kubectl ARGS` against the cluster (with STDIN when given); its stdout, or a panic with
    /// its stderr.
    pub(crate) fn kubectl(&self, args: &[&str], stdin: Option<&str>) -> String {
        let mut command = Command::new("kubectl");
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args);
        run(command, stdin)
    }

    /// `helm ARGS` (the pinned helm) against the cluster.
    pub(crate) fn helm(&self, args: &[&str]) -> String {
        let mut command = Command::new(self.upstream_bin().join("helm"));
        command
            .arg("--kubeconfig")
            .arg(self.kubeconfig())
            .args(args);
        run(command, None)
    }

    /// `helm install nodeipam charts/nodeipam` in kube-system as the README tells users: the
    /// cluster CIDR and service range, our image, then `extra` (`--set=…`); the rest the chart's
    /// defaults.
    pub(crate) fn helm_install(&self, extra: &[&str]) {
        let chart = repo_root().join("charts/nodeipam");
        let values = [
            format!("--set=controller.clusterCIDR={CLUSTER_CIDR}"),
            format!("--set=controller.serviceClusterIPRange={SERVICE_CIDR}"),
            format!("--set=image.repository={CONTROLLER_REPOSITORY}"),
            format!("--set=image.tag={}", self.controller_tag()),
        ];
        let mut args = vec![
            "install",
            "nodeipam",
            chart.to_str().unwrap(),
            "--namespace=kube-system",
        ];
        args.extend(values.iter().map(String::as_str));
        args.extend(extra);
        self.helm(&args);
    }

    /// `ctr -n k8s.io ARGS` on every real Node's containerd (Node 0's in the state folder, Node
    /// I's in `node-I/`).
    pub(crate) fn ctr_each_node(&self, args: &[&str]) {
        for index in 0..self.nodes {
            let folder = if index == 0 {
                self.state.clone()
            } else {
                self.state.join(format!("node-{index}"))
            };
            let mut command = Command::new("ctr");
            command
                .arg("--address")
                .arg(folder.join("containerd/containerd.sock"))
                .args(["-n", "k8s.io"])
                .args(args);
            run(command, None);
        }
    }

    /// `cluster.sh ARGS` on this cluster (`kcm …`, `hollow add|delete …`).
    pub(crate) fn cluster_sh(&self, args: &[&str]) {
        let mut command = cluster_sh();
        command.args(args).env("NODEIPAM_CLUSTER_DIR", &self.state);
        run(command, None);
    }

    /// kube-controller-manager's running command line (arguments after the program).
    pub(crate) fn kcm_command_line(&self) -> Vec<String> {
        let pid = self.state_file("pids/kube-controller-manager");
        let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
        cmdline
            .split(|b| *b == 0)
            .skip(1)
            .filter(|a| !a.is_empty())
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect()
    }

    /// Per Node, the PATCHes of its `spec.podCIDR` that kube-apiserver answered 200 to `user`
    /// (the audit log `cluster.sh` keeps: every write of a Node object, with its body).
    pub(crate) fn pod_cidr_patches(&self, user: &str) -> BTreeMap<String, usize> {
        let mut patches = BTreeMap::new();
        for line in self.log("audit").lines() {
            let event: serde_json::Value = serde_json::from_str(line).unwrap();
            let field = |pointer: &str| event.pointer(pointer).and_then(|v| v.as_str());
            let sets_pod_cidr = event
                .pointer("/requestObject/spec/podCIDR")
                .is_some_and(|v| !v.is_null());
            if field("/stage") == Some("ResponseComplete")
                && field("/verb") == Some("patch")
                && field("/user/username") == Some(user)
                && field("/objectRef/subresource").is_none()
                && event
                    .pointer("/responseStatus/code")
                    .and_then(|v| v.as_u64())
                    == Some(200)
                && sets_pod_cidr
            {
                let node = field("/objectRef/name").unwrap().to_owned();
                *patches.entry(node).or_insert(0) += 1;
            }
        }
        patches
    }

    /// The cluster's logs so far (kube-controller-manager's, the kubelet's…).
    pub(crate) fn log(&self, process: &str) -> String {
        std::fs::read_to_string(self.state.join("logs").join(format!("{process}.log"))).unwrap()
    }

    /// `cluster.sh down`: must succeed and report nothing left behind.
    pub(crate) fn down(mut self) {
        self.torn_down = true;
        let started = Instant::now();
        let status = self.down_command(false).status().unwrap();
        assert!(
            status.success(),
            "cluster.sh down failed ({status}): something was left behind"
        );
        eprintln!("cluster down in {:?}", started.elapsed());
    }

    fn down_command(&self, keep_logs: bool) -> Command {
        let mut command = cluster_sh();
        command.arg("down").env("NODEIPAM_CLUSTER_DIR", &self.state);
        if keep_logs {
            command.env("NODEIPAM_CLUSTER_KEEP_LOGS", &self.logs);
        }
        command
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        if !self.torn_down {
            let status = self.down_command(true).status();
            eprintln!(
                "cluster.sh down after a failure: {status:?}; logs in {}",
                self.logs.display()
            );
        }
    }
}

fn cluster_sh() -> Command {
    Command::new(repo_root().join("tests/cluster/cluster.sh"))
}

/// Runs `command` (with STDIN when given): its stdout, or a panic with its stderr.
pub(crate) fn run(command: Command, stdin: Option<&str>) -> String {
    let (status, stdout, stderr) = run_status(command, stdin);
    assert!(status == Some(0), "failed ({status:?}): {stderr}");
    stdout
}

/// Runs `command` (with STDIN when given): (exit code, stdout, stderr).
pub(crate) fn run_status(
    mut command: Command,
    stdin: Option<&str>,
) -> (Option<i32>, String, String) {
    let shown = format!("{command:?}");
    command
        .stdin(if stdin.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    let mut child = command.spawn().unwrap_or_else(|e| panic!("{shown}: {e}"));
    if let Some(input) = stdin {
        child
            .stdin
            .take()
            .unwrap()
            .write_all(input.as_bytes())
            .unwrap();
    }
    let output = child.wait_with_output().unwrap();
    (
        output.status.code(),
        String::from_utf8(output.stdout).unwrap(),
        format!("{shown}: {}", String::from_utf8_lossy(&output.stderr)),
    )
}

/// Polls `probe` every 500 ms until it gives `Some`; panics naming `what` after [`WAIT`].
pub(crate) async fn wait_for<T, F, Fut>(what: &str, mut probe: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let started = Instant::now();
    loop {
        if let Some(value) = probe().await {
            eprintln!("{what}: after {:?}", started.elapsed());
            return value;
        }
        assert!(started.elapsed() < WAIT, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn condition_true(conditions: Option<&Vec<impl Conditioned>>, type_: &str) -> bool {
    conditions
        .into_iter()
        .flatten()
        .any(|c| c.type_() == type_ && c.status() == "True")
}

trait Conditioned {
    fn type_(&self) -> &str;
    fn status(&self) -> &str;
}
impl Conditioned for k8s_openapi::api::core::v1::NodeCondition {
    fn type_(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}
impl Conditioned for k8s_openapi::api::core::v1::PodCondition {
    fn type_(&self) -> &str {
        &self.type_
    }
    fn status(&self) -> &str {
        &self.status
    }
}

pub(crate) fn node_ready(node: &Node) -> bool {
    condition_true(
        node.status.as_ref().and_then(|s| s.conditions.as_ref()),
        "Ready",
    )
}

pub(crate) fn pod_ready(pod: &Pod) -> bool {
    condition_true(
        pod.status.as_ref().and_then(|s| s.conditions.as_ref()),
        "Ready",
    )
}

/// `f` of every Node, by name.
pub(crate) async fn per_node<T>(client: &Client, f: impl Fn(Node) -> T) -> BTreeMap<String, T> {
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|node| (node.metadata.name.clone().unwrap(), f(node)))
        .collect()
}

/// Every Node's `spec.podCIDRs` (empty: none yet).
pub(crate) async fn pod_cidrs(client: &Client) -> BTreeMap<String, Vec<String>> {
    per_node(client, |node| {
        node.spec.and_then(|s| s.pod_cidrs).unwrap_or_default()
    })
    .await
}

/// Waits until there are `nodes` Nodes and every one has a podCIDR; returns them all, checked
/// for duplicates.
pub(crate) async fn all_served(
    client: &Client,
    what: &str,
    nodes: usize,
) -> BTreeMap<String, Vec<String>> {
    let cidrs = wait_for(what, || async {
        let cidrs = pod_cidrs(client).await;
        (cidrs.len() == nodes && cidrs.values().all(|c| !c.is_empty())).then_some(cidrs)
    })
    .await;
    assert_no_duplicate(&cidrs);
    cidrs
}

/// A busybox Pod `name` in `default` on the Pod network (bound to `node` when given, as the
/// scheduler would bind it); its `status.podIP` once it runs (host-local gives it from the
/// podCIDR of the Node it runs on).
pub(crate) async fn test_pod_address(client: &Client, name: &str, node: Option<&str>) -> IpAddr {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let mut spec = json!({
        "containers": [{
            "name": "sleep",
            "image": BUSYBOX_IMAGE,
            "args": ["sleep", "3600"],
            "imagePullPolicy": "Never",
        }],
        "terminationGracePeriodSeconds": 0,
    });
    if let Some(node) = node {
        spec["nodeName"] = json!(node);
    }
    let pod: Pod = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": spec,
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(&format!("the address of test Pod {name}"), || async {
        let pod = pods.get(name).await.ok()?;
        let status = pod.status?;
        (status.phase.as_deref() == Some("Running")).then_some(())?;
        status.pod_ip?.parse().ok()
    })
    .await
}

/// Per Node, the field managers that own `spec.podCIDR` (who wrote it).
pub(crate) async fn pod_cidr_writers(client: &Client) -> BTreeMap<String, Vec<String>> {
    per_node(client, |node| {
        node.metadata
            .managed_fields
            .unwrap_or_default()
            .into_iter()
            .filter(|entry| {
                entry
                    .fields_v1
                    .as_ref()
                    .is_some_and(|f| f.0.pointer("/f:spec/f:podCIDR").is_some())
            })
            .filter_map(|entry| entry.manager)
            .collect()
    })
    .await
}

/// Panics when two Nodes hold the same podCIDR.
pub(crate) fn assert_no_duplicate(cidrs: &BTreeMap<String, Vec<String>>) {
    let mut holders: BTreeMap<&str, &str> = BTreeMap::new();
    for (node, node_cidrs) in cidrs {
        for cidr in node_cidrs {
            if let Some(other) = holders.insert(cidr, node) {
                panic!("{cidr} is held by both {other} and {node}: {cidrs:?}");
            }
        }
    }
}

/// The Pod of the controller Deployment that holds the Lease (its identity is
/// `$POD_NAME_<pid>`, shell/src/controller/mod.rs), once one does.
pub(crate) async fn lease_holder_pod(client: &Client) -> String {
    use k8s_openapi::api::coordination::v1::Lease;
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "kube-system");
    wait_for("a controller Pod holding the Lease", || async {
        let holder = leases
            .get("nodeipam-controller")
            .await
            .ok()?
            .spec?
            .holder_identity?;
        let list = pods
            .list(&ListParams::default().labels(CONTROLLER_SELECTOR))
            .await
            .ok()?;
        list.items.into_iter().find_map(|pod| {
            let name = pod.metadata.name?;
            holder
                .strip_prefix(&format!("{name}_"))
                .is_some_and(|pid| pid.parse::<u32>().is_ok())
                .then_some(name)
        })
    })
    .await
}

/// `kubectl kustomize deploy/` with the placeholder `--cluster-cidr` replaced by `flags` (kube-
/// controller-manager's IPAM flags) and our image in place of the default: what
/// deploy/kustomization.yaml tells users to do.
pub(crate) fn render_deploy(cluster: &Cluster, flags: &[String]) -> String {
    let mut kustomize = Command::new("kubectl");
    kustomize.arg("kustomize").arg(repo_root().join("deploy"));
    let rendered = run(kustomize, None);
    let placeholder = "- --cluster-cidr=REPLACE-WITH-KUBE-CONTROLLER-MANAGER-CLUSTER-CIDR";
    assert_eq!(rendered.matches(placeholder).count(), 1, "{rendered}");
    assert_eq!(
        rendered.matches("image: nodeipam-controller:").count(),
        1,
        "{rendered}"
    );
    rendered
        .lines()
        .map(|line| {
            if let Some((indent, _)) = line.split_once(placeholder) {
                flags
                    .iter()
                    .map(|flag| format!("{indent}- {flag}\n"))
                    .collect()
            } else if let Some((indent, _)) = line.split_once("image: nodeipam-controller:") {
                format!(
                    "{indent}image: {CONTROLLER_REPOSITORY}:{}\n",
                    cluster.controller_tag()
                )
            } else {
                format!("{line}\n")
            }
        })
        .collect()
}

/// `curl -sk` GET of the secure port's `/metrics`: (HTTP status, body).
pub(crate) fn scrape(token: Option<&str>) -> (String, String) {
    let body = tempfile::NamedTempFile::new().unwrap();
    let mut command = Command::new("curl");
    command
        .args(["-sk", "--max-time", "10", "-o"])
        .arg(body.path())
        .args(["-w", "%{http_code}"]);
    if let Some(token) = token {
        command
            .arg("-H")
            .arg(format!("Authorization: Bearer {token}"));
    }
    command.arg(format!("https://{NODE_IP}:{SECURE_PORT}/metrics"));
    let status = run(command, None);
    (status, std::fs::read_to_string(body.path()).unwrap())
}

/// The value of the first sample of `metric` (any labels) in a Prometheus text exposition.
pub(crate) fn metric_value(body: &str, metric: &str) -> Option<f64> {
    body.lines()
        .filter(|l| !l.starts_with('#'))
        .find(|l| {
            l.strip_prefix(metric)
                .is_some_and(|rest| rest.starts_with(' ') || rest.starts_with('{'))
        })
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
}
