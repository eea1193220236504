//! Every intended divergence between upstream's cidrset and ours, one row each. The comparison
//! ([`super::compare`](mod@super::compare)) accepts a different answer only when a row matches it; everything else
//! fails the test. RELIABILITY.md ("Differential against upstream's cidrset") mirrors this table;
//! a test checks that every row is named there.
//!
//! Host bits are not a row: both sides clear them (Go's `net.ParseCIDR`; our controller's
//! [`Cidr::parse_masked`](nodeipam_core::Cidr::parse_masked)), and the generator sends them in
//! about a fifth of the CIDRs.

use nodeipam_core::{Cidr, Family};

use super::protocol::Op;

/// What the comparison knows when a request's answers differ: the current set's `new` request
/// (parsed) and the request itself with both answers.
#[derive(Debug, Clone, Copy)]
pub struct Context<'a> {
    /// The cluster CIDR of the last `new`, if it parsed.
    pub cluster: Option<Cidr>,
    /// The node mask size of the last `new`, bits.
    pub node_mask: u16,
    /// The request.
    pub op: &'a Op,
    /// Our answer.
    pub ours: &'a str,
    /// Upstream's answer.
    pub upstream: &'a str,
}

/// One intended divergence.
#[derive(Debug, Clone, Copy)]
pub struct Divergence {
    /// Short name (also in RELIABILITY.md's table).
    pub name: &'static str,
    /// What upstream's cidrset does.
    pub upstream: &'static str,
    /// What nodeipam-core does.
    pub ours: &'static str,
    /// Why we differ.
    pub reason: &'static str,
    /// The two sets may hold different blocks afterwards: the rest of the sequence is not
    /// compared.
    pub ends_comparison: bool,
    /// Whether this row explains the difference in `Context`.
    pub matches: fn(&Context<'_>) -> bool,
}

/// The table. Order does not matter: at most one row matches a difference.
pub const INTENDED: &[Divergence] = &[
    Divergence {
        name: "ipv6-above-2^16-blocks",
        upstream: "refuses an IPv6 set of more than 2^16 blocks (clusterSubnetMaxDiff = 16)",
        ours: "accepts up to 2^24 blocks",
        reason: "upstream's limit comes from its uncompressed big.Int bitmap (its TODO, \
                 kubernetes#44918); our hierarchical bitmap makes 2^24 cheap, so an IPv6 /40 \
                 can be cut into /64s (README: blocks per cluster CIDR)",
        ends_comparison: true,
        matches: |c| {
            new_with_bits(c, Family::V6, 17..=24)
                && c.upstream == "err too-many-blocks"
                && c.ours.starts_with("ok blocks=")
        },
    },
    Divergence {
        name: "ipv4-above-2^24-blocks",
        upstream: "accepts an IPv4 set of any size (up to 2^32 blocks)",
        ours: "refuses more than 2^24 blocks (too-many-blocks)",
        reason: "one limit for both families (DESIGN: 2^24 blocks), so storage is bounded \
                 (2 MiB) and sized before the set exists; a /8 cut into /32s is the largest",
        ends_comparison: true,
        matches: |c| {
            new_with_bits(c, Family::V4, 25..=32)
                && c.upstream.starts_with("ok blocks=")
                && c.ours == "err too-many-blocks"
        },
    },
    Divergence {
        name: "node-mask-outside-prefix-and-width",
        upstream: "makes a set anyway: 0 blocks for a mask shorter than the cluster prefix, a \
                   nil node mask past the address width (its caller must check: \
                   range_allocator.go, \"Caller must ensure subNetMaskSize is not less than \
                   cluster CIDR mask size\")",
        ours: "refuses (invalid-node-mask)",
        reason: "CidrSet::new checks its own input (every core function is total); \
                 kube-controller-manager rejects such flags before it makes a set, and so does \
                 our configuration",
        ends_comparison: true,
        matches: |c| {
            matches!(c.op, Op::New { .. })
                && c.ours == "err invalid-node-mask"
                && c.cluster.is_some_and(|cluster| {
                    c.node_mask < u16::from(cluster.prefix_len())
                        || c.node_mask > u16::from(cluster.family().max_prefix_len())
                })
        },
    },
    Divergence {
        name: "other-family-error",
        upstream: "out-of-range (\"cidr … is out the range of cluster cidr …\")",
        ours: "family-mismatch; nothing changes on either side (the counts must agree)",
        reason: "a finer error, so a caller can tell a wrong family from a wrong range \
                 (AllocError::FamilyMismatch)",
        ends_comparison: false,
        matches: |c| {
            matches!(c.op, Op::Occupy(_) | Op::Release(_))
                && other_family(c)
                && !ipv4_mapped(c)
                && c.upstream.strip_prefix("err out-of-range ")
                    == c.ours.strip_prefix("err family-mismatch ")
                && c.upstream.starts_with("err out-of-range ")
        },
    },
    Divergence {
        name: "ipv4-mapped-cidr-on-ipv4-set",
        upstream: "reads `::ffff:a.b.c.d/n` as IPv4 with an IPv6 prefix length: its range is \
                   computed from the wrong bytes (an error, or occupy/release of unrelated \
                   blocks)",
        ours: "family-mismatch, nothing changed",
        reason: "an IPv6 range is not an IPv4 one (README: IPv4-mapped ranges are refused as \
                 cluster CIDRs; our podCIDR parsing keeps the family)",
        ends_comparison: true,
        matches: |c| {
            matches!(c.op, Op::Occupy(_) | Op::Release(_))
                && ipv4_mapped(c)
                && c.cluster
                    .is_some_and(|cluster| cluster.family() == Family::V4)
                && c.ours.starts_with("err family-mismatch ")
        },
    },
];

/// The rows matching a difference (at most one, by construction; a test checks it).
pub fn matching(context: &Context<'_>) -> Vec<&'static Divergence> {
    INTENDED
        .iter()
        .filter(|row| (row.matches)(context))
        .collect()
}

fn new_with_bits(c: &Context<'_>, family: Family, bits: std::ops::RangeInclusive<u16>) -> bool {
    matches!(c.op, Op::New { .. })
        && c.cluster.is_some_and(|cluster| {
            cluster.family() == family
                && c.node_mask <= u16::from(family.max_prefix_len())
                && c.node_mask
                    .checked_sub(u16::from(cluster.prefix_len()))
                    .is_some_and(|b| bits.contains(&b))
        })
}

/// The request's CIDR, parsed as both sides parse it.
fn request_cidr(c: &Context<'_>) -> Option<Cidr> {
    match c.op {
        Op::Occupy(text) | Op::Release(text) => Cidr::parse_masked(text).ok().map(|(cidr, _)| cidr),
        _ => None,
    }
}

fn other_family(c: &Context<'_>) -> bool {
    match (request_cidr(c), c.cluster) {
        (Some(cidr), Some(cluster)) => cidr.family() != cluster.family(),
        _ => false,
    }
}

/// An IPv6 CIDR of 96 bits or more inside `::ffff:0:0/96` (Go's `To4()` turns it into IPv4).
fn ipv4_mapped(c: &Context<'_>) -> bool {
    request_cidr(c).is_some_and(|cidr| {
        cidr.family() == Family::V6
            && cidr.prefix_len() >= 96
            && cidr.network_bits() >> 32 == 0xffff
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn context<'a>(
        cluster: &str,
        node_mask: u16,
        op: &'a Op,
        ours: &'a str,
        upstream: &'a str,
    ) -> Context<'a> {
        Context {
            cluster: Cidr::parse_masked(cluster).ok().map(|(c, _)| c),
            node_mask,
            op,
            ours,
            upstream,
        }
    }

    #[test]
    fn each_known_difference_matches_exactly_one_row() {
        let new6 = Op::New {
            cluster: "fd00::/40".into(),
            node_mask: 64,
        };
        let new4 = Op::New {
            cluster: "0.0.0.0/0".into(),
            node_mask: 32,
        };
        let short = Op::New {
            cluster: "10.0.0.0/16".into(),
            node_mask: 8,
        };
        let other = Op::Occupy("fd00::/64".into());
        let mapped = Op::Release("::ffff:10.0.0.0/120".into());
        let cases = [
            (
                context(
                    "fd00::/40",
                    64,
                    &new6,
                    "ok blocks=16777216",
                    "err too-many-blocks",
                ),
                "ipv6-above-2^16-blocks",
            ),
            (
                context(
                    "0.0.0.0/0",
                    32,
                    &new4,
                    "err too-many-blocks",
                    "ok blocks=4294967296",
                ),
                "ipv4-above-2^24-blocks",
            ),
            (
                context(
                    "10.0.0.0/16",
                    8,
                    &short,
                    "err invalid-node-mask",
                    "ok blocks=0",
                ),
                "node-mask-outside-prefix-and-width",
            ),
            (
                context(
                    "10.0.0.0/16",
                    24,
                    &other,
                    "err family-mismatch allocated=3",
                    "err out-of-range allocated=3",
                ),
                "other-family-error",
            ),
            (
                context(
                    "10.0.0.0/16",
                    24,
                    &mapped,
                    "err family-mismatch allocated=3",
                    "ok allocated=2",
                ),
                "ipv4-mapped-cidr-on-ipv4-set",
            ),
        ];
        for (context, name) in cases {
            let rows: Vec<&str> = matching(&context).iter().map(|r| r.name).collect();
            assert_eq!(rows, [name], "{context:?}");
        }
    }

    #[test]
    fn no_row_accepts_a_real_difference() {
        let alloc = Op::Alloc;
        let other = Op::Occupy("fd00::/64".into());
        let new6 = Op::New {
            cluster: "fd00::/48".into(),
            node_mask: 64,
        };
        let cases = [
            // A different block, a different cursor (tries), a different count.
            context(
                "10.0.0.0/16",
                24,
                &alloc,
                "ok 10.0.1.0/24 allocated=2 tries=0",
                "ok 10.0.2.0/24 allocated=2 tries=0",
            ),
            context(
                "10.0.0.0/16",
                24,
                &alloc,
                "ok 10.0.1.0/24 allocated=2 tries=0",
                "ok 10.0.1.0/24 allocated=2 tries=1",
            ),
            // The other family, but the counts differ: something changed on one side.
            context(
                "10.0.0.0/16",
                24,
                &other,
                "err family-mismatch allocated=3",
                "err out-of-range allocated=4",
            ),
            // IPv6 within upstream's limit must agree.
            context(
                "fd00::/48",
                64,
                &new6,
                "ok blocks=65536",
                "err too-many-blocks",
            ),
        ];
        for context in cases {
            assert!(matching(&context).is_empty(), "{context:?}");
        }
    }
}
