//! Batched BM25 top-k on the device (`kernels/bm25.cu`): the host side.
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
//!   host's pinned buffer (`DFSETS_BM25_ZERO_COPY=0`: one copy down).
//! - Results are bit-identical to the CPU's (`search::topk`): same f64 sums in the same
//!   order, same ties. Queries the kernel does not take (more than [`BM25_MAX_TERMS`]
//!   terms, k above [`BM25_MAX_K`], lists not resident) come back as `None`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use cudarc::driver::result;
use cudarc::driver::{CudaEvent, CudaFunction, CudaModule};
use datafusion::arrow::buffer::ScalarBuffer;
use rayon::prelude::*;

use super::cuda::{
    DevBuf, Gpu, LentPinned, Workspace, align, bytes_of, compile_module, drv, env_knob, gpu,
    panic_message, source_from_env, view, view_mut,
};
use super::graph::Launch;
use super::{BM25_MAX_K, BM25_MAX_TERMS, Bm25Batch, Bm25Cpu, Bm25Output, Bm25Timings, GpuError};
use crate::search::index::InvertedIndex;
use crate::search::rank::Ranked;
use crate::search::scoring::{FLOOR_K, Scored};
use crate::search::topk::{Hit, Mode};

mod planned;

const SOURCE: &str = include_str!("../../../kernels/bm25.cu");
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

