//! The output stream of one partition of [`super::exec::SimilarityJoinExec`]: waits for the
//! shared build, then probes ranges of the sets claimed from its home range and, when that is
//! done, from the homes of the partitions its plan instance started ([`ProbeClaims`]), a
//! chunk at a time, yielding between chunks (so a dropped or cancelled
//! query stops promptly) and emitting `batch_size` rows per batch.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

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
use super::filter::{Candidate, Scratch, reserve, verify_candidate};
use super::threshold::Threshold;
use crate::backend::cpu::BoundedKernel;
use crate::config::BackendChoice;
use crate::intersect::similarity::Measure;
use crate::join::gpu::{self, DeviceJoin, DeviceSets, PairBuffer, PairToVerify};

/// Work units (probes plus sets met in the index) done per poll before yielding.
const WORK_PER_POLL: usize = 1 << 14;
/// Candidate pairs per chunk sent to the GPU (a call takes about a millisecond; filling a
/// chunk, tens of milliseconds).
const CHUNK_PAIRS: usize = 1 << 18;
/// Smallest chunk when the memory pool refuses the default (smaller still: the CPU verifies).
const MIN_CHUNK_PAIRS: usize = 1 << 14;
/// The most pairs one call of the join on the device returns (a range of probe sets with more
/// is probed again in halves), and the fewest when the memory pool refuses that many.
const DEVICE_PAIRS: usize = 1 << 20;
const MIN_DEVICE_PAIRS: usize = 1 << 12;
/// The fewest probe sets a partition claims for one call of the join on the device (each
/// call waits for the device once: ~0.7 ms a call beyond its kernel on the H200 host, with
/// 16 partitions calling).
const DEVICE_MIN_CLAIM: usize = MAX_CLAIM;

/// GPU verification of one partition: the chunk being filled and the one at the device.
/// A full chunk is queued on the device and the partition filters the next one meanwhile;
/// the answer is taken when that one is full too (the paper's overlap of filtering and
/// verification, on the partition's own thread: the device needs no host thread while it
/// works).
struct GpuVerify {
    sets: Arc<DeviceSets>,
    /// The chunk being filled (page-locked when possible: copied to the device as it is).
    chunk: PairBuffer,
    /// A chunk buffer back from the device, reused for the next chunk.
    spare: Option<PairBuffer>,
    capacity: usize,
    /// The chunk at the device.
    inflight: Option<gpu::PendingVerify>,
    _reservation: MemoryReservation,
}

impl GpuVerify {
    /// Write probe set `p`'s candidates into the chunk being filled, as one group.
    fn queue(&mut self, p: u32, candidates: &[Candidate]) {
        if candidates.is_empty() {
            return;
        }
        self.chunk.start_group(p);
        self.chunk.extend(candidates.iter().map(|c| PairToVerify {
            y: c.set,
            alpha: c.alpha,
        }));
    }
}

/// The whole join on the device: each claimed range of probe sets is filtered and verified
/// there ([`gpu::probe_sets`]) and only the passing pairs come back.
struct DeviceProbe {
    join: Arc<DeviceJoin>,
    /// The most pairs one call returns (a range with more is probed again in halves).
    cap: usize,
    /// Whether the pairs come back (else the device only counts them).
    emit: bool,
    _reservation: MemoryReservation,
}

enum Verifier {
    Cpu,
    Gpu(Box<GpuVerify>),
    Device(Box<DeviceProbe>),
}

/// The filter-only knob (feature `tuning`, benchmarks only; read when a partition starts):
/// candidates counted as pairs without verification, to time the filter alone, or also
/// written into the GPU chunks (not sent), to time the filter with the serialization.
#[cfg(feature = "tuning")]
use crate::tuning::SjFilterOnly as FilterOnly;

pub(crate) type BuildFuture = Pin<Box<dyn Future<Output = Result<Arc<Built>>> + Send>>;

enum State {
    Building(BuildFuture),
    /// Probing `next..end`, a range claimed from `claims`; a new range is claimed when it
    /// is done, and the partition is done when none is left.
    Probing {
        built: Arc<Built>,
        claims: Claims,
        next: usize,
        end: usize,
    },
    Done,
}

/// Smallest and largest range of probe sets a partition claims at a time.
const MIN_CLAIM: usize = 16;
const MAX_CLAIM: usize = 4096;

/// The probe sets' claims of one plan's executions. The `len` probe sets are cut into one
/// contiguous home range per output partition, and a partition probes its own home first, a
/// share of what is left of it at a time (a fraction, so the last claims are small and the
/// partitions finish together). When its home is done it takes work from the homes of the
/// partitions this plan instance has started, never from the others': an engine that runs
/// each output partition in its own copy of the plan (Ballista, or a retried task) probes
/// every set exactly once across the copies, and within one instance a core the machine takes
/// away for a while, or a home of costlier sets, no longer holds up the whole join.
/// The `k`-th execution of each partition joins execution `k`, so a plan executed again
/// probes every set again.
#[derive(Debug)]
pub(crate) struct ProbeClaims {
    runs: Vec<AtomicUsize>,
    executions: Mutex<Vec<Arc<Execution>>>,
}

