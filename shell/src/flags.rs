//! Command-line flags: kube-controller-manager's names and defaults for the node IPAM controller
//! (`--cluster-cidr`, `--node-cidr-mask-size*`, `--service-cluster-ip-range`, client and
//! leader-election flags), plus the `plan` subcommand.
//!
//! The whole kube-controller-manager / cloud-controller-manager command line is accepted
//! ([`kcm::KCM_FLAGS`]): the flags this controller implements behave as in kcm, the others are
//! accepted and listed at start-up as ignored ([`Parsed::ignored`]); our own flags (the
//! `CloudAllocator` node-pool flags, the workers, the metrics and health addresses) are in that
//! table too, and follow the same conventions (global, so `plan` takes the whole command line).
//! Values are read as pflag reads them ([`pflag`]): booleans `--flag` / `--flag=true|True|1|t|…`, integers in Go's syntax
//! (`0x18`, `024`), `--flag value` and `--flag=value`, `_` in a flag name read as `-`, a repeated
//! flag's last value wins (list flags such as `--controllers` append). Durations take Go's duration
//! text (`15s`, `1m30s`, `500ms`). Parse errors (clap's own) exit with status 2 and name the flag;
//! the IPAM flags are then validated by [`nodeipam_core::config::validate`] (see
//! [`IpamFlags::validate`]), whose errors also name the flag.

use std::path::PathBuf;
use std::time::Duration;

use clap::{
    ArgAction, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum,
};

use crate::labels::NodeSelector;
use crate::node_pools::LabelRange;

pub mod kcm;
pub mod pflag;
pub mod serving;
mod validate;
mod values;

pub use values::{BindAddress, parse_go_duration};
use values::{
    parse_allocator_type, parse_bind_address, parse_burst, parse_qps, parse_verbosity,
    parse_workers,
};

/// kube-controller-manager's allocator type: every Node gets the node CIDR mask size (default).
pub const RANGE_ALLOCATOR: &str = "RangeAllocator";
/// cloud-provider-azure's allocator type: per-Node sizes, here from node-pool rules and labels
/// ([`crate::node_pools`]).
pub const CLOUD_ALLOCATOR: &str = "CloudAllocator";
/// KEP-2593's allocator type (kube-controller-manager 1.25–1.28, removed since): the flag CIDRs
/// are the default pool, sized as the `RangeAllocator` sizes them, and `nodeipam.io/v1alpha1`
/// `ClusterCIDR` objects add pools at run time ([`crate::cluster_cidr`]; the CRD is
/// `deploy/crds/clustercidrs.yaml`).
pub const MULTI_CIDR_ALLOCATOR: &str = "MultiCIDRRangeAllocator";

/// Default Lease name for leader election (`--leader-elect-resource-name`).
pub const DEFAULT_LEASE_NAME: &str = "nodeipam-controller";

/// The Kubernetes node IPAM controller (range allocator): without a subcommand it runs against the
/// cluster and assigns spec.podCIDR(s) to Nodes; `plan` shows offline what it would do.
#[derive(Debug, Parser)]
#[command(
    name = "nodeipam-controller",
    version = crate::build_info::VERSION_TEXT,
    about = "Kubernetes node IPAM controller: without a subcommand, runs against the cluster and assigns spec.podCIDR(s) to Nodes; `plan` shows offline what it would do.",
    long_about = None,
    args_override_self = true,
    after_help = AFTER_HELP
)]
pub struct Cli {
    /// `plan` runs offline; without a subcommand the controller runs against the cluster.
    #[command(subcommand)]
    pub command: Option<Command>,
    /// Node IPAM flags.
    #[command(flatten)]
    pub ipam: IpamFlags,
    /// Client, leader-election and serving flags.
    #[command(flatten)]
    pub controller: ControllerFlags,
    /// Verbosity and log format.
    #[command(flatten)]
    pub logging: LoggingFlags,
    /// kube-controller-manager flags read only to refuse values this controller cannot honour.
    #[command(flatten)]
    pub compat: CompatFlags,
    /// Secure serving (issue 9): `--secure-port`, `--bind-address`, `--tls-*-file`,
    /// `--authentication-kubeconfig`, `--authorization-*` (see [`serving`], [`crate::serving`]).
    #[command(flatten)]
    pub serving: serving::SecureServingFlags,
}

