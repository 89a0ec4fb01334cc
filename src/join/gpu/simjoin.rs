//! Verification of similarity-join candidates on the device (`kernels/simjoin.cu`): the
//! host side, the CUDA implementation of [`super::PairVerifier`].
//!
//! - [`upload_sets`] copies one join's sets (token ranks, CSR) to the device once; they stay
//!   there while the join's [`Sets`] live.
//! - [`verify_pairs`] verifies one chunk of candidate pairs: the chunk goes up in two copies
//!   (pairs; the groups' starts and probe sets), two launches (a block per probe
//!   set for short remainders, a block per pair, merge-path partitioned, for long ones), and
//!   one copy back of the passing pairs (index and overlap), compacted on the device.
//!   Calls from several threads (the join's partitions) run at once, each on a lane of its
//!   own (a stream with pooled pinned and device buffers, taken from a pool that grows to
//!   the number of concurrent callers), so no call waits for another's and one chunk's
//!   copies overlap another's kernels.
//!
//! The answers equal the CPU's `join::filter::verify` of the whole sets (same counts; with
//! `exact = false` a passing pair's count may be any value from `alpha` up to its overlap, as
//! on the CPU).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use cudarc::driver::result;
use cudarc::driver::{CudaEvent, CudaFunction, CudaStream};

use super::{
    PairBuffer, PairGroups, PairToVerify, PassOrder, VerifyAnswer, VerifyTimings, in_chunk_order,
};
use crate::backend::gpu::{
    DevBuf, Gpu, GpuError, Module, Workspace, align, arg, bytes_of, drv, launch_on, panic_message,
    par_copy, ready, view,
};
use crate::tuning::knobs;
/// Threads of the two kernels (`GROUP_THREADS`, `LARGE_THREADS` in the source).
const GROUP_THREADS: u32 = 128;
const LARGE_THREADS: u32 = 256;
/// Pairs whose two sets together hold this many tokens go to the block-per-pair layout;
/// the knob `sj_large_from` overrides it (measurements).
const LARGE_FROM: u64 = 1024;
/// The kernels' counters: large pairs, passing pairs, the bad-pair flag.
const COUNTERS: usize = 3;

pub(super) struct Kernels {
    groups: CudaFunction,
    large: CudaFunction,
    /// The whole join's probe (`probe_join`, driven by `probe.rs`).
    pub(super) probe: CudaFunction,
    /// Blocks of a full grid of each (resident blocks on every SM).
    groups_grid: u32,
    large_grid: u32,
    pub(super) probe_grid: u32,
}

static KERNELS: OnceLock<Result<Kernels, GpuError>> = OnceLock::new();

