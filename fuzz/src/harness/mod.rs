//! Model-checking harness shared by the fuzz targets (`fuzz/fuzz_targets/*.rs`, through the
//! `nodeipam-fuzz` library) and by the stable replay test (`core/tests/fuzz_replay.rs`, which
//! includes this file with `#[path]`). It uses `std` (`BTreeSet`, `Vec`): it only ever runs in a
//! test or fuzz binary, never in `nodeipam-core`'s `no_std` library.
//!
//! Every entry point takes arbitrary bytes and panics (an `assert!`) on the first disagreement
//! between `nodeipam-core` and a trivial model, or on any panic inside `nodeipam-core`.
//!
//! - `run_cidr_set`: bytes → a cluster CIDR (IPv4 or IPv6) and a node mask (1 … 2^16 blocks,
//!   rarely up to 2^24) → a `CidrSet` → operations compared with `SetModel` (a `BTreeSet<u32>` of
//!   allocated block indices plus upstream's round-robin cursor) after every step.
//! - `run_pool`: bytes → a single- or dual-stack `Pool` → node-level operations compared with
//!   one `SetModel` per cluster CIDR (all-or-nothing `allocate_node`).
//! - `run_pool_ranges`: bytes → one set shared by three `PoolRange`s (overlapping pools) →
//!   allocations within each range, stale candidates, occupy/release and free counts compared
//!   with one `SetModel` and a cursor per range; then the allocations moved into a grown,
//!   re-gridded set (`occupy_allocations_of`).
//! - `run_pool_order`: bytes → a `Pool` of 1 … 5 cluster CIDRs, several per family
//!   (`Pool::from_sets`) → allocations and releases checked against the order rule (a family's
//!   block from its first set with room for the size, all or nothing across families).
//! - `run_cidr_parse`: text → `Cidr::parse`/`parse_masked` → `Display` into a stack buffer →
//!   parse again; each line, and `config::validate` on the lines; never a panic.
//!
//! Byte formats are documented on each entry point; missing bytes read as zero, so every input,
//! including the empty one, is valid.

mod check;
mod decode;
mod model;
mod order;
mod parse;
mod pool;
mod ranges;
mod set;

pub use order::run_pool_order;
pub use parse::run_cidr_parse;
pub use pool::run_pool;
pub use ranges::run_pool_ranges;
pub use set::run_cidr_set;

use std::fmt::{self, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use nodeipam_core::{Cidr, Family};

/// Most operations decoded from one input (keeps a fuzz execution in the low milliseconds).
pub const MAX_OPS: usize = 512;

/// Largest `node_mask − cluster prefix` the set target usually uses: sets of 1 … 2^16 blocks.
pub const MAX_SET_BLOCK_BITS: u8 = 16;

/// "Huge" sets of 2^17 … 2^24 blocks (the core's limit, four bitmap levels) are picked by a
/// block-bits byte ≥ `HUGE_SELECTOR`, with fewer operations, ranges of at most
/// 2^`HUGE_RANGE_BITS` blocks for `occupy` and `allocate_aligned` (the model is a `BTreeSet`), and
/// no block-by-block comparison.
pub const HUGE_SELECTOR: u8 = 0xF8;

/// Most operations on a huge set.
pub const HUGE_MAX_OPS: usize = 48;

/// Largest range, in blocks (log2), that a huge set's model inserts at once.
pub const HUGE_RANGE_BITS: u8 = 12;

/// Largest `node_mask − cluster prefix` the pool target uses (small sets exhaust quickly).
pub const MAX_POOL_BLOCK_BITS: u8 = 8;

/// Sets with at most this many blocks are compared bit by bit after every operation; larger ones
/// after every failed operation (storage snapshot) and at the end.
const FULL_CHECK_BLOCKS: u32 = 64;

/// Whether `NODEIPAM_FUZZ_TRACE` is set: then every operation and its result is printed to stderr
/// (for reading a reproducer: `NODEIPAM_FUZZ_TRACE=1 cargo fuzz run TARGET FILE`).
fn tracing() -> bool {
    static TRACE: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *TRACE.get_or_init(|| std::env::var_os("NODEIPAM_FUZZ_TRACE").is_some())
}

fn trace(step: &str, what: &dyn fmt::Debug) {
    if tracing() {
        eprintln!("{step}: {what:?}");
    }
}

/// Filler written into the storage before `CidrSet::new`: the set must not rely on zeroed memory,
/// and must leave words past `storage_words` alone.
const GARBAGE: u64 = 0xA5A5_5A5A_DEAD_BEEF;

// ----- byte reader ----------------------------------------------------------------------------

/// A cursor over the fuzz input; reads past the end give zeros.
pub struct Bytes<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Bytes<'a> {
    /// A reader at the start of `data`.
    pub fn new(data: &'a [u8]) -> Self {
        Bytes { data, pos: 0 }
    }

    /// Whether every byte has been read.
    pub fn is_empty(&self) -> bool {
        self.pos >= self.data.len()
    }

    /// The next byte, or 0 past the end.
    pub fn u8(&mut self) -> u8 {
        let byte = self.data.get(self.pos).copied().unwrap_or(0);
        self.pos = self.pos.saturating_add(1);
        byte
    }

    /// The next two bytes, little-endian.
    pub fn u16(&mut self) -> u16 {
        u16::from_le_bytes([self.u8(), self.u8()])
    }

    /// The next `count` (≤ 16) bytes as a big-endian number.
    pub fn uint(&mut self, count: usize) -> u128 {
        (0..count.min(16)).fold(0u128, |acc, _| (acc << 8) | u128::from(self.u8()))
    }
}

