//! Benchmarks of `list_intersect` & co. (criterion, `harness = false`).
//!
//! Run everything (a few minutes):   cargo bench --bench list_intersect
//! One group or benchmark:           cargo bench --bench list_intersect -- sql/W1
//! Dump W1..W3 for an external driver (binary, see `dump`), then exit:
//!                                   SETS_BENCH_DUMP=/some/dir cargo bench --bench list_intersect
//!
//! Groups (ids are `group/shape/variant`):
//! - `sql/{W1,W2,W3}/{builtin,ours,ours_cold}`: `SELECT array_intersect(a, b)` vs
//!   `SELECT list_intersect(a, b)` over one MemTable, result collected, one core:
//!   `target_partitions = 1`, `SET sets.parallel_min_values = 0`, a current-thread tokio
//!   runtime and a 1-thread rayon pool. `ours` repeats the query on the same buffers (the
//!   crate's per-buffer row-verdict cache is warm after the first run); `ours_cold` runs each
//!   iteration on a fresh deep copy of the table (copy not timed), i.e. a table's first query.
//! - `kernel/{W1,W2,W3}/{auto,scalar,galloping,sse42,avx2,avx512,vp2intersect}`: the CPU kernel
//!   alone over every row, read straight from the Arrow buffers, `out` cleared per row.
//!   Kernels the CPU lacks run their documented fallback (the bench prints which).
//! - `sweep/{u32,u64}/{short}x{ratio}/{auto,scalar,galloping,avx2,avx512,vp2intersect}`: each
//!   kernel of the hybrid policy on ~16 M values of pairs of fixed lengths (the thresholds in
//!   `src/backend/cpu/mod.rs` come from it); throughput in pairs per second.
//! - `check/{W1,W2,W3}/{sortedness,check_then_auto,checked_auto,read}`: `cpu::sortedness`
//!   over both lists of every row (the per-row check the SQL path does before it may call a
//!   sorted kernel), the check and the kernel row by row, the order-checking kernel
//!   (`cpu::intersect_auto_checked`: a table's first query without SQL), and a plain
//!   read (sum) of the same values as a memory-bandwidth baseline.
//! - `sql_small_batches/W1/ours`: `sql/W1/ours` with W1 in 98 batches of 2,048 rows (196 list
//!   columns for the row-verdict cache).
//! - `sql_threads/{W1,W2}/ours`: same query, default session (all cores, default
//!   `target_partitions`, default `sets.parallel_min_values`, global rayon pool).
//! - `count/{W1,W2,W3}/{builtin,ours,ours_cold}`: `cardinality(array_intersect(a, b))` vs
//!   `list_intersect_count(a, b)`, one core.
//! - `agg/gcide/*`: conjunctive queries of the TREC 2005 Terabyte efficiency log
//!   (`terabyte05-eff`) over the gcide postings, one core; skipped with a note when
//!   `bench-data/` is absent (build it with `benches/data/build.sh`).
//!
//! Workloads: rows of two strictly increasing `list<uint32>` columns `a`, `b`; per row
//! |a|, |b| are drawn log-uniformly, exactly round(0.2 * min(|a|, |b|)) values are common,
//! values are a random interleaving of the common / a-only / b-only values with gaps uniform
//! in 1..=64, from `StdRng::seed_from_u64(seed)` (rand 0.9):
//!   W1 (seed 1): 200,000 rows, |a|, |b| in 10..1000
//!   W2 (seed 2):   2,000 rows, |a|, |b| in 1e3..1e5
//!   W3 (seed 3):   5,000 rows, |a| in 5..50, |b| in 5e3..5e4
//! MemTable batches hold 8,192 rows (W2, W3: one batch).

use std::collections::HashMap;
use std::hint::black_box;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use criterion::{BatchSize, BenchmarkGroup, Criterion, SamplingMode, measurement::WallTime};
use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, RecordBatch, StringArray, UInt32Array,
};
use datafusion::arrow::buffer::{OffsetBuffer, ScalarBuffer};
use datafusion::arrow::datatypes::{DataType, Field, Schema, UInt32Type, UInt64Type};
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::AggregateUDFImpl;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::kernels::{self as cpu, Kernel};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------------------------------------
// Workloads
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Copy)]
struct Shape {
    name: &'static str,
    seed: u64,
    rows: usize,
    a: (f64, f64),
    b: (f64, f64),
}

const SHAPES: [Shape; 3] = [
    Shape {
        name: "W1",
        seed: 1,
        rows: 200_000,
        a: (10.0, 1000.0),
        b: (10.0, 1000.0),
    },
    Shape {
        name: "W2",
        seed: 2,
        rows: 2_000,
        a: (1e3, 1e5),
        b: (1e3, 1e5),
    },
    Shape {
        name: "W3",
        seed: 3,
        rows: 5_000,
        a: (5.0, 50.0),
        b: (5e3, 5e4),
    },
];

const BATCH_ROWS: usize = 8192;
const COMMON_FRACTION: f64 = 0.2;
const MAX_GAP: u32 = 64;

/// One generated workload: two list columns and the exact total intersection size.
struct Workload {
    shape: Shape,
    a: ListArray,
    b: ListArray,
    expected_total: u64,
}

impl Workload {
    fn values(&self) -> u64 {
        (self.a.values().len() + self.b.values().len()) as u64
    }
}

