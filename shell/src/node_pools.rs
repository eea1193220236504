//! Node pools: a node CIDR mask size per Node, from the Node's own labels
//! (`--cidr-allocator-type=CloudAllocator`).
//!
//! cloud-provider-azure's `CloudAllocator` (`pkg/nodeipam/ipam/cloud_cidr_allocator.go`) gives
//! the Nodes of different node pools blocks of different sizes from one cluster CIDR, reading the
//! size from tags on the VM scale set behind each Node. Here the size comes from the Node object:
//!
//! - **rules** — `--node-cidr-mask-size-rule 'KEY=VALUE:ipv4=N,ipv6=M'` (repeatable) and the lines
//!   of `--node-cidr-mask-size-rules-file`: a Node whose label `KEY` equals `VALUE` gets `/N`
//!   (IPv4) and `/M` (IPv6). The flags' rules come first, in the order given, then the file's,
//!   in line order; the **first** matching rule wins, and a family the rule does not name gets
//!   the default size;
//! - **the Node's own labels** `nodeipam.io/node-cidr-mask-size-ipv4` / `-ipv6`, honoured only
//!   with `--allow-node-mask-label`, and only within `--node-mask-label-range` (the cap). A label
//!   takes precedence over the rules for its family;
//! - otherwise the default sizes (`--node-cidr-mask-size[-ipv4|-ipv6]`).
//!
//! The **grid** of each cluster CIDR — the unit the bitmap counts in — is the finest size any of
//! these can give (default, every rule, the label range's upper end), fixed at start-up. A Node's
//! block is `2^(grid − size)` aligned grid blocks. Blocks coarser than the default size are
//! placed first fit from the start of the cluster CIDR (the reference's order); the default size
//! and finer ones round-robin from the cursor, so a cluster without rules allocates exactly as
//! the range allocator does ([`nodeipam_core::Placement`]).
//!
//! Which labels are safe to key on: a kubelet may set any label on its own Node except those the
//! NodeRestriction admission plugin forbids (`plugin/pkg/admission/noderestriction/admission.go`,
//! `getForbiddenLabels`): keys in the `node-restriction.kubernetes.io/` namespace (or a
//! subdomain of it), and keys in a `kubernetes.io`/`k8s.io` namespace other than the kubelet's own
//! (`k8s.io/kubelet/pkg/apis/well_known_labels.go`, `IsKubeletLabel`: hostname, zone, region,
//! instance type, os, arch, and the `kubelet.kubernetes.io`/`node.kubernetes.io` namespaces).
//! [`kubelet_may_set`] applies that rule; start-up warns about every rule keyed on a label a
//! kubelet could set. Cloud node-pool labels (`kubernetes.azure.com/agentpool`, `agentpool`,
//! `eks.amazonaws.com/nodegroup`, `cloud.google.com/gke-nodepool`) are set by the cloud's
//! provisioning through the kubelet's `--node-labels`, so a compromised node can claim another
//! pool's label; the damage is bounded by the rules themselves (it gets at most the largest block
//! a rule gives) and, for the mask labels, by `--node-mask-label-range`.

use std::collections::BTreeMap;
use std::fmt;
use std::path::{Path, PathBuf};

use nodeipam_core::{Cidr, Family, IpamConfig, MAX_BLOCK_BITS};

use crate::labels::{self, NodeSelector};

/// The Node label that asks for an IPv4 node CIDR mask size (with `--allow-node-mask-label`).
pub const MASK_LABEL_IPV4: &str = "nodeipam.io/node-cidr-mask-size-ipv4";
/// The Node label that asks for an IPv6 node CIDR mask size (with `--allow-node-mask-label`).
pub const MASK_LABEL_IPV6: &str = "nodeipam.io/node-cidr-mask-size-ipv6";

/// Where a rule was written, for messages.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RuleOrigin {
    /// The `index`-th `--node-cidr-mask-size-rule` (1-based).
    Flag {
        /// 1-based position among the flags.
        index: usize,
    },
    /// Line `line` (1-based) of a rules file.
    File {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
    },
}

impl fmt::Display for RuleOrigin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RuleOrigin::Flag { index } => write!(f, "--node-cidr-mask-size-rule #{index}"),
            RuleOrigin::File { path, line } => write!(
                f,
                "--node-cidr-mask-size-rules-file {} line {line}",
                path.display()
            ),
        }
    }
}

