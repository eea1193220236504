//! The line protocol of both cidrset drivers: one request per line in, one answer per line out.
//!
//! Requests (CIDRs as text, host bits allowed: both sides clear them, as kube-controller-manager
//! and our controller do with Node podCIDRs):
//!
//! | request | answer |
//! |---|---|
//! | `new CIDR MASK` — a new set: cluster CIDR cut into blocks of prefix length `MASK` bits; replaces the previous set | `ok blocks=N` or `err CLASS` |
//! | `alloc` — allocate the next block (round robin from the next-candidate cursor) | `ok CIDR allocated=N tries=T` or `err CLASS allocated=N` |
//! | `occupy CIDR` / `release CIDR` | `ok allocated=N` or `err CLASS allocated=N` |
//!
//! `N` after `blocks=` is the set's block count; after `allocated=`, its allocated count after the
//! request. `T` is how many allocated blocks the allocation skipped from the cursor (upstream's
//! `cidrset_allocation_tries_per_request` observation): the cursor before the allocation is
//! `(index of CIDR − T) mod blocks` and after it `index + 1 mod blocks`, so equal answers mean
//! equal cursors at every allocation.
//!
//! Error classes: `no-cidrs-remaining` (exhausted), `too-many-blocks`, `out-of-range`,
//! `family-mismatch` (ours only: upstream says `out-of-range`), `invalid-node-mask` (ours only),
//! `index-out-of-range` (upstream only), `parse`, `no-set` (no set yet, or the last `new` failed),
//! `bad-op`, `panic:…` (upstream only, recovered), `other:…`.

use std::fmt;

/// One request of the protocol.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Op {
    /// `new CIDR MASK`: a new set of cluster CIDR `cluster` (text, host bits allowed) with node
    /// CIDR mask size `node_mask` (prefix length, bits; out-of-range values are sent as they are).
    New {
        /// The cluster CIDR, as text.
        cluster: String,
        /// The node CIDR mask size, bits.
        node_mask: u16,
    },
    /// `alloc`: allocate the next free block.
    Alloc,
    /// `occupy CIDR`: mark every block the CIDR overlaps as allocated.
    Occupy(String),
    /// `release CIDR`: mark every block the CIDR overlaps as free.
    Release(String),
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Op::New { cluster, node_mask } => write!(f, "new {cluster} {node_mask}"),
            Op::Alloc => f.write_str("alloc"),
            Op::Occupy(cidr) => write!(f, "occupy {cidr}"),
            Op::Release(cidr) => write!(f, "release {cidr}"),
        }
    }
}

impl Op {
    /// Parses one request line; `None` for anything that is not a request of the protocol
    /// (answered `err bad-op`).
    pub fn parse(line: &str) -> Option<Op> {
        let fields: Vec<&str> = line.split_whitespace().collect();
        match fields.as_slice() {
            ["new", cluster, mask] => Some(Op::New {
                cluster: (*cluster).to_owned(),
                node_mask: mask.parse().ok()?,
            }),
            ["alloc"] => Some(Op::Alloc),
            ["occupy", cidr] => Some(Op::Occupy((*cidr).to_owned())),
            ["release", cidr] => Some(Op::Release((*cidr).to_owned())),
            _ => None,
        }
    }
}

/// The requests as protocol text, one line each.
pub fn to_text(ops: &[Op]) -> String {
    let mut text = String::with_capacity(ops.len() * 24);
    for op in ops {
        text.push_str(&op.to_string());
        text.push('\n');
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_round_trip_through_text() {
        let ops = [
            Op::New {
                cluster: "10.0.0.1/8".into(),
                node_mask: 24,
            },
            Op::Alloc,
            Op::Occupy("fd00::/64".into()),
            Op::Release("10.1.2.3/32".into()),
        ];
        for op in &ops {
            assert_eq!(Op::parse(&op.to_string()).as_ref(), Some(op));
        }
        assert_eq!(Op::parse("alloc 1"), None);
        assert_eq!(Op::parse("new 10.0.0.0/8 x"), None);
        assert_eq!(Op::parse(""), None);
    }
}
