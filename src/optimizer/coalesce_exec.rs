//! `SetsCoalesceExec`: gathers each input partition's batches into batches of at least
//! `rows` rows (or [`MAX_BUFFERED_BYTES`] of buffered arrays, whichever comes first), in
//! order. The backend rule puts it below a projection whose set functions it bound to the
//! GPU: DataFusion hands a projection batches of `datafusion.execution.batch_size` rows (8192),
//! and every device call has a fixed cost (launches, synchronizations, the copy's latency), so
//! small batches would pay it many times (`sets.gpu_batch_rows`, chosen by measurement:
//! kernels/NOTES.md). A partition with fewer rows emits what it has when its input ends, so a
//! small input is not delayed; a batch that is large already passes through as it is.
//!
//! What it buffers is reserved in the session's memory pool; when the pool says no, the
//! buffer is emitted early rather than failing the query.

use std::fmt;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use datafusion::arrow::compute::concat_batches;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::Result;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::metrics::{BaselineMetrics, ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::{Stream, StreamExt};

/// Buffered arrays past which a partition emits what it holds, whatever its row count.
pub const MAX_BUFFERED_BYTES: usize = 256 << 20;

/// See the module docs.
#[derive(Debug)]
pub struct SetsCoalesceExec {
    input: Arc<dyn ExecutionPlan>,
    rows: usize,
    metrics: ExecutionPlanMetricsSet,
}

impl SetsCoalesceExec {
    /// Batches of at least `rows` rows (at least 1) from `input`.
    pub fn new(input: Arc<dyn ExecutionPlan>, rows: usize) -> Self {
        Self {
            input,
            rows: rows.max(1),
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The row target.
    pub fn rows(&self) -> usize {
        self.rows
    }
}

impl DisplayAs for SetsCoalesceExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        if !matches!(t, DisplayFormatType::TreeRender) {
            write!(f, "SetsCoalesceExec: ")?;
        }
        write!(f, "rows={}", self.rows)
    }
}

impl ExecutionPlan for SetsCoalesceExec {
    fn name(&self) -> &str {
        "SetsCoalesceExec"
    }
    fn properties(&self) -> &Arc<PlanProperties> {
        self.input.properties()
    }
    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }
    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }
    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(Arc::clone(&children[0]), self.rows)))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let reservation = MemoryConsumer::new(format!("SetsCoalesceExec[{partition}]"))
            .register(context.memory_pool());
        Ok(Box::pin(CoalesceStream {
            input: self.input.execute(partition, context)?,
            schema: self.input.schema(),
            rows: self.rows,
            buffered: Vec::new(),
            buffered_rows: 0,
            reservation,
            done: false,
            metrics: BaselineMetrics::new(&self.metrics, partition),
        }))
    }
    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }
}

struct CoalesceStream {
    input: SendableRecordBatchStream,
    schema: SchemaRef,
    rows: usize,
    buffered: Vec<RecordBatch>,
    buffered_rows: usize,
    reservation: MemoryReservation,
    done: bool,
    metrics: BaselineMetrics,
}

impl CoalesceStream {
    /// The buffered batches as one (the buffer emptied), or `None` when it is empty.
    fn flush(&mut self) -> Option<Result<RecordBatch>> {
        if self.buffered.is_empty() {
            return None;
        }
        let batches = std::mem::take(&mut self.buffered);
        self.buffered_rows = 0;
        let out = if batches.len() == 1 {
            Ok(batches.into_iter().next().expect("one batch"))
        } else {
            let _timer = self.metrics.elapsed_compute().timer();
            concat_batches(&self.schema, &batches).map_err(Into::into)
        };
        self.reservation.free();
        Some(out)
    }
}

impl Stream for CoalesceStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = &mut *self;
        loop {
            if this.done {
                let out = this.flush();
                return this.metrics.record_poll(Poll::Ready(out));
            }
            match this.input.poll_next_unpin(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) => this.done = true,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(batch))) => {
                    if batch.num_rows() == 0 {
                        continue;
                    }
                    // A batch as large as the target alone goes as it is (after what is
                    // buffered, to keep the order).
                    if this.buffered.is_empty() && batch.num_rows() >= this.rows {
                        return this.metrics.record_poll(Poll::Ready(Some(Ok(batch))));
                    }
                    let bytes = batch.get_array_memory_size();
                    let fits = this.reservation.size() + bytes <= MAX_BUFFERED_BYTES
                        && this.reservation.try_grow(bytes).is_ok();
                    if !fits && !this.buffered.is_empty() {
                        // Emit what is held; the new batch starts the next buffer.
                        let out = this.flush();
                        this.buffered_rows = batch.num_rows();
                        let _ = this.reservation.try_grow(bytes);
                        this.buffered.push(batch);
                        return this.metrics.record_poll(Poll::Ready(out));
                    }
                    this.buffered_rows += batch.num_rows();
                    this.buffered.push(batch);
                    if this.buffered_rows >= this.rows || !fits {
                        let out = this.flush();
                        return this.metrics.record_poll(Poll::Ready(out));
                    }
                }
            }
        }
    }
}

