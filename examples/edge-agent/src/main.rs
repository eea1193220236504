//! An edge agent on bare metal: `nodeipam-core` on a Cortex-M4F (QEMU's `mps2-an386` board,
//! target `thumbv7em-none-eabihf`), with no allocator and no heap.
//!
//! Shape of the agent — three tasks on an `embassy-executor` thread executor, talking through two
//! `embassy-sync` channels in static memory:
//!
//! ```text
//! transport ──REQUESTS──▶ agent ──REPLIES──▶ reporter
//!  (script)              (SharedPool)        (digest, report, exit)
//! ```
//!
//! - `transport` sends the scripted requests ([`workload::Script`]: 16,500 allocate / occupy /
//!   release / check / status requests over six IPv4, IPv6 and dual-stack pools);
//! - `agent` serves each with the pools' `SharedPool`s ([`workload::serve`]), whose bitmaps are
//!   slices of one static arena sized with `storage_words_for`;
//! - `reporter` folds every reply into the digest ([`workload::Summary`]), prints the report over
//!   semihosting and exits QEMU with status 0, or 1 if a reply came out of sequence, the pools
//!   could not be built, or anything panicked or faulted.
//!
//! The host test `core/tests/edge_agent.rs` runs the same script through the same code on x86-64
//! and compares its report with this firmware's output. Run:
//! `cd examples/edge-agent && cargo run --release` (needs `qemu-system-arm`).
#![no_std]
#![no_main]
#![deny(unsafe_code)]

mod workload;

use core::fmt::Write;

use cortex_m_rt::{ExceptionFrame, entry, exception};
use cortex_m_semihosting::{debug, hio};
use embassy_executor::{Executor, Spawner};
use embassy_sync::blocking_mutex::raw::CriticalSectionRawMutex;
use embassy_sync::channel::Channel;
use nodeipam_core::{CidrSet, Pool, SharedPool};
use panic_semihosting as _;
use static_cell::{ConstStaticCell, StaticCell};

use workload::{ARENA_WORDS, Reply, Request, Script, SharedPools, Summary};

/// Requests (and replies) a channel holds before its sender waits.
const QUEUE_DEPTH: usize = 8;

/// A set's bitmap: a slice of [`ARENA`].
type Storage = &'static mut [u64];

/// The pools, each behind a critical-section mutex (tasks may run at different interrupt
/// levels in a real agent).
type Pools = SharedPools<CriticalSectionRawMutex, Storage>;

/// The bitmaps of every pool: [`ARENA_WORDS`] words, zero-initialised (`.bss`).
static ARENA: ConstStaticCell<[u64; ARENA_WORDS]> = ConstStaticCell::new([0; ARENA_WORDS]);

/// The pools, built at start-up from [`workload::POOLS`].
static POOLS: StaticCell<Pools> = StaticCell::new();

static EXECUTOR: StaticCell<Executor> = StaticCell::new();

/// Transport → agent.
static REQUESTS: Channel<CriticalSectionRawMutex, Request, QUEUE_DEPTH> = Channel::new();

/// Agent → reporter.
static REPLIES: Channel<CriticalSectionRawMutex, Reply, QUEUE_DEPTH> = Channel::new();

#[entry]
fn main() -> ! {
    print_memory_figures();
    let pools = match build_pools() {
        Ok(pools) => pools,
        Err(error) => fail(format_args!("cannot build the pools: {error:?}")),
    };
    let executor = EXECUTOR.init(Executor::new());
    executor.run(|spawner| spawn_tasks(spawner, pools))
}

/// Hands each set a slice of [`ARENA`], in [`workload::POOLS`] order.
fn build_pools() -> Result<&'static Pools, workload::SetupError> {
    let mut rest: Storage = ARENA.take();
    let pools = workload::build_pools(|words| {
        let all = core::mem::take(&mut rest);
        let (mine, others) = all.split_at_mut(words.min(all.len()));
        rest = others;
        mine
    })?;
    Ok(POOLS.init(pools))
}

fn spawn_tasks(spawner: Spawner, pools: &'static Pools) {
    spawner.spawn(agent(pools).unwrap_or_else(|_| fail(format_args!("cannot spawn agent"))));
    spawner.spawn(reporter().unwrap_or_else(|_| fail(format_args!("cannot spawn reporter"))));
    spawner.spawn(transport().unwrap_or_else(|_| fail(format_args!("cannot spawn transport"))));
}

/// Sends the script's requests, waiting whenever the queue is full.
#[embassy_executor::task]
async fn transport() {
    for request in Script::new() {
        REQUESTS.send(request).await;
    }
}

/// Serves requests for ever.
#[embassy_executor::task]
async fn agent(pools: &'static Pools) {
    loop {
        let request = REQUESTS.receive().await;
        REPLIES.send(workload::serve(pools, request)).await;
    }
}

/// Folds every reply into the summary, prints the report and exits.
#[embassy_executor::task]
async fn reporter() {
    let mut summary = Summary::default();
    while !summary.is_complete() {
        let reply = REPLIES.receive().await;
        if let Err(error) = summary.record(&reply) {
            fail(format_args!("reply out of sequence: {error:?}"));
        }
    }
    let mut out = Semihosting;
    if summary.write_report(&mut out).is_err() {
        fail(format_args!("cannot write the report"));
    }
    debug::exit(debug::EXIT_SUCCESS);
}

/// Sizes as this target lays them out (32-bit pointers, 8-byte `u128` alignment).
fn print_memory_figures() {
    let _ = writeln!(
        Semihosting,
        "edge-agent: target sizes: arena {} words = {} bytes; CidrSet<&mut [u64]> {} bytes; \
         Pool {} bytes; SharedPool {} bytes; Request {} bytes; Reply {} bytes; queues 2 x {}",
        ARENA_WORDS,
        ARENA_WORDS * 8,
        size_of::<CidrSet<Storage>>(),
        size_of::<Pool<Storage>>(),
        size_of::<SharedPool<CriticalSectionRawMutex, Storage>>(),
        size_of::<Request>(),
        size_of::<Reply>(),
        QUEUE_DEPTH,
    );
}

/// Semihosting standard output as a `fmt::Write` (opened per write: no state to keep).
struct Semihosting;

impl Write for Semihosting {
    fn write_str(&mut self, text: &str) -> core::fmt::Result {
        let mut out = hio::hstdout().map_err(|_| core::fmt::Error)?;
        out.write_all(text.as_bytes()).map_err(|_| core::fmt::Error)
    }
}

/// Prints `why` and exits QEMU with a failure status.
fn fail(why: core::fmt::Arguments<'_>) -> ! {
    let _ = writeln!(Semihosting, "edge-agent: FAILED: {why}");
    debug::exit(debug::EXIT_FAILURE);
    loop {
        cortex_m::asm::wfi();
    }
}

/// A fault is a bug (every core function is total): report it and exit with a failure status
/// instead of hanging until CI's timeout.
// SAFETY: cortex-m-rt requires the HardFault handler to be an `unsafe fn`; this one only reads
// the stacked frame it is given and calls the semihosting exit, which is safe to call from any
// context.
#[allow(unsafe_code)]
#[exception]
unsafe fn HardFault(frame: &ExceptionFrame) -> ! {
    fail(format_args!("hard fault at pc {:#010x}", frame.pc()))
}