/// The two kernels of bm25.cu.
struct Kernels {
    /// The module (its `bm25_trace` global, compiled with `DFSETS_BM25_TRACE=1`).
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

fn kernel(g: &Gpu) -> Result<&'static Kernels, GpuError> {
    KERNEL
        .get_or_init(|| {
            let (major, minor) = g.info.compute_capability;
            let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
            // Experiments only: another bm25.cu (see `source_from_env`).
            let source_override = source_from_env("DFSETS_BM25_SOURCE")?;
            let source = source_override.as_deref().unwrap_or(SOURCE);
            let module = compile_module(&g.ctx, arch, source, "bm25.cu", compile_options())?;
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

/// The work (candidates times lists searched, see [`plan`]) a piece of a split query should
/// hold in a batch of `mode` (`DFSETS_BM25_PIECE`, 0: never split; default [`DEFAULT_PIECE`];
/// an AND batch: `DFSETS_BM25_PIECE_AND`, default the smaller of that and
/// [`DEFAULT_PIECE_AND`]). AND's pieces are smaller: its time is its longest pieces' chains
/// of searches (pieces of 4,096 took AND's kernels from 0.15 to 0.13 ms, session 42, H200),
/// whereas OR at 4,096 lost more to each piece's own top-k (0.59 -> 0.78 ms).
fn piece_work(mode: Mode) -> u64 {
    static P: OnceLock<(u64, u64)> = OnceLock::new();
    let (any, and) = *P.get_or_init(|| {
        let any = env_knob("DFSETS_BM25_PIECE", DEFAULT_PIECE);
        let and = env_knob("DFSETS_BM25_PIECE_AND", any.min(DEFAULT_PIECE_AND));
        (any, and)
    });
    if mode == Mode::And { and } else { any }
}
const DEFAULT_PIECE_AND: u64 = 4096;
const DEFAULT_PIECE: u64 = 16384;

/// How the device ranks one query: `pieces` blocks over ordinal ranges (1: the whole query
/// in one block), each holding about `work / pieces` of the work (candidates times lists
/// searched), cut at the ordinals of the list `lead` (its position among the query's terms).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
struct Plan {
    pieces: u32,
    work: u64,
    lead: u32,
    /// OR's starting threshold (`Scored::theta_floor`; -inf for AND, which never reads it).
    floor: f64,
    /// AND-then-OR (a split one also gets a block for its AND).
    and_or: bool,
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

/// The device's plan for one query (see `or_pruned` in bm25.cu for the lists it visits): an
/// OR query visits the postings of its essential lists (those left once the lists whose
/// maxima, smallest first, sum with the static bound to no more than the floor are put
/// aside), or of all its lists (no floor, or none put aside); AND visits its shortest list.
/// Each candidate is then looked up by a binary search in every other list, one list after
/// the other: a block's time follows those chains of dependent loads (ncu on the H100: the
/// OR launch's busiest multiprocessor was active 1.9x as long as the average one, held by
/// queries of 8-12 terms whose pieces had as many postings as a two-term query's), so the
/// work is the candidates times the lists searched (at least one). A query with more work
/// than `piece` is split into pieces over ranges of ordinals, cut at equal shares of its
/// longest essential list (AND: of its shortest list). Only the count of pieces and where
/// they are cut depend on this estimate, never the answer (every split is exact). An OR query
/// is split only with a floor: a piece starts from its query's floor, whereas without one
/// each piece would collect and sort its own k candidates before it could prune (measured:
/// OR at k = 100, no floor, 2.85 ms of kernels unsplit, 4.97 ms split into 16,186 pieces of
/// 4,096 postings); the sweep's work is all its postings.
fn plan(
    lens: &[u64],
    maxima: impl Fn(usize) -> f64,
    floor: f64,
    static_max: f64,
    mode: Mode,
    k: usize,
    piece: u64,
) -> Plan {
    let and_or = mode == Mode::AndOr;
    let whole = |work| Plan {
        pieces: 1,
        work,
        lead: 0,
        floor,
        and_or,
    };
    let most = (CAP / k.max(1)).min(MAX_PIECES) as u64;
    let split = |work: u64, lead: usize| Plan {
        pieces: if piece == 0 || most < 2 {
            1
        } else {
            work.div_ceil(piece).clamp(1, most) as u32
        },
        work,
        lead: lead as u32,
        floor,
        and_or,
    };
    // Lists each candidate is searched in.
    let searched = (lens.len() as u64).saturating_sub(1).max(1);
    if mode == Mode::And {
        let Some((lead, &short)) = lens.iter().enumerate().min_by_key(|&(_, &l)| l) else {
            return whole(0);
        };
        return split(short * searched, lead);
    }
    if floor == f64::NEG_INFINITY {
        // The sweep, never split.
        return whole(lens.iter().sum());
    }
    // Lists still essential, one bit each (at most BM25_MAX_TERMS = 64 lists).
    let mut essential: u64 = if lens.len() >= 64 {
        u64::MAX
    } else {
        (1 << lens.len()) - 1
    };
    let is_essential = |e: u64, j: usize| e >> j & 1 == 1;
    let cut = floor - 1e-12 * floor.abs();
    let mut sum = static_max;
    while let Some(j) = (0..lens.len())
        .filter(|&j| is_essential(essential, j))
        .min_by(|&a, &b| maxima(a).total_cmp(&maxima(b)))
    {
        if sum + maxima(j) > cut {
            break;
        }
        sum += maxima(j);
        essential &= !(1 << j);
    }
    if essential == 0 {
        // Nothing can reach the floor: the kernel visits nothing.
        return whole(0);
    }
    let ess = (0..lens.len()).filter(|&j| is_essential(essential, j));
    let work: u64 = ess.clone().map(|j| lens[j]).sum::<u64>() * searched;
    split(work, ess.max_by_key(|&j| lens[j]).unwrap_or(0))
}

/// NVRTC options beyond C++17, from measurement knobs (anything out of range is ignored):
/// the OR tile (`DFSETS_BM25_TILE`, a power of two in 256..=4096), short AND queries' bound
/// (`DFSETS_BM25_SHORT_LEAD`, at most 64), `bm25_topk_and`'s candidates a thread
/// (`DFSETS_BM25_AND_G`, 1..=8), fence entries (`DFSETS_BM25_AND_FENCE`, a power of two in
/// 256..=2048) and blocks a multiprocessor should hold (`DFSETS_BM25_AND_MIN_BLOCKS`, 1..=8).
fn compile_options() -> Vec<String> {
    let knob = |name: &str, ok: &dyn Fn(u32) -> bool| {
        std::env::var(format!("DFSETS_BM25_{name}"))
            .ok()
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|&t| ok(t))
            .map(|t| format!("-D{name}={t}"))
    };
    // Measurements: the OR tile; short AND queries (a warp each) up to SHORT_LEAD postings
    // (0: none).
    [
        knob("TILE", &|t| {
            t.is_power_of_two() && (256..=4096).contains(&t)
        }),
        knob("SHORT_LEAD", &|t| t <= 64),
        knob("AND_G", &|t| (1..=8).contains(&t)),
        knob("AND_FENCE", &|t| {
            t.is_power_of_two() && (256..=2048).contains(&t)
        }),
        knob("AND_MIN_BLOCKS", &|t| (1..=8).contains(&t)),
        // AND items of few candidates searched in every list at once from this many lists
        // (0: never), in at most AND_SMALL_ROUNDS rounds of lists; two-list AND queries cut
        // every AND2_PIECE candidates (0: by work only).
        knob("AND_SMALL", &|t| t <= 64),
        knob("AND_SMALL_ROUNDS", &|t| (1..=64).contains(&t)),
        knob("AND2_PIECE", &|t| t <= 1 << 20),
        // AND queries of up to AND_CUT_LISTS lists cut so (default 2).
        knob("AND_CUT_LISTS", &|t| (2..=64).contains(&t)),
        // Diagnostics: the ranking blocks' timeline (`bm25_trace_take`).
        (std::env::var("DFSETS_BM25_TRACE").as_deref() == Ok("1")).then(|| "-DBM25_TRACE".into()),
    ]
    .into_iter()
    .flatten()
    .collect()
}

/// The index on the device.
struct Resident {
    scored: Weak<Scored>,
    /// Ordinal of every posting of the index (host copy, for rebuilding the selection).
    host_ord: Vec<u32>,
    /// Doc id of every ordinal.
    ord_doc: Vec<u32>,
    /// Weighted static score of every ordinal (empty without static scores).
    ord_static: Vec<f64>,
    /// Each term's `ListRef` (bm25.cu) as two words: the device position of its postings
    /// (`u64::MAX` where not resident), and its length with its maximum impact (f32, rounded
    /// up) above. One read per term when a batch is staged.
    refs: Vec<[u64; 2]>,
    /// Every term's own floor at one k (`Scored::term_floor`), for the last k staged.
    floors: Option<(usize, Vec<f64>)>,
    /// Times each term was visited by a query (over every batch seen).
    visits: Vec<u64>,
    all: bool,
    ord: Option<DevBuf>,
    imp: Option<DevBuf>,
    stat: Option<DevBuf>,
    doc: Option<DevBuf>,
    /// The device's copy of `refs` (device-planned batches), uploaded once.
    d_refs: Option<DevBuf>,
    /// The device's copy of `floors` at one k.
    d_floors: Option<(usize, DevBuf)>,
    bytes: usize,
}

static RESIDENT: Mutex<Option<Resident>> = Mutex::new(None);

/// The default budget: `DFSETS_GPU_INDEX_BUDGET` bytes, else half the device's memory.
fn default_budget(g: &Gpu) -> usize {
    std::env::var("DFSETS_GPU_INDEX_BUDGET")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(g.info.total_memory / 2)
}

impl Resident {
    fn new(index: &InvertedIndex, scored: &Arc<Scored>) -> Result<Self, GpuError> {
        let mut ord_doc: Vec<u32> = index.docs().to_vec();
        ord_doc.par_sort_unstable();
        ord_doc.dedup();
        let host_ord: Vec<u32> = index
            .docs()
            .par_iter()
            .map(|d| ord_doc.binary_search(d).unwrap_or(0) as u32)
            .collect();
        let mut ord_static = Vec::new();
        if !scored.weighted_static.is_empty() {
            ord_static = vec![f64::NAN; ord_doc.len()];
            for (p, &o) in host_ord.iter().enumerate() {
                let s = scored.static_at(p);
                let slot = &mut ord_static[o as usize];
                if slot.is_nan() {
                    *slot = s;
                } else if slot.to_bits() != s.to_bits() {
                    return Err(GpuError::Unsupported(
                        "static scores differ between postings of one document".into(),
                    ));
                }
            }
        }
        Ok(Self {
            scored: Arc::downgrade(scored),
            host_ord,
            ord_doc,
            ord_static,
            refs: vec![[u64::MAX, 0]; index.terms()],
            floors: None,
            visits: vec![0; index.terms()],
            all: false,
            ord: None,
            imp: None,
            stat: None,
            doc: None,
            d_refs: None,
            d_floors: None,
            bytes: 0,
        })
    }

    fn is_for(&self, scored: &Arc<Scored>) -> bool {
        self.scored
            .upgrade()
            .is_some_and(|s| Arc::ptr_eq(&s, scored))
    }

    fn table_bytes(&self) -> usize {
        self.ord_doc.len() * 4 + self.ord_static.len() * 8
    }

    /// The terms to hold within `budget` bytes: all when they fit, else the most visited.
    fn select(&self, index: &InvertedIndex, budget: usize) -> Option<Vec<bool>> {
        let tables = self.table_bytes();
        if tables > budget {
            return None;
        }
        let room = (budget - tables) / 12;
        if index.docs().len() <= room {
            return Some(vec![true; index.terms()]);
        }
        let mut cand: Vec<u32> = (0..index.terms() as u32)
            .filter(|&t| self.visits[t as usize] > 0)
            .collect();
        cand.sort_unstable_by_key(|&t| {
            (
                std::cmp::Reverse(self.visits[t as usize]),
                index.postings_len(t),
            )
        });
        let mut sel = vec![false; index.terms()];
        let mut used = 0usize;
        for t in cand {
            let len = index.postings_len(t);
            if used + len <= room {
                used += len;
                sel[t as usize] = true;
            }
        }
        Some(sel)
    }

    /// Upload the postings of the selected terms (and the ordinal tables).
    fn upload(
        &mut self,
        g: &Gpu,
        index: &InvertedIndex,
        scored: &Scored,
        sel: &[bool],
    ) -> Result<usize, GpuError> {
        self.ord = None;
        self.imp = None;
        self.stat = None;
        self.doc = None;
        self.d_refs = None;
        self.d_floors = None;
        self.bytes = 0;
        let mut ord = Vec::new();
        let mut imp = Vec::new();
        self.refs.iter_mut().for_each(|r| *r = [u64::MAX, 0]);
        self.all = sel.iter().all(|&s| s);
        // A ListRef is { u64 start; u32 len; f32 max }: two little-endian u64 words.
        let word = |t: u32| {
            index.postings_len(t) as u64
                | (u64::from(max_up(scored.term_max[t as usize]).to_bits()) << 32)
        };
        if self.all {
            // The whole index in its own layout: term t starts at its index offset.
            for t in 0..index.terms() as u32 {
                self.refs[t as usize] = [index.range(t).start as u64, word(t)];
            }
        } else {
            for t in 0..index.terms() as u32 {
                if sel[t as usize] {
                    self.refs[t as usize] = [ord.len() as u64, word(t)];
                    let r = index.range(t);
                    ord.extend_from_slice(&self.host_ord[r.clone()]);
                    imp.extend_from_slice(&scored.impacts[r]);
                }
            }
        }
        let (ord_s, imp_s): (&[u32], &[f64]) = if self.all {
            (&self.host_ord, &scored.impacts)
        } else {
            (&ord, &imp)
        };
        let up = |v: &[u8]| DevBuf::upload(v, "index allocation", "index upload");
        self.ord = Some(up(bytes_of(ord_s))?);
        self.imp = Some(up(bytes_of(imp_s))?);
        self.doc = Some(up(bytes_of(&self.ord_doc))?);
        if !self.ord_static.is_empty() {
            self.stat = Some(up(bytes_of(&self.ord_static))?);
        }
        let _ = g;
        self.bytes = ord_s.len() * 12 + self.table_bytes();
        Ok(self.bytes)
    }

    fn ptr(b: &Option<DevBuf>) -> u64 {
        b.as_ref().map_or(0, |b| b.ptr)
    }

    /// Bytes the device-planned path's tables take at `k`: every term's `ListRef` (16
    /// bytes), and its floor when k has floors (8 bytes).
    fn plan_table_bytes(&self, k: usize) -> usize {
        let floors = self.floors.as_ref().is_some_and(|(fk, _)| *fk == k);
        DevBuf::bytes_for(self.refs.len() * 16)
            + if floors {
                DevBuf::bytes_for(self.refs.len() * 8)
            } else {
                0
            }
    }

    /// Bytes of those tables on the device now.
    fn device_table_bytes(&self) -> usize {
        self.d_refs.as_ref().map_or(0, |b| b.bytes)
            + self.d_floors.as_ref().map_or(0, |(_, b)| b.bytes)
    }

    /// Computes every term's own floor at `k` (none above [`FLOOR_K`]) unless the last batch
    /// had the same k.
    fn cache_floors(&mut self, scored: &Scored, k: usize) {
        if k == 0 || k > FLOOR_K || self.floors.as_ref().is_some_and(|(fk, _)| *fk == k) {
            return;
        }
        let f = (0..self.refs.len() as u32)
            .into_par_iter()
            .map(|t| scored.term_floor(t, k))
            .collect();
        self.floors = Some((k, f));
    }
}

/// Rank a batch of queries: the device ranks every query it takes (see the module doc), and
/// `cpu(i)` ranks the others, on rayon's pool while the device works. The results come in
/// batch order, in one flat layout. `budget` bounds the device memory the resident index may
/// take (bytes; `None`: `DFSETS_GPU_INDEX_BUDGET`, else half the device).
pub fn bm25_topk(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    batch: &Bm25Batch<'_>,
    k: usize,
    budget: Option<usize>,
    cpu: &Bm25Cpu<'_>,
    hold: &mut dyn FnMut(usize) -> bool,
) -> Result<Bm25Output, GpuError> {
    let n = batch.len();
    let g = gpu()?;
    let started = Instant::now();
    if n == 0 || k == 0 || k > BM25_MAX_K {
        let lists: Vec<Vec<Hit>> = (0..n).into_par_iter().map(cpu).collect();
        return Ok(Bm25Output {
            ranked: Ranked::from_lists(&lists),
            timings: Bm25Timings::default(),
        });
    }
    let mut resident = RESIDENT.lock().unwrap_or_else(|p| p.into_inner());
    let mut ws = match g.workspace.lock() {
        Ok(ws) => ws,
        Err(poisoned) => {
            let mut ws = poisoned.into_inner();
            ws.clear();
            ws
        }
    };
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let f = kernel(g)?;
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

/// `x` as an f32 no smaller than it (the kernel's list maxima are upper bounds).
fn max_up(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) < x { f.next_up() } else { f }
}

/// Where a batch query is ranked: `ON_CPU | c` is the `c`-th query of the CPU's share, any
/// other value the query's slot on the device.
const ON_CPU: u32 = 1 << 31;

/// Sort keys for the longest-first launch order: buckets of work (postings to visit), four
/// per power of two (exact order does not matter, only that long queries start first).
fn work_bucket(work: u64) -> usize {
    if work < 4 {
        return work as usize;
    }
    let lz = 63 - work.leading_zeros() as usize; // floor(log2)
    let frac = ((work >> (lz - 2)) & 3) as usize; // the next two bits
    4 * (lz - 1) + frac
}
/// Queries per parallel task when staging a batch (measured on the H100 host, OR at k 10 on
/// 10,000 queries: the writing pass took 0.60-0.69 ms in groups of 512, 0.38-0.41 ms in groups
/// of 256, 128 or 64; its work is ~2.5 ms on one core, mostly cache misses).
const STAGE_GROUP: usize = 128;
/// Buckets of [`work_bucket`] (work < 2^64).
const WORK_BUCKETS: usize = 4 * 63 + 4;

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
    /// H200 hosts, its pages faulted in; session 55). Read through [`Staged::slot_at`].
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

/// A group's blocks, built by the writing pass: its items (`Item` in bm25.cu: device slot,
/// part, lead << 16 | parts, kind | piece slot counted within the group), their sort keys,
/// and its split queries (device slot, end of its pieces within the group).
#[derive(Default)]
struct Blocks {
    items: Vec<[u32; 4]>,
    keys: Vec<u8>,
    splits: Vec<[u32; 2]>,
    pieces: u32,
}

impl Blocks {
    /// Query `q`'s blocks: one, or its pieces (and a block for the AND of an AND-then-OR).
    fn push(&mut self, q: u32, p: &Plan) {
        if p.pieces == 1 {
            self.items.push([q, 0, 1, WHOLE]);
            self.keys.push(work_bucket(p.work) as u8);
            return;
        }
        let key = work_bucket(p.work / u64::from(p.pieces)) as u8;
        if p.and_or {
            self.items.push([q, 0, 1, AND_ONLY]);
            self.keys.push(key);
        }
        // Pieces of equal shares of the lead list, cut by the device.
        for j in 0..p.pieces {
            self.items
                .push([q, j, p.lead << 16 | p.pieces, PIECE | (self.pieces + j)]);
            self.keys.push(key);
        }
        self.pieces += p.pieces;
        self.splits.push([q, self.pieces]);
    }
}

/// Stage the batch: each query's place (a device slot or the CPU's share), its lists and its
/// floor, written straight into the pinned upload buffer (a counting pass and a writing pass
/// over groups of queries, in parallel); the writing pass also plans each query and builds
/// its group's blocks (a query, or a piece of one), which then go into a second pinned buffer
/// with their order, longest first.
///
/// `hold(bytes)` is asked for the pinned bytes the batch stages through (queries up and
/// results down, then the blocks too) before they are written; refused: `MemoryLimit`.
fn stage(
    c: &Ctx<'_>,
    ws: &mut Workspace,
    hold: &mut dyn FnMut(usize) -> bool,
    t: &mut Bm25Timings,
) -> Result<Staged, GpuError> {
    let mut ask = |bytes: usize| match hold(bytes) {
        true => Ok(()),
        false => Err(GpuError::MemoryLimit(format!(
            "{bytes} bytes of topk_bm25's GPU staging"
        ))),
    };
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1e3;
    let (k, batch) = (c.k, c.batch);
    let nq = batch.len();
    let t_look = Instant::now();
    let group_of = |g: usize| g * STAGE_GROUP..((g + 1) * STAGE_GROUP).min(nq);
    // With the whole index resident, a query's place depends on its number of terms alone:
    // one pass on this thread (0.08 ms for 10,000 queries on the H100 host, 0.11 ms as a
    // parallel pass: within that host's spread).
    // The term ids themselves are checked by the writing pass, before they are looked up.
    let count = |g: usize| {
        let (mut q, mut l) = (0, 0);
        for i in group_of(g) {
            if c.takes(i) {
                q += 1;
                l += batch.terms(i).len();
            }
        }
        (q, l)
    };
    let n_groups = nq.div_ceil(STAGE_GROUP);
    let groups: Vec<(usize, usize)> = if c.res.all {
        (0..n_groups).map(count).collect()
    } else {
        (0..n_groups).into_par_iter().map(count).collect()
    };
    let gq: usize = groups.iter().map(|g| g.0).sum();
    let n_lists: usize = groups.iter().map(|g| g.1).sum();
    t.lookup_ms += ms(t_look);
    let mut part = Staged::new(nq, gq);
    if gq == 0 {
        for (r, (s, q)) in part.slot.iter_mut().zip(part.cpu_q.iter_mut()).enumerate() {
            *s = ON_CPU | r as u32;
            *q = r as u32;
        }
        t.stage_ms += ms(t_look);
        return Ok(part);
    }
    let t_fill = Instant::now();
    let mut lay = Layout {
        qoff: 0,
        ..Layout::default()
    };
    lay.mode = lay.qoff + align((gq + 1) * 4);
    lay.lists = lay.mode + align(gq);
    lay.floor = lay.lists + align(n_lists * LISTREF_BYTES);
    part.in_bytes = lay.floor + align(gq * 8);
    (part.out_bytes, part.down_bytes) = lay.answers(gq, k);
    ask(part.in_bytes + part.down_bytes)?;
    let in_bytes = part.in_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_in, in_bytes)?.as_mut_slice()[..in_bytes];
    let (head, floors_b) = pin.split_at_mut(lay.floor);
    let floors_v = &mut view_mut::<f64>(floors_b)[..gq];
    let (head, lists_b) = head.split_at_mut(lay.lists);
    let (qoff_b, modes_b) = head.split_at_mut(lay.mode);
    let qoff = &mut view_mut::<u32>(qoff_b)[..gq + 1];
    qoff[gq] = n_lists as u32;
    let lists_v = &mut view_mut::<u64>(lists_b)[..2 * n_lists];
    let modes_v = &mut modes_b[..gq];
    // Split every output into the groups' shares.
    struct Share<'a> {
        first: usize,
        q0: usize,
        l0: usize,
        c0: usize,
        slot: &'a mut [u32],
        blocks: Blocks,
        qoff: &'a mut [u32],
        modes: &'a mut [u8],
        lists: &'a mut [u64],
        floors: &'a mut [f64],
        cpu_q: &'a mut [u32],
    }
    let mut shares = Vec::with_capacity(groups.len());
    {
        let (mut sl, mut qo, mut mo, mut li, mut fl, mut cq) = (
            part.slot.as_mut_slice(),
            &mut qoff[..gq],
            &mut *modes_v,
            &mut *lists_v,
            &mut *floors_v,
            part.cpu_q.as_mut_slice(),
        );
        let (mut q0, mut l0, mut c0) = (0, 0, 0);
        for (g, &(q, l)) in groups.iter().enumerate() {
            let r = group_of(g);
            let nq = r.len();
            let a;
            (a, sl) = std::mem::take(&mut sl).split_at_mut(nq);
            let d;
            (d, qo) = std::mem::take(&mut qo).split_at_mut(q);
            let e;
            (e, mo) = std::mem::take(&mut mo).split_at_mut(q);
            let f;
            (f, li) = std::mem::take(&mut li).split_at_mut(2 * l);
            let h;
            (h, fl) = std::mem::take(&mut fl).split_at_mut(q);
            let x;
            (x, cq) = std::mem::take(&mut cq).split_at_mut(nq - q);
            shares.push(Share {
                first: r.start,
                q0,
                l0,
                c0,
                slot: a,
                blocks: Blocks::default(),
                qoff: d,
                modes: e,
                lists: f,
                floors: h,
                cpu_q: x,
            });
            q0 += q;
            l0 += l;
            c0 += nq - q;
        }
    }
    let refs = &c.res.refs;
    let n_terms = c.index.terms();
    let beyond = AtomicBool::new(false);
    let fill_share = |s: &mut Share<'_>| {
        let (mut q, mut l, mut cq) = (0, 0, 0);
        for (r, slot) in s.slot.iter_mut().enumerate() {
            let i = s.first + r;
            if batch.terms(i).iter().any(|&t| t as usize >= n_terms) {
                beyond.store(true, Ordering::Relaxed);
                return;
            }
            if !c.takes(i) {
                *slot = ON_CPU | (s.c0 + cq) as u32;
                s.cpu_q[cq] = i as u32;
                cq += 1;
                continue;
            }
            *slot = (s.q0 + q) as u32;
            s.qoff[q] = (s.l0 + l) as u32;
            s.modes[q] = mode_code(batch.mode(i));
            let p = c.plan_of(i);
            s.floors[q] = p.floor;
            s.blocks.push((s.q0 + q) as u32, &p);
            for &tm in batch.terms(i) {
                s.lists[2 * l..2 * l + 2].copy_from_slice(&refs[tm as usize]);
                l += 1;
            }
            q += 1;
        }
    };
    shares.par_iter_mut().for_each(fill_share);
    t.fill_ms += ms(t_fill);
    if beyond.into_inner() {
        return Err(malformed());
    }

