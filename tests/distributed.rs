//! datafusion-sets across processes and tasks.
//!
//! 1. Codec: every query shape that uses a node or a stateful function of the crate is
//!    planned in one session, encoded with its `SetsCodec`, decoded in another session (a
//!    stand-in for another process: nothing is shared but the bytes and, for the scalar
//!    `topk_bm25`, the index table registered under its name), run there, and must answer
//!    what the first session answers.
//! 2. Per-task copies: the similarity join's plan is decoded once per output partition and
//!    each copy runs only its partition (as Ballista runs a stage); the copies together must
//!    give every pair exactly once, on real data.
//! 3. datafusion-distributed: three workers on 127.0.0.1 in this process, the coordinator
//!    planning with `with_sets_distributed`, every function on real data equal to one
//!    process, the plans really spread over stages and tasks; and the bad cases (a worker
//!    without the crate, an index table missing on a worker) give clear errors.
//!
//! Real data: `bench-data/` (or `$SETS_BENCH_DATA`), built by `benches/data/build.sh`;
//! without it the real-data parts print why and pass, unless `SETS_REQUIRE_DATA=1`.

mod common;

use std::path::Path;
use std::sync::Arc;

use datafusion::arrow::array::RecordBatch;
use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::{SessionState, SessionStateBuilder};
use datafusion::physical_plan::{
    ExecutionPlan, ExecutionPlanProperties, collect, displayable, replace_children_if_necessary,
};
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_distributed::SessionStateBuilderExt as _;
use datafusion_distributed::{
    DistributedExt, Worker, WorkerQueryContext, WorkerResolver, display_plan_ascii,
};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_to_bytes_with_extension_codec,
};
use datafusion_sets::distributed::{
    SetsCodec, SetsDistributedExt, sets_worker_session, with_sets_codec,
};
use futures::StreamExt;

/// A session with the crate and its codec, `partitions` target partitions.
fn session(partitions: usize) -> (SessionContext, SetsCodec) {
    let config = SessionConfig::new().with_target_partitions(partitions);
    let (builder, codec) = with_sets_codec(
        SessionStateBuilder::new()
            .with_default_features()
            .with_config(config),
    );
    (SessionContext::from(builder.build()), codec)
}

async fn run_all(ctx: &SessionContext, statements: &[&str]) -> Result<()> {
    for s in statements {
        ctx.sql(s).await?.collect().await?;
    }
    Ok(())
}

/// The rows of `batches`, formatted, sorted: equal for equal multisets of rows.
fn rows(batches: &[RecordBatch]) -> Vec<String> {
    let text = pretty_format_batches(batches).unwrap().to_string();
    let mut lines: Vec<String> = text
        .lines()
        .filter(|l| l.starts_with('|'))
        .skip(1)
        .map(str::to_string)
        .collect();
    lines.sort_unstable();
    lines
}

/// The small tables of the round trips, in memory (their data travel inside the plan).
const SETUP: &[&str] = &[
    "CREATE TABLE t (id INT, g INT, a INT[], b BIGINT[], s VARCHAR[]) AS VALUES \
     (1, 0, [1, 2, 3, 4], [2, 3, 9], ['x', 'y']), \
     (2, 0, [2, 3, 5], [3, 5, 7, 2], ['y', 'z']), \
     (3, 1, [1, 5, 9], [9], ['x', 'y', 'z']), \
     (4, 1, NULL, [1], ['x']), \
     (5, 2, [7, 8], [], NULL), \
     (6, 2, [2, 3, 4], [2, 3, 4, 5], ['y'])",
    "CREATE TABLE docs (id INT, body VARCHAR) AS VALUES \
     (1, 'the quick brown fox'), (2, 'the lazy dog sleeps'), (3, 'quick quick fox jumps'), \
     (4, 'a dog and a fox'), (5, 'Zürich straße café')",
    "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body')",
    "CREATE TABLE queries (qid INT, q VARCHAR) AS VALUES (1, 'quick fox'), (2, 'dog'), \
     (3, 'café'), (4, 'nothing here')",
];

