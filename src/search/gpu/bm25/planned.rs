//! A batch planned on the device (the whole index resident): the host writes each query's
//! term ids and unknown-term flag into a page-locked buffer (no lookups), and `bm25_plan` /
//! `bm25_order` (kernels/bm25.cu) read them there across the bus (or in a copy), look the
//! lists up, take the floors, plan the pieces and order the items on the device.
//!
//! The host-staged path (`stage` in the parent) reads each term's list reference and floor
//! and plans every query on the host: ~0.3-0.5 ms of a 10,000-query batch on the H100 host
//! (cache misses into the term table), longer than AND's kernels. Here the host's share is a
//! copy of the term ids into that buffer and one graph launch (H200 hosts: the copy up
//! queued beside it cost 0.010-0.017 ms of the host's time and the device's reads across
//! the bus ~0.007 ms of the kernels'; the knob `bm25_mapped_in` off queues the copy).
//! It does not wait for the plan: `bm25_topk` goes out on an upper
//! bound of blocks (the queries ranked plus the piece budget) and `bm25_merge` on a fixed
//! number that stride over the split queries, both reading the plan's counts on the device;
//! the host reads the counts after the batch's one wait (`settle`).
//! [`crate::tuning::bm25_device_plan`] off (the knob, or `set_bm25_device_plan(false)`)
//! keeps the host-staged path.

use cudarc::driver::result;

use super::launch::{RankArgs, answers_down, packed_on_host, rank_launches, submit};
use super::resident::Resident;
use super::{
    CAP, Ctx, Kernels, Layout, MAX_PIECES, ON_CPU, Staged, batch_events, malformed, mode_code,
};
use crate::backend::gpu::{
    DevBuf, Gpu, GpuError, Launch, Workspace, align, bytes_of, drv, view, view_mut,
};
use crate::search::gpu::{BM25_MAX_TERMS, Bm25Timings};
use crate::search::topk::Mode;
use crate::tuning::knobs;

/// Whether the device reads a batch where the host wrote it (the pinned upload buffer, through
/// its mapped address: `bm25_plan` copies the offsets and writes the modes into device
/// memory, `bm25_clear` clears the counters) rather than in a copy queued before the kernels
/// (the knob `bm25_mapped_in`, default on; off: the copy).
fn mapped() -> bool {
    knobs().bm25_mapped_in
}

/// Whether batches go through this path when the whole index is resident
/// ([`crate::tuning::bm25_device_plan`]).
pub(super) fn enabled() -> bool {
    crate::tuning::bm25_device_plan()
}

/// Threads per block of `bm25_plan` (one query each).
const PLAN_THREADS: u32 = 128;
/// Threads of `bm25_order`'s one block.
const ORDER_THREADS: u32 = 1024;
/// Bytes the pieces' answers may take on the device (the piece budget at large k).
const PIECE_BYTES_MAX: usize = 64 << 20;

/// What a device-planned batch adds to [`Staged`]: where its upload and the device's planning
/// buffers lie, and its budget of piece slots and items.
#[derive(Clone, Copy, Default)]
pub(super) struct PlannedLayout {
    /// Upload: q_off (gq + 1) | terms | modes | counters (`COUNTERS` zero words:
    /// `bm25_plan`'s counters start cleared with no memset).
    terms: usize,
    modes: usize,
    counters: usize,
    max_pieces: usize,
    cap_items: usize,
    /// Device planning buffer: lists | floors | items | keys | order | split_q | split_lo |
    /// split_hi.
    lists: usize,
    floors: usize,
    items: usize,
    keys: usize,
    order: usize,
    splitq: usize,
    splitlo: usize,
    splithi: usize,
    /// ... | the offsets (gq + 1) | the modes (gq) | the counters, where a batch the device
    /// reads in the host's buffer (`mapped`) has them on the device.
    qoff: usize,
    mode: usize,
    counters_dev: usize,
    plan_bytes: usize,
}

