//! `scale-bench`: the controller's scale benchmark. For every row (Nodes × stack × mode) it starts
//! an API server with N renamed copies of a real AWS Node (fixture 05's second Node, no podCIDRs)
//! — the release `sandbox-apiserver` (`--server sandbox`) or etcd + kube-apiserver built by
//! `tests/upstream/build.sh` (`--server real`, the Nodes created through the API first) — and a
//! runner as a separate process: our release `nodeipam-controller`, and with `--peer kcm` the
//! pinned kube-controller-manager, with `--peer null` the null writer (this binary's
//! `null-writer` subcommand: PATCHes `plan`'s answers, the server's floor); each runner on a fresh
//! server, alternating ours / kcm / null, `--repeat` times. It prints: time to ready, time to serve
//! every Node, PATCHes per second, CPU seconds and peak RSS once idle, requests by verb, 410s, and
//! a restart against the fully allocated server (time to ready, PATCHes sent: must be 0), then the
//! `ours/kcm` and `ours/null` ratios. Every row also gives the API server's cost per served Node:
//! (kube-apiserver or sandbox CPU + etcd CPU) / N, in milliseconds, from the runner's exec until
//! it is idle; on the real server also the same less the servers' idle CPU rate (sampled for
//! 3 s just before the run: their timers and the bench's own JSON watch) over that window.
//!
//! Issue 34 item 3 (the server's cost by PATCH type and watch encoding): `--null-patch-types`,
//! `--null-answers` and `--null-watchers` run the null writer once per combination, on a fresh
//! server each, alternating within each `--repeat`; `--no-ours` leaves our controller out. The
//! `watcher` subcommand ([`watcher`]) lists and watches Nodes in JSON or protobuf beside the null
//! writer, so the difference between rows with and without it is the server's cost of one
//! informer's list + watch in that encoding:
//!
//! ```text
//! target/release/scale-bench --server real --no-ours --peer null --nodes 10000 --stacks single \
//!     --modes unlimited --null-patch-types smp,merge,json-test --null-watchers none,json,protobuf --repeat 3
//! ```
//!
//! ```text
//! cargo build --release -p nodeipam --bin nodeipam-controller -p nodeipam-tests --bin sandbox-apiserver --bin scale-bench
//! target/release/scale-bench --nodes 2000,10000,50000 --stacks single,dual --modes unlimited,latency
//! export NODEIPAM_UPSTREAM_BIN="$(tests/upstream/build.sh | tail -n 1)"
//! target/release/scale-bench --peer kcm,null --server real --nodes 2000 --stacks single --modes unlimited
//! ```
//!
//! Results: a Markdown table on stdout (one line per run as it finishes), progress on stderr, one
//! JSON object per run appended to `--json`, the processes' logs in `--out-dir`. Timing is
//! reported, never asserted.

mod http;
mod null_writer;
mod process;
mod run;
mod server;
mod watcher;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use null_writer::{Answer, PatchType};
use run::{Mode, Row, Runner, Settings, Stack, Variant};
use server::ServerKind;