/// One execution of the plan's partitions: per partition, whether it started and how many
/// sets of its home were claimed.
#[derive(Debug)]
pub(crate) struct Execution {
    started: Vec<AtomicBool>,
    taken: Vec<AtomicUsize>,
}

impl ProbeClaims {
    pub(crate) fn new(partitions: usize) -> Self {
        Self {
            runs: (0..partitions.max(1))
                .map(|_| AtomicUsize::new(0))
                .collect(),
            executions: Mutex::new(Vec::new()),
        }
    }

    /// The output partitions whose homes the probe sets are cut into.
    pub(crate) fn partitions(&self) -> usize {
        self.runs.len()
    }

    /// `partition`'s claims in its next execution; the partition counts as started from now.
    pub(crate) fn start(&self, partition: usize) -> Claims {
        let partitions = self.runs.len();
        let partition = partition.min(partitions - 1);
        let run = self.runs[partition].fetch_add(1, Ordering::Relaxed);
        let mut executions = self.executions.lock().unwrap_or_else(|e| e.into_inner());
        while executions.len() <= run {
            executions.push(Arc::new(Execution {
                started: (0..partitions).map(|_| AtomicBool::new(false)).collect(),
                taken: (0..partitions).map(|_| AtomicUsize::new(0)).collect(),
            }));
        }
        let execution = Arc::clone(&executions[run]);
        execution.started[partition].store(true, Ordering::Release);
        Claims {
            execution,
            partition,
        }
    }
}

/// One partition's claims of probe sets in one execution (see [`ProbeClaims`]).
#[derive(Debug, Clone)]
pub(crate) struct Claims {
    execution: Arc<Execution>,
    partition: usize,
}

impl Claims {
    /// The next range of the `len` probe sets for this partition: from its home while any is
    /// left, then from the homes of the started partitions; an empty range at `len` when
    /// none is left.
    pub(crate) fn next(&self, len: usize) -> (usize, usize) {
        self.next_at_least(len, MIN_CLAIM)
    }

    /// [`Claims::next`] with claims of at least `min` sets (while a home has that many
    /// left): the device's calls, each a launch, want more work than a CPU's.
    pub(crate) fn next_at_least(&self, len: usize, min: usize) -> (usize, usize) {
        let e = &self.execution;
        let partitions = e.taken.len();
        let home = |q: usize| (len * q / partitions, len * (q + 1) / partitions);
        let (lo, hi) = home(self.partition);
        if let Some(r) = claim(&e.taken[self.partition], lo, hi, partitions, min) {
            return r;
        }
        for step in 1..partitions {
            let q = (self.partition + step) % partitions;
            if !e.started[q].load(Ordering::Acquire) {
                continue;
            }
            let (lo, hi) = home(q);
            if let Some(r) = claim(&e.taken[q], lo, hi, partitions, min) {
                return r;
            }
        }
        (len, len)
    }
}

/// Claim the next range of the home `lo..hi` whose first `taken` sets are claimed: a
/// `4 * partitions`-th of what is left, within [`min`, `MAX_CLAIM`] (everything for one
/// partition); `None` when none is left. Homes differ in cost (the sets are ordered by
/// length), and a quarter of the costliest home in one claim held up a 16-partition join by
/// a fifth.
fn claim(
    taken: &AtomicUsize,
    lo: usize,
    hi: usize,
    partitions: usize,
    min: usize,
) -> Option<(usize, usize)> {
    let size = hi - lo;
    let mut done = taken.load(Ordering::Relaxed);
    loop {
        if done >= size {
            return None;
        }
        let left = size - done;
        let n = if partitions <= 1 {
            left
        } else {
            (left / (4 * partitions))
                .clamp(min.min(MAX_CLAIM), MAX_CLAIM)
                .min(left)
        };
        match taken.compare_exchange_weak(done, done + n, Ordering::Relaxed, Ordering::Relaxed) {
            Ok(_) => return Some((lo + done, lo + done + n)),
            Err(now) => done = now,
        }
    }
}

