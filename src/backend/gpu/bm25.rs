//! Batched BM25 top-k on the device (`kernels/bm25.cu`): the host side.
//!
//! - The index is made resident once per [`Scored`] (per index and parameter set) and kept
//!   between batches: document ordinals (the rank of each doc id, so ordinal order is doc-id
//!   order) and f64 impacts of the resident terms' postings, and per ordinal the doc id and
//!   the weighted static score. When the whole index does not fit the budget, the terms the
//!   queries visit most (counted over the batches seen) are admitted first (the Wang et al.
//!   list cache); a query with a term that is not resident finishes on the CPU.
//! - A batch is uploaded in one copy (query order, CSR offsets, modes, list references),
//!   ranked by one launch (one block per query, the longest queries first), and its results
//!   come back in one copy.
//! - Results are bit-identical to the CPU's (`search::topk`): same f64 sums in the same
//!   order, same ties. Queries the kernel does not take (more than [`BM25_MAX_TERMS`]
//!   terms, k above [`BM25_MAX_K`], lists not resident) come back as `None`.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Instant;

use cudarc::driver::result;
use cudarc::driver::{CudaEvent, CudaFunction};
use rayon::prelude::*;

use super::cuda::{
    DevBuf, Gpu, Workspace, align, arg, bytes_of, compile_module, drv, gpu, panic_message,
};
use super::{BM25_MAX_K, BM25_MAX_TERMS, Bm25Batch, Bm25Cpu, Bm25Output, Bm25Timings, GpuError};
use crate::search::index::InvertedIndex;
use crate::search::rank::Ranked;
use crate::search::scoring::Scored;
use crate::search::topk::{Hit, Mode};

const SOURCE: &str = include_str!("../../../kernels/bm25.cu");
const THREADS: u32 = 256;
/// Bytes of one `ListRef` of the kernel.
const LISTREF_BYTES: usize = 16;

static KERNEL: OnceLock<Result<CudaFunction, GpuError>> = OnceLock::new();

fn kernel(g: &Gpu) -> Result<&'static CudaFunction, GpuError> {
    KERNEL
        .get_or_init(|| {
            let (major, minor) = g.info.compute_capability;
            let arch: &'static str = Box::leak(format!("compute_{major}{minor}").into_boxed_str());
            let module = compile_module(&g.ctx, arch, SOURCE, "bm25.cu", compile_options())?;
            module
                .load_function("bm25_topk")
                .map_err(drv("kernel lookup"))
        })
        .as_ref()
        .map_err(Clone::clone)
}

