//! A column of queries over a sharded index, each partition ranking every query against the
//! whole shards it holds, and the lists merged per query.
//!
//! ```text
//! TopkBm25QueriesMergeExec: k=10, mode=or        per query: the best k of its lists
//!   CoalescePartitionsExec                        (added by the planner)
//!     TopkBm25QueriesShardsExec: index=idx, ...   each partition: every query's best k
//!       RepartitionExec: Hash([shard])            (added by the planner, unless the scan
//!         <the index table's scan>                 already declares it)
//!       <the distinct queries>                    read whole by every partition
//! ```
//!
//! The scalar `topk_bm25` over a column of queries plans this (through
//! `functions::topk_bm25::queries`): the distinct texts are ranked here and the lists are
//! joined back to the rows. Exactness is the table function's ([`super::shards`]): whole
//! shards carry the corpus's statistics, each document lives in one shard, and the best k of
//! the partitions' best-k lists, ties to the smaller id, is the whole index's top k. An
//! unsharded index is read in one partition, as one shard.
//!
//! The queries are read once per plan instance (under datafusion-distributed, once per task)
//! and shared by its partitions.

use std::collections::HashMap;
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, AsArray, ListArray, RecordBatch, StringArray, UInt8Array};
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Schema, SchemaRef, UInt8Type, UInt32Type,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err, internal_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{Distribution, EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::loaded::load_partition;
use super::rank::{Ranked, hit_fields};
use super::scoring::params_of;
use super::shards::{FALLBACK, MAIN, WHO, best, partition_lists, require_whole_shards};
use super::tokenize::Tokenizer;
use super::topk::{Hit, Mode};

/// Queries ranked between two checks for cancellation (one output batch).
const QUERIES_PER_BATCH: usize = 1024;

/// The type of a query's hits: `List<Struct<doc_id, score>>`, as the scalar returns them.
pub fn hits_type() -> DataType {
    DataType::List(Arc::new(Field::new_list_field(
        DataType::Struct(hit_fields()),
        true,
    )))
}

/// `lists` as a list column of `{doc_id, score}` (no NULL).
pub fn hits_column<'a>(lists: impl IntoIterator<Item = &'a [Hit]>) -> Result<ListArray> {
    let lists: Vec<&[Hit]> = lists.into_iter().collect();
    let counts: Vec<usize> = lists.iter().map(|l| l.len()).collect();
    // `Ranked::build` takes fewer than 2^32 hits; the list, fewer than 2^31.
    if counts.iter().sum::<usize>() > i32::MAX as usize {
        return exec_err!("{WHO}: more than 2^31 results in one batch");
    }
    let ranked = Ranked::build(&counts, |i, docs, scores| {
        for ((d, s), h) in docs.iter_mut().zip(scores.iter_mut()).zip(lists[i]) {
            (*d, *s) = (h.doc, h.score);
        }
    });
    ranked.into_list(None)
}

/// A partition's lists: `(query, hits, list)`, one row per query and list.
fn lists_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("query", DataType::Utf8, false),
        Field::new("hits", hits_type(), false),
        Field::new("list", DataType::UInt8, false),
    ]))
}

/// The merge's output: `(query, hits)`, one row per distinct query (declared nullable, as
/// the scalar's result is: a table of these rows may be planned from the scalar itself).
pub fn merged_schema() -> SchemaRef {
    Arc::new(Schema::new(vec![
        Field::new("query", DataType::Utf8, true),
        Field::new("hits", hits_type(), true),
    ]))
}

/// The distinct query texts a plan instance read, shared by its partitions, reserved in the
/// pool while it lives.
#[derive(Debug)]
struct QueryTexts {
    texts: Vec<String>,
    _reservation: MemoryReservation,
}

