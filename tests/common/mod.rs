//! The sqllogictest runner shared by `sqllogictests` (CPU) and `gpu_sql` (`sets.backend = 'gpu'`).

#![allow(dead_code, reason = "each test binary uses part of this module")]

use std::path::{Path, PathBuf};

use datafusion::common::{DataFusionError, Result};
use datafusion::execution::{FunctionRegistry, SessionStateBuilder};
use datafusion::logical_expr::ScalarUDF;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::SessionStateBuilderExt;
use datafusion_sqllogictest::{DataFusion, TestContext, df_value_validator, value_normalizer};
use indicatif::ProgressBar;
use sqllogictest::strict_column_validator;

/// DataFusion's test files holding `array_intersect` / `list_intersect` cases.
pub const UPSTREAM_FILES: &[&str] = &["array/array_union.slt", "array/arrays_zip.slt"];

/// The crate's root: `CARGO_MANIFEST_DIR` as cargo sets it when it runs the test, else the
/// directory the binary was compiled in (a cached binary may have been built from another
/// clone of the same sources).
pub fn manifest_dir() -> PathBuf {
    std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")))
}

/// Print one file's outcome and count it.
pub fn report(path: &Path, result: Result<()>, passed: &mut usize, failed: &mut usize) {
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

/// Run statements (e.g. `SET sets.backend = 'gpu'`) on a session before a file.
async fn prepare(ctx: &SessionContext, setup: &[&str]) -> Result<()> {
    for sql in setup {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(())
}

/// `|x ∩ y|` of two ascending lists of distinct values (a plain merge: the tests' oracle).
pub fn common_count(x: &[u32], y: &[u32]) -> usize {
    let (mut i, mut j, mut o) = (0, 0, 0);
    while i < x.len() && j < y.len() {
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => {
                o += 1;
                i += 1;
                j += 1;
            }
        }
    }
    o
}

/// Whether a GPU test runs: a GPU is there (named on stderr); else skip with a note, or fail
/// under `DFSETS_REQUIRE_GPU=1` (the device script sets it).
pub fn gpu_or_skip(test: &str) -> bool {
    match datafusion_sets::gpu::device() {
        Ok(d) => {
            eprintln!(
                "{test}: on {} (sm_{}{})",
                d.name, d.compute_capability.0, d.compute_capability.1
            );
            true
        }
        Err(e) => {
            if std::env::var("DFSETS_REQUIRE_GPU").is_ok_and(|v| v == "1") {
                panic!("{test}: DFSETS_REQUIRE_GPU=1 but no usable GPU: {e}");
            }
            eprintln!("{test}: skipped, no usable GPU ({e})");
            false
        }
    }
}

/// The backend the backend-generic suites (cancellation, concurrency) run their queries on:
/// `$SETS_TEST_BACKEND` ('auto', 'cpu' or 'gpu'; default 'auto'). The device script runs them
/// with 'gpu', where [`gpu_or_skip`]'s rule holds: no GPU is a skip, or a failure under
/// `DFSETS_REQUIRE_GPU=1`.
pub fn test_backend(test: &str) -> Option<String> {
    let backend = std::env::var("SETS_TEST_BACKEND").unwrap_or_else(|_| "auto".into());
    if backend == "gpu" && !gpu_or_skip(test) {
        return None;
    }
    Some(backend)
}

/// Where the real data sets are: `$SETS_BENCH_DATA`, else `bench-data/` at the repository
/// root (built by `benches/data/build.sh`).
pub fn bench_data() -> PathBuf {
    match std::env::var_os("SETS_BENCH_DATA") {
        Some(d) => PathBuf::from(d),
        None => manifest_dir().join("bench-data"),
    }
}

/// Whether every one of `paths` exists. A missing one is a failure with
/// `SETS_REQUIRE_DATA=1` (as `.ci/run` sets, after building the data), and otherwise a
/// note that `test` is skipped.
pub fn data_present(test: &str, paths: &[&Path]) -> bool {
    let Some(missing) = paths.iter().find(|p| !p.exists()) else {
        return true;
    };
    let why = format!(
        "{test}: {} is missing (build it with benches/data/build.sh, or set SETS_BENCH_DATA)",
        missing.display()
    );
    if std::env::var("SETS_REQUIRE_DATA").is_ok_and(|v| v == "1") {
        panic!("{why}; SETS_REQUIRE_DATA=1");
    }
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{why}: SKIPPED");
    false
}

/// A session with DataFusion's defaults plus datafusion-sets, on `config`.
pub fn sets_session(config: SessionConfig) -> SessionContext {
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_sets()
        .build();
    SessionContext::new_with_state(state)
}

/// Our suites: DataFusion's defaults plus datafusion-sets, 4 partitions for stable plans.
pub async fn run_ours(path: &Path, setup: &[&str]) -> Result<()> {
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .with_information_schema(true);
    let ctx = sets_session(config);
    prepare(&ctx, setup).await?;
    let labels: &[&str] = if setup.iter().any(|s| s.contains("'gpu'")) {
        &["gpu"]
    } else {
        &[]
    };
    run_file_labeled(
        ctx,
        path,
        path.file_name().map(PathBuf::from).unwrap_or_default(),
        labels,
    )
    .await
}

/// DataFusion's own file, in the session DataFusion's runner builds for it, with ours installed
/// and answering to both `list_intersect` and `array_intersect`.
pub async fn run_upstream(path: &Path, relative: &Path, setup: &[&str]) -> Result<()> {
    let Some(test_ctx) = TestContext::try_new_for_test_file(relative).await else {
        return Err(DataFusionError::Execution(format!(
            "DataFusion cannot set up {}",
            relative.display()
        )));
    };
    let ctx = test_ctx.session_ctx().clone();
    datafusion_sets::register(&ctx)?;
    let ours = datafusion_sets::udf::list_intersect_udf();
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
    prepare(&ctx, setup).await?;
    run_file(ctx, path, relative.to_path_buf()).await
}

pub async fn run_file(ctx: SessionContext, path: &Path, relative: PathBuf) -> Result<()> {
    run_file_labeled(ctx, path, relative, &[]).await
}

/// [`run_file`] with sqllogictest labels (`onlyif <label>` / `skipif <label>` in the files):
/// the GPU suite runs with the label `gpu`.
pub async fn run_file_labeled(
    ctx: SessionContext,
    path: &Path,
    relative: PathBuf,
    labels: &[&str],
) -> Result<()> {
    let mut runner = sqllogictest::Runner::new(|| {
        let ctx = ctx.clone();
        let relative = relative.clone();
        async move { Ok(DataFusion::new(ctx, relative, ProgressBar::hidden())) }
    });
    for l in labels {
        runner.add_label(l);
    }
    // `onlyif tuning`: the cases that set `tuning.*` switches (built with the feature only).
    if cfg!(feature = "tuning") {
        runner.add_label("tuning");
    }
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

/// `DFSETS_UPSTREAM_SLT` when set (the GPU machine has no cargo registry), else the
/// `test_files/` of the `datafusion-sqllogictest` package in cargo's registry, at the
/// version `Cargo.lock` resolved.
pub fn upstream_test_dir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("DFSETS_UPSTREAM_SLT") {
        return Ok(PathBuf::from(dir));
    }
    let manifest_dir = manifest_dir();
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
