//! The operators that build an index table (`bm25_index`).
//!
//! - [`Bm25IndexExec`]: one index of every document, built in one partition from the whole
//!   input (each batch tokenized on every core).
//! - Spread over partitions and tasks (`sets.bm25_index_distribution = 'terms'`, the choice
//!   under datafusion-distributed):
//!   1. [`Bm25PartsExec`] indexes the documents of each input partition where they are read,
//!      and sends each term's postings to the term's bucket (a hash of the term), with the
//!      partition's statistics (documents, terms, and, to bucket 0, its document ids) to
//!      every bucket.
//!   2. A hash exchange on the bucket (`EnsureRequirements` plans it; datafusion-distributed
//!      makes it a network shuffle).
//!   3. [`Bm25MergeExec`] merges each term's postings from every part, sorted by document,
//!      under the statistics summed over every part, and checks across parts that no id
//!      appears twice. Its partitions come out sorted by term; a sort-preserving merge above
//!      makes the one table `Bm25IndexExec` would have built, row for row.

use std::collections::{HashMap, HashSet};
use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, ListArray, RecordBatch, StringArray, UInt32Array, UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::cast;
use datafusion::arrow::datatypes::{
    DataType, Field, Float64Type, Schema, SchemaRef, UInt32Type, UInt64Type,
};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, ScalarValue, exec_err, internal_err};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, LexOrdering, PhysicalSortExpr};
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties, SendableRecordBatchStream,
};
use futures::{StreamExt, TryStreamExt};

use super::index::{IndexBuilder, index_batch, index_schema, sharded_index_schema};
use super::tokenize::{Tokenizer, TokenizerOptions};

/// The SQL name these operators build for, in errors.
const WHO: &str = "bm25_index";

/// The bucket column of [`Bm25PartsExec`]'s output.
pub const BUCKET: &str = "__sets_bucket";

/// Reads every row of its input and emits the index as one batch (sharded into `shards`
/// shards when that is not 0).
#[derive(Debug)]
pub struct Bm25IndexExec {
    input: Arc<dyn ExecutionPlan>,
    pub tokenizer: TokenizerOptions,
    pub with_static: bool,
    pub shards: u32,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl Bm25IndexExec {
    pub fn new(
        input: Arc<dyn ExecutionPlan>,
        tokenizer: TokenizerOptions,
        with_static: bool,
        shards: u32,
    ) -> Self {
        let schema = match shards {
            0 => index_schema(with_static),
            _ => sharded_index_schema(with_static),
        };
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
            shards,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }
}

impl DisplayAs for Bm25IndexExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Bm25IndexExec: {}",
            options(self.tokenizer, self.with_static)
        )?;
        match self.shards {
            0 => Ok(()),
            n => write!(f, ", shards={n}"),
        }
    }
}

/// The tokenizer's canonical spelling, its pairs spaced like the other fields, and whether
/// static scores are indexed.
fn options(tokenizer: TokenizerOptions, with_static: bool) -> String {
    let tokenizer = tokenizer.to_string().replace(',', ", ");
    format!("{tokenizer}, static={with_static}")
}

impl ExecutionPlan for Bm25IndexExec {
    plan_basics!("Bm25IndexExec");

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
            self.shards,
        )))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition != 0 {
            return exec_err!("{WHO}: partition {partition} out of range (1 partition)");
        }
        let input: Arc<dyn ExecutionPlan> =
            if self.input.output_partitioning().partition_count() > 1 {
                Arc::new(CoalescePartitionsExec::new(Arc::clone(&self.input)))
            } else {
                Arc::clone(&self.input)
            };
        let stream = input.execute(0, Arc::clone(&context))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (tokenizer, with_static, shards) = (self.tokenizer, self.with_static, self.shards);
        let reservation = MemoryConsumer::new(WHO).register(context.memory_pool());
        let fut = async move {
            let (builder, _, reservation) =
                index_input(stream, tokenizer, with_static, reservation, &baseline).await?;
            let _t = baseline.elapsed_compute().timer();
            // The index is built beside the builder (which it empties as it goes), then
            // moved into the output batch uncopied: reserve both before building.
            reservation.try_grow(builder.finished_bytes())?;
            let index = builder.finish();
            let out = match shards {
                0 => index.into_batch()?,
                // The shards' rows are a second copy of the postings.
                n => {
                    reservation.try_grow(index.size_bytes())?;
                    index.into_sharded_batch(n)?
                }
            };
            baseline.record_output(out.num_rows());
            Ok::<_, DataFusionError>(out)
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(fut),
        )))
    }
}