    // The groups' blocks, then the longest first: a counting sort on buckets of work
    // (descending), stable.
    let t_sort = Instant::now();
    let blocks: Vec<Blocks> = shares.into_iter().map(|s| s.blocks).collect();
    let n_items: usize = blocks.iter().map(|b| b.items.len()).sum();
    let n_pieces: usize = blocks.iter().map(|b| b.pieces as usize).sum();
    let n_split: usize = blocks.iter().map(|b| b.splits.len()).sum();
    t.pieces += n_pieces;
    (part.n_items, part.n_pieces, part.n_split) = (n_items, n_pieces, n_split);
    lay.order = 0;
    lay.items = align(n_items * 4);
    lay.splitq = lay.items + align(n_items * ITEM_BYTES);
    lay.splitp = lay.splitq + align(n_split * 4);
    part.items_bytes = lay.splitp + align((n_split + 1) * 4);
    lay.pord = align(n_pieces * 4);
    lay.pscore = lay.pord + align(n_pieces * k * 4);
    lay.and = lay.pscore + align(n_pieces * k * 8);
    lay.done = lay.and + align(gq * 4);
    lay.piece_bytes = lay.done;
    ask(part.in_bytes + part.items_bytes + part.down_bytes)?;
    let items_bytes = part.items_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_items, items_bytes)?.as_mut_slice()[..items_bytes];
    let (head, splitp_b) = pin.split_at_mut(lay.splitp);
    let (head, splitq_b) = head.split_at_mut(lay.splitq);
    let (order_b, items_b) = head.split_at_mut(lay.items);
    let order_v = &mut view_mut::<u32>(order_b)[..n_items];
    let items_v = &mut view_mut::<u32>(items_b)[..4 * n_items];
    let splitq_v = &mut view_mut::<u32>(splitq_b)[..n_split];
    let splitp_v = &mut view_mut::<u32>(splitp_b)[..n_split + 1];
    // Each group's piece slots follow the groups before it.
    let (mut at, mut sq, mut base) = (0usize, 0usize, 0u32);
    for b in &blocks {
        for (dst, src) in items_v[4 * at..].chunks_exact_mut(4).zip(&b.items) {
            let mut item = *src;
            if item[3] & PIECE == PIECE {
                item[3] += base;
            }
            dst.copy_from_slice(&item);
        }
        at += b.items.len();
        for &[q, end] in &b.splits {
            splitq_v[sq] = q;
            sq += 1;
            splitp_v[sq] = base + end;
        }
        base += b.pieces;
    }
    splitp_v[0] = 0;
    let keys = || blocks.iter().flat_map(|b| b.keys.iter().copied());
    let mut start = [0u32; WORK_BUCKETS + 1];
    for b in keys() {
        start[WORK_BUCKETS - 1 - b as usize + 1] += 1;
    }
    for b in 1..=WORK_BUCKETS {
        start[b] += start[b - 1];
    }
    for (j, b) in keys().enumerate() {
        let at = &mut start[WORK_BUCKETS - 1 - b as usize];
        order_v[*at as usize] = j as u32;
        *at += 1;
    }
    part.layout = lay;
    t.sort_ms += ms(t_sort);
    t.stage_ms += ms(t_look);
    Ok(part)
}

