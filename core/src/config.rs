//! Validation of kube-controller-manager's node IPAM flags: `--cluster-cidr`,
//! `--node-cidr-mask-size[-ipv4|-ipv6]` and `--service-cluster-ip-range`.
//!
//! Pure functions over the flag text; no allocation (`heapless::Vec`s: at most
//! [`MAX_CLUSTER_CIDRS`] cluster CIDRs, at most 2 service CIDRs).
//!
//! Where we differ from kube-controller-manager: `--cluster-cidr` may list several CIDRs per
//! family (kcm refuses more than one per family). They are used in the order given, a later one
//! only when the earlier ones of its family are full ([`crate::Pool::allocate_node_blocks`]);
//! CIDRs of one family must not overlap. The family of the first entry is the family of every
//! Node's `spec.podCIDR`. The node mask size flags apply per family, to every CIDR of it, with
//! kcm's rules: dual-stack (both families present, however many CIDRs each) refuses
//! `--node-cidr-mask-size` and reads `--node-cidr-mask-size-ipv4` / `-ipv6`; single-stack (one
//! family) reads `--node-cidr-mask-size` or its own family's flag.

use core::fmt;

use heapless::Vec;

use crate::cidr::{Cidr, Family};
use crate::cidr_set::MAX_BLOCK_BITS;
use crate::error::CidrError;

/// Default node CIDR mask size for IPv4 cluster CIDRs, in bits (kube-controller-manager: 24).
pub const DEFAULT_NODE_MASK_SIZE_IPV4: u8 = 24;
/// Default node CIDR mask size for IPv6 cluster CIDRs, in bits (kube-controller-manager: 64).
pub const DEFAULT_NODE_MASK_SIZE_IPV6: u8 = 64;

/// The most `--cluster-cidr` entries accepted, both families together (e.g. 4 IPv4 and 4 IPv6, or
/// 7 IPv4 and 1 IPv6). A fixed capacity because the core does not allocate: the configuration and
/// the shell's [`crate::Pool`] hold at most this many sets. kube-controller-manager accepts 2.
pub const MAX_CLUSTER_CIDRS: usize = 8;

/// `::ffff:0:0/96`, the IPv4-mapped IPv6 range (RFC 4291 §2.5.5.2).
const IPV4_MAPPED: Cidr = Cidr::from_parts(Family::V6, 0xffff_0000_0000, 96);

/// The node mask size flags as given; `None` (or `Some(0)`, kube-controller-manager's "unset")
/// means not given.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct NodeMaskFlags {
    /// `--node-cidr-mask-size` (single-stack only), bits.
    pub node_cidr_mask_size: Option<u8>,
    /// `--node-cidr-mask-size-ipv4`, bits.
    pub node_cidr_mask_size_ipv4: Option<u8>,
    /// `--node-cidr-mask-size-ipv6`, bits.
    pub node_cidr_mask_size_ipv6: Option<u8>,
}

/// One validated cluster CIDR with its node mask size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
pub struct ClusterCidrConfig {
    /// The cluster CIDR (host bits cleared).
    pub cluster_cidr: Cidr,
    /// The node CIDR mask size for it, in bits.
    pub node_mask_size: u8,
    /// Whether the flag text had host bits set (`10.0.0.1/8`): accepted as upstream does, but
    /// worth a warning.
    pub host_bits_were_set: bool,
}

impl ClusterCidrConfig {
    /// Number of node blocks: 2^(node mask size − cluster prefix length), clamped to 1 ..= 2^24
    /// (the fields are public, so a hand-built value may be out of range; this never panics).
    pub fn block_count(&self) -> u32 {
        1u32 << self
            .node_mask_size
            .saturating_sub(self.cluster_cidr.prefix_len())
            .min(MAX_BLOCK_BITS)
    }
}

/// A validated node IPAM configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpamConfig {
    /// 1 ..= [`MAX_CLUSTER_CIDRS`] cluster CIDRs, flag order (the first is the family of
    /// `spec.podCIDR`; within a family, the order they are used in). No two overlap.
    pub cluster_cidrs: Vec<ClusterCidrConfig, MAX_CLUSTER_CIDRS>,
    /// Zero, one or two service CIDRs (different families), host bits cleared.
    pub service_cidrs: Vec<Cidr, 2>,
}

impl IpamConfig {
    /// Whether cluster CIDRs of both families are configured.
    pub fn is_dual_stack(&self) -> bool {
        let first = self.cluster_cidrs.first().map(|c| c.cluster_cidr.family());
        self.cluster_cidrs
            .iter()
            .any(|c| Some(c.cluster_cidr.family()) != first)
    }
}

