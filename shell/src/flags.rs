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

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{
    ArgAction, Args, CommandFactory as _, FromArgMatches as _, Parser, Subcommand, ValueEnum,
};
use nodeipam_core::{ConfigError, IpamConfig, NodeMaskFlags};

use crate::node_pools::{LabelRange, MaskRule, NodePoolError, NodePools, RuleOrigin};
use crate::node_selector::NodeSelector;

pub mod kcm;
pub mod pflag;

/// kube-controller-manager's allocator type: every Node gets the node CIDR mask size (default).
pub const RANGE_ALLOCATOR: &str = "RangeAllocator";
/// cloud-provider-azure's allocator type: per-Node sizes, here from node-pool rules and labels
/// ([`crate::node_pools`]).
pub const CLOUD_ALLOCATOR: &str = "CloudAllocator";

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
    /// `--authentication-kubeconfig`, `--authorization-*` (see [`crate::serving`]).
    #[command(flatten)]
    pub serving: crate::serving::SecureServingFlags,
}

/// `--help`'s closing section: the environment and the exit statuses.
const AFTER_HELP: &str = "\
Every other kube-controller-manager and cloud-controller-manager flag is accepted and ignored
(each one given is listed once at start-up with the reason); README's flag table lists them all.

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
    /// CIDR range(s) for pods, comma-separated: one, or one IPv4 and one IPv6 (dual-stack).
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
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_int_as::<u8>)]
    pub node_cidr_mask_size: Option<u8>,
    /// Node CIDR mask size (bits) for the IPv4 cluster CIDR (default 24).
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_int_as::<u8>)]
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// Node CIDR mask size (bits) for the IPv6 cluster CIDR (default 64).
    #[arg(long, global = true, value_name = "BITS", value_parser = pflag::parse_int_as::<u8>)]
    pub node_cidr_mask_size_ipv6: Option<u8>,
    /// Whether to allocate pod CIDRs to Nodes (kube-controller-manager defaults to false; this
    /// controller exists to do it, so true).
    #[arg(long, global = true, value_name = "BOOL", default_value_t = true, action = ArgAction::Set,
          num_args = 0..=1, require_equals = true, default_missing_value = "true",
          value_parser = pflag::parse_bool)]
    pub allocate_node_cidrs: bool,
    /// CIDR allocator type: `RangeAllocator` (every Node gets the node CIDR mask size) or
    /// `CloudAllocator` (per-Node sizes from --node-cidr-mask-size-rule and the Nodes' labels).
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
    /// Address for Prometheus metrics (`/metrics`) over plain HTTP **without authentication**,
    /// for local use (a workstation, `kubectl port-forward`); `0` disables. In a cluster, turn it
    /// off and scrape the authenticated `--secure-port` instead.
    #[arg(long, global = true, value_name = "ADDR", default_value = "0.0.0.0:8080", value_parser = parse_bind_address)]
    pub metrics_bind_address: BindAddress,
    /// Address for `/healthz` and `/readyz` over plain HTTP, for local use; `0` disables. In a
    /// cluster, probe the `--secure-port` instead.
    #[arg(long, global = true, value_name = "ADDR", default_value = "0.0.0.0:8081", value_parser = parse_bind_address)]
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

