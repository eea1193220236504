//! `nodeipam-controller`: thin entry point; see the `nodeipam` library.

use std::process::ExitCode;

use nodeipam::Error;
use nodeipam::controller::{self, ControllerConfig};
use nodeipam::flags::{self, Cli, Command, IpamFlags, OutputFormat, Parsed, PlanArgs};
use nodeipam::logging::{self, FilterSource};
use nodeipam::reconcile::Allocator;
use nodeipam::startup;
use nodeipam_core::IpamConfig;

fn main() -> ExitCode {
    // Before anything is allocated in bulk (see the module's doc for why and what it saved).
    nodeipam::malloc::fix_mmap_threshold();
    let argv = std::env::args_os().map(|a| a.to_string_lossy().into_owned());
    let Parsed { cli, ignored } = match flags::parse_from(argv) {
        Ok(parsed) => parsed,
        Err(error) => return clap_exit(&error),
    };
    if let Some(Command::Completion { shell }) = cli.command {
        let mut command = flags::command();
        clap_complete::generate(
            shell.generator(),
            &mut command,
            "nodeipam-controller",
            &mut std::io::stdout(),
        );
        return ExitCode::SUCCESS;
    }
    let filter = logging::init(&cli.logging);
    if let Err(message) = cli
        .compat
        .validate(&cli.controller)
        .and_then(|()| cli.controller.validate())
    {
        return ExitCode::from(fail(&Error::Flag(message)));
    }
    let code = match cli.command {
        Some(Command::Plan(ref args)) => run_plan(args, &cli, &ignored),
        _ => run_controller(&cli, &ignored, &filter),
    };
    ExitCode::from(code)
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
/// to report a client error, exit 1, first). The allocator built here is the one `plan` or the
/// controller then uses (built once per path). The warnings about rules keyed on a label a
/// kubelet may set ([`nodeipam::node_pools::Sizing::warnings`]) are the caller's to print, with
/// the other start-up diagnostics.
fn validate(flags: &IpamFlags) -> Result<(IpamConfig, Allocator), Error> {
    let config = flags.validate().map_err(Error::Config)?;
    let pools = flags.node_pools().map_err(Error::NodePools)?;
    let sizing = pools.sizing(&config).map_err(Error::NodePools)?;
    let allocator = Allocator::with_sizing(&config, sizing).map_err(Error::Pool)?;
    Ok((config, allocator))
}

fn run_plan(args: &PlanArgs, cli: &Cli, ignored: &[flags::kcm::GivenIgnoredFlag]) -> u8 {
    if !cli.ipam.allocate_node_cidrs {
        eprintln!(
            "error: plan shows what the controller would allocate; it has nothing to show with --allocate-node-cidrs=false"
        );
        return 2;
    }
    let (config, allocator) = match validate(&cli.ipam) {
        Ok(valid) => valid,
        Err(e) => return fail(&e),
    };
    let sizing = allocator.sizing().clone();
    let cluster_cidrs = match args.cluster_cidrs.as_deref().map(read_cluster_cidrs) {
        None => nodeipam::plan::cluster_cidrs::ClusterCidrInput::default(),
        Some(Ok(input)) => input,
        Some(Err(e)) => return fail(&e),
    };
    // Of each Node's labels, only those the node-pool rules and the ClusterCIDRs' selectors read
    // are kept.
    let mut label_keys = sizing.label_keys();
    label_keys.extend(cluster_cidrs.label_keys());
    label_keys.sort();
    label_keys.dedup();
    let nodes = if args.input == "-" {
        nodeipam::nodelist::read_nodes(std::io::stdin().lock(), "-", &label_keys)
    } else {
        std::fs::File::open(&args.input)
            .map_err(|source| Error::Read {
                path: args.input.clone(),
                source,
            })
            .and_then(|file| nodeipam::nodelist::read_nodes(file, &args.input, &label_keys))
    };
    let planner = match nodes {
        Ok(nodes) => nodeipam::plan::Planner::with_allocator(allocator, nodes)
            .with_cluster_cidrs(cluster_cidrs),
        Err(e) => return fail(&e),
    };
    for line in startup::ignored_lines(ignored) {
        eprintln!("note: {line}");
    }
    for line in startup::diagnostic_lines(&config, &sizing, &planner.findings()) {
        eprintln!("note: {line}");
    }
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = match args.output {
        OutputFormat::Json => planner.write_json(&mut out),
        OutputFormat::Table => planner.write_table(&mut out),
    }
    .and_then(|served| std::io::Write::flush(&mut out).map(|()| served));
    match written {
        Ok(true) => 0,
        Ok(false) => 1,
        // A closed pipe (`plan … | head`) is not an error of the plan.
        Err(source) if source.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(source) => {
            eprintln!("error: cannot write the plan: {source}");
            1
        }
    }
}

/// `plan --cluster-cidrs FILE`: the file read ([`nodeipam::plan::cluster_cidrs::read_cluster_cidrs`]).
fn read_cluster_cidrs(
    path: &str,
) -> Result<nodeipam::plan::cluster_cidrs::ClusterCidrInput, Error> {
    std::fs::File::open(path)
        .map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })
        .and_then(|file| nodeipam::plan::cluster_cidrs::read_cluster_cidrs(file, path))
}