fn log_uniform(rng: &mut StdRng, (lo, hi): (f64, f64)) -> usize {
    let u: f64 = rng.random();
    (lo.ln() + u * (hi.ln() - lo.ln())).exp().round() as usize
}

/// One row's two strictly increasing lists of `la` and `lb` values, exactly
/// round(COMMON_FRACTION * min(la, lb)) of them common: a random interleaving of the common,
/// a-only and b-only values with gaps uniform in 1..=MAX_GAP from a start below 1,000, passed
/// in increasing order to `emit(value, in_a, in_b)`. Returns the number of common values.
fn pair_values(
    rng: &mut StdRng,
    labels: &mut Vec<u8>,
    la: usize,
    lb: usize,
    mut emit: impl FnMut(u32, bool, bool),
) -> u64 {
    let c = (COMMON_FRACTION * la.min(lb) as f64).round() as usize;
    labels.clear();
    labels.extend(std::iter::repeat_n(0u8, c));
    labels.extend(std::iter::repeat_n(1u8, la - c));
    labels.extend(std::iter::repeat_n(2u8, lb - c));
    labels.shuffle(rng);
    let mut v: u32 = rng.random_range(0..1000);
    for &l in labels.iter() {
        v += rng.random_range(1..=MAX_GAP);
        emit(v, l != 2, l != 1);
    }
    c as u64
}

fn generate(shape: Shape) -> Workload {
    let mut rng = StdRng::seed_from_u64(shape.seed);
    let (mut oa, mut ob) = (vec![0i32], vec![0i32]);
    let (mut va, mut vb) = (Vec::<u32>::new(), Vec::<u32>::new());
    let mut labels = Vec::new();
    let mut expected_total = 0u64;
    for _ in 0..shape.rows {
        let la = log_uniform(&mut rng, shape.a);
        let lb = log_uniform(&mut rng, shape.b);
        expected_total += pair_values(&mut rng, &mut labels, la, lb, |v, in_a, in_b| {
            if in_a {
                va.push(v);
            }
            if in_b {
                vb.push(v);
            }
        });
        oa.push(va.len() as i32);
        ob.push(vb.len() as i32);
    }
    let list = |o: Vec<i32>, v: Vec<u32>| {
        ListArray::new(
            Arc::new(Field::new_list_field(DataType::UInt32, true)),
            OffsetBuffer::new(ScalarBuffer::from(o)),
            Arc::new(UInt32Array::from(v)),
            None,
        )
    };
    Workload {
        shape,
        a: list(oa, va),
        b: list(ob, vb),
        expected_total,
    }
}

fn workload(i: usize) -> &'static Workload {
    static W: [OnceLock<Workload>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    W[i].get_or_init(|| {
        let t = std::time::Instant::now();
        let w = generate(SHAPES[i]);
        eprintln!(
            "[data] {}: {} rows, {} values (a {}, b {}), {} common, generated in {:.1?}",
            w.shape.name,
            w.shape.rows,
            w.values(),
            w.a.values().len(),
            w.b.values().len(),
            w.expected_total,
            t.elapsed()
        );
        w
    })
}

/// Row `i` of a `list<uint32>` column, straight from the Arrow buffers.
#[inline]
fn row<'a>(values: &'a [u32], offsets: &[i32], i: usize) -> &'a [u32] {
    &values[offsets[i] as usize..offsets[i + 1] as usize]
}

fn rows(w: &'static Workload) -> Vec<(&'static [u32], &'static [u32])> {
    let (av, ao) = (
        w.a.values().as_primitive::<UInt32Type>().values(),
        w.a.value_offsets(),
    );
    let (bv, bo) = (
        w.b.values().as_primitive::<UInt32Type>().values(),
        w.b.value_offsets(),
    );
    (0..w.a.len())
        .map(|i| (row(av, ao, i), row(bv, bo, i)))
        .collect()
}

fn memtable(w: &Workload) -> Arc<MemTable> {
    memtable_in(w, BATCH_ROWS)
}

/// `w` as a MemTable of one partition in batches of `batch_rows` rows.
fn memtable_in(w: &Workload, batch_rows: usize) -> Arc<MemTable> {
    let schema = Arc::new(Schema::new(vec![
        Field::new("a", w.a.data_type().clone(), true),
        Field::new("b", w.b.data_type().clone(), true),
    ]));
    let mut batches = Vec::new();
    let mut start = 0;
    while start < w.a.len() {
        let len = batch_rows.min(w.a.len() - start);
        let cols: Vec<ArrayRef> = vec![
            Arc::new(w.a.slice(start, len)),
            Arc::new(w.b.slice(start, len)),
        ];
        batches.push(RecordBatch::try_new(Arc::clone(&schema), cols).unwrap());
        start += len;
    }
    Arc::new(MemTable::try_new(schema, vec![batches]).unwrap())
}

// ---------------------------------------------------------------------------------------------
// Sessions and runtimes
// ---------------------------------------------------------------------------------------------

/// One core: target_partitions = 1, no intra-batch threading, current-thread tokio.
struct OneCore {
    rt: tokio::runtime::Runtime,
    ctx: SessionContext,
    pool: rayon::ThreadPool,
}

