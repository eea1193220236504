//! The edge agent's workload: the pools it serves ([`POOLS`]), the scripted request sequence
//! ([`Script`]), the request handler ([`serve`], [`apply`]) and the digest of every answer
//! ([`Summary`]).
//!
//! One file, two builds: the firmware (`examples/edge-agent/src/main.rs`, thumbv7em) uses it as a
//! module, and the host test `core/tests/edge_agent.rs` (x86-64, under `cargo test --workspace`)
//! includes it with `#[path]`. Both run the same requests through the same code and print the
//! same report lines ([`Summary::write_report`]); equal lines mean 32-bit Arm and x86-64 gave the
//! same answers bit for bit — `u128` block arithmetic, shifts of 0 to 128 bits, the round-robin
//! cursor and its wrap-around, exhaustion, and every error.
//!
//! `no_std`, no allocation, no panics at run time: it uses only `nodeipam-core`, `heapless`,
//! `embassy-sync` and `fnv`.

use core::fmt;
use core::hash::Hasher;
use core::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use embassy_sync::blocking_mutex::raw::RawMutex;
use fnv::FnvHasher;
use nodeipam_core::{
    AllocError, Allocation, Cidr, CidrSet, Family, NodeAllocation, Pool, SharedPool,
    storage_words_for,
};

// ----- the pools ------------------------------------------------------------------------------

/// One cluster CIDR and its node CIDR mask size (`--node-cidr-mask-size-ipv4/-ipv6`, bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetSpec {
    /// The cluster CIDR.
    pub cluster_cidr: Cidr,
    /// The prefix length of each node block, in bits.
    pub node_mask_size: u8,
}

impl SetSpec {
    /// `u64` words of bitmap this set needs ([`storage_words_for`]).
    pub const fn storage_words(&self) -> usize {
        storage_words_for(self.cluster_cidr.prefix_len(), self.node_mask_size)
    }

    /// Number of blocks: 2^(node mask size − cluster prefix length).
    pub const fn block_count(&self) -> u32 {
        1 << (self.node_mask_size - self.cluster_cidr.prefix_len())
    }

    const fn width(&self) -> u8 {
        self.cluster_cidr.family().max_prefix_len()
    }
}

/// One pool the agent serves: one cluster CIDR (single-stack) or two of different families
/// (dual-stack, flag order), and how many requests of the script go to it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PoolSpec {
    /// The first cluster CIDR (the family of a node's `spec.podCIDR`).
    pub first: SetSpec,
    /// The second cluster CIDR of a dual-stack pool.
    pub second: Option<SetSpec>,
    /// Requests the script sends to this pool.
    pub requests: u32,
}

impl PoolSpec {
    /// `u64` words of bitmap the pool's sets need together.
    pub const fn storage_words(&self) -> usize {
        let second = match self.second {
            Some(set) => set.storage_words(),
            None => 0,
        };
        self.first.storage_words() + second
    }

    /// The pool's sets in flag order (1 or 2).
    pub fn sets(&self) -> impl Iterator<Item = SetSpec> {
        core::iter::once(self.first).chain(self.second)
    }

    fn set(&self, index: usize) -> SetSpec {
        match (index, self.second) {
            (1, Some(second)) => second,
            _ => self.first,
        }
    }

    fn set_count(&self) -> u64 {
        if self.second.is_some() { 2 } else { 1 }
    }
}

/// A canonical CIDR for the const tables below; evaluated at compile time only (a bad entry is
/// a build error, never a run-time panic).
const fn spec_cidr(addr: IpAddr, prefix_len: u8) -> Cidr {
    match Cidr::new(addr, prefix_len) {
        Ok(cidr) => cidr,
        Err(_) => panic!("POOLS entry with host bits set or a prefix length past the family"),
    }
}

const fn v4(o: [u8; 4], prefix_len: u8) -> Cidr {
    spec_cidr(
        IpAddr::V4(Ipv4Addr::new(o[0], o[1], o[2], o[3])),
        prefix_len,
    )
}

const fn v6(s: [u16; 8], prefix_len: u8) -> Cidr {
    let addr = Ipv6Addr::new(s[0], s[1], s[2], s[3], s[4], s[5], s[6], s[7]);
    spec_cidr(IpAddr::V6(addr), prefix_len)
}