/// The controller: flags validated (and the allocator built) before the runtime starts, then
/// [`serve_and_allocate`] on a multi-threaded runtime. Returns the exit status.
fn run_controller(
    cli: &Cli,
    ignored: &[flags::kcm::GivenIgnoredFlag],
    filter: &FilterSource,
) -> u8 {
    let ipam = if cli.ipam.allocate_node_cidrs {
        match validate(&cli.ipam) {
            Ok(valid) => Some(valid),
            Err(e) => return fail(&e),
        }
    } else {
        None
    };
    controller::install_panic_hook();
    // Before the runtime and the first connection (issue 31, item 4).
    nodeipam::open_files::raise_and_log();
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
    runtime.block_on(serve_and_allocate(cli, ignored, filter, ipam))
}

/// The client and the API server URL (for the start-up line).
type Connected = (kube::Client, String);

/// In phases: connect (the client configuration is checked first, exit 2 naming the flag); log
/// the start-up lines; start the servers (metrics, health probes, the secure port); then either
/// allocate or, with `--allocate-node-cidrs=false`, only serve until a signal.
async fn serve_and_allocate(
    cli: &Cli,
    ignored: &[flags::kcm::GivenIgnoredFlag],
    filter: &FilterSource,
    ipam: Option<(IpamConfig, Allocator)>,
) -> u8 {
    let flags = &cli.controller;
    // The secure port needs the client too: its TokenReviews and SubjectAccessReviews go through
    // it unless --authentication-kubeconfig/--authorization-kubeconfig name another.
    let client = if ipam.is_some() || cli.serving.enabled() {
        match controller::client_from_flags(flags).await {
            Ok(client) => Some(client),
            Err(e) => return fail(&e.into()),
        }
    } else {
        None
    };
    let allocation = ipam.map(|(ipam, allocator)| {
        let mut config = ControllerConfig::from_flags(ipam, flags);
        config.sizing = allocator.sizing().clone();
        config.watch_cluster_cidr_objects =
            cli.ipam.cidr_allocator_type == flags::MULTI_CIDR_ALLOCATOR;
        (config, allocator)
    });
    log_startup(cli, ignored, filter, allocation.as_ref(), client.as_ref());
    let health = controller::Health::new();
    let mut servers = tokio::task::JoinSet::new();
    if let Err(e) = start_servers(cli, client.as_ref(), &health, &mut servers).await {
        return fail(&e);
    }
    let (Some((mut config, allocator)), Some((client, _))) = (allocation, client) else {
        health.set_ready(true);
        tokio::select! {
            () = shutdown_signal() => return 0,
            _ = servers.join_next(), if !servers.is_empty() => {
                return fail(&Error::TaskFailed { task: "the probe or metrics server", reason: "stopped".to_owned() });
            }
        }
    };
    config.health = health.clone();
    allocate(config, allocator, client, &health, &mut servers).await
}

/// The start-up lines: the configuration, the ignored flags, the configuration's diagnostics.
fn log_startup(
    cli: &Cli,
    ignored: &[flags::kcm::GivenIgnoredFlag],
    filter: &FilterSource,
    allocation: Option<&(ControllerConfig, Allocator)>,
    client: Option<&Connected>,
) {
    startup::log_startup(&startup::StartupView {
        config: allocation.map(|(config, _)| config),
        sizing: allocation.map(|(config, _)| &config.sizing),
        ipam_flags: &cli.ipam,
        flags: &cli.controller,
        api_server: client.map(|(_, url)| url.as_str()),
        filter,
    });
    for line in startup::ignored_lines(ignored) {
        tracing::info!("{line}");
    }
    if let Some((config, _)) = allocation {
        for line in startup::config_diagnostic_lines(&config.ipam, &config.sizing) {
            tracing::warn!("{line}");
        }
    }
}

