//! The optimizer rule `sets_topk_queries_by_shard`: a `topk_bm25` call over a column of
//! queries, in a SELECT list or an aggregate's arguments, becomes a left join of the rows
//! with the results of the distinct queries ([`TopkQueriesTable`]), ranked shard by shard.
//!
//! ```text
//! Projection: q.id, topk_bm25(Utf8("idx"), q.text, Int64(10)) AS hits
//!   TableScan: q
//! ```
//! becomes
//! ```text
//! Projection: q.id, __sets_topk_1_results.hits AS hits
//!   Left Join: __sets_topk_1_query = __sets_topk_1_results.query
//!     Projection: q.id, q.text, CAST(q.text AS Utf8) AS __sets_topk_1_query
//!       TableScan: q
//!     TableScan: __sets_topk_1_results     (the distinct non-NULL texts of q, ranked)
//! ```
//!
//! It applies when `sets.topk_bm25_distribution` is `shards`, or `auto` under
//! datafusion-distributed: there every task would otherwise load the whole index table. The
//! rows' input and the query expression are planned twice (once for the rows, once for the
//! distinct queries), so the rule leaves alone a volatile query or an input with a volatile
//! expression (`random()`), whose two readings could differ. A NULL query finds no row in the
//! results and gets NULL, as the scalar gives.

use std::sync::Arc;

use datafusion::arrow::datatypes::DataType;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::datasource::provider_as_source;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{
    Expr, ExprSchemable, JoinType, LogicalPlan, LogicalPlanBuilder, cast, col,
};
use datafusion::optimizer::optimizer::ApplyOrder;
use datafusion::optimizer::{OptimizerConfig, OptimizerRule};

use crate::config::{SearchDistributionChoice, SetsConfig, under_distributed};
use crate::functions::topk_bm25::queries::{HITS, QUERY, TopkQueriesTable};
use crate::functions::topk_bm25::table::{TOPK_BM25, check_mode};
use crate::search::topk::Mode;

/// The rule's name.
pub const TOPK_QUERIES_BY_SHARD: &str = "sets_topk_queries_by_shard";

/// See the module documentation.
#[derive(Debug, Default)]
pub struct TopkQueriesByShard;

/// A call the rule rewrites: its index, query expression, k and mode.
struct Call {
    expr: Expr,
    func: Arc<datafusion::logical_expr::ScalarUDF>,
    index: String,
    query: Expr,
    k: usize,
    mode: Mode,
}

/// `expr` as a call of the session's async `topk_bm25` with literal index, k and mode and a
/// query that is neither a literal nor volatile.
fn call_of(expr: &Expr) -> Option<Call> {
    let Expr::ScalarFunction(ScalarFunction { func, args }) = expr else {
        return None;
    };
    // The session's `topk_bm25` after the analyzer: the async function of that name.
    let is_topk = func.name() == TOPK_BM25
        && func
            .inner()
            .is::<datafusion::logical_expr::async_udf::AsyncScalarUDF>();
    if !is_topk || !(3..=4).contains(&args.len()) {
        return None;
    }
    let literal = |i: usize| match args.get(i) {
        Some(Expr::Literal(v, _)) => Some(v.clone()),
        _ => None,
    };
    let index = literal(0)?.try_as_str().flatten()?.to_string();
    // A literal query is one search (the table function's case); a volatile one would be
    // evaluated twice, for the rows and for the distinct texts.
    if matches!(args[1], Expr::Literal(..)) || args[1].is_volatile() {
        return None;
    }
    let k = match literal(2)?.cast_to(&DataType::Int64).ok()? {
        ScalarValue::Int64(Some(k)) if k > 0 && k <= u32::MAX as i64 => k as usize,
        _ => return None,
    };
    let mode = match args.len() {
        4 => check_mode(literal(3)?.try_as_str().flatten()?, 4).ok()?,
        _ => Mode::Or,
    };
    Some(Call {
        expr: expr.clone(),
        func: Arc::clone(func),
        index,
        query: args[1].clone(),
        k,
        mode,
    })
}

/// The distinct rewritable calls in `exprs`.
fn calls_in(exprs: &[Expr]) -> Vec<Call> {
    let mut calls: Vec<Call> = Vec::new();
    for e in exprs {
        let _ = e.apply(|e| {
            if let Some(c) = call_of(e) {
                if !calls.iter().any(|d| d.expr == c.expr) {
                    calls.push(c);
                }
                return Ok(TreeNodeRecursion::Jump);
            }
            Ok(TreeNodeRecursion::Continue)
        });
    }
    calls
}

fn has_volatile(plan: &LogicalPlan) -> Result<bool> {
    plan.exists(|p| Ok(p.expressions().iter().any(Expr::is_volatile)))
}

