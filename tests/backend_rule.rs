//! The backend rule through SQL: `EXPLAIN ANALYZE` shows, above the projection, the device
//! each call was bound to and what the calls did. On a machine with a GPU (the device run,
//! `scripts/gpu/`) the GPU counters must move; without one the choice must be the CPU with
//! the reason.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion_sets::gpu;
use datafusion_sets::new_context;

/// The value of metric `name=` in an `EXPLAIN ANALYZE` line.
fn metric(plan: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    let at = plan
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {plan}"));
    plan[at + key.len()..]
        .chars()
        .take_while(|c| c.is_ascii_digit())
        .collect::<String>()
        .parse()
        .unwrap_or_else(|_| panic!("{name} is not a count in {plan}"))
}

/// The value of metric `name=` as DataFusion prints it, a count or a size with a unit
/// (`16.56 M`, `2.05 K`).
fn metric_scaled(plan: &str, name: &str) -> f64 {
    let key = format!("{name}=");
    let at = plan
        .find(&key)
        .unwrap_or_else(|| panic!("no {name} in {plan}"));
    let text: String = plan[at + key.len()..]
        .chars()
        .take_while(|c| *c != ',' && *c != ']')
        .collect();
    let mut parts = text.split_whitespace();
    let number: f64 = parts
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{name} is not a number in {plan}"));
    let scale = match parts.next() {
        None => 1.0,
        Some("K") => 1e3,
        Some("M") => 1e6,
        Some("G") => 1e9,
        Some("T") => 1e12,
        Some(other) => panic!("{name}: unit {other} in {plan}"),
    };
    number * scale
}

