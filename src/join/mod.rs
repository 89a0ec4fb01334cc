//! The exact set similarity join: [`exec::SimilarityJoinExec`] (filter: AllPairs + PPJoin
//! over frequency-ordered tokens; verification: early-terminating merge), its threshold
//! arithmetic ([`threshold`]), the `similarity_join(...)` table function and the optimizer
//! rule that plans `JOIN ... ON jaccard(r.tokens, s.tokens) >= t` with it ([`rewrite`]).

mod build;
mod crew;
pub mod exec;
mod filter;
pub mod gpu;
pub mod rewrite;
mod split_scan;
mod stream;
pub mod table_function;
pub mod threshold;

pub use exec::{JoinColumn, JoinInput, SimilarityJoinExec};
pub use rewrite::{SIMILARITY_JOIN_REWRITE, SimilarityJoinRewrite};
pub use table_function::{SIMILARITY_JOIN, SimilarityJoinFunction};
pub use threshold::{Comparison, Threshold};
