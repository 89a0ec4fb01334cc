//! The per-row engine behind `list_intersect` and `list_intersect_count` on integer lists.
//!
//! Each row is classified on its own, never trusted:
//! - every list sorted ascending with no NULL element → the sorted kernels (hybrid SIMD /
//!   galloping per pair, k-way shortest first); the result is the distinct common values,
//!   ascending, which is exactly what the built-in returns for sorted input;
//! - otherwise → the exact semantics of DataFusion's `array_intersect`, folded left: the
//!   shorter list is the lookup side, the longer one is probed in order (ties: the left one
//!   is probed), duplicates dropped, NULL elements equal to each other.
//!
//! A row's order verdicts come from the per-buffer cache when an earlier query checked the
//! same buffers; otherwise they are established as the row is read: a row of two lists runs
//! the order-checking kernel ([`cpu::intersect_auto_checked`]: with the AVX-512 block kernel
//! the check rides on the kernel's own loads), and only a row it refuses is classified list
//! by list; other rows are checked list by list just before their kernel runs.
//!
//! Large batches are split into chunks of about equal value counts, run on rayon's pool.

use std::collections::HashSet;
use std::ops::Range;
use std::sync::Arc;

use datafusion::arrow::array::OffsetSizeTrait;
use datafusion::arrow::buffer::Buffer;
use rayon::prelude::*;

use super::lists::IntLists;
use super::verdicts::{Lookup, Verdict, lookup_verdicts, store_verdicts, verdict_of};
use crate::backend::cpu::CpuKernelChoice;
use crate::backend::cpu::{self, SetElem, Sortedness};
use crate::config::BackendChoice;
use crate::placement::plan::{BackendMetrics, BackendPlan};

type FastSet<T> = HashSet<T, foldhash::fast::RandomState>;

/// How the rows of one call are processed.
#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Kernel policy for sorted rows.
    pub kernel: CpuKernelChoice,
    /// Split across threads when the batch holds at least this many values (0: never).
    pub parallel_min_values: usize,
    /// Device: `Gpu` tries the GPU backend first (the CPU when it cannot run the batch).
    pub backend: BackendChoice,
    /// The planning-time choice this call belongs to, whose counters it feeds (`None` for a
    /// function called without the optimizer rule).
    pub plan: Option<Arc<BackendPlan>>,
    /// Keep the list columns on the device for later batches within this many bytes (0:
    /// the default budget); `None`: copy them per batch (`sets.gpu_resident_columns`).
    pub gpu_columns: Option<usize>,
}

/// What one chunk of rows produced (values mode).
pub struct ValuesOut<T> {
    /// Concatenated row results.
    pub values: Vec<T>,
    /// Length of each row's result.
    pub lengths: Vec<usize>,
    /// Element validity, `None` when no NULL element was produced.
    pub validity: Option<Vec<bool>>,
    /// The values as an Arrow buffer of `T` instead of `values` (the GPU's results, handed
    /// over without a copy); `values` is then empty.
    pub shared: Option<Buffer>,
}

/// Reused per-thread buffers.
struct Scratch<'a, T: SetElem> {
    rows: Vec<&'a [T]>,
    tmp: Vec<T>,
    tmp2: Vec<T>,
    opt_a: Vec<Option<T>>,
    opt_b: Vec<Option<T>>,
    opt_out: Vec<Option<T>>,
    lookup: FastSet<Option<T>>,
    seen: FastSet<Option<T>>,
}

impl<T: SetElem> Scratch<'_, T> {
    fn new() -> Self {
        Self {
            rows: Vec::new(),
            tmp: Vec::new(),
            tmp2: Vec::new(),
            opt_a: Vec::new(),
            opt_b: Vec::new(),
            opt_out: Vec::new(),
            lookup: FastSet::default(),
            seen: FastSet::default(),
        }
    }
}

/// A row's classification.
enum RowKind {
    /// Some list is empty: the result is empty, whatever the rest holds.
    Empty,
    /// All lists sorted, no NULL element; `strict` when none has duplicates.
    Sorted { strict: bool },
    /// Anything else: exact built-in semantics.
    General,
}

