//! The GPU backend against the CPU backend: random batches through the SQL functions with
//! `sets.backend = 'gpu'` and `'cpu'`, results compared array for array, plus the engine
//! called directly (flags, chunking) and, `#[ignore]`d, the benchmark.
//!
//! Without a usable GPU every test prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`
//! (the device script sets it), which makes the absence a failure.

mod common;

use common::gpu_or_skip;
use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, GenericListArray, Int64Array, OffsetSizeTrait,
};
use datafusion::arrow::buffer::{NullBuffer, OffsetBuffer};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::config::ConfigOptions;
use datafusion::datasource::MemTable;
use datafusion::logical_expr::{ColumnarValue, ScalarFunctionArgs, ScalarUDF};
use datafusion_sets::BackendChoice;
use datafusion_sets::SetsConfig;
use datafusion_sets::backend::gpu::{self, HostList, HostOffsets, Mode};
use datafusion_sets::tuning;
use datafusion_sets::udf::list_intersect_count_udf;
use datafusion_sets::udf::list_intersect_udf;

/// splitmix64: fast, deterministic, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next() % n }
    }
}

/// One row: `None` = NULL list; elements `None` = NULL element.
type Row = Option<Vec<Option<i64>>>;

/// A strictly increasing list of `len` values from `start`, gaps 1..=2*gap.
fn sorted_list(rng: &mut Rng, start: i64, len: usize, gap: u64) -> Vec<Option<i64>> {
    let mut v = Vec::with_capacity(len);
    let mut x = start;
    for _ in 0..len {
        x += 1 + rng.below(2 * gap.max(1)) as i64;
        v.push(Some(x));
    }
    v
}

/// A random row of a batch: mostly sorted posting lists sharing a universe (so that
/// intersections are not empty), with empty, single-element, unsorted, duplicated, NULL
/// lists and NULL elements mixed in. `signed` puts values below zero.
fn random_row(rng: &mut Rng, signed: bool, big: bool) -> Row {
    let start = if signed {
        -(rng.below(3000) as i64)
    } else {
        rng.below(100) as i64
    };
    let kind = rng.below(100);
    let row = match kind {
        0..=5 => return None,
        6..=13 => vec![],
        14..=21 => vec![Some(start + rng.below(20) as i64)],
        22..=27 => {
            // unsorted
            let len = 1 + rng.below(60) as usize;
            let mut v = sorted_list(rng, start, len, 2);
            for i in (1..v.len()).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                v.swap(i, j);
            }
            v
        }
        28..=32 => {
            // sorted with duplicates
            let len = 1 + rng.below(60) as usize;
            let mut v = sorted_list(rng, start, len, 1);
            let dups: Vec<_> = v.iter().step_by(3).copied().collect();
            v.extend(dups);
            v.sort();
            v
        }
        33..=36 => {
            // NULL elements
            let len = 1 + rng.below(30) as usize;
            let mut v = sorted_list(rng, start, len, 2);
            let i = rng.below(v.len() as u64) as usize;
            v[i] = None;
            v
        }
        37..=44 if big => {
            let len = 2000 + rng.below(30_000) as usize;
            sorted_list(rng, start, len, 1)
        }
        _ => {
            let len = [3u64, 30, 300, 3000][rng.below(4) as usize];
            let (len, gap) = (1 + rng.below(len) as usize, 1 + rng.below(3));
            sorted_list(rng, start, len, gap)
        }
    };
    Some(row)
}

/// A list array of `rows` with elements of type `element`; with `pad`, junk values around
/// the used range and a sliced child (the list's first offset is not 0).
fn build<O: OffsetSizeTrait>(rows: &[Row], element: &DataType, pad: usize) -> ArrayRef {
    let mut values: Vec<Option<i64>> = vec![Some(7); pad];
    let mut offsets = vec![O::usize_as(pad)];
    for r in rows {
        if let Some(v) = r {
            values.extend(v.iter().copied());
        }
        offsets.push(O::usize_as(values.len()));
    }
    values.extend(std::iter::repeat_n(Some(3), pad));
    let child: ArrayRef = Arc::new(Int64Array::from(values));
    let child = cast(&child, element).expect("cast the child");
    let nulls = NullBuffer::from(rows.iter().map(|r| r.is_some()).collect::<Vec<_>>());
    let field = Arc::new(Field::new_list_field(element.clone(), true));
    let list =
        GenericListArray::<O>::new(field, OffsetBuffer::new(offsets.into()), child, Some(nulls));
    Arc::new(list)
}

fn config(backend: BackendChoice) -> Arc<ConfigOptions> {
    config_with(backend, true)
}

/// Options with `sets.backend = backend` and `sets.gpu_resident_columns = resident`.
fn config_with(backend: BackendChoice, resident: bool) -> Arc<ConfigOptions> {
    let mut sets = SetsConfig::default();
    sets.backend = backend;
    sets.gpu_resident_columns = resident;
    let mut options = ConfigOptions::new();
    options.extensions.insert(sets);
    Arc::new(options)
}

fn invoke(udf: &ScalarUDF, args: &[ArrayRef], backend: BackendChoice) -> ArrayRef {
    invoke_with(udf, args, config(backend))
}

fn invoke_with(udf: &ScalarUDF, args: &[ArrayRef], config_options: Arc<ConfigOptions>) -> ArrayRef {
    let fields: Vec<_> = args
        .iter()
        .map(|a| Arc::new(Field::new("a", a.data_type().clone(), true)))
        .collect();
    let ret = udf
        .return_field_from_args(datafusion::logical_expr::ReturnFieldArgs {
            arg_fields: &fields,
            scalar_arguments: &vec![None; args.len()],
        })
        .expect("return type");
    let out = udf
        .invoke_with_args(ScalarFunctionArgs {
            args: args
                .iter()
                .map(|a| ColumnarValue::Array(Arc::clone(a)))
                .collect(),
            arg_fields: fields,
            number_rows: args[0].len(),
            return_field: ret,
            config_options,
        })
        .expect("invoke");
    match out {
        ColumnarValue::Array(a) => a,
        ColumnarValue::Scalar(_) => panic!("array arguments gave a scalar"),
    }
}

/// `list_intersect` and `list_intersect_count` on the GPU equal the CPU's, and the GPU ran.
fn check_same(args: &[ArrayRef], what: &str) {
    let before = gpu::batches_run();
    let cpu = invoke(&list_intersect_udf(), args, BackendChoice::Cpu);
    let gpu_out = invoke(&list_intersect_udf(), args, BackendChoice::Gpu);
    assert_eq!(
        cpu.as_ref(),
        gpu_out.as_ref(),
        "list_intersect differs: {what}"
    );
    let cpu_c = invoke(&list_intersect_count_udf(), args, BackendChoice::Cpu);
    let gpu_c = invoke(&list_intersect_count_udf(), args, BackendChoice::Gpu);
    assert_eq!(
        cpu_c.as_ref(),
        gpu_c.as_ref(),
        "list_intersect_count differs: {what}"
    );
    if ![
        DataType::Int8,
        DataType::Int16,
        DataType::UInt8,
        DataType::UInt16,
    ]
    .iter()
    .any(|t| what.contains(&format!("{t}/")))
    {
        assert!(
            gpu::batches_run() >= before + 2,
            "the GPU did not run both calls: {what}"
        );
    }
}

const TYPES: [DataType; 5] = [
    DataType::Int32,
    DataType::UInt32,
    DataType::Int64,
    DataType::UInt64,
    DataType::Int16,
];

#[test]
fn gpu_equals_cpu_on_random_batches() {
    if !gpu_or_skip("gpu_equals_cpu_on_random_batches") {
        return;
    }
    let mut cases = 0;
    for seed in 0..60u64 {
        let mut rng = Rng(seed * 7919 + 1);
        let element = &TYPES[(seed % TYPES.len() as u64) as usize];
        let signed = matches!(element, DataType::Int32 | DataType::Int64 | DataType::Int16);
        let k = 2 + (seed % 3) as usize;
        let n = [1usize, 7, 100, 1000, 5000][(seed / 3 % 5) as usize];
        let pad = (seed % 2) as usize * 5;
        let large = seed % 4 == 3;
        let big = seed % 5 == 0;
        let lists: Vec<Vec<Row>> = (0..k)
            .map(|_| (0..n).map(|_| random_row(&mut rng, signed, big)).collect())
            .collect();
        let args: Vec<ArrayRef> = lists
            .iter()
            .map(|rows| {
                if large {
                    build::<i64>(rows, element, pad)
                } else {
                    build::<i32>(rows, element, pad)
                }
            })
            .collect();
        let what = format!("seed {seed}: {element}/ k={k} n={n} pad={pad} large={large}");
        check_same(&args, &what);
        // A slice of the batch (list arrays with an offset).
        if n > 4 {
            let sliced: Vec<ArrayRef> = args.iter().map(|a| a.slice(1, n - 3)).collect();
            check_same(&sliced, &format!("{what} sliced"));
        }
        cases += 1;
    }
    eprintln!("gpu_equals_cpu_on_random_batches: {cases} batches equal");
}