const fn set(cluster_cidr: Cidr, node_mask_size: u8) -> SetSpec {
    let prefix_len = cluster_cidr.prefix_len();
    assert!(
        node_mask_size >= prefix_len
            && node_mask_size <= cluster_cidr.family().max_prefix_len()
            && node_mask_size - prefix_len <= nodeipam_core::MAX_BLOCK_BITS,
        "POOLS entry whose node mask the core refuses"
    );
    SetSpec {
        cluster_cidr,
        node_mask_size,
    }
}

/// The pools the agent serves. Chosen for the arithmetic that could differ between a 32-bit and
/// a 64-bit target: 65,536-block sets (four bitmap levels' worth of summary propagation, cursor
/// wrap far from 0), block shifts of 0, 24, 64, 120 and 128 bits, networks at the bottom and the
/// top of both address spaces, one-block sets, and dual-stack pools in both family orders.
pub const POOLS: [PoolSpec; 6] = [
    // kubeadm's dual-stack defaults: 256 + 256 blocks, so nodes exhaust and free them often.
    PoolSpec {
        first: set(v4([10, 244, 0, 0], 16), 24),
        second: Some(set(v6([0xfd00, 0x10, 0x244, 0, 0, 0, 0, 0], 56), 64)),
        requests: 4_000,
    },
    // 10.0.0.0/8 cut into /24s: 65,536 blocks (BENCHMARKS W1), 8,328 bytes of bitmap.
    PoolSpec {
        first: set(v4([10, 0, 0, 0], 8), 24),
        second: None,
        requests: 4_500,
    },
    // A /48 cut into /64s: 65,536 blocks, the block shift is exactly 64 (a u128 half).
    PoolSpec {
        first: set(v6([0x2001, 0xdb8, 0xab00, 0, 0, 0, 0, 0], 48), 64),
        second: None,
        requests: 3_000,
    },
    // The bottom of both address spaces with the widest shifts: 0.0.0.0/0 in /8s (shift 24),
    // ::/0 in /8s (shift 120).
    PoolSpec {
        first: set(v4([0, 0, 0, 0], 0), 8),
        second: Some(set(v6([0; 8], 0), 8)),
        requests: 2_000,
    },
    // The top of both address spaces with shift 0, IPv6 first: the last /120 in /128s (the last
    // block ends at u128::MAX), and 255.255.255.0/24 in /32s.
    PoolSpec {
        first: set(
            v6(
                [
                    0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xffff, 0xff00,
                ],
                120,
            ),
            128,
        ),
        second: Some(set(v4([255, 255, 255, 0], 24), 32)),
        requests: 2_000,
    },
    // One block per family: ::/0 as a single /0 (shift 128) and 192.0.2.0/24 as one /24.
    PoolSpec {
        first: set(v4([192, 0, 2, 0], 24), 24),
        second: Some(set(v6([0; 8], 0), 0)),
        requests: 1_000,
    },
];

/// Number of pools.
pub const POOL_COUNT: usize = POOLS.len();

/// `u64` words of bitmap all pools need together: the size of the agent's static arena.
pub const ARENA_WORDS: usize = {
    let mut total = 0;
    let mut i = 0;
    while i < POOL_COUNT {
        total += POOLS[i].storage_words();
        i += 1;
    }
    total
};

/// Requests in the whole script.
pub const TOTAL_REQUESTS: u32 = {
    let mut total = 0;
    let mut i = 0;
    while i < POOL_COUNT {
        total += POOLS[i].requests;
        i += 1;
    }
    total
};

// The issue asks for at least 10,000 operations.
const _: () = assert!(
    TOTAL_REQUESTS >= 10_000,
    "the script must send at least 10,000 requests"
);

/// Why the pools could not be built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SetupError {
    /// A set or pool of [`POOLS`] was refused (e.g. `StorageTooSmall`).
    Alloc {
        /// Index in [`POOLS`].
        pool: usize,
        /// The core's reason.
        error: AllocError,
    },
    /// More pools than the capacity (cannot happen: the capacity is [`POOL_COUNT`]).
    TooManyPools {
        /// Index in [`POOLS`] of the pool that did not fit.
        pool: usize,
    },
}

impl SetupError {
    /// Index in [`POOLS`] of the pool that could not be built.
    pub fn pool(&self) -> usize {
        match self {
            SetupError::Alloc { pool, .. } | SetupError::TooManyPools { pool } => *pool,
        }
    }
}

