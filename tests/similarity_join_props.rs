//! Property tests of the similarity join (`similarity_join(...)` → `SimilarityJoinExec`)
//! against a brute-force nested loop over `BTreeSet`s: random collections (small token
//! domains, so near-duplicates are common; duplicates, NULL elements, empty and NULL lists;
//! duplicate and NULL ids), every function, many thresholds (including values that pairs
//! reach exactly) with `>=` and `>`, self and R-S joins, several list types, batch sizes and
//! partition counts. Also: `count(*)`, metrics, the memory pool, and dropping a stream early.
//!
//! And the SQL forms the `similarity_join_rewrite` rule plans as `SimilarityJoinExec`
//! (`JOIN ... ON jaccard(l.tokens, r.tokens) >= t` and friends): the same query with the rule
//! on and off (`SET sets.similarity_join_rewrite`) gives the same multiset of rows, and the
//! rule fires exactly when the threshold is one the join can take.

mod common;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, Int64Array, ListArray, RecordBatch, UInt64Array,
};
use datafusion::arrow::buffer::NullBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::arrow::util::display::array_value_to_string;
use datafusion::datasource::MemTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::{ExecutionPlan, collect, execute_stream_partitioned};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::Measure;
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::{Comparison, SimilarityJoinExec, Threshold};
use futures::StreamExt;
use proptest::prelude::*;

/// One row: id (NULL allowed) and token list (`None` = NULL list, `None` elements = NULL).
type Row = (Option<i64>, Option<Vec<Option<i64>>>);

const TOKEN_TYPES: [&str; 5] = [
    "List(Int64)",
    "LargeList(Int32)",
    "List(UInt8)",
    "List(Int16)",
    "FixedSizeList(4, Int64)",
];

fn rows_strategy(fixed: bool) -> impl Strategy<Value = Vec<Row>> {
    (2i64..50).prop_flat_map(move |domain| {
        let list = if fixed {
            prop::collection::vec(prop::option::weighted(0.95, 0..domain), 4..=4).boxed()
        } else {
            prop::collection::vec(prop::option::weighted(0.97, 0..domain), 0..16).boxed()
        };
        let row = (
            prop::option::weighted(0.95, 0i64..80),
            prop::option::weighted(0.92, list),
        );
        prop::collection::vec(row, 0..60)
    })
}

fn threshold_strategy() -> impl Strategy<Value = (Measure, f64, Comparison)> {
    let measure = prop::sample::select(Measure::ALL.to_vec());
    let cmp = prop::sample::select(vec![Comparison::GtEq, Comparison::Gt]);
    (measure, cmp, 0usize..20, 0.0f64..1.0).prop_map(|(m, c, k, u)| {
        let normalized = [
            0.1,
            0.2,
            0.25,
            1.0 / 3.0,
            0.4,
            0.5,
            0.6,
            2.0 / 3.0,
            0.7,
            0.75,
            0.8,
            0.9,
            1.0,
            4.0 / 7.0,
            0.8944271909999159,
        ];
        let overlaps = [0.5, 1.0, 2.0, 3.0, 4.5, 6.0, 1.0e-9];
        let t = if m.is_normalized() {
            if k < normalized.len() {
                normalized[k]
            } else {
                (1.0 - u).max(1e-3)
            }
        } else {
            overlaps[k % overlaps.len()]
        };
        (m, t, c)
    })
}

fn set_of(row: &Row) -> Option<BTreeSet<i64>> {
    row.1
        .as_ref()
        .map(|l| l.iter().flatten().copied().collect())
}

/// `(left_id, right_id, similarity bits)` of every pair, sorted.
type Pairs = Vec<(Option<i64>, Option<i64>, u64)>;