/// Each partition's best `k` for every distinct query of its second input, among the whole
/// shards of the index table its first input partition holds.
#[derive(Debug)]
pub struct TopkQueriesShardsExec {
    /// The index table's scan.
    pub input: Arc<dyn ExecutionPlan>,
    /// The queries: a string column first; NULLs are skipped.
    pub queries: Arc<dyn ExecutionPlan>,
    /// The index table's name as the query gave it (errors, EXPLAIN).
    pub index: String,
    pub k: usize,
    pub mode: Mode,
    /// The `shard` column; `None` for an unsharded index, read in one partition.
    shard: Option<Arc<dyn PhysicalExpr>>,
    texts: Arc<OnceCell<Arc<QueryTexts>>>,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl TopkQueriesShardsExec {
    /// Over `input`, the scan of the index table `index` (sharded when it has a `shard`
    /// column), the queries of `queries`' first column.
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        queries: Arc<dyn ExecutionPlan>,
        index: String,
        k: usize,
        mode: Mode,
    ) -> Result<Self> {
        let shard = input
            .schema()
            .index_of("shard")
            .ok()
            .map(|at| Arc::new(Column::new("shard", at)) as Arc<dyn PhysicalExpr>);
        match queries.schema().fields().first().map(|f| f.data_type()) {
            Some(DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View) => {}
            other => {
                return internal_err!(
                    "TopkBm25QueriesShardsExec: the queries' first column is {other:?}, not a string"
                );
            }
        }
        let partitions = input.output_partitioning().partition_count();
        Ok(Self {
            input,
            queries,
            index,
            k,
            mode,
            shard,
            texts: Arc::new(OnceCell::new()),
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(lists_schema()),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }

    /// Whether the index is read shard by shard (else whole, in one partition).
    pub fn sharded(&self) -> bool {
        self.shard.is_some()
    }
}

impl DisplayAs for TopkQueriesShardsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TopkBm25QueriesShardsExec: index={}, k={}, mode={}{}",
            self.index,
            self.k,
            self.mode.name(),
            if self.sharded() { "" } else { ", unsharded" }
        )
    }
}

/// The distinct non-NULL texts of `queries`' first column (partition 0), reserved in the
/// pool of `ctx`.
async fn read_texts(queries: Arc<dyn ExecutionPlan>, ctx: Arc<TaskContext>) -> Result<QueryTexts> {
    let reservation = MemoryConsumer::new(format!("{WHO} queries")).register(ctx.memory_pool());
    let mut stream = queries.execute(0, ctx)?;
    let mut distinct = std::collections::HashSet::new();
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        let column = cast(batch.column(0), &DataType::Utf8)?;
        for text in column.as_string::<i32>().iter().flatten() {
            if !distinct.contains(text) {
                reservation.try_grow(text.len() + 64)?;
                distinct.insert(text.to_string());
            }
        }
    }
    let texts: Vec<String> = distinct.into_iter().collect();
    reservation.resize(texts.iter().map(|t| t.len() + 32).sum());
    Ok(QueryTexts {
        texts,
        _reservation: reservation,
    })
}