fn one_core() -> OneCore {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = SessionConfig::new().with_target_partitions(1);
    let state = SessionStateBuilder::new()
        .with_config(cfg)
        .with_default_features()
        .with_sets()
        .build();
    let ctx = SessionContext::new_with_state(state);
    rt.block_on(async {
        ctx.sql("SET sets.parallel_min_values = 0")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
    });
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    OneCore { rt, ctx, pool }
}

impl OneCore {
    fn run(&self, sql: &str) -> Vec<RecordBatch> {
        self.pool.install(|| {
            self.rt
                .block_on(async { self.ctx.sql(sql).await.unwrap().collect().await.unwrap() })
        })
    }
}

/// Sum of list lengths (or of u64 values) of column 0.
fn total(batches: &[RecordBatch]) -> u64 {
    batches
        .iter()
        .map(|b| {
            let c = b.column(0);
            match c.data_type() {
                DataType::List(_) => {
                    let l = c.as_list::<i32>();
                    let o = l.value_offsets();
                    (o[l.len()] - o[0]) as u64
                }
                DataType::UInt64 => c.as_primitive::<UInt64Type>().values().iter().sum(),
                DataType::Int32 => c
                    .as_primitive::<datafusion::arrow::datatypes::Int32Type>()
                    .values()
                    .iter()
                    .map(|&v| v as u64)
                    .sum(),
                DataType::Int64 => c
                    .as_primitive::<datafusion::arrow::datatypes::Int64Type>()
                    .values()
                    .iter()
                    .map(|&v| v as u64)
                    .sum(),
                other => panic!("unexpected result type {other}"),
            }
        })
        .sum()
}

fn configure(g: &mut BenchmarkGroup<'_, WallTime>) {
    g.sampling_mode(SamplingMode::Flat);
    g.sample_size(10);
}

// ---------------------------------------------------------------------------------------------
// Groups
// ---------------------------------------------------------------------------------------------

/// A deep copy of `l`: new buffers, so nothing cached about the old ones applies.
fn deep_copy(l: &ListArray) -> ListArray {
    let values = l.values().as_primitive::<UInt32Type>().values().to_vec();
    ListArray::new(
        Arc::new(Field::new_list_field(DataType::UInt32, true)),
        OffsetBuffer::new(ScalarBuffer::from(l.value_offsets().to_vec())),
        Arc::new(UInt32Array::from(values)),
        None,
    )
}

/// One row of 2^16 values: large enough for the crate's row-verdict cache, whose lookups drop
/// entries of buffers nobody else holds.
fn flush_table() -> Arc<MemTable> {
    let values: Vec<u32> = (0..1u32 << 16).collect();
    let list = ListArray::new(
        Arc::new(Field::new_list_field(DataType::UInt32, true)),
        OffsetBuffer::from_lengths([values.len()]),
        Arc::new(UInt32Array::from(values)),
        None,
    );
    let schema = Arc::new(Schema::new(vec![Field::new(
        "a",
        list.data_type().clone(),
        true,
    )]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(list)]).unwrap();
    Arc::new(MemTable::try_new(schema, vec![vec![batch]]).unwrap())
}

/// `variants`: (name, select expression, cold). A cold variant runs every iteration on a
/// fresh deep copy of the table (copied and registered outside the timed part), so per-buffer
/// caches (the crate's row-verdict cache) start empty as on a table's first query; a warm
/// variant repeats the query on the same buffers, as criterion does by default.
fn bench_sql(c: &mut Criterion, group: &str, variants: &[(&str, &str, bool)]) {
    for (i, shape) in SHAPES.iter().enumerate() {
        let mut g = c.benchmark_group(format!("{group}/{}", shape.name));
        configure(&mut g);
        let setup: OnceLock<OneCore> = OnceLock::new();
        for &(name, expr, cold) in variants {
            // Criterion calls the closure once per sample: check the result only once.
            let mut checked = false;
            g.bench_function(name, |bch| {
                let w = workload(i);
                let oc = setup.get_or_init(|| {
                    let oc = one_core();
                    oc.ctx.register_table("t", memtable(w)).unwrap();
                    oc.ctx.register_table("flush", flush_table()).unwrap();
                    oc
                });
                if !cold {
                    let sql = format!("SELECT {expr} FROM t");
                    if !checked {
                        checked = true;
                        let got = total(&oc.run(&sql));
                        assert_eq!(
                            got, w.expected_total,
                            "{group}/{}/{name}: wrong result",
                            shape.name
                        );
                    }
                    bch.iter(|| black_box(oc.run(&sql)));
                } else {
                    let sql = format!("SELECT {expr} FROM t_cold");
                    let fresh = || {
                        let copy = Workload {
                            shape: w.shape,
                            a: deep_copy(&w.a),
                            b: deep_copy(&w.b),
                            expected_total: w.expected_total,
                        };
                        // Drop the previous copy here, outside the timing: deregister it, then
                        // run one query over a large-enough column so the row-verdict cache
                        // releases its stale entries (and their buffers) now rather than in
                        // the next timed query.
                        oc.ctx.deregister_table("t_cold").unwrap();
                        oc.run("SELECT list_intersect_count(a, a) FROM flush");
                        oc.ctx.register_table("t_cold", memtable(&copy)).unwrap();
                    };
                    if !checked {
                        checked = true;
                        fresh();
                        let got = total(&oc.run(&sql));
                        assert_eq!(
                            got, w.expected_total,
                            "{group}/{}/{name}: wrong result",
                            shape.name
                        );
                    }
                    bch.iter_batched(fresh, |()| oc.run(&sql), BatchSize::PerIteration);
                    oc.ctx.deregister_table("t_cold").unwrap();
                }
            });
        }
        g.finish();
    }
}

