//! `SET sets.<option> = ...`: the crate's configuration extension.
//!
//! Every option is read at execution time from the session's `ConfigOptions`, so a `SET`
//! takes effect on the next query. Bad values are rejected by the `SET` itself.

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions};
use datafusion::common::{DataFusionError, config_err, config_field};

use crate::backend::cpu::Kernel;

/// Which device runs the set kernels.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum BackendChoice {
    /// Decide per operator from statistics (CPU when no GPU is present).
    #[default]
    Auto,
    /// Always the CPU kernels.
    Cpu,
    /// The GPU when one is present (the CPU otherwise; EXPLAIN says why).
    Gpu,
}

impl FromStr for BackendChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cpu" => Ok(Self::Cpu),
            "gpu" | "cuda" => Ok(Self::Gpu),
            other => config_err!("sets.backend: expected 'auto', 'cpu' or 'gpu', got '{other}'"),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Cpu => "cpu",
            Self::Gpu => "gpu",
        })
    }
}

config_field!(BackendChoice);

/// Which CPU intersection kernel runs on sorted rows: `auto` (the measured hybrid) or one
/// kernel forced for every row (testing and benchmarking).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum CpuKernelChoice {
    /// Pick per row from the two lengths and the CPU's features.
    #[default]
    Auto,
    /// Force this kernel (falls back to a correct one if the CPU lacks it).
    Fixed(Kernel),
}

impl FromStr for CpuKernelChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim().to_ascii_lowercase();
        if s == "auto" {
            return Ok(Self::Auto);
        }
        match Kernel::ALL.iter().find(|k| k.name() == s) {
            Some(k) => Ok(Self::Fixed(*k)),
            None => {
                let names: Vec<_> = Kernel::ALL.iter().map(|k| k.name()).collect();
                config_err!(
                    "sets.cpu_kernel: expected 'auto' or one of {}, got '{s}'",
                    names.join(", ")
                )
            }
        }
    }
}

impl fmt::Display for CpuKernelChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Auto => f.write_str("auto"),
            Self::Fixed(k) => f.write_str(k.name()),
        }
    }
}

config_field!(CpuKernelChoice);

/// Options of datafusion-sets, set with `SET sets.<name> = <value>` and listed (with their
/// `sets.` prefix) by `SHOW ALL` and `information_schema.df_settings`.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct SetsConfig {
    /// Device for set kernels: 'auto', 'cpu' or 'gpu'.
    pub backend: BackendChoice,
    /// CPU intersection kernel for sorted rows: 'auto' (the measured hybrid) or one of
    /// 'scalar', 'galloping', 'sse42', 'avx2', 'avx512', 'vp2intersect'; also the
    /// similarity join's verification kernel.
    pub cpu_kernel: CpuKernelChoice,
    /// Split a batch's rows across threads when it holds at least this many list values
    /// (0 disables intra-batch threading).
    pub parallel_min_values: usize,
    /// BM25's k1 (term-frequency saturation), >= 0.
    pub bm25_k1: f64,
    /// BM25's b (length normalization), in [0, 1].
    pub bm25_b: f64,
    /// Weight of an index's static score: S = alpha * static + (1 - alpha) * BM25, in [0, 1].
    pub bm25_alpha: f64,
    /// Plan inner joins on `jaccard/cosine/dice/overlap(l.tokens, r.tokens) >= t` (or `> t`)
    /// as `SimilarityJoinExec` instead of a nested loop (the `similarity_join_rewrite`
    /// physical optimizer rule). Read when a query is planned.
    pub similarity_join_rewrite: bool,
    /// Read a similarity join's Parquet input with fewer row groups than
    /// `target_partitions` in row ranges at page boundaries, one task each (the offset index
    /// derived from the page headers when the file has none), instead of a row group per task.
    pub similarity_join_split_scan: bool,
    /// Device memory (bytes) the resident `topk_bm25` index may take on the GPU; 0: the
    /// `DFSETS_GPU_INDEX_BUDGET` environment variable, else half the device's memory. When
    /// the index does not fit, the terms queries visit most are admitted first and queries
    /// needing the others are ranked on the CPU.
    pub gpu_index_budget: usize,
    /// Keep the list columns that `list_intersect` / `list_intersect_count` send to the GPU
    /// on the device for later batches and queries (a table queried again is not copied
    /// again), least recently used evicted first.
    pub gpu_resident_columns: bool,
    /// Device memory (bytes) the resident list columns may take; 0: the
    /// `DFSETS_GPU_COLUMN_BUDGET` environment variable, else a quarter of the device's memory.
    pub gpu_column_budget: usize,
}