impl ExecutionPlan for TopkQueriesShardsExec {
    fn name(&self) -> &str {
        "TopkBm25QueriesShardsExec"
    }
    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        match &self.shard {
            Some(s) => f(s),
            None => Ok(TreeNodeRecursion::Continue),
        }
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }
    fn required_input_distribution(&self) -> Vec<Distribution> {
        let index = match &self.shard {
            Some(s) => Distribution::KeyPartitioned(vec![Arc::clone(s)]),
            None => Distribution::SinglePartition,
        };
        vec![index, Distribution::SinglePartition]
    }
    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![self.sharded(), false]
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input, &self.queries]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input, queries] = <[_; 2]>::try_from(children)
            .or_else(|c| internal_err!("TopkBm25QueriesShardsExec: {} children", c.len()))?;
        Ok(Arc::new(Self::try_new(
            input,
            queries,
            self.index.clone(),
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
        require_whole_shards(
            "TopkBm25QueriesShardsExec",
            &self.index,
            &self.input,
            self.shard.as_ref(),
        )?;
        let queries_partitions = self.queries.output_partitioning().partition_count();
        if queries_partitions != 1 {
            return internal_err!(
                "TopkBm25QueriesShardsExec: queries in {queries_partitions} partitions"
            );
        }
        let (input, queries) = (Arc::clone(&self.input), Arc::clone(&self.queries));
        let texts = Arc::clone(&self.texts);
        let (index, k, mode) = (self.index.clone(), self.k, self.mode);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let postings: Count =
            MetricBuilder::new(&self.metrics).counter("postings_loaded", partition);
        let kept = MetricBuilder::new(&self.metrics).counter("partitions_kept_loaded", partition);
        let ranked: Count = MetricBuilder::new(&self.metrics).counter("queries_ranked", partition);
        let schema = lists_schema();
        let out = Arc::clone(&schema);
        let fut = async move {
            let ctx = Arc::clone(&context);
            let texts = texts
                .get_or_try_init(|| async move { read_texts(queries, ctx).await.map(Arc::new) })
                .await?;
            let texts = Arc::clone(texts);
            let (loaded, was_kept) =
                load_partition(Arc::clone(&context), &input, partition, WHO, &index).await?;
            kept.add(usize::from(was_kept));
            if let Some(l) = &loaded {
                postings.add(l.index.docs().len());
            }
            let scored = match &loaded {
                Some(l) => Some(l.scored(params_of(context.session_config().options())?)?),
                None => None,
            };
            // One batch per group of queries, ranked when the stream is polled (a cancel
            // stops between groups).
            let groups = (0..texts.texts.len()).step_by(QUERIES_PER_BATCH);
            let stream = futures::stream::iter(groups).map(move |start| {
                let _t = baseline.elapsed_compute().timer();
                let end = (start + QUERIES_PER_BATCH).min(texts.texts.len());
                let group = &texts.texts[start..end];
                let mut rows: Vec<(&str, Vec<Hit>, u8)> = Vec::with_capacity(group.len());
                let mut tok = loaded.as_ref().map(|l| Tokenizer::new(l.index.tokenizer()));
                for text in group {
                    let (Some(l), Some(s), Some(tok)) = (&loaded, &scored, tok.as_mut()) else {
                        // No shard here: empty lists, so the merge sees every query.
                        rows.push((text, Vec::new(), MAIN));
                        continue;
                    };
                    let (main, fallback) = partition_lists(l, s, tok, text, k, mode);
                    let sent = mode == Mode::AndOr && main.len() < k;
                    rows.push((text, main, MAIN));
                    if sent {
                        rows.push((text, fallback, FALLBACK));
                    }
                }
                ranked.add(group.len());
                let hits = hits_column(rows.iter().map(|r| r.1.as_slice()))?;
                let batch = RecordBatch::try_new(
                    Arc::clone(&out),
                    vec![
                        Arc::new(StringArray::from_iter_values(rows.iter().map(|r| r.0))),
                        Arc::new(hits),
                        Arc::new(UInt8Array::from_iter_values(rows.iter().map(|r| r.2))),
                    ],
                )?;
                baseline.record_output(batch.num_rows());
                Ok(batch)
            });
            Ok::<_, datafusion::error::DataFusionError>(stream)
        };
        let stream = futures::stream::once(fut).try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }
}

/// Per query, the best `k` of the lists [`TopkQueriesShardsExec`]'s partitions found: the
/// whole index's top k. Its input is one partition (the planner coalesces the lists).
#[derive(Debug)]
pub struct TopkQueriesMergeExec {
    pub input: Arc<dyn ExecutionPlan>,
    pub k: usize,
    pub mode: Mode,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl TopkQueriesMergeExec {
    /// The merge of `input`'s lists (a [`TopkQueriesShardsExec`], possibly coalesced).
    pub fn try_new(input: Arc<dyn ExecutionPlan>, k: usize, mode: Mode) -> Result<Self> {
        if input.schema().fields() != lists_schema().fields() {
            return internal_err!(
                "TopkBm25QueriesMergeExec: input is not TopkBm25QueriesShardsExec's lists"
            );
        }
        Ok(Self {
            input,
            k,
            mode,
            properties: Arc::new(PlanProperties::new(
                EquivalenceProperties::new(merged_schema()),
                Partitioning::UnknownPartitioning(1),
                EmissionType::Final,
                Boundedness::Bounded,
            )),
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for TopkQueriesMergeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "TopkBm25QueriesMergeExec: k={}, mode={}",
            self.k,
            self.mode.name()
        )
    }
}

/// A query's lists as the merge gathers them.
#[derive(Default)]
struct Gathered {
    main: Vec<Hit>,
    fallback: Vec<Hit>,
}

impl ExecutionPlan for TopkQueriesMergeExec {
    plan_basics!("TopkBm25QueriesMergeExec");

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![Distribution::SinglePartition]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children)
            .or_else(|c| internal_err!("TopkBm25QueriesMergeExec: {} children", c.len()))?;
        Ok(Arc::new(Self::try_new(input, self.k, self.mode)?))
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
            return internal_err!("TopkBm25QueriesMergeExec: input of {partitions} partitions");
        }
        let mut input = self.input.execute(0, Arc::clone(&context))?;
        let (k, mode) = (self.k, self.mode);
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let schema = merged_schema();
        let out = Arc::clone(&schema);
        let fut = async move {
            let reservation =
                MemoryConsumer::new(format!("{WHO} merge")).register(context.memory_pool());
            let mut lists: HashMap<String, Gathered> = HashMap::new();
            while let Some(batch) = input.next().await {
                let batch = batch?;
                let _t = baseline.elapsed_compute().timer();
                let texts = batch.column(0).as_string::<i32>();
                let hits = batch.column(1).as_list::<i32>();
                let kinds = batch.column(2).as_primitive::<UInt8Type>();
                if texts.null_count() + hits.null_count() + kinds.null_count() > 0 {
                    return internal_err!("TopkBm25QueriesMergeExec: NULL in the shards' lists");
                }
                let values = hits.values().as_struct();
                let docs = values.column(0).as_primitive::<UInt32Type>();
                let scores = values.column(1).as_primitive::<Float64Type>();
                let offsets = hits.value_offsets();
                for row in 0..batch.num_rows() {
                    let text = texts.value(row);
                    if !lists.contains_key(text) {
                        reservation.try_grow(text.len() + 96)?;
                        lists.insert(text.to_string(), Gathered::default());
                    }
                    let Some(gathered) = lists.get_mut(text) else {
                        return internal_err!("TopkBm25QueriesMergeExec: a text lost");
                    };
                    let range = offsets[row] as usize..offsets[row + 1] as usize;
                    reservation.try_grow(range.len() * std::mem::size_of::<Hit>())?;
                    let list = match kinds.value(row) {
                        MAIN => &mut gathered.main,
                        _ => &mut gathered.fallback,
                    };
                    list.extend(range.map(|i| Hit {
                        doc: docs.value(i),
                        score: scores.value(i),
                    }));
                }
            }
            let _t = baseline.elapsed_compute().timer();
            let (mut texts, mut merged) = (Vec::with_capacity(lists.len()), Vec::new());
            for (text, g) in lists {
                texts.push(text);
                let main = best(g.main, k)?;
                // AND matched fewer than k documents in the corpus: every partition's AND
                // list was short, so every partition sent its OR list.
                merged.push(match mode == Mode::AndOr && main.len() < k {
                    true => best(g.fallback, k)?,
                    false => main,
                });
            }
            let hits = hits_column(merged.iter().map(Vec::as_slice))?;
            let batch = RecordBatch::try_new(
                out,
                vec![
                    Arc::new(StringArray::from_iter_values(texts.iter())),
                    Arc::new(hits),
                ],
            )?;
            baseline.record_output(batch.num_rows());
            drop(reservation);
            Ok(batch)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(fut),
        )))
    }
}