/// One rule: Nodes whose label `label_key` equals `label_value` get these mask sizes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MaskRule {
    /// The label key (a Kubernetes qualified name: `[prefix/]name`).
    pub label_key: String,
    /// The label value (may be empty).
    pub label_value: String,
    /// IPv4 node CIDR mask size, bits, if the rule sets one.
    pub ipv4: Option<u8>,
    /// IPv6 node CIDR mask size, bits, if the rule sets one.
    pub ipv6: Option<u8>,
    /// The rule as written (trimmed).
    pub text: String,
    /// Where it was written.
    pub origin: RuleOrigin,
}

impl MaskRule {
    /// Parses `KEY=VALUE:ipv4=N,ipv6=M` (either size may be left out, not both; surrounding
    /// whitespace is ignored). The key must be a label key and the value a label value
    /// ([`labels::validate_key`], [`labels::validate_value`]); sizes are decimal bits.
    ///
    /// # Errors
    /// [`NodePoolError::RuleSyntax`] saying what is wrong, naming the rule.
    pub fn parse(text: &str, origin: RuleOrigin) -> Result<MaskRule, NodePoolError> {
        let text = text.trim();
        let syntax = |reason: String| NodePoolError::RuleSyntax {
            origin: origin.clone(),
            text: text.to_owned(),
            reason,
        };
        let (selector, sizes) = text.split_once(':').ok_or_else(|| {
            syntax("expected LABEL-KEY=LABEL-VALUE:ipv4=N,ipv6=M (no ':' found)".to_owned())
        })?;
        let (label_key, label_value) = selector.split_once('=').ok_or_else(|| {
            syntax("expected LABEL-KEY=LABEL-VALUE before the ':' (no '=' found)".to_owned())
        })?;
        labels::validate_key(label_key).map_err(|e| syntax(e.to_string()))?;
        labels::validate_value(label_key, label_value).map_err(|e| syntax(e.to_string()))?;
        let sizes = parse_family_list(sizes, parse_mask_size).map_err(syntax)?;
        Ok(MaskRule {
            label_key: label_key.to_owned(),
            label_value: label_value.to_owned(),
            ipv4: sizes.ipv4,
            ipv6: sizes.ipv6,
            text: text.to_owned(),
            origin,
        })
    }

    /// The mask size the rule sets for `family`, if any.
    pub fn mask_for(&self, family: Family) -> Option<u8> {
        match family {
            Family::V4 => self.ipv4,
            Family::V6 => self.ipv6,
        }
    }

    /// Whether a Node with these labels matches (its label `label_key` equals `label_value`).
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        labels::has_label(labels, &self.label_key, &self.label_value)
    }
}

/// Parses a rules file: one rule per line in the flag's syntax; blank lines and lines starting
/// with `#` (after leading whitespace) are ignored.
///
/// # Errors
/// [`NodePoolError::RuleSyntax`] for the first bad line (file and line named).
pub fn parse_rules_file(path: &Path, text: &str) -> Result<Vec<MaskRule>, NodePoolError> {
    text.lines()
        .enumerate()
        .filter(|(_, line)| {
            let line = line.trim();
            !line.is_empty() && !line.starts_with('#')
        })
        .map(|(number, line)| {
            MaskRule::parse(
                line,
                RuleOrigin::File {
                    path: path.to_owned(),
                    line: number + 1,
                },
            )
        })
        .collect()
}

/// The sizes a Node's mask labels may ask for, per family (`--node-mask-label-range`): inclusive
/// prefix lengths in bits, coarsest first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LabelRange {
    /// IPv4 `(coarsest, finest)`, if given.
    pub ipv4: Option<(u8, u8)>,
    /// IPv6 `(coarsest, finest)`, if given.
    pub ipv6: Option<(u8, u8)>,
}

impl LabelRange {
    /// Parses `ipv4=MIN-MAX,ipv6=MIN-MAX` (either may be left out, not both), e.g.
    /// `ipv4=23-26`: a label may ask for /23 … /26.
    ///
    /// # Errors
    /// A message saying what is wrong.
    pub fn parse(text: &str) -> Result<LabelRange, String> {
        let list = parse_family_list(text.trim(), |t| {
            let (min, max) = t
                .split_once('-')
                .ok_or_else(|| format!("{t:?} is not MIN-MAX (e.g. 23-26)"))?;
            let (min, max) = (parse_mask_size(min)?, parse_mask_size(max)?);
            if min > max {
                return Err(format!(
                    "{t:?}: the coarsest size /{min} must not be finer than /{max}"
                ));
            }
            Ok((min, max))
        })?;
        Ok(LabelRange {
            ipv4: list.ipv4,
            ipv6: list.ipv6,
        })
    }