/// How many candidates ahead the CPU verification prefetches the candidate's set. Measured
/// (gcide_words Dice 0.5, one core, verify_time, scalar / AVX2 / AVX-512 merge): none
/// 7.2 / 4.7 / 5.9 s, 4 ahead 3.3 / 3.6 / 3.1 s, 8 ahead 3.7 / 2.7 / 3.2 s, 16 ahead
/// 3.8 / 2.7 / 3.4 s (one run each; the sets are scattered over a 16 MB collection).
const PREFETCH_AHEAD: usize = 8;

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
    /// The plan's claims of probe sets, shared by its partitions.
    claims: Arc<ProbeClaims>,
    batch_size: usize,
    context: Arc<TaskContext>,
    scratch: Scratch,
    scratch_reservation: Option<MemoryReservation>,
    backend: BackendChoice,
    verifier: Verifier,
    /// The CPU's verification kernel (`tuning.cpu_kernel` at execution).
    kernel: BoundedKernel,
    /// The filter-only knob (see [`FilterOnly`]).
    #[cfg(feature = "tuning")]
    filter_only: FilterOnly,
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
    /// The probe loop's clock, in [`ticks`]: the end of the last timed step. One read per
    /// probe set without candidates, two per probe set with some (the filter's and the
    /// verification's ends); the loop's own steps count as filtering.
    clock: u64,
    /// When this poll's probe loop began: the loop's wall time is split between filtering
    /// and verification in the ratio of their ticks.
    loop_start: Instant,
    /// Filter and verification ticks, candidates met and verified in this poll, added to
    /// the metrics when it ends (not per probe set: an atomic add each).
    filter_ticks: u64,
    verify_ticks: u64,
    candidates_met: usize,
    candidates_verified: usize,
    gpu_chunks: Count,
    gpu_pairs: Count,
    /// Probe sets the device probed (the join on the device).
    gpu_probe_sets: Count,
    bytes_to_device: Count,
    bytes_from_device: Count,
    gpu_kernel_time: Time,
    gpu_call_time: Time,
    gpu_wait_time: Time,
    /// Copying the sets (and the prefix indexes) to the device, by the partition that did.
    gpu_upload_time: Time,
}

/// A cheap count that grows with time, for splitting the probe loop's time between filtering
/// and verification: the time-stamp counter on x86-64 (~9 ns a read on this project's machine
/// against ~24 ns for `Instant::now`, which the loop read 100,000 times in a debian_deps query:
/// 2-4% of its samples), else nanoseconds. Only the ratio of two counts within one poll is used,
/// so the counter's rate does not matter.
#[inline]
fn ticks() -> u64 {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: RDTSC exists on every x86-64 CPU and only reads the counter.
        unsafe { core::arch::x86_64::_rdtsc() }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        static EPOCH: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();
        EPOCH.get_or_init(Instant::now).elapsed().as_nanos() as u64
    }
}

