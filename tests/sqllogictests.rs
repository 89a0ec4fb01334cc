//! The SQL test suites, run by `cargo test` (harness = false):
//!
//! 1. every `sql-tests/*.slt` file, each in a fresh session with datafusion-sets installed;
//! 2. DataFusion's own `array_intersect` / `list_intersect` cases, unchanged, read from the
//!    `datafusion-sqllogictest` crate this crate depends on, in DataFusion's own test session
//!    with our `list_intersect` installed and also answering to `array_intersect`, so every
//!    intersect case of those files runs on our implementation.
//!
//! `cargo test --test sqllogictests -- <substring>` runs the files whose path contains it.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::FunctionRegistry;
use datafusion::execution::SessionStateBuilder;
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sqllogictest::{DataFusion, TestContext, df_value_validator, value_normalizer};
use indicatif::ProgressBar;
use sqllogictest::strict_column_validator;

/// DataFusion's test files holding `array_intersect` / `list_intersect` cases.
const UPSTREAM_FILES: &[&str] = &["array/array_union.slt", "array/arrays_zip.slt"];

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

    let mut ours: Vec<PathBuf> =
        std::fs::read_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("sql-tests"))
            .map(|d| d.filter_map(|e| e.ok().map(|e| e.path())).collect())
            .unwrap_or_default();
    ours.retain(|p| p.extension().is_some_and(|e| e == "slt"));
    ours.sort();
    for path in ours.iter().filter(|p| selected(p)) {
        report(
            path,
            runtime.block_on(run_ours(path)),
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
                        runtime.block_on(run_upstream(&path, Path::new(rel))),
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

fn report(path: &Path, result: Result<()>, passed: &mut usize, failed: &mut usize) {
    match result {
        Ok(()) => {
            println!("ok    {}", path.display());
            *passed += 1;
        }
        Err(e) => {
            println!("FAIL  {}\n{e}", path.display());
            *failed += 1;
        }
    }
}

/// Our suites: DataFusion's defaults plus datafusion-sets, 4 partitions for stable plans.
async fn run_ours(path: &Path) -> Result<()> {
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .with_information_schema(true);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_sets()
        .build();
    run_file(
        SessionContext::new_with_state(state),
        path,
        path.file_name().map(PathBuf::from).unwrap_or_default(),
    )
    .await
}

/// DataFusion's own file, in the session DataFusion's runner builds for it, with ours installed.
async fn run_upstream(path: &Path, relative: &Path) -> Result<()> {
    let Some(test_ctx) = TestContext::try_new_for_test_file(relative).await else {
        return Err(DataFusionError::Execution(format!(
            "DataFusion cannot set up {}",
            relative.display()
        )));
    };
    let ctx = test_ctx.session_ctx().clone();
    datafusion_sets::register(&ctx)?;
    let ours = datafusion_sets::functions::list_intersect::list_intersect_udf();
    ctx.register_udf(ScalarUDF::clone(&ours).with_aliases(["array_intersect"]));
    for name in ["list_intersect", "array_intersect"] {
        let resolved = ctx.udf(name)?;
        if resolved.name() != "list_intersect" {
            return Err(DataFusionError::Execution(format!(
                "{name} resolves to {}, not ours",
                resolved.name()
            )));
        }
    }
    run_file(ctx, path, relative.to_path_buf()).await
}

async fn run_file(ctx: SessionContext, path: &Path, relative: PathBuf) -> Result<()> {
    let mut runner = sqllogictest::Runner::new(|| {
        let ctx = ctx.clone();
        let relative = relative.clone();
        async move { Ok(DataFusion::new(ctx, relative, ProgressBar::hidden())) }
    });
    runner.with_column_validator(strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);
    let records =
        sqllogictest::parse_file(path).map_err(|e| DataFusionError::External(Box::new(e)))?;
    let mut errors = Vec::new();
    for record in records {
        if let sqllogictest::Record::Halt { .. } = record {
            break;
        }
        if let Err(e) = runner.run_async(record).await {
            errors.push(e.to_string());
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        Err(DataFusionError::Execution(format!(
            "{} failing records:\n{}",
            errors.len(),
            errors.join("\n")
        )))
    }
}

/// `test_files/` of the `datafusion-sqllogictest` package in cargo's registry, at the
/// version `Cargo.lock` resolved.
fn upstream_test_dir() -> Result<PathBuf> {
    let manifest_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lock = std::fs::read_to_string(manifest_dir.join("Cargo.lock"))?;
    let mut lines = lock.lines();
    let version = loop {
        match lines.next() {
            Some("name = \"datafusion-sqllogictest\"") => {
                let v = lines
                    .next()
                    .and_then(|l| l.strip_prefix("version = \""))
                    .and_then(|v| v.strip_suffix('"'));
                break v.ok_or_else(|| {
                    DataFusionError::Execution(
                        "Cargo.lock: no version after datafusion-sqllogictest".into(),
                    )
                })?;
            }
            Some(_) => {}
            None => {
                return Err(DataFusionError::Execution(
                    "Cargo.lock has no datafusion-sqllogictest".into(),
                ));
            }
        }
    };
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))
        .ok_or_else(|| DataFusionError::Execution("neither CARGO_HOME nor HOME is set".into()))?;
    let package = format!("datafusion-sqllogictest-{version}");
    for index in std::fs::read_dir(cargo_home.join("registry").join("src"))?.flatten() {
        let dir = index.path().join(&package).join("test_files");
        if dir.join(UPSTREAM_FILES[0]).is_file() {
            return Ok(dir);
        }
    }
    Err(DataFusionError::Execution(format!(
        "{package}/test_files not found under {}",
        cargo_home.display()
    )))
}