/// Every query shape the codec must carry: bound calls in a projection, a filter, an
/// aggregate's arguments and the aggregate itself; the similarity join (table function, R-S,
/// the SQL join rewrite); `bm25_index`; `topk_bm25` as a table and as the async scalar.
const SHAPES: &[(&str, &str)] = &[
    (
        "SELECT id, list_intersect(a, b), list_intersect_count(a, b), jaccard(a, b) FROM t",
        "SetsBackendExec",
    ),
    (
        "SELECT id FROM t WHERE list_intersect_count(a, b) >= 2",
        "SetsBackendExec",
    ),
    (
        "SELECT g, list_intersect_agg(b), sum(cardinality(list_intersect(a, b))) FROM t GROUP BY g",
        "SetsBackendExec",
    ),
    (
        "SELECT * FROM similarity_join('t', 'id', 'b', 'jaccard', 0.3)",
        "SimilarityJoinExec",
    ),
    (
        "SELECT * FROM similarity_join('t', 'id', 'a', 't', 'id', 'b', 'overlap', 2, '>')",
        "SimilarityJoinExec",
    ),
    (
        "SELECT l.id, r.id, dice(l.s, r.s) FROM t l JOIN t r ON dice(l.s, r.s) >= 0.5 AND l.id < r.id",
        "SimilarityJoinExec",
    ),
    (
        "SELECT term, doc_ids, tfs FROM bm25_index('docs', 'id', 'body', 'stem=english')",
        "Bm25IndexExec",
    ),
    (
        "SELECT shard, term, doc_ids, df FROM bm25_index('docs', 'id', 'body', 'shards=2')",
        "shards=2",
    ),
    (
        "SELECT rank, doc_id, score FROM topk_bm25('idx', 'quick fox', 3)",
        "TopkBm25Exec",
    ),
    (
        "SELECT doc_id, score FROM topk_bm25('idx', 'dog fox', 5, 'and')",
        "TopkBm25Exec",
    ),
    (
        "SELECT qid, topk_bm25('idx', q, 2) FROM queries",
        "SetsBackendExec",
    ),
];

/// `sql` planned in `home`, sent to `away` as the codec's bytes and run there: the decoded
/// plan shows each of `nodes`, and its answer equals home's. Returns home's batch count.
async fn round_trip(
    (home, home_codec): (&SessionContext, &SetsCodec),
    (away, away_codec): (&SessionContext, &SetsCodec),
    sql: &str,
    nodes: &[&str],
    label: &str,
) -> Result<usize> {
    let plan = home.sql(sql).await?.create_physical_plan().await?;
    let expected = collect(Arc::clone(&plan), home.task_ctx()).await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, home_codec)?;
    let decoded =
        physical_plan_from_bytes_with_extension_codec(&bytes, &away.task_ctx(), away_codec)?;
    let shown = displayable(decoded.as_ref()).indent(true).to_string();
    for node in nodes {
        assert!(shown.contains(node), "{label}{sql}: no {node} in\n{shown}");
    }
    let got = collect(decoded, away.task_ctx()).await?;
    assert_eq!(rows(&got), rows(&expected), "{label}{sql}");
    Ok(expected.len())
}

