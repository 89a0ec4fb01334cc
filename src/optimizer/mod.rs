//! The crate's planning rules: the function rewrite that plans `topk_bm25` asynchronously,
//! and the physical optimizer rules.

pub mod async_calls;
pub mod backend_exec;
pub mod backend_rule;