/// A configuration error: names the flag and says how to fix it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum ConfigError {
    /// `--cluster-cidr` is empty while CIDR allocation is on.
    ClusterCidrMissing,
    /// An entry of `--cluster-cidr` is not a CIDR.
    ClusterCidrInvalid {
        /// 0-based position in the comma list.
        index: u8,
        /// Why.
        error: CidrError,
    },
    /// A `--cluster-cidr` entry overlaps the IPv4-mapped IPv6 range `::ffff:0:0/96`: Kubernetes
    /// treats such addresses as IPv4 in some places and IPv6 in others, so they are refused.
    ClusterCidrIpv4Mapped {
        /// 0-based position in the comma list.
        index: u8,
    },
    /// More than [`MAX_CLUSTER_CIDRS`] `--cluster-cidr` entries.
    TooManyClusterCidrs {
        /// How many were given.
        count: usize,
    },
    /// Two `--cluster-cidr` entries overlap (they are necessarily of one family).
    ClusterCidrsOverlap {
        /// 0-based position of the earlier entry in the comma list.
        first_index: u8,
        /// The earlier entry (host bits cleared).
        first: Cidr,
        /// 0-based position of the later entry.
        second_index: u8,
        /// The later entry (host bits cleared).
        second: Cidr,
    },
    /// `--node-cidr-mask-size` with two cluster CIDRs.
    SingleMaskWithDualStack,
    /// `--node-cidr-mask-size` together with a per-family flag on a single-stack cluster.
    SingleMaskWithFamilyMask,
    /// A per-family mask flag that does not match a single-stack cluster's family.
    FamilyMaskForOtherFamily {
        /// The flag's family (`--node-cidr-mask-size-ipv4` is V4).
        flag_family: Family,
    },
    /// The node mask size is shorter than the cluster prefix or longer than the address.
    NodeMaskSizeOutOfRange {
        /// The flag that set it, or the flag to set when the default applied (`defaulted`):
        /// `--node-cidr-mask-size` single-stack, the family's flag dual-stack.
        flag: &'static str,
        /// No flag gave a size (or only `0`, which means "the default"): the default applied.
        defaulted: bool,
        /// The node mask size, bits.
        node_mask_size: u8,
        /// The cluster CIDR it applies to.
        cluster_cidr: Cidr,
    },
    /// The node mask size cuts the cluster CIDR into more than 2^24 blocks.
    NodeMaskSizeTooManyBlocks {
        /// The flag that set it, or the flag to set when the default applied (`defaulted`):
        /// `--node-cidr-mask-size` single-stack, the family's flag dual-stack.
        flag: &'static str,
        /// No flag gave a size (or only `0`, which means "the default"): the default applied.
        defaulted: bool,
        /// The node mask size, bits.
        node_mask_size: u8,
        /// The cluster CIDR it applies to.
        cluster_cidr: Cidr,
    },
    /// An entry of a comma list (`--cluster-cidr`, `--service-cluster-ip-range`) is empty: a
    /// leading or trailing comma, or two in a row (`a,,b`). kube-controller-manager refuses it too
    /// (`netutils.ParseCIDRs` fails on the empty string); this says where.
    EmptyEntry {
        /// The flag, e.g. `--cluster-cidr`.
        flag: &'static str,
        /// 0-based position in the comma list.
        index: u8,
        /// How many entries the list has, the empty ones included.
        count: usize,
    },
    /// An entry of `--service-cluster-ip-range` is not a CIDR.
    ServiceCidrInvalid {
        /// 0-based position in the comma list.
        index: u8,
        /// Why.
        error: CidrError,
    },
    /// More than two `--service-cluster-ip-range` entries.
    TooManyServiceCidrs {
        /// How many were given.
        count: usize,
    },
    /// Two `--service-cluster-ip-range` entries of the same family.
    ServiceCidrsNotDualStack {
        /// The family both have.
        family: Family,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::ClusterCidrMissing => f.write_str(
                "--cluster-cidr is required when --allocate-node-cidrs=true: give one CIDR, or several separated by commas (at most 8; both families for dual-stack)",
            ),
            ConfigError::ClusterCidrInvalid { index, error } => write!(
                f,
                "--cluster-cidr entry {} is invalid ({error}); write e.g. --cluster-cidr=10.244.0.0/16,fd00:10:244::/56",
                index + 1
            ),
            ConfigError::EmptyEntry { flag, index, count } => {
                let position = if usize::from(*index) + 1 == *count {
                    "a trailing comma"
                } else if *index == 0 {
                    "a leading comma"
                } else {
                    "two commas in a row"
                };
                write!(
                    f,
                    "{flag} entry {} of {count} is empty ({position}); remove it",
                    index + 1
                )
            }
            ConfigError::ClusterCidrIpv4Mapped { index } => write!(
                f,
                "--cluster-cidr entry {} overlaps the IPv4-mapped IPv6 range ::ffff:0:0/96; write an IPv4 range as IPv4 (e.g. 10.244.0.0/16) and pick an IPv6 range outside it",
                index + 1
            ),
            ConfigError::TooManyClusterCidrs { count } => write!(
                f,
                "--cluster-cidr has {count} entries; at most {MAX_CLUSTER_CIDRS} are allowed (IPv4 and IPv6 together)"
            ),
            ConfigError::ClusterCidrsOverlap {
                first_index,
                first,
                second_index,
                second,
            } => write!(
                f,
                "--cluster-cidr entries {} ({first}) and {} ({second}) overlap; the CIDRs of a family must be disjoint (each is used in turn, in the order given)",
                first_index + 1,
                second_index + 1
            ),
            ConfigError::SingleMaskWithDualStack => f.write_str(
                "--node-cidr-mask-size is not allowed with a dual-stack --cluster-cidr; use --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6",
            ),
            ConfigError::SingleMaskWithFamilyMask => f.write_str(
                "--node-cidr-mask-size cannot be combined with --node-cidr-mask-size-ipv4 or --node-cidr-mask-size-ipv6; set only one of them",
            ),
            ConfigError::FamilyMaskForOtherFamily { flag_family } => {
                let (flag, cluster) = match flag_family {
                    Family::V4 => ("--node-cidr-mask-size-ipv4", "IPv6"),
                    Family::V6 => ("--node-cidr-mask-size-ipv6", "IPv4"),
                };
                write!(
                    f,
                    "{flag} is not allowed for a single-stack {cluster} --cluster-cidr; use --node-cidr-mask-size"
                )
            }
            ConfigError::NodeMaskSizeOutOfRange { .. }
            | ConfigError::NodeMaskSizeTooManyBlocks { .. } => self.fmt_node_mask_size(f),
            ConfigError::ServiceCidrInvalid { index, error } => write!(
                f,
                "--service-cluster-ip-range entry {} is invalid ({error}); write e.g. --service-cluster-ip-range=10.96.0.0/12",
                index + 1
            ),
            ConfigError::TooManyServiceCidrs { count } => write!(
                f,
                "--service-cluster-ip-range has {count} entries; at most 2 are allowed (one IPv4 and one IPv6)"
            ),
            ConfigError::ServiceCidrsNotDualStack { family } => write!(
                f,
                "--service-cluster-ip-range has two {family} entries; two entries must be one IPv4 and one IPv6"
            ),
        }
    }
}

