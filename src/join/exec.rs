//! `SimilarityJoinExec`: the exact set similarity join as a physical operator.
//!
//! Inputs: a left plan and, for an R-S join, a right plan, each with a token-list column
//! (lists of integers of any width or of strings; `List`, `LargeList` or `FixedSizeList`;
//! strings are given dense ids as they are read, `crate::intersect::strings`) and, where needed,
//! an id column. The join finds every pair whose similarity passes the [`Threshold`]:
//! - R-S join: every pair `(r, s)`, `r` from the left input, `s` from the right one;
//! - self-join: every pair of distinct rows `x`, `y` of the one input with
//!   `id(x) < id(y)` (as `r.id < s.id` in SQL: rows with a NULL id or an equal id are not
//!   paired), left = the smaller id.
//!
//! A NULL or empty token list never joins. The similarity is exactly
//! `jaccard(l.tokens, r.tokens)` (etc.) as the SQL function computes it.
//!
//! Output: one row per pair, in any order, whose columns are a list of [`JoinColumn`]s:
//! any column of the left row, any column of the right row (gathered with `take` from the
//! buffered inputs) and the similarity. The table function asks for
//! `(left_id, right_id, similarity)` ([`SimilarityJoinExec::try_new`]); the SQL rewrite
//! (`super::rewrite`) for the columns of the nested-loop join it replaces
//! ([`SimilarityJoinExec::try_with_columns`]).
//!
//! Execution: the first partition stream to be polled reads both inputs (all their
//! partitions, a task each), keeps the columns the output needs and builds the shared
//! `Collections` (reordered sets and prefix indexes, memory reserved in the task's pool; the
//! read tasks build it together, `super::crew`); then the output partitions claim ranges of
//! the global positions to probe (`super::stream`). So do the broadcast and replicated
//! spreads, over the plan instance's part of the right input; a prefix-partitioned join's
//! output partition builds from its own input partitions alone. With no output
//! column (`SELECT count(*)`) no pair is built: verification stops once the required
//! overlap is reached and the stream emits batches without columns.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, DynComparator, make_comparator, new_empty_array,
};
use datafusion::arrow::compute::{SortOptions, cast};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err, plan_err};
use datafusion::execution::memory_pool::MemoryReservation;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::coop::cooperative;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricBuilder, MetricsSet};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, Distribution, ExecutionPlan, ExecutionPlanProperties,
    Partitioning, PlanProperties,
};
use tokio::sync::OnceCell;

use super::filter::Collections;
use super::read::{PairRule, PairRuleKind};
use super::read::{Partial, build_collections};
use super::stream::{BuildFuture, ProbeClaims, SimilarityJoinStream};
use super::threshold::Threshold;
use crate::config::BackendChoice;
use crate::intersect::similarity::{Measure, coerce_pair};
use crate::io::time_slice::time_sliced;

/// One input of the join: a plan, its token column and (optionally) its id column.
#[derive(Clone, Debug)]
pub struct JoinInput {
    /// The input plan.
    pub plan: Arc<dyn ExecutionPlan>,
    /// Index of the id column in the plan's schema: orients the pairs of a self-join, and is
    /// the `left_id` / `right_id` column of [`SimilarityJoinExec::try_new`]. Only a self-join
    /// requires one.
    pub id: Option<usize>,
    /// Index of the token-list column in the plan's schema.
    pub tokens: usize,
}

impl JoinInput {
    /// A new input with an id column.
    pub fn new(plan: Arc<dyn ExecutionPlan>, id: usize, tokens: usize) -> Self {
        Self {
            plan,
            id: Some(id),
            tokens,
        }
    }

    /// A new input without an id column (R-S joins whose output names columns itself).
    pub fn without_id(plan: Arc<dyn ExecutionPlan>, tokens: usize) -> Self {
        Self {
            plan,
            id: None,
            tokens,
        }
    }

    fn field(&self, i: usize, what: &str) -> Result<Field> {
        let schema = self.plan.schema();
        match schema.fields().get(i) {
            Some(f) => Ok(f.as_ref().clone()),
            None => {
                plan_err!("SimilarityJoinExec: {what} column index {i} out of range for {schema}")
            }
        }
    }

    fn id_field(&self) -> Result<Field> {
        match self.id {
            Some(i) => self.field(i, "id"),
            None => plan_err!("SimilarityJoinExec: this input has no id column"),
        }
    }
}

