//! `dfsets`: datafusion-cli with datafusion-sets installed.
//!
//! The REPL, `-c`, `-f`, `--format`, `-q` and the other flags are datafusion-cli's own
//! (through its library crate); this file only parses them and builds the session.

use std::num::NonZeroUsize;
use std::path::Path;
use std::process::ExitCode;
use std::sync::Arc;

use clap::Parser;
use datafusion::common::config::ConfigNonZeroUsize;
use datafusion::common::config_err;
use datafusion::config::ConfigOptions;
use datafusion::error::{DataFusionError, Result};
use datafusion::execution::context::SessionConfig;
use datafusion::execution::disk_manager::{DiskManagerBuilder, DiskManagerMode};
use datafusion::execution::memory_pool::{
    FairSpillPool, GreedyMemoryPool, MemoryPool, TrackConsumersPool,
};
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::logical_expr::ExplainFormat;
use datafusion::prelude::SessionContext;
use datafusion_cli::catalog::DynamicObjectStoreCatalog;
use datafusion_cli::exec;
use datafusion_cli::functions::ParquetMetadataFunc;
use datafusion_cli::object_storage::instrumented::{
    InstrumentedObjectStoreMode, InstrumentedObjectStoreRegistry,
};
use datafusion_cli::pool_type::PoolType;
use datafusion_cli::print_format::PrintFormat;
use datafusion_cli::print_options::{MaxRows, PrintOptions};

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// DataFusion's SQL shell with fast set operations on list columns (datafusion-sets).
#[derive(Debug, Parser)]
#[clap(version, about, long_about = None)]
struct Args {
    /// Path to your data, default to current directory
    #[clap(short = 'p', long, value_parser(valid_dir))]
    data_path: Option<String>,

    /// The batch size of each query, or use DataFusion default
    #[clap(short = 'b', long)]
    batch_size: Option<usize>,

    /// Execute the given command string(s), then exit
    #[clap(short = 'c', long, num_args = 0.., value_parser(non_empty))]
    command: Vec<String>,

    /// The memory pool limitation (e.g. '10g'), default to None (no limit)
    #[clap(short = 'm', long, value_parser(byte_size))]
    memory_limit: Option<usize>,

    /// Execute commands from file(s), then exit
    #[clap(short, long, num_args = 0.., value_parser(valid_file))]
    file: Vec<String>,

    /// Run the provided files on startup instead of ~/.datafusionrc
    #[clap(short = 'r', long, num_args = 0.., value_parser(valid_file), conflicts_with = "file")]
    rc: Option<Vec<String>>,

    #[clap(long, value_enum, default_value_t = PrintFormat::Automatic)]
    format: PrintFormat,

    /// Reduce printing other than the results and work quietly
    #[clap(short, long)]
    quiet: bool,

    /// Specify the memory pool type 'greedy' or 'fair'
    #[clap(long, default_value_t = PoolType::Greedy)]
    mem_pool_type: PoolType,

    /// The number of top memory consumers to display when a query fails for memory (0: off)
    #[clap(long, default_value = "3")]
    top_memory_consumers: usize,

    /// The max number of rows to display for 'Table' format (a number, or 'inf')
    #[clap(long, default_value = "40")]
    maxrows: MaxRows,

    /// Enables console syntax highlighting
    #[clap(long)]
    color: bool,

    /// Available disk space for spilling queries (e.g. '10g')
    #[clap(short = 'd', long, value_parser(byte_size))]
    disk_limit: Option<usize>,

    /// Object store profiling mode: disabled, summary or trace
    #[clap(long, default_value_t = InstrumentedObjectStoreMode::Disabled)]
    object_store_profiling: InstrumentedObjectStoreMode,
}

#[tokio::main]
async fn main() -> ExitCode {
    match run().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("Error: {e}");
            ExitCode::FAILURE
        }
    }
}