/// Where each list's row verdicts come from during one call.
struct Verdicts {
    /// Verdicts of every row, from the cache.
    cached: Vec<Option<Arc<[Verdict]>>>,
    /// Lists the cache missed: their rows are checked as the chunk reads them (so the values
    /// are in cache when the kernel runs), recorded, and stored when the call ends.
    record: Vec<bool>,
}

impl Verdicts {
    fn look_up<O: OffsetSizeTrait, T: SetElem>(lists: &[IntLists<'_, O, T>]) -> Self {
        let (mut cached, mut record) = (Vec::new(), Vec::new());
        for l in lists {
            let (c, r) = match lookup_verdicts(l) {
                Lookup::Hit(v) => (Some(v), false),
                Lookup::Miss => (None, true),
                Lookup::Small => (None, false),
            };
            cached.push(c);
            record.push(r);
        }
        Self { cached, record }
    }

    /// Check every row as it comes, record nothing.
    fn unchecked(lists: usize) -> Self {
        Self {
            cached: vec![None; lists],
            record: vec![false; lists],
        }
    }

    /// Fresh per-chunk recording buffers.
    fn recorder(&self, rows: usize) -> Vec<Vec<Verdict>> {
        self.record
            .iter()
            .map(|&r| Vec::with_capacity(if r { rows } else { 0 }))
            .collect()
    }

    /// Check row `i` of every recorded list; called once per row, in row order.
    fn record_row<O: OffsetSizeTrait, T: SetElem>(
        &self,
        lists: &[IntLists<'_, O, T>],
        rec: &mut [Vec<Verdict>],
        i: usize,
    ) {
        for ((l, &r), out) in lists.iter().zip(&self.record).zip(rec) {
            if r {
                out.push(verdict_of(l, i));
            }
        }
    }

    /// Record row verdicts `Strict` for every recorded list (a checked kernel found the row's
    /// lists strictly increasing); called instead of [`Self::record_row`].
    fn record_strict(&self, rec: &mut [Vec<Verdict>]) {
        for (out, &r) in rec.iter_mut().zip(&self.record) {
            if r {
                out.push(Verdict::Strict);
            }
        }
    }

    /// Store the recorded verdicts, the chunks' recorders in row order.
    fn store<O: OffsetSizeTrait, T: SetElem>(
        &self,
        lists: &[IntLists<'_, O, T>],
        recorders: Vec<Vec<Vec<Verdict>>>,
    ) {
        for (k, l) in lists.iter().enumerate() {
            if self.record[k] {
                let all: Vec<Verdict> = recorders
                    .iter()
                    .flat_map(|r| r[k].iter().copied())
                    .collect();
                store_verdicts(l, all);
            }
        }
    }
}

fn classify<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    verdicts: &Verdicts,
    rec: &[Vec<Verdict>],
    i: usize,
) -> RowKind {
    if lists.iter().any(|l| l.range(i).is_empty()) {
        return RowKind::Empty;
    }
    let mut strict = true;
    for (k, l) in lists.iter().enumerate() {
        let verdict = match &verdicts.cached[k] {
            Some(v) => v[i],
            // `record_row` has just checked this row.
            None if verdicts.record[k] => rec[k][rec[k].len() - 1],
            None => verdict_of(l, i),
        };
        match verdict {
            Verdict::Strict => {}
            Verdict::NonDecreasing => strict = false,
            Verdict::General => return RowKind::General,
        }
    }
    RowKind::Sorted { strict }
}

/// A row of two non-empty, non-NULL lists under the `auto` policy, shorter list first: the
/// common case, run without the general row machinery (the rows vector, its sort, the k-way
/// loop).
enum FastPair<'a, T> {
    /// Both lists are known to be strictly increasing (cached verdicts): the sorted kernels.
    Known(&'a [T], &'a [T]),
    /// Nobody has checked their order yet and neither has a NULL element: the kernel that
    /// intersects them checks it ([`cpu::intersect_auto_checked`]), so the check costs no
    /// pass of its own over memory.
    Unchecked(&'a [T], &'a [T]),
}

fn fast_pair<'a, O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'a, O, T>],
    verdicts: &Verdicts,
    kernel: CpuKernelChoice,
    i: usize,
) -> Option<FastPair<'a, T>> {
    let [l0, l1] = lists else { return None };
    if !matches!(kernel, CpuKernelChoice::Auto) || l0.is_null(i) || l1.is_null(i) {
        return None;
    }
    let (a, b) = (l0.row(i), l1.row(i));
    if a.is_empty() || b.is_empty() {
        return None;
    }
    let (a, b) = if a.len() <= b.len() { (a, b) } else { (b, a) };
    match (&verdicts.cached[0], &verdicts.cached[1]) {
        (Some(x), Some(y)) => {
            (x[i] == Verdict::Strict && y[i] == Verdict::Strict).then_some(FastPair::Known(a, b))
        }
        (None, None) => (!l0.row_has_null_element(i) && !l1.row_has_null_element(i))
            .then_some(FastPair::Unchecked(a, b)),
        _ => None,
    }
}