/// `--help`'s closing section: the environment and the exit statuses.
const AFTER_HELP: &str = "\
Every other kube-controller-manager and cloud-controller-manager flag is accepted and ignored
(each one given is listed once at start-up with the reason); docs/kcm-flags.md lists them all.

Environment:
  RUST_LOG       log filter (tracing EnvFilter syntax, e.g. `info,nodeipam=debug`); when set it
                 replaces the level chosen with -v
  POD_NAME       Lease holder identity and events' reportingInstance (else $HOSTNAME), plus `_<pid>`
  HOSTNAME       used when POD_NAME is unset
  KUBERNETES_SERVICE_HOST, KUBERNETES_SERVICE_PORT
                 the in-cluster API server, used when neither --kubeconfig nor --master is given
                 (with the service account token in /var/run/secrets/kubernetes.io/serviceaccount)

Exit status:
  0  clean shutdown (SIGTERM/SIGINT); plan: every Node kept or assigned
  1  runtime failure (a task died, the Lease was lost); plan: some Node skipped or failed
  2  bad flags, input or client configuration

Shell completions: nodeipam-controller completion bash|zsh|fish";

/// Subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Offline: read a NodeList (`kubectl get nodes -o json`) and show, per Node, whether the
    /// controller would keep its podCIDRs, assign new ones, skip it (bad or conflicting podCIDRs)
    /// or fail to serve it (pool exhausted). Exit 0 if every Node is kept or assigned, 1 otherwise,
    /// 2 on bad flags or input.
    Plan(PlanArgs),
    /// Print a shell completion script (e.g. `source <(nodeipam-controller completion bash)`).
    Completion {
        /// The shell.
        #[arg(value_enum)]
        shell: CompletionShell,
    },
}

/// Shells `completion` writes a script for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum CompletionShell {
    /// Bash.
    Bash,
    /// Zsh.
    Zsh,
    /// Fish.
    Fish,
}

impl CompletionShell {
    /// The clap_complete generator.
    pub fn generator(self) -> clap_complete::Shell {
        match self {
            CompletionShell::Bash => clap_complete::Shell::Bash,
            CompletionShell::Zsh => clap_complete::Shell::Zsh,
            CompletionShell::Fish => clap_complete::Shell::Fish,
        }
    }
}

/// Flags of `plan`.
#[derive(Debug, Args)]
#[command(args_override_self = true)]
pub struct PlanArgs {
    /// NodeList JSON file, or `-` for standard input.
    #[arg(value_name = "NODELIST")]
    pub input: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// ClusterCIDR objects to plan with, as JSON: the output of `kubectl get clustercidrs -o
    /// json` (a List) or one object. Shows one row per ClusterCIDR and which Nodes it serves.
    #[arg(long = "cluster-cidrs", value_name = "FILE")]
    pub cluster_cidrs: Option<String>,
}

/// `plan` output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum OutputFormat {
    /// A human-readable table.
    Table,
    /// `{"nodes":[…],"pools":[…]}`.
    Json,
}