#[test]
fn gpu_equals_cpu_on_ten_million_element_rows() {
    if !gpu_or_skip("gpu_equals_cpu_on_ten_million_element_rows") {
        return;
    }
    let mut rng = Rng(42);
    for element in [DataType::UInt32, DataType::Int64] {
        let mut a: Vec<Row> = Vec::new();
        let mut b: Vec<Row> = Vec::new();
        a.push(Some(sorted_list(&mut rng, -5, 10_000_000, 2)));
        b.push(Some(sorted_list(&mut rng, 0, 10_000_000, 2)));
        for _ in 0..50 {
            a.push(random_row(&mut rng, false, false));
            b.push(random_row(&mut rng, false, false));
        }
        // one long row against a short one, and a long unsorted one (flagged, redone on the CPU)
        a.push(Some(sorted_list(&mut rng, 0, 3_000_000, 1)));
        b.push(Some(sorted_list(&mut rng, 0, 17, 100_000)));
        let mut u = sorted_list(&mut rng, 0, 2_000_000, 1);
        u.swap(1_000_000, 1_500_000);
        a.push(Some(u));
        b.push(Some(sorted_list(&mut rng, 0, 2_000_000, 1)));
        let args = vec![build::<i32>(&a, &element, 0), build::<i32>(&b, &element, 0)];
        check_same(&args, &format!("{element}/ 1e7-element rows"));
    }
}

#[test]
fn engine_flags_unsorted_and_duplicated_rows() {
    if !gpu_or_skip("engine_flags_unsorted_and_duplicated_rows") {
        return;
    }
    let offsets = [0i32, 3, 6, 9, 9];
    let a: Vec<u32> = vec![1, 2, 3, 3, 2, 1, 5, 5, 6];
    let b_off = [0i32, 3, 5, 8, 10];
    let b: Vec<u32> = vec![2, 3, 4, 1, 3, 5, 6, 7, 1, 2];
    let lists = [
        HostList {
            offsets: HostOffsets::I32(&offsets),
            values: &a,
            column: None,
        },
        HostList {
            offsets: HostOffsets::I32(&b_off),
            values: &b,
            column: None,
        },
    ];
    let out = gpu::intersect(&lists, None, Mode::Values, None, false).expect("GPU batch");
    assert_eq!(out.flagged, vec![false, true, true, false]);
    assert_eq!(&out.values[..2], &[2, 3]);
    assert_eq!(out.offsets[0..2], [0, 2]);
    assert_eq!(out.offsets[4] - out.offsets[3], 0);
}

/// A list column and its parts as the engine takes them.
struct Column {
    list: GenericListArray<i32>,
}

impl Column {
    fn new(rng: &mut Rng, rows: usize) -> Self {
        let cols = log_uniform_columns(rng, rows, 10.0, 400.0, 4);
        let (offs, vals) = &cols[0];
        Self::from_parts(offs, vals)
    }

    fn sliced(&self, from: usize, rows: usize) -> Self {
        Column {
            list: self.list.slice(from, rows),
        }
    }

    /// The engine's view; `keep`: with the Arrow buffers, so the column may stay resident.
    fn host(&self, keep: bool) -> HostList<'_, u32> {
        let child = self.list.values().as_primitive::<UInt32Type>();
        HostList {
            offsets: HostOffsets::I32(self.list.value_offsets()),
            values: child.values().as_ref(),
            column: keep.then(|| (child.values().inner(), self.list.offsets().inner().inner())),
        }
    }

    /// Bytes a resident copy takes (values padded to 256, then offsets).
    fn resident_bytes(&self) -> usize {
        let child = self.list.values().as_primitive::<UInt32Type>();
        child.values().inner().len().div_ceil(256) * 256 + self.list.offsets().inner().inner().len()
    }
}

/// `intersect` over `cols` with residency (`budget`) equals the staged call, in both modes;
/// the values call's timings.
fn resident_call(cols: &[&Column], budget: usize, what: &str) -> gpu::Timings {
    let staged: Vec<_> = cols.iter().map(|c| c.host(false)).collect();
    let kept: Vec<_> = cols.iter().map(|c| c.host(true)).collect();
    let reference = gpu::intersect(&staged, None, Mode::Values, None, false).expect("staged");
    // The values handed over as an Arrow buffer (page-locked memory lent to it when the batch
    // is one launch group), as the SQL functions take them.
    let out = gpu::intersect(&kept, None, Mode::Values, Some(budget), true).expect("resident");
    if out.timings.chunks == 1 {
        assert!(
            out.values.is_empty() && out.shared_values.is_some(),
            "{what}"
        );
    }
    assert_same_rows(
        &out.offsets,
        out.values_slice(),
        &out.flagged,
        &reference,
        what,
    );
    let counts = gpu::intersect(&kept, None, Mode::Counts, Some(budget), false).expect("counts");
    assert_same_rows(&counts.offsets, &[], &counts.flagged, &reference, what);
    out.timings
}

/// The same flags as `reference`, and the same results in every row not flagged (a flagged
/// row's device result is meaningless: the caller recomputes it on the CPU, and how many
/// matches a row with duplicates gets depends on whether B was merged or searched). Values
/// are compared when `values` is not empty or the reference has none.
fn assert_same_rows(
    offsets: &[u64],
    values: &[u32],
    flagged: &[bool],
    reference: &gpu::GpuOutput<u32>,
    what: &str,
) {
    assert_eq!(flagged, &reference.flagged[..], "flags: {what}");
    assert_eq!(offsets.len(), reference.offsets.len(), "rows: {what}");
    let check_values = !values.is_empty() || reference.values.is_empty();
    let mut compared = 0;
    for r in 0..flagged.len() {
        if flagged[r] {
            continue;
        }
        let (o0, o1) = (offsets[r] as usize, offsets[r + 1] as usize);
        let (e0, e1) = (
            reference.offsets[r] as usize,
            reference.offsets[r + 1] as usize,
        );
        assert_eq!(o1 - o0, e1 - e0, "row {r} length: {what}");
        if check_values {
            assert_eq!(values[o0..o1], reference.values[e0..e1], "row {r}: {what}");
        }
        compared += 1;
    }
    assert!(
        compared > 0 || flagged.is_empty(),
        "no row compared: {what}"
    );
}

#[test]
fn engine_keeps_list_columns_on_the_device_between_calls() {
    if !gpu_or_skip("engine_keeps_list_columns_on_the_device_between_calls") {
        return;
    }
    let mut rng = Rng(11);
    let (a, b, c) = (
        Column::new(&mut rng, 40_000),
        Column::new(&mut rng, 40_000),
        Column::new(&mut rng, 40_000),
    );
    let t = resident_call(&[&a, &b], 0, "first call");
    // The values call uploads both; the counts call after it already reuses them.
    assert_eq!((t.columns_uploaded, t.columns_reused), (2, 0), "{t:?}");
    if std::env::var("DFSETS_GPU_LAUNCH_BYTES").is_ok() {
        // scripts/gpu/run.sh's second pass: launch groups after the first read the
        // resident copies from their own first offset on.
        assert!(t.chunks > 1, "{t:?}");
    }
    let uploaded = t.h2d_bytes;
    let t = resident_call(&[&a, &b], 0, "second call");
    assert_eq!((t.columns_uploaded, t.columns_reused), (0, 2), "{t:?}");
    assert!(
        t.h2d_bytes * 100 < uploaded,
        "{} vs {uploaded}",
        t.h2d_bytes
    );
    // One column twice in a call, k = 3.
    let t = resident_call(&[&a, &a, &b], 0, "a, a, b");
    assert_eq!((t.columns_uploaded, t.columns_reused), (0, 3), "{t:?}");
    // Sliced arrays: equal results whether or not they become resident.
    resident_call(&[&a.sliced(3, 30_000), &b.sliced(3, 30_000)], 0, "sliced");
    resident_call(&[&a.sliced(39_990, 10), &c.sliced(0, 10)], 0, "ten rows");
    // A budget for about one column: what is resident stays, the rest is staged.
    let one = a.resident_bytes().max(c.resident_bytes()) * 3 / 2;
    let t = resident_call(&[&b, &c], one, "small budget, b resident");
    assert_eq!((t.columns_uploaded, t.columns_reused), (0, 1), "{t:?}");
    // c evicts the columns this call does not use, then a does not fit next to it.
    let t = resident_call(&[&c, &a], one, "small budget, c admitted");
    assert_eq!((t.columns_uploaded, t.columns_reused), (1, 0), "{t:?}");
    let t = resident_call(&[&c, &b], one, "small budget, b evicted");
    assert_eq!((t.columns_uploaded, t.columns_reused), (0, 1), "{t:?}");
    // A budget below one column: everything staged, results equal.
    let t = resident_call(&[&a, &b], 1 << 16, "tiny budget");
    assert_eq!((t.columns_uploaded, t.columns_reused), (0, 0), "{t:?}");
    // LargeList<Int64> (64-bit elements and offsets) through the SQL function, twice.
    let wide: Vec<ArrayRef> = [&a, &b]
        .iter()
        .map(|c| {
            let t = DataType::LargeList(Arc::new(Field::new_list_field(DataType::Int64, true)));
            cast(&c.list, &t).expect("cast")
        })
        .collect();
    check_same(&wide, "LargeList<Int64>, first");
    check_same(&wide, "LargeList<Int64>, again");
}