impl Resident {
    /// The device's copies of every term's list reference (once per residency) and of every
    /// term's own floor at `k` (once per k; none when k has no floors).
    pub(super) fn device_tables(&mut self, k: usize) -> Result<(u64, u64), GpuError> {
        if self.d_refs.is_none() {
            self.d_refs = Some(DevBuf::upload(
                bytes_of(&self.refs),
                "index allocation",
                "index upload",
            )?);
        }
        let floors = match &self.floors {
            Some((fk, f)) if *fk == k => Some(f),
            _ => None,
        };
        let p_floor = match floors {
            None => {
                self.d_floors = None; // another k's: not read, not kept
                0
            }
            Some(f) => {
                if self.d_floors.as_ref().is_none_or(|(dk, _)| *dk != k) {
                    self.d_floors = None;
                    self.d_floors = Some((
                        k,
                        DevBuf::upload(bytes_of(f), "index allocation", "index upload")?,
                    ));
                }
                self.d_floors.as_ref().map_or(0, |(_, b)| b.ptr)
            }
        };
        Ok((Resident::ptr(&self.d_refs), p_floor))
    }
}

/// Stage the batch for the device's planning: the whole batch goes up as it lies (`Queries`:
/// every term id in one copy, the offsets, each query's unknown-term flag), each query in the
/// device slot of its batch index; `bm25_plan` gives each query its mode from its flag and
/// the batch's mode. A query with no terms under its mode's rule is left unranked on the
/// device (`MODE_NONE` in bm25.cu: its count stays the cleared 0, its answer empty, as the
/// CPU's rule says); one with more than [`BM25_MAX_TERMS`] terms too, and it goes to the
/// CPU's share. Copies and one counting pass on the calling thread, no compaction: the device
/// skips what it does not rank. (H200 hosts: a pass writing each query's mode
/// byte into the pinned buffer, or into ordinary memory and then copied there, took
/// 0.017-0.033 ms of a 10,000-query batch.)
/// (Staging only the ranked queries, compacted, took 0.14 ms of a 10,000-query AND batch in
/// parallel groups and 0.39 ms on the calling thread, on the H200 host.)
pub(super) fn stage(
    c: &Ctx<'_>,
    ws: &mut Workspace,
    hold: &mut dyn FnMut(usize) -> bool,
    t: &mut Bm25Timings,
) -> Result<Staged, GpuError> {
    let ms = |since: std::time::Instant| since.elapsed().as_secs_f64() * 1e3;
    let t0 = std::time::Instant::now();
    let (k, batch) = (c.k, c.batch);
    let nq = batch.len();
    let ids = batch.queries.all_ids();
    let offsets = batch.queries.offsets();
    let n_terms = ids.len();
    if u32::try_from(n_terms).is_err() {
        return Err(GpuError::Unsupported(format!(
            "{n_terms} query terms in one topk_bm25 batch (the device takes fewer than 2^32)"
        )));
    }
    // The device's slots are the batch's indices (an empty `slot`, until a query goes to
    // the CPU).
    let mut part = Staged::new(0, 0);
    part.gq = nq;
    part.on_device = nq;
    t.lookup_ms += ms(t0);
    let t_fill = std::time::Instant::now();
    let gq = nq;
    let mut pl = PlannedLayout::default();
    pl.terms = align((gq + 1) * 4);
    pl.modes = pl.terms + align(n_terms * 4);
    pl.counters = pl.modes + align(gq);
    part.in_bytes = pl.counters + COUNTER_BYTES;
    let mut lay = Layout::default();
    (part.out_bytes, part.down_bytes) = lay.answers(gq, k);
    // The counters come back through the items' pinned buffer (written there by
    // `bm25_order`, or copied down).
    part.items_bytes = align(COUNTER_BYTES);
    if !hold(part.in_bytes + part.items_bytes + part.down_bytes) {
        return Err(GpuError::MemoryLimit(format!(
            "{} bytes of topk_bm25's GPU staging",
            part.in_bytes + part.items_bytes + part.down_bytes
        )));
    }
    let in_bytes = part.in_bytes;
    let pin = &mut Workspace::pinned(&mut ws.pin_in, in_bytes)?.as_mut_slice()[..in_bytes];
    let (head, tail) = pin.split_at_mut(pl.modes);
    let (modes_b, counters_b) = tail.split_at_mut(pl.counters - pl.modes);
    counters_b.fill(0);
    let (qoff_b, terms_b) = head.split_at_mut(pl.terms);
    // The offsets written as the device reads them (u32) and the queries counted in one pass,
    // from the same values (nothing read back from the pinned buffer: a pass that did took
    // 0.10-0.13 ms on the GPU hosts, the same pass over ordinary memory 0.02-0.04). A vector
    // of u32 offsets, a count over it and its copy: 12.5-17.6 µs for 10,000 queries against
    // 9.5-12.2 for this pass (a microbenchmark on a Zen 5 host, caches cold).
    let t_copy = std::time::Instant::now();
    let unknown = batch.queries.unknown_flags();
    let (ranked, long) = offsets_and_counts(
        offsets,
        unknown,
        batch.mode,
        &mut view_mut::<u32>(qoff_b)[..gq + 1],
    );
    view_mut::<u32>(terms_b)[..n_terms].copy_from_slice(ids);
    // Each query's unknown-term flag, which `bm25_plan` turns into its mode in place.
    for (m, &u) in modes_b[..gq].iter_mut().zip(unknown) {
        *m = u8::from(u);
    }
    t.copy_ms += ms(t_copy);
    // Piece slots: as many as every ranked query could use (its most pieces, min(CAP / k,
    // 64)), within PIECE_BYTES_MAX of answers. A slot the plan leaves unused costs its
    // answer's bytes on the device and nothing else: `bm25_topk`'s blocks claim the items the
    // plan made (`claim`), none is launched per slot. The plan hands slots out first come,
    // first served, and a query that finds them taken is ranked whole: with a budget short of
    // the demand the queries planned last make the batch's tail (H100 host, the first 10,000
    // terabyte05 queries OR k 10 on the 40x corpus with four slots a query: all 33,396 used,
    // queries of 9-12 lists ranked whole by one block each, the longest 134 ms of a 135 ms
    // span whose blocks were 13.8 s of work, 26 ms on the device's 528 resident blocks).
    let most = (CAP / k.max(1)).min(MAX_PIECES);
    pl.max_pieces = match crate::tuning::bm25_piece_slots() {
        Some(per_8) => ranked * per_8 / 8,
        None => ranked * most,
    }
    .min(PIECE_BYTES_MAX / (k * 12))
    .max(1);
    pl.cap_items = gq + 2 * pl.max_pieces;
    pl.lists = 0;
    pl.floors = align(n_terms * 16);
    pl.items = pl.floors + align(gq * 8);
    pl.keys = pl.items + align(pl.cap_items * 16);
    pl.order = pl.keys + align(pl.cap_items);
    pl.splitq = pl.order + align(pl.cap_items * 4);
    pl.splitlo = pl.splitq + align(gq * 4);
    pl.splithi = pl.splitlo + align(gq * 4);
    pl.qoff = pl.splithi + align(gq * 4);
    pl.mode = pl.qoff + align((gq + 1) * 4);
    pl.counters_dev = pl.mode + align(gq);
    pl.plan_bytes = pl.counters_dev + align(COUNTER_BYTES);
    lay.pord = align(pl.max_pieces * 4);
    lay.pscore = lay.pord + align(pl.max_pieces * k * 4);
    lay.and = lay.pscore + align(pl.max_pieces * k * 8);
    lay.done = lay.and + align(gq * 4);
    lay.piece_bytes = lay.done + align(pl.max_pieces * 4);
    // The rare query past BM25_MAX_TERMS goes to the CPU. (The counts above: one pass without
    // data-dependent branches. On an H200 host, 10,000 AND queries: a pass through
    // `terms(i)` / `mode(i)`, branching on each query's empty term list, took 0.13-0.15 ms.)
    let t_modes = std::time::Instant::now();
    if long > 0 {
        part.slot = (0..nq as u32).collect();
        for i in 0..nq {
            if batch.terms(i).len() > BM25_MAX_TERMS {
                part.slot[i] = ON_CPU | part.cpu_q.len() as u32;
                part.cpu_q.push(i as u32);
            }
        }
    }
    t.modes_ms += ms(t_modes);
    // The CPU's queries' term ids are checked here; the device checks those of the queries it
    // ranks (`bm25_plan`'s C_BAD) and reads no others.
    let n_index_terms = c.index.terms();
    let beyond = |&i: &u32| {
        batch
            .terms(i as usize)
            .iter()
            .any(|&t| t as usize >= n_index_terms)
    };
    if part.cpu_q.iter().any(beyond) {
        return Err(malformed());
    }
    if ranked == 0 {
        // Nothing for the device: every query is the CPU's (answered empty, or ranked there).
        let mut host = Staged::new(nq, 0);
        for (i, (slot, q)) in host.slot.iter_mut().zip(&mut host.cpu_q).enumerate() {
            *slot = ON_CPU | i as u32;
            *q = i as u32;
        }
        t.fill_ms += ms(t_fill);
        t.stage_ms += ms(t0);
        return Ok(host);
    }
    part.on_device = ranked;
    part.layout = lay;
    part.planned = Some(pl);
    t.fill_ms += ms(t_fill);
    t.stage_ms += ms(t0);
    Ok(part)
}

