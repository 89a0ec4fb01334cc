//! The exact set similarity join on real data, end to end through SQL (criterion for the
//! small cases, a plain timed loop for the large ones; `harness = false`).
//!
//! Run (needs `bench-data/`, see `benches/data/build.sh`):
//!   cargo bench --bench similarity_join                       # all cases (about 10 minutes)
//!   cargo bench --bench similarity_join -- debian              # criterion cases matching a filter
//!   SETS_BENCH_LARGE=0 cargo bench --bench similarity_join     # skip the large cases
//!   SETS_BENCH_LARGE_ONLY=1 cargo bench --bench similarity_join  # only the large cases
//!   SETS_BENCH_REPS=3 ...                                     # repetitions of each large case
//!   SETS_BENCH_LARGE_CASES=jaccard ...                        # large cases whose name contains it
//!   SETS_BENCH_CPU_KERNEL=scalar ...                          # `tuning.cpu_kernel` (verification kernel; --features tuning)
//!   SETS_BENCH_SPLIT_SCAN=0 ...                               # `tuning.similarity_join_split_scan` (--features tuning)
//!   SETS_BENCH_RATIO=41 ...                                   # one core vs all, alternating, with ceilings
//!
//! What one iteration measures: planning and running
//! `SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', measure, t)` on a session
//! where `sets` is an external table over `bench-data/<dataset>/sets.parquet`: reading and
//! decoding the Parquet file, the build (sets, token ranks, prefix indexes), the filter and
//! the verification of every candidate (`count(*)` builds no pair: the paper's output-count
//! mode, as in the reference join of issue 4). The small cases also run
//! `SELECT * FROM similarity_join(...)` (`pairs`: every pair materialized as a batch of
//! `left_id, right_id, similarity`, then dropped).
//!
//! Cases (issue 4's, with its reference times of a compiled single-threaded
//! AllPairs + PPJoin on this machine): `debian_deps` Jaccard >= 0.9 (0.09 s), `gcide_words`
//! Jaccard >= 0.8 (0.26 s), Jaccard >= 0.5 (4.5 s), Dice >= 0.5 (138 s). The first two are
//! criterion benchmarks (`similarity_join/<case>/<cores>/<output>`, 10 samples); the last two,
//! too long for criterion's sampling, run `SETS_BENCH_REPS` times (default 1) after one
//! untimed warm-up of the small case, printing each time and the minimum.
//!
//! Allocator: mimalloc with the `cli` feature (`cargo bench --features cli ...`), as in the
//! `dfsets` CLI; the system
//! allocator returned and re-faulted the build's buffers on every query (3-4 ms of a 36 ms
//! debian_deps query on this 2-core machine, benches/README.md).
//!
//! Cores: `1core` is `target_partitions = 1` on a current-thread tokio runtime (everything on
//! the calling thread); `allcores` is `target_partitions = nproc` on a multi-threaded runtime
//! with `nproc` workers. Every run's pair count is checked against the first one's.

use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use criterion::Criterion;
use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Int64Type};
use datafusion::execution::SessionStateBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;

#[cfg(feature = "cli")]
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn bench_data_dir() -> PathBuf {
    std::env::var_os("SETS_BENCH_DATA")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("bench-data"))
}

fn env_flag(name: &str) -> Option<bool> {
    std::env::var(name).ok().map(|v| v != "0" && !v.is_empty())
}

/// A session with `sets` registered over the dataset's Parquet file, and its runtime.
struct Engine {
    rt: tokio::runtime::Runtime,
    ctx: SessionContext,
}

impl Engine {
    fn new(path: &Path, cores: usize) -> Self {
        let rt = if cores == 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores)
                .enable_all()
                .build()
                .unwrap()
        };
        let state = SessionStateBuilder::new()
            .with_config(SessionConfig::new().with_target_partitions(cores))
            .with_default_features()
            .with_sets()
            .build();
        let ctx = SessionContext::new_with_state(state);
        let sql = format!(
            "CREATE EXTERNAL TABLE sets STORED AS PARQUET LOCATION '{}'",
            path.display()
        );
        rt.block_on(async { ctx.sql(&sql).await.unwrap().collect().await.unwrap() });
        if let Ok(kernel) = std::env::var("SETS_BENCH_CPU_KERNEL") {
            let sql = format!("SET tuning.cpu_kernel = '{kernel}'");
            rt.block_on(async { ctx.sql(&sql).await.unwrap().collect().await.unwrap() });
        }
        if let Some(split) = env_flag("SETS_BENCH_SPLIT_SCAN") {
            let sql = format!("SET tuning.similarity_join_split_scan = {split}");
            rt.block_on(async { ctx.sql(&sql).await.unwrap().collect().await.unwrap() });
        }
        Self { rt, ctx }
    }

    fn run(&self, sql: &str) -> Vec<RecordBatch> {
        self.rt
            .block_on(async { self.ctx.sql(sql).await.unwrap().collect().await.unwrap() })
    }

    /// Pairs the query returns: `count(*)`'s value, or the number of rows.
    fn pairs(&self, sql: &str) -> usize {
        let batches = self.run(sql);
        if sql.contains("count(*)") {
            let c = cast(batches[0].column(0), &DataType::Int64).unwrap();
            c.as_primitive::<Int64Type>().value(0) as usize
        } else {
            batches.iter().map(|b| b.num_rows()).sum()
        }
    }
}

