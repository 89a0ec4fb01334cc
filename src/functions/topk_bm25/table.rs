//! `topk_bm25(...)` as a table function: one ad hoc query, one row per ranked document.
//!
//! ```sql
//! SELECT * FROM topk_bm25('idx', 'white house', 10);           -- OR (default)
//! SELECT * FROM topk_bm25('idx', 'white house', 10, 'and');    -- 'and', 'or', 'and_or'
//! ```
//!
//! Columns: `rank` (UInt32, from 1), `doc_id` (UInt32), `score` (Float64), best first, ties
//! by increasing `doc_id`. The scalar function of the same name ranks a column of queries.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err, internal_err, plan_err};
use datafusion::config::ConfigOptions;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};

use crate::config::{SearchDistributionChoice, SetsConfig, under_distributed};
use crate::functions::args::{int_arg, string_arg};
use crate::search::loaded::IndexScan;
use crate::search::rank::rank_one;
use crate::search::scoring::params_of;
use crate::search::shards::{
    TopkMergeExec, TopkShardsExec, hits_batch, result_properties, result_schema,
};
use crate::search::tokenize::Tokenizer;
use crate::search::topk::Mode;

/// The SQL name (of this table function and of the scalar function).
pub const TOPK_BM25: &str = "topk_bm25";

/// Check a `k` argument: 1 ..= 2^32 - 1.
pub fn check_k(k: i64, arg: usize) -> Result<usize> {
    if k < 1 || k > u32::MAX as i64 {
        return plan_err!(
            "{TOPK_BM25}: argument {arg} (k) must be between 1 and 4294967295, got {k}"
        );
    }
    Ok(k as usize)
}

/// Parse a mode argument.
pub fn check_mode(mode: &str, arg: usize) -> Result<Mode> {
    match Mode::from_name(mode) {
        Some(m) => Ok(m),
        None => plan_err!(
            "{TOPK_BM25}: argument {arg} (mode) must be 'and', 'or' or 'and_or', got '{mode}'"
        ),
    }
}

/// The `topk_bm25` table function.
#[derive(Debug, Default)]
pub struct TopkBm25Function;

impl TableFunctionImpl for TopkBm25Function {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        if !(3..=4).contains(&exprs.len()) {
            return plan_err!(
                "{TOPK_BM25}: expected 3 or 4 arguments, got {}; usage: {TOPK_BM25}('index_table', 'query text', k [, 'and' | 'or' | 'and_or'])",
                exprs.len()
            );
        }
        let table = string_arg(TOPK_BM25, exprs, 0, "index table")?;
        let query = string_arg(TOPK_BM25, exprs, 1, "query")?;
        let k = check_k(int_arg(TOPK_BM25, exprs, 2, "k")?, 3)?;
        let mode = match exprs.len() {
            4 => check_mode(&string_arg(TOPK_BM25, exprs, 3, "mode")?, 4)?,
            _ => Mode::Or,
        };
        Ok(Arc::new(TopkTable {
            table,
            query,
            k,
            mode,
            schema: result_schema(),
        }))
    }
}

#[derive(Debug)]
struct TopkTable {
    table: String,
    query: String,
    k: usize,
    mode: Mode,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for TopkTable {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
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
        // Planning resolves the table and plans its scan; the index is read and the query
        // ranked when the plan runs (so EXPLAIN ranks nothing, and a cancel stops the load).
        let index = IndexScan::plan(state, &self.table, TOPK_BM25, 1).await?;
        let per_shard = per_shard(state.config_options(), &index, &self.table)?;
        if per_shard {
            let shards = TopkShardsExec::try_new(
                Arc::clone(index.scan()),
                self.table.clone(),
                self.query.clone(),
                self.k,
                self.mode,
            )?;
            return Ok(Arc::new(TopkMergeExec::try_new(
                Arc::new(shards),
                self.k,
                self.mode,
                projection.cloned(),
            )?));
        }
        Ok(Arc::new(TopkOneExec::try_new(
            index,
            self.query.clone(),
            self.k,
            self.mode,
            projection.cloned(),
        )?))
    }
}

/// Whether `topk_bm25` over the index table `table` (planned as `index`) ranks shard by shard
/// (`sets.topk_bm25_distribution`): `auto` does for a sharded index under
/// datafusion-distributed; `shards` over an unsharded index is an error.
pub(crate) fn per_shard(options: &ConfigOptions, index: &IndexScan, table: &str) -> Result<bool> {
    let sharded = index.scan().schema().column_with_name("df").is_some();
    Ok(
        match SetsConfig::from_options(options)?.topk_bm25_distribution {
            SearchDistributionChoice::Single => false,
            SearchDistributionChoice::Auto => sharded && under_distributed(options),
            SearchDistributionChoice::Shards if sharded => true,
            SearchDistributionChoice::Shards => {
                return plan_err!(
                    "{TOPK_BM25}: argument 1 (table): sets.topk_bm25_distribution = 'shards' needs a sharded index, and '{table}' is not one (build it with bm25_index(..., 'shards=N'), or set 'single' or 'auto')"
                );
            }
        },
    )
}

/// One ad hoc query ranked when the plan runs.
#[derive(Debug)]
pub(crate) struct TopkOneExec {
    pub(crate) index: IndexScan,
    pub(crate) query: String,
    pub(crate) k: usize,
    pub(crate) mode: Mode,
    pub(crate) projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl TopkOneExec {
    /// The query `query`'s `k` best documents in `index`, columns `projection` of `(rank,
    /// doc_id, score)`.
    pub(crate) fn try_new(
        index: IndexScan,
        query: String,
        k: usize,
        mode: Mode,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        let (schema, properties) = result_properties(projection.as_deref())?;
        Ok(Self {
            index,
            query,
            k,
            mode,
            projection,
            properties,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for TopkOneExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TopkBm25Exec: index={}, query={:?}, k={}, mode={}",
            self.index.name(),
            self.query,
            self.k,
            self.mode.name()
        )
    }
}

impl ExecutionPlan for TopkOneExec {
    fn name(&self) -> &str {
        "TopkBm25Exec"
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if !children.is_empty() {
            return internal_err!("TopkBm25Exec has no children");
        }
        Ok(self)
    }
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return exec_err!("{TOPK_BM25}: partition {partition} out of range (1 partition)");
        }
        let index = self.index.clone();
        let (query, k, mode) = (self.query.clone(), self.k, self.mode);
        let projection = self.projection.clone();
        let schema = Arc::clone(&self.schema);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let fut = async move {
            let loaded = index.open(Arc::clone(&context), TOPK_BM25).await?;
            let _t = baseline.elapsed_compute().timer();
            let scored = loaded.scored(params_of(context.session_config().options())?)?;
            let mut tok = Tokenizer::new(loaded.index.tokenizer());
            let hits = rank_one(&loaded, &scored, &mut tok, &query, k, mode);
            let batch = hits_batch(schema, &hits, projection.as_deref())?;
            baseline.record_output(batch.num_rows());
            Ok(batch)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(fut),
        )))
    }
}