/// Rows for the known-order test: log-uniform lengths in `min..max`, strictly increasing
/// over a shared universe, except about one in `broken` rows, which gets one descent (at its
/// start, its end or inside) or one duplicated element.
fn order_rows(rng: &mut Rng, rows: usize, min: f64, max: f64, broken: u64) -> Vec<Vec<u32>> {
    (0..rows)
        .map(|_| {
            let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
            let len = (min * (max / min).powf(u)) as usize;
            let mut x = rng.below(8) as u32;
            let mut v: Vec<u32> = (0..len)
                .map(|_| {
                    x += 1 + rng.below(3) as u32;
                    x
                })
                .collect();
            if len >= 2 && rng.below(broken) == 0 {
                let i = match rng.below(3) {
                    0 => 0,
                    1 => len - 2,
                    _ => rng.below(len as u64 - 1) as usize,
                };
                if rng.below(2) == 0 {
                    v.swap(i, i + 1);
                } else {
                    v[i + 1] = v[i];
                }
            }
            v
        })
        .collect()
}

impl Column {
    fn from_rows(rows: &[Vec<u32>]) -> Self {
        let mut offs = vec![0i32];
        let mut vals = Vec::new();
        for r in rows {
            vals.extend_from_slice(r);
            offs.push(vals.len() as i32);
        }
        Self::from_parts(&offs, &vals)
    }

    fn from_parts(offs: &[i32], vals: &[u32]) -> Self {
        let list = u32_lists(offs, vals)
            .as_any()
            .downcast_ref::<GenericListArray<i32>>()
            .expect("list")
            .clone();
        Column { list }
    }
}

/// The warp kernel's call after a call that ran tiles: the device buffers of per-tile counts
/// and slots are reused from call to call, and the step must read only what it wrote (a call
/// with more tiles than the warp call has pieces came first: its counts would otherwise be
/// gathered as this call's results, or send the gather out of bounds).
#[test]
fn warp_call_after_a_tiled_one() {
    if !gpu_or_skip("warp_call_after_a_tiled_one") {
        return;
    }
    let mut rng = Rng(31);
    let equal = [
        Column::from_rows(&order_rows(&mut rng, 20_000, 100.0, 2_000.0, u64::MAX)),
        Column::from_rows(&order_rows(&mut rng, 20_000, 100.0, 2_000.0, u64::MAX)),
    ];
    let short = Column::from_rows(&order_rows(&mut rng, 20_000, 1.0, 8.0, u64::MAX));
    let long = Column::from_rows(&order_rows(&mut rng, 20_000, 1_000.0, 8_000.0, u64::MAX));
    let before = tuning::known_order();
    for _ in 0..2 {
        tuning::set_known_order(tuning::KnownOrder::Search(4));
        resident_call(&[&equal[0], &equal[1]], 0, "tiles");
        tuning::set_known_order(tuning::KnownOrder::Warp);
        resident_call(&[&short, &long], 0, "warp after tiles");
    }
    tuning::set_known_order(before);
}

/// `wmerge`'s steps never clear their look-back states: each launch tags its words with an
/// epoch. When the 24-bit epochs run out they start again at 1 and every state buffer is
/// cleared, so that a word written 2^24 epochs earlier cannot pass for the new launch's. Here
/// the wrap comes right after a call of the same shape whose words carry the very epochs the
/// wrapped call takes (1 and 2): uncleared, its inclusive counts would place the second
/// call's rows.
#[test]
fn warp_calls_across_the_epoch_wrap() {
    if !gpu_or_skip("warp_calls_across_the_epoch_wrap") {
        return;
    }
    let mut rng = Rng(41);
    let mut pair = || {
        [
            Column::from_rows(&order_rows(&mut rng, 20_000, 50.0, 2_000.0, u64::MAX)),
            Column::from_rows(&order_rows(&mut rng, 20_000, 50.0, 2_000.0, u64::MAX)),
        ]
    };
    let (first, second) = (pair(), pair());
    let before = tuning::known_order();
    tuning::set_known_order(tuning::KnownOrder::Warp);
    let mut calls = Vec::new();
    for cols in [&first, &second] {
        let staged: Vec<_> = cols.iter().map(|c| c.host(false)).collect();
        let kept: Vec<_> = cols.iter().map(|c| c.host(true)).collect();
        let reference = gpu::intersect(&staged, None, Mode::Values, None, false).expect("staged");
        // Copied to the device (and their row order found) before the epochs are set.
        gpu::intersect(&kept, None, Mode::Values, Some(0), false).expect("upload");
        calls.push((kept, reference));
    }
    for (i, (kept, reference)) in calls.iter().enumerate() {
        // Epochs 1 and 2 for the first call; the second wraps around to them.
        gpu::set_next_epoch(if i == 0 { 1 } else { u32::MAX });
        let out = gpu::intersect(kept, None, Mode::Values, Some(0), false).expect("resident");
        assert_eq!(out.timings.columns_reused, 2);
        assert_same_rows(
            &out.offsets,
            out.values_slice(),
            &out.flagged,
            reference,
            &format!("call {i} at the epoch wrap"),
        );
    }
    tuning::set_known_order(before);
}

/// A `wmerge` call whose kernels (k, element and offset types) were launched before goes out as
/// one launch of the workspace's kernel graph for them, each node's grid and arguments set to
/// the call's own: calls over other columns, row counts, slices and modes (values, then counts:
/// each `resident_call` makes both) give the staged call's results, k = 3 gets a graph of its
/// own, and k = 2 after it finds its graph again. With `DFSETS_GPU_GRAPH=0` no call uses one.
#[test]
fn warp_calls_through_the_kernel_graph() {
    if !gpu_or_skip("warp_calls_through_the_kernel_graph") {
        return;
    }
    let graphs = std::env::var("DFSETS_GPU_GRAPH").map_or(true, |v| v.trim() != "0");
    let mut rng = Rng(53);
    let a = Column::from_rows(&order_rows(&mut rng, 20_000, 50.0, 2_000.0, u64::MAX));
    let b = Column::from_rows(&order_rows(&mut rng, 20_000, 1.0, 300.0, u64::MAX));
    // k = 3 over columns of their own (a slice of less than half a column is kept as its
    // values alone, its row order unknown: no `wmerge`).
    let c = Column::from_rows(&order_rows(&mut rng, 7_000, 10.0, 900.0, u64::MAX));
    let d = Column::from_rows(&order_rows(&mut rng, 7_000, 50.0, 2_000.0, u64::MAX));
    let e = Column::from_rows(&order_rows(&mut rng, 7_000, 1.0, 300.0, u64::MAX));
    let before = tuning::known_order();
    tuning::set_known_order(tuning::KnownOrder::Warp);
    // Copied to the device (and their row order found) first, so that every call below runs
    // `wmerge`.
    for col in [&a, &b, &c, &d, &e] {
        let kept = [col.host(true), col.host(true)];
        gpu::intersect(&kept, None, Mode::Values, Some(0), false).expect("upload");
    }
    let (a_s, b_s) = (a.sliced(5, 12_000), b.sliced(3_000, 12_000));
    let calls: [(&[&Column], &str); 8] = [
        (&[&a, &b], "a, b"),
        (&[&b, &a], "b, a"),
        (&[&a_s, &b_s], "sliced"),
        (&[&a, &a], "a, a"),
        (&[&d, &e, &c], "k = 3"),
        (&[&c, &e, &d], "k = 3 again"),
        (&[&b, &a], "k = 2 after k = 3"),
        (&[&a, &b], "k = 2 again"),
    ];
    let mut ks_met = Vec::new();
    let mut through_graph = 0;
    for (cols, what) in calls {
        let t = resident_call(cols, 0, what);
        println!(
            "{what}: {} of {} launch groups through a graph (graphs off: {:?})",
            t.graph_launches,
            t.chunks,
            gpu::kernel_graphs_off()
        );
        assert_eq!(gpu::kernel_graphs_off(), None, "{what}");
        // A k met in this loop before has been launched at least twice (values and counts):
        // its graph is built. (The first call of each k may or may not find one, after the
        // other tests of this process.)
        if ks_met.contains(&cols.len()) {
            let expect = if graphs { t.chunks } else { 0 };
            assert_eq!(t.graph_launches, expect, "graph launches: {what}");
        }
        through_graph += t.graph_launches;
        ks_met.push(cols.len());
    }
    assert_eq!(through_graph > 0, graphs);
    tuning::set_known_order(before);
}

/// Resident columns carry the order of their rows, found on the device when copied there:
/// rows known increasing skip the order check, and short rows against long known-increasing
/// ones search the long row in device memory. Every use of it (ignored, check only, searching
/// at ratios 1 to 16, the warp kernel) gives the staged call's values, counts and flags, with
/// rows that break
/// the order at their first, last or an inner pair, duplicates, skew both ways and k = 3.
#[test]
fn engine_uses_known_row_order() {
    if !gpu_or_skip("engine_uses_known_row_order") {
        return;
    }
    let mut rng = Rng(23);
    let short = Column::from_rows(&order_rows(&mut rng, 30_000, 1.0, 40.0, 8));
    let long = Column::from_rows(&order_rows(&mut rng, 30_000, 1.0, 4000.0, 8));
    let mixed = Column::from_rows(&order_rows(&mut rng, 30_000, 1.0, 400.0, 50));
    let before = tuning::known_order();
    for mode in [
        tuning::KnownOrder::Ignore,
        tuning::KnownOrder::CheckOnly,
        tuning::KnownOrder::Search(1),
        tuning::KnownOrder::Search(4),
        tuning::KnownOrder::Search(16),
        tuning::KnownOrder::Warp,
    ] {
        tuning::set_known_order(mode);
        let what = format!("{mode:?}");
        resident_call(&[&short, &long], 0, &format!("short, long: {what}"));
        resident_call(&[&long, &short], 0, &format!("long, short: {what}"));
        resident_call(&[&mixed, &long], 0, &format!("mixed, long: {what}"));
        resident_call(&[&short, &long, &mixed], 0, &format!("k = 3: {what}"));
        resident_call(
            &[&short.sliced(7, 20_000), &long.sliced(9_000, 20_000)],
            0,
            &format!("sliced: {what}"),
        );
    }
    tuning::set_known_order(before);
    // Signed and 64-bit elements (the other order kernels) through the SQL function.
    for t in [DataType::Int32, DataType::Int64, DataType::UInt64] {
        let args: Vec<ArrayRef> = [&short, &long]
            .iter()
            .map(|c| {
                let t = DataType::List(Arc::new(Field::new_list_field(t.clone(), true)));
                cast(&c.list, &t).expect("cast")
            })
            .collect();
        check_same(&args, &format!("known order, {t}/"));
    }
}