fn pair<T: SetElem>(kernel: CpuKernelChoice, strict: bool, a: &[T], b: &[T], out: &mut Vec<T>) {
    if !strict {
        cpu::intersect_nondecreasing(a, b, out);
    } else {
        match kernel {
            CpuKernelChoice::Auto => {
                cpu::intersect_auto(a, b, out);
            }
            CpuKernelChoice::Fixed(k) => {
                cpu::intersect(k, a, b, out);
            }
        }
    }
}

fn pair_count<T: SetElem>(kernel: CpuKernelChoice, strict: bool, a: &[T], b: &[T]) -> usize {
    if !strict {
        cpu::intersect_count_nondecreasing(a, b)
    } else {
        match kernel {
            CpuKernelChoice::Auto => cpu::intersect_count_auto(a, b),
            CpuKernelChoice::Fixed(k) => cpu::intersect_count(k, a, b),
        }
    }
}

/// Sorted rows: intersect shortest first into `out`; with a count, only the last step counts.
fn sorted_row<'a, O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'a, O, T>],
    i: usize,
    strict: bool,
    kernel: CpuKernelChoice,
    scratch: &mut Scratch<'a, T>,
    out: Option<&mut Vec<T>>,
) -> usize {
    let rows = &mut scratch.rows;
    rows.clear();
    rows.extend(lists.iter().map(|l| l.row(i)));
    rows.sort_by_key(|r| r.len());
    if strict && matches!(kernel, CpuKernelChoice::Auto) {
        return match out {
            Some(out) => cpu::intersect_kway(rows, out, &mut scratch.tmp),
            None => cpu::intersect_kway_count(rows, &mut scratch.tmp),
        };
    }
    // Pairwise fold, shortest first. After the first step the running result is strictly
    // increasing, so later steps only need the non-strict kernel for non-strict inputs.
    let k = rows.len();
    if k == 2 {
        return match out {
            Some(out) => {
                let before = out.len();
                pair(kernel, strict, rows[0], rows[1], out);
                out.len() - before
            }
            None => pair_count(kernel, strict, rows[0], rows[1]),
        };
    }
    let (cur, next) = (&mut scratch.tmp, &mut scratch.tmp2);
    cur.clear();
    pair(kernel, strict, rows[0], rows[1], cur);
    for (step, r) in rows[2..].iter().enumerate() {
        let last = step + 3 == k;
        let r_strict = strict || cpu::sortedness(r) == Sortedness::Strict;
        if cur.is_empty() {
            break;
        }
        if last && out.is_none() {
            return pair_count(kernel, r_strict, cur, r);
        }
        next.clear();
        pair(kernel, r_strict, cur, r, next);
        std::mem::swap(cur, next);
    }
    match out {
        Some(out) => {
            out.extend_from_slice(cur);
            cur.len()
        }
        None => cur.len(),
    }
}

/// One step of the built-in's semantics: probe the longer side (left on ties) against the
/// shorter, keep first occurrences.
fn general_pair<T: SetElem>(
    l: &[Option<T>],
    r: &[Option<T>],
    out: &mut Vec<Option<T>>,
    lookup: &mut FastSet<Option<T>>,
    seen: &mut FastSet<Option<T>>,
) {
    let (small, probe) = if l.len() < r.len() { (l, r) } else { (r, l) };
    lookup.clear();
    lookup.extend(small.iter().copied());
    seen.clear();
    for x in probe {
        if lookup.contains(x) && seen.insert(*x) {
            out.push(*x);
        }
    }
}

