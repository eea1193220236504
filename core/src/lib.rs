//! `nodeipam-core`: the allocator behind nodeipam, a Kubernetes node IPAM controller.
//!
//! It cuts cluster CIDRs into node blocks (pod CIDRs) and tracks which are allocated, with the
//! semantics of kube-controller-manager's `nodeipam` range allocator (`cidrset`): same allocation
//! order, same occupy/release ranges, same validation of flags — plus all-or-nothing dual-stack
//! allocation and O(log₆₄ n) search.
//!
//! `#![no_std]`, no `alloc`: memory is the caller's (a `[u64; N]` array sized with
//! [`storage_words_for`], a `Vec<u64>` in a std program, or a borrowed slice), every public function
//! is total (no panics on any input) and a call that returns `Err` changes nothing.
//!
//! ```
//! use nodeipam_core::{Cidr, CidrSet, storage_words_for};
//!
//! let cluster = Cidr::parse("10.42.0.0/16").unwrap();
//! let mut set = CidrSet::new(cluster, 24, [0u64; storage_words_for(16, 24)]).unwrap();
//! set.occupy(Cidr::parse("10.42.0.0/24").unwrap()).unwrap();
//! let next = set.allocate_next().unwrap();
//! assert_eq!(next.cidr, Cidr::parse("10.42.1.0/24").unwrap());
//! assert_eq!(set.allocated_count(), 2);
//! ```
#![no_std]
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub mod cidr;
pub mod cidr_set;
pub mod config;
pub mod error;
pub mod pool;
pub mod shared;

pub use cidr::{Cidr, Family};
pub use cidr_set::{
    AlignedAllocation, Allocation, BlockAllocation, BlockRequest, CidrSet, FreeBlock,
    MAX_BLOCK_BITS, Placement, PoolRange, RangeCandidate, storage_words, storage_words_for,
};
pub use config::{
    ClusterCidrConfig, ConfigError, DEFAULT_NODE_MASK_SIZE_IPV4, DEFAULT_NODE_MASK_SIZE_IPV6,
    IpamConfig, MAX_CLUSTER_CIDRS, NodeMaskFlags,
};
pub use error::{AllocError, CidrError};
pub use pool::{NodeAllocation, NodeBlocks, Pool, Slot};
pub use shared::{PoolBusy, SharedPool};
