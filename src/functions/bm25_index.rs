//! `bm25_index(...)`: build an inverted index from any table with an id and a text column.
//!
//! ```sql
//! CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text');
//! CREATE TABLE idx2 AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'stopwords=english, stem=english, static=rank');
//! COPY idx TO 'idx.parquet';   -- and later: CREATE EXTERNAL TABLE idx STORED AS PARQUET LOCATION 'idx.parquet';
//! ```
//!
//! Arguments: the table (`schema.table` allowed), the id column (any integer type, values in
//! `0..=4294967295`, distinct, not NULL), the text column (any string type; NULL text is an
//! empty document) and optional `key=value` options: the tokenizer's (`tokenizer=unicode|ascii`,
//! `fold=ascii|none`, `stopwords=<language>|none`, `stem=<language>|none`, `qgrams=N`,
//! `shingles=N`; see `search::tokenize`: the Unicode tokenizer unless `tokenizer=ascii`) and
//! `static=<column>` (a numeric column of static scores, e.g. PageRank; NULL counts as 0). The
//! result is the index table described in `index`, one row per term; its `tokenizer` column
//! records the tokenizer options in full, so `topk_bm25` tokenizes queries the same way.

use std::fmt;
use std::sync::Arc;

use async_trait::async_trait;
use datafusion::arrow::array::{Array, AsArray, RecordBatch};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{DataType, Float64Type, SchemaRef, UInt64Type};
use datafusion::catalog::{Session, TableFunctionArgs, TableFunctionImpl, TableProvider};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, ScalarValue, exec_err, plan_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::MemoryConsumer;
use datafusion::logical_expr::{Expr, TableType};
use datafusion::physical_expr::EquivalenceProperties;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::ExecutionPlanProperties;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, Partitioning, PlanProperties,
    SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use crate::catalog::resolve_table;
use crate::functions::args::string_arg;
use crate::search::index::{IndexBuilder, index_schema};
use crate::search::tokenize::{Tokenizer, TokenizerOptions};

/// The table function's SQL name.
pub const BM25_INDEX: &str = "bm25_index";

/// The `bm25_index` table function (see the module docs).
#[derive(Debug, Default)]
pub struct Bm25IndexFunction;

impl TableFunctionImpl for Bm25IndexFunction {
    fn call_with_args(&self, args: TableFunctionArgs) -> Result<Arc<dyn TableProvider>> {
        let exprs = args.exprs();
        let session = args.session();
        if !(3..=4).contains(&exprs.len()) {
            return plan_err!(
                "{BM25_INDEX}: expected 3 or 4 arguments, got {}; usage: {BM25_INDEX}('table', 'id_column', 'text_column' [, 'tokenizer=unicode, fold=ascii, stopwords=english, stem=english, static=column'])",
                exprs.len()
            );
        }
        let name = string_arg(BM25_INDEX, exprs, 0, "table")?;
        let table = resolve_table(BM25_INDEX, session, &name, 1)?;
        let schema = table.schema();
        let column = |k: usize, what: &str| -> Result<(usize, DataType)> {
            let col = string_arg(BM25_INDEX, exprs, k, what)?;
            match schema.index_of(&col) {
                Ok(i) => Ok((i, schema.field(i).data_type().clone())),
                Err(_) => plan_err!(
                    "{BM25_INDEX}: argument {} ({what}): column '{col}' not found in table '{name}'",
                    k + 1
                ),
            }
        };
        let (id, id_type) = column(1, "id column")?;
        if !id_type.is_integer() {
            return plan_err!(
                "{BM25_INDEX}: argument 2 (id column): must be an integer column, got {id_type}"
            );
        }
        let (text, text_type) = column(2, "text column")?;
        if !matches!(
            text_type,
            DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View | DataType::Null
        ) {
            return plan_err!(
                "{BM25_INDEX}: argument 3 (text column): must be a string column, got {text_type}"
            );
        }
        let mut tokenizer_spec = Vec::new();
        let mut static_col = None;
        let spec = match exprs.len() {
            4 => string_arg(BM25_INDEX, exprs, 3, "options")?,
            _ => String::new(),
        };
        {
            for part in spec
                .split(|c: char| c == ',' || c.is_whitespace())
                .filter(|p| !p.is_empty())
            {
                match part.split_once('=') {
                    Some((k, v)) if k.trim().eq_ignore_ascii_case("static") => {
                        let v = v.trim();
                        let Ok(i) = schema.index_of(v) else {
                            return plan_err!(
                                "{BM25_INDEX}: argument 4 (options): static score column '{v}' not found in table '{name}'"
                            );
                        };
                        let t = schema.field(i).data_type();
                        if !t.is_numeric() {
                            return plan_err!(
                                "{BM25_INDEX}: argument 4 (options): static score column '{v}' must be numeric, got {t}"
                            );
                        }
                        static_col = Some(i);
                    }
                    _ => tokenizer_spec.push(part),
                }
            }
        }
        let tokenizer = TokenizerOptions::parse_options(&tokenizer_spec.join(","), BM25_INDEX)?;
        Ok(Arc::new(Bm25IndexTable {
            source: table,
            columns: [Some(id), Some(text), static_col]
                .into_iter()
                .flatten()
                .collect(),
            tokenizer,
            schema: index_schema(static_col.is_some()),
        }))
    }
}

