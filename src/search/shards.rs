//! One ad hoc query over a sharded index, each partition ranking the whole shards it holds.
//!
//! ```text
//! TopkBm25MergeExec: k=10, mode=or              the lists merged: best k, ranks assigned
//!   CoalescePartitionsExec                       (added by the planner)
//!     TopkBm25ShardsExec: index=idx, ...         each partition: its shards' best k
//!       RepartitionExec: Hash([shard])           (added by the planner, unless the scan
//!         <the index table's scan>                already declares it)
//! ```
//!
//! A sharded index table (`bm25_index(..., 'shards=N')`, [`crate::search::index`]) carries the
//! corpus's statistics in every row, and each document lives in one shard only (checked at
//! load). So whole shards loaded together rank their documents exactly as the whole index
//! does, and the best k of the partitions' best-k lists, ties to the smaller id, is the whole
//! index's top k. [`TopkShardsExec`] requires its input hash-partitioned on `shard`, which
//! puts every row of a shard in one partition; under datafusion-distributed each task then
//! ranks the shards it holds, and only k hits per partition travel to the merge.
//!
//! `and_or` falls back to OR when AND matches fewer than k documents in the whole corpus,
//! which no partition knows alone: each partition sends its AND list, and its OR list too
//! when its AND list is short (a partition with k AND hits knows the corpus has them). The
//! merge decides on the merged AND list.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Float64Array, RecordBatch, RecordBatchOptions, UInt8Array,
    UInt32Array,
};
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Schema, SchemaRef, UInt8Type, UInt32Type,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err, internal_err, plan_err};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{
    Distribution, EquivalenceProperties, PhysicalExpr, PhysicalSortExpr,
};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::StreamExt;

use super::loaded::{LoadedIndex, load_partition};
use super::rank::rank_one;
use super::scoring::{Scored, params_of};
use super::tokenize::Tokenizer;
use super::topk::{Hit, Mode};

/// The function whose plan these nodes are (errors and memory consumers name it).
pub(super) const WHO: &str = "topk_bm25";

/// `list` of a partition's hits: the mode's own list (AND or OR).
pub(super) const MAIN: u8 = 0;
/// `list` of a partition's OR hits sent for `and_or`'s fallback.
pub(super) const FALLBACK: u8 = 1;

/// A partition's hits: `(doc_id, score, list)`.
fn hits_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("doc_id", DataType::UInt32, false),
        Field::new("score", DataType::Float64, false),
        Field::new("list", DataType::UInt8, false),
    ]))
}

/// Each partition's best `k` for `query` among the whole shards of a sharded index table
/// that its input partition holds.
#[derive(Debug)]
pub struct TopkShardsExec {
    pub input: Arc<dyn ExecutionPlan>,
    /// The index table's name as the query gave it (errors, EXPLAIN).
    pub index: String,
    pub query: String,
    pub k: usize,
    pub mode: Mode,
    shard: Arc<dyn PhysicalExpr>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl TopkShardsExec {
    /// Over `input`, the scan of the sharded index table `index` (a `shard` column).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        index: String,
        query: String,
        k: usize,
        mode: Mode,
    ) -> Result<Self> {
        let Ok(at) = input.schema().index_of("shard") else {
            return plan_err!(
                "{WHO}: argument 1 (table): table '{index}' is not a sharded index (no column 'shard'); build one with bm25_index(..., 'shards=N')"
            );
        };
        let partitions = input.output_partitioning().partition_count();
        let schema = hits_schema();
        Ok(Self {
            input,
            index,
            query,
            k,
            mode,
            shard: Arc::new(Column::new("shard", at)),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(schema),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for TopkShardsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TopkBm25ShardsExec: index={}, query={:?}, k={}, mode={}",
            self.index,
            self.query,
            self.k,
            self.mode.name()
        )
    }
}

impl ExecutionPlan for TopkShardsExec {
    fn name(&self) -> &str {
        "TopkBm25ShardsExec"
    }
    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        f(&self.shard)
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::KeyPartitioned(vec![Arc::clone(&self.shard)])]
    }
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true]
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .or_else(|c| internal_err!("TopkBm25ShardsExec: {} children", c.len()))?;
        Ok(Arc::new(Self::try_new(
            input,
            self.index.clone(),
            self.query.clone(),
            self.k,
            self.mode,
        )?))
    }
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        // Whole shards in each partition is what makes the lists exact: an engine that ran
        // this plan without the exchange the planner adds (a host across FFI, a hand-built
        // plan) would rank shards in pieces.
        require_whole_shards(
            "TopkBm25ShardsExec",
            &self.index,
            &self.input,
            Some(&self.shard),
        )?;
        let input = Arc::clone(&self.input);
        let (index, query, k, mode) = (self.index.clone(), self.query.clone(), self.k, self.mode);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let postings: Count =
            MetricBuilder::new(&self.metrics).counter("postings_loaded", partition);
        let kept = MetricBuilder::new(&self.metrics).counter("partitions_kept_loaded", partition);
        let schema = hits_schema();
        let out = Arc::clone(&schema);
        let fut = async move {
            let loaded = load_partition(Arc::clone(&context), &input, partition, WHO, &index);
            let (loaded, was_kept) = loaded.await?;
            kept.add(usize::from(was_kept));
            let Some(loaded) = loaded else {
                return Ok(RecordBatch::new_empty(out));
            };
            let _t = baseline.elapsed_compute().timer();
            postings.add(loaded.index.docs().len());
            let scored = loaded.scored(params_of(context.session_config().options())?)?;
            let mut tok = Tokenizer::new(loaded.index.tokenizer());
            let (main, fallback) = partition_lists(&loaded, &scored, &mut tok, &query, k, mode);
            let n = main.len() + fallback.len();
            let all = || main.iter().chain(&fallback);
            let lists = std::iter::repeat_n(MAIN, main.len())
                .chain(std::iter::repeat_n(FALLBACK, fallback.len()));
            let batch = RecordBatch::try_new(
                out,
                vec![
                    Arc::new(UInt32Array::from_iter_values(all().map(|h| h.doc))),
                    Arc::new(Float64Array::from_iter_values(all().map(|h| h.score))),
                    Arc::new(UInt8Array::from_iter_values(lists)),
                ],
            )?;
            baseline.record_output(n);
            Ok(batch)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(fut),
        )))
    }
}

