//! The similarity join on 1, 2 and 4 datafusion-distributed workers against one process
//! (benches/README.md has the numbers; `scripts/gpu/distributed-bench.sh` runs it on the GPU
//! machine's host).
//!
//! Each worker is its own process with a tokio runtime of `--threads` threads (so `W` workers
//! use `W * threads` cores), serving Arrow Flight on 127.0.0.1. The coordinator plans with
//! `target_partitions = threads` and `sets.similarity_join_distribution` as asked; the
//! baseline is the same query in one process of `threads` threads and of `W * threads`.
//!
//! ```text
//! distributed worker PORT THREADS [DATA]
//! distributed local DATA THREADS SQL
//! distributed cluster DATA THREADS DISTRIBUTION PORTS SQL
//! distributed scale SRC COPIES OUT      (the data COPIES times larger: disjoint token spaces)
//! ```
//! `DATA` is Parquet files to register: `name=path,name=path`, or one path, registered as
//! `sets(id, tokens)`; a worker registers its `DATA` in every session (the index table the
//! scalar `topk_bm25` reads by name). Each run prints
//! `rows <n> best_ms <t> runs_ms <t1,t2,t3>`, and the cluster run the executed plan's
//! network nodes with their metrics (rows and bytes that crossed between tasks).

use std::sync::Arc;
use std::time::Instant;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, ListArray, RecordBatch, UInt32Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, UInt32Type};
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_plan::collect;
use datafusion::prelude::{ParquetReadOptions, SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExt, DistributedMetricsFormat, SessionStateBuilderExt as _, Worker, WorkerResolver,
    display_plan_ascii, rewrite_distributed_plan_with_metrics,
};
use datafusion_sets::SessionStateBuilderExt as _;
use datafusion_sets::distributed::{SetsDistributedExt, sets_worker_session};

