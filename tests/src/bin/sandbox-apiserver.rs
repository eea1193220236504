//! The sandbox Kubernetes API server as a process, for local demos, the scale benchmark and peer
//! controllers in other languages (plain HTTP on 127.0.0.1 only, no authentication).
//!
//! ```text
//! sandbox-apiserver --listen 127.0.0.1:8001 --nodes fixtures/nodes/05-aws-4nodes-no-podcidr.json
//! sandbox-apiserver --listen 127.0.0.1:8001 --admin --history-limit 1000 --request-log-size 2000 \
//!     --replicate fixtures/nodes/05-aws-4nodes-no-podcidr.json:1:50000
//! ```
//!
//! Flags (all also in `--help`):
//! - `--listen ADDR` (default `127.0.0.1:8001`; must be on 127.0.0.1; port 0 picks one; the line
//!   `sandbox API server listening on http://…` on stdout says where);
//! - `--nodes FILE`: a NodeList JSON file loaded as the initial Nodes;
//! - `--replicate FILE:INDEX:COUNT[:PREFIX]` (repeatable): COUNT copies of `items[INDEX]` of FILE,
//!   named `PREFIX-0…PREFIX-(COUNT−1)` (default PREFIX `node` for the first flag, `node<k>` for
//!   the k-th), each with a new uid and without podCIDRs;
//! - `--history-limit N` (default 1000): changes kept for watches and continue tokens; older
//!   resourceVersions get 410 Expired;
//! - `--request-log-size N` (default 100000): requests kept in the log (a ring);
//! - `--request-body-limit BYTES` (default 16384): largest body the log keeps;
//! - `--bookmark-interval-ms MS` (default 5000): idle time before a watch with
//!   `allowWatchBookmarks` gets a BOOKMARK;
//! - `--delay-ms MS` (default 0): delay added to every response (changeable via the admin API);
//! - `--watch-event-delay-ms MS` (default 0): pause before each change a watch sends after its
//!   initial state (a slow watch stream);
//! - `--no-watch-list`: answer streaming lists (`sendInitialEvents=true`) as a server with the
//!   WatchList feature off does (422 Invalid), so clients fall back to a paged LIST;
//! - `--admin`: serve the admin endpoints below.
//!
//! Admin endpoints (only with `--admin`):
//! - `GET /sandbox/summary` ⇒ `{"nodes":N,"nodesWithPodCIDRs":M,"patches":P,"lists":L,
//!   "watches":W,"gone410":G,"resourceVersion":RV}` (cheap: no Node is read);
//! - `GET /sandbox/requests` (the request log; `"status": null` = not answered: still in flight,
//!   the client gave up, or the connection was dropped; `late_write` = what a late write did),
//!   `DELETE /sandbox/requests`;
//! - `POST /sandbox/faults` with a rule `{"verb":"patch","resource":"nodes","name":"n1","times":1,
//!   …action}` where the action is one of `"status":C`, `"retryAfterSeconds":S`, `"hangMs":MS`,
//!   `"delayMs":MS`, `"commitThenStatus":C`, `"commitThenHangMs":MS`, `"watchError":C` (a WATCH
//!   answered with one `ERROR` event of code C),
//!   `"lateWrite":{"commitAfterMs":MS,"answer":"timeout","answerAfterMs":MS}` or
//!   `"lateWrite":{"commitAfterMs":MS,"answer":"drop"}` (verb, resource, name optional = any);
//!   `GET /sandbox/faults` ⇒ `{"pending":N}` (firings left); `DELETE /sandbox/faults`;
//! - `POST /sandbox/delay {"ms":N}`, `POST /sandbox/drop-watches`, `POST /sandbox/compact`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use nodeipam_tests::sandbox::log::{DEFAULT_REQUEST_BODY_LIMIT, DEFAULT_REQUEST_LOG_CAPACITY};
use nodeipam_tests::sandbox::{Replicas, Sandbox, SandboxOptions};