/// What one output column of the join holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum JoinColumn {
    /// Column `i` of the pair's left row (of the row with the smaller id in a self-join).
    Left(usize),
    /// Column `i` of the pair's right row (of the row with the larger id in a self-join,
    /// read from the one input).
    Right(usize),
    /// The pair's similarity (the measure's SQL result type).
    Similarity,
}

/// The join's full output schema for the table function: `left_id`, `right_id` (the id
/// columns' types, nullable) and `similarity` (the measure's SQL result type).
pub fn output_schema(left_id: &DataType, right_id: &DataType, measure: Measure) -> Schema {
    Schema::new(vec![
        Field::new("left_id", left_id.clone(), true),
        Field::new("right_id", right_id.clone(), true),
        Field::new("similarity", measure.return_type(), false),
    ])
}

/// How a self-join orients a pair of sets: `(set with the smaller id, the other)`, or no
/// pair when either id is NULL or both are equal (as `r.id < s.id`). Indexed by set, not by
/// row, so a verified pair is oriented without looking up either set's row.
pub(crate) enum IdOrder {
    /// Integer ids as order-preserving `u64` keys, one per set in set order (a pair is
    /// oriented per verified candidate: millions of comparisons, where Arrow's comparator
    /// pays a dynamic call, null checks and two row lookups).
    Keys {
        keys: Vec<u64>,
        /// Per set: its id is NULL (absent when no id is).
        nulls: Option<Vec<bool>>,
    },
    /// Any other id type: Arrow's comparator over the rows of the sets.
    Dyn {
        ids: ArrayRef,
        rows: Vec<u32>,
        order: DynComparator,
    },
}

impl IdOrder {
    /// `ids`: the id of each input row; `rows[p]`: the row of set `p`.
    pub(crate) fn new(ids: ArrayRef, rows: &[u32]) -> Result<Self> {
        let dt = ids.data_type();
        let keys: Option<Vec<u64>> = if dt.is_signed_integer() {
            let v = cast(&ids, &DataType::Int64)?;
            let v = v.as_primitive::<Int64Type>().values();
            Some(
                rows.iter()
                    .map(|&r| (v[r as usize] as u64) ^ (1 << 63))
                    .collect(),
            )
        } else if dt.is_unsigned_integer() {
            let v = cast(&ids, &DataType::UInt64)?;
            let v = v.as_primitive::<UInt64Type>().values();
            Some(rows.iter().map(|&r| v[r as usize]).collect())
        } else {
            None
        };
        Ok(match keys {
            Some(keys) => IdOrder::Keys {
                keys,
                nulls: ids
                    .logical_nulls()
                    .filter(|n| n.null_count() > 0)
                    .map(|n| rows.iter().map(|&r| n.is_null(r as usize)).collect()),
            },
            None => {
                let order = make_comparator(ids.as_ref(), ids.as_ref(), SortOptions::default())?;
                IdOrder::Dyn {
                    ids,
                    rows: rows.to_vec(),
                    order,
                }
            }
        })
    }

    /// Whether [`IdOrder::orient`] pairs every two distinct sets (integer ids, none NULL, no
    /// two equal): then pairs can be counted without being oriented.
    pub(crate) fn pairs_every_two_sets(&self) -> bool {
        use rayon::slice::ParallelSliceMut;
        match self {
            IdOrder::Keys { keys, nulls: None } => {
                let mut sorted = keys.clone();
                sorted.par_sort_unstable();
                sorted.windows(2).all(|w| w[0] != w[1])
            }
            _ => false,
        }
    }

    /// `(p, q)` or `(q, p)`, the set of smaller id first; `None` when they are not paired.
    #[inline]
    pub(crate) fn orient(&self, p: u32, q: u32) -> Option<(u32, u32)> {
        let ordering = match self {
            IdOrder::Keys { keys, nulls } => {
                if let Some(n) = nulls
                    && (n[p as usize] || n[q as usize])
                {
                    return None;
                }
                keys[p as usize].cmp(&keys[q as usize])
            }
            IdOrder::Dyn { ids, rows, order } => {
                let (a, b) = (rows[p as usize] as usize, rows[q as usize] as usize);
                if ids.is_null(a) || ids.is_null(b) {
                    return None;
                }
                order(a, b)
            }
        };
        match ordering {
            std::cmp::Ordering::Less => Some((p, q)),
            std::cmp::Ordering::Greater => Some((q, p)),
            std::cmp::Ordering::Equal => None,
        }
    }
}

