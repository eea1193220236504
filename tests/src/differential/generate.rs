//! Seed → sequence of requests for the differential. Everything random comes from one ChaCha8
//! stream seeded with the seed (value-stable: the same sequence on every machine).
//!
//! A sequence is one `new` and then, for a set both allocators accept, 60–460 requests (260 on
//! average) drawn from:
//! - **sets**: IPv4 or IPv6 (half each), 2^0…2^24 blocks (block bits drawn in four bands: 0–4,
//!   5–10, 11–16, 17–24; IPv6 stops at 16 bits, upstream's limit), node masks at the boundaries
//!   (/32, /24, /128, /64, /63, /65, a cluster prefix of 0) or anywhere, the cluster CIDR's text
//!   often with host bits set. One seed in 25 asks for a set only one side accepts (IPv6 with
//!   17–24 block bits, IPv4 with 25–32, a node mask shorter than the cluster prefix or longer than
//!   the address): then only `new` and two `alloc`s, as the rest is not comparable;
//! - **requests**: `alloc`; `occupy`/`release` of a block (first, last, at or near the cursor, or
//!   anywhere; canonical or with host bits), of an allocated block, of a sub-block CIDR (longer
//!   prefix than the node mask), of an aligned multi-block CIDR, of the whole cluster CIDR or a
//!   supernet of it, of a CIDR of the same family outside the cluster, of the other family, of an
//!   IPv4-mapped IPv6 CIDR (IPv4 sets; rarely, as it ends the comparison), or of a prefix past the
//!   family's width (a parse error);
//! - **bursts**: allocate until exhausted and a few more; fill the set (occupy the cluster CIDR)
//!   then release a few blocks and allocate them again; churn on a full set (release one, allocate
//!   one, many times); a wall (occupy the blocks after the cursor, then allocate across them).
//!
//! Requests that make the Go side walk millions of bits (a whole-cluster or supernet occupy on a
//! set above 2^16 blocks; multi-block CIDRs above 2^16 blocks) are not drawn, so a long run stays
//! quick; those paths are covered on the smaller sets.
//!
//! The generator runs our own [`CidrSet`](nodeipam_core::CidrSet) alongside (through
//! [`CoreDriver`]) only to pick targets such as "an allocated block" or "the cursor"; the answers
//! it checks come from the drivers.

use std::net::{Ipv4Addr, Ipv6Addr};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

use super::core_driver::CoreDriver;
use super::protocol::Op;

/// Sets above this many blocks get no whole-cluster occupy/release and no multi-block CIDR larger
/// than this (upstream walks them bit by bit, with a metric update per bit).
const MAX_WALK_BLOCKS: u32 = 1 << 16;

/// The sequence of `seed`: a `new` first, then the requests (see the module doc).
pub fn generate(seed: u64) -> Vec<Op> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let shape = Shape::draw(&mut rng);
    let mut g = Generator {
        rng,
        shape,
        shadow: CoreDriver::new(),
        ops: Vec::new(),
    };
    let cluster = g.shape.cluster_text(&mut g.rng);
    g.push(Op::New {
        cluster,
        node_mask: g.shape.node_mask,
    });
    if !g.shape.comparable {
        g.push(Op::Alloc);
        g.push(Op::Alloc);
        return g.ops;
    }
    let length = g.rng.random_range(60..=460);
    while g.ops.len() < length {
        g.step(length);
    }
    g.ops
}

/// The set a sequence works on.
#[derive(Debug, Clone, Copy)]
struct Shape {
    /// Address width: 32 or 128.
    width: u8,
    /// Cluster network, as an integer (IPv4 in the low 32 bits).
    network: u128,
    prefix: u8,
    node_mask: u16,
    /// Both allocators accept this set (the rest of the sequence can be compared).
    comparable: bool,
}

impl Shape {
    fn draw(rng: &mut ChaCha8Rng) -> Shape {
        let width: u8 = if rng.random_bool(0.5) { 32 } else { 128 };
        let odd = rng.random_range(0..25) == 0;
        if odd {
            return Shape::draw_one_sided(rng, width);
        }
        let max_bits = if width == 32 { 24 } else { 16 };
        let bits: u8 = match rng.random_range(0..4) {
            0 => rng.random_range(0..=4),
            1 => rng.random_range(5..=10),
            2 => rng.random_range(11..=16),
            _ => rng.random_range(17..=24),
        }
        .min(max_bits);
        let node_mask = Shape::draw_node_mask(rng, width, bits);
        let prefix = node_mask - bits;
        Shape {
            width,
            network: random_network(rng, width, prefix),
            prefix,
            node_mask: u16::from(node_mask),
            comparable: true,
        }
    }

