//! `list_intersect_agg` with `GROUP BY`: one accumulator for every group of a partition.
//!
//! DataFusion's adapter for plain accumulators copies each batch's lists into group order
//! (`take`) and hands every group a slice of that copy, so each group would hold, and count
//! in its size, the whole copied batch. This accumulator instead keeps each input array once,
//! by reference, with one `(group, array, row)` entry per list, and folds a group's lists
//! shortest first when the held values outgrow the folded results (amortised: every value is
//! folded once) or when groups are emitted. A group's folded result is a strictly increasing
//! run of one flat buffer (offsets per group), so the state of millions of groups is three
//! vectors, not millions of allocations.

use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, ArrowPrimitiveType, AsArray, BooleanArray, GenericListArray, OffsetSizeTrait,
    PrimitiveArray,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::datatypes::{DataType, FieldRef};
use datafusion::common::{Result, internal_err};
use datafusion::logical_expr::{EmitTo, GroupsAccumulator};
use rayon::prelude::*;

use super::{
    FLUSH_VALUES, FoldFn, append_as_set, fold_on_gpu, record_cpu_fold, row_as_set, strict_row,
};
use crate::backend::cpu::{self, SetElem};
use crate::intersect::lists::IntLists;
use crate::placement::plan::BackendPlan;

/// One input list waiting to be folded into its group.
#[derive(Clone, Copy, Debug)]
struct Entry {
    group: usize,
    /// Index into `IntersectGroups::arrays`.
    array: u32,
    row: u32,
}

/// Held values from which a CPU fold runs on every core (a block of groups per task).
const PARALLEL_FOLD_VALUES: usize = 1 << 18;

/// One task's scratch for folding groups on the CPU.
struct FoldBuffers<T> {
    cur: Vec<T>,
    tmp: Vec<T>,
    row: Vec<T>,
}

impl<T> Default for FoldBuffers<T> {
    fn default() -> Self {
        Self {
            cur: Vec::new(),
            tmp: Vec::new(),
            row: Vec::new(),
        }
    }
}

/// The `GroupsAccumulator` of `list_intersect_agg` over element type `P`.
pub(super) struct IntersectGroups<P: ArrowPrimitiveType>
where
    P::Native: SetElem,
{
    /// The result's list field (`List` or `LargeList` of `P`).
    field: FieldRef,
    large: bool,
    /// Per group: whether a non-NULL list was folded in (else the group's result is NULL).
    seen: Vec<bool>,
    /// Per group: whether every list folded in so far held a NULL element.
    null_in_all: Vec<bool>,
    /// Group `g`'s folded intersection is `values[offsets[g]..offsets[g + 1]]`.
    offsets: Vec<usize>,
    values: Vec<P::Native>,
    /// Input arrays the entries point into, each held once.
    arrays: Vec<ArrayRef>,
    /// Memory of `arrays`.
    array_bytes: usize,
    entries: Vec<Entry>,
    /// Values referenced by `entries`.
    pending_values: usize,
    /// Scratch of the one-thread fold (kept between folds).
    bufs: FoldBuffers<P::Native>,
    /// The planning-time choice: with `Gpu`, folds run on the device (all groups at once).
    plan: Option<Arc<BackendPlan>>,
    /// The device's fold ([`crate::backend::gpu::fold_groups`]).
    gpu_fold: FoldFn<P::Native>,
    /// Held values from which the CPU folds on every core (tests lower it).
    parallel_fold_values: usize,
}

