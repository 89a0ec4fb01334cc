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
//! read tasks build it together, `super::crew`); then output
//! partition `k` of `P` probes the sets at global positions `k, k + P, ...`. With no output
//! column (`SELECT count(*)`) no pair is built: verification stops once the required
//! overlap is reached and the stream emits batches without columns.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{
    Array, ArrayRef, AsArray, DynComparator, make_comparator, new_empty_array,
};
use datafusion::arrow::compute::{SortOptions, cast, concat};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef, UInt64Type};
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{DataFusionError, Result, internal_err, plan_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::coop::cooperative;
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType, SchedulingType};
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::build::{Prepared, prepare};
use super::crew::{Crew, lock};
use super::filter::{Collections, reserve};
use super::stream::{ProbeClaims, SimilarityJoinStream};
use super::threshold::Threshold;
use crate::config::BackendChoice;
use crate::intersect::similarity::{Measure, coerce_pair};
use crate::intersect::strings::{StringIds, is_string_list};
use crate::io::parquet_split::split_scan;
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
    fn new(ids: ArrayRef, rows: &[u32]) -> Result<Self> {
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
    /// Keeps the memory of `collections` and the columns accounted.
    pub(crate) _reservation: Arc<MemoryReservation>,
    /// The sets on the device, uploaded by the first partition that verifies on the GPU
    /// (an error: the GPU could not take them, every partition verifies on the CPU).
    pub(crate) device_sets: std::sync::OnceLock<
        std::result::Result<Arc<crate::join::gpu::DeviceSets>, crate::backend::gpu::GpuError>,
    >,
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

/// The exact set similarity join (see the module docs).
#[derive(Debug)]
pub struct SimilarityJoinExec {
    pub(crate) left: JoinInput,
    pub(crate) right: Option<JoinInput>,
    pub(crate) threshold: Threshold,
    /// The list type both token columns are cast to.
    token_type: DataType,
    pub(crate) columns: Vec<JoinColumn>,
    pub(crate) kind: OutputKind,
    pub(crate) schema: SchemaRef,
    pub(crate) partitions: usize,
    /// Where candidates are verified (`sets.backend` when the plan was made).
    pub(crate) backend: BackendChoice,
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

    fn new_inner(
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
            return plan_err!("similarity_join: the token columns are NULL, not lists of integers or strings");
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
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        )
        .with_scheduling_type(SchedulingType::Cooperative));
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
            build: Arc::new(OnceCell::new()),
            claims: Arc::new(ProbeClaims::new(partitions)),
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// This join with candidates verified by `backend` (`sets.backend`; the default is
    /// `auto`: the GPU when one is present and the sets hold at least a million tokens).
    pub fn with_backend(mut self, backend: BackendChoice) -> Self {
        self.backend = backend;
        self
    }

    /// Where candidates are verified, as `EXPLAIN` shows it.
    fn backend_label(&self) -> String {
        crate::placement::join_verifier_label(self.backend)
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

    fn inputs(&self) -> Vec<&JoinInput> {
        std::iter::once(&self.left)
            .chain(self.right.as_ref())
            .collect()
    }

    /// For each input, the columns to keep: the output's and, in a self-join, the id.
    fn gathered(&self) -> Vec<Vec<usize>> {
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
        for s in &mut sides {
            s.sort_unstable();
            s.dedup();
        }
        sides
    }
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
                write!(f, ", backend={}", self.backend_label())
            }
            DisplayFormatType::TreeRender => {
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
        // Every input partition is read to the end by one task before probing starts.
        vec![false; self.children().len()]
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
            .with_backend(self.backend),
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
        ) {
            Ok(exec) => Ok(Some(Arc::new(exec.with_backend(self.backend)))),
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
        let cell = Arc::clone(&self.build);
        let inputs: Vec<JoinInput> = self.inputs().into_iter().cloned().collect();
        let gathered = self.gathered();
        let token_type = self.token_type.clone();
        let threshold = self.threshold;
        let ctx = Arc::clone(&context);
        let build = Box::pin(async move {
            let built = cell
                .get_or_try_init(|| {
                    build_collections(inputs, gathered, token_type, threshold, ctx, build_time)
                })
                .await?;
            Ok(Arc::clone(built))
        });
        SimilarityJoinStream::try_new(
            Arc::clone(&self.schema),
            build,
            self.threshold,
            self.columns.clone(),
            partition,
            Arc::clone(&self.claims),
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

/// Read every input to the end and build the shared state. `gathered[s]`: the columns of
/// input `s` to keep.
///
/// Every partition of every input is read by its own task, all at once (a Parquet input of
/// fewer row groups than cores is read in row ranges: split_scan.rs). The tasks then build
/// together, on the threads they already run on (crew.rs): the last to finish its read builds,
/// the others help.
async fn build_collections(
    inputs: Vec<JoinInput>,
    gathered: Vec<Vec<usize>>,
    token_type: DataType,
    threshold: Threshold,
    context: Arc<TaskContext>,
    build_time: Time,
) -> Result<Arc<Built>> {
    let reservation =
        Arc::new(MemoryConsumer::new("SimilarityJoinExec[build]").register(context.memory_pool()));
    let threads = context.session_config().target_partitions();
    let split = crate::config::similarity_join_split_scan(context.session_config().options());
    let mut plans = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let plan = match split {
            true => split_scan(&input.plan, threads, &context, &reservation).await,
            false => None,
        }
        .unwrap_or_else(|| Arc::clone(&input.plan));
        plans.push(plan);
    }
    let parts: Vec<usize> = plans
        .iter()
        .map(|p| p.output_partitioning().partition_count())
        .collect();
    let readers = parts.iter().sum();
    let shared = Arc::new(Shared {
        crew: Crew::new(readers),
        reads: std::sync::Mutex::new(
            parts
                .iter()
                .map(|&n| (0..n).map(|_| None).collect())
                .collect(),
        ),
        built: std::sync::Mutex::new(None),
        // Token strings get their ids as the batches are read, from one map for both inputs.
        strings: std::sync::Mutex::new(
            is_string_list(&token_type).then(|| Arc::new(StringIds::new(4 * threads.max(1)))),
        ),
        string_bytes: std::sync::atomic::AtomicUsize::new(0),
        inputs,
        gathered,
        threshold,
        reservation,
        threads,
        build_time,
    });
    if readers == 0 {
        return shared.assemble();
    }
    let mut tasks = Vec::with_capacity(readers);
    for (side, (plan, &n)) in plans.iter().zip(&parts).enumerate() {
        // The build's first step (each set sorted and deduplicated) runs in the read tasks
        // when they are as many as the build's threads (every core reads, so every core
        // takes its share, with no pause between the read and the build); an input of fewer
        // partitions leaves it to the build.
        let prepare_sets = n >= threads;
        for part in 0..n {
            let stream = plan.execute(part, Arc::clone(&context))?;
            let shared = Arc::clone(&shared);
            let token_type = token_type.clone();
            tasks.push(SpawnedTask::spawn(async move {
                // A task that ends before its part is done (a panic, an abort) lets the
                // helpers go, so that none waits for a build that will not come.
                struct Release<'a>(&'a Crew, bool);
                impl Drop for Release<'_> {
                    fn drop(&mut self) {
                        if !self.1 {
                            self.0.finish_build();
                        }
                    }
                }
                let mut release = Release(&shared.crew, false);
                let input = &shared.inputs[side];
                let strings = lock(&shared.strings).clone();
                let read = read_partition(
                    stream,
                    Arc::clone(&shared.reservation),
                    shared.gathered[side].clone(),
                    input.tokens,
                    token_type,
                    strings.map(|ids| (ids, &shared.string_bytes)),
                    prepare_sets,
                );
                let last = shared
                    .crew
                    .read(read, |read| lock(&shared.reads)[side][part] = Some(read))
                    .await;
                if last {
                    let built = shared.assemble();
                    *lock(&shared.built) = Some(built);
                    shared.crew.finish_build();
                } else {
                    shared.crew.help().await;
                }
                release.1 = true;
            }));
        }
    }
    for task in tasks {
        task.join_unwind()
            .await
            .map_err(|e| DataFusionError::ExecutionJoin(Box::new(e)))?;
    }
    let built = lock(&shared.built).take();
    match built {
        Some(built) => built,
        None => internal_err!("SimilarityJoinExec: the reads ended with no build"),
    }
}

