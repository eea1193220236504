//! Proof that `nodeipam-core` needs no heap: a `#![no_std]`, `#![no_main]` host binary with no
//! global allocator (and no `alloc` crate) that runs the allocator — a 65,536-block `CidrSet` in a
//! stack array, `allocate_next`, `occupy`, `release`, `allocate_aligned`, a dual-stack `Pool` on
//! borrowed slices, parsing, `Display` and flag validation — and checks every result.
//!
//! It links only because nothing in the core allocates: any use of `alloc` would fail with "no
//! global memory allocator found". Exit status 0 means every check passed; a failed check exits
//! with its own non-zero code (see [`run`]); a panic spins (CI runs it under `timeout`).
//!
//! Build and run: `cargo build --release --manifest-path core/nostd-proof/Cargo.toml` then
//! `core/nostd-proof/target/release/nodeipam-nostd-proof; echo $?`.
#![no_std]
#![no_main]
#![deny(unsafe_code)]

use core::fmt::Write;
use core::panic::PanicInfo;

use nodeipam_core::config::validate;
use nodeipam_core::{
    AllocError, BlockRequest, Cidr, CidrSet, NodeMaskFlags, Placement, Pool, storage_words_for,
};

/// Storage words for 10.0.0.0/8 cut into /24s: 65,536 blocks (BENCHMARKS W1).
const W1_WORDS: usize = storage_words_for(8, 24);

/// `size_of` of a 65,536-block set held by value: the bitmap plus the set's header.
pub const W1_SET_BYTES: usize = core::mem::size_of::<CidrSet<[u64; W1_WORDS]>>();

// The set is its storage plus a small header: no hidden buffers.
const _: () = assert!(
    W1_SET_BYTES <= W1_WORDS * 8 + 128,
    "CidrSet<[u64; N]> should be its bitmap plus at most 128 bytes of header"
);

/// `Ok` if `condition`, else the check's exit code.
fn check(condition: bool, code: u8) -> Result<(), u8> {
    if condition { Ok(()) } else { Err(code) }
}

fn cidr(text: &str, code: u8) -> Result<Cidr, u8> {
    Cidr::parse(text).map_err(|_| code)
}

fn shows_as(value: &Cidr, text: &str, code: u8) -> Result<(), u8> {
    let mut shown: heapless::String<64> = heapless::String::new();
    write!(shown, "{value}").map_err(|_| code)?;
    check(shown.as_str() == text, code)
}

