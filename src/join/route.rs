//! The prefix-partitioned similarity join (Vernica, Carey and Li, SIGMOD 2010): the plan that
//! spreads one join over many partitions and tasks, each set sent only where a partner can be.
//!
//! ```text
//! SimilarityJoinExec: distribution=prefix(buckets=B)      each partition joins its own sets
//!   RepartitionExec: Hash([__sets_bucket])               (a shuffle between tasks)
//!     PrefixRouteExec                                     one row per (set, prefix bucket)
//!       <input>
//!       CoalescePartitionsExec                            the token counts, whole, in every task
//!         AggregateExec: FinalPartitioned, count per token
//!           RepartitionExec: Hash([token])
//!             AggregateExec: Partial
//!               UnnestExec <- the token column(s) of both inputs
//! ```
//!
//! 1. **Global order.** Tokens are counted over both inputs, a distributed aggregation, and
//!    every router ranks them the same way: by count, then by value (rarest first). The rank
//!    table is small (one row per distinct token) and each task reads all of it.
//! 2. **Routing.** A set's tokens become ranks, sorted. Its probe prefix (its
//!    [`Threshold::prefix_len`] smallest ranks) must share a rank with the prefix of every set
//!    it passes with. Rank `r` belongs to bucket `r mod B`; the set is emitted once per
//!    distinct bucket of its prefix, its tokens written as `rank * B + bucket`. Copies in
//!    different buckets share no token, so a partition that receives several buckets joins
//!    them as separate joins in one build, and two copies of one set never meet.
//! 3. **Join and ownership.** Every partition joins the sets it received, with the ordinary
//!    engine. A pair that passes shares a prefix rank, so both sets have a copy in the bucket
//!    of their smallest common rank `t`, which the hash repartition sends to one partition; it
//!    may also meet in other buckets (other common prefix ranks). It is kept only in bucket
//!    `t mod B` (`owns`), so every pair comes out exactly once. The partition's build keeps
//!    the routed order ([`super::build::TokenOrder::Routed`]), so `t` is the first token the
//!    probe meets the pair at, and its index holds only the copy's own-bucket prefix tokens:
//!    the other buckets' pairs are mostly never met, and the candidates of all buckets
//!    together are about those of one build.
//!
//! Any total order makes this exact; the frequency order keeps prefixes, and so copies and
//! candidates, few.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, Int64Array, ListArray, RecordBatch, UInt32Builder, UInt64Array,
};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::compute::{SortColumn, cast, lexsort_to_indices, take};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::arrow::row::{RowConverter, SortField};
use datafusion::common::UnnestOptions;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, exec_err, internal_err, plan_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::functions_aggregate::count::count_udaf;
use datafusion::physical_expr::aggregate::AggregateExprBuilder;
use datafusion::physical_expr::expressions::{CastExpr, Column};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::aggregates::{AggregateExec, AggregateMode, PhysicalGroupBy};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::unnest::{ListUnnest, UnnestExec};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use futures::{StreamExt, TryStreamExt};
use tokio::sync::OnceCell;

use super::exec::{JoinColumn, JoinDistribution, JoinInput, OutputKind, SimilarityJoinExec};
use super::filter::{FastMap, reserve};
use super::threshold::Threshold;

/// The router's bucket column (the hash repartition's key).
pub const BUCKET_COLUMN: &str = "__sets_bucket";
/// The router's token column: `rank * buckets + bucket`, sorted, one per distinct token.
pub const TOKENS_COLUMN: &str = "__sets_tokens";

/// The largest bucket count (a token is `rank * buckets + bucket` in a `u64`).
pub const MAX_BUCKETS: u32 = 1 << 16;