/// The agent's pools, each behind its own [`SharedPool`] lock, in [`POOLS`] order.
pub type SharedPools<M, S> = heapless::Vec<SharedPool<M, S>, POOL_COUNT>;

/// Builds every pool of [`POOLS`], taking each set's bitmap from `storage(words)` (the firmware
/// hands out slices of a static arena, the host test `Vec`s). Every block starts free.
///
/// # Errors
/// [`SetupError::Alloc`] naming the pool whose set or pool was refused.
pub fn build_pools<M: RawMutex, S: AsRef<[u64]> + AsMut<[u64]>>(
    mut storage: impl FnMut(usize) -> S,
) -> Result<SharedPools<M, S>, SetupError> {
    let mut pools = SharedPools::new();
    for (index, spec) in POOLS.iter().enumerate() {
        let alloc = |error| SetupError::Alloc { pool: index, error };
        let mut make = |set: SetSpec| {
            CidrSet::new(
                set.cluster_cidr,
                set.node_mask_size,
                storage(set.storage_words()),
            )
        };
        let first = make(spec.first).map_err(alloc)?;
        let second = match spec.second {
            Some(set) => Some(make(set).map_err(alloc)?),
            None => None,
        };
        let pool = Pool::new(first, second).map_err(alloc)?;
        pools
            .push(SharedPool::new(pool))
            .map_err(|_| SetupError::TooManyPools { pool: index })?;
    }
    Ok(pools)
}

// ----- requests and answers ---------------------------------------------------------------------

/// A node's podCIDRs as a request carries them: 0 to 3 (3 is refused: `TooManyCidrs`).
pub type NodeCidrs = heapless::Vec<Cidr, 3>;

/// What a request asks of a pool; each maps to one `Pool`/`CidrSet` call (see [`apply`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Operation {
    /// `Pool::allocate_node`: one block per family, all or nothing.
    AllocateNode,
    /// `Pool::occupy_node`: a node seen with podCIDRs already set.
    OccupyNode(NodeCidrs),
    /// `Pool::release_node`: the node is gone.
    ReleaseNode(NodeCidrs),
    /// `Pool::check_node`: would these podCIDRs be accepted? Changes nothing.
    CheckNode(NodeCidrs),
    /// `Pool::occupy`: reserve one CIDR (any size) in its family's set.
    Occupy(Cidr),
    /// `Pool::release`: free one CIDR (any size) in its family's set.
    Release(Cidr),
    /// `Pool::release_blocks`: free blocks `first..=last` (indices) of the family's set.
    ReleaseBlocks {
        /// The set's family.
        family: Family,
        /// First block index.
        first: u32,
        /// Last block index (inclusive).
        last: u32,
    },
    /// `Pool::reserve_service_cidr`.
    ReserveServiceCidr(Cidr),
    /// `CidrSet::allocated_in` on the family's set: allocated blocks overlapped by the CIDR.
    AllocatedIn(Cidr),
    /// Every set's allocated count and next-candidate cursor.
    Status,
}

/// One request from the transport: a sequence number, the pool (index in [`POOLS`]) and what to
/// do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    /// Position in the script, from 0.
    pub sequence: u32,
    /// Index in [`POOLS`] (an index past the end is answered [`Answer::NoSuchPool`]).
    pub pool: u8,
    /// What to do.
    pub operation: Operation,
}

/// One set's counters, as [`Operation::Status`] reports them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SetStatus {
    /// Allocated (or occupied) blocks.
    pub allocated_count: u32,
    /// Where the next round-robin search starts (block index).
    pub next_candidate: u32,
}

/// The agent's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// For [`Operation::AllocateNode`].
    Node(Result<NodeAllocation, AllocError>),
    /// A block count: blocks changed by an occupy/release/reservation, or allocated blocks for
    /// [`Operation::AllocatedIn`].
    Blocks(Result<u32, AllocError>),
    /// For [`Operation::CheckNode`].
    Checked(Result<(), AllocError>),
    /// For [`Operation::Status`]: one entry per set, flag order.
    Status(heapless::Vec<SetStatus, 2>),
    /// The request named a pool the agent does not have.
    NoSuchPool,
    /// The pool was locked by a re-entrant call (`PoolBusy`); nothing was done.
    Busy,
}