#[test]
fn engine_counts_match_values() {
    if !gpu_or_skip("engine_counts_match_values") {
        return;
    }
    let mut rng = Rng(7);
    let n = 20_000;
    let mut offs = [vec![0i64], vec![0i64], vec![0i64]];
    let mut vals: [Vec<i64>; 3] = [vec![], vec![], vec![]];
    for _ in 0..n {
        for j in 0..3 {
            let len = rng.below(200) as usize;
            let v = sorted_list(&mut rng, -100, len, 1);
            vals[j].extend(v.into_iter().flatten());
            offs[j].push(vals[j].len() as i64);
        }
    }
    let lists: Vec<HostList<'_, i64>> = (0..3)
        .map(|j| HostList {
            offsets: HostOffsets::I64(&offs[j]),
            values: &vals[j],
            column: None,
        })
        .collect();
    let v = gpu::intersect(&lists, None, Mode::Values, None, false).expect("values");
    let c = gpu::intersect(&lists, None, Mode::Counts, None, false).expect("counts");
    assert_eq!(v.offsets, c.offsets);
    assert!(!v.any_flagged);
    // against a plain merge on the host
    for r in 0..n {
        let row = |j: usize| &vals[j][offs[j][r] as usize..offs[j][r + 1] as usize];
        let ab: Vec<i64> = row(0)
            .iter()
            .copied()
            .filter(|x| row(1).binary_search(x).is_ok())
            .collect();
        let abc: Vec<i64> = ab
            .into_iter()
            .filter(|x| row(2).binary_search(x).is_ok())
            .collect();
        assert_eq!(
            &v.values[v.offsets[r] as usize..v.offsets[r + 1] as usize],
            &abc[..],
            "row {r}"
        );
    }
}

/// The benchmark of the issue: 100k rows of 10..10,000 u32 (log-uniform lengths, two lists),
/// kernel throughput against the device copy ceiling and end to end from pinned memory
/// against the pinned H2D ceiling. `cargo test --test gpu_props -- --ignored bench`.
#[test]
#[ignore]
fn bench_gpu_intersect() {
    if !gpu_or_skip("bench_gpu_intersect") {
        return;
    }
    let dev = gpu::device().expect("device");
    let ceil = gpu::measure_ceilings(1 << 30).expect("ceilings");
    println!(
        "device: {}  ceilings: D2D {:.0} GB/s (read+write), H2D pinned {:.1} GB/s, D2H pinned {:.1} GB/s",
        dev.name, ceil.d2d_gbps, ceil.h2d_gbps, ceil.d2h_gbps
    );
    let mut rng = Rng(2026);
    let rows = 100_000;
    let mut report = Vec::new();
    for (name, k) in [("2 lists", 2usize), ("3 lists", 3)] {
        let mut offs: Vec<Vec<i32>> = vec![vec![0]; k];
        let mut vals: Vec<Vec<u32>> = vec![Vec::new(); k];
        for _ in 0..rows {
            for j in 0..k {
                let len = (10f64 * 1000f64.powf((rng.next() >> 11) as f64 / (1u64 << 53) as f64))
                    as usize;
                let mut x = 0u32;
                for _ in 0..len {
                    x += 1 + rng.below(4) as u32;
                    vals[j].push(x);
                }
                offs[j].push(vals[j].len() as i32);
            }
        }
        let lists: Vec<HostList<'_, u32>> = (0..k)
            .map(|j| HostList {
                offsets: HostOffsets::I32(&offs[j]),
                values: &vals[j],
                column: None,
            })
            .collect();
        let input: usize = vals.iter().map(|v| v.len()).sum();
        for mode in [Mode::Values, Mode::Counts] {
            // From pinned memory: everything staged first, then one copy (the H2D time is
            // the copy alone); then the default, staging overlapped with the copy in pieces.
            let pieces = tuning::stage_piece();
            tuning::set_stage_piece(0);
            let mut runs = Vec::new();
            for _ in 0..8 {
                runs.push(gpu::intersect(&lists, None, mode, None, false).expect("GPU batch"));
            }
            tuning::set_stage_piece(pieces);
            let mut piped: Vec<f64> = (0..6)
                .map(|_| {
                    let o = gpu::intersect(&lists, None, mode, None, false).expect("GPU batch");
                    assert_eq!(o.offsets, runs[0].offsets, "pieces: offsets differ");
                    assert_eq!(o.values, runs[0].values, "pieces: values differ");
                    o.timings.total_ms
                })
                .collect();
            piped.sort_by(f64::total_cmp);
            let piped = piped[piped.len() / 2];
            let med = |f: &dyn Fn(&gpu::GpuOutput<u32>) -> f64| {
                let mut v: Vec<f64> = runs[1..].iter().map(f).collect();
                v.sort_by(f64::total_cmp);
                (v[v.len() / 2], v[0], v[v.len() - 1])
            };
            let out_values = runs[0].offsets[rows] as usize;
            let (kern, kmin, kmax) = med(&|o| o.timings.kernel_ms);
            let (e2e, _, _) = med(&|o| o.timings.h2d_ms + o.timings.kernel_ms + o.timings.d2h_ms);
            let (h2d, _, _) = med(&|o| o.timings.h2d_ms);
            let (stage, _, _) = med(&|o| o.timings.stage_ms);
            let (total, _, _) = med(&|o| o.timings.total_ms);
            let bytes = (input + if mode == Mode::Values { out_values } else { 0 }) as f64 * 4.0;
            let kgbps = bytes / (kern * 1e-3) / 1e9;
            let h2d_bytes = runs[0].timings.h2d_bytes as f64;
            let e2e_floor = h2d_bytes / (ceil.h2d_gbps * 1e9) * 1e3;
            let line = format!(
                "{name:8} {mode:6?}: {input} input values, {out_values} results; kernels {kern:.3} ms (min {kmin:.3}, max {kmax:.3}) = {kgbps:.0} GB/s = {:.0}% of D2D copy; pinned end-to-end {e2e:.2} ms (H2D {h2d:.2} ms; H2D floor {e2e_floor:.2} ms = {:.0}%); host staging {stage:.1} ms; whole call {total:.1} ms, {piped:.1} ms with staging overlapping the copy ({} MiB pieces)",
                100.0 * kgbps / ceil.d2d_gbps,
                100.0 * e2e_floor / e2e,
                pieces >> 20
            );
            println!("{line}");
            report.push(line);
        }
        // The CPU backend on the same data, through the SQL function (all cores).
        let arrays: Vec<ArrayRef> = (0..k).map(|j| u32_lists(&offs[j], &vals[j])).collect();
        let (cpu, staged, first, resident) = cpu_staged_resident(&arrays);
        let pieces = tuning::stage_piece();
        tuning::set_stage_piece(0);
        let (_, staged_whole, _, _) = cpu_staged_resident(&arrays);
        tuning::set_stage_piece(pieces);
        let line = format!(
            "{name:8} SQL function on Arrow arrays (pageable): CPU backend {cpu:.1} ms ({} threads), GPU backend {staged:.1} ms staged ({staged_whole:.1} ms staging all before one copy), {resident:.1} ms with the columns resident (first call {first:.1} ms) = {:.1}x the CPU; results equal",
            rayon_threads(),
            cpu / resident
        );
        println!("{line}");
        report.push(line);
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(path, report.join("\n") + "\n");
    }
}

