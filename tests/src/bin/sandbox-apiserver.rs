//! Run the sandbox API server for local demos:
//! `sandbox-apiserver --listen 127.0.0.1:8001 --nodes fixtures/nodes/05-aws-4nodes-no-podcidr.json`.
//!
//! Admin endpoints: `GET/DELETE /sandbox/requests`, `POST/DELETE /sandbox/faults`,
//! `POST /sandbox/delay {"ms":N}`, `POST /sandbox/drop-watches`, `POST /sandbox/compact`.
//! In `GET /sandbox/requests`, `"status": null` marks a request that was not answered (still in
//! flight, or its client gave up first).

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use nodeipam_tests::sandbox::{Sandbox, SandboxOptions};

/// Sandbox Kubernetes API server (plain HTTP on 127.0.0.1 only).
#[derive(Debug, Parser)]
struct Args {
    /// Address to listen on; must be 127.0.0.1.
    #[arg(long, default_value = "127.0.0.1:8001")]
    listen: SocketAddr,
    /// NodeList JSON file loaded as the initial Nodes.
    #[arg(long)]
    nodes: Option<PathBuf>,
    /// Changes kept for watches; older resourceVersions get 410 Expired.
    #[arg(long, default_value_t = 1000)]
    history_limit: usize,
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
    let options = SandboxOptions {
        port: args.listen.port(),
        history_limit: args.history_limit,
        admin_endpoints: true,
        ..SandboxOptions::default()
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
        sandbox.nodes().len()
    );
    let _ = tokio::signal::ctrl_c().await;
    sandbox.shutdown().await;
    ExitCode::SUCCESS
}