fn brute_force(left: &[Row], right: Option<&[Row]>, th: &Threshold) -> Pairs {
    let mut out = Vec::new();
    let consider = |a: &Row, b: &Row, out: &mut Pairs| {
        let (Some(x), Some(y)) = (set_of(a), set_of(b)) else {
            return;
        };
        let o = x.intersection(&y).count() as u64;
        let (n, m) = (x.len() as u64, y.len() as u64);
        let score = th.measure().score(o, n, m);
        if th.accepts(score) {
            let bits = if th.measure() == Measure::Overlap {
                o
            } else {
                score.to_bits()
            };
            out.push((a.0, b.0, bits));
        }
    };
    match right {
        Some(right) => {
            for a in left {
                for b in right {
                    consider(a, b, &mut out);
                }
            }
        }
        None => {
            for (i, a) in left.iter().enumerate() {
                for b in &left[i + 1..] {
                    match (a.0, b.0) {
                        (Some(x), Some(y)) if x < y => consider(a, b, &mut out),
                        (Some(x), Some(y)) if y < x => consider(b, a, &mut out),
                        _ => {}
                    }
                }
            }
        }
    }
    out.sort_unstable();
    out
}

fn batch(rows: &[Row], token_type: &str) -> RecordBatch {
    let ids = Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let tokens: ArrayRef = if let Some(size) = token_type
        .strip_prefix("FixedSizeList(")
        .and_then(|s| s.split(',').next())
    {
        let size: i32 = size.parse().unwrap_or(4);
        let values = Int64Array::from(
            rows.iter()
                .flat_map(|r| r.1.clone().unwrap_or_else(|| vec![Some(0); size as usize]))
                .collect::<Vec<_>>(),
        );
        let nulls = NullBuffer::from(rows.iter().map(|r| r.1.is_some()).collect::<Vec<_>>());
        Arc::new(datafusion::arrow::array::FixedSizeListArray::new(
            Arc::new(Field::new_list_field(DataType::Int64, true)),
            size,
            Arc::new(values),
            Some(nulls),
        ))
    } else {
        let list =
            ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().map(|r| r.1.clone()));
        let target = match token_type {
            "List(Int64)" => DataType::new_list(DataType::Int64, true),
            "LargeList(Int32)" => DataType::new_large_list(DataType::Int32, true),
            "List(UInt8)" => DataType::new_list(DataType::UInt8, true),
            _ => DataType::new_list(DataType::Int16, true),
        };
        cast(&list, &target).expect("cast token lists")
    };
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, true),
        Field::new("tokens", tokens.data_type().clone(), true),
    ]));
    RecordBatch::try_new(schema, vec![Arc::new(ids), tokens]).expect("batch")
}

fn context(batch_size: usize, partitions: usize) -> SessionContext {
    common::sets_session(
        SessionConfig::new()
            .with_batch_size(batch_size)
            .with_target_partitions(partitions),
    )
}

/// Register `rows` as `name`, split into up to 3 batches (and partitions).
fn register(ctx: &SessionContext, name: &str, rows: &[Row], token_type: &str) {
    let full = batch(rows, token_type);
    let n = full.num_rows();
    let parts: Vec<Vec<RecordBatch>> = [0..n / 3, n / 3..n / 2, n / 2..n]
        .into_iter()
        .map(|r| vec![full.slice(r.start, r.len())])
        .collect();
    let table = MemTable::try_new(full.schema(), parts).expect("mem table");
    ctx.register_table(name, Arc::new(table)).expect("register");
}

fn pairs_of(batches: &[RecordBatch], measure: Measure) -> Pairs {
    let mut out = Vec::new();
    for b in batches {
        let l = b.column(0).as_primitive::<Int64Type>();
        let r = b.column(1).as_primitive::<Int64Type>();
        for i in 0..b.num_rows() {
            let bits = if measure == Measure::Overlap {
                b.column(2)
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .map(|a| a.value(i))
                    .unwrap_or(u64::MAX)
            } else {
                b.column(2)
                    .as_any()
                    .downcast_ref::<Float64Array>()
                    .map(|a| a.value(i).to_bits())
                    .unwrap_or(0)
            };
            out.push((
                l.is_valid(i).then(|| l.value(i)),
                r.is_valid(i).then(|| r.value(i)),
                bits,
            ));
        }
    }
    out.sort_unstable();
    out
}

fn count_of(batches: &[RecordBatch]) -> i64 {
    batches[0].column(0).as_primitive::<Int64Type>().value(0)
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio")
}