fn kernels(g: &Gpu) -> Result<&'static Kernels, GpuError> {
    KERNELS
        .get_or_init(|| {
            let module = g.module(Module::Simjoin, Vec::new)?;
            let f = |name: &str| module.load_function(name).map_err(drv("kernel lookup"));
            let (groups, large, probe) =
                (f("verify_groups")?, f("verify_large")?, f("probe_join")?);
            let grid = |k: &CudaFunction, threads: u32| -> Result<u32, GpuError> {
                let per_sm = k
                    .occupancy_max_active_blocks_per_multiprocessor(threads, 0, None)
                    .map_err(drv("occupancy"))?
                    .max(1);
                Ok(g.info.multiprocessors * per_sm)
            };
            Ok(Kernels {
                groups_grid: grid(&groups, GROUP_THREADS)?,
                large_grid: grid(&large, LARGE_THREADS)?,
                probe_grid: grid(&probe, super::probe::PROBE_THREADS)?,
                groups,
                large,
                probe,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// Whether the join's kernels are compiled and loaded (their first use compiles them, 0.4 to
/// 5 s).
pub(super) fn kernels_ready() -> bool {
    matches!(KERNELS.get(), Some(Ok(_)))
}

/// Whether the join's kernels are loaded or load from the kernel cache (milliseconds); then
/// they are loaded now, and the answer is whether that worked.
pub(super) fn kernels_load_fast() -> bool {
    let Ok(g) = ready() else {
        return false;
    };
    if !g.module_loads_fast(Module::Simjoin, Vec::new) {
        return false;
    }
    g.ctx.bind_to_thread().is_ok() && kernels(g).is_ok()
}

/// Compile the join's kernels on a thread of their own, once per process (a failure is kept,
/// as a first use's would be).
pub(super) fn prepare_kernels() {
    static STARTED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
    if KERNELS.get().is_some() || STARTED.swap(true, std::sync::atomic::Ordering::Relaxed) {
        return;
    }
    let spawned = std::thread::Builder::new()
        .name("dfsets-simjoin-compile".into())
        .spawn(|| {
            let compiled = ready().and_then(|g| {
                g.ctx.bind_to_thread().map_err(drv("bind context"))?;
                kernels(g).map(|_| ())
            });
            if let Err(e) = compiled {
                log::debug!("datafusion-sets: the similarity join's kernels: {e}");
            }
        });
    if spawned.is_err() {
        STARTED.store(false, std::sync::atomic::Ordering::Relaxed);
    }
}

/// One lane: a stream and the pooled device and pinned buffers of the chunks it runs.
pub(super) struct Lane {
    pub(super) stream: Arc<CudaStream>,
    pub(super) ws: Workspace,
    /// How many passing pairs to copy back with the counters, before knowing how many
    /// passed (twice the last chunk's, at least [`MIN_GUESS`]); more take a second copy.
    guess: usize,
    /// Puts the passing pairs in chunk order.
    order: PassOrder,
}

/// The fewest passing pairs a lane copies back with the counters.
const MIN_GUESS: usize = 4096;

// SAFETY: the stream handle and the workspace's raw allocations are only touched by the one
// call that took the lane from the pool.
unsafe impl Send for Lane {}

/// Lanes not in use. A call takes one (or makes one when none is free) and puts it back.
static LANE_POOL: Mutex<Vec<Lane>> = Mutex::new(Vec::new());
/// The lanes of uploads ([`upload_staged`]), apart from the calls' so that their two staging
/// buffers stay allocated from join to join (page-locking 16 MB anew cost an upload ~10 ms).
static UPLOAD_LANES: Mutex<Vec<Lane>> = Mutex::new(Vec::new());

fn large_from() -> u64 {
    knobs().sj_large_from.unwrap_or(LARGE_FROM)
}

/// One join's sets on the device (freed when dropped).
pub(crate) struct Sets {
    pub(super) tokens: Option<DevBuf>,
    pub(super) starts: Option<DevBuf>,
    /// Number of sets.
    sets: usize,
    bytes: u64,
}

impl std::fmt::Debug for Sets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceSets")
            .field("sets", &self.sets)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Sets {
    /// Bytes copied to the device for the sets.
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Number of sets.
    pub(super) fn len(&self) -> usize {
        self.sets
    }
}

impl Drop for Sets {
    fn drop(&mut self) {
        free_on_device(&mut [&mut self.tokens, &mut self.starts]);
    }
}

/// Free device buffers from any thread: with the context bound to it, else (no usable
/// context) by leaking them rather than freeing them in the wrong context.
pub(super) fn free_on_device(bufs: &mut [&mut Option<DevBuf>]) {
    if let Ok(g) = ready() {
        let _lock = g.workspace.lock();
        if g.ctx.bind_to_thread().is_ok() {
            for b in bufs.iter_mut() {
                **b = None;
            }
        }
    }
    for b in bufs.iter_mut() {
        std::mem::forget(b.take());
    }
}

/// Copy sets to the device: set `s` is `tokens[starts[s]..starts[s + 1]]`, ascending and
/// distinct (the join's token ranks).
pub(super) fn upload_sets(tokens: &[u32], starts: &[usize]) -> Result<Sets, GpuError> {
    if starts.is_empty()
        || starts[starts.len() - 1] != tokens.len()
        || starts
            .windows(2)
            .any(|w| w[0] > w[1] || w[1] - w[0] > u32::MAX as usize)
    {
        return Err(GpuError::Unsupported("malformed set offsets".into()));
    }
    let starts64: Vec<u64> = starts.iter().map(|&s| s as u64).collect();
    let mut bufs = upload_staged(&[bytes_of(tokens), bytes_of(&starts64)], "set")?.into_iter();
    Ok(Sets {
        tokens: bufs.next(),
        starts: bufs.next(),
        sets: starts.len() - 1,
        bytes: (tokens.len() * 4 + starts64.len() * 8) as u64,
    })
}

/// Bytes of each piece [`upload_staged`] stages.
const STAGE_PIECE: usize = 8 << 20;

/// New device buffers holding copies of `parts`, through a lane's two page-locked staging
/// buffers: the CPU's threads copy a piece into one (`par_copy`) while the device takes the
/// other's, so a join's tens of megabytes go up at the bus's speed (a synchronous copy from
/// pageable memory goes through the driver's own staging, on one thread). `what` names the
/// data in errors. The buffers are plain allocations: dropped, each frees itself.
pub(super) fn upload_staged(parts: &[&[u8]], what: &'static str) -> Result<Vec<DevBuf>, GpuError> {
    let (g, _, lane) = take_lane_from(&UPLOAD_LANES)?;
    let (lane, bufs) = guarded(g, lane, |lane| {
        let bufs = parts
            .iter()
            .map(|p| DevBuf::alloc(p.len(), what))
            .collect::<Result<Vec<_>, _>>()?;
        let stream = &lane.stream;
        let cs = stream.cu_stream();
        let ws = &mut lane.ws;
        Workspace::pinned(&mut ws.pin_in, STAGE_PIECE)?;
        Workspace::pinned(&mut ws.pin_aux, STAGE_PIECE)?;
        // The event after each staging buffer's last copy: the buffer is free once it passed.
        let mut copied: [Option<CudaEvent>; 2] = [None, None];
        let mut k = 0;
        for (part, buf) in parts.iter().zip(&bufs) {
            for (i, piece) in part.chunks(STAGE_PIECE).enumerate() {
                let slot = k % 2;
                if let Some(e) = copied[slot].take() {
                    e.synchronize().map_err(drv("event synchronize"))?;
                }
                let pin = if slot == 0 {
                    &mut ws.pin_in
                } else {
                    &mut ws.pin_aux
                };
                let pin = pin
                    .as_mut()
                    .ok_or(GpuError::OutOfMemory("pinned allocation"))?
                    .as_mut_slice();
                let staged = &mut pin[..piece.len()];
                par_copy(staged, piece);
                // SAFETY: `piece.len()` bytes into `buf` at `i * STAGE_PIECE` (within its
                // `part.len()` bytes) from the staging buffer, which is not written again
                // before the event recorded next has passed.
                unsafe {
                    result::memcpy_htod_async(buf.ptr + (i * STAGE_PIECE) as u64, &*staged, cs)
                        .map_err(drv("host-to-device copy"))?;
                }
                let e = g.event()?;
                e.record(stream).map_err(drv("event record"))?;
                copied[slot] = Some(e);
                k += 1;
            }
        }
        g.wait_asleep(stream)?;
        Ok(bufs)
    })?;
    UPLOAD_LANES
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(lane);
    Ok(bufs)
}

/// Verify a chunk of candidate pairs against sets on the device. The answer lists the pairs
/// that reach their `alpha`, as (index in `pairs`, overlap), by ascending index. `groups`:
/// each pair's probe set (see [`PairGroups`]). `exact = false` lets a passing pair stop
/// counting at its `alpha`.
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub(super) fn verify_pairs(
    sets: &Sets,
    pairs: &[PairToVerify],
    groups: PairGroups<'_>,
    exact: bool,
) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
    check_chunk(sets, pairs, groups)?;
    if pairs.is_empty() {
        return Ok((Vec::new(), VerifyTimings::default()));
    }
    let started = Instant::now();
    let (g, k, mut lane) = take_lane()?;
    let launched;
    (lane, launched) = guarded(g, lane, |lane| {
        launch(g, k, lane, sets, pairs, groups, exact)
    })?;
    let (lane, (passed, mut t)) = guarded(g, lane, |lane| collect(g, lane, &launched))?;
    give_back(lane);
    t.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok((passed, t))
}

/// A chunk of pairs at the device: its copies and kernels queued on a lane of its own by
/// [`submit_pairs`], its answer taken by [`Pending::finish`]. The caller goes on (the
/// join filters its next chunk) while the device works. Dropped unfinished, it waits for
/// its stream first, so the device never reads the chunk's memory after it is freed.
pub(crate) struct Pending {
    pairs: Arc<PairBuffer>,
    /// The device's work: `None` when the call failed before anything was queued.
    inflight: Option<Inflight>,
    /// Why the call failed, when it did at submission.
    failed: Option<GpuError>,
    /// Host time spent submitting.
    submit: std::time::Duration,
}

struct Inflight {
    lane: Lane,
    launched: Launched,
    /// The sets the kernels read, kept alive until they are done.
    _sets: Arc<Sets>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PendingVerify")
            .field("pairs", &self.pairs.len())
            .field("queued", &self.inflight.is_some())
            .finish()
    }
}

/// Queue the verification of the chunk `pairs` (its groups as the join recorded them) on a
/// lane and return at once; [`Pending::finish`] waits for the answer, which is
/// [`verify_pairs`]'s. A failure to queue is kept and returned by `finish`.
pub(super) fn submit_pairs(sets: &Arc<Sets>, pairs: Arc<PairBuffer>, exact: bool) -> Pending {
    let started = Instant::now();
    let mut pending = Pending {
        pairs,
        inflight: None,
        failed: None,
        submit: std::time::Duration::ZERO,
    };
    let queued = (|| -> Result<Option<Inflight>, GpuError> {
        let chunk = pending.pairs.as_slice();
        if chunk.is_empty() {
            return Ok(None);
        }
        let groups = pending.pairs.groups().ok_or_else(|| {
            GpuError::Unsupported("candidate pairs outside any probe set's group".into())
        })?;
        check_chunk(sets, chunk, groups)?;
        let (g, k, lane) = take_lane()?;
        let (lane, launched) = guarded(g, lane, |lane| {
            launch(g, k, lane, sets, chunk, groups, exact)
        })?;
        Ok(Some(Inflight {
            lane,
            launched,
            _sets: Arc::clone(sets),
        }))
    })();
    match queued {
        Ok(inflight) => pending.inflight = inflight,
        Err(e) => pending.failed = Some(e),
    }
    pending.submit = started.elapsed();
    pending
}

impl Pending {
    /// Wait (asleep) for the device and take the answer, with the chunk back. The answer's
    /// `total_ms` is the host's time in the call: submitting plus finishing (the wait
    /// included), not the time the chunk spent at the device meanwhile.
    pub(super) fn finish(mut self) -> VerifyAnswer {
        let pairs = Arc::clone(&self.pairs);
        if let Some(e) = self.failed.take() {
            return (pairs, Err(e));
        }
        let Some(Inflight { lane, launched, .. }) = self.inflight.take() else {
            return (pairs, Ok((Vec::new(), VerifyTimings::default())));
        };
        let started = Instant::now();
        let answer = ready().and_then(|g| {
            g.ctx.bind_to_thread().map_err(drv("bind context"))?;
            let (lane, (passed, mut t)) = guarded(g, lane, |lane| collect(g, lane, &launched))?;
            give_back(lane);
            t.total_ms = (self.submit + started.elapsed()).as_secs_f64() * 1e3;
            Ok((passed, t))
        });
        (pairs, answer)
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        if let Some(Inflight { lane, .. }) = self.inflight.take() {
            // Abandoned (the join was cancelled): the stream may still read the chunk.
            match ready() {
                Ok(g) if g.ctx.bind_to_thread().is_ok() && lane.stream.synchronize().is_ok() => {
                    give_back(lane)
                }
                // Unknown state: keep the lane's buffers (and the chunk) alive for good.
                _ => {
                    std::mem::forget(lane);
                    std::mem::forget(Arc::clone(&self.pairs));
                }
            }
        }
    }
}

/// The chunk's own checks on the host: at most `u32::MAX - 1` pairs, well-formed groups.
/// (Each pair's sets are checked by the kernel that reads them: a pass over the chunk here
/// cost the partition's thread about as much as the rest of the call.)
fn check_chunk(
    sets: &Sets,
    pairs: &[PairToVerify],
    groups: PairGroups<'_>,
) -> Result<(), GpuError> {
    if sets.sets >= u32::MAX as usize {
        return Err(GpuError::Unsupported("too many sets".into()));
    }
    if pairs.len() >= u32::MAX as usize {
        return Err(GpuError::Unsupported("too many pairs in one chunk".into()));
    }
    let gs = groups.starts;
    if !pairs.is_empty()
        && (gs.first() != Some(&0)
            || gs.len() != groups.probes.len()
            || gs.windows(2).any(|w| w[0] >= w[1])
            || gs.last().is_some_and(|&l| l as usize >= pairs.len()))
    {
        return Err(GpuError::Unsupported("malformed pair groups".into()));
    }
    Ok(())
}

/// The device, bound to this thread, its kernels and a lane from the pool (a new one when
/// none is free). The kernels are compiled first, so a compile failure costs no lane.
pub(super) fn take_lane() -> Result<(&'static Gpu, &'static Kernels, Lane), GpuError> {
    take_lane_from(&LANE_POOL)
}

fn take_lane_from(
    pool: &Mutex<Vec<Lane>>,
) -> Result<(&'static Gpu, &'static Kernels, Lane), GpuError> {
    let g = ready()?;
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let k = kernels(g)?;
    let free = pool.lock().unwrap_or_else(|p| p.into_inner()).pop();
    let lane = match free {
        Some(lane) => lane,
        None => Lane {
            stream: g.ctx.new_stream().map_err(drv("stream creation"))?,
            ws: Workspace::default(),
            guess: MIN_GUESS,
            order: PassOrder::default(),
        },
    };
    Ok((g, k, lane))
}

pub(super) fn give_back(lane: Lane) {
    LANE_POOL
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .push(lane)
}

/// Run one phase of a call on `lane`, catching panics. On success the lane comes back with
/// the result; on failure it goes back to the pool (out of memory: after its stream is idle
/// and its buffers freed) or, when the stream's state is unknown, is kept for good, and the
/// device is marked broken for driver, kernel and panic failures.
pub(super) fn guarded<R>(
    g: &Gpu,
    mut lane: Lane,
    f: impl FnOnce(&mut Lane) -> Result<R, GpuError>,
) -> Result<(Lane, R), GpuError> {
    let res = catch_unwind(AssertUnwindSafe(|| f(&mut lane)))
        .unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
    match res {
        Ok(r) => Ok((lane, r)),
        Err(e) => {
            if matches!(
                e,
                GpuError::Kernel(_) | GpuError::Panic(_) | GpuError::Driver { .. }
            ) {
                g.mark_broken(&e);
            }
            if matches!(e, GpuError::OutOfMemory(_)) {
                let _ = lane.stream.synchronize();
                lane.ws.clear();
                give_back(lane);
            } else if matches!(e, GpuError::Unsupported(_)) && lane.stream.synchronize().is_ok() {
                // A chunk refused by the kernels: the lane is idle and sound.
                give_back(lane);
            } else {
                // The stream may still be busy (or the context gone): its buffers are never
                // freed under it. The device is marked broken or the call was refused, so
                // this happens at most a few times per process.
                std::mem::forget(lane);
            }
            Err(e)
        }
    }
}

/// What [`launch`] queued, for [`collect`].
struct Launched {
    m: usize,
    /// Passing pairs copied back with the counters (each list at `align(COUNTERS * 4)` and
    /// `align(COUNTERS * 4) + align(guess * 4)` in the lane's pinned output).
    guess: usize,
    events: (CudaEvent, CudaEvent),
    /// Device addresses of the two lists of passing pairs.
    p_pidx: u64,
    p_povl: u64,
    t: VerifyTimings,
}

/// Queue a chunk's copies up, kernels and counters' copy back on `lane`'s stream. `pairs`
/// must stay untouched until the stream is synchronized ([`collect`] does).
fn launch(
    g: &Gpu,
    k: &Kernels,
    lane: &mut Lane,
    sets: &Sets,
    pairs: &[PairToVerify],
    groups: PairGroups<'_>,
    exact: bool,
) -> Result<Launched, GpuError> {
    let mut t = VerifyTimings::default();
    let m = pairs.len();
    let n_groups = groups.starts.len();
    t.groups = n_groups as u64;

    // Input: pairs | group_start (the groups' starts, then m) | group_probe | counters (3
    // u32, zero). The pairs are copied straight from the caller's memory (page-locked when
    // it is a pinned `PairBuffer`), the rest through the lane's pinned staging buffer. Device
    // output: large list (2 m u32: index, probe set) | pass_idx | pass_ovl (m u32 each),
    // filled by the kernels; only the counters and the passing pairs come back.
    let gs_at = align(std::mem::size_of_val(pairs));
    let gp_at = gs_at + align((n_groups + 1) * 4);
    let cnt_at = gp_at + align(n_groups * 4);
    let in_bytes = cnt_at + align(COUNTERS * 4);
    let lists_bytes = in_bytes - gs_at;
    let large_at = 0usize;
    let pidx_at = align(2 * m * 4);
    let povl_at = pidx_at + align(m * 4);
    let out_bytes = povl_at + align(m * 4);
    let ws = &mut lane.ws;
    let d_in = ws.dev("sj_in", in_bytes)?;
    let d_out = ws.dev("sj_out", out_bytes)?;
    {
        let pin =
            &mut Workspace::pinned(&mut ws.pin_in, lists_bytes)?.as_mut_slice()[..lists_bytes];
        pin.fill(0);
        pin[..n_groups * 4].copy_from_slice(bytes_of(groups.starts));
        pin[n_groups * 4..(n_groups + 1) * 4].copy_from_slice(&(m as u32).to_ne_bytes());
        let gp = gp_at - gs_at;
        pin[gp..gp + n_groups * 4].copy_from_slice(bytes_of(groups.probes));
    }
    let stream = &lane.stream;
    let cs = stream.cu_stream();
    let ev = |g: &Gpu| -> Result<CudaEvent, GpuError> { g.event() };
    let (e1, e2) = (ev(g)?, ev(g)?);
    {
        let pin = ws
            .pin_in
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
        // SAFETY: `d_in` holds `in_bytes`: the pairs at 0, the rest from `gs_at`; both
        // sources (the caller's pairs, borrowed for this whole call, and the lane's pinned
        // buffer) stay untouched until the stream is synchronized below.
        unsafe {
            result::memcpy_htod_async(d_in, bytes_of(pairs), cs)
                .map_err(drv("host-to-device copy"))?;
            result::memcpy_htod_async(d_in + gs_at as u64, &pin.as_slice()[..lists_bytes], cs)
                .map_err(drv("host-to-device copy"))?;
        }
    }
    t.h2d_bytes = (std::mem::size_of_val(pairs) + lists_bytes) as u64;
    e1.record(stream).map_err(drv("event record"))?;
    let p_tokens = sets.tokens.as_ref().map_or(0, |b| b.ptr);
    let p_starts = sets.starts.as_ref().map_or(0, |b| b.ptr);
    let p_pairs = d_in;
    let p_gs = d_in + gs_at as u64;
    let p_gp = d_in + gp_at as u64;
    let p_cnt = d_in + cnt_at as u64;
    let p_large = d_out + large_at as u64;
    let p_pidx = d_out + pidx_at as u64;
    let p_povl = d_out + povl_at as u64;
    let groups32 = n_groups as u32;
    let n_sets = sets.sets as u32;
    let exact32 = i32::from(exact);
    let large_from32 = large_from().min(u64::from(u32::MAX)) as u32;
    // SAFETY: the parameters match `verify_groups` and `verify_large` in
    // kernels/simjoin.cu; the input region holds m pairs, n_groups + 1 group starts
    // (ascending, within 0..=m), n_groups probe sets and three zeroed counters
    // (verify_groups reads a group's pairs only when its probe set is < n_sets, a pair's
    // candidate only when it is < n_sets; verify_large only pairs verify_groups listed); the
    // output region holds the large list (2 m u32: at most one entry per pair) and two lists
    // of m u32 (at most one entry per pair); the sets' buffers hold every set's tokens and
    // len + 1 starts.
    unsafe {
        launch_on(
            stream,
            &k.groups,
            groups32.min(k.groups_grid * 4),
            GROUP_THREADS,
            &mut [
                arg(&p_tokens),
                arg(&p_starts),
                arg(&n_sets),
                arg(&p_pairs),
                arg(&p_gs),
                arg(&p_gp),
                arg(&groups32),
                arg(&large_from32),
                arg(&exact32),
                arg(&p_cnt),
                arg(&p_large),
                arg(&p_pidx),
                arg(&p_povl),
            ],
        )?;
        launch_on(
            stream,
            &k.large,
            k.large_grid,
            LARGE_THREADS,
            &mut [
                arg(&p_tokens),
                arg(&p_starts),
                arg(&p_pairs),
                arg(&p_large),
                arg(&p_cnt),
                arg(&p_pidx),
                arg(&p_povl),
            ],
        )?;
    }
    e2.record(stream).map_err(drv("event record"))?;
    // The counters come back, and with them the first `guess` entries of both lists of
    // passing pairs (the kernels write them from the lists' starts): when no more passed,
    // `collect` has its answer after one wait.
    let guess = lane.guess.min(m);
    let (cnt_bytes, list_bytes) = (align(COUNTERS * 4), align(guess * 4));
    let pin = Workspace::pinned(&mut ws.pin_out, cnt_bytes + 2 * list_bytes)?;
    let dst = pin.as_mut_slice();
    // SAFETY: the counters and `guess` u32 of each list (within the output region: each list
    // holds m) into the pinned buffer (`cnt_bytes + 2 * list_bytes`), read after the sync.
    unsafe {
        result::memcpy_dtoh_async(&mut dst[..COUNTERS * 4], p_cnt, cs)
            .map_err(drv("device-to-host copy"))?;
        if guess > 0 {
            let (pidx, povl) = dst[cnt_bytes..].split_at_mut(list_bytes);
            result::memcpy_dtoh_async(&mut pidx[..guess * 4], p_pidx, cs)
                .map_err(drv("device-to-host copy"))?;
            result::memcpy_dtoh_async(&mut povl[..guess * 4], p_povl, cs)
                .map_err(drv("device-to-host copy"))?;
        }
    }
    t.d2h_bytes = (COUNTERS * 4 + 2 * guess * 4) as u64;
    Ok(Launched {
        m,
        guess,
        events: (e1, e2),
        p_pidx,
        p_povl,
        t,
    })
}

/// Wait (asleep) for what [`launch`] queued; copy the passing pairs back when more passed
/// than came with the counters; put them in chunk order.
fn collect(
    g: &Gpu,
    lane: &mut Lane,
    l: &Launched,
) -> Result<(Vec<(u32, u32)>, VerifyTimings), GpuError> {
    let (m, p_pidx, p_povl) = (l.m, l.p_pidx, l.p_povl);
    let mut t = l.t.clone();
    let stream = &lane.stream;
    let cs = stream.cu_stream();
    let ws = &mut lane.ws;
    let waited = Instant::now();
    g.wait_asleep(stream)?;
    t.wait_ms = waited.elapsed().as_secs_f64() * 1e3;
    let mut counters = [0u32; COUNTERS];
    {
        let pin = ws
            .pin_out
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
        bytes_of_mut(&mut counters).copy_from_slice(&pin.as_slice()[..COUNTERS * 4]);
    }
    if counters[2] != 0 {
        return Err(GpuError::Unsupported(
            "candidate pair names a set out of range".into(),
        ));
    }
    let (n_large, n_pass) = (counters[0] as usize, counters[1] as usize);
    if n_large > m || n_pass > m {
        return Err(GpuError::Kernel(format!(
            "similarity-join verification counted {n_large} large and {n_pass} passing pairs of {m}"
        )));
    }
    t.large_pairs = n_large as u64;
    // The lists came back with the counters when at most `guess` passed; else copy them now.
    let (at_idx, at_ovl) = if n_pass <= l.guess {
        let cnt_bytes = align(COUNTERS * 4);
        (cnt_bytes, cnt_bytes + align(l.guess * 4))
    } else {
        let back = align(n_pass * 4) + n_pass * 4;
        let pin = Workspace::pinned(&mut ws.pin_out, back)?;
        let dst = pin.as_mut_slice();
        // SAFETY: n_pass u32 from each of the two passing lists (within the output region)
        // into the pinned buffer (`back` bytes), read after the sync.
        unsafe {
            result::memcpy_dtoh_async(&mut dst[..n_pass * 4], p_pidx, cs)
                .map_err(drv("device-to-host copy"))?;
            result::memcpy_dtoh_async(&mut dst[align(n_pass * 4)..back], p_povl, cs)
                .map_err(drv("device-to-host copy"))?;
        }
        g.wait_asleep(stream)?;
        t.d2h_bytes += (2 * n_pass * 4) as u64;
        (0, align(n_pass * 4))
    };
    lane.guess = (2 * n_pass).max(MIN_GUESS);
    let (e1, e2) = &l.events;
    t.kernel_ms = f64::from(e1.elapsed_ms(e2).map_err(drv("event timing"))?);
    let pin = ws
        .pin_out
        .as_ref()
        .ok_or(GpuError::OutOfMemory("pinned allocation"))?
        .as_slice();
    let idx = view::<u32>(&pin[at_idx..at_idx + n_pass * 4]);
    let ovl = view::<u32>(&pin[at_ovl..at_ovl + n_pass * 4]);
    let Some(passed) = in_chunk_order(idx, ovl, m, &mut lane.order) else {
        return Err(GpuError::Kernel(
            "similarity-join verification answered a pair twice or out of range".into(),
        ));
    };
    Ok((passed, t))
}

pub(super) fn bytes_of_mut(s: &mut [u32]) -> &mut [u8] {
    // SAFETY: a u32 slice viewed as its bytes (no padding; every bit pattern is a valid u32).
    unsafe { std::slice::from_raw_parts_mut(s.as_mut_ptr().cast(), std::mem::size_of_val(s)) }
}