impl ConfigError {
    /// The message of [`ConfigError::NodeMaskSizeOutOfRange`] and
    /// [`ConfigError::NodeMaskSizeTooManyBlocks`]: the flag (or the default) and the valid range.
    fn fmt_node_mask_size(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NodeMaskSizeOutOfRange {
                flag,
                defaulted,
                node_mask_size,
                cluster_cidr,
            } => {
                // The valid range: the cluster prefix up to the address width, and at most 2^24
                // blocks (MAX_BLOCK_BITS past the prefix).
                let (low, high) = node_mask_size_range(cluster_cidr);
                if *defaulted {
                    write!(
                        f,
                        "the default node CIDR mask size /{node_mask_size} does not fit --cluster-cidr {cluster_cidr}: set {flag} between {low} and {high}"
                    )
                } else {
                    write!(
                        f,
                        "{flag}={node_mask_size} does not fit --cluster-cidr {cluster_cidr}: it must be between {low} and {high}"
                    )
                }
            }
            ConfigError::NodeMaskSizeTooManyBlocks {
                flag,
                defaulted,
                node_mask_size,
                cluster_cidr,
            } => {
                if *defaulted {
                    write!(f, "the default node CIDR mask size /{node_mask_size}")?;
                } else {
                    write!(f, "{flag}={node_mask_size}")?;
                }
                let (low, high) = node_mask_size_range(cluster_cidr);
                write!(
                    f,
                    " cuts --cluster-cidr {cluster_cidr} into 2^{} node CIDRs; at most 2^24 are supported: set {flag} between {low} and {high}",
                    node_mask_size.saturating_sub(cluster_cidr.prefix_len()),
                )
            }
            _ => Ok(()),
        }
    }
}

/// The node mask sizes `cluster_cidr` accepts, bits: from its prefix length to the address
/// width, and at most [`MAX_BLOCK_BITS`] past the prefix (2^24 blocks).
fn node_mask_size_range(cluster_cidr: &Cidr) -> (u8, u8) {
    let low = cluster_cidr.prefix_len();
    let high = low
        .saturating_add(MAX_BLOCK_BITS)
        .min(cluster_cidr.family().max_prefix_len());
    (low, high)
}

impl core::error::Error for ConfigError {}

/// A comma list of at most `N` CIDRs, parsed upstream-style (host bits cleared, reported).
/// Each entry is read with [`Cidr::parse_sloppy`], as kube-controller-manager reads these flags
/// (`netutils.ParseCIDRs` → `ParseCIDRSloppy`): `010.0.0.0/16` is 10.0.0.0/16, leading zeros read
/// as decimal. An empty entry is refused ([`ConfigError::EmptyEntry`]), as kube-controller-manager's `ParseCIDRs`.
/// Why a comma list was rejected: the entry count, and the first bad entry (index, cause) if the
/// count itself was fine; the cause is `None` for an empty entry.
type ListError = (usize, Option<(u8, Option<CidrError>)>);

fn parse_cidr_list<const N: usize>(text: &str) -> Result<Vec<(Cidr, bool), N>, ListError> {
    let count = text.split(',').count();
    if count > N {
        return Err((count, None));
    }
    let mut out = Vec::new();
    for (index, entry) in text.split(',').enumerate() {
        if entry.trim().is_empty() {
            return Err((count, Some((index as u8, None))));
        }
        match Cidr::parse_sloppy(entry.trim()) {
            Ok(parsed) => {
                let _ = out.push(parsed);
            }
            Err(error) => return Err((count, Some((index as u8, Some(error))))),
        }
    }
    Ok(out)
}

