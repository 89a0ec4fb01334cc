//! The results of the scalar `topk_bm25` over a column of queries, as a table: one row
//! `(query, hits)` per distinct query text. The rule `sets_topk_queries_by_shard`
//! ([`crate::optimizer::topk_queries`]) joins it back to the rows, so that under
//! datafusion-distributed each task ranks the queries against the shards it holds instead of
//! loading the whole index table.
//!
//! A sharded index plans [`TopkQueriesMergeExec`] over [`TopkQueriesShardsExec`]. An unsharded
//! one (`sets.topk_bm25_distribution = 'auto'` under datafusion-distributed) plans the scalar
//! itself over the distinct queries, which loads the whole table where it runs and keeps it
//! cached, as without the rule.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableProvider};
use datafusion::common::{Column, Result, ScalarValue};
use datafusion::execution::SessionState;
use datafusion::logical_expr::expr::ScalarFunction;
use datafusion::logical_expr::{Expr, LogicalPlan, LogicalPlanBuilder, ScalarUDF, TableType};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column as PhysicalColumn;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_planner::{DefaultPhysicalPlanner, PhysicalPlanner};

use super::table::{TOPK_BM25, per_shard};
use crate::search::loaded::IndexScan;
use crate::search::shard_queries::{TopkQueriesMergeExec, TopkQueriesShardsExec, merged_schema};
use crate::search::topk::Mode;

/// The result table's query column (Utf8) and hits column.
pub const QUERY: &str = "query";
pub const HITS: &str = "hits";

/// `topk_bm25(index, query, k, mode)` for every distinct non-NULL text of `queries`' one
/// column `query` (Utf8).
pub struct TopkQueriesTable {
    /// The call's function (the session's async `topk_bm25`), for an unsharded index.
    pub func: Arc<ScalarUDF>,
    pub index: String,
    pub k: usize,
    pub mode: Mode,
    pub queries: LogicalPlan,
}

impl fmt::Debug for TopkQueriesTable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TopkQueriesTable")
            .field("index", &self.index)
            .field("k", &self.k)
            .field("mode", &self.mode)
            .finish()
    }
}

#[async_trait]
impl TableProvider for TopkQueriesTable {
    fn schema(&self) -> SchemaRef {
        merged_schema()
    }
    fn table_type(&self) -> TableType {
        TableType::Temporary
    }
    async fn scan(
        &self,
        state: &dyn Session,
        projection: Option<&Vec<usize>>,
        _filters: &[Expr],
        _limit: Option<usize>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let index = IndexScan::plan(state, &self.index, TOPK_BM25, 1).await?;
        let plan: Arc<dyn ExecutionPlan> =
            if per_shard(state.config_options(), &index, &self.index)? {
                let queries = plan_below(state, &self.queries).await?;
                let shards = TopkQueriesShardsExec::try_new(
                    Arc::clone(index.scan()),
                    queries,
                    self.index.clone(),
                    self.k,
                    self.mode,
                )?;
                Arc::new(TopkQueriesMergeExec::try_new(
                    Arc::new(shards),
                    self.k,
                    self.mode,
                )?)
            } else {
                self.scalar_plan(state).await?
            };
        match projection {
            Some(p) if p.as_slice() != [0, 1] => {
                let schema = plan.schema();
                let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = p
                    .iter()
                    .map(|&i| {
                        let name = schema.field(i).name().clone();
                        (Arc::new(PhysicalColumn::new(&name, i)) as _, name)
                    })
                    .collect();
                Ok(Arc::new(ProjectionExec::try_new(exprs, plan)?))
            }
            _ => Ok(plan),
        }
    }
}

impl TopkQueriesTable {
    /// The scalar itself over the distinct queries.
    async fn scalar_plan(&self, state: &dyn Session) -> Result<Arc<dyn ExecutionPlan>> {
        let query = Expr::Column(Column::from_name(QUERY));
        let call = Expr::ScalarFunction(ScalarFunction::new_udf(
            Arc::clone(&self.func),
            vec![
                Expr::Literal(ScalarValue::Utf8(Some(self.index.clone())), None),
                query.clone(),
                Expr::Literal(ScalarValue::Int64(Some(self.k as i64)), None),
                Expr::Literal(ScalarValue::Utf8(Some(self.mode.name().into())), None),
            ],
        ));
        let plan = LogicalPlanBuilder::from(self.queries.clone())
            .project(vec![query, call.alias(HITS)])?
            .build()?;
        plan_below(state, &plan).await
    }
}

/// `plan` (analyzed), optimized without the rule that made it (its option set to `single`)
/// and planned by DataFusion's own planner, not the session's query planner: this is a piece
/// of the query being planned, which a distributed planner distributes as a whole.
async fn plan_below(state: &dyn Session, plan: &LogicalPlan) -> Result<Arc<dyn ExecutionPlan>> {
    let optimized = match state.as_any().downcast_ref::<SessionState>() {
        Some(s) => {
            let mut s = s.clone();
            s.config_mut()
                .options_mut()
                .set("sets.topk_bm25_distribution", "single")?;
            s.optimize(plan)?
        }
        // A host's session (across FFI): the plan as the rule built it, unoptimized.
        None => plan.clone(),
    };
    DefaultPhysicalPlanner::default()
        .create_physical_plan(&optimized, state)
        .await
}