/// Queue the staged batch on the stream: its copies up, the ranking launch (and the merge of
/// its split queries), its copy down, with an event before, between and after.
fn launch(
    g: &Gpu,
    f: &Kernels,
    c: &Ctx<'_>,
    ws: &mut Workspace,
    mut part: Staged,
    t: &mut Bm25Timings,
) -> Result<Staged, GpuError> {
    if part.gq == 0 {
        return Ok(part);
    }
    let packed_host = packed_on_host(ws, &mut part)?;
    let lay = &part.layout;
    let d_in = ws.dev("bm25_in", part.in_bytes)?;
    let d_items = ws.dev("bm25_items", part.items_bytes)?;
    let d_out = ws.dev("bm25_out", part.out_bytes)?;
    let d_piece = ws.dev("bm25_piece", lay.piece_bytes)?;
    let cs = g.stream.cu_stream();
    let record = |e: &CudaEvent| g.record(e);
    let events = batch_events(g)?;
    record(&events[0])?;
    for (pin, dst, bytes) in [
        (&ws.pin_in, d_in, part.in_bytes),
        (&ws.pin_items, d_items, part.items_bytes),
    ] {
        let pin = pin
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
        // SAFETY: `dst` holds at least `bytes`; the pinned source, written by `stage`, is not
        // touched again until the stream is synchronized.
        unsafe { result::memcpy_htod_async(dst, &pin.as_slice()[..bytes], cs) }
            .map_err(drv("host-to-device copy"))?;
    }
    let (n_items32, n_split32) = (part.n_items as u32, part.n_split as u32);
    let p_order = d_items + lay.order as u64;
    let p_items = d_items + lay.items as u64;
    let p_qoff = d_in + lay.qoff as u64;
    let p_mode = d_in + lay.mode as u64;
    let p_lists = d_in + lay.lists as u64;
    let p_floor = d_in + lay.floor as u64;
    let p_splitq = d_items + lay.splitq as u64;
    let p_splitp = d_items + lay.splitp as u64;
    let p_splitp_hi = p_splitp + 4;
    let rank = RankArgs {
        n_queries: part.gq as u32,
        n_items: n_items32,
        n_items_dev: 0,
        n_short_dev: 0,
        order: p_order,
        items: p_items,
        q_off: p_qoff,
        mode: p_mode,
        lists: p_lists,
        floor: p_floor,
        n_split: n_split32,
        n_split_dev: 0,
        merge_blocks: n_split32,
        split_q: p_splitq,
        split_lo: p_splitp,
        split_hi: p_splitp_hi,
        out: d_out,
        piece: d_piece,
        packed_host,
        piece_done: 0,
        counters: 0,
        clock_host: 0,
    };
    // SAFETY: the part's input region holds n_items order entries and items (queries < gq,
    // piece slots < n_pieces, a piece's lead list among its query's lists and its part below
    // its count of parts), gq + 1 offsets, gq modes and the lists' references whose postings
    // lie in the resident buffers (start + len within them, by construction), gq floors;
    // split_q / split_p hold n_split queries and n_split + 1 piece offsets (each query's
    // pieces at most CAP / k, by `plan`); `d_out` and `d_piece` are laid out by `lay` for gq
    // queries and n_pieces pieces.
    let launches = rank_launches(f, c, lay, &rank);
    unsafe { submit(g, ws, &launches, Some(events), t)? };
    answers_down(g, ws, &mut part, d_out, packed_host, t)?;
    record(&events[3])?;
    t.h2d_bytes += (part.in_bytes + part.items_bytes) as u64;
    part.events = Some(events);
    Ok(part)
}