/// Everything the probes share, built once per execution.
pub(crate) struct Built {
    pub(crate) collections: Collections,
    /// The columns of each side (one side for a self-join) the output needs, batches
    /// concatenated; `None` where not needed.
    pub(crate) columns: Vec<Vec<Option<ArrayRef>>>,
    /// Self-join: orders ids to orient (and filter) pairs.
    pub(crate) id_order: Option<IdOrder>,
    /// A spread join: which verified pairs this partition emits.
    pub(crate) pair_rule: Option<PairRule>,
    /// Keeps the memory of `collections` and the columns accounted.
    pub(crate) _reservation: Arc<MemoryReservation>,
    /// The sets on the device, uploaded by the first partition that verifies on the GPU
    /// (an error: the GPU could not take them, every partition verifies on the CPU).
    pub(crate) device_sets: std::sync::OnceLock<
        std::result::Result<Arc<crate::join::gpu::DeviceSets>, crate::backend::gpu::GpuError>,
    >,
    /// The prefix indexes on the device beside the sets, uploaded by the first partition
    /// that joins on the GPU (an error: every partition filters on the CPU).
    pub(crate) device_join: std::sync::OnceLock<
        std::result::Result<Arc<crate::join::gpu::DeviceJoin>, crate::backend::gpu::GpuError>,
    >,
    /// [`IdOrder::pairs_every_two_sets`], found by the first partition that asks.
    pub(crate) every_pair_kept: std::sync::OnceLock<bool>,
    /// [`Collections::probe_work`], found by the first partition that asks.
    pub(crate) probe_work: std::sync::OnceLock<u64>,
}

impl Built {
    /// Column `i` of `side` (0 = left, 1 = right; a self-join reads side 0 for both).
    pub(crate) fn column(&self, side: usize, i: usize) -> Result<&ArrayRef> {
        let side = side.min(self.columns.len() - 1);
        match self.columns[side].get(i) {
            Some(Some(c)) => Ok(c),
            _ => internal_err!("SimilarityJoinExec: column {i} of side {side} was not gathered"),
        }
    }
}

/// How the output was asked for (only affects `EXPLAIN`).
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum OutputKind {
    /// `(left_id, right_id, similarity)`, projected.
    Ids { projection: Option<Vec<usize>> },
    /// Columns of the inputs' rows.
    Rows,
}

/// How the join spreads over its output partitions (and, in a distributed plan, its tasks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum JoinDistribution {
    /// One build over every partition of the inputs, shared by the output partitions, each
    /// probing its share of the sets (a plan of one task: it reads the whole input).
    #[default]
    Single,
    /// The inputs are routed by `super::route::PrefixRouteExec` and hash-partitioned on
    /// its bucket column: output partition `k` joins partition `k` of each input on its own,
    /// and keeps a pair only in the bucket that owns it (`super::route`).
    Prefix {
        /// The routers' bucket count.
        buckets: u32,
    },
    /// An R-S join whose left input comes whole (one partition) to every plan instance (a
    /// task), which reads it once with all its partitions of the right input into one build
    /// on all its threads; its output partitions share the probes of those right sets.
    Broadcast,
    /// A self-join run as [`JoinDistribution::Broadcast`] of the input with itself: a task
    /// joins the whole input (left) with its partitions of it (right). Only the right side's
    /// sets probe, the left side's index, and a pair of rows comes out of the task holding
    /// its later set (`Collections::id_ranks`), its row of smaller id on the right.
    Replicated,
}

impl fmt::Display for JoinDistribution {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Single => f.write_str("single"),
            Self::Prefix { buckets } => write!(f, "prefix(buckets={buckets})"),
            Self::Broadcast => f.write_str("broadcast"),
            Self::Replicated => f.write_str("replicated"),
        }
    }
}

/// The exact set similarity join (see the module docs).
#[derive(Debug)]
pub struct SimilarityJoinExec {
    pub(crate) left: JoinInput,
    pub(crate) right: Option<JoinInput>,
    pub(crate) threshold: Threshold,
    /// The list type both token columns are cast to.
    pub(crate) token_type: DataType,
    pub(crate) columns: Vec<JoinColumn>,
    pub(crate) kind: OutputKind,
    pub(crate) schema: SchemaRef,
    pub(crate) partitions: usize,
    /// Where candidates are verified (`sets.backend` when the plan was made).
    pub(crate) backend: BackendChoice,
    pub(crate) distribution: JoinDistribution,
    build: Arc<OnceCell<Arc<Built>>>,
    /// The partitions' claims of probe sets (shared, as the build is).
    claims: Arc<ProbeClaims>,
    metrics: ExecutionPlanMetricsSet,
    cache: Arc<PlanProperties>,
}