impl RecordBatchStream for CoalesceStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::{Int32Array, ListArray};
    use datafusion::arrow::datatypes::{DataType, Field, Int32Type, Schema};
    use datafusion::datasource::memory::MemorySourceConfig;
    use datafusion::execution::memory_pool::GreedyMemoryPool;
    use datafusion::execution::runtime_env::RuntimeEnvBuilder;
    use datafusion::physical_plan::collect;

    fn batch(schema: &SchemaRef, from: i32, rows: i32) -> RecordBatch {
        let ids = Int32Array::from_iter_values(from..from + rows);
        let lists = ListArray::from_iter_primitive::<Int32Type, _, _>(
            (from..from + rows).map(|v| Some(vec![Some(v), Some(v + 1)])),
        );
        RecordBatch::try_new(Arc::clone(schema), vec![Arc::new(ids), Arc::new(lists)]).unwrap()
    }

    async fn run(sizes: &[i32], target: usize, pool: Option<usize>) -> Vec<RecordBatch> {
        let schema = Arc::new(Schema::new(vec![
            Field::new("id", DataType::Int32, false),
            Field::new_list("l", Field::new_list_field(DataType::Int32, true), true),
        ]));
        let mut from = 0;
        let batches: Vec<RecordBatch> = sizes
            .iter()
            .map(|&n| {
                let b = batch(&schema, from, n);
                from += n;
                b
            })
            .collect();
        let source =
            MemorySourceConfig::try_new_exec(&[batches], Arc::clone(&schema), None).unwrap();
        let exec = Arc::new(SetsCoalesceExec::new(source, target));
        let mut runtime = RuntimeEnvBuilder::new();
        if let Some(bytes) = pool {
            runtime = runtime.with_memory_pool(Arc::new(GreedyMemoryPool::new(bytes)));
        }
        let ctx = TaskContext::default().with_runtime(runtime.build_arc().unwrap());
        let out = collect(exec, Arc::new(ctx)).await.unwrap();
        // Every row, once, in order.
        let ids: Vec<i32> = out
            .iter()
            .flat_map(|b| {
                b.column(0)
                    .as_any()
                    .downcast_ref::<Int32Array>()
                    .unwrap()
                    .values()
                    .to_vec()
            })
            .collect();
        assert_eq!(ids, (0..sizes.iter().sum::<i32>()).collect::<Vec<_>>());
        out
    }

    fn rows(out: &[RecordBatch]) -> Vec<usize> {
        out.iter().map(|b| b.num_rows()).collect()
    }

    #[tokio::test]
    async fn gathers_to_the_target_in_order() {
        assert_eq!(rows(&run(&[3, 3, 3, 3, 3], 6, None).await), vec![6, 6, 3]);
        // Empty batches vanish; a large batch passes through; the rest at the end.
        assert_eq!(rows(&run(&[0, 10, 2, 0, 2], 4, None).await), vec![10, 4]);
        assert_eq!(rows(&run(&[2, 9], 4, None).await), vec![11]);
        assert_eq!(rows(&run(&[], 4, None).await), Vec::<usize>::new());
        assert_eq!(rows(&run(&[5], 1, None).await), vec![5]);
    }

    #[tokio::test]
    async fn a_full_pool_emits_early_instead_of_failing() {
        // Room for about one batch: every batch goes out (nearly) alone, and nothing fails.
        let one = {
            let schema = Arc::new(Schema::new(vec![
                Field::new("id", DataType::Int32, false),
                Field::new_list("l", Field::new_list_field(DataType::Int32, true), true),
            ]));
            batch(&schema, 0, 100).get_array_memory_size()
        };
        let out = run(&[100, 100, 100, 100], 1000, Some(one + one / 2)).await;
        assert!(out.len() >= 3, "{:?}", rows(&out));
        let out = run(&[100, 100, 100, 100], 1000, None).await;
        assert_eq!(rows(&out), vec![400]);
    }
}
