//! `TimeSliceExec`: a pass-through node under an operator whose set functions make each
//! batch costly, so that the task running it gives control back to tokio at least every
//! [`SLICE`] of work.
//!
//! DataFusion's sources yield by tokio's task budget: once every 128 batches. That is a
//! blink for a cheap operator, but `list_intersect_agg` folds lists and `list_intersect_count`
//! in a filter intersects every row, and an aggregate or a filter that drops every row pulls
//! batch after batch inside one poll: 128 batches can be seconds in which a dropped query
//! cannot return. This node counts time instead of batches: the first poll after the task
//! last yielded starts a slice, and a poll that finds the slice over returns `Pending`, so
//! the operator's loop unwinds to the runtime, which can then drop the query. Below the
//! operator, the slice holds the operator's own work and its parents'.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use datafusion::arrow::datatypes::SchemaRef;
use datafusion::arrow::record_batch::RecordBatch;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, Statistics};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties};
use futures::Stream;

/// The most work between two yields of the task, beyond the one batch (and the fold it may
/// start) in progress when the slice ends.
pub const SLICE: Duration = Duration::from_millis(10);

/// See the module docs.
#[derive(Debug)]
pub struct TimeSliceExec {
    input: Arc<dyn ExecutionPlan>,
}

impl TimeSliceExec {
    pub fn new(input: Arc<dyn ExecutionPlan>) -> Self {
        Self { input }
    }
}

impl DisplayAs for TimeSliceExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        if !matches!(t, DisplayFormatType::TreeRender) {
            write!(f, "TimeSliceExec: ")?;
        }
        write!(f, "yield every {} ms", SLICE.as_millis())
    }
}

impl ExecutionPlan for TimeSliceExec {
    fn name(&self) -> &str {
        "TimeSliceExec"
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
        mut children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        Ok(Arc::new(Self::new(children.swap_remove(0))))
    }
    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }
    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        Ok(Arc::clone(&input_stats[0]))
    }
    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        Ok(time_sliced(self.input.execute(partition, context)?))
    }
}

/// `inner`, yielding to tokio once a [`SLICE`] of work has passed since the task last did.
pub fn time_sliced(inner: SendableRecordBatchStream) -> SendableRecordBatchStream {
    Box::pin(TimeSliced {
        inner,
        slice: SLICE,
        started: None,
    })
}

/// The stream of [`TimeSliceExec`].
struct TimeSliced {
    inner: SendableRecordBatchStream,
    slice: Duration,
    /// When the current slice began: the first poll since the task last yielded.
    started: Option<Instant>,
}

impl Stream for TimeSliced {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let now = Instant::now();
        let started = *self.started.get_or_insert(now);
        if now.duration_since(started) >= self.slice {
            self.started = None;
            // tokio's own yield: it wakes the task only after the worker has turned its
            // drivers, so a timer (a timeout, a cancel's deadline) fires at this yield, not
            // up to 61 task polls later as after a plain self-wake. Outside tokio it wakes
            // the task at once.
            let mut yielded = std::pin::pin!(tokio::task::yield_now());
            if yielded.as_mut().poll(cx).is_ready() {
                cx.waker().wake_by_ref();
            }
            return Poll::Pending;
        }
        let polled = self.inner.as_mut().poll_next(cx);
        if polled.is_pending() {
            // The task yields anyway: the next poll starts a new slice.
            self.started = None;
        }
        polled
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.inner.size_hint()
    }
}

impl RecordBatchStream for TimeSliced {
    fn schema(&self) -> SchemaRef {
        self.inner.schema()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use datafusion::arrow::array::Int32Array;
    use datafusion::arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
    use futures::StreamExt;

    /// A stream that takes `work` per batch yields once a slice is spent, and between
    /// yields passes every batch through in order.
    #[tokio::test]
    async fn yields_once_a_slice_is_spent() {
        let schema = Arc::new(Schema::new(vec![Field::new("x", DataType::Int32, false)]));
        let batches: Vec<Result<RecordBatch>> = (0..12)
            .map(|i| {
                Ok(RecordBatch::try_new(
                    Arc::clone(&schema),
                    vec![Arc::new(Int32Array::from(vec![i]))],
                )?)
            })
            .collect();
        let inner = futures::stream::iter(batches).map(|b| {
            std::thread::sleep(Duration::from_millis(4));
            b
        });
        let mut sliced = TimeSliced {
            inner: Box::pin(RecordBatchStreamAdapter::new(Arc::clone(&schema), inner)),
            slice: Duration::from_millis(10),
            started: None,
        };
        let waker = futures::task::noop_waker();
        let mut cx = Context::from_waker(&waker);
        let (mut seen, mut pending, mut last_pending) = (Vec::new(), 0, false);
        loop {
            match Pin::new(&mut sliced).poll_next(&mut cx) {
                Poll::Ready(Some(b)) => {
                    let b = b.unwrap();
                    let col = b.column(0).as_any().downcast_ref::<Int32Array>().unwrap();
                    seen.push(col.value(0));
                    last_pending = false;
                }
                Poll::Ready(None) => break,
                Poll::Pending => {
                    // A yield starts a new slice: the next poll makes progress.
                    assert!(!last_pending, "two yields in a row");
                    last_pending = true;
                    pending += 1;
                }
            }
        }
        assert_eq!(seen, (0..12).collect::<Vec<_>>());
        // 48 ms or more of work in slices of 10 ms: a yield at least every 3 batches (every
        // batch on a slow machine), never more than one per batch.
        assert!((3..=12).contains(&pending), "{pending} yields");
    }
}
