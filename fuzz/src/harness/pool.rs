//! The `pool_model` target: a single- or dual-stack `Pool` against one model per set.

use nodeipam_core::{
    AllocError, Allocation, BlockAllocation, BlockRequest, Cidr, CidrSet, Family, Placement, Pool,
};

use super::check::{Storage, check_all_bits, check_counters, check_unchanged};
use super::decode::{build_set, decode_aligned_prefix, decode_cidr, decode_cluster, family_bit};
use super::model::SetModel;
use super::{Bytes, MAX_OPS, MAX_POOL_BLOCK_BITS, display_nonempty, other_family, trace};

/// One model per pool set (flag order).
fn pool_expect_allocate(models: &mut [SetModel]) -> Result<Vec<Allocation>, AllocError> {
    if let Some(full) = models.iter().find(|m| m.full()) {
        return Err(AllocError::Exhausted {
            cluster_cidr: full.cluster_cidr,
        });
    }
    models.iter_mut().map(SetModel::allocate_next).collect()
}

/// All or nothing: every model finds its block before any takes one.
fn pool_expect_blocks(
    models: &mut [SetModel],
    requests: &[BlockRequest],
) -> Result<Vec<BlockAllocation>, AllocError> {
    if requests.len() != models.len() {
        return Err(AllocError::RequestCountMismatch {
            requests: requests.len(),
            sets: models.len(),
        });
    }
    let found: Vec<(u32, u32, u32)> = models
        .iter()
        .zip(requests)
        .map(|(model, request)| model.find_block(*request))
        .collect::<Result<_, _>>()?;
    Ok(models
        .iter_mut()
        .zip(requests)
        .zip(found)
        .map(|((model, request), found)| model.take_block(*request, found))
        .collect())
}

fn model_for(models: &mut [SetModel], family: Family) -> Option<&mut SetModel> {
    models.iter_mut().find(|m| m.family() == family)
}

fn pool_expect_check(models: &mut [SetModel], cidrs: &[Cidr]) -> Result<(), AllocError> {
    if cidrs.len() > 2 {
        return Err(AllocError::TooManyCidrs { count: cidrs.len() });
    }
    if let [a, b] = cidrs
        && a.family() == b.family()
    {
        return Err(AllocError::DuplicateFamily { family: a.family() });
    }
    for &cidr in cidrs {
        model_for(models, cidr.family())
            .ok_or(AllocError::NoClusterCidrForFamily { cidr })?
            .block_range(cidr)?;
    }
    Ok(())
}

fn pool_expect_node(
    models: &mut [SetModel],
    cidrs: &[Cidr],
    occupy: bool,
) -> Result<u32, AllocError> {
    pool_expect_check(models, cidrs)?;
    let mut changed = 0;
    for &cidr in cidrs {
        if let Some(model) = model_for(models, cidr.family()) {
            changed += if occupy {
                model.occupy(cidr)?
            } else {
                model.release(cidr)?
            };
        }
    }
    Ok(changed)
}

fn pool_expect_one(models: &mut [SetModel], cidr: Cidr, occupy: bool) -> Result<u32, AllocError> {
    let model =
        model_for(models, cidr.family()).ok_or(AllocError::NoClusterCidrForFamily { cidr })?;
    if occupy {
        model.occupy(cidr)
    } else {
        model.release(cidr)
    }
}

fn pool_expect_service(models: &mut [SetModel], service_cidr: Cidr) -> Result<u32, AllocError> {
    let Some(model) = model_for(models, service_cidr.family()) else {
        return Ok(0);
    };
    let Ok((first, last)) = model.block_range(service_cidr) else {
        return Ok(0);
    };
    let free_in_range = (last - first + 1) - model.allocated_in(service_cidr)?;
    if free_in_range >= model.free_count() {
        return Err(AllocError::ServiceCidrFillsClusterCidr {
            service_cidr,
            cluster_cidr: model.cluster_cidr,
        });
    }
    model.occupy(service_cidr)
}

fn check_pool(pool: &Pool<Storage>, models: &[SetModel], step: &str) {
    assert_eq!(pool.sets().len(), models.len(), "{step}: set count");
    assert_eq!(
        pool.is_dual_stack(),
        models.len() == 2,
        "{step}: dual-stack"
    );
    for (set, model) in pool.sets().iter().zip(models) {
        check_counters(set, model, step);
        check_all_bits(set, model, step);
        let by_family = pool.set_for(model.family()).map(CidrSet::cluster_cidr);
        assert_eq!(by_family, Some(model.cluster_cidr), "{step}: set_for");
    }
}