/// Tokenizes and indexes every row of `stream` (id, text and optional static score columns),
/// returning the builder, the ids seen, and the reservation that holds both.
async fn index_input(
    mut stream: SendableRecordBatchStream,
    tokenizer: TokenizerOptions,
    with_static: bool,
    reservation: MemoryReservation,
    baseline: &BaselineMetrics,
) -> Result<(IndexBuilder, HashSet<u32>, MemoryReservation)> {
    let timer = baseline.elapsed_compute().clone();
    let mut builder = IndexBuilder::new(tokenizer, with_static);
    let mut tok = Tokenizer::new(tokenizer);
    let mut seen = HashSet::new();
    // A batch of long texts is a second of tokenizing in a test build: it is indexed in
    // slices, each enough for every core, with a yield after each, so a cancel (or another
    // query's task) gets in even when the input never runs out of tokio's budget.
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
    Ok((builder, seen, reservation))
}

fn add_batch(
    builder: &mut IndexBuilder,
    tok: &mut Tokenizer,
    seen: &mut HashSet<u32>,
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
            return exec_err!("{WHO}: NULL in the id column");
        }
        let bad = || {
            ScalarValue::try_from_array(ids_in, r)
                .map(|v| v.to_string())
                .unwrap_or_default()
        };
        if ids.is_null(r) || ids.value(r) > u32::MAX as u64 {
            return exec_err!(
                "{WHO}: id {} is outside 0..=4294967295 (ids must fit in 32 bits)",
                bad()
            );
        }
        let id = ids.value(r) as u32;
        if !seen.insert(id) {
            return twice(id);
        }
        let s = match statics {
            Some(s) if s.is_valid(r) => {
                let v = s.value(r);
                if !v.is_finite() {
                    return exec_err!("{WHO}: static score of id {id} is not finite ({v})");
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

fn twice<T>(id: u32) -> Result<T> {
    exec_err!("{WHO}: id {id} appears twice in the id column")
}

/// The schema of [`Bm25PartsExec`]'s output: the bucket, then the index table's columns
/// without `tokenizer`, `term` NULL in a row of statistics (the part's `n_docs` and
/// `total_len`; in bucket 0 its document ids in `doc_ids`).
fn parts_schema(with_static: bool) -> SchemaRef {
    let index = index_schema(with_static);
    let mut fields = vec![Field::new(BUCKET, DataType::UInt32, false)];
    for f in index.fields().iter().filter(|f| f.name() != "tokenizer") {
        let f = f.as_ref().clone();
        fields.push(if f.name() == "term" {
            f.with_nullable(true)
        } else {
            f
        });
    }
    Arc::new(Schema::new(fields))
}

/// A term's bucket: FNV-1a of its bytes, the same in every process.
fn bucket_of(term: &str, buckets: u32) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in term.as_bytes() {
        h = (h ^ b as u64).wrapping_mul(0x0000_0100_0000_01b3);
    }
    (h % buckets as u64) as u32
}

/// Indexes each input partition on its own and emits its postings by bucket of term, and
/// its statistics to every bucket (module docs).
#[derive(Debug)]
pub struct Bm25PartsExec {
    input: Arc<dyn ExecutionPlan>,
    pub tokenizer: TokenizerOptions,
    pub with_static: bool,
    pub buckets: u32,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl Bm25PartsExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        tokenizer: TokenizerOptions,
        with_static: bool,
        buckets: u32,
    ) -> Result<Self> {
        if buckets == 0 {
            return internal_err!("{WHO}: an index spread over 0 buckets");
        }
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(parts_schema(with_static)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            tokenizer,
            with_static,
            buckets,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

impl DisplayAs for Bm25PartsExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let options = options(self.tokenizer, self.with_static);
        write!(f, "Bm25PartsExec: buckets={}, {options}", self.buckets)
    }
}

impl ExecutionPlan for Bm25PartsExec {
    plan_basics!("Bm25PartsExec");

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            Arc::clone(&children[0]),
            self.tokenizer,
            self.with_static,
            self.buckets,
        )?))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let stream = self.input.execute(partition, Arc::clone(&context))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (tokenizer, with_static, buckets) = (self.tokenizer, self.with_static, self.buckets);
        let schema = parts_schema(with_static);
        let reservation =
            MemoryConsumer::new(format!("{WHO} part[{partition}]")).register(context.memory_pool());
        let out_schema = Arc::clone(&schema);
        let fut = async move {
            let (builder, seen, reservation) =
                index_input(stream, tokenizer, with_static, reservation, &baseline).await?;
            let _t = baseline.elapsed_compute().timer();
            reservation.try_grow(builder.finished_bytes())?;
            let index = builder.finish();
            let (n_docs, total_len) = (index.n_docs(), index.total_len());
            let postings = index.into_batch()?;
            let stats = stats_batch(&out_schema, seen, (n_docs, total_len), buckets)?;
            // The index batch's columns, the bucket first and `tokenizer` (last) left out.
            let terms = postings.column(0).as_string::<i32>();
            let bucket: UInt32Array = terms
                .iter()
                .map(|t| bucket_of(t.unwrap_or(""), buckets))
                .collect();
            let mut columns: Vec<ArrayRef> = vec![Arc::new(bucket)];
            columns.extend(
                postings.columns()[..postings.num_columns() - 1]
                    .iter()
                    .cloned(),
            );
            let postings = RecordBatch::try_new(Arc::clone(&out_schema), columns)?;
            baseline.record_output(postings.num_rows() + stats.num_rows());
            drop(reservation);
            Ok::<_, DataFusionError>(futures::stream::iter([Ok(stats), Ok(postings)]))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            schema,
            futures::stream::once(fut).try_flatten(),
        )))
    }
}