/// NVRTC options beyond C++17: the OR tile's size when `DFSETS_BM25_TILE` asks for another
/// (a power of two in 256..=4096; a measurement knob, anything else is ignored).
fn compile_options() -> Vec<String> {
    let mut o = Vec::new();
    if let Some(t) = std::env::var("DFSETS_BM25_TILE")
        .ok()
        .and_then(|v| v.trim().parse::<u32>().ok())
        .filter(|t| t.is_power_of_two() && (256..=4096).contains(t))
    {
        o.push(format!("-DTILE={t}"));
    }
    o
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
    /// Device position of each term's postings, `u64::MAX` where not resident.
    start: Vec<u64>,
    /// Times each term was visited by a query (over every batch seen).
    visits: Vec<u64>,
    all: bool,
    ord: Option<DevBuf>,
    imp: Option<DevBuf>,
    stat: Option<DevBuf>,
    doc: Option<DevBuf>,
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
            start: vec![u64::MAX; index.terms()],
            visits: vec![0; index.terms()],
            all: false,
            ord: None,
            imp: None,
            stat: None,
            doc: None,
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
        self.bytes = 0;
        let mut ord = Vec::new();
        let mut imp = Vec::new();
        self.start.iter_mut().for_each(|s| *s = u64::MAX);
        self.all = sel.iter().all(|&s| s);
        if self.all {
            // The whole index in its own layout: term t starts at its index offset.
            for t in 0..index.terms() as u32 {
                self.start[t as usize] = index.range(t).start as u64;
            }
        } else {
            for t in 0..index.terms() as u32 {
                if sel[t as usize] {
                    self.start[t as usize] = ord.len() as u64;
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
) -> Result<Bm25Output, GpuError> {
    let n = batch.modes.len();
    if batch.offsets.len() != n + 1
        || batch.offsets[n] as usize != batch.terms.len()
        || batch.offsets.windows(2).any(|w| w[0] > w[1])
        || batch.terms.iter().any(|&t| t as usize >= index.terms())
    {
        return Err(GpuError::Unsupported("malformed BM25 batch".into()));
    }
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
/// Queries per parallel task when staging a batch.
const STAGE_GROUP: usize = 512;
/// Buckets of [`work_bucket`] (work < 2^64).
const WORK_BUCKETS: usize = 4 * 63 + 4;

/// Views of the pinned byte buffers as the kernel's element types.
///
/// SAFETY (both): `T` is one of u32, u64, f64 (every bit pattern valid, no padding); the
/// regions start at multiples of 256 bytes in page-aligned pinned buffers (asserted).
fn view<T: Copy>(bytes: &[u8]) -> &[T] {
    // SAFETY: see above.
    let (pre, mid, _) = unsafe { bytes.align_to::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}
fn view_mut<T: Copy>(bytes: &mut [u8]) -> &mut [T] {
    // SAFETY: see `view`.
    let (pre, mid, _) = unsafe { bytes.align_to_mut::<T>() };
    assert!(pre.is_empty(), "misaligned pinned region");
    mid
}

#[allow(clippy::too_many_arguments)]
fn run(
    g: &Gpu,
    f: &CudaFunction,
    ws: &mut Workspace,
    resident: &mut Option<Resident>,
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    batch: &Bm25Batch<'_>,
    k: usize,
    budget: usize,
    cpu: &Bm25Cpu<'_>,
    t: &mut Bm25Timings,
) -> Result<Ranked, GpuError> {
    let n = batch.modes.len();
    let ms = |since: Instant| since.elapsed().as_secs_f64() * 1e3;
    let t_stage = Instant::now();
    if !resident.as_ref().is_some_and(|r| r.is_for(scored)) {
        *resident = None;
        *resident = Some(Resident::new(index, scored)?);
    }
    let res = resident.as_mut().expect("set above");
    let terms_of =
        |i: usize| &batch.terms[batch.offsets[i] as usize..batch.offsets[i + 1] as usize];
    // With the whole index resident (the usual case) nothing below needs the visit counts
    // or a new selection.
    if !(res.all && res.ord.is_some()) {
        for &t in batch.terms {
            res.visits[t as usize] += 1;
        }
        let fits = |res: &Resident, i: usize| {
            let ts = terms_of(i);
            !ts.is_empty()
                && ts.len() <= BM25_MAX_TERMS
                && ts.iter().all(|&t| res.start[t as usize] != u64::MAX)
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
                let ts = terms_of(i);
                !ts.is_empty() && ts.len() <= BM25_MAX_TERMS && ts.iter().all(|&t| sel[t as usize])
            };
            let new_cov = (0..n).filter(|&i| covers(i)).count();
            if !loaded || new_cov > covered {
                t.uploaded_bytes += res.upload(g, index, scored, &sel)? as u64;
            }
        }
    }
    t.resident_bytes = res.bytes as u64;

    // Each query's place (a device slot or the CPU's share), its work, its lists, written
    // straight into the pinned upload buffer: a counting pass and a writing pass over groups
    // of queries, in parallel.
    let offs = index.offsets();
    let all = res.all;
    let starts = &res.start;
    let takes = |i: usize| {
        let ts = terms_of(i);
        !ts.is_empty()
            && ts.len() <= BM25_MAX_TERMS
            && (all || ts.iter().all(|&t| starts[t as usize] != u64::MAX))
    };
    let groups: Vec<(usize, usize)> = (0..n.div_ceil(STAGE_GROUP))
        .into_par_iter()
        .map(|c| {
            let (mut q, mut l) = (0, 0);
            for i in c * STAGE_GROUP..((c + 1) * STAGE_GROUP).min(n) {
                if takes(i) {
                    q += 1;
                    l += terms_of(i).len();
                }
            }
            (q, l)
        })
        .collect();
    let gq: usize = groups.iter().map(|g| g.0).sum();
    let n_lists: usize = groups.iter().map(|g| g.1).sum();
    t.on_device = gq;
    t.lookup_ms = ms(t_stage);
    let t_fill = Instant::now();
    if gq == 0 {
        t.stage_ms = ms(t_stage);
        let lists: Vec<Vec<Hit>> = (0..n).into_par_iter().map(cpu).collect();
        return Ok(Ranked::from_lists(&lists));
    }
    // Input region: order | q_off | modes | lists | floors.
    let order_at = 0usize;
    let qoff_at = align(gq * 4);
    let mode_at = qoff_at + align((gq + 1) * 4);
    let lists_at = mode_at + align(gq);
    let floor_at = lists_at + align(n_lists * LISTREF_BYTES);
    let in_bytes = floor_at + align(gq * 8);
    // Output region: counts | docs | scores.
    let cnt_at = 0usize;
    let doc_at = align(gq * 4);
    let score_at = doc_at + align(gq * k * 4);
    let out_bytes = score_at + gq * k * 8;
    let d_in = ws.dev("bm25_in", in_bytes)?;
    let d_out = ws.dev("bm25_out", out_bytes)?;
    let mut slot = vec![0u32; n];
    let mut keys = vec![0u8; gq];
    let mut cpu_q = vec![0u32; n - gq];
    let pin = &mut Workspace::pinned(&mut ws.pin_in, in_bytes)?.as_mut_slice()[..in_bytes];
    let (head, floors_b) = pin.split_at_mut(floor_at);
    let floors_v = &mut view_mut::<f64>(floors_b)[..gq];
    let (head, lists_b) = head.split_at_mut(lists_at);
    let (head, modes_b) = head.split_at_mut(mode_at);
    let (order_b, qoff_b) = head.split_at_mut(qoff_at);
    let order_v = &mut view_mut::<u32>(order_b)[..gq];
    let qoff = &mut view_mut::<u32>(qoff_b)[..gq + 1];
    qoff[gq] = n_lists as u32;
    let lists_v = &mut view_mut::<u64>(lists_b)[..2 * n_lists];
    let modes_v = &mut modes_b[..gq];
    // Split every output into the groups' parts.
    struct Part<'a> {
        first: usize,
        q0: usize,
        l0: usize,
        c0: usize,
        slot: &'a mut [u32],
        keys: &'a mut [u8],
        qoff: &'a mut [u32],
        modes: &'a mut [u8],
        lists: &'a mut [u64],
        floors: &'a mut [f64],
        cpu_q: &'a mut [u32],
    }
    let mut parts = Vec::with_capacity(groups.len());
    {
        let (mut sl, mut ke, mut qo, mut mo, mut li, mut fl, mut cq) = (
            slot.as_mut_slice(),
            keys.as_mut_slice(),
            &mut qoff[..gq],
            &mut *modes_v,
            &mut *lists_v,
            &mut *floors_v,
            cpu_q.as_mut_slice(),
        );
        let (mut q0, mut l0, mut c0) = (0, 0, 0);
        for (c, &(q, l)) in groups.iter().enumerate() {
            let first = c * STAGE_GROUP;
            let nq = ((c + 1) * STAGE_GROUP).min(n) - first;
            let a;
            (a, sl) = std::mem::take(&mut sl).split_at_mut(nq);
            let b;
            (b, ke) = std::mem::take(&mut ke).split_at_mut(q);
            let d;
            (d, qo) = std::mem::take(&mut qo).split_at_mut(q);
            let e;
            (e, mo) = std::mem::take(&mut mo).split_at_mut(q);
            let f;
            (f, li) = std::mem::take(&mut li).split_at_mut(2 * l);
            let h;
            (h, fl) = std::mem::take(&mut fl).split_at_mut(q);
            let g;
            (g, cq) = std::mem::take(&mut cq).split_at_mut(nq - q);
            parts.push(Part {
                first,
                q0,
                l0,
                c0,
                slot: a,
                keys: b,
                qoff: d,
                modes: e,
                lists: f,
                floors: h,
                cpu_q: g,
            });
            q0 += q;
            l0 += l;
            c0 += nq - q;
        }
    }
    parts.into_par_iter().for_each(|p| {
        let (mut q, mut l, mut c) = (0, 0, 0);
        for (r, s) in p.slot.iter_mut().enumerate() {
            let i = p.first + r;
            if !takes(i) {
                *s = ON_CPU | (p.c0 + c) as u32;
                p.cpu_q[c] = i as u32;
                c += 1;
                continue;
            }
            *s = (p.q0 + q) as u32;
            p.qoff[q] = (p.l0 + l) as u32;
            p.modes[q] = match batch.modes[i] {
                Mode::And => 0,
                Mode::Or => 1,
                Mode::AndOr => 2,
            };
            // OR's starting threshold (AND never reads it).
            p.floors[q] = match batch.modes[i] {
                Mode::And => f64::NEG_INFINITY,
                Mode::Or | Mode::AndOr => scored.theta_floor(terms_of(i), k),
            };
            // A ListRef is { u64 start; u32 len; f32 max }: two little-endian u64 words.
            let mut work = 0u64;
            for &tm in terms_of(i) {
                let tm = tm as usize;
                let len = (offs[tm + 1] - offs[tm]) as u64;
                p.lists[2 * l] = starts[tm];
                p.lists[2 * l + 1] = len | (u64::from(max_up(scored.term_max[tm]).to_bits()) << 32);
                work += len;
                l += 1;
            }
            p.keys[q] = work_bucket(work) as u8;
            q += 1;
        }
    });
    t.fill_ms = ms(t_fill);

    // Longest first: a counting sort on buckets of work (descending), stable.
    let t_sort = Instant::now();
    let mut start = [0u32; WORK_BUCKETS + 1];
    for &b in &keys {
        start[WORK_BUCKETS - 1 - b as usize + 1] += 1;
    }
    for b in 1..=WORK_BUCKETS {
        start[b] += start[b - 1];
    }
    for (j, &b) in keys.iter().enumerate() {
        let at = &mut start[WORK_BUCKETS - 1 - b as usize];
        order_v[*at as usize] = j as u32;
        *at += 1;
    }
    t.sort_ms = ms(t_sort);
    t.stage_ms = ms(t_stage);

    let t_wait = Instant::now();
    let cs = g.stream.cu_stream();
    let ev = |g: &Gpu| -> Result<CudaEvent, GpuError> { g.event() };
    let (e0, e1, e2, e3) = (ev(g)?, ev(g)?, ev(g)?, ev(g)?);
    g.record(&e0)?;
    {
        let pin = ws
            .pin_in
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
        // SAFETY: `d_in` holds at least `in_bytes`; the pinned source is owned by the
        // workspace and not touched until the stream is synchronized below.
        unsafe { result::memcpy_htod_async(d_in, &pin.as_slice()[..in_bytes], cs) }
            .map_err(drv("host-to-device copy"))?;
    }
    g.record(&e1)?;
    let gq32 = gq as u32;
    let k32 = k as u32;
    let p_order = d_in + order_at as u64;
    let p_qoff = d_in + qoff_at as u64;
    let p_mode = d_in + mode_at as u64;
    let p_lists = d_in + lists_at as u64;
    let p_floor = d_in + floor_at as u64;
    let static_max = scored.static_max;
    let p_ord = Resident::ptr(&res.ord);
    let p_imp = Resident::ptr(&res.imp);
    let p_stat = Resident::ptr(&res.stat);
    let p_doc = Resident::ptr(&res.doc);
    let p_cnt = d_out + cnt_at as u64;
    let p_docs = d_out + doc_at as u64;
    let p_scores = d_out + score_at as u64;
    // SAFETY: the parameters match `bm25_topk` in kernels/bm25.cu; the input region holds
    // gq order entries, gq + 1 offsets, gq modes and n_lists list references whose
    // postings lie in the resident buffers (start + len within them, by construction);
    // the output region holds gq counts and gq * k docs and scores; the floors region holds
    // gq f64; ord_static is null without static scores.
    unsafe {
        g.launch(
            f,
            gq32,
            THREADS,
            &mut [
                arg(&gq32),
                arg(&p_order),
                arg(&p_qoff),
                arg(&p_mode),
                arg(&p_lists),
                arg(&p_ord),
                arg(&p_imp),
                arg(&p_stat),
                arg(&p_doc),
                arg(&k32),
                arg(&p_cnt),
                arg(&p_docs),
                arg(&p_scores),
                arg(&p_floor),
                arg(&static_max),
            ],
        )?;
    }
    g.record(&e2)?;
    {
        let pin = Workspace::pinned(&mut ws.pin_out, out_bytes)?;
        // SAFETY: `d_out` holds `out_bytes`; the pinned destination is read only after
        // the synchronize below.
        unsafe { result::memcpy_dtoh_async(&mut pin.as_mut_slice()[..out_bytes], d_out, cs) }
            .map_err(drv("device-to-host copy"))?;
    }
    g.record(&e3)?;
    // The CPU's share while the device works.
    let t_cpu = Instant::now();
    let cpu_hits: Vec<Vec<Hit>> = cpu_q.par_iter().map(|&i| cpu(i as usize)).collect();
    t.cpu_ms = ms(t_cpu);
    g.sync()?;
    t.wait_ms = ms(t_wait);

    let t_unpack = Instant::now();
    let pin = &ws
        .pin_out
        .as_ref()
        .ok_or(GpuError::OutOfMemory("pinned allocation"))?
        .as_slice()[..out_bytes];
    let dev_cnt = &view::<u32>(&pin[cnt_at..doc_at])[..gq];
    let dev_doc = &view::<u32>(&pin[doc_at..score_at])[..gq * k];
    let dev_score = &view::<f64>(&pin[score_at..])[..gq * k];
    if let Some(&c) = dev_cnt.iter().find(|&&c| c as usize > k) {
        return Err(GpuError::Kernel(format!("{c} hits for k = {k}")));
    }
    let counts: Vec<usize> = slot
        .iter()
        .map(|&s| {
            if s & ON_CPU != 0 {
                cpu_hits[(s & !ON_CPU) as usize].len()
            } else {
                dev_cnt[s as usize] as usize
            }
        })
        .collect();
    let ranked = Ranked::build(&counts, |i, docs, scores| {
        let s = slot[i];
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
            let at = s as usize * k;
            let c = docs.len();
            docs.copy_from_slice(&dev_doc[at..at + c]);
            scores.copy_from_slice(&dev_score[at..at + c]);
        }
    });
    t.unpack_ms = ms(t_unpack);
    let ms =
        |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map(f64::from).map_err(drv("event timing"));
    t.h2d_ms = ms(&e0, &e1)?;
    t.kernel_ms = ms(&e1, &e2)?;
    t.d2h_ms = ms(&e2, &e3)?;
    t.h2d_bytes = in_bytes as u64;
    t.d2h_bytes = out_bytes as u64;
    Ok(ranked)
}

/// Drop the resident index (tests; frees its device memory).
pub fn bm25_evict() {
    if let Ok(g) = gpu() {
        let _ = g.ctx.bind_to_thread();
        let _ = g.sync();
    }
    *RESIDENT.lock().unwrap_or_else(|p| p.into_inner()) = None;
}
