//! `nodeipam-controller`: thin entry point; see the `nodeipam` library.

use std::io::Read as _;
use std::process::ExitCode;

use clap::Parser as _;
use nodeipam::Error;
use nodeipam::controller::{self, ControllerConfig};
use nodeipam::flags::{Cli, Command, IpamFlags, OutputFormat, PlanArgs};
use nodeipam::node_pools::{NodePools, Sizing};
use nodeipam_core::IpamConfig;

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => return clap_exit(&error),
    };
    init_tracing();
    let code = match cli.command {
        Some(Command::Plan(ref args)) => run_plan(args, &cli.ipam),
        None => run_controller(&cli),
    };
    ExitCode::from(code)
}

fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
}

/// clap's own errors as one line on stderr, exit 2 (`--help`/`--version` print as usual, exit 0).
/// clap renders a parse error over several lines (the error, `[possible values: …]`, a blank
/// line, `Usage: …`, `For more information, try '--help'.`); the contract is one line naming the
/// flag, so keep the error and its details and drop the usage and the tip.
fn clap_exit(error: &clap::Error) -> ExitCode {
    if !error.use_stderr() {
        let _ = error.print();
        return ExitCode::SUCCESS;
    }
    let rendered = error.render().to_string();
    let line = rendered
        .lines()
        .map(str::trim)
        .take_while(|l| !l.starts_with("Usage:"))
        .filter(|l| {
            !l.is_empty() && !l.starts_with("For more information") && !l.starts_with("tip:")
        })
        .collect::<Vec<_>>()
        .join(" ");
    eprintln!("{line} (see --help)");
    ExitCode::from(2)
}

/// Prints `error: …` (one line) and returns the error's exit status.
fn fail(error: &Error) -> u8 {
    eprintln!("error: {error}");
    error.exit_code().clamp(1, 255) as u8
}

/// Validates the IPAM flags, including what only shows when the pool is built (a service CIDR
/// covering every block of a cluster CIDR, node-pool rules that do not fit the cluster CIDRs), so
/// that such a configuration exits 2 before any listener or client is set up (the controller used
/// to report a client error, exit 1, first). Logs a warning per rule keyed on a label a kubelet
/// may set.
fn validate(flags: &IpamFlags) -> Result<(IpamConfig, NodePools, Sizing), Error> {
    let config = flags.validate().map_err(Error::Config)?;
    let pools = flags.node_pools().map_err(Error::NodePools)?;
    let sizing = pools.sizing(&config).map_err(Error::NodePools)?;
    nodeipam::reconcile::Allocator::with_sizing(&config, sizing.clone()).map_err(Error::Pool)?;
    for warning in sizing.warnings() {
        tracing::warn!("{warning}");
    }
    for cluster in &config.cluster_cidrs {
        if cluster.host_bits_were_set {
            tracing::warn!(
                cluster_cidr = %cluster.cluster_cidr,
                "--cluster-cidr entry has host bits set; using its network address {}",
                cluster.cluster_cidr
            );
        }
    }
    Ok((config, pools, sizing))
}

fn run_plan(args: &PlanArgs, ipam: &IpamFlags) -> u8 {
    if !ipam.allocate_node_cidrs {
        eprintln!(
            "error: plan shows what the controller would allocate; it has nothing to show with --allocate-node-cidrs=false"
        );
        return 2;
    }
    let (config, _, sizing) = match validate(ipam) {
        Ok(valid) => valid,
        Err(e) => return fail(&e),
    };
    let text = if args.input == "-" {
        let mut text = String::new();
        std::io::stdin()
            .read_to_string(&mut text)
            .map(|_| text)
            .map_err(|source| Error::Read {
                path: "-".to_owned(),
                source,
            })
    } else {
        std::fs::read_to_string(&args.input).map_err(|source| Error::Read {
            path: args.input.clone(),
            source,
        })
    };
    let report = text
        .and_then(|text| nodeipam::nodelist::parse_nodes(&text))
        .and_then(|nodes| nodeipam::plan::plan_with_sizing(&config, sizing, &nodes));
    let report = match report {
        Ok(report) => report,
        Err(e) => return fail(&e),
    };
    match args.output {
        OutputFormat::Json => println!("{}", report.to_json()),
        OutputFormat::Table => print!("{}", report.to_table()),
    }
    if report.all_served() { 0 } else { 1 }
}

