//! Typed errors. Every variant is a distinct cause a caller can branch on; `Display` says what was
//! wrong and, for configuration errors, which flag to change and how.

use core::fmt;

use crate::cidr::{Cidr, Family};

/// Why CIDR text or parts were rejected: defined beside [`Cidr`] (which returns it), kept
/// here as well so every error type has one home to import from.
pub use crate::cidr::CidrError;

/// Why an allocator operation (on a [`crate::CidrSet`] or a [`crate::Pool`]) failed. A call that
/// returns an error has changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[cfg_attr(feature = "defmt", derive(defmt::Format))]
#[non_exhaustive]
pub enum AllocError {
    /// Every block of this cluster CIDR is allocated (upstream's "no cidrs remaining"); for a
    /// multi-block request ([`crate::CidrSet::allocate_block`]): no aligned block of the requested
    /// size is entirely free, although smaller ones may be.
    Exhausted {
        /// The cluster CIDR that has no free block.
        cluster_cidr: Cidr,
    },
    /// The CIDR shares no address with the cluster CIDR.
    OutOfRange {
        /// The CIDR asked for.
        cidr: Cidr,
        /// The cluster CIDR it was checked against.
        cluster_cidr: Cidr,
    },
    /// The CIDR covers the whole cluster CIDR and more: it overlaps the cluster CIDR (so
    /// [`crate::Pool::check_node`] and `occupy` accept it, as upstream's `CidrSet.Occupy` does) but
    /// does not lie in it, so it cannot be kept as a node's podCIDR
    /// ([`crate::Pool::check_node_within`]).
    WiderThanClusterCidr {
        /// The CIDR asked for.
        cidr: Cidr,
        /// The cluster CIDR it is wider than.
        cluster_cidr: Cidr,
    },
    /// The CIDR's family differs from the cluster CIDR's.
    FamilyMismatch {
        /// The CIDR asked for.
        cidr: Cidr,
        /// The cluster CIDR it was checked against.
        cluster_cidr: Cidr,
    },
    /// No cluster CIDR of this CIDR's family is configured (e.g. an IPv6 podCIDR on an IPv4-only
    /// cluster).
    NoClusterCidrForFamily {
        /// The CIDR asked for.
        cidr: Cidr,
    },
    /// The node mask size is shorter than the cluster prefix or longer than the address.
    InvalidNodeMaskSize {
        /// The cluster CIDR.
        cluster_cidr: Cidr,
        /// The node CIDR mask size (prefix length, bits).
        node_mask_size: u8,
    },
    /// `node_mask_size − cluster prefix` exceeds 24: more than 2^24 blocks.
    TooManyBlocks {
        /// The cluster CIDR.
        cluster_cidr: Cidr,
        /// The node CIDR mask size (prefix length, bits).
        node_mask_size: u8,
    },
    /// The caller-supplied storage has fewer `u64` words than the set needs
    /// ([`crate::storage_words`]).
    StorageTooSmall {
        /// Words needed.
        needed_words: usize,
        /// Words supplied.
        provided_words: usize,
    },
    /// A block index at or past the set's block count.
    BlockIndexOutOfRange {
        /// The index asked for.
        block_index: u32,
        /// The number of blocks in the set.
        block_count: u32,
    },
    /// An aligned multi-block request whose prefix is shorter than the cluster prefix or longer
    /// than the node mask size.
    InvalidBlockPrefixLen {
        /// The prefix length asked for, in bits.
        prefix_len: u8,
        /// The cluster CIDR.
        cluster_cidr: Cidr,
        /// The node CIDR mask size (prefix length, bits).
        node_mask_size: u8,
    },
    /// More than two podCIDRs were given (a node has at most one per family).
    TooManyCidrs {
        /// How many were given.
        count: usize,
    },
    /// Two podCIDRs of the same family were given (a node has at most one per family), or
    /// [`crate::Pool::new`] was given two sets of one family.
    DuplicateFamily {
        /// The family given twice.
        family: Family,
    },
    /// No cluster CIDR was given to a pool.
    NoClusterCidr,
    /// A pool was asked for a different number of blocks than it has address families
    /// ([`crate::Pool::allocate_node_blocks`] takes one request per family, in the order of
    /// [`crate::Pool::families`]).
    RequestCountMismatch {
        /// Requests given.
        requests: usize,
        /// Address families of the pool (1 or 2): its set count when each family has one
        /// cluster CIDR.
        sets: usize,
    },
    /// A pool was given more cluster CIDRs than its capacity ([`crate::Pool::from_sets`]).
    TooManyClusterCidrs {
        /// How many were given.
        count: usize,
        /// The pool's capacity (its `N`).
        max: usize,
    },
    /// [`crate::Pool::splice`] was given an index past the pool's sets, or one index twice.
    InvalidSetIndex {
        /// The index.
        index: usize,
    },
    /// Two cluster CIDRs of a pool overlap ([`crate::Pool::from_sets`]): every address must
    /// belong to one set only.
    ClusterCidrsOverlap {
        /// The earlier one (flag order).
        first: Cidr,
        /// The later one.
        second: Cidr,
    },
    /// Several cluster CIDRs of `family` are configured and none has a free block of the size
    /// asked for (with one cluster CIDR in the family, [`AllocError::Exhausted`] is returned
    /// instead).
    ClusterCidrsExhausted {
        /// The family.
        family: Family,
        /// Its first cluster CIDR (flag order).
        first: Cidr,
        /// Its last cluster CIDR (flag order).
        last: Cidr,
        /// How many cluster CIDRs the family has (2 or more).
        count: u8,
    },
    /// Several cluster CIDRs of the CIDR's family are configured and the CIDR shares no address
    /// with any of them (with one cluster CIDR in the family, [`AllocError::OutOfRange`] is
    /// returned instead).
    OutsideClusterCidrs {
        /// The CIDR asked for.
        cidr: Cidr,
        /// The family's first cluster CIDR (flag order).
        first: Cidr,
        /// The family's last cluster CIDR (flag order).
        last: Cidr,
        /// How many cluster CIDRs the family has (2 or more).
        count: u8,
    },
    /// A block was requested within a pool's range with a prefix shorter than the range's: the
    /// block would not fit inside the range ([`crate::CidrSet::find_block_within`]).
    BlockLargerThanRange {
        /// The prefix length asked for, in bits.
        prefix_len: u8,
        /// The range (the pool's CIDR).
        range: Cidr,
    },
    /// A candidate from [`crate::CidrSet::find_block_within`] no longer fits: it was found for
    /// another range, or one of its blocks has been allocated since.
    StaleCandidate {
        /// The range it was offered for.
        range: Cidr,
    },
    /// A service CIDR covers every remaining block of a cluster CIDR, leaving nothing to allocate.
    ServiceCidrFillsClusterCidr {
        /// The service CIDR.
        service_cidr: Cidr,
        /// The cluster CIDR it fills.
        cluster_cidr: Cidr,
    },
}

