//! The `pool_ranges` target: up to three pools allocating through `PoolRange`s of one shared set
//! (overlapping `ClusterCIDR`s), compared with the set's `SetModel` and a cursor per range, plus
//! moving the allocations into a grown or re-gridded set (`occupy_allocations_of`).

use nodeipam_core::{AllocError, BlockRequest, Cidr, CidrSet, Placement, PoolRange};

use super::check::{Storage, check_all_bits, check_counters, check_unchanged};
use super::decode::{build_set, decode_aligned_prefix, decode_cidr, decode_cluster, family_bit};
use super::model::SetModel;
use super::{Bytes, MAX_OPS, MAX_POOL_BLOCK_BITS, display_nonempty, masked_cidr, span, trace};

/// The model of one range: its CIDR and its cursor (grid blocks past the range's first block).
#[derive(Debug, Clone, Copy)]
struct RangeModel {
    cidr: Cidr,
    cursor: u32,
}

/// `(first, last, effective CIDR)` of a range in the model's set, as `find_block_within` derives
/// them: the range's own blocks, the whole set for a supernet.
fn bounds(model: &SetModel, range: &RangeModel) -> Result<(u32, u32, Cidr), AllocError> {
    let (first, last) = model.block_range(range.cidr)?;
    let cidr = if range.cidr.prefix_len() <= model.cluster_cidr.prefix_len() {
        model.cluster_cidr
    } else {
        range.cidr
    };
    Ok((first, last, cidr))
}

/// `bounds` plus the size in grid blocks of a `prefix_len` block, which must fit between the
/// range's prefix and the grid (the errors `find_block_within` and `free_blocks_within` give).
fn groups(
    model: &SetModel,
    range: &RangeModel,
    prefix_len: u8,
) -> Result<(u32, u32, Cidr, u64), AllocError> {
    let (low, high, range_cidr) = bounds(model, range)?;
    if prefix_len < range_cidr.prefix_len() {
        return Err(AllocError::BlockLargerThanRange {
            prefix_len,
            range: range_cidr,
        });
    }
    if prefix_len > model.node_mask_size {
        return Err(AllocError::InvalidBlockPrefixLen {
            prefix_len,
            cluster_cidr: model.cluster_cidr,
            node_mask_size: model.node_mask_size,
        });
    }
    let group = 1u64 << (model.node_mask_size - prefix_len);
    Ok((low, high, range_cidr, group))
}

/// Whether the model's grid blocks `first .. first + group` are all free.
fn all_free(model: &SetModel, first: u64, group: u64) -> bool {
    let last = first + group - 1;
    model
        .allocated
        .range(first as u32..=last as u32)
        .next()
        .is_none()
}

/// What `find_block_within` must return: `(first block, group, tries)`, searched position by
/// position over the range's aligned positions from the rounded-up cursor, wrapping.
fn expect_find(
    model: &SetModel,
    range: &RangeModel,
    request: BlockRequest,
) -> Result<(u32, u32, u32), AllocError> {
    let (low, high, range_cidr, group) = groups(model, range, request.prefix_len)?;
    let span = u64::from(high - low) + 1;
    let positions = span / group;
    let start = match request.placement {
        Placement::FirstFit => 0,
        Placement::NextFromCursor => (u64::from(range.cursor) % span).div_ceil(group) % positions,
    };
    for tries in 0..positions {
        let first = u64::from(low) + ((start + tries) % positions) * group;
        if all_free(model, first, group) {
            return Ok((first as u32, group as u32, tries as u32));
        }
    }
    Err(AllocError::Exhausted {
        cluster_cidr: range_cidr,
    })
}

/// Free aligned blocks of `prefix_len` inside the range, counted position by position.
fn expect_free(model: &SetModel, range: &RangeModel, prefix_len: u8) -> Result<u32, AllocError> {
    let (low, high, _, group) = groups(model, range, prefix_len)?;
    let mut free = 0;
    let mut first = u64::from(low);
    while first <= u64::from(high) {
        if all_free(model, first, group) {
            free += 1;
        }
        first += group;
    }
    Ok(free)
}

