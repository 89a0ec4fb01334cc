//! Batched BM25 top-k on the device (`kernels/bm25.cu`): the host side, the CUDA
//! implementation of [`super::Bm25Device`].
//!
//! - The index is made resident once per [`Scored`] (per index and parameter set) and kept
//!   between batches: document ordinals (the rank of each doc id, so ordinal order is doc-id
//!   order) and f64 impacts of the resident terms' postings, and per ordinal the doc id and
//!   the weighted static score. When the whole index does not fit the budget, the terms the
//!   queries visit most (counted over the batches seen) are admitted first (the Wang et al.
//!   list cache); a query with a term that is not resident finishes on the CPU.
//! - A batch is uploaded in one copy (block order, items, CSR offsets, modes, list
//!   references, floors), ranked by one launch (one block per query, the longest first; a
//!   query with much work (candidates times the lists each is searched in; an OR query only
//!   with a floor) is split into pieces over ranges of ordinals, a block each, whose answers
//!   a second launch merges on the device: a long query no longer holds one block while all
//!   the others finish), and its results come back packed, written by the device into the
//!   host's pinned buffer (with the knob `bm25_zero_copy` off: one copy down).
//! - Results are bit-identical to the CPU's (`search::topk`): same f64 sums in the same
//!   order, same ties. Queries the kernel does not take (more than [`BM25_MAX_TERMS`]
//!   terms, k above [`BM25_MAX_K`], lists not resident) come back as `None`.
//!
//! The batch's path: [`topk`] takes the locks and the kernels, `run` makes the index
//! resident (`resident`), then stages the batch (`stage`: planned on the host; `planned`:
//! the whole index resident, planned on the device), queues it (`launch`), ranks the CPU's
//! share while the device works and unpacks the answers (`unpack`); `plan` is how a query is
//! cut into pieces.

mod launch;
mod plan;
mod planned;
mod resident;
mod stage;
mod unpack;

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, OnceLock};
use std::time::Instant;

use cudarc::driver::{CudaEvent, CudaFunction, CudaModule};
use rayon::prelude::*;

use super::{BM25_MAX_K, BM25_MAX_TERMS, Bm25Batch, Bm25Cpu, Bm25Output, Bm25Timings};
use crate::backend::gpu::{Gpu, GpuError, Module, Workspace, align, drv, panic_message, ready};
use crate::search::index::InvertedIndex;
use crate::search::rank::Ranked;
use crate::search::scoring::Scored;
use crate::search::topk::{Hit, Mode};
use crate::tuning::knobs;
use launch::{launch, packed_bytes};
use plan::{Plan, piece_work, plan};
use resident::{RESIDENT, Resident, default_budget};
use stage::stage;
use unpack::unpack;

const THREADS: u32 = 256;
/// Bytes of one `ListRef` of the kernel.
const LISTREF_BYTES: usize = 16;
/// Bytes of one `Item` of the kernel.
const ITEM_BYTES: usize = 16;
/// The kernel's candidate buffer (`CAP` in bm25.cu): a split query's pieces hold at most
/// this many answers together.
const CAP: usize = 1024;
/// Most pieces one query is split into.
const MAX_PIECES: usize = 64;
/// `Item::ks` (bm25.cu): the kind in the top two bits, a piece's slot below.
const WHOLE: u32 = 0;
const AND_ONLY: u32 = 1 << 30;
const PIECE: u32 = 2 << 30;

/// The kernels of bm25.cu.
struct Kernels {
    /// The module (its `bm25_trace` global, compiled with the knob `bm25_trace`).
    #[cfg_attr(not(feature = "tuning"), allow(dead_code))]
    module: Arc<CudaModule>,
    topk: CudaFunction,
    /// `bm25_topk` for batches of AND queries only (`bm25_topk_and`).
    topk_and: CudaFunction,
    merge: CudaFunction,
    plan: CudaFunction,
    /// `bm25_clear`: the plan's counters, for a batch the device reads where the host wrote it.
    clear: CudaFunction,
    order: CudaFunction,
    pack: CudaFunction,
}

static KERNEL: OnceLock<Result<Kernels, GpuError>> = OnceLock::new();