#[cfg(test)]
mod tests {
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::prelude::SessionContext;

    use super::*;
    use crate::search::index::{IndexBuilder, InvertedIndex};
    use crate::search::tokenize::TokenizerOptions;

    /// 300 documents: the index, and its table whole and in 4 shards.
    fn tables() -> (RecordBatch, RecordBatch) {
        let options = TokenizerOptions::default();
        let build = || {
            let mut b = IndexBuilder::new(options, false);
            let mut tok = Tokenizer::new(options);
            for id in 0..300u32 {
                let text = format!("w{} x{} y{} z{}", id % 7, id % 5, id % 3, id % 11);
                b.add_text(&mut tok, id, Some(&text), None);
            }
            b.finish()
        };
        (
            build().into_batch().unwrap(),
            build().into_sharded_batch(4).unwrap(),
        )
    }

    fn queries(texts: &[Option<&str>]) -> Arc<dyn ExecutionPlan> {
        let schema = Arc::new(Schema::new(vec![Field::new("q", DataType::Utf8View, true)]));
        let column = datafusion::arrow::array::StringViewArray::from(texts.to_vec());
        let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(column)]).unwrap();
        MemorySourceConfig::try_new_exec(&[vec![batch]], schema, None).unwrap()
    }

    /// `index` (its partitions as given) searched for `texts`: every merged row, as
    /// `(query, [(doc, score)])`, in the merge's order.
    async fn search(
        index: Arc<dyn ExecutionPlan>,
        texts: &[Option<&str>],
        k: usize,
        mode: Mode,
    ) -> Result<Vec<(String, Vec<(u32, f64)>)>> {
        let shards = TopkQueriesShardsExec::try_new(index, queries(texts), "idx".into(), k, mode)?;
        let lists = Arc::new(CoalescePartitionsExec::new(Arc::new(shards)));
        let merge = Arc::new(TopkQueriesMergeExec::try_new(lists, k, mode)?);
        let mut rows = Vec::new();
        for b in collect(merge, SessionContext::new().task_ctx()).await? {
            let texts = b.column(0).as_string::<i32>();
            let lists = b.column(1).as_list::<i32>();
            for i in 0..b.num_rows() {
                let hits = lists.value(i);
                let hits = hits.as_struct();
                let docs = hits.column(0).as_primitive::<UInt32Type>();
                let scores = hits.column(1).as_primitive::<Float64Type>();
                let list = docs
                    .values()
                    .iter()
                    .copied()
                    .zip(scores.values().iter().copied());
                rows.push((texts.value(i).to_string(), list.collect()));
            }
        }
        rows.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(rows)
    }

    fn scan(batches: Vec<Vec<RecordBatch>>) -> Arc<dyn ExecutionPlan> {
        let schema = batches[0][0].schema();
        MemorySourceConfig::try_new_exec(&batches, schema, None).unwrap()
    }

    /// The shards spread over 3 partitions by hash, and the unsharded table in one, give
    /// every distinct query the whole index's top k, for every mode; NULL is skipped and a
    /// repeated text answered once.
    #[tokio::test]
    async fn shards_answer_every_query_as_the_whole_index() {
        let (whole, sharded) = tables();
        let index =
            InvertedIndex::from_batches(&whole.schema(), std::slice::from_ref(&whole), WHO, "idx")
                .unwrap();
        let texts = [
            Some("w1 x2"),
            None,
            Some("w1 x2"),
            Some("z3 y1 w6"),
            Some("nothing here"),
            Some("x4"),
            Some(""),
        ];
        let at = sharded.schema().index_of("shard").unwrap();
        // A fresh exchange per search (an exchange's partitions are read once).
        let by_hash = || {
            Arc::new(
                RepartitionExec::try_new(
                    scan(vec![vec![sharded.clone()]]),
                    Partitioning::Hash(vec![Arc::new(Column::new("shard", at))], 3),
                )
                .unwrap(),
            )
        };
        let params = crate::search::scoring::Bm25Params::default();
        let scored = crate::search::scoring::Scored::new(&index, params);
        for (mode, k) in [
            (Mode::Or, 5),
            (Mode::And, 3),
            (Mode::AndOr, 4),
            (Mode::AndOr, 200),
        ] {
            let got = search(by_hash(), &texts, k, mode).await.unwrap();
            let unsharded = search(scan(vec![vec![whole.clone()]]), &texts, k, mode).await;
            assert_eq!(got, unsharded.unwrap(), "{mode:?} k={k}");
            let mut distinct: Vec<&str> = texts.iter().flatten().copied().collect();
            distinct.sort();
            distinct.dedup();
            assert_eq!(got.len(), distinct.len());
            let mut tok = Tokenizer::new(index.tokenizer());
            for (text, hits) in &got {
                let terms = tok.terms(text);
                let (ids, unknown) =
                    crate::search::topk::query_terms(&index, terms.iter().map(String::as_str));
                let want = crate::search::topk::top(&index, &scored, &ids, unknown, k, mode);
                let want: Vec<(u32, f64)> = want.iter().map(|h| (h.doc, h.score)).collect();
                assert_eq!(hits, &want, "{mode:?} k={k} {text:?}");
            }
        }
    }

    /// A shard's rows in two partitions that are not partitioned by shard are refused, not
    /// ranked in pieces; so is an unsharded table in several partitions.
    #[tokio::test]
    async fn split_shards_are_refused() {
        let (whole, sharded) = tables();
        let split = |b: &RecordBatch| {
            let (x, y) = (b.slice(0, 10), b.slice(10, b.num_rows() - 10));
            scan(vec![vec![x], vec![y]])
        };
        for index in [split(&sharded), split(&whole)] {
            let err = search(index, &[Some("w1")], 3, Mode::Or).await.unwrap_err();
            assert!(
                err.to_string()
                    .contains("must reach TopkBm25QueriesShardsExec whole"),
                "{err}"
            );
        }
    }
}
