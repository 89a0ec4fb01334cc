//! The output stream of one partition of [`super::exec::SimilarityJoinExec`]: waits for the
//! shared build, then probes its share of the sets a chunk at a time, yielding between
//! chunks (so a dropped or cancelled query stops promptly) and emitting `batch_size` rows
//! per batch.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use datafusion::arrow::array::{
    ArrayRef, Float64Array, RecordBatch, RecordBatchOptions, UInt32Array, UInt64Array,
};
use datafusion::arrow::compute::take;
use datafusion::arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{RecordBatchStream, TaskContext};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, Time,
};
use futures::Stream;

use super::exec::{Built, JoinColumn};
use super::filter::{Scratch, reserve, verify_candidate};
use super::threshold::Threshold;
use crate::functions::set_similarity::Measure;

/// Work units (probes plus sets met in the index) done per poll before yielding.
const WORK_PER_POLL: usize = 1 << 14;

type BuildFuture = Pin<Box<dyn Future<Output = Result<Arc<Built>>> + Send>>;

enum State {
    Building(BuildFuture),
    Probing { built: Arc<Built>, next: usize },
    Done,
}

/// One output partition of the join.
pub(crate) struct SimilarityJoinStream {
    schema: SchemaRef,
    state: State,
    threshold: Threshold,
    /// The output columns.
    columns: Vec<JoinColumn>,
    /// Whether the output holds any column (else only pairs are counted).
    materialize: bool,
    /// Whether the output holds the similarity (else verification may stop early).
    exact: bool,
    partition: usize,
    partitions: usize,
    batch_size: usize,
    context: Arc<TaskContext>,
    scratch: Scratch,
    scratch_reservation: Option<MemoryReservation>,
    // Pairs found and not yet emitted.
    left_rows: Vec<u32>,
    right_rows: Vec<u32>,
    scores: Vec<f64>,
    overlaps: Vec<u64>,
    pending: usize,
    // Metrics.
    baseline: BaselineMetrics,
    candidates: Count,
    verified: Count,
    filter_time: Time,
    verify_time: Time,
}