/// Validates `--cluster-cidr` (comma list): 1 ..= [`MAX_CLUSTER_CIDRS`] CIDRs of either family,
/// no two overlapping (kube-controller-manager takes at most one per family; see the module
/// docs). Host bits are cleared and reported per entry.
///
/// # Errors
/// [`ConfigError::ClusterCidrMissing`], [`ConfigError::ClusterCidrInvalid`],
/// [`ConfigError::EmptyEntry`], [`ConfigError::TooManyClusterCidrs`], [`ConfigError::ClusterCidrIpv4Mapped`],
/// [`ConfigError::ClusterCidrsOverlap`] (the first overlapping pair, by the later entry's
/// position).
pub fn parse_cluster_cidrs(
    text: &str,
) -> Result<Vec<(Cidr, bool), MAX_CLUSTER_CIDRS>, ConfigError> {
    if text.trim().is_empty() {
        return Err(ConfigError::ClusterCidrMissing);
    }
    let list = parse_cidr_list(text).map_err(|(count, error)| match error {
        Some((index, Some(error))) => ConfigError::ClusterCidrInvalid { index, error },
        Some((index, None)) => ConfigError::EmptyEntry {
            flag: "--cluster-cidr",
            index,
            count,
        },
        None => ConfigError::TooManyClusterCidrs { count },
    })?;
    for (index, (cidr, _)) in list.iter().enumerate() {
        if IPV4_MAPPED.overlaps(cidr) {
            return Err(ConfigError::ClusterCidrIpv4Mapped { index: index as u8 });
        }
    }
    for (second_index, (second, _)) in list.iter().enumerate() {
        let earlier = list.iter().take(second_index).enumerate();
        if let Some((first_index, (first, _))) =
            earlier.into_iter().find(|(_, (c, _))| c.overlaps(second))
        {
            return Err(ConfigError::ClusterCidrsOverlap {
                first_index: first_index as u8,
                first: *first,
                second_index: second_index as u8,
                second: *second,
            });
        }
    }
    Ok(list)
}

/// Validates `--service-cluster-ip-range` (comma list; empty = none): at most 2 CIDRs, two must be
/// of different families. Host bits are cleared.
///
/// # Errors
/// [`ConfigError::ServiceCidrInvalid`], [`ConfigError::EmptyEntry`], [`ConfigError::TooManyServiceCidrs`],
/// [`ConfigError::ServiceCidrsNotDualStack`].
pub fn parse_service_cidrs(text: &str) -> Result<Vec<Cidr, 2>, ConfigError> {
    if text.trim().is_empty() {
        return Ok(Vec::new());
    }
    let list = parse_cidr_list::<2>(text).map_err(|(count, error)| match error {
        Some((index, Some(error))) => ConfigError::ServiceCidrInvalid { index, error },
        Some((index, None)) => ConfigError::EmptyEntry {
            flag: "--service-cluster-ip-range",
            index,
            count,
        },
        None => ConfigError::TooManyServiceCidrs { count },
    })?;
    if let [(a, _), (b, _)] = list.as_slice()
        && a.family() == b.family()
    {
        return Err(ConfigError::ServiceCidrsNotDualStack { family: a.family() });
    }
    let mut out = Vec::new();
    for (cidr, _) in list {
        let _ = out.push(cidr);
    }
    Ok(out)
}