/// The share of `wall` that `part` of `total` ticks took; `None` when it took none.
fn share_of(wall: Duration, part: u64, total: u64) -> Option<Duration> {
    if part == 0 || total == 0 {
        return None;
    }
    let nanos = wall.as_nanos() * u128::from(part.min(total)) / u128::from(total);
    Some(Duration::from_nanos(
        u64::try_from(nanos).unwrap_or(u64::MAX),
    ))
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
        claims: Arc<ProbeClaims>,
        backend: BackendChoice,
        context: Arc<TaskContext>,
        metrics: &ExecutionPlanMetricsSet,
    ) -> Result<Self> {
        let kernel = BoundedKernel::resolve(crate::config::cpu_kernel(
            context.session_config().options(),
        ));
        Ok(Self {
            schema,
            state: State::Building(build),
            threshold,
            materialize: !columns.is_empty(),
            exact: columns.contains(&JoinColumn::Similarity),
            columns,
            partition,
            claims,
            batch_size: context.session_config().batch_size().max(1),
            context,
            scratch: Scratch::default(),
            scratch_reservation: None,
            backend,
            verifier: Verifier::Cpu,
            kernel,
            #[cfg(feature = "tuning")]
            filter_only: crate::tuning::sj_filter_only(),
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
            clock: 0,
            loop_start: Instant::now(),
            filter_ticks: 0,
            verify_ticks: 0,
            candidates_met: 0,
            candidates_verified: 0,
            gpu_chunks: MetricBuilder::new(metrics).counter("gpu_chunks", partition),
            gpu_pairs: MetricBuilder::new(metrics).counter("gpu_pairs", partition),
            gpu_probe_sets: MetricBuilder::new(metrics).counter("gpu_probe_sets", partition),
            bytes_to_device: MetricBuilder::new(metrics).counter("bytes_to_device", partition),
            bytes_from_device: MetricBuilder::new(metrics).counter("bytes_from_device", partition),
            gpu_kernel_time: MetricBuilder::new(metrics).subset_time("gpu_kernel_time", partition),
            gpu_call_time: MetricBuilder::new(metrics).subset_time("gpu_call_time", partition),
            gpu_wait_time: MetricBuilder::new(metrics).subset_time("gpu_wait_time", partition),
            gpu_upload_time: MetricBuilder::new(metrics).subset_time("gpu_upload_time", partition),
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
        // Started first: while this partition uploads to the device, the others may take
        // its home.
        let claims = self.claims.start(self.partition);
        self.verifier = self.choose_verifier(&built);
        let len = built.collections.len();
        let (next, end) = if matches!(self.verifier, Verifier::Device(_)) {
            claims.next_at_least(len, DEVICE_MIN_CLAIM)
        } else {
            claims.next(len)
        };
        self.state = State::Probing {
            built,
            claims,
            next,
            end,
        };
        Ok(())
    }

    /// The GPU verifier when the backend and the data call for it and the device takes the
    /// sets; else the CPU (the reason in the debug log).
    fn choose_verifier(&self, built: &Built) -> Verifier {
        let (tokens, starts) = built.collections.raw();
        let work = *built
            .probe_work
            .get_or_init(|| built.collections.probe_work());
        let partitions = self.claims.partitions();
        let wanted =
            crate::placement::join_partition_on_gpu(self.backend, work, self.partition, partitions);
        log::debug!(
            "datafusion-sets: similarity_join probe work {work}: partition {} of {partitions} \
             on the {}",
            self.partition,
            if wanted { "gpu" } else { "cpu" }
        );
        if !wanted || built.collections.len() == 0 {
            return Verifier::Cpu;
        }
        // `auto` never makes a join wait for the kernels' first compile: the CPU takes this
        // join while they compile, for the next ones. Kernels an earlier process compiled load
        // from the kernel cache in milliseconds, and this join takes them.
        if self.backend == BackendChoice::Auto && !gpu::kernels_ready_or_cached() {
            gpu::prepare_kernels();
            log::debug!("datafusion-sets: similarity_join on the CPU while its kernels compile");
            return Verifier::Cpu;
        }
        #[cfg(feature = "tuning")]
        if self.filter_only == FilterOnly::Count {
            return Verifier::Cpu;
        }
        // One partition uploads the sets; the others share them (so the upload's bytes are
        // counted once, by the partition that made it).
        let mut uploaded = 0;
        let sets = built.device_sets.get_or_init(|| {
            let _timer = self.gpu_upload_time.timer();
            let sets = gpu::upload_sets(tokens, starts).map(Arc::new);
            uploaded = sets.as_ref().map_or(0, |s| s.bytes());
            sets
        });
        self.bytes_to_device.add(uploaded as usize);
        let sets = match sets {
            Ok(s) => Arc::clone(s),
            Err(e) => {
                log::debug!("datafusion-sets: similarity_join verifies on the CPU: {e}");
                return Verifier::Cpu;
            }
        };
        if crate::tuning::sj_device_filter()
            && let Some(device) = self.device_probe(built, &sets)
        {
            return Verifier::Device(Box::new(device));
        }
        let reservation =
            MemoryConsumer::new(format!("SimilarityJoinExec[gpu chunks {}]", self.partition))
                .register(self.context.memory_pool());
        // Two chunks live at a time (one filling, one at the device or spare) plus the
        // device's answers.
        let per_pair = 2 * size_of::<PairToVerify>() + size_of::<u32>();
        let mut capacity = CHUNK_PAIRS;
        while reservation
            .try_grow(PairBuffer::allocation_for(capacity) * per_pair)
            .is_err()
        {
            capacity /= 4;
            if capacity < MIN_CHUNK_PAIRS {
                log::debug!(
                    "datafusion-sets: similarity_join verifies on the CPU: the memory pool \
                     refused the GPU chunk buffers"
                );
                return Verifier::Cpu;
            }
        }
        Verifier::Gpu(Box::new(GpuVerify {
            sets,
            chunk: PairBuffer::new(capacity, true),
            spare: None,
            capacity,
            inflight: None,
            _reservation: reservation,
        }))
    }

    /// The whole join on the device, when its indexes go there (one partition uploads them,
    /// the others share them) and the memory pool grants room for the pairs of a call; else
    /// `None` (the reason in the debug log).
    fn device_probe(&self, built: &Built, sets: &DeviceSets) -> Option<DeviceProbe> {
        let coll = &built.collections;
        if coll.routed() {
            log::debug!(
                "datafusion-sets: similarity_join filters on the CPU: a prefix-partitioned \
                 build indexes only its own bucket's tokens, and the device's probe counts \
                 every common prefix token"
            );
            return None;
        }
        let mut uploaded = 0;
        let join = built.device_join.get_or_init(|| {
            let _timer = self.gpu_upload_time.timer();
            let views = coll.index_views();
            let join = gpu::upload_join(sets, coll.sides(), &views).map(Arc::new);
            uploaded = join.as_ref().map_or(0, |j| j.bytes());
            join
        });
        self.bytes_to_device.add(uploaded as usize);
        let join = match join {
            Ok(j) => Arc::clone(j),
            Err(e) => {
                log::debug!("datafusion-sets: similarity_join filters on the CPU: {e}");
                return None;
            }
        };
        let reservation =
            MemoryConsumer::new(format!("SimilarityJoinExec[gpu pairs {}]", self.partition))
                .register(self.context.memory_pool());
        // A call's pairs: in page-locked memory, then as a vector.
        let per_pair = 2 * 3 * size_of::<u32>();
        let mut cap = crate::tuning::knobs()
            .sj_device_pairs
            .map_or(DEVICE_PAIRS, |c| c.clamp(1, DEVICE_PAIRS as u64) as usize);
        while reservation.try_grow(cap * per_pair).is_err() {
            if cap <= MIN_DEVICE_PAIRS {
                log::debug!(
                    "datafusion-sets: similarity_join filters on the CPU: the memory pool \
                     refused the buffers for the device's pairs"
                );
                return None;
            }
            cap = (cap / 4).max(MIN_DEVICE_PAIRS);
        }
        Some(DeviceProbe {
            join,
            cap,
            // A count needs the pairs back only to orient or filter them.
            emit: self.materialize
                || built.pair_rule.is_some()
                || built.id_order.as_ref().is_some_and(|order| {
                    !*built
                        .every_pair_kept
                        .get_or_init(|| order.pairs_every_two_sets())
                }),
            _reservation: reservation,
        })
    }

    /// Probe sets `from..to` on the device, filter and verification. A range whose pairs
    /// pass a call's capacity is probed again in halves, a single probe set with that many
    /// on the CPU; when the device fails, the CPU probes the range and the rest of the join.
    fn probe_on_device(&mut self, built: &Built, from: usize, to: usize) {
        let mut ranges = vec![(from, to)];
        while let Some((a, b)) = ranges.pop() {
            let Verifier::Device(device) = &self.verifier else {
                // The device failed earlier in this range: the CPU probes what is left.
                self.clock = ticks();
                for p in a..b {
                    self.probe(built, p);
                }
                continue;
            };
            let answer = gpu::probe_sets(
                &device.join,
                &self.threshold,
                (a, b),
                self.exact,
                device.emit,
                device.cap,
            );
            let emit = device.emit;
            match answer {
                Ok(found) if found.overflow => {
                    if b - a > 1 {
                        let mid = a + (b - a) / 2;
                        ranges.push((mid, b));
                        ranges.push((a, mid));
                    } else {
                        // One probe set with more pairs than a call returns.
                        self.clock = ticks();
                        let device = std::mem::replace(&mut self.verifier, Verifier::Cpu);
                        self.probe(built, a);
                        self.verifier = device;
                    }
                }
                Ok(found) => {
                    gpu::count_simjoin_chunk();
                    let t = &found.timings;
                    self.gpu_chunks.add(1);
                    self.gpu_pairs.add(found.verified as usize);
                    self.gpu_probe_sets.add(b - a);
                    self.candidates.add(found.verified as usize);
                    self.verified.add(found.verified as usize);
                    self.bytes_from_device.add(t.d2h_bytes as usize);
                    self.gpu_kernel_time
                        .add_duration(Duration::from_secs_f64(t.kernel_ms / 1e3));
                    self.gpu_call_time
                        .add_duration(Duration::from_secs_f64(t.total_ms / 1e3));
                    self.gpu_wait_time
                        .add_duration(Duration::from_secs_f64(t.wait_ms / 1e3));
                    if emit {
                        for &(p, q, o) in &found.pairs {
                            self.record(built, p, q, u64::from(o));
                        }
                    } else {
                        self.pending += found.passed as usize;
                    }
                }
                Err(e) => {
                    log::debug!(
                        "datafusion-sets: similarity_join on the GPU failed ({e}); the CPU \
                         probes the rest"
                    );
                    self.verifier = Verifier::Cpu;
                    ranges.push((a, b));
                }
            }
        }
        self.flush_probe_metrics();
    }

    /// Probe set `p`: its candidates are verified now (CPU) or queued for the device.
    /// Returns the work it took.
    fn probe(&mut self, built: &Built, p: usize) -> usize {
        let coll = &built.collections;
        let met = coll.filter(p, &self.threshold, &mut self.scratch);
        let t1 = ticks();
        self.filter_ticks += t1.wrapping_sub(self.clock);
        self.clock = t1;
        self.candidates_met += met;
        self.candidates_verified += self.scratch.candidates.len();
        let work = 1 + met + self.scratch.candidates.len();
        #[cfg(feature = "tuning")]
        if self.filter_only != FilterOnly::Off {
            if let (FilterOnly::Serialize, Verifier::Gpu(gv)) =
                (self.filter_only, &mut self.verifier)
            {
                gv.queue(p as u32, &self.scratch.candidates);
            }
            if self.materialize {
                let c = std::mem::take(&mut self.scratch.candidates);
                for c in &c {
                    self.record(built, p as u32, c.set, u64::from(c.overlap));
                }
                self.scratch.candidates = c;
            } else {
                // Counting: every candidate is a pair (the self-join's id check skipped too).
                self.pending += self.scratch.candidates.len();
            }
            return work;
        }
        if let Verifier::Gpu(gv) = &mut self.verifier {
            gv.queue(p as u32, &self.scratch.candidates);
            return work;
        }
        let x = coll.set(p);
        let (exact, kernel) = (self.exact, self.kernel);
        let candidates = std::mem::take(&mut self.scratch.candidates);
        for (n, c) in candidates.iter().enumerate() {
            // The candidates' sets are scattered over the collection: fetch a few ahead.
            if let Some(a) = candidates.get(n + PREFETCH_AHEAD) {
                coll.prefetch_set(a.set as usize, a.from_y as usize);
            }
            let y = coll.set(c.set as usize);
            let verified = if exact {
                verify_candidate::<true>(kernel, x, y, c)
            } else {
                verify_candidate::<false>(kernel, x, y, c)
            };
            if let Some(o) = verified {
                self.record(built, p as u32, c.set, o);
            }
        }
        if !candidates.is_empty() {
            let t2 = ticks();
            self.verify_ticks += t2.wrapping_sub(t1);
            self.clock = t2;
        }
        self.scratch.candidates = candidates;
        work
    }

    /// Add the probe loop's times and counts to the metrics.
    fn flush_probe_metrics(&mut self) {
        self.candidates
            .add(std::mem::take(&mut self.candidates_met));
        self.verified
            .add(std::mem::take(&mut self.candidates_verified));
        let (filter, verify) = (
            std::mem::take(&mut self.filter_ticks),
            std::mem::take(&mut self.verify_ticks),
        );
        let wall = self.loop_start.elapsed();
        for (part, metric) in [(filter, &self.filter_time), (verify, &self.verify_time)] {
            if let Some(d) = share_of(wall, part, filter.saturating_add(verify)) {
                metric.add_duration(d);
            }
        }
    }

    /// Record the verified pair of sets `p` (the probe) and `q` with overlap `o`.
    #[inline]
    fn record(&mut self, built: &Built, p: u32, q: u32, o: u64) {
        let coll = &built.collections;
        let (l, r) = match &built.id_order {
            Some(order) => match order.orient(p, q) {
                Some(pair) => pair,
                None => return,
            },
            None if coll.side(p as usize) == 0 => (p, q),
            None => (q, p),
        };
        let rows = match &built.pair_rule {
            Some(rule) => match rule.rows(coll, l, r) {
                Some(rows) => rows,
                None => return,
            },
            None => (coll.row(l as usize), coll.row(r as usize)),
        };
        self.pending += 1;
        if self.materialize {
            self.left_rows.push(rows.0);
            self.right_rows.push(rows.1);
            if self.exact {
                let n = coll.set(p as usize).len() as u64;
                let m = coll.set(q as usize).len() as u64;
                match self.threshold.measure() {
                    Measure::Overlap => self.overlaps.push(o),
                    measure => self.scores.push(measure.score(o, n, m)),
                }
            }
        }
    }

    /// The pairs of a verified chunk: the device's answers, or the CPU's when the device
    /// failed (then the CPU verifies the rest of the join too).
    fn take_chunk(&mut self, built: &Built, result: gpu::VerifyAnswer) {
        let (chunk, answer) = result;
        match answer {
            Ok((passed, t)) => {
                gpu::count_simjoin_chunk();
                self.gpu_chunks.add(1);
                self.gpu_pairs.add(chunk.len());
                self.bytes_to_device.add(t.h2d_bytes as usize);
                self.bytes_from_device.add(t.d2h_bytes as usize);
                self.gpu_kernel_time
                    .add_duration(std::time::Duration::from_secs_f64(t.kernel_ms / 1e3));
                self.gpu_call_time
                    .add_duration(std::time::Duration::from_secs_f64(t.total_ms / 1e3));
                self.gpu_wait_time
                    .add_duration(std::time::Duration::from_secs_f64(t.wait_ms / 1e3));
                let pairs = chunk.as_slice();
                if let Some(groups) = chunk.groups() {
                    groups.each_probe(&passed, |x, i, o| {
                        self.record(built, x, pairs[i as usize].y, u64::from(o))
                    });
                }
                // The buffer goes back to the pool of this partition.
                if let (Ok(mut buffer), Verifier::Gpu(gv)) =
                    (Arc::try_unwrap(chunk), &mut self.verifier)
                {
                    buffer.clear();
                    gv.spare = Some(buffer);
                }
            }
            Err(e) => {
                let why = e.to_string();
                log::debug!(
                    "datafusion-sets: similarity_join GPU verification failed ({why}); the CPU \
                     verifies the rest"
                );
                self.verify_on_cpu(built, &chunk);
                if let Verifier::Gpu(gv) = &mut self.verifier {
                    let rest = std::mem::replace(&mut gv.chunk, PairBuffer::new(0, false));
                    self.verifier = Verifier::Cpu;
                    self.verify_on_cpu(built, &rest);
                }
            }
        }
    }

    /// Verify a chunk's pairs here (the device failed): each pair's whole sets, as the
    /// device would have.
    fn verify_on_cpu(&mut self, built: &Built, chunk: &PairBuffer) {
        let t0 = Instant::now();
        let coll = &built.collections;
        let pairs = chunk.as_slice();
        let Some(groups) = chunk.groups() else {
            // Only a chunk with no pair has no groups (pairs are pushed after a group).
            debug_assert!(pairs.is_empty());
            return;
        };
        for (g, (&start, &px)) in groups.starts.iter().zip(groups.probes).enumerate() {
            let end = groups
                .starts
                .get(g + 1)
                .map_or(pairs.len(), |&e| e as usize);
            let x = coll.set(px as usize);
            for n in start as usize..end {
                if let Some(a) = pairs.get(n + PREFETCH_AHEAD) {
                    coll.prefetch_set(a.y as usize, 0);
                }
                let pair = pairs[n];
                let c = Candidate {
                    set: pair.y,
                    alpha: pair.alpha,
                    overlap: 0,
                    from_x: 0,
                    from_y: 0,
                };
                let y = coll.set(pair.y as usize);
                let verified = if self.exact {
                    verify_candidate::<true>(self.kernel, x, y, &c)
                } else {
                    verify_candidate::<false>(self.kernel, x, y, &c)
                };
                if let Some(o) = verified {
                    self.record(built, px, pair.y, o);
                }
            }
        }
        self.verify_time.add_elapsed(t0);
    }

    /// Move the GPU pipeline on once the chunk being filled is full, or at the end
    /// (`flush`): take the answer of the chunk at the device (waiting for it, asleep, if it
    /// is not done yet: it had the whole filling of this chunk to finish), then queue this
    /// one; at the end, wait for it too.
    fn advance_gpu(&mut self, built: &Built, flush: bool) {
        let Verifier::Gpu(gv) = &mut self.verifier else {
            return;
        };
        if !(gv.chunk.is_full() || flush) {
            return;
        }
        #[cfg(feature = "tuning")]
        if self.filter_only == FilterOnly::Serialize {
            // Written, not sent (benchmarks: the filter with the serialization).
            gv.chunk.clear();
            return;
        }
        if let Some(pending) = gv.inflight.take() {
            self.take_chunk(built, pending.finish());
        }
        // The answer may have been a failure: then the CPU verified everything.
        let Verifier::Gpu(gv) = &mut self.verifier else {
            return;
        };
        if gv.chunk.is_empty() {
            return;
        }
        let next = gv
            .spare
            .take()
            .unwrap_or_else(|| PairBuffer::new(gv.capacity, true));
        let chunk = Arc::new(std::mem::replace(&mut gv.chunk, next));
        let pending = gpu::submit_pairs(&gv.sets, chunk, self.exact);
        if flush {
            self.take_chunk(built, pending.finish());
        } else {
            gv.inflight = Some(pending);
        }
    }

    /// Whether the GPU pipeline holds pairs not yet verified.
    fn gpu_busy(&self) -> bool {
        matches!(&self.verifier, Verifier::Gpu(gv) if gv.inflight.is_some() || !gv.chunk.is_empty())
    }

    /// Whether the chunk being filled is full (filtering waits for the device).
    fn chunk_full(&self) -> bool {
        matches!(&self.verifier, Verifier::Gpu(gv) if gv.chunk.is_full())
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
        match &mut self.state {
            State::Done => Poll::Ready(None),
            State::Building(fut) => match fut.as_mut().poll(cx) {
                Poll::Pending => Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.state = State::Done;
                    Poll::Ready(Some(Err(e)))
                }
                Poll::Ready(Ok(built)) => {
                    if let Err(e) = self.start_probing(built) {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    // Yield once before probing. The build finished inside one
                    // partition's poll, and the other partitions' tasks, woken from it,
                    // wait where an idle worker cannot take them (tokio's LIFO slot of this
                    // worker) until this poll returns: probing here first kept the other
                    // cores idle for a whole probe step (1.4-3 ms of a 60 ms gcide_words
                    // query on two cores). Yielding queues this task where it can be
                    // stolen and runs the woken one.
                    cx.waker().wake_by_ref();
                    Poll::Pending
                }
            },
            State::Probing {
                built,
                claims,
                next,
                end,
            } => {
                let (built, claims) = (Arc::clone(built), claims.clone());
                let (mut p, mut end) = (*next, *end);
                let elapsed = self.baseline.elapsed_compute().clone();
                let timer = elapsed.timer();
                let mut work = 0;
                let len = built.collections.len();
                if self.pending < self.batch_size {
                    self.advance_gpu(&built, p >= len);
                }
                self.loop_start = Instant::now();
                self.clock = ticks();
                if matches!(self.verifier, Verifier::Device(_)) {
                    // The device takes a claimed range at a time; the poll ends after it.
                    if self.pending < self.batch_size && p < len {
                        self.probe_on_device(&built, p, end);
                        (p, end) = claims.next_at_least(len, DEVICE_MIN_CLAIM);
                    }
                    work = WORK_PER_POLL;
                }
                while self.pending < self.batch_size
                    && p < len
                    && work < WORK_PER_POLL
                    && !self.chunk_full()
                {
                    work += self.probe(&built, p);
                    p += 1;
                    if p == end {
                        (p, end) = claims.next(len);
                    }
                }
                if let State::Probing { next, end: e, .. } = &mut self.state {
                    (*next, *e) = (p, end);
                }
                self.flush_probe_metrics();
                if self.pending < self.batch_size && (p >= len || self.chunk_full()) {
                    self.advance_gpu(&built, p >= len);
                }
                let finished = p >= len && !self.gpu_busy();
                let result = if self.pending >= self.batch_size {
                    Some(self.emit(&built, self.batch_size))
                } else if finished && self.pending > 0 {
                    Some(self.emit(&built, self.pending))
                } else {
                    None
                };
                timer.done();
                if let Some(batch) = result {
                    return Poll::Ready(Some(batch));
                }
                if finished {
                    self.state = State::Done;
                    self.scratch = Scratch::default();
                    self.scratch_reservation = None;
                    self.verifier = Verifier::Cpu;
                    self.baseline.done();
                    return Poll::Ready(None);
                }
                // Out of budget for this poll: let other tasks (and cancellation) in.
                cx.waker().wake_by_ref();
                Poll::Pending
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

#[cfg(test)]
mod tests {
    use super::*;

    /// Every range a partition claims until it gets none, on its own thread.
    fn drain(claims: Claims, len: usize) -> Vec<(usize, usize)> {
        let mut mine = Vec::new();
        loop {
            let (a, b) = claims.next(len);
            if a == b {
                assert_eq!(a, len);
                return mine;
            }
            mine.push((a, b));
        }
    }

    /// The ranges cover `0..len` once, each within the claim sizes.
    fn assert_cover(mut ranges: Vec<(usize, usize)>, len: usize, what: &str) {
        ranges.sort_unstable();
        let mut at = 0;
        for &(a, b) in &ranges {
            assert_eq!(a, at, "{what}: {ranges:?}");
            assert!(b - a <= MAX_CLAIM, "{what}");
            at = b;
        }
        assert_eq!(at, len, "{what}");
    }

    /// Partitions of one instance claiming at once get disjoint ranges that cover every
    /// probe set, within the claim sizes; one partition claims all at once.
    #[test]
    fn claims_cover_every_probe_set_once() {
        for (len, partitions) in [(0, 2), (1, 2), (15, 2), (100_000, 2), (58_048, 3), (999, 8)] {
            let claims = ProbeClaims::new(partitions);
            let all: Vec<Claims> = (0..partitions).map(|p| claims.start(p)).collect();
            let ranges: Vec<(usize, usize)> = std::thread::scope(|s| {
                let handles: Vec<_> = all
                    .into_iter()
                    .map(|c| s.spawn(move || drain(c, len)))
                    .collect();
                handles
                    .into_iter()
                    .flat_map(|h| h.join().unwrap())
                    .collect()
            });
            assert_cover(ranges, len, &format!("{len} sets, {partitions} partitions"));
        }
        let claims = ProbeClaims::new(1).start(0);
        assert_eq!(claims.next(100_000), (0, 100_000));
        assert_eq!(claims.next(100_000), (100_000, 100_000));
    }

    /// A partition that finishes its home takes work only from partitions this instance
    /// started: run each partition in its own instance (an engine's copy per task) and
    /// every set is probed once across the copies; in one instance the first partition to
    /// start, draining before the others start, takes nothing of theirs.
    #[test]
    fn copies_per_partition_probe_each_set_once() {
        for (len, partitions) in [(10, 3), (100_000, 4), (58_048, 3)] {
            let ranges: Vec<(usize, usize)> = (0..partitions)
                .flat_map(|p| drain(ProbeClaims::new(partitions).start(p), len))
                .collect();
            assert_cover(ranges, len, &format!("copies: {len} sets, {partitions}"));
            let one = ProbeClaims::new(partitions);
            let first = drain(one.start(1), len);
            assert!(
                first
                    .iter()
                    .all(|&(a, b)| a >= len / partitions && b <= 2 * len / partitions)
            );
            let mut rest = first;
            for p in (0..partitions).filter(|&p| p != 1) {
                rest.extend(drain(one.start(p), len));
            }
            assert_cover(rest, len, &format!("late starts: {len} sets, {partitions}"));
        }
    }

    /// Each partition's `k`-th execution joins execution `k` with the others' `k`-th.
    #[test]
    fn each_execution_of_the_partitions_is_its_own() {
        let claims = ProbeClaims::new(2);
        let (a0, b0) = (claims.start(0), claims.start(1));
        assert!(Arc::ptr_eq(&a0.execution, &b0.execution));
        let (b1, a1) = (claims.start(1), claims.start(0));
        assert!(Arc::ptr_eq(&a1.execution, &b1.execution));
        assert!(!Arc::ptr_eq(&a0.execution, &a1.execution));
        // Each execution probes everything again.
        assert_cover(
            drain(a1, 1000).into_iter().chain(drain(b1, 1000)).collect(),
            1000,
            "run 1",
        );
    }

    /// The probe loop's wall time is split in the ratio of the ticks, the shares adding up
    /// to the whole (to a nanosecond per share), and a part with no ticks gets nothing.
    #[test]
    fn shares_of_the_loop_time_follow_the_ticks() {
        let wall = Duration::from_micros(10_000);
        assert_eq!(share_of(wall, 1, 4), Some(Duration::from_micros(2_500)));
        assert_eq!(share_of(wall, 3, 4), Some(Duration::from_micros(7_500)));
        assert_eq!(share_of(wall, 0, 4), None);
        assert_eq!(share_of(wall, 0, 0), None);
        // Counts near u64::MAX do not overflow.
        assert_eq!(share_of(wall, u64::MAX, u64::MAX), Some(wall));
        for (a, b) in [(1u64, 2u64), (7, 13), (123_456_789, 987_654_321)] {
            let (x, y) = (
                share_of(wall, a, a + b).unwrap(),
                share_of(wall, b, a + b).unwrap(),
            );
            let sum = x + y;
            assert!(
                sum <= wall && wall - sum <= Duration::from_nanos(2),
                "{a} {b}: {sum:?}"
            );
        }
    }

    /// Ticks grow with time: a loop that takes a millisecond advances them.
    #[test]
    fn ticks_advance_with_time() {
        let a = ticks();
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_millis(1) {
            std::hint::spin_loop();
        }
        let b = ticks();
        assert!(b > a, "{a} -> {b}");
    }
}