impl OptimizerRule for TopkQueriesByShard {
    fn name(&self) -> &str {
        TOPK_QUERIES_BY_SHARD
    }
    fn apply_order(&self) -> Option<ApplyOrder> {
        Some(ApplyOrder::BottomUp)
    }
    fn supports_rewrite(&self) -> bool {
        true
    }
    fn rewrite(
        &self,
        plan: LogicalPlan,
        config: &dyn OptimizerConfig,
    ) -> Result<Transformed<LogicalPlan>> {
        if !matches!(plan, LogicalPlan::Projection(_) | LogicalPlan::Aggregate(_)) {
            return Ok(Transformed::no(plan));
        }
        let options = config.options();
        let on = match SetsConfig::from_options(&options)?.topk_bm25_distribution {
            SearchDistributionChoice::Single => false,
            SearchDistributionChoice::Auto => under_distributed(&options),
            SearchDistributionChoice::Shards => true,
        };
        if !on {
            return Ok(Transformed::no(plan));
        }
        let exprs = plan.expressions();
        let calls = calls_in(&exprs);
        let input = match plan.inputs().as_slice() {
            [input] => (*input).clone(),
            _ => return Ok(Transformed::no(plan)),
        };
        if calls.is_empty() || has_volatile(&input)? {
            return Ok(Transformed::no(plan));
        }
        let mut joined = input.clone();
        let mut replaced: Vec<(Expr, Expr)> = Vec::with_capacity(calls.len());
        for call in calls {
            let name = config.alias_generator().next("__sets_topk");
            let (query_col, table) = (format!("{name}_query"), format!("{name}_results"));
            let text = match call.query.get_type(input.schema())? {
                DataType::Utf8 => call.query.clone(),
                _ => cast(call.query.clone(), DataType::Utf8),
            };
            let mut left: Vec<Expr> = joined
                .schema()
                .columns()
                .into_iter()
                .map(Expr::Column)
                .collect();
            left.push(text.clone().alias(&query_col));
            let left = LogicalPlanBuilder::from(joined).project(left)?;
            let queries = LogicalPlanBuilder::from(input.clone())
                .project(vec![text.alias(QUERY)])?
                .filter(col(QUERY).is_not_null())?
                .distinct()?
                .build()?;
            let results = TopkQueriesTable {
                func: Arc::clone(&call.func),
                index: call.index.clone(),
                k: call.k,
                mode: call.mode,
                queries,
            };
            let right = LogicalPlanBuilder::scan(
                table.as_str(),
                provider_as_source(Arc::new(results)),
                None,
            )?
            .build()?;
            joined = left
                .join(
                    right,
                    JoinType::Left,
                    (
                        vec![Column::from_name(query_col)],
                        vec![Column::new(Some(table.as_str()), QUERY)],
                    ),
                    None,
                )?
                .build()?;
            replaced.push((
                call.expr,
                Expr::Column(Column::new(Some(table.as_str()), HITS)),
            ));
        }
        let mut new_exprs = Vec::with_capacity(exprs.len());
        for e in exprs {
            let rewritten = e.clone().transform_down(|x| {
                match replaced.iter().find(|(call, _)| *call == x) {
                    Some((_, column)) => Ok(Transformed::new(
                        column.clone(),
                        true,
                        TreeNodeRecursion::Jump,
                    )),
                    None => Ok(Transformed::no(x)),
                }
            })?;
            new_exprs.push(match (rewritten.transformed, &e) {
                (false, _) => e,
                (true, Expr::Alias(_)) => rewritten.data,
                (true, _) => rewritten.data.alias(e.schema_name().to_string()),
            });
        }
        Ok(Transformed::yes(
            plan.with_new_exprs(new_exprs, vec![joined])?,
        ))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::execution::SessionStateBuilder;
    use datafusion::physical_plan::displayable;
    use datafusion::prelude::{SessionConfig, SessionContext};

    use crate::SessionStateBuilderExt;

    async fn plan_of(ctx: &SessionContext, sql: &str) -> String {
        let plan = ctx
            .sql(sql)
            .await
            .unwrap()
            .create_physical_plan()
            .await
            .unwrap();
        displayable(plan.as_ref()).indent(true).to_string()
    }

    /// The rule applies where the option asks, keeps the plain call for a literal query, a
    /// volatile input and `single`, and answers as the plain call does.
    #[tokio::test]
    async fn the_rule_applies_where_it_may() {
        let state = SessionStateBuilder::new()
            .with_default_features()
            .with_config(SessionConfig::new().with_target_partitions(2))
            .with_sets()
            .build();
        let ctx = SessionContext::from(state);
        for sql in [
            "CREATE TABLE docs AS SELECT v AS id, concat('w', v % 7, ' x', v % 5) AS body FROM generate_series(1, 300) AS g(v)",
            "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'id', 'body', 'shards=3')",
            "CREATE TABLE q AS VALUES (1, 'w1 x2'), (2, NULL), (3, 'w3'), (4, 'w1 x2')",
        ] {
            ctx.sql(sql).await.unwrap().collect().await.unwrap();
        }
        let column = "SELECT column1, topk_bm25('idx', column2, 3) AS h FROM q ORDER BY column1";
        let literal = "SELECT column1, topk_bm25('idx', 'w1', 3) AS h FROM q";
        let volatile = "SELECT column1, topk_bm25('idx', CASE WHEN random() < 2 THEN column2 END, 3) AS h FROM q";
        let single = plan_of(&ctx, column).await;
        assert!(single.contains("AsyncFuncExec"), "{single}");
        let expected = ctx.sql(column).await.unwrap().collect().await.unwrap();
        ctx.sql("SET sets.topk_bm25_distribution = 'shards'")
            .await
            .unwrap();
        let shards = plan_of(&ctx, column).await;
        assert!(shards.contains("TopkBm25QueriesShardsExec"), "{shards}");
        assert!(!shards.contains("AsyncFuncExec"), "{shards}");
        let got = ctx.sql(column).await.unwrap().collect().await.unwrap();
        let text = |b: &[datafusion::arrow::array::RecordBatch]| {
            datafusion::arrow::util::pretty::pretty_format_batches(b)
                .unwrap()
                .to_string()
        };
        assert_eq!(text(&got), text(&expected));
        for sql in [literal, volatile] {
            let plan = plan_of(&ctx, sql).await;
            assert!(plan.contains("AsyncFuncExec"), "{sql}\n{plan}");
            assert!(!plan.contains("TopkBm25Queries"), "{sql}\n{plan}");
        }
    }
}