/// The checks; `Err(code)` names the first that failed (codes 1–34).
fn run() -> Result<(), u8> {
    // A 65,536-block set in a stack array (8,328 bytes of bitmap).
    let cluster = cidr("10.0.0.0/8", 1)?;
    let mut set = CidrSet::new(cluster, 24, [0u64; W1_WORDS]).map_err(|_| 2)?;
    check(set.block_count() == 65_536, 3)?;

    let first = set.allocate_next().map_err(|_| 4)?;
    check(first.block_index == 0 && first.tries == 0, 5)?;
    shows_as(&first.cidr, "10.0.0.0/24", 6)?;

    check(set.occupy(cidr("10.0.1.0/24", 7)?) == Ok(1), 8)?;
    let second = set.allocate_next().map_err(|_| 9)?;
    check(second.block_index == 2 && second.tries == 1, 10)?;

    check(set.release(cidr("10.0.0.0/24", 11)?) == Ok(1), 12)?;
    check(set.release(cidr("10.0.0.0/24", 11)?) == Ok(0), 13)?;
    check(
        set.allocated_count() == 2 && set.is_allocated(0) == Ok(false),
        14,
    )?;

    // Round-robin: the cursor is past block 2, so block 0 is not reused yet.
    let third = set.allocate_next().map_err(|_| 15)?;
    check(third.block_index == 3, 16)?;

    // Aligned /20 (16 blocks): first fit from block 0 skips the allocated 1–3 → 10.0.16.0/20.
    let aligned = set.allocate_aligned(20).map_err(|_| 17)?;
    shows_as(&aligned.cidr, "10.0.16.0/20", 18)?;

    // Fill the set: exactly the free blocks succeed, then `Exhausted`, and a failed call changes
    // nothing.
    let free = set.free_count();
    let mut allocated = 0u32;
    while set.allocate_next().is_ok() {
        allocated += 1;
    }
    check(allocated == free && set.free_count() == 0, 19)?;
    let cursor = set.next_candidate();
    let exhausted = set.allocate_next();
    check(
        exhausted
            == Err(AllocError::Exhausted {
                cluster_cidr: cluster,
            })
            && set.next_candidate() == cursor,
        20,
    )?;
    check(set.occupy(cidr("fd00::/64", 21)?).is_err(), 22)?;

    // Dual-stack pool on borrowed slices: 10.0.0.0/16 (/24) + fd00::/120 (/121). The IPv6 side is
    // exhausted after 2 nodes; the 3rd node fails and the IPv4 side does not leak a block.
    let mut v4_words = [0u64; storage_words_for(16, 24)];
    let mut v6_words = [0u64; storage_words_for(120, 121)];
    let v4 = CidrSet::new(cidr("10.0.0.0/16", 23)?, 24, &mut v4_words[..]).map_err(|_| 23)?;
    let v6 = CidrSet::new(cidr("fd00::/120", 23)?, 121, &mut v6_words[..]).map_err(|_| 23)?;
    let mut pool = Pool::new(v4, Some(v6)).map_err(|_| 24)?;
    let node = pool.allocate_node().map_err(|_| 25)?;
    check(node.len() == 2, 25)?;
    shows_as(&node[1].cidr, "fd00::/121", 25)?;
    pool.allocate_node().map_err(|_| 26)?;
    check(pool.allocate_node().is_err(), 27)?;
    check(pool.sets()[0].allocated_count() == 2, 28)?;

    // Per-Node sizes on a /26 grid (cloud-provider-azure's vector): /24 first fit, then a /26 from
    // the cursor, then a /24 first fit; the largest free block is then the /17 at 10.244.128.0.
    let mut grid_words = [0u64; storage_words_for(16, 26)];
    let mut grid =
        CidrSet::new(cidr("10.244.0.0/16", 30)?, 26, &mut grid_words[..]).map_err(|_| 30)?;
    let request = |prefix_len, placement| BlockRequest {
        prefix_len,
        placement,
    };
    let big = grid
        .allocate_block(request(24, Placement::FirstFit))
        .map_err(|_| 31)?;
    shows_as(&big.cidr, "10.244.0.0/24", 31)?;
    let small = grid
        .allocate_block(request(26, Placement::NextFromCursor))
        .map_err(|_| 32)?;
    shows_as(&small.cidr, "10.244.1.0/26", 32)?;
    let next = grid
        .allocate_block(request(24, Placement::FirstFit))
        .map_err(|_| 33)?;
    shows_as(&next.cidr, "10.244.2.0/24", 33)?;
    let largest = grid.largest_free_block().ok_or(34)?;
    shows_as(&largest.cidr, "10.244.128.0/17", 34)?;

    // Flag validation, allocation-free.
    let config = validate(
        "10.244.0.0/16,fd00:10:244::/56",
        "10.96.0.0/12",
        NodeMaskFlags::default(),
    )
    .map_err(|_| 29)?;
    check(
        config.is_dual_stack()
            && config.cluster_cidrs[0].node_mask_size == 24
            && config.cluster_cidrs[1].node_mask_size == 64,
        29,
    )?;
    Ok(())
}

/// The C entry point, called by the C runtime's `_start` through `__libc_start_main`.
// SAFETY: `#![no_main]` and no `std` mean nothing else in the link defines the `main` symbol, and
// this signature is the C `int main(int, char **)` that crt1.o calls; the body is safe Rust.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn main(_argc: i32, _argv: *const *const u8) -> i32 {
    match run() {
        Ok(()) => 0,
        Err(code) => i32::from(code),
    }
}

/// The unwinding personality routine. The precompiled `core` (built with `panic = "unwind"`) names
/// `rust_eh_personality` in its unwind tables, and `std`, which defines it, is absent; with
/// `panic = "abort"` nothing ever unwinds, so this is never called. (Optimised LTO builds drop the
/// reference; unoptimised ones do not link without this stub.)
// SAFETY: the symbol is defined nowhere else in the link (no `std`, no `panic_unwind`); it is only
// ever called by an unwinder during unwinding, and with `panic = "abort"` in both profiles and no
// foreign code raising exceptions, no unwinding happens.
#[allow(unsafe_code)]
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

/// A panic would be a bug in the core (every function is total): spin, so the run times out and
/// fails instead of exiting 0.
#[panic_handler]
fn panic(_info: &PanicInfo<'_>) -> ! {
    loop {
        core::hint::spin_loop();
    }
}
