#![allow(clippy::unwrap_used)] // test code: a failed unwrap is a failed test.
//! The edge-agent firmware's workload on the host: `examples/edge-agent/src/workload.rs` (the
//! pools, the 16,500-request script, the request handler and the digest — included here with
//! `#[path]`, so it is the firmware's code, not a copy) run on x86-64.
//!
//! - `answers_match_the_model`: every answer of the core equals a trivial model's (a `Vec<bool>`
//!   per set, upstream's bit-by-bit round-robin scan), and the script reaches the edges it is
//!   meant to (exhaustion, cursor wrap, first and last blocks, every error kind). So the host's
//!   digest is the digest of right answers.
//! - `firmware_report_matches_host`: with `NODEIPAM_EDGE_AGENT_OUTPUT` naming a file holding the
//!   firmware's semihosting output (`.ci/run` sets it after running the firmware under QEMU), the
//!   firmware's `edge-agent: pool …` and `edge-agent: all …` lines must equal the host's, digest for
//!   digest: 32-bit Arm and x86-64 gave the same answers bit for bit. Without it, the test prints
//!   the host's report and says that there was nothing to compare.

#[path = "../../examples/edge-agent/src/workload.rs"]
#[allow(dead_code)]
mod workload;

use std::net::IpAddr;

use embassy_sync::blocking_mutex::raw::NoopRawMutex;
use nodeipam_core::{AllocError, Allocation, Cidr, Family, NodeAllocation};
use workload::{
    Answer, NodeCidrs, Operation, POOLS, PoolSpec, Request, Script, SetSpec, SetStatus, Summary,
};

/// The environment variable naming the firmware's captured output.
const FIRMWARE_OUTPUT: &str = "NODEIPAM_EDGE_AGENT_OUTPUT";

// ----- the model ---------------------------------------------------------------------------------

