//! The checks clap cannot make one flag at a time, each error one line naming the flag: the IPAM
//! flags against kube-controller-manager's rules (through `nodeipam-core`), the node-pool flags,
//! the leader-election durations (component-base and client-go's rules), and the kcm/ccm flags
//! this controller reads only to refuse a value it cannot honour.
use nodeipam_core::{ConfigError, IpamConfig, NodeMaskFlags};

use super::{
    CLOUD_ALLOCATOR, CompatFlags, ControllerFlags, DEFAULT_LEASE_NAME, FOREIGN_LEASE_NAMES,
    IpamFlags, kcm,
};
use crate::leader::{JITTER_FACTOR, TimingRule, check_timing};
use crate::node_pools::{MaskRule, NodePoolError, NodePools, RuleOrigin};

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
    /// only when `--leader-elect` is on (as upstream): the timing rules of [`check_timing`] (every
    /// duration > 0, lease duration > renew deadline > [`JITTER_FACTOR`] × retry period, a lease
    /// duration that fits a Lease's `spec.leaseDurationSeconds`: 1 s ..= 2^31−1 s), a Lease name
    /// and namespace.
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
        match check_timing(lease, renew, retry) {
            Ok(()) => {}
            Err(TimingRule::LeaseDurationRange) => {
                return Err(format!(
                    "--leader-elect-lease-duration={}s must be between 1s and {}s (a Lease holds whole seconds in an int32)",
                    lease.as_secs_f64(),
                    i32::MAX
                ));
            }
            Err(TimingRule::RenewDeadlineZero) => {
                return Err("--leader-elect-renew-deadline must be greater than zero".to_owned());
            }
            Err(TimingRule::RetryPeriodZero) => {
                return Err("--leader-elect-retry-period must be greater than zero".to_owned());
            }
            Err(TimingRule::RenewDeadlineNotBelowLease) => {
                return Err(format!(
                    "--leader-elect-renew-deadline={renew:?} must be shorter than --leader-elect-lease-duration={lease:?}"
                ));
            }
            Err(TimingRule::RenewDeadlineNotAboveJitteredRetry) => {
                return Err(format!(
                    "--leader-elect-retry-period={retry:?} is too long: --leader-elect-renew-deadline={renew:?} must exceed {JITTER_FACTOR} × the retry period"
                ));
            }
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