fn call(left: &str, right: Option<&str>, m: Measure, t: f64, c: Comparison) -> String {
    let tail = format!("'{}', {t:?}, '{c}'", m.name());
    match right {
        Some(r) => {
            format!("similarity_join('{left}', 'id', 'tokens', '{r}', 'id', 'tokens', {tail})")
        }
        None => format!("similarity_join('{left}', 'id', 'tokens', {tail})"),
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(160))]

    #[test]
    fn join_equals_nested_loop(
        left in rows_strategy(false),
        right in rows_strategy(false),
        self_join in any::<bool>(),
        (measure, t, cmp) in threshold_strategy(),
        types in (0usize..4, 0usize..4),
        batch_size in 1usize..9,
        partitions in 1usize..5,
        distribution in prop::sample::select(vec!["auto", "prefix", "broadcast"]),
    ) {
        let rt = runtime();
        let th = Threshold::try_new(measure, t, cmp, "test").expect("valid threshold");
        let ctx = context(batch_size, partitions);
        register(&ctx, "l", &left, TOKEN_TYPES[types.0]);
        register(&ctx, "r", &right, TOKEN_TYPES[types.1]);
        // One shared build (`auto` in one process), prefix-partitioned, or broadcast (a
        // self-join replicated): the same pairs.
        rt.block_on(async {
            ctx.sql(&format!("SET sets.similarity_join_distribution = '{distribution}'"))
                .await?
                .collect()
                .await
        }).expect("SET");
        let (sql_call, want) = if self_join {
            (call("l", None, measure, t, cmp), brute_force(&left, None, &th))
        } else {
            (call("l", Some("r"), measure, t, cmp), brute_force(&left, Some(&right), &th))
        };
        let got = rt.block_on(async {
            ctx.sql(&format!("SELECT left_id, right_id, similarity FROM {sql_call}")).await?.collect().await
        }).expect("join runs");
        prop_assert_eq!(pairs_of(&got, measure), want.clone(), "{} ({})", sql_call, distribution);
        let count = rt.block_on(async {
            ctx.sql(&format!("SELECT count(*) FROM {sql_call}")).await?.collect().await
        }).expect("count runs");
        prop_assert_eq!(count_of(&count), want.len() as i64, "count(*) of {}", sql_call);
        // The pairs as the scalar function sees them: the same similarity values.
        let ids = rt.block_on(async {
            ctx.sql(&format!("SELECT count(*) FROM {sql_call} WHERE right_id IS NOT NULL")).await?.collect().await
        }).expect("projection runs");
        prop_assert_eq!(count_of(&ids), want.iter().filter(|p| p.1.is_some()).count() as i64);
    }

    #[test]
    fn fixed_size_lists(
        left in rows_strategy(true),
        (measure, t, cmp) in threshold_strategy(),
        partitions in 1usize..4,
    ) {
        let rt = runtime();
        let th = Threshold::try_new(measure, t, cmp, "test").expect("valid threshold");
        let ctx = context(3, partitions);
        register(&ctx, "f", &left, TOKEN_TYPES[4]);
        register(&ctx, "g", &left, TOKEN_TYPES[0]);
        let sql_call = call("f", Some("g"), measure, t, cmp);
        let got = rt.block_on(async {
            ctx.sql(&format!("SELECT * FROM {sql_call}")).await?.collect().await
        }).expect("join runs");
        prop_assert_eq!(pairs_of(&got, measure), brute_force(&left, Some(&left), &th));
        let self_call = call("f", None, measure, t, cmp);
        let got = rt.block_on(async {
            ctx.sql(&format!("SELECT * FROM {self_call}")).await?.collect().await
        }).expect("self join runs");
        prop_assert_eq!(pairs_of(&got, measure), brute_force(&left, None, &th));
    }
}

/// One SQL spelling of a similarity join of `l` and `r` (see `sql_join`).
const FORMS: usize = 9;

/// The forms that join a table with itself on `a.id < b.id` (or `>`) over the same scan (form
/// 3 reads the view `l`, whose unused `tag` column the optimizer prunes, leaving the scan),
/// which the rule runs in the exec's self-join mode.
const SELF_FORMS: [usize; 3] = [3, 7, 8];