/// Each shape planned in one session and run in another from the codec's bytes equals the
/// first session's answer, and the decoded plan has the crate's node (bound again: EXPLAIN
/// shows the receiver's choice).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_shape_survives_the_codec() -> Result<()> {
    let (home, home_codec) = session(2);
    run_all(&home, SETUP).await?;
    let (away, away_codec) = session(3);
    // The scalar `topk_bm25` reads its index by name where it runs.
    run_all(&away, &SETUP[1..3]).await?;
    let (from, to) = ((&home, &home_codec), (&away, &away_codec));
    for (sql, node) in SHAPES {
        let n = round_trip(from, to, sql, &[node], "").await?;
        assert!(n > 0, "{sql}: nothing to compare");
    }
    // The join spread over partitions: routers, token counts and the join's distribution
    // travel too.
    let joins = &SHAPES[3..6];
    // Per join shape (self, R-S, self): what EXPLAIN shows under each setting.
    for (distribution, nodes) in [
        ("prefix", ["PrefixRouteExec"; 3]),
        (
            "broadcast",
            [
                "distribution=replicated",
                "distribution=broadcast",
                "distribution=replicated",
            ],
        ),
    ] {
        home.sql(&format!(
            "SET sets.similarity_join_distribution = '{distribution}'"
        ))
        .await?;
        for ((sql, _), node) in joins.iter().zip(nodes) {
            let label = format!("{distribution}: ");
            let n = round_trip(from, to, sql, &[node], &label).await?;
            assert!(n > 0, "{distribution}: {sql}: nothing to compare");
        }
    }
    // The index built by term: the parts and the merge travel.
    home.sql("SET sets.bm25_index_distribution = 'terms'")
        .await?;
    let (sql, _) = SHAPES[6];
    let nodes = ["Bm25PartsExec: buckets=2", "Bm25MergeExec"];
    round_trip(from, to, sql, &nodes, "").await?;
    // The search over a sharded index's shards: the shards' ranking and the merge travel
    // (batches of 2 rows, so the planner spreads this small table over the partitions).
    run_all(
        &home,
        &[
            "SET sets.bm25_index_distribution = 'auto'",
            "CREATE TABLE idx_sh AS SELECT * FROM bm25_index('docs', 'id', 'body', 'shards=3')",
            "SET sets.topk_bm25_distribution = 'shards'",
            "SET datafusion.execution.batch_size = 2",
        ],
    )
    .await?;
    for mode in ["or", "and", "and_or"] {
        let sql = format!(
            "SELECT rank, doc_id, score FROM topk_bm25('idx_sh', 'quick fox dog', 2, '{mode}')"
        );
        let nodes = ["TopkBm25MergeExec", "TopkBm25ShardsExec", "Hash([shard@"];
        round_trip(from, to, &sql, &nodes, "").await?;
        // The scalar over a column of queries: the distinct queries ranked by the shards,
        // merged per query and joined back.
        let sql = format!("SELECT id, topk_bm25('idx_sh', body, 2, '{mode}') AS hits FROM docs");
        let nodes = [
            "TopkBm25QueriesMergeExec",
            "TopkBm25QueriesShardsExec",
            "Hash([shard@",
        ];
        round_trip(from, to, &sql, &nodes, "").await?;
    }
    Ok(())
}

/// `sql`'s plan decoded once per partition of its `TopkBm25ShardsExec`, each copy ranking
/// only its partition's shards (an engine's task per partition), the hits then merged by the
/// plan's own merge: the answer of the whole plan.
async fn shard_copies_answer_as_one_plan(
    ctx: &SessionContext,
    codec: &SetsCodec,
    sql: &str,
) -> Result<()> {
    let plan = ctx.sql(sql).await?.create_physical_plan().await?;
    let expected = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), codec)?;
    // The merge, the coalesce, the shards.
    let shards = |p: &Arc<dyn ExecutionPlan>| -> Arc<dyn ExecutionPlan> {
        let node = Arc::clone(p.children()[0].children()[0]);
        assert_eq!(node.name(), "TopkBm25ShardsExec", "{sql}");
        node
    };
    let partitions = shards(&plan).output_partitioning().partition_count();
    assert!(partitions > 1, "{sql}: {partitions} partition");
    let mut hits = Vec::new();
    for p in 0..partitions {
        let copy = physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), codec)?;
        let mut stream = shards(&copy).execute(p, ctx.task_ctx())?;
        while let Some(b) = stream.next().await {
            hits.push(b?);
        }
    }
    let schema = shards(&plan).schema();
    let lists = MemorySourceConfig::try_new_exec(&[hits], schema, None)?;
    let merge = replace_children_if_necessary(Arc::clone(&plan), vec![lists])?;
    let got = collect(merge, ctx.task_ctx()).await?;
    assert_eq!(rows(&got), rows(&expected), "{sql}");
    Ok(())
}