/// The token counts of `sides` (each: a plan and its token column), as one plan of schema
/// `(token, n)`: every list cast to `LargeList(element)`, unnested, counted in a partial and
/// a final aggregation (`EnsureRequirements` puts the hash repartition between them).
pub fn token_counts(
    sides: &[(Arc<dyn ExecutionPlan>, usize)],
    element: &DataType,
) -> Result<Arc<dyn ExecutionPlan>> {
    let list = DataType::LargeList(Arc::new(Field::new_list_field(element.clone(), true)));
    let mut lists = Vec::with_capacity(sides.len());
    for (plan, tokens) in sides {
        let schema = plan.schema();
        let Some(field) = schema.fields().get(*tokens) else {
            return plan_err!("PrefixRouteExec: token column {tokens} out of range for {schema}");
        };
        let column: Arc<dyn PhysicalExpr> = Arc::new(Column::new(field.name(), *tokens));
        let cast: Arc<dyn PhysicalExpr> = Arc::new(CastExpr::new(column, list.clone(), None));
        lists.push(Arc::new(ProjectionExec::try_new(
            vec![(cast, "token".to_string())],
            Arc::clone(plan),
        )?) as Arc<dyn ExecutionPlan>);
    }
    let lists = UnionExec::try_new(lists)?;
    let unnested_schema = Arc::new(Schema::new(vec![Field::new(
        "token",
        element.clone(),
        true,
    )]));
    let unnest = Arc::new(UnnestExec::new(
        lists,
        vec![ListUnnest {
            index_in_input_schema: 0,
            depth: 1,
        }],
        vec![],
        Arc::clone(&unnested_schema),
        UnnestOptions::new().with_preserve_nulls(false),
    )?);
    let token: Arc<dyn PhysicalExpr> = Arc::new(Column::new("token", 0));
    let group_by = PhysicalGroupBy::new_single(vec![(Arc::clone(&token), "token".to_string())]);
    let count = Arc::new(
        AggregateExprBuilder::new(count_udaf(), vec![token])
            .schema(Arc::clone(&unnested_schema))
            .alias("n")
            .build()?,
    );
    let partial = Arc::new(AggregateExec::try_new(
        AggregateMode::Partial,
        group_by.clone(),
        vec![Arc::clone(&count)],
        vec![None],
        unnest,
        Arc::clone(&unnested_schema),
    )?);
    Ok(Arc::new(AggregateExec::try_new(
        AggregateMode::FinalPartitioned,
        group_by.as_final(),
        vec![count],
        vec![None],
        partial,
        unnested_schema,
    )?))
}

/// Token value → global rank: the counted tokens sorted by `(count, value)`.
enum RankMap {
    /// Integer tokens, as `i64` (unsigned ones reinterpreted: distinct values stay distinct).
    Ints(FastMap<i64, u32>),
    /// Any other type, by its row encoding.
    Rows(RowConverter, FastMap<Box<[u8]>, u32>),
}

/// Integer `values` as `i64` keys (`None` for other types).
fn int_keys(values: &ArrayRef) -> Result<Option<Int64Array>> {
    let dt = values.data_type();
    if dt.is_signed_integer() {
        return Ok(Some(
            cast(values, &DataType::Int64)?
                .as_primitive::<Int64Type>()
                .clone(),
        ));
    }
    if dt.is_unsigned_integer() {
        let v = cast(values, &DataType::UInt64)?;
        let v = v.as_primitive::<UInt64Type>();
        return Ok(Some(v.unary(|x| x as i64)));
    }
    Ok(None)
}

struct Ranks {
    map: RankMap,
    _reservation: MemoryReservation,
}

impl Ranks {
    /// The ranks of the counts' batches (`token`, `n`).
    fn build(
        batches: &[RecordBatch],
        schema: &SchemaRef,
        reservation: MemoryReservation,
    ) -> Result<Self> {
        let counts = match batches.len() {
            0 => RecordBatch::new_empty(Arc::clone(schema)),
            _ => datafusion::arrow::compute::concat_batches(schema, batches)?,
        };
        let (tokens, n) = (counts.column(0), counts.column(1));
        let order = lexsort_to_indices(
            &[
                SortColumn {
                    values: Arc::clone(n),
                    options: None,
                },
                SortColumn {
                    values: Arc::clone(tokens),
                    options: None,
                },
            ],
            None,
        )?;
        let sorted = take(tokens, &order, None)?;
        let valid = sorted.len() - sorted.null_count();
        if valid > u32::MAX as usize {
            return exec_err!("similarity_join: more than 2^32 distinct tokens");
        }
        reserve(&reservation, valid * 24, "the token ranks")?;
        let mut rank = 0u32;
        let mut next = || {
            let r = rank;
            rank = rank.saturating_add(1);
            r
        };
        let map = match int_keys(&sorted)? {
            Some(keys) => {
                let mut map = FastMap::with_capacity_and_hasher(valid, Default::default());
                for k in keys.iter().flatten() {
                    map.insert(k, next());
                }
                RankMap::Ints(map)
            }
            None => {
                let converter =
                    RowConverter::new(vec![SortField::new(sorted.data_type().clone())])?;
                let rows = converter.convert_columns(&[Arc::clone(&sorted)])?;
                reserve(&reservation, rows.size(), "the token ranks")?;
                let mut map = FastMap::with_capacity_and_hasher(valid, Default::default());
                for (i, row) in rows.iter().enumerate() {
                    if sorted.is_valid(i) {
                        map.insert(row.as_ref().into(), next());
                    }
                }
                RankMap::Rows(converter, map)
            }
        };
        Ok(Self {
            map,
            _reservation: reservation,
        })
    }