/// General rows: the exact left fold; the result is left in `scratch.opt_out`.
fn general_row<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    i: usize,
    scratch: &mut Scratch<'_, T>,
) {
    let Scratch {
        opt_a,
        opt_b,
        opt_out,
        lookup,
        seen,
        ..
    } = scratch;
    opt_a.clear();
    opt_a.extend(lists[0].row_options(i));
    for l in &lists[1..] {
        opt_b.clear();
        opt_b.extend(l.row_options(i));
        opt_out.clear();
        general_pair(opt_a, opt_b, opt_out, lookup, seen);
        std::mem::swap(opt_a, opt_out);
        if opt_a.is_empty() {
            break;
        }
    }
    std::mem::swap(opt_a, opt_out);
}

fn row_is_null<O: OffsetSizeTrait, T: SetElem>(lists: &[IntLists<'_, O, T>], i: usize) -> bool {
    lists.iter().any(|l| l.is_null(i))
}

fn values_chunk<'a, O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'a, O, T>],
    verdicts: &Verdicts,
    rows: Range<usize>,
    kernel: CpuKernelChoice,
) -> (ValuesOut<T>, Vec<Vec<Verdict>>) {
    let mut scratch: Scratch<'a, T> = Scratch::new();
    let mut rec = verdicts.recorder(rows.len());
    let mut out = ValuesOut {
        values: Vec::new(),
        lengths: Vec::with_capacity(rows.len()),
        validity: None,
        shared: None,
    };
    for i in rows {
        let before = out.values.len();
        let fast = match fast_pair(lists, verdicts, kernel, i) {
            Some(FastPair::Known(a, b)) => {
                cpu::intersect_auto(a, b, &mut out.values);
                true
            }
            Some(FastPair::Unchecked(a, b)) => {
                let done = cpu::intersect_auto_checked(a, b, &mut out.values).is_some();
                if done {
                    verdicts.record_strict(&mut rec);
                }
                done
            }
            None => false,
        };
        if !fast {
            verdicts.record_row(lists, &mut rec, i);
            if !row_is_null(lists, i) {
                match classify(lists, verdicts, &rec, i) {
                    RowKind::Empty => {}
                    RowKind::Sorted { strict } => {
                        sorted_row(
                            lists,
                            i,
                            strict,
                            kernel,
                            &mut scratch,
                            Some(&mut out.values),
                        );
                    }
                    RowKind::General => {
                        general_row(lists, i, &mut scratch);
                        let res = &scratch.opt_out;
                        if out.validity.is_none() && res.iter().any(|v| v.is_none()) {
                            out.validity = Some(vec![true; before]);
                        }
                        out.values.extend(res.iter().map(|v| v.unwrap_or_default()));
                        if let Some(valid) = &mut out.validity {
                            valid.extend(res.iter().map(|v| v.is_some()));
                        }
                    }
                }
            }
        }
        let after = out.values.len();
        if let Some(valid) = &mut out.validity {
            valid.resize(after, true);
        }
        out.lengths.push(after - before);
    }
    (out, rec)
}

fn count_chunk<'a, O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'a, O, T>],
    verdicts: &Verdicts,
    rows: Range<usize>,
    kernel: CpuKernelChoice,
) -> (Vec<u64>, Vec<Vec<Verdict>>) {
    let mut scratch: Scratch<'a, T> = Scratch::new();
    let mut rec = verdicts.recorder(rows.len());
    let counts = rows
        .map(|i| {
            match fast_pair(lists, verdicts, kernel, i) {
                Some(FastPair::Known(a, b)) => return cpu::intersect_count_auto(a, b) as u64,
                Some(FastPair::Unchecked(a, b)) => {
                    if let Some(n) = cpu::intersect_count_auto_checked(a, b) {
                        verdicts.record_strict(&mut rec);
                        return n as u64;
                    }
                }
                None => {}
            }
            verdicts.record_row(lists, &mut rec, i);
            if row_is_null(lists, i) {
                return 0;
            }
            (match classify(lists, verdicts, &rec, i) {
                RowKind::Empty => 0,
                RowKind::Sorted { strict } => {
                    sorted_row(lists, i, strict, kernel, &mut scratch, None)
                }
                RowKind::General => {
                    general_row(lists, i, &mut scratch);
                    scratch.opt_out.len()
                }
            }) as u64
        })
        .collect();
    (counts, rec)
}