/// A session without the crate cannot decode its nodes: a clear error, not a panic.
#[tokio::test]
async fn a_session_without_the_codec_fails_clearly() -> Result<()> {
    let (home, home_codec) = session(2);
    run_all(&home, SETUP).await?;
    let plan = home
        .sql("SELECT * FROM similarity_join('t', 'id', 'b', 'jaccard', 0.3)")
        .await?
        .create_physical_plan()
        .await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &home_codec)?;
    let plain = SessionContext::new();
    let err = datafusion_proto::bytes::physical_plan_from_bytes(&bytes, &plain.task_ctx())
        .expect_err("decoded without the codec");
    assert!(err.to_string().contains("PhysicalExtensionCodec"), "{err}");
    // With the codec but without the crate's functions, a bound call cannot be bound again.
    let plan = home
        .sql("SELECT list_intersect(a, b) FROM t")
        .await?
        .create_physical_plan()
        .await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &home_codec)?;
    let (_, codec) = session(1);
    let err = physical_plan_from_bytes_with_extension_codec(&bytes, &plain.task_ctx(), &codec)
        .expect_err("bound without the crate's functions");
    assert!(err.to_string().contains("list_intersect"), "{err}");
    Ok(())
}

fn real_data(test: &str, files: &[&str]) -> Option<std::path::PathBuf> {
    let dir = common::bench_data();
    let paths: Vec<_> = files.iter().map(|f| dir.join(f)).collect();
    let refs: Vec<&Path> = paths.iter().map(|p| p.as_path()).collect();
    common::data_present(test, &refs).then_some(dir)
}

/// The join's plan decoded once per output partition, each copy running only its partition
/// (an engine's task per partition): together every pair exactly once, as in one plan.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_per_partition_gives_every_pair_once() -> Result<()> {
    let Some(dir) = real_data("copies per partition", &["debian_deps/sets.parquet"]) else {
        return Ok(());
    };
    let (ctx, codec) = session(4);
    let path = dir.join("debian_deps/sets.parquet");
    ctx.register_parquet(
        "file",
        path.to_str().unwrap(),
        ParquetReadOptions::default(),
    )
    .await?;
    // In memory: the copies decode the rows from the plan instead of the file again.
    run_all(
        &ctx,
        &["CREATE TABLE deps AS SELECT id, tokens FROM file WHERE id % 2 = 0"],
    )
    .await?;
    let mut answers = std::collections::HashMap::new();
    // One shared build (`auto` in one process), replicated (`broadcast` of a self-join: the
    // input dealt round-robin over the partitions), prefix-partitioned.
    for (distribution, sql) in ["auto", "broadcast", "prefix"].into_iter().flat_map(|d| {
        [
            "SELECT * FROM similarity_join('deps', 'id', 'tokens', 'jaccard', 0.6)",
            "SELECT l.id, r.id FROM deps l JOIN deps r ON cosine(l.tokens, r.tokens) >= 0.9 AND l.id < r.id",
        ]
        .map(|sql| (d, sql))
    }) {
        run_all(
            &ctx,
            &[&format!(
                "SET sets.similarity_join_distribution = '{distribution}'"
            )],
        )
        .await?;
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let partitions = plan.output_partitioning().partition_count();
        assert!(partitions > 1, "{sql}: {partitions} partition");
        let expected = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        let bytes = physical_plan_to_bytes_with_extension_codec(plan, &codec)?;
        let mut got = Vec::new();
        for p in 0..partitions {
            let copy =
                physical_plan_from_bytes_with_extension_codec(&bytes, &ctx.task_ctx(), &codec)?;
            let mut stream = copy.execute(p, ctx.task_ctx())?;
            while let Some(b) = stream.next().await {
                got.push(b?);
            }
        }
        let (got, expected) = (rows(&got), rows(&expected));
        // Every distribution's plan finds the pairs of one shared build.
        let first = answers.entry(sql).or_insert_with(|| expected.clone());
        assert_eq!(first, &expected, "{distribution}: {sql}");
        let sql = format!("{distribution}: {sql}");
        assert!(expected.len() > 100, "{sql}: {} pairs", expected.len());
        assert_eq!(got.len(), expected.len(), "{sql}");
        assert_eq!(got, expected, "{sql}");
    }
    Ok(())
}