/// What one read task returns: the kept columns' batches, the token column's batches and
/// (when the task prepares sets) the build's first step on each batch.
type ReadResult = Result<(Vec<Vec<ArrayRef>>, Vec<ArrayRef>, Option<Vec<Prepared>>)>;

/// What the read tasks share: their results, and what the one that builds needs.
struct Shared {
    crew: Crew,
    /// Per input, per partition: the read's result once it is in.
    reads: std::sync::Mutex<Vec<Vec<Option<ReadResult>>>>,
    built: std::sync::Mutex<Option<Result<Arc<Built>>>>,
    /// The ids of token strings (for lists of strings), dropped once every read is in.
    strings: std::sync::Mutex<Option<Arc<StringIds>>>,
    /// The bytes reserved for `strings`.
    string_bytes: std::sync::atomic::AtomicUsize,
    inputs: Vec<JoinInput>,
    gathered: Vec<Vec<usize>>,
    threshold: Threshold,
    reservation: Arc<MemoryReservation>,
    threads: usize,
    build_time: Time,
}

impl Shared {
    /// Every read is in: concatenate the kept columns and build (the leader's work; the
    /// build's parallel steps go to the crew).
    fn assemble(&self) -> Result<Arc<Built>> {
        let reads = std::mem::take(&mut *lock(&self.reads));
        // Every token is an id now: the strings' map is no longer needed.
        if lock(&self.strings).take().is_some() {
            self.reservation.shrink(
                self.string_bytes
                    .swap(0, std::sync::atomic::Ordering::Relaxed),
            );
        }
        let self_join = self.inputs.len() == 1;
        let mut tokens = Vec::with_capacity(self.inputs.len());
        let mut columns = Vec::with_capacity(self.inputs.len());
        let mut prepared = Vec::with_capacity(self.inputs.len());
        for ((input, keep), side_reads) in self.inputs.iter().zip(&self.gathered).zip(reads) {
            let schema = input.plan.schema();
            let mut side_tokens = Vec::new();
            let mut side_columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); keep.len()];
            let mut side_prepared: Option<Vec<Prepared>> = None;
            for (i, read) in side_reads.into_iter().enumerate() {
                let Some(read) = read else {
                    return internal_err!("SimilarityJoinExec: a read task left no result");
                };
                let (part_columns, part_tokens, part_prepared) = read?;
                for (all, part) in side_columns.iter_mut().zip(part_columns) {
                    all.extend(part);
                }
                side_tokens.extend(part_tokens);
                match (i, &mut side_prepared, part_prepared) {
                    (0, all, part) => *all = part,
                    (_, Some(all), Some(part)) => all.extend(part),
                    _ => {}
                }
            }
            prepared.push(side_prepared);
            let mut side = vec![None; schema.fields().len()];
            for (k, &i) in keep.iter().enumerate() {
                let parts = &side_columns[k];
                let column = match parts.len() {
                    0 => new_empty_array(schema.field(i).data_type()),
                    1 => Arc::clone(&parts[0]),
                    _ => {
                        let refs: Vec<&dyn Array> = parts.iter().map(|a| a.as_ref()).collect();
                        let column = concat(&refs)?;
                        reserve(
                            &self.reservation,
                            column.get_array_memory_size(),
                            "the gathered columns",
                        )?;
                        column
                    }
                };
                side[i] = Some(column);
            }
            columns.push(side);
            tokens.push(side_tokens);
        }
        let _timer = self.build_time.timer();
        let collections = Collections::build(
            &tokens,
            prepared,
            &self.threshold,
            &self.reservation,
            self.threads,
            &self.crew,
        )?;
        drop(tokens);
        let id_order = match (self_join, self.inputs[0].id) {
            (true, Some(id)) => match columns[0].get(id) {
                Some(Some(ids)) => Some(IdOrder::new(Arc::clone(ids), collections.rows())?),
                _ => {
                    return internal_err!(
                        "SimilarityJoinExec: the self-join's id column was not kept"
                    );
                }
            },
            (true, None) => {
                return internal_err!("SimilarityJoinExec: a self-join needs an id column");
            }
            (false, _) => None,
        };
        Ok(Arc::new(Built {
            collections,
            columns,
            id_order,
            _reservation: Arc::clone(&self.reservation),
            device_sets: std::sync::OnceLock::new(),
        }))
    }
}

