//! datafusion-sets on datafusion-distributed workers: `cargo run --release --features distributed
//! --example distributed` (from the repository root; `-- 4` for four workers).
//!
//! Starts workers on 127.0.0.1 (each an Arrow Flight server, as it would be on its own host),
//! a coordinating session over them, and runs a similarity join and a BM25 search over the
//! bundled Debian packages (`examples/data`). Each query's distributed plan is printed with
//! its stages, and its answer compared with the same query in one process.
//! docs/distributed.md says how to deploy workers on other hosts.

use datafusion::arrow::util::pretty::pretty_format_batches;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::collect;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt as _, Worker, WorkerResolver, display_plan_ascii,
};
use datafusion_sets::SessionStateBuilderExt as _;
use datafusion_sets::distributed::{SetsDistributedExt, sets_worker_session};

/// The workers' addresses, as a resolver gives them to the coordinator.
struct Workers(Vec<url::Url>);

impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<url::Url>> {
        Ok(self.0.clone())
    }
}

/// One worker on a free port of 127.0.0.1; its URL.
async fn start_worker() -> Result<url::Url> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let port = listener.local_addr()?.port();
    let worker = Worker::from_session_builder(sets_worker_session);
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(worker.into_worker_server())
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener))
            .await
    });
    url::Url::parse(&format!("http://127.0.0.1:{port}"))
        .map_err(|e| DataFusionError::External(Box::new(e)))
}

/// The example's tables, built in one process and written as Parquet into `dir` (a file
/// every worker reads, as on shared storage): `packages`, `deps` (each package's dependency
/// names as sorted ids) and `idx` (the BM25 index of the descriptions).
async fn write_tables(dir: &std::path::Path) -> Result<()> {
    let ctx = SessionContext::from(
        SessionStateBuilder::new()
            .with_default_features()
            .with_sets()
            .build(),
    );
    let out = |name: &str| dir.join(format!("{name}.parquet")).display().to_string();
    for sql in [
        "CREATE EXTERNAL TABLE packages STORED AS JSON LOCATION 'examples/data/debian-packages.json'".to_string(),
        "CREATE TABLE dep_names AS SELECT row_number() OVER (ORDER BY name) AS dep_id, name \
         FROM (SELECT DISTINCT unnest(depends) AS name FROM packages)"
            .to_string(),
        format!(
            "COPY (SELECT p.id, array_sort(array_agg(d.dep_id)) AS dep_ids \
             FROM (SELECT id, unnest(depends) AS name FROM packages) p JOIN dep_names d USING (name) \
             GROUP BY p.id) TO '{}' STORED AS PARQUET",
            out("deps")
        ),
        format!("COPY (SELECT id, package, description FROM packages) TO '{}' STORED AS PARQUET", out("packages")),
        format!(
            "COPY (SELECT * FROM bm25_index('packages', 'id', 'description', \
             'stopwords=english, stem=english')) TO '{}' STORED AS PARQUET",
            out("idx")
        ),
    ] {
        ctx.sql(&sql).await?.collect().await?;
    }
    Ok(())
}

/// The tables of `dir` registered in `ctx`.
async fn register(ctx: &SessionContext, dir: &std::path::Path) -> Result<()> {
    for name in ["packages", "deps", "idx"] {
        let path = dir.join(format!("{name}.parquet")).display().to_string();
        ctx.register_parquet(name, &path, Default::default())
            .await?;
    }
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let workers: usize = match std::env::args().nth(1) {
        Some(n) => n
            .parse()
            .map_err(|_| DataFusionError::Plan(format!("workers: expected a number, got '{n}'")))?,
        None => 2,
    };
    let mut urls = Vec::with_capacity(workers);
    for _ in 0..workers {
        urls.push(start_worker().await?);
    }
    println!(
        "{workers} workers: {}",
        urls.iter()
            .map(|u| u.as_str())
            .collect::<Vec<_>>()
            .join(", ")
    );

    // The coordinator: the distributed planner over the workers, datafusion-sets installed.
    let state = SessionStateBuilder::new()
        .with_default_features()
        .with_config(SessionConfig::new().with_target_partitions(2))
        .with_distributed_worker_resolver(Workers(urls))
        .with_distributed_planner()
        // The example's files are small: cut them finely, so every worker gets a part.
        .with_distributed_file_scan_config_bytes_per_partition(1)?
        .with_sets_distributed()
        .build();
    let cluster = SessionContext::from(state);
    // One process, for comparison.
    let local = SessionContext::from(
        SessionStateBuilder::new()
            .with_default_features()
            .with_sets()
            .build(),
    );
    let dir = tempfile::tempdir()?;
    write_tables(dir.path()).await?;
    register(&cluster, dir.path()).await?;
    register(&local, dir.path()).await?;

    let queries = [
        // The similarity join, a self-join through SQL: spread over the workers.
        "SELECT a.id AS a, b.id AS b, round(jaccard(a.dep_ids, b.dep_ids), 3) AS jaccard \
         FROM deps a JOIN deps b ON jaccard(a.dep_ids, b.dep_ids) >= 0.8 AND a.id < b.id \
         ORDER BY jaccard DESC, a, b LIMIT 10",
        // The table function, counted.
        "SELECT count(*) AS pairs FROM similarity_join('deps', 'id', 'dep_ids', 'jaccard', 0.6)",
        // A search: the index table's scan travels in the plan.
        "SELECT r.rank, p.package, round(r.score, 3) AS score \
         FROM topk_bm25('idx', 'IMAP server', 5) r JOIN packages p ON p.id = r.doc_id \
         ORDER BY r.rank",
    ];
    for sql in queries {
        println!("\n{sql}");
        let plan = cluster.sql(sql).await?.create_physical_plan().await?;
        println!("{}", display_plan_ascii(plan.as_ref(), false));
        let got = collect(plan, cluster.task_ctx()).await?;
        let expected = local.sql(sql).await?.collect().await?;
        let (got, expected) = (
            pretty_format_batches(&got)?.to_string(),
            pretty_format_batches(&expected)?.to_string(),
        );
        println!("{got}");
        if got != expected {
            return Err(DataFusionError::Execution(format!(
                "the workers' answer differs from one process':\n{expected}"
            )));
        }
        println!("(the same answer as in one process)");
    }
    Ok(())
}