/// The workers' addresses.
#[derive(Clone)]
struct Localhost(Vec<u16>);

impl WorkerResolver for Localhost {
    fn get_urls(&self) -> Result<Vec<url::Url>> {
        self.0
            .iter()
            .map(|p| {
                url::Url::parse(&format!("http://127.0.0.1:{p}"))
                    .map_err(|e| datafusion::common::DataFusionError::External(Box::new(e)))
            })
            .collect()
    }
}

/// `n` workers on 127.0.0.1, each building its sessions with `build`.
async fn start_workers<B>(n: usize, build: B) -> Vec<u16>
where
    B: datafusion_distributed::WorkerSessionBuilder + Clone + Send + Sync + 'static,
{
    let mut ports = Vec::new();
    for _ in 0..n {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        ports.push(listener.local_addr().unwrap().port());
        let worker = Worker::from_session_builder(build.clone());
        tokio::spawn(async move {
            tonic::transport::Server::builder()
                .add_service(worker.into_worker_server())
                .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
                .await
        });
    }
    ports
}

/// The coordinating session: the distributed planner over `ports`, scans cut as finely as
/// the workers allow (so even one-row-group files spread over tasks), datafusion-sets.
fn coordinator(ports: Vec<u16>) -> Result<SessionContext> {
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2))
        .with_distributed_worker_resolver(Localhost(ports))
        .with_distributed_planner()
        .with_distributed_file_scan_config_bytes_per_partition(1)?
        .with_sets_distributed()
        .build();
    Ok(SessionContext::from(state))
}

/// A worker's session: the crate, and the index table `idx` (the scalar `topk_bm25` reads
/// it by name) from `index` when given.
async fn worker_session(ctx: WorkerQueryContext, index: Option<String>) -> Result<SessionState> {
    let state = sets_worker_session(ctx).await?;
    let Some(index) = index else {
        return Ok(state);
    };
    let ctx = SessionContext::from(state);
    ctx.register_parquet("idx", &index, ParquetReadOptions::default())
        .await?;
    Ok(ctx.state())
}

/// Run `sql` on the cluster and in one process; the answers must be equal. The cluster's
/// plan must have several stages, one of them on several tasks, and a similarity join in it
/// must run on several tasks with `distribution` in EXPLAIN; with `distribution` "single",
/// the join must run in one task instead (the plan may then stay on the coordinator).
async fn same_answer(
    cluster: &SessionContext,
    local: &SessionContext,
    sql: &str,
    distribution: Option<&str>,
) -> Result<usize> {
    let df = cluster.sql(sql).await?;
    let plan = df.create_physical_plan().await?;
    let shown = display_plan_ascii(plan.as_ref(), false);
    let several = shown
        .lines()
        .any(|l| l.contains("Stage") && l.contains("tasks=") && !l.contains("tasks=1 "));
    // A join kept in one task may run in the coordinator's plan, undistributed.
    if distribution != Some("single") {
        assert!(shown.contains("Stage 1"), "{sql}: not distributed\n{shown}");
        assert!(several, "{sql}: no stage on several tasks\n{shown}");
    }
    // The join, and the index build's two halves, run on several tasks, not in a stage of one.
    for node in [
        "SimilarityJoinExec",
        "Bm25PartsExec",
        "Bm25MergeExec",
        "TopkBm25ShardsExec",
        "TopkBm25QueriesShardsExec",
    ] {
        // The node by its whole name (`Bm25MergeExec` is also the end of another's).
        let Some(at) = shown.match_indices(node).map(|(i, _)| i).find(|&i| {
            !shown[..i]
                .chars()
                .next_back()
                .is_some_and(|c| c.is_alphanumeric())
        }) else {
            continue;
        };
        let stage = shown[..at]
            .lines()
            .rev()
            .find(|l| l.contains("Stage"))
            .unwrap_or_default();
        let line = shown[at..].lines().next().unwrap_or_default();
        let several_tasks = stage.contains("tasks=") && !stage.contains("tasks=1 ");
        if node == "SimilarityJoinExec" && distribution == Some("single") {
            // Kept in one task (the stage of one task, or the coordinator's).
            let one_task = !line.contains("distribution=") && !several_tasks;
            assert!(one_task, "{sql}: not one task ({stage})\n{shown}");
            eprintln!("{}", line.trim());
            continue;
        }
        assert!(
            several_tasks,
            "{sql}: {node} runs in one task ({stage})\n{shown}"
        );
        if node == "SimilarityJoinExec" {
            assert!(
                shown.contains(distribution.unwrap_or("distribution=")),
                "{sql}:\n{shown}"
            );
        }
        eprintln!("{}", line.trim());
    }
    if std::env::var_os("SETS_SHOW_PLANS").is_some() {
        eprintln!("{shown}");
    }
    let t0 = std::time::Instant::now();
    let got = collect(plan, cluster.task_ctx()).await?;
    let expected = local.sql(sql).await?.collect().await?;
    let (got, expected) = (rows(&got), rows(&expected));
    eprintln!("{} rows in {:?}: {sql}", got.len(), t0.elapsed());
    assert_eq!(got.len(), expected.len(), "{sql}");
    assert_eq!(got, expected, "{sql}");
    Ok(expected.len())
}