impl fmt::Display for AllocError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AllocError::Exhausted { cluster_cidr } => {
                write!(f, "no free pod CIDR left in cluster CIDR {cluster_cidr}")
            }
            AllocError::OutOfRange { cidr, cluster_cidr } => {
                write!(f, "{cidr} is outside cluster CIDR {cluster_cidr}")
            }
            AllocError::WiderThanClusterCidr { cidr, cluster_cidr } => {
                write!(f, "{cidr} is larger than cluster CIDR {cluster_cidr}")
            }
            AllocError::FamilyMismatch { cidr, cluster_cidr } => write!(
                f,
                "{cidr} is {} but cluster CIDR {cluster_cidr} is {}",
                cidr.family(),
                cluster_cidr.family()
            ),
            AllocError::NoClusterCidrForFamily { cidr } => {
                write!(
                    f,
                    "{cidr} is {} and no {} cluster CIDR is configured",
                    cidr.family(),
                    cidr.family()
                )
            }
            AllocError::InvalidNodeMaskSize {
                cluster_cidr,
                node_mask_size,
            } => write!(
                f,
                "node CIDR mask size /{node_mask_size} must be between the cluster prefix /{} and /{}",
                cluster_cidr.prefix_len(),
                cluster_cidr.family().max_prefix_len()
            ),
            AllocError::TooManyBlocks {
                cluster_cidr,
                node_mask_size,
            } => write!(
                f,
                "cluster CIDR {cluster_cidr} cut into /{node_mask_size} blocks gives 2^{} blocks; at most 2^24 are supported",
                node_mask_size.saturating_sub(cluster_cidr.prefix_len())
            ),
            AllocError::StorageTooSmall {
                needed_words,
                provided_words,
            } => write!(
                f,
                "bitmap storage has {provided_words} words, {needed_words} are needed"
            ),
            AllocError::BlockIndexOutOfRange {
                block_index,
                block_count,
            } => write!(
                f,
                "block index {block_index} is not below the block count {block_count}"
            ),
            AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr,
                node_mask_size,
            } => write!(
                f,
                "block prefix /{prefix_len} must be between the cluster prefix /{} and the node mask /{node_mask_size}",
                cluster_cidr.prefix_len()
            ),
            AllocError::TooManyCidrs { count } => {
                write!(
                    f,
                    "{count} CIDRs given; at most 2 (one IPv4, one IPv6) are allowed"
                )
            }
            AllocError::DuplicateFamily { .. }
            | AllocError::NoClusterCidr
            | AllocError::RequestCountMismatch { .. }
            | AllocError::TooManyClusterCidrs { .. }
            | AllocError::InvalidSetIndex { .. }
            | AllocError::ClusterCidrsOverlap { .. }
            | AllocError::ClusterCidrsExhausted { .. }
            | AllocError::OutsideClusterCidrs { .. } => self.fmt_cluster_cidrs(f),
            AllocError::BlockLargerThanRange { prefix_len, range } => write!(
                f,
                "a /{prefix_len} block does not fit inside range {range}: the block's prefix must be at least /{}",
                range.prefix_len()
            ),
            AllocError::StaleCandidate { range } => write!(
                f,
                "the block found in range {range} is no longer free there; search again"
            ),
            AllocError::ServiceCidrFillsClusterCidr {
                service_cidr,
                cluster_cidr,
            } => write!(
                f,
                "service CIDR {service_cidr} covers every free block of cluster CIDR {cluster_cidr}: no pod CIDR could ever be allocated"
            ),
        }
    }
}