/// What known row order buys on resident columns: the engine's kernel time on columns kept on
/// the device, with their row order ignored (every element checked, as for staged lists),
/// used to skip the check, and used to search long rows at ratios 4 to 64; the modes take
/// turns, 7 calls each, medians; every answer equal to the first mode's. Shapes: the issue's
/// (100,000 rows, lengths log-uniform in 10..10,000, gaps 1..4, k = 2 and 3) and a skewed one
/// (short rows of 1..100 against long ones of 1,000..100,000, as rare terms against common).
#[test]
#[ignore]
fn bench_known_order() {
    if !gpu_or_skip("bench_known_order") {
        return;
    }
    let ceil = gpu::measure_ceilings(1 << 30).expect("ceilings");
    let mut rng = Rng(2026);
    let mut report = Vec::new();
    let uniform = |rng: &mut Rng, rows: usize, min: f64, max: f64| {
        let (offs, vals) = log_uniform_columns(rng, rows, min, max, 4).remove(0);
        Column::from_parts(&offs, &vals)
    };
    let issue: Vec<Column> = (0..3)
        .map(|_| uniform(&mut rng, 100_000, 10.0, 10_000.0))
        .collect();
    let skew = [
        uniform(&mut rng, 100_000, 1.0, 100.0),
        uniform(&mut rng, 100_000, 1_000.0, 100_000.0),
    ];
    let shapes: [(&str, Vec<&Column>); 3] = [
        ("issue k=2", vec![&issue[0], &issue[1]]),
        ("issue k=3", vec![&issue[0], &issue[1], &issue[2]]),
        ("skewed k=2", vec![&skew[0], &skew[1]]),
    ];
    let modes = [
        tuning::KnownOrder::Ignore,
        tuning::KnownOrder::CheckOnly,
        tuning::KnownOrder::Search(1),
        tuning::KnownOrder::Search(2),
        tuning::KnownOrder::Search(4),
        tuning::KnownOrder::Search(8),
        tuning::KnownOrder::Search(16),
        tuning::KnownOrder::Warp,
    ];
    // DFSETS_BENCH_KO_MODES=warp: `wmerge` and the tile kernel at ratio 4 (the reference of
    // earlier runs) alone, for side-by-side runs of `wmerge`'s settings.
    let modes: Vec<_> = match std::env::var("DFSETS_BENCH_KO_MODES").as_deref() {
        Ok("warp") => vec![tuning::KnownOrder::Search(4), tuning::KnownOrder::Warp],
        _ => modes.to_vec(),
    };
    let before = tuning::known_order();
    for (name, cols) in shapes {
        let kept: Vec<_> = cols.iter().map(|c| c.host(true)).collect();
        let first = gpu::intersect(&kept, None, Mode::Values, Some(0), false).expect("upload");
        assert_eq!(
            first.timings.columns_uploaded as usize + first.timings.columns_reused as usize,
            cols.len()
        );
        let input: u64 = first.timings.input_values;
        let mut kernel = vec![Vec::new(); modes.len()];
        let mut span = vec![Vec::new(); modes.len()];
        let mut merge = vec![Vec::new(); modes.len()];
        let mut marked = vec![Vec::new(); modes.len()];
        let mut reference: Option<gpu::GpuOutput<u32>> = None;
        // Rounds alternate without and with the merge kernels' own marks (events around
        // them, queued between the kernels): the kernels' time from the first, their
        // breakdown from the second.
        for round in 0..14 {
            let marks = round % 2 == 1;
            tuning::set_merge_marks(marks);
            for (i, &m) in modes.iter().enumerate() {
                tuning::set_known_order(m);
                let o =
                    gpu::intersect(&kept, None, Mode::Values, Some(0), false).expect("resident");
                assert_eq!(o.timings.columns_reused as usize, cols.len(), "{name}");
                match &reference {
                    None => reference = Some(o.clone()),
                    Some(r) => {
                        assert_eq!(o.offsets, r.offsets, "{name} {m:?}: offsets");
                        assert_eq!(o.values_slice(), r.values_slice(), "{name} {m:?}: values");
                        assert_eq!(o.flagged, r.flagged, "{name} {m:?}: flags");
                    }
                }
                if marks {
                    merge[i].push(o.timings.merge_ms);
                    marked[i].push(o.timings.kernel_ms);
                } else {
                    kernel[i].push(o.timings.kernel_ms);
                    span[i].push(o.timings.kernel_span_ms);
                }
            }
        }
        let results = reference
            .as_ref()
            .map_or(0, |r| r.offsets[r.offsets.len() - 1]);
        let bytes = (input + results) as f64 * 4.0;
        let cells: Vec<String> = modes
            .iter()
            .zip(
                kernel
                    .into_iter()
                    .zip(span)
                    .zip(merge.into_iter().zip(marked)),
            )
            .map(|(m, ((v, sp), (w, x)))| {
                let ms = median(v);
                let pct = |ms: f64| 100.0 * bytes / (ms * 1e-3) / 1e9 / ceil.d2d_gbps;
                // The graph's own span (0 when the calls were launched one by one).
                let sp = median(sp);
                let span = if sp > 0.0 {
                    format!("; graph span {sp:.3} ms ({:.0}%)", pct(sp))
                } else {
                    String::new()
                };
                format!(
                    "{m:?} {ms:.3} ms ({:.0}%{span}; merge {:.3} of {:.3} with marks)",
                    pct(ms),
                    median(w),
                    median(x)
                )
            })
            .collect();
        let line = format!(
            "{name:10}: {input} input values, {results} results; resident kernels (input + results bytes against the D2D copy {:.0} GB/s; the merge kernels alone, from rounds with their marks): {}",
            ceil.d2d_gbps,
            cells.join(", ")
        );
        println!("{line}");
        report.push(line);
    }
    tuning::set_known_order(before);
    tuning::set_merge_marks(false);
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(format!("{path}.known_order"), report.join("\n") + "\n");
    }
}

/// `list_intersect` over `arrays` through the SQL function, median of 5 calls each: the CPU
/// backend, the GPU backend with the columns staged per call, the GPU backend's first call
/// with residency on (it copies the columns and keeps them), then its calls that find them
/// resident. Every answer equal to the CPU's. Milliseconds.
fn cpu_staged_resident(arrays: &[ArrayRef]) -> (f64, f64, f64, f64) {
    let udf = list_intersect_udf();
    let timed = |cfg: &Arc<ConfigOptions>| {
        let t = Instant::now();
        let out = invoke_with(&udf, arrays, Arc::clone(cfg));
        (out, t.elapsed().as_secs_f64() * 1e3)
    };
    let (cpu_cfg, staged_cfg, resident_cfg) = (
        config_with(BackendChoice::Cpu, false),
        config_with(BackendChoice::Gpu, false),
        config_with(BackendChoice::Gpu, true),
    );
    let (reference, _) = timed(&cpu_cfg);
    let mut runs = [Vec::new(), Vec::new(), Vec::new()];
    let (out, first) = timed(&resident_cfg);
    assert_eq!(
        out.as_ref(),
        reference.as_ref(),
        "resident, first call: GPU != CPU"
    );
    for _ in 0..5 {
        for (i, cfg) in [&cpu_cfg, &staged_cfg, &resident_cfg]
            .into_iter()
            .enumerate()
        {
            let (out, ms) = timed(cfg);
            assert_eq!(
                out.as_ref(),
                reference.as_ref(),
                "bench data: backend {i} != CPU"
            );
            runs[i].push(ms);
        }
    }
    let [cpu, staged, resident] = runs.map(median);
    (cpu, staged, first, resident)
}

/// Device-resident list columns against the CPU backend on all cores, through the SQL
/// function on one call over whole Arrow arrays: the foundation issue's W1 (200,000 rows of
/// two lists, lengths log-uniform in 10..1000) and W2 (2,000 rows, 1e3..1e5), lists strictly
/// increasing with gaps uniform in 1..=4, then both shapes scaled 4x in rows.
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_resident_columns() {
    if !gpu_or_skip("bench_resident_columns") {
        return;
    }
    let mut rng = Rng(41);
    let mut report = Vec::new();
    for (shape, rows, lo, hi) in [
        ("W1", 200_000usize, 10f64, 1000f64),
        ("W2", 2_000, 1e3, 1e5),
        ("W1x4", 800_000, 10.0, 1000.0),
        ("W2x4", 8_000, 1e3, 1e5),
    ] {
        let columns = log_uniform_columns(&mut rng, rows, lo, hi, 4);
        let arrays: Vec<ArrayRef> = columns.iter().map(|(o, v)| u32_lists(o, v)).collect();
        let values: usize = columns.iter().map(|(_, v)| v.len()).sum();
        let (cpu, staged, first, resident) = cpu_staged_resident(&arrays);
        // Where a resident call's time goes: the engine on the same (resident) columns.
        let lists: Vec<_> = arrays
            .iter()
            .map(|a| {
                a.as_any()
                    .downcast_ref::<GenericListArray<i32>>()
                    .expect("list")
            })
            .collect();
        let kept: Vec<HostList<'_, u32>> = lists
            .iter()
            .map(|l| {
                let child = l.values().as_primitive::<UInt32Type>();
                HostList {
                    offsets: HostOffsets::I32(l.value_offsets()),
                    values: child.values().as_ref(),
                    column: Some((child.values().inner(), l.offsets().inner().inner())),
                }
            })
            .collect();
        let runs: Vec<gpu::Timings> = (0..5)
            .map(|_| {
                gpu::intersect(&kept, None, Mode::Values, Some(0), false)
                    .expect("resident engine call")
                    .timings
            })
            .collect();
        let med = |f: fn(&gpu::Timings) -> f64| median(runs.iter().map(f).collect());
        let line = format!(
            "{shape:5} {rows} rows, {values} values: CPU backend {cpu:.1} ms ({} threads), GPU staged {staged:.1} ms ({:.1}x), GPU resident {resident:.1} ms ({:.1}x; first call {first:.1} ms); resident engine call {:.2} ms = staging {:.2} + copy in {:.3} + kernels {:.3} + copy out {:.3} + unstaging {:.2} ms ({} bytes in, {} out)",
            rayon_threads(),
            cpu / staged,
            cpu / resident,
            med(|t| t.total_ms),
            med(|t| t.stage_ms),
            med(|t| t.h2d_ms),
            med(|t| t.kernel_ms),
            med(|t| t.d2h_ms),
            med(|t| t.unstage_ms),
            runs[0].h2d_bytes,
            runs[0].d2h_bytes
        );
        println!("{line}");
        report.push(line);
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(format!("{path}.resident"), report.join("\n") + "\n");
    }
}

