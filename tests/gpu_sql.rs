//! The SQL test suites with `sets.backend = 'gpu'` (harness = false): every
//! `sql-tests/*.slt` file except `config.slt` (which tests the option's own defaults and
//! switches to the CPU), and DataFusion's own `array_intersect` cases, in sessions where
//! `list_intersect` / `list_intersect_count` run on the GPU.
//!
//! Without a usable GPU it prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`.
//! Directories: `DFSETS_SQL_TESTS` (default `./sql-tests`, then the crate's own) and
//! `DFSETS_UPSTREAM_SLT` (DataFusion's `test_files/`; default: cargo's registry).

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::{UPSTREAM_FILES, report, run_ours, run_upstream, upstream_test_dir};
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
    let batches = gpu::batches_run() - before;
    println!("gpu_sql: {passed} passed, {failed} failed; {batches} batches ran on the GPU");
    if batches == 0 {
        eprintln!("FAIL  no batch ran on the GPU");
        failed += 1;
    }
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
