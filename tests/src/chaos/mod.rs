//! The chaos suite: a seeded random schedule of cluster churn and API faults, run against the
//! real controller (`nodeipam::controller::run`, in-process) on the sandbox API server, with the
//! invariants checked at **every** state the server passes through and again after quiescence.
//! `tests/tests/chaos.rs` runs fixed seeds under `cargo test` and thousands in an ignored test;
//! RELIABILITY.md records the runs.
//!
//! # A seed
//!
//! [`Plan::generate`] turns a seed number into everything the run does, from one ChaCha8 stream
//! (value-stable: the same plan on every machine), printed in full when the seed fails:
//!
//! - the **network**: one of [`NETWORKS`] (IPv4, IPv4 with only 240 usable blocks, dual-stack
//!   IPv4-first and IPv6-first, IPv6; service CIDRs inside cluster CIDRs reserve blocks);
//! - the **controller settings**: one replica (no leader election: as the binary with
//!   `--leader-elect=false`, its write intents live in the fence Lease, which a restarted process
//!   takes at once) or two with leader election on one Lease (lease
//!   2 s / renew deadline 1.5 s / retry 200 ms, or 3 s / 2 s / 300 ms; the one replica's fence
//!   Lease has the same settings); request timeout 500 ms
//!   (the Lease makes it 1 s: `controller::write_timeout`); retries 5 → 100 ms; 1, 4 or 30
//!   workers; 20 % of seeds (35 % with leader election) pace writes at 50/s with a burst of 5,
//!   so PATCHes queue at the token bucket after the write gate let them through; streaming list or paged LIST; a watch history of 5,000 or 300 changes (the small one
//!   makes `410 Gone` happen by itself);
//! - **200–500 Nodes** created over the run, copies of the 19 real Nodes of fixtures 05–10
//!   (renamed `aws-17`, `ocp-gcp-203`, …; a quarter to a half exist at the start, up to 60 % of
//!   those already with podCIDRs from "an earlier allocator", 8 % with a finalizer);
//! - the **schedule**, spread over 2–4 s with bursts: creations; deletions (a Node with a
//!   finalizer stays terminating until its finalizer is removed, another step); re-creation under
//!   the same name (a new uid); label churn and kubelet-style status heartbeats (events that
//!   change no podCIDR); Nodes created with podCIDRs by another actor; fault rules; dropped
//!   watches; compaction (`410 Gone`); slow responses; and 1–3 **controller events**: `kill -9`
//!   (half of the time right after a burst of new Nodes, with a late write in flight), a clean
//!   stop (right after a burst of new Nodes, with an early-answered late write in flight), each
//!   followed by a start 20–600 ms later; with leader election a Lease loss (Lease requests hang
//!   past the renew deadline and fail, so the leader gives up and the standby takes over once the
//!   faults are spent), right after a burst of new Nodes, starting once one of its late writes is
//!   in flight; or a quiescent point where foreign in-range Nodes are added;
//! - from a stream of the seed of its own (module `edges`, issue 30; the draws above are what
//!   they were before): a quarter of the late writes **delivered late** (applied up to 60 s after
//!   they arrived, whatever their `timeout=`), and 0–2 **edge events** aimed at the write-intent
//!   fence: a leader killed or deposed with delivered-late PATCHes on the wire (their Nodes'
//!   other PATCHes refused until they land), renewals failing while new Nodes' PATCHes start
//!   just before the write gate closes and are delivered around their deadline or later, a
//!   takeover right after a Lease UPDATE (an intent write) whose answer was lost.
//!
//! # Faults injected
//!
//! Times are relative to the request timeout *T* the controller uses:
//!
//! | target | faults |
//! |---|---|
//! | Node PATCH | 500/502/503; 409 Conflict; 429 with `Retry-After: 1`; hang 0.5–2 *T* (504, not run); delay 0.05–1.3 *T* then run (not run past the deadline); commit then 500/503/504; commit then hang 0.5–2 *T*; **late write**: committed 0.1–1.2 *T* after arrival (refused past the request's deadline), the client answered earlier with a 504 or a dropped connection; **delivered late**: applied 0.8 *T* – 60 s after arrival whatever its deadline (`edges::delivery_delay`) |
//! | Node GET (re-read after a refusal) | 500; hang; delay |
//! | Node LIST / WATCH (informer) | 500/503; hang; delay; dropped watches; compaction (410) |
//! | Event POST | 500; hang |
//! | Lease GET / UPDATE (the leader-election or fence Lease) | 500/503; 409; hang; delay; late write and delivered late (UPDATE); commit then 504 (UPDATE, right before a kill) |
//! | every response | a delay of 0–150 ms for a while |
//! | the controller | `kill -9` (abort of the `run()` task: every future dropped, in-flight requests cut, no Lease release) mid-PATCH with a late write in flight, or anywhere; clean stop with an early-answered late write in flight; restart (a new identity); with two replicas the leader killed, stopped, or made to lose the Lease, and the standby taking over |
//!
//! Faults a conformant API server never produces are not injected: no false 404 or 422 (the
//! controller treats both as definite and releases). A write committed after its own deadline is
//! injected only as a request *delivered* late (the deadline starts when a request arrives).
//!
//! The end phase waits (at most 65 s) until every late write has run before it clears the
//! faults, so a delivered-late write lands while its Node's other PATCHes are still refused.
//! `CHAOS_NO_WRITE_INTENTS=1` runs the controllers without write intents (the design before
//! issue 30) to show the suite finds what they prevent (RELIABILITY.md).
//!
//! # Nodes with podCIDRs from another actor
//!
//! Two allocators writing podCIDRs into the same range can collide whatever either does, so the
//! actor only sets podCIDRs where no controller allocation can be: **outside every cluster CIDR**
//! (the controller must skip the Node, out of range), **inside a service CIDR** that lies in a
//! cluster CIDR (skipped, conflict; those blocks are reserved for good), or **inside a cluster
//! CIDR at a quiescent point** — every controller stopped cleanly, the sandbox idle (no request,
//! no late write in flight: [`crate::sandbox::SandboxHandle::in_flight`]) — in blocks free at
//! that moment (one block, two blocks or half a block); the controllers started next must occupy
//! them.
//!
//! # Invariants
//!
//! At every committed write (commit observers, under the store lock):
//! 1. no two Nodes' podCIDRs overlap ([`crate::monitor::OverlapMonitor`]);
//! 2. a podCIDR set by an update is a controller allocation: one block per cluster CIDR, flag
//!    order, exactly the node mask size, inside its cluster CIDR, outside every service CIDR,
//!    `spec.podCIDR = spec.podCIDRs[0]`; podCIDRs once set never change ([`AllocationMonitor`]).
//!
//! Over the request log: 3. every Node PATCH is pinned to a uid, carries `timeout=` equal to the
//! controller's request timeout and its field manager, and one controller process sends one Node
//! object only one set of podCIDRs ([`check_patches`]).
//!
//! During the run: 4. no controller fails, panics or returns unless stopped (with leader
//! election, exiting after losing the Lease is expected; the replica is replaced).
//!
//! After quiescence (faults cleared, terminating Nodes let go, controllers running, every late
//! write run, the leader's pool usage equal to the blocks the Nodes hold, at every check for 200 ms),
//! with the last leader stopped cleanly and its `RunSummary` compared with the Nodes
//! ([`crate::invariants::check`]): 5. every servable Node is served — unless a cluster CIDR is
//! full, when waiting is legitimate; 6. no overlap, every podCIDR inside a cluster CIDR and
//! outside the service CIDRs; 7. nothing leaked: the pool's usage equals the blocks Nodes and
//! service CIDRs cover, and what the controller holds per Node is what the Node has. A leader
//! that loses the Lease between the settled check and its stop (invariant 4 allows a loss at any
//! time) leaves no summary: the end phase then starts new replicas and settles again (at most
//! `MAX_RESETTLES` times, each logged and counted in `SeedReport::resettles`); a seed that still
//! has no leader's summary fails.
//!
//! # The ClusterCIDR variant
//!
//! `Plan::generate_with_cluster_cidrs` (module `pools`; the `cluster_cidr_seeds` test, or
//! `CHAOS_CLUSTER_CIDRS=1`) runs a seed's plan with the controllers serving ClusterCIDR objects
//! (`--cidr-allocator-type=MultiCIDRRangeAllocator`): a selector-less fallback pool from the start
//! (disjoint from the flag CIDRs, or a supernet of them), and 2–5 steps creating selector pools
//! (inside the flag CIDR with finer or coarser blocks, or small and disjoint; selectors on the
//! fixture Nodes' real labels and the churned one) or deleting one. Invariant 2 then also accepts
//! an allocation of one ClusterCIDR that exists at the commit; a ClusterCIDR may be removed only
//! while no Node holds a podCIDR inside it; at the end every servable Node is served, the
//! leader's usage matches per backing address space, and the finalizer is on every live pool and
//! gone from every deleted one no Node holds a block of.
//!
//! # Reproducing
//!
//! Each replica and the sandbox run on a tokio runtime of their own (`ProcessRuntime`), as each is
//! a process of its own in a cluster: another seed's work, or the driver's, cannot hold up a
//! leader's Lease timers (seed 10207, RELIABILITY.md).
//!
//! The plan is a function of the seed; the interleaving of the controller's tasks, the sandbox and
//! the driver is not (real sockets, real time, threads), so a failing seed may need a few runs
//! (`CHAOS_SEED=n CHAOS_REPEAT=20`) to fail again. The failure report lists the violations, the
//! plan and the driver's log with times.

mod checks;
mod driver;
mod edges;
mod phases;
mod plan;
mod pools;
mod process;
mod watchdog;

pub use checks::{AllocationMonitor, Assignment, allocation_problem, check_patches, pool_usage};
pub use driver::{
    MAX_RESETTLES, SETTLE_TIMEOUT, SeedFailure, SeedReport, build_node, cluster_spec,
    controller_view, run_plan, run_seed, run_seed_variant, write_intents_off,
};
pub use edges::{EDGE_STREAM, Edge, delivery_delay};
pub use phases::{PhaseTimes, SettleWait};
pub use plan::{
    Action, CHURN_LABEL, FINALIZER, ForeignKind, LeaseTiming, NETWORKS, Network, NodeSpec, Plan,
    Step, TEMPLATE_FIXTURES, Template, block, block_count, family_bits, templates,
};
pub use pools::{FALLBACK_POOL, POOL_FINALIZER, PoolPlan, PoolSpec, PoolWatch};
pub use process::ProcessRuntime;
pub use watchdog::{Lateness, NOTABLE, TICK, Watchdog};