/// kube-controller-manager's node IPAM flags.
#[derive(Debug, Clone, Args)]
pub struct IpamFlags {
    /// CIDR range(s) for pods, comma-separated: one, or one IPv4 and one IPv6 (dual-stack), or
    /// several per family (at most 8 in all, none overlapping): within a family they are used in
    /// the order given, a later one only when the earlier ones are full (kcm takes one per
    /// family). The first entry's family is that of every Node's spec.podCIDR.
    #[arg(
        long,
        global = true,
        value_name = "CIDRS",
        default_value = "",
        hide_default_value = true
    )]
    pub cluster_cidr: String,
    /// CIDR range(s) for Services, comma-separated (at most one per family); node blocks that
    /// overlap them are never allocated.
    #[arg(
        long,
        global = true,
        value_name = "CIDRS",
        default_value = "",
        hide_default_value = true
    )]
    pub service_cluster_ip_range: String,
    /// Node CIDR mask size (bits) for a single-stack cluster (default 24 for IPv4, 64 for IPv6).
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_mask_size)]
    pub node_cidr_mask_size: Option<u8>,
    /// Node CIDR mask size (bits) for the IPv4 cluster CIDR (default 24).
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_mask_size)]
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// Node CIDR mask size (bits) for the IPv6 cluster CIDR (default 64).
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_mask_size)]
    pub node_cidr_mask_size_ipv6: Option<u8>,
    /// Whether to allocate pod CIDRs to Nodes (kube-controller-manager defaults to false; this
    /// controller exists to do it, so true).
    #[arg(long, global = true, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = pflag::parse_bool)]
    pub allocate_node_cidrs: bool,
    /// CIDR allocator type: `RangeAllocator` (every Node gets the node CIDR mask size),
    /// `CloudAllocator` (per-Node sizes from --node-cidr-mask-size-rule and the Nodes' labels) or
    /// `MultiCIDRRangeAllocator` (the RangeAllocator's pool from --cluster-cidr, plus the pools of
    /// the cluster's nodeipam.io ClusterCIDR objects, watched; needs the CRD installed).
    #[arg(long, global = true, value_name = "TYPE", default_value = RANGE_ALLOCATOR, value_parser = parse_allocator_type)]
    pub cidr_allocator_type: String,
    /// CloudAllocator rule, repeatable: Nodes whose label KEY equals VALUE get /N (IPv4) and /M
    /// (IPv6) blocks, e.g. 'kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64'. First match
    /// wins (these flags in order, then the rules file); a family the rule leaves out gets the
    /// default size. N and M are decimal bits, as in the rules file and the mask labels (our own
    /// syntax inside a string flag, not a pflag integer).
    #[arg(long = "node-cidr-mask-size-rule", global = true, value_name = "KEY=VALUE:ipv4=N,ipv6=M", action = ArgAction::Append)]
    pub node_cidr_mask_size_rules: Vec<String>,
    /// CloudAllocator rules file: one rule per line in --node-cidr-mask-size-rule's syntax; blank
    /// lines and lines starting with # are ignored.
    #[arg(long, global = true, value_name = "PATH")]
    pub node_cidr_mask_size_rules_file: Option<PathBuf>,
    /// CloudAllocator: honour the Nodes' nodeipam.io/node-cidr-mask-size-ipv4/-ipv6 labels
    /// (before the rules), within --node-mask-label-range. A kubelet can set these on its own Node.
    /// A pflag boolean, like every boolean here (`--allow-node-mask-label`, `=true|True|1|t|…`).
    #[arg(long, global = true, value_name = "BOOL", default_value_t = false, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = pflag::parse_bool)]
    pub allow_node_mask_label: bool,
    /// The sizes a Node's mask label may ask for, e.g. 'ipv4=23-26,ipv6=60-64' (default: from the
    /// coarsest to the finest size the default and the rules give).
    #[arg(long, global = true, value_name = "ipv4=MIN-MAX,ipv6=MIN-MAX", value_parser = LabelRange::parse)]
    pub node_mask_label_range: Option<LabelRange>,
    /// Serve only the Nodes this label selector selects, Kubernetes syntax:
    /// 'a=b,c!=d,e in (x,y),f notin (z),!g,h' (default: every Node). Filtered here, not by the
    /// API server: every Node is still watched, because the podCIDRs a Node not served already
    /// has stay occupied (never handed to a served Node). A Node not served is never written and
    /// gets no event; `plan` shows it as `ignore`.
    #[arg(long, global = true, value_name = "SELECTOR", default_value = "",
          hide_default_value = true, value_parser = NodeSelector::parse)]
    pub node_selector: NodeSelector,
}