    fn for_family(&self, family: Family) -> Option<(u8, u8)> {
        match family {
            Family::V4 => self.ipv4,
            Family::V6 => self.ipv6,
        }
    }
}

/// What the rule flags give, before they are checked against the cluster CIDRs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodePools {
    /// The rules, first match wins.
    pub rules: Vec<MaskRule>,
    /// `--allow-node-mask-label`: honour the Nodes' mask labels.
    pub allow_mask_label: bool,
    /// `--node-mask-label-range` (only with `allow_mask_label`).
    pub label_range: LabelRange,
    /// `--node-selector`: the Nodes served (every Node by default). Not a node-pool rule, but
    /// decided per Node from its labels like the sizes, so carried with them into [`Sizing`].
    pub node_selector: NodeSelector,
}

impl NodePools {
    /// Checks the rules against the validated configuration and fixes the grid of each cluster
    /// CIDR. Every mask (rule, label range) must lie between the cluster prefix and the finest
    /// grid the core supports (cluster prefix + 24 bits, at most 32/128), and name only families
    /// that have a cluster CIDR.
    ///
    /// # Errors
    /// [`NodePoolError::MaskOutOfRange`], [`NodePoolError::FamilyNotConfigured`] (each naming the
    /// rule or flag), [`NodePoolError::LabelRangeWithoutLabels`].
    pub fn sizing(&self, config: &IpamConfig) -> Result<Sizing, NodePoolError> {
        if !self.allow_mask_label && self.label_range != LabelRange::default() {
            return Err(NodePoolError::LabelRangeWithoutLabels);
        }
        let families: Vec<Family> = config
            .cluster_cidrs
            .iter()
            .map(|c| c.cluster_cidr.family())
            .collect();
        for rule in &self.rules {
            for family in [Family::V4, Family::V6] {
                if rule.mask_for(family).is_some() && !families.contains(&family) {
                    return Err(NodePoolError::FamilyNotConfigured {
                        what: format!("{} {:?}", rule.origin, rule.text),
                        family,
                    });
                }
            }
        }
        for family in [Family::V4, Family::V6] {
            if self.label_range.for_family(family).is_some() && !families.contains(&family) {
                return Err(NodePoolError::FamilyNotConfigured {
                    what: "--node-mask-label-range".to_owned(),
                    family,
                });
            }
        }
        let mut sets = Vec::new();
        for cluster in &config.cluster_cidrs {
            let cluster_cidr = cluster.cluster_cidr;
            let family = cluster_cidr.family();
            let finest_allowed = finest_allowed(cluster_cidr);
            let in_range = |mask: u8, what: String| {
                if mask < cluster_cidr.prefix_len() || mask > finest_allowed {
                    Err(NodePoolError::MaskOutOfRange {
                        what,
                        mask,
                        cluster_cidr,
                        finest: finest_allowed,
                    })
                } else {
                    Ok(())
                }
            };
            let mut coarsest = cluster.node_mask_size;
            let mut grid = cluster.node_mask_size;
            for rule in &self.rules {
                if let Some(mask) = rule.mask_for(family) {
                    in_range(mask, format!("{} {:?}", rule.origin, rule.text))?;
                    coarsest = coarsest.min(mask);
                    grid = grid.max(mask);
                }
            }
            let label = if self.allow_mask_label {
                let range = match self.label_range.for_family(family) {
                    Some((min, max)) => {
                        in_range(min, "--node-mask-label-range".to_owned())?;
                        in_range(max, "--node-mask-label-range".to_owned())?;
                        grid = grid.max(max);
                        (min, max)
                    }
                    None => (coarsest, grid),
                };
                coarsest = coarsest.min(range.0);
                Some(range)
            } else {
                None
            };
            sets.push(SetSizing {
                cluster_cidr,
                default_mask: cluster.node_mask_size,
                grid_mask: grid,
                coarsest_mask: coarsest,
                label_range: label,
            });
        }
        Ok(Sizing {
            rules: self.rules.clone(),
            allow_mask_label: self.allow_mask_label,
            sets,
            node_selector: self.node_selector.clone(),
        })
    }
}

/// The finest mask a set of `cluster_cidr` may be cut into: cluster prefix + 24 bits (2^24
/// blocks), at most the address width.
fn finest_allowed(cluster_cidr: Cidr) -> u8 {
    cluster_cidr
        .prefix_len()
        .saturating_add(MAX_BLOCK_BITS)
        .min(cluster_cidr.family().max_prefix_len())
}

