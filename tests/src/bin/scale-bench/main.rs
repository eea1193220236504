//! `scale-bench`: the controller's scale benchmark. For every row (Nodes × stack × mode) it starts
//! a release `sandbox-apiserver` with N renamed copies of a real AWS Node (fixture 05's second
//! Node, no podCIDRs) and a release `nodeipam-controller` as separate processes, and prints:
//! time to ready (start-up occupy done), time to serve every Node, PATCHes per second, controller
//! CPU seconds and peak RSS once idle, 410s seen by the sandbox, and a restart against the fully
//! allocated sandbox (time to ready, PATCHes sent: must be 0).
//!
//! ```text
//! cargo build --release -p nodeipam --bin nodeipam-controller -p nodeipam-tests --bin sandbox-apiserver --bin scale-bench
//! target/release/scale-bench --nodes 2000,10000,50000 --stacks single,dual --modes unlimited,latency
//! ```
//!
//! Results: a Markdown table on stdout (one line per row as it finishes), progress on stderr, one
//! JSON object per row appended to `--json`, the processes' logs in `--out-dir`. Timing is
//! reported, never asserted.

mod http;
mod process;
mod run;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use run::{Mode, Settings, Stack};

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
    /// Extra controller environment `KEY=VALUE` (repeatable).
    #[arg(long)]
    controller_env: Vec<String>,
    /// Also write the controller's RSS and CPU every 50 ms to a `.usage.tsv` file in `--out-dir`.
    #[arg(long)]
    usage_series: bool,
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

#[tokio::main(flavor = "current_thread")]
async fn main() -> ExitCode {
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
        controller_env,
        usage_series: args.usage_series,
    };
    for path in [&settings.controller, &settings.sandbox, &settings.fixture] {
        if !path.exists() {
            eprintln!("error: {} does not exist", path.display());
            return ExitCode::from(2);
        }
    }
    println!(
        "| N | stack | QPS/burst | latency | load | ready s | serve all s | PATCH/s | CPU s | peak RSS MiB | PATCHes | 410s | restart ready s | restart PATCHes | restart peak RSS MiB |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    let mut failed = false;
    for &nodes in &args.nodes {
        for &stack in &args.stacks {
            for &mode in &args.modes {
                eprintln!("row: {nodes} Nodes, {stack:?}, {mode:?}");
                match run::row(&settings, nodes, stack, mode).await {
                    Ok(row) => {
                        let qps = match mode {
                            Mode::Default => "20/30",
                            Mode::Unlimited | Mode::Latency => "unlimited",
                        };
                        println!(
                            "| {} | {:?} | {qps} | {} ms | {:.1} | {} | {:.2} | {:.0} | {:.2} | {:.1} | {} | {} | {} | {} | {} |",
                            row.nodes,
                            row.stack,
                            row.latency_ms,
                            row.load_before,
                            opt(row.ready_s, 2),
                            row.served_s,
                            row.patches_per_s,
                            row.cpu_s,
                            row.peak_rss_mib,
                            row.patches,
                            row.gone410,
                            opt(row.restart_ready_s, 2),
                            row.restart_patches
                                .map_or_else(|| "–".to_owned(), |p| p.to_string()),
                            opt(row.restart_peak_rss_mib, 1),
                        );
                        let _ = std::io::stdout().flush();
                        if let Some(path) = &args.json {
                            let line = serde_json::to_string(&row).unwrap_or_default();
                            let appended = std::fs::OpenOptions::new()
                                .create(true)
                                .append(true)
                                .open(path)
                                .and_then(|mut f| writeln!(f, "{line}"));
                            if let Err(e) = appended {
                                eprintln!("warning: cannot append to {}: {e}", path.display());
                            }
                        }
                    }
                    Err(e) => {
                        eprintln!("error: {nodes} Nodes, {stack:?}, {mode:?}: {e}");
                        failed = true;
                    }
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
