//! The exact set similarity join: [`exec::SimilarityJoinExec`] (filter: AllPairs + PPJoin
//! over frequency-ordered tokens; verification: early-terminating merge) and its threshold
//! arithmetic ([`threshold`]). Its SQL faces are `functions::similarity_join` (the table
//! function) and `optimizer::similarity_join_rewrite` (the rule that plans
//! `JOIN ... ON jaccard(r.tokens, s.tokens) >= t` with it).

mod build;
mod crew;
pub mod exec;
mod filter;
pub mod gpu;
mod read;
pub mod route;
mod stream;
pub mod threshold;

pub use exec::{JoinColumn, JoinDistribution, JoinInput, SimilarityJoinExec};
pub use threshold::{Comparison, Threshold};
