//! `topk_bm25` over a sharded index stored as Hive-partitioned Parquet, one directory per
//! shard (`COPY ... PARTITIONED BY (shard)`), on real data: the gcide dictionary in 8 shards,
//! queried with the TREC 2005 Terabyte efficiency log.
//!
//! Read back with `datafusion.optimizer.preserve_file_partitions`, the scan itself declares
//! its partitioning by `shard`, so the shard plan needs no exchange: each partition reads its
//! shards' files and ranks them. Every mode must answer row for row (rank, document, score
//! unrounded) what the unsharded index answers in one load.
//!
//! Data: `bench-data/` (or `$SETS_BENCH_DATA`); without it the test prints why and passes,
//! unless `SETS_REQUIRE_DATA=1`.

mod common;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use std::sync::Arc;

use datafusion::common::tree_node::{Transformed, TreeNode};
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::DataSourceExec;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_sets::bm25::{index_loads, kept_shard_partitions};

async fn run(ctx: &SessionContext, sql: &str) -> Result<Vec<RecordBatch>> {
    ctx.sql(sql).await?.collect().await
}

fn lines(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    text.lines().map(str::to_string).collect()
}

/// The partitions a shard plan's ranking node found kept loaded (its EXPLAIN ANALYZE counter).
fn kept_partitions(plan: &Arc<dyn ExecutionPlan>) -> usize {
    let own = plan
        .metrics()
        .and_then(|m| m.sum_by_name("partitions_kept_loaded"))
        .map_or(0, |v| v.as_usize());
    own + plan
        .children()
        .into_iter()
        .map(kept_partitions)
        .sum::<usize>()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hive_partitioned_shards_search_without_an_exchange() -> Result<()> {
    let dir = common::bench_data();
    let (docs, queries) = (
        dir.join("gcide/docs.parquet"),
        dir.join("queries/queries.parquet"),
    );
    if !common::data_present("sharded search", &[&docs, &queries]) {
        return Ok(());
    }
    let ctx = common::sets_session(SessionConfig::new().with_target_partitions(4));
    ctx.register_parquet(
        "docs",
        docs.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await?;
    ctx.register_parquet(
        "queries",
        queries.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await?;
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("idx");
    let out = out.to_str().unwrap();
    run(
        &ctx,
        &format!(
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'shards=8')) TO '{out}/' \
             STORED AS PARQUET PARTITIONED BY (shard)"
        ),
    )
    .await?;
    let shard_dirs = std::fs::read_dir(out).unwrap().count();
    assert_eq!(shard_dirs, 8, "one directory per shard");
    run(
        &ctx,
        &format!("CREATE EXTERNAL TABLE idx_sh STORED AS PARQUET PARTITIONED BY (shard) LOCATION '{out}/'"),
    )
    .await?;
    run(
        &ctx,
        "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text')",
    )
    .await?;
    for set in [
        "SET datafusion.optimizer.preserve_file_partitions = 1",
        "SET sets.topk_bm25_distribution = 'shards'",
    ] {
        run(&ctx, set).await?;
    }
    let texts = run(
        &ctx,
        "SELECT text FROM queries WHERE source = 'terabyte05-eff' AND text LIKE '% %' \
         ORDER BY qid LIMIT 12",
    )
    .await?;
    let texts: Vec<String> = lines(&texts)
        .iter()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(|l| l.trim_matches(|c| c == '|' || c == ' ').replace('\'', "''"))
        .collect();
    assert_eq!(texts.len(), 12);
    let mut hits = 0;
    for (i, text) in texts.iter().enumerate() {
        let (mode, k) = [("or", 10), ("and", 100), ("and_or", 10), ("or", 1000)][i % 4];
        let sharded = format!("SELECT * FROM topk_bm25('idx_sh', '{text}', {k}, '{mode}')");
        let plan = ctx.sql(&sharded).await?.create_physical_plan().await?;
        let shown = displayable(plan.as_ref()).indent(true).to_string();
        assert!(shown.contains("TopkBm25ShardsExec"), "{shown}");
        assert!(
            !shown.contains("RepartitionExec"),
            "the shards' files already partition the scan:\n{shown}"
        );
        assert!(
            shown.contains("output_partitioning=Hash([shard@"),
            "{shown}"
        );
        let loads = index_loads();
        let got = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        // The first query loads each partition's shards; later ones find them kept loaded
        // (the files are unchanged), as EXPLAIN ANALYZE's counter says too.
        let loaded = index_loads() - loads;
        match i {
            0 => assert!(loaded > 0, "the first query loads the shards"),
            _ => {
                assert_eq!(loaded, 0, "query {i} loaded {loaded} partitions again");
                let kept = kept_partitions(&plan);
                assert!(kept > 0, "{kept} partitions kept loaded");
            }
        }
        let whole = format!("SELECT * FROM topk_bm25('idx', '{text}', {k}, '{mode}')");
        run(&ctx, "SET sets.topk_bm25_distribution = 'single'").await?;
        let expected = run(&ctx, &whole).await?;
        run(&ctx, "SET sets.topk_bm25_distribution = 'shards'").await?;
        assert_eq!(lines(&got), lines(&expected), "{sharded}");
        hits += expected.iter().map(|b| b.num_rows()).sum::<usize>();
    }
    assert!(hits > 1000, "{hits} hits in all");

    // A datafusion-distributed task scans its slice of the file groups, and the next query
    // may send another task to this process: each partition is found by its own files,
    // whatever the scan's other groups. Here the same groups, rotated.
    let text = &texts[0];
    let sharded = format!("SELECT * FROM topk_bm25('idx_sh', '{text}', 10, 'or')");
    let plan = ctx.sql(&sharded).await?.create_physical_plan().await?;
    let expected = datafusion::physical_plan::collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let rotated = plan
        .transform_up(|node| {
            let Some(scan) = node.downcast_ref::<DataSourceExec>() else {
                return Ok(Transformed::no(node));
            };
            let Some(files) = scan.data_source().downcast_ref::<FileScanConfig>() else {
                return Ok(Transformed::no(node));
            };
            let mut files = files.clone();
            assert!(
                files.file_groups.len() > 1,
                "{} groups",
                files.file_groups.len()
            );
            files.file_groups.rotate_left(1);
            Ok(Transformed::yes(
                DataSourceExec::from_data_source(files) as Arc<dyn ExecutionPlan>
            ))
        })?
        .data;
    let loads = index_loads();
    let got = datafusion::physical_plan::collect(Arc::clone(&rotated), ctx.task_ctx()).await?;
    assert_eq!(
        index_loads() - loads,
        0,
        "a rotated slicing loaded shards again"
    );
    assert!(kept_partitions(&rotated) > 0);
    assert_eq!(lines(&got), lines(&expected));

    // The scalar over a column of queries: the distinct texts ranked shard by shard and
    // joined back to the rows; NULL texts stay NULL, repeated texts get the same list.
    run(
        &ctx,
        "CREATE TABLE q AS SELECT qid, CASE WHEN length(text) % 13 = 0 THEN NULL ELSE text END AS text \
         FROM queries WHERE source = 'terabyte05-eff' \
         UNION ALL SELECT concat(qid, 'b'), text FROM queries \
         WHERE source = 'terabyte05-eff' AND length(text) % 7 = 0",
    )
    .await?;
    for (mode, k) in [("or", 10), ("and", 5), ("and_or", 20)] {
        let sql = |table: &str| {
            format!(
                "SELECT qid, topk_bm25('{table}', text, {k}, '{mode}') AS hits FROM q ORDER BY qid"
            )
        };
        run(&ctx, "SET sets.topk_bm25_distribution = 'shards'").await?;
        let plan = ctx
            .sql(&sql("idx_sh"))
            .await?
            .create_physical_plan()
            .await?;
        let shown = displayable(plan.as_ref()).indent(true).to_string();
        assert!(shown.contains("TopkBm25QueriesShardsExec"), "{shown}");
        assert!(!shown.contains("AsyncFuncExec"), "{shown}");
        let got = datafusion::physical_plan::collect(plan, ctx.task_ctx()).await?;
        run(&ctx, "SET sets.topk_bm25_distribution = 'single'").await?;
        let expected = run(&ctx, &sql("idx")).await?;
        let (got, expected) = (lines(&got), lines(&expected));
        assert!(expected.len() > 10_000, "{} rows", expected.len());
        assert_eq!(got, expected, "{mode} k={k}");
    }
    // In an aggregate's argument too; a NULL text gets NULL.
    run(&ctx, "SET sets.topk_bm25_distribution = 'shards'").await?;
    let nulls = "SELECT count(*) FILTER (WHERE text IS NULL), \
                 count(*) FILTER (WHERE topk_bm25('idx_sh', text, 3) IS NULL) FROM q";
    let nulls = lines(&run(&ctx, nulls).await?);
    let counts: Vec<&str> = nulls[3]
        .split('|')
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .collect();
    assert!(counts[0] != "0" && counts[0] == counts[1], "{nulls:?}");
    let agg = "SELECT count(*), sum(cardinality(topk_bm25('idx_sh', text, 10))) FROM q";
    let shown = lines(&run(&ctx, &format!("EXPLAIN {agg}")).await?).join("\n");
    assert!(shown.contains("TopkBm25QueriesShardsExec"), "{shown}");
    let got = lines(&run(&ctx, agg).await?);
    run(&ctx, "SET sets.topk_bm25_distribution = 'single'").await?;
    let expected = lines(&run(&ctx, &agg.replace("idx_sh", "idx")).await?);
    // The values (the headers name the tables, so the padding differs).
    let cells = |l: &str| -> Vec<String> { l.split('|').map(|c| c.trim().to_string()).collect() };
    assert_eq!(cells(&got[3]), cells(&expected[3]));

    // A shard file rewritten in place (here: only its modification time) is read again, and
    // the partition kept from its old version is released, not left to age out.
    run(&ctx, "SET sets.topk_bm25_distribution = 'shards'").await?;
    let search = |table: &str| format!("SELECT * FROM topk_bm25('{table}', '{text}', 10)");
    let before = lines(&run(&ctx, &search("idx_sh")).await?);
    let (kept, loads) = (kept_shard_partitions(), index_loads());
    let shard = std::fs::read_dir(out)
        .unwrap()
        .flat_map(|d| std::fs::read_dir(d.unwrap().path()).unwrap())
        .map(|f| f.unwrap().path())
        .find(|f| f.extension().is_some_and(|e| e == "parquet"))
        .expect("a shard file");
    let file = std::fs::File::options().write(true).open(&shard).unwrap();
    file.set_modified(std::time::SystemTime::now() + std::time::Duration::from_secs(3600))
        .unwrap();
    drop(file);
    // DataFusion keeps a table's file listing (with no expiry by default): cleared here, as
    // its expiry (`datafusion.runtime.list_files_cache_ttl`) would.
    if let Some(listed) = ctx.runtime_env().cache_manager.get_list_files_cache() {
        listed.clear();
    }
    assert_eq!(lines(&run(&ctx, &search("idx_sh")).await?), before);
    assert!(
        index_loads() > loads,
        "the rewritten shard was not read again"
    );
    assert_eq!(
        kept_shard_partitions(),
        kept,
        "the old version's partition stayed kept"
    );

    // Dropping a table releases the shards kept from it: its files, or (a copy in memory,
    // shuffled by shard at every query) its batches.
    run(&ctx, "CREATE TABLE idx_mem AS SELECT * FROM idx_sh").await?;
    run(&ctx, &search("idx_mem")).await?;
    let with_both = kept_shard_partitions();
    run(&ctx, "DROP TABLE idx_sh").await?;
    let with_memory = kept_shard_partitions();
    assert!(
        with_memory > 0 && with_memory < with_both,
        "{with_both} then {with_memory}"
    );
    run(&ctx, "DROP TABLE idx_mem").await?;
    assert_eq!(kept_shard_partitions(), 0);
    Ok(())
}