/// A range CIDR: mostly inside the cluster (`decode_cidr`'s sub-ranges and blocks), sometimes a
/// supernet, a neighbour or the other family.
fn decode_range(bytes: &mut Bytes<'_>, model: &SetModel) -> RangeModel {
    let cidr = decode_cidr(bytes, model);
    RangeModel {
        cidr,
        cursor: u32::from(bytes.u16()),
    }
}

fn placement(byte: u8) -> Placement {
    if byte & 1 == 0 {
        Placement::NextFromCursor
    } else {
        Placement::FirstFit
    }
}

/// Byte format: header `h` (bit 0 = IPv6), the cluster CIDR and grid (`decode_cluster`, up to
/// 2^`MAX_POOL_BLOCK_BITS` blocks), three ranges (a CIDR from `decode_cidr` and a 16-bit cursor
/// each), then operations until the input ends (at most `MAX_OPS`): opcode `op % 6` —
/// 0/1 allocate within range `b % 3` (prefix from `decode_aligned_prefix`, placement bit);
/// 2 find within a range, occupy a CIDR, then take the (maybe stale) candidate;
/// 3 occupy / 4 release a CIDR (`decode_cidr`); 5 free-block count of a range at a prefix.
/// At the end the allocations move into a grown set (one prefix shorter, where the family allows)
/// on a grid up to 2 bits finer, checked address by address.
pub fn run_pool_ranges(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let family = family_bit(bytes.u8() & 1 != 0);
    let (cluster_cidr, grid) = decode_cluster(&mut bytes, family, MAX_POOL_BLOCK_BITS, false);
    let (mut set, mut model) = build_set(cluster_cidr, grid, 0);
    let mut models: Vec<RangeModel> = (0..3).map(|_| decode_range(&mut bytes, &model)).collect();
    let mut ranges: Vec<PoolRange> = models
        .iter()
        .map(|m| PoolRange::with_cursor(m.cidr, m.cursor))
        .collect();
    for op_index in 0..MAX_OPS {
        if bytes.is_empty() {
            break;
        }
        let op = bytes.u8();
        let which = usize::from(bytes.u8() % 3);
        let step = format!(
            "op {op_index} ({op}) on range {which} {}",
            models[which].cidr
        );
        match op % 6 {
            0 | 1 => {
                let request = BlockRequest {
                    prefix_len: decode_aligned_prefix(&mut bytes, &model),
                    placement: placement(bytes.u8()),
                };
                let want = expect_find(&model, &models[which], request);
                let before = set.clone();
                let got = set.allocate_block_within(&mut ranges[which], request);
                trace(&step, &(request, &got));
                match (want, got) {
                    (Ok((first, group, tries)), Ok(got)) => {
                        assert_eq!(
                            (got.first_block_index, got.block_count, got.tries),
                            (first, group, tries),
                            "{step}: block"
                        );
                        assert_eq!(
                            got.cidr,
                            masked_cidr(
                                family,
                                span(&model.block_cidr(first)).0,
                                request.prefix_len
                            ),
                            "{step}: CIDR"
                        );
                        let (low, high, _) =
                            bounds(&model, &models[which]).unwrap_or((0, 0, cluster_cidr));
                        assert!(
                            first >= low && first + group - 1 <= high,
                            "{step}: outside the range"
                        );
                        model.allocated.extend(first..first + group);
                        if request.placement == Placement::NextFromCursor {
                            let end = first - low + group;
                            models[which].cursor = if end > high - low { 0 } else { end };
                        }
                    }
                    (Err(want), Err(got)) => {
                        assert_eq!(got, want, "{step}: error");
                        display_nonempty(&got);
                        check_unchanged(before, &set, &step);
                    }
                    (want, got) => panic!("{step}: model {want:?}, set {got:?}"),
                }
            }
            2 => {
                let request = BlockRequest {
                    prefix_len: decode_aligned_prefix(&mut bytes, &model),
                    placement: placement(bytes.u8()),
                };
                let candidate = set.find_block_within(&ranges[which], request);
                let target = decode_cidr(&mut bytes, &model);
                let occupied = set.occupy(target);
                assert_eq!(occupied, model.occupy(target), "{step}: occupy {target}");
                if let Ok(candidate) = candidate {
                    let first = candidate.first_block_index();
                    let group = candidate.block_count();
                    let still_free = model
                        .allocated
                        .range(first..=first + (group - 1))
                        .next()
                        .is_none();
                    let before = set.clone();
                    let got = set.take_block_within(&mut ranges[which], candidate);
                    trace(&step, &(request, target, &got));
                    if still_free {
                        assert!(
                            got.is_ok(),
                            "{step}: a still-free candidate was refused: {got:?}"
                        );
                        model.allocated.extend(first..first + group);
                        if request.placement == Placement::NextFromCursor {
                            let (low, high, _) =
                                bounds(&model, &models[which]).unwrap_or((0, 0, cluster_cidr));
                            let end = first - low + group;
                            models[which].cursor = if end > high - low { 0 } else { end };
                        }
                    } else {
                        assert_eq!(
                            got,
                            Err(AllocError::StaleCandidate {
                                range: models[which].cidr
                            }),
                            "{step}: stale candidate"
                        );
                        check_unchanged(before, &set, &step);
                    }
                }
            }
            3 | 4 => {
                let target = decode_cidr(&mut bytes, &model);
                let (got, want) = if op % 6 == 3 {
                    (set.occupy(target), model.occupy(target))
                } else {
                    (set.release(target), model.release(target))
                };
                trace(&step, &(target, &got));
                assert_eq!(got, want, "{step}: occupy/release {target}");
            }
            _ => {
                let prefix_len = decode_aligned_prefix(&mut bytes, &model);
                let got = set.free_blocks_within(&ranges[which], prefix_len);
                assert_eq!(
                    got,
                    expect_free(&model, &models[which], prefix_len),
                    "{step}: free /{prefix_len}"
                );
            }
        }
        for (range, range_model) in ranges.iter().zip(&models) {
            assert_eq!(
                range.cursor(),
                range_model.cursor,
                "{step}: cursor of {}",
                range_model.cidr
            );
        }
        check_counters(&set, &model, &step);
    }
    check_all_bits(&set, &model, "end");
    check_regrid(&set, &model, bytes.u8());
}

