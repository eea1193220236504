//! What the controller says when it starts: one line with the whole configuration, one line with
//! the kube-controller-manager flags it ignores, and the configuration diagnostics
//! ([`crate::diagnostics`]). `plan` prints the same ignored-flag and diagnostic lines as notes.

use std::collections::BTreeMap;

use nodeipam_core::IpamConfig;

use crate::controller::ControllerConfig;
use crate::diagnostics::{self, Finding};
use crate::flags::kcm::GivenIgnoredFlag;
use crate::flags::{BindAddress, ControllerFlags, IpamFlags};
use crate::logging::FilterSource;

/// Everything the start-up line reports.
#[derive(Debug)]
pub struct StartupView<'a> {
    /// The controller configuration (`None` with `--allocate-node-cidrs=false`).
    pub config: Option<&'a ControllerConfig>,
    /// The IPAM flags as given.
    pub ipam_flags: &'a IpamFlags,
    /// The controller flags.
    pub flags: &'a ControllerFlags,
    /// The API server URL (`None` when no client is built).
    pub api_server: Option<&'a str>,
    /// Where the log filter came from.
    pub filter: &'a FilterSource,
}

/// `10.244.0.0/16 (/24, 256 blocks), fd00::/56 (/64, 256 blocks)`.
pub fn cluster_cidrs_text(config: &IpamConfig) -> String {
    config
        .cluster_cidrs
        .iter()
        .map(|c| {
            let blocks = c.block_count();
            let unit = if blocks == 1 { "block" } else { "blocks" };
            format!(
                "{} (/{}, {blocks} {unit})",
                c.cluster_cidr, c.node_mask_size
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// `10.96.0.0/12`, or `none (service filtering off)`.
pub fn service_cidrs_text(config: &IpamConfig) -> String {
    if config.service_cidrs.is_empty() {
        return "none (service filtering off)".to_owned();
    }
    config
        .service_cidrs
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(",")
}

fn address_text(address: BindAddress) -> String {
    address
        .0
        .map_or_else(|| "off".to_owned(), |a| a.to_string())
}

/// Logs the start-up line (info).
pub fn log_startup(view: &StartupView<'_>) {
    let flags = view.flags;
    let leader_election = match view.config.and_then(|c| c.leader_election.as_ref()) {
        Some(le) => format!(
            "Lease {}/{} as {} (lease {:?}, renew deadline {:?}, retry {:?})",
            le.namespace,
            le.name,
            le.identity,
            le.lease_duration,
            le.renew_deadline,
            le.retry_period
        ),
        None if flags.leader_elect => "on".to_owned(),
        None => {
            "off (one allocator only; writes start one request timeout after start-up)".to_owned()
        }
    };
    let log_filter = match view.filter {
        FilterSource::Verbosity(filter) => format!("{filter} (from -v)"),
        FilterSource::RustLog(text) => format!("RUST_LOG={text} (replaces -v)"),
        FilterSource::InvalidRustLog { text, used } => {
            format!("RUST_LOG={text:?} is not a valid filter; using {used}")
        }
    };
    match view.config {
        Some(config) => tracing::info!(
            version = crate::build_info::VERSION_TEXT,
            cluster_cidrs = %cluster_cidrs_text(&config.ipam),
            service_cidrs = %service_cidrs_text(&config.ipam),
            api_server = view.api_server.unwrap_or("-"),
            kube_api_qps = config.kube_api_qps,
            kube_api_burst = config.kube_api_burst,
            workers = config.workers,
            leader_election = %leader_election,
            metrics = %address_text(flags.metrics_bind_address),
            health = %address_text(flags.health_probe_bind_address),
            log_filter = %log_filter,
            "starting nodeipam-controller"
        ),
        None => tracing::info!(
            version = crate::build_info::VERSION_TEXT,
            allocation = "off (--allocate-node-cidrs=false): not allocating, not connecting to the API server",
            cluster_cidr = %view.ipam_flags.cluster_cidr,
            metrics = %address_text(flags.metrics_bind_address),
            health = %address_text(flags.health_probe_bind_address),
            log_filter = %log_filter,
            "starting nodeipam-controller"
        ),
    }
}

/// One line listing the ignored kube-controller-manager flags, grouped by reason (none if no such
/// flag was given).
pub fn ignored_lines(ignored: &[GivenIgnoredFlag]) -> Vec<String> {
    if ignored.is_empty() {
        return Vec::new();
    }
    let mut by_reason: BTreeMap<&str, Vec<String>> = BTreeMap::new();
    for flag in ignored {
        by_reason
            .entry(flag.reason)
            .or_default()
            .push(flag.to_string());
    }
    let groups: Vec<String> = by_reason
        .into_iter()
        .map(|(reason, flags)| format!("{} ({reason})", flags.join(" ")))
        .collect();
    vec![format!(
        "ignoring {} kube-controller-manager flag{}: {}",
        ignored.len(),
        if ignored.len() == 1 { "" } else { "s" },
        groups.join("; ")
    )]
}

/// Diagnostic lines about the configuration alone (R05, R13, host bits).
pub fn config_diagnostic_lines(config: &IpamConfig) -> Vec<String> {
    diagnostics::summarize(&diagnostics::config_findings(config))
}

/// Diagnostic lines for `plan`: the configuration's and the Nodes' (`node_findings`).
pub fn diagnostic_lines(config: &IpamConfig, node_findings: &[Finding]) -> Vec<String> {
    let mut findings = diagnostics::config_findings(config);
    findings.extend(node_findings.iter().cloned());
    diagnostics::summarize(&findings)
}