/// Client, leader-election and serving flags.
#[derive(Debug, Clone, Args)]
pub struct ControllerFlags {
    /// Path to a kubeconfig file. Without it and without `--master`: the in-cluster config
    /// (`$KUBECONFIG` and `~/.kube/config` are never read, as by kube-controller-manager).
    #[arg(long, global = true, value_name = "PATH")]
    pub kubeconfig: Option<PathBuf>,
    /// The address of the Kubernetes API server (overrides the kubeconfig's server); given alone,
    /// requests carry no credentials.
    #[arg(long, global = true, value_name = "URL")]
    pub master: Option<String>,
    /// Write requests per second to the API server (client-side token bucket refill rate).
    #[arg(long, global = true, value_name = "QPS", default_value_t = 20.0, value_parser = parse_qps)]
    pub kube_api_qps: f64,
    /// Burst of write requests allowed above `--kube-api-qps` (token bucket size).
    #[arg(long, global = true, value_name = "N", default_value_t = 30, value_parser = parse_burst)]
    pub kube_api_burst: u32,
    /// Acquire a `coordination.k8s.io/v1` Lease before allocating; only the holder allocates
    /// (kube-controller-manager's default, so two replicas never allocate at once).
    /// `--leader-elect=false` runs without one: then no write starts until one request timeout
    /// after start-up, so that a write of a previous process cannot land after ours.
    #[arg(long, global = true, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = pflag::parse_bool)]
    pub leader_elect: bool,
    /// How long a non-leader waits after the last renewal before taking the Lease.
    #[arg(long, global = true, value_name = "DURATION", default_value = "15s", value_parser = parse_go_duration)]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader keeps trying to renew before giving up leadership, counted from the
    /// start of its last successful renewal; must be shorter than the lease duration. The leader
    /// renews every --leader-elect-retry-period (2s by default), not only near the deadline.
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s", value_parser = parse_go_duration)]
    pub leader_elect_renew_deadline: Duration,
    /// Wait between attempts to acquire or renew the Lease: a standby takes a released Lease
    /// within one retry period.
    #[arg(long, global = true, value_name = "DURATION", default_value = "2s", value_parser = parse_go_duration)]
    pub leader_elect_retry_period: Duration,
    /// Namespace of the leader-election Lease.
    #[arg(
        long,
        global = true,
        value_name = "NAMESPACE",
        default_value = "kube-system"
    )]
    pub leader_elect_resource_namespace: String,
    /// Name of the leader-election Lease.
    #[arg(long, global = true, value_name = "NAME", default_value = DEFAULT_LEASE_NAME)]
    pub leader_elect_resource_name: String,
    /// Concurrent writes of spec.podCIDR(s) (kube-controller-manager's range allocator runs 30
    /// `cidrUpdateWorkers`). One slow or hung request holds one worker, not the controller.
    #[arg(long, global = true, value_name = "N", default_value_t = 30, value_parser = parse_workers)]
    pub node_cidr_update_workers: usize,
    /// How long the pod CIDRs of a deleted Node stay reserved for its name before a Node waiting
    /// for a block may take them (Go duration; `0` releases them at once). A Node of that name
    /// created again meanwhile (`kubectl replace --force`, a restore) keeps them, or gets them
    /// back if it has no podCIDRs. Liveness only: a shorter quarantine can leave the re-created
    /// Node holding a block given away, which is reported as a conflict, never kept twice.
    #[arg(long, global = true, value_name = "DURATION", default_value = "10s", value_parser = parse_go_duration)]
    pub deleted_node_cidr_quarantine: Duration,
    /// Address for Prometheus metrics (`/metrics`) over plain HTTP **without authentication**,
    /// for local use (a workstation, `kubectl port-forward`), e.g. `127.0.0.1:8080`; `0` (the
    /// default) disables: kube-controller-manager serves its metrics only on its secure port, and
    /// so do we, on the authenticated `--secure-port`. Bounded as the secure port is (64
    /// connections at once, headers within 30 s: `http_server`).
    #[arg(long, global = true, value_name = "ADDR", default_value = "0", value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,
    /// Address for `/healthz`, `/livez` and `/readyz` over plain HTTP, for local use, e.g.
    /// `127.0.0.1:8081`; `0` (the default) disables: kube-controller-manager serves its probes
    /// only on its secure port, and the manifests probe `--secure-port`. Bounded as the secure
    /// port is.
    #[arg(long, global = true, value_name = "ADDR", default_value = "0", value_parser = parse_bind_address)]
    pub health_probe_bind_address: BindAddress,
}

/// How logs are written (`--logging-format`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// tracing-subscriber's text lines.
    Text,
    /// One JSON object per line, with klog's field names (`ts`, `caller`, `msg`, `v`).
    Json,
}

/// kube-controller-manager's logging flags (component-base `logs/api/v1`).
#[derive(Debug, Clone, Args)]
pub struct LoggingFlags {
    /// klog verbosity: 0–3 info, 4 debug, 5 trace for this controller, 6 adds the Kubernetes
    /// client's debug lines, 7 and more trace everything. `RUST_LOG`, when set, replaces it.
    #[arg(short = 'v', long = "v", global = true, value_name = "LEVEL", default_value_t = 0,
          value_parser = parse_verbosity)]
    pub verbosity: u32,
    /// Log format: `text` or `json` (JSON lines with klog's field names).
    #[arg(long = "logging-format", visible_alias = "log-format", global = true, value_enum,
          value_name = "FORMAT", default_value_t = LogFormat::Text)]
    pub logging_format: LogFormat,
}