/// The literal `t` as SQL: integral overlap thresholds sometimes as integers (compared as
/// UInt64), everything else as a float literal (compared as Float64).
fn literal(t: f64, integral: bool) -> String {
    if integral && t.fract() == 0.0 && t.abs() < 1e15 {
        format!("{}", t as i64)
    } else {
        format!("{t:?}")
    }
}

/// Form `form` of the join of `l` and `r` on `m(..) <cmp> t`.
fn sql_join(form: usize, m: Measure, t: &str, c: Comparison) -> String {
    let m = m.name();
    let flipped = match c {
        Comparison::GtEq => "<=",
        Comparison::Gt => "<",
    };
    match form {
        0 => format!(
            "SELECT l.id, r.id, {m}(l.tokens, r.tokens) FROM l JOIN r ON {m}(l.tokens, r.tokens) {c} {t}"
        ),
        1 => format!("SELECT * FROM l JOIN r ON {t} {flipped} {m}(r.tokens, l.tokens)"),
        2 => {
            format!("SELECT l.id, l.tag, r.tokens FROM l, r WHERE {m}(r.tokens, l.tokens) {c} {t}")
        }
        3 => format!(
            "SELECT a.id, b.id, {m}(a.tokens, b.tokens) FROM l a JOIN l b ON {m}(a.tokens, b.tokens) {c} {t} AND a.id < b.id"
        ),
        4 => format!(
            "SELECT l.id, r.id, r.tag FROM l JOIN r ON {m}(l.tokens, r.tokens) {c} {t} AND (l.id + r.id) % 3 <> 0"
        ),
        5 => format!("SELECT count(*) FROM l CROSS JOIN r WHERE {m}(l.tokens, r.tokens) {c} {t}"),
        6 => format!(
            "SELECT l.id, r.id FROM l JOIN r ON {m}(array_append(l.tokens, 3), r.tokens) {c} {t}"
        ),
        7 => format!(
            "SELECT a.id, b.id, b.tokens FROM l_raw a JOIN l_raw b ON {m}(a.tokens, b.tokens) {c} {t} AND a.id < b.id"
        ),
        _ => format!(
            "SELECT b.tokens, a.id, b.id FROM l_raw a, l_raw b WHERE {m}(b.tokens, a.tokens) {c} {t} AND a.id > b.id"
        ),
    }
}

/// Every row of `batches` as text, sorted (a multiset).
fn rows_of(batches: &[RecordBatch]) -> Vec<String> {
    let mut out = Vec::new();
    for b in batches {
        for i in 0..b.num_rows() {
            let row: Vec<String> = b
                .columns()
                .iter()
                .map(|c| array_value_to_string(c.as_ref(), i).expect("display"))
                .collect();
            out.push(row.join(" | "));
        }
    }
    out.sort_unstable();
    out
}

/// `sql`'s rows and, when its plan holds a `SimilarityJoinExec`, whether that is a self-join.
async fn run_sql(
    ctx: &SessionContext,
    sql: &str,
) -> datafusion::error::Result<(Vec<String>, Option<bool>)> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let rewritten = find_join(&plan).map(|j| j.is_self_join());
    let batches = collect(plan, ctx.task_ctx()).await?;
    Ok((rows_of(&batches), rewritten))
}

/// Tables `l_raw` and `r_raw` (`id`, `tokens`) and views `l` and `r` over them adding `tag`
/// (the id as text).
fn register_with_tag(
    ctx: &SessionContext,
    rt: &tokio::runtime::Runtime,
    rows: (&[Row], &[Row]),
    types: (&str, &str),
) {
    register(ctx, "l_raw", rows.0, types.0);
    register(ctx, "r_raw", rows.1, types.1);
    rt.block_on(async {
        for (view, table) in [("l", "l_raw"), ("r", "r_raw")] {
            ctx.sql(&format!(
                "CREATE VIEW {view} AS SELECT id, tokens, CAST(id AS VARCHAR) AS tag FROM {table}"
            ))
            .await?
            .collect()
            .await?;
        }
        Ok::<_, datafusion::error::DataFusionError>(())
    })
    .expect("views");
}