fn ip_bits(addr: IpAddr) -> u128 {
    match addr {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

fn width(family: Family) -> u32 {
    match family {
        Family::V4 => 32,
        Family::V6 => 128,
    }
}

/// First and last address of a CIDR, from its address and prefix length only.
fn span(cidr: &Cidr) -> (u128, u128) {
    let first = ip_bits(cidr.network());
    let host_bits = width(cidr.family()) - u32::from(cidr.prefix_len());
    let host_mask = if host_bits == 128 {
        u128::MAX
    } else {
        (1u128 << host_bits) - 1
    };
    (first, first | host_mask)
}

/// One set: which blocks are allocated, upstream's cursor, and what the script reached.
struct SetModel {
    spec: SetSpec,
    allocated: Vec<bool>,
    cursor: u32,
    /// Allocations that found their block before the cursor (the search wrapped past the end).
    wraps: u32,
    first_block_allocated: bool,
    last_block_allocated: bool,
}

impl SetModel {
    fn new(spec: SetSpec) -> Self {
        SetModel {
            spec,
            allocated: vec![false; spec.block_count() as usize],
            cursor: 0,
            wraps: 0,
            first_block_allocated: false,
            last_block_allocated: false,
        }
    }

    fn block_count(&self) -> u32 {
        self.allocated.len() as u32
    }

    fn allocated_count(&self) -> u32 {
        self.allocated.iter().filter(|&&a| a).count() as u32
    }

    fn is_full(&self) -> bool {
        self.allocated.iter().all(|&a| a)
    }

    /// Upstream's `AllocateNext`: test one block after another from the cursor, wrapping.
    fn allocate_next(&mut self) -> Allocation {
        let n = self.block_count();
        let (found, tries) = (0..n)
            .map(|tries| ((self.cursor + tries) % n, tries))
            .find(|&(candidate, _)| !self.allocated[candidate as usize])
            .expect("allocate_next on a full set");
        if found < self.cursor {
            self.wraps += 1;
        }
        self.first_block_allocated |= found == 0;
        self.last_block_allocated |= found == n - 1;
        self.allocated[found as usize] = true;
        self.cursor = (found + 1) % n;
        let shift = width(self.spec.cluster_cidr.family()) - u32::from(self.spec.node_mask_size);
        let offset = u128::from(found).checked_shl(shift).unwrap_or(0);
        let network = ip_bits(self.spec.cluster_cidr.network()) + offset;
        let address = match self.spec.cluster_cidr.family() {
            Family::V4 => IpAddr::from(std::net::Ipv4Addr::from(network as u32)),
            Family::V6 => IpAddr::from(std::net::Ipv6Addr::from(network)),
        };
        Allocation {
            cidr: Cidr::new(address, self.spec.node_mask_size).unwrap(),
            block_index: found,
            tries,
        }
    }

    /// Upstream's `getBeginningAndEndIndices`, from address arithmetic.
    fn block_range(&self, cidr: Cidr) -> Result<(u32, u32), AllocError> {
        let cluster_cidr = self.spec.cluster_cidr;
        if cidr.family() != cluster_cidr.family() {
            return Err(AllocError::FamilyMismatch { cidr, cluster_cidr });
        }
        let (first, last) = span(&cidr);
        let (cluster_first, cluster_last) = span(&cluster_cidr);
        if last < cluster_first || cluster_last < first {
            return Err(AllocError::OutOfRange { cidr, cluster_cidr });
        }
        if cidr.prefix_len() <= cluster_cidr.prefix_len() {
            return Ok((0, self.block_count() - 1));
        }
        let shift = width(cidr.family()) - u32::from(self.spec.node_mask_size);
        let index = |address: u128| (address - cluster_first).checked_shr(shift).unwrap_or(0);
        Ok((index(first) as u32, index(last) as u32))
    }

    /// Sets blocks `first..=last` to `allocated`; returns how many changed.
    fn mark(&mut self, first: u32, last: u32, allocated: bool) -> u32 {
        let mut changed = 0;
        for block in &mut self.allocated[first as usize..=last as usize] {
            changed += u32::from(*block != allocated);
            *block = allocated;
        }
        changed
    }

    fn allocated_in(&self, first: u32, last: u32) -> u32 {
        self.allocated[first as usize..=last as usize]
            .iter()
            .filter(|&&a| a)
            .count() as u32
    }
}

/// One pool: its sets in flag order, each operation as `Pool`'s documentation states it.
struct PoolModel {
    sets: Vec<SetModel>,
}

impl PoolModel {
    fn new(spec: &PoolSpec) -> Self {
        PoolModel {
            sets: spec.sets().map(SetModel::new).collect(),
        }
    }

    fn set_for(&mut self, family: Family) -> Option<&mut SetModel> {
        self.sets
            .iter_mut()
            .find(|set| set.spec.cluster_cidr.family() == family)
    }

    fn allocate_node(&mut self) -> Result<NodeAllocation, AllocError> {
        if let Some(full) = self.sets.iter().find(|set| set.is_full()) {
            return Err(AllocError::Exhausted {
                cluster_cidr: full.spec.cluster_cidr,
            });
        }
        let mut node = NodeAllocation::new();
        for set in &mut self.sets {
            node.push(set.allocate_next()).unwrap();
        }
        Ok(node)
    }

    fn check_node(&mut self, cidrs: &NodeCidrs) -> Result<(), AllocError> {
        if cidrs.len() > 2 {
            return Err(AllocError::TooManyCidrs { count: cidrs.len() });
        }
        if let [a, b] = cidrs.as_slice()
            && a.family() == b.family()
        {
            return Err(AllocError::DuplicateFamily { family: a.family() });
        }
        for &cidr in cidrs {
            self.set_for(cidr.family())
                .ok_or(AllocError::NoClusterCidrForFamily { cidr })?
                .block_range(cidr)?;
        }
        Ok(())
    }

    fn mark_one(&mut self, cidr: Cidr, allocated: bool) -> Result<u32, AllocError> {
        let set = self
            .set_for(cidr.family())
            .ok_or(AllocError::NoClusterCidrForFamily { cidr })?;
        let (first, last) = set.block_range(cidr)?;
        Ok(set.mark(first, last, allocated))
    }

    fn mark_node(&mut self, cidrs: &NodeCidrs, allocated: bool) -> Result<u32, AllocError> {
        self.check_node(cidrs)?;
        let mut changed = 0;
        for &cidr in cidrs {
            changed += self.mark_one(cidr, allocated)?;
        }
        Ok(changed)
    }

    fn release_blocks(&mut self, family: Family, first: u32, last: u32) -> Result<u32, AllocError> {
        let Some(set) = self.set_for(family) else {
            return Ok(0);
        };
        let block_count = set.block_count();
        if last >= block_count || first > last {
            return Err(AllocError::BlockIndexOutOfRange {
                block_index: if first > last { first } else { last },
                block_count,
            });
        }
        Ok(set.mark(first, last, false))
    }

    fn reserve_service_cidr(&mut self, service_cidr: Cidr) -> Result<u32, AllocError> {
        let Some(set) = self.set_for(service_cidr.family()) else {
            return Ok(0);
        };
        let Ok((first, last)) = set.block_range(service_cidr) else {
            return Ok(0);
        };
        let free_in_range = (last - first + 1) - set.allocated_in(first, last);
        let free = set.block_count() - set.allocated_count();
        if free_in_range >= free {
            return Err(AllocError::ServiceCidrFillsClusterCidr {
                service_cidr,
                cluster_cidr: set.spec.cluster_cidr,
            });
        }
        Ok(set.mark(first, last, true))
    }

    fn allocated_in(&mut self, cidr: Cidr) -> Result<u32, AllocError> {
        let set = self
            .set_for(cidr.family())
            .ok_or(AllocError::NoClusterCidrForFamily { cidr })?;
        let (first, last) = set.block_range(cidr)?;
        Ok(set.allocated_in(first, last))
    }

    fn apply(&mut self, operation: &Operation) -> Answer {
        match operation {
            Operation::AllocateNode => Answer::Node(self.allocate_node()),
            Operation::OccupyNode(cidrs) => Answer::Blocks(self.mark_node(cidrs, true)),
            Operation::ReleaseNode(cidrs) => Answer::Blocks(self.mark_node(cidrs, false)),
            Operation::CheckNode(cidrs) => Answer::Checked(self.check_node(cidrs)),
            Operation::Occupy(cidr) => Answer::Blocks(self.mark_one(*cidr, true)),
            Operation::Release(cidr) => Answer::Blocks(self.mark_one(*cidr, false)),
            Operation::ReleaseBlocks {
                family,
                first,
                last,
            } => Answer::Blocks(self.release_blocks(*family, *first, *last)),
            Operation::ReserveServiceCidr(cidr) => Answer::Blocks(self.reserve_service_cidr(*cidr)),
            Operation::AllocatedIn(cidr) => Answer::Blocks(self.allocated_in(*cidr)),
            Operation::Status => Answer::Status(
                self.sets
                    .iter()
                    .map(|set| SetStatus {
                        allocated_count: set.allocated_count(),
                        next_candidate: set.cursor,
                    })
                    .collect(),
            ),
        }
    }
}

// ----- the tests -----------------------------------------------------------------------------

/// Runs the whole script through the firmware's handler on host pools (`Vec` storage, the same
/// `SharedPool` locking) and returns the summary, checking each answer with `check`.
fn run_script(mut check: impl FnMut(&Request, &Answer)) -> Summary {
    let pools =
        workload::build_pools::<NoopRawMutex, _>(|words| vec![0u64; words]).expect("pools build");
    let mut summary = Summary::default();
    for request in Script::new() {
        let reply = workload::serve(&pools, request);
        check(&reply.request, &reply.answer);
        summary.record(&reply).expect("replies in sequence");
    }
    summary
}

/// A name for the kind of an error, to count which kinds the script reached.
fn error_kind(answer: &Answer) -> Option<&'static str> {
    let error = match answer {
        Answer::Node(Err(error)) | Answer::Blocks(Err(error)) | Answer::Checked(Err(error)) => {
            error
        }
        _ => return None,
    };
    Some(match error {
        AllocError::Exhausted { .. } => "Exhausted",
        AllocError::OutOfRange { .. } => "OutOfRange",
        AllocError::NoClusterCidrForFamily { .. } => "NoClusterCidrForFamily",
        AllocError::BlockIndexOutOfRange { .. } => "BlockIndexOutOfRange",
        AllocError::TooManyCidrs { .. } => "TooManyCidrs",
        AllocError::DuplicateFamily { .. } => "DuplicateFamily",
        AllocError::ServiceCidrFillsClusterCidr { .. } => "ServiceCidrFillsClusterCidr",
        _ => "other",
    })
}

#[test]
fn answers_match_the_model() {
    let mut models: Vec<PoolModel> = POOLS.iter().map(PoolModel::new).collect();
    let mut operations_seen = std::collections::HashSet::new();
    let mut errors_seen = std::collections::BTreeSet::new();
    let summary = run_script(|request, answer| {
        let model = &mut models[usize::from(request.pool)];
        let expected = model.apply(&request.operation);
        assert_eq!(
            *answer, expected,
            "request {} to pool {}: {:?}",
            request.sequence, request.pool, request.operation
        );
        operations_seen.insert(std::mem::discriminant(&request.operation));
        errors_seen.extend(error_kind(answer));
    });

    // The script is what the firmware claims to run: every request answered, every pool served.
    assert!(summary.is_complete());
    assert_eq!(summary.replies, workload::TOTAL_REQUESTS);
    assert_eq!(
        operations_seen.len(),
        10,
        "every Operation variant was sent"
    );
    assert_eq!(
        errors_seen.into_iter().collect::<Vec<_>>(),
        [
            "BlockIndexOutOfRange",
            "DuplicateFamily",
            "Exhausted",
            "NoClusterCidrForFamily",
            "OutOfRange",
            "ServiceCidrFillsClusterCidr",
            "TooManyCidrs",
        ],
        "the script reaches every error a pool can give"
    );
    // … and the edges of every set: exhaustion, cursor wrap, the first and the last block.
    for (index, (pool, model)) in summary.pools.iter().zip(&models).enumerate() {
        assert_eq!(pool.replies, POOLS[index].requests);
        assert!(pool.exhausted > 0, "pool {index} never exhausted");
        assert!(pool.node_allocations > 0, "pool {index} never allocated");
        for set in &model.sets {
            let cidr = set.spec.cluster_cidr;
            assert!(set.first_block_allocated, "{cidr}: block 0 never allocated");
            assert!(
                set.last_block_allocated,
                "{cidr}: last block never allocated"
            );
            if set.block_count() > 1 {
                assert!(set.wraps > 0, "{cidr}: the cursor never wrapped");
            }
        }
    }
}

/// The report lines (`edge-agent: pool …`, `edge-agent: all …`) of an output.
fn report_lines(output: &str) -> Vec<&str> {
    output
        .lines()
        .filter(|line| {
            line.starts_with("edge-agent: pool ") || line.starts_with("edge-agent: all ")
        })
        .collect()
}

#[test]
fn firmware_report_matches_host() {
    let summary = run_script(|_, _| {});
    let mut host = String::new();
    summary.write_report(&mut host).unwrap();
    let host_lines = report_lines(&host);
    assert_eq!(host_lines.len(), POOLS.len() + 1);
    eprintln!("host (x86-64) report:\n{host}");

    let Some(path) = std::env::var_os(FIRMWARE_OUTPUT) else {
        eprintln!(
            "{FIRMWARE_OUTPUT} is not set: no firmware output to compare with (.ci/run sets it)"
        );
        return;
    };
    let output = std::fs::read_to_string(&path)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", path.to_string_lossy()));
    assert!(
        !output.contains("edge-agent: FAILED"),
        "the firmware reported a failure:\n{output}"
    );
    assert_eq!(
        report_lines(&output),
        host_lines,
        "the firmware (thumbv7em) and the host (x86-64) disagree; firmware output:\n{output}"
    );
    eprintln!(
        "firmware report in {} matches the host's",
        path.to_string_lossy()
    );
}