impl CompatFlags {
    /// Refuses what kube-controller-manager would do differently from this controller:
    /// - `--controllers` that disable the node IPAM controller ([`kcm::node_ipam_enabled`]):
    ///   kcm would not run the allocator; this process is nothing else;
    /// - `--leader-elect-resource-lock` other than `leases` with leader election (kcm 1.3x refuses
    ///   it too: `GenericControllerManagerConfigurationOptions.Validate`);
    /// - `--leader-elect-resource-name` naming kcm's or ccm's own Lease, with leader election;
    /// - a non-empty `--node-filter-requirements` (cloud-provider-azure serves only matching Nodes).
    ///
    /// # Errors
    /// One line naming the flag and saying why.
    pub fn validate(&self, controller: &ControllerFlags) -> Result<(), String> {
        if !kcm::node_ipam_enabled(&self.controllers) {
            let controllers = self.controllers.join(",");
            // The entry that disables it, if one does (kcm: the first entry naming it decides).
            let disabling = self.controllers.iter().find_map(|entry| {
                let name = entry.strip_prefix('-').unwrap_or(entry);
                kcm::NODE_IPAM_CONTROLLER_NAMES
                    .contains(&name)
                    .then_some(entry.as_str())
            });
            return Err(match disabling {
                Some(entry) => format!(
                    "--controllers={controllers} does not enable the node IPAM controller (nodeipam), and this process is that controller: remove {entry} here (keep it on kube-controller-manager)"
                ),
                None => format!(
                    "--controllers={controllers} does not enable the node IPAM controller (nodeipam): it names neither nodeipam nor *, and this process is that controller; add nodeipam (or *) here, or leave --controllers out"
                ),
            });
        }
        if controller.leader_elect && self.leader_elect_resource_lock != "leases" {
            return Err(format!(
                "--leader-elect-resource-lock={:?}: only \"leases\" is supported (as kube-controller-manager)",
                self.leader_elect_resource_lock
            ));
        }
        if controller.leader_elect
            && FOREIGN_LEASE_NAMES.contains(&controller.leader_elect_resource_name.as_str())
        {
            return Err(format!(
                "--leader-elect-resource-name={}: that is {}'s own Lease; this controller needs its own (default {DEFAULT_LEASE_NAME}), or it and {} would lock each other out",
                controller.leader_elect_resource_name,
                controller.leader_elect_resource_name,
                controller.leader_elect_resource_name
            ));
        }
        if !self.node_filter_requirements.trim().is_empty() {
            return Err(format!(
                "--node-filter-requirements={:?}: this controller serves every Node; a selector would make cloud-controller-manager's node IPAM controller serve only the matching ones",
                self.node_filter_requirements
            ));
        }
        Ok(())
    }
}

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

impl IpamFlags {
    /// Validates the cluster/service CIDRs and mask sizes with kube-controller-manager's rules.
    ///
    /// # Errors
    /// The [`ConfigError`] of [`nodeipam_core::config::validate`]; its `Display` is one line that
    /// names the flag and the fix.
    pub fn validate(&self) -> Result<IpamConfig, ConfigError> {
        nodeipam_core::config::validate(
            &self.cluster_cidr,
            &self.service_cluster_ip_range,
            NodeMaskFlags {
                node_cidr_mask_size: self.node_cidr_mask_size,
                node_cidr_mask_size_ipv4: self.node_cidr_mask_size_ipv4,
                node_cidr_mask_size_ipv6: self.node_cidr_mask_size_ipv6,
            },
        )
    }
}

impl IpamFlags {
    /// The node-pool rules and label settings: the flags' rules in order, then the rules file's
    /// (read here). Checked against the cluster CIDRs later ([`NodePools::sizing`]).
    ///
    /// # Errors
    /// [`NodePoolError::NeedsCloudAllocator`] for a node-pool flag with the `RangeAllocator`;
    /// [`NodePoolError::RuleSyntax`] naming the rule; [`NodePoolError::ReadRulesFile`].
    pub fn node_pools(&self) -> Result<NodePools, NodePoolError> {
        if self.cidr_allocator_type != CLOUD_ALLOCATOR {
            let given = [
                (
                    !self.node_cidr_mask_size_rules.is_empty(),
                    "--node-cidr-mask-size-rule",
                ),
                (
                    self.node_cidr_mask_size_rules_file.is_some(),
                    "--node-cidr-mask-size-rules-file",
                ),
                (self.allow_node_mask_label, "--allow-node-mask-label"),
                (
                    self.node_mask_label_range.is_some(),
                    "--node-mask-label-range",
                ),
            ];
            if let Some((_, flag)) = given.iter().find(|(given, _)| *given) {
                return Err(NodePoolError::NeedsCloudAllocator { flag });
            }
        }
        let mut rules = self
            .node_cidr_mask_size_rules
            .iter()
            .enumerate()
            .map(|(i, text)| MaskRule::parse(text, RuleOrigin::Flag { index: i + 1 }))
            .collect::<Result<Vec<_>, _>>()?;
        if let Some(path) = &self.node_cidr_mask_size_rules_file {
            let text =
                std::fs::read_to_string(path).map_err(|source| NodePoolError::ReadRulesFile {
                    path: path.clone(),
                    source,
                })?;
            rules.extend(crate::node_pools::parse_rules_file(path, &text)?);
        }
        Ok(NodePools {
            rules,
            allow_mask_label: self.allow_node_mask_label,
            label_range: self.node_mask_label_range.unwrap_or_default(),
            node_selector: self.node_selector.clone(),
        })
    }
}