/// The cost of a device call by batch size: the same rows given to the SQL function in slices
/// of `b` rows, one call per slice (a projection gets batches of
/// `datafusion.execution.batch_size` = 8192 rows by default), GPU and CPU backends, on two
/// shapes of two `List<UInt32>` columns: the foundation issue's W1 (200,000 rows, lengths
/// log-uniform in 10..1000) and 100,000 rows of 10..10,000; then the whole query through SQL
/// over a memory table of 8192-row batches. Median of 3 passes, results checked equal.
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_batch_rows() {
    if !gpu_or_skip("bench_batch_rows") {
        return;
    }
    let mut rng = Rng(7);
    let mut report = Vec::new();
    for (shape, rows, max_len) in [
        ("W1", 200_000usize, 1000f64),
        ("10..10k", 100_000, 10_000.0),
    ] {
        let columns = log_uniform_columns(&mut rng, rows, 10.0, max_len, 4);
        let arrays: Vec<ArrayRef> = columns.iter().map(|(o, v)| u32_lists(o, v)).collect();
        // Where an 8192-row call's time goes: the engine itself on every 8192-row slice,
        // its timings summed (second of two passes).
        let mut sum = gpu::Timings::default();
        let mut calls = 0;
        for _ in 0..2 {
            sum = gpu::Timings::default();
            calls = 0;
            for r0 in (0..rows).step_by(8192) {
                let n = 8192.min(rows - r0);
                let lists: Vec<HostList<'_, u32>> = columns
                    .iter()
                    .map(|(o, v)| HostList {
                        offsets: HostOffsets::I32(&o[r0..=r0 + n]),
                        values: v,
                        column: None,
                    })
                    .collect();
                let t = gpu::intersect(&lists, None, Mode::Values, None, false)
                    .expect("GPU batch")
                    .timings;
                sum.stage_ms += t.stage_ms;
                sum.h2d_ms += t.h2d_ms;
                sum.kernel_ms += t.kernel_ms;
                sum.d2h_ms += t.d2h_ms;
                sum.unstage_ms += t.unstage_ms;
                sum.total_ms += t.total_ms;
                calls += 1;
            }
        }
        let parts = sum.stage_ms + sum.h2d_ms + sum.kernel_ms + sum.d2h_ms + sum.unstage_ms;
        let line = format!(
            "batch rows {shape:8} engine, {calls} calls of 8192 rows, summed: stage {:.1} ms, H2D {:.1}, kernels {:.1}, D2H {:.1}, unstage {:.1}, rest {:.1}; whole calls {:.1} ms",
            sum.stage_ms,
            sum.h2d_ms,
            sum.kernel_ms,
            sum.d2h_ms,
            sum.unstage_ms,
            sum.total_ms - parts,
            sum.total_ms
        );
        println!("{line}");
        report.push(line);
        let values: usize = columns.iter().map(|(_, v)| v.len()).sum();
        let udf = list_intersect_udf();
        let run = |b: usize, backend: BackendChoice| -> (f64, Vec<ArrayRef>) {
            let t = Instant::now();
            let mut out = Vec::new();
            let mut r0 = 0;
            while r0 < rows {
                let n = b.min(rows - r0);
                let slice: Vec<ArrayRef> = arrays.iter().map(|a| a.slice(r0, n)).collect();
                out.push(invoke(&udf, &slice, backend));
                r0 += n;
            }
            (t.elapsed().as_secs_f64() * 1e3, out)
        };
        for b in [8192usize, 32_768, 131_072, rows] {
            let (mut g, mut c) = (Vec::new(), Vec::new());
            for _ in 0..3 {
                let (tg, og) = run(b, BackendChoice::Gpu);
                let (tc, oc) = run(b, BackendChoice::Cpu);
                assert!(
                    og.iter().zip(&oc).all(|(x, y)| x.as_ref() == y.as_ref()),
                    "GPU != CPU"
                );
                g.push(tg);
                c.push(tc);
            }
            g.sort_by(f64::total_cmp);
            c.sort_by(f64::total_cmp);
            let line = format!(
                "batch rows {shape:8} {rows} rows, {values} values: slices of {b:>6} rows ({} calls): GPU {:.1} ms, CPU {:.1} ms ({} threads)",
                rows.div_ceil(b),
                g[1],
                c[1],
                rayon_threads()
            );
            println!("{line}");
            report.push(line);
        }
        // Through SQL: a memory table in batches of 8192 rows (DataFusion spreads them over
        // the partitions; each batch is its own device call).
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", arrays[0].data_type().clone(), true),
            Field::new("b", arrays[1].data_type().clone(), true),
        ]));
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(8192)
            .map(|r0| {
                let n = 8192.min(rows - r0);
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![arrays[0].slice(r0, n), arrays[1].slice(r0, n)],
                )
                .expect("batch")
            })
            .collect();
        let runtime = tokio::runtime::Runtime::new().expect("tokio");
        let mut expected = None;
        for backend in ["cpu", "gpu"] {
            let (times, total, _) = sql_count(&runtime, &schema, &batches, backend);
            let ms = median(times);
            assert_eq!(*expected.get_or_insert(total), total, "{backend}");
            let line = format!(
                "batch rows {shape:8} SQL, table in batches of 8192 rows: sets.backend = '{backend}': {ms:.1} ms"
            );
            println!("{line}");
            report.push(line);
        }
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let path = format!("{path}.batch_rows");
        let _ = std::fs::write(path, report.join("\n") + "\n");
    }
}

/// `SELECT list_intersect_count(a, b) FROM t` over a memory table of `batches` with
/// `sets.backend = backend`, in a fresh session each time: the times (ms) of 3 runs, or of
/// as many as fit half a second (up to 25) for short queries, the sum of the counts, and
/// the backend line of `EXPLAIN`.
fn sql_count(
    runtime: &tokio::runtime::Runtime,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    backend: &str,
) -> (Vec<f64>, u64, String) {
    let mut times = Vec::new();
    let (mut total, mut chosen) = (None, String::new());
    while times.len() < 3 || (times.len() < 25 && times.iter().sum::<f64>() < 500.0) {
        let (ms, sum, line) = sql_count_once(runtime, schema, batches, backend, times.is_empty());
        assert_eq!(
            *total.get_or_insert(sum),
            sum,
            "{backend}: same answer every run"
        );
        times.push(ms);
        if !line.is_empty() {
            chosen = line;
        }
    }
    (times, total.unwrap_or(0), chosen)
}

/// A fresh session with `batches` as table `t` (a memory table of one partition) and
/// `sets.backend = backend`.
fn table_session(
    runtime: &tokio::runtime::Runtime,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    backend: &str,
) -> datafusion::prelude::SessionContext {
    let ctx = datafusion_sets::new_context();
    let table = MemTable::try_new(Arc::clone(schema), vec![batches.to_vec()]).expect("table");
    ctx.register_table("t", Arc::new(table)).expect("register");
    let set = format!("SET sets.backend = '{backend}'");
    runtime.block_on(async { ctx.sql(&set).await.unwrap().collect().await.unwrap() });
    ctx
}