fn run_controller(cli: &Cli) -> u8 {
    let flags = &cli.controller;
    if let Err(message) = flags.validate() {
        return fail(&Error::Flag(message));
    }
    let ipam = if cli.ipam.allocate_node_cidrs {
        match validate(&cli.ipam) {
            Ok((config, pools, _)) => Some((config, pools)),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    controller::install_panic_hook();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the tokio runtime: {e}");
            return 1;
        }
    };
    runtime.block_on(async move {
        let health = controller::Health::new();
        let mut servers = tokio::task::JoinSet::new();
        if let Some(address) = flags.metrics_bind_address.0 {
            let handle = match nodeipam::metrics::install_recorder() {
                Ok(handle) => handle,
                Err(e) => return fail(&e),
            };
            let listener = match tokio::net::TcpListener::bind(address).await {
                Ok(listener) => listener,
                Err(source) => {
                    return fail(&Error::Listen {
                        address: address.to_string(),
                        source,
                    });
                }
            };
            let upkeep = handle.clone();
            servers.spawn(async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                    upkeep.run_upkeep();
                }
            });
            let router = controller::metrics_router(handle);
            servers.spawn(async move {
                let result =
                    controller::serve_router(listener, router, std::future::pending()).await;
                tracing::error!(?result, "the metrics server stopped");
            });
        }
        if let Some(address) = flags.health_probe_bind_address.0 {
            let listener = match tokio::net::TcpListener::bind(address).await {
                Ok(listener) => listener,
                Err(source) => {
                    return fail(&Error::Listen {
                        address: address.to_string(),
                        source,
                    });
                }
            };
            let probes = health.clone();
            servers.spawn(async move {
                let result = controller::serve_health(listener, probes, std::future::pending()).await;
                tracing::error!(?result, "the health probe server stopped");
            });
        }
        let Some((ipam, node_pools)) = ipam else {
            tracing::info!("--allocate-node-cidrs=false: not allocating; waiting for a signal");
            health.set_ready(true);
            tokio::select! {
                () = shutdown_signal() => return 0,
                _ = servers.join_next(), if !servers.is_empty() => {
                    return fail(&Error::TaskFailed { task: "the probe or metrics server", reason: "stopped".to_owned() });
                }
            }
        };
        let client = match controller::client_from_flags(flags).await {
            Ok(client) => client,
            Err(e) => return fail(&e),
        };
        let mut config = ControllerConfig::from_flags(ipam, flags);
        config.node_pools = node_pools;
        config.health = health.clone();
        let controller = controller::run(config, client, shutdown_signal());
        tokio::pin!(controller);
        let result = tokio::select! {
            result = &mut controller => result,
            _ = servers.join_next(), if !servers.is_empty() => {
                let error = Error::TaskFailed { task: "the probe or metrics server", reason: "stopped".to_owned() };
                health.set_failed(error.to_string());
                Err(error)
            }
        };
        match result {
            Ok(summary) => {
                for pool in &summary.pools {
                    tracing::info!(
                        cluster_cidr = %pool.cluster_cidr,
                        capacity = pool.capacity,
                        used = pool.used,
                        free = pool.free,
                        "stopped"
                    );
                }
                0
            }
            Err(e) => {
                tracing::error!(error = %e, kind = e.metric_label(), "controller stopped");
                fail(&e)
            }
        }
    })
}

/// Resolves on SIGTERM or SIGINT.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = tokio::signal::ctrl_c() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
    tracing::info!("shutdown signal received; finishing in-flight work");
}
