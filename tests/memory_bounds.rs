//! Memory honesty: under a memory pool limit, each operator's peak resident memory stays
//! within a stated factor of the limit (plus a fixed base), and over the limit the query
//! fails with ResourcesExhausted, never an abort or an OOM kill.
//!
//! Each workload runs in a child process (this test binary again, `child_workload`), which
//! builds its input, resets the kernel's peak-RSS counter (`/proc/self/clear_refs`), runs
//! the query under the limit and prints its peak growth.

use std::process::Command;
use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::execution::memory_pool::GreedyMemoryPool;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;

const MB: u64 = 1 << 20;
/// The stated bound: peak growth ≤ FACTOR · limit + BASE.
const FACTOR: u64 = 2;
const BASE: u64 = 96 * MB;

/// (name, pool limit, setup statements run without a limit, the query).
const WORKLOADS: [(&str, u64, &[&str], &str); 5] = [
    (
        "bm25_index",
        150 * MB,
        &[
            "CREATE TABLE docs AS SELECT value AS id, concat('w', value % 5003, ' x', value, ' y', value % 97, ' z', value % 11) AS body FROM generate_series(1, 1000000)",
        ],
        "SELECT count(*) FROM bm25_index('docs', 'id', 'body')",
    ),
    (
        "topk_bm25 load from Parquet",
        50 * MB,
        &[
            "CREATE TABLE docs AS SELECT value AS id, concat('w', value % 5003, ' x', value, ' y', value % 97) AS body FROM generate_series(1, 1000000)",
            "COPY (SELECT * FROM bm25_index('docs', 'id', 'body')) TO '$DIR/idx.parquet' STORED AS PARQUET",
            "DROP TABLE docs",
            "CREATE EXTERNAL TABLE idx STORED AS PARQUET LOCATION '$DIR/idx.parquet'",
        ],
        "SELECT * FROM topk_bm25('idx', 'w17 y3', 10)",
    ),
    (
        "similarity_join",
        100 * MB,
        &[
            "CREATE TABLE s AS SELECT value AS id, [value % 50, value % 51, value % 52, 1000 + value % 7, 2000 + value % 3] AS tokens FROM generate_series(1, 30000)",
        ],
        "SELECT count(*) FROM similarity_join('s', 'id', 'tokens', 'jaccard', 0.6)",
    ),
    (
        "list_intersect_count with a large constant",
        200 * MB,
        &[
            "CREATE TABLE t AS SELECT value AS id, [value % 1000, value % 20000] AS x FROM generate_series(1, 100000)",
        ],
        "SELECT sum(list_intersect_count(x, (SELECT range(20000)))) FROM t",
    ),
    (
        // The answer is [] from the first row on: rows, not only values, bound what is held
        // (the audit saw 1.5 GB for 20 M empty lists).
        "list_intersect_agg over empty lists",
        100 * MB,
        &[
            "CREATE TABLE e AS SELECT array_remove([value], value) AS l FROM generate_series(1, 5000000)",
        ],
        "SELECT list_intersect_agg(l) FROM e",
    ),
];

fn status_kb(field: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/self/status").unwrap();
    s.lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

/// The child: runs workload `DFSETS_MEM_CHILD` and prints `growth=<bytes> result=<...>`.
#[test]
fn child_workload() {
    let Ok(name) = std::env::var("DFSETS_MEM_CHILD") else {
        return;
    };
    let (_, limit, setup, query) = WORKLOADS.iter().find(|w| w.0 == name).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path().display().to_string();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let state = |pool_limit: Option<u64>| {
            let mut runtime = RuntimeEnvBuilder::new();
            if let Some(l) = pool_limit {
                runtime = runtime.with_memory_pool(Arc::new(GreedyMemoryPool::new(l as usize)));
            }
            SessionStateBuilder::new()
                .with_config(SessionConfig::new().with_target_partitions(2))
                .with_runtime_env(runtime.build_arc().unwrap())
                .with_default_features()
                .with_sets()
                .build()
        };
        // Setup without a limit; the query in a session of the same catalog, with one.
        let free = SessionContext::new_with_state(state(None));
        for sql in setup.iter() {
            let sql = sql.replace("$DIR", &dir);
            free.sql(&sql).await.unwrap().collect().await.unwrap();
        }
        let limited = SessionContext::new_with_state(state(Some(*limit)));
        for name in ["docs", "s", "t", "idx", "e"] {
            if let Ok(t) = free.table_provider(name).await {
                limited.register_table(name, t).unwrap();
            }
        }
        std::fs::write("/proc/self/clear_refs", "5").unwrap();
        let before = status_kb("VmRSS:") * 1024;
        let result = match limited.sql(query).await {
            Ok(df) => df.collect().await.map(|_| ()),
            Err(e) => Err(e),
        };
        let peak = status_kb("VmHWM:") * 1024;
        let result = match result {
            Ok(()) => "ok".to_string(),
            Err(e) if e.to_string().contains("Resources exhausted") => "exhausted".into(),
            Err(e) => format!("error: {e}"),
        };
        println!(
            "\nMEMORY growth={} result={result}",
            peak.saturating_sub(before)
        );
    });
}

#[test]
fn each_operator_stays_within_its_pool_limit() {
    if std::env::var("DFSETS_MEM_CHILD").is_ok() {
        return;
    }
    let exe = std::env::current_exe().unwrap();
    let mut failures = Vec::new();
    for (name, limit, ..) in WORKLOADS {
        let out = Command::new(&exe)
            .args([
                "--exact",
                "child_workload",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("DFSETS_MEM_CHILD", name)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let Some(line) = stdout.lines().find(|l| l.starts_with("MEMORY ")) else {
            failures.push(format!(
                "{name}: the child died ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr)
            ));
            continue;
        };
        let growth: u64 = line
            .split_whitespace()
            .find_map(|w| w.strip_prefix("growth="))
            .unwrap()
            .parse()
            .unwrap();
        let result = line.split_once("result=").unwrap().1;
        eprintln!(
            "{name}: limit {} MB, peak growth {} MB, {result}",
            limit / MB,
            growth / MB
        );
        if result.starts_with("error") {
            failures.push(format!("{name}: {result}"));
        }
        if growth > FACTOR * limit + BASE {
            failures.push(format!(
                "{name}: grew {} MB under a {} MB limit (bound {} MB)",
                growth / MB,
                limit / MB,
                (FACTOR * limit + BASE) / MB
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}