/// `EXPLAIN ANALYZE query`, pretty-printed, in a new session with `sets.backend = backend`
/// after the `setup` statements.
async fn explain_analyze_of(backend: &str, setup: &[&str], query: &str) -> String {
    let ctx = new_context();
    let set = format!("SET sets.backend = '{backend}'");
    for s in std::iter::once(set.as_str()).chain(setup.iter().copied()) {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    let out = ctx
        .sql(&format!("EXPLAIN ANALYZE {query}"))
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    pretty_format_batches(&out).unwrap().to_string()
}

async fn explain_analyze(backend: &str) -> String {
    explain_analyze_of(
        backend,
        &["CREATE TABLE t (a INT[], b INT[]) AS SELECT [1, 2, 3, v], [2, 3, v, 9] FROM generate_series(1, 500) AS s(v)"],
        "SELECT list_intersect(a, b) FROM t",
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_choice_and_counters() {
    let plan = explain_analyze("cpu").await;
    assert!(
        plan.contains("SetsBackendExec: list_intersect=cpu (sets.backend = 'cpu')"),
        "{plan}"
    );
    assert_eq!(metric(&plan, "rows"), 500, "{plan}");
    assert!(metric(&plan, "cpu_batches") >= 1, "{plan}");
    assert_eq!(metric(&plan, "gpu_batches"), 0, "{plan}");
    assert_eq!(metric(&plan, "bytes_to_device"), 0, "{plan}");

    let plan = explain_analyze("gpu").await;
    match gpu::device() {
        Err(e) => {
            assert!(
                plan.contains(&format!("list_intersect=cpu (no GPU: {e})")),
                "{plan}"
            );
            assert_eq!(metric(&plan, "gpu_batches"), 0, "{plan}");
        }
        Ok(_) => {
            assert!(
                plan.contains("list_intersect=gpu (sets.backend = 'gpu')"),
                "{plan}"
            );
            assert_eq!(metric(&plan, "rows"), 500, "{plan}");
            assert!(metric(&plan, "gpu_batches") >= 1, "{plan}");
            assert!(metric(&plan, "bytes_to_device") > 0, "{plan}");
            assert!(metric(&plan, "bytes_from_device") > 0, "{plan}");
        }
    }
}

async fn explain_analyze_topk(backend: &str) -> String {
    explain_analyze_of(
        backend,
        &[
            "CREATE TABLE docs AS SELECT v AS doc_id, concat('w', v % 7, ' x', v % 11) AS body FROM generate_series(1, 2000) AS s(v)",
            "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')",
            "CREATE TABLE q AS SELECT v AS qid, concat('w', v % 7, ' x', v % 5) AS text FROM generate_series(1, 300) AS s(v)",
        ],
        "SELECT qid, topk_bm25('idx', text, 10) FROM q",
    )
    .await
}

/// `topk_bm25` (an async function: `AsyncFuncExec`) is bound and counted the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_topk_bm25_choice_and_counters() {
    let plan = explain_analyze_topk("cpu").await;
    assert!(
        plan.contains("SetsBackendExec: topk_bm25=cpu (sets.backend = 'cpu')"),
        "{plan}"
    );
    assert!(plan.contains("AsyncFuncExec"), "{plan}");
    assert_eq!(metric(&plan, "rows"), 300, "{plan}");
    assert!(metric(&plan, "cpu_batches") >= 1, "{plan}");
    assert_eq!(metric(&plan, "gpu_batches"), 0, "{plan}");

    let plan = explain_analyze_topk("gpu").await;
    assert_eq!(metric(&plan, "rows"), 300, "{plan}");
    match gpu::device() {
        Err(e) => {
            assert!(
                plan.contains(&format!("topk_bm25=cpu (no GPU: {e})")),
                "{plan}"
            );
            assert_eq!(metric(&plan, "gpu_batches"), 0, "{plan}");
        }
        Ok(_) => {
            assert!(
                plan.contains("topk_bm25=gpu (sets.backend = 'gpu')"),
                "{plan}"
            );
            assert!(metric(&plan, "gpu_batches") >= 1, "{plan}");
            // The index goes up with the first batch, the queries with every batch.
            assert!(metric(&plan, "bytes_to_device") > 0, "{plan}");
            assert!(metric(&plan, "bytes_from_device") > 0, "{plan}");
        }
    }
}

/// A memory table queried twice on the GPU: the first query copies its list columns to the
/// device and keeps them, the second reads them there (`gpu_columns_reused`, far fewer bytes
/// to the device); with `sets.gpu_resident_columns = false` nothing is kept or reused. The
/// answers equal the CPU's every time. Without a GPU every counter stays 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_resident_list_columns() {
    let ctx = new_context();
    for s in [
        "CREATE TABLE t AS SELECT range(v, v + 40) AS a, range(v + 7, v + 90, 3) AS b FROM generate_series(1, 30000) AS s(v)",
        "SET sets.backend = 'gpu'",
    ] {
        ctx.sql(s).await.unwrap().collect().await.unwrap();
    }
    let query =
        "SELECT cardinality(list_intersect(a, b)) AS n, list_intersect_count(b, a) AS m FROM t";
    let total = "SELECT sum(cardinality(list_intersect(a, b))) AS n, sum(list_intersect_count(b, a)) AS m FROM t";
    let run = |sql: String| {
        let ctx = ctx.clone();
        async move {
            let out = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            pretty_format_batches(&out).unwrap().to_string()
        }
    };
    let first = run(format!("EXPLAIN ANALYZE {query}")).await;
    let second = run(format!("EXPLAIN ANALYZE {query}")).await;
    let answer_gpu = run(total.to_string()).await;
    run("SET sets.gpu_resident_columns = false".to_string()).await;
    let third = run(format!("EXPLAIN ANALYZE {query}")).await;
    run("SET sets.backend = 'cpu'".to_string()).await;
    let answer_cpu = run(total.to_string()).await;
    assert_eq!(answer_gpu, answer_cpu);
    assert!(answer_cpu.contains("| 330000 | 330000 |"), "{answer_cpu}");
    let counts = |plan: &str| {
        (
            metric(plan, "gpu_columns_uploaded_0") + metric(plan, "gpu_columns_uploaded_1"),
            metric(plan, "gpu_columns_reused_0") + metric(plan, "gpu_columns_reused_1"),
            metric_scaled(plan, "bytes_to_device_0") + metric_scaled(plan, "bytes_to_device_1"),
        )
    };
    let ((up1, re1, b1), (up2, re2, b2), (up3, re3, _)) =
        (counts(&first), counts(&second), counts(&third));
    if gpu::device().is_err() {
        assert_eq!((up1, re1, up2, re2), (0, 0, 0, 0), "{second}");
        assert_eq!((b1, b2), (0.0, 0.0), "{second}");
        return;
    }
    // Each batch's two columns go up once, for the first call that meets them.
    assert!(up1 >= 2, "{first}");
    assert_eq!(up2, 0, "{second}");
    assert!(re2 >= 4 && re2 >= 2 * up1, "{second}");
    assert!(b2 * 50.0 < b1, "{first}\n{second}");
    assert_eq!((up3, re3), (0, 0), "{third}");
}

/// A memory table of one large batch, which DataFusion hands on in slices of 8,192 rows (each
/// slice's offsets a buffer of its own, over the same values), queried twice on the GPU: the
/// first query stages its first slices and keeps the values buffers once the slices read cover
/// half of them, the later slices and every slice of the second query read them there
/// (`gpu_columns_reused`; only offsets go to the device). Answers equal the CPU's. Without a
/// GPU every counter stays 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_of_one_large_batch_keep_their_values_on_the_device() {
    let ctx = new_context();
    let built = ctx
        .sql("SELECT range(v, v + 40) AS a, range(v + 7, v + 90, 3) AS b FROM generate_series(1, 40000) AS s(v)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap();
    let schema = built[0].schema();
    let one = datafusion::arrow::compute::concat_batches(&schema, &built).unwrap();
    assert_eq!(one.num_rows(), 40_000);
    let table = datafusion::datasource::MemTable::try_new(schema, vec![vec![one]]).unwrap();
    ctx.register_table("t", std::sync::Arc::new(table)).unwrap();
    let run = |sql: &str| {
        let (ctx, sql) = (ctx.clone(), sql.to_string());
        async move {
            let out = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            pretty_format_batches(&out).unwrap().to_string()
        }
    };
    run("SET sets.backend = 'gpu'").await;
    let query = "EXPLAIN ANALYZE SELECT list_intersect_count(a, b) AS n FROM t";
    let total = "SELECT sum(list_intersect_count(a, b)) AS n FROM t";
    let first = run(query).await;
    let second = run(query).await;
    let answer_gpu = run(total).await;
    run("SET sets.backend = 'cpu'").await;
    let answer_cpu = run(total).await;
    assert_eq!(answer_gpu, answer_cpu);
    assert!(answer_cpu.contains("| 440000 |"), "{answer_cpu}");
    let counts = |plan: &str| {
        (
            metric(plan, "gpu_batches"),
            metric(plan, "gpu_columns_uploaded"),
            metric(plan, "gpu_columns_reused"),
            metric_scaled(plan, "bytes_to_device"),
        )
    };
    let ((g1, up1, re1, b1), (g2, up2, re2, b2)) = (counts(&first), counts(&second));
    if gpu::device().is_err() {
        assert_eq!((g1, up1, re1, g2, up2, re2), (0, 0, 0, 0, 0, 0), "{second}");
        return;
    }
    // 40,000 rows: 5 slices, each on the GPU.
    assert_eq!((g1, g2), (5, 5), "{first}\n{second}");
    // Two values buffers go up once, with the third slice (the first three cover 60% of
    // them); slices 4 and 5 and every slice of the second query read them there.
    assert_eq!((up1, re1), (2, 4), "{first}");
    assert_eq!((up2, re2), (0, 10), "{second}");
    assert!(b2 * 50.0 < b1, "{first}\n{second}");
}

/// `auto` keeps `list_intersect` on the CPU for a table of 16,384 rows (two lists of 600
/// values a row; staged, the GPU would be slower), but a table queried again is another
/// matter: the first query runs on the CPU and notes its columns, the second copies them to
/// the device and runs there, the third reads them there; the answers equal the CPU's. With
/// `sets.gpu_resident_columns = false` every batch stays on the CPU. Without a GPU the plan
/// says why and every batch runs on the CPU.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auto_runs_a_table_queried_again_on_device_resident_columns() {
    let has_gpu = gpu::device().is_ok();
    // A smaller table without a GPU: only the CPU path is checked there.
    let rows = if has_gpu { 16_384 } else { 2_048 };
    let ctx = new_context();
    for s in [
        format!(
            "CREATE TABLE t AS SELECT range(v, v + 600) AS a, range(v + 300, v + 900) AS b FROM generate_series(1, {rows}) AS s(v)"
        ),
        "SET sets.backend = 'auto'".to_string(),
    ] {
        ctx.sql(&s).await.unwrap().collect().await.unwrap();
    }
    let run = |sql: String| {
        let ctx = ctx.clone();
        async move {
            let out = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
            pretty_format_batches(&out).unwrap().to_string()
        }
    };
    // array_length, not cardinality: cardinality(list_intersect(..)) is planned as
    // list_intersect_count, and this test follows the lists' own path.
    let query = "EXPLAIN ANALYZE SELECT array_length(list_intersect(a, b)) AS n FROM t";
    let total = "SELECT sum(array_length(list_intersect(a, b))) AS n FROM t";
    let first = run(query.to_string()).await;
    let second = run(query.to_string()).await;
    let third = run(query.to_string()).await;
    let answer_auto = run(total.to_string()).await;
    run("SET sets.gpu_resident_columns = false".to_string()).await;
    let off = run(query.to_string()).await;
    run("SET sets.backend = 'cpu'".to_string()).await;
    let answer_cpu = run(total.to_string()).await;
    assert_eq!(answer_auto, answer_cpu);
    assert!(
        answer_cpu.contains(&format!("| {} |", 300 * rows)),
        "{answer_cpu}"
    );
    for plan in [&first, &second, &third, &off] {
        // Printed scaled: "16.38 K".
        let got = metric_scaled(plan, "rows");
        assert!((got - rows as f64).abs() <= 0.01 * rows as f64, "{plan}");
    }
    let e = match gpu::device() {
        Err(e) => e,
        Ok(_) => {
            assert!(
                first.contains("list_intersect=cpu (auto: ")
                    && first.contains("queried before runs on the GPU"),
                "{first}"
            );
            assert_eq!(metric(&first, "gpu_batches"), 0, "{first}");
            assert!(metric(&first, "cpu_batches") >= 1, "{first}");
            // Every batch's two columns go up once, in the second query.
            assert!(metric(&second, "gpu_batches") >= 1, "{second}");
            assert_eq!(metric(&second, "cpu_batches"), 0, "{second}");
            let uploaded = metric(&second, "gpu_columns_uploaded");
            assert_eq!(uploaded, 2 * metric(&second, "gpu_batches"), "{second}");
            assert_eq!(metric(&third, "gpu_columns_uploaded"), 0, "{third}");
            assert_eq!(metric(&third, "gpu_columns_reused"), uploaded, "{third}");
            assert_eq!(metric(&off, "gpu_batches"), 0, "{off}");
            assert!(!off.contains("queried before"), "{off}");
            return;
        }
    };
    for plan in [&first, &second, &third] {
        assert!(
            plan.contains(&format!("list_intersect=cpu (no GPU: {e})")),
            "{plan}"
        );
        assert_eq!(metric(plan, "gpu_batches"), 0, "{plan}");
    }
}