impl fmt::Debug for Built {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Built")
            .field("sets", &self.collections.len())
            .finish_non_exhaustive()
    }
}

impl SimilarityJoinExec {
    /// A join of `left` with `right` (`None`: a self-join of `left`), emitting the columns
    /// `projection` of `(left_id, right_id, similarity)` (all when `None`) over `partitions`
    /// output partitions. A self-join's input needs its id column; an R-S input needs its
    /// id column only when the projection keeps it (`left_id` for the left input, `right_id`
    /// for the right one), so that `count(*)` or `SELECT similarity` reads no ids.
    pub fn try_new(
        left: JoinInput,
        right: Option<JoinInput>,
        threshold: Threshold,
        projection: Option<Vec<usize>>,
        partitions: usize,
    ) -> Result<Self> {
        let kept = |i: usize| projection.as_ref().is_none_or(|p| p.contains(&i));
        // The type of an id column the projection drops does not matter: it is projected
        // away below.
        let id_type = |input: &JoinInput, i: usize| match input.id_field() {
            Ok(f) => Ok(f.data_type().clone()),
            Err(_) if right.is_some() && !kept(i) => Ok(DataType::Null),
            Err(e) => Err(e),
        };
        let left_id = id_type(&left, 0)?;
        let right_id = id_type(right.as_ref().unwrap_or(&left), 1)?;
        let full = output_schema(&left_id, &right_id, threshold.measure());
        let all = [
            JoinColumn::Left(left.id.unwrap_or_default()),
            JoinColumn::Right(right.as_ref().unwrap_or(&left).id.unwrap_or_default()),
            JoinColumn::Similarity,
        ];
        let (schema, columns) = match &projection {
            Some(p) => {
                let mut columns = Vec::with_capacity(p.len());
                for &i in p {
                    match all.get(i) {
                        Some(c) => columns.push(*c),
                        None => {
                            return plan_err!(
                                "SimilarityJoinExec: projection index {i} out of range"
                            );
                        }
                    }
                }
                (full.project(p)?, columns)
            }
            None => (full, all.to_vec()),
        };
        Self::new_inner(
            left,
            right,
            threshold,
            columns,
            OutputKind::Ids { projection },
            Arc::new(schema),
            partitions,
        )
    }

    /// A join of `left` with `right` (`None`: a self-join of `left`, which needs the left
    /// input's id column) emitting `columns`, named and typed by `schema` (whose field types
    /// must be those of the columns), over `partitions` output partitions.
    pub fn try_with_columns(
        left: JoinInput,
        right: Option<JoinInput>,
        threshold: Threshold,
        columns: Vec<JoinColumn>,
        schema: SchemaRef,
        partitions: usize,
    ) -> Result<Self> {
        Self::new_inner(
            left,
            right,
            threshold,
            columns,
            OutputKind::Rows,
            schema,
            partitions,
        )
    }

