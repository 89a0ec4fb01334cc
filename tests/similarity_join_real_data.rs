//! The similarity join on real data: `debian_deps` (58,048 dependency sets of Debian 12's
//! packages, many duplicates) and `gcide_words` (the word sets of 126,240 gcide articles),
//! built by `benches/data/build.sh`.
//!
//! For each case, the pairs our join returns through SQL must equal, pair for pair and
//! similarity for similarity (bit for bit), the pairs of an independent oracle written here:
//! a plain prefix-filter join over the builders' own token ids (their global order, not our
//! ranks) with a deliberately loose prefix bound derived from the measure's definition
//! (`o >= t·n` for Jaccard, `t·n/(2-t)` for Dice, `t²·n` for cosine, `n` the larger size),
//! the same bound on the smaller set's size, no positional filter, and a full merge
//! intersection per candidate scored with the measures' definitions in `f64`. It shares no
//! code with `src/join`, and is itself checked against every pair on small random sets.
//!
//! Our pairs come from three SQL forms over the same data:
//! - `similarity_join('sets', 'id', 'tokens', measure, t)` over the Parquet file (an external
//!   table; the self-join mode), and `count(*)` of it (the counting path);
//! - `JOIN ... ON measure(a.tokens, b.tokens) >= t AND a.id < b.id` over the Parquet file and
//!   over an in-memory copy (the rewrite's self-join mode: both scans read the same data);
//! - the same JOIN over the file with `AND b.id IS NOT NULL` (true of every row, but on one
//!   side only: the rewrite plans an R-S join with the id filter above it).
//!
//! The independent check against PyPI `SetSimilaritySearch.all_pairs` is
//! `benches/data/check_similarity_join.py`, fed by this test's dump (see there).
//!
//! Data: `bench-data/` (or `$SETS_BENCH_DATA`). Without it the test prints why and passes
//! (unless `SETS_REQUIRE_DATA=1`, as `.ci/run` sets after building the data).
//!
//! Environment: `SETS_SIMJOIN_DUMP=dir` also writes the table function's pairs of each case
//! as `dir/<dataset>_<measure>_<t>.tsv` (`left_id  right_id  similarity`, sorted).

mod common;

use std::collections::HashMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, Int64Type, UInt32Type};
use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};

/// Unbuffered, uncaptured notes (libtest captures `println!`, not direct writes).
macro_rules! note {
    ($($t:tt)*) => {{
        let _ = writeln!(std::io::stderr(), $($t)*);
    }};
}

/// `(left id, right id) -> similarity`, left < right.
type Pairs = HashMap<(u32, u32), f64>;

#[derive(Clone, Copy, Debug, PartialEq)]
enum Measure {
    Jaccard,
    Cosine,
    Dice,
}

impl Measure {
    fn name(self) -> &'static str {
        match self {
            Measure::Jaccard => "jaccard",
            Measure::Cosine => "cosine",
            Measure::Dice => "dice",
        }
    }

    /// The measure's definition (README), in `f64`, for sets of sizes `n`, `m` sharing `o`.
    fn score(self, o: usize, n: usize, m: usize) -> f64 {
        match self {
            Measure::Jaccard => o as f64 / (n + m - o) as f64,
            Measure::Cosine => o as f64 / ((n as f64) * (m as f64)).sqrt(),
            Measure::Dice => (2 * o) as f64 / (n + m) as f64,
        }
    }

    /// A lower bound on the overlap of any passing pair whose larger set has `n` elements,
    /// which is also a lower bound on the smaller set's size (the overlap is at most that),
    /// in real arithmetic. Used with a margin for rounding: a looser bound only costs
    /// candidates.
    fn min_overlap_bound(self, n: usize, t: f64) -> f64 {
        let n = n as f64;
        let bound = match self {
            // o >= t·|x ∪ y| >= t·n
            Measure::Jaccard => t * n,
            // 2o >= t(n + m) >= t(n + o)
            Measure::Dice => t * n / (2.0 - t),
            // o >= t·sqrt(n·m) >= t·sqrt(n·o)
            Measure::Cosine => t * t * n,
        };
        bound * (1.0 - 1e-9)
    }
}

