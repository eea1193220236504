//! One row of the benchmark: a fresh sandbox with N replicated Nodes, the controller until every
//! Node is served and the controller is idle, then a restart against the same (now fully
//! allocated) sandbox.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::ListParams;
use serde::Serialize;

use crate::http::{self, Summary};
use crate::process::{self, Running, Usage};

/// The controller's log line after its first complete list (informer).
const LISTED: &str = "listed Nodes; watching";
/// The controller's log line once every existing podCIDR is occupied: it allocates from now on.
const OCCUPIED: &str = "start-up occupy done";
/// The controller's log lines the benchmark time-stamps.
const MARKS: &[&str] = &[LISTED, OCCUPIED];

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
    fn cluster_cidr(self) -> &'static str {
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

/// What is measured, and how.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The release `nodeipam-controller`.
    pub controller: PathBuf,
    /// The release `sandbox-apiserver`.
    pub sandbox: PathBuf,
    /// NodeList file whose `items[1]` is replicated.
    pub fixture: PathBuf,
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
    /// Extra environment of the controller (`KEY=VALUE`).
    pub controller_env: Vec<(String, String)>,
    /// Write the controller's RSS and CPU every 50 ms to `<out_dir>/<row>-controller-<phase>.usage.tsv`.
    pub usage_series: bool,
}