/// A request and its answer, as the agent sends them back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The request served.
    pub request: Request,
    /// Its answer.
    pub answer: Answer,
}

/// Serves one request: locks its pool and applies the operation ([`apply`]).
pub fn serve<M: RawMutex, S: AsRef<[u64]> + AsMut<[u64]>>(
    pools: &[SharedPool<M, S>],
    request: Request,
) -> Reply {
    let answer = match pools.get(usize::from(request.pool)) {
        None => Answer::NoSuchPool,
        Some(shared) => shared
            .with(|pool| apply(pool, &request.operation))
            .unwrap_or(Answer::Busy),
    };
    Reply { request, answer }
}

/// Applies one operation to a pool and returns the core's answer unchanged.
pub fn apply<S: AsRef<[u64]> + AsMut<[u64]>>(pool: &mut Pool<S>, operation: &Operation) -> Answer {
    match operation {
        Operation::AllocateNode => Answer::Node(pool.allocate_node()),
        Operation::OccupyNode(cidrs) => Answer::Blocks(pool.occupy_node(cidrs)),
        Operation::ReleaseNode(cidrs) => Answer::Blocks(pool.release_node(cidrs)),
        Operation::CheckNode(cidrs) => Answer::Checked(pool.check_node(cidrs)),
        Operation::Occupy(cidr) => Answer::Blocks(pool.occupy(*cidr)),
        Operation::Release(cidr) => Answer::Blocks(pool.release(*cidr)),
        Operation::ReleaseBlocks {
            family,
            first,
            last,
        } => Answer::Blocks(pool.release_blocks(*family, *first, *last)),
        Operation::ReserveServiceCidr(cidr) => Answer::Blocks(pool.reserve_service_cidr(*cidr)),
        Operation::AllocatedIn(cidr) => Answer::Blocks(match pool.set_for(cidr.family()) {
            Some(set) => set.allocated_in(*cidr),
            None => Err(AllocError::NoClusterCidrForFamily { cidr: *cidr }),
        }),
        Operation::Status => {
            let mut sets = heapless::Vec::new();
            for set in pool.sets() {
                // A pool has at most 2 sets, the capacity: the push cannot fail.
                let _ = sets.push(SetStatus {
                    allocated_count: set.allocated_count(),
                    next_candidate: set.next_candidate(),
                });
            }
            Answer::Status(sets)
        }
    }
}

// ----- the script -----------------------------------------------------------------------------

/// The script's seed: fixed, so every run on every target sends the same requests. The host test
/// (`answers_match_the_model`) asserts the edges this seed's script reaches — exhaustion, cursor
/// wrap, the first and the last block of every set, every error kind; about three seeds in four
/// reach all of them, so a new seed or generator change must be checked against that test.
pub const SCRIPT_SEED: u64 = 1;

/// SplitMix64 (as in `core/benches/allocator.rs`): 64-bit arithmetic only, so the same on every
/// target.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A value in `0..bound` (0 when `bound` is 0).
    fn below(&mut self, bound: u64) -> u64 {
        self.next().checked_rem(bound).unwrap_or(0)
    }
}

/// The scripted request sequence: [`TOTAL_REQUESTS`] requests, each pool getting its
/// [`PoolSpec::requests`], interleaved pseudo-randomly ([`SCRIPT_SEED`]).
///
/// A third of the requests allocate nodes; the rest occupy, release and check CIDRs of every size
/// (sub-block, one block, many blocks, the whole cluster CIDR and larger), out-of-range and
/// other-family CIDRs, block-index ranges (some out of range or reversed), service CIDRs, and
/// status queries. Operands carry random host bits, cleared as `Cidr::new_masked` does.
#[derive(Debug, Clone)]
pub struct Script {
    rng: SplitMix64,
    remaining: [u32; POOL_COUNT],
    sequence: u32,
}

impl Default for Script {
    fn default() -> Self {
        Script::new()
    }
}

impl Script {
    /// The script from its first request.
    pub fn new() -> Self {
        let mut remaining = [0; POOL_COUNT];
        for (left, spec) in remaining.iter_mut().zip(POOLS.iter()) {
            *left = spec.requests;
        }
        Script {
            rng: SplitMix64(SCRIPT_SEED),
            remaining,
            sequence: 0,
        }
    }

