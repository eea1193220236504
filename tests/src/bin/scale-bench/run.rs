//! One row of the benchmark for one runner (ours, kube-controller-manager or the null writer): a
//! fresh API server with N replicated Nodes, the runner until every Node is served and the runner
//! is idle, then a restart against the same (now fully allocated) server.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use crate::http;
use crate::null_writer::{self, Answer, PatchType};
use crate::process::{self, Running, Usage};
use crate::server::{Server, ServerKind, Setup};
use crate::watcher::{self, Encoding};

/// The controller's log line after its first complete list (informer).
const LISTED: &str = "listed Nodes; watching";
/// The controller's log line once every existing podCIDR is occupied: it allocates from now on.
const OCCUPIED: &str = "start-up occupy done";

/// IPv4 only, or dual-stack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Stack {
    /// `--cluster-cidr=10.0.0.0/8` (/24 blocks: 65,536).
    Single,
    /// `--cluster-cidr=10.0.0.0/8,fd00::/48` (/24 and /64 blocks: 65,536 each).
    Dual,
}

impl Stack {
    /// `--cluster-cidr` of every runner.
    pub fn cluster_cidr(self) -> &'static str {
        match self {
            Stack::Single => "10.0.0.0/8",
            Stack::Dual => "10.0.0.0/8,fd00::/48",
        }
    }
}

/// Write rate limit and API latency of a row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Mode {
    /// `--kube-api-qps=100000 --kube-api-burst=100000` (no client-side limit in practice).
    Unlimited,
    /// The defaults, 20 qps, burst 30.
    Default,
    /// Unlimited, with every API response delayed `--latency-ms` by the sandbox.
    Latency,
}

/// Who allocates in a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum Runner {
    /// Our release `nodeipam-controller`.
    Ours,
    /// The pinned kube-controller-manager (`$NODEIPAM_UPSTREAM_BIN/kube-controller-manager`) with
    /// only its node IPAM controller, `--cidr-allocator-type=RangeAllocator`.
    Kcm,
    /// The null writer (`scale-bench null-writer`): PATCHes answers known in advance.
    Null,
}

/// How a run is varied beyond its runner (issue 34 item 3): the null writer's PATCH type and
/// answer form, and a watcher beside the runner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct Variant {
    /// The null writer's `--patch-type` (the other runners send their own).
    pub patch_type: PatchType,
    /// The null writer's `--answer`.
    pub answer: Answer,
    /// A `scale-bench watcher` in this encoding, started before the runner (its list included in
    /// the server's CPU) and held until the runner is idle.
    pub watcher: Option<Encoding>,
}

impl Default for Variant {
    fn default() -> Variant {
        Variant {
            patch_type: PatchType::Smp,
            answer: Answer::Full,
            watcher: None,
        }
    }
}

impl Variant {
    /// `smp/full`, `json-test/metadata +watch protobuf`, … for `runner` (kcm and ours send
    /// their own PATCHes: only the watcher is named).
    pub fn label(&self, runner: Runner) -> String {
        let mut label = match runner {
            Runner::Null => format!("{}/{}", self.patch_type.name(), self.answer.name()),
            Runner::Ours | Runner::Kcm => String::new(),
        };
        if let Some(encoding) = self.watcher {
            if !label.is_empty() {
                label.push(' ');
            }
            label.push_str("+watch ");
            label.push_str(encoding.name());
        }
        label
    }
}

/// kube-controller-manager's log line once its range allocator has listed every Node and
/// occupied their podCIDRs (`rangeAllocator.Run`, `pkg/controller/nodeipam/ipam/range_allocator.go`).
const KCM_READY: &str = "Starting range CIDR allocator";
const OURS_MARKS: &[&str] = &[LISTED, OCCUPIED];
const KCM_MARKS: &[&str] = &[KCM_READY];
const NULL_MARKS: &[&str] = &[null_writer::READY];