/// The sizes of one cluster CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetSizing {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// The default node CIDR mask size (the `--node-cidr-mask-size*` flags), bits.
    pub default_mask: u8,
    /// The grid: the finest size any Node can get, bits; the set's block unit.
    pub grid_mask: u8,
    /// The coarsest size any Node can get, bits.
    pub coarsest_mask: u8,
    /// With `--allow-node-mask-label`: the sizes a label may ask for, `(coarsest, finest)`.
    pub label_range: Option<(u8, u8)>,
}

/// Checked node-pool sizes for one configuration: per cluster CIDR the default, the grid and the
/// label range, and the rules; and which Nodes are served at all (`--node-selector`). Built by
/// [`NodePools::sizing`]; [`Sizing::range_allocator`] is the sizing without rules (every Node is
/// served and gets the default size).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sizing {
    rules: Vec<MaskRule>,
    allow_mask_label: bool,
    sets: Vec<SetSizing>,
    node_selector: NodeSelector,
}

/// Where a Node's mask size for one family came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskSource {
    /// The default (`--node-cidr-mask-size*`).
    Default,
    /// The rule at this index of [`Sizing::rules`] (0-based).
    Rule(usize),
    /// The Node's mask label.
    Label,
}

/// A Node's mask size for one cluster CIDR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeMask {
    /// Prefix length, bits.
    pub prefix_len: u8,
    /// Where it came from.
    pub source: MaskSource,
}

/// Why a Node's mask label cannot be used (the Node is not served until it is fixed).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LabelError {
    /// The value is not a mask size (decimal bits).
    #[error("label {label}={value:?} is not a node CIDR mask size (decimal bits, e.g. 24)")]
    NotANumber {
        /// The label key.
        label: &'static str,
        /// Its value.
        value: String,
    },
    /// The size is outside `--node-mask-label-range`.
    #[error(
        "label {label}={value} asks for /{value}, outside the range a label may ask for (/{min} to /{max}, --node-mask-label-range)"
    )]
    OutOfRange {
        /// The label key.
        label: &'static str,
        /// The size asked for, bits.
        value: u8,
        /// Coarsest allowed, bits.
        min: u8,
        /// Finest allowed, bits.
        max: u8,
    },
}

impl Sizing {
    /// Every Node gets the default size of each cluster CIDR; the grid is the default size.
    pub fn range_allocator(config: &IpamConfig) -> Sizing {
        Sizing {
            rules: Vec::new(),
            allow_mask_label: false,
            sets: config
                .cluster_cidrs
                .iter()
                .map(|c| SetSizing {
                    cluster_cidr: c.cluster_cidr,
                    default_mask: c.node_mask_size,
                    grid_mask: c.node_mask_size,
                    coarsest_mask: c.node_mask_size,
                    label_range: None,
                })
                .collect(),
            node_selector: NodeSelector::default(),
        }
    }

    /// This sizing serving only the Nodes `node_selector` selects.
    #[must_use]
    pub fn with_node_selector(mut self, node_selector: NodeSelector) -> Sizing {
        self.node_selector = node_selector;
        self
    }

    /// `--node-selector`: which Nodes are served.
    pub fn node_selector(&self) -> &NodeSelector {
        &self.node_selector
    }

    /// Whether a Node with these labels is served (selected by `--node-selector`). A Node that is
    /// not is never written; what its podCIDRs cover stays occupied all the same (see
    /// [`crate::reconcile`]).
    pub fn serves(&self, labels: &BTreeMap<String, String>) -> bool {
        self.node_selector.matches(labels)
    }

    /// Per cluster CIDR, flag order.
    pub fn sets(&self) -> &[SetSizing] {
        &self.sets
    }

    /// The rules, first match wins.
    pub fn rules(&self) -> &[MaskRule] {
        &self.rules
    }

    /// The sizing of the first cluster CIDR (flag order) of `family`. Every cluster CIDR of a
    /// family has the same default size, grid and label range (the flags are per family); only
    /// the range checks differ per cluster CIDR.
    pub fn set_for(&self, family: Family) -> Option<&SetSizing> {
        self.sets.iter().find(|s| s.cluster_cidr.family() == family)
    }

    /// The sizing of cluster CIDR `cluster_cidr`, if it is one of this configuration's.
    pub fn set_of(&self, cluster_cidr: Cidr) -> Option<&SetSizing> {
        self.sets.iter().find(|s| s.cluster_cidr == cluster_cidr)
    }