/// Sandbox Kubernetes API server (plain HTTP on 127.0.0.1 only, no authentication).
#[derive(Debug, Parser)]
#[command(name = "sandbox-apiserver")]
struct Args {
    /// Address to listen on; must be on 127.0.0.1 (port 0 picks a free one).
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: SocketAddr,
    /// NodeList JSON file loaded as the initial Nodes.
    #[arg(long, value_name = "FILE")]
    nodes: Option<PathBuf>,
    /// Load COUNT copies of `items[INDEX]` of the NodeList in FILE, named PREFIX-0 … PREFIX-(COUNT-1)
    /// (default PREFIX: node, node1, node2 … for the 1st, 2nd, 3rd flag), each with a new uid and
    /// without podCIDRs. Repeatable.
    #[arg(long, value_name = "FILE:INDEX:COUNT[:PREFIX]")]
    replicate: Vec<String>,
    /// Changes kept for watches and continue tokens; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 1000, value_name = "N")]
    history_limit: usize,
    /// Requests kept in the request log (a ring: the oldest are dropped).
    #[arg(long, default_value_t = DEFAULT_REQUEST_LOG_CAPACITY, value_name = "N")]
    request_log_size: usize,
    /// Largest request body kept in the request log, in bytes.
    #[arg(long, default_value_t = DEFAULT_REQUEST_BODY_LIMIT, value_name = "BYTES")]
    request_body_limit: usize,
    /// Idle time before a watch with allowWatchBookmarks gets a BOOKMARK, in milliseconds.
    #[arg(long, default_value_t = 5000, value_name = "MS")]
    bookmark_interval_ms: u64,
    /// Delay added to every response, in milliseconds (changeable with POST /sandbox/delay).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    delay_ms: u64,
    /// Pause before each change a watch sends after its initial state, in milliseconds (a slow
    /// watch stream).
    #[arg(long, default_value_t = 0, value_name = "MS")]
    watch_event_delay_ms: u64,
    /// Answer streaming lists (watch with sendInitialEvents=true) as a server with the WatchList
    /// feature off: 422 Invalid, so clients fall back to a paged LIST.
    #[arg(long)]
    no_watch_list: bool,
    /// Store Node podCIDRs with host bits, a leading-0 prefix length or an IPv4-mapped address as
    /// a server before Kubernetes 1.36 (or with StrictIPCIDRValidation off) does, instead of
    /// refusing them (422). Leading 0s in an IPv4 address are still refused (the sandbox's parser
    /// reads no such address); load such Nodes with --nodes, which stores them as given.
    #[arg(long)]
    no_strict_cidr_validation: bool,
    /// Serve the /sandbox/... admin endpoints (summary, request log, faults incl. late writes,
    /// delay, drop-watches, compact).
    #[arg(long)]
    admin: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let args = Args::parse();
    if args.listen.ip() != IpAddr::V4(Ipv4Addr::LOCALHOST) {
        eprintln!("error: --listen must be on 127.0.0.1 (got {})", args.listen);
        return ExitCode::from(2);
    }
    let initial = match &args.nodes {
        Some(path) => match std::fs::read_to_string(path)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
        {
            Ok(v) => v,
            Err(e) => {
                eprintln!("error: cannot load {}: {e}", path.display());
                return ExitCode::from(2);
            }
        },
        None => serde_json::Value::Null,
    };
    let mut replicas = Vec::new();
    for (k, arg) in args.replicate.iter().enumerate() {
        let prefix = if k == 0 {
            "node".to_owned()
        } else {
            format!("node{k}")
        };
        match Replicas::parse_arg(arg, &prefix) {
            Ok(r) => replicas.push(r),
            Err(e) => {
                eprintln!("error: --replicate {arg}: {e}");
                return ExitCode::from(2);
            }
        }
    }
    let options = SandboxOptions {
        port: args.listen.port(),
        history_limit: args.history_limit,
        bookmark_interval: Duration::from_millis(args.bookmark_interval_ms),
        admin_endpoints: args.admin,
        request_log_limit: args.request_log_size,
        request_body_limit: args.request_body_limit,
        watch_list: !args.no_watch_list,
        replicas,
        delay: Duration::from_millis(args.delay_ms),
        watch_event_delay: Duration::from_millis(args.watch_event_delay_ms),
        strict_cidr_validation: !args.no_strict_cidr_validation,
    };
    let sandbox = match Sandbox::try_start(initial, options).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::FAILURE;
        }
    };
    println!(
        "sandbox API server listening on {} ({} nodes)",
        sandbox.url(),
        sandbox.summary().nodes
    );
    stopped().await;
    sandbox.shutdown().await;
    ExitCode::SUCCESS
}

/// Ctrl-C (SIGINT) or SIGTERM.
async fn stopped() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