/// Writes the batch's offsets `off` (n + 1 of them, each below 2^32) into `out` as the
/// device's u32, and counts how many of the batch's queries the device ranks (1 ..=
/// [`BM25_MAX_TERMS`] terms under the batch's rules: [`Bm25Batch::terms`]; `bm25_plan` gives
/// the others `MODE_NONE`) and how many have too many terms (the CPU ranks those), from the
/// same values and the unknown-term flags: 32-bit lanes without data-dependent branches.
///
/// [`Bm25Batch::terms`]: crate::search::gpu::Bm25Batch::terms
fn offsets_and_counts(
    off: &[usize],
    unknown: &[bool],
    batch_mode: Mode,
    out: &mut [u32],
) -> (usize, usize) {
    let n = unknown.len();
    out[0] = off[0] as u32;
    let drop_unknown = u8::from(batch_mode == Mode::And);
    let max = BM25_MAX_TERMS as u32;
    let (mut ranked, mut long) = (0u32, 0u32);
    for (((&a, &b), w), &unk) in off[..n]
        .iter()
        .zip(&off[1..=n])
        .zip(&mut out[1..=n])
        .zip(unknown)
    {
        let (a, b) = (a as u32, b as u32);
        *w = b;
        // All ones unless the query's unknown term empties it (AND).
        let keep = 0u32.wrapping_sub(u32::from((u8::from(unk) & drop_unknown) ^ 1));
        let terms = b.wrapping_sub(a) & keep;
        ranked += u32::from(terms.wrapping_sub(1) < max); // 1 ..= max terms
        long += u32::from(terms > max);
    }
    (ranked as usize, long as usize)
}