/// `sql_small_batches/W1/ours`: `sql/W1/ours` over W1 in batches of 2,048 rows (98 batches,
/// 196 list columns): a table queried again whose columns outnumber a small row-verdict
/// cache (a scan evicts each entry before its next use), as DataFusion's slices of a large
/// batch do. One core, as `sql/`.
fn bench_sql_small_batches(c: &mut Criterion) {
    let mut g = c.benchmark_group("sql_small_batches/W1");
    configure(&mut g);
    let setup: OnceLock<OneCore> = OnceLock::new();
    g.bench_function("ours", |bch| {
        let w = workload(0);
        let oc = setup.get_or_init(|| {
            let oc = one_core();
            oc.ctx.register_table("t", memtable_in(w, 2048)).unwrap();
            let got = total(&oc.run("SELECT list_intersect(a, b) FROM t"));
            assert_eq!(got, w.expected_total, "sql_small_batches/W1: wrong result");
            oc
        });
        bch.iter(|| black_box(oc.run("SELECT list_intersect(a, b) FROM t")));
    });
    g.finish();
}

fn bench_sql_threads(c: &mut Criterion) {
    for (i, shape) in SHAPES.iter().enumerate().take(2) {
        let mut g = c.benchmark_group(format!("sql_threads/{}", shape.name));
        configure(&mut g);
        let mut checked = false;
        let setup: OnceLock<(tokio::runtime::Runtime, SessionContext)> = OnceLock::new();
        g.bench_function("ours", |bch| {
            let (rt, ctx) = setup.get_or_init(|| {
                let w = workload(i);
                let rt = tokio::runtime::Builder::new_multi_thread()
                    .enable_all()
                    .build()
                    .unwrap();
                let ctx = datafusion_sets::new_context();
                ctx.register_table("t", memtable(w)).unwrap();
                (rt, ctx)
            });
            let run = || {
                rt.block_on(async {
                    ctx.sql("SELECT list_intersect(a, b) FROM t")
                        .await
                        .unwrap()
                        .collect()
                        .await
                        .unwrap()
                })
            };
            if !checked {
                checked = true;
                assert_eq!(total(&run()), workload(i).expected_total);
                eprintln!(
                    "[sql_threads] tokio workers = {}, target_partitions = {}, rayon threads = {}",
                    rt.metrics().num_workers(),
                    ctx.copied_config().target_partitions(),
                    rayon::current_num_threads()
                );
            }
            bch.iter(|| black_box(run()));
        });
        g.finish();
    }
}

fn bench_kernels(c: &mut Criterion) {
    let mut noted = false;
    for (i, shape) in SHAPES.iter().enumerate() {
        let mut g = c.benchmark_group(format!("kernel/{}", shape.name));
        configure(&mut g);
        let pairs: OnceLock<Vec<(&[u32], &[u32])>> = OnceLock::new();
        let kernels: Vec<(&str, Option<Kernel>)> = std::iter::once(("auto", None))
            .chain(Kernel::ALL.iter().map(|k| (k.name(), Some(*k))))
            .collect();
        for (name, kernel) in kernels {
            let mut checked = false;
            g.bench_function(name, |bch| {
                let w = workload(i);
                let p = pairs.get_or_init(|| rows(w));
                if !noted {
                    noted = true;
                    for k in Kernel::ALL {
                        if !k.is_available() {
                            eprintln!(
                                "[kernel] {} not available on this CPU: it runs its fallback",
                                k.name()
                            );
                        }
                    }
                }
                let mut out: Vec<u32> = Vec::with_capacity(1 << 16);
                let run = |out: &mut Vec<u32>| {
                    let mut n = 0usize;
                    for &(a, b) in p {
                        out.clear();
                        n += match kernel {
                            None => cpu::intersect_auto(a, b, out),
                            Some(k) => cpu::intersect(k, a, b, out),
                        };
                    }
                    n
                };
                if !checked {
                    checked = true;
                    assert_eq!(run(&mut out) as u64, w.expected_total, "kernel {name}");
                }
                bch.iter(|| black_box(run(&mut out)));
            });
        }
        g.finish();
    }
}

/// Cells of the hybrid policy's sweep: (shorter length, longer / shorter).
/// One sweep cell's data: the values, (start, length) of each list (pairs adjacent), and
/// the total intersection size.
type SweepData<T> = (Vec<T>, Vec<(usize, usize)>, u64);

const SWEEP_CELLS: [(usize, usize); 40] = [
    (1, 1),
    (1, 8),
    (1, 16),
    (2, 8),
    (2, 16),
    (4, 4),
    (4, 8),
    (4, 16),
    (8, 1),
    (8, 16),
    (8, 32),
    (12, 1),
    (12, 48),
    (16, 1),
    (16, 4),
    (16, 16),
    (16, 32),
    (16, 64),
    (16, 96),
    (32, 1),
    (32, 32),
    (32, 64),
    (32, 128),
    (64, 1),
    (64, 32),
    (64, 64),
    (64, 128),
    (128, 64),
    (128, 128),
    (128, 256),
    (256, 1),
    (256, 128),
    (256, 256),
    (256, 512),
    (1024, 1),
    (1024, 8),
    (1024, 192),
    (1024, 256),
    (1024, 512),
    (1024, 1024),
];