/// Starts the supervised servers: one metrics recorder (with its upkeep) for the plain and the
/// secure `/metrics`, the plain metrics server, the health probe server, the secure port.
async fn start_servers(
    cli: &Cli,
    client: Option<&Connected>,
    health: &controller::Health,
    servers: &mut tokio::task::JoinSet<()>,
) -> Result<(), Error> {
    let flags = &cli.controller;
    let metrics = if flags.metrics_bind_address.0.is_some() || cli.serving.enabled() {
        let handle = nodeipam::metrics::install_recorder()?;
        let upkeep = handle.clone();
        servers.spawn(async move {
            loop {
                tokio::time::sleep(std::time::Duration::from_secs(5)).await;
                upkeep.run_upkeep();
            }
        });
        Some(handle)
    } else {
        None
    };
    if let (Some(address), Some(handle)) = (flags.metrics_bind_address.0, metrics.clone()) {
        let listener = bind(address).await?;
        let router = controller::metrics_router(handle);
        servers.spawn(async move {
            let result = controller::serve_router(listener, router, std::future::pending()).await;
            tracing::error!(?result, "the metrics server stopped");
        });
    }
    if let Some(address) = flags.health_probe_bind_address.0 {
        let listener = bind(address).await?;
        let probes = health.clone();
        servers.spawn(async move {
            let result = controller::serve_health(listener, probes, std::future::pending()).await;
            tracing::error!(?result, "the health probe server stopped");
        });
    }
    // Secure serving (issue 9): `nodeipam::serving`.
    if let (Some(handle), Some((client, _))) = (metrics.filter(|_| cli.serving.enabled()), client) {
        start_secure_serving(cli, client, health, handle, servers).await?;
    }
    Ok(())
}

/// A plain listener (metrics, health probes).
async fn bind(address: std::net::SocketAddr) -> Result<tokio::net::TcpListener, Error> {
    tokio::net::TcpListener::bind(address)
        .await
        .map_err(|source| Error::Listen {
            address: address.to_string(),
            source,
        })
}

/// Runs the controller until a signal, or until a server stops (then `/healthz` fails and the
/// process exits 1); logs the pools it leaves. Returns the exit status.
async fn allocate(
    config: ControllerConfig,
    allocator: Allocator,
    client: kube::Client,
    health: &controller::Health,
    servers: &mut tokio::task::JoinSet<()>,
) -> u8 {
    let controller = controller::run_with_allocator(config, allocator, client, shutdown_signal());
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
                    capacity = pool.capacity_blocks,
                    used = pool.used_blocks,
                    free = pool.free_blocks,
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
}

/// Starts the secure port (`--secure-port` …, see `nodeipam::serving`) as one more supervised
/// server: the certificate, the review clients (the controller's own unless
/// `--authentication-kubeconfig`/`--authorization-kubeconfig` say otherwise), then the listener.
async fn start_secure_serving(
    cli: &Cli,
    client: &kube::Client,
    health: &controller::Health,
    metrics: metrics_exporter_prometheus::PrometheusHandle,
    servers: &mut tokio::task::JoinSet<()>,
) -> Result<(), Error> {
    let Some(serving) = cli.serving.resolve(client).await? else {
        return Ok(());
    };
    let listener = serving.bind().await?;
    let address = listener.local_addr().unwrap_or(serving.address);
    let certificate = match &serving.certificate {
        nodeipam::serving::ServingCertificate::Files { files } => {
            servers.spawn(files.clone().watch(nodeipam::serving::RELOAD_INTERVAL));
            "--tls-cert-file (re-read every minute)"
        }
        nodeipam::serving::ServingCertificate::SelfSigned { .. } => "self-signed (in memory)",
    };
    tracing::info!(%address, certificate, "serving /healthz, /readyz, /livez and /metrics over HTTPS with delegated authentication and authorization");
    let router = nodeipam::serving::router(health.clone(), metrics, serving.auth.clone());
    servers.spawn(async move {
        nodeipam::serving::serve(listener, serving.tls, router, std::future::pending()).await;
        tracing::error!("the secure server stopped");
    });
    Ok(())
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