#[derive(Debug)]
struct Bm25IndexTable {
    source: Arc<dyn TableProvider>,
    /// id, text and (optional) static score columns of `source`.
    columns: Vec<usize>,
    tokenizer: TokenizerOptions,
    schema: SchemaRef,
}

#[async_trait]
impl TableProvider for Bm25IndexTable {
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
        let input = self
            .source
            .scan(state, Some(&self.columns), &[], None)
            .await?;
        let exec: Arc<dyn ExecutionPlan> = Arc::new(Bm25IndexExec::new(
            input,
            self.tokenizer,
            self.columns.len() == 3,
        ));
        match projection {
            Some(p)
                if p.len() != self.schema.fields().len()
                    || p.iter().enumerate().any(|(i, &c)| i != c) =>
            {
                let exprs: Vec<(Arc<dyn PhysicalExpr>, String)> = p
                    .iter()
                    .map(|&i| {
                        let f = self.schema.field(i);
                        (
                            Arc::new(datafusion::physical_expr::expressions::Column::new(
                                f.name(),
                                i,
                            )) as _,
                            f.name().clone(),
                        )
                    })
                    .collect();
                Ok(Arc::new(ProjectionExec::try_new(exprs, exec)?))
            }
            _ => Ok(exec),
        }
    }
}

/// Reads every row of its input and emits the index as one batch.
#[derive(Debug)]
pub struct Bm25IndexExec {
    input: Arc<dyn ExecutionPlan>,
    pub(crate) tokenizer: TokenizerOptions,
    pub(crate) with_static: bool,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl Bm25IndexExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        tokenizer: TokenizerOptions,
        with_static: bool,
    ) -> Self {
        let schema = index_schema(with_static);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(1),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Self {
            input,
            tokenizer,
            with_static,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for Bm25IndexExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        // The canonical spelling, its pairs spaced like the other fields.
        let tokenizer = self.tokenizer.to_string().replace(',', ", ");
        write!(
            f,
            "Bm25IndexExec: {tokenizer}, static={}",
            self.with_static
        )
    }
}