/// How many pairs of `short` and `long` values make a sweep cell's ~16 M values.
fn sweep_rows(short: usize, long: usize) -> usize {
    (16_000_000 / (short + long)).max(1)
}

/// Pairs of strictly increasing lists of exactly `short` and `long` values (20% of the
/// shorter in common, gaps 1..=64), back to back in one buffer of about 16 M values (larger
/// than this machine's L3 for u32, so each pass streams from memory as a column scan does).
fn sweep_pairs<T: Copy + TryFrom<u64>>(short: usize, long: usize, seed: u64) -> SweepData<T> {
    let mut rng = StdRng::seed_from_u64(seed);
    let n = sweep_rows(short, long);
    let (mut values, mut spans, mut common) = (Vec::new(), Vec::new(), 0u64);
    let mut labels = Vec::new();
    for _ in 0..n {
        let (mut a, mut b) = (Vec::new(), Vec::new());
        common += pair_values(&mut rng, &mut labels, short, long, |v, in_a, in_b| {
            let x = T::try_from(u64::from(v)).ok().expect("sweep value fits");
            if in_a {
                a.push(x);
            }
            if in_b {
                b.push(x);
            }
        });
        spans.push((values.len(), short));
        values.extend_from_slice(&a);
        spans.push((values.len(), long));
        values.extend_from_slice(&b);
    }
    (values, spans, common)
}

/// `sweep/{u32,u64}/{short}x{ratio}/{auto,scalar,galloping,avx2,avx512,vp2intersect}`: the
/// kernels of the hybrid policy (`cpu::choose_kernel`) on pairs of fixed lengths, one core;
/// criterion's throughput is pairs per second. Thresholds in `src/backend/cpu/mod.rs` come
/// from this sweep.
fn bench_sweep(c: &mut Criterion) {
    fn width<T: cpu::SetElem + TryFrom<u64>>(c: &mut Criterion, name: &str) {
        let kernels = [
            Kernel::Scalar,
            Kernel::Galloping,
            Kernel::Avx2,
            Kernel::Avx512,
            Kernel::Vp2intersect,
        ];
        for (cell, &(short, ratio)) in SWEEP_CELLS.iter().enumerate() {
            let long = short * ratio;
            let mut g = c.benchmark_group(format!("sweep/{name}/{short}x{ratio}"));
            configure(&mut g);
            g.warm_up_time(Duration::from_millis(200));
            g.measurement_time(Duration::from_millis(600));
            let data: OnceLock<SweepData<T>> = OnceLock::new();
            g.throughput(criterion::Throughput::Elements(
                sweep_rows(short, long) as u64
            ));
            let variants =
                std::iter::once(("auto", None)).chain(kernels.iter().map(|k| (k.name(), Some(*k))));
            for (kname, kernel) in variants {
                if kernel == Some(Kernel::Scalar) && long > 64 {
                    continue;
                }
                let mut checked = false;
                g.bench_function(kname, |bch| {
                    let (values, spans, common) =
                        data.get_or_init(|| sweep_pairs::<T>(short, long, 100 + cell as u64));
                    let mut out: Vec<T> = Vec::with_capacity(short + 64);
                    let run = |out: &mut Vec<T>| {
                        let mut n = 0usize;
                        for p in spans.chunks_exact(2) {
                            let a = &values[p[0].0..p[0].0 + p[0].1];
                            let b = &values[p[1].0..p[1].0 + p[1].1];
                            out.clear();
                            n += match kernel {
                                None => cpu::intersect_auto(a, b, out),
                                Some(k) => cpu::intersect(k, a, b, out),
                            };
                        }
                        n as u64
                    };
                    if !checked {
                        checked = true;
                        assert_eq!(run(&mut out), *common, "{name} {short}x{ratio} {kname}");
                    }
                    bch.iter(|| black_box(run(&mut out)));
                });
            }
            g.finish();
        }
    }
    width::<u32>(c, "u32");
    width::<u64>(c, "u64");
}

