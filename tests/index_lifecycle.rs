//! The loaded-index cache over a table's life: what a search sees and what the memory pool
//! holds after INSERT, replacement, DROP and new `sets.bm25_*` values, and a table without a
//! scan identity, matched by its rows' buffers.

use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, RecordBatch, UInt32Array};
use datafusion::arrow::datatypes::{SchemaRef, UInt32Type};
use datafusion::catalog::streaming::StreamingTable;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryPool};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::physical_plan::SendableRecordBatchStream;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::streaming::PartitionStream;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;

/// The count of index loads is the process's: the tests that read it run alone.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

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

/// The test's own copy of every batch (new buffers, as a file read makes), or the batches
/// themselves (what a host's in-memory table hands over through FFI).
#[derive(Debug)]
struct Batches {
    schema: SchemaRef,
    batches: Vec<RecordBatch>,
    copy: bool,
}

impl PartitionStream for Batches {
    fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    fn execute(&self, _ctx: Arc<TaskContext>) -> SendableRecordBatchStream {
        let batches: Vec<_> = if self.copy {
            self.batches
                .iter()
                .map(|b| {
                    let all = UInt32Array::from_iter_values(0..b.num_rows() as u32);
                    let columns = b
                        .columns()
                        .iter()
                        .map(|c| datafusion::arrow::compute::take(c, &all, None).unwrap())
                        .collect();
                    RecordBatch::try_new(b.schema(), columns).unwrap()
                })
                .collect()
        } else {
            self.batches.clone()
        };
        Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::iter(batches.into_iter().map(Ok)),
        ))
    }
}

/// Register `name` as a streaming table (no scan identity) over `batches`, in two partitions.
fn stream_table(ctx: &SessionContext, name: &str, batches: Vec<RecordBatch>, copy: bool) {
    let schema = batches[0].schema();
    let half = batches.len() / 2;
    let parts: Vec<Arc<dyn PartitionStream>> = [&batches[..half], &batches[half..]]
        .into_iter()
        .map(|b| {
            Arc::new(Batches {
                schema: Arc::clone(&schema),
                batches: b.to_vec(),
                copy,
            }) as _
        })
        .collect();
    let table = StreamingTable::try_new(schema, parts).unwrap();
    ctx.deregister_table(name).unwrap();
    ctx.register_table(name, Arc::new(table)).unwrap();
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
    let _alone = SERIAL.lock().await;
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
    let _alone = SERIAL.lock().await;
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
    let _alone = SERIAL.lock().await;
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
    let _alone = SERIAL.lock().await;
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

#[tokio::test]
async fn a_table_without_scan_identity_is_matched_by_its_buffers() {
    let _alone = SERIAL.lock().await;
    let (ctx, _pool) = session(1 << 30);
    corpus(&ctx, "docs").await;
    let index = run(&ctx, "SELECT * FROM bm25_index('docs', 'id', 'body')").await;
    let q = |t: &str| format!("SELECT doc_id FROM topk_bm25('{t}', 'x17 w3', 5) ORDER BY rank");
    run(
        &ctx,
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
    )
    .await;
    let want = docs_of(&ctx, &q("idx")).await;
    assert_eq!(want.len(), 5);

    // The same buffers at every read: loaded once, however the partitions come.
    stream_table(&ctx, "same", index.clone(), false);
    let before = datafusion_sets::bm25::index_loads();
    for _ in 0..3 {
        assert_eq!(docs_of(&ctx, &q("same")).await, want);
    }
    assert_eq!(datafusion_sets::bm25::index_loads(), before + 1);

    // Rows decoded afresh at every read (as from a file): loaded at every query.
    stream_table(&ctx, "fresh", index.clone(), true);
    let before = datafusion_sets::bm25::index_loads();
    for _ in 0..2 {
        assert_eq!(docs_of(&ctx, &q("fresh")).await, want);
    }
    assert_eq!(datafusion_sets::bm25::index_loads(), before + 2);

    // The table replaced by other rows under the same name: the new rows answer.
    let without = run(
        &ctx,
        "SELECT * FROM bm25_index('docs', 'id', 'body') WHERE term <> 'x17'",
    )
    .await;
    stream_table(&ctx, "same", without, false);
    let hits = docs_of(&ctx, &q("same")).await;
    assert!(!hits.contains(&17), "{hits:?}");
    assert_eq!(hits.len(), 5);
    // And back to the first rows (still held by this test): the same answers as before.
    stream_table(&ctx, "same", index, false);
    assert_eq!(docs_of(&ctx, &q("same")).await, want);
}