impl ExecutionPlan for Bm25IndexExec {
    fn name(&self) -> &str {
        "Bm25IndexExec"
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
        vec![&self.input]
    }
    /// One index of every document: the whole input in one partition, which an engine that
    /// runs a plan per task (datafusion-distributed) gathers from all its tasks first.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(
            Arc::clone(&children[0]),
            self.tokenizer,
            self.with_static,
        )))
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
            return exec_err!("{BM25_INDEX}: partition {partition} out of range (1 partition)");
        }
        let input: Arc<dyn ExecutionPlan> =
            if self.input.output_partitioning().partition_count() > 1 {
                Arc::new(CoalescePartitionsExec::new(Arc::clone(&self.input)))
            } else {
                Arc::clone(&self.input)
            };
        let mut stream = input.execute(0, Arc::clone(&context))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (tokenizer, with_static) = (self.tokenizer, self.with_static);
        let reservation = MemoryConsumer::new(BM25_INDEX).register(context.memory_pool());
        let fut = async move {
            let timer = baseline.elapsed_compute().clone();
            let mut builder = IndexBuilder::new(tokenizer, with_static);
            let mut tok = Tokenizer::new(tokenizer);
            let mut seen = std::collections::HashSet::new();
            // A batch of long texts is a second of tokenizing in a test build: it is
            // indexed in slices, each enough for every core, with a yield after each, so a
            // cancel (or another query's task) gets in even when the input never runs out
            // of tokio's budget.
            let slice = (256 * rayon::current_num_threads()).max(1024);
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                let mut at = 0;
                while at < batch.num_rows() {
                    let len = slice.min(batch.num_rows() - at);
                    let _t = timer.timer();
                    add_batch(&mut builder, &mut tok, &mut seen, &batch.slice(at, len))?;
                    let want = builder.size_bytes() + seen.len() * 8;
                    reservation.try_resize(want)?;
                    drop(_t);
                    at += len;
                    tokio::task::yield_now().await;
                }
            }
            let _t = timer.timer();
            // The index is built beside the builder (which it empties as it goes), then
            // moved into the output batch uncopied: reserve both before building.
            reservation.try_grow(builder.finished_bytes())?;
            let index = builder.finish();
            let out = index.into_batch()?;
            baseline.record_output(out.num_rows());
            drop(reservation);
            Ok::<_, datafusion::common::DataFusionError>(out)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(fut).map_ok(|b| b),
        )))
    }
}

fn add_batch(
    builder: &mut IndexBuilder,
    tok: &mut Tokenizer,
    seen: &mut std::collections::HashSet<u32>,
    batch: &RecordBatch,
) -> Result<()> {
    let ids_in = batch.column(0);
    let ids = cast(ids_in, &DataType::UInt64)?;
    let ids = ids.as_primitive::<UInt64Type>();
    let text = cast(batch.column(1), &DataType::Utf8)?;
    let text = text.as_string::<i32>();
    let statics = match batch.columns().get(2) {
        Some(c) => Some(cast(c, &DataType::Float64)?),
        None => None,
    };
    let statics = statics.as_ref().map(|s| s.as_primitive::<Float64Type>());
    // The rows checked in order (the first bad one is the error), then indexed together.
    let mut docs = Vec::with_capacity(batch.num_rows());
    for r in 0..batch.num_rows() {
        if ids_in.is_null(r) {
            return exec_err!("{BM25_INDEX}: NULL in the id column");
        }
        let bad = || {
            ScalarValue::try_from_array(ids_in, r)
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        if ids.is_null(r) || ids.value(r) > u32::MAX as u64 {
            return exec_err!(
                "{BM25_INDEX}: id {} is outside 0..=4294967295 (ids must fit in 32 bits)",
                bad()
            );
        }
        let id = ids.value(r) as u32;
        if !seen.insert(id) {
            return exec_err!("{BM25_INDEX}: id {id} appears twice in the id column");
        }
        let s = match statics {
            Some(s) if s.is_valid(r) => {
                let v = s.value(r);
                if !v.is_finite() {
                    return exec_err!("{BM25_INDEX}: static score of id {id} is not finite ({v})");
                }
                Some(v)
            }
            _ => None,
        };
        docs.push((id, text.is_valid(r).then(|| text.value(r)), s));
    }
    builder.add_texts(tok, &docs);
    Ok(())
}
