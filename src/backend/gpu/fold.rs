//! Many groups' sets intersected on the GPU, each group shortest first: the batched
//! conjunctive queries of the Wu and Wang papers (`list_intersect_agg` with `GROUP BY`).
//!
//! A group is a chain of 2-list intersections that must run in order, but the groups are
//! independent, so the chains advance together: round `r` intersects, for every group that
//! still has a set left and a non-empty result, its running result with its `r`-th set, all
//! of them as one batched [`intersect`] call (one row per group). A group's sets come
//! shortest first, so its running result only shrinks and the first rounds, where most rows
//! are, read the shortest lists. Rounds stop when no group has work left; a group whose
//! result empties drops out.

use std::ops::Range;

use super::{GpuError, GpuOutput, HostList, HostOffsets, Mode, Timings, intersect};
use crate::backend::cpu::{self, SetElem};

/// What [`fold_groups`] returns: group `g`'s intersection is
/// `values[offsets[g]..offsets[g + 1]]`, strictly increasing.
#[derive(Clone, Debug, Default)]
pub struct FoldOutput<T> {
    pub offsets: Vec<usize>,
    pub values: Vec<T>,
    /// Batched calls made (one per round with work).
    pub calls: u32,
    /// Rows the device flagged (a set not strictly increasing), recomputed on the CPU.
    pub redone: u64,
    /// The calls' timings, summed.
    pub timings: Timings,
}

/// Intersects each group's sets on the GPU: group `g`'s sets are
/// `sets[groups[g].clone()]`, each strictly increasing, in the order they are folded
/// (shortest first is the caller's choice and the efficient one). A group with no set gets an
/// empty result; with one set, that set. The result is the same as folding the sets with
/// the CPU's kernels (a row the device flags is recomputed on the CPU).
pub fn fold_groups<T: SetElem>(
    groups: &[Range<usize>],
    sets: &[&[T]],
) -> Result<FoldOutput<T>, GpuError> {
    fold_groups_with(groups, sets, |lists| {
        let out = intersect(lists, None, Mode::Values, None, false)?;
        super::BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(out)
    })
}

