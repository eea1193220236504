//! Our half of the differential: the protocol of [`super::protocol`] over `nodeipam-core`'s
//! [`CidrSet`], parsing CIDRs the way the controller parses Node podCIDRs and `--cluster-cidr`
//! ([`Cidr::parse_masked`]: host bits cleared, like Go's `net.ParseCIDR`).

use nodeipam_core::{AllocError, Cidr, CidrSet, storage_words_for};

use super::protocol::Op;

/// A [`CidrSet`] answering protocol requests. One driver can run many sequences: each `new`
/// replaces the set (its storage is reused).
#[derive(Debug, Default)]
pub struct CoreDriver {
    set: Option<CidrSet<Vec<u64>>>,
    spare: Vec<u64>,
}

impl CoreDriver {
    /// A driver with no set (requests before the first `new` answer `err no-set`).
    pub fn new() -> CoreDriver {
        CoreDriver::default()
    }

    /// The current set, if the last `new` succeeded.
    pub fn set(&self) -> Option<&CidrSet<Vec<u64>>> {
        self.set.as_ref()
    }

    /// Answers one request (one protocol line, without the newline).
    pub fn answer(&mut self, op: &Op) -> String {
        match op {
            Op::New { cluster, node_mask } => self.new_set(cluster, *node_mask),
            Op::Alloc => {
                let Some(set) = self.set.as_mut() else {
                    return "err no-set".to_owned();
                };
                match set.allocate_next() {
                    Ok(allocation) => format!(
                        "ok {} allocated={} tries={}",
                        allocation.cidr,
                        set.allocated_count(),
                        allocation.tries
                    ),
                    Err(error) => format!(
                        "err {} allocated={}",
                        error_class(&error),
                        set.allocated_count()
                    ),
                }
            }
            Op::Occupy(text) | Op::Release(text) => {
                let Some(set) = self.set.as_mut() else {
                    return "err no-set".to_owned();
                };
                let result = match Cidr::parse_masked(text) {
                    Err(_) => Err("parse".to_owned()),
                    Ok((cidr, _)) if matches!(op, Op::Occupy(_)) => {
                        set.occupy(cidr).map_err(|e| error_class(&e))
                    }
                    Ok((cidr, _)) => set.release(cidr).map_err(|e| error_class(&e)),
                };
                match result {
                    Ok(_) => format!("ok allocated={}", set.allocated_count()),
                    Err(class) => format!("err {class} allocated={}", set.allocated_count()),
                }
            }
        }
    }

    /// Answers every request, one answer each.
    pub fn answer_all(&mut self, ops: &[Op]) -> Vec<String> {
        ops.iter().map(|op| self.answer(op)).collect()
    }

    fn new_set(&mut self, cluster: &str, node_mask: u16) -> String {
        let mut storage = match self.set.take() {
            Some(set) => set.into_storage(),
            None => std::mem::take(&mut self.spare),
        };
        let Ok((cluster, _)) = Cidr::parse_masked(cluster) else {
            self.spare = storage;
            return "err parse".to_owned();
        };
        let Ok(node_mask) = u8::try_from(node_mask) else {
            self.spare = storage;
            return "err invalid-node-mask".to_owned();
        };
        // Exactly the words this set needs (at most the 2^24-block size, ~2 MiB); `new`
        // overwrites them.
        storage.resize(storage_words_for(cluster.prefix_len(), node_mask), 0);
        match CidrSet::new(cluster, node_mask, storage) {
            Ok(set) => {
                let answer = format!("ok blocks={}", set.block_count());
                self.set = Some(set);
                answer
            }
            Err(error) => format!("err {}", error_class(&error)),
        }
    }
}

/// The protocol's error class of a core error.
fn error_class(error: &AllocError) -> String {
    match error {
        AllocError::Exhausted { .. } => "no-cidrs-remaining".to_owned(),
        AllocError::OutOfRange { .. } => "out-of-range".to_owned(),
        AllocError::FamilyMismatch { .. } => "family-mismatch".to_owned(),
        AllocError::TooManyBlocks { .. } => "too-many-blocks".to_owned(),
        AllocError::InvalidNodeMaskSize { .. } => "invalid-node-mask".to_owned(),
        other => format!("other:{}", other.to_string().replace(' ', "_")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(script: &str) -> Vec<String> {
        let ops: Vec<Op> = script.lines().filter_map(Op::parse).collect();
        CoreDriver::new().answer_all(&ops)
    }

    #[test]
    fn answers_a_small_script_like_upstream() {
        // The same script through tests/upstream's cidrset-driver (v1.36.3) answered exactly this.
        let answers = run("alloc\n\
             new 10.0.0.5/30 32\n\
             alloc\n\
             alloc\n\
             occupy 10.0.0.3/32\n\
             alloc\n\
             alloc\n\
             alloc\n\
             release 10.0.0.0/31\n\
             alloc\n\
             occupy 10.1.0.0/24\n\
             release 0.0.0.0/0\n\
             occupy 10.0.0.0/24\n\
             new fd00::/48 64\n\
             alloc\n\
             new 10.0.0.0/24 16\n\
             alloc");
        assert_eq!(
            answers,
            [
                "err no-set",
                "ok blocks=4",
                "ok 10.0.0.4/32 allocated=1 tries=0",
                "ok 10.0.0.5/32 allocated=2 tries=0",
                "err out-of-range allocated=2",
                "ok 10.0.0.6/32 allocated=3 tries=0",
                "ok 10.0.0.7/32 allocated=4 tries=0",
                "err no-cidrs-remaining allocated=4",
                "err out-of-range allocated=4",
                "err no-cidrs-remaining allocated=4",
                "err out-of-range allocated=4",
                "ok allocated=0",
                "ok allocated=4",
                "ok blocks=65536",
                "ok fd00::/64 allocated=1 tries=0",
                // Upstream's cidrset makes an empty set here (its caller must check the mask).
                "err invalid-node-mask",
                "err no-set",
            ]
        );
    }

    #[test]
    fn tries_count_the_used_blocks_skipped_after_a_wrap() {
        let answers = run("new 10.0.0.0/30 32\n\
             alloc\nalloc\nalloc\n\
             release 10.0.0.0/32\n\
             occupy 10.0.0.3/32\n\
             alloc\n\
             occupy fd00::/64");
        // Cursor at 3 (used): skip 3, wrap to 0 (free) → 1 try; the cursor moves to 1.
        assert_eq!(answers[6], "ok 10.0.0.0/32 allocated=4 tries=1");
        assert_eq!(answers[7], "err family-mismatch allocated=4");
    }
}