/// Counts a CPU batch into the call's plan metrics when dropped.
struct CpuBatch<'a> {
    plan: Option<&'a BackendPlan>,
    rows: usize,
    start: std::time::Instant,
}

impl<'a> CpuBatch<'a> {
    fn start(opts: &'a EngineOptions, rows: usize) -> Self {
        Self {
            plan: opts.plan.as_deref(),
            rows,
            start: std::time::Instant::now(),
        }
    }
}

impl Drop for CpuBatch<'_> {
    fn drop(&mut self) {
        if let Some(p) = self.plan {
            let m = &p.metrics;
            BackendMetrics::add(&m.rows, self.rows as u64);
            BackendMetrics::add(&m.cpu_batches, 1);
            BackendMetrics::add(&m.cpu_ns, self.start.elapsed().as_nanos() as u64);
        }
    }
}

/// Row ranges of about equal value counts, one per task, or the whole batch when it is too
/// small to be worth splitting.
fn chunks<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
) -> Vec<Range<usize>> {
    let n = lists[0].len();
    let total: usize = lists.iter().map(|l| l.total_values()).sum();
    let threads = rayon::current_num_threads();
    if opts.parallel_min_values == 0 || total < opts.parallel_min_values || threads < 2 || n < 2 {
        return std::iter::once(0..n).collect();
    }
    // Several tasks per thread so uneven rows still balance.
    let tasks = (threads * 4).min(n);
    let per_task = total.div_ceil(tasks).max(1);
    let mut ranges = Vec::with_capacity(tasks);
    let mut start = 0;
    let mut acc = 0;
    for i in 0..n {
        acc += lists.iter().map(|l| l.range(i).len()).sum::<usize>();
        if acc >= per_task {
            ranges.push(start..i + 1);
            start = i + 1;
            acc = 0;
        }
    }
    if start < n {
        ranges.push(start..n);
    }
    ranges
}

/// Intersect row by row; the result values of every row, in row order.
pub fn intersect_values<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
) -> ValuesOut<T> {
    if let Some(out) = super::gpu::try_values(lists, opts) {
        return out;
    }
    let _cpu = CpuBatch::start(opts, lists[0].len());
    let verdicts = Verdicts::look_up(lists);
    let ranges = chunks(lists, opts);
    if ranges.len() == 1 {
        let (out, rec) = values_chunk(lists, &verdicts, ranges[0].clone(), opts.kernel);
        verdicts.store(lists, vec![rec]);
        return out;
    }
    let (parts, recs): (Vec<ValuesOut<T>>, Vec<_>) = ranges
        .into_par_iter()
        .map(|r| values_chunk(lists, &verdicts, r, opts.kernel))
        .unzip();
    verdicts.store(lists, recs);
    let total: usize = parts.iter().map(|p| p.values.len()).sum();
    let any_nulls = parts.iter().any(|p| p.validity.is_some());
    let mut out = ValuesOut {
        values: Vec::with_capacity(total),
        lengths: Vec::with_capacity(lists[0].len()),
        validity: any_nulls.then(|| Vec::with_capacity(total)),
        shared: None,
    };
    for p in parts {
        if let Some(valid) = &mut out.validity {
            match &p.validity {
                Some(v) => valid.extend_from_slice(v),
                None => valid.resize(valid.len() + p.values.len(), true),
            }
        }
        out.values.extend_from_slice(&p.values);
        out.lengths.extend_from_slice(&p.lengths);
    }
    out
}

/// Cardinality of every row's intersection (0 for NULL rows; the caller sets validity).
pub fn intersect_counts<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
) -> Vec<u64> {
    if let Some(out) = super::gpu::try_counts(lists, opts) {
        return out;
    }
    let _cpu = CpuBatch::start(opts, lists[0].len());
    let verdicts = Verdicts::look_up(lists);
    let ranges = chunks(lists, opts);
    if ranges.len() == 1 {
        let (out, rec) = count_chunk(lists, &verdicts, ranges[0].clone(), opts.kernel);
        verdicts.store(lists, vec![rec]);
        return out;
    }
    let (parts, recs): (Vec<Vec<u64>>, Vec<_>) = ranges
        .into_par_iter()
        .map(|r| count_chunk(lists, &verdicts, r, opts.kernel))
        .unzip();
    verdicts.store(lists, recs);
    parts.concat()
}