    pub(crate) fn new_inner(
        left: JoinInput,
        right: Option<JoinInput>,
        threshold: Threshold,
        columns: Vec<JoinColumn>,
        kind: OutputKind,
        schema: SchemaRef,
        partitions: usize,
    ) -> Result<Self> {
        let left_tokens = left.field(left.tokens, "tokens")?;
        let right_tokens = match &right {
            Some(r) => r.field(r.tokens, "tokens")?,
            None => left_tokens.clone(),
        };
        let coerced = coerce_pair(
            "similarity_join",
            &[
                left_tokens.data_type().clone(),
                right_tokens.data_type().clone(),
            ],
        )?;
        let token_type = coerced[0].clone();
        if token_type.is_null() {
            return plan_err!(
                "similarity_join: the token columns are NULL, not lists of integers or strings"
            );
        }
        if right.is_none() {
            // Self-joins orient pairs by id: the ids must be orderable.
            let left_id = left.id_field()?;
            let empty = new_empty_array(left_id.data_type());
            if let Err(e) = make_comparator(empty.as_ref(), empty.as_ref(), SortOptions::default())
            {
                return plan_err!(
                    "similarity_join: the id column {} ({}) cannot be ordered for a self-join: {e}",
                    left_id.name(),
                    left_id.data_type()
                );
            }
        }
        if columns.len() != schema.fields().len() {
            return plan_err!(
                "SimilarityJoinExec: {} output columns but {} schema fields",
                columns.len(),
                schema.fields().len()
            );
        }
        for (c, field) in columns.iter().zip(schema.fields()) {
            let source = match c {
                JoinColumn::Left(i) => left.field(*i, "output")?.data_type().clone(),
                JoinColumn::Right(i) => {
                    let input = right.as_ref().unwrap_or(&left);
                    input.field(*i, "output")?.data_type().clone()
                }
                JoinColumn::Similarity => threshold.measure().return_type(),
            };
            if &source != field.data_type() {
                return plan_err!(
                    "SimilarityJoinExec: output column {} is {source}, the schema says {}",
                    field.name(),
                    field.data_type()
                );
            }
        }
        let partitions = partitions.max(1);
        let cache = Arc::new(
            PlanProperties::new(
                EquivalenceProperties::new(Arc::clone(&schema)),
                Partitioning::UnknownPartitioning(partitions),
                EmissionType::Final,
                Boundedness::Bounded,
            )
            .with_scheduling_type(SchedulingType::Cooperative),
        );
        Ok(Self {
            left,
            right,
            threshold,
            token_type,
            columns,
            kind,
            schema,
            partitions,
            backend: BackendChoice::Auto,
            distribution: JoinDistribution::Single,
            build: Arc::new(OnceCell::new()),
            claims: Arc::new(ProbeClaims::new(partitions)),
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// This join run where `backend` says (`sets.backend`; the default is `auto`: see
    /// `placement::join_partition_on_gpu`).
    pub fn with_backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// This join spread as `distribution` over its inputs' partitions (its output has as
    /// many partitions as its right input for [`JoinDistribution::Broadcast`], as its left
    /// input for [`JoinDistribution::Prefix`], whose inputs must be routed:
    /// `super::route::PrefixRouteExec`).
    pub fn with_distribution(self, distribution: JoinDistribution) -> Result<Self> {
        let partitions = match distribution {
            JoinDistribution::Single => {
                return Ok(Self {
                    distribution,
                    ..self
                });
            }
            JoinDistribution::Broadcast => match &self.right {
                Some(r) => r.plan.output_partitioning().partition_count(),
                None => {
                    return plan_err!("SimilarityJoinExec: a self-join cannot broadcast a side");
                }
            },
            JoinDistribution::Replicated => match &self.right {
                Some(r) if r.id.is_some() && self.left.id.is_some() => {
                    r.plan.output_partitioning().partition_count()
                }
                _ => {
                    return plan_err!(
                        "SimilarityJoinExec: a replicated self-join needs both inputs, with ids"
                    );
                }
            },
            JoinDistribution::Prefix { buckets } => {
                for input in self.inputs() {
                    let schema = input.plan.schema();
                    if bucket_column(&schema).is_none()
                        || schema.field(input.tokens).name() != super::route::TOKENS_COLUMN
                    {
                        return plan_err!(
                            "SimilarityJoinExec: a prefix-partitioned join needs routed inputs (PrefixRouteExec), got {schema}"
                        );
                    }
                }
                if buckets == 0 || buckets > super::route::MAX_BUCKETS {
                    return plan_err!("SimilarityJoinExec: {buckets} buckets");
                }
                self.left.plan.output_partitioning().partition_count()
            }
        };
        let partitions = partitions.max(1);
        let cache = PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&self.schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        )
        .with_scheduling_type(SchedulingType::Cooperative);
        Ok(Self {
            distribution,
            partitions,
            claims: Arc::new(ProbeClaims::new(partitions)),
            cache: Arc::new(cache),
            ..self
        })
    }

    /// How the join spreads over partitions and tasks.
    pub fn distribution(&self) -> JoinDistribution {
        self.distribution
    }

    /// Where candidates are verified, as `EXPLAIN` shows it.
    fn backend_label(&self) -> String {
        let partitions = self.cache.output_partitioning().partition_count();
        crate::placement::join_verifier_label(self.backend, partitions)
    }

    /// The threshold.
    pub fn threshold(&self) -> &Threshold {
        &self.threshold
    }

    /// Whether this is a self-join.
    pub fn is_self_join(&self) -> bool {
        self.right.is_none()
    }

    /// The output projection of `(left_id, right_id, similarity)` (table function output).
    pub fn projection(&self) -> Option<&[usize]> {
        match &self.kind {
            OutputKind::Ids { projection } => projection.as_deref(),
            OutputKind::Rows => None,
        }
    }

    /// The output columns.
    pub fn columns(&self) -> &[JoinColumn] {
        &self.columns
    }

    pub(crate) fn inputs(&self) -> Vec<&JoinInput> {
        std::iter::once(&self.left)
            .chain(self.right.as_ref())
            .collect()
    }

    /// For each input, the columns to keep: the output's and, in a self-join, the id.
    pub(crate) fn gathered(&self) -> Vec<Vec<usize>> {
        let mut sides = vec![Vec::new(); 1 + usize::from(self.right.is_some())];
        let last = sides.len() - 1;
        for c in &self.columns {
            match c {
                JoinColumn::Left(i) => sides[0].push(*i),
                JoinColumn::Right(i) => sides[last].push(*i),
                JoinColumn::Similarity => {}
            }
        }
        if self.right.is_none()
            && let Some(id) = self.left.id
        {
            sides[0].push(id);
        }
        // A replicated join keeps its pairs by id (a prefix-partitioned one by the sets' own
        // tokens, in the build), and writes either side's row on either side of a pair: both
        // sides (one input) keep the same columns.
        if let JoinDistribution::Replicated = self.distribution {
            for (side, input) in sides.iter_mut().zip(self.inputs()) {
                side.extend(input.id);
            }
            let all: Vec<usize> = sides.concat();
            for side in &mut sides {
                side.clone_from(&all);
            }
        }
        for s in &mut sides {
            s.sort_unstable();
            s.dedup();
        }
        sides
    }
}

/// The index of a routed input's bucket column.
fn bucket_column(schema: &Schema) -> Option<usize> {
    schema.index_of(super::route::BUCKET_COLUMN).ok()
}

impl DisplayAs for SimilarityJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let col = |input: &JoinInput, i: usize| {
            let schema = input.plan.schema();
            schema
                .fields()
                .get(i)
                .map(|f| format!("{}@{i}", f.name()))
                .unwrap_or_else(|| format!("?@{i}"))
        };
        let side = |input: &JoinInput| match input.id {
            Some(id) => format!("({}, {})", col(input, id), col(input, input.tokens)),
            None => format!("({})", col(input, input.tokens)),
        };
        let mode = if self.is_self_join() { "self" } else { "r-s" };
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "SimilarityJoinExec: mode={mode}, function={}, threshold={} {}, left={}",
                    self.threshold.measure().name(),
                    self.threshold.comparison(),
                    self.threshold.value(),
                    side(&self.left),
                )?;
                if let Some(r) = &self.right {
                    write!(f, ", right={}", side(r))?;
                }
                match &self.kind {
                    OutputKind::Ids { projection } => {
                        if let Some(p) = projection.as_ref().filter(|p| **p != [0, 1, 2]) {
                            write!(f, ", projection={p:?}")?;
                        }
                    }
                    OutputKind::Rows => {
                        let right = self.right.as_ref().unwrap_or(&self.left);
                        let shown: Vec<String> = self
                            .columns
                            .iter()
                            .map(|c| match c {
                                JoinColumn::Left(i) => format!("L.{}", col(&self.left, *i)),
                                JoinColumn::Right(i) => format!("R.{}", col(right, *i)),
                                JoinColumn::Similarity => "similarity".to_string(),
                            })
                            .collect();
                        write!(f, ", output=[{}]", shown.join(", "))?;
                    }
                }
                if self.distribution != JoinDistribution::Single {
                    write!(f, ", distribution={}", self.distribution)?;
                }
                write!(f, ", backend={}", self.backend_label())
            }
            DisplayFormatType::TreeRender => {
                if self.distribution != JoinDistribution::Single {
                    writeln!(f, "distribution={}", self.distribution)?;
                }
                writeln!(f, "mode={mode}")?;
                writeln!(f, "function={}", self.threshold.measure().name())?;
                writeln!(
                    f,
                    "threshold={} {}",
                    self.threshold.comparison(),
                    self.threshold.value()
                )?;
                write!(f, "backend={}", self.backend_label())
            }
        }
    }
}