fn bench_sortedness(c: &mut Criterion) {
    for (i, shape) in SHAPES.iter().enumerate() {
        let mut g = c.benchmark_group(format!("check/{}", shape.name));
        configure(&mut g);
        let pairs: OnceLock<Vec<(&[u32], &[u32])>> = OnceLock::new();
        g.bench_function("sortedness", |bch| {
            let p = pairs.get_or_init(|| rows(workload(i)));
            bch.iter(|| {
                let mut strict = 0usize;
                for &(a, b) in p {
                    strict += (cpu::sortedness(a) == cpu::Sortedness::Strict) as usize;
                    strict += (cpu::sortedness(b) == cpu::Sortedness::Strict) as usize;
                }
                assert_eq!(strict, 2 * p.len());
                black_box(strict)
            });
        });
        // The cold path of the SQL function without SQL: each row checked, then intersected;
        // or checked by the kernel itself where it can be (what the engine does now).
        type RowFn = fn(&[u32], &[u32], &mut Vec<u32>) -> usize;
        let variants: [(&str, RowFn); 2] = [
            ("check_then_auto", |a, b, out| {
                assert!(
                    cpu::sortedness(a) == cpu::Sortedness::Strict
                        && cpu::sortedness(b) == cpu::Sortedness::Strict
                );
                cpu::intersect_auto(a, b, out)
            }),
            ("checked_auto", |a, b, out| {
                let (a, b) = if a.len() <= b.len() { (a, b) } else { (b, a) };
                cpu::intersect_auto_checked(a, b, out).expect("sorted rows")
            }),
        ];
        for (name, row) in variants {
            g.bench_function(name, |bch| {
                let w = workload(i);
                let p = pairs.get_or_init(|| rows(w));
                let mut out: Vec<u32> = Vec::with_capacity(1 << 16);
                let mut run = || {
                    let mut n = 0usize;
                    for &(a, b) in p {
                        out.clear();
                        n += row(a, b, &mut out);
                    }
                    n
                };
                assert_eq!(run() as u64, w.expected_total, "check/{name}");
                bch.iter(|| black_box(run()));
            });
        }
        // Baseline: read the same values once (wrapping sum), to tell a check bound by memory
        // bandwidth from one bound by compute.
        g.bench_function("read", |bch| {
            let p = pairs.get_or_init(|| rows(workload(i)));
            bch.iter(|| {
                let mut sum = 0u32;
                for &(a, b) in p {
                    sum = a.iter().chain(b).fold(sum, |s, &v| s.wrapping_add(v));
                }
                black_box(sum)
            });
        });
        g.finish();
    }
}

// ---------------------------------------------------------------------------------------------
// agg/gcide: real conjunctive queries
// ---------------------------------------------------------------------------------------------

fn bench_data_dir() -> PathBuf {
    std::env::var_os("SETS_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-data"))
}

/// `common.tokenize` of the shared dataset builders: lowercase, `[a-z0-9]+` runs.
fn tokenize(text: &str) -> Vec<String> {
    text.to_lowercase()
        .split(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit()))
        .filter(|t| !t.is_empty())
        .map(str::to_owned)
        .collect()
}

struct Gcide {
    oc: OneCore,
    /// Per query: its distinct terms present in the index (at least 2), in query order.
    queries: Vec<Vec<String>>,
    /// term -> row of the postings table (for the kernel-only variant).
    postings: HashMap<String, (usize, usize)>,
    values: Vec<u32>,
    skipped: (usize, usize),
}

fn gcide_paths() -> (PathBuf, PathBuf) {
    let dir = bench_data_dir();
    (
        dir.join("gcide/postings.parquet"),
        dir.join("queries/queries.parquet"),
    )
}

fn load_gcide(n_queries: usize) -> Gcide {
    let (pp, qp) = gcide_paths();
    let oc = one_core();
    let (postings_batches, query_batches) = oc.rt.block_on(async {
        let p = oc
            .ctx
            .read_parquet(pp.to_str().unwrap(), ParquetReadOptions::default())
            .await
            .unwrap()
            .select_columns(&["term", "doc_ids"])
            .unwrap()
            .collect()
            .await
            .unwrap();
        oc.ctx
            .register_parquet(
                "queries",
                qp.to_str().unwrap(),
                ParquetReadOptions::default(),
            )
            .await
            .unwrap();
        let q = oc
            .ctx
            .sql("SELECT text FROM queries WHERE source = 'terabyte05-eff'")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        (p, q)
    });
    // Postings: one contiguous copy for the kernel-only variant.
    let mut postings = HashMap::new();
    let mut values = Vec::new();
    for b in &postings_batches {
        let terms = b
            .column(0)
            .as_any()
            .downcast_ref::<StringArray>()
            .cloned()
            .unwrap_or_else(|| {
                let c = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
                c.as_string::<i32>().clone()
            });
        let lists = b.column(1).as_list::<i32>();
        for i in 0..b.num_rows() {
            let l = lists.value(i);
            let v = l.as_primitive::<UInt32Type>().values();
            postings.insert(terms.value(i).to_owned(), (values.len(), v.len()));
            values.extend_from_slice(v);
        }
    }
    let schema = postings_batches[0].schema();
    let table = MemTable::try_new(schema, vec![postings_batches]).unwrap();
    oc.ctx.register_table("postings", Arc::new(table)).unwrap();

    let mut queries = Vec::new();
    let (mut seen, mut too_few) = (0usize, 0usize);
    'outer: for b in &query_batches {
        let texts = b.column(0).as_string_view_opt().map(|s| {
            (0..s.len())
                .map(|i| s.value(i).to_owned())
                .collect::<Vec<_>>()
        });
        let texts = texts.unwrap_or_else(|| {
            let s = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
            let s = s.as_string::<i32>();
            (0..s.len()).map(|i| s.value(i).to_owned()).collect()
        });
        for t in texts {
            seen += 1;
            let mut terms: Vec<String> = Vec::new();
            for tok in tokenize(&t) {
                if postings.contains_key(&tok) && !terms.contains(&tok) {
                    terms.push(tok);
                }
            }
            if terms.len() >= 2 {
                queries.push(terms);
                if queries.len() == n_queries {
                    break 'outer;
                }
            } else {
                too_few += 1;
            }
        }
    }
    Gcide {
        oc,
        queries,
        postings,
        values,
        skipped: (seen, too_few),
    }
}