/// The sum of metric `name=` over every line that has it (an aggregate's partial and final
/// `SetsBackendExec`).
fn metric_sum(plan: &str, name: &str) -> u64 {
    let key = format!("{name}=");
    plan.match_indices(&key)
        .map(|(at, _)| {
            plan[at + key.len()..]
                .chars()
                .take_while(|c| c.is_ascii_digit())
                .collect::<String>()
                .parse::<u64>()
                .unwrap_or_else(|_| panic!("{name} is not a count in {plan}"))
        })
        .sum()
}

/// `list_intersect_agg` with `GROUP BY`: `EXPLAIN ANALYZE` shows the choice above the partial
/// and the final aggregate and what their folds did: on the CPU under 'cpu'; under 'gpu', on
/// the device (batches, bytes each way) when there is one, else the CPU with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn explain_analyze_shows_list_intersect_agg_folds() {
    let setup = [
        "CREATE TABLE p AS SELECT v % 40 AS g, range(v % 7, 2000, 1 + v % 3) AS l FROM generate_series(1, 120) AS s(v)",
    ];
    let query = "SELECT g, list_intersect_agg(l) FROM p GROUP BY g";
    let plan = explain_analyze_of("cpu", &setup, query).await;
    assert_eq!(
        plan.matches("list_intersect_agg=cpu (sets.backend = 'cpu')")
            .count(),
        2,
        "{plan}"
    );
    // The partial folds the 120 lists; the final merges the partial results.
    assert!(metric_sum(&plan, "rows") >= 120, "{plan}");
    assert!(metric_sum(&plan, "cpu_batches") >= 1, "{plan}");
    assert_eq!(metric_sum(&plan, "gpu_batches"), 0, "{plan}");

    let plan = explain_analyze_of("gpu", &setup, query).await;
    match gpu::device() {
        Err(e) => {
            assert!(
                plan.contains(&format!("list_intersect_agg=cpu (no GPU: {e})")),
                "{plan}"
            );
            assert_eq!(metric_sum(&plan, "gpu_batches"), 0, "{plan}");
        }
        Ok(_) => {
            assert!(
                plan.contains("list_intersect_agg=gpu (sets.backend = 'gpu'"),
                "{plan}"
            );
            assert!(metric_sum(&plan, "rows") >= 120, "{plan}");
            assert!(metric_sum(&plan, "gpu_batches") >= 1, "{plan}");
            assert_eq!(metric_sum(&plan, "cpu_batches"), 0, "{plan}");
            assert!(metric_sum(&plan, "bytes_to_device") > 0, "{plan}");
            assert!(metric_sum(&plan, "bytes_from_device") > 0, "{plan}");
        }
    }
}