/// Moves the allocations into a set one prefix shorter (where possible) on a grid up to 2 bits
/// finer (where the family and the 2^24 limit allow): a new block is allocated exactly when it
/// overlaps an allocated old block.
fn check_regrid(old: &CidrSet<Storage>, model: &SetModel, byte: u8) {
    let family = model.cluster_cidr.family();
    let width = super::width(family);
    let outer_prefix = model.cluster_cidr.prefix_len().saturating_sub(byte & 1);
    let outer = masked_cidr(family, span(&model.cluster_cidr).0, outer_prefix);
    let grid = (model.node_mask_size + (byte >> 1) % 3).min(width);
    let grid = grid.min(outer_prefix + MAX_POOL_BLOCK_BITS + 2);
    let (mut grown, grown_model) = build_set(outer, grid, 0);
    let changed = grown.occupy_allocations_of(old);
    assert_eq!(changed, Ok(grown.allocated_count()), "regrid: count");
    for index in 0..grown_model.block_count {
        let block = grown_model.block_cidr(index);
        let (first, last) = span(&block);
        let (c_first, c_last) = span(&model.cluster_cidr);
        let overlapping = first <= c_last
            && last >= c_first
            && model.allocated.iter().any(|&i| {
                let (b_first, b_last) = span(&model.block_cidr(i));
                b_first <= last && b_last >= first
            });
        assert_eq!(
            grown.is_allocated(index),
            Ok(overlapping),
            "regrid: block {block}"
        );
    }
}
