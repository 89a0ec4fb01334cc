//! The crate's planning rules: the function rewrite that plans `topk_bm25` asynchronously,
//! the physical rule that binds every call to a backend, and the rule that plans similarity
//! joins written as SQL joins on `SimilarityJoinExec`.

pub mod async_calls;
pub mod backend_exec;
pub mod backend_rule;
pub mod join_distribution;
pub mod similarity_join_rewrite;
pub mod topk_queries;