/// `sets.backend = 'gpu'` in a session whose memory pool is too small for a batch's GPU
/// staging runs the batch on the CPU (same answer, `gpu_batches=0`); a large pool lets it
/// run on the device, and every reservation is returned when the query ends. Without a GPU
/// every batch is a CPU batch in both.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gpu_staging_is_reserved_in_the_query_pool() {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::prelude::SessionContext;
    use datafusion_sets::SessionStateBuilderExt;
    let mut answers = Vec::new();
    for limit in [256 << 10, 1 << 30] {
        let runtime = RuntimeEnvBuilder::new()
            .with_memory_limit(limit, 1.0)
            .build_arc()
            .unwrap();
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_runtime_env(std::sync::Arc::clone(&runtime))
            .with_sets()
            .build();
        let ctx = SessionContext::new_with_state(state);
        // One batch of 8,192 rows of two 40-value lists: ~2.6 MB staged, far past 256 KiB.
        for s in [
            "SET sets.backend = 'gpu'",
            "SET sets.gpu_resident_columns = false",
            "CREATE TABLE t AS SELECT range(v, v + 40) AS a, range(v + 7, v + 90, 3) AS b FROM generate_series(1, 8192) AS s(v)",
        ] {
            ctx.sql(s).await.unwrap().collect().await.unwrap();
        }
        let run = |sql: String| {
            let ctx = ctx.clone();
            async move {
                let out = ctx.sql(&sql).await.unwrap().collect().await.unwrap();
                pretty_format_batches(&out).unwrap().to_string()
            }
        };
        let lists = run("EXPLAIN ANALYZE SELECT list_intersect(a, b) FROM t".into()).await;
        answers.push(run("SELECT sum(cardinality(list_intersect(a, b))) FROM t".into()).await);
        assert_eq!(runtime.memory_pool.reserved(), 0, "{limit}");
        // topk_bm25 over a small index (it fits the small pool): 5,000 queries' top-10 come
        // back through ~0.4 MB of staging, past the small pool too.
        for s in [
            "CREATE TABLE docs AS SELECT v AS doc_id, concat('w', v % 7, ' x', v % 11) AS body FROM generate_series(1, 500) AS s(v)",
            "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')",
            "CREATE TABLE q AS SELECT v AS qid, concat('w', v % 7, ' x', v % 5) AS text FROM generate_series(1, 5000) AS s(v)",
        ] {
            ctx.sql(s).await.unwrap().collect().await.unwrap();
        }
        let topk =
            run("EXPLAIN ANALYZE SELECT qid, topk_bm25('idx', text, 10) FROM q".into()).await;
        answers.push(
            run("SELECT sum(cardinality(topk_bm25('idx', text, 10))), sum(topk_bm25('idx', text, 10)[10]['doc_id']) FROM q".into())
                .await,
        );
        for plan in [&lists, &topk] {
            let (gpu_batches, cpu_batches) =
                (metric(plan, "gpu_batches"), metric(plan, "cpu_batches"));
            if gpu::device().is_err() || limit < 1 << 20 {
                assert_eq!(gpu_batches, 0, "{limit}: {plan}");
                assert!(cpu_batches >= 1, "{limit}: {plan}");
            } else {
                assert!(gpu_batches >= 1, "{limit}: {plan}");
                assert_eq!(cpu_batches, 0, "{limit}: {plan}");
            }
        }
    }
    assert_eq!(answers[0], answers[2]);
    assert_eq!(answers[1], answers[3]);
    assert!(answers[0].contains("| 90112 "), "{}", answers[0]);
    assert!(answers[1].contains("| 50000 "), "{}", answers[1]);
}
