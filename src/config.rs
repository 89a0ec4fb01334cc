//! `SET sets.<option> = ...`: the crate's user options, each declared once in
//! [`SetsConfig`]'s table below; with the `tuning` feature also `SET tuning.<option>`, the
//! measurement switches ([`TuningOptions`]).
//!
//! Every option is read at execution time from the session's `ConfigOptions`, so a `SET`
//! takes effect on the next query. Bad values are rejected by the `SET` itself, or, behind
//! datafusion-ffi (where the host stores foreign options unchecked), by the query that reads
//! them.

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, DATAFUSION_FFI_CONFIG_NAMESPACE, ExtensionOptions,
};
use datafusion::common::{DataFusionError, config_err, config_field};
use datafusion::config::ConfigOptions;

use crate::backend::cpu::{CpuKernelChoice, Kernel};

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

/// How a similarity join spreads over the tasks of a distributed plan
/// (`sets.similarity_join_distribution`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JoinDistributionChoice {
    /// One task in one process; under datafusion-distributed, chosen by the inputs'
    /// statistics (`crate::optimizer::join_distribution`).
    #[default]
    Auto,
    /// One task reads both inputs and builds one index (partitions share it).
    Single,
    /// Each set goes to the partitions of its prefix tokens' buckets (global frequency
    /// order), and each partition joins its own sets.
    Prefix,
    /// Every partition reads the smaller side of an R-S join whole and joins it with its part
    /// of the other side; a self-join's input is read whole and joined with each part of it.
    Broadcast,
}

impl FromStr for JoinDistributionChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "single" => Ok(Self::Single),
            "prefix" => Ok(Self::Prefix),
            "broadcast" => Ok(Self::Broadcast),
            other => config_err!(
                "sets.similarity_join_distribution: expected 'auto', 'single', 'prefix' or 'broadcast', got '{other}'"
            ),
        }
    }
}

impl fmt::Display for JoinDistributionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Single => "single",
            Self::Prefix => "prefix",
            Self::Broadcast => "broadcast",
        })
    }
}

config_field!(JoinDistributionChoice);

/// How `bm25_index` spreads its build over partitions and tasks
/// (`sets.bm25_index_distribution`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum IndexDistributionChoice {
    /// `single` in one process, `terms` under datafusion-distributed.
    #[default]
    Auto,
    /// One partition reads every document and builds the index (on every core).
    Single,
    /// Each partition indexes the documents it reads; the postings are merged per term after
    /// a hash exchange on the term (`crate::search::build`).
    Terms,
}

impl FromStr for IndexDistributionChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "single" => Ok(Self::Single),
            "terms" => Ok(Self::Terms),
            other => config_err!(
                "sets.bm25_index_distribution: expected 'auto', 'single' or 'terms', got '{other}'"
            ),
        }
    }
}

impl fmt::Display for IndexDistributionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Single => "single",
            Self::Terms => "terms",
        })
    }
}

config_field!(IndexDistributionChoice);

/// How `topk_bm25` (the table function, and the scalar over a column of queries) searches a
/// sharded index (`sets.topk_bm25_distribution`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum SearchDistributionChoice {
    /// `shards` for a sharded index under datafusion-distributed, else `single`.
    #[default]
    Auto,
    /// One task loads the whole index table and ranks.
    Single,
    /// Each partition loads whole shards and ranks them; the lists are merged
    /// (`crate::search::shards`, `crate::search::shard_queries`). Only for a sharded index.
    Shards,
}

impl FromStr for SearchDistributionChoice {
    type Err = DataFusionError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "single" => Ok(Self::Single),
            "shards" => Ok(Self::Shards),
            other => config_err!(
                "sets.topk_bm25_distribution: expected 'auto', 'single' or 'shards', got '{other}'"
            ),
        }
    }
}

impl fmt::Display for SearchDistributionChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Single => "single",
            Self::Shards => "shards",
        })
    }
}

config_field!(SearchDistributionChoice);

