//! The crate's planning rules: the function rewrites that plan `topk_bm25` asynchronously and
//! `cardinality(list_intersect(...))` as `list_intersect_count(...)`,
//! the physical rule that binds every call to a backend, the rule that plans similarity
//! joins written as SQL joins on `SimilarityJoinExec`, and the rules that spread them over
//! partitions and tasks.

pub mod async_calls;
pub mod backend_exec;
pub mod backend_rule;
pub mod intersect_count;
pub mod join_deal;
pub mod join_distribution;
pub mod similarity_join_rewrite;
pub mod topk_queries;