fn runtime(threads: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn arg(args: &[String], i: usize, what: &str) -> Result<String> {
    args.get(i)
        .cloned()
        .ok_or_else(|| DataFusionError::Plan(format!("missing argument {i}: {what}")))
}

fn number(s: &str, what: &str) -> Result<usize> {
    s.parse()
        .map_err(|_| DataFusionError::Plan(format!("{what}: expected a number, got '{s}'")))
}

struct Ports(Vec<u16>);

impl WorkerResolver for Ports {
    fn get_urls(&self) -> Result<Vec<url::Url>> {
        self.0
            .iter()
            .map(|p| {
                url::Url::parse(&format!("http://127.0.0.1:{p}"))
                    .map_err(|e| DataFusionError::External(Box::new(e)))
            })
            .collect()
    }
}

/// Registers the Parquet files of `data` (module docs) in `ctx`.
/// Registers `data` (`name=path,...`; a path ending in `/` is a directory of Parquet files
/// partitioned Hive-style by `shard`), then runs the statements of `$BENCH_SETTINGS` (`;`
/// between them), e.g. `SET sets.topk_bm25_distribution = 'shards'`.
async fn register(ctx: &SessionContext, data: &str) -> Result<()> {
    for item in data.split(',').filter(|d| !d.is_empty()) {
        let (name, path) = item.split_once('=').unwrap_or(("sets", item));
        let options = match path.ends_with('/') {
            true => ParquetReadOptions::default()
                .table_partition_cols(vec![("shard".to_string(), DataType::UInt32)]),
            false => ParquetReadOptions::default(),
        };
        ctx.register_parquet(name, path, options).await?;
    }
    let settings = std::env::var("BENCH_SETTINGS").unwrap_or_default();
    for set in settings.split(';').filter(|s| !s.trim().is_empty()) {
        ctx.sql(set).await?.collect().await?;
    }
    Ok(())
}

/// What three runs of a query gave: its rows (the first 5, formatted, to compare runs and
/// plans), each run's milliseconds, the last run's plan.
struct Timed {
    rows: usize,
    answer: String,
    times: Vec<f64>,
    plan: Arc<dyn datafusion::physical_plan::ExecutionPlan>,
}

/// Three runs of `sql` (`$BENCH_RUNS` runs: 1 for a statement that writes); every run must
/// give the first run's answer.
async fn time(ctx: &SessionContext, sql: &str) -> Result<Timed> {
    let mut times = Vec::new();
    let mut seen: Option<(usize, String)> = None;
    let mut last = None;
    let runs = match std::env::var("BENCH_RUNS") {
        Ok(n) => number(&n, "BENCH_RUNS")?.max(1),
        Err(_) => 3,
    };
    for _ in 0..runs {
        let t0 = Instant::now();
        let plan = ctx.sql(sql).await?.create_physical_plan().await?;
        let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        times.push(t0.elapsed().as_secs_f64() * 1e3);
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let head: Vec<RecordBatch> = batches
            .iter()
            .take(1)
            .map(|b| b.slice(0, b.num_rows().min(5)))
            .collect();
        let answer = datafusion::arrow::util::pretty::pretty_format_batches(&head)?
            .to_string()
            .lines()
            .filter(|l| l.starts_with('|'))
            .skip(1)
            .collect::<Vec<_>>()
            .join(" ");
        if let Some(first) = &seen
            && (first.0 != rows || (rows == 1 && first.1 != answer))
        {
            return Err(DataFusionError::Execution(format!(
                "runs differ: {first:?} then ({rows}, {answer})"
            )));
        }
        seen = Some((rows, answer));
        last = Some(plan);
    }
    let (rows, answer) = seen.expect("three runs");
    let plan = last.expect("three runs");
    Ok(Timed {
        rows,
        answer,
        times,
        plan,
    })
}

fn report(timed: &Timed) {
    let times = &timed.times;
    let best = times.iter().copied().fold(f64::INFINITY, f64::min);
    let all: Vec<String> = times.iter().map(|t| format!("{t:.0}")).collect();
    println!(
        "rows {} best_ms {best:.0} runs_ms {} answer {}",
        timed.rows,
        all.join(","),
        timed.answer
    );
}

/// The data `copies` times: copy `k` has ids `id + k * (max id + 1)` and tokens
/// `t + k * (max token + 1)`, so the copies join only within themselves (the answer is
/// `copies` times the original's). Each copy is a row group of its own (at most 2^20 rows a
/// group, the writer's default): a large table comes in many row groups or files, and a
/// distributed scan spreads over its tasks by row group.
fn scale(src: &str, copies: usize, out: &str) -> Result<()> {
    let file = std::fs::File::open(src)?;
    let reader =
        datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)?
            .build()?;
    let batches: Vec<RecordBatch> = reader.collect::<std::result::Result<_, _>>()?;
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new(
            "tokens",
            DataType::List(Arc::new(Field::new_list_field(DataType::UInt32, true))),
            true,
        ),
    ]));
    let (mut max_id, mut max_token) = (0i64, 0u32);
    let mut parts = Vec::new();
    for b in &batches {
        let ids = cast(b.column_by_name("id").expect("id"), &DataType::Int64)?;
        let tokens = cast(
            b.column_by_name("tokens").expect("tokens"),
            schema.field(1).data_type(),
        )?;
        let ids = ids.as_primitive::<Int64Type>().clone();
        max_id = max_id.max(ids.iter().flatten().max().unwrap_or(0));
        let values = tokens
            .as_list::<i32>()
            .values()
            .as_primitive::<UInt32Type>()
            .clone();
        max_token = max_token.max(values.iter().flatten().max().unwrap_or(0));
        parts.push((ids, tokens));
    }
    let rows: usize = parts.iter().map(|(ids, _)| ids.len()).sum();
    let props = datafusion::parquet::file::properties::WriterProperties::builder()
        .set_max_row_group_row_count(Some(rows.clamp(1, 1 << 20)))
        .build();
    let mut writer = datafusion::parquet::arrow::ArrowWriter::try_new(
        std::fs::File::create(out)?,
        Arc::clone(&schema),
        Some(props),
    )?;
    for k in 0..copies as i64 {
        for (ids, tokens) in &parts {
            let ids: Int64Array = ids.unary(|v| v + k * (max_id + 1));
            let list = tokens.as_list::<i32>();
            let shift = k as u32 * (max_token + 1);
            let values: UInt32Array = list
                .values()
                .as_primitive::<UInt32Type>()
                .unary(|v| v + shift);
            let list = ListArray::try_new(
                Arc::new(Field::new_list_field(DataType::UInt32, true)),
                OffsetBuffer::new(list.offsets().inner().clone()),
                Arc::new(values) as ArrayRef,
                list.nulls().cloned(),
            )?;
            writer.write(&RecordBatch::try_new(
                Arc::clone(&schema),
                vec![Arc::new(ids), Arc::new(list)],
            )?)?;
        }
        writer.flush()?;
    }
    writer.close()?;
    Ok(())
}