struct Case {
    name: &'static str,
    dataset: &'static str,
    measure: &'static str,
    t: f64,
    /// The reference time (s), compiled single-threaded AllPairs + PPJoin.
    reference_s: f64,
}

const SMALL: &[Case] = &[
    Case {
        name: "debian_deps_jaccard_0.9",
        dataset: "debian_deps",
        measure: "jaccard",
        t: 0.9,
        reference_s: 0.09,
    },
    Case {
        name: "gcide_words_jaccard_0.8",
        dataset: "gcide_words",
        measure: "jaccard",
        t: 0.8,
        reference_s: 0.26,
    },
];

const LARGE: &[Case] = &[
    Case {
        name: "gcide_words_jaccard_0.5",
        dataset: "gcide_words",
        measure: "jaccard",
        t: 0.5,
        reference_s: 4.5,
    },
    Case {
        name: "gcide_words_dice_0.5",
        dataset: "gcide_words",
        measure: "dice",
        t: 0.5,
        reference_s: 138.0,
    },
];

fn query(case: &Case, select: &str) -> String {
    format!(
        "SELECT {select} FROM similarity_join('sets', 'id', 'tokens', '{}', {:?})",
        case.measure, case.t
    )
}

fn cores_list() -> Vec<(usize, &'static str)> {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut v = vec![(1, "1core")];
    if all > 1 {
        v.push((all, "allcores"));
    }
    v
}

fn small_cases(c: &mut Criterion) {
    for case in SMALL {
        let path = bench_data_dir().join(case.dataset).join("sets.parquet");
        if !path.exists() {
            eprintln!("{}: no {}, skipped", case.name, path.display());
            continue;
        }
        let mut group = c.benchmark_group(format!("similarity_join/{}", case.name));
        group
            .sample_size(10)
            .warm_up_time(Duration::from_secs(1))
            .measurement_time(Duration::from_secs(5));
        let mut expected = None;
        for (cores, label) in cores_list() {
            let engine = Engine::new(&path, cores);
            for (output, select) in [("count", "count(*)"), ("pairs", "*")] {
                let sql = query(case, select);
                let pairs = engine.pairs(&sql);
                assert_eq!(*expected.get_or_insert(pairs), pairs, "{sql} on {label}");
                group.bench_function(format!("{label}/{output}"), |b| {
                    b.iter(|| black_box(engine.run(&sql)))
                });
            }
        }
        if let Some(p) = expected {
            eprintln!(
                "{}: {p} pairs (reference: {} s on one core)",
                case.name, case.reference_s
            );
        }
        group.finish();
    }
}