// ----- CIDR helpers computed independently of nodeipam-core -----------------------------------

fn width(family: Family) -> u8 {
    match family {
        Family::V4 => 32,
        Family::V6 => 128,
    }
}

fn other_family(family: Family) -> Family {
    match family {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    }
}

fn ip_from_bits(family: Family, bits: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from(bits as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from(bits)),
    }
}

fn ip_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

/// Host-part mask of a `prefix_len` network in a `width`-bit family (low bits set).
fn host_mask(width: u8, prefix_len: u8) -> u128 {
    let host_bits = u32::from(width - prefix_len);
    if host_bits >= 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    }
}

/// A CIDR from any address bits, host bits cleared (`prefix_len` clamped to the family width).
fn masked_cidr(family: Family, bits: u128, prefix_len: u8) -> Cidr {
    let w = width(family);
    let prefix_len = prefix_len.min(w);
    let bits = bits & host_mask(128, 128 - w); // keep the family's width
    let network = bits & !host_mask(w, prefix_len);
    let cidr = Cidr::new(ip_from_bits(family, network), prefix_len);
    assert_eq!(
        cidr,
        Cidr::new_masked(ip_from_bits(family, bits), prefix_len),
        "Cidr::new on a masked address must equal Cidr::new_masked"
    );
    match cidr {
        Ok(cidr) => cidr,
        Err(error) => panic!("Cidr::new rejected canonical {network:#x}/{prefix_len}: {error:?}"),
    }
}

/// `(first, last)` address bits of a CIDR, from its network and prefix length only.
fn span(cidr: &Cidr) -> (u128, u128) {
    let first = ip_bits(cidr.network());
    let last = first | host_mask(width(cidr.family()), cidr.prefix_len());
    (first, last)
}

/// A `fmt::Write` into a fixed stack buffer (no allocation), failing when full.
pub type StackText = heapless::String<96>;

/// A `fmt::Write` that only counts bytes (to exercise `Display` of errors of any length).
struct CountingSink(usize);

impl Write for CountingSink {
    fn write_str(&mut self, s: &str) -> fmt::Result {
        self.0 += s.len();
        Ok(())
    }
}

fn display_nonempty(value: &dyn fmt::Display) {
    let mut sink = CountingSink(0);
    assert!(write!(sink, "{value}").is_ok(), "Display failed");
    assert!(sink.0 > 0, "Display wrote nothing");
}