    /// A node mask of `bits` block bits or more, often at a boundary.
    fn draw_node_mask(rng: &mut ChaCha8Rng, width: u8, bits: u8) -> u8 {
        let boundaries: &[u8] = if width == 32 {
            &[32, 24, 31, 25, 16]
        } else {
            &[128, 64, 63, 65, 127, 96]
        };
        let candidate = match rng.random_range(0..4) {
            0 => bits, // a cluster prefix of 0
            1 | 2 => boundaries[rng.random_range(0..boundaries.len())],
            _ => rng.random_range(bits..=width),
        };
        candidate.max(bits)
    }

    /// A set that only one side accepts (see [`super::divergence::INTENDED`]).
    fn draw_one_sided(rng: &mut ChaCha8Rng, width: u8) -> Shape {
        let (prefix, node_mask) = match (width, rng.random_range(0..3)) {
            // IPv6 above upstream's 2^16, or IPv4 above our 2^24.
            (128, 0) => {
                let bits = rng.random_range(17..=24);
                let mask = Shape::draw_node_mask(rng, width, bits);
                (mask - bits, u16::from(mask))
            }
            (_, 0) => {
                let bits = rng.random_range(25..=32u8);
                let mask = rng.random_range(bits..=32);
                (mask - bits, u16::from(mask))
            }
            // A node mask shorter than the cluster prefix.
            (_, 1) => {
                let prefix = rng.random_range(1..=width);
                (prefix, u16::from(rng.random_range(0..prefix)))
            }
            // A node mask longer than the address.
            _ => {
                let prefix = rng.random_range(0..=width);
                (
                    prefix,
                    rng.random_range(u16::from(width) + 1..=u16::from(width) + 3),
                )
            }
        };
        Shape {
            width,
            network: random_network(rng, width, prefix),
            prefix,
            node_mask,
            comparable: false,
        }
    }

    /// The cluster CIDR's text; half of the time with host bits set.
    fn cluster_text(&self, rng: &mut ChaCha8Rng) -> String {
        let address = if rng.random_bool(0.5) {
            self.network | (rng.random::<u128>() & host_mask(self.width, self.prefix))
        } else {
            self.network
        };
        cidr_text(self.width, address, self.prefix)
    }

    fn block_bits(&self) -> u8 {
        (self.node_mask as u8).saturating_sub(self.prefix)
    }

    fn block_count(&self) -> u32 {
        1 << self.block_bits()
    }

    /// Network of block `index`.
    fn block_network(&self, index: u32) -> u128 {
        // A shift of 128 (an IPv6 /0 block) has only block 0.
        self.network
            | u128::from(index)
                .checked_shl(u32::from(self.width - self.node_mask as u8))
                .unwrap_or(0)
    }
}

/// Low `width − prefix` bits set.
fn host_mask(width: u8, prefix: u8) -> u128 {
    let host_bits = u32::from(width - prefix);
    if host_bits == 0 {
        0
    } else {
        u128::MAX >> (128 - host_bits)
    }
}

/// A random network of `prefix` bits. IPv6 avoids the IPv4-mapped range `::ffff:0:0/96`, which
/// Go reads as IPv4 and our configuration refuses as a cluster CIDR (README's differences table).
fn random_network(rng: &mut ChaCha8Rng, width: u8, prefix: u8) -> u128 {
    loop {
        let value = rng.random::<u128>()
            & if width == 32 {
                u128::from(u32::MAX)
            } else {
                u128::MAX
            };
        let network = value & !host_mask(width, prefix);
        if width == 128 && prefix >= 96 && network >> 32 == 0xffff {
            continue;
        }
        return network;
    }
}

fn cidr_text(width: u8, address: u128, prefix: u8) -> String {
    if width == 32 {
        format!("{}/{prefix}", Ipv4Addr::from_bits(address as u32))
    } else {
        format!("{}/{prefix}", Ipv6Addr::from_bits(address))
    }
}

struct Generator {
    rng: ChaCha8Rng,
    shape: Shape,
    shadow: CoreDriver,
    ops: Vec<Op>,
}

impl Generator {
    fn push(&mut self, op: Op) {
        self.shadow.answer(&op);
        self.ops.push(op);
    }

    fn allocated(&self) -> u32 {
        self.shadow.set().map_or(0, |s| s.allocated_count())
    }

    fn cursor(&self) -> u32 {
        self.shadow.set().map_or(0, |s| s.next_candidate())
    }

    fn full(&self) -> bool {
        self.allocated() >= self.shape.block_count()
    }