fn sql_threshold_strategy() -> impl Strategy<Value = (Measure, f64, Comparison)> {
    // Mostly thresholds the join takes, sometimes ones it must leave to the nested loop
    // (0 with >=, negative, > 1), and `> 0`.
    (threshold_strategy(), 0usize..12).prop_map(|((m, t, c), k)| match k {
        0 => (m, 0.0, c),
        1 => (m, -0.5, c),
        2 if m.is_normalized() => (m, 1.25, c),
        _ => (m, t, c),
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn sql_join_rewrite_equals_nested_loop(
        left in rows_strategy(false),
        right in rows_strategy(false),
        (measure, t, cmp) in sql_threshold_strategy(),
        form in 0..FORMS,
        integral in any::<bool>(),
        types in (0usize..4, 0usize..4),
        batch_size in 1usize..9,
        partitions in 1usize..5,
    ) {
        let rt = runtime();
        let ctx = context(batch_size, partitions);
        register_with_tag(&ctx, &rt, (&left, &right), (TOKEN_TYPES[types.0], TOKEN_TYPES[types.1]));
        let integral = integral && measure == Measure::Overlap;
        let sql = sql_join(form, measure, &literal(t, integral), cmp);
        let takes = Threshold::try_new(measure, t, cmp, "test").is_ok();
        let (on, on_rewritten) = rt.block_on(run_sql(&ctx, &sql)).expect("rewrite on");
        rt.block_on(async {
            ctx.sql("SET sets.similarity_join_rewrite = false").await?.collect().await
        }).expect("SET");
        let (off, off_rewritten) = rt.block_on(run_sql(&ctx, &sql)).expect("rewrite off");
        let want = takes.then_some(SELF_FORMS.contains(&form));
        prop_assert_eq!(on_rewritten, want, "rewritten (self-join?) with the rule on: {}", sql);
        prop_assert!(off_rewritten.is_none(), "rewritten with the rule off: {}", sql);
        prop_assert_eq!(on, off, "{}", sql);
    }
}

/// `n` rows with ids `0..n`, near-duplicate sets of a 20-token vocabulary.
fn clustered(n: i64) -> Vec<Row> {
    (0..n)
        .map(|i| {
            (
                Some(i),
                Some(
                    (0..12)
                        .map(|k| Some((i % 7 + k * (1 + i % 3)) % 20))
                        .collect(),
                ),
            )
        })
        .collect()
}

fn find_join(plan: &Arc<dyn ExecutionPlan>) -> Option<&SimilarityJoinExec> {
    if let Some(join) = plan.downcast_ref::<SimilarityJoinExec>() {
        return Some(join);
    }
    plan.children().into_iter().find_map(find_join)
}

/// Table `c` of [`clustered`] rows in `ctx`, and its self-join's pairs at Jaccard >= 0.5 (more
/// than a thousand).
fn clustered_table(ctx: &SessionContext) -> Pairs {
    let rows = clustered(300);
    register(ctx, "c", &rows, "List(Int64)");
    let th =
        Threshold::try_new(Measure::Jaccard, 0.5, Comparison::GtEq, "test").expect("threshold");
    let want = brute_force(&rows, None, &th);
    assert!(
        want.len() > 1000,
        "the test needs many pairs, got {}",
        want.len()
    );
    want
}

#[test]
fn metrics_are_reported() {
    let rt = runtime();
    let ctx = context(64, 3);
    let want = clustered_table(&ctx).len();
    rt.block_on(async {
        let df = ctx.sql("SELECT * FROM similarity_join('c', 'id', 'tokens', 'jaccard', 0.5)").await?;
        let plan = df.create_physical_plan().await?;
        let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        assert_eq!(batches.iter().map(|b| b.num_rows()).sum::<usize>(), want);
        assert!(batches.iter().all(|b| b.num_rows() <= 64));
        let join = find_join(&plan).expect("a SimilarityJoinExec in the plan");
        let metrics = join.metrics().expect("metrics");
        assert_eq!(metrics.output_rows(), Some(want));
        let value = |name: &str| metrics.sum_by_name(name).map(|v| v.as_usize()).unwrap_or(0);
        assert!(value("candidates") >= value("verified"));
        assert!(value("verified") >= want);
        let shown = format!("{}", datafusion::physical_plan::displayable(plan.as_ref()).indent(true));
        assert!(shown.contains("SimilarityJoinExec: mode=self, function=jaccard, threshold=>= 0.5"), "{shown}");
        let analyzed = ctx
            .sql("EXPLAIN ANALYZE SELECT count(*) FROM similarity_join('c', 'id', 'tokens', 'jaccard', 0.5)")
            .await?
            .collect()
            .await?;
        let text = format!("{}", datafusion::arrow::util::pretty::pretty_format_batches(&analyzed)?);
        for metric in ["candidates=", "verified=", "filter_time=", "verify_time=", "build_time="] {
            assert!(text.contains(metric), "EXPLAIN ANALYZE lacks {metric}: {text}");
        }
        Ok::<_, datafusion::error::DataFusionError>(())
    })
    .expect("query runs");
}

#[test]
fn memory_pool_refusal_is_a_clear_error() {
    let rt = runtime();
    let runtime_env = RuntimeEnvBuilder::new()
        .with_memory_limit(4096, 1.0)
        .build_arc()
        .expect("runtime env");
    let state = SessionStateBuilder::new()
        .with_config(SessionConfig::new())
        .with_runtime_env(runtime_env)
        .with_default_features()
        .with_sets()
        .build();
    let ctx = SessionContext::new_with_state(state);
    register(&ctx, "c", &clustered(2000), "List(Int64)");
    let err = rt
        .block_on(async {
            ctx.sql("SELECT count(*) FROM similarity_join('c', 'id', 'tokens', 'jaccard', 0.5)")
                .await?
                .collect()
                .await
        })
        .expect_err("4 KiB cannot hold the index");
    let msg = err.to_string();
    assert!(
        msg.contains("SimilarityJoinExec: the memory pool refused"),
        "{msg}"
    );
}

#[test]
fn dropping_the_stream_stops_the_join() {
    let rt = runtime();
    let ctx = context(100, 1);
    // 3000 identical sets: 4.5 million pairs.
    let rows: Vec<Row> = (0..3000)
        .map(|i| (Some(i), Some((0..40).map(Some).collect())))
        .collect();
    register(&ctx, "same", &rows, "List(Int64)");
    rt.block_on(async {
        let df = ctx
            .sql("SELECT * FROM similarity_join('same', 'id', 'tokens', 'jaccard', 0.9)")
            .await?;
        let plan = df.create_physical_plan().await?;
        let mut streams = execute_stream_partitioned(plan, ctx.task_ctx())?;
        let mut stream = streams.remove(0);
        let start = Instant::now();
        let first = stream.next().await.expect("a batch")?;
        assert_eq!(first.num_rows(), 100);
        drop(stream);
        assert!(start.elapsed() < Duration::from_secs(20));
        Ok::<_, datafusion::error::DataFusionError>(())
    })
    .expect("query runs");
}

/// The partitions share the probe sets by claiming ranges: a plan executed again probes every
/// set again (each execution has its own claims), and partitions drained one after another
/// (the first claims every set, the later ones find none) still give every pair once.
#[test]
fn partitions_claim_every_probe_set_once_per_execution() {
    let rt = runtime();
    let ctx = context(64, 3);
    let want = clustered_table(&ctx);
    rt.block_on(async {
        let df = ctx
            .sql("SELECT left_id, right_id, similarity FROM similarity_join('c', 'id', 'tokens', 'jaccard', 0.5)")
            .await?;
        let plan = df.create_physical_plan().await?;
        for run in 0..3 {
            let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
            assert_eq!(pairs_of(&batches, Measure::Jaccard), want, "execution {run}");
        }
        let mut batches = Vec::new();
        for mut stream in execute_stream_partitioned(Arc::clone(&plan), ctx.task_ctx())? {
            while let Some(batch) = stream.next().await {
                batches.push(batch?);
            }
        }
        assert_eq!(pairs_of(&batches, Measure::Jaccard), want, "partitions one at a time");
        Ok::<_, datafusion::error::DataFusionError>(())
    })
    .expect("query runs");
}