/// Where `bm25_pack` writes a batch's packed answers: into host memory that `unpack` reads
/// (its device address), unless `DFSETS_BM25_ZERO_COPY=0` (then on the device, and
/// [`copy_down`] copies the whole packed region: k places a query, most of them unused).
/// A batch whose answers are the packed layout as it lies ([`lends`]) gets a block that its
/// result keeps (`Workspace::pin_lent`, from the pool of lent blocks); others the workspace's
/// pinned buffer.
fn packed_on_host(ws: &mut Workspace, part: &mut Staged) -> Result<Option<u64>, GpuError> {
    static ON: OnceLock<bool> = OnceLock::new();
    if !*ON.get_or_init(|| env_knob("DFSETS_BM25_ZERO_COPY", 1) == 1) {
        return Ok(None);
    }
    part.lent = lends(part);
    if part.lent
        && ws
            .pin_lent
            .as_ref()
            .is_none_or(|b| b.bytes() < part.down_bytes)
    {
        ws.pin_lent = None;
        // None: the lent blocks are at their ceiling; the workspace's buffer takes them.
        ws.pin_lent = LentPinned::take(part.down_bytes)?;
        part.lent = ws.pin_lent.is_some();
    }
    if part.lent {
        let block = ws.pin_lent.as_mut().expect("set above");
        let dev = block.device_ptr().ok();
        part.lent = dev.is_some();
        if dev.is_some() {
            return Ok(dev);
        }
    }
    let pin = Workspace::pinned(&mut ws.pin_out, part.down_bytes)?;
    // A driver that does not map the buffer: the answers are copied down instead.
    Ok(pin.device_ptr().ok())
}

/// Whether a batch's answers go to the caller in the block `bm25_pack` writes them into:
/// every query on the device, each in the slot of its batch index (a device-planned batch
/// with no query left to the CPU), so the packed layout is the result's
/// (`DFSETS_BM25_LEND=0`: copied out of the workspace's buffer instead).
fn lends(part: &Staged) -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_knob("DFSETS_BM25_LEND", 1) == 1) && part.in_batch_order()
}

/// The host's copy of a batch's packed answers (`part.down_bytes` bytes laid out from
/// `Layout::pk_off`): the lent block or the workspace's pinned buffer.
fn packed_region<'a>(ws: &'a Workspace, part: &Staged) -> Result<&'a [u8], GpuError> {
    let pin = if part.lent {
        ws.pin_lent.as_ref().map(|b| b.as_slice())
    } else {
        ws.pin_out.as_ref().map(|b| b.as_slice())
    };
    Ok(&pin.ok_or(GpuError::OutOfMemory("pinned allocation"))?[..part.down_bytes])
}

/// After the packing launches: the answers are in the host's buffer already (`packed_host`),
/// or their copy down is queued.
fn answers_down(
    g: &Gpu,
    ws: &mut Workspace,
    part: &mut Staged,
    d_out: u64,
    packed_host: Option<u64>,
    t: &mut Bm25Timings,
) -> Result<(), GpuError> {
    part.packed_on_host = packed_host.is_some();
    if !part.packed_on_host {
        copy_down(g, ws, part, d_out)?;
        t.d2h_bytes += part.down_bytes as u64;
    }
    Ok(())
}