impl AllocError {
    /// `Display` of the errors about a pool's sets (how many, which family serves, issue 18 §1).
    fn fmt_cluster_cidrs(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // "," between two CIDRs, " …" between the first and the last of more.
        let between = |count: u8| if count == 2 { "," } else { " …" };
        match self {
            AllocError::DuplicateFamily { family } => write!(
                f,
                "two {family} CIDRs given; at most one per family is allowed"
            ),
            AllocError::NoClusterCidr => f.write_str("no cluster CIDR configured"),
            AllocError::RequestCountMismatch { requests, sets } => write!(
                f,
                "{requests} block requests given for a pool of {sets} address families; give one per family"
            ),
            AllocError::TooManyClusterCidrs { count, max } => {
                write!(f, "{count} cluster CIDRs given; a pool holds at most {max}")
            }
            AllocError::InvalidSetIndex { index } => write!(
                f,
                "set index {index} is past the pool's sets or given twice"
            ),
            AllocError::ClusterCidrsOverlap { first, second } => write!(
                f,
                "cluster CIDRs {first} and {second} overlap; each address may belong to one cluster CIDR only"
            ),
            AllocError::ClusterCidrsExhausted {
                family,
                first,
                last,
                count,
            } => write!(
                f,
                "no free pod CIDR left in any of the {count} {family} cluster CIDRs ({first}{} {last})",
                between(*count)
            ),
            AllocError::OutsideClusterCidrs {
                cidr,
                first,
                last,
                count,
            } => write!(
                f,
                "{cidr} is outside all {count} {} cluster CIDRs ({first}{} {last})",
                cidr.family(),
                between(*count)
            ),
            _ => Ok(()),
        }
    }
}

impl core::error::Error for AllocError {}
