//! The differential against upstream: kube-controller-manager's own allocator
//! (`k8s.io/kubernetes/pkg/controller/nodeipam/ipam/cidrset`, at the release `tests/upstream/go.mod`
//! pins) and `nodeipam-core`'s [`CidrSet`](nodeipam_core::CidrSet) answer the same seeded
//! sequences of requests, and every answer must be the same — except where one row of
//! [`INTENDED`] says why not.
//!
//! - [`protocol`]: the line protocol both drivers speak (`new CIDR MASK`, `alloc`, `occupy CIDR`,
//!   `release CIDR`; answers carry the CIDR or error class, the allocated count and the
//!   allocation's tries, from which the next-candidate cursor follows);
//! - [`core_driver`]: our half, over `nodeipam-core` (also the bin `nodeipam-cidrset-driver`);
//!   upstream's half is the Go program `tests/upstream/cmd/cidrset-driver`;
//! - [`generate`](mod@generate): seed → sequence (both families, 2^0…2^24 blocks, boundary prefixes, host bits,
//!   out-of-range / other-family / supernet / sub-block CIDRs, exhaustion bursts, churn on full
//!   sets);
//! - [`divergence`]: the table of intended divergences, one row each, with its reason;
//! - [`compare`](mod@compare): the comparison of two answer streams and the shrinker (drop requests while the
//!   sequence still diverges);
//! - [`upstream`]: runs the Go driver, one long-lived process per batch of sequences.
//!
//! The test target is `upstream_differential` (`tests/tests/upstream_differential.rs`); how to
//! run it and what it found is in RELIABILITY.md, "Differential against upstream's cidrset".

pub mod compare;
pub mod core_driver;
pub mod divergence;
pub mod generate;
pub mod protocol;
pub mod upstream;

pub use compare::{Outcome, compare, run_and_compare, shrink};
pub use core_driver::CoreDriver;
pub use divergence::{Divergence, INTENDED};
pub use generate::generate;
pub use protocol::Op;
pub use upstream::{UpstreamDriver, UpstreamError};