fn in_list(terms: &[String]) -> String {
    terms
        .iter()
        .map(|t| format!("'{t}'"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// A cross join of one single-term scan per term, with `f` combining their doc_ids.
fn nested_sql(terms: &[String], f: impl Fn(&[String]) -> String) -> String {
    let cols: Vec<String> = (0..terms.len()).map(|i| format!("p{i}.doc_ids")).collect();
    let from: Vec<String> = (0..terms.len()).map(|i| format!("postings p{i}")).collect();
    let filt: Vec<String> = terms
        .iter()
        .enumerate()
        .map(|(i, t)| format!("p{i}.term = '{t}'"))
        .collect();
    format!(
        "SELECT {} FROM {} WHERE {}",
        f(&cols),
        from.join(", "),
        filt.join(" AND ")
    )
}

fn bench_gcide(c: &mut Criterion) {
    let n_queries: usize = std::env::var("SETS_BENCH_QUERIES")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1000);
    let (pp, qp) = gcide_paths();
    if !pp.exists() || !qp.exists() {
        eprintln!(
            "[agg/gcide] skipped: {} or {} is missing; build them with benches/data/build.sh",
            pp.display(),
            qp.display()
        );
        return;
    }
    static DATA: OnceLock<Gcide> = OnceLock::new();
    let get = || -> &'static Gcide {
        DATA.get_or_init(|| {
            let g = load_gcide(n_queries);
            let lens: Vec<usize> = g.queries.iter().map(|q| q.len()).collect();
            let post: usize = g
                .queries
                .iter()
                .flat_map(|q| q.iter().map(|t| g.postings[t].1))
                .sum();
            eprintln!(
                "[agg/gcide] {} terms; {} queries with >= 2 indexed terms (of the first {} \
                 terabyte05-eff queries; {} had < 2), {} terms, {} postings read in all",
                g.postings.len(),
                g.queries.len(),
                g.skipped.0,
                g.skipped.1,
                lens.iter().sum::<usize>(),
                post
            );
            g
        })
    };
    let mut g = c.benchmark_group("agg/gcide");
    configure(&mut g);
    type Variant = (&'static str, fn(&[String]) -> String);
    let variants: [Variant; 4] = [
        ("ours_agg", |t| {
            format!(
                "SELECT list_intersect_agg(doc_ids) FROM postings WHERE term IN ({})",
                in_list(t)
            )
        }),
        ("scan_only", |t| {
            format!(
                "SELECT doc_ids FROM postings WHERE term IN ({})",
                in_list(t)
            )
        }),
        ("builtin_nested", |t| {
            nested_sql(t, |cols| {
                cols[1..].iter().fold(cols[0].clone(), |acc, c| {
                    format!("array_intersect({acc}, {c})")
                })
            })
        }),
        ("ours_nary", |t| {
            nested_sql(t, |cols| format!("list_intersect({})", cols.join(", ")))
        }),
    ];
    let expected: OnceLock<u64> = OnceLock::new();
    // The posting lists of every query, resolved once (the kernel variant times only the
    // k-way intersections).
    let resolved: OnceLock<Vec<Vec<&[u32]>>> = OnceLock::new();
    let lists_of = |d: &'static Gcide| {
        resolved.get_or_init(|| {
            d.queries
                .iter()
                .map(|q| {
                    q.iter()
                        .map(|t| {
                            let (o, l) = d.postings[t];
                            &d.values[o..o + l]
                        })
                        .collect()
                })
                .collect()
        })
    };
    let kernel_total = |queries: &[Vec<&[u32]>]| {
        let mut out = Vec::new();
        let mut scratch = Vec::new();
        let mut lists: Vec<&[u32]> = Vec::new();
        let mut n = 0u64;
        for q in queries {
            lists.clear();
            lists.extend_from_slice(q);
            out.clear();
            n += cpu::intersect_kway(&mut lists, &mut out, &mut scratch) as u64;
        }
        n
    };
    for (name, make) in variants {
        let mut checked = false;
        g.bench_function(name, |bch| {
            let d = get();
            let sqls: Vec<String> = d.queries.iter().map(|q| make(q)).collect();
            let run = || sqls.iter().map(|s| total(&d.oc.run(s))).sum::<u64>();
            if !checked {
                checked = true;
                let exp = *expected.get_or_init(|| kernel_total(lists_of(d)));
                let got = run();
                if name != "scan_only" {
                    assert_eq!(
                        got, exp,
                        "agg/gcide/{name}: results differ from the kernel's"
                    );
                }
            }
            bch.iter(|| black_box(run()));
        });
    }
    g.bench_function("kernel", |bch| {
        let q = lists_of(get());
        bch.iter(|| black_box(kernel_total(q)));
    });
    g.finish();
    let exp = *expected.get_or_init(|| kernel_total(lists_of(get())));
    bench_gcide_grouped(c, get(), exp);
}

/// `list_intersect_agg` over DataFusion's adapter for plain accumulators: the function as it is
/// but without its `GroupsAccumulator`, so `GROUP BY` goes through
/// `GroupsAccumulatorAdapter` (the state before the groups accumulator; side by side).
#[derive(Debug, PartialEq, Eq, Hash)]
struct AdapterAgg(datafusion_sets::udf::ListIntersectAgg);

impl AggregateUDFImpl for AdapterAgg {
    fn name(&self) -> &str {
        "list_intersect_agg_adapter"
    }
    fn signature(&self) -> &datafusion::logical_expr::Signature {
        self.0.signature()
    }
    fn coerce_types(&self, t: &[DataType]) -> datafusion::common::Result<Vec<DataType>> {
        self.0.coerce_types(t)
    }
    fn return_type(&self, t: &[DataType]) -> datafusion::common::Result<DataType> {
        self.0.return_type(t)
    }
    fn state_fields(
        &self,
        a: datafusion::logical_expr::function::StateFieldsArgs,
    ) -> datafusion::common::Result<Vec<datafusion::arrow::datatypes::FieldRef>> {
        self.0.state_fields(a)
    }
    fn accumulator(
        &self,
        a: datafusion::logical_expr::function::AccumulatorArgs,
    ) -> datafusion::common::Result<Box<dyn datafusion::logical_expr::Accumulator>> {
        self.0.accumulator(a)
    }
}

/// All queries in one SQL statement: a `(qid, term)` table joined with the postings and
/// grouped by query.
fn bench_gcide_grouped(c: &mut Criterion, d: &'static Gcide, expected: u64) {
    let mut qids = Vec::new();
    let mut terms = Vec::new();
    for (i, q) in d.queries.iter().enumerate() {
        for t in q {
            qids.push(i as u32);
            terms.push(t.clone());
        }
    }
    let schema = Arc::new(Schema::new(vec![
        Field::new("qid", DataType::UInt32, false),
        Field::new("term", DataType::Utf8, false),
    ]));
    let batch = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(UInt32Array::from(qids)),
            Arc::new(StringArray::from(terms)),
        ],
    )
    .unwrap();
    let table = MemTable::try_new(schema, vec![vec![batch]]).unwrap();
    d.oc.ctx.deregister_table("qterms").unwrap();
    d.oc.ctx.register_table("qterms", Arc::new(table)).unwrap();
    d.oc.ctx
        .register_udaf(datafusion::logical_expr::AggregateUDF::new_from_impl(
            AdapterAgg(datafusion_sets::udf::ListIntersectAgg::new()),
        ));
    let mut g = c.benchmark_group("agg/gcide_grouped");
    configure(&mut g);
    for (name, f) in [
        ("groups_accumulator", "list_intersect_agg"),
        ("adapter", "list_intersect_agg_adapter"),
    ] {
        let sql = format!(
            "SELECT {f}(p.doc_ids) AS r, q.qid FROM qterms q JOIN postings p ON q.term = p.term \
             GROUP BY q.qid"
        );
        let got = total(&d.oc.run(&sql));
        assert_eq!(
            got, expected,
            "agg/gcide_grouped/{name}: results differ from the kernel's"
        );
        g.bench_function(name, |bch| bch.iter(|| black_box(total(&d.oc.run(&sql)))));
    }
    g.bench_function("join_only", |bch| {
        let sql = "SELECT p.doc_ids, q.qid FROM qterms q JOIN postings p ON q.term = p.term";
        bch.iter(|| black_box(total(&d.oc.run(sql))))
    });
    g.finish();
}