impl Default for SetsConfig {
    fn default() -> Self {
        Self {
            backend: BackendChoice::Auto,
            cpu_kernel: CpuKernelChoice::Auto,
            parallel_min_values: 1 << 18,
            bm25_k1: 1.2,
            bm25_b: 0.75,
            bm25_alpha: 0.3,
            similarity_join_rewrite: true,
            similarity_join_split_scan: true,
            gpu_index_budget: 0,
            gpu_resident_columns: true,
            gpu_column_budget: 0,
        }
    }
}

const BACKEND_DOC: &str = "Device for set kernels: 'auto', 'cpu' or 'gpu'.";
const CPU_KERNEL_DOC: &str = "CPU intersection kernel for sorted rows: 'auto' (hybrid) or one of 'scalar', 'galloping', 'sse42', 'avx2', 'avx512', 'vp2intersect'.";
const BM25_K1_DOC: &str = "BM25 k1 (term-frequency saturation) for topk_bm25, >= 0.";
const BM25_B_DOC: &str = "BM25 b (document-length normalization) for topk_bm25, in [0, 1].";
const BM25_ALPHA_DOC: &str = "topk_bm25 over an index with static scores: score = alpha * static + (1 - alpha) * BM25; alpha in [0, 1].";
const PARALLEL_DOC: &str =
    "Split a batch's rows across threads when it holds at least this many list values (0: never).";
const GPU_INDEX_BUDGET_DOC: &str = "Device memory (bytes) the resident topk_bm25 index may take on the GPU; 0: DFSETS_GPU_INDEX_BUDGET, else half the device's memory.";
const GPU_RESIDENT_COLUMNS_DOC: &str = "Keep the list columns list_intersect / list_intersect_count send to the GPU on the device for later batches and queries (least recently used evicted first).";
const GPU_COLUMN_BUDGET_DOC: &str = "Device memory (bytes) the resident list columns may take; 0: DFSETS_GPU_COLUMN_BUDGET, else a quarter of the device's memory.";
const SPLIT_SCAN_DOC: &str = "Read a similarity join's Parquet input with fewer row groups than target_partitions in row ranges at page boundaries, one task each (the offset index derived from the page headers when the file has none).";
const REWRITE_DOC: &str = "Plan inner joins whose condition is jaccard/cosine/dice/overlap(l.tokens, r.tokens) >= (or >) a literal as SimilarityJoinExec instead of a nested loop.";

impl ExtensionOptions for SetsConfig {
    fn as_any(&self) -> &dyn Any {
        self
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }

    fn cloned(&self) -> Box<dyn ExtensionOptions> {
        Box::new(self.clone())
    }