/// A partition's lists for `text`: the mode's own list, and for `and_or` the OR list when
/// the AND list is short (else empty): a partition with k AND hits proves the corpus has them.
pub(super) fn partition_lists(
    loaded: &LoadedIndex,
    scored: &Scored,
    tok: &mut Tokenizer,
    text: &str,
    k: usize,
    mode: Mode,
) -> (Vec<Hit>, Vec<Hit>) {
    let mut rank = |mode| rank_one(loaded, scored, tok, text, k, mode);
    match mode {
        Mode::And | Mode::Or => (rank(mode), Vec::new()),
        Mode::AndOr => {
            let and = rank(Mode::And);
            let or = match and.len() < k {
                true => rank(Mode::Or),
                false => Vec::new(),
            };
            (and, or)
        }
    }
}

/// Whether `partitioning` keeps every row of a shard in one partition: one partition, or a
/// hash of the shard column alone.
fn by_shard(partitioning: &Partitioning, shard: &Arc<dyn PhysicalExpr>) -> bool {
    match partitioning {
        Partitioning::Hash(exprs, _) => exprs.len() == 1 && exprs[0].eq(shard),
        p => p.partition_count() == 1,
    }
}

/// An error unless `input` brings operator `op` the shards of `index` whole: partitioned by
/// `shard` (when the table has shards), or in one partition.
pub(super) fn require_whole_shards(
    op: &str,
    index: &str,
    input: &Arc<dyn ExecutionPlan>,
    shard: Option<&Arc<dyn PhysicalExpr>>,
) -> Result<()> {
    let whole = match shard {
        Some(s) => by_shard(input.output_partitioning(), s),
        None => input.output_partitioning().partition_count() == 1,
    };
    if whole {
        return Ok(());
    }
    exec_err!(
        "{WHO}: the shards of index '{index}' must reach {op} whole (input partitioned by Hash([shard]) or in one partition), got {}",
        input.output_partitioning()
    )
}

/// `(rank, doc_id, score)`, the table function's columns.
pub fn result_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("rank", DataType::UInt32, false),
        Field::new("doc_id", DataType::UInt32, false),
        Field::new("score", DataType::Float64, false),
    ]))
}

/// The output's properties: rows come best first, by `rank` (when it is projected).
fn rank_ordered(schema: &SchemaRef) -> EquivalenceProperties {
    let mut eq = EquivalenceProperties::new(Arc::clone(schema));
    if let Ok(i) = schema.index_of("rank") {
        let rank: Arc<dyn PhysicalExpr> = Arc::new(Column::new("rank", i));
        eq.add_ordering([PhysicalSortExpr::new_default(rank)]);
    }
    eq
}

/// The table function's columns `projection` of `(rank, doc_id, score)`, and the properties
/// of its one partition of them, best first.
pub fn result_properties(projection: Option<&[usize]>) -> Result<(SchemaRef, Arc<PlanProperties>)> {
    let schema = match projection {
        Some(p) => Arc::new(result_schema().project(p)?),
        None => result_schema(),
    };
    let properties = PlanProperties::new(
        rank_ordered(&schema),
        Partitioning::UnknownPartitioning(1),
        EmissionType::Final,
        Boundedness::Bounded,
    );
    Ok((schema, Arc::new(properties)))
}