/// A part's statistics, one row per bucket; bucket 0's `doc_ids` hold the part's ids.
fn stats_batch(
    schema: &SchemaRef,
    seen: HashSet<u32>,
    (n_docs, total_len): (u64, u64),
    buckets: u32,
) -> Result<RecordBatch> {
    let n = buckets as usize;
    let mut ids: Vec<u32> = seen.into_iter().collect();
    ids.sort_unstable();
    let id_count = i32::try_from(ids.len())
        .or_else(|_| exec_err!("{WHO}: more than 2^31 documents in one partition"))?;
    let mut offsets = vec![0i32; n + 1];
    offsets[1..].fill(id_count);
    let empty = OffsetBuffer::new_zeroed(n);
    let list = |values: ArrayRef, offsets: OffsetBuffer<i32>| -> ArrayRef {
        let field = Field::new_list_field(values.data_type().clone(), false);
        Arc::new(ListArray::new(Arc::new(field), offsets, values, None))
    };
    let no_u32 = || {
        list(
            Arc::new(UInt32Array::from(Vec::<u32>::new())),
            empty.clone(),
        )
    };
    let mut columns: Vec<ArrayRef> = vec![
        Arc::new(UInt32Array::from_iter_values(0..buckets)),
        Arc::new(StringArray::new_null(n)),
        list(
            Arc::new(UInt32Array::from(ids)),
            OffsetBuffer::new(offsets.into()),
        ),
        no_u32(),
        no_u32(),
    ];
    if schema.column_with_name("static_scores").is_some() {
        let values = Arc::new(datafusion::arrow::array::Float64Array::from(
            Vec::<f64>::new(),
        ));
        columns.push(list(values, empty.clone()));
    }
    columns.push(Arc::new(UInt64Array::from_value(n_docs, n)));
    columns.push(Arc::new(UInt64Array::from_value(total_len, n)));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Merges the parts of each term that its input partitions hold (module docs); its input
/// must be partitioned on the bucket, and each output partition comes out sorted by term.
#[derive(Debug)]
pub struct Bm25MergeExec {
    input: Arc<dyn ExecutionPlan>,
    pub tokenizer: TokenizerOptions,
    pub with_static: bool,
    schema: SchemaRef,
    properties: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
}

impl Bm25MergeExec {
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        tokenizer: TokenizerOptions,
        with_static: bool,
    ) -> Result<Self> {
        let want = parts_schema(with_static);
        if input.schema().fields() != want.fields() {
            return internal_err!(
                "{WHO}: the merge's input is not the parts of an index (got {}, expected {})",
                input.schema(),
                want
            );
        }
        let schema = index_schema(with_static);
        let properties = Arc::new(PlanProperties::new(
            EquivalenceProperties::new_with_orderings(Arc::clone(&schema), [by_term()]),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            tokenizer,
            with_static,
            schema,
            properties,
            metrics: ExecutionPlanMetricsSet::new(),
        })
    }
}