/// Whether a session plans for datafusion-distributed (its options hold the `distributed`
/// extension, which the distributed planner registers).
pub fn under_distributed(options: &ConfigOptions) -> bool {
    options
        .extensions
        .iter()
        .any(|(prefix, _)| prefix == "distributed")
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
                    "tuning.cpu_kernel: expected 'auto' or one of {}, got '{s}'",
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

/// Declares an options struct once: each option's doc (shown by `SHOW ALL`), name, type,
/// default and parser, from which the struct, its `Default`, `SET` and the listing follow.
macro_rules! options {
    (
        $(#[$meta:meta])*
        pub struct $Name:ident ($prefix:literal) {
            $( #[doc = $doc:literal] $field:ident : $ty:ty = $default:expr, $parse:expr; )*
        }
    ) => {
        $(#[$meta])*
        #[derive(Debug, Clone, PartialEq)]
        #[non_exhaustive]
        pub struct $Name {
            $( #[doc = $doc] pub $field: $ty, )*
        }

        impl Default for $Name {
            fn default() -> Self {
                Self { $( $field: $default, )* }
            }
        }

        impl ExtensionOptions for $Name {
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
                    $( stringify!($field) => {
                        let parse: fn(&mut $ty, &str, &str) -> datafusion::common::Result<()> = $parse;
                        parse(&mut self.$field, concat!($prefix, ".", stringify!($field)), value)
                    } )*
                    other => {
                        let names = [$( concat!($prefix, ".", stringify!($field)) ),*];
                        config_err!(
                            "unknown option {}.{other}: expected one of {}",
                            $prefix,
                            names.join(", ")
                        )
                    }
                }
            }

            fn entries(&self) -> Vec<ConfigEntry> {
                vec![$( ConfigEntry {
                    key: concat!($prefix, ".", stringify!($field)).to_string(),
                    value: Some(self.$field.to_string()),
                    description: $doc.trim(),
                }, )*]
            }
        }

        impl ConfigExtension for $Name {
            const PREFIX: &'static str = $prefix;
        }

        impl $Name {
            /// The options in force for a query: the session's, or the defaults when the
            /// extension was not registered (a UDF used on its own).
            ///
            /// Behind datafusion-ffi (datafusion-python loading the `datafusion_sets`
            /// wheel) the session holds no extension of this type: the host keeps every
            /// foreign `SET` as text, under its full name, in one extension of prefix
            /// `datafusion_ffi`, and checks none of them. They are parsed here, so a bad
            /// value is this call's error, not a silent default.
            pub fn from_options(options: &ConfigOptions) -> datafusion::common::Result<Self> {
                if let Some(local) = options.extensions.get::<Self>() {
                    return Ok(local.clone());
                }
                let mut found = Self::default();
                let foreign = options
                    .extensions
                    .iter()
                    .filter(|(prefix, _)| *prefix == DATAFUSION_FFI_CONFIG_NAMESPACE);
                for (_, extension) in foreign {
                    for entry in extension.entries() {
                        let name = entry.key.strip_prefix(concat!($prefix, "."));
                        if let (Some(name), Some(value)) = (name, entry.value.as_deref()) {
                            found.set(name, value)?;
                        }
                    }
                }
                Ok(found)
            }
        }
    };
}

/// A value parsed by its `ConfigField` impl (the type's own `FromStr` errors name the option).
fn parse_field<T: ConfigField>(
    field: &mut T,
    _key: &str,
    value: &str,
) -> datafusion::common::Result<()> {
    field.set("", value)
}

options! {
    /// Options of datafusion-sets, set with `SET sets.<name> = <value>` and listed (with their
    /// `sets.` prefix) by `SHOW ALL` and `information_schema.df_settings`.
    pub struct SetsConfig ("sets") {
        /// Device for set kernels: 'auto', 'cpu' or 'gpu'.
        backend: BackendChoice = BackendChoice::Auto, parse_field;
        /// Split a batch's rows across threads when it holds at least this many list values (0: never).
        parallel_min_values: usize = 1 << 18, set_usize;
        /// BM25 k1 (term-frequency saturation) for topk_bm25, in [0, 1000000] (bounded so every score stays finite).
        bm25_k1: f64 = 1.2, |f, k, v| set_f64(f, k, v, 0.0, BM25_K1_MAX);
        /// BM25 b (document-length normalization) for topk_bm25, in [0, 1].
        bm25_b: f64 = 0.75, |f, k, v| set_f64(f, k, v, 0.0, 1.0);
        /// topk_bm25 over an index with static scores: score = alpha * static + (1 - alpha) * BM25; alpha in [0, 1].
        bm25_alpha: f64 = 0.3, |f, k, v| set_f64(f, k, v, 0.0, 1.0);
        /// Plan inner joins whose condition is jaccard/cosine/dice/overlap(l.tokens, r.tokens) >= (or >) a literal as SimilarityJoinExec instead of a nested loop.
        similarity_join_rewrite: bool = true, parse_field;
        /// How a similarity join spreads over partitions and tasks: 'auto' (one shared index in one process; under datafusion-distributed chosen by statistics), 'single', 'prefix' (sets sent to the buckets of their prefix tokens) or 'broadcast' (the smaller side, or a self-join's input, read whole by every partition).
        similarity_join_distribution: JoinDistributionChoice = JoinDistributionChoice::Auto, parse_field;
        /// How bm25_index spreads its build: 'auto' (single in one process, terms under datafusion-distributed), 'single' (one partition indexes every document) or 'terms' (each partition indexes its documents; postings merged per term after a hash exchange).
        bm25_index_distribution: IndexDistributionChoice = IndexDistributionChoice::Auto, parse_field;
        /// How topk_bm25 searches a sharded index (bm25_index(..., 'shards=N')): 'auto' (shards under datafusion-distributed, else single), 'single' (one task loads the whole table) or 'shards' (each partition ranks whole shards, the lists merged; the scalar over a column of queries ranks its distinct texts so and joins the lists back; an error for an unsharded index).
        topk_bm25_distribution: SearchDistributionChoice = SearchDistributionChoice::Auto, parse_field;
        /// Device memory (bytes) the resident topk_bm25 index may take on the GPU; 0: DFSETS_GPU_INDEX_BUDGET, else half the device's memory.
        gpu_index_budget: usize = 0, set_usize;
        /// Keep the list columns list_intersect / list_intersect_count send to the GPU on the device for later batches and queries (least recently used evicted first).
        gpu_resident_columns: bool = true, parse_field;
        /// Device memory (bytes) the resident list columns may take; 0: DFSETS_GPU_COLUMN_BUDGET, else a quarter of the device's memory.
        gpu_column_budget: usize = 0, set_usize;
    }
}

#[cfg(feature = "tuning")]
options! {
    /// Measurement switches (the `tuning` feature only): `SET tuning.<name> = <value>`. They
    /// never change an answer, only how it is computed.
    pub struct TuningOptions ("tuning") {
        /// CPU intersection kernel for sorted rows and the similarity join's verification: 'auto' (hybrid) or one of 'scalar', 'galloping', 'sse42', 'avx2', 'avx512', 'vp2intersect'.
        cpu_kernel: CpuKernelChoice = CpuKernelChoice::Auto, parse_field;
        /// Read a similarity join's Parquet input with fewer row groups than target_partitions in row ranges at page boundaries, one task each (the offset index derived from the page headers when the file has none).
        similarity_join_split_scan: bool = true, parse_field;
    }
}

/// The CPU kernel choice in force (`tuning.cpu_kernel`; always `auto` without the `tuning`
/// feature).
pub fn cpu_kernel(_options: &ConfigOptions) -> CpuKernelChoice {
    #[cfg(feature = "tuning")]
    return TuningOptions::from_options(_options)
        .unwrap_or_default()
        .cpu_kernel;
    #[cfg(not(feature = "tuning"))]
    CpuKernelChoice::Auto
}

/// Whether a similarity join may split its Parquet scan at page boundaries
/// (`tuning.similarity_join_split_scan`; always on without the `tuning` feature).
pub fn similarity_join_split_scan(_options: &ConfigOptions) -> bool {
    #[cfg(feature = "tuning")]
    return TuningOptions::from_options(_options)
        .unwrap_or_default()
        .similarity_join_split_scan;
    #[cfg(not(feature = "tuning"))]
    true
}

/// Adds the crate's configuration extensions to `options` where missing.
pub(crate) fn install(options: &mut ConfigOptions) {
    if options.extensions.get::<SetsConfig>().is_none() {
        options.extensions.insert(SetsConfig::default());
    }
    #[cfg(feature = "tuning")]
    if options.extensions.get::<TuningOptions>().is_none() {
        options.extensions.insert(TuningOptions::default());
    }
}

/// Parse a non-negative integer into `field`.
fn set_usize(field: &mut usize, key: &str, value: &str) -> datafusion::common::Result<()> {
    match value.trim().parse::<usize>() {
        Ok(v) => {
            *field = v;
            Ok(())
        }
        Err(_) => config_err!("{key}: expected a non-negative integer, got '{value}'"),
    }
}

/// The largest `sets.bm25_k1`: a posting's score is at most idf · tf · (k1 + 1) / (tf + k1·(1 − b)),
/// with idf < 45 and tf < 2^32, far from overflow at this bound (at 1e308 it overflows to inf).
pub const BM25_K1_MAX: f64 = 1e6;

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
        _ => config_err!("{key}: expected a number in [{lo}, {hi}], got '{value}'"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a datafusion-ffi host (datafusion-python) keeps for every foreign option: one
    /// extension of prefix `datafusion_ffi`, full names to unchecked text.
    #[derive(Debug, Clone, Default)]
    struct ForeignOptions(Vec<(String, String)>);

    impl ExtensionOptions for ForeignOptions {
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
            self.0.push((key.to_string(), value.to_string()));
            Ok(())
        }
        fn entries(&self) -> Vec<ConfigEntry> {
            let entry = |(k, v): &(String, String)| ConfigEntry {
                key: k.clone(),
                value: Some(v.clone()),
                description: "",
            };
            self.0.iter().map(entry).collect()
        }
    }

    impl ConfigExtension for ForeignOptions {
        const PREFIX: &'static str = DATAFUSION_FFI_CONFIG_NAMESPACE;
    }

    fn foreign(pairs: &[(&str, &str)]) -> ConfigOptions {
        let mut options = ConfigOptions::new();
        let pairs = pairs.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        options.extensions.insert(ForeignOptions(pairs.collect()));
        options
    }

    #[test]
    fn foreign_options_are_parsed_and_checked() {
        let options = foreign(&[
            ("sets.backend", "cpu"),
            ("sets.bm25_k1", "2.5"),
            ("other.thing", "x"),
        ]);
        let sets = SetsConfig::from_options(&options).unwrap();
        assert_eq!(sets.backend, BackendChoice::Cpu);
        assert_eq!(sets.bm25_k1, 2.5);
        assert_eq!(sets.bm25_b, SetsConfig::default().bm25_b);

        let bad = SetsConfig::from_options(&foreign(&[("sets.backend", "gpx")])).unwrap_err();
        assert!(bad.to_string().contains("sets.backend"), "{bad}");
        let unknown = SetsConfig::from_options(&foreign(&[("sets.bakend", "cpu")])).unwrap_err();
        assert!(unknown.to_string().contains("sets.bakend"), "{unknown}");
    }

    #[test]
    fn the_local_extension_comes_first_and_none_gives_defaults() {
        assert_eq!(
            SetsConfig::from_options(&ConfigOptions::new()).unwrap(),
            SetsConfig::default()
        );
        let mut options = foreign(&[("sets.backend", "gpx")]);
        options.extensions.insert(SetsConfig {
            backend: BackendChoice::Gpu,
            ..SetsConfig::default()
        });
        assert_eq!(
            SetsConfig::from_options(&options).unwrap().backend,
            BackendChoice::Gpu
        );
    }
}