/// The CPU's exact result of single rows, one [`ValuesOut`] per row of `rows` (the GPU
/// backend redoes the rows its kernels flag with this).
pub(crate) fn cpu_values_rows<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    rows: &[usize],
    opts: &EngineOptions,
) -> Vec<ValuesOut<T>> {
    let verdicts = Verdicts::unchecked(lists.len());
    rows.iter()
        .map(|&i| values_chunk(lists, &verdicts, i..i + 1, opts.kernel).0)
        .collect()
}

/// The CPU's exact count of single rows (see [`cpu_values_rows`]).
pub(crate) fn cpu_counts_rows<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    rows: &[usize],
    opts: &EngineOptions,
) -> Vec<u64> {
    let verdicts = Verdicts::unchecked(lists.len());
    rows.iter()
        .map(|&i| count_chunk(lists, &verdicts, i..i + 1, opts.kernel).0[0])
        .collect()
}

#[cfg(test)]
mod tests {
    use datafusion::arrow::array::{Int32Array, ListArray};
    use datafusion::arrow::buffer::OffsetBuffer;
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type};

    use super::*;

    /// `rows` rows of 400 values each: strictly increasing (class 0), sorted with duplicates
    /// (1) and unsorted (2), the class `r % 3` for an even `shift` and `(r / 3) % 3` for an
    /// odd one (so two such columns pair every class with every class); every 7th row empty. Columns
    /// whose shifts differ by a multiple of 3 share most values.
    fn column(rows: usize, shift: i32) -> ListArray {
        let (mut values, mut lengths) = (Vec::new(), Vec::new());
        for r in 0..rows {
            let base: Vec<i32> = if r % 7 == 0 {
                Vec::new()
            } else {
                (0..400).map(|k| k * 3 + shift + r as i32).collect()
            };
            lengths.push(base.len());
            let class = if shift % 2 == 0 { r % 3 } else { (r / 3) % 3 };
            match class {
                0 => values.extend(base),
                1 => values.extend(base.iter().map(|v| v / 4)),
                _ => values.extend(base.iter().rev()),
            }
        }
        ListArray::new(
            Arc::new(Field::new_list_field(DataType::Int32, true)),
            OffsetBuffer::from_lengths(lengths),
            Arc::new(Int32Array::from(values)),
            None,
        )
    }

    /// A cache miss checks rows as the chunks read them and stores what it saw: the stored
    /// verdicts are the checked ones (every row, in order, also across parallel chunks), the
    /// next call hits, and the results of the recording call, the hitting call and a call
    /// that checks everything itself are identical.
    #[test]
    fn verdicts_recorded_during_the_kernel_pass_are_stored_and_reused() {
        for parallel_min_values in [0, 1000] {
            let (a, b) = (column(500, 0), column(500, 3));
            let la = IntLists::<i32, i32>::new::<Int32Type>(&a);
            let lb = IntLists::<i32, i32>::new::<Int32Type>(&b);
            let lists = [la, lb];
            let opts = EngineOptions {
                kernel: CpuKernelChoice::Auto,
                parallel_min_values,
                backend: BackendChoice::Cpu,
                plan: None,
                gpu_columns: None,
            };
            let reference = values_chunk(
                &lists,
                &Verdicts::unchecked(2),
                0..500,
                CpuKernelChoice::Auto,
            )
            .0;
            let first = intersect_values(&lists, &opts);
            for l in &lists {
                let Lookup::Hit(v) = lookup_verdicts(l) else {
                    panic!("the first call must store the verdicts");
                };
                assert_eq!(v.len(), 500);
                for (i, got) in v.iter().enumerate() {
                    assert_eq!(*got, verdict_of(l, i), "row {i}");
                }
            }
            let again = intersect_values(&lists, &opts);
            let counts = intersect_counts(&lists, &opts);
            for out in [&first, &again] {
                assert_eq!(out.values, reference.values);
                assert_eq!(out.lengths, reference.lengths);
            }
            let want: Vec<u64> = reference.lengths.iter().map(|&n| n as u64).collect();
            assert_eq!(counts, want);
        }
    }
}
