//! # datafusion-sets
//!
//! Fast set operations on Arrow list columns for Apache DataFusion.
//!
//! - SQL: `list_intersect`, `list_intersect_count`, `list_intersect_agg`, `jaccard`,
//!   `cosine`, `dice`, `overlap`, `tokenize`, the `similarity_join` and `bm25_index` table
//!   functions, `topk_bm25`, and the rule that runs
//!   `JOIN ... ON jaccard(r.tokens, s.tokens) >= 0.8` as a similarity join
//!   ([`SimilarityJoinExec`]); options `SET sets.<option> = ...` ([`SetsConfig`]).
//! - Rust: the UDFs one by one ([`udf`]), `Expr` builders ([`expr_fn`]), BM25 without SQL
//!   ([`bm25`]), the CPU kernels ([`kernels`]) and the GPU's status ([`gpu`]).
//!
//! Install everything with [`SessionStateBuilderExt::with_sets`] or [`register`]:
//!
//! ```
//! use datafusion::prelude::SessionContext;
//!
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> datafusion::error::Result<()> {
//! let ctx = SessionContext::new();
//! datafusion_sets::register(&ctx)?;
//! let df = ctx.sql("SELECT list_intersect([1, 3, 5, 7], [3, 4, 5]) AS common").await?;
//! let batches = df.collect().await?;
//! assert_eq!(batches[0].num_rows(), 1);
//! # Ok(())
//! # }
//! ```

/// A module that is part of the public API only with the `tuning` feature (benchmarks, device
/// tests and probes reach the internals through it); private otherwise.
macro_rules! lab_module {
    ($($name:ident),* $(,)?) => {$(
        #[cfg(feature = "tuning")]
        #[doc(hidden)]
        pub mod $name;
        #[cfg(not(feature = "tuning"))]
        mod $name;
    )*};
}

lab_module!(
    backend, functions, intersect, io, join, optimizer, placement, search, tuning
);
mod catalog;
mod config;
#[cfg(feature = "proto")]
pub mod distributed;
mod session;

#[cfg(feature = "tuning")]
pub use config::TuningOptions;
pub use config::{BackendChoice, SetsConfig};
pub use functions::expr_fn;
pub use functions::{all_aggregate_functions, all_scalar_functions};
pub use intersect::similarity::Measure;
pub use join::{
    Comparison, JoinColumn, JoinDistribution, JoinInput, SimilarityJoinExec, Threshold,
};
pub use session::{SessionStateBuilderExt, new_context, register, register_all, table_functions};

/// The crate's UDFs one by one (every one of them: [`all_scalar_functions`],
/// [`all_aggregate_functions`]).
pub mod udf {
    pub use crate::functions::list_intersect::list_intersect_udf;
    pub use crate::functions::list_intersect_agg::{ListIntersectAgg, list_intersect_agg_udaf};
    pub use crate::functions::list_intersect_count::list_intersect_count_udf;
    pub use crate::functions::similarity::{cosine_udf, dice_udf, jaccard_udf, overlap_udf};
    pub use crate::functions::tokenize::tokenize_udf;
    pub use crate::functions::topk_bm25::{SessionHandle, TopkBm25, hit_fields};

    /// For hosts that pass every argument as an array (datafusion-ffi): an argument meant
    /// to be a constant as one value, when its rows all hold the same one.
    pub use crate::functions::common::one_value;
}

/// The GPU as the crate sees it: whether one is usable (and which), or why not.
pub mod gpu {
    pub use crate::backend::gpu::{
        DeviceInfo, GpuError, batches_run, device, is_available, kernel_modules,
    };
    pub use crate::search::gpu::bm25_batches_run;
}

/// BM25 search from Rust: build an index, tokenize, rank (what `bm25_index` and `topk_bm25`
/// run, without SQL).
pub mod bm25 {
    pub use crate::search::index::{IndexBuilder, IndexedDoc, InvertedIndex};
    pub use crate::search::loaded::index_loads;
    pub use crate::search::queries::{Queries, QueryTerms};
    pub use crate::search::rank::{RankStats, Ranked, rank_terms};
    pub use crate::search::scoring::{Bm25Params, Scored};
    pub use crate::search::tokenize::{
        Grams, Language, Tokenizer, TokenizerKind, TokenizerOptions, uax29_words,
    };
    pub use crate::search::topk::{Hit, Mode, exhaustive, query_terms, top};
}

/// The CPU intersection kernels over sorted integer slices (scalar, galloping, SSE4.2, AVX2,
/// AVX-512, VP2INTERSECT), chosen at run time from the CPU's features.
pub mod kernels {
    pub use crate::backend::cpu::{
        Kernel, SetElem, Sortedness, choose_kernel, intersect, intersect_auto,
        intersect_auto_checked, intersect_kway, sortedness,
    };
}

/// The README's Rust snippets, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