/// Queue the batch: its copy up, the planning launches, the ranking launches on upper
/// bounds of blocks (no wait for the plan), the packing and the counters' copy down (events
/// as in the parent's `launch`). [`settle`] reads the counters after the batch's wait.
pub(super) fn launch(
    g: &Gpu,
    f: &Kernels,
    c: &Ctx<'_>,
    ws: &mut Workspace,
    mut part: Staged,
    tables: (u64, u64),
    t: &mut Bm25Timings,
) -> Result<Staged, GpuError> {
    if part.gq == 0 {
        return Ok(part);
    }
    let pl = part.planned.expect("a device-planned batch");
    let lay = &part.layout;
    let t_plan = std::time::Instant::now();
    let d_plan = ws.dev("bm25_plan", pl.plan_bytes)?;
    let d_out = ws.dev("bm25_out", part.out_bytes)?;
    let d_piece = ws.dev("bm25_piece", lay.piece_bytes)?;
    let cs = g.stream.cu_stream();
    let events = batch_events(g)?;
    let t_copy = std::time::Instant::now();
    // Where the device reads the batch: the pinned buffer `stage` wrote, across the bus (its
    // mapped address), or a copy of it on the device, queued here.
    let p_in = if mapped() {
        let pin = ws
            .pin_in
            .as_mut()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
        pin.device_ptr().ok()
    } else {
        None
    };
    part.copied_up = p_in.is_none();
    let (p_in, p_qoff, p_mode, p_counters) = match p_in {
        Some(p) => (
            p,
            d_plan + pl.qoff as u64,
            d_plan + pl.mode as u64,
            d_plan + pl.counters_dev as u64,
        ),
        None => {
            let d_in = ws.dev("bm25_in", part.in_bytes)?;
            g.record(&events[0])?;
            let pin = ws
                .pin_in
                .as_ref()
                .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
            // SAFETY: `d_in` holds at least `in_bytes`; the pinned source, written by `stage`,
            // is not touched again until the stream is synchronized.
            unsafe {
                result::memcpy_htod_async(d_in, &pin.as_slice()[..part.in_bytes], cs)
                    .map_err(drv("host-to-device copy"))?;
            }
            (
                d_in,
                d_in,
                d_in + pl.modes as u64,
                d_in + pl.counters as u64,
            )
        }
    };
    t.queue_copy_ms += t_copy.elapsed().as_secs_f64() * 1e3;
    let gq32 = part.gq as u32;
    let k32 = c.k as u32;
    let n_index_terms = c.index.terms() as u32;
    let batch_mode = u32::from(mode_code(c.batch.mode));
    let (p_refs, p_term_floor) = tables;
    let p_terms = p_in + pl.terms as u64;
    let p_flag = p_in + pl.modes as u64;
    let p_lists = d_plan + pl.lists as u64;
    let p_floor = d_plan + pl.floors as u64;
    let p_items = d_plan + pl.items as u64;
    let p_keys = d_plan + pl.keys as u64;
    let p_order = d_plan + pl.order as u64;
    let p_splitq = d_plan + pl.splitq as u64;
    let p_splitlo = d_plan + pl.splitlo as u64;
    let p_splithi = d_plan + pl.splithi as u64;
    let p_cnt = d_out + lay.cnt as u64;
    let p_done = d_piece + lay.done as u64;
    let static_max = c.scored.static_max.to_bits();
    let piece = c.piece;
    let most = (CAP / c.k.max(1)).min(MAX_PIECES) as u32;
    let max_pieces = pl.max_pieces as u32;
    let packed_host = packed_on_host(ws, &mut part)?;
    // The plan's counters for the host: written into its pinned buffer by `bm25_order` when
    // the answers go there too, else copied down after the kernels.
    let counters_host = match packed_host {
        Some(_) => Workspace::pinned(&mut ws.pin_aux, part.items_bytes)?
            .device_ptr()
            .ok(),
        None => None,
    };
    // The batch times itself when nothing crosses the bus by copies (read where the host
    // wrote it, answers and counters written into the host's memory): `bm25_clear` stamps
    // its start, `bm25_pack`'s last block its end, into the counters' pinned copy. Timing
    // events cost the launch ~3 µs each on the H200 hosts; the copies' times
    // need them, so a batch with copies keeps them.
    part.clocked = !part.copied_up && counters_host.is_some();
    let clock_host = match counters_host {
        Some(h) if part.clocked => {
            let pin = Workspace::pinned(&mut ws.pin_aux, part.items_bytes)?.as_mut_slice();
            pin[CLOCK_HOST..COUNTER_BYTES].fill(0);
            h + CLOCK_HOST as u64
        }
        _ => 0,
    };
    // The parameters of `bm25_clear`, `bm25_plan` and `bm25_order` in kernels/bm25.cu: gq + 1
    // offsets over n_terms term ids (each checked against the index's term count on the
    // device) and gq unknown-term flags at `p_in` (the mapped pinned buffer, or its copy in
    // `d_in`), copied into gq + 1 offsets at `p_qoff` and turned into gq modes at `p_mode`
    // (the same places in a copy); `refs` holds the index's terms' ListRefs, `term_floor`
    // their floors at k (or null); the planning buffer holds n_terms lists, gq floors,
    // cap_items = gq + 2 * max_pieces items and keys (a query adds at most 1 + pieces
    // items, pieces within the budget), gq splits; the COUNTERS counters (cleared in the
    // upload, or by `bm25_clear`) lie at `p_counters`, their host copy in as many pinned
    // words; `d_out` holds gq answer counts (cleared by the plan); the piece region holds
    // max_pieces completion counts at `lay.done` (a split query's, at its first piece slot,
    // cleared by the plan).
    let mut launches = Vec::with_capacity(8);
    if !part.copied_up {
        launches.push(Launch {
            f: f.clear.cu_function(),
            grid: 1,
            block: 32,
            args: vec![p_counters.into(), (COUNTERS as u32).into()],
        });
    }
    launches.extend([
        Launch {
            f: f.plan.cu_function(),
            grid: gq32.div_ceil(PLAN_THREADS),
            block: PLAN_THREADS,
            args: vec![
                gq32.into(),
                p_in.into(),
                p_terms.into(),
                p_flag.into(),
                p_qoff.into(),
                p_mode.into(),
                batch_mode.into(),
                n_index_terms.into(),
                p_refs.into(),
                p_term_floor.into(),
                static_max.into(),
                k32.into(),
                piece.into(),
                most.into(),
                max_pieces.into(),
                p_lists.into(),
                p_floor.into(),
                p_items.into(),
                p_keys.into(),
                p_splitq.into(),
                p_splitlo.into(),
                p_splithi.into(),
                p_counters.into(),
                p_cnt.into(),
                p_done.into(),
            ],
        },
        Launch {
            f: f.order.cu_function(),
            grid: 1,
            block: ORDER_THREADS,
            args: vec![
                p_counters.into(),
                p_keys.into(),
                p_order.into(),
                counters_host.unwrap_or(0).into(),
            ],
        },
    ]);
    let (item_bound, split_bound) = bounds(part.on_device, pl.max_pieces);
    let rank = RankArgs {
        n_queries: gq32,
        n_items: item_bound,
        n_items_dev: p_counters + 4 * C_ITEMS as u64,
        n_short_dev: p_counters + 4 * C_SHORT as u64,
        order: p_order,
        items: p_items,
        q_off: p_qoff,
        mode: p_mode,
        lists: p_lists,
        floor: p_floor,
        n_split: split_bound,
        n_split_dev: p_counters + 4 * C_SPLITS as u64,
        merge_blocks: 0, // no `bm25_merge` (`piece_done`)
        split_q: p_splitq,
        split_lo: p_splitlo,
        split_hi: p_splithi,
        out: d_out,
        piece: d_piece,
        packed_host,
        piece_done: p_done,
        counters: p_counters,
        clock_host,
        claim: p_counters + 4 * C_CLAIM as u64,
        multiprocessors: g.info.multiprocessors,
    };
    // The ranking launches read the items, order, lists and floors that `bm25_plan` /
    // `bm25_order` write before them on the same stream: at most `item_bound` items
    // (`bounds`; the kernels read the plan's own count and take the smaller) and
    // `split_bound` split queries, queries of 1 to 64 terms (by `stage`), piece slots below
    // max_pieces, each split query's at most CAP / k; the piece region is sized for
    // max_pieces (answers and completion counts), the output for gq queries. No
    // `bm25_merge`: the block completing a split query merges it (`piece_done`).
    launches.extend(rank_launches(f, c, &part.layout, &rank));
    let t_submit = std::time::Instant::now();
    let timing = (!part.clocked).then_some(events);
    // SAFETY: the launches' parameters are as the two notes above say.
    unsafe { submit(g, ws, &launches, timing, t)? };
    t.submit_ms += t_submit.elapsed().as_secs_f64() * 1e3;
    answers_down(g, ws, &mut part, d_out, packed_host, t)?;
    if counters_host.is_none() {
        let pin = &mut Workspace::pinned(&mut ws.pin_aux, part.items_bytes)?.as_mut_slice()
            [..COUNTER_BYTES];
        // SAFETY: the counters on the device into as many pinned bytes, read by `settle` after
        // the stream is synchronized.
        unsafe { result::memcpy_dtoh_async(&mut pin[..], p_counters, cs) }
            .map_err(drv("device-to-host copy"))?;
    }
    if !part.clocked {
        g.record(&events[3])?;
        part.events = Some(events);
    }
    t.plan_ms += t_plan.elapsed().as_secs_f64() * 1e3;
    t.h2d_bytes += part.in_bytes as u64;
    t.d2h_bytes += COUNTER_BYTES as u64;
    Ok(part)
}

