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
//!   could not be built, anything panicked or faulted, or (with `--features whole-api`) the
//!   whole-API check at boot got a wrong result.
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
    #[cfg(feature = "whole-api")]
    whole_api::check();
    let pools = match build_pools() {
        Ok(pools) => pools,
        // The host test builds the same pools and shows the core's error in full; printing only
        // the pool keeps `Debug` formatting of errors out of the firmware.
        Err(error) => fail(format_args!("cannot build pool {}", error.pool())),
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
            fail(format_args!(
                "reply {} arrived when {} was expected",
                error.received, error.expected
            ));
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

/// With `--features whole-api`, the rest of the core's public API runs on the target too — flag
/// validation, strict CIDR parsing, aligned allocation, error text — so BENCHMARKS.md can give the
/// footprint of the whole core, not only of the allocator calls the agent makes. One report line;
/// a wrong result fails the run.
#[cfg(feature = "whole-api")]
mod whole_api {
    use core::fmt::Write;
    use core::hint::black_box;

    use nodeipam_core::config::{NodeMaskFlags, validate};
    use nodeipam_core::{Cidr, CidrSet, storage_words_for};

    use super::{Semihosting, fail, workload};

    pub(super) fn check() {
        // kubeadm's dual-stack flags: the cluster CIDRs and masks of POOLS[0].
        let cluster_flag = black_box("10.244.0.0/16,fd00:10:244::/56");
        let config = validate(
            cluster_flag,
            black_box("10.96.0.0/12"),
            NodeMaskFlags::default(),
        )
        .unwrap_or_else(|error| fail(format_args!("--cluster-cidr={cluster_flag}: {error}")));
        let pool = &workload::POOLS[0];
        let matches = config.cluster_cidrs.len() == 2
            && pool
                .sets()
                .zip(config.cluster_cidrs.iter())
                .all(|(spec, flag)| {
                    spec.cluster_cidr == flag.cluster_cidr
                        && spec.node_mask_size == flag.node_mask_size
                });
        if !matches {
            fail(format_args!(
                "--cluster-cidr={cluster_flag} does not give POOLS[0]"
            ));
        }
        // A strict parse refuses host bits, with an error text.
        let pod_cidr = black_box("10.244.1.7/24");
        let refused = match Cidr::parse(pod_cidr) {
            Err(error) => error,
            Ok(cidr) => fail(format_args!("{pod_cidr} parsed as {cidr}")),
        };
        // Aligned allocation on a scratch /16 cut into /24s: first fit is 10.244.0.0/20.
        let mut words = [0u64; storage_words_for(16, 24)];
        let cluster = config.cluster_cidrs[0].cluster_cidr;
        let mut set = CidrSet::new(cluster, 24, &mut words[..])
            .unwrap_or_else(|error| fail(format_args!("{cluster} /24: {error}")));
        let aligned = set
            .allocate_aligned(black_box(20))
            .unwrap_or_else(|error| fail(format_args!("aligned /20: {error}")));
        if aligned.first_block_index != 0 || aligned.block_count != 16 {
            fail(format_args!("aligned /20 gave {}", aligned.cidr));
        }
        let foreign = Cidr::parse(black_box("192.0.2.0/24"))
            .unwrap_or_else(|error| fail(format_args!("192.0.2.0/24: {error}")));
        let out_of_range = match set.occupy(foreign) {
            Err(error) => error,
            Ok(_) => fail(format_args!("{foreign} occupied in {cluster}")),
        };
        let _ = writeln!(
            Semihosting,
            "edge-agent: whole API: --cluster-cidr={cluster_flag} validated; {pod_cidr} refused: \
             {refused}; aligned /20: {}; occupy {foreign}: {out_of_range}",
            aligned.cidr
        );
    }
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
