//! The loaded-index cache over a table's life: what a search sees and what the memory pool
//! holds after INSERT, replacement, DROP and new `sets.bm25_*` values.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray};
use datafusion::arrow::datatypes::UInt32Type;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;

/// A session whose pool the test reads.
fn session(limit: usize) -> (SessionContext, Arc<dyn MemoryPool>) {
    let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(limit));
    let runtime = RuntimeEnvBuilder::new()
        .with_memory_pool(Arc::clone(&pool))
        .build_arc()
        .unwrap();
    let state = SessionStateBuilder::new()
        .with_config(SessionConfig::new().with_target_partitions(2))
        .with_runtime_env(runtime)
        .with_default_features()
        .with_sets()
        .build();
    (SessionContext::new_with_state(state), pool)
}

async fn run(ctx: &SessionContext, sql: &str) -> Vec<datafusion::arrow::array::RecordBatch> {
    ctx.sql(sql).await.unwrap().collect().await.unwrap()
}

async fn docs_of(ctx: &SessionContext, sql: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for b in run(ctx, sql).await {
        let c = b.column(0).as_primitive::<UInt32Type>();
        out.extend(c.iter().flatten());
    }
    out
}

/// A corpus big enough that its index is a visible share of the pool: 4,000 documents.
async fn corpus(ctx: &SessionContext, table: &str) {
    run(
        ctx,
        &format!(
            "CREATE TABLE {table} AS SELECT value AS id, \
             concat('w', value % 97, ' w', value % 13, ' x', value, ' common') AS body \
             FROM generate_series(0, 3999)"
        ),
    )
    .await;
}

#[tokio::test]
async fn drop_and_replace_release_the_loaded_index_at_once() {
    let (ctx, pool) = session(1 << 30);
    corpus(&ctx, "docs").await;
    run(
        &ctx,
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
    )
    .await;
    assert_eq!(pool.reserved(), 0, "nothing held before a search");
    let hits = docs_of(&ctx, "SELECT doc_id FROM topk_bm25('idx', 'x17', 3)").await;
    assert_eq!(hits, vec![17]);
    let loaded = pool.reserved();
    assert!(loaded > 100_000, "index and scores reserved: {loaded}");

    // Replaced: the old index goes with the old table (the new one is not loaded yet).
    run(
        &ctx,
        "CREATE OR REPLACE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body') WHERE term <> 'x17'",
    )
    .await;
    assert_eq!(pool.reserved(), 0, "replaced table's index released");
    let hits = docs_of(&ctx, "SELECT doc_id FROM topk_bm25('idx', 'x17', 3)").await;
    assert!(hits.is_empty(), "the replacement has no x17: {hits:?}");
    assert!(pool.reserved() > 100_000);

    run(&ctx, "DROP TABLE idx").await;
    assert_eq!(pool.reserved(), 0, "dropped table's index released");
    let err = ctx
        .sql("SELECT * FROM topk_bm25('idx', 'x17', 3)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert!(err.to_string().contains("table 'idx' not found"), "{err}");
}

#[tokio::test]
async fn new_bm25_parameters_replace_old_scores_instead_of_piling_up() {
    let (ctx, pool) = session(1 << 30);
    corpus(&ctx, "docs").await;
    run(
        &ctx,
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
    )
    .await;
    let mut held = Vec::new();
    for k1 in ["0.5", "0.9", "1.2", "1.5", "2.0", "3.0"] {
        run(&ctx, &format!("SET sets.bm25_k1 = {k1}")).await;
        let hits = docs_of(&ctx, "SELECT doc_id FROM topk_bm25('idx', 'w3 common', 2)").await;
        assert_eq!(hits.len(), 2);
        held.push(pool.reserved());
    }
    // Index + one parameter set, then + two, then it stays there.
    assert!(held[1] > held[0], "{held:?}");
    assert!(held[2..].iter().all(|&h| h == held[1]), "{held:?}");
}

#[tokio::test]
async fn a_load_over_the_limit_fails_before_it_allocates_the_index() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("idx.parquet");
    let (big, _) = session(1 << 30);
    corpus(&big, "docs").await;
    run(
        &big,
        &format!(
            "COPY (SELECT * FROM bm25_index('docs', 'id', 'body')) TO '{}' STORED AS PARQUET",
            path.display()
        ),
    )
    .await;
    // The index of 4,000 documents needs several hundred kilobytes.
    let (ctx, pool) = session(64 << 10);
    run(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE idx STORED AS PARQUET LOCATION '{}'",
            path.display()
        ),
    )
    .await;
    let err = ctx
        .sql("SELECT * FROM topk_bm25('idx', 'x17', 3)")
        .await
        .unwrap()
        .collect()
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("Resources exhausted"),
        "expected ResourcesExhausted, got {err}"
    );
    assert_eq!(pool.reserved(), 0, "a failed load holds nothing");
    // With room, the same file loads and answers.
    let (ctx, _) = session(64 << 20);
    run(
        &ctx,
        &format!(
            "CREATE EXTERNAL TABLE idx STORED AS PARQUET LOCATION '{}'",
            path.display()
        ),
    )
    .await;
    assert_eq!(
        docs_of(&ctx, "SELECT doc_id FROM topk_bm25('idx', 'x17', 3)").await,
        vec![17]
    );
}

#[tokio::test]
async fn a_table_read_again_after_insert_sees_the_new_rows() {
    let (ctx, _pool) = session(1 << 30);
    run(
        &ctx,
        "CREATE TABLE d(id INT, t VARCHAR) AS VALUES (1, 'apple zebra'), (2, 'banana'), (3, 'apple')",
    )
    .await;
    run(
        &ctx,
        "CREATE TABLE idx AS SELECT * FROM bm25_index('d', 'id', 't') WHERE term <> 'zebra'",
    )
    .await;
    let q = "SELECT doc_id FROM topk_bm25('idx', 'zebra', 3)";
    assert!(docs_of(&ctx, q).await.is_empty());
    run(
        &ctx,
        "INSERT INTO idx SELECT * FROM bm25_index('d', 'id', 't') WHERE term = 'zebra'",
    )
    .await;
    assert_eq!(docs_of(&ctx, q).await, vec![1]);
    // The scalar form reads the same cache.
    let b = run(&ctx, "SELECT topk_bm25('idx', 'zebra', 3)").await;
    assert_eq!(b[0].column(0).as_list::<i32>().value(0).len(), 1);
}
