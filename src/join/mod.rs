//! The exact set similarity join: [`exec::SimilarityJoinExec`] (filter: AllPairs + PPJoin
//! over frequency-ordered tokens; verification: early-terminating merge), its threshold
//! arithmetic ([`threshold`]) and the `similarity_join(...)` table function.

pub mod exec;
mod filter;
mod stream;
pub mod table_function;
pub mod threshold;

pub use exec::{JoinInput, SimilarityJoinExec};
pub use table_function::{SIMILARITY_JOIN, SimilarityJoinFunction};
pub use threshold::{Comparison, Threshold};