/// Picks the node mask size for each cluster CIDR from the flags, exactly as kube-controller-manager's
/// `setNodeCIDRMaskSizes` does: dual-stack rejects `--node-cidr-mask-size` and uses the per-family
/// flags (defaults 24 and 64); single-stack uses `--node-cidr-mask-size`, or the flag of its own
/// family, and rejects the other family's flag or a mix. Dual-stack means both families present
/// (however many CIDRs each); a family's size applies to every CIDR of it. Then checks each size
/// against its cluster CIDR: cluster prefix ≤ mask ≤ 32/128 and at most 2^24 blocks.
///
/// Returns `(mask size, flag that set it)` per cluster CIDR, in the same order.
///
/// # Errors
/// [`ConfigError::SingleMaskWithDualStack`], [`ConfigError::SingleMaskWithFamilyMask`],
/// [`ConfigError::FamilyMaskForOtherFamily`], [`ConfigError::NodeMaskSizeOutOfRange`],
/// [`ConfigError::NodeMaskSizeTooManyBlocks`].
pub fn resolve_node_mask_sizes(
    cluster_cidrs: &[Cidr],
    flags: NodeMaskFlags,
) -> Result<Vec<(u8, &'static str), MAX_CLUSTER_CIDRS>, ConfigError> {
    let given = |v: Option<u8>| v.filter(|&m| m != 0);
    let single = given(flags.node_cidr_mask_size);
    let v4 = given(flags.node_cidr_mask_size_ipv4);
    let v6 = given(flags.node_cidr_mask_size_ipv6);
    let first_family = cluster_cidrs.first().map(Cidr::family);
    let dual_stack = cluster_cidrs
        .iter()
        .any(|c| Some(c.family()) != first_family);
    // (size, flag that set it or is to be set, whether the default applied)
    let mut v4_choice = (
        DEFAULT_NODE_MASK_SIZE_IPV4,
        "--node-cidr-mask-size-ipv4",
        true,
    );
    let mut v6_choice = (
        DEFAULT_NODE_MASK_SIZE_IPV6,
        "--node-cidr-mask-size-ipv6",
        true,
    );
    if dual_stack {
        if single.is_some() {
            return Err(ConfigError::SingleMaskWithDualStack);
        }
        if let Some(m) = v4 {
            v4_choice = (m, v4_choice.1, false);
        }
        if let Some(m) = v6 {
            v6_choice = (m, v6_choice.1, false);
        }
    } else {
        let single_family = first_family;
        // Single-stack, the flag to name for a default is the generic one.
        v4_choice.1 = "--node-cidr-mask-size";
        v6_choice.1 = "--node-cidr-mask-size";
        if let Some(m) = single {
            if v4.is_some() || v6.is_some() {
                return Err(ConfigError::SingleMaskWithFamilyMask);
            }
            v4_choice = (m, "--node-cidr-mask-size", false);
            v6_choice = (m, "--node-cidr-mask-size", false);
        } else {
            if let Some(m) = v4 {
                if single_family == Some(Family::V6) {
                    return Err(ConfigError::FamilyMaskForOtherFamily {
                        flag_family: Family::V4,
                    });
                }
                v4_choice = (m, "--node-cidr-mask-size-ipv4", false);
            }
            if let Some(m) = v6 {
                if single_family == Some(Family::V4) {
                    return Err(ConfigError::FamilyMaskForOtherFamily {
                        flag_family: Family::V6,
                    });
                }
                v6_choice = (m, "--node-cidr-mask-size-ipv6", false);
            }
        }
    }
    let mut out = Vec::new();
    for cluster_cidr in cluster_cidrs.iter().take(MAX_CLUSTER_CIDRS) {
        let (node_mask_size, flag, defaulted) = match cluster_cidr.family() {
            Family::V4 => v4_choice,
            Family::V6 => v6_choice,
        };
        if node_mask_size < cluster_cidr.prefix_len()
            || node_mask_size > cluster_cidr.family().max_prefix_len()
        {
            return Err(ConfigError::NodeMaskSizeOutOfRange {
                flag,
                defaulted,
                node_mask_size,
                cluster_cidr: *cluster_cidr,
            });
        }
        if node_mask_size - cluster_cidr.prefix_len() > MAX_BLOCK_BITS {
            return Err(ConfigError::NodeMaskSizeTooManyBlocks {
                flag,
                defaulted,
                node_mask_size,
                cluster_cidr: *cluster_cidr,
            });
        }
        let _ = out.push((node_mask_size, flag));
    }
    Ok(out)
}