impl Runner {
    fn marks(self) -> &'static [&'static str] {
        match self {
            Runner::Ours => OURS_MARKS,
            Runner::Kcm => KCM_MARKS,
            Runner::Null => NULL_MARKS,
        }
    }

    fn ready_mark(self) -> &'static str {
        match self {
            Runner::Ours => OCCUPIED,
            Runner::Kcm => KCM_READY,
            Runner::Null => null_writer::READY,
        }
    }
}

/// What is measured, and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The release `nodeipam-controller`.
    pub controller: PathBuf,
    /// The release `sandbox-apiserver`.
    pub sandbox: PathBuf,
    /// The pinned `kube-controller-manager` (only needed with [`Runner::Kcm`]).
    pub kcm: PathBuf,
    /// This benchmark's own binary (the null writer is its `null-writer` subcommand).
    pub bench: PathBuf,
    /// NodeList file whose `items[1]` is replicated.
    pub fixture: PathBuf,
    /// Which API server.
    pub server: ServerKind,
    /// `--node-cidr-mask-size` of every runner (`None`: the defaults, /24 and /64).
    pub node_cidr_mask_size: Option<u8>,
    /// Logs go here.
    pub out_dir: PathBuf,
    /// Delay of every API response in [`Mode::Latency`] rows, milliseconds.
    pub latency_ms: u64,
    /// `--leader-elect` of the controller.
    pub leader_elect: bool,
    /// `--history-limit` of the sandbox (watch history, changes).
    pub history_limit: usize,
    /// Give up a phase after this long.
    pub timeout: Duration,
    /// Also restart the controller against the allocated sandbox.
    pub restart: bool,
    /// LIST every Node at the end and check that every podCIDR is distinct.
    pub verify: bool,
    /// Extra controller flags.
    pub controller_args: Vec<String>,
    /// Extra kube-apiserver flags (real server).
    pub apiserver_args: Vec<String>,
    /// Extra environment of the controller (`KEY=VALUE`).
    pub controller_env: Vec<(String, String)>,
    /// Write the controller's RSS and CPU every 50 ms to `<out_dir>/<row>-controller-<phase>.usage.tsv`.
    pub usage_series: bool,
}

/// One row's figures. Times are seconds from the runner's exec.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Who allocated.
    pub runner: Runner,
    /// The null writer's PATCH type and answer form, and the watcher beside the runner.
    pub variant: Variant,
    /// Which API server.
    pub server: ServerKind,
    /// Nodes.
    pub nodes: usize,
    /// Stack.
    pub stack: Stack,
    /// Node CIDR mask size given (`None`: the defaults).
    pub node_cidr_mask_size: Option<u8>,
    /// Mode.
    pub mode: Mode,
    /// Response delay, milliseconds.
    pub latency_ms: u64,
    /// Whether the controller ran with leader election.
    pub leader_elect: bool,
    /// 1-minute load average before the row.
    pub load_before: f64,
    /// Real server: start-up and Node creation (before the timed part).
    pub setup: Option<Setup>,
    /// Null writer: LIST + `plan` + answers file (before the timed part), seconds.
    pub prepare_s: Option<f64>,
    /// The first complete list is in the cache (ours only).
    pub listed_s: Option<f64>,
    /// Ready: ours' start-up occupy done, kcm's `Starting range CIDR allocator`, the null
    /// writer's answers loaded.
    pub ready_s: Option<f64>,
    /// Every Node has podCIDRs (sandbox summary polled every 20 ms; real server: the bench's own
    /// watch).
    pub served_s: f64,
    /// PATCHes per second between ready and served.
    pub patches_per_s: f64,
    /// Runner CPU (user + system) when it went idle after serving every Node.
    pub cpu_s: f64,
    /// Runner peak RSS (VmHWM) when idle, MiB.
    pub peak_rss_mib: f64,
    /// Runner RSS when idle, MiB.
    pub idle_rss_mib: f64,
    /// Anonymous part of the idle RSS (heap, stacks), MiB.
    pub idle_rss_anon_mib: f64,
    /// File-backed part of the idle RSS (binary, libraries), MiB.
    pub idle_rss_file_mib: f64,
    /// Runner peak RSS including its shutdown (the last VmHWM before it exited), MiB.
    pub exit_peak_rss_mib: f64,
    /// Node PATCHes during the first run.
    pub patches: u64,
    /// Node LIST requests (pages).
    pub lists: u64,
    /// Node WATCH requests.
    pub watches: u64,
    /// Node GETs (real server only).
    pub gets: u64,
    /// 410 answers on Node lists/watches.
    pub gone410: u64,
    /// Distinct podCIDRs found by the final LIST (if verified).
    pub distinct_pod_cidrs: Option<usize>,
    /// The restart: time to ready.
    pub restart_ready_s: Option<f64>,
    /// PATCHes the restarted runner sent (must be 0).
    pub restart_patches: Option<u64>,
    /// Restarted runner's CPU when idle.
    pub restart_cpu_s: Option<f64>,
    /// Restarted runner's peak RSS, MiB.
    pub restart_peak_rss_mib: Option<f64>,
    /// Peak RSS of the sandbox or of kube-apiserver, MiB.
    pub sandbox_peak_rss_mib: f64,
    /// Peak RSS of etcd (real server), MiB.
    pub etcd_peak_rss_mib: Option<f64>,
    /// CPU the sandbox or kube-apiserver used during the first run (exec to idle), seconds.
    pub server_cpu_s: f64,
    /// CPU etcd used during the first run (real server), seconds.
    pub etcd_cpu_s: Option<f64>,
    /// (`server_cpu_s` + `etcd_cpu_s`) / `nodes`, milliseconds: the API server's cost per
    /// served Node, its idle use during the window included.
    pub server_etcd_cpu_ms_per_node: f64,
    /// CPU seconds per second the server and etcd used together while idle, sampled over
    /// [`IDLE_SAMPLE`] just before the run (their timers, the bench's own watch; real server
    /// only, 0 for the sandbox's which is not sampled).
    pub server_etcd_idle_cpu_per_s: f64,
    /// Seconds between the two samples of `server_cpu_s` (the run's window: runner exec to idle,
    /// the watcher's list included).
    pub window_s: f64,
    /// `server_etcd_cpu_ms_per_node` less the idle rate over the window: what serving the Nodes
    /// cost the server.
    pub server_etcd_net_cpu_ms_per_node: f64,
}

