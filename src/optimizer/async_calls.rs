//! The function rewrite `sets_async_calls`: each call of a function registered as a plain
//! entry for its documentation ([`TopkBm25Entry`]) becomes a call of the async function the
//! entry carries, so the physical planner runs it in an `AsyncFuncExec`.
//!
//! It runs first among the analyzer's steps (DataFusion applies function rewrites before type
//! coercion) and where a session turns a lone expression into a physical one
//! (`SessionState::create_physical_expr`). The replacement has the entry's name, signature
//! and return type, so column names and schemas do not change.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::common::{DFSchema, Result};
use datafusion::logical_expr::Expr;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;

use crate::functions::topk_bm25::TopkBm25Entry;

/// The rewrite's name, as `Analyzer::function_rewrites` lists it.
pub const SETS_ASYNC_CALLS: &str = "sets_async_calls";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct AsyncCallRewrite;

impl FunctionRewrite for AsyncCallRewrite {
    fn name(&self) -> &str {
        SETS_ASYNC_CALLS
    }

    fn rewrite(
        &self,
        expr: Expr,
        _schema: &DFSchema,
        _config: &ConfigOptions,
    ) -> Result<Transformed<Expr>> {
        if let Expr::ScalarFunction(ScalarFunction { func, args }) = &expr
            && let Some(entry) = func.inner().downcast_ref::<TopkBm25Entry>()
        {
            let call =
                ScalarFunction::new_udf(std::sync::Arc::clone(entry.async_udf()), args.clone());
            return Ok(Transformed::yes(Expr::ScalarFunction(call)));
        }
        Ok(Transformed::no(expr))
    }
}
