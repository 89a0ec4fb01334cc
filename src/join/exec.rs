//! `SimilarityJoinExec`: the exact set similarity join as a physical operator.
//!
//! Inputs: a left plan and, for an R-S join, a right plan, each with an id column and a
//! token-list column (integer lists of any width; `List`, `LargeList` or `FixedSizeList`).
//! Output: `(left_id, right_id, similarity)` for every pair whose similarity passes the
//! [`Threshold`], in any order:
//! - R-S join: every pair `(r, s)`, `r` from the left input, `s` from the right one;
//! - self-join: every pair of distinct rows `x`, `y` of the one input with
//!   `id(x) < id(y)` (as `r.id < s.id` in SQL: rows with a NULL id or an equal id are not
//!   paired), left = the smaller id.
//!
//! A NULL or empty token list never joins. The similarity column is exactly
//! `jaccard(l.tokens, r.tokens)` (etc.) as the SQL function computes it.
//!
//! Execution: the first partition stream to be polled reads both inputs (all their
//! partitions) and builds the shared [`Collections`] (reordered sets and prefix indexes,
//! memory reserved in the task's pool); then output partition `k` of `P` probes the sets at
//! global positions `k, k + P, ...`. With an empty projection (`SELECT count(*)`) no pair
//! is built: verification stops once the required overlap is reached and the stream emits
//! batches without columns.

use std::fmt;
use std::sync::Arc;

use datafusion::arrow::array::{Array, ArrayRef, DynComparator, make_comparator, new_empty_array};
use datafusion::arrow::compute::{SortOptions, cast, concat};
use datafusion::arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, internal_err, plan_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, MetricBuilder, MetricsSet, Time,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties, Partitioning,
    PlanProperties,
};
use futures::StreamExt;
use tokio::sync::OnceCell;

use super::filter::{Collections, reserve};
use super::stream::SimilarityJoinStream;
use super::threshold::Threshold;
use crate::functions::set_similarity::{Measure, coerce_pair};

/// One input of the join: a plan and the indexes of its id and token columns.
#[derive(Clone, Debug)]
pub struct JoinInput {
    /// The input plan.
    pub plan: Arc<dyn ExecutionPlan>,
    /// Index of the id column in the plan's schema.
    pub id: usize,
    /// Index of the token-list column in the plan's schema.
    pub tokens: usize,
}