/// One row's figures. Times are seconds from the controller's exec.
#[derive(Debug, Clone, Serialize)]
pub struct Row {
    /// Nodes.
    pub nodes: usize,
    /// Stack.
    pub stack: Stack,
    /// Mode.
    pub mode: Mode,
    /// Response delay, milliseconds.
    pub latency_ms: u64,
    /// Whether the controller ran with leader election.
    pub leader_elect: bool,
    /// 1-minute load average before the row.
    pub load_before: f64,
    /// The first complete list is in the cache.
    pub listed_s: Option<f64>,
    /// Start-up occupy done: allocating.
    pub ready_s: Option<f64>,
    /// Every Node has podCIDRs (sandbox summary, polled every 20 ms).
    pub served_s: f64,
    /// PATCHes per second between ready and served.
    pub patches_per_s: f64,
    /// Controller CPU (user + system) when it went idle after serving every Node.
    pub cpu_s: f64,
    /// Controller peak RSS (VmHWM) when idle, MiB.
    pub peak_rss_mib: f64,
    /// Controller RSS when idle, MiB.
    pub idle_rss_mib: f64,
    /// Anonymous part of the idle RSS (heap, stacks), MiB.
    pub idle_rss_anon_mib: f64,
    /// File-backed part of the idle RSS (binary, libraries), MiB.
    pub idle_rss_file_mib: f64,
    /// Controller peak RSS including its shutdown (the last VmHWM before it exited), MiB.
    pub exit_peak_rss_mib: f64,
    /// Sandbox counters after the first run.
    pub patches: u64,
    /// Node LIST requests (pages).
    pub lists: u64,
    /// Node WATCH requests.
    pub watches: u64,
    /// 410 answers on Node lists/watches.
    pub gone410: u64,
    /// Distinct podCIDRs found by the final LIST (if verified).
    pub distinct_pod_cidrs: Option<usize>,
    /// The restart: time to ready.
    pub restart_ready_s: Option<f64>,
    /// PATCHes the restarted controller sent (must be 0).
    pub restart_patches: Option<u64>,
    /// Restarted controller's CPU when idle.
    pub restart_cpu_s: Option<f64>,
    /// Restarted controller's peak RSS, MiB.
    pub restart_peak_rss_mib: Option<f64>,
    /// Sandbox peak RSS, MiB.
    pub sandbox_peak_rss_mib: f64,
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

fn elapsed_s(at: Option<Duration>) -> Option<f64> {
    at.map(|d| d.as_secs_f64())
}

/// Runs one row.
///
/// # Errors
/// A process that would not start, a phase past its timeout, or a controller that exited early.
pub async fn row(
    settings: &Settings,
    nodes: usize,
    stack: Stack,
    mode: Mode,
) -> Result<Row, String> {
    let ticks = process::clock_ticks();
    let latency_ms = if mode == Mode::Latency {
        settings.latency_ms
    } else {
        0
    };
    let tag = format!("n{nodes}-{stack:?}-{mode:?}").to_lowercase();
    std::fs::create_dir_all(&settings.out_dir)
        .map_err(|e| format!("{}: {e}", settings.out_dir.display()))?;
    let load_before = process::load_average();

    let sandbox_args: Vec<String> = [
        "--listen",
        "127.0.0.1:0",
        "--admin",
        "--request-log-size",
        "1000",
        "--history-limit",
        &settings.history_limit.to_string(),
        "--delay-ms",
        &latency_ms.to_string(),
        "--replicate",
        &format!("{}:1:{nodes}", settings.fixture.display()),
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    let (sandbox, line) = Running::spawn(
        &settings.sandbox,
        &sandbox_args,
        &[],
        settings.out_dir.join(format!("{tag}-sandbox.log")),
        &[],
        Instant::now(),
        true,
    )?;
    let url = line
        .as_deref()
        .and_then(|l| l.split_whitespace().find(|w| w.starts_with("http://")))
        .ok_or_else(|| format!("sandbox printed no URL: {line:?}"))?
        .to_owned();
    let api = http::client(&url)?;
    let before = http::summary(&api).await?;
    if before.nodes != nodes || before.nodes_with_pod_cidrs != 0 {
        return Err(format!(
            "sandbox loaded {before:?}, wanted {nodes} Nodes without podCIDRs"
        ));
    }

    let first = controller_run(
        settings,
        &url,
        stack,
        mode,
        &tag,
        "first",
        ticks,
        &api,
        |s| s.nodes_with_pod_cidrs >= nodes,
    )
    .await?;
    let after_first = http::summary(&api).await?;
    let distinct = if settings.verify {
        Some(distinct_pod_cidrs(&api, nodes, stack).await?)
    } else {
        None
    };
    let restart = if settings.restart {
        let patches_before = http::summary(&api).await?.patches;
        let restart = controller_run(
            settings,
            &url,
            stack,
            mode,
            &tag,
            "restart",
            ticks,
            &api,
            |_| true,
        )
        .await?;
        let patches_after = http::summary(&api).await?.patches;
        Some((restart, patches_after - patches_before))
    } else {
        None
    };
    let sandbox_usage = process::usage(sandbox.pid(), ticks).unwrap_or_default();
    let _ = sandbox.terminate(Duration::from_secs(10), ticks);

    let serving = first.served - first.ready.unwrap_or_default().as_secs_f64();
    Ok(Row {
        nodes,
        stack,
        mode,
        latency_ms,
        leader_elect: settings.leader_elect,
        load_before,
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
        gone410: after_first.gone410,
        distinct_pod_cidrs: distinct,
        restart_ready_s: restart.as_ref().and_then(|(r, _)| elapsed_s(r.ready)),
        restart_patches: restart.as_ref().map(|(_, p)| *p),
        restart_cpu_s: restart.as_ref().map(|(r, _)| r.idle.cpu_s),
        restart_peak_rss_mib: restart.as_ref().map(|(r, _)| mib(r.idle.peak_rss)),
        sandbox_peak_rss_mib: mib(sandbox_usage.peak_rss),
    })
}

/// What one controller process did.
struct ControllerRun {
    listed: Option<Duration>,
    ready: Option<Duration>,
    /// Seconds until `done` held (after ready).
    served: f64,
    /// Usage once idle.
    idle: Usage,
    /// The last usage read before it exited.
    exit: Usage,
}

/// Starts the controller, waits for ready, then for `done(summary)`, then for its work queue to
/// be empty and its CPU to stay idle; stops it with SIGTERM.
#[allow(clippy::too_many_arguments)]
async fn controller_run(
    settings: &Settings,
    url: &str,
    stack: Stack,
    mode: Mode,
    tag: &str,
    phase: &str,
    ticks: f64,
    api: &kube::Client,
    done: impl Fn(&Summary) -> bool,
) -> Result<ControllerRun, String> {
    let metrics_port = process::free_port()?;
    let health_port = process::free_port()?;
    let mut args = vec![
        format!("--master={url}"),
        format!("--cluster-cidr={}", stack.cluster_cidr()),
        format!("--leader-elect={}", settings.leader_elect),
        format!("--metrics-bind-address=127.0.0.1:{metrics_port}"),
        format!("--health-probe-bind-address=127.0.0.1:{health_port}"),
        // The plain health/metrics ports above are what the bench reads; kcm's secure port
        // (10257 by default) would make a run fail whenever something else holds it.
        "--secure-port=0".to_owned(),
    ];
    if mode != Mode::Default {
        args.push("--kube-api-qps=100000".to_owned());
        args.push("--kube-api-burst=100000".to_owned());
    }
    args.extend(settings.controller_args.iter().cloned());
    let env: Vec<(&str, &str)> = settings
        .controller_env
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect();
    let start = Instant::now();
    let (mut controller, _) = Running::spawn(
        &settings.controller,
        &args,
        &env,
        settings
            .out_dir
            .join(format!("{tag}-controller-{phase}.log")),
        MARKS,
        start,
        false,
    )?;
    let pid = controller.pid();
    if settings.usage_series {
        let path = settings
            .out_dir
            .join(format!("{tag}-controller-{phase}.usage.tsv"));
        std::thread::spawn(move || write_usage_series(pid, ticks, start, &path));
    }
    let deadline = start + settings.timeout;
    let metrics = http::client(&format!("http://127.0.0.1:{metrics_port}"))?;

    // Ready: the start-up occupy is done.
    while controller.marks.get(OCCUPIED).is_none() {
        check_alive(&mut controller, deadline, "ready")?;
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Served.
    let served = loop {
        check_alive(&mut controller, deadline, "every Node served")?;
        let summary = http::summary(api).await?;
        if done(&summary) {
            break start.elapsed().as_secs_f64();
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    // Idle: nothing queued, and no CPU used over 1 s (its own watch events are consumed too).
    loop {
        check_alive(&mut controller, deadline, "idle")?;
        let text = http::get_text(&metrics, "/metrics")
            .await
            .unwrap_or_default();
        let depth = http::metric(&text, "node_ipam_controller_workqueue_depth");
        let before = process::usage(pid, ticks).unwrap_or_default();
        tokio::time::sleep(Duration::from_secs(1)).await;
        let after = process::usage(pid, ticks).unwrap_or_default();
        if depth.is_none_or(|d| d == 0.0) && after.cpu_s - before.cpu_s < 0.02 {
            break;
        }
    }
    let idle = process::usage(pid, ticks).ok_or("the controller is gone")?;
    let marks = controller.marks.clone();
    let log = controller.log.clone();
    let (status, exit) = controller.terminate(Duration::from_secs(30), ticks);
    let exit = exit.unwrap_or(idle);
    eprintln!(
        "  {tag} {phase}: ready {:?}, served {served:.2} s, idle: CPU {:.2} s, VmHWM {:.1} MiB, RSS {:.1} MiB (anon {:.1}, file {:.1}); VmHWM at exit {:.1} MiB; exit: {status}; log {}",
        marks.get(OCCUPIED),
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
        ready: marks.get(OCCUPIED),
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
            MARKS.len(),
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