/// How long the real server's idle CPU is sampled before each run.
pub const IDLE_SAMPLE: Duration = Duration::from_secs(3);

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn elapsed_s(at: Option<Duration>) -> Option<f64> {
    at.map(|d| d.as_secs_f64())
}

/// Runs one row for one runner, on a fresh server.
///
/// # Errors
/// A process that would not start, a phase past its timeout, or a runner that exited early.
pub async fn row(
    settings: &Settings,
    nodes: usize,
    stack: Stack,
    mode: Mode,
    runner: Runner,
    variant: Variant,
) -> Result<Row, String> {
    let ticks = process::clock_ticks();
    let latency_ms = if mode == Mode::Latency {
        settings.latency_ms
    } else {
        0
    };
    if runner != Runner::Ours && mode == Mode::Default {
        return Err("the 20/30 rows are ours only (kcm and the null writer run unlimited)".into());
    }
    if settings.server == ServerKind::Real && mode == Mode::Latency {
        return Err("injected latency needs the sandbox (--server sandbox)".into());
    }
    let tag = format!(
        "n{nodes}-{stack:?}-{mode:?}-{:?}-{runner:?}{}",
        settings.server,
        variant
            .label(runner)
            .split(['/', ' '])
            .filter(|w| !w.is_empty())
            .fold(String::new(), |tag, w| tag + "-" + w)
    )
    .to_lowercase();
    std::fs::create_dir_all(&settings.out_dir)
        .map_err(|e| format!("{}: {e}", settings.out_dir.display()))?;
    let load_before = process::load_average();

    let (server, setup) = match settings.server {
        ServerKind::Sandbox => (
            Server::sandbox(
                &settings.sandbox,
                &settings.fixture,
                nodes,
                latency_ms,
                settings.history_limit,
                settings.out_dir.join(format!("{tag}-sandbox.log")),
            )
            .await?,
            None,
        ),
        ServerKind::Real => {
            let (server, setup) =
                Server::real(&settings.fixture, nodes, &settings.apiserver_args).await?;
            eprintln!(
                "  {tag}: real server up in {:.1} s, {nodes} Nodes created in {:.1} s",
                setup.start_s, setup.create_s
            );
            (server, Some(setup))
        }
    };
    let prepared = Instant::now();
    let answers = if runner == Runner::Null {
        Some(prepare_answers(settings, &server, stack, &tag).await?)
    } else {
        None
    };
    let prepare_s = answers.as_ref().map(|_| prepared.elapsed().as_secs_f64());
    server.start_counting().await?;
    let before = server.counters().await?;
    let server_etcd_idle_cpu_per_s = if settings.server == ServerKind::Real {
        let (server_0, etcd_0) = server.usage(ticks);
        let sampled = Instant::now();
        tokio::time::sleep(IDLE_SAMPLE).await;
        let (server_1, etcd_1) = server.usage(ticks);
        let etcd = etcd_1
            .zip(etcd_0)
            .map_or(0.0, |(after, before)| after.cpu_s - before.cpu_s);
        (server_1.cpu_s - server_0.cpu_s + etcd) / sampled.elapsed().as_secs_f64()
    } else {
        0.0
    };
    let (server_before, etcd_before) = server.usage(ticks);
    let window = Instant::now();
    let watcher = match variant.watcher {
        Some(encoding) => Some(start_watcher(settings, &server, encoding, &tag).await?),
        None => None,
    };

    let first = runner_run(
        settings,
        &server,
        runner,
        answers.as_deref(),
        (stack, mode, variant),
        &tag,
        "first",
        ticks,
        Some(nodes),
    )
    .await?;
    let after_first = server.counters().await?.since(before);
    let (server_after, etcd_after) = server.usage(ticks);
    let window_s = window.elapsed().as_secs_f64();
    if let Some(watcher) = watcher {
        let ended = watcher.marks.get(watcher::ENDED).is_some();
        let log = watcher.log.clone();
        let _ = watcher.terminate(Duration::from_secs(10), ticks);
        if ended {
            // kube-apiserver says why it closed a watch (its watch cache's "Forcing … watcher
            // close due to unresponsiveness" for a slow reader): kept beside the watcher's log.
            let mut why = String::new();
            if let Some(text) = server.apiserver_log() {
                let path = settings.out_dir.join(format!("{tag}-kube-apiserver.log"));
                let _ = std::fs::write(&path, &text);
                why = text
                    .lines()
                    .filter(|l| l.contains("watcher close") || l.contains("unresponsive"))
                    .take(3)
                    .collect::<Vec<_>>()
                    .join("\n");
                why = format!("; kube-apiserver's log ({}): {why}", path.display());
            }
            return Err(format!(
                "the watcher's watch ended before the run did; see {}{why}",
                log.display()
            ));
        }
    }
    server.stop_counting();
    let distinct = if settings.verify {
        Some(distinct_pod_cidrs(server.api(), nodes, stack).await?)
    } else {
        None
    };
    let restart = if settings.restart && runner != Runner::Null {
        let patches_before = server.counters().await?.patches;
        let restart = runner_run(
            settings,
            &server,
            runner,
            None,
            (stack, mode, variant),
            &tag,
            "restart",
            ticks,
            None,
        )
        .await?;
        let patches_after = server.counters().await?.patches;
        Some((restart, patches_after - patches_before))
    } else {
        None
    };
    let (server_usage, etcd_usage) = server.usage(ticks);
    server.stop(ticks);

    let serving = first.served - first.ready.unwrap_or_default().as_secs_f64();
    let server_cpu_s = server_after.cpu_s - server_before.cpu_s;
    let etcd_cpu_s = etcd_after
        .zip(etcd_before)
        .map(|(after, before)| after.cpu_s - before.cpu_s);
    Ok(Row {
        runner,
        variant,
        server: settings.server,
        nodes,
        stack,
        node_cidr_mask_size: settings.node_cidr_mask_size,
        mode,
        latency_ms,
        leader_elect: settings.leader_elect,
        load_before,
        setup,
        prepare_s,
        listed_s: elapsed_s(first.listed),
        ready_s: elapsed_s(first.ready),
        served_s: first.served,
        patches_per_s: if serving > 0.0 {
            after_first.patches as f64 / serving
        } else {
            f64::NAN
        },
        cpu_s: first.idle.cpu_s,
        peak_rss_mib: mib(first.idle.peak_rss),
        idle_rss_mib: mib(first.idle.rss),
        idle_rss_anon_mib: mib(first.idle.rss_anon),
        idle_rss_file_mib: mib(first.idle.rss_file),
        exit_peak_rss_mib: mib(first.exit.peak_rss),
        patches: after_first.patches,
        lists: after_first.lists,
        watches: after_first.watches,
        gets: after_first.gets,
        gone410: after_first.gone410,
        distinct_pod_cidrs: distinct,
        restart_ready_s: restart.as_ref().and_then(|(r, _)| elapsed_s(r.ready)),
        restart_patches: restart.as_ref().map(|(_, p)| *p),
        restart_cpu_s: restart.as_ref().map(|(r, _)| r.idle.cpu_s),
        restart_peak_rss_mib: restart.as_ref().map(|(r, _)| mib(r.idle.peak_rss)),
        sandbox_peak_rss_mib: mib(server_usage.peak_rss),
        etcd_peak_rss_mib: etcd_usage.map(|u| mib(u.peak_rss)),
        server_cpu_s,
        etcd_cpu_s,
        server_etcd_cpu_ms_per_node: (server_cpu_s + etcd_cpu_s.unwrap_or(0.0)) * 1000.0
            / nodes.max(1) as f64,
        server_etcd_idle_cpu_per_s,
        window_s,
        server_etcd_net_cpu_ms_per_node: (server_cpu_s + etcd_cpu_s.unwrap_or(0.0)
            - server_etcd_idle_cpu_per_s * window_s)
            * 1000.0
            / nodes.max(1) as f64,
    })
}