/// Ranked hits as the table function's batch: ranks from 1, columns `projection`.
pub fn hits_batch(
    schema: SchemaRef,
    hits: &[Hit],
    projection: Option<&[usize]>,
) -> Result<RecordBatch> {
    let columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(1..=hits.len() as u32)),
        Arc::new(UInt32Array::from_iter_values(hits.iter().map(|h| h.doc))),
        Arc::new(Float64Array::from_iter_values(hits.iter().map(|h| h.score))),
    ];
    let columns = match projection {
        Some(p) => p.iter().map(|&i| Arc::clone(&columns[i])).collect(),
        None => columns,
    };
    Ok(RecordBatch::try_new_with_options(
        schema,
        columns,
        &RecordBatchOptions::new().with_row_count(Some(hits.len())),
    )?)
}

/// The best `k` of the hits [`TopkShardsExec`]'s partitions found, ranked: the whole index's
/// top k. Its input is one partition (the planner coalesces the shards' lists).
#[derive(Debug)]
pub struct TopkMergeExec {
    pub input: Arc<dyn ExecutionPlan>,
    pub k: usize,
    pub mode: Mode,
    pub projection: Option<Vec<usize>>,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl TopkMergeExec {
    /// The merge of `input`'s hits (a [`TopkShardsExec`], possibly coalesced), columns
    /// `projection` of `(rank, doc_id, score)`.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        k: usize,
        mode: Mode,
        projection: Option<Vec<usize>>,
    ) -> Result<Self> {
        if input.schema().fields() != hits_schema().fields() {
            return internal_err!("TopkBm25MergeExec: input is not TopkBm25ShardsExec's hits");
        }
        let (schema, properties) = result_properties(projection.as_deref())?;
        Ok(Self {
            input,
            k,
            mode,
            projection,
            properties,
            schema,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for TopkMergeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TopkBm25MergeExec: k={}, mode={}",
            self.k,
            self.mode.name()
        )
    }
}

/// The best `k` of `hits`, best first, ties by increasing id; an error when a document
/// comes twice (two partitions held it: the shards were not whole).
pub(super) fn best(mut hits: Vec<Hit>, k: usize) -> Result<Vec<Hit>> {
    hits.sort_unstable_by_key(|h| h.doc);
    if let Some(w) = hits.windows(2).find(|w| w[0].doc == w[1].doc) {
        return exec_err!(
            "{WHO}: document {} was ranked by two partitions of a sharded index: its shards were not read whole",
            w[0].doc
        );
    }
    hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
    hits.truncate(k);
    Ok(hits)
}

impl ExecutionPlan for TopkMergeExec {
    plan_basics!("TopkBm25MergeExec");

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .or_else(|c| internal_err!("TopkBm25MergeExec: {} children", c.len()))?;
        Ok(Arc::new(Self::try_new(
            input,
            self.k,
            self.mode,
            self.projection.clone(),
        )?))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return exec_err!("{WHO}: partition {partition} out of range (1 partition)");
        }
        let partitions = self.input.output_partitioning().partition_count();
        if partitions != 1 {
            return internal_err!("TopkBm25MergeExec: input of {partitions} partitions");
        }
        let mut input = self.input.execute(0, context)?;
        let (k, mode) = (self.k, self.mode);
        let projection = self.projection.clone();
        let schema = Arc::clone(&self.schema);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let fut = async move {
            let (mut main, mut fallback) = (Vec::new(), Vec::new());
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let _t = baseline.elapsed_compute().timer();
                let docs = batch.column(0).as_primitive::<UInt32Type>();
                let scores = batch.column(1).as_primitive::<Float64Type>();
                let lists = batch.column(2).as_primitive::<UInt8Type>();
                if docs.null_count() + scores.null_count() + lists.null_count() > 0 {
                    return internal_err!("TopkBm25MergeExec: NULL in the shards' hits");
                }
                for ((&doc, &score), &list) in docs
                    .values()
                    .iter()
                    .zip(scores.values())
                    .zip(lists.values())
                {
                    match list {
                        MAIN => main.push(Hit { doc, score }),
                        _ => fallback.push(Hit { doc, score }),
                    }
                }
            }
            let _t = baseline.elapsed_compute().timer();
            let main = best(main, k)?;
            // AND matched fewer than k documents in the corpus: every partition's AND list
            // was short, so every partition sent its OR list.
            let hits = match mode == Mode::AndOr && main.len() < k {
                true => best(fallback, k)?,
                false => main,
            };
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

#[cfg(test)]
mod tests {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::collect;
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::search::index::IndexBuilder;
    use crate::search::tokenize::TokenizerOptions;