    /// A pool index, weighted by the requests each pool still has to get.
    fn pick_pool(&mut self) -> Option<usize> {
        let left: u32 = self.remaining.iter().sum();
        let mut pick = self.rng.below(u64::from(left)) as u32;
        for (index, remaining) in self.remaining.iter_mut().enumerate() {
            if pick < *remaining {
                *remaining -= 1;
                return Some(index);
            }
            pick -= *remaining;
        }
        None
    }

    fn operation(&mut self, spec: &PoolSpec) -> Operation {
        let rng = &mut self.rng;
        match rng.below(100) {
            0..=33 => Operation::AllocateNode,
            34..=47 => Operation::Release(random_operand(rng, spec)),
            48..=57 => Operation::ReleaseNode(node_cidrs(rng, spec)),
            58..=65 => Operation::Occupy(random_operand(rng, spec)),
            66..=70 => Operation::OccupyNode(node_cidrs(rng, spec)),
            71..=75 => {
                let set = random_set(rng, spec);
                let family = if rng.below(10) == 0 {
                    other_family(set.cluster_cidr.family())
                } else {
                    set.cluster_cidr.family()
                };
                let blocks = u64::from(set.block_count());
                // Mostly short runs inside the set; some reach past its end or run backwards.
                let first = rng.below(blocks + 2) as u32;
                let last = if rng.below(4) == 0 {
                    rng.below(blocks + 2) as u32
                } else {
                    first.saturating_add(rng.below(70) as u32)
                };
                Operation::ReleaseBlocks {
                    family,
                    first,
                    last,
                }
            }
            76..=80 => Operation::CheckNode(node_cidrs(rng, spec)),
            81..=85 => Operation::AllocatedIn(random_operand(rng, spec)),
            86..=90 => {
                let cidr = foreign_cidr(rng, spec);
                if rng.below(2) == 0 {
                    Operation::Occupy(cidr)
                } else {
                    Operation::Release(cidr)
                }
            }
            91..=95 => Operation::Status,
            _ => Operation::ReserveServiceCidr(random_operand(rng, spec)),
        }
    }
}

impl Iterator for Script {
    type Item = Request;

    fn next(&mut self) -> Option<Request> {
        let pool = self.pick_pool()?;
        let operation = self.operation(&POOLS[pool]);
        let request = Request {
            sequence: self.sequence,
            pool: pool as u8,
            operation,
        };
        self.sequence += 1;
        Some(request)
    }
}

fn other_family(family: Family) -> Family {
    match family {
        Family::V4 => Family::V6,
        Family::V6 => Family::V4,
    }
}

fn random_set(rng: &mut SplitMix64, spec: &PoolSpec) -> SetSpec {
    spec.set(rng.below(spec.set_count()) as usize)
}

/// [`operand`] of a random set of the pool.
fn random_operand(rng: &mut SplitMix64, spec: &PoolSpec) -> Cidr {
    let set = random_set(rng, spec);
    operand(rng, set)
}

/// An address of `family` from integer bits (IPv4 in the low 32).
fn address(family: Family, bits: u128) -> IpAddr {
    match family {
        Family::V4 => IpAddr::V4(Ipv4Addr::from_bits(bits as u32)),
        Family::V6 => IpAddr::V6(Ipv6Addr::from_bits(bits)),
    }
}