/// Starts a `scale-bench watcher` in `encoding` against `server` and waits until it has read
/// the full list.
async fn start_watcher(
    settings: &Settings,
    server: &Server,
    encoding: Encoding,
    tag: &str,
) -> Result<Running, String> {
    let args = vec![
        "watcher".to_owned(),
        server.connect_flag(),
        format!("--encoding={}", encoding.name()),
    ];
    let start = Instant::now();
    let (mut running, _) = Running::spawn(
        &settings.bench,
        &args,
        &[],
        settings.out_dir.join(format!("{tag}-watcher.log")),
        &[watcher::LISTED, watcher::ENDED],
        start,
        false,
    )?;
    let deadline = start + settings.timeout;
    while running.marks.get(watcher::LISTED).is_none() {
        check_alive(&mut running, deadline, "the watcher's list")?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok(running)
}

/// The null writer's answers, before the timed part: every Node's name and uid (paged LIST, 500
/// a page) into a slim NodeList, `nodeipam-controller plan -o json` over it with the row's flags,
/// then `name uid podCIDR[,podCIDR]` lines. Returns the answers file.
async fn prepare_answers(
    settings: &Settings,
    server: &Server,
    stack: Stack,
    tag: &str,
) -> Result<PathBuf, String> {
    let all: Api<Node> = Api::all(server.api().clone());
    let mut params = ListParams::default().limit(500);
    let mut items = Vec::new();
    let mut uids = Vec::new();
    loop {
        let page = all.list(&params).await.map_err(|e| format!("LIST: {e}"))?;
        for node in page.items {
            let name = node.metadata.name.unwrap_or_default();
            let uid = node.metadata.uid.unwrap_or_default();
            items.push(serde_json::json!({"metadata": {"name": name, "uid": uid}}));
            uids.push(uid);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => break,
        }
    }
    let list_path = settings.out_dir.join(format!("{tag}-nodes.json"));
    let list = serde_json::json!({"apiVersion": "v1", "kind": "NodeList", "items": items});
    std::fs::write(&list_path, list.to_string())
        .map_err(|e| format!("{}: {e}", list_path.display()))?;
    let mut plan = std::process::Command::new(&settings.controller);
    plan.arg("plan")
        .arg(format!("--cluster-cidr={}", stack.cluster_cidr()))
        .args(["-o", "json"]);
    if let Some(mask) = settings.node_cidr_mask_size {
        plan.arg(format!("--node-cidr-mask-size={mask}"));
    }
    let output = plan
        .arg(&list_path)
        .output()
        .map_err(|e| format!("{}: {e}", settings.controller.display()))?;
    let _ = std::fs::remove_file(&list_path);
    if !output.status.success() {
        return Err(format!(
            "plan failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    #[derive(serde::Deserialize)]
    struct PlanNode {
        name: String,
        #[serde(rename = "podCIDRs")]
        pod_cidrs: Vec<String>,
    }
    #[derive(serde::Deserialize)]
    struct Plan {
        nodes: Vec<PlanNode>,
    }
    let plan: Plan =
        serde_json::from_slice(&output.stdout).map_err(|e| format!("plan's JSON: {e}"))?;
    if plan.nodes.len() != uids.len() {
        return Err(format!(
            "plan gave {} Nodes for {} listed",
            plan.nodes.len(),
            uids.len()
        ));
    }
    let mut text = String::new();
    for (node, uid) in plan.nodes.iter().zip(&uids) {
        if node.pod_cidrs.is_empty() {
            return Err(format!("plan gave Node {} no podCIDRs", node.name));
        }
        text.push_str(&format!(
            "{} {uid} {}\n",
            node.name,
            node.pod_cidrs.join(",")
        ));
    }
    let path = settings.out_dir.join(format!("{tag}-answers.txt"));
    std::fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

/// What one runner process did.
struct ControllerRun {
    listed: Option<Duration>,
    ready: Option<Duration>,
    /// Seconds until every Node was served (after ready); 0 when not waited for.
    served: f64,
    /// Usage once idle.
    idle: Usage,
    /// The last usage read before it exited.
    exit: Usage,
}

/// A kubeconfig for the sandbox's plain-HTTP URL (kube-controller-manager reads one; no user).
fn sandbox_kubeconfig(path: &std::path::Path, url: &str) -> Result<(), String> {
    let text = format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: sandbox\n  cluster:\n    server: {url}\nusers:\n- name: anonymous\n  user: {{}}\ncontexts:\n- name: sandbox\n  context:\n    cluster: sandbox\n    user: anonymous\ncurrent-context: sandbox\n"
    );
    std::fs::write(path, text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The command line of `runner` against `server`; for ours also its plain metrics port.
fn command_line(
    settings: &Settings,
    server: &Server,
    runner: Runner,
    answers: Option<&std::path::Path>,
    (stack, mode, variant): (Stack, Mode, Variant),
    tag: &str,
    phase: &str,
) -> Result<(PathBuf, Vec<String>, Option<u16>), String> {
    let unlimited = mode != Mode::Default;
    match runner {
        Runner::Ours => {
            let metrics_port = process::free_port()?;
            let health_port = process::free_port()?;
            let mut args = vec![
                server.connect_flag(),
                format!("--cluster-cidr={}", stack.cluster_cidr()),
                format!("--leader-elect={}", settings.leader_elect),
                format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
                format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
                // The plain health/metrics ports above are what the bench reads; kcm's secure
                // port (10257 by default) would make a run fail whenever something else holds it.
                "--secure-port=0".to_owned(),
            ];
            if let Some(mask) = settings.node_cidr_mask_size {
                args.push(format!("--node-cidr-mask-size={mask}"));
            }
            if unlimited {
                args.push("--kube-api-qps=100000".to_owned());
                args.push("--kube-api-burst=100000".to_owned());
            }
            args.extend(settings.controller_args.iter().cloned());
            Ok((settings.controller.clone(), args, Some(metrics_port)))
        }
        Runner::Kcm => {
            let kubeconfig = match server {
                Server::Sandbox { url, .. } => {
                    let path = settings.out_dir.join(format!("{tag}-kcm.kubeconfig"));
                    sandbox_kubeconfig(&path, url)?;
                    path
                }
                Server::Real { kubeconfig, .. } => kubeconfig.clone(),
            };
            // The minimal working set (see BENCHMARKS.md): only the node IPAM controller, no
            // serving (its secure port needs a free 10257 and delegated authentication),
            // leader election as ours; no cloud provider flag is needed.
            let mut args = vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                "--controllers=nodeipam".to_owned(),
                "--allocate-node-cidrs=true".to_owned(),
                "--cidr-allocator-type=RangeAllocator".to_owned(),
                format!("--cluster-cidr={}", stack.cluster_cidr()),
                format!("--leader-elect={}", settings.leader_elect),
                // kcm does not give its Lease back on SIGTERM: a restart under the same name
                // would wait out the 15 s lease duration first. Ours releases it.
                format!("--leader-elect-resource-name=kube-controller-manager-{phase}"),
                "--secure-port=0".to_owned(),
                "--kube-api-qps=100000".to_owned(),
                "--kube-api-burst=100000".to_owned(),
            ];
            if let Some(mask) = settings.node_cidr_mask_size {
                args.push(format!("--node-cidr-mask-size={mask}"));
            }
            if matches!(server, Server::Sandbox { .. }) {
                // The sandbox speaks JSON only; kcm's default is protobuf.
                args.push("--kube-api-content-type=application/json".to_owned());
            }
            Ok((settings.kcm.clone(), args, None))
        }
        Runner::Null => {
            let answers = answers.ok_or("the null writer needs its answers")?;
            let args = vec![
                "null-writer".to_owned(),
                server.connect_flag(),
                format!("--answers={}", answers.display()),
                "--workers=30".to_owned(),
                format!("--patch-type={}", variant.patch_type.name()),
                format!("--answer={}", variant.answer.name()),
            ];
            Ok((settings.bench.clone(), args, None))
        }
    }
}

/// Starts `runner`, waits for its ready mark, then (if `nodes`) for every Node to be served, then
/// for it to be idle (ours: work queue empty; every runner: < 0.02 CPU s over 1 s); stops it with
/// SIGTERM.
#[allow(clippy::too_many_arguments)]
async fn runner_run(
    settings: &Settings,
    server: &Server,
    runner: Runner,
    answers: Option<&std::path::Path>,
    shape: (Stack, Mode, Variant),
    tag: &str,
    phase: &str,
    ticks: f64,
    nodes: Option<usize>,
) -> Result<ControllerRun, String> {
    let (program, args, metrics_port) =
        command_line(settings, server, runner, answers, shape, tag, phase)?;
    let env: Vec<(&str, &str)> = if runner == Runner::Ours {
        settings
            .controller_env
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    } else {
        Vec::new()
    };
    let start = Instant::now();
    let (mut controller, _) = Running::spawn(
        &program,
        &args,
        &env,
        settings.out_dir.join(format!("{tag}-{phase}.log")),
        runner.marks(),
        start,
        false,
    )?;
    let pid = controller.pid();
    if settings.usage_series {
        let path = settings.out_dir.join(format!("{tag}-{phase}.usage.tsv"));
        std::thread::spawn(move || write_usage_series(pid, ticks, start, &path));
    }
    let deadline = start + settings.timeout;
    let metrics = match metrics_port {
        Some(port) => Some(http::client(&format!("http://127.0.0.1:{port}"))?),
        None => None,
    };

    let ready_mark = runner.ready_mark();
    while controller.marks.get(ready_mark).is_none() {
        check_alive(&mut controller, deadline, "ready")?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let served = match nodes {
        Some(nodes) => loop {
            check_alive(&mut controller, deadline, "every Node served")?;
            if server.served().await? >= nodes {
                break start.elapsed().as_secs_f64();
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        },
        None => 0.0,
    };
    // Idle: nothing queued, and no CPU used over 1 s (its own watch events are consumed too).
    loop {
        check_alive(&mut controller, deadline, "idle")?;
        let depth = match &metrics {
            Some(metrics) => {
                let text = http::get_text(metrics, "/metrics")
                    .await
                    .unwrap_or_default();
                http::metric(&text, "node_ipam_controller_workqueue_depth")
            }
            None => None,
        };
        let before = process::usage(pid, ticks).unwrap_or_default();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = process::usage(pid, ticks).unwrap_or_default();
        if depth.is_none_or(|d| d == 0.0) && after.cpu_s - before.cpu_s < 0.02 {
            break;
        }
    }
    let idle = process::usage(pid, ticks).ok_or("the runner is gone")?;
    let marks = controller.marks.clone();
    let log = controller.log.clone();
    let (status, exit) = controller.terminate(Duration::from_secs(30), ticks);
    let exit = exit.unwrap_or(idle);
    eprintln!(
        "  {tag} {phase}: ready {:?}, served {served:.2} s, idle: CPU {:.2} s, VmHWM {:.1} MiB, RSS {:.1} MiB (anon {:.1}, file {:.1}); VmHWM at exit {:.1} MiB; exit: {status}; log {}",
        marks.get(ready_mark),
        idle.cpu_s,
        mib(idle.peak_rss),
        mib(idle.rss),
        mib(idle.rss_anon),
        mib(idle.rss_file),
        mib(exit.peak_rss),
        log.display()
    );
    Ok(ControllerRun {
        listed: marks.get(LISTED),
        ready: marks.get(ready_mark),
        served,
        idle,
        exit,
    })
}

/// `seconds  VmRSS-MiB  RssAnon-MiB  VmHWM-MiB  CPU-s` every 50 ms until `pid` is gone.
fn write_usage_series(pid: u32, ticks: f64, start: Instant, path: &std::path::Path) {
    use std::io::Write as _;
    let Ok(file) = std::fs::File::create(path) else {
        return;
    };
    let mut out = std::io::BufWriter::new(file);
    let _ = writeln!(out, "seconds\trss_mib\tanon_mib\thwm_mib\tcpu_s");
    while let Some(u) = process::usage(pid, ticks).filter(|u| u.rss > 0) {
        let _ = writeln!(
            out,
            "{:.3}\t{:.1}\t{:.1}\t{:.1}\t{:.2}",
            start.elapsed().as_secs_f64(),
            mib(u.rss),
            mib(u.rss_anon),
            mib(u.peak_rss),
            u.cpu_s
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn check_alive(controller: &mut Running, deadline: Instant, phase: &str) -> Result<(), String> {
    if let Some(status) = controller.exited() {
        return Err(format!(
            "the controller exited ({status}) before {phase}; see {}",
            controller.log.display()
        ));
    }
    if Instant::now() > deadline {
        return Err(format!(
            "timed out waiting for {phase} ({} of {} marks seen); see {}",
            controller.marks.count(),
            controller.watched,
            controller.log.display()
        ));
    }
    Ok(())
}

/// Pages through every Node (500 a page) and checks each has one podCIDR per family, all
/// distinct; returns how many distinct podCIDRs there are.
async fn distinct_pod_cidrs(
    api: &kube::Client,
    nodes: usize,
    stack: Stack,
) -> Result<usize, String> {
    let per_node = match stack {
        Stack::Single => 1,
        Stack::Dual => 2,
    };
    let all: Api<Node> = Api::all(api.clone());
    let mut seen = HashSet::with_capacity(nodes * per_node);
    let mut params = ListParams::default().limit(500);
    let mut listed = 0;
    loop {
        let page = all.list(&params).await.map_err(|e| format!("LIST: {e}"))?;
        for node in &page.items {
            listed += 1;
            let cidrs = node
                .spec
                .as_ref()
                .and_then(|s| s.pod_cidrs.clone())
                .unwrap_or_default();
            if cidrs.len() != per_node {
                return Err(format!(
                    "Node {:?} has podCIDRs {cidrs:?}",
                    node.metadata.name
                ));
            }
            for cidr in cidrs {
                if !seen.insert(cidr.clone()) {
                    return Err(format!("{cidr} is given to two Nodes"));
                }
            }
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params.continue_token = Some(token),
            None => break,
        }
    }
    if listed != nodes {
        return Err(format!("listed {listed} Nodes, wanted {nodes}"));
    }
    Ok(seen.len())
}