impl JoinInput {
    /// A new input.
    pub fn new(plan: Arc<dyn ExecutionPlan>, id: usize, tokens: usize) -> Self {
        Self { plan, id, tokens }
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
}

/// The join's full output schema: `left_id`, `right_id` (the id columns' types, nullable)
/// and `similarity` (the measure's SQL result type).
pub fn output_schema(left_id: &DataType, right_id: &DataType, measure: Measure) -> Schema {
    Schema::new(vec![
        Field::new("left_id", left_id.clone(), true),
        Field::new("right_id", right_id.clone(), true),
        Field::new("similarity", measure.return_type(), false),
    ])
}

/// Everything the probes share, built once per execution.
pub(crate) struct Built {
    pub(crate) collections: Collections,
    /// Id column of each side (one for a self-join), batches concatenated.
    pub(crate) ids: Vec<ArrayRef>,
    /// Self-join: orders ids to orient (and filter) pairs.
    pub(crate) id_order: Option<DynComparator>,
    /// Keeps the memory of `collections` and the inputs accounted.
    pub(crate) _reservation: MemoryReservation,
}

/// The exact set similarity join (see the module docs).
#[derive(Debug)]
pub struct SimilarityJoinExec {
    left: JoinInput,
    right: Option<JoinInput>,
    threshold: Threshold,
    /// The list type both token columns are cast to.
    token_type: DataType,
    projection: Option<Vec<usize>>,
    schema: SchemaRef,
    partitions: usize,
    build: Arc<OnceCell<Arc<Built>>>,
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
    /// output partitions.
    pub fn try_new(
        left: JoinInput,
        right: Option<JoinInput>,
        threshold: Threshold,
        projection: Option<Vec<usize>>,
        partitions: usize,
    ) -> Result<Self> {
        let left_id = left.field(left.id, "id")?;
        let left_tokens = left.field(left.tokens, "tokens")?;
        let (right_id, right_tokens) = match &right {
            Some(r) => (r.field(r.id, "id")?, r.field(r.tokens, "tokens")?),
            None => (left_id.clone(), left_tokens.clone()),
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
            return plan_err!("similarity_join: the token columns are NULL, not lists of integers");
        }
        if right.is_none() {
            // Self-joins orient pairs by id: the ids must be orderable.
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
        let full = output_schema(
            left_id.data_type(),
            right_id.data_type(),
            threshold.measure(),
        );
        let schema = Arc::new(match &projection {
            Some(p) => full.project(p)?,
            None => full,
        });
        let partitions = partitions.max(1);
        let cache = Arc::new(PlanProperties::new(
            EquivalenceProperties::new(Arc::clone(&schema)),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Final,
            Boundedness::Bounded,
        ));
        Ok(Self {
            left,
            right,
            threshold,
            token_type,
            projection,
            schema,
            partitions,
            build: Arc::new(OnceCell::new()),
            metrics: ExecutionPlanMetricsSet::new(),
            cache,
        })
    }

    /// The threshold.
    pub fn threshold(&self) -> &Threshold {
        &self.threshold
    }

    /// Whether this is a self-join.
    pub fn is_self_join(&self) -> bool {
        self.right.is_none()
    }

    /// The output projection of `(left_id, right_id, similarity)`.
    pub fn projection(&self) -> Option<&[usize]> {
        self.projection.as_deref()
    }

    fn inputs(&self) -> Vec<&JoinInput> {
        std::iter::once(&self.left)
            .chain(self.right.as_ref())
            .collect()
    }

    /// Columns wanted: `[left_id, right_id, similarity]`.
    fn wanted(&self) -> [bool; 3] {
        match &self.projection {
            None => [true; 3],
            Some(p) => [p.contains(&0), p.contains(&1), p.contains(&2)],
        }
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
        let mode = if self.is_self_join() { "self" } else { "r-s" };
        match t {
            DisplayFormatType::Default | DisplayFormatType::Verbose => {
                write!(
                    f,
                    "SimilarityJoinExec: mode={mode}, function={}, threshold={} {}, left=({}, {})",
                    self.threshold.measure().name(),
                    self.threshold.comparison(),
                    self.threshold.value(),
                    col(&self.left, self.left.id),
                    col(&self.left, self.left.tokens),
                )?;
                if let Some(r) = &self.right {
                    write!(f, ", right=({}, {})", col(r, r.id), col(r, r.tokens))?;
                }
                if let Some(p) = self.projection.as_ref().filter(|p| **p != [0, 1, 2]) {
                    write!(f, ", projection={p:?}")?;
                }
                write!(f, ", backend=cpu")
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
                write!(f, "backend=cpu")
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
        Ok(Arc::new(Self::try_new(
            left,
            right,
            self.threshold,
            self.projection.clone(),
            self.partitions,
        )?))
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
        let token_type = self.token_type.clone();
        let threshold = self.threshold;
        let ctx = Arc::clone(&context);
        let build = Box::pin(async move {
            let built = cell
                .get_or_try_init(|| {
                    build_collections(inputs, token_type, threshold, ctx, build_time)
                })
                .await?;
            Ok(Arc::clone(built))
        });
        SimilarityJoinStream::try_new(
            Arc::clone(&self.schema),
            build,
            self.threshold,
            self.wanted(),
            partition,
            self.partitions,
            context,
            &self.metrics,
        )
        .map(|s| Box::pin(s) as SendableRecordBatchStream)
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

/// Read every input to the end and build the shared state.
async fn build_collections(
    inputs: Vec<JoinInput>,
    token_type: DataType,
    threshold: Threshold,
    context: Arc<TaskContext>,
    build_time: Time,
) -> Result<Arc<Built>> {
    let reservation =
        MemoryConsumer::new("SimilarityJoinExec[build]").register(context.memory_pool());
    let self_join = inputs.len() == 1;
    let mut tokens = Vec::with_capacity(inputs.len());
    let mut ids = Vec::with_capacity(inputs.len());
    for input in &inputs {
        let mut side_tokens = Vec::new();
        let mut side_ids = Vec::new();
        for part in 0..input.plan.output_partitioning().partition_count() {
            let mut stream = input.plan.execute(part, Arc::clone(&context))?;
            while let Some(batch) = stream.next().await {
                let batch = batch?;
                reserve(
                    &reservation,
                    batch.get_array_memory_size(),
                    "the input batches",
                )?;
                side_ids.push(Arc::clone(batch.column(input.id)));
                side_tokens.push(cast(batch.column(input.tokens), &token_type)?);
            }
        }
        let id_type = input.plan.schema().field(input.id).data_type().clone();
        let id = if side_ids.is_empty() {
            new_empty_array(&id_type)
        } else {
            let refs: Vec<&dyn Array> = side_ids.iter().map(|a| a.as_ref()).collect();
            concat(&refs)?
        };
        ids.push(id);
        tokens.push(side_tokens);
    }
    let _timer = build_time.timer();
    let collections = Collections::build(&tokens, &threshold, &reservation)?;
    drop(tokens);
    let id_order = if self_join {
        Some(make_comparator(
            ids[0].as_ref(),
            ids[0].as_ref(),
            SortOptions::default(),
        )?)
    } else {
        None
    };
    Ok(Arc::new(Built {
        collections,
        ids,
        id_order,
        _reservation: reservation,
    }))
}