async fn run() -> Result<()> {
    env_logger::init();
    let args = Args::parse();
    if !args.quiet {
        eprintln!(
            "dfsets {} (DataFusion CLI v{})",
            env!("CARGO_PKG_VERSION"),
            datafusion_cli::DATAFUSION_CLI_VERSION
        );
    }
    if let Some(path) = &args.data_path {
        std::env::set_current_dir(path)?;
    }

    let mut options = ConfigOptions::from_env()?;
    if let Some(batch_size) = args.batch_size {
        if batch_size == 0 {
            return config_err!("batch_size must be greater than 0");
        }
        options.execution.batch_size = ConfigNonZeroUsize::try_new(batch_size)?;
    }
    if std::env::var_os("DATAFUSION_EXPLAIN_FORMAT").is_none() {
        options.explain.format = ExplainFormat::Tree;
    }
    if std::env::var_os("DATAFUSION_FORMAT_NULL").is_none() {
        options.format.null = "NULL".to_string();
    }
    let config = SessionConfig::from(options).with_information_schema(true);

    let mut runtime = RuntimeEnvBuilder::new();
    if let Some(limit) = args.memory_limit {
        let top = NonZeroUsize::new(args.top_memory_consumers);
        let pool: Arc<dyn MemoryPool> = match (args.mem_pool_type, top) {
            (PoolType::Fair, None) => Arc::new(FairSpillPool::new(limit)),
            (PoolType::Fair, Some(n)) => {
                Arc::new(TrackConsumersPool::new(FairSpillPool::new(limit), n))
            }
            (PoolType::Greedy, None) => Arc::new(GreedyMemoryPool::new(limit)),
            (PoolType::Greedy, Some(n)) => {
                Arc::new(TrackConsumersPool::new(GreedyMemoryPool::new(limit), n))
            }
        };
        runtime = runtime.with_memory_pool(pool);
    }
    if let Some(limit) = args.disk_limit {
        runtime = runtime.with_disk_manager_builder(
            DiskManagerBuilder::default()
                .with_mode(DiskManagerMode::OsTmpDirectory)
                .with_max_temp_directory_size(limit as u64),
        );
    }
    let registry = Arc::new(
        InstrumentedObjectStoreRegistry::new().with_profile_mode(args.object_store_profiling),
    );
    runtime = runtime.with_object_store_registry(registry.clone());

    let ctx = SessionContext::new_with_config_rt(config, runtime.build_arc()?).enable_url_table();
    ctx.refresh_catalogs().await?;
    ctx.register_catalog_list(Arc::new(DynamicObjectStoreCatalog::new(
        ctx.state().catalog_list().clone(),
        ctx.state_weak_ref(),
    )));
    ctx.register_udtf("parquet_metadata", Arc::new(ParquetMetadataFunc {}));
    datafusion_sets::register(&ctx)?;

    let mut print_options = PrintOptions {
        format: args.format,
        quiet: args.quiet,
        maxrows: args.maxrows,
        color: args.color,
        instrumented_registry: registry,
    };

    if args.command.is_empty() && args.file.is_empty() {
        let rc = args.rc.unwrap_or_else(default_rc);
        if !rc.is_empty() {
            exec::exec_from_files(&ctx, rc, &print_options).await?;
        }
        return exec::exec_from_repl(&ctx, &mut print_options)
            .await
            .map_err(|e| DataFusionError::External(Box::new(e)));
    }
    if !args.file.is_empty() {
        exec::exec_from_files(&ctx, args.file, &print_options).await?;
    }
    if !args.command.is_empty() {
        exec::exec_from_commands(&ctx, args.command, &print_options).await?;
    }
    Ok(())
}

fn default_rc() -> Vec<String> {
    std::env::var_os("HOME")
        .map(|home| Path::new(&home).join(".datafusionrc"))
        .filter(|p| p.exists())
        .and_then(|p| p.to_str().map(str::to_string))
        .into_iter()
        .collect()
}

fn valid_file(path: &str) -> Result<String, String> {
    if Path::new(path).is_file() {
        Ok(path.to_string())
    } else {
        Err(format!("Invalid file '{path}'"))
    }
}

fn valid_dir(path: &str) -> Result<String, String> {
    if Path::new(path).is_dir() {
        Ok(path.to_string())
    } else {
        Err(format!("Invalid data directory '{path}'"))
    }
}

fn non_empty(command: &str) -> Result<String, String> {
    if command.is_empty() {
        Err("-c flag expects only non empty commands".to_string())
    } else {
        Ok(command.to_string())
    }
}

/// '512', '64k', '10m', '2g', '1t' (binary units) → bytes.
fn byte_size(s: &str) -> Result<usize, String> {
    let s = s.trim().to_ascii_lowercase();
    let digits = s.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let unit = &s[digits.len()..];
    let shift = match unit {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        _ => return Err(format!("Invalid size unit in '{s}'")),
    };
    let n: usize = digits.parse().map_err(|_| format!("Invalid size '{s}'"))?;
    n.checked_shl(shift)
        .filter(|v| v >> shift == n)
        .ok_or_else(|| format!("Size '{s}' is too large"))
}