/// Bytes the device wrote into the host's buffer for answers packed there: the offsets and
/// the hits (`off[gq]` of them, as `bm25_pack` counted them).
fn packed_bytes(ws: &Workspace, part: &Staged) -> u64 {
    let Ok(pin) = packed_region(ws, part) else {
        return 0;
    };
    if part.gq == 0 {
        return 0;
    }
    let off = view::<u32>(&pin[..(part.gq + 1) * 4]);
    ((part.gq + 1) * 4) as u64 + u64::from(off[part.gq]) * 12
}

/// Queue the copy of the packed answers (`part.down_bytes` from `Layout::pk_off` of `d_out`)
/// into the pinned buffer `unpack` reads.
fn copy_down(g: &Gpu, ws: &mut Workspace, part: &Staged, d_out: u64) -> Result<(), GpuError> {
    let down = part.down_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_out, down)?.as_mut_slice()[..down];
    // SAFETY: `d_out` holds `out_bytes` = `pk_off + down_bytes` (`Layout::answers`); the
    // pinned destination is read only after the stream is synchronized.
    unsafe {
        result::memcpy_dtoh_async(pin, d_out + part.layout.pk_off as u64, g.stream.cu_stream())
    }
    .map_err(drv("device-to-host copy"))
}

/// Where a batch's ranking launches read and write (device addresses): its items in launch
/// order, its queries (CSR offsets, modes, list references, floors), its split queries with
/// each one's piece slots `split_lo[s] .. split_hi[s]`, the answers (`out`, laid out by
/// [`Layout`]: counts, doc ids, scores) and the pieces' answers (`piece`: counts, ordinals,
/// scores, AND counts).
struct RankArgs {
    /// Queries on the device (their answers: `out`).
    n_queries: u32,
    /// Items, or an upper bound of them when `n_items_dev` (not 0) holds their count on the
    /// device (a device-planned batch, launched without waiting for its plan).
    n_items: u32,
    n_items_dev: u64,
    /// Where the device holds how many of the items (the last ones in `order`) are short
    /// (`and_short` in bm25.cu: a warp each), or 0: none (a host-staged batch).
    n_short_dev: u64,
    order: u64,
    items: u64,
    q_off: u64,
    mode: u64,
    lists: u64,
    floor: u64,
    /// Split queries (or an upper bound, as for the items: `n_split_dev`), and the blocks
    /// `bm25_merge` strides over them with.
    n_split: u32,
    n_split_dev: u64,
    merge_blocks: u32,
    split_q: u64,
    split_lo: u64,
    split_hi: u64,
    out: u64,
    piece: u64,
    /// Where the packed answers go (the packed part of [`Layout`]): the host's pinned buffer
    /// (`Some`: its address, written across the bus by `bm25_pack`, nothing to copy down) or
    /// the device's `out` (`None`: copied down by [`copy_down`]).
    packed_host: Option<u64>,
    /// A device-planned batch's count of each split query's completed blocks (cleared by
    /// `bm25_plan`): the block completing a split query merges it, and `bm25_merge` is not
    /// launched. 0: a host-staged batch, merged by `bm25_merge`.
    piece_done: u64,
    /// The batch's clock (a device-planned batch timed on the device): its counters, where
    /// `bm25_clear` wrote the start, and the host's pinned words `bm25_pack` writes the start
    /// and the end into. 0 and 0: timed by events instead.
    counters: u64,
    clock_host: u64,
}

/// Whether AND batches use `bm25_topk_and` (`DFSETS_BM25_AND_KERNEL`, default 1).
fn and_kernel() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| env_knob("DFSETS_BM25_AND_KERNEL", 1) == 1)
}

/// The launches of `bm25_topk` over a batch's items (longest first), then `bm25_merge` over
/// its split queries, then `bm25_pack` (the answers packed for the host: into its pinned
/// buffer, or on the device for the copy down), in order, for
/// [`submit`]. Queueing them is sound when every address of `a` holds what `bm25_topk` and
/// `bm25_merge` (kernels/bm25.cu) read and write for `a.n_items` items and `a.n_split` split
/// queries: items naming queries with 1 to 64 lists whose postings lie in the resident
/// buffers, piece slots within the piece region, at most CAP / k pieces per split query;
/// `out` and `piece` laid out by `lay` for the batch.
fn rank_launches(f: &Kernels, c: &Ctx<'_>, lay: &Layout, a: &RankArgs) -> Vec<Launch> {
    let k32 = c.k as u32;
    let static_max = c.scored.static_max.to_bits();
    let p_ord = Resident::ptr(&c.res.ord);
    let p_imp = Resident::ptr(&c.res.imp);
    let p_stat = Resident::ptr(&c.res.stat);
    let p_doc = Resident::ptr(&c.res.doc);
    let p_cnt = a.out + lay.cnt as u64;
    let p_docs = a.out + lay.doc as u64;
    let p_scores = a.out + lay.score as u64;
    let p_pcnt = a.piece;
    let p_pord = a.piece + lay.pord as u64;
    let p_pscore = a.piece + lay.pscore as u64;
    let p_and = a.piece + lay.and as u64;
    let mut launches = Vec::with_capacity(4);
    // The parameters of `bm25_topk` and `bm25_merge` in kernels/bm25.cu, in their order;
    // ord_static is null without static scores; the merge reads what the first launch wrote,
    // on the same stream.
    // An AND batch's blocks through the AND-only kernel (no OR tile, AND_G searches in flight
    // a thread); `DFSETS_BM25_AND_KERNEL=0` keeps them on the general one (measurements).
    let topk = if c.batch.mode == Mode::And && and_kernel() {
        &f.topk_and
    } else {
        &f.topk
    };
    launches.push(Launch {
        f: topk.cu_function(),
        grid: a.n_items,
        block: THREADS,
        args: vec![
            a.n_items.into(),
            a.n_items_dev.into(),
            a.n_short_dev.into(),
            a.order.into(),
            a.items.into(),
            a.q_off.into(),
            a.mode.into(),
            a.lists.into(),
            p_ord.into(),
            p_imp.into(),
            p_stat.into(),
            p_doc.into(),
            k32.into(),
            p_cnt.into(),
            p_docs.into(),
            p_scores.into(),
            a.floor.into(),
            static_max.into(),
            p_pcnt.into(),
            p_pord.into(),
            p_pscore.into(),
            p_and.into(),
            a.piece_done.into(),
        ],
    });
    if a.n_split > 0 && a.piece_done == 0 {
        launches.push(Launch {
            f: f.merge.cu_function(),
            grid: a.merge_blocks.clamp(1, a.n_split),
            block: THREADS,
            args: vec![
                a.n_split.into(),
                a.n_split_dev.into(),
                a.split_q.into(),
                a.split_lo.into(),
                a.split_hi.into(),
                a.mode.into(),
                p_and.into(),
                k32.into(),
                p_pcnt.into(),
                p_pord.into(),
                p_pscore.into(),
                p_doc.into(),
                p_cnt.into(),
                p_docs.into(),
                p_scores.into(),
            ],
        });
    }
    let gq = a.n_queries;
    // The offsets always on the device (`bm25_pack` reads them there), and in the host's
    // buffer too when the hits go there.
    let p_pk_off = a.out + lay.pk_off as u64;
    let packed = a.packed_host.unwrap_or(p_pk_off);
    let p_off_copy = a.packed_host.unwrap_or(0);
    let p_pk_doc = packed + (lay.pk_doc - lay.pk_off) as u64;
    let p_pk_score = packed + (lay.pk_score - lay.pk_off) as u64;
    launches.push(Launch {
        f: f.pack.cu_function(),
        grid: gq.div_ceil(PACK_QUERIES).clamp(1, PACK_BLOCKS),
        block: PACK_QUERIES,
        args: vec![
            gq.into(),
            k32.into(),
            p_cnt.into(),
            p_pk_off.into(),
            p_off_copy.into(),
            p_docs.into(),
            p_scores.into(),
            p_pk_doc.into(),
            p_pk_score.into(),
            a.counters.into(),
            a.clock_host.into(),
        ],
    });
    launches
}