/// Every function on three workers equals one process on real data.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_workers_answer_as_one_process() -> Result<()> {
    let files = [
        "gcide_words/sets.parquet",
        "debian_deps/sets.parquet",
        "gcide/docs.parquet",
        "queries/queries.parquet",
    ];
    let Some(dir) = real_data("distributed", &files) else {
        return Ok(());
    };
    let path = |f: &str| dir.join(f).to_str().unwrap().to_string();
    // The index, built once and written as Parquet: the coordinator and the workers read it.
    let tmp = tempfile::tempdir().unwrap();
    let index = tmp.path().join("idx.parquet").to_str().unwrap().to_string();
    let (local, local_codec) = session(4);
    local
        .register_parquet(
            "docs",
            &path("gcide/docs.parquet"),
            ParquetReadOptions::default(),
        )
        .await?;
    local
        .sql(&format!(
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text')) TO '{index}' STORED AS PARQUET"
        ))
        .await?
        .collect()
        .await?;
    // The same index in 8 shards (`auto` searches it shard by shard on the workers).
    let sharded = tmp
        .path()
        .join("idx_sh.parquet")
        .to_str()
        .unwrap()
        .to_string();
    local
        .sql(&format!(
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'shards=8')) TO '{sharded}' STORED AS PARQUET"
        ))
        .await?
        .collect()
        .await?;
    let with_index = Some(index.clone());
    let ports = start_workers(3, move |ctx: WorkerQueryContext| {
        let index = with_index.clone();
        async move { worker_session(ctx, index).await }
    })
    .await;
    let cluster = coordinator(ports)?;
    for ctx in [&cluster, &local] {
        for (name, file) in [
            ("words", "gcide_words/sets.parquet"),
            ("deps", "debian_deps/sets.parquet"),
            ("queries", "queries/queries.parquet"),
        ] {
            if ctx.table_exist(name)? {
                continue;
            }
            ctx.register_parquet(name, &path(file), ParquetReadOptions::default())
                .await?;
        }
        if !ctx.table_exist("docs")? {
            ctx.register_parquet(
                "docs",
                &path("gcide/docs.parquet"),
                ParquetReadOptions::default(),
            )
            .await?;
        }
        ctx.register_parquet("idx", &index, ParquetReadOptions::default())
            .await?;
        ctx.register_parquet("idx_sh", &sharded, ParquetReadOptions::default())
            .await?;
    }
    let queries = [
        // Scalars per row on every task.
        "SELECT id, list_intersect(tokens, [1, 2, 3, 5, 8, 13, 21, 34, 55, 89]) AS common, \
         list_intersect_count(tokens, [2, 3, 5, 7, 11, 13]) AS n, jaccard(tokens, [1, 2, 3]) AS j \
         FROM deps WHERE cardinality(tokens) > 3",
        // The aggregate: partial states on the tasks, merged after a shuffle.
        "SELECT id % 97 AS g, list_intersect_agg(tokens) AS common, count(*) AS n FROM deps \
         GROUP BY id % 97",
        "SELECT cardinality(tokens) AS len, sum(list_intersect_count(tokens, [1, 2, 3, 4])) AS s \
         FROM words GROUP BY cardinality(tokens)",
        // Search: the scalar over a column of queries (the index read on the workers).
        "SELECT qid, topk_bm25('idx', text, 10) AS hits FROM queries WHERE source = 'terabyte05-eff' \
         AND CAST(qid AS BIGINT) % 20 = 0",
    ];
    for sql in queries {
        let n = same_answer(&cluster, &local, sql, None).await?;
        assert!(n > 0, "{sql}: no rows");
    }
    // Search over the sharded index: on the cluster each task ranks the shards it holds with
    // the corpus's statistics and the lists are merged; one process loads the whole table.
    // Real queries, every mode; k = 1000 reaches past the shards' own lists.
    // Real queries, each mode, the AND query among those with AND matches (gcide is a
    // dictionary: most web queries have none); k = 1000 reaches past the shards' own lists.
    let texts = |filter: &str| {
        let sql = format!(
            "SELECT text FROM queries WHERE source = 'terabyte05-eff' AND {filter} ORDER BY qid LIMIT 1"
        );
        let local = local.clone();
        async move {
            let found = local.sql(&sql).await?.collect().await?;
            let found: Vec<String> = rows(&found)
                .iter()
                .map(|r| r.trim_matches(|c| c == '|' || c == ' ').replace('\'', "''"))
                .collect();
            assert_eq!(found.len(), 1, "{sql}");
            Result::<String>::Ok(found[0].clone())
        }
    };
    let or_text = texts("qid LIKE '%07'").await?;
    let and_or_text = texts("qid LIKE '%08'").await?;
    let and_text = texts(
        "qid LIKE '%9' AND text LIKE '% %' \
         AND cardinality(topk_bm25('idx', text, 20, 'and')) = 20",
    )
    .await?;
    for (text, mode, k) in [
        (&or_text, "or", 10),
        (&and_text, "and", 1000),
        (&and_or_text, "and_or", 10),
        (&and_text, "and_or", 1000),
    ] {
        let sql =
            format!("SELECT rank, doc_id, score FROM topk_bm25('idx_sh', '{text}', {k}, '{mode}')");
        let n = same_answer(&cluster, &local, &sql, None).await?;
        assert!(n > 0, "{sql}: no rows");
    }
    // The scalar over a column of queries: each task ranks the distinct queries against the
    // shards it holds, the lists merged per query and joined back to the rows.
    for mode in ["or", "and_or"] {
        let sql = format!(
            "SELECT qid, topk_bm25('idx_sh', text, 10, '{mode}') AS hits FROM queries \
             WHERE source = 'terabyte05-eff' AND CAST(qid AS BIGINT) % 10 = 0"
        );
        let n = same_answer(&cluster, &local, &sql, None).await?;
        assert!(n > 0, "{sql}: no rows");
    }
    // The same plan with each partition of the shards' ranking in its own copy (one process).
    local
        .sql("SET sets.topk_bm25_distribution = 'shards'")
        .await?;
    for (text, mode) in [(&or_text, "or"), (&and_text, "and_or")] {
        let sql =
            format!("SELECT rank, doc_id, score FROM topk_bm25('idx_sh', '{text}', 100, '{mode}')");
        shard_copies_answer_as_one_plan(&local, &local_codec, &sql).await?;
    }
    local
        .sql("SET sets.topk_bm25_distribution = 'auto'")
        .await?;
    // The join, as a table function and as SQL joins: as `auto` chooses by statistics (one
    // task for inputs this small, a small side broadcast), replicated and prefix-partitioned
    // on request.
    for (setting, sql, distribution) in [
        (
            "auto",
            "SELECT * FROM similarity_join('words', 'id', 'tokens', 'jaccard', 0.5)",
            "single",
        ),
        (
            "broadcast",
            "SELECT * FROM similarity_join('words', 'id', 'tokens', 'jaccard', 0.5)",
            "distribution=replicated",
        ),
        (
            "prefix",
            "SELECT l.id, r.id FROM deps l JOIN deps r ON cosine(l.tokens, r.tokens) >= 0.9 \
             AND l.id < r.id",
            "distribution=prefix",
        ),
        (
            "prefix",
            "SELECT l.id, r.id FROM deps l JOIN deps r ON cosine(l.tokens, r.tokens) >= 0.9 \
             AND l.id < r.id AND r.id IS NOT NULL",
            "distribution=prefix",
        ),
        (
            "auto",
            "SELECT l.id, r.id FROM words l JOIN (SELECT * FROM words WHERE id < 3000) r \
             ON jaccard(l.tokens, r.tokens) >= 0.6",
            "distribution=broadcast",
        ),
    ] {
        cluster
            .sql(&format!(
                "SET sets.similarity_join_distribution = '{setting}'"
            ))
            .await?;
        let n = same_answer(&cluster, &local, sql, Some(distribution)).await?;
        assert!(n > 0, "{sql}: no rows");
    }
    // The index build (`auto`: by term under datafusion-distributed): each task indexes its
    // documents, the postings merged per term after a shuffle. One process builds it whole.
    // Its rows whole for some terms, and counts and statistics over all of them.
    for build in [
        "SELECT term, doc_ids, tfs, doc_lens, n_docs, total_len, tokenizer \
         FROM bm25_index('docs', 'doc_id', 'text') WHERE term LIKE 'qu%' OR term LIKE 'zy%'",
        "SELECT count(*) AS terms, sum(cardinality(doc_ids)) AS postings, \
         sum(array_sum(tfs)) AS tf, min(n_docs), max(n_docs), min(total_len), max(total_len) \
         FROM bm25_index('docs', 'doc_id', 'text', 'stem=english')",
    ] {
        let n = same_answer(&cluster, &local, build, None).await?;
        assert!(n > 0, "{build}: no rows");
    }
    Ok(())
}

