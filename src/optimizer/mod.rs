//! Physical optimizer rules of the crate.

pub mod backend_exec;
pub mod backend_rule;