/// kube-controller-manager / cloud-controller-manager flags this controller reads only to refuse a
/// value that it cannot honour without allocating differently (see [`CompatFlags::validate`]).
#[derive(Debug, Clone, Args)]
pub struct CompatFlags {
    /// Controllers to run, kube-controller-manager's syntax (`*`, `name`, `-name`); this process is
    /// the node IPAM controller, so a list that disables `nodeipam` is refused.
    #[arg(long, global = true, value_name = "NAMES", value_delimiter = ',',
          action = ArgAction::Append, default_value = "*", allow_hyphen_values = true)]
    pub controllers: Vec<String>,
    /// Leader-election lock type; `leases` only, as kube-controller-manager.
    #[arg(long, global = true, value_name = "TYPE", default_value = "leases")]
    pub leader_elect_resource_lock: String,
    /// cloud-provider-azure: label selector of the Nodes to serve; only empty (all Nodes) is
    /// supported.
    #[arg(long, global = true, value_name = "SELECTOR", default_value = "")]
    pub node_filter_requirements: String,
}

/// Lease names of kube-controller-manager and cloud-controller-manager (their
/// `--leader-elect-resource-name` defaults): taking one would lock the other component out.
pub const FOREIGN_LEASE_NAMES: [&str; 2] = ["kube-controller-manager", "cloud-controller-manager"];

/// The parsed command line: the flags, and the accepted kcm flags that are ignored.
#[derive(Debug)]
pub struct Parsed {
    /// Every implemented flag.
    pub cli: Cli,
    /// kube-controller-manager flags given but ignored, with the reason (table order).
    pub ignored: Vec<kcm::GivenIgnoredFlag>,
}

/// The clap command: [`Cli`] plus a hidden, accepted argument for every kube-controller-manager
/// and cloud-controller-manager flag it does not implement ([`kcm::ignored_args`]).
pub fn command() -> clap::Command {
    let ignored: Vec<clap::Arg> = kcm::ignored_args().collect();
    Cli::command().args(ignored)
}

/// Parses `argv` (program name first) as pflag would read it: flag names normalised
/// ([`pflag::normalize_args`]), then [`command`].
///
/// # Errors
/// clap's error (exit status 2, or 0 for `--help`/`--version`).
pub fn parse_from<I, T>(argv: I) -> Result<Parsed, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<String>,
{
    let argv = pflag::normalize_args(argv);
    check_spaced_bool_values(&argv)?;
    let mut matches = command().try_get_matches_from(argv)?;
    let ignored = kcm::given_ignored(&matches);
    let cli = Cli::from_arg_matches_mut(&mut matches)?;
    Ok(Parsed { cli, ignored })
}

/// Refuses a boolean flag followed by a separate boolean word (`--leader-elect True`): pflag, and
/// so kube-controller-manager, reads that as `--leader-elect` (true) and a stray argument `True`,
/// which clap would then blame on its own (an unknown subcommand, or `plan`'s NodeList file).
/// Booleans take their value after `=` only.
///
/// # Errors
/// One line naming the flag and the form to write.
fn check_spaced_bool_values(argv: &[String]) -> Result<(), clap::Error> {
    let command = command();
    for pair in argv.windows(2) {
        let (flag, value) = (&pair[0], &pair[1]);
        if flag == "--" {
            break;
        }
        let Some(name) = flag.strip_prefix("--").filter(|n| !n.contains('=')) else {
            continue;
        };
        // pflag's booleans here: a value only after `=`, and optional (`--flag` alone is true).
        let is_bool = command.get_arguments().any(|a| {
            a.get_long() == Some(name)
                && a.is_require_equals_set()
                && a.get_num_args()
                    .is_some_and(|n| n.min_values() == 0 && n.max_values() == 1)
        });
        if is_bool && pflag::parse_bool(value).is_ok() {
            return Err(command.clone().error(
                clap::error::ErrorKind::InvalidValue,
                format!(
                    "--{name} {value}: a boolean flag takes its value after '=' (--{name}={value}); given apart, {value:?} is a separate argument, as kube-controller-manager reads it"
                ),
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