/// The controller's scale benchmark (separate sandbox and controller processes).
#[derive(Debug, Parser)]
#[command(name = "scale-bench")]
struct Args {
    /// Node counts, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "2000,10000,50000")]
    nodes: Vec<usize>,
    /// Stacks, comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "single,dual")]
    stacks: Vec<Stack>,
    /// Modes, comma-separated: unlimited (qps/burst 100000), default (20/30), latency (unlimited,
    /// every response delayed --latency-ms).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "unlimited,latency,default"
    )]
    modes: Vec<Mode>,
    /// Response delay of the latency rows, milliseconds.
    #[arg(long, default_value_t = 5)]
    latency_ms: u64,
    /// `--leader-elect` of the controller (true: it takes a Lease from the sandbox first;
    /// false adds a start-up write fence of one request timeout, 10 s).
    #[arg(long, default_value_t = true, action = clap::ArgAction::Set)]
    leader_elect: bool,
    /// `--history-limit` of the sandbox (changes kept for watches).
    #[arg(long, default_value_t = 1000)]
    history_limit: usize,
    /// The controller binary (default: `nodeipam-controller` beside this binary).
    #[arg(long)]
    controller: Option<PathBuf>,
    /// The sandbox binary (default: `sandbox-apiserver` beside this binary).
    #[arg(long)]
    sandbox: Option<PathBuf>,
    /// NodeList whose `items[1]` is replicated.
    #[arg(long)]
    fixture: Option<PathBuf>,
    /// Logs of every process go here.
    #[arg(long, default_value = "/tmp/scale-bench")]
    out_dir: PathBuf,
    /// Append one JSON object per row here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Give up a phase after this many seconds.
    #[arg(long, default_value_t = 7200)]
    timeout_s: u64,
    /// Skip the restart against the allocated sandbox.
    #[arg(long)]
    no_restart: bool,
    /// Skip the final LIST that checks every podCIDR is distinct.
    #[arg(long)]
    no_verify: bool,
    /// Extra controller flag (repeatable), e.g. `--controller-arg=--node-cidr-update-workers=1`.
    #[arg(long, allow_hyphen_values = true)]
    controller_arg: Vec<String>,
    /// Extra kube-apiserver flag with `--server real` (repeatable), e.g. `--apiserver-arg=--v=1`.
    #[arg(long, allow_hyphen_values = true)]
    apiserver_arg: Vec<String>,
    /// Extra controller environment `KEY=VALUE` (repeatable).
    #[arg(long)]
    controller_env: Vec<String>,
    /// Also write the controller's RSS and CPU every 50 ms to a `.usage.tsv` file in `--out-dir`.
    #[arg(long)]
    usage_series: bool,
    /// Peers run after ours on the same row, each on a fresh server, comma-separated: `kcm`
    /// (kube-controller-manager's range allocator), `null` (the null writer).
    #[arg(long, value_delimiter = ',')]
    peer: Vec<Runner>,
    /// The API server: `sandbox`, or `real` (etcd + kube-apiserver from `$NODEIPAM_UPSTREAM_BIN`).
    #[arg(long, value_enum, default_value = "sandbox")]
    server: ServerKind,
    /// The kube-controller-manager binary (default: `$NODEIPAM_UPSTREAM_BIN/kube-controller-manager`).
    #[arg(long)]
    kcm: Option<PathBuf>,
    /// `--node-cidr-mask-size` of every runner (default: the runners' defaults, /24 and /64), e.g.
    /// 26 for 150,000 Nodes in 10.0.0.0/8.
    #[arg(long, value_parser = clap::value_parser!(u8).range(1..=128))]
    node_cidr_mask_size: Option<u8>,
    /// Runs of every row (ours, then each peer, again), e.g. 2.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    repeat: u32,
    /// Leave our controller out (only the peers run; no ratios).
    #[arg(long)]
    no_ours: bool,
    /// The null writer's PATCH types, comma-separated: one null run per type (× answer ×
    /// watcher). `smp` is the controller's own body.
    #[arg(long, value_delimiter = ',', default_value = "smp")]
    null_patch_types: Vec<PatchType>,
    /// The null writer's answer forms, comma-separated: `full` (the whole Node, as the
    /// controller asks) and/or `metadata` (`PartialObjectMetadata`).
    #[arg(long, value_delimiter = ',', default_value = "full")]
    null_answers: Vec<Answer>,
    /// A watcher beside each null run, comma-separated: `none`, `json` (as our informer),
    /// `protobuf` (as kcm's); one null run per value.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    null_watchers: Vec<WatcherChoice>,
}

/// `--null-watchers` values.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum WatcherChoice {
    /// No watcher.
    None,
    /// A JSON list + watch.
    Json,
    /// A protobuf list + watch.
    Protobuf,
}

impl WatcherChoice {
    fn encoding(self) -> Option<watcher::Encoding> {
        match self {
            WatcherChoice::None => None,
            WatcherChoice::Json => Some(watcher::Encoding::Json),
            WatcherChoice::Protobuf => Some(watcher::Encoding::Protobuf),
        }
    }
}

fn ratio(ours: f64, peer: f64) -> String {
    if peer > 0.0 && ours.is_finite() && peer.is_finite() {
        format!("{:.2}", ours / peer)
    } else {
        "–".to_owned()
    }
}