/// One run of `SELECT list_intersect_count(a, b) FROM t` over a memory table of `batches`
/// with `sets.backend = backend`, in a fresh session: its time (ms), the sum of the counts,
/// and (`explain`: from an `EXPLAIN` first, not timed) the plan's backend line.
fn sql_count_once(
    runtime: &tokio::runtime::Runtime,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    backend: &str,
    explain: bool,
) -> (f64, u64, String) {
    let ctx = table_session(runtime, schema, batches, backend);
    runtime.block_on(async {
        // DFSETS_BENCH_SPLIT=N: `sets.parallel_min_values` (measurements of where a batch's
        // split across threads pays on the GPU machine's host).
        if let Ok(n) = std::env::var("DFSETS_BENCH_SPLIT") {
            let set = format!("SET sets.parallel_min_values = {}", n.trim());
            ctx.sql(&set).await.unwrap().collect().await.unwrap();
        }
        let query = "SELECT list_intersect_count(a, b) AS c FROM t";
        let chosen = if explain {
            let plan = ctx.sql(&format!("EXPLAIN {query}")).await.unwrap();
            let plan = plan.collect().await.unwrap();
            let plan = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
                .unwrap()
                .to_string();
            plan.lines()
                .find_map(|l| {
                    l.find("list_intersect_count=")
                        .map(|i| l[i..].trim_end_matches(['|', ' ']).to_string())
                })
                .unwrap_or_default()
        } else {
            String::new()
        };
        let t = Instant::now();
        let out = ctx.sql(query).await.unwrap().collect().await.unwrap();
        let ms = t.elapsed().as_secs_f64() * 1e3;
        let sum: u64 = out
            .iter()
            .map(|b| {
                let c = cast(b.column(0), &DataType::UInt64).unwrap();
                c.as_any()
                    .downcast_ref::<datafusion::arrow::array::UInt64Array>()
                    .unwrap()
                    .values()
                    .iter()
                    .sum::<u64>()
            })
            .sum();
        (ms, sum, chosen)
    })
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// `sets.backend = 'auto'` against `'cpu'` and `'gpu'` through SQL, by row count (rows of two
/// sorted `list<uint32>`, lengths log-uniform in 10..100, a memory table in batches of 8192
/// rows): the issue's "auto never more than 5% slower than the better of the two". Each row
/// count in rounds of one run per backend (see the loop); "auto / better" from the medians,
/// and paired (auto over the faster backend's run of the same round, median over rounds).
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_auto_rows() {
    if !gpu_or_skip("bench_auto_rows") {
        return;
    }
    let mut rng = Rng(11);
    let max_rows = std::env::var("DFSETS_BENCH_AUTO_MAX_ROWS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10_000_000usize);
    let columns = log_uniform_columns(&mut rng, max_rows, 10.0, 100.0, 8);
    let arrays: Vec<ArrayRef> = columns.iter().map(|(o, v)| u32_lists(o, v)).collect();
    drop(columns);
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", arrays[0].data_type().clone(), true),
        Field::new("b", arrays[1].data_type().clone(), true),
    ]));
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let mut report = vec![format!(
        "auto vs cpu vs gpu through SQL, list_intersect_count, rows of 10..100 u32 each, batches of 8192 rows, median (ms), {} threads",
        rayon_threads()
    )];
    println!("{}", report[0]);
    let mut rows = 1usize;
    while rows <= max_rows {
        // Each batch with buffers of its own, as a table read or built batch by batch has
        // (DataFusion's byte statistics count a slice's whole buffers).
        let own = |a: &ArrayRef, r0: usize, n: usize| {
            let data = a.slice(r0, n).to_data();
            let mut copy = datafusion::arrow::array::MutableArrayData::new(vec![&data], false, n);
            copy.try_extend(0, 0, n).expect("copy");
            datafusion::arrow::array::make_array(copy.freeze())
        };
        let batches: Vec<RecordBatch> = (0..rows)
            .step_by(8192)
            .map(|r0| {
                let n = 8192.min(rows - r0);
                RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![own(&arrays[0], r0, n), own(&arrays[1], r0, n)],
                )
                .expect("batch")
            })
            .collect();
        // Rounds of one run of each backend, in each of the six orders in turn, so that a
        // drift of the machine falls on all three alike and each follows each other as often
        // (a query right after a GPU one may pay for it): at least 6 rounds, then as many as
        // fit 1.5 s (up to 30). Medians of each, and the paired ratios: the median over the
        // rounds of auto's time over the other's in the same round.
        let names = ["cpu", "gpu", "auto"];
        let mut times: [Vec<f64>; 3] = Default::default();
        let (mut totals, mut chosen) = ([None; 3], String::new());
        let mut spent = 0.0;
        const ORDERS: [[usize; 3]; 6] = [
            [0, 1, 2],
            [0, 2, 1],
            [1, 0, 2],
            [1, 2, 0],
            [2, 0, 1],
            [2, 1, 0],
        ];
        while times[0].len() < 6 || (times[0].len() < 30 && spent < 1500.0) {
            let round = times[0].len();
            for b in ORDERS[round % 6] {
                let explain = round == 0 && b == 2;
                let (ms, sum, line) =
                    sql_count_once(&runtime, &schema, &batches, names[b], explain);
                assert_eq!(*totals[b].get_or_insert(sum), sum, "{}", names[b]);
                if explain {
                    chosen = line;
                }
                times[b].push(ms);
                spent += ms;
            }
        }
        assert!(
            totals[0] == totals[1] && totals[0] == totals[2],
            "{rows} rows: answers differ"
        );
        let paired =
            |x: usize| median(times[2].iter().zip(&times[x]).map(|(a, o)| a / o).collect());
        let (vs_cpu, vs_gpu) = (paired(0), paired(1));
        let rounds = times[0].len();
        let [cpu, gpu_ms, auto] = times.map(median);
        let better = if cpu <= gpu_ms { vs_cpu } else { vs_gpu };
        let line = format!(
            "rows {rows:>9}: cpu {cpu:9.2}  gpu {gpu_ms:9.2}  auto {auto:9.2}  auto / better {:.2}  paired: auto / cpu {vs_cpu:.2}, auto / gpu {vs_gpu:.2}, auto / better {better:.2} ({} rounds)  ({chosen})",
            auto / cpu.min(gpu_ms),
            rounds
        );
        println!("{line}");
        report.push(line);
        rows *= 10;
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(format!("{path}.auto_rows"), report.join("\n") + "\n");
    }
}

/// `sets.backend = 'auto'` on a table queried again, through SQL in one session: a memory
/// table of one batch (the foundation issue's W1 and W2 scaled 4x in rows), queried seven
/// times under `auto` (the first on the CPU, noting the columns; then each batch where the
/// resident model prices it, its columns copied once and read on the device after), five
/// times under `'cpu'` and five under `'gpu'`; the answers equal. DataFusion hands a batch of
/// more than 8,192 rows on in slices of 8,192 (W1x4: 98), each with offsets of its own: the
/// values buffer is kept once half of it was read, and each slice copies its offsets.
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_auto_resident() {
    if !gpu_or_skip("bench_auto_resident") {
        return;
    }
    let mut rng = Rng(43);
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let mut report = vec![format!(
        "auto on a table queried again, list_intersect_count through SQL, one batch, {} threads",
        rayon_threads()
    )];
    println!("{}", report[0]);
    for (shape, rows, lo, hi) in [
        ("W1x4", 800_000usize, 10f64, 1000f64),
        ("W2x4", 8_000, 1e3, 1e5),
    ] {
        let columns = log_uniform_columns(&mut rng, rows, lo, hi, 4);
        let values: usize = columns.iter().map(|(_, v)| v.len()).sum();
        let arrays: Vec<ArrayRef> = columns.iter().map(|(o, v)| u32_lists(o, v)).collect();
        drop(columns);
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", arrays[0].data_type().clone(), true),
            Field::new("b", arrays[1].data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(Arc::clone(&schema), arrays).expect("batch");
        let ctx = datafusion_sets::new_context();
        let table = MemTable::try_new(schema, vec![vec![batch]]).expect("table");
        ctx.register_table("t", Arc::new(table)).expect("register");
        let run = |backend: &str| {
            runtime.block_on(async {
                let set = format!("SET sets.backend = '{backend}'");
                ctx.sql(&set).await.unwrap().collect().await.unwrap();
                let t = Instant::now();
                let out = ctx
                    .sql("SELECT list_intersect_count(a, b) AS c FROM t")
                    .await
                    .unwrap()
                    .collect()
                    .await
                    .unwrap();
                let ms = t.elapsed().as_secs_f64() * 1e3;
                let sum: u64 = out
                    .iter()
                    .map(|b| {
                        b.column(0)
                            .as_primitive::<datafusion::arrow::datatypes::UInt64Type>()
                            .values()
                            .iter()
                            .sum::<u64>()
                    })
                    .sum();
                (ms, sum)
            })
        };
        // Each auto run with the batches it ran on the GPU (DataFusion hands the table's one
        // batch on in slices of 8,192 rows).
        let auto: Vec<(f64, u64, u64)> = (0..7)
            .map(|_| {
                let before = gpu::batches_run();
                let (ms, sum) = run("auto");
                (ms, sum, gpu::batches_run() - before)
            })
            .collect();
        let on_gpu: Vec<u64> = auto.iter().map(|r| r.2).collect();
        let slices = rows.div_ceil(8192) as u64;
        let cpu: Vec<(f64, u64)> = (0..5).map(|_| run("cpu")).collect();
        let gpu_runs: Vec<(f64, u64)> = (0..5).map(|_| run("gpu")).collect();
        // What auto chose and ran, as EXPLAIN ANALYZE tells it (the plan's reason, the
        // batches and rows it ran on each backend).
        let explained = runtime.block_on(async {
            ctx.sql("SET sets.backend = 'auto'")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            let plan = ctx
                .sql("EXPLAIN ANALYZE SELECT list_intersect_count(a, b) AS c FROM t")
                .await
                .unwrap()
                .collect()
                .await
                .unwrap();
            datafusion::arrow::util::pretty::pretty_format_batches(&plan)
                .unwrap()
                .to_string()
        });
        for l in explained
            .lines()
            .filter(|l| l.contains("SetsBackendExec") || l.contains("DataSourceExec"))
        {
            println!(
                "{shape}: {}",
                l.trim_matches(|c: char| c == '|' || c.is_whitespace())
            );
        }
        let answer = cpu[0].1;
        assert!(
            auto.iter()
                .map(|r| r.1)
                .chain(cpu.iter().chain(&gpu_runs).map(|r| r.1))
                .all(|a| a == answer),
            "{shape}: answers differ"
        );
        // The first run on the CPU (it notes the columns); where the later runs go is the
        // resident model's call, batch by batch.
        println!("{shape}: batches on the GPU per auto run: {on_gpu:?} of {slices}");
        assert_eq!(on_gpu[0], 0, "{shape}: the first auto run is on the CPU");
        let rest = median(auto[2..].iter().map(|r| r.0).collect());
        let cpu_ms = median(cpu.iter().map(|r| r.0).collect());
        let gpu_ms = median(gpu_runs.iter().map(|r| r.0).collect());
        let line = format!(
            "{shape:5} {rows} rows ({slices} batches), {values} values: auto 1st {:.1} ms, 2nd {:.1} ms, then {rest:.1} ms (median of 5; GPU batches per run {on_gpu:?}); cpu {cpu_ms:.1} ms, gpu {gpu_ms:.1} ms (medians of 5); auto / better = {:.2}",
            auto[0].0,
            auto[1].0,
            rest / cpu_ms.min(gpu_ms)
        );
        println!("{line}");
        report.push(line);
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(format!("{path}.auto_resident"), report.join("\n") + "\n");
    }
}

/// Two list columns (offsets, values) of `rows` rows: each list of log-uniform length in
/// `min_len..max_len`, strictly increasing with gaps uniform in `1..=max_gap`.
fn log_uniform_columns(
    rng: &mut Rng,
    rows: usize,
    min_len: f64,
    max_len: f64,
    max_gap: u64,
) -> Vec<(Vec<i32>, Vec<u32>)> {
    (0..2)
        .map(|_| {
            let mut offs = vec![0i32];
            let mut vals = Vec::new();
            for _ in 0..rows {
                let u = (rng.next() >> 11) as f64 / (1u64 << 53) as f64;
                let len = (min_len * (max_len / min_len).powf(u)) as usize;
                let mut x = 0u32;
                for _ in 0..len {
                    x += 1 + rng.below(max_gap) as u32;
                    vals.push(x);
                }
                offs.push(vals.len() as i32);
            }
            (offs, vals)
        })
        .collect()
}

/// A `List<UInt32>` array (no NULLs) from its offsets and values.
fn u32_lists(offsets: &[i32], values: &[u32]) -> ArrayRef {
    let field = Arc::new(Field::new_list_field(DataType::UInt32, true));
    let child: ArrayRef = Arc::new(datafusion::arrow::array::UInt32Array::from(values.to_vec()));
    Arc::new(GenericListArray::<i32>::new(
        field,
        OffsetBuffer::new(offsets.to_vec().into()),
        child,
        None,
    ))
}

fn rayon_threads() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
}

