//! What the controller says when it starts: one line with the whole configuration (with
//! `CloudAllocator`, the node-pool rules, the mask labels and each cluster CIDR's sizes and grid;
//! with `--node-selector`, the selector),
//! one line with the kube-controller-manager flags it ignores, and the configuration diagnostics
//! ([`crate::diagnostics`], then the node-pool warnings of [`Sizing::warnings`]). `plan` prints the
//! same ignored-flag and diagnostic lines as notes.

use std::collections::BTreeMap;

use nodeipam_core::IpamConfig;

use crate::controller::ControllerConfig;
use crate::diagnostics::{self, Finding};
use crate::flags::kcm::GivenIgnoredFlag;
use crate::flags::{BindAddress, CLOUD_ALLOCATOR, ControllerFlags, IpamFlags};
use crate::logging::FilterSource;
use crate::node_pools::{MaskSource, SetSizing, Sizing};

/// Everything the start-up line reports.
#[derive(Debug)]
pub struct StartupView<'a> {
    /// The controller configuration (`None` with `--allocate-node-cidrs=false`).
    pub config: Option<&'a ControllerConfig>,
    /// The per-Node sizes checked against `config` (`None` with `--allocate-node-cidrs=false`).
    pub sizing: Option<&'a Sizing>,
    /// The IPAM flags as given.
    pub ipam_flags: &'a IpamFlags,
    /// The controller flags.
    pub flags: &'a ControllerFlags,
    /// The API server URL (`None` when no client is built).
    pub api_server: Option<&'a str>,
    /// Where the log filter came from.
    pub filter: &'a FilterSource,
}

/// `10.244.0.0/16 (/24, 256 blocks), fd00::/56 (/64, 256 blocks)`: each cluster CIDR with its node
/// CIDR mask size and how many such blocks it holds. When node-pool rules or mask labels give
/// other sizes, also the range of sizes and the grid the cluster CIDR is counted in:
/// `10.244.0.0/16 (/24, 256 blocks; sizes /23 to /26 on a /26 grid of 1024 blocks)`.
pub fn cluster_cidrs_text(config: &IpamConfig, sizing: &Sizing) -> String {
    config
        .cluster_cidrs
        .iter()
        .map(|c| {
            let blocks = c.block_count();
            let mut text = format!(
                "{} (/{}, {blocks} {}",
                c.cluster_cidr,
                c.node_mask_size,
                plural(u64::from(blocks), "block")
            );
            let set = sizing.set_of(c.cluster_cidr);
            if let Some(set) = set.filter(|s| s.grid_mask != s.coarsest_mask) {
                let grid_blocks = 1u64
                    << set
                        .grid_mask
                        .saturating_sub(c.cluster_cidr.prefix_len())
                        .min(63);
                text.push_str(&format!(
                    "; sizes /{} to /{} on a /{} grid of {grid_blocks} {}",
                    set.coarsest_mask,
                    set.grid_mask,
                    set.grid_mask,
                    plural(grid_blocks, "block")
                ));
            }
            text.push(')');
            text
        })
        .collect::<Vec<_>>()
        .join(", ")
}

fn plural(count: u64, word: &str) -> String {
    if count == 1 {
        word.to_owned()
    } else {
        format!("{word}s")
    }
}

/// With `--cidr-allocator-type=CloudAllocator`: the node-pool rules in the order they are tried
/// (first match wins), each named as in every other message (`--node-cidr-mask-size-rule #1
/// "agentpool=big:ipv4=23"`), joined by `; `, or `none`.
pub fn node_pool_rules_text(sizing: &Sizing) -> String {
    if sizing.rules().is_empty() {
        return "none".to_owned();
    }
    (0..sizing.rules().len())
        .map(|index| sizing.describe(MaskSource::Rule(index)))
        .collect::<Vec<_>>()
        .join("; ")
}