    /// The rank of every value of `values` (`None` for NULL elements); an error for a token
    /// the counts did not see (the input changed between its two reads).
    fn of(&self, values: &ArrayRef) -> Result<Vec<Option<u32>>> {
        let missing = || {
            exec_err!(
                "similarity_join: a token of the input is missing from its token counts: the \
                 input changed between the two reads of a prefix-partitioned join"
            )
        };
        let mut out = Vec::with_capacity(values.len());
        match &self.map {
            RankMap::Ints(map) => {
                let Some(keys) = int_keys(values)? else {
                    return internal_err!(
                        "PrefixRouteExec: integer ranks for {}",
                        values.data_type()
                    );
                };
                for k in keys.iter() {
                    out.push(match k {
                        None => None,
                        Some(k) => match map.get(&k) {
                            Some(&r) => Some(r),
                            None => return missing(),
                        },
                    });
                }
            }
            RankMap::Rows(converter, map) => {
                let rows = converter.convert_columns(&[Arc::clone(values)])?;
                for (i, row) in rows.iter().enumerate() {
                    out.push(match values.is_valid(i) {
                        false => None,
                        true => match map.get(row.as_ref()) {
                            Some(&r) => Some(r),
                            None => return missing(),
                        },
                    });
                }
            }
        }
        Ok(out)
    }
}

/// Sends each set of its input to the buckets of its probe prefix (see the module docs).
/// Output: the `keep` columns of the input, then [`BUCKET_COLUMN`] (`UInt32`) and
/// [`TOKENS_COLUMN`] (`List(UInt64)`), one row per (set, bucket); NULL and empty lists, and
/// sets no set can pass with, are dropped.
#[derive(Debug)]
pub struct PrefixRouteExec {
    pub(crate) input: Arc<dyn ExecutionPlan>,
    /// The token counts, `(token, n)`, of both sides of the join.
    pub(crate) counts: Arc<dyn ExecutionPlan>,
    pub(crate) keep: Vec<usize>,
    pub(crate) tokens: usize,
    pub(crate) threshold: Threshold,
    pub(crate) buckets: u32,
    /// The list type the token column is read as (`LargeList` of the counted type).
    list_type: DataType,
    schema: SchemaRef,
    /// The ranks, read once per plan instance from the counts' one partition.
    ranks: Arc<OnceCell<Arc<Ranks>>>,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl fmt::Debug for Ranks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Ranks").finish_non_exhaustive()
    }
}