/// The error of `sql` on a coordinator over the workers `ports`, after `setup`, with the
/// Parquet file `deps` registered (the query must fail).
async fn cluster_error(ports: Vec<u16>, deps: &Path, setup: &[&str], sql: &str) -> Result<String> {
    let cluster = coordinator(ports)?;
    run_all(&cluster, setup).await?;
    cluster
        .register_parquet(
            "deps",
            deps.to_str().unwrap(),
            ParquetReadOptions::default(),
        )
        .await?;
    let result = cluster.sql(sql).await?.collect().await;
    Ok(result.expect_err(sql).to_string())
}

/// A worker without the crate, and a worker without the index table, fail the query with
/// errors that say what is missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn missing_pieces_on_a_worker_fail_clearly() -> Result<()> {
    let Some(dir) = real_data("distributed errors", &["debian_deps/sets.parquet"]) else {
        return Ok(());
    };
    let path = dir.join("debian_deps/sets.parquet");
    // Workers of plain DataFusion.
    let plain = start_workers(2, |ctx: WorkerQueryContext| async move {
        Ok(ctx.builder.build())
    })
    .await;
    let sql = "SELECT id, list_intersect_count(tokens, [1, 2, 3]) FROM deps";
    let msg = cluster_error(plain, &path, &[], sql).await?;
    assert!(
        msg.contains("PhysicalExtensionCodec") || msg.contains("list_intersect"),
        "{msg}"
    );
    // Workers with the crate, without the index table the scalar `topk_bm25` names.
    let ours = start_workers(2, sets_worker_session).await;
    let sql = "SELECT id, topk_bm25('idx', CAST(id AS VARCHAR), 3) FROM deps";
    let msg = cluster_error(ours, &path, SETUP, sql).await?;
    assert!(msg.contains("topk_bm25") && msg.contains("idx"), "{msg}");
    Ok(())
}
