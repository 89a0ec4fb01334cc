//! A staged batch queued on the stream: its copies up, the ranking launches (`bm25_topk`,
//! `bm25_merge` for the split queries, `bm25_pack`) in one submission through the
//! workspace's kernel graph once a batch with the same kernels came before, and its answers
//! written into the host's pinned buffer by the device or copied down.

use cudarc::driver::{CudaEvent, result};

use super::{Ctx, Kernels, Layout, Resident, Staged, THREADS, batch_events};
use crate::backend::gpu::{Gpu, GpuError, Launch, LentPinned, Workspace, drv, view};
use crate::search::gpu::Bm25Timings;
use crate::search::topk::Mode;
use crate::tuning::knobs;

/// Queue the staged batch on the stream: its copies up, the ranking launch (and the merge of
/// its split queries), its copy down, with an event before, between and after.
pub(super) fn launch(
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
        (&ws.pin_aux, d_items, part.items_bytes),
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
        claim: 0,
        multiprocessors: 0,
    };
    // SAFETY: the part's input region holds n_items order entries and items (queries < gq,
    // piece slots < n_pieces, a piece's lead list among its query's lists and its part below
    // its count of parts), gq + 1 offsets, gq modes and the lists' references whose postings
    // lie in the resident buffers (start + len within them, by construction), gq floors;
    // split_q / split_p hold n_split queries and n_split + 1 piece offsets (each query's
    // pieces at most CAP / k, by `plan`); `d_out` and `d_piece` are laid out by `lay` for gq
    // queries and n_pieces pieces.
    let launches = rank_launches(f, c, lay, &rank);
    // SAFETY: as the note above says.
    unsafe { submit(g, ws, &launches, Some(events), t)? };
    answers_down(g, ws, &mut part, d_out, packed_host, t)?;
    record(&events[3])?;
    t.h2d_bytes += (part.in_bytes + part.items_bytes) as u64;
    part.events = Some(events);
    Ok(part)
}

/// Where `bm25_pack` writes a batch's packed answers: into host memory that `unpack` reads
/// (its device address), unless the knob `bm25_zero_copy` is off (then on the device, and
/// [`copy_down`] copies the whole packed region: k places a query, most of them unused).
/// A batch whose answers are the packed layout as it lies ([`lends`]) gets a block that its
/// result keeps (`Workspace::pin_lent`, from the pool of lent blocks); others the workspace's
/// pinned buffer.
pub(super) fn packed_on_host(
    ws: &mut Workspace,
    part: &mut Staged,
) -> Result<Option<u64>, GpuError> {
    if !knobs().bm25_zero_copy {
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
/// (with the knob `bm25_lend` off: copied out of the workspace's buffer instead).
fn lends(part: &Staged) -> bool {
    knobs().bm25_lend && part.in_batch_order()
}

/// The host's copy of a batch's packed answers (`part.down_bytes` bytes laid out from
/// `Layout::pk_off`): the lent block or the workspace's pinned buffer.
pub(super) fn packed_region<'a>(ws: &'a Workspace, part: &Staged) -> Result<&'a [u8], GpuError> {
    let pin = if part.lent {
        ws.pin_lent.as_ref().map(|b| b.as_slice())
    } else {
        ws.pin_out.as_ref().map(|b| b.as_slice())
    };
    Ok(&pin.ok_or(GpuError::OutOfMemory("pinned allocation"))?[..part.down_bytes])
}