impl ControllerFlags {
    /// Checks the values clap cannot check one flag at a time, with kube-controller-manager's rules
    /// (component-base `ValidateLeaderElectionConfiguration` and client-go's `NewLeaderElector`),
    /// only when `--leader-elect` is on (as upstream): every duration > 0, lease duration > renew
    /// deadline > 1.2 × retry period, a Lease name and namespace. The lease duration must also fit
    /// a Lease's `spec.leaseDurationSeconds` (whole seconds, an int32), so 1 s ..= 2^31−1 s.
    ///
    /// # Errors
    /// One line naming the flag.
    pub fn validate(&self) -> Result<(), String> {
        if !self.leader_elect {
            return Ok(());
        }
        let lease = self.leader_elect_lease_duration;
        let renew = self.leader_elect_renew_deadline;
        let retry = self.leader_elect_retry_period;
        if lease < Duration::from_secs(1) || lease.as_secs() > i32::MAX as u64 {
            return Err(format!(
                "--leader-elect-lease-duration={lease:?} must be between 1s and {}s (a Lease holds whole seconds in an int32)",
                i32::MAX
            ));
        }
        if renew.is_zero() {
            return Err("--leader-elect-renew-deadline must be greater than zero".to_owned());
        }
        if retry.is_zero() {
            return Err("--leader-elect-retry-period must be greater than zero".to_owned());
        }
        if renew >= lease {
            return Err(format!(
                "--leader-elect-renew-deadline={renew:?} must be shorter than --leader-elect-lease-duration={lease:?}"
            ));
        }
        if renew.as_secs_f64() <= 1.2 * retry.as_secs_f64() {
            return Err(format!(
                "--leader-elect-retry-period={retry:?} is too long: --leader-elect-renew-deadline={renew:?} must exceed 1.2 × the retry period"
            ));
        }
        if self.leader_elect_resource_name.trim().is_empty() {
            return Err("--leader-elect-resource-name must not be empty".to_owned());
        }
        if self.leader_elect_resource_namespace.trim().is_empty() {
            return Err("--leader-elect-resource-namespace must not be empty".to_owned());
        }
        Ok(())
    }
}

fn parse_allocator_type(text: &str) -> Result<String, String> {
    if text == RANGE_ALLOCATOR || text == CLOUD_ALLOCATOR {
        Ok(text.to_owned())
    } else {
        Err(format!(
            "{RANGE_ALLOCATOR} and {CLOUD_ALLOCATOR} are supported"
        ))
    }
}

/// klog's `-v`: `strconv.ParseUint(text, 10, 32)` (component-base `VerbosityLevelPflag`).
fn parse_verbosity(text: &str) -> Result<u32, String> {
    if text.starts_with('+') {
        return Err("expected a whole number ≥ 0".to_owned());
    }
    text.parse::<u32>()
        .map_err(|_| "expected a whole number ≥ 0".to_owned())
}

/// `--kube-api-burst`: an int32 in pflag's syntax, at least 1.
fn parse_burst(text: &str) -> Result<u32, String> {
    match pflag::parse_int(text)? {
        n @ 1..=0x7fff_ffff => Ok(n as u32),
        _ => Err("must be a whole number from 1 to 2147483647".to_owned()),
    }
}