impl ExecutionPlan for SimilarityJoinExec {
    fn name(&self) -> &str {
        "SimilarityJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        self.inputs().into_iter().map(|i| &i.plan).collect()
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        match self.distribution {
            // Every input partition is read to the end by one task before probing starts.
            JoinDistribution::Single => vec![false; self.children().len()],
            JoinDistribution::Prefix { .. } => vec![true; self.children().len()],
            JoinDistribution::Broadcast | JoinDistribution::Replicated => vec![false, true],
        }
    }

    fn required_input_distribution(&self) -> Vec<Distribution> {
        match self.distribution {
            JoinDistribution::Single => {
                vec![Distribution::UnspecifiedDistribution; self.children().len()]
            }
            JoinDistribution::Prefix { .. } => self
                .inputs()
                .iter()
                .map(|input| {
                    let schema = input.plan.schema();
                    let i = bucket_column(&schema).unwrap_or_default();
                    let key: Arc<dyn PhysicalExpr> =
                        Arc::new(Column::new(schema.field(i).name(), i));
                    Distribution::KeyPartitioned(vec![key])
                })
                .collect(),
            JoinDistribution::Broadcast | JoinDistribution::Replicated => vec![
                Distribution::SinglePartition,
                Distribution::UnspecifiedDistribution,
            ],
        }
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
        let expected = 1 + usize::from(self.right.is_some());
        if children.len() != expected {
            return internal_err!(
                "SimilarityJoinExec: expected {expected} children, got {}",
                children.len()
            );
        }
        let mut children = children.into_iter();
        let left = JoinInput {
            plan: children
                .next()
                .unwrap_or_else(|| Arc::clone(&self.left.plan)),
            ..self.left.clone()
        };
        let right = self.right.as_ref().map(|r| JoinInput {
            plan: children.next().unwrap_or_else(|| Arc::clone(&r.plan)),
            ..r.clone()
        });
        Ok(Arc::new(
            Self::new_inner(
                left,
                right,
                self.threshold,
                self.columns.clone(),
                self.kind.clone(),
                Arc::clone(&self.schema),
                self.partitions,
            )?
            .with_backend(self.backend)
            .with_distribution(self.distribution)?,
        ))
    }