impl PrefixRouteExec {
    /// A router of `input`'s column `tokens`, keeping the columns `keep`, with the ranks of
    /// `counts` (a plan of schema `(token, n)`, as [`token_counts`] makes).
    pub fn try_new(
        input: Arc<dyn ExecutionPlan>,
        counts: Arc<dyn ExecutionPlan>,
        keep: Vec<usize>,
        tokens: usize,
        threshold: Threshold,
        buckets: u32,
    ) -> Result<Self> {
        if buckets == 0 || buckets > MAX_BUCKETS {
            return plan_err!("PrefixRouteExec: {buckets} buckets, expected 1 to {MAX_BUCKETS}");
        }
        let in_schema = input.schema();
        let counts_schema = counts.schema();
        if counts_schema.fields().len() != 2 || !counts_schema.field(1).data_type().is_integer() {
            return plan_err!(
                "PrefixRouteExec: the counts must be (token, n), got {counts_schema}"
            );
        }
        let element = counts_schema.field(0).data_type().clone();
        let Some(token_field) = in_schema.fields().get(tokens) else {
            return plan_err!(
                "PrefixRouteExec: token column {tokens} out of range for {in_schema}"
            );
        };
        let list_type = DataType::LargeList(Arc::new(Field::new_list_field(element, true)));
        if !datafusion::arrow::compute::can_cast_types(token_field.data_type(), &list_type) {
            return plan_err!(
                "PrefixRouteExec: the token column is {}, not castable to {list_type}",
                token_field.data_type()
            );
        }
        let mut fields = Vec::with_capacity(keep.len() + 2);
        for &i in &keep {
            match in_schema.fields().get(i) {
                Some(f) => fields.push(Arc::clone(f)),
                None => {
                    return plan_err!("PrefixRouteExec: column {i} out of range for {in_schema}");
                }
            }
        }
        fields.push(Arc::new(Field::new(BUCKET_COLUMN, DataType::UInt32, false)));
        fields.push(Arc::new(Field::new(
            TOKENS_COLUMN,
            DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, false))),
            false,
        )));
        let schema = Arc::new(Schema::new(fields));
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(input.output_partitioning().partition_count()),
            EmissionType::Incremental,
            Boundedness::Bounded,
        ));
        Ok(Self {
            input,
            counts,
            keep,
            tokens,
            threshold,
            buckets,
            list_type,
            schema,
            ranks: Arc::new(OnceCell::new()),
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// The token column's index in the output.
    pub fn tokens_column(&self) -> usize {
        self.keep.len() + 1
    }
}

/// What routing a batch needs besides the ranks.
#[derive(Debug, Clone)]
struct Routing {
    keep: Vec<usize>,
    tokens: usize,
    list_type: DataType,
    threshold: Threshold,
    buckets: u32,
    schema: SchemaRef,
}

/// Route one batch.
fn route(batch: &RecordBatch, ranks: &Ranks, routing: &Routing) -> Result<RecordBatch> {
    let Routing {
        keep,
        tokens,
        list_type,
        threshold,
        buckets,
        schema,
    } = routing;
    let (tokens, buckets) = (*tokens, *buckets);
    let lists = cast(batch.column(tokens), list_type)?;
    let lists = lists.as_list::<i64>();
    let offsets = lists.value_offsets();
    let first = offsets[0] as usize;
    let last = offsets[lists.len()] as usize;
    let values = lists.values().slice(first, last - first);
    let value_ranks = ranks.of(&values)?;
    let mut rows = UInt32Builder::new();
    let mut bucket_of = UInt32Builder::new();
    let mut out_offsets = vec![0i32];
    let mut out_tokens: Vec<u64> = Vec::new();
    let mut set: Vec<u32> = Vec::new();
    let mut picked: Vec<u32> = Vec::new();
    let b = u64::from(buckets);
    for i in 0..lists.len() {
        if lists.is_null(i) {
            continue;
        }
        let (from, to) = (offsets[i] as usize - first, offsets[i + 1] as usize - first);
        set.clear();
        set.extend(value_ranks[from..to].iter().flatten());
        set.sort_unstable();
        set.dedup();
        let Some(prefix) = threshold.prefix_len(set.len() as u64) else {
            continue;
        };
        picked.clear();
        picked.extend(set[..prefix as usize].iter().map(|r| r % buckets));
        picked.sort_unstable();
        picked.dedup();
        for &bucket in &picked {
            rows.append_value(i as u32);
            bucket_of.append_value(bucket);
            out_tokens.extend(set.iter().map(|&r| u64::from(r) * b + u64::from(bucket)));
            let end = i32::try_from(out_tokens.len()).map_err(|_| {
                datafusion::common::DataFusionError::Execution(
                    "similarity_join: a routed batch holds more than 2^31 tokens".into(),
                )
            })?;
            out_offsets.push(end);
        }
    }
    let rows = rows.finish();
    let mut columns: Vec<ArrayRef> = Vec::with_capacity(keep.len() + 2);
    for &k in keep {
        columns.push(take(batch.column(k), &rows, None)?);
    }
    columns.push(Arc::new(bucket_of.finish()));
    columns.push(Arc::new(ListArray::try_new(
        Arc::new(Field::new_list_field(DataType::UInt64, false)),
        OffsetBuffer::new(out_offsets.into()),
        Arc::new(UInt64Array::from(out_tokens)),
        None,
    )?));
    Ok(RecordBatch::try_new(Arc::clone(schema), columns)?)
}

/// Reads the counts' one partition and ranks them.
async fn load_ranks(
    counts: Arc<dyn ExecutionPlan>,
    context: Arc<TaskContext>,
) -> Result<Arc<Ranks>> {
    let reservation = MemoryConsumer::new("PrefixRouteExec[ranks]").register(context.memory_pool());
    let parts = counts.output_partitioning().partition_count();
    if parts != 1 {
        return internal_err!(
            "PrefixRouteExec: the token counts come in {parts} partitions, not 1"
        );
    }
    let mut batches = Vec::new();
    let mut stream = counts.execute(0, context)?;
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        reserve(
            &reservation,
            batch.get_array_memory_size(),
            "the token counts",
        )?;
        batches.push(batch);
    }
    Ok(Arc::new(Ranks::build(
        &batches,
        &counts.schema(),
        reservation,
    )?))
}

impl DisplayAs for PrefixRouteExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let tokens = self.input.schema().field(self.tokens).name().clone();
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => write!(
                f,
                "PrefixRouteExec: tokens={tokens}@{}, threshold={}, buckets={}",
                self.tokens, self.threshold, self.buckets
            ),
            DisplayFormatType::TreeRender => {
                writeln!(f, "tokens={tokens}")?;
                write!(f, "buckets={}", self.buckets)
            }
        }
    }
}

