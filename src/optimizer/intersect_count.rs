//! `cardinality(list_intersect(a, b, ...))` planned as `list_intersect_count(a, b, ...)`:
//! the count without building the list.
//!
//! The two are equal row for row, by definition (`list_intersect_count` is documented and
//! tested as that cardinality: the same arguments, coercion, errors, `NULL` for a `NULL`
//! list, `UInt64`). The counting kernels skip the result list, its offsets and, on the GPU,
//! its copy back: `SELECT sum(cardinality(list_intersect(a, b))) FROM t` is the common way to
//! ask how much two columns share. An analyzer function rewrite, so the query's column names
//! stay what the user wrote.

use datafusion::arrow::datatypes::DataType;
use datafusion::common::DFSchema;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::Transformed;
use datafusion::functions_nested::cardinality::Cardinality;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::expr_rewriter::FunctionRewrite;
use datafusion::logical_expr::{Expr, ExprSchemable};

use crate::functions::list_intersect::ListIntersect;
use crate::functions::list_intersect_count::list_intersect_count;

/// Whether `args` are two or more lists: anything else is left to `list_intersect`, whose
/// error then names the function the query called.
fn all_lists(args: &[Expr], schema: &DFSchema) -> bool {
    args.len() >= 2
        && args.iter().all(|a| {
            a.get_type(schema).is_ok_and(|t| {
                matches!(
                    t,
                    DataType::List(_) | DataType::LargeList(_) | DataType::FixedSizeList(..)
                )
            })
        })
}

/// The rewrite's name, as `Analyzer::function_rewrites` lists it.
pub const SETS_INTERSECT_COUNT: &str = "sets_intersect_count";

/// See the module.
#[derive(Debug, Default)]
pub struct IntersectCountRewrite;

impl FunctionRewrite for IntersectCountRewrite {
    fn name(&self) -> &str {
        SETS_INTERSECT_COUNT
    }

    fn rewrite(
        &self,
        expr: Expr,
        schema: &DFSchema,
        _config: &ConfigOptions,
    ) -> Result<Transformed<Expr>> {
        if let Expr::ScalarFunction(ScalarFunction { func, args }) = &expr
            && func.inner().downcast_ref::<Cardinality>().is_some()
            && let [Expr::ScalarFunction(inner)] = args.as_slice()
            && inner.func.inner().downcast_ref::<ListIntersect>().is_some()
            && all_lists(&inner.args, schema)
        {
            return Ok(Transformed::yes(list_intersect_count(inner.args.clone())));
        }
        Ok(Transformed::no(expr))
    }
}