fn main() -> Result<()> {
    let _ = env_logger::try_init();
    let args: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| a != "--bench")
        .collect();
    let mode = arg(&args, 0, "mode: worker, local, cluster or scale")?;
    match mode.as_str() {
        "worker" => {
            let port = number(&arg(&args, 1, "port")?, "port")?;
            let threads = number(&arg(&args, 2, "threads")?, "threads")?;
            let data = Arc::new(args.get(3).cloned().unwrap_or_default());
            runtime(threads).block_on(async move {
                let addr = format!("127.0.0.1:{port}")
                    .parse()
                    .map_err(|e| DataFusionError::External(Box::new(e)))?;
                let worker = Worker::from_session_builder(move |ctx| {
                    let data = Arc::clone(&data);
                    async move {
                        let state = sets_worker_session(ctx).await?;
                        if data.is_empty() {
                            return Ok(state);
                        }
                        let ctx = SessionContext::from(state);
                        register(&ctx, &data).await?;
                        Ok(ctx.state())
                    }
                });
                tonic::transport::Server::builder()
                    .add_service(worker.into_worker_server())
                    .serve(addr)
                    .await
                    .map_err(|e| DataFusionError::External(Box::new(e)))
            })
        }
        "local" => {
            let data = arg(&args, 1, "data")?;
            let threads = number(&arg(&args, 2, "threads")?, "threads")?;
            let sql = arg(&args, 3, "sql")?;
            runtime(threads).block_on(async move {
                let ctx = SessionContext::from(
                    SessionStateBuilder::new()
                        .with_default_features()
                        .with_config(SessionConfig::new().with_target_partitions(threads))
                        .with_sets()
                        .build(),
                );
                register(&ctx, &data).await?;
                report(&time(&ctx, &sql).await?);
                Ok(())
            })
        }
        "cluster" => {
            let data = arg(&args, 1, "data")?;
            let threads = number(&arg(&args, 2, "threads")?, "threads")?;
            let distribution = arg(&args, 3, "distribution")?;
            let ports = arg(&args, 4, "ports")?
                .split(',')
                .map(|p| number(p, "port").map(|p| p as u16))
                .collect::<Result<Vec<_>>>()?;
            let sql = arg(&args, 5, "sql")?;
            runtime(4).block_on(async move {
                let state = SessionStateBuilder::new()
                    .with_default_features()
                    .with_config(SessionConfig::new().with_target_partitions(threads))
                    .with_distributed_worker_resolver(Ports(ports))
                    .with_distributed_planner()
                    // Scans cut as finely as the workers allow: one-row-group files spread too.
                    .with_distributed_file_scan_config_bytes_per_partition(1)?
                    .with_distributed_metrics_collection(true)?
                    .with_sets_distributed()
                    .build();
                let ctx = SessionContext::from(state);
                ctx.sql(&format!(
                    "SET sets.similarity_join_distribution = '{distribution}'"
                ))
                .await?;
                register(&ctx, &data).await?;
                let timed = time(&ctx, &sql).await?;
                report(&timed);
                // The workers' metrics (rows and bytes through the network nodes) gathered
                // into the executed plan.
                let plan = rewrite_distributed_plan_with_metrics(
                    Arc::clone(&timed.plan),
                    DistributedMetricsFormat::Aggregated,
                )
                .await?;
                for line in display_plan_ascii(plan.as_ref(), true).lines() {
                    if line.contains("Network")
                        || line.contains("Stage")
                        || line.contains("SimilarityJoinExec")
                        || line.contains("PrefixRouteExec")
                        || line.contains("Bm25")
                        || line.contains("Topk")
                    {
                        println!("  {}", line.trim());
                    }
                }
                Ok(())
            })
        }
        "scale" => {
            let src = arg(&args, 1, "source")?;
            let copies = number(&arg(&args, 2, "copies")?, "copies")?;
            let out = arg(&args, 3, "out")?;
            scale(&src, copies, &out)
        }
        other => Err(DataFusionError::Plan(format!("unknown mode '{other}'"))),
    }
}