/// A CIDR around a random block of `set` (one in four at either end): usually the block itself, sometimes a sub-block range
/// (1–3 bits longer), a run of blocks (1 ..= all block bits shorter) or something larger than the
/// cluster CIDR; with random host bits, which `Cidr::new_masked` clears.
fn operand(rng: &mut SplitMix64, set: SetSpec) -> Cidr {
    let width = set.width();
    let block_bits = u64::from(set.node_mask_size - set.cluster_cidr.prefix_len());
    let blocks = u64::from(set.block_count());
    // One operand in four sits on one of the two first or two last blocks: the edges of the
    // address arithmetic and of the cursor's wrap.
    let index = match rng.below(8) {
        0 => rng.below(2.min(blocks)),
        1 => blocks - 1 - rng.below(2.min(blocks)),
        _ => rng.below(blocks),
    };
    let shift = u32::from(width - set.node_mask_size);
    let block_network = u128::from(index as u32).checked_shl(shift).unwrap_or(0);
    // Random bits below the block (all 128 for a /0 block, none for a /32 or /128 one).
    let block_host_mask = u128::MAX.checked_shr(128 - shift).unwrap_or(0);
    let host_bits = (u128::from(rng.next()) << 64 | u128::from(rng.next())) & block_host_mask;
    let bits = set.cluster_cidr.network_bits() | block_network | host_bits;
    let longer_by = match rng.below(20) {
        0..=11 => 0,
        12..=13 => -1 - rng.below(3) as i16,
        14..=18 => 1 + rng.below(block_bits) as i16,
        _ => block_bits as i16 + 1 + rng.below(2) as i16,
    };
    let prefix_len = (i16::from(set.node_mask_size) - longer_by).clamp(0, i16::from(width)) as u8;
    // new_masked clears whatever host bits lie past prefix_len.
    Cidr::new_masked(address(set.cluster_cidr.family(), bits), prefix_len)
        .unwrap_or(set.cluster_cidr)
}

/// A CIDR the pool does not cover: outside a set's cluster CIDR (its first address bit flipped;
/// only possible when the cluster prefix is not /0), or of a family with no set, or failing that
/// an other-family CIDR.
fn foreign_cidr(rng: &mut SplitMix64, spec: &PoolSpec) -> Cidr {
    let set = random_set(rng, spec);
    let family = set.cluster_cidr.family();
    let width = set.width();
    if rng.below(2) == 0 && set.cluster_cidr.prefix_len() > 0 {
        let flipped = set.cluster_cidr.network_bits() ^ (1u128 << (width - 1));
        let prefix_len = set.node_mask_size.max(1);
        return Cidr::new_masked(address(family, flipped), prefix_len).unwrap_or(set.cluster_cidr);
    }
    match other_family(family) {
        Family::V4 => v4([198, 51, 100, 0], 24),
        Family::V6 => v6([0x2001, 0xdb8, 0xffff, 0, 0, 0, 0, 0], 64),
    }
}

/// 0–3 podCIDRs: usually one block per set in flag order or swapped (IPv6 first), sometimes the
/// same family twice, a foreign CIDR, none, or three.
fn node_cidrs(rng: &mut SplitMix64, spec: &PoolSpec) -> NodeCidrs {
    let mut cidrs = NodeCidrs::new();
    let count = match rng.below(20) {
        0 => 0,
        1..=6 => 1,
        7..=18 => 2,
        _ => 3,
    };
    let swap = rng.below(2) == 1;
    for slot in 0..count {
        let cidr = match rng.below(12) {
            0 => foreign_cidr(rng, spec),
            1 => random_operand(rng, spec),
            _ => {
                let index = if swap { 1 - slot.min(1) } else { slot.min(1) };
                operand(rng, spec.set(index))
            }
        };
        // Capacity is 3 and count ≤ 3: the push cannot fail.
        let _ = cidrs.push(cidr);
    }
    cidrs
}

// ----- the digest -----------------------------------------------------------------------------

/// FNV-1a (64-bit) over a fixed little-endian encoding of requests and answers: every integer at
/// its declared width (`usize` fields as `u64`), so the encoding is the same on 32- and 64-bit
/// targets.
#[derive(Default)]
pub struct Digest(FnvHasher);

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest({:#018x})", self.value())
    }
}

impl Digest {
    /// The digest so far.
    pub fn value(&self) -> u64 {
        self.0.finish()
    }

    fn u8(&mut self, value: u8) {
        self.0.write(&[value]);
    }

    fn u32(&mut self, value: u32) {
        self.0.write(&value.to_le_bytes());
    }

    fn u64(&mut self, value: u64) {
        self.0.write(&value.to_le_bytes());
    }

    fn u128(&mut self, value: u128) {
        self.0.write(&value.to_le_bytes());
    }

    fn family(&mut self, family: Family) {
        self.u8(match family {
            Family::V4 => 4,
            Family::V6 => 6,
        });
    }

    fn cidr(&mut self, cidr: &Cidr) {
        self.family(cidr.family());
        self.u128(cidr.network_bits());
        self.u8(cidr.prefix_len());
    }

    fn cidrs(&mut self, cidrs: &[Cidr]) {
        self.u8(cidrs.len() as u8);
        for cidr in cidrs {
            self.cidr(cidr);
        }
    }