    /// A sharded index table of 200 documents in 3 shards.
    fn sharded() -> RecordBatch {
        let options = TokenizerOptions::default();
        let mut b = IndexBuilder::new(options, false);
        let mut tok = Tokenizer::new(options);
        for id in 0..200u32 {
            let text = format!("w{} x{} y{}", id % 7, id % 5, id % 3);
            b.add_text(&mut tok, id, Some(&text), None);
        }
        b.finish().into_sharded_batch(3).unwrap()
    }

    /// Whole shards in one partition rank; rows of one shard in two partitions that are not
    /// partitioned by shard are refused, not ranked in pieces.
    #[tokio::test]
    async fn shards_split_across_partitions_are_refused() {
        let batch = sharded();
        let schema = batch.schema();
        let ctx = SessionContext::new().task_ctx();
        let plan = |parts: Vec<Vec<RecordBatch>>| {
            let scan = MemorySourceConfig::try_new_exec(&parts, Arc::clone(&schema), None).unwrap();
            let shards =
                TopkShardsExec::try_new(scan, "idx".into(), "w1 x2".into(), 5, Mode::Or).unwrap();
            Arc::new(TopkMergeExec::try_new(Arc::new(shards), 5, Mode::Or, None).unwrap())
        };
        let whole = collect(plan(vec![vec![batch.clone()]]), Arc::clone(&ctx)).await;
        let whole = whole.unwrap();
        assert_eq!(whole.iter().map(|b| b.num_rows()).sum::<usize>(), 5);
        let (a, b) = (batch.slice(0, 10), batch.slice(10, batch.num_rows() - 10));
        let split = plan(vec![vec![a], vec![b]]);
        let coalesced = Arc::new(
            datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec::new(
                Arc::clone(&split.input),
            ),
        );
        let merge = TopkMergeExec::try_new(coalesced, 5, Mode::Or, None).unwrap();
        let err = collect(Arc::new(merge), ctx).await.unwrap_err().to_string();
        assert!(err.contains("must reach TopkBm25ShardsExec whole"), "{err}");
    }

    fn hits(rows: &[(u32, f64, u8)]) -> RecordBatch {
        RecordBatch::try_new(
            hits_schema(),
            vec![
                Arc::new(UInt32Array::from_iter_values(rows.iter().map(|r| r.0))),
                Arc::new(Float64Array::from_iter_values(rows.iter().map(|r| r.1))),
                Arc::new(UInt8Array::from_iter_values(rows.iter().map(|r| r.2))),
            ],
        )
        .unwrap()
    }

    async fn merged(parts: &[&[(u32, f64, u8)]], k: usize, mode: Mode) -> Result<Vec<(u32, f64)>> {
        let batches: Vec<RecordBatch> = parts.iter().map(|p| hits(p)).collect();
        let scan = MemorySourceConfig::try_new_exec(&[batches], hits_schema(), None)?;
        let merge = Arc::new(TopkMergeExec::try_new(scan, k, mode, Some(vec![1, 2]))?);
        let out = collect(merge, SessionContext::new().task_ctx()).await?;
        let mut got = Vec::new();
        for b in &out {
            let docs = b.column(0).as_primitive::<UInt32Type>();
            let scores = b.column(1).as_primitive::<Float64Type>();
            got.extend(
                docs.values()
                    .iter()
                    .copied()
                    .zip(scores.values().iter().copied()),
            );
        }
        Ok(got)
    }

    /// The merge: best k, ties to the smaller id; `and_or` falls back to the OR lists only
    /// when the merged AND list is short; a document from two partitions is an error.
    #[tokio::test]
    async fn the_merge_decides_on_every_partition_together() {
        let (a, b): (&[_], &[_]) = (
            &[(4, 2.0, MAIN), (9, 1.0, MAIN), (7, 5.0, FALLBACK)],
            &[(3, 2.0, MAIN), (8, 0.5, MAIN)],
        );
        let got = merged(&[a, b], 3, Mode::AndOr).await.unwrap();
        assert_eq!(got, vec![(3, 2.0), (4, 2.0), (9, 1.0)]);
        let got = merged(&[a, b], 5, Mode::AndOr).await.unwrap();
        assert_eq!(got, vec![(7, 5.0)]);
        let got = merged(&[a, b], 5, Mode::And).await.unwrap();
        assert_eq!(got.len(), 4);
        let twice: &[_] = &[(9, 1.0, MAIN)];
        let err = merged(&[a, b, twice], 3, Mode::Or)
            .await
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("document 9 was ranked by two partitions"),
            "{err}"
        );
    }
}