fn large_cases() {
    let reps: usize = std::env::var("SETS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1);
    let only = std::env::var("SETS_BENCH_LARGE_CASES").unwrap_or_default();
    for case in LARGE.iter().filter(|c| c.name.contains(&only)) {
        let path = bench_data_dir().join(case.dataset).join("sets.parquet");
        if !path.exists() {
            eprintln!("{}: no {}, skipped", case.name, path.display());
            continue;
        }
        let sql = query(case, "count(*)");
        let mut expected = None;
        let mut one_core = None;
        for (cores, label) in cores_list() {
            let engine = Engine::new(&path, cores);
            // Warm-up: the file in the page cache, the allocator's arenas grown.
            engine.pairs(&query(&SMALL[1], "count(*)"));
            let mut times = Vec::new();
            for _ in 0..reps {
                let t0 = Instant::now();
                let pairs = engine.pairs(&sql);
                let s = t0.elapsed().as_secs_f64();
                assert_eq!(*expected.get_or_insert(pairs), pairs, "{sql} on {label}");
                println!(
                    "similarity_join/{}/{label}/count  {s:.3} s  ({pairs} pairs)",
                    case.name
                );
                times.push(s);
            }
            let best = times.iter().copied().fold(f64::INFINITY, f64::min);
            let speedup = match one_core {
                None => {
                    one_core = Some(best);
                    String::new()
                }
                Some(one) => format!(", {:.2}x one core", one / best),
            };
            println!(
                "similarity_join/{}/{label}/count  min of {reps}: {best:.3} s \
                 (reference {} s on one core{speedup})",
                case.name, case.reference_s
            );
        }
    }
}

/// `SETS_BENCH_RATIO=N`: each small case's `count(*)` query run `N` rounds on one core and on
/// all cores. A round runs the query on one core, then on all cores, then each of the
/// machine's ceilings the same two ways: a CPU-bound job as long as the query on one core,
/// split evenly into one tokio task per core, on the same two runtimes. Alternating puts both
/// sides of a ratio, and the ceilings, in the same minute of a shared machine.
///
/// The ceilings tell what the machine gives work with no serial part at all, by kind:
/// - `ceiling`: a dependent integer chain, latency-bound: two hardware threads of one
///   physical core still both run it at full speed;
/// - `vector-ceiling`: a vectorized sum over an array in L1, bound by the vector units;
/// - `ilp-ceiling`: eight independent integer chains, bound by the integer units' throughput,
///   which two hardware threads of one physical core share. It drops below 2× when the host
///   runs the two virtual CPUs on one physical core (or a neighbour shares theirs); the query's
///   phases are closest to it (instruction throughput, data in cache).
///
/// Prints each median and minimum time and the median of the `N` pairwise ratios; then the
/// query's median ratio over the rounds whose `ilp-ceiling` ratio was at least 0.97 × the
/// cores, and over the others (whether the query's slow rounds are the machine's: on this
/// 2-core machine they were not, benches/README.md).
fn ratio_cases(rounds: usize) {
    let all = std::thread::available_parallelism().map_or(1, |n| n.get());
    for case in SMALL {
        let path = bench_data_dir().join(case.dataset).join("sets.parquet");
        if !path.exists() {
            eprintln!("{}: no {}, skipped", case.name, path.display());
            continue;
        }
        let sql = query(case, "count(*)");
        let one = Engine::new(&path, 1);
        let many = Engine::new(&path, all);
        let pairs = one.pairs(&sql);
        assert_eq!(
            pairs,
            many.pairs(&sql),
            "{sql}: one core and {all} cores differ"
        );
        // Warm-up: the file in the page cache, the allocator's arenas grown, the pools started.
        let mut warm = Vec::new();
        for _ in 0..3 {
            let t0 = Instant::now();
            black_box(one.run(&sql));
            warm.push(t0.elapsed().as_secs_f64() * 1e3);
            black_box(many.run(&sql));
        }
        warm.sort_by(f64::total_cmp);
        let one_core_ms = warm[0];
        let time = |e: &Engine| {
            let t0 = Instant::now();
            black_box(e.run(&sql));
            t0.elapsed().as_secs_f64() * 1e3
        };
        let jobs: [(&str, Job); 3] = [
            ("ceiling", spin),
            ("vector-ceiling", vector_sum),
            ("ilp-ceiling", ilp),
        ];
        let units: Vec<u64> = jobs
            .iter()
            .map(|&(_, w)| units_for(one_core_ms, w))
            .collect();
        let job = |e: &Engine, work: Job, units: u64, tasks: u64| {
            let t0 = Instant::now();
            e.rt.block_on(async {
                let handles: Vec<_> = (0..tasks)
                    .map(|_| tokio::spawn(async move { work(units / tasks) }))
                    .collect();
                for h in handles {
                    black_box(h.await.unwrap());
                }
            });
            t0.elapsed().as_secs_f64() * 1e3
        };
        // Per series (the query, then each ceiling): one-core times, all-core times.
        let mut series = vec![(Vec::new(), Vec::new()); 1 + jobs.len()];
        for _ in 0..rounds {
            let (a, b) = (time(&one), time(&many));
            series[0].0.push(a);
            series[0].1.push(b);
            for (j, &(_, work)) in jobs.iter().enumerate() {
                let (a, b) = (
                    job(&one, work, units[j], 1),
                    job(&many, work, units[j], all as u64),
                );
                series[1 + j].0.push(a);
                series[1 + j].1.push(b);
            }
        }
        let ratios = |(t1, tn): &(Vec<f64>, Vec<f64>)| -> Vec<f64> {
            t1.iter().zip(tn).map(|(a, b)| a / b).collect()
        };
        let query_ratios = ratios(&series[0]);
        let ilp_ratios = ratios(&series[jobs.len()]);
        for (j, pair) in series.iter().enumerate() {
            let (t1, tn) = pair;
            let (min1, med1) = min_median(t1);
            let (minn, medn) = min_median(tn);
            let (_, ratio) = min_median(&ratios(pair));
            match j {
                0 => println!(
                    "similarity_join/{}/ratio  {rounds} rounds: 1core median {med1:.2} ms (min \
                     {min1:.2}), {all} cores median {medn:.2} ms (min {minn:.2}), median ratio \
                     {ratio:.2}x ({pairs} pairs)",
                    case.name
                ),
                _ => println!(
                    "similarity_join/{}/{}  the same rounds, a CPU-bound job split into {all} \
                     tasks: 1core median {med1:.2} ms, {all} cores median {medn:.2} ms (min \
                     {minn:.2}), median ratio {ratio:.2}x",
                    case.name,
                    jobs[j - 1].0
                ),
            }
        }
        let full = 0.97 * all as f64;
        let (quiet, busy): (Vec<_>, Vec<_>) = query_ratios
            .iter()
            .zip(&ilp_ratios)
            .partition(|&(_, &c)| c >= full);
        let median_of = |v: &[(&f64, &f64)]| {
            let r: Vec<f64> = v.iter().map(|&(&q, _)| q).collect();
            if r.is_empty() {
                "-".to_string()
            } else {
                format!("{:.2}x", min_median(&r).1)
            }
        };
        println!(
            "similarity_join/{}/ratio-by-machine  rounds whose ilp-ceiling ratio >= {full:.2}: \
             {} of {rounds}, query median ratio {}; the other rounds: {}",
            case.name,
            quiet.len(),
            median_of(&quiet),
            median_of(&busy)
        );
    }
}

/// The minimum and the median of `v` (not empty).
fn min_median(v: &[f64]) -> (f64, f64) {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    (v[0], v[v.len() / 2])
}

/// A CPU-bound job of `units` units of work.
type Job = fn(u64) -> u64;

/// A dependent chain of `units` integer steps: CPU-bound, no memory traffic.
fn spin(units: u64) -> u64 {
    let mut x = black_box(0x9e37_79b9_7f4a_7c15u64);
    for _ in 0..units {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
    }
    x
}

/// `units` steps of eight independent integer chains: bound by the integer units'
/// throughput (several instructions a cycle), which two hardware threads of one physical
/// core share.
fn ilp(units: u64) -> u64 {
    let mut x: [u64; 8] = std::array::from_fn(|i| black_box(0x9e37_79b9_7f4a_7c15 + i as u64));
    for _ in 0..units {
        for v in x.iter_mut() {
            *v ^= *v << 13;
            *v ^= *v >> 7;
            *v ^= *v << 17;
        }
    }
    x.iter().fold(0, |a, b| a ^ b)
}

/// `units` passes of a sum over 8,192 integers (32 KiB, in L1), vectorized: with AVX2 where
/// the CPU has it (the width of the verification's merge kernels), else with the baseline's
/// vectors. Bound by the vector units' throughput.
fn vector_sum(units: u64) -> u64 {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx2") {
        // SAFETY: the CPU has AVX2 (checked above).
        return unsafe { vector_sum_avx2(units) };
    }
    vector_sum_any(units)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn vector_sum_avx2(units: u64) -> u64 {
    vector_sum_any(units)
}

#[inline(always)]
fn vector_sum_any(units: u64) -> u64 {
    let values: Vec<u32> = black_box((0..8192u32).collect());
    let mut total = 0u64;
    for r in 0..units {
        let r = r as u32;
        total = total.wrapping_add(values.iter().map(|&x| u64::from(x ^ r)).sum::<u64>());
    }
    total
}

/// How many units of `work` take `ms` milliseconds on this core.
fn units_for(ms: f64, work: Job) -> u64 {
    // About 10 ms of either job.
    let mut probe = 1u64;
    let per_ms = loop {
        let t0 = Instant::now();
        black_box(work(probe));
        let elapsed = t0.elapsed().as_secs_f64() * 1e3;
        if elapsed >= 10.0 {
            break probe as f64 / elapsed;
        }
        probe *= 2;
    };
    (per_ms * ms) as u64
}

fn main() {
    if let Some(rounds) = std::env::var("SETS_BENCH_RATIO")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|&n| n > 0)
    {
        ratio_cases(rounds);
        return;
    }
    let large_only = env_flag("SETS_BENCH_LARGE_ONLY").unwrap_or(false);
    if !large_only {
        let mut c = Criterion::default().configure_from_args();
        small_cases(&mut c);
        c.final_summary();
    }
    if env_flag("SETS_BENCH_LARGE").unwrap_or(true) {
        large_cases();
    }
}