    fn allocation(&mut self, allocation: &Allocation) {
        self.cidr(&allocation.cidr);
        self.u32(allocation.block_index);
        self.u32(allocation.tries);
    }

    fn error(&mut self, error: &AllocError) {
        match error {
            AllocError::Exhausted { cluster_cidr } => {
                self.u8(1);
                self.cidr(cluster_cidr);
            }
            AllocError::OutOfRange { cidr, cluster_cidr } => {
                self.u8(2);
                self.cidr(cidr);
                self.cidr(cluster_cidr);
            }
            AllocError::FamilyMismatch { cidr, cluster_cidr } => {
                self.u8(3);
                self.cidr(cidr);
                self.cidr(cluster_cidr);
            }
            AllocError::NoClusterCidrForFamily { cidr } => {
                self.u8(4);
                self.cidr(cidr);
            }
            AllocError::InvalidNodeMaskSize {
                cluster_cidr,
                node_mask_size,
            } => {
                self.u8(5);
                self.cidr(cluster_cidr);
                self.u8(*node_mask_size);
            }
            AllocError::TooManyBlocks {
                cluster_cidr,
                node_mask_size,
            } => {
                self.u8(6);
                self.cidr(cluster_cidr);
                self.u8(*node_mask_size);
            }
            AllocError::StorageTooSmall {
                needed_words,
                provided_words,
            } => {
                self.u8(7);
                self.u64(*needed_words as u64);
                self.u64(*provided_words as u64);
            }
            AllocError::BlockIndexOutOfRange {
                block_index,
                block_count,
            } => {
                self.u8(8);
                self.u32(*block_index);
                self.u32(*block_count);
            }
            AllocError::InvalidBlockPrefixLen {
                prefix_len,
                cluster_cidr,
                node_mask_size,
            } => {
                self.u8(9);
                self.u8(*prefix_len);
                self.cidr(cluster_cidr);
                self.u8(*node_mask_size);
            }
            AllocError::TooManyCidrs { count } => {
                self.u8(10);
                self.u64(*count as u64);
            }
            AllocError::DuplicateFamily { family } => {
                self.u8(11);
                self.family(*family);
            }
            AllocError::NoClusterCidr => self.u8(12),
            AllocError::ServiceCidrFillsClusterCidr {
                service_cidr,
                cluster_cidr,
            } => {
                self.u8(13);
                self.cidr(service_cidr);
                self.cidr(cluster_cidr);
            }
            // `AllocError` is non-exhaustive: a variant added later still changes the digest.
            _ => self.u8(0xff),
        }
    }

    fn request(&mut self, request: &Request) {
        self.u32(request.sequence);
        self.u8(request.pool);
        match &request.operation {
            Operation::AllocateNode => self.u8(1),
            Operation::OccupyNode(cidrs) => {
                self.u8(2);
                self.cidrs(cidrs);
            }
            Operation::ReleaseNode(cidrs) => {
                self.u8(3);
                self.cidrs(cidrs);
            }
            Operation::CheckNode(cidrs) => {
                self.u8(4);
                self.cidrs(cidrs);
            }
            Operation::Occupy(cidr) => {
                self.u8(5);
                self.cidr(cidr);
            }
            Operation::Release(cidr) => {
                self.u8(6);
                self.cidr(cidr);
            }
            Operation::ReleaseBlocks {
                family,
                first,
                last,
            } => {
                self.u8(7);
                self.family(*family);
                self.u32(*first);
                self.u32(*last);
            }
            Operation::ReserveServiceCidr(cidr) => {
                self.u8(8);
                self.cidr(cidr);
            }
            Operation::AllocatedIn(cidr) => {
                self.u8(9);
                self.cidr(cidr);
            }
            Operation::Status => self.u8(10),
        }
    }