impl SimilarityJoinStream {
    #[expect(
        clippy::too_many_arguments,
        reason = "one private constructor, called once"
    )]
    pub(crate) fn try_new(
        schema: SchemaRef,
        build: BuildFuture,
        threshold: Threshold,
        columns: Vec<JoinColumn>,
        partition: usize,
        partitions: usize,
        context: Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Self> {
        Ok(Self {
            schema,
            state: State::Building(build),
            threshold,
            materialize: !columns.is_empty(),
            exact: columns.contains(&JoinColumn::Similarity),
            columns,
            partition,
            partitions,
            batch_size: context.session_config().batch_size().max(1),
            context,
            scratch: Scratch::default(),
            scratch_reservation: None,
            left_rows: Vec::new(),
            right_rows: Vec::new(),
            scores: Vec::new(),
            overlaps: Vec::new(),
            pending: 0,
            baseline: BaselineMetrics::new(metrics, partition),
            candidates: MetricBuilder::new(metrics).counter("candidates", partition),
            verified: MetricBuilder::new(metrics).counter("verified", partition),
            filter_time: MetricBuilder::new(metrics).subset_time("filter_time", partition),
            verify_time: MetricBuilder::new(metrics).subset_time("verify_time", partition),
        })
    }

    fn start_probing(&mut self, built: Arc<Built>) -> Result<()> {
        let sets = built.collections.len();
        let reservation =
            MemoryConsumer::new(format!("SimilarityJoinExec[probe {}]", self.partition))
                .register(self.context.memory_pool());
        reserve(&reservation, Scratch::bytes_for(sets), "the probe buffers")?;
        self.scratch = Scratch::new(sets);
        self.scratch_reservation = Some(reservation);
        self.state = State::Probing {
            built,
            next: self.partition,
        };
        Ok(())
    }

    /// Probe set `p` and record its pairs. Returns the work it took.
    fn probe(&mut self, built: &Built, p: usize) -> usize {
        let coll = &built.collections;
        let t0 = Instant::now();
        let met = coll.filter(p, &self.threshold, &mut self.scratch);
        let t1 = Instant::now();
        self.candidates.add(met);
        self.verified.add(self.scratch.candidates.len());
        let exact = self.exact;
        let materialize = self.materialize;
        let x = coll.set(p);
        let n = x.len() as u64;
        let measure = self.threshold.measure();
        for c in &self.scratch.candidates {
            let q = c.set;
            let y = coll.set(q as usize);
            let verified = if exact {
                verify_candidate::<true>(x, y, c)
            } else {
                verify_candidate::<false>(x, y, c)
            };
            let Some(o) = verified else {
                continue;
            };
            let (rp, rq) = (coll.row(p), coll.row(q as usize));
            let (l, r) = match &built.id_order {
                Some((ids, order)) => {
                    if ids.is_null(rp as usize) || ids.is_null(rq as usize) {
                        continue;
                    }
                    match order(rp as usize, rq as usize) {
                        std::cmp::Ordering::Less => (rp, rq),
                        std::cmp::Ordering::Greater => (rq, rp),
                        std::cmp::Ordering::Equal => continue,
                    }
                }
                None if coll.side(p) == 0 => (rp, rq),
                None => (rq, rp),
            };
            self.pending += 1;
            if materialize {
                self.left_rows.push(l);
                self.right_rows.push(r);
                if exact {
                    let m = y.len() as u64;
                    match measure {
                        Measure::Overlap => self.overlaps.push(o),
                        _ => self.scores.push(measure.score(o, n, m)),
                    }
                }
            }
        }
        self.filter_time.add_duration(t1 - t0);
        self.verify_time.add_elapsed(t1);
        1 + met + self.scratch.candidates.len()
    }

    /// The next `k` pending pairs as a batch.
    fn emit(&mut self, built: &Built, k: usize) -> Result<RecordBatch> {
        let mut columns: Vec<ArrayRef> = Vec::with_capacity(self.columns.len());
        if self.materialize {
            let left = UInt32Array::from(self.left_rows.drain(..k).collect::<Vec<u32>>());
            let right = UInt32Array::from(self.right_rows.drain(..k).collect::<Vec<u32>>());
            let similarity: Option<ArrayRef> = if self.exact {
                Some(match self.threshold.measure() {
                    Measure::Overlap => Arc::new(UInt64Array::from(
                        self.overlaps.drain(..k).collect::<Vec<_>>(),
                    )),
                    _ => Arc::new(Float64Array::from(
                        self.scores.drain(..k).collect::<Vec<_>>(),
                    )),
                })
            } else {
                None
            };
            for c in &self.columns {
                columns.push(match c {
                    JoinColumn::Left(i) => take(built.column(0, *i)?.as_ref(), &left, None)?,
                    JoinColumn::Right(i) => take(built.column(1, *i)?.as_ref(), &right, None)?,
                    JoinColumn::Similarity => match &similarity {
                        Some(s) => Arc::clone(s),
                        None => {
                            return internal_err!("SimilarityJoinExec: similarity not computed");
                        }
                    },
                });
            }
        }
        self.pending -= k;
        self.baseline.output_rows().add(k);
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &RecordBatchOptions::new().with_row_count(Some(k)),
        )?)
    }

    fn poll_inner(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            match &mut self.state {
                State::Done => return Poll::Ready(None),
                State::Building(fut) => match fut.as_mut().poll(cx) {
                    Poll::Pending => return Poll::Pending,
                    Poll::Ready(Err(e)) => {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    Poll::Ready(Ok(built)) => {
                        if let Err(e) = self.start_probing(built) {
                            self.state = State::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                    }
                },
                State::Probing { built, next } => {
                    let built = Arc::clone(built);
                    let mut p = *next;
                    let elapsed = self.baseline.elapsed_compute().clone();
                    let timer = elapsed.timer();
                    let mut work = 0;
                    let len = built.collections.len();
                    while self.pending < self.batch_size && p < len && work < WORK_PER_POLL {
                        work += self.probe(&built, p);
                        p += self.partitions;
                    }
                    if let State::Probing { next, .. } = &mut self.state {
                        *next = p;
                    }
                    let result = if self.pending >= self.batch_size {
                        Some(self.emit(&built, self.batch_size))
                    } else if p >= len && self.pending > 0 {
                        Some(self.emit(&built, self.pending))
                    } else {
                        None
                    };
                    timer.done();
                    if let Some(batch) = result {
                        return Poll::Ready(Some(batch));
                    }
                    if p >= len {
                        self.state = State::Done;
                        self.scratch = Scratch::default();
                        self.scratch_reservation = None;
                        self.baseline.done();
                        return Poll::Ready(None);
                    }
                    // Out of budget for this poll: let other tasks (and cancellation) in.
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
            }
        }
    }
}

impl Stream for SimilarityJoinStream {
    type Item = Result<RecordBatch>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        self.get_mut().poll_inner(cx)
    }
}

impl RecordBatchStream for SimilarityJoinStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