    /// One request or one burst, at most up to `length` requests in all (a burst may run past).
    fn step(&mut self, length: usize) {
        let blocks = self.shape.block_count();
        let small = blocks <= MAX_WALK_BLOCKS;
        match self.rng.random_range(0..100) {
            0..35 => self.push(Op::Alloc),
            35..50 => {
                let target = self.target();
                self.push(Op::Occupy(target));
            }
            50..63 => {
                let target = self.target();
                self.push(Op::Release(target));
            }
            63..73 => {
                let target = self.allocated_block_text();
                self.push(Op::Release(target));
            }
            // Exhaustion burst: up to the end of the set and a few more (small free counts only).
            73..79 => {
                let free = blocks - self.allocated();
                let count = if free <= 600 {
                    free + self.rng.random_range(1..=3)
                } else {
                    self.rng.random_range(1..=40)
                };
                for _ in 0..count {
                    self.push(Op::Alloc);
                }
            }
            // Fill: the whole cluster (or a supernet) occupied, a few blocks released and
            // allocated again; the cursor's wrap is exercised on a full set.
            79..83 if small => {
                let target = if self.shape.prefix > 0 && self.rng.random_bool(0.3) {
                    let prefix = self.rng.random_range(0..self.shape.prefix);
                    cidr_text(
                        self.shape.width,
                        self.shape.network & !host_mask(self.shape.width, prefix),
                        prefix,
                    )
                } else {
                    cidr_text(self.shape.width, self.shape.network, self.shape.prefix)
                };
                self.push(Op::Occupy(target));
                let holes = self.rng.random_range(1..=8u32).min(blocks);
                for _ in 0..holes {
                    let index = self.rng.random_range(0..blocks);
                    let target = self.block_text(index);
                    self.push(Op::Release(target));
                }
                for _ in 0..holes + 1 {
                    self.push(Op::Alloc);
                }
            }
            // Churn on a full set: release one, allocate one.
            83..91 => {
                if !self.full() {
                    self.push(Op::Alloc);
                    return;
                }
                let rounds = self.rng.random_range(1..=30);
                for _ in 0..rounds {
                    let target = self.allocated_block_text();
                    self.push(Op::Release(target));
                    self.push(Op::Alloc);
                    if self.ops.len() >= length {
                        break;
                    }
                }
            }
            // A wall after the cursor: an aligned multi-block CIDR holding the cursor's block,
            // then allocations across it (large tries).
            91..96 => {
                if let Some(target) = self.multi_block_text(self.cursor()) {
                    self.push(Op::Occupy(target));
                }
                for _ in 0..self.rng.random_range(1..=4) {
                    self.push(Op::Alloc);
                }
            }
            _ => {
                let target = self.odd_target();
                if self.rng.random_bool(0.5) {
                    self.push(Op::Occupy(target));
                } else {
                    self.push(Op::Release(target));
                }
            }
        }
    }

    /// A block index: the first, the last, the cursor's, near it, or anywhere.
    fn block_index(&mut self) -> u32 {
        let blocks = self.shape.block_count();
        match self.rng.random_range(0..5) {
            0 => 0,
            1 => blocks - 1,
            2 => self.cursor(),
            3 => (self.cursor() + self.rng.random_range(0..8)) % blocks,
            _ => self.rng.random_range(0..blocks),
        }
    }

    /// A block as a CIDR; a third of the time with host bits set.
    fn block_text(&mut self, index: u32) -> String {
        let s = self.shape;
        let mut address = s.block_network(index);
        if self.rng.random_bool(0.33) {
            address |= self.rng.random::<u128>() & host_mask(s.width, s.node_mask as u8);
        }
        cidr_text(s.width, address, s.node_mask as u8)
    }

    /// An allocated block (or any block when none is).
    fn allocated_block_text(&mut self) -> String {
        let blocks = self.shape.block_count();
        let start = self.rng.random_range(0..blocks);
        let index = self.shadow.set().and_then(|set| {
            (0..blocks.min(4096))
                .map(|k| (start + k) % blocks)
                .find(|&i| set.is_allocated(i).unwrap_or(false))
        });
        let index = index.unwrap_or(start);
        self.block_text(index)
    }

    /// A CIDR inside the cluster: a block, a sub-block or an aligned multi-block range.
    fn target(&mut self) -> String {
        let index = self.block_index();
        let s = self.shape;
        match self.rng.random_range(0..10) {
            0..6 => self.block_text(index),
            6..8 if (s.node_mask as u8) < s.width => {
                // A sub-block CIDR: longer prefix, anywhere inside the block.
                let prefix = self.rng.random_range(s.node_mask as u8 + 1..=s.width);
                let address = s.block_network(index)
                    | (self.rng.random::<u128>() & host_mask(s.width, s.node_mask as u8));
                let address = if self.rng.random_bool(0.5) {
                    address & !host_mask(s.width, prefix)
                } else {
                    address
                };
                cidr_text(s.width, address, prefix)
            }
            _ => self
                .multi_block_text(index)
                .unwrap_or_else(|| self.block_text(index)),
        }
    }