/// Validates the whole node IPAM configuration: `--cluster-cidr` text, `--service-cluster-ip-range`
/// text (empty for none) and the node mask flags.
///
/// # Errors
/// Any [`ConfigError`] from [`parse_cluster_cidrs`], [`parse_service_cidrs`] or
/// [`resolve_node_mask_sizes`].
pub fn validate(
    cluster_cidr_flag: &str,
    service_cidr_flag: &str,
    mask_flags: NodeMaskFlags,
) -> Result<IpamConfig, ConfigError> {
    let clusters = parse_cluster_cidrs(cluster_cidr_flag)?;
    let mut cidrs: Vec<Cidr, MAX_CLUSTER_CIDRS> = Vec::new();
    for (cidr, _) in &clusters {
        let _ = cidrs.push(*cidr);
    }
    let masks = resolve_node_mask_sizes(&cidrs, mask_flags)?;
    let service_cidrs = parse_service_cidrs(service_cidr_flag)?;
    let mut cluster_cidrs = Vec::new();
    for ((cluster_cidr, host_bits_were_set), (node_mask_size, _)) in clusters.iter().zip(masks) {
        let _ = cluster_cidrs.push(ClusterCidrConfig {
            cluster_cidr: *cluster_cidr,
            node_mask_size,
            host_bits_were_set: *host_bits_were_set,
        });
    }
    Ok(IpamConfig {
        cluster_cidrs,
        service_cidrs,
    })
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::string::ToString;

    fn flags(single: Option<u8>, v4: Option<u8>, v6: Option<u8>) -> NodeMaskFlags {
        NodeMaskFlags {
            node_cidr_mask_size: single,
            node_cidr_mask_size_ipv4: v4,
            node_cidr_mask_size_ipv6: v6,
        }
    }

    fn masks(cluster: &str, f: NodeMaskFlags) -> Result<std::vec::Vec<u8>, ConfigError> {
        validate(cluster, "", f).map(|c| c.cluster_cidrs.iter().map(|c| c.node_mask_size).collect())
    }

    /// kube-controller-manager's setNodeCIDRMaskSizes table.
    #[test]
    fn node_mask_sizes_follow_upstream() {
        let none = flags(None, None, None);
        assert_eq!(masks("10.0.0.0/8", none), Ok([24].into()));
        assert_eq!(masks("fd00::/48", none), Ok([64].into()));
        assert_eq!(masks("10.0.0.0/8,fd00::/48", none), Ok([24, 64].into()));
        assert_eq!(masks("fd00::/48,10.0.0.0/8", none), Ok([64, 24].into()));
        assert_eq!(
            masks("10.0.0.0/8", flags(Some(26), None, None)),
            Ok([26].into())
        );
        assert_eq!(
            masks("fd00::/56", flags(Some(0), None, Some(80))),
            Ok([80].into())
        );
        assert_eq!(
            masks("10.0.0.0/8", flags(None, Some(25), None)),
            Ok([25].into())
        );
        assert_eq!(
            masks("10.0.0.0/8,fd00::/48", flags(None, Some(25), Some(72))),
            Ok([25, 72].into())
        );
        assert_eq!(
            masks("10.0.0.0/8,fd00::/48", flags(Some(24), None, None)),
            Err(ConfigError::SingleMaskWithDualStack)
        );
        assert_eq!(
            masks("10.0.0.0/8", flags(Some(24), Some(24), None)),
            Err(ConfigError::SingleMaskWithFamilyMask)
        );
        assert_eq!(
            masks("fd00::/48", flags(None, Some(24), None)),
            Err(ConfigError::FamilyMaskForOtherFamily {
                flag_family: Family::V4
            })
        );
        assert_eq!(
            masks("10.0.0.0/8", flags(None, None, Some(64))),
            Err(ConfigError::FamilyMaskForOtherFamily {
                flag_family: Family::V6
            })
        );
    }

    /// kube-controller-manager reads `--cluster-cidr` and `--service-cluster-ip-range` with
    /// `ParseCIDRSloppy`: leading zeros are decimal, so `010.0.0.0/16` starts at 10.0.0.0.
    #[test]
    fn flag_cidrs_take_leading_zeros_as_kcm_does() {
        let none = flags(None, None, None);
        let config = validate("010.0.0.0/16,fd00:0010::/0048", "010.96.0.0/12", none).unwrap();
        let clusters: std::vec::Vec<std::string::String> = config
            .cluster_cidrs
            .iter()
            .map(|c| c.cluster_cidr.to_string())
            .collect();
        assert_eq!(clusters, ["10.0.0.0/16", "fd00:10::/48"]);
        assert_eq!(
            config
                .service_cidrs
                .iter()
                .map(|c| c.to_string())
                .collect::<std::vec::Vec<_>>(),
            ["10.96.0.0/12"]
        );
        // Still refused: an octet over 255, a group over ffff.
        assert!(validate("256.0.0.0/16", "", none).is_err());
        assert!(validate("fd00:10000::/48", "", none).is_err());
    }

    #[test]
    fn errors_name_the_flag() {
        let cases: &[(&str, &str, NodeMaskFlags, ConfigError, &str)] = &[
            (
                "",
                "",
                flags(None, None, None),
                ConfigError::ClusterCidrMissing,
                "--cluster-cidr",
            ),
            (
                "10.0.0.0/8,garbage",
                "",
                flags(None, None, None),
                ConfigError::ClusterCidrInvalid {
                    index: 1,
                    error: CidrError::Syntax,
                },
                "--cluster-cidr entry 2",
            ),
            (
                // Two of one family are accepted now (kcm refuses them), but not overlapping.
                "10.0.0.0/8,10.1.0.0/16",
                "",
                flags(None, None, None),
                ConfigError::ClusterCidrsOverlap {
                    first_index: 0,
                    first: Cidr::parse("10.0.0.0/8").unwrap(),
                    second_index: 1,
                    second: Cidr::parse("10.1.0.0/16").unwrap(),
                },
                "--cluster-cidr entries 1 (10.0.0.0/8) and 2 (10.1.0.0/16) overlap",
            ),
            (
                "10.244.0.0/16,fd00::/48,10.245.0.0/16,fd00:0:1::/48,10.244.128.1/17",
                "",
                flags(None, None, None),
                ConfigError::ClusterCidrsOverlap {
                    first_index: 0,
                    first: Cidr::parse("10.244.0.0/16").unwrap(),
                    second_index: 4,
                    second: Cidr::parse("10.244.128.0/17").unwrap(),
                },
                "--cluster-cidr entries 1 (10.244.0.0/16) and 5 (10.244.128.0/17) overlap",
            ),
            (
                "10.0.0.0/16,10.1.0.0/16,10.2.0.0/16,10.3.0.0/16,10.4.0.0/16,10.5.0.0/16,10.6.0.0/16,10.7.0.0/16,fd00::/48",
                "",
                flags(None, None, None),
                ConfigError::TooManyClusterCidrs { count: 9 },
                "--cluster-cidr has 9 entries; at most 8 are allowed",
            ),
            (
                "10.0.0.0/16",
                "",
                flags(Some(8), None, None),
                ConfigError::NodeMaskSizeOutOfRange {
                    flag: "--node-cidr-mask-size",
                    defaulted: false,
                    node_mask_size: 8,
                    cluster_cidr: Cidr::parse("10.0.0.0/16").unwrap(),
                },
                "--node-cidr-mask-size=8",
            ),
            (
                "fd00::/32",
                "",
                flags(None, None, None),
                ConfigError::NodeMaskSizeTooManyBlocks {
                    flag: "--node-cidr-mask-size",
                    defaulted: true,
                    node_mask_size: 64,
                    cluster_cidr: Cidr::parse("fd00::/32").unwrap(),
                },
                "the default node CIDR mask size /64 cuts --cluster-cidr fd00::/32 into 2^32 node CIDRs; at most 2^24 are supported: set --node-cidr-mask-size between 32 and 56",
            ),
            (
                "10.0.0.0/8,::ffff:10.0.0.0/104",
                "",
                flags(None, None, None),
                ConfigError::ClusterCidrIpv4Mapped { index: 1 },
                "--cluster-cidr entry 2 overlaps the IPv4-mapped",
            ),
            (
                "::/0",
                "",
                flags(None, None, Some(24)),
                ConfigError::ClusterCidrIpv4Mapped { index: 0 },
                "IPv4-mapped",
            ),
            (
                "10.0.0.0/8",
                "10.96.0.0/12,10.97.0.0/16",
                flags(None, None, None),
                ConfigError::ServiceCidrsNotDualStack { family: Family::V4 },
                "--service-cluster-ip-range",
            ),
            (
                "10.0.0.0/8",
                "10.96.0.0/33",
                flags(None, None, None),
                ConfigError::ServiceCidrInvalid {
                    index: 0,
                    error: CidrError::InvalidPrefixLen {
                        prefix_len: 33,
                        max: 32,
                    },
                },
                "--service-cluster-ip-range entry 1",
            ),
        ];
        for (cluster, service, f, want, text) in cases {
            let got = validate(cluster, service, *f).unwrap_err();
            assert_eq!(got, *want, "{cluster} / {service}");
            let message = got.to_string();
            assert!(message.contains(text), "{message:?} lacks {text:?}");
        }
    }

    /// An empty entry (a trailing comma, `a,,b`, a lone comma, blanks between commas) is refused
    /// naming the flag, its position and what it probably is, instead of "not a CIDR" (hostile-run
    /// finding: the old message named an entry the operator could not see). Checked before the
    /// overlap rule, after the count.
    #[test]
    fn empty_entries_are_named_as_such() {
        let none = flags(None, None, None);
        let cases: &[(&str, &str, ConfigError, &str)] = &[
            (
                "10.0.0.0/16,",
                "",
                ConfigError::EmptyEntry {
                    flag: "--cluster-cidr",
                    index: 1,
                    count: 2,
                },
                "--cluster-cidr entry 2 of 2 is empty (a trailing comma); remove it",
            ),
            (
                "10.0.0.0/16,,10.1.0.0/16",
                "",
                ConfigError::EmptyEntry {
                    flag: "--cluster-cidr",
                    index: 1,
                    count: 3,
                },
                "--cluster-cidr entry 2 of 3 is empty (two commas in a row); remove it",
            ),
            (
                " , 10.1.0.0/16",
                "",
                ConfigError::EmptyEntry {
                    flag: "--cluster-cidr",
                    index: 0,
                    count: 2,
                },
                "--cluster-cidr entry 1 of 2 is empty (a leading comma); remove it",
            ),
            (
                "10.0.0.0/16",
                "10.96.0.0/12,",
                ConfigError::EmptyEntry {
                    flag: "--service-cluster-ip-range",
                    index: 1,
                    count: 2,
                },
                "--service-cluster-ip-range entry 2 of 2 is empty (a trailing comma); remove it",
            ),
        ];
        for (cluster, service, want, text) in cases {
            let got = validate(cluster, service, none).unwrap_err();
            assert_eq!(got, *want, "{cluster:?} / {service:?}");
            assert_eq!(got.to_string(), *text);
        }
        // Nine entries, one empty: the count is the first thing said.
        assert_eq!(
            validate(
                "10.0.0.0/16,,10.2.0.0/16,10.3.0.0/16,10.4.0.0/16,10.5.0.0/16,10.6.0.0/16,10.7.0.0/16,10.8.0.0/16",
                "",
                none
            ),
            Err(ConfigError::TooManyClusterCidrs { count: 9 })
        );
        // Blanks around real entries are still accepted (kcm trims only the whole flag).
        assert!(validate(" 10.0.0.0/16 ,\t10.1.0.0/16", "", none).is_ok());
    }

    /// The node mask size errors name the flag the user typed, or the one to set when the default
    /// applied (single-stack: the generic one), and give the whole valid range, 2^24 cap included
    /// (`fd00::/48` takes 48 to 72, not 48 to 128).
    #[test]
    fn node_mask_size_errors_name_the_flag_and_the_capped_range() {
        let message = |cluster: &str, f: NodeMaskFlags| {
            let error = resolve_node_mask_sizes(&[Cidr::parse(cluster).unwrap()], f)
                .expect_err("out of range");
            std::format!("{error}")
        };
        assert_eq!(
            message("fd00::/48", flags(Some(40), None, None)),
            "--node-cidr-mask-size=40 does not fit --cluster-cidr fd00::/48: it must be between 48 and 72"
        );
        assert_eq!(
            message("10.0.0.0/26", flags(None, None, None)),
            "the default node CIDR mask size /24 does not fit --cluster-cidr 10.0.0.0/26: set --node-cidr-mask-size between 26 and 32"
        );
        assert_eq!(
            message("10.0.0.0/26", flags(Some(0), None, None)),
            "the default node CIDR mask size /24 does not fit --cluster-cidr 10.0.0.0/26: set --node-cidr-mask-size between 26 and 32"
        );
        assert_eq!(
            message("10.0.0.0/26", flags(None, Some(25), None)),
            "--node-cidr-mask-size-ipv4=25 does not fit --cluster-cidr 10.0.0.0/26: it must be between 26 and 32"
        );
        assert_eq!(
            message("fd00::/48", flags(Some(100), None, None)),
            "--node-cidr-mask-size=100 cuts --cluster-cidr fd00::/48 into 2^52 node CIDRs; at most 2^24 are supported: set --node-cidr-mask-size between 48 and 72"
        );
    }

    /// Several CIDRs per family (issue 18 §1): accepted up to [`MAX_CLUSTER_CIDRS`] in all, flag
    /// order kept; the family's mask flag applies to each of its CIDRs; dual-stack (both
    /// families, however many CIDRs each) keeps kcm's mask rules.
    #[test]
    fn several_cluster_cidrs_per_family() {
        let none = flags(None, None, None);
        let config = validate("10.244.0.0/16,10.245.0.0/16,fd00:10::/56", "", none).unwrap();
        let clusters: std::vec::Vec<std::string::String> = config
            .cluster_cidrs
            .iter()
            .map(|c| c.cluster_cidr.to_string())
            .collect();
        assert_eq!(clusters, ["10.244.0.0/16", "10.245.0.0/16", "fd00:10::/56"]);
        assert!(config.is_dual_stack());
        assert_eq!(
            masks("10.244.0.0/16,10.245.0.0/16,fd00:10::/56", none),
            Ok([24, 24, 64].into())
        );
        assert_eq!(
            masks(
                "10.244.0.0/16,fd00:10::/56,10.245.0.0/16",
                flags(None, Some(26), Some(80))
            ),
            Ok([26, 80, 26].into())
        );
        // Two IPv4 CIDRs are single-stack: --node-cidr-mask-size applies to both.
        let single = validate(
            "10.244.0.0/16,10.245.0.0/20",
            "",
            flags(Some(26), None, None),
        )
        .unwrap();
        assert!(!single.is_dual_stack());
        assert_eq!(
            single
                .cluster_cidrs
                .iter()
                .map(|c| c.node_mask_size)
                .collect::<std::vec::Vec<_>>(),
            [26, 26]
        );
        assert_eq!(
            masks(
                "10.244.0.0/16,10.245.0.0/16,fd00:10::/56",
                flags(Some(24), None, None)
            ),
            Err(ConfigError::SingleMaskWithDualStack)
        );
        // A family's size must fit each of its CIDRs: the one it does not fit is named.
        assert_eq!(
            masks("10.244.0.0/16,10.245.0.0/26", none),
            Err(ConfigError::NodeMaskSizeOutOfRange {
                flag: "--node-cidr-mask-size",
                defaulted: true,
                node_mask_size: 24,
                cluster_cidr: Cidr::parse("10.245.0.0/26").unwrap(),
            })
        );
        let eight = "10.0.0.0/16,10.1.0.0/16,10.2.0.0/16,10.3.0.0/16,fd00:0::/56,fd00:1::/56,fd00:2::/56,fd00:3::/56";
        assert_eq!(
            validate(eight, "", none).unwrap().cluster_cidrs.len(),
            MAX_CLUSTER_CIDRS
        );
        // Adjacent CIDRs touch but do not overlap.
        assert!(validate("10.244.0.0/16,10.245.0.0/16", "", none).is_ok());
    }

    #[test]
    fn host_bits_are_cleared_and_reported() {
        let config = validate(
            "10.244.7.1/16, fd00::/56",
            "10.96.0.1/12",
            NodeMaskFlags::default(),
        )
        .unwrap();
        assert!(config.is_dual_stack());
        assert_eq!(
            config.cluster_cidrs[0].cluster_cidr,
            Cidr::parse("10.244.0.0/16").unwrap()
        );
        assert!(config.cluster_cidrs[0].host_bits_were_set);
        assert!(!config.cluster_cidrs[1].host_bits_were_set);
        assert_eq!(
            config.service_cidrs[0],
            Cidr::parse("10.96.0.0/12").unwrap()
        );
        assert_eq!(config.cluster_cidrs[0].block_count(), 256);
        let hand_built = ClusterCidrConfig {
            cluster_cidr: Cidr::parse("10.0.0.0/16").unwrap(),
            node_mask_size: 8,
            host_bits_were_set: false,
        };
        assert_eq!(
            hand_built.block_count(),
            1,
            "out-of-range fields clamp, never panic"
        );
    }
}
