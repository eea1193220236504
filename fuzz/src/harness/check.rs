//! Comparisons of a `CidrSet` with its `SetModel`, and the "a failed call changes nothing" check.

use std::fmt;

use nodeipam_core::{AllocError, CidrSet, storage_words};

use super::model::SetModel;
use super::{GARBAGE, display_nonempty, trace};

pub(super) type Storage = Vec<u64>;

/// Counts, cursor and identity of the set equal the model's.
pub(super) fn check_counters(set: &CidrSet<Storage>, model: &SetModel, step: &str) {
    assert_eq!(
        set.cluster_cidr(),
        model.cluster_cidr,
        "{step}: cluster CIDR"
    );
    assert_eq!(set.node_mask_size(), model.node_mask_size, "{step}: mask");
    assert_eq!(set.block_count(), model.block_count, "{step}: block_count");
    assert_eq!(
        set.allocated_count() as usize,
        model.allocated.len(),
        "{step}: allocated_count"
    );
    assert_eq!(set.free_count(), model.free_count(), "{step}: free_count");
    assert_eq!(set.next_candidate(), model.cursor, "{step}: cursor");
}

/// The given blocks (clamped to the set) have the model's state.
pub(super) fn check_bits(set: &CidrSet<Storage>, model: &SetModel, indices: &[u32], step: &str) {
    for &index in indices {
        if index < model.block_count {
            assert_eq!(
                set.is_allocated(index),
                Ok(model.allocated.contains(&index)),
                "{step}: block {index}"
            );
        }
    }
}

/// Every block has the model's state (one merge walk over the model).
pub(super) fn check_all_bits(set: &CidrSet<Storage>, model: &SetModel, step: &str) {
    let mut allocated = model.allocated.iter().peekable();
    for index in 0..model.block_count {
        let expected = allocated.next_if_eq(&&index).is_some();
        assert_eq!(
            set.is_allocated(index),
            Ok(expected),
            "{step}: block {index}"
        );
    }
    assert_eq!(allocated.next(), None, "{step}: model has indices ≥ n");
}

/// The storage layout documented in `cidr_set.rs`: level 0 has bit i = block i free, nothing past
/// the block count; each higher level has one bit per word below, set iff that word is non-zero,
/// until a level of one word. Words past the layout keep their previous contents.
pub(super) fn check_layout(storage: &[u64], model: &SetModel, extra_words: usize) {
    let needed = storage_words(model.block_count);
    assert_eq!(storage.len(), needed + extra_words, "storage length");
    // Level 0: every block free, then the model's allocated blocks cleared.
    let count = model.block_count as usize;
    let mut expected = vec![0u64; count.div_ceil(64)];
    for (w, word) in expected.iter_mut().enumerate() {
        let bits = count.saturating_sub(w * 64).min(64);
        *word = if bits == 64 {
            u64::MAX
        } else {
            (1u64 << bits) - 1
        };
    }
    for &index in &model.allocated {
        expected[index as usize / 64] &= !(1u64 << (index % 64));
    }
    let mut start = 0usize;
    let mut level = 0;
    loop {
        let level_words = &storage[start..start + expected.len()];
        if let Some(w) = (0..expected.len()).find(|&w| level_words[w] != expected[w]) {
            panic!(
                "level {level} word {w}: storage {:#018x}, expected {:#018x}",
                level_words[w], expected[w]
            );
        }
        start += expected.len();
        level += 1;
        if expected.len() <= 1 {
            break;
        }
        // Next level: bit i set iff word i of this level is non-zero.
        let below = expected;
        expected = vec![0u64; below.len().div_ceil(64)];
        for (i, &word) in below.iter().enumerate() {
            if word != 0 {
                expected[i / 64] |= 1u64 << (i % 64);
            }
        }
    }
    assert_eq!(start, needed, "levels end where storage_words says");
    for (i, &word) in storage[needed..].iter().enumerate() {
        assert_eq!(
            word,
            GARBAGE,
            "storage word {} past the layout changed",
            needed + i
        );
    }
}

/// The whole bitmap equals the model without visiting every block: the set's own count over the
/// whole cluster (`allocated_in`, a word scan) equals the model's, and every model block is
/// allocated in the set. For sets too large to compare block by block.
pub(super) fn check_sparse(set: &CidrSet<Storage>, model: &SetModel, step: &str) {
    assert_eq!(
        set.allocated_in(model.cluster_cidr),
        Ok(model.allocated.len() as u32),
        "{step}: allocated_in(cluster)"
    );
    for &index in &model.allocated {
        assert_eq!(set.is_allocated(index), Ok(true), "{step}: block {index}");
    }
}

/// A failed call must leave the set exactly as it was: counters and every storage word.
pub(super) fn check_unchanged(before: CidrSet<Storage>, after: &CidrSet<Storage>, step: &str) {
    assert_eq!(
        before.allocated_count(),
        after.allocated_count(),
        "{step}: Err changed count"
    );
    assert_eq!(
        before.next_candidate(),
        after.next_candidate(),
        "{step}: Err moved cursor"
    );
    assert_eq!(
        before.block_count(),
        after.block_count(),
        "{step}: Err changed block_count"
    );
    assert!(
        before.into_storage() == after.clone().into_storage(),
        "{step}: Err changed the bitmap"
    );
}

/// Runs a mutating call on the set and the model, compares results, and on `Err` checks that the
/// set is unchanged.
pub(super) fn mutate<T: PartialEq + fmt::Debug>(
    set: &mut CidrSet<Storage>,
    step: &str,
    actual: impl FnOnce(&mut CidrSet<Storage>) -> Result<T, AllocError>,
    expected: Result<T, AllocError>,
) {
    // Snapshot only when the model expects an error (an unexpected `Err` fails the comparison
    // anyway): a 2^24-block set is 2 MiB to copy.
    let before = expected.is_err().then(|| set.clone());
    let result = actual(set);
    trace(step, &result);
    assert_eq!(result, expected, "{step}");
    if let (Err(error), Some(before)) = (result, before) {
        display_nonempty(&error);
        check_unchanged(before, set, step);
    }
}