impl ExecutionPlan for PrefixRouteExec {
    fn name(&self) -> &str {
        "PrefixRouteExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input, &self.counts]
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        vec![
            Distribution::UnspecifiedDistribution,
            Distribution::SinglePartition,
        ]
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        vec![true, false]
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input, counts] = <[_; 2]>::try_from(children).map_err(|c| {
            datafusion::common::DataFusionError::Internal(format!(
                "PrefixRouteExec: expected 2 children, got {}",
                c.len()
            ))
        })?;
        Ok(Arc::new(Self::try_new(
            input,
            counts,
            self.keep.clone(),
            self.tokens,
            self.threshold,
            self.buckets,
        )?))
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, Arc::clone(&context))?;
        let cell = Arc::clone(&self.ranks);
        let counts = Arc::clone(&self.counts);
        let routing = Arc::new(Routing {
            keep: self.keep.clone(),
            tokens: self.tokens,
            list_type: self.list_type.clone(),
            threshold: self.threshold,
            buckets: self.buckets,
            schema: Arc::clone(&self.schema),
        });
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let sets_in = MetricBuilder::new(&self.metrics).counter("input_rows", partition);
        let ctx = Arc::clone(&context);
        let out_schema = Arc::clone(&self.schema);
        let stream = futures::stream::once(async move {
            let ranks = cell
                .get_or_try_init(|| load_ranks(counts, ctx))
                .await
                .map(Arc::clone)?;
            Ok::<_, datafusion::common::DataFusionError>(input.and_then(move |batch| {
                let (ranks, routing) = (Arc::clone(&ranks), Arc::clone(&routing));
                let baseline = baseline.clone();
                let sets_in = sets_in.clone();
                async move {
                    let _timer = baseline.elapsed_compute().timer();
                    sets_in.add(batch.num_rows());
                    let out = route(&batch, &ranks, &routing)?;
                    baseline.output_rows().add(out.num_rows());
                    Ok(out)
                }
            }))
        })
        .try_flatten();
        Ok(Box::pin(RecordBatchStreamAdapter::new(out_schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// The element type of a list type.
pub(crate) fn element_type(list: &DataType) -> Option<DataType> {
    match list {
        DataType::List(f) | DataType::LargeList(f) | DataType::FixedSizeList(f, _) => {
            Some(f.data_type().clone())
        }
        _ => None,
    }
}

/// `join` (one shared build) spread over partitions by prefix routing with `buckets`
/// buckets: both inputs routed with one token count, the output the same.
pub fn prefix_partitioned(join: &SimilarityJoinExec, buckets: u32) -> Result<SimilarityJoinExec> {
    let Some(element) = element_type(&join.token_type) else {
        return internal_err!("SimilarityJoinExec: token type {}", join.token_type);
    };
    let inputs = join.inputs();
    let sides: Vec<_> = inputs
        .iter()
        .map(|i| (Arc::clone(&i.plan), i.tokens))
        .collect();
    let counts = token_counts(&sides, &element)?;
    let keeps = join.gathered();
    let mut routed = Vec::with_capacity(inputs.len());
    for (input, keep) in inputs.iter().zip(&keeps) {
        let router = PrefixRouteExec::try_new(
            Arc::clone(&input.plan),
            Arc::clone(&counts),
            keep.clone(),
            input.tokens,
            join.threshold,
            buckets,
        )?;
        let at = |i: usize| keep.iter().position(|&k| k == i);
        routed.push(JoinInput {
            id: input.id.and_then(at),
            tokens: router.tokens_column(),
            plan: Arc::new(router),
        });
    }
    let moved = |i: usize, keep: &[usize]| match keep.iter().position(|&k| k == i) {
        Some(p) => Ok(p),
        None => internal_err!("SimilarityJoinExec: output column {i} was not routed"),
    };
    let last = keeps.len() - 1;
    let columns = join
        .columns
        .iter()
        .map(|c| {
            Ok(match c {
                JoinColumn::Left(i) => JoinColumn::Left(moved(*i, &keeps[0])?),
                JoinColumn::Right(i) => JoinColumn::Right(moved(*i, &keeps[last])?),
                JoinColumn::Similarity => JoinColumn::Similarity,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    let mut routed = routed.into_iter();
    let left = routed.next().expect("a left input");
    spread(
        join,
        left,
        routed.next(),
        columns,
        JoinDistribution::Prefix { buckets },
    )
}

/// An R-S `join` spread over the partitions of its larger side (`right_is_small`: the
/// right side is the one every partition reads whole, and the sides are swapped).
pub fn broadcast(join: &SimilarityJoinExec, right_is_small: bool) -> Result<SimilarityJoinExec> {
    let Some(right) = &join.right else {
        return plan_err!("SimilarityJoinExec: a self-join cannot broadcast a side");
    };
    let (left, right, columns) = match right_is_small {
        false => (join.left.clone(), right.clone(), join.columns.clone()),
        true => (right.clone(), join.left.clone(), swapped(&join.columns)),
    };
    spread(
        join,
        left,
        Some(right),
        columns,
        JoinDistribution::Broadcast,
    )
}

/// `columns` with the sides exchanged.
fn swapped(columns: &[JoinColumn]) -> Vec<JoinColumn> {
    columns
        .iter()
        .map(|c| match c {
            JoinColumn::Left(i) => JoinColumn::Right(*i),
            JoinColumn::Right(i) => JoinColumn::Left(*i),
            JoinColumn::Similarity => JoinColumn::Similarity,
        })
        .collect()
}

/// `join` (its threshold, schema, partitions and backend) over new inputs and output
/// columns, spread as `distribution`.
fn spread(
    join: &SimilarityJoinExec,
    left: JoinInput,
    right: Option<JoinInput>,
    columns: Vec<JoinColumn>,
    distribution: JoinDistribution,
) -> Result<SimilarityJoinExec> {
    SimilarityJoinExec::new_inner(
        left,
        right,
        join.threshold,
        columns,
        // The columns are named: they moved (a decoded ids form would derive them again).
        OutputKind::Rows,
        Arc::clone(&join.schema),
        join.partitions,
    )?
    .with_backend(join.backend)
    .with_distribution(distribution)
}

/// A self-`join` spread as [`JoinDistribution::Replicated`]: the input, whole, joined with
/// its partitions; the output columns swap sides (a pair's smaller id is the right row's).
pub fn replicated(join: &SimilarityJoinExec) -> Result<SimilarityJoinExec> {
    if join.right.is_some() {
        return plan_err!("SimilarityJoinExec: only a self-join is replicated");
    }
    spread(
        join,
        join.left.clone(),
        Some(join.left.clone()),
        swapped(&join.columns),
        JoinDistribution::Replicated,
    )
}

/// Whether routed token `token` (`rank * buckets + bucket`) is of its copy's own bucket: its
/// rank belongs to the bucket the copy was sent to (`rank mod buckets == bucket`).
#[inline]
pub(crate) fn in_own_bucket(token: u64, buckets: u32) -> bool {
    let b = u64::from(buckets.max(1));
    (token / b) % b == token % b
}

/// Whether this bucket owns the pair of routed sets `x` and `y` (tokens ascending, distinct,
/// in the routed order; see the module docs): their smallest common token within both probe
/// prefixes, which a passing pair has, is of the copy's own bucket (`own`). The same test on
/// the router's tokens (`own`: [`in_own_bucket`]) and on a routed build's ranks
/// (`Collections::home`).
#[inline]
pub(crate) fn owns<T: Ord + Copy>(
    x: &[T],
    y: &[T],
    threshold: &Threshold,
    own: impl Fn(T) -> bool,
) -> bool {
    let prefix = |s: &[T]| threshold.prefix_len(s.len() as u64).unwrap_or(0) as usize;
    let (x, y) = (&x[..prefix(x).min(x.len())], &y[..prefix(y).min(y.len())]);
    let (mut i, mut j) = (0, 0);
    while i < x.len() && j < y.len() {
        match x[i].cmp(&y[j]) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return own(x[i]),
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intersect::similarity::Measure;
    use crate::join::Comparison;
    use datafusion::arrow::array::{Int32Array, StringArray};

    fn ranks_of(tokens: ArrayRef, counts: Vec<i64>) -> Ranks {
        let schema = Arc::new(Schema::new(vec![
            Field::new("token", tokens.data_type().clone(), true),
            Field::new("n", DataType::Int64, false),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&schema),
            vec![tokens, Arc::new(Int64Array::from(counts))],
        )
        .unwrap();
        let pool = Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default())
            as Arc<dyn datafusion::execution::memory_pool::MemoryPool>;
        Ranks::build(&[batch], &schema, MemoryConsumer::new("t").register(&pool)).unwrap()
    }

    /// Ranks go by count, then by value; strings and integers alike; NULL elements have none;
    /// a token that was not counted is an error, not a guess.
    #[test]
    fn ranks_by_count_then_value() {
        let ints = ranks_of(
            Arc::new(Int32Array::from(vec![7, 3, 5, 1])),
            vec![2, 2, 1, 9],
        );
        let probe: ArrayRef = Arc::new(Int32Array::from(vec![
            Some(1),
            None,
            Some(5),
            Some(3),
            Some(7),
        ]));
        assert_eq!(
            ints.of(&probe).unwrap(),
            vec![Some(3), None, Some(0), Some(1), Some(2)]
        );
        let missing: ArrayRef = Arc::new(Int32Array::from(vec![4]));
        assert!(
            ints.of(&missing)
                .unwrap_err()
                .to_string()
                .contains("changed")
        );
        let strings = ranks_of(
            Arc::new(StringArray::from(vec![Some("b"), Some("a"), None])),
            vec![1, 1, 4],
        );
        let probe: ArrayRef = Arc::new(StringArray::from(vec!["b", "a"]));
        assert_eq!(strings.of(&probe).unwrap(), vec![Some(1), Some(0)]);
    }

    /// The router's output for an `Int32` id column kept.
    fn routed_schema() -> SchemaRef {
        Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new(BUCKET_COLUMN, DataType::UInt32, false),
            Field::new(
                TOKENS_COLUMN,
                DataType::List(Arc::new(Field::new_list_field(DataType::UInt64, false))),
                false,
            ),
        ]))
    }

    /// Routing by hand: each set once per distinct bucket of its prefix, tokens shifted into
    /// the bucket, NULL and empty lists dropped; and exactly one bucket owns a passing pair.
    #[test]
    fn routes_and_owns() {
        let ranks = ranks_of(
            Arc::new(Int32Array::from((0..10).collect::<Vec<_>>())),
            vec![1; 10],
        );
        let threshold = Threshold::try_new(Measure::Jaccard, 0.5, Comparison::GtEq, "t").unwrap();
        let lists =
            ListArray::from_iter_primitive::<datafusion::arrow::datatypes::Int32Type, _, _>(vec![
                Some(vec![Some(0), Some(1), Some(2), Some(3)]),
                None,
                Some(vec![]),
                Some(vec![Some(1), Some(2), Some(3), Some(4), Some(1), None]),
            ]);
        let input_schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("t", lists.data_type().clone(), true),
        ]));
        let batch = RecordBatch::try_new(
            Arc::clone(&input_schema),
            vec![
                Arc::new(Int32Array::from(vec![10, 11, 12, 13])),
                Arc::new(lists),
            ],
        )
        .unwrap();
        let list_type = DataType::LargeList(Arc::new(Field::new_list_field(DataType::Int32, true)));
        let schema = routed_schema();
        let routing = Routing {
            keep: vec![0],
            tokens: 1,
            list_type,
            threshold,
            buckets: 2,
            schema,
        };
        let out = route(&batch, &ranks, &routing).unwrap();
        // Sets of 4: prefix of 3 ranks (J >= 0.5 needs 2 of 4 shared with a set of 2).
        assert_eq!(threshold.prefix_len(4), Some(3));
        let ids = out
            .column(0)
            .as_primitive::<datafusion::arrow::datatypes::Int32Type>();
        let buckets = out
            .column(1)
            .as_primitive::<datafusion::arrow::datatypes::UInt32Type>();
        assert_eq!(ids.values().to_vec(), vec![10, 10, 13, 13]);
        assert_eq!(buckets.values().to_vec(), vec![0, 1, 0, 1]);
        let tokens = out.column(2).as_list::<i32>();
        let row = |i: usize| {
            tokens
                .value(i)
                .as_primitive::<UInt64Type>()
                .values()
                .to_vec()
        };
        assert_eq!(row(0), vec![0, 2, 4, 6]);
        assert_eq!(row(1), vec![1, 3, 5, 7]);
        assert_eq!(row(3), vec![3, 5, 7, 9]);
        // {0,1,2,3} and {1,2,3,4} share 3 of 5 (J = 0.6): smallest common rank 1, bucket 1.
        let owner =
            |a: usize, b: usize| owns(&row(a), &row(b), &threshold, |v| in_own_bucket(v, 2));
        assert!(!owner(0, 2));
        assert!(owner(1, 3));
    }

    /// The prefix-partitioned join by hand on random sets: routed to `buckets` buckets, each
    /// bucket built in the routed order and probed from its own-bucket tokens only, the pairs
    /// its bucket owns kept. Every pair that passes comes out exactly once, with its overlap,
    /// as a nested loop finds them (thresholds reached exactly by many pairs included).
    #[test]
    fn routed_buckets_find_every_pair_once() {
        use crate::backend::cpu::{BoundedKernel, CpuKernelChoice};
        use crate::join::build::{TokenOrder, build_on_threads};
        use crate::join::filter::{Scratch, verify_candidate};
        use datafusion::arrow::array::BooleanArray;
        use datafusion::arrow::compute::filter_record_batch;
        use datafusion::arrow::datatypes::{Int32Type, UInt32Type};
        use std::collections::BTreeMap;

        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |n: u64| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state % n
        };
        // Skewed token values (small ones frequent), repeated elements, and copies and
        // near-copies of earlier sets so that many pairs pass, some exactly at the threshold.
        let mut sets: Vec<Vec<i32>> = Vec::new();
        for i in 0..600 {
            let set = if i > 0 && next(4) == 0 {
                let mut s = sets[next(i as u64) as usize].clone();
                if next(2) == 0 {
                    s.push((next(60) * next(60) / 60) as i32);
                }
                s
            } else {
                (0..1 + next(14))
                    .map(|_| (next(60) * next(60) / 60) as i32)
                    .collect()
            };
            sets.push(set);
        }
        let distinct = |s: &[i32]| {
            let mut d = s.to_vec();
            d.sort_unstable();
            d.dedup();
            d
        };
        let mut counts: BTreeMap<i32, i64> = BTreeMap::new();
        for s in &sets {
            for v in distinct(s) {
                *counts.entry(v).or_default() += 1;
            }
        }
        let ranks = ranks_of(
            Arc::new(Int32Array::from(counts.keys().copied().collect::<Vec<_>>())),
            counts.values().copied().collect(),
        );
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
            sets.iter()
                .map(|s| Some(s.iter().map(|&v| Some(v)).collect::<Vec<_>>())),
        );
        let input_schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new("t", lists.data_type().clone(), true),
        ]));
        let ids: Vec<i32> = (0..sets.len() as i32).collect();
        let batch = RecordBatch::try_new(
            input_schema,
            vec![Arc::new(Int32Array::from(ids)), Arc::new(lists)],
        )
        .unwrap();
        let schema = routed_schema();
        let kernel = BoundedKernel::resolve(CpuKernelChoice::Auto);
        let pool = Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default())
            as Arc<dyn datafusion::execution::memory_pool::MemoryPool>;
        for (t, buckets) in [(0.5, 1u32), (0.5, 3), (0.6, 4), (0.75, 7), (0.34, 2)] {
            let threshold = Threshold::try_new(Measure::Jaccard, t, Comparison::GtEq, "t").unwrap();
            let mut want = BTreeMap::new();
            for i in 0..sets.len() {
                for j in i + 1..sets.len() {
                    let (x, y) = (distinct(&sets[i]), distinct(&sets[j]));
                    let o = x.iter().filter(|v| y.binary_search(v).is_ok()).count();
                    if o as f64 / (x.len() + y.len() - o) as f64 >= t {
                        want.insert((i as i32, j as i32), o as u64);
                    }
                }
            }
            let routing = Routing {
                keep: vec![0],
                tokens: 1,
                list_type: DataType::LargeList(Arc::new(Field::new_list_field(
                    DataType::Int32,
                    true,
                ))),
                threshold,
                buckets,
                schema: Arc::clone(&schema),
            };
            let routed = route(&batch, &ranks, &routing).unwrap();
            let mut got = BTreeMap::new();
            let mut candidates = 0;
            for b in 0..buckets {
                let of_bucket = routed.column(1).as_primitive::<UInt32Type>();
                let keep: BooleanArray = of_bucket.iter().map(|x| Some(x == Some(b))).collect();
                let part = filter_record_batch(&routed, &keep).unwrap();
                let tokens = Arc::clone(part.column(2));
                let reservation = MemoryConsumer::new("t").register(&pool);
                // Built on one thread, and the same on three (a leader and two helpers).
                let build = |threads: usize| {
                    build_on_threads(
                        &[vec![Arc::clone(&tokens)]],
                        vec![None],
                        TokenOrder::Routed { buckets },
                        &threshold,
                        &reservation,
                        threads,
                    )
                    .unwrap()
                };
                let coll = build(1);
                assert!(coll.routed());
                assert!(build(3) == coll, "J >= {t}, bucket {b}: 3 threads differ");
                // The owner test on the router's tokens, as the build's ranks give it.
                let routed = tokens.as_list::<i32>();
                let routed = |r: u32| {
                    let v = routed.value(r as usize);
                    v.as_primitive::<UInt64Type>().values().to_vec()
                };
                let part_ids = part.column(0).as_primitive::<Int32Type>();
                let mut scratch = Scratch::new(coll.len());
                for p in 0..coll.len() {
                    coll.filter(p, &threshold, &mut scratch);
                    candidates += scratch.candidates.len();
                    for c in scratch.candidates.clone() {
                        let (x, y) = (coll.set(p), coll.set(c.set as usize));
                        let Some(o) = verify_candidate::<true>(kernel, x, y, &c) else {
                            continue;
                        };
                        let (l, r) = (coll.row(p), coll.row(c.set as usize));
                        let by_tokens = owns(&routed(l), &routed(r), &threshold, |v| {
                            in_own_bucket(v, buckets)
                        });
                        assert_eq!(coll.owns(p, c.set as usize, &threshold), by_tokens);
                        if by_tokens {
                            let (a, b) = (part_ids.value(l as usize), part_ids.value(r as usize));
                            let pair = (a.min(b), a.max(b));
                            assert!(got.insert(pair, o).is_none(), "{pair:?} twice");
                        }
                    }
                }
            }
            assert!(want.len() > 100, "{t}: only {} pairs", want.len());
            assert_eq!(
                got, want,
                "J >= {t}, {buckets} buckets, {candidates} candidates"
            );
        }
    }
}