/// Queue a batch's kernel launches on the stream, between `events[1]` (the kernels' window
/// opens) and `events[2]` (it closes): in one submission, through the workspace's kernel
/// graph (`graph.rs`; its event nodes record the two events), once a batch with the same
/// kernels came before, else one by one. `DFSETS_GPU_GRAPH=0` keeps them one by one.
/// Without `events` the batch times itself (`bm25_pack`'s clock): nothing recorded.
///
/// # Safety
/// Each launch's arguments match its kernel's parameter list, and every device pointer among
/// them is valid for the accesses the kernel makes (the callers' notes).
unsafe fn submit(
    g: &Gpu,
    ws: &mut Workspace,
    launches: &[Launch],
    events: Option<&'static [CudaEvent; 4]>,
    t: &mut Bm25Timings,
) -> Result<(), GpuError> {
    let span = events.map(|e| (e[1].cu_event(), e[2].cu_event()));
    // SAFETY: the caller's contract; the events are made once and never dropped, so they
    // outlive every graph that records them.
    let graphed = unsafe {
        ws.graph.submit(
            launches,
            g.stream.cu_stream(),
            g.graphs,
            span,
            |graphed| match events {
                Some(e) if !graphed => g.record(&e[1]),
                _ => Ok(()),
            },
            |l| g.launch_words(l),
        )?
    };
    if graphed {
        t.graph_launches += 1;
        t.graph_update_ms += ws.graph.last.update_ms;
        t.graph_launch_ms += ws.graph.last.launch_ms;
        t.graph_nodes_updated += ws.graph.last.updated;
    } else if let Some(e) = events {
        g.record(&e[2])?;
    }
    Ok(())
}

/// Queries per chunk of `bm25_pack` and its threads (`PACK_QUERIES` in bm25.cu), and its
/// most blocks (`PACK_BLOCKS`).
const PACK_QUERIES: u32 = 256;
const PACK_BLOCKS: u32 = 64;

/// The batch's answers in batch order (the device's, once the stream is synchronized, and
/// the CPU's share). The device's come packed (`bm25_pack`): query slot `s`'s hits are
/// `docs[off[s]..off[s + 1]]`, slots in batch order, so a run of device queries between two
/// of the CPU's share is one copy. A lent block (`part.lent`) is the answer as it lies: its
/// doc ids and scores go to the result uncopied.
fn unpack(
    ws: &mut Workspace,
    part: &Staged,
    k: usize,
    cpu_hits: &[Vec<Hit>],
) -> Result<Ranked, GpuError> {
    let lay = &part.layout;
    let gq = part.gq;
    let (d0, s0) = (lay.pk_doc - lay.pk_off, lay.pk_score - lay.pk_off);
    let pin = if gq == 0 {
        &[][..]
    } else {
        packed_region(ws, part)?
    };
    let (off, dev_doc, dev_score): (&[u32], &[u32], &[f64]) = if gq == 0 {
        (&[0], &[], &[])
    } else {
        (
            &view::<u32>(&pin[..d0])[..gq + 1],
            &view::<u32>(&pin[d0..s0])[..gq * k],
            &view::<f64>(&pin[s0..])[..gq * k],
        )
    };
    // The offsets as `bm25_pack` writes them: from 0, at most k a query.
    if !packed_offsets_ok(off, k) {
        return Err(GpuError::Kernel(format!(
            "packed answers' offsets out of order or above k = {k}"
        )));
    }
    let dev_hits = off[gq] as usize;
    if part.lent && gq > 0 {
        // The hits and their offsets stay where the device wrote them. (The offsets copied
        // into a fresh vector took a few µs of a 10,000-query call on the H200 hosts, its
        // pages faulted in; session 55.)
        let block = Arc::new(ws.pin_lent.take().expect("a lent batch holds its block"));
        // SAFETY: the block starts with the gq + 1 offsets (checked above), and `d0` and `s0`
        // are 256-byte aligned offsets into it, where the device wrote `dev_hits` doc ids and
        // scores (within gq * k each: checked above); the stream is synchronized and the
        // block left the workspace, so nothing writes it.
        let (offsets, docs, scores) = unsafe {
            (
                LentPinned::buffer(&block, 0, (gq + 1) * 4),
                LentPinned::buffer(&block, d0, dev_hits * 4),
                LentPinned::buffer(&block, s0, dev_hits * 8),
            )
        };
        return Ok(Ranked {
            offsets: ScalarBuffer::new(offsets, 0, gq + 1),
            docs: ScalarBuffer::new(docs, 0, dev_hits),
            scores: ScalarBuffer::new(scores, 0, dev_hits),
        });
    }
    let hits = dev_hits + cpu_hits.iter().map(Vec::len).sum::<usize>();
    // Both layouts below hold u32 offsets (`Ranked::build` panics past them).
    if u32::try_from(hits).is_err() {
        return Err(GpuError::Unsupported(format!(
            "{hits} topk_bm25 hits in one batch (fewer than 2^32)"
        )));
    }
    if hits > unpack_seq_max() {
        // Many hits: counts first, filled in parallel.
        let counts: Vec<usize> = part
            .slots()
            .map(|s| {
                if s & ON_CPU != 0 {
                    cpu_hits[(s & !ON_CPU) as usize].len()
                } else {
                    (off[s as usize + 1] - off[s as usize]) as usize
                }
            })
            .collect();
        return Ok(Ranked::build(&counts, |i, docs, scores| {
            let s = part.slot_at(i);
            if s & ON_CPU != 0 {
                for ((h, d), sc) in cpu_hits[(s & !ON_CPU) as usize]
                    .iter()
                    .zip(docs)
                    .zip(scores)
                {
                    *d = h.doc;
                    *sc = h.score;
                }
            } else {
                let at = off[s as usize] as usize;
                docs.copy_from_slice(&dev_doc[at..at + docs.len()]);
                scores.copy_from_slice(&dev_score[at..at + scores.len()]);
            }
        }));
    }
    if part.in_batch_order() {
        // The packed layout is the answer's. (Past `unpack_seq_max` hits, the parallel
        // fill above: one thread copying OR k 100's 835,000 hits took 4.9-5.4 ms on an H100
        // host, the fill 1.0-2.6.)
        return Ok(Ranked {
            offsets: off.to_vec().into(),
            docs: dev_doc[..dev_hits].to_vec().into(),
            scores: dev_score[..dev_hits].to_vec().into(),
        });
    }
    // One pass on this thread: the device's hits are copied a run of consecutive slots at a
    // time (the whole batch at once when the CPU's share has no hits).
    let mut offsets: Vec<u32> = Vec::with_capacity(part.queries() + 1);
    let mut docs = Vec::with_capacity(hits);
    let mut scores = Vec::with_capacity(hits);
    offsets.push(0);
    // The pending run: slots lo..next, not yet copied.
    let (mut lo, mut next) = (0usize, 0usize);
    let flush = |docs: &mut Vec<u32>, scores: &mut Vec<f64>, lo: usize, next: usize| {
        let r = off[lo] as usize..off[next] as usize;
        docs.extend_from_slice(&dev_doc[r.clone()]);
        scores.extend_from_slice(&dev_score[r]);
    };
    for s in part.slots() {
        if s & ON_CPU != 0 {
            let h = &cpu_hits[(s & !ON_CPU) as usize];
            if !h.is_empty() {
                flush(&mut docs, &mut scores, lo, next);
                lo = next;
                docs.extend(h.iter().map(|h| h.doc));
                scores.extend(h.iter().map(|h| h.score));
            }
        } else {
            let s = s as usize;
            if s != next {
                flush(&mut docs, &mut scores, lo, next);
                lo = s;
            }
            next = s + 1;
        }
        // (At most `hits`, below 2^32: checked above.)
        offsets.push((docs.len() + (off[next] - off[lo]) as usize) as u32);
    }
    flush(&mut docs, &mut scores, lo, next);
    Ok(Ranked {
        offsets: offsets.into(),
        docs: docs.into(),
        scores: scores.into(),
    })
}