fn print_row(row: &Row, rep: u32) {
    let qps = match row.mode {
        Mode::Default => "20/30",
        Mode::Unlimited | Mode::Latency => "unlimited",
    };
    println!(
        "| {} | {:?} | {:?} | {qps} | {} ms | {:?} | {rep} | {:.1} | {} | {:.2} | {:.2} | {:.1} | {} / {} / {} / {} | {} | {} | {} | {} | {:.0} | {} | {:.2} | {} | {} | {:.3} | {:.3} | {:.1} | {:.3} |",
        row.nodes,
        row.stack,
        row.server,
        row.latency_ms,
        row.runner,
        row.load_before,
        opt(row.ready_s, 2),
        row.served_s,
        row.cpu_s,
        row.peak_rss_mib,
        row.patches,
        row.lists,
        row.watches,
        row.gets,
        row.gone410,
        opt(row.restart_ready_s, 2),
        row.restart_patches
            .map_or_else(|| "–".to_owned(), |p| p.to_string()),
        opt(row.restart_peak_rss_mib, 1),
        row.sandbox_peak_rss_mib,
        opt(row.etcd_peak_rss_mib, 0),
        row.server_cpu_s,
        opt(row.etcd_cpu_s, 2),
        row.variant.label(row.runner),
        row.server_etcd_cpu_ms_per_node,
        row.server_etcd_idle_cpu_per_s,
        row.window_s,
        row.server_etcd_net_cpu_ms_per_node,
    );
}

fn print_ratio(ours: &Row, peer: &Row) {
    println!(
        "| {} | {:?} | {:?} | | {} ms | ours/{:?} | | | | {} | {} | {} | | | | | | | | | | {} | {} | | | {} |",
        ours.nodes,
        ours.stack,
        ours.server,
        ours.latency_ms,
        peer.runner,
        ratio(ours.served_s, peer.served_s),
        ratio(ours.cpu_s, peer.cpu_s),
        ratio(ours.peak_rss_mib, peer.peak_rss_mib),
        peer.variant.label(peer.runner),
        ratio(
            ours.server_etcd_cpu_ms_per_node,
            peer.server_etcd_cpu_ms_per_node
        ),
        ratio(
            ours.server_etcd_net_cpu_ms_per_node,
            peer.server_etcd_net_cpu_ms_per_node
        ),
    );
}

fn beside_me(name: &str) -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(|d| d.join(name)))
        .unwrap_or_else(|| PathBuf::from(name))
}

fn opt(value: Option<f64>, digits: usize) -> String {
    value.map_or_else(|| "–".to_owned(), |v| format!("{v:.digits$}"))
}