/// After the packing launches: the answers are in the host's buffer already (`packed_host`),
/// or their copy down is queued.
pub(super) fn answers_down(
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
pub(super) fn packed_bytes(ws: &Workspace, part: &Staged) -> u64 {
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
pub(super) struct RankArgs {
    /// Queries on the device (their answers: `out`).
    pub(super) n_queries: u32,
    /// Items, or an upper bound of them when `n_items_dev` (not 0) holds their count on the
    /// device (a device-planned batch, launched without waiting for its plan).
    pub(super) n_items: u32,
    pub(super) n_items_dev: u64,
    /// Where the device holds how many of the items (the last ones in `order`) are short
    /// (`and_short` in bm25.cu: a warp each), or 0: none (a host-staged batch).
    pub(super) n_short_dev: u64,
    pub(super) order: u64,
    pub(super) items: u64,
    pub(super) q_off: u64,
    pub(super) mode: u64,
    pub(super) lists: u64,
    pub(super) floor: u64,
    /// Split queries (or an upper bound, as for the items: `n_split_dev`), and the blocks
    /// `bm25_merge` strides over them with.
    pub(super) n_split: u32,
    pub(super) n_split_dev: u64,
    pub(super) merge_blocks: u32,
    pub(super) split_q: u64,
    pub(super) split_lo: u64,
    pub(super) split_hi: u64,
    pub(super) out: u64,
    pub(super) piece: u64,
    /// Where the packed answers go (the packed part of [`Layout`]): the host's pinned buffer
    /// (`Some`: its address, written across the bus by `bm25_pack`, nothing to copy down) or
    /// the device's `out` (`None`: copied down by [`copy_down`]).
    pub(super) packed_host: Option<u64>,
    /// A device-planned batch's count of each split query's completed blocks (cleared by
    /// `bm25_plan`): the block completing a split query merges it, and `bm25_merge` is not
    /// launched. 0: a host-staged batch, merged by `bm25_merge`.
    pub(super) piece_done: u64,
    /// The batch's clock (a device-planned batch timed on the device): its counters, where
    /// `bm25_clear` wrote the start, and the host's pinned words `bm25_pack` writes the start
    /// and the end into. 0 and 0: timed by events instead.
    pub(super) counters: u64,
    pub(super) clock_host: u64,
    /// A device-planned batch's counter of claimed work units (cleared, in its counters):
    /// `bm25_topk` is launched on as many blocks as the device's `multiprocessors` hold at
    /// once, each claiming units until none is left. 0: a block per item (`n_items` blocks).
    pub(super) claim: u64,
    pub(super) multiprocessors: u32,
}

/// Whether AND batches use `bm25_topk_and` (the knob `bm25_and_kernel`, default on).
fn and_kernel() -> bool {
    knobs().bm25_and_kernel
}

/// The launches of `bm25_topk` over a batch's items (longest first), then `bm25_merge` over
/// its split queries, then `bm25_pack` (the answers packed for the host: into its pinned
/// buffer, or on the device for the copy down), in order, for
/// [`submit`]. Queueing them is sound when every address of `a` holds what `bm25_topk` and
/// `bm25_merge` (kernels/bm25.cu) read and write for `a.n_items` items and `a.n_split` split
/// queries: items naming queries with 1 to 64 lists whose postings lie in the resident
/// buffers, piece slots within the piece region, at most CAP / k pieces per split query;
/// `out` and `piece` laid out by `lay` for the batch.
pub(super) fn rank_launches(f: &Kernels, c: &Ctx<'_>, lay: &Layout, a: &RankArgs) -> Vec<Launch> {
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
    // a thread); the knob `bm25_and_kernel` off keeps them on the general one (measurements).
    let topk = if c.batch.mode == Mode::And && and_kernel() {
        &f.topk_and
    } else {
        &f.topk
    };
    // Resident blocks: the driver's occupancy of the kernel (4 a multiprocessor if it cannot
    // say; more blocks only wait their turn and then find nothing to claim).
    let grid = match a.claim {
        0 => a.n_items,
        _ => {
            let per_sm = topk
                .occupancy_max_active_blocks_per_multiprocessor(THREADS, 0, None)
                .unwrap_or(4)
                .max(1);
            (per_sm * a.multiprocessors.max(1)).clamp(1, a.n_items.max(1))
        }
    };
    launches.push(Launch {
        f: topk.cu_function(),
        grid,
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
            a.claim.into(),
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
/// kernels came before, else one by one. The knob `gpu_graph` off keeps them one by one.
/// Without `events` the batch times itself (`bm25_pack`'s clock): nothing recorded.
///
/// # Safety
/// Each launch's arguments match its kernel's parameter list, and every device pointer among
/// them is valid for the accesses the kernel makes (the callers' notes).
pub(super) unsafe fn submit(
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