impl<P: ArrowPrimitiveType> IntersectGroups<P>
where
    P::Native: SetElem,
{
    /// `return_type`: `List` or `LargeList` of `P` (the aggregate's return type).
    pub(super) fn new(return_type: &DataType, plan: Option<Arc<BackendPlan>>) -> Result<Self> {
        let (field, large) = match return_type {
            DataType::List(f) => (Arc::clone(f), false),
            DataType::LargeList(f) => (Arc::clone(f), true),
            other => return internal_err!("list_intersect_agg: unexpected return type {other}"),
        };
        Ok(Self {
            field,
            large,
            seen: Vec::new(),
            null_in_all: Vec::new(),
            offsets: vec![0],
            values: Vec::new(),
            arrays: Vec::new(),
            array_bytes: 0,
            entries: Vec::new(),
            pending_values: 0,
            bufs: FoldBuffers::default(),
            plan,
            gpu_fold: crate::backend::gpu::fold_groups::<P::Native>,
            parallel_fold_values: PARALLEL_FOLD_VALUES,
        })
    }

    fn groups(&self) -> usize {
        self.seen.len()
    }

    fn resize(&mut self, total_num_groups: usize) {
        if total_num_groups > self.groups() {
            let end = self.values.len();
            self.seen.resize(total_num_groups, false);
            self.null_in_all.resize(total_num_groups, true);
            self.offsets.resize(total_num_groups + 1, end);
        }
    }

    fn add(
        &mut self,
        lists: &ArrayRef,
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        self.resize(total_num_groups);
        if self.large {
            self.hold::<i64>(lists, group_indices, opt_filter)?;
        } else {
            self.hold::<i32>(lists, group_indices, opt_filter)?;
        }
        // Fold once the held lists outweigh the folded results: each value is then folded a
        // bounded number of times, and at most about twice the results' size is held.
        if self.pending_values + self.entries.len()
            >= FLUSH_VALUES.max(self.values.len() + self.groups())
        {
            self.fold()?;
        }
        Ok(())
    }

    fn hold<O: OffsetSizeTrait>(
        &mut self,
        lists: &ArrayRef,
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<()> {
        let Some(list) = lists.as_list_opt::<O>() else {
            return internal_err!(
                "list_intersect_agg: unexpected input type {}",
                lists.data_type()
            );
        };
        if group_indices.len() != list.len() {
            return internal_err!(
                "list_intersect_agg: {} group indices for {} rows",
                group_indices.len(),
                list.len()
            );
        }
        let Ok(array) = u32::try_from(self.arrays.len()) else {
            return internal_err!("list_intersect_agg: too many input batches held");
        };
        let offsets = list.value_offsets();
        let before = self.entries.len();
        for (row, &group) in group_indices.iter().enumerate() {
            if list.is_null(row) || opt_filter.is_some_and(|f| !f.is_valid(row) || !f.value(row)) {
                continue;
            }
            if group >= self.groups() {
                return internal_err!(
                    "list_intersect_agg: group index {group} of {} groups",
                    self.groups()
                );
            }
            self.pending_values += (offsets[row + 1] - offsets[row]).as_usize();
            self.entries.push(Entry {
                group,
                array,
                // A batch has fewer than 2^32 rows (its offsets are at most i64, its length usize,
                // but DataFusion batches are far smaller); checked to stay exact.
                row: u32::try_from(row).map_err(|_| {
                    datafusion::common::DataFusionError::Internal(
                        "list_intersect_agg: a batch of 2^32 rows or more".into(),
                    )
                })?,
            });
        }
        if self.entries.len() > before {
            self.array_bytes += lists.get_array_memory_size();
            self.arrays.push(Arc::clone(lists));
        }
        Ok(())
    }

    /// Fold every held list into its group's result, shortest first per group, and release
    /// the held arrays.
    fn fold(&mut self) -> Result<()> {
        if self.entries.is_empty() {
            return Ok(());
        }
        if self.large {
            self.fold_with::<i64>()
        } else {
            self.fold_with::<i32>()
        }
    }

    fn fold_with<O: OffsetSizeTrait>(&mut self) -> Result<()> {
        let arrays = std::mem::take(&mut self.arrays);
        let entries = std::mem::take(&mut self.entries);
        let mut views = Vec::with_capacity(arrays.len());
        for a in &arrays {
            let Some(list) = a.as_list_opt::<O>() else {
                return internal_err!(
                    "list_intersect_agg: unexpected input type {}",
                    a.data_type()
                );
            };
            views.push(IntLists::<O, P::Native>::new::<P>(list));
        }
        let len = |e: &Entry| views[e.array as usize].range(e.row as usize).len();
        let sorting = std::time::Instant::now();
        let groups = self.groups();
        // By group in one counting pass (a comparison sort of half a million entries took
        // ~0.3 s in a test build, a pause no cancel could interrupt), then each group's
        // few lists by length.
        let mut bounds = vec![0usize; groups + 1];
        for e in &entries {
            bounds[e.group + 1] += 1;
        }
        for g in 0..groups {
            bounds[g + 1] += bounds[g];
        }
        let mut by_group = entries.clone();
        let mut next = bounds.clone();
        for e in &entries {
            by_group[next[e.group]] = *e;
            next[e.group] += 1;
        }
        drop(next);
        for g in 0..groups {
            by_group[bounds[g]..bounds[g + 1]].sort_unstable_by_key(len);
        }
        let mut entries = by_group;
        let sorted = sorting.elapsed();
        if self.fold_on_gpu(&views, &entries) {
            log::debug!(
                "datafusion-sets: list_intersect_agg: {} lists of {} groups folded on the GPU \
                 ({:.1} ms sorting them, {:.1} ms in all)",
                entries.len(),
                self.groups(),
                sorted.as_secs_f64() * 1e3,
                sorting.elapsed().as_secs_f64() * 1e3
            );
            drop(views);
            entries.clear();
            self.entries = entries;
            self.pending_values = 0;
            self.array_bytes = 0;
            return Ok(());
        }
        let started = std::time::Instant::now();
        // Each group's entries are `entries[bounds[g]..bounds[g + 1]]`.
        // Groups are independent: blocks of consecutive groups fold on every core when there
        // is enough to fold, each into its own buffer, joined in group order.
        let blocks = if self.pending_values >= self.parallel_fold_values {
            (rayon::current_num_threads() * 8).min(groups).max(1)
        } else {
            1
        };
        let per_block = groups.div_ceil(blocks).max(1);
        let (old_values, old_offsets) = (&self.values, &self.offsets);
        let fold_block = |block: usize,
                          seen: &mut [bool],
                          null_in_all: &mut [bool],
                          bufs: &mut FoldBuffers<P::Native>|
         -> (Vec<P::Native>, Vec<usize>) {
            let first = block * per_block;
            let mut values = Vec::new();
            let mut lens = Vec::with_capacity(seen.len());
            for (i, (seen, null_in_all)) in seen.iter_mut().zip(null_in_all.iter_mut()).enumerate()
            {
                let g = first + i;
                let old = &old_values[old_offsets[g]..old_offsets[g + 1]];
                let group = &entries[bounds[g]..bounds[g + 1]];
                if group.is_empty() {
                    values.extend_from_slice(old);
                    lens.push(old.len());
                    continue;
                }
                let mut have = *seen;
                bufs.cur.clear();
                bufs.cur.extend_from_slice(old);
                for e in group {
                    let view = &views[e.array as usize];
                    let row = e.row as usize;
                    let has_null = view.row_has_null_element(row);
                    *null_in_all &= has_null;
                    if have && bufs.cur.is_empty() {
                        continue; // nothing can come back; only the NULL flag still changes
                    }
                    let set = row_as_set(view, row, has_null, &mut bufs.row);
                    if have {
                        bufs.tmp.clear();
                        cpu::intersect_auto(&bufs.cur, set, &mut bufs.tmp);
                        std::mem::swap(&mut bufs.cur, &mut bufs.tmp);
                    } else {
                        bufs.cur.extend_from_slice(set);
                        have = true;
                    }
                }
                *seen = have;
                values.extend_from_slice(&bufs.cur);
                lens.push(bufs.cur.len());
            }
            (values, lens)
        };
        let mut seen = std::mem::take(&mut self.seen);
        let mut null_in_all = std::mem::take(&mut self.null_in_all);
        let parts: Vec<(Vec<P::Native>, Vec<usize>)> = if blocks > 1 {
            seen.par_chunks_mut(per_block)
                .zip(null_in_all.par_chunks_mut(per_block))
                .enumerate()
                .map_init(FoldBuffers::default, |bufs, (block, (seen, nia))| {
                    fold_block(block, seen, nia, bufs)
                })
                .collect()
        } else {
            let mut bufs = std::mem::take(&mut self.bufs);
            let part = fold_block(0, &mut seen, &mut null_in_all, &mut bufs);
            self.bufs = bufs;
            vec![part]
        };
        self.seen = seen;
        self.null_in_all = null_in_all;
        let mut offsets = Vec::with_capacity(groups + 1);
        offsets.push(0);
        let mut end = 0;
        for l in parts.iter().flat_map(|(_, lens)| lens) {
            end += l;
            offsets.push(end);
        }
        // One block's values are the result as they are; blocks are joined in order.
        self.values = match <[_; 1]>::try_from(parts) {
            Ok([(values, _)]) => values,
            Err(parts) => {
                let mut all = Vec::with_capacity(end);
                for (v, _) in parts {
                    all.extend_from_slice(&v);
                }
                all
            }
        };
        self.offsets = offsets;
        record_cpu_fold(self.plan.as_ref(), entries.len(), started);
        log::debug!(
            "datafusion-sets: list_intersect_agg: {} lists of {} groups folded on the CPU in \
             {:.1} ms (+{:.1} ms sorting them)",
            entries.len(),
            groups,
            started.elapsed().as_secs_f64() * 1e3,
            sorted.as_secs_f64() * 1e3
        );
        entries.clear();
        self.entries = entries;
        self.pending_values = 0;
        self.array_bytes = 0;
        Ok(())
    }

    /// Every group's held lists folded into its result on the GPU, when the plan chose it:
    /// each group's operands (its result so far, then its lists as sets, shortest first)
    /// go to [`crate::backend::gpu::fold_groups`] together. `false`, with nothing changed,
    /// when the CPU must fold them instead. `entries` are sorted by group, then length.
    fn fold_on_gpu<O: OffsetSizeTrait>(
        &mut self,
        views: &[IntLists<'_, O, P::Native>],
        entries: &[Entry],
    ) -> bool {
        if self.plan.is_none() {
            return false;
        }
        // A set is a row borrowed from its Arrow buffer when it is one already, else its
        // sorted, deduplicated copy in `owned`.
        enum Src<'a, T> {
            Row(&'a [T]),
            Owned(std::ops::Range<usize>),
        }
        let groups = self.groups();
        // Each held row's NULL flag, and the row itself when it is a set already: read on
        // every core (the order check reads every value of every list).
        let rows: Vec<(bool, Option<&[P::Native]>)> = entries
            .par_iter()
            .with_min_len(64)
            .map(|e| {
                let view = &views[e.array as usize];
                let row = e.row as usize;
                let has_null = view.row_has_null_element(row);
                (has_null, strict_row(view, row, has_null))
            })
            .collect();
        let mut owned: Vec<P::Native> = Vec::new();
        let mut srcs: Vec<Src<'_, P::Native>> = Vec::with_capacity(entries.len() + groups);
        let mut ranges = Vec::with_capacity(groups);
        let mut seen = self.seen.clone();
        let mut null_in_all = self.null_in_all.clone();
        let mut next = 0;
        for g in 0..groups {
            let first = srcs.len();
            let start = next;
            while next < entries.len() && entries[next].group == g {
                next += 1;
            }
            let old = &self.values[self.offsets[g]..self.offsets[g + 1]];
            if seen[g] {
                srcs.push(Src::Row(old));
            }
            // An empty result stays empty; only the NULL flags still change.
            let settled = seen[g] && old.is_empty();
            for (e, &(has_null, strict)) in entries[start..next].iter().zip(&rows[start..next]) {
                null_in_all[g] &= has_null;
                if settled {
                    continue;
                }
                if let Some(values) = strict {
                    srcs.push(Src::Row(values));
                } else {
                    let at = owned.len();
                    append_as_set(&views[e.array as usize], e.row as usize, &mut owned);
                    srcs.push(Src::Owned(at..owned.len()));
                }
            }
            seen[g] |= start < next;
            ranges.push(first..srcs.len());
        }
        let mut sets: Vec<&[P::Native]> = srcs
            .iter()
            .map(|s| match s {
                Src::Row(r) => *r,
                Src::Owned(r) => &owned[r.clone()],
            })
            .collect();
        // Shortest first within each group (the held lists are sorted already; the result so
        // far goes where its length puts it).
        for r in &ranges {
            sets[r.clone()].sort_by_key(|s| s.len());
        }
        let Some(out) = fold_on_gpu(self.plan.as_ref(), &ranges, &sets, self.gpu_fold) else {
            return false;
        };
        self.values = out.values;
        self.offsets = out.offsets;
        self.seen = seen;
        self.null_in_all = null_in_all;
        true
    }

    /// The first `n` groups' results as a list array (a NULL list for a group with no
    /// non-NULL list; one trailing NULL element where every list held one), removed from the
    /// state; the remaining groups move down by `n`.
    fn emit(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.fold()?;
        let n = match emit_to {
            EmitTo::All => self.groups(),
            EmitTo::First(n) => n.min(self.groups()),
        };
        let with_null = |g: usize| self.seen[g] && self.null_in_all[g];
        let extra = (0..n).filter(|&g| with_null(g)).count();
        let end = self.offsets[n];
        let mut lengths = Vec::with_capacity(n);
        let mut element_valid = (extra > 0).then(|| Vec::with_capacity(end + extra));
        // Every group, no NULL element to add: the results are the values as they are.
        let whole = n == self.groups() && extra == 0;
        let mut values = match whole {
            true => std::mem::take(&mut self.values),
            false => Vec::with_capacity(end + extra),
        };
        for g in 0..n {
            if whole {
                lengths.push(self.offsets[g + 1] - self.offsets[g]);
                continue;
            }
            let run = &self.values[self.offsets[g]..self.offsets[g + 1]];
            values.extend_from_slice(run);
            let mut len = run.len();
            if let Some(v) = element_valid.as_mut() {
                v.extend(std::iter::repeat_n(true, run.len()));
            }
            if with_null(g) {
                values.push(P::Native::default());
                len += 1;
                if let Some(v) = element_valid.as_mut() {
                    v.push(false);
                }
            }
            lengths.push(len);
        }
        let list_valid = NullBuffer::from(self.seen[..n].to_vec());
        let list_nulls = (list_valid.null_count() > 0).then_some(list_valid);
        let element = Arc::new(PrimitiveArray::<P>::new(
            values.into(),
            element_valid.map(NullBuffer::from),
        ));
        fn list<O: OffsetSizeTrait>(
            field: FieldRef,
            lengths: Vec<usize>,
            element: ArrayRef,
            nulls: Option<NullBuffer>,
        ) -> Result<ArrayRef> {
            let offsets = OffsetBuffer::<O>::from_lengths(lengths);
            Ok(Arc::new(GenericListArray::<O>::try_new(
                field, offsets, element, nulls,
            )?))
        }
        let (field, element): (_, ArrayRef) = (Arc::clone(&self.field), element);
        let out = if self.large {
            list::<i64>(field, lengths, element, list_nulls)?
        } else {
            list::<i32>(field, lengths, element, list_nulls)?
        };
        // Drop the emitted groups.
        if !whole {
            self.values.drain(..end);
        }
        self.offsets.drain(..n);
        for o in &mut self.offsets {
            *o -= end;
        }
        self.seen.drain(..n);
        self.null_in_all.drain(..n);
        Ok(out)
    }

    /// One input list per row as this aggregate's state: the list itself under the state's
    /// field (a list's state is the list), NULL where the filter drops the row.
    fn as_state<O: OffsetSizeTrait>(
        &self,
        lists: &ArrayRef,
        opt_filter: Option<&BooleanArray>,
    ) -> Result<ArrayRef> {
        let Some(list) = lists.as_list_opt::<O>() else {
            return internal_err!(
                "list_intersect_agg: unexpected input type {}",
                lists.data_type()
            );
        };
        let filter_nulls = opt_filter.map(|f| {
            // A row passes where the filter is true (not NULL, not false).
            let keep = match f.nulls() {
                Some(n) => f.values() & n.inner(),
                None => f.values().clone(),
            };
            NullBuffer::new(keep)
        });
        let nulls = NullBuffer::union(list.nulls(), filter_nulls.as_ref());
        Ok(Arc::new(GenericListArray::<O>::try_new(
            Arc::clone(&self.field),
            list.offsets().clone(),
            Arc::clone(list.values()),
            nulls,
        )?))
    }
}

impl<P: ArrowPrimitiveType> std::fmt::Debug for IntersectGroups<P>
where
    P::Native: SetElem,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IntersectGroups")
            .field("field", &self.field)
            .field("groups", &self.groups())
            .field("values", &self.values.len())
            .field("entries", &self.entries.len())
            .finish()
    }
}