/// The flags of a subcommand (`scale-bench null-writer …`): the command line without its name.
fn subcommand_args<P: Parser>() -> P {
    P::parse_from(
        std::env::args_os()
            .enumerate()
            .filter(|(i, _)| *i != 1)
            .map(|(_, a)| a),
    )
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
    match std::env::args_os().nth(1) {
        Some(a) if a == "null-writer" => return null_writer::main(subcommand_args()).await,
        Some(a) if a == "watcher" => return watcher::main(subcommand_args()).await,
        _ => {}
    }
    let args = Args::parse();
    let mut controller_env = Vec::new();
    for pair in &args.controller_env {
        match pair.split_once('=') {
            Some((k, v)) => controller_env.push((k.to_owned(), v.to_owned())),
            None => {
                eprintln!("error: --controller-env {pair:?} is not KEY=VALUE");
                return ExitCode::from(2);
            }
        }
    }
    let settings = Settings {
        controller: args
            .controller
            .unwrap_or_else(|| beside_me("nodeipam-controller")),
        sandbox: args
            .sandbox
            .unwrap_or_else(|| beside_me("sandbox-apiserver")),
        kcm: args.kcm.unwrap_or_else(|| {
            std::env::var_os(nodeipam_tests::real_apiserver::BIN_ENV)
                .map(PathBuf::from)
                .unwrap_or_default()
                .join("kube-controller-manager")
        }),
        bench: std::env::current_exe().unwrap_or_else(|_| PathBuf::from("scale-bench")),
        server: args.server,
        node_cidr_mask_size: args.node_cidr_mask_size,
        fixture: args.fixture.unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../fixtures/nodes/05-aws-4nodes-no-podcidr.json"
            ))
        }),
        out_dir: args.out_dir,
        latency_ms: args.latency_ms,
        leader_elect: args.leader_elect,
        history_limit: args.history_limit,
        timeout: Duration::from_secs(args.timeout_s),
        restart: !args.no_restart,
        verify: !args.no_verify,
        controller_args: args.controller_arg,
        apiserver_args: args.apiserver_arg,
        controller_env,
        usage_series: args.usage_series,
    };
    let mut runners = Vec::new();
    if !args.no_ours {
        runners.push(Runner::Ours);
    }
    for peer in &args.peer {
        if !runners.contains(peer) {
            runners.push(*peer);
        }
    }
    if runners.is_empty() {
        eprintln!("error: --no-ours without --peer leaves nothing to run");
        return ExitCode::from(2);
    }
    // Every run of a row: ours and kcm once, the null writer once per variant.
    let mut runs: Vec<(Runner, Variant)> = Vec::new();
    for &runner in &runners {
        if runner != Runner::Null {
            runs.push((runner, Variant::default()));
            continue;
        }
        for &patch_type in &args.null_patch_types {
            for &answer in &args.null_answers {
                for &watcher in &args.null_watchers {
                    let variant = Variant {
                        patch_type,
                        answer,
                        watcher: watcher.encoding(),
                    };
                    if !runs.contains(&(runner, variant)) {
                        runs.push((runner, variant));
                    }
                }
            }
        }
    }
    // The controller is needed by the null writer too (`plan` gives its answers).
    let mut needed = vec![&settings.controller, &settings.fixture];
    if settings.server == ServerKind::Sandbox {
        needed.push(&settings.sandbox);
    }
    if runners.contains(&Runner::Kcm) {
        needed.push(&settings.kcm);
    }
    for path in needed {
        if !path.is_file() {
            eprintln!(
                "error: {} does not exist (kube-controller-manager and the real server: set {} to \
                 the folder `tests/upstream/build.sh` prints, or give --kcm)",
                path.display(),
                nodeipam_tests::real_apiserver::BIN_ENV
            );
            return ExitCode::from(2);
        }
    }
    println!(
        "| N | stack | server | QPS/burst | latency | runner | run | load | ready s | serve all s | CPU s | peak RSS MiB | PATCH / LIST / WATCH / GET | 410s | restart ready s | restart PATCHes | restart peak RSS MiB | server peak RSS MiB | etcd peak RSS MiB | server CPU s | etcd CPU s | variant | server+etcd CPU ms/Node | server+etcd idle CPU s/s | window s | server+etcd net CPU ms/Node |"
    );
    println!(
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"
    );
    let mut failed = false;
    for &nodes in &args.nodes {
        for &stack in &args.stacks {
            for &mode in &args.modes {
                for rep in 1..=args.repeat {
                    let mut done: Vec<Row> = Vec::new();
                    for &(runner, variant) in &runs {
                        let label = variant.label(runner);
                        eprintln!(
                            "row: {nodes} Nodes, {stack:?}, {mode:?}, {runner:?} {label}, run {rep}"
                        );
                        match run::row(&settings, nodes, stack, mode, runner, variant).await {
                            Ok(row) => {
                                print_row(&row, rep);
                                let _ = std::io::stdout().flush();
                                if let Some(path) = &args.json {
                                    let line = serde_json::to_string(&row).unwrap_or_default();
                                    let appended = std::fs::OpenOptions::new()
                                        .create(true)
                                        .append(true)
                                        .open(path)
                                        .and_then(|mut f| writeln!(f, "{line}"));
                                    if let Err(e) = appended {
                                        eprintln!(
                                            "warning: cannot append to {}: {e}",
                                            path.display()
                                        );
                                    }
                                }
                                done.push(row);
                            }
                            Err(e) => {
                                eprintln!(
                                    "error: {nodes} Nodes, {stack:?}, {mode:?}, {runner:?} {label}: {e}"
                                );
                                failed = true;
                            }
                        }
                    }
                    if let Some(ours) = done.iter().find(|r| r.runner == Runner::Ours) {
                        for peer in done.iter().filter(|r| r.runner != Runner::Ours) {
                            print_ratio(ours, peer);
                        }
                    }
                    let _ = std::io::stdout().flush();
                }
            }
        }
    }
    if failed {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}