/// Whether packed answers' offsets are as `bm25_pack` writes them: from 0, each query's
/// count (the next offset less its own) at most `k` (a decrease wraps above it). One pass
/// without data-dependent branches, which the compiler vectorizes (a pass that stopped at the
/// first bad pair was a branch per query).
fn packed_offsets_ok(off: &[u32], k: usize) -> bool {
    let Ok(k) = u32::try_from(k) else {
        return false;
    };
    let Some((&first, rest)) = off.split_first() else {
        return false;
    };
    let over = off
        .iter()
        .zip(rest)
        .fold(0u32, |acc, (&a, &b)| acc | u32::from(b.wrapping_sub(a) > k));
    first == 0 && over == 0
}

/// Most hits a batch's answers are unpacked on one thread (`DFSETS_BM25_UNPACK_SEQ_MAX`;
/// default [`UNPACK_SEQ_MAX`]); more go through [`Ranked::build`]'s parallel fill.
fn unpack_seq_max() -> usize {
    static M: OnceLock<usize> = OnceLock::new();
    *M.get_or_init(|| env_knob("DFSETS_BM25_UNPACK_SEQ_MAX", UNPACK_SEQ_MAX as u64) as usize)
}
const UNPACK_SEQ_MAX: usize = 262_144;

/// Diagnostics (kernels compiled with `DFSETS_BM25_TRACE=1`, else empty): for each place of
/// the last ranking launches' `order`, the start and end (ns, the device's global timer) of
/// the block or short item's warp that ranked it, and the query, kind and multiprocessor
/// (`bm25_trace` in bm25.cu: query in the low 32 bits, kind in the next 8, SM above). Places
/// no block reached are all zero. The record is cleared for the next batch.
pub fn bm25_trace_take() -> Result<Vec<[u64; 3]>, GpuError> {
    if std::env::var("DFSETS_BM25_TRACE").as_deref() != Ok("1") {
        return Ok(Vec::new());
    }
    let g = gpu()?;
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
pub fn bm25_evict() {
    if let Ok(g) = gpu() {
        let _ = g.ctx.bind_to_thread();
        let _ = g.sync();
    }
    *RESIDENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
}

#[cfg(test)]
mod tests {
    use super::*;

    const INF: f64 = f64::INFINITY;

    proptest::proptest! {
        /// The branch-free check says what a pair-by-pair reading of the rule says.
        #[test]
        fn packed_offsets_check_follows_the_rule(
            steps in proptest::collection::vec(0u32..14, 0..300),
            start in 0u32..3,
            k in 1usize..12,
            dip in proptest::option::of(0usize..300),
        ) {
            let mut off = vec![start];
            for s in &steps {
                off.push(off.last().unwrap() + s);
            }
            if let Some(d) = dip.filter(|&d| d + 1 < off.len()) {
                off[d + 1] = off[d].saturating_sub(1); // a decrease (or equal, at 0)
            }
            let want = off[0] == 0
                && off.windows(2).all(|w| w[1] >= w[0] && (w[1] - w[0]) as usize <= k);
            proptest::prop_assert_eq!(packed_offsets_ok(&off, k), want);
        }
    }

    #[test]
    fn packed_offsets_edges() {
        assert!(!packed_offsets_ok(&[], 10));
        assert!(packed_offsets_ok(&[0], 10));
        assert!(!packed_offsets_ok(&[1], 10));
        assert!(packed_offsets_ok(&[0, 10, 10, 20], 10));
        assert!(!packed_offsets_ok(&[0, 11], 10));
        assert!(!packed_offsets_ok(&[0, 5, 4], 10));
        assert!(!packed_offsets_ok(&[0, u32::MAX], 10));
    }

    #[test]
    fn a_query_is_split_by_its_candidates_times_the_lists_searched() {
        let lens = [10_000, 300, 50_000];
        let maxima = [1.0, 2.0, 0.5];
        // No floor: all lists are swept, in one piece.
        let p = plan(&lens, |j| maxima[j], -INF, 0.0, Mode::Or, 10, 4096);
        assert_eq!((p.pieces, p.work), (1, 60_300));
        // A floor below every maximum: every posting is a candidate searched in two lists, in
        // pieces cut at the longest list.
        let p = plan(&lens, |j| maxima[j], 0.1, 0.0, Mode::Or, 10, 4096);
        assert_eq!((p.pieces, p.work, p.lead), (30, 120_600, 2));
        // A floor of 1.6: the two smallest maxima (0.5 + 1.0 = 1.5 <= 1.6) are put aside;
        // the candidates are the 300 postings of the list of maximum 2.0.
        let p = plan(&lens, |j| maxima[j], 1.6, 0.0, Mode::Or, 10, 128);
        assert_eq!((p.pieces, p.work, p.lead), (5, 600, 1));
        // The static bound counts against the floor: 0.2 + 0.5 <= 1.0 but + 1.0 is not.
        let p = plan(&lens, |j| maxima[j], 1.0, 0.2, Mode::AndOr, 10, 4096);
        assert_eq!((p.pieces, p.work, p.lead), (6, 20_600, 0));
        // Within one piece: not split.
        let p = plan(&[100, 50], |j| [1.0, 2.0][j], 1.6, 0.0, Mode::Or, 10, 200);
        assert_eq!((p.pieces, p.work), (1, 50));
        // One list: each candidate counts once.
        let p = plan(&[1000], |_| 1.0, 0.5, 0.0, Mode::Or, 10, 100);
        assert_eq!((p.pieces, p.work), (10, 1000));
        // Every list below the floor: nothing to visit.
        let p = plan(&lens, |j| maxima[j], 4.0, 0.0, Mode::Or, 10, 16);
        assert_eq!((p.pieces, p.work), (1, 0));
        // AND: the shortest list's postings, each searched in the others, cut at that list.
        let p = plan(&lens, |j| maxima[j], -INF, 0.0, Mode::And, 10, 100);
        assert_eq!((p.pieces, p.work, p.lead), (6, 600, 1));
    }

    #[test]
    fn pieces_are_bounded_by_the_merge_buffer() {
        let lens = [1_000_000];
        let maxima = [1.0];
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 10, 16);
        assert_eq!(p.pieces as usize, MAX_PIECES);
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 100, 16);
        assert_eq!(p.pieces as usize, CAP / 100);
        let p = plan(&[5, 1_000_000], |_| 1.0, -INF, 0.0, Mode::And, 100, 1);
        assert_eq!((p.pieces as usize, p.work), (5, 5));
        // k above half the buffer: two pieces' answers would not fit, no split.
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 600, 16);
        assert_eq!(p.pieces, 1);
        let p = plan(&lens, |_| 1.0, -INF, 0.0, Mode::And, 600, 16);
        assert_eq!(p.pieces, 1);
        // Splitting off.
        let p = plan(&lens, |j| maxima[j], 0.5, 0.0, Mode::Or, 10, 0);
        assert_eq!(p.pieces, 1);
        let p = plan(&[5, 1_000_000], |_| 1.0, -INF, 0.0, Mode::And, 10, 0);
        assert_eq!((p.pieces, p.work), (1, 5));
    }
}