/// The index table's order: by term (its first column).
pub fn by_term() -> LexOrdering {
    let term = Arc::new(Column::new("term", 0));
    LexOrdering::new([PhysicalSortExpr::new_default(term)]).expect("one sort expression")
}

impl DisplayAs for Bm25MergeExec {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(
            f,
            "Bm25MergeExec: {}",
            options(self.tokenizer, self.with_static)
        )
    }
}

impl ExecutionPlan for Bm25MergeExec {
    plan_basics!("Bm25MergeExec");

    /// Every part of a term, and the statistics of every part, in one partition: the parts
    /// hashed on their bucket.
    fn required_input_distribution(&self) -> Vec<Distribution> {
        let bucket = Arc::new(Column::new(BUCKET, 0)) as Arc<dyn PhysicalExpr>;
        vec![Distribution::KeyPartitioned(vec![bucket])]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::try_new(
            Arc::clone(&children[0]),
            self.tokenizer,
            self.with_static,
        )?))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let mut stream = self.input.execute(partition, Arc::clone(&context))?;
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let (tokenizer, with_static) = (self.tokenizer, self.with_static);
        let reservation = MemoryConsumer::new(format!("{WHO} merge[{partition}]"))
            .register(context.memory_pool());
        let fut = async move {
            let mut batches = Vec::new();
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                reservation.try_grow(batch.get_array_memory_size())?;
                batches.push(batch);
            }
            let timer = baseline.elapsed_compute().clone();
            let t = timer.timer();
            let merge = Merge::new(&batches, tokenizer, with_static)?;
            drop(t);
            // The output is as large as the input (the postings, moved into new lists).
            let input: usize = batches.iter().map(|b| b.get_array_memory_size()).sum();
            reservation.try_grow(input)?;
            let mut out = Vec::new();
            let mut at = 0;
            while at < merge.terms.len() {
                let t = timer.timer();
                let (batch, next) = merge.batch(at)?;
                drop(t);
                baseline.record_output(batch.num_rows());
                out.push(Ok(batch));
                at = next;
                tokio::task::yield_now().await;
            }
            drop(merge);
            drop(batches);
            Ok::<_, DataFusionError>(futures::stream::iter(out))
        };
        Ok(Box::pin(RecordBatchStreamAdapter::new(
            Arc::clone(&self.schema),
            futures::stream::once(fut).try_flatten(),
        )))
    }
}

/// One batch of parts, its columns read as slices.
struct Parts<'a> {
    bucket: &'a [u32],
    terms: &'a StringArray,
    /// `doc_ids`, `tfs`, `doc_lens`: their offsets and values.
    lists: [(&'a [i32], &'a [u32]); 3],
    statics: Option<(&'a [i32], &'a [f64])>,
    n_docs: &'a [u64],
    total_len: &'a [u64],
}