/// The batches of one input partition: the kept columns (`keep`'s order), the token column
/// cast to `token_type` (lists of strings then mapped to lists of ids by `strings`, whose
/// growth is reserved and added to its counter), and with `prepare_sets` the build's first step done on each batch as
/// it comes (its sets sorted and deduplicated: work that runs here, on every reading core,
/// instead of after the last read), each batch's memory reserved.
async fn read_partition(
    mut stream: SendableRecordBatchStream,
    reservation: Arc<MemoryReservation>,
    keep: Vec<usize>,
    tokens: usize,
    token_type: DataType,
    strings: Option<(Arc<StringIds>, &std::sync::atomic::AtomicUsize)>,
    prepare_sets: bool,
) -> Result<(Vec<Vec<ArrayRef>>, Vec<ArrayRef>, Option<Vec<Prepared>>)> {
    let mut columns: Vec<Vec<ArrayRef>> = vec![Vec::new(); keep.len()];
    let mut token_columns = Vec::new();
    let mut prepared = prepare_sets.then(Vec::new);
    loop {
        let Some(batch) = stream.next().await else {
            break;
        };
        let batch = batch?;
        reserve(
            &reservation,
            batch.get_array_memory_size(),
            "the input batches",
        )?;
        for (k, &i) in keep.iter().enumerate() {
            columns[k].push(Arc::clone(batch.column(i)));
        }
        let mut token_column = cast(batch.column(tokens), &token_type)?;
        if let Some((ids, bytes)) = &strings {
            let (mapped, grown) = ids.map_list(&token_column, "SimilarityJoinExec")?;
            reserve(&reservation, grown, "the token strings' ids")?;
            bytes.fetch_add(grown, std::sync::atomic::Ordering::Relaxed);
            token_column = mapped;
        }
        if let Some(prepared) = &mut prepared {
            prepared.push(prepare(&token_column, &reservation)?);
        }
        token_columns.push(token_column);
    }
    Ok((columns, token_columns, prepared))
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
