//! # datafusion-sets
//!
//! Fast set operations on Arrow list columns for Apache DataFusion.
//!
//! - [`functions`]: the SQL surface (`list_intersect`, `list_intersect_count`,
//!   `list_intersect_agg`, `jaccard`, `cosine`, `dice`, `overlap`), one function per file.
//! - [`join`]: the exact set similarity join (`SimilarityJoinExec`, the `similarity_join`
//!   table function, and the `similarity_join_rewrite` optimizer rule that runs
//!   `JOIN ... ON jaccard(r.tokens, s.tokens) >= 0.8` on it).
//! - [`backend`]: the kernels — scalar, galloping and SIMD (SSE4.2 STTNI, AVX2, AVX-512,
//!   VP2INTERSECT) on the CPU, chosen at run time.
//! - [`config`]: `SET sets.<option> = ...`.
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

pub mod backend;
pub mod config;
pub mod functions;
pub mod join;
pub mod optimizer;
pub mod search;
mod session;
pub mod table_args;
pub mod tuning;

pub use config::SetsConfig;
pub use functions::expr_fn;
pub use session::{SessionStateBuilderExt, new_context, register, register_all};

/// The README's Rust snippets, compiled and run as doc tests.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