impl<'a> Parts<'a> {
    fn of(batch: &'a RecordBatch, with_static: bool) -> Result<Self> {
        let list = |i: usize| -> Result<(&'a [i32], &'a ListArray)> {
            let Some(l) = batch.column(i).as_list_opt::<i32>() else {
                return internal_err!("{WHO}: column {i} of the parts is not a list");
            };
            Ok((l.value_offsets(), l))
        };
        let u32s = |i: usize| -> Result<(&'a [i32], &'a [u32])> {
            let (offsets, l) = list(i)?;
            match l.values().as_primitive_opt::<UInt32Type>() {
                Some(v) => Ok((offsets, v.values().as_ref())),
                None => internal_err!("{WHO}: column {i} of the parts is not a list of u32"),
            }
        };
        let statics = match with_static {
            true => {
                let (offsets, l) = list(5)?;
                match l.values().as_primitive_opt::<Float64Type>() {
                    Some(v) => Some((offsets, v.values().as_ref())),
                    None => return internal_err!("{WHO}: static scores of the parts are not f64"),
                }
            }
            false => None,
        };
        let at = 5 + with_static as usize;
        fn bad<T>(what: &str) -> Result<T> {
            internal_err!("{WHO}: the parts' {what} column has another type")
        }
        let u64s = |i: usize| -> Result<&'a [u64]> {
            match batch
                .columns()
                .get(i)
                .and_then(|c| c.as_primitive_opt::<UInt64Type>())
            {
                Some(c) => Ok(c.values().as_ref()),
                None => bad("statistics"),
            }
        };
        let Some(bucket) = batch.column(0).as_primitive_opt::<UInt32Type>() else {
            return bad("bucket");
        };
        let Some(terms) = batch.column(1).as_string_opt::<i32>() else {
            return bad("term");
        };
        Ok(Self {
            bucket: bucket.values(),
            terms,
            lists: [u32s(2)?, u32s(3)?, u32s(4)?],
            statics,
            n_docs: u64s(at)?,
            total_len: u64s(at + 1)?,
        })
    }

    /// Row `r`'s postings: where they start in each list (`doc_ids`, `tfs`, `doc_lens`, then
    /// the static scores), and how many there are, checked to be as many in every list.
    fn postings(&self, r: usize) -> Result<([usize; 4], usize)> {
        let span = |o: &[i32]| (o[r] as usize, (o[r + 1] - o[r]) as usize);
        let (docs, n) = span(self.lists[0].0);
        let mut starts = [docs, 0, 0, 0];
        let others = self.lists[1..]
            .iter()
            .map(|l| l.0)
            .chain(self.statics.map(|s| s.0));
        for (k, o) in others.enumerate() {
            let (start, len) = span(o);
            if len != n {
                return internal_err!("{WHO}: a term's part has lists of different lengths");
            }
            starts[k + 1] = start;
        }
        Ok((starts, n))
    }
}

/// Terms merged into one output batch (the merge yields between batches, so a cancel gets
/// in).
const TERMS_PER_BATCH: usize = 16_384;

/// The parts one merge partition received, ready to merge: the corpus's statistics, and every
/// term row as (term, batch, row), sorted by term.
struct Merge<'a> {
    parts: Vec<Parts<'a>>,
    /// Documents and terms in the corpus.
    stats: (u64, u64),
    terms: Vec<(&'a str, u32, u32)>,
    tokenizer: TokenizerOptions,
    with_static: bool,
}

impl<'a> Merge<'a> {
    /// Reads `batches` (parts of one or more buckets): the statistics of every part, summed,
    /// checked alike in every bucket; the ids of every part (bucket 0), checked distinct.
    fn new(
        batches: &'a [RecordBatch],
        tokenizer: TokenizerOptions,
        with_static: bool,
    ) -> Result<Self> {
        let parts: Vec<Parts> = batches
            .iter()
            .map(|b| Parts::of(b, with_static))
            .collect::<Result<_>>()?;
        // Per bucket, the sums over the parts (each part sent every bucket the same).
        let mut stats: HashMap<u32, (u64, u64, usize)> = HashMap::new();
        let mut ids = Vec::new();
        let mut terms: Vec<(&str, u32, u32)> = Vec::new();
        for (b, p) in parts.iter().enumerate() {
            for r in 0..p.bucket.len() {
                if p.terms.is_valid(r) {
                    terms.push((p.terms.value(r), b as u32, r as u32));
                    continue;
                }
                let s = stats.entry(p.bucket[r]).or_default();
                s.0 += p.n_docs[r];
                s.1 += p.total_len[r];
                s.2 += 1;
                if p.bucket[r] == 0 {
                    // A statistics row holds ids in `doc_ids` alone.
                    let (offsets, values) = p.lists[0];
                    ids.extend_from_slice(&values[offsets[r] as usize..offsets[r + 1] as usize]);
                }
            }
        }
        let mut sums = stats.values();
        let global = match sums.next() {
            Some(&s) if sums.all(|&t| t == s) => s,
            Some(_) => return internal_err!("{WHO}: the parts' statistics differ between buckets"),
            None if terms.is_empty() => (0, 0, 0),
            None => return internal_err!("{WHO}: postings without the parts' statistics"),
        };
        if stats.contains_key(&0) {
            // Bucket 0 holds every part's ids: an id in two parts is a duplicate in the input.
            ids.sort_unstable();
            if let Some(w) = ids.windows(2).find(|w| w[0] == w[1]) {
                return twice(w[0]);
            }
            if ids.len() as u64 != global.0 {
                return internal_err!("{WHO}: {} ids for {} documents", ids.len(), global.0);
            }
        }
        terms.sort_unstable();
        Ok(Self {
            parts,
            stats: (global.0, global.1),
            terms,
            tokenizer,
            with_static,
        })
    }

