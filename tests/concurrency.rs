//! Many queries at once in one `SessionContext`, as an embedding server runs them: searches,
//! joins and intersections mixed, while index tables are dropped and created again, over
//! the shared caches (row verdicts, loaded indexes). Every answer equals the serial one, and
//! nothing deadlocks or stays held.
//!
//! The serial answers come from the CPU backend; the concurrent queries run on
//! `$SETS_TEST_BACKEND` (default 'auto'; the device script runs them on 'gpu' too, over the
//! resident GPU columns and the resident index).

use std::sync::Arc;
use std::time::Duration;

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::prelude::{SessionConfig, SessionContext};

mod common;

const QUERIES: [&str; 6] = [
    "SELECT qid, topk_bm25('idx', q, 5) FROM queries ORDER BY qid",
    "SELECT * FROM topk_bm25('idx', 'w3 v1', 7) ORDER BY rank",
    "SELECT left_id, right_id FROM similarity_join('sets', 'id', 'tokens', 'jaccard', 0.5) ORDER BY 1, 2",
    "SELECT count(*) FROM sets a JOIN sets b ON a.id < b.id AND dice(a.tokens, b.tokens) >= 0.6",
    "SELECT id, list_intersect(tokens, [1, 2, 3, 5, 8, 13]) FROM sets ORDER BY id",
    "SELECT g, list_intersect_agg(tokens) FROM (SELECT id % 9 AS g, tokens FROM sets) GROUP BY g ORDER BY g",
];

async fn answer(ctx: &SessionContext, sql: &str) -> Result<String, String> {
    let batches = ctx
        .sql(sql)
        .await
        .map_err(|e| e.to_string())?
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok(pretty_format_batches(&batches).unwrap().to_string())
}

async fn setup() -> SessionContext {
    let ctx = common::sets_session(SessionConfig::new().with_target_partitions(4));
    for sql in [
        "CREATE TABLE docs AS SELECT value AS id, \
         concat('w', value % 31, ' w', value % 7, ' v', value % 5, ' x', value) AS body \
         FROM generate_series(1, 20000)",
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
        "CREATE TABLE queries AS SELECT value AS qid, concat('w', value % 31, ' v', value % 5) AS q \
         FROM generate_series(1, 300)",
        "CREATE TABLE sets AS SELECT value AS id, \
         [value % 13, value % 17, 20 + value % 3, 30 + value % 4] AS tokens \
         FROM generate_series(1, 3000)",
    ] {
        ctx.sql(sql).await.unwrap().collect().await.unwrap();
    }
    ctx
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_queries_answer_as_serial_ones_while_tables_change() {
    let Some(backend) = common::test_backend("concurrency") else {
        return;
    };
    let ctx = Arc::new(setup().await);
    answer(&ctx, "SET sets.backend = 'cpu'").await.unwrap();
    let mut serial = Vec::new();
    for q in QUERIES {
        serial.push(answer(&ctx, q).await.unwrap());
    }
    answer(&ctx, &format!("SET sets.backend = '{backend}'"))
        .await
        .unwrap();
    let serial = Arc::new(serial);
    let run = async {
        let mut tasks = Vec::new();
        for worker in 0..12 {
            let (ctx, serial) = (Arc::clone(&ctx), Arc::clone(&serial));
            tasks.push(tokio::spawn(async move {
                let mut mismatches = Vec::new();
                for round in 0..4 {
                    let i = (worker + round) % QUERIES.len();
                    match answer(&ctx, QUERIES[i]).await {
                        Ok(a) if a == serial[i] => {}
                        Ok(a) => mismatches.push(format!("{}: {a}", QUERIES[i])),
                        // The index table may be between its drop and its new copy.
                        Err(e) if e.contains("table 'idx' not found") => {}
                        Err(e) => mismatches.push(format!("{}: {e}", QUERIES[i])),
                    }
                }
                mismatches
            }));
        }
        // Meanwhile the index is dropped and built again, with the same content.
        let churn = {
            let ctx = Arc::clone(&ctx);
            tokio::spawn(async move {
                for _ in 0..6 {
                    answer(&ctx, "DROP TABLE idx").await.unwrap();
                    answer(
                        &ctx,
                        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
                    )
                    .await
                    .unwrap();
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            })
        };
        let mut mismatches = Vec::new();
        for t in tasks {
            mismatches.extend(t.await.unwrap());
        }
        churn.await.unwrap();
        mismatches
    };
    let mismatches = tokio::time::timeout(Duration::from_secs(300), run)
        .await
        .expect("a deadlock: 12 workers did not finish in 300 s");
    assert!(mismatches.is_empty(), "{}", mismatches.join("\n"));
    // After the churn the latest index answers as before.
    assert_eq!(answer(&ctx, QUERIES[1]).await.unwrap(), serial[1]);
    // Dropped, the last index leaves nothing reserved: no copy leaked from the churn.
    answer(&ctx, "DROP TABLE idx").await.unwrap();
    assert_eq!(ctx.runtime_env().memory_pool.reserved(), 0);
}