    fn answer(&mut self, answer: &Answer) {
        match answer {
            Answer::Node(Ok(allocations)) => {
                self.u8(1);
                self.u8(allocations.len() as u8);
                for allocation in allocations {
                    self.allocation(allocation);
                }
            }
            Answer::Node(Err(error)) => {
                self.u8(2);
                self.error(error);
            }
            Answer::Blocks(Ok(blocks)) => {
                self.u8(3);
                self.u32(*blocks);
            }
            Answer::Blocks(Err(error)) => {
                self.u8(4);
                self.error(error);
            }
            Answer::Checked(Ok(())) => self.u8(5),
            Answer::Checked(Err(error)) => {
                self.u8(6);
                self.error(error);
            }
            Answer::Status(sets) => {
                self.u8(7);
                self.u8(sets.len() as u8);
                for set in sets {
                    self.u32(set.allocated_count);
                    self.u32(set.next_candidate);
                }
            }
            Answer::NoSuchPool => self.u8(8),
            Answer::Busy => self.u8(9),
        }
    }

    /// Folds one request and its answer in.
    pub fn reply(&mut self, reply: &Reply) {
        self.request(&reply.request);
        self.answer(&reply.answer);
    }
}

/// Counters and digest of one pool's replies.
#[derive(Debug, Default)]
pub struct PoolSummary {
    /// Replies received.
    pub replies: u32,
    /// Nodes allocated (`AllocateNode` answered `Ok`).
    pub node_allocations: u32,
    /// `Exhausted` answers.
    pub exhausted: u32,
    /// Other error answers (out of range, family, index, too many CIDRs, …).
    pub other_errors: u32,
    /// Digest of this pool's requests and answers, in order.
    pub digest: Digest,
}

/// A reply arrived out of order: the agent lost, duplicated or reordered a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutOfSequence {
    /// The sequence number expected next.
    pub expected: u32,
    /// The one received.
    pub received: u32,
}

/// Everything the report says: per-pool counters and digests and the digest of all replies.
#[derive(Debug, Default)]
pub struct Summary {
    /// Per pool, [`POOLS`] order.
    pub pools: [PoolSummary; POOL_COUNT],
    /// Digest of every request and answer, in sequence order.
    pub all: Digest,
    /// Replies received.
    pub replies: u32,
}

impl Summary {
    /// Records one reply (they must come in sequence order, from 0).
    ///
    /// # Errors
    /// [`OutOfSequence`] if `reply` is not the next in sequence; nothing is recorded.
    pub fn record(&mut self, reply: &Reply) -> Result<(), OutOfSequence> {
        if reply.request.sequence != self.replies {
            return Err(OutOfSequence {
                expected: self.replies,
                received: reply.request.sequence,
            });
        }
        self.replies += 1;
        self.all.reply(reply);
        if let Some(pool) = self.pools.get_mut(usize::from(reply.request.pool)) {
            pool.replies += 1;
            pool.digest.reply(reply);
            let error = match &reply.answer {
                Answer::Node(Ok(_)) => {
                    pool.node_allocations += 1;
                    None
                }
                Answer::Node(Err(error))
                | Answer::Blocks(Err(error))
                | Answer::Checked(Err(error)) => Some(error),
                _ => None,
            };
            match error {
                Some(AllocError::Exhausted { .. }) => pool.exhausted += 1,
                Some(_) => pool.other_errors += 1,
                None => {}
            }
        }
        Ok(())
    }

    /// Whether all [`TOTAL_REQUESTS`] replies are in.
    pub fn is_complete(&self) -> bool {
        self.replies == TOTAL_REQUESTS
    }

    /// The report, one line per pool and a last line for everything, each starting
    /// `edge-agent: `. The firmware prints it over semihosting; the host test compares those lines
    /// with its own.
    ///
    /// # Errors
    /// Whatever `out` returns.
    pub fn write_report(&self, out: &mut impl fmt::Write) -> fmt::Result {
        for (index, (spec, pool)) in POOLS.iter().zip(self.pools.iter()).enumerate() {
            write!(out, "edge-agent: pool {index} [")?;
            for (n, set) in spec.sets().enumerate() {
                let separator = if n == 0 { "" } else { ", " };
                write!(
                    out,
                    "{separator}{} /{}",
                    set.cluster_cidr, set.node_mask_size
                )?;
            }
            writeln!(
                out,
                "]: {} requests, {} nodes allocated, {} exhausted, {} other errors, digest {:016x}",
                pool.replies,
                pool.node_allocations,
                pool.exhausted,
                pool.other_errors,
                pool.digest.value()
            )?;
        }
        writeln!(
            out,
            "edge-agent: all {} requests, digest {:016x}",
            self.replies,
            self.all.value()
        )
    }
}