impl<P: ArrowPrimitiveType> GroupsAccumulator for IntersectGroups<P>
where
    P::Native: SetElem,
{
    fn update_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        opt_filter: Option<&BooleanArray>,
        total_num_groups: usize,
    ) -> Result<()> {
        match values {
            [lists] => self.add(lists, group_indices, opt_filter, total_num_groups),
            _ => internal_err!(
                "list_intersect_agg expects one input column, got {}",
                values.len()
            ),
        }
    }

    fn evaluate(&mut self, emit_to: EmitTo) -> Result<ArrayRef> {
        self.emit(emit_to)
    }

    fn state(&mut self, emit_to: EmitTo) -> Result<Vec<ArrayRef>> {
        // A partial result is a list like any input list (see `Accumulator::state` of the
        // plain accumulator), so the state is the result.
        Ok(vec![self.emit(emit_to)?])
    }

    fn merge_batch(
        &mut self,
        values: &[ArrayRef],
        group_indices: &[usize],
        total_num_groups: usize,
    ) -> Result<()> {
        self.update_batch(values, group_indices, None, total_num_groups)
    }

    fn convert_to_state(
        &self,
        values: &[ArrayRef],
        opt_filter: Option<&BooleanArray>,
    ) -> Result<Vec<ArrayRef>> {
        let [lists] = values else {
            return internal_err!(
                "list_intersect_agg expects one input column, got {}",
                values.len()
            );
        };
        Ok(vec![if self.large {
            self.as_state::<i64>(lists, opt_filter)?
        } else {
            self.as_state::<i32>(lists, opt_filter)?
        }])
    }

    fn size(&self) -> usize {
        size_of_val(self)
            + (self.seen.capacity() + self.null_in_all.capacity())
            + self.offsets.capacity() * size_of::<usize>()
            + (self.values.capacity()
                + self.bufs.cur.capacity()
                + self.bufs.tmp.capacity()
                + self.bufs.row.capacity())
                * size_of::<P::Native>()
            + self.arrays.capacity() * size_of::<ArrayRef>()
            + self.array_bytes
            + self.entries.capacity() * size_of::<Entry>()
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use datafusion::arrow::array::{Int32Builder, ListBuilder};
    use datafusion::arrow::datatypes::Int32Type;
    use proptest::prelude::*;

    use super::*;
    use crate::config::BackendChoice;
    use crate::placement::plan::BackendMetrics;

    type Row = (usize, Option<Vec<Option<i32>>>);

    fn list_array(rows: &[Row], large: bool) -> ArrayRef {
        let mut b = ListBuilder::new(Int32Builder::new());
        for (_, l) in rows {
            match l {
                None => b.append_null(),
                Some(v) => {
                    for x in v {
                        b.values().append_option(*x);
                    }
                    b.append(true);
                }
            }
        }
        let a: ArrayRef = Arc::new(b.finish());
        if large {
            datafusion::arrow::compute::cast(&a, &DataType::new_large_list(DataType::Int32, true))
                .unwrap()
        } else {
            a
        }
    }

    /// Per group: None (no non-NULL list) or (distinct non-NULL common values ascending,
    /// whether every list held a NULL).
    fn reference(rows: &[(Row, bool)], groups: usize) -> Vec<Option<(Vec<i32>, bool)>> {
        let mut out: Vec<Option<(BTreeSet<i32>, bool)>> = vec![None; groups];
        for ((g, l), keep) in rows {
            let (Some(l), true) = (l, keep) else { continue };
            let set: BTreeSet<i32> = l.iter().flatten().copied().collect();
            let has_null = l.iter().any(Option::is_none);
            out[*g] = Some(match out[*g].take() {
                None => (set, has_null),
                Some((cur, all)) => (cur.intersection(&set).copied().collect(), all && has_null),
            });
        }
        out.into_iter()
            .map(|o| o.map(|(s, n)| (s.into_iter().collect(), n)))
            .collect()
    }

    fn decode(a: &ArrayRef) -> Vec<Option<(Vec<i32>, bool)>> {
        let rows: Vec<Option<ArrayRef>> = if let Some(l) = a.as_list_opt::<i32>() {
            l.iter().collect()
        } else {
            a.as_list::<i64>().iter().collect()
        };
        rows.into_iter()
            .map(|r| {
                r.map(|v| {
                    let v = v.as_primitive::<Int32Type>();
                    let vals: Vec<Option<i32>> = v.iter().collect();
                    let has_null = vals.last() == Some(&None);
                    // At most one NULL, and only last.
                    assert!(
                        vals[..vals.len() - usize::from(has_null)]
                            .iter()
                            .all(Option::is_some)
                    );
                    (vals.into_iter().flatten().collect(), has_null)
                })
            })
            .collect()
    }

    fn rows_strategy() -> impl Strategy<Value = (usize, Vec<(Row, bool)>)> {
        (1usize..12).prop_flat_map(|groups| {
            let elem = prop_oneof![9 => (0i32..24).prop_map(Some), 1 => Just(None)];
            let list = prop_oneof![
                1 => Just(None),
                8 => proptest::collection::vec(elem, 0..20).prop_map(Some),
            ];
            (
                Just(groups),
                proptest::collection::vec(((0..groups, list), prop::bool::weighted(0.85)), 0..60),
            )
        })
    }

    /// Feed `rows` to a fresh accumulator in batches of `batch` rows: even batches through
    /// `update_batch` (with the filter), odd ones through `convert_to_state` + `merge_batch` of
    /// a second accumulator's states (as a two-phase aggregation does).
    fn run(
        rows: &[(Row, bool)],
        groups: usize,
        batch: usize,
        large: bool,
        first: usize,
        emulated: bool,
        parallel: bool,
    ) -> Vec<Option<(Vec<i32>, bool)>> {
        let ret = if large {
            DataType::new_large_list(DataType::Int32, true)
        } else {
            DataType::new_list(DataType::Int32, true)
        };
        // `emulated`: bound to the GPU, its folds on the emulated device (rounds and redo as
        // on the GPU, rows computed by the CPU), so the device path's preparation (operands,
        // NULL flags, results so far) is checked on any machine.
        let plan = emulated.then(|| Arc::new(BackendPlan::new(BackendChoice::Gpu, "test")));
        let make = || {
            let mut acc = IntersectGroups::<Int32Type>::new(&ret, plan.clone()).unwrap();
            if emulated {
                acc.gpu_fold = crate::backend::gpu::fold_groups_emulated::<i32>;
            }
            if parallel {
                // Every CPU fold in blocks of groups on the thread pool.
                acc.parallel_fold_values = 0;
            }
            acc
        };
        let (mut acc, mut other) = (make(), make());
        for (i, chunk) in rows.chunks(batch.max(1)).enumerate() {
            let plain: Vec<Row> = chunk.iter().map(|(r, _)| r.clone()).collect();
            let lists = list_array(&plain, large);
            let filter = BooleanArray::from(chunk.iter().map(|(_, k)| *k).collect::<Vec<_>>());
            let gi: Vec<usize> = chunk.iter().map(|((g, _), _)| *g).collect();
            if i % 2 == 0 {
                acc.update_batch(&[lists], &gi, Some(&filter), groups)
                    .unwrap();
            } else {
                let state = other.convert_to_state(&[lists], Some(&filter)).unwrap();
                assert_eq!(state[0].data_type(), &ret);
                other.merge_batch(&state, &gi, groups).unwrap();
            }
        }
        // Two-phase: the second accumulator's partial results merged into the first.
        let partial = other.state(EmitTo::All).unwrap();
        let identity: Vec<usize> = (0..partial[0].len()).collect();
        acc.merge_batch(&partial, &identity, groups).unwrap();
        assert!(acc.size() > 0);
        // Emit the first groups, then the rest.
        let mut out = decode(&acc.evaluate(EmitTo::First(first.min(groups))).unwrap());
        out.extend(decode(&acc.evaluate(EmitTo::All).unwrap()));
        if let Some(p) = &plan {
            // Every fold went to the (emulated) device.
            assert_eq!(BackendMetrics::get(&p.metrics.cpu_batches), 0);
        }
        out
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]
        #[test]
        fn groups_match_reference(
            (groups, rows) in rows_strategy(),
            batch in 1usize..20,
            large in any::<bool>(),
            first in 0usize..12,
            emulated in any::<bool>(),
            parallel in any::<bool>(),
        ) {
            let expected = reference(&rows, groups);
            prop_assert_eq!(run(&rows, groups, batch, large, first, emulated, parallel), expected);
        }
    }

    /// Bound to the GPU in a query with a memory pool, the fold reserves its host memory
    /// there: a pool too small for it sends the fold to the CPU (same answer), a large one
    /// lets it run on the (emulated) device, and nothing stays reserved afterwards.
    #[test]
    fn gpu_fold_reserves_in_the_query_pool() {
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
        let rows: Vec<(Row, bool)> = (0..200)
            .map(|i| {
                let list = (0..40).map(|v| Some((v * (1 + i % 3)) as i32)).collect();
                ((i % 5, Some(list)), true)
            })
            .collect();
        let expected = reference(&rows, 5);
        let ret = DataType::new_list(DataType::Int32, true);
        for (limit, on_gpu) in [(256usize, false), (1 << 30, true)] {
            let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
            let plan = Arc::new(BackendPlan::new(BackendChoice::Gpu, "test"));
            plan.bind_pool(&pool, "list_intersect_agg[gpu]");
            let mut acc = IntersectGroups::<Int32Type>::new(&ret, Some(Arc::clone(&plan))).unwrap();
            acc.gpu_fold = crate::backend::gpu::fold_groups_emulated::<i32>;
            let plain: Vec<Row> = rows.iter().map(|(r, _)| r.clone()).collect();
            let gi: Vec<usize> = plain.iter().map(|(g, _)| *g).collect();
            acc.update_batch(&[list_array(&plain, false)], &gi, None, 5)
                .unwrap();
            let out = decode(&acc.evaluate(EmitTo::All).unwrap());
            assert_eq!(out, expected, "pool of {limit} bytes");
            let m = &plan.metrics;
            assert_eq!(BackendMetrics::get(&m.gpu_batches) > 0, on_gpu, "{limit}");
            assert_eq!(BackendMetrics::get(&m.cpu_batches) > 0, !on_gpu, "{limit}");
            assert_eq!(pool.reserved(), 0);
        }
    }

    /// Many small batches over few groups: the held lists are folded while rows still come
    /// in (not only at the end), and what is held after each fold stays bounded.
    #[test]
    fn folds_while_adding() {
        let ret = DataType::new_list(DataType::Int32, true);
        let mut acc = IntersectGroups::<Int32Type>::new(&ret, None).unwrap();
        let n = 3 * (FLUSH_VALUES / 1000) + 7;
        let mut peak = 0;
        for i in 0..n {
            // Group i % 2: lists 0..1000 step 1 with one value dropped per row, so the
            // intersection shrinks row by row.
            let drop = (i / 2) as i32 % 1000;
            let row: Vec<Option<i32>> = (0..1000).filter(|&x| x != drop).map(Some).collect();
            let lists = list_array(&[(i % 2, Some(row))], false);
            acc.update_batch(&[lists], &[i % 2], None, 2).unwrap();
            peak = peak.max(acc.pending_values);
        }
        assert!(peak <= FLUSH_VALUES + 1000, "held {peak} values");
        let out = decode(&acc.evaluate(EmitTo::All).unwrap());
        // Every value 0..1000 was dropped by some row of each group: nothing is common.
        assert_eq!(out, vec![Some((vec![], false)), Some((vec![], false))]);
    }
}