    fn set(&mut self, key: &str, value: &str) -> datafusion::common::Result<()> {
        match key {
            "backend" => self.backend.set("", value),
            "cpu_kernel" => self.cpu_kernel.set("", value),
            "parallel_min_values" => set_usize(&mut self.parallel_min_values, key, value),
            "bm25_k1" => set_f64(&mut self.bm25_k1, key, value, 0.0, f64::MAX),
            "bm25_b" => set_f64(&mut self.bm25_b, key, value, 0.0, 1.0),
            "bm25_alpha" => set_f64(&mut self.bm25_alpha, key, value, 0.0, 1.0),
            "similarity_join_rewrite" => self.similarity_join_rewrite.set("", value),
            "similarity_join_split_scan" => self.similarity_join_split_scan.set("", value),
            "gpu_index_budget" => set_usize(&mut self.gpu_index_budget, key, value),
            "gpu_resident_columns" => self.gpu_resident_columns.set("", value),
            "gpu_column_budget" => set_usize(&mut self.gpu_column_budget, key, value),
            other => config_err!(
                "unknown option sets.{other}: expected one of sets.backend, sets.cpu_kernel, sets.parallel_min_values, sets.bm25_k1, sets.bm25_b, sets.bm25_alpha, sets.similarity_join_rewrite, sets.similarity_join_split_scan, sets.gpu_index_budget, sets.gpu_resident_columns, sets.gpu_column_budget"
            ),
        }
    }

    fn entries(&self) -> Vec<ConfigEntry> {
        let entry = |key: &str, value: String, description: &'static str| ConfigEntry {
            key: format!("{}.{key}", Self::PREFIX),
            value: Some(value),
            description,
        };
        vec![
            entry("backend", self.backend.to_string(), BACKEND_DOC),
            entry("cpu_kernel", self.cpu_kernel.to_string(), CPU_KERNEL_DOC),
            entry(
                "parallel_min_values",
                self.parallel_min_values.to_string(),
                PARALLEL_DOC,
            ),
            entry("bm25_k1", self.bm25_k1.to_string(), BM25_K1_DOC),
            entry("bm25_b", self.bm25_b.to_string(), BM25_B_DOC),
            entry("bm25_alpha", self.bm25_alpha.to_string(), BM25_ALPHA_DOC),
            entry(
                "similarity_join_rewrite",
                self.similarity_join_rewrite.to_string(),
                REWRITE_DOC,
            ),
            entry(
                "similarity_join_split_scan",
                self.similarity_join_split_scan.to_string(),
                SPLIT_SCAN_DOC,
            ),
            entry(
                "gpu_index_budget",
                self.gpu_index_budget.to_string(),
                GPU_INDEX_BUDGET_DOC,
            ),
            entry(
                "gpu_resident_columns",
                self.gpu_resident_columns.to_string(),
                GPU_RESIDENT_COLUMNS_DOC,
            ),
            entry(
                "gpu_column_budget",
                self.gpu_column_budget.to_string(),
                GPU_COLUMN_BUDGET_DOC,
            ),
        ]
    }
}

/// Parse a non-negative integer into `field`.
fn set_usize(field: &mut usize, key: &str, value: &str) -> datafusion::common::Result<()> {
    match value.trim().parse::<usize>() {
        Ok(v) => {
            *field = v;
            Ok(())
        }
        Err(_) => config_err!("sets.{key}: expected a non-negative integer, got '{value}'"),
    }
}

/// Parse a finite float in `[lo, hi]` into `field`.
fn set_f64(
    field: &mut f64,
    key: &str,
    value: &str,
    lo: f64,
    hi: f64,
) -> datafusion::common::Result<()> {
    match value.trim().parse::<f64>() {
        Ok(v) if v.is_finite() && (lo..=hi).contains(&v) => {
            *field = v;
            Ok(())
        }
        _ if hi == f64::MAX => config_err!("sets.{key}: expected a number >= {lo}, got '{value}'"),
        _ => config_err!("sets.{key}: expected a number in [{lo}, {hi}], got '{value}'"),
    }
}

impl ConfigExtension for SetsConfig {
    const PREFIX: &'static str = "sets";
}

impl SetsConfig {
    /// The options in force for a query: the session's, or the defaults when the extension
    /// was not registered (a UDF used on its own).
    pub fn from_options(options: &datafusion::config::ConfigOptions) -> SetsConfig {
        options
            .extensions
            .get::<SetsConfig>()
            .cloned()
            .unwrap_or_default()
    }
}
