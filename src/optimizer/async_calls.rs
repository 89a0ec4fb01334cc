//! The function rewrite `sets_async_calls`: each call of a function registered as a plain
//! entry for its documentation ([`TopkBm25Entry`]) becomes a call of the async function the
//! entry carries, so the physical planner runs it in an `AsyncFuncExec`.
//!
//! It runs first among the analyzer's steps (DataFusion applies function rewrites before type
//! coercion) and where a session turns a lone expression into a physical one
//! (`SessionState::create_physical_expr`). The replacement has the entry's name, signature
//! and return type, so column names and schemas do not change.

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{DFSchema, Result, plan_err};
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;
use datafusion::logical_expr::{Expr, LogicalPlan};
use datafusion::optimizer::AnalyzerRule;

use crate::functions::topk_bm25::TopkBm25Entry;
use crate::functions::topk_bm25::table::TOPK_BM25;

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

/// The analyzer rule's name.
pub const SETS_ASYNC_PLACES: &str = "sets_async_call_places";

/// An analyzer rule that rejects, with a way out, a `topk_bm25` call where DataFusion
/// cannot run an async function: it evaluates them only in a SELECT list, a WHERE clause
/// and an aggregate's arguments, and elsewhere fails with an internal error.
#[derive(Debug, Default)]
pub struct AsyncCallPlaces;

impl AnalyzerRule for AsyncCallPlaces {
    fn name(&self) -> &str {
        SETS_ASYNC_PLACES
    }

    fn analyze(&self, plan: LogicalPlan, _config: &ConfigOptions) -> Result<LogicalPlan> {
        plan.apply_with_subqueries(|node| {
            let (place, exprs): (&str, Vec<&Expr>) = match node {
                LogicalPlan::Sort(s) => ("ORDER BY", s.expr.iter().map(|e| &e.expr).collect()),
                LogicalPlan::Aggregate(a) => ("GROUP BY", a.group_expr.iter().collect()),
                LogicalPlan::Window(w) => ("a window function", w.window_expr.iter().collect()),
                LogicalPlan::Values(v) => ("VALUES", v.values.iter().flatten().collect()),
                LogicalPlan::Join(j) => (
                    "a join condition",
                    j.on.iter()
                        .flat_map(|(l, r)| [l, r])
                        .chain(j.filter.as_ref())
                        .collect(),
                ),
                _ => return Ok(TreeNodeRecursion::Continue),
            };
            for e in exprs {
                if calls_topk(e)? {
                    return plan_err!(
                        "{TOPK_BM25}: cannot be called in {place} (DataFusion runs async functions only in a SELECT list, a WHERE clause or an aggregate's arguments); compute it in a subquery first, e.g. SELECT ... FROM (SELECT *, {TOPK_BM25}(...) AS hits FROM t) ORDER BY cardinality(hits)"
                    );
                }
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }
}

fn calls_topk(e: &Expr) -> Result<bool> {
    e.exists(|e| Ok(matches!(e, Expr::ScalarFunction(f) if f.name() == TOPK_BM25)))
}