fn data_dir() -> PathBuf {
    common::bench_data()
}

/// `sets[id]`, read with the Parquet reader (not through DataFusion), sorted and deduplicated.
fn read_sets(path: &Path) -> Vec<Vec<u32>> {
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let reader = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut sets: Vec<Option<Vec<u32>>> = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let ids = cast(batch.column_by_name("id").unwrap(), &DataType::UInt32).unwrap();
        let ids = ids.as_primitive::<UInt32Type>();
        let tokens = batch.column_by_name("tokens").unwrap().as_list::<i32>();
        for i in 0..batch.num_rows() {
            let id = ids.value(i) as usize;
            let mut set: Vec<u32> = tokens
                .value(i)
                .as_primitive::<UInt32Type>()
                .values()
                .to_vec();
            set.sort_unstable();
            set.dedup();
            if sets.len() <= id {
                sets.resize(id + 1, None);
            }
            assert!(sets[id].is_none(), "id {id} twice");
            sets[id] = Some(set);
        }
    }
    sets.into_iter()
        .map(|s| s.expect("ids are 0..n-1"))
        .collect()
}

/// The independent oracle (module docs): every pair of distinct ids with score `>= t`.
fn oracle(sets: &[Vec<u32>], measure: Measure, t: f64) -> Pairs {
    let mut order: Vec<usize> = (0..sets.len()).filter(|&i| !sets[i].is_empty()).collect();
    order.sort_by_key(|&i| (sets[i].len(), i));
    let tokens = sets.iter().flatten().max().map_or(0, |&m| m as usize + 1);
    let mut index: Vec<Vec<u32>> = vec![Vec::new(); tokens];
    let mut seen = vec![u32::MAX; sets.len()];
    let mut candidates = Vec::new();
    let mut out = Pairs::new();
    for &x in &order {
        let set = &sets[x];
        let n = set.len();
        // Partners met so far are no larger than x; a shared token lies in both prefixes.
        let bound = measure.min_overlap_bound(n, t);
        let prefix = n - (bound.floor() as usize).clamp(1, n) + 1;
        candidates.clear();
        for &w in &set[..prefix] {
            for &y in &index[w as usize] {
                if seen[y as usize] != x as u32 {
                    seen[y as usize] = x as u32;
                    candidates.push(y as usize);
                }
            }
        }
        for &y in &candidates {
            if (sets[y].len() as f64) < bound {
                continue;
            }
            let o = common::common_count(set, &sets[y]);
            let score = measure.score(o, n, sets[y].len());
            if score >= t {
                out.insert((x.min(y) as u32, x.max(y) as u32), score);
            }
        }
        for &w in &set[..prefix] {
            index[w as usize].push(x as u32);
        }
    }
    out
}

fn context() -> SessionContext {
    // Two partitions (this machine's cores), small batches: the parallel probe and the
    // batching of the output both run.
    common::sets_session(
        SessionConfig::new()
            .with_target_partitions(2)
            .with_batch_size(4096),
    )
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio")
}