/// The differential `Pool` target (dual-stack all-or-nothing allocation).
///
/// Format: byte 0 — bit 0 first family, bit 1 dual-stack, bit 2 second set of the *same* family
/// (then `Pool::new` must fail with `DuplicateFamily` and the run ends); then one or two clusters
/// (`decode_cluster`, ≤ 2^8 blocks); then operations, one selector byte each (mod 8): 0–1
/// `allocate_node`; 2 `occupy(cidr)`; 3 `release(cidr)`; 4 `occupy_node(cidrs)`; 5
/// `release_node(cidrs)`; 6 `check_node(cidrs)`; 7 `reserve_service_cidr(cidr)` — `cidrs` is
/// 0–3 CIDRs, each generated around a randomly chosen set. A selector byte ≥ 0xF0 is
/// `allocate_node_blocks`: one request per set (prefix as `decode_aligned_prefix`, placement from
/// one byte), one request fewer when the selector is odd.
pub fn run_pool(data: &[u8]) {
    let mut bytes = Bytes::new(data);
    let header = bytes.u8();
    let first_family = family_bit(header & 1 != 0);
    let dual_stack = header & 2 != 0;
    let same_family = header & 4 != 0;
    let (first_cidr, first_mask) =
        decode_cluster(&mut bytes, first_family, MAX_POOL_BLOCK_BITS, false);
    let (first_set, first_model) = build_set(first_cidr, first_mask, 0);
    let mut models = vec![first_model];
    let second_set = if dual_stack {
        let family = if same_family {
            first_family
        } else {
            other_family(first_family)
        };
        let (cidr, mask) = decode_cluster(&mut bytes, family, MAX_POOL_BLOCK_BITS, false);
        let (set, model) = build_set(cidr, mask, 0);
        models.push(model);
        Some(set)
    } else {
        None
    };
    let mut pool = match Pool::new(first_set, second_set) {
        Ok(pool) => pool,
        Err(error) => {
            assert!(dual_stack && same_family, "Pool::new failed: {error}");
            assert_eq!(
                error,
                AllocError::DuplicateFamily {
                    family: first_family
                }
            );
            return;
        }
    };
    assert!(
        !(dual_stack && same_family),
        "Pool::new accepted two {first_family} sets"
    );
    check_pool(&pool, &models, "new");

    let mut ops = 0usize;
    while !bytes.is_empty() && ops < MAX_OPS {
        ops += 1;
        let raw = bytes.u8();
        // 8: sized allocation (selector bytes ≥ 0xF0, so older seeds keep their meaning).
        let selector = if raw >= 0xF0 { 8 } else { raw % 8 };
        let step = format!("pool op {ops} (selector {selector})");
        let before = pool.clone();
        let failed = match selector {
            8 => {
                let mut requests = Vec::new();
                for model in &models {
                    let prefix_len = decode_aligned_prefix(&mut bytes, model);
                    let placement = if bytes.u8() & 1 == 0 {
                        Placement::NextFromCursor
                    } else {
                        Placement::FirstFit
                    };
                    requests.push(BlockRequest {
                        prefix_len,
                        placement,
                    });
                }
                if raw & 1 == 1 {
                    requests.pop();
                }
                let expected = pool_expect_blocks(&mut models, &requests);
                let actual = pool
                    .allocate_node_blocks(&requests)
                    .map(|node| node.to_vec());
                trace(&step, &(&requests, &actual));
                assert_eq!(actual, expected, "{step}");
                actual.err()
            }
            0 | 1 => {
                let expected = pool_expect_allocate(&mut models);
                let actual = pool.allocate_node().map(|node| node.to_vec());
                trace(&step, &actual);
                assert_eq!(actual, expected, "{step}");
                actual.err()
            }
            2 | 3 | 7 => {
                let pick = usize::from(bytes.u8()) % models.len();
                let cidr = decode_cidr(&mut bytes, &models[pick]);
                let (actual, expected) = match selector {
                    2 => (pool.occupy(cidr), pool_expect_one(&mut models, cidr, true)),
                    3 => (
                        pool.release(cidr),
                        pool_expect_one(&mut models, cidr, false),
                    ),
                    _ => (
                        pool.reserve_service_cidr(cidr),
                        pool_expect_service(&mut models, cidr),
                    ),
                };
                trace(&step, &(cidr, &actual));
                assert_eq!(actual, expected, "{step} {cidr}");
                actual.err()
            }
            _ => {
                let count = usize::from(bytes.u8() % 4);
                let mut cidrs = Vec::with_capacity(count);
                for _ in 0..count {
                    let pick = usize::from(bytes.u8()) % models.len();
                    cidrs.push(decode_cidr(&mut bytes, &models[pick]));
                }
                let (actual, expected) = match selector {
                    4 => (
                        pool.occupy_node(&cidrs),
                        pool_expect_node(&mut models, &cidrs, true),
                    ),
                    5 => (
                        pool.release_node(&cidrs),
                        pool_expect_node(&mut models, &cidrs, false),
                    ),
                    _ => (
                        pool.check_node(&cidrs).map(|()| 0),
                        pool_expect_check(&mut models, &cidrs).map(|()| 0),
                    ),
                };
                trace(&step, &(&cidrs, &actual));
                assert_eq!(actual, expected, "{step} {cidrs:?}");
                actual.err()
            }
        };
        if let Some(error) = failed {
            display_nonempty(&error);
            for (b, a) in before.sets().iter().zip(pool.sets()) {
                check_unchanged(b.clone(), a, &step);
            }
        }
        check_pool(&pool, &models, &step);
    }
}
