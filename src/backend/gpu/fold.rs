//! Many groups' sets intersected on the GPU (`list_intersect_agg` with `GROUP BY`; the
//! batched conjunctive queries of the Wu and Wang papers).
//!
//! Intersection is associative and commutative, so a group's sets reduce as a tree: round
//! `r` pairs each group's operands (its sets in round 1, the previous round's results
//! after) two by two, shortest with next shortest, and intersects every pair of every group
//! as one batched [`intersect`] call (one row per pair). A group of `n` sets takes
//! `ceil(log2 n)` rounds, so a fold of groups with hundreds of short lists makes a handful of
//! device calls, not hundreds (a chain, one set a round, paid a device round trip per set
//! and held its caller for seconds). A group drops out once it is down to one operand or a
//! pair's result is empty (the intersection is then empty).

use std::mem::MaybeUninit;
use std::ops::Range;

use rayon::prelude::*;

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
/// `sets[groups[g].clone()]`, each strictly increasing, reduced as a tree in `ceil(log2 n)`
/// batched device calls (pairs of similar length first). A group with no set gets an
/// empty result; with one set, that set. The result is the same as folding the sets with
/// the CPU's kernels (a row the device flags is recomputed on the CPU).
///
/// `hold(bytes)` asks to hold `bytes` of host memory in all (the rounds' operands and
/// staging, the results kept to the end, the output); when it answers `false` the fold stops
/// with [`GpuError::MemoryLimit`] (the caller folds on the CPU).
pub fn fold_groups<T: SetElem>(
    groups: &[Range<usize>],
    sets: &[&[T]],
    hold: &mut dyn FnMut(usize) -> bool,
) -> Result<FoldOutput<T>, GpuError> {
    fold_groups_with(groups, sets, hold, |lists| {
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
    hold: &mut dyn FnMut(usize) -> bool,
    mut run: impl FnMut(&[HostList<'_, T>]) -> Result<GpuOutput<T>, GpuError>,
) -> Result<FoldOutput<T>, GpuError> {
    // Every operand stays where it was made, never copied: a set, a row of a round's output
    // (the outputs are kept to the end), or the CPU's redo of a flagged row in `redone`.
    // `ops[g]` are group `g`'s operands, shortest first; an empty one empties the group.
    let mut ops: Vec<Vec<Cur>> = groups
        .iter()
        .map(|g| {
            if g.clone().any(|i| sets[i].is_empty()) {
                vec![Cur::Empty]
            } else {
                g.clone().map(Cur::Set).collect()
            }
        })
        .collect();
    let mut outputs: Vec<GpuOutput<T>> = Vec::new();
    let mut redone: Vec<T> = Vec::new();
    let mut out = FoldOutput::default();
    // One round's batch: row k intersects A's row k with B's (64-bit offsets, so no batch is
    // limited to 2^31 values).
    let (mut a_off, mut a_val, mut b_off, mut b_val) = (
        Vec::<i64>::new(),
        Vec::<T>::new(),
        Vec::<i64>::new(),
        Vec::<T>::new(),
    );
    let mut tmp = Vec::new();
    let esz = std::mem::size_of::<T>();
    // Bytes of the round outputs kept to the end (the redone rows' are `redone`'s).
    let mut kept = 0usize;
    let mut ask = |bytes: usize, what: &str| match hold(bytes) {
        true => Ok(()),
        false => Err(GpuError::MemoryLimit(format!(
            "{bytes} bytes for the GPU fold ({what})"
        ))),
    };
    // Host time gathering operands and storing results, against the device calls' own time.
    let (mut gather, mut store) = (std::time::Duration::ZERO, std::time::Duration::ZERO);
    let started = std::time::Instant::now();
    for round in 1.. {
        let t0 = std::time::Instant::now();
        // The round's rows: (group, its pair's first operand).
        let pairs: Vec<(usize, usize)> = (0..groups.len())
            .filter(|&g| ops[g].len() > 1)
            .flat_map(|g| (0..ops[g].len() / 2).map(move |j| (g, 2 * j)))
            .collect();
        if pairs.is_empty() {
            break;
        }
        let a_rows: Vec<&[T]> = pairs
            .iter()
            .map(|&(g, j)| slice_of(&ops[g][j], sets, &outputs, &redone))
            .collect();
        let b_rows: Vec<&[T]> = pairs
            .iter()
            .map(|&(g, j)| slice_of(&ops[g][j + 1], sets, &outputs, &redone))
            .collect();
        gather_rows(&a_rows, &mut a_off, &mut a_val);
        gather_rows(&b_rows, &mut b_off, &mut b_val);
        drop((a_rows, b_rows));
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
        gather += t0.elapsed();
        let operands =
            (a_val.capacity() + b_val.capacity()) * esz + (a_off.capacity() + b_off.capacity()) * 8;
        let staged = super::staging_bytes(&lists, Mode::Values, super::launch_group_bytes(), false);
        let held = kept + redone.capacity() * esz;
        ask(held + operands + staged, &format!("round {round}"))?;
        let res = run(&lists)?;
        let t1 = std::time::Instant::now();
        out.calls += 1;
        add_timings(&mut out.timings, &res.timings);
        let range = |o: &[i64], k: usize| o[k] as usize..o[k + 1] as usize;
        let index = outputs.len();
        // Each group's next operands: its pairs' results, then an odd one out carried over.
        let mut next: Vec<Option<Vec<Cur>>> = vec![None; groups.len()];
        for (k, &(g, _)) in pairs.iter().enumerate() {
            let made = if res.flagged.get(k).copied().unwrap_or(false) {
                // Not reached with strictly increasing sets; kept exact all the same.
                tmp.clear();
                cpu::intersect_auto(&a_val[range(&a_off, k)], &b_val[range(&b_off, k)], &mut tmp);
                let start = redone.len();
                redone.extend_from_slice(&tmp);
                out.redone += 1;
                Cur::Redone(start..redone.len())
            } else {
                Cur::Out(index, res.offsets[k] as usize..res.offsets[k + 1] as usize)
            };
            next[g].get_or_insert_with(Vec::new).push(made);
        }
        kept +=
            std::mem::size_of_val(res.values_slice()) + res.offsets.len() * 8 + res.flagged.len();
        outputs.push(res);
        for (g, made) in next.into_iter().enumerate() {
            let Some(mut made) = made else { continue };
            if ops[g].len() % 2 == 1 {
                made.push(ops[g].pop().expect("an odd operand"));
            }
            let len = |c: &Cur| slice_of(c, sets, &outputs, &redone).len();
            ops[g] = if made.iter().any(|c| len(c) == 0) {
                vec![Cur::Empty]
            } else {
                made.sort_by_key(len);
                made
            };
        }
        store += t1.elapsed();
    }
    let cur: Vec<Cur> = ops
        .into_iter()
        .map(|o| o.into_iter().next().unwrap_or(Cur::Empty))
        .collect();
    let t2 = std::time::Instant::now();
    let rows: Vec<&[T]> = cur
        .iter()
        .map(|c| slice_of(c, sets, &outputs, &redone))
        .collect();
    let total: usize = rows.iter().map(|r| r.len()).sum();
    ask(
        kept + redone.capacity() * esz + total * esz + (rows.len() + 1) * 8,
        "its output",
    )?;
    let mut offsets = Vec::new();
    gather_rows(&rows, &mut offsets, &mut out.values);
    out.offsets = offsets.into_iter().map(|o| o as usize).collect();
    let t = &out.timings;
    log::debug!(
        "datafusion-sets: GPU fold of {} groups, {} sets: {:.1} ms, host gather {:.1} ms, \
         results stored {:.1} ms, output {:.1} ms; {} calls: {:.1} ms (stage {:.1}, h2d {:.1}, \
         kernels {:.1}, d2h {:.1}, unstage {:.1}), {} values in, {} bytes to the device",
        groups.len(),
        sets.len(),
        started.elapsed().as_secs_f64() * 1e3,
        gather.as_secs_f64() * 1e3,
        store.as_secs_f64() * 1e3,
        t2.elapsed().as_secs_f64() * 1e3,
        out.calls,
        t.total_ms,
        t.stage_ms,
        t.h2d_ms,
        t.kernel_ms,
        t.d2h_ms,
        t.unstage_ms,
        t.input_values,
        t.h2d_bytes,
    );
    Ok(out)
}

/// Where an operand of a group is (see [`fold_groups_with`]).
#[derive(Clone, Debug)]
enum Cur {
    /// An empty set (a group with no set, or one whose intersection emptied).
    Empty,
    /// One of the group's sets, `sets[i]`.
    Set(usize),
    /// Row values `range` of round output `i`.
    Out(usize, Range<usize>),
    /// Values `range` of the CPU's redone rows.
    Redone(Range<usize>),
}

fn slice_of<'a, T: SetElem>(
    c: &Cur,
    sets: &[&'a [T]],
    outputs: &'a [GpuOutput<T>],
    redone: &'a [T],
) -> &'a [T] {
    match c {
        Cur::Empty => &[],
        Cur::Set(i) => sets[*i],
        Cur::Out(i, r) => &outputs[*i].values_slice()[r.clone()],
        Cur::Redone(r) => &redone[r.clone()],
    }
}

/// `rows` one after another into `values`, with their offsets (`rows.len() + 1`, from 0) in
/// `offsets`; the copying on every core (a round's operands are the largest host copy of the
/// fold).
fn gather_rows<T: SetElem>(rows: &[&[T]], offsets: &mut Vec<i64>, values: &mut Vec<T>) {
    offsets.clear();
    offsets.reserve(rows.len() + 1);
    offsets.push(0);
    let mut total = 0usize;
    for r in rows {
        total += r.len();
        offsets.push(total as i64);
    }
    values.clear();
    values.reserve(total);
    // Disjoint destinations, one per row, split off the spare capacity in order.
    let parts: Vec<&mut [MaybeUninit<T>]> = crate::backend::split_lengths(
        &mut values.spare_capacity_mut()[..total],
        rows.iter().map(|r| r.len()),
    );
    parts
        .into_par_iter()
        .zip(rows.par_iter())
        .with_min_len(16)
        .for_each(|(dst, src)| {
            // SAFETY: `dst` and `src` have the same length and do not overlap (`dst` is spare
            // capacity); `T` is `Copy`.
            unsafe {
                std::ptr::copy_nonoverlapping(src.as_ptr(), dst.as_mut_ptr().cast::<T>(), src.len())
            }
        });
    // SAFETY: the parts cover `0..total` and every one was written above.
    unsafe { values.set_len(total) };
}

fn add_timings(sum: &mut Timings, t: &Timings) {
    sum.stage_ms += t.stage_ms;
    sum.h2d_ms += t.h2d_ms;
    sum.kernel_ms += t.kernel_ms;
    sum.kernel_span_ms += t.kernel_span_ms;
    sum.merge_ms += t.merge_ms;
    sum.d2h_ms += t.d2h_ms;
    sum.unstage_ms += t.unstage_ms;
    sum.total_ms += t.total_ms;
    sum.h2d_bytes += t.h2d_bytes;
    sum.d2h_bytes += t.d2h_bytes;
    sum.input_values += t.input_values;
    sum.chunks += t.chunks;
    sum.columns_reused += t.columns_reused;
    sum.graph_launches += t.graph_launches;
    sum.columns_uploaded += t.columns_uploaded;
}

/// [`fold_groups`] on an emulated device that computes each row with the CPU's kernels but
/// flags every third row of a call (its values garbage), so the redo path runs too.
#[cfg(test)]
pub(crate) fn fold_groups_emulated<T: SetElem>(
    groups: &[Range<usize>],
    sets: &[&[T]],
    hold: &mut dyn FnMut(usize) -> bool,
) -> Result<FoldOutput<T>, GpuError> {
    fold_groups_with(groups, sets, hold, |lists| {
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
        /// group (0, 1 or many), their lengths and the rows the emulated device flags, in at
        /// most `ceil(log2 n)` device calls.
        #[test]
        fn rounds_fold_every_group(
            groups in proptest::collection::vec(
                proptest::collection::vec(
                    proptest::collection::btree_set(-20i64..40, 0..30), 0..12),
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
            let out = fold_groups_emulated(&ranges, &views, &mut |_| true).unwrap();
            prop_assert_eq!(out.offsets.len(), groups.len() + 1);
            for (g, r) in ranges.iter().enumerate() {
                let want = reference(&sets[r.clone()]);
                prop_assert_eq!(&out.values[out.offsets[g]..out.offsets[g + 1]], want.as_slice());
            }
            let max = groups.iter().map(Vec::len).max().unwrap_or(0);
            // A tree: ceil(log2 n) rounds for the largest group, not one round per set.
            let rounds = (usize::BITS - max.saturating_sub(1).leading_zeros()) as usize;
            prop_assert!(out.calls as usize <= rounds, "{} calls for {} sets", out.calls, max);
        }
    }

    /// The fold asks for its host memory before each round and before its output, in
    /// amounts that cover what it then holds; refused, it stops with `MemoryLimit`.
    #[test]
    fn fold_holds_its_memory_and_stops_when_refused() {
        let sets: Vec<Vec<u32>> = (0..40u32)
            .map(|i| (0..200 + 10 * i).map(|v| v * (1 + i % 3)).collect())
            .collect();
        let views: Vec<&[u32]> = sets.iter().map(Vec::as_slice).collect();
        let ranges: Vec<Range<usize>> = (0..10).map(|g| 4 * g..4 * g + 4).collect();
        let mut asked = Vec::new();
        let out = fold_groups_emulated(&ranges, &views, &mut |b| {
            asked.push(b);
            true
        })
        .unwrap();
        // Two rounds (four sets per group, reduced as a tree), then the output.
        assert_eq!(out.calls, 2);
        assert_eq!(asked.len(), out.calls as usize + 1);
        // Each round's request covers at least its operands (A and B: every set in round 1)
        // as gathered and as staged; the output's covers the output.
        let first_round: usize = ranges
            .iter()
            .map(|r| r.clone().map(|i| sets[i].len()).sum::<usize>() * 4)
            .sum();
        assert!(asked[0] >= 2 * first_round, "{asked:?} vs {first_round}");
        assert!(*asked.last().unwrap() >= out.values.len() * 4 + out.offsets.len() * 8);
        // Refused at the second request: the fold stops there.
        let mut n = 0;
        let err = fold_groups_emulated(&ranges, &views, &mut |_| {
            n += 1;
            n < 2
        })
        .unwrap_err();
        assert!(
            matches!(&err, GpuError::MemoryLimit(m) if m.contains("round 2")),
            "{err}"
        );
        // Refused its output: stops too.
        let mut n = 0;
        let calls = out.calls as usize;
        let err = fold_groups_emulated(&ranges, &views, &mut |_| {
            n += 1;
            n <= calls
        })
        .unwrap_err();
        assert!(
            matches!(&err, GpuError::MemoryLimit(m) if m.contains("output")),
            "{err}"
        );
    }
}
