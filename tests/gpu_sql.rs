//! The SQL test suites with `sets.backend = 'gpu'` (harness = false): every
//! `sql-tests/*.slt` file except `config.slt` (which tests the option's own defaults and
//! switches to the CPU), and DataFusion's own `array_intersect` cases, in sessions where
//! `list_intersect` / `list_intersect_count` / `topk_bm25` run on the GPU; then `topk_bm25`
//! on 2,500 random queries with `sets.backend = 'gpu'` against `'cpu'` (equal lists, score
//! bits included). Fails when no list batch or no `topk_bm25` batch ran on the GPU.
//!
//! Without a usable GPU it prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`.
//! Directories: `DFSETS_SQL_TESTS` (default `./sql-tests`, then the crate's own) and
//! `DFSETS_UPSTREAM_SLT` (DataFusion's `test_files/`; default: cargo's registry).

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::{UPSTREAM_FILES, report, run_ours, run_upstream, upstream_test_dir};
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::datatypes::{Float64Type, Int32Type, UInt32Type};
use datafusion_sets::backend::gpu;

/// Every file runs with the GPU backend selected.
const GPU: &[&str] = &["SET sets.backend = 'gpu'"];

fn main() -> ExitCode {
    match gpu::device() {
        Ok(d) => println!("gpu_sql: on {}", d.name),
        Err(e) => {
            if std::env::var("DFSETS_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                eprintln!("gpu_sql: DFSETS_REQUIRE_GPU=1 but no usable GPU: {e}");
                return ExitCode::FAILURE;
            }
            println!("gpu_sql: skipped, no usable GPU ({e})");
            return ExitCode::SUCCESS;
        }
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cannot start tokio: {e}");
            return ExitCode::FAILURE;
        }
    };
    let (mut passed, mut failed) = (0usize, 0usize);
    let before = gpu::batches_run();
    let bm25_before = datafusion_sets::search::gpu::bm25_batches_run();
    let dir = std::env::var_os("DFSETS_SQL_TESTS")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let local = PathBuf::from("sql-tests");
            if local.is_dir() {
                local
            } else {
                common::manifest_dir().join("sql-tests")
            }
        });
    let mut ours: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    ours.retain(|p| {
        p.extension().is_some_and(|e| e == "slt")
            && p.file_name().is_some_and(|f| f != "config.slt")
    });
    ours.sort();
    if ours.is_empty() {
        eprintln!("FAIL  no .slt files in {}", dir.display());
        failed += 1;
    }
    for path in &ours {
        report(
            path,
            runtime.block_on(run_ours(path, GPU)),
            &mut passed,
            &mut failed,
        );
    }
    match upstream_test_dir().ok() {
        Some(dir) => {
            for rel in UPSTREAM_FILES {
                let path = dir.join(rel);
                report(
                    &path,
                    runtime.block_on(run_upstream(&path, Path::new(rel), GPU)),
                    &mut passed,
                    &mut failed,
                );
            }
        }
        None => {
            eprintln!("FAIL  DataFusion's test_files not found (set DFSETS_UPSTREAM_SLT)");
            failed += 1;
        }
    }
    match runtime.block_on(bm25_gpu_equals_cpu()) {
        Ok(()) => {
            println!("ok    topk_bm25: 2,500 random queries, sets.backend 'gpu' == 'cpu'");
            passed += 1;
        }
        Err(e) => {
            eprintln!("FAIL  topk_bm25 'gpu' vs 'cpu': {e}");
            failed += 1;
        }
    }
    let batches = gpu::batches_run() - before;
    let bm25_batches = datafusion_sets::search::gpu::bm25_batches_run() - bm25_before;
    println!(
        "gpu_sql: {passed} passed, {failed} failed; {batches} list batches and {bm25_batches} \
         topk_bm25 batches ran on the GPU"
    );
    if batches == 0 {
        eprintln!("FAIL  no batch ran on the GPU");
        failed += 1;
    }
    if bm25_batches == 0 {
        eprintln!("FAIL  no topk_bm25 batch ran on the GPU");
        failed += 1;
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `topk_bm25` over a random corpus and 2,500 queries (some NULL): the lists with
/// `sets.backend = 'gpu'` equal those with `'cpu'`, in every mode.
async fn bm25_gpu_equals_cpu() -> Result<(), String> {
    // splitmix64
    let mut state = 0x5eedu64;
    let mut next = move |n: u64| {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        (z ^ (z >> 31)) % n.max(1)
    };
    let mut docs = String::from("CREATE TABLE bm25_docs(id BIGINT, body VARCHAR) AS VALUES ");
    for i in 0..3000u64 {
        let len = next(25);
        let words: Vec<String> = (0..len)
            .map(|_| {
                let r = next(1 << 20) as f64 / (1u64 << 20) as f64;
                format!("w{}", ((r * r * r) * 150.0) as usize)
            })
            .collect();
        let sep = if i == 0 { "" } else { ", " };
        docs += &format!("{sep}({}, '{}')", i * 7 + 1, words.join(" "));
    }
    let mut queries = String::from("CREATE TABLE bm25_q(qid INT, text VARCHAR) AS VALUES ");
    for i in 0..2500u64 {
        let len = next(6);
        let words: Vec<String> = (0..len).map(|_| format!("w{}", next(170))).collect();
        let text = if i % 97 == 0 {
            "NULL".to_string()
        } else {
            format!("'{}'", words.join(" "))
        };
        let sep = if i == 0 { "" } else { ", " };
        queries += &format!("{sep}({i}, {text})");
    }
    let ctx = datafusion_sets::new_context();
    let run = |sql: String| {
        let ctx = ctx.clone();
        async move {
            ctx.sql(&sql)
                .await
                .map_err(|e| format!("{sql}: {e}"))?
                .collect()
                .await
                .map_err(|e| format!("{sql}: {e}"))
        }
    };
    run(docs).await?;
    run(queries).await?;
    run("CREATE TABLE bm25_idx AS SELECT * FROM bm25_index('bm25_docs', 'id', 'body')".into())
        .await?;
    let before = datafusion_sets::search::gpu::bm25_batches_run();
    for mode in ["or", "and", "and_or"] {
        let mut results = Vec::new();
        for backend in ["cpu", "gpu"] {
            run(format!("SET sets.backend = '{backend}'")).await?;
            let batches = run(format!(
                "SELECT qid, topk_bm25('bm25_idx', text, 10, '{mode}') FROM bm25_q ORDER BY qid"
            ))
            .await?;
            results.push(hit_rows(&batches));
        }
        if results[0].len() != 2500 {
            return Err(format!("{} rows", results[0].len()));
        }
        if results[0] != results[1] {
            let i = (0..2500)
                .find(|&i| results[0][i] != results[1][i])
                .unwrap_or(0);
            return Err(format!(
                "mode {mode}: query {i}: cpu {:?} gpu {:?}",
                results[0][i], results[1][i]
            ));
        }
    }
    if datafusion_sets::search::gpu::bm25_batches_run() == before {
        return Err("no topk_bm25 batch ran on the GPU".into());
    }
    Ok(())
}

/// (qid, hits as (doc id, score bits), or None for a NULL row).
type HitRow = (i32, Option<Vec<(u32, u64)>>);

fn hit_rows(batches: &[RecordBatch]) -> Vec<HitRow> {
    let mut out = Vec::new();
    for b in batches {
        let qids = b.column(0).as_primitive::<Int32Type>();
        let lists = b.column(1).as_list::<i32>();
        for r in 0..b.num_rows() {
            if lists.is_null(r) {
                out.push((qids.value(r), None));
                continue;
            }
            let v = lists.value(r);
            let s = v.as_struct();
            let docs = s.column(0).as_primitive::<UInt32Type>();
            let scores = s.column(1).as_primitive::<Float64Type>();
            let hits = (0..s.len())
                .map(|i| (docs.value(i), scores.value(i).to_bits()))
                .collect();
            out.push((qids.value(r), Some(hits)));
        }
    }
    out
}
