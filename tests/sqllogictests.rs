//! The SQL test suites, run by `cargo test` (harness = false):
//!
//! 1. every `sql-tests/*.slt` file, each in a fresh session with datafusion-sets installed;
//! 2. DataFusion's own `array_intersect` / `list_intersect` cases, unchanged, read from the
//!    `datafusion-sqllogictest` crate this crate depends on, in DataFusion's own test session
//!    with our `list_intersect` installed and also answering to `array_intersect`, so every
//!    intersect case of those files runs on our implementation.
//!
//! `cargo test --test sqllogictests -- <substring>` runs the files whose path contains it.

mod common;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use common::{UPSTREAM_FILES, report, run_ours, run_upstream, upstream_test_dir};

fn main() -> ExitCode {
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
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
    let selected = |p: &Path| {
        filters.is_empty()
            || filters
                .iter()
                .any(|f| p.to_string_lossy().contains(f.as_str()))
    };

    let mut ours: Vec<PathBuf> = std::fs::read_dir(common::manifest_dir().join("sql-tests"))
        .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default();
    ours.retain(|p| p.extension().is_some_and(|e| e == "slt"));
    ours.sort();
    for path in ours.iter().filter(|p| selected(p)) {
        report(
            path,
            runtime.block_on(run_ours(path, &[])),
            &mut passed,
            &mut failed,
        );
    }

    match upstream_test_dir() {
        Ok(dir) => {
            for rel in UPSTREAM_FILES {
                let path = dir.join(rel);
                if selected(&path) {
                    report(
                        &path,
                        runtime.block_on(run_upstream(&path, Path::new(rel), &[])),
                        &mut passed,
                        &mut failed,
                    );
                }
            }
        }
        Err(e) => {
            eprintln!("FAIL  DataFusion's own array_intersect cases: {e}");
            failed += 1;
        }
    }

    println!("sqllogictests: {passed} passed, {failed} failed");
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