/// [`fold_groups`] with `run` as the device's batched 2-list intersection (tests give it an
/// emulation that flags rows, to check the rounds and the CPU's redo on any machine).
pub(crate) fn fold_groups_with<T: SetElem>(
    groups: &[Range<usize>],
    sets: &[&[T]],
    mut run: impl FnMut(&[HostList<'_, T>]) -> Result<GpuOutput<T>, GpuError>,
) -> Result<FoldOutput<T>, GpuError> {
    // Every group's running result is `arena[at[g].clone()]`; a round appends the new
    // results of the groups it advanced and repoints them (the arena only grows by results,
    // which never exceed the sets they came from).
    let mut arena: Vec<T> = Vec::new();
    let mut at: Vec<Range<usize>> = Vec::with_capacity(groups.len());
    for g in groups {
        let start = arena.len();
        if !g.is_empty() {
            arena.extend_from_slice(sets[g.start]);
        }
        at.push(start..arena.len());
    }
    let mut out = FoldOutput::default();
    // One round's batch: A = the active groups' running results, B = their next sets (64-bit
    // offsets, so no batch is limited to 2^31 values).
    let (mut a_off, mut a_val, mut b_off, mut b_val) = (
        Vec::<i64>::new(),
        Vec::<T>::new(),
        Vec::<i64>::new(),
        Vec::<T>::new(),
    );
    let mut tmp = Vec::new();
    for round in 1.. {
        let active: Vec<usize> = (0..groups.len())
            .filter(|&g| groups[g].len() > round && !at[g].is_empty())
            .collect();
        if active.is_empty() {
            break;
        }
        a_off.clear();
        a_val.clear();
        b_off.clear();
        b_val.clear();
        a_off.push(0);
        b_off.push(0);
        for &g in &active {
            a_val.extend_from_slice(&arena[at[g].clone()]);
            a_off.push(a_val.len() as i64);
            b_val.extend_from_slice(sets[groups[g].start + round]);
            b_off.push(b_val.len() as i64);
        }
        let lists = [
            HostList {
                offsets: HostOffsets::I64(&a_off),
                values: &a_val,
                column: None,
            },
            HostList {
                offsets: HostOffsets::I64(&b_off),
                values: &b_val,
                column: None,
            },
        ];
        let res = run(&lists)?;
        out.calls += 1;
        add_timings(&mut out.timings, &res.timings);
        let got = res.values_slice();
        let range = |o: &[i64], k: usize| o[k] as usize..o[k + 1] as usize;
        for (k, &g) in active.iter().enumerate() {
            let start = arena.len();
            if res.flagged.get(k).copied().unwrap_or(false) {
                // Not reached with strictly increasing sets; kept exact all the same.
                tmp.clear();
                cpu::intersect_auto(&a_val[range(&a_off, k)], &b_val[range(&b_off, k)], &mut tmp);
                arena.extend_from_slice(&tmp);
                out.redone += 1;
            } else {
                let (lo, hi) = (res.offsets[k] as usize, res.offsets[k + 1] as usize);
                arena.extend_from_slice(&got[lo..hi]);
            }
            at[g] = start..arena.len();
        }
    }
    out.offsets.reserve(groups.len() + 1);
    out.offsets.push(0);
    for r in &at {
        out.values.extend_from_slice(&arena[r.clone()]);
        out.offsets.push(out.values.len());
    }
    Ok(out)
}

fn add_timings(sum: &mut Timings, t: &Timings) {
    sum.stage_ms += t.stage_ms;
    sum.h2d_ms += t.h2d_ms;
    sum.kernel_ms += t.kernel_ms;
    sum.d2h_ms += t.d2h_ms;
    sum.unstage_ms += t.unstage_ms;
    sum.total_ms += t.total_ms;
    sum.h2d_bytes += t.h2d_bytes;
    sum.d2h_bytes += t.d2h_bytes;
    sum.input_values += t.input_values;
    sum.chunks += t.chunks;
    sum.columns_reused += t.columns_reused;
    sum.columns_uploaded += t.columns_uploaded;
}

/// [`fold_groups`] on an emulated device that computes each row with the CPU's kernels but
/// flags every third row of a call (its values garbage), so the redo path runs too.
#[cfg(test)]
pub(crate) fn fold_groups_emulated<T: SetElem>(
    groups: &[Range<usize>],
    sets: &[&[T]],
) -> Result<FoldOutput<T>, GpuError> {
    fold_groups_with(groups, sets, |lists| {
        let rows = lists[0].offsets.rows();
        let mut out = GpuOutput::<T> {
            offsets: vec![0],
            ..GpuOutput::default()
        };
        let mut tmp = Vec::new();
        for k in 0..rows {
            let (a, b) = (&lists[0], &lists[1]);
            let a = &a.values[a.offsets.at(k)..a.offsets.at(k + 1)];
            let b = &b.values[b.offsets.at(k)..b.offsets.at(k + 1)];
            let flagged = k % 3 == 2;
            tmp.clear();
            if flagged {
                tmp.extend_from_slice(b);
                tmp.reverse();
            } else {
                cpu::intersect_auto(a, b, &mut tmp);
            }
            out.values.extend_from_slice(&tmp);
            out.offsets.push(out.values.len() as u64);
            out.flagged.push(flagged);
            out.any_flagged |= flagged;
        }
        Ok(out)
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn reference(sets: &[Vec<i64>]) -> Vec<i64> {
        let mut it = sets.iter();
        let Some(first) = it.next() else {
            return Vec::new();
        };
        it.fold(first.clone(), |acc, s| {
            acc.into_iter()
                .filter(|v| s.binary_search(v).is_ok())
                .collect()
        })
    }

    proptest! {
        /// Every group's result equals the fold of its sets, whatever the number of sets per
        /// group (0, 1 or many), their lengths and the rows the emulated device flags.
        #[test]
        fn rounds_fold_every_group(
            groups in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::collection::btree_set(-20i64..40, 0..30), 0..6),
                0..20),
        ) {
            let mut sets: Vec<Vec<i64>> = Vec::new();
            let mut ranges = Vec::new();
            for g in &groups {
                let start = sets.len();
                sets.extend(g.iter().map(|s| s.iter().copied().collect::<Vec<_>>()));
                ranges.push(start..sets.len());
            }
            let views: Vec<&[i64]> = sets.iter().map(Vec::as_slice).collect();
            let out = fold_groups_emulated(&ranges, &views).unwrap();
            prop_assert_eq!(out.offsets.len(), groups.len() + 1);
            for (g, r) in ranges.iter().enumerate() {
                let want = reference(&sets[r.clone()]);
                prop_assert_eq!(&out.values[out.offsets[g]..out.offsets[g + 1]], want.as_slice());
            }
            let max = groups.iter().map(Vec::len).max().unwrap_or(0);
            prop_assert!(out.calls as usize <= max.saturating_sub(1));
        }
    }
}