    /// The label keys the rules (and the mask labels, when honoured) and `--node-selector` read,
    /// sorted, no duplicates: all an informer needs to keep of a Node's labels.
    pub fn label_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.rules.iter().map(|r| r.label_key.clone()).collect();
        keys.extend_from_slice(self.node_selector.label_keys());
        if self.allow_mask_label {
            keys.extend([MASK_LABEL_IPV4.to_owned(), MASK_LABEL_IPV6.to_owned()]);
        }
        keys.sort();
        keys.dedup();
        keys
    }

    /// The mask size for each cluster CIDR (flag order) of a Node with these labels: its mask
    /// label (when honoured and present), else the first matching rule's size for that family,
    /// else the default.
    ///
    /// # Errors
    /// [`LabelError`] if a honoured mask label is present but unusable.
    pub fn resolve(&self, labels: &BTreeMap<String, String>) -> Result<Vec<NodeMask>, LabelError> {
        let rule = self.rules.iter().position(|r| r.matches(labels));
        self.sets
            .iter()
            .map(|set| {
                let family = set.cluster_cidr.family();
                if let Some((min, max)) = set.label_range {
                    let label = match family {
                        Family::V4 => MASK_LABEL_IPV4,
                        Family::V6 => MASK_LABEL_IPV6,
                    };
                    if let Some(value) = labels.get(label) {
                        let prefix_len =
                            parse_mask_size(value).map_err(|_| LabelError::NotANumber {
                                label,
                                value: value.clone(),
                            })?;
                        if prefix_len < min || prefix_len > max {
                            return Err(LabelError::OutOfRange {
                                label,
                                value: prefix_len,
                                min,
                                max,
                            });
                        }
                        return Ok(NodeMask {
                            prefix_len,
                            source: MaskSource::Label,
                        });
                    }
                }
                let from_rule = rule.and_then(|index| {
                    self.rules[index]
                        .mask_for(family)
                        .map(|prefix_len| NodeMask {
                            prefix_len,
                            source: MaskSource::Rule(index),
                        })
                });
                Ok(from_rule.unwrap_or(NodeMask {
                    prefix_len: set.default_mask,
                    source: MaskSource::Default,
                }))
            })
            .collect()
    }

    /// One line per rule (or honoured label) keyed on a label that a kubelet may set on its own
    /// Node ([`kubelet_may_set`]), for start-up warnings.
    pub fn warnings(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .rules
            .iter()
            .filter(|r| kubelet_may_set(&r.label_key))
            .map(|r| {
                format!(
                    "{} {:?} keys on label {}, which a kubelet may set on its own Node (the NodeRestriction admission plugin does not protect it): a compromised node can claim this rule's block size",
                    r.origin, r.text, r.label_key
                )
            })
            .collect();
        if self.allow_mask_label {
            out.push(format!(
                "--allow-node-mask-label: {MASK_LABEL_IPV4} and {MASK_LABEL_IPV6} can be set by a kubelet on its own Node; they are capped by --node-mask-label-range"
            ));
        }
        out
    }

    /// A sentence for `source`, e.g. `rule --node-cidr-mask-size-rule #1 "agentpool=big:ipv4=23"`.
    pub fn describe(&self, source: MaskSource) -> String {
        match source {
            MaskSource::Default => "the default size".to_owned(),
            MaskSource::Label => "the Node's mask label".to_owned(),
            MaskSource::Rule(index) => match self.rules.get(index) {
                Some(rule) => format!("{} {:?}", rule.origin, rule.text),
                None => "a rule".to_owned(),
            },
        }
    }
}

/// Whether a kubelet may set label `key` on its own Node under the NodeRestriction admission
/// plugin (kube-apiserver `plugin/pkg/admission/noderestriction/admission.go`,
/// `getForbiddenLabels`): not in the `node-restriction.kubernetes.io` namespace, and not a
/// `kubernetes.io`/`k8s.io` label unless it is one of the kubelet's own
/// (`k8s.io/kubelet/pkg/apis/well_known_labels.go`, `IsKubeletLabel`).
pub fn kubelet_may_set(key: &str) -> bool {
    const KUBELET_LABELS: [&str; 11] = [
        "kubernetes.io/hostname",
        "failure-domain.beta.kubernetes.io/zone",
        "failure-domain.beta.kubernetes.io/region",
        "topology.kubernetes.io/zone",
        "topology.kubernetes.io/region",
        "beta.kubernetes.io/instance-type",
        "node.kubernetes.io/instance-type",
        "kubernetes.io/os",
        "kubernetes.io/arch",
        "beta.kubernetes.io/os",
        "beta.kubernetes.io/arch",
    ];
    let namespace = key.split_once('/').map_or("", |(ns, _)| ns);
    let in_namespace = |ns: &str| namespace == ns || namespace.ends_with(&format!(".{ns}"));
    if in_namespace("node-restriction.kubernetes.io") {
        return false;
    }
    let kubernetes = in_namespace("kubernetes.io") || in_namespace("k8s.io");
    if !kubernetes {
        return true;
    }
    KUBELET_LABELS.contains(&key)
        || in_namespace("kubelet.kubernetes.io")
        || in_namespace("node.kubernetes.io")
}