/// The kernels, compiled on the first call of the process.
fn kernel(g: &Gpu) -> Result<&'static Kernels, GpuError> {
    KERNEL
        .get_or_init(|| {
            let module = g.module(Module::Bm25, compile_options)?;
            let load = |name| module.load_function(name).map_err(drv("kernel lookup"));
            Ok(Kernels {
                module: module.clone(),
                topk: load("bm25_topk")?,
                topk_and: load("bm25_topk_and")?,
                merge: load("bm25_merge")?,
                plan: load("bm25_plan")?,
                clear: load("bm25_clear")?,
                order: load("bm25_order")?,
                pack: load("bm25_pack")?,
            })
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// A mode as the kernels' `q_mode` (and `bm25_plan`'s `batch_mode`) codes it.
fn mode_code(mode: Mode) -> u8 {
    match mode {
        Mode::And => 0,
        Mode::Or => 1,
        Mode::AndOr => 2,
    }
}

/// A batch naming a term the index does not hold (the caller resolves terms through it).
fn malformed() -> GpuError {
    GpuError::Unsupported("malformed BM25 batch: a term id beyond the index".into())
}

/// NVRTC options beyond C++17, from measurement knobs (anything out of range is ignored):
/// the OR tile (`bm25_tile`, a power of two in 256..=4096), short AND queries' bound
/// (`bm25_short_lead`, at most 64), `bm25_topk_and`'s candidates a thread (`bm25_and_g`,
/// 1..=8), fence entries (`bm25_and_fence`, a power of two in 256..=2048) and blocks a
/// multiprocessor should hold (`bm25_and_min_blocks`, 1..=8).
fn compile_options() -> Vec<String> {
    let k = knobs();
    let knob = |name: &str, v: Option<u32>, ok: &dyn Fn(u32) -> bool| {
        v.filter(|&t| ok(t)).map(|t| format!("-D{name}={t}"))
    };
    // Measurements: the OR tile; short AND queries (a warp each) up to SHORT_LEAD postings
    // (0: none).
    [
        knob("TILE", k.bm25_tile, &|t| {
            t.is_power_of_two() && (256..=4096).contains(&t)
        }),
        knob("SHORT_LEAD", k.bm25_short_lead, &|t| t <= 64),
        knob("AND_G", k.bm25_and_g, &|t| (1..=8).contains(&t)),
        knob("AND_FENCE", k.bm25_and_fence, &|t| {
            t.is_power_of_two() && (256..=2048).contains(&t)
        }),
        knob("AND_MIN_BLOCKS", k.bm25_and_min_blocks, &|t| {
            (1..=8).contains(&t)
        }),
        // AND items of few candidates searched in every list at once from this many lists
        // (0: never), in at most AND_SMALL_ROUNDS rounds of lists; two-list AND queries cut
        // every AND2_PIECE candidates (0: by work only).
        knob("AND_SMALL", k.bm25_and_small, &|t| t <= 64),
        knob("AND_SMALL_ROUNDS", k.bm25_and_small_rounds, &|t| {
            (1..=64).contains(&t)
        }),
        knob("AND2_PIECE", k.bm25_and2_piece, &|t| t <= 1 << 20),
        // AND queries of up to AND_CUT_LISTS lists cut so (default 2).
        knob("AND_CUT_LISTS", k.bm25_and_cut_lists, &|t| {
            (2..=64).contains(&t)
        }),
        // Diagnostics: the ranking blocks' timeline (`bm25_trace_take`).
        k.bm25_trace.then(|| "-DBM25_TRACE".into()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// Rank a batch of queries: the device ranks every query it takes (see the module doc), and
/// `cpu(i)` ranks the others, on rayon's pool while the device works. The results come in
/// batch order, in one flat layout. `budget` bounds the device memory the resident index may
/// take (bytes; `None`: `DFSETS_GPU_INDEX_BUDGET`, else half the device).
pub(super) fn topk(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    batch: &Bm25Batch<'_>,
    k: usize,
    budget: Option<usize>,
    cpu: &Bm25Cpu<'_>,
    hold: &mut dyn FnMut(usize) -> bool,
) -> Result<Bm25Output, GpuError> {
    let n = batch.len();
    let g = ready()?;
    let started = Instant::now();
    if n == 0 || k == 0 || k > BM25_MAX_K {
        let lists: Vec<Vec<Hit>> = (0..n).into_par_iter().map(cpu).collect();
        return Ok(Bm25Output {
            ranked: Ranked::from_lists(&lists),
            timings: Bm25Timings::default(),
        });
    }
    // The process's first batch compiles the kernel (NVRTC, seconds): before taking the
    // device's workspace, which every other GPU call (a fold, an intersection) waits for.
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let f = kernel(g)?;
    let mut resident = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
    let mut ws = match g.workspace.lock() {
        Ok(ws) => ws,
        Err(poisoned) => {
            let mut ws = poisoned.into_inner();
            ws.clear();
            ws
        }
    };
    let mut timings = Bm25Timings::default();
    let res = catch_unwind(AssertUnwindSafe(|| {
        run(
            g,
            f,
            &mut ws,
            &mut resident,
            index,
            scored,
            batch,
            k,
            budget.unwrap_or_else(|| default_budget(g)),
            cpu,
            hold,
            &mut timings,
        )
    }))
    .unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
    match res {
        Ok(ranked) => {
            timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
            Ok(Bm25Output { ranked, timings })
        }
        Err(e) => {
            if matches!(
                e,
                GpuError::Kernel(_) | GpuError::Panic(_) | GpuError::Driver { .. }
            ) {
                g.mark_broken(&e);
            }
            if matches!(e, GpuError::OutOfMemory(_)) {
                let _ = g.sync();
                ws.clear();
                *resident = None;
            }
            Err(e)
        }
    }
}

/// Where a batch query is ranked: `ON_CPU | c` is the `c`-th query of the CPU's share, any
/// other value the query's slot on the device.
const ON_CPU: u32 = 1 << 31;

#[allow(clippy::too_many_arguments)]
fn run(
    g: &Gpu,
    f: &Kernels,
    ws: &mut Workspace,
    resident: &mut Option<Resident>,
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    batch: &Bm25Batch<'_>,
    k: usize,
    budget: usize,
    cpu: &Bm25Cpu<'_>,
    hold: &mut dyn FnMut(usize) -> bool,
    t: &mut Bm25Timings,
) -> Result<Ranked, GpuError> {
    let n = batch.len();
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1e3;
    let t_stage = Instant::now();
    if !resident.as_ref().is_some_and(|r| r.is_for(scored)) {
        *resident = None;
        *resident = Some(Resident::new(index, scored)?);
    }
    let res = resident.as_mut().expect("set above");
    // With the whole index resident (the usual case) nothing below needs the visit counts
    // or a new selection.
    if !(res.all && res.ord.is_some()) {
        if !batch.known_to(index) {
            return Err(malformed());
        }
        for i in 0..n {
            for &t in batch.terms(i) {
                res.visits[t as usize] += 1;
            }
        }
        let fits = |res: &Resident, i: usize| {
            let ts = batch.terms(i);
            !ts.is_empty()
                && ts.len() <= BM25_MAX_TERMS
                && ts.iter().all(|&t| res.refs[t as usize][0] != u64::MAX)
        };
        let loaded = res.ord.is_some();
        let covered = if loaded {
            (0..n).filter(|&i| fits(res, i)).count()
        } else {
            0
        };
        if !loaded || covered < n {
            let Some(sel) = res.select(index, budget) else {
                return Err(GpuError::Unsupported(
                    "the index's document tables exceed the GPU index budget".into(),
                ));
            };
            let covers = |i: usize| {
                let ts = batch.terms(i);
                !ts.is_empty() && ts.len() <= BM25_MAX_TERMS && ts.iter().all(|&t| sel[t as usize])
            };
            let new_cov = (0..n).filter(|&i| covers(i)).count();
            if !loaded || new_cov > covered {
                t.uploaded_bytes += res.upload(g, index, scored, &sel)? as u64;
            }
        }
    }
    t.lookup_ms = ms(t_stage);
    t.stage_ms = ms(t_stage);

    res.cache_floors(scored, k);
    // The whole index resident: the device plans the batch (see `planned`), when its tables
    // fit in the budget beside the index; else the host plans it (exact either way), and
    // tables of an earlier call are let go (unless they fit and only the device's planning
    // is turned off, `set_bm25_device_plan`: the benchmark alternates the two paths, and a
    // device-planned call would otherwise upload its 3.5 MB tables again each time).
    let fits = res.all && res.bytes + res.plan_table_bytes(k) <= budget;
    let tables = if fits && planned::enabled() {
        Some(res.device_tables(k)?)
    } else {
        if !fits {
            res.d_refs = None;
        }
        if !fits || res.d_floors.as_ref().is_some_and(|(fk, _)| *fk != k) {
            res.d_floors = None;
        }
        None
    };
    t.resident_bytes = (res.bytes + res.device_table_bytes()) as u64;
    let res = &*res;
    let ctx = Ctx {
        index,
        scored,
        batch,
        k,
        res,
        floors: res
            .floors
            .as_ref()
            .filter(|(fk, _)| *fk == k)
            .map(|(_, f)| f.as_slice()),
        piece: piece_work(batch.mode),
    };
    let part = match tables {
        Some(_) => planned::stage(&ctx, ws, hold, t)?,
        None => stage(&ctx, ws, hold, t)?,
    };
    let t_launch = Instant::now();
    let mut part = match tables {
        Some(tables) => planned::launch(g, f, &ctx, ws, part, tables, t)?,
        None => launch(g, f, &ctx, ws, part, t)?,
    };
    t.launch_ms = ms(t_launch);
    t.on_device = part.on_device;

    // The CPU's share while the device works.
    let t_cpu = Instant::now();
    // A query with no terms left (none known; or an unknown one under AND) matches nothing
    // (`search::topk::top`): its answer is empty without asking the CPU (under AND on the
    // benchmark's web queries, 4,586 of 10,000).
    let rank_cpu = |i: u32| {
        if batch.terms(i as usize).is_empty() {
            Vec::new()
        } else {
            cpu(i as usize)
        }
    };
    let cpu_hits: Vec<Vec<Hit>> = if part
        .cpu_q
        .iter()
        .all(|&i| batch.terms(i as usize).is_empty())
    {
        vec![Vec::new(); part.cpu_q.len()]
    } else {
        part.cpu_q.par_iter().map(|&i| rank_cpu(i)).collect()
    };
    t.cpu_ms = ms(t_cpu);
    let t_wait = Instant::now();
    g.sync()?;
    t.wait_ms = ms(t_wait);
    planned::settle(ws, &mut part, t)?;
    if part.packed_on_host {
        t.d2h_bytes += packed_bytes(ws, &part);
    }

    let t_unpack = Instant::now();
    let out = unpack(ws, &part, k, &cpu_hits)?;
    t.unpack_ms = ms(t_unpack);
    if part.lent {
        t.lent_bytes = (out.docs.len() * 12) as u64;
    }
    if let Some(ev) = &part.events {
        let elapsed = |a: &CudaEvent, b: &CudaEvent| {
            a.elapsed_ms(b).map(f64::from).map_err(drv("event timing"))
        };
        if part.copied_up {
            t.h2d_ms = elapsed(&ev[0], &ev[1])?;
        }
        t.kernel_ms = elapsed(&ev[1], &ev[2])?;
        t.d2h_ms = elapsed(&ev[2], &ev[3])?;
    }
    Ok(out)
}

/// A batch's four timing events (before the copies up, after them, after the kernels, after
/// the copy down), made once rather than per call (the call's queueing took 0.11-0.12 ms
/// either way on the H100 host: no measured gain, kept as the lighter path). Used under the
/// workspace lock, one batch at a time.
fn batch_events(g: &Gpu) -> Result<&'static [CudaEvent; 4], GpuError> {
    static E: OnceLock<[CudaEvent; 4]> = OnceLock::new();
    if let Some(e) = E.get() {
        return Ok(e);
    }
    let e = [g.event()?, g.event()?, g.event()?, g.event()?];
    Ok(E.get_or_init(|| e))
}

/// What staging, launching and unpacking a batch read.
struct Ctx<'a> {
    index: &'a InvertedIndex,
    scored: &'a Arc<Scored>,
    batch: &'a Bm25Batch<'a>,
    k: usize,
    res: &'a Resident,
    /// Every term's own floor at k (`None`: k has no floors).
    floors: Option<&'a [f64]>,
    piece: u64,
}

impl Ctx<'_> {
    fn takes(&self, i: usize) -> bool {
        let ts = self.batch.terms(i);
        !ts.is_empty()
            && ts.len() <= BM25_MAX_TERMS
            && (self.res.all || ts.iter().all(|&t| self.res.refs[t as usize][0] != u64::MAX))
    }

    /// The device's plan for query `i`, from its terms' list references and floors
    /// (resident terms only).
    fn plan_of(&self, i: usize) -> Plan {
        let ts = self.batch.terms(i);
        let mode = self.batch.mode(i);
        let mut lens = [0u64; BM25_MAX_TERMS];
        let mut maxima = [0f64; BM25_MAX_TERMS];
        for (j, &tm) in ts.iter().enumerate() {
            let w = self.res.refs[tm as usize][1];
            lens[j] = w & 0xffff_ffff;
            maxima[j] = f64::from(f32::from_bits((w >> 32) as u32));
        }
        // OR's starting threshold (AND never reads it): `Scored::theta_floor`.
        let floor = match (mode, self.floors) {
            (Mode::Or | Mode::AndOr, Some(f)) => {
                Scored::floor_of_terms(ts.iter().map(|&t| f[t as usize]))
            }
            _ => f64::NEG_INFINITY,
        };
        plan(
            &lens[..ts.len()],
            |j| maxima[j],
            floor,
            self.scored.static_max,
            mode,
            self.k,
            self.piece,
        )
    }
}

/// A staged batch: where each query went (a device slot or the CPU's share), the layout of
/// the device's buffers, and (once launched) its events: before the copies up, after them,
/// after the kernels, after the copy down.
struct Staged {
    gq: usize,
    /// Each batch query's device slot, or `ON_CPU |` its place in `cpu_q`. Empty: every
    /// query in the slot of its batch index (a device-planned batch with none on the CPU;
    /// writing that identity into a fresh vector took 7-10 µs of a 10,000-query call on the
    /// H200 hosts, its pages faulted in). Read through [`Staged::slot_at`].
    slot: Vec<u32>,
    /// Batch indices of the queries left to the CPU.
    cpu_q: Vec<u32>,
    /// Bytes of the queries up and of the blocks up, staged in the pinned buffers.
    in_bytes: usize,
    items_bytes: usize,
    layout: Layout,
    n_items: usize,
    n_split: usize,
    n_pieces: usize,
    /// Bytes of the device's answers (as ranked, then packed) and of the packed ones, which
    /// are copied down (`Layout::answers`).
    out_bytes: usize,
    down_bytes: usize,
    /// Queries the device ranks (a device-planned batch also holds slots it leaves unranked).
    on_device: usize,
    events: Option<&'static [CudaEvent; 4]>,
    /// Whether the batch was copied up (`events[0]` recorded before the copy); a
    /// device-planned batch may be read where the host wrote it instead (`planned::mapped`).
    copied_up: bool,
    /// The device's planning buffers (a device-planned batch).
    planned: Option<planned::PlannedLayout>,
    /// Whether `bm25_pack` wrote the answers straight into the host's pinned buffer (nothing
    /// copied down).
    packed_on_host: bool,
    /// Whether that buffer is the workspace's block lent to the result (`lends`).
    lent: bool,
    /// Whether the batch timed its kernels itself (`planned::launch`; no events).
    clocked: bool,
}

impl Staged {
    /// Every query on the device, each in the slot of its batch index (a device-planned batch
    /// with no query left to the CPU): the packed answers are the result's layout.
    fn in_batch_order(&self) -> bool {
        self.planned.is_some()
            && self.cpu_q.is_empty()
            && (self.slot.is_empty() || self.gq == self.slot.len())
    }

    /// Queries of the batch.
    fn queries(&self) -> usize {
        if self.slot.is_empty() {
            self.gq
        } else {
            self.slot.len()
        }
    }

    /// Batch query `i`'s slot (`slot`).
    fn slot_at(&self, i: usize) -> u32 {
        if self.slot.is_empty() {
            i as u32
        } else {
            self.slot[i]
        }
    }

    /// Every batch query's slot, in batch order.
    fn slots(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.queries()).map(|i| self.slot_at(i))
    }

    /// A batch of `nq` queries, `gq` of them for the device, nothing placed or laid out yet.
    fn new(nq: usize, gq: usize) -> Self {
        Staged {
            gq,
            slot: vec![0u32; nq],
            cpu_q: vec![0u32; nq - gq],
            in_bytes: 0,
            items_bytes: 0,
            layout: Layout::default(),
            n_items: 0,
            n_split: 0,
            n_pieces: 0,
            out_bytes: 0,
            down_bytes: 0,
            on_device: gq,
            events: None,
            copied_up: true,
            planned: None,
            packed_on_host: false,
            lent: false,
            clocked: false,
        }
    }
}

/// Offsets of the regions in the batch's buffers: queries up (q_off | modes | lists | floors),
/// blocks up (order | items | split_q | split_p), the answers (counts | docs | scores as
/// ranked, `k` places a query, then packed: offsets | docs | scores, the part the host reads,
/// written into its pinned buffer by the device or copied down)
/// and the pieces' answers on the device (counts | ordinals | scores | AND counts).
#[derive(Default)]
struct Layout {
    qoff: usize,
    mode: usize,
    lists: usize,
    floor: usize,
    order: usize,
    items: usize,
    splitq: usize,
    splitp: usize,
    cnt: usize,
    doc: usize,
    score: usize,
    pk_off: usize,
    pk_doc: usize,
    pk_score: usize,
    pord: usize,
    pscore: usize,
    and: usize,
    /// Each split query's count of completed blocks (device-planned batches only).
    done: usize,
    piece_bytes: usize,
}

impl Layout {
    /// Lay out the answers of `gq` queries at `k` (see the struct doc); returns the bytes of
    /// the device's answer buffer and of its packed part (copied down, from `pk_off`).
    fn answers(&mut self, gq: usize, k: usize) -> (usize, usize) {
        self.cnt = 0;
        self.doc = align(gq * 4);
        self.score = self.doc + align(gq * k * 4);
        self.pk_off = self.score + align(gq * k * 8);
        self.pk_doc = self.pk_off + align((gq + 1) * 4);
        self.pk_score = self.pk_doc + align(gq * k * 4);
        let out = self.pk_score + gq * k * 8;
        (out, out - self.pk_off)
    }
}

/// Diagnostics (kernels compiled with the knob `bm25_trace`, else empty): for each place of
/// the last ranking launches' `order`, the start and end (ns, the device's global timer) of
/// the block or short item's warp that ranked it, and the query, kind and multiprocessor
/// (`bm25_trace` in bm25.cu: query in the low 32 bits, kind in the next 8, SM above). Places
/// no block reached are all zero. The record is cleared for the next batch.
#[cfg(feature = "tuning")]
pub(super) fn trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
    use cudarc::driver::result;
    if !knobs().bm25_trace {
        return Ok(Vec::new());
    }
    let g = ready()?;
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let f = kernel(g)?;
    let _ws = g.workspace.lock().unwrap_or_else(|p| p.into_inner());
    g.sync()?;
    let mut view = f
        .module
        .get_global("bm25_trace", &g.stream)
        .map_err(drv("trace symbol"))?;
    let bytes = view.len();
    let (ptr, _sync) = cudarc::driver::DevicePtrMut::device_ptr_mut(&mut view, &g.stream);
    let mut host = vec![0u64; bytes / 8];
    // SAFETY: the symbol holds `bytes` bytes; the stream is synchronized before and after.
    unsafe { result::memcpy_dtoh_async(&mut host[..], ptr, g.stream.cu_stream()) }
        .map_err(drv("device-to-host copy"))?;
    g.sync()?;
    // SAFETY: as above, the whole symbol.
    unsafe { result::memset_d8_async(ptr, 0, bytes, g.stream.cu_stream()) }
        .map_err(drv("memset"))?;
    g.sync()?;
    Ok(host.chunks_exact(3).map(|c| [c[0], c[1], c[2]]).collect())
}

/// Drop the resident index (tests; frees its device memory).
#[cfg_attr(not(feature = "tuning"), allow(dead_code))] // device tests and probes (tuning)
pub(super) fn evict() {
    if let Ok(g) = ready() {
        let _ = g.ctx.bind_to_thread();
        let _ = g.sync();
    }
    *RESIDENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
}