fn parse_workers(text: &str) -> Result<usize, String> {
    match text.parse::<usize>() {
        Ok(n) if (1..=1000).contains(&n) => Ok(n),
        _ => Err("must be a whole number from 1 to 1000".to_owned()),
    }
}

fn parse_qps(text: &str) -> Result<f64, String> {
    match text.parse::<f64>() {
        Ok(qps) if qps.is_finite() && qps > 0.0 => Ok(qps),
        _ => Err("must be a number greater than 0".to_owned()),
    }
}

/// A listen address, or `None` when disabled with `0` (controller-runtime's convention).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BindAddress(pub Option<SocketAddr>);

/// Parses a listen address (`HOST:PORT`, Go's `:PORT`); `0` disables the server.
fn parse_bind_address(text: &str) -> Result<BindAddress, String> {
    if text == "0" {
        return Ok(BindAddress(None));
    }
    // Go's `:8080` form means every address.
    let full = if text.starts_with(':') {
        format!("0.0.0.0{text}")
    } else {
        text.to_owned()
    };
    full.parse::<SocketAddr>()
        .map(|a| BindAddress(Some(a)))
        .map_err(|_| "expected HOST:PORT (e.g. 0.0.0.0:8080, :8080) or 0 to disable".to_owned())
}

/// Parses Go's `time.ParseDuration` text, restricted to non-negative values: a sequence of
/// decimal numbers each with a unit `h`, `m`, `s`, `ms`, `us`/`µs`, `ns` (`1m30s`, `1.5s`), or `0`.
///
/// # Errors
/// A message saying what is expected.
pub fn parse_go_duration(text: &str) -> Result<Duration, String> {
    const EXPECTED: &str = "expected a duration such as 15s, 1m30s or 500ms";
    if text == "0" {
        return Ok(Duration::ZERO);
    }
    let mut rest = text;
    let mut total = 0f64;
    if rest.is_empty() {
        return Err(EXPECTED.to_owned());
    }
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(|| EXPECTED.to_owned())?;
        let (number, tail) = rest.split_at(number_end);
        let value: f64 = number.parse().map_err(|_| EXPECTED.to_owned())?;
        let unit_end = tail
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let seconds = match unit {
            "h" => 3600.0,
            "m" => 60.0,
            "s" => 1.0,
            "ms" => 1e-3,
            "us" | "µs" => 1e-6,
            "ns" => 1e-9,
            _ => return Err(EXPECTED.to_owned()),
        };
        total += value * seconds;
        rest = tail;
    }
    Duration::try_from_secs_f64(total).map_err(|_| EXPECTED.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        let cases = [
            ("15s", Some(Duration::from_secs(15))),
            ("1m30s", Some(Duration::from_secs(90))),
            ("500ms", Some(Duration::from_millis(500))),
            ("1.5s", Some(Duration::from_millis(1500))),
            ("0", Some(Duration::ZERO)),
            ("2h", Some(Duration::from_secs(7200))),
            ("", None),
            ("15", None),
            ("s", None),
            ("15x", None),
            ("-1s", None),
        ];
        for (text, want) in cases {
            assert_eq!(parse_go_duration(text).ok(), want, "{text}");
        }
    }

    #[test]
    fn defaults_match_kube_controller_manager() {
        let cli = Cli::try_parse_from(["nodeipam-controller", "--cluster-cidr=10.244.0.0/16"])
            .expect("parses");
        assert!(cli.ipam.allocate_node_cidrs);
        assert_eq!(cli.ipam.cidr_allocator_type, RANGE_ALLOCATOR);
        assert_eq!(cli.controller.kube_api_qps, 20.0);
        assert_eq!(cli.controller.kube_api_burst, 30);
        assert!(
            cli.controller.leader_elect,
            "kube-controller-manager elects a leader by default"
        );
        assert_eq!(cli.controller.node_cidr_update_workers, 30);
        assert_eq!(
            cli.controller.leader_elect_lease_duration,
            Duration::from_secs(15)
        );
        assert_eq!(
            cli.controller.leader_elect_renew_deadline,
            Duration::from_secs(10)
        );
        assert_eq!(
            cli.controller.leader_elect_retry_period,
            Duration::from_secs(2)
        );
        assert_eq!(
            cli.controller.leader_elect_resource_namespace,
            "kube-system"
        );
        assert_eq!(
            cli.controller.leader_elect_resource_name,
            DEFAULT_LEASE_NAME
        );
    }

    #[test]
    fn go_style_booleans() {
        let cli = Cli::try_parse_from([
            "nodeipam-controller",
            "--allocate-node-cidrs=false",
            "--leader-elect",
        ])
        .expect("parses");
        assert!(!cli.ipam.allocate_node_cidrs);
        assert!(cli.controller.leader_elect);
    }

    #[test]
    fn bad_flags_are_rejected() {
        for args in [
            vec!["--cidr-allocator-type=IPAMFromCluster"],
            vec!["--node-mask-label-range=ipv4=26-23"],
            vec!["--kube-api-qps=0"],
            vec!["--kube-api-burst=0"],
            vec!["--node-cidr-mask-size=300"],
            vec!["--leader-elect-lease-duration=soon"],
            vec!["--metrics-bind-address=nowhere"],
            vec!["--node-cidr-update-workers=0"],
            vec!["--node-cidr-update-workers=lots"],
        ] {
            let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
            assert!(Cli::try_parse_from(argv).is_err(), "{args:?}");
        }
    }

    #[test]
    fn node_pool_flags() {
        let parse = |args: &[&str]| {
            let argv = std::iter::once("nodeipam-controller").chain(args.iter().copied());
            Cli::try_parse_from(argv).expect("parses").ipam.node_pools()
        };
        let pools = parse(&[
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rule",
            "kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64",
            "--node-cidr-mask-size-rule=agentpool=small:ipv4=26",
            "--allow-node-mask-label",
            "--node-mask-label-range=ipv4=22-26",
        ])
        .expect("valid");
        let texts: Vec<&str> = pools.rules.iter().map(|r| r.text.as_str()).collect();
        assert_eq!(
            texts,
            [
                "kubernetes.azure.com/agentpool=bigpool:ipv4=23,ipv6=64",
                "agentpool=small:ipv4=26"
            ]
        );
        assert!(pools.allow_mask_label);
        assert_eq!(pools.label_range.ipv4, Some((22, 26)));
        assert_eq!(
            parse(&[]).expect("no rules"),
            NodePools::default(),
            "RangeAllocator by default"
        );
        for flag in [
            "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
            "--allow-node-mask-label",
            "--node-cidr-mask-size-rules-file=/nonexistent",
        ] {
            let error = parse(&[flag])
                .expect_err("needs CloudAllocator")
                .to_string();
            assert!(
                error.contains("needs --cidr-allocator-type=CloudAllocator"),
                "{error}"
            );
        }
        let error = parse(&[
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rule=agentpool=big:ipv4=23",
            "--node-cidr-mask-size-rule=agentpool",
        ])
        .expect_err("bad second rule")
        .to_string();
        assert!(
            error.starts_with("--node-cidr-mask-size-rule #2 \"agentpool\""),
            "{error}"
        );
        let error = parse(&[
            "--cidr-allocator-type=CloudAllocator",
            "--node-cidr-mask-size-rules-file=/nonexistent/rules",
        ])
        .expect_err("missing file")
        .to_string();
        assert!(error.contains("/nonexistent/rules"), "{error}");
    }

    /// `--leader-elect-renew-deadline`'s help says what the leader does: it renews every retry
    /// period (it said the leader renewed once 5s of the 15s Lease were left).
    #[test]
    fn renew_deadline_help_says_when_the_leader_renews() {
        use clap::CommandFactory;
        let command = Cli::command();
        let help = command
            .get_arguments()
            .find(|a| a.get_id() == "leader_elect_renew_deadline")
            .and_then(|a| a.get_help())
            .map(ToString::to_string)
            .expect("documented flag");
        assert!(
            help.contains("renews every --leader-elect-retry-period (2s by default)"),
            "{help}"
        );
        assert!(!help.contains("5s of its 15s"), "{help}");
    }

    /// `--leader-elect True` (value apart) is refused naming the flag and `--leader-elect=True`;
    /// it blamed `True` as a subcommand, or as `plan`'s file.
    #[test]
    fn boolean_value_given_apart_names_the_flag() {
        for argv in [
            vec![
                "nodeipam-controller",
                "--leader-elect",
                "True",
                "--cluster-cidr=10.0.0.0/16",
            ],
            vec!["nodeipam-controller", "plan", "--leader-elect", "True"],
            vec!["nodeipam-controller", "--allocate-node-cidrs", "false"],
        ] {
            let error = parse_from(argv.clone())
                .map(|_| ())
                .expect_err("refused")
                .to_string();
            let flag = argv
                .iter()
                .find(|a| a.starts_with("--") && !a.contains('='))
                .unwrap();
            let value = argv[argv.iter().position(|a| a == flag).unwrap() + 1];
            assert!(
                error.contains(&format!(
                    "{flag} {value}: a boolean flag takes its value after '=' ({flag}={value})"
                )),
                "{argv:?}: {error}"
            );
        }
        // `=` forms, and a flag alone before another flag or `plan`'s file, are fine.
        for argv in [
            vec![
                "nodeipam-controller",
                "--leader-elect=True",
                "--cluster-cidr=10.0.0.0/16",
            ],
            vec![
                "nodeipam-controller",
                "--leader-elect",
                "--cluster-cidr=10.0.0.0/16",
            ],
            vec![
                "nodeipam-controller",
                "plan",
                "--leader-elect",
                "nodes.json",
            ],
        ] {
            assert!(parse_from(argv.clone()).is_ok(), "{argv:?}");
        }
    }

    /// `--controllers` that leaves nodeipam out: the message says what to change — remove the
    /// entry that disables it, or add it when nothing names it (it said "remove -nodeipam" for
    /// `--controllers=bootstrapsigner`, which has none).
    #[test]
    fn controllers_without_nodeipam_say_what_to_change() {
        let error = |controllers: &str| {
            let cli = Cli::try_parse_from(["nodeipam-controller", controllers]).expect("parses");
            cli.compat.validate(&cli.controller).expect_err("refused")
        };
        assert_eq!(
            error("--controllers=bootstrapsigner"),
            "--controllers=bootstrapsigner does not enable the node IPAM controller (nodeipam): it names neither nodeipam nor *, and this process is that controller; add nodeipam (or *) here, or leave --controllers out"
        );
        assert_eq!(
            error("--controllers=*,-node-ipam-controller"),
            "--controllers=*,-node-ipam-controller does not enable the node IPAM controller (nodeipam), and this process is that controller: remove -node-ipam-controller here (keep it on kube-controller-manager)"
        );
        let cli = Cli::try_parse_from([
            "nodeipam-controller",
            "--controllers=bootstrapsigner,nodeipam",
        ])
        .expect("parses");
        assert_eq!(cli.compat.validate(&cli.controller), Ok(()));
    }

    #[test]
    fn bind_addresses() {
        assert_eq!(parse_bind_address("0"), Ok(BindAddress(None)));
        assert_eq!(
            parse_bind_address(":9090"),
            Ok(BindAddress(Some(SocketAddr::from(([0, 0, 0, 0], 9090)))))
        );
    }

    #[test]
    fn config_errors_name_the_flag() {
        let cli = Cli::try_parse_from([
            "nodeipam-controller",
            "--cluster-cidr=10.244.0.0/16,10.245.0.0/16",
        ])
        .expect("parses");
        let err = cli.ipam.validate().expect_err("two IPv4 cluster CIDRs");
        assert!(err.to_string().contains("--cluster-cidr"), "{err}");
    }
}