/// Upper bounds of a device-planned batch's items and split queries, from the queries it
/// ranks and its piece budget: a query is one item, or its pieces (and one more under
/// AND-then-OR), so each split query adds at most its pieces to the items; the pieces of all
/// split queries stay within the budget, and each has at least two.
fn bounds(ranked: usize, max_pieces: usize) -> (u32, u32) {
    let items = (ranked + max_pieces) as u32;
    let splits = ranked.min(max_pieces / 2) as u32;
    (items, splits)
}

/// After the batch's wait, for a device-planned batch (others: nothing): the plan's counters
/// (a term id beyond the index is an error; the counts must lie within the bounds the
/// launches assumed), and the batch's items, splits and pieces for the timings.
pub(super) fn settle(
    ws: &Workspace,
    part: &mut Staged,
    t: &mut Bm25Timings,
) -> Result<(), GpuError> {
    let Some(pl) = part.planned else {
        return Ok(());
    };
    if part.gq == 0 {
        return Ok(());
    }
    let pin = ws
        .pin_aux
        .as_ref()
        .ok_or(GpuError::OutOfMemory("pinned allocation"))?;
    let c = view::<u32>(&pin.as_slice()[..COUNTER_BYTES]);
    if c[C_BAD] != 0 {
        return Err(malformed());
    }
    let (item_bound, split_bound) = bounds(part.on_device, pl.max_pieces);
    if c[C_ITEMS] > item_bound || c[C_SPLITS] > split_bound || c[C_SHORT] > c[C_ITEMS] {
        return Err(GpuError::Kernel(format!(
            "bm25_plan wrote {} items ({} short) and {} splits for {} ranked queries (bounds \
             {item_bound} and {split_bound})",
            c[C_ITEMS], c[C_SHORT], c[C_SPLITS], part.on_device
        )));
    }
    t.warp_queries += c[C_SHORT] as usize;
    if part.clocked {
        let clock = view::<u64>(&pin.as_slice()[CLOCK_HOST..COUNTER_BYTES]);
        // (0 if the device wrote no clock: timing only, never the answers.)
        t.kernel_ms = clock[1].saturating_sub(clock[0]) as f64 / 1e6;
    }
    part.n_items = c[C_ITEMS] as usize;
    part.n_split = c[C_SPLITS] as usize;
    part.n_pieces = (c[C_PIECES] as usize).min(pl.max_pieces);
    t.pieces += part.n_pieces;
    Ok(())
}

