//! The SQL test suites with `sets.backend = 'gpu'` (harness = false): every
//! `sql-tests/*.slt` file except `config.slt` (which tests the option's own defaults and
//! switches to the CPU), and DataFusion's own `array_intersect` cases, in sessions where
//! `list_intersect` / `list_intersect_count` run on the GPU.
//!
//! Without a usable GPU it prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`.
//! Directories: `DFSETS_SQL_TESTS` (default `./sql-tests`, then the crate's own) and
//! `DFSETS_UPSTREAM_SLT` (DataFusion's `test_files/`; default: cargo's registry).

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sets::backend::gpu;
use datafusion_sqllogictest::{DataFusion, TestContext, df_value_validator, value_normalizer};
use indicatif::ProgressBar;
use sqllogictest::strict_column_validator;

const UPSTREAM_FILES: &[&str] = &["array/array_union.slt", "array/arrays_zip.slt"];

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
                Path::new(env!("CARGO_MANIFEST_DIR")).join("sql-tests")
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
            runtime.block_on(run_ours(path)),
            &mut passed,
            &mut failed,
        );
    }
    match upstream_dir() {
        Some(dir) => {
            for rel in UPSTREAM_FILES {
                let path = dir.join(rel);
                report(
                    &path,
                    runtime.block_on(run_upstream(&path, Path::new(rel))),
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

async fn use_gpu(ctx: &SessionContext) -> Result<()> {
    ctx.sql("SET sets.backend = 'gpu'").await?.collect().await?;
    Ok(())
}

async fn run_ours(path: &Path) -> Result<()> {
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .with_information_schema(true);
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_sets()
        .build();
    let ctx = SessionContext::new_with_state(state);
    use_gpu(&ctx).await?;
    run_file(
        ctx,
        path,
        path.file_name().map(PathBuf::from).unwrap_or_default(),
    )
    .await
}

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
    if ctx.udf("array_intersect")?.name() != "list_intersect" {
        return Err(DataFusionError::Execution(
            "array_intersect does not resolve to ours".into(),
        ));
    }
    use_gpu(&ctx).await?;
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

/// DataFusion's `test_files/`: `DFSETS_UPSTREAM_SLT`, else the registry copy of the
/// `datafusion-sqllogictest` version this crate was built with.
fn upstream_dir() -> Option<PathBuf> {
    if let Some(d) = std::env::var_os("DFSETS_UPSTREAM_SLT") {
        return Some(PathBuf::from(d));
    }
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cargo")))?;
    for index in std::fs::read_dir(home.join("registry").join("src"))
        .ok()?
        .flatten()
    {
        for pkg in std::fs::read_dir(index.path()).ok()?.flatten() {
            let name = pkg.file_name().to_string_lossy().into_owned();
            if name.starts_with("datafusion-sqllogictest-55.") {
                let dir = pkg.path().join("test_files");
                if dir.join(UPSTREAM_FILES[0]).is_file() {
                    return Some(dir);
                }
            }
        }
    }
    None
}