/// With `--cidr-allocator-type=CloudAllocator`: `off`, or the sizes each family's mask label may
/// ask for (`ipv4 /23 to /26, ipv6 /60 to /64`).
pub fn mask_labels_text(sizing: &Sizing) -> String {
    // One per family: every cluster CIDR of a family has the family's range.
    let ranges: Vec<String> = sizing
        .sets()
        .iter()
        .enumerate()
        .filter(|(index, set)| {
            !sizing.sets()[..*index]
                .iter()
                .any(|s| s.cluster_cidr.family() == set.cluster_cidr.family())
        })
        .filter_map(|(_, set): (usize, &SetSizing)| {
            let (min, max) = set.label_range?;
            Some(format!("{} /{min} to /{max}", set.cluster_cidr.family()))
        })
        .collect();
    if ranges.is_empty() {
        "off".to_owned()
    } else {
        ranges.join(", ")
    }
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
        Some(config) => {
            let range_allocator;
            let sizing = match view.sizing {
                Some(sizing) => sizing,
                None => {
                    range_allocator = Sizing::range_allocator(&config.ipam);
                    &range_allocator
                }
            };
            // The node-pool fields only with CloudAllocator (a `None` field is left out).
            let cloud = view.ipam_flags.cidr_allocator_type == CLOUD_ALLOCATOR;
            let node_pool_rules = cloud.then(|| node_pool_rules_text(sizing));
            let mask_labels = cloud.then(|| mask_labels_text(sizing));
            // Only with --node-selector (which Nodes are served).
            let node_selector =
                (!sizing.node_selector().selects_all()).then(|| sizing.node_selector().to_string());
            tracing::info!(
            version = crate::build_info::VERSION_TEXT,
            allocator = %view.ipam_flags.cidr_allocator_type,
            cluster_cidrs = %cluster_cidrs_text(&config.ipam, sizing),
            node_pool_rules = node_pool_rules.as_deref(),
            mask_labels = mask_labels.as_deref(),
            node_selector = node_selector.as_deref(),
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
            );
        }
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

/// Diagnostic lines about the configuration alone (R05, R13, host bits), then the node-pool
/// warnings (rules keyed on labels a kubelet may set, [`Sizing::warnings`]).
pub fn config_diagnostic_lines(config: &IpamConfig, sizing: &Sizing) -> Vec<String> {
    let mut lines = diagnostics::summarize(&diagnostics::config_findings(config, sizing));
    lines.extend(sizing.warnings());
    lines
}

/// Diagnostic lines for `plan`: the configuration's and the Nodes' (`node_findings`), then the
/// node-pool warnings.
pub fn diagnostic_lines(
    config: &IpamConfig,
    sizing: &Sizing,
    node_findings: &[Finding],
) -> Vec<String> {
    let mut findings = diagnostics::config_findings(config, sizing);
    findings.extend(node_findings.iter().cloned());
    let mut lines = diagnostics::summarize(&findings);
    lines.extend(sizing.warnings());
    lines
}

#[cfg(test)]
mod tests {
    use nodeipam_core::NodeMaskFlags;

    use super::*;
    use crate::node_pools::{LabelRange, MaskRule, NodePools, RuleOrigin};

    fn config(cluster: &str, masks: NodeMaskFlags) -> IpamConfig {
        nodeipam_core::config::validate(cluster, "", masks).expect("valid configuration")
    }

    fn pools(rules: &[&str], label_range: Option<LabelRange>) -> NodePools {
        NodePools {
            rules: rules
                .iter()
                .enumerate()
                .map(|(i, text)| {
                    MaskRule::parse(text, RuleOrigin::Flag { index: i + 1 }).expect("rule")
                })
                .collect(),
            allow_mask_label: label_range.is_some(),
            label_range: label_range.unwrap_or_default(),
            ..NodePools::default()
        }
    }

    /// The start-up texts of the range allocator, of CloudAllocator rules (a family without a
    /// rule keeps its plain text), and of mask labels.
    #[test]
    fn node_pool_texts() {
        let dual = config("10.244.0.0/16,fd00:10:244::/56", NodeMaskFlags::default());
        let range = Sizing::range_allocator(&dual);
        assert_eq!(
            cluster_cidrs_text(&dual, &range),
            "10.244.0.0/16 (/24, 256 blocks), fd00:10:244::/56 (/64, 256 blocks)"
        );
        assert_eq!(node_pool_rules_text(&range), "none");
        assert_eq!(mask_labels_text(&range), "off");

        let sized = pools(
            &[
                "kubernetes.azure.com/agentpool=big:ipv4=23",
                "agentpool=small:ipv4=26",
            ],
            None,
        )
        .sizing(&dual)
        .expect("fits");
        assert_eq!(
            cluster_cidrs_text(&dual, &sized),
            "10.244.0.0/16 (/24, 256 blocks; sizes /23 to /26 on a /26 grid of 1024 blocks), fd00:10:244::/56 (/64, 256 blocks)"
        );
        assert_eq!(
            node_pool_rules_text(&sized),
            "--node-cidr-mask-size-rule #1 \"kubernetes.azure.com/agentpool=big:ipv4=23\"; --node-cidr-mask-size-rule #2 \"agentpool=small:ipv4=26\""
        );
        assert_eq!(mask_labels_text(&sized), "off");

        let single = config("10.0.0.0/16", NodeMaskFlags::default());
        let labels = pools(&[], LabelRange::parse("ipv4=22-28").ok())
            .sizing(&single)
            .expect("fits");
        assert_eq!(mask_labels_text(&labels), "IPv4 /22 to /28");
        assert_eq!(
            cluster_cidrs_text(&single, &labels),
            "10.0.0.0/16 (/24, 256 blocks; sizes /22 to /28 on a /28 grid of 4096 blocks)"
        );
    }
}
