//! A new leader's first duty: the write intents its predecessor left in the Lease (issue 30).

use std::sync::{Mutex, PoisonError};

use nodeipam_core::Cidr;

use super::Health;
use super::informer::NodeCache;
use crate::leader::{WriteIntent, WriteIntents};
use crate::metrics as m;
use crate::reconcile::Allocator;

/// How the inherited intents were resolved at start-up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct Inherited {
    /// Reserved for their unserved Nodes as writes in doubt (and sent again).
    pub(super) reserved: usize,
    /// Settled: the Node has podCIDRs, is gone, or is another object now.
    pub(super) settled: usize,
    /// Could not be reserved (see the error log): their write may land on blocks held otherwise.
    pub(super) conflicting: usize,
}

/// Reserves, after the start-up occupy and before the first allocation, the blocks of every write
/// a predecessor may still land: each intent inherited with the Lease whose Node is listed with
/// the intent's uid and no podCIDRs becomes a write in doubt
/// ([`Allocator::seed_write_in_doubt`]); every other intent can no longer change anything and
/// leaves the Lease. Logs each one, and publishes the pool figures (gauges and health) as the
/// seeding left them: a reserved block counts as used from now on, and the write that later
/// shows it applied changes no figure (found by the chaos suite, seed 21: an exhausted pool whose
/// reported usage stayed at the start-up occupy's, 11 blocks short, once a takeover inherited 11
/// unsent intents of Nodes decided ahead).
pub(super) fn seed_inherited_intents(
    allocator: &Mutex<Allocator>,
    cache: &NodeCache,
    intents: &WriteIntents,
    health: &Health,
) -> Inherited {
    let inherited = intents.inherited();
    let mut outcome = Inherited::default();
    let mut allocator = allocator.lock().unwrap_or_else(PoisonError::into_inner);
    for intent in &inherited {
        let listed = cache
            .get(intent.node.as_str())
            .map(|(key, node)| node.view(&key));
        let same_object = listed
            .as_ref()
            .is_some_and(|n| n.uid.as_deref() == intent.uid.as_deref());
        let Some(view) = listed.filter(|n| same_object && !n.has_pod_cidrs()) else {
            tracing::info!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), "inherited write intent settled: the Node has podCIDRs, is gone or is another object");
            intents.settle(&intent.node);
            outcome.settled += 1;
            continue;
        };
        let seeded = parse(intent).and_then(|cidrs| allocator.seed_write_in_doubt(&view, &cidrs));
        match seeded {
            Ok(metrics) => {
                metrics.iter().for_each(m::apply);
                tracing::warn!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), "inherited a write in doubt from the previous leader: its pod CIDRs stay reserved for the Node and are sent again");
                outcome.reserved += 1;
            }
            Err(reason) => {
                tracing::error!(node = %intent.node, pod_cidrs = %intent.pod_cidrs.join(","), %reason, "inherited write intent cannot be reserved: if the previous leader's write still lands, it gives these pod CIDRs to the Node although this replica does not hold them for it");
                outcome.conflicting += 1;
            }
        }
    }
    let pools = allocator.pool_stats();
    m::set_pool_gauges(&pools, allocator.skipped_count());
    health.set_pools(pools);
    outcome
}

/// The intent's podCIDRs, parsed (we write canonical text; anything else is an error).
fn parse(intent: &WriteIntent) -> Result<Vec<Cidr>, String> {
    intent
        .pod_cidrs
        .iter()
        .map(|text| {
            text.parse::<Cidr>()
                .map_err(|e| format!("podCIDR {text:?} of the intent: {e}"))
        })
        .collect()
}