    /// The terms of `self.terms` from `at`, up to `TERMS_PER_BATCH` of them, as index rows,
    /// each term's postings merged from its parts; and where the next batch starts.
    fn batch(&self, at: usize) -> Result<(RecordBatch, usize)> {
        let mut names = Vec::new();
        let mut offsets = vec![0usize];
        let [mut docs, mut tfs, mut lens] = [(); 3].map(|_| Vec::new());
        let mut statics = self.with_static.then(Vec::new);
        let mut merged: Vec<(u32, u32, u32, f64)> = Vec::new();
        let mut end = at;
        for run in self.terms[at..]
            .chunk_by(|a, b| a.0 == b.0)
            .take(TERMS_PER_BATCH)
        {
            end += run.len();
            merged.clear();
            for &(_, b, r) in run {
                let p = &self.parts[b as usize];
                let ([d, t, l, st], n) = p.postings(r as usize)?;
                for i in 0..n {
                    let s = p.statics.map_or(0.0, |s| s.1[st + i]);
                    merged.push((
                        p.lists[0].1[d + i],
                        p.lists[1].1[t + i],
                        p.lists[2].1[l + i],
                        s,
                    ));
                }
            }
            if run.len() > 1 {
                merged.sort_unstable_by_key(|e| e.0);
                if let Some(w) = merged.windows(2).find(|w| w[0].0 == w[1].0) {
                    return twice(w[0].0);
                }
            }
            for &(d, tf, len, s) in &merged {
                docs.push(d);
                tfs.push(tf);
                lens.push(len);
                if let Some(st) = &mut statics {
                    st.push(s);
                }
            }
            names.push(run[0].0);
            offsets.push(docs.len());
        }
        let batch = index_batch(
            &names,
            &offsets,
            [docs, tfs, lens],
            statics,
            self.stats,
            self.tokenizer,
        )?;
        Ok((batch, end))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::index::InvertedIndex;
    use datafusion::arrow::array::{Float64Array, Int64Array};
    use datafusion::arrow::compute::concat_batches;
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::physical_plan::collect;
    use datafusion::physical_plan::repartition::RepartitionExec;
    use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
    use datafusion::prelude::SessionContext;
    use rand::{Rng, SeedableRng, rngs::StdRng};

    type Doc = (i64, Option<String>, Option<f64>);

    /// Random documents over a small vocabulary (terms repeat across partitions), some empty
    /// or NULL, ids shuffled.
    fn corpus(n: usize, seed: u64) -> Vec<Doc> {
        let mut rng = StdRng::seed_from_u64(seed);
        let words = [
            "alpha", "beta", "gamma", "delta", "eps", "zeta", "éclair", "straße",
        ];
        let mut ids: Vec<i64> = (0..n as i64).map(|i| i * 7 + 3).collect();
        for i in (1..ids.len()).rev() {
            ids.swap(i, rng.random_range(0..=i));
        }
        ids.into_iter()
            .map(|id| {
                let text = match rng.random_range(0..10) {
                    0 => None,
                    1 => Some(String::new()),
                    // A rare word now and then: with many documents, more terms than one
                    // output batch holds.
                    _ => {
                        let len = rng.random_range(1..12);
                        let mut w: Vec<String> = (0..len)
                            .map(|_| words[rng.random_range(0..words.len())].to_string())
                            .collect();
                        w.push(format!("w{}", rng.random_range(0..40_000)));
                        Some(w.join(" "))
                    }
                };
                (id, text, Some(rng.random_range(0..100) as f64 / 10.0))
            })
            .collect()
    }

    fn batch(docs: &[Doc]) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int64, false),
            Field::new("text", DataType::Utf8, true),
            Field::new("rank", DataType::Float64, true),
        ]));
        let columns: Vec<ArrayRef> = vec![
            Arc::new(docs.iter().map(|d| d.0).collect::<Int64Array>()),
            Arc::new(docs.iter().map(|d| d.1.clone()).collect::<StringArray>()),
            Arc::new(docs.iter().map(|d| d.2).collect::<Float64Array>()),
        ];
        RecordBatch::try_new(schema, columns).unwrap()
    }

    /// The documents in `partitions` partitions (several batches each), parts, a hash
    /// exchange on the bucket into `merges` partitions, and the merge.
    fn spread_plan(
        docs: &[Doc],
        partitions: usize,
        merges: usize,
        buckets: u32,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let mut parts: Vec<Vec<RecordBatch>> = docs
            .chunks(docs.len().div_ceil(partitions).max(1))
            .map(|p| p.chunks(17).map(batch).collect())
            .collect();
        parts.resize(partitions, Vec::new());
        let schema = batch(&[]).schema();
        let scan = MemorySourceConfig::try_new_exec(&parts, schema, None)?;
        let options = TokenizerOptions::default();
        let parts = Arc::new(Bm25PartsExec::try_new(scan, options, true, buckets)?);
        let bucket = Arc::new(Column::new(BUCKET, 0)) as Arc<dyn PhysicalExpr>;
        let hashed = Arc::new(RepartitionExec::try_new(
            parts,
            Partitioning::Hash(vec![bucket], merges),
        )?);
        Ok(Arc::new(Bm25MergeExec::try_new(hashed, options, true)?))
    }

    /// The index of `docs` in one process, in one piece.
    fn whole(docs: &[Doc]) -> RecordBatch {
        let mut b = IndexBuilder::new(TokenizerOptions::default(), true);
        let mut tok = Tokenizer::new(TokenizerOptions::default());
        for (id, text, s) in docs {
            b.add_text(&mut tok, *id as u32, text.as_deref(), *s);
        }
        b.finish().into_batch().unwrap()
    }

    /// Each merge partition run by a plan copy of its own (as a task of a distributed stage
    /// does), the outputs together, sorted by term, equal the index built whole.
    #[tokio::test]
    async fn a_copy_per_partition_builds_the_whole_index() -> Result<()> {
        let ctx = SessionContext::new();
        for (n, partitions, merges, buckets) in [
            (500, 4, 3, 3),
            (200, 3, 2, 16),
            (60, 1, 4, 1),
            (30_000, 3, 1, 2),
        ] {
            let docs = corpus(n, n as u64);
            let mut outs = Vec::new();
            for p in 0..merges {
                let plan = spread_plan(&docs, partitions, merges, buckets)?;
                let stream = plan.execute(p, ctx.task_ctx())?;
                let batches: Vec<RecordBatch> = stream.try_collect().await?;
                outs.extend(batches);
            }
            let got = concat_batches(&index_schema(true), &outs)?;
            let sorted = SortPreservingMergeExec::new(
                by_term(),
                MemorySourceConfig::try_new_exec(
                    &outs.iter().map(|b| vec![b.clone()]).collect::<Vec<_>>(),
                    index_schema(true),
                    None,
                )?,
            );
            let sorted = collect(Arc::new(sorted), ctx.task_ctx()).await?;
            let sorted = concat_batches(&index_schema(true), &sorted)?;
            let expected = whole(&docs);
            assert_eq!(got.num_rows(), expected.num_rows());
            assert_eq!(
                sorted, expected,
                "{n} docs, {partitions} parts, {merges} merges"
            );
            // And it loads as an index.
            InvertedIndex::from_batches(&index_schema(true), &[sorted], "test", "idx")?;
        }
        Ok(())
    }

    /// No documents: no rows. An id in two input partitions: the error names it.
    #[tokio::test]
    async fn empty_input_and_an_id_in_two_partitions() -> Result<()> {
        let ctx = SessionContext::new();
        let plan = spread_plan(&[], 2, 2, 4)?;
        let out = collect(plan, ctx.task_ctx()).await?;
        assert_eq!(out.iter().map(|b| b.num_rows()).sum::<usize>(), 0);
        // Id 10 in the first and the last partition, with no term in common.
        let docs: Vec<Doc> = vec![
            (10, Some("alpha".into()), None),
            (11, Some("beta".into()), None),
            (12, Some("gamma".into()), None),
            (10, Some("delta".into()), None),
        ];
        for buckets in [1, 5] {
            let plan = spread_plan(&docs, 2, 2, buckets)?;
            let err = collect(plan, ctx.task_ctx()).await.unwrap_err().to_string();
            assert!(err.contains("id 10 appears twice"), "{err}");
        }
        Ok(())
    }
}