/// One group's answer: its key and its list (`None`: NULL; `None` elements: NULL elements).
type GroupResult = (i64, Option<Vec<Option<i64>>>);

/// `SELECT g, list_intersect_agg(l) FROM t GROUP BY g` under `backend`, over `batches`, in a
/// fresh session: the wall times of `runs` runs and the answer (sorted by group, each list
/// as `i64`s, `None` for a NULL element).
fn sql_agg(
    runtime: &tokio::runtime::Runtime,
    schema: &SchemaRef,
    batches: &[RecordBatch],
    backend: &str,
    runs: usize,
) -> (Vec<f64>, Vec<GroupResult>) {
    let ctx = table_session(runtime, schema, batches, backend);
    runtime.block_on(async {
        let query = "SELECT g, list_intersect_agg(l) AS r FROM t GROUP BY g";
        let mut times = Vec::new();
        let mut answer = Vec::new();
        for _ in 0..runs {
            let t = Instant::now();
            let out = ctx.sql(query).await.unwrap().collect().await.unwrap();
            times.push(t.elapsed().as_secs_f64() * 1e3);
            answer.clear();
            for b in &out {
                let g = cast(b.column(0), &DataType::Int64).unwrap();
                let g = g.as_primitive::<datafusion::arrow::datatypes::Int64Type>();
                let r = cast(b.column(1), &DataType::new_list(DataType::Int64, true)).unwrap();
                let r = r.as_list::<i32>();
                for i in 0..b.num_rows() {
                    let list = (!r.is_null(i)).then(|| {
                        let v = r.value(i);
                        v.as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                            .iter()
                            .collect()
                    });
                    answer.push((g.value(i), list));
                }
            }
        }
        answer.sort();
        (times, answer)
    })
}

/// `list_intersect_agg` with `GROUP BY` under `'gpu'` (every group's lists folded on the
/// device, all groups together, round by round) equals `'cpu'`, group for group: random
/// groups of 1-8 lists of every kind `random_row` makes (empty, unsorted, duplicated, NULL
/// lists and elements, long lists), element types of 32 and 64 bits, List and LargeList; the
/// GPU ran batches.
#[test]
fn gpu_agg_equals_cpu_agg() {
    if !gpu_or_skip("gpu_agg_equals_cpu_agg") {
        return;
    }
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let mut rng = Rng(29);
    for (case, (element, large, groups)) in [
        (DataType::Int32, false, 300usize),
        (DataType::UInt32, false, 2_000),
        (DataType::Int64, true, 700),
        (DataType::UInt64, false, 50),
    ]
    .into_iter()
    .enumerate()
    {
        let mut batches = Vec::new();
        let list_type = if large {
            DataType::new_large_list(element.clone(), true)
        } else {
            DataType::new_list(element.clone(), true)
        };
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("l", list_type, true),
        ]));
        for _ in 0..3 {
            let rows: Vec<(i64, Row)> = (0..groups * 2)
                .map(|_| {
                    let g = rng.below(groups as u64) as i64;
                    (
                        g,
                        random_row(&mut rng, element.is_signed_integer(), case == 1),
                    )
                })
                .collect();
            let lists: Vec<Row> = rows.iter().map(|(_, r)| r.clone()).collect();
            let l = if large {
                build::<i64>(&lists, &element, 3)
            } else {
                build::<i32>(&lists, &element, 0)
            };
            let g: ArrayRef = Arc::new(Int64Array::from(
                rows.iter().map(|(g, _)| *g).collect::<Vec<_>>(),
            ));
            batches.push(RecordBatch::try_new(Arc::clone(&schema), vec![g, l]).expect("batch"));
        }
        let (_, cpu) = sql_agg(&runtime, &schema, &batches, "cpu", 1);
        let before = gpu::batches_run();
        let (_, on_gpu) = sql_agg(&runtime, &schema, &batches, "gpu", 1);
        let ran = gpu::batches_run() - before;
        assert!(ran > 0, "case {case}: no GPU batch ran");
        assert_eq!(cpu.len(), on_gpu.len(), "case {case}: groups");
        for (c, g) in cpu.iter().zip(&on_gpu) {
            assert_eq!(c, g, "case {case}: group {}", c.0);
        }
        println!(
            "gpu_agg_equals_cpu_agg: {element} large={large}: {} groups equal, {ran} GPU batches",
            cpu.len()
        );
    }
}

/// `list_intersect_agg` with `GROUP BY` through SQL on `'cpu'` (all threads) and `'gpu'`:
/// groups of 2-5 sorted `list<uint32>` of log-uniform length (small: 10..1,000; large:
/// 1,000..100,000), gaps 1..8; median of 5 runs each, answers equal. The numbers behind
/// `auto` keeping the aggregate on the CPU.
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_agg_groups() {
    if !gpu_or_skip("bench_agg_groups") {
        return;
    }
    // RUST_LOG=datafusion_sets=debug: each fold's host and device times.
    let _ = env_logger::try_init();
    let runtime = tokio::runtime::Runtime::new().expect("tokio");
    let mut rng = Rng(31);
    let mut report = vec![format!(
        "list_intersect_agg GROUP BY, 'cpu' ({} threads) vs 'gpu', median of 5 (ms)",
        rayon_threads()
    )];
    println!("{}", report[0]);
    for (name, groups, min, max) in [
        ("small", 100_000usize, 10.0, 1_000.0),
        ("large", 2_000, 1_000.0, 100_000.0),
    ] {
        let schema = Arc::new(Schema::new(vec![
            Field::new("g", DataType::Int64, false),
            Field::new("l", DataType::new_list(DataType::UInt32, true), true),
        ]));
        let mut gs = Vec::new();
        for g in 0..groups {
            for _ in 0..2 + rng.below(4) {
                gs.push(g as i64);
            }
        }
        // Rows in random order (a group's lists spread over the batches).
        for i in (1..gs.len()).rev() {
            let j = rng.below(i as u64 + 1) as usize;
            gs.swap(i, j);
        }
        let mut batches = Vec::new();
        let mut values = 0usize;
        for chunk in gs.chunks(8192) {
            let cols = log_uniform_columns(&mut rng, chunk.len(), min, max, 8);
            values += cols[0].1.len();
            let l = u32_lists(&cols[0].0, &cols[0].1);
            let g: ArrayRef = Arc::new(Int64Array::from(chunk.to_vec()));
            batches.push(RecordBatch::try_new(Arc::clone(&schema), vec![g, l]).expect("batch"));
        }
        let (cpu_t, cpu) = sql_agg(&runtime, &schema, &batches, "cpu", 5);
        let before = gpu::batches_run();
        let (gpu_t, on_gpu) = sql_agg(&runtime, &schema, &batches, "gpu", 5);
        let ran = gpu::batches_run() - before;
        assert_eq!(cpu, on_gpu, "{name}: answers differ");
        let (c, g) = (median(cpu_t), median(gpu_t));
        let line = format!(
            "{name}: {groups} groups, {} lists, {values} values: cpu {c:.1}  gpu {g:.1}  cpu/gpu {:.2}  ({} GPU batches a run)",
            gs.len(),
            c / g,
            ran / 5
        );
        println!("{line}");
        report.push(line);
    }
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        let _ = std::fs::write(format!("{path}.agg_groups"), report.join("\n") + "\n");
    }
}