    /// The aligned CIDR of 2..=2^16 blocks (fewer than the whole set) holding block `index`.
    fn multi_block_text(&mut self, index: u32) -> Option<String> {
        let s = self.shape;
        let bits = s.block_bits();
        if bits < 2 {
            return None;
        }
        let group_bits = self.rng.random_range(1..bits.min(17));
        let prefix = s.node_mask as u8 - group_bits;
        let address = s.block_network(index) & !host_mask(s.width, prefix);
        Some(cidr_text(s.width, address, prefix))
    }

    /// A CIDR the set should refuse or treat specially: outside the cluster, the other family,
    /// IPv4-mapped, a supernet or the whole cluster (small sets), or past the family's width.
    fn odd_target(&mut self) -> String {
        let s = self.shape;
        let small = s.block_count() <= MAX_WALK_BLOCKS;
        match self.rng.random_range(0..12) {
            0..4 if s.prefix > 0 => {
                // Same family, outside: flip one network bit.
                let bit = self.rng.random_range(0..s.prefix);
                let address = s.network ^ (1u128 << (s.width - 1 - bit));
                let prefix = self.rng.random_range(bit + 1..=s.width);
                let address = address & !host_mask(s.width, prefix);
                cidr_text(s.width, address, prefix)
            }
            4..7 => {
                // The other family.
                let width = if s.width == 32 { 128 } else { 32 };
                let prefix = self.rng.random_range(0..=width);
                let network = random_network(&mut self.rng, width, prefix);
                cidr_text(width, network, prefix)
            }
            // Rarely: upstream's answer ends the comparison (a row of the table).
            7 if s.width == 32 && self.rng.random_bool(0.1) => {
                // IPv4-mapped IPv6 text of a range inside the cluster.
                let index = self.block_index();
                let prefix = self.rng.random_range(s.node_mask as u8..=32);
                let address = (s.block_network(index) & !host_mask(32, prefix)) as u32;
                format!("::ffff:{}/{}", Ipv4Addr::from_bits(address), 96 + prefix)
            }
            8 | 9 if small => {
                let prefix = self.rng.random_range(0..=s.prefix);
                let address = s.network & !host_mask(s.width, prefix);
                cidr_text(s.width, address, prefix)
            }
            10 => {
                // Past the family's width: a parse error on both sides.
                format!(
                    "{}/{}",
                    cidr_text(s.width, s.network, 0).trim_end_matches("/0"),
                    s.width + 1
                )
            }
            _ => {
                let index = self.block_index();
                self.block_text(index)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_always_gives_the_same_sequence() {
        for seed in [0, 1, 42, 9_999] {
            assert_eq!(generate(seed), generate(seed));
        }
        assert_ne!(generate(1), generate(2));
    }

    #[test]
    fn sequences_cover_what_the_module_doc_promises() {
        let (mut v4, mut v6, mut odd, mut full_bursts, mut big, mut ops) = (0, 0, 0, 0, 0, 0);
        let mut host_bits = 0;
        for seed in 0..400 {
            let sequence = generate(seed);
            ops += sequence.len();
            let Some(Op::New { cluster, node_mask }) = sequence.first() else {
                panic!("seed {seed} does not start with new");
            };
            if cluster.contains(':') {
                v6 += 1;
            } else {
                v4 += 1;
            }
            let Ok((cidr, _)) = nodeipam_core::Cidr::parse_masked(cluster) else {
                panic!("seed {seed}: cluster {cluster} does not parse");
            };
            let bits = i32::from(*node_mask) - i32::from(cidr.prefix_len());
            if sequence.len() == 3 {
                odd += 1;
                continue;
            }
            if bits >= 20 {
                big += 1;
            }
            let mut driver = CoreDriver::new();
            let answers = driver.answer_all(&sequence);
            full_bursts += usize::from(answers.iter().any(|a| a.starts_with("err no-cidrs")));
            host_bits += sequence
                .iter()
                .filter(|op| match op {
                    Op::Occupy(t) | Op::Release(t) => {
                        matches!(nodeipam_core::Cidr::parse_masked(t), Ok((_, true)))
                    }
                    _ => false,
                })
                .count();
        }
        assert!(v4 > 150 && v6 > 150, "families: {v4} IPv4, {v6} IPv6");
        assert!((5..50).contains(&odd), "{odd} one-sided sets");
        assert!(
            full_bursts > 100,
            "{full_bursts} sequences exhaust their set"
        );
        assert!(big > 20, "{big} sets of 2^20 blocks or more");
        assert!(host_bits > 1000, "{host_bits} requests with host bits");
        assert!(ops > 400 * 200, "{ops} requests in 400 sequences");
    }
}