/// Why the node-pool flags were rejected. Each message names the rule or flag.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NodePoolError {
    /// A rule is not `KEY=VALUE:ipv4=N,ipv6=M`.
    #[error("{origin} {text:?}: {reason}")]
    RuleSyntax {
        /// Where it was written.
        origin: RuleOrigin,
        /// The rule as written.
        text: String,
        /// What is wrong.
        reason: String,
    },
    /// A mask size (of a rule or the label range) is coarser than the cluster prefix or finer
    /// than the finest grid (cluster prefix + 24 bits, at most the address width).
    #[error(
        "{what}: /{mask} does not fit cluster CIDR {cluster_cidr}: a node CIDR mask size must be between {} and {finest}",
        cluster_cidr.prefix_len()
    )]
    MaskOutOfRange {
        /// The rule (origin and text) or flag.
        what: String,
        /// The size given, bits.
        mask: u8,
        /// The cluster CIDR of that family.
        cluster_cidr: Cidr,
        /// The finest allowed, bits.
        finest: u8,
    },
    /// A rule or the label range sets a size for a family without a cluster CIDR.
    #[error("{what} sets an {family} size but no {family} --cluster-cidr is configured")]
    FamilyNotConfigured {
        /// The rule (origin and text) or flag.
        what: String,
        /// The family.
        family: Family,
    },
    /// `--node-mask-label-range` without `--allow-node-mask-label`.
    #[error("--node-mask-label-range has no effect without --allow-node-mask-label")]
    LabelRangeWithoutLabels,
    /// Rules or mask labels with the range allocator.
    #[error(
        "{flag} needs --cidr-allocator-type=CloudAllocator (the RangeAllocator gives every Node the same size)"
    )]
    NeedsCloudAllocator {
        /// The flag given.
        flag: &'static str,
    },
    /// The rules file could not be read.
    #[error("--node-cidr-mask-size-rules-file {}: {source}", path.display())]
    ReadRulesFile {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
}

/// Sizes per family as parsed from `ipv4=…,ipv6=…`.
struct FamilyList<T> {
    ipv4: Option<T>,
    ipv6: Option<T>,
}

/// Parses `ipv4=A,ipv6=B` (each at most once, at least one) with `value` for A and B.
fn parse_family_list<T>(
    text: &str,
    value: impl Fn(&str) -> Result<T, String>,
) -> Result<FamilyList<T>, String> {
    let mut list = FamilyList {
        ipv4: None,
        ipv6: None,
    };
    if text.is_empty() {
        return Err("expected ipv4=N and/or ipv6=M after the ':'".to_owned());
    }
    for entry in text.split(',') {
        let (family, raw) = entry
            .split_once('=')
            .ok_or_else(|| format!("{entry:?} is not ipv4=N or ipv6=M"))?;
        let slot = match family {
            "ipv4" => &mut list.ipv4,
            "ipv6" => &mut list.ipv6,
            _ => return Err(format!("{family:?} is not a family: use ipv4 or ipv6")),
        };
        if slot.is_some() {
            return Err(format!("{family} is given twice"));
        }
        *slot = Some(value(raw)?);
    }
    Ok(list)
}

/// A mask size: 1–3 decimal digits, at most 128.
fn parse_mask_size(text: &str) -> Result<u8, String> {
    let bad = || format!("{text:?} is not a mask size (decimal bits, 0–128)");
    if text.is_empty() || text.len() > 3 || !text.bytes().all(|b| b.is_ascii_digit()) {
        return Err(bad());
    }
    match text.parse::<u8>() {
        Ok(bits) if bits <= 128 => Ok(bits),
        _ => Err(bad()),
    }
}

#[cfg(test)]
mod tests;