// ---------------------------------------------------------------------------------------------
// Dump for external drivers
// ---------------------------------------------------------------------------------------------

/// `<dir>/W{1,2,3}.bin`, little endian: u64 rows, u64 expected total; then per row u32 |a|,
/// u32 |b|, |a| u32 values, |b| u32 values.
fn dump(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    for i in 0..SHAPES.len() {
        let w = workload(i);
        let path = dir.join(format!("{}.bin", w.shape.name));
        let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
        f.write_all(&(w.shape.rows as u64).to_le_bytes()).unwrap();
        f.write_all(&w.expected_total.to_le_bytes()).unwrap();
        for (a, b) in rows(w) {
            f.write_all(&(a.len() as u32).to_le_bytes()).unwrap();
            f.write_all(&(b.len() as u32).to_le_bytes()).unwrap();
            for v in a.iter().chain(b) {
                f.write_all(&v.to_le_bytes()).unwrap();
            }
        }
        f.flush().unwrap();
        eprintln!("[dump] {}", path.display());
    }
}

fn main() {
    if let Some(dir) = std::env::var_os("SETS_BENCH_DUMP") {
        dump(Path::new(&dir));
        return;
    }
    let mut c = Criterion::default()
        .warm_up_time(Duration::from_millis(500))
        .measurement_time(Duration::from_secs(2))
        .configure_from_args();
    bench_sql(
        &mut c,
        "sql",
        &[
            ("builtin", "array_intersect(a, b)", false),
            ("ours", "list_intersect(a, b)", false),
            ("ours_cold", "list_intersect(a, b)", true),
        ],
    );
    bench_kernels(&mut c);
    bench_sweep(&mut c);
    bench_sortedness(&mut c);
    bench_sql_threads(&mut c);
    bench_sql_small_batches(&mut c);
    bench_sql(
        &mut c,
        "count",
        &[
            ("builtin", "cardinality(array_intersect(a, b))", false),
            ("ours", "list_intersect_count(a, b)", false),
            ("ours_cold", "list_intersect_count(a, b)", true),
        ],
    );
    bench_gcide(&mut c);
    c.final_summary();
}