/// `counters[]` of `bm25_plan` (C_ITEMS .. C_BAD in bm25.cu), `bm25_order` (C_SHORT) and
/// `bm25_topk` (C_CLAIM); words 5 and 8 ..= 9 are the device's own (C_PACKED, C_CLOCK).
const C_ITEMS: usize = 0;
const C_PIECES: usize = 1;
const C_SPLITS: usize = 2;
const C_BAD: usize = 3;
const C_SHORT: usize = 4;
/// `bm25_topk`'s count of claimed work units (cleared with the others).
const C_CLAIM: usize = 6;
/// Words of counters (C_ITEMS ..= C_CLOCK + 1, rounded up), on the device and in the host's
/// pinned copy; the copy's last 16 bytes are the batch's clock (`bm25_pack`: start and end
/// on the device's global timer, ns).
const COUNTERS: usize = 16;
const COUNTER_BYTES: usize = COUNTERS * 4;
const CLOCK_HOST: usize = COUNTER_BYTES - 16;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::search::gpu::Bm25Batch;
    use crate::search::queries::{Queries, QueryTerms};

    proptest::proptest! {
        /// The branch-free counts say what `Bm25Batch::terms` says, query by query, and the
        /// offsets are written as they are.
        #[test]
        fn query_counts_follow_the_batch_rules(
            qs in proptest::collection::vec((0usize..70, proptest::bool::ANY), 0..200),
            mode in 0usize..3,
        ) {
            let queries: Queries = qs
                .iter()
                .map(|&(n, unknown)| QueryTerms { ids: (0..n as u32).collect(), unknown })
                .collect();
            let mode = [Mode::And, Mode::Or, Mode::AndOr][mode];
            let batch = Bm25Batch { queries: &queries, mode };
            let mut off = vec![u32::MAX; batch.len() + 1];
            let (ranked, long) =
                offsets_and_counts(queries.offsets(), queries.unknown_flags(), mode, &mut off);
            let want_off: Vec<u32> = queries.offsets().iter().map(|&o| o as u32).collect();
            proptest::prop_assert_eq!(&off, &want_off);
            let (mut want_ranked, mut want_long) = (0, 0);
            for i in 0..batch.len() {
                let n = batch.terms(i).len();
                want_ranked += usize::from(n > 0 && n <= BM25_MAX_TERMS);
                want_long += usize::from(n > BM25_MAX_TERMS);
            }
            proptest::prop_assert_eq!((ranked, long), (want_ranked, want_long));
        }
    }
}