async fn collect(ctx: &SessionContext, sql: &str) -> Vec<RecordBatch> {
    ctx.sql(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
        .collect()
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"))
}

/// Pairs of a result whose first three columns are left id, right id, similarity; every
/// pair once.
fn pairs_of(batches: &[RecordBatch], what: &str) -> Pairs {
    let mut out = Pairs::new();
    for b in batches {
        let l = cast(b.column(0), &DataType::UInt32).unwrap();
        let r = cast(b.column(1), &DataType::UInt32).unwrap();
        let (l, r) = (
            l.as_primitive::<UInt32Type>(),
            r.as_primitive::<UInt32Type>(),
        );
        let s = b.column(2).as_primitive::<Float64Type>();
        for i in 0..b.num_rows() {
            let key = (l.value(i), r.value(i));
            assert!(
                key.0 < key.1,
                "{what}: pair {key:?} not oriented left < right"
            );
            let prev = out.insert(key, s.value(i));
            assert!(prev.is_none(), "{what}: pair {key:?} twice");
        }
    }
    out
}

fn assert_same(ours: &Pairs, want: &Pairs, what: &str) {
    let mut only_ours: Vec<_> = ours.keys().filter(|k| !want.contains_key(k)).collect();
    let mut only_want: Vec<_> = want.keys().filter(|k| !ours.contains_key(k)).collect();
    let mut differ: Vec<_> = ours
        .iter()
        .filter(|(k, s)| want.get(k).is_some_and(|w| w.to_bits() != s.to_bits()))
        .map(|(k, s)| (k, *s, want[k]))
        .collect();
    only_ours.sort();
    only_want.sort();
    differ.sort_by_key(|d| *d.0);
    assert!(
        only_ours.is_empty() && only_want.is_empty() && differ.is_empty(),
        "{what}: {} pairs, oracle {}; only ours ({}): {:?}; only the oracle's ({}): {:?}; \
         other similarity ({}): {:?}",
        ours.len(),
        want.len(),
        only_ours.len(),
        &only_ours[..only_ours.len().min(10)],
        only_want.len(),
        &only_want[..only_want.len().min(10)],
        differ.len(),
        &differ[..differ.len().min(10)],
    );
}

fn dump(dir: &Path, name: &str, pairs: &Pairs) {
    std::fs::create_dir_all(dir).unwrap();
    let mut sorted: Vec<_> = pairs.iter().collect();
    sorted.sort_by_key(|p| *p.0);
    let path = dir.join(format!("{name}.tsv"));
    let mut f = std::io::BufWriter::new(std::fs::File::create(&path).unwrap());
    for ((l, r), s) in sorted {
        writeln!(f, "{l}\t{r}\t{s}").unwrap();
    }
    f.flush().unwrap();
    note!("wrote {}", path.display());
}

/// Every case of one dataset: the three SQL forms against the oracle.
fn check_dataset(dataset: &str, cases: &[(Measure, f64)]) {
    let path = data_dir().join(dataset).join("sets.parquet");
    if !common::data_present(&format!("similarity_join_real_data ({dataset})"), &[&path]) {
        return;
    }
    let sets = read_sets(&path);
    let rt = runtime();
    let ctx = context();
    rt.block_on(async {
        collect(
            &ctx,
            &format!(
                "CREATE EXTERNAL TABLE sets STORED AS PARQUET LOCATION '{}'",
                path.display()
            ),
        )
        .await;
        collect(&ctx, "CREATE TABLE mem AS SELECT id, tokens FROM sets").await;
    });
    for &(measure, t) in cases {
        let name = format!("{dataset}_{}_{t}", measure.name());
        let m = measure.name();
        let t0 = Instant::now();
        let want = oracle(&sets, measure, t);
        let oracle_s = t0.elapsed().as_secs_f64();
        assert!(!want.is_empty(), "{name}: the oracle found no pair");

        let t0 = Instant::now();
        let table_fn = rt.block_on(collect(
            &ctx,
            &format!("SELECT * FROM similarity_join('sets', 'id', 'tokens', '{m}', {t:?})"),
        ));
        let ours_s = t0.elapsed().as_secs_f64();
        let ours = pairs_of(&table_fn, "similarity_join");
        assert_same(&ours, &want, &format!("{name}: similarity_join(...)"));
        if let Some(dir) = std::env::var_os("SETS_SIMJOIN_DUMP") {
            dump(Path::new(&dir), &name, &ours);
        }

        let count = rt.block_on(collect(
            &ctx,
            &format!("SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', '{m}', {t:?})"),
        ));
        let count = cast(count[0].column(0), &DataType::Int64).unwrap();
        assert_eq!(
            count.as_primitive::<Int64Type>().value(0) as usize,
            want.len(),
            "{name}: count(*)"
        );

        // The Parquet file's two scans alike, and the same batches: the self-join mode; with a
        // conjunct on one side only (true of every row), an R-S join with the id filter above.
        for (table, extra, mode) in [
            ("sets", "", "mode=self"),
            ("mem", "", "mode=self"),
            ("sets", " AND b.id IS NOT NULL", "mode=r-s"),
        ] {
            let sql = format!(
                "SELECT a.id, b.id, {m}(a.tokens, b.tokens) FROM {table} a JOIN {table} b \
                 ON {m}(a.tokens, b.tokens) >= {t:?} AND a.id < b.id{extra}"
            );
            let plan = rt.block_on(collect(&ctx, &format!("EXPLAIN {sql}")));
            let plan = datafusion::arrow::util::pretty::pretty_format_batches(&plan)
                .unwrap()
                .to_string();
            assert!(
                plan.contains("SimilarityJoinExec") && plan.contains(mode),
                "{name}: {sql} is not planned as SimilarityJoinExec {mode}:\n{plan}"
            );
            let got = pairs_of(&rt.block_on(collect(&ctx, &sql)), &sql);
            assert_same(&got, &want, &format!("{name}: JOIN over {table}{extra}"));
        }
        if (measure, t) == cases[0] {
            // The SQL forms prefix-partitioned on the data whose prefixes are short (on
            // gcide_words they replicate each set several times: minutes in a test build).
            check_spread(&rt, &ctx, &name, m, t, &want, dataset == "debian_deps");
        }
        note!(
            "{name}: {} sets, {} pairs identical to the oracle in every SQL form \
             (oracle {oracle_s:.2} s, similarity_join {ours_s:.2} s in this test build)",
            sets.len(),
            want.len()
        );
    }
}

/// The same answers from the join spread over partitions (`sets.similarity_join_distribution`,
/// the first case of each dataset):
/// prefix-partitioned (the table function, its count, and the SQL join both as a self-join
/// and as an R-S join), replicated (the self-joins), and broadcast (an R-S join of the sets
/// with a tenth of them, the smaller side read whole by every partition, the sides swapped).
fn check_spread(
    rt: &tokio::runtime::Runtime,
    ctx: &SessionContext,
    name: &str,
    m: &str,
    t: f64,
    want: &Pairs,
    prefix_sql: bool,
) {
    let explain = |sql: &str| {
        let plan = rt.block_on(collect(ctx, &format!("EXPLAIN {sql}")));
        datafusion::arrow::util::pretty::pretty_format_batches(&plan)
            .unwrap()
            .to_string()
    };
    let run = |sql: &str, shown: &str| {
        let plan = explain(sql);
        assert!(
            plan.contains(shown),
            "{name}: {sql} is not planned with {shown}:\n{plan}"
        );
        let t0 = Instant::now();
        let got = pairs_of(&rt.block_on(collect(ctx, sql)), sql);
        note!("{name}: {shown}: {:.2} s", t0.elapsed().as_secs_f64());
        got
    };
    rt.block_on(collect(
        ctx,
        "SET sets.similarity_join_distribution = 'prefix'",
    ));
    let table_fn = format!("SELECT * FROM similarity_join('sets', 'id', 'tokens', '{m}', {t:?})");
    let got = run(&table_fn, "distribution=prefix");
    assert!(explain(&table_fn).contains("PrefixRouteExec"));
    assert_same(&got, want, &format!("{name}: prefix similarity_join(...)"));
    let count = rt.block_on(collect(
        ctx,
        &format!("SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', '{m}', {t:?})"),
    ));
    let count = cast(count[0].column(0), &DataType::Int64).unwrap();
    assert_eq!(
        count.as_primitive::<Int64Type>().value(0) as usize,
        want.len(),
        "{name}: prefix count(*)"
    );
    for extra in ["", " AND b.id IS NOT NULL"].iter().filter(|_| prefix_sql) {
        let sql = format!(
            "SELECT a.id, b.id, {m}(a.tokens, b.tokens) FROM mem a JOIN mem b \
             ON {m}(a.tokens, b.tokens) >= {t:?} AND a.id < b.id{extra}"
        );
        let got = run(&sql, "distribution=prefix");
        assert_same(&got, want, &format!("{name}: prefix JOIN{extra}"));
    }
    // The self-join replicated: the input whole in every partition, joined with each part.
    rt.block_on(collect(
        ctx,
        "SET sets.similarity_join_distribution = 'broadcast'",
    ));
    let got = run(&table_fn, "distribution=replicated");
    assert_same(
        &got,
        want,
        &format!("{name}: replicated similarity_join(...)"),
    );
    let sql = format!(
        "SELECT a.id, b.id, {m}(a.tokens, b.tokens) FROM mem a JOIN mem b \
         ON {m}(a.tokens, b.tokens) >= {t:?} AND a.id < b.id"
    );
    let got = run(&sql, "distribution=replicated");
    assert_same(&got, want, &format!("{name}: replicated JOIN"));
    // A tenth of the sets on the right: the pairs whose larger id is a multiple of 10.
    let tenth: Pairs = want
        .iter()
        .filter(|((_, r), _)| r % 10 == 0)
        .map(|(k, v)| (*k, *v))
        .collect();
    let sql = format!(
        "SELECT a.id, b.id, {m}(a.tokens, b.tokens) FROM mem a \
         JOIN (SELECT * FROM mem WHERE id % 10 = 0) b \
         ON {m}(a.tokens, b.tokens) >= {t:?} AND a.id < b.id"
    );
    let spreads = [
        ("broadcast", "distribution=broadcast"),
        ("prefix", "distribution=prefix"),
    ];
    for (distribution, shown) in spreads.iter().filter(|(d, _)| prefix_sql || *d != "prefix") {
        rt.block_on(collect(
            ctx,
            &format!("SET sets.similarity_join_distribution = '{distribution}'"),
        ));
        let got = run(&sql, shown);
        assert_same(
            &got,
            &tenth,
            &format!("{name}: {distribution} R-S JOIN with a tenth"),
        );
    }
    rt.block_on(collect(
        ctx,
        "SET sets.similarity_join_distribution = 'auto'",
    ));
}

#[test]
fn debian_deps() {
    check_dataset(
        "debian_deps",
        &[(Measure::Jaccard, 0.9), (Measure::Cosine, 0.9)],
    );
}

#[test]
fn gcide_words() {
    check_dataset(
        "gcide_words",
        &[(Measure::Jaccard, 0.8), (Measure::Dice, 0.9)],
    );
}

/// The oracle itself, on sets small enough to check against every pair.
#[test]
fn oracle_equals_all_pairs_on_small_sets() {
    let mut state = 0x9E37_79B9_7F4A_7C15u64;
    let mut next = move |k: u64| {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state % k
    };
    for round in 0..20 {
        let sets: Vec<Vec<u32>> = (0..300)
            .map(|_| {
                let len = 1 + next(12) as usize;
                let mut s: Vec<u32> = (0..len).map(|_| next(16 + round) as u32).collect();
                s.sort_unstable();
                s.dedup();
                s
            })
            .collect();
        for measure in [Measure::Jaccard, Measure::Cosine, Measure::Dice] {
            for t in [0.3, 0.5, 2.0 / 3.0, 0.8, 0.9, 1.0] {
                let mut want = Pairs::new();
                for x in 0..sets.len() {
                    for y in x + 1..sets.len() {
                        let o = common::common_count(&sets[x], &sets[y]);
                        let s = measure.score(o, sets[x].len(), sets[y].len());
                        if s >= t {
                            want.insert((x as u32, y as u32), s);
                        }
                    }
                }
                assert_same(
                    &oracle(&sets, measure, t),
                    &want,
                    &format!("oracle {measure:?} {t}"),
                );
            }
        }
    }
}