    /// A projection of plain columns folds into the output columns (so `count(*)` over the
    /// join, whose projection is empty, builds no pair).
    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        let mut picked = Vec::with_capacity(projection.expr().len());
        for e in projection.expr() {
            match e.expr.downcast_ref::<Column>() {
                Some(c) if c.index() < self.columns.len() => picked.push(c.index()),
                _ => return Ok(None),
            }
        }
        let columns = picked.iter().map(|&i| self.columns[i]).collect();
        let kind = match &self.kind {
            OutputKind::Ids { projection: p } => OutputKind::Ids {
                projection: Some(
                    picked
                        .iter()
                        .map(|&i| p.as_ref().map_or(i, |p| p[i]))
                        .collect(),
                ),
            },
            OutputKind::Rows => OutputKind::Rows,
        };
        match Self::new_inner(
            self.left.clone(),
            self.right.clone(),
            self.threshold,
            columns,
            kind,
            projection.schema(),
            self.partitions,
        )
        .and_then(|exec| {
            exec.with_backend(self.backend)
                .with_distribution(self.distribution)
        }) {
            Ok(exec) => Ok(Some(Arc::new(exec))),
            Err(_) => Ok(None),
        }
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        if partition >= self.partitions {
            return internal_err!(
                "SimilarityJoinExec: partition {partition} out of range (0..{})",
                self.partitions
            );
        }
        let build_time = MetricBuilder::new(&self.metrics).subset_time("build_time", partition);
        let inputs: Vec<JoinInput> = self.inputs().into_iter().cloned().collect();
        let gathered = self.gathered();
        let token_type = self.token_type.clone();
        let threshold = self.threshold;
        let ctx = Arc::clone(&context);
        // Which partition of each input this output partition reads (`None`: all of them,
        // for the build every partition of this plan instance shares). A broadcast or
        // replicated join's instance reads its left input (whole) once and every partition of
        // its right input (its task's part), builds once on all its threads, and its
        // partitions share the probes of the right side's sets.
        let reads = match self.distribution {
            JoinDistribution::Single
            | JoinDistribution::Broadcast
            | JoinDistribution::Replicated => None,
            JoinDistribution::Prefix { .. } => Some(vec![partition; inputs.len()]),
        };
        let rule = match self.distribution {
            JoinDistribution::Prefix { buckets } => Some(PairRuleKind::Owner { buckets }),
            JoinDistribution::Replicated => Some(PairRuleKind::Replicated),
            _ => None,
        };
        let (build, claims): (BuildFuture, _) = match reads {
            None => {
                let cell = Arc::clone(&self.build);
                // Only a one-task join reads its files whole: a task of a spread join holds
                // part of the right input's row groups, which its scan knows and a split
                // would not.
                let split_scan = self.distribution == JoinDistribution::Single;
                let build = Box::pin(async move {
                    let built = cell
                        .get_or_try_init(|| {
                            build_collections(
                                inputs,
                                gathered,
                                token_type,
                                threshold,
                                ctx,
                                build_time,
                                Partial {
                                    reads: None,
                                    rule,
                                    split_scan,
                                },
                            )
                        })
                        .await?;
                    Ok(Arc::clone(built))
                });
                (build, Arc::clone(&self.claims))
            }
            Some(reads) => {
                let counts: Vec<usize> = inputs
                    .iter()
                    .map(|i| i.plan.output_partitioning().partition_count())
                    .collect();
                if counts.iter().any(|&n| n != self.partitions) {
                    // Partition k of each input must hold the same buckets.
                    return internal_err!(
                        "SimilarityJoinExec ({}): inputs of {counts:?} partitions for {} output partitions",
                        self.distribution,
                        self.partitions
                    );
                }
                // Each output partition builds from its own partitions, on its own thread.
                let partial = Partial {
                    reads: Some(reads),
                    rule,
                    split_scan: false,
                };
                let build = Box::pin(async move {
                    build_collections(
                        inputs, gathered, token_type, threshold, ctx, build_time, partial,
                    )
                    .await
                });
                (build as BuildFuture, Arc::new(ProbeClaims::new(1)))
            }
        };
        SimilarityJoinStream::try_new(
            Arc::clone(&self.schema),
            build,
            self.threshold,
            self.columns.clone(),
            partition,
            claims,
            self.backend,
            context,
            &self.metrics,
        )
        // Ready batches consume tokio's task budget, and the stream yields by time as well
        // (a slow parent, a GROUP BY in a test build, spends seconds on 128 batches), so a
        // parent that consumes quietly (`count(*)`, a filter that drops every row) still
        // yields, and a cancel lands.
        .map(|s| time_sliced(Box::pin(cooperative(s))))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int16Array, StringArray, UInt64Array};

    /// Pairs of sets each order keeps, oriented, against `r.id < s.id` written out.
    fn oriented(order: &IdOrder, n: u32) -> Vec<(u32, u32)> {
        let mut out = Vec::new();
        for a in 0..n {
            for b in 0..n {
                if a != b
                    && let Some(p) = order.orient(a, b)
                {
                    out.push(p);
                }
            }
        }
        out
    }

    #[test]
    fn ids_orient_pairs_as_r_id_less_than_s_id() {
        let signed: ArrayRef = Arc::new(Int16Array::from(vec![
            Some(3),
            Some(-7),
            None,
            Some(3),
            Some(i16::MIN),
            Some(0),
        ]));
        let unsigned: ArrayRef = Arc::new(UInt64Array::from(vec![
            Some(u64::MAX),
            Some(1),
            None,
            Some(u64::MAX),
            Some(0),
            Some(1 << 63),
        ]));
        let strings: ArrayRef = Arc::new(StringArray::from(vec![
            Some("c"),
            Some("a"),
            None,
            Some("c"),
            Some(""),
            Some("b"),
        ]));
        // Sets are numbered in another order than rows: set p is row rows[p].
        let rows = [4u32, 0, 5, 2, 1, 3];
        for ids in [signed, unsigned, strings] {
            let order = IdOrder::new(Arc::clone(&ids), &rows).unwrap();
            let reference =
                make_comparator(ids.as_ref(), ids.as_ref(), SortOptions::default()).unwrap();
            let mut expected = Vec::new();
            for a in 0..6u32 {
                for b in 0..6u32 {
                    let (ra, rb) = (rows[a as usize] as usize, rows[b as usize] as usize);
                    if a != b && ids.is_valid(ra) && ids.is_valid(rb) && reference(ra, rb).is_lt() {
                        // Each unordered pair once, from both (a, b) and (b, a).
                        expected.push((a, b));
                        expected.push((a, b));
                    }
                }
            }
            let mut got = oriented(&order, 6);
            got.sort_unstable();
            expected.sort_unstable();
            assert_eq!(got, expected, "{}", ids.data_type());
            assert!(matches!(
                (&order, ids.data_type()),
                (IdOrder::Dyn { .. }, DataType::Utf8) | (IdOrder::Keys { .. }, _)
            ));
        }
    }
}
