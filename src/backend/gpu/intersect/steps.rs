//! A launch group's kernels, step by step (step `s` intersects the running result with list
//! `s`): on the tile path, plan, scans and compaction, then partition and merge, then the
//! scan and `gather` that put the matches in place; on the `wmerge` path (every list known
//! increasing), plan_scan, `wmerge` and `wplace`, queued in one submission through the
//! workspace's kernel graph unless merge marks must sit between them.

use cudarc::driver::result;

use super::super::GpuError;
use super::super::graph::{Launch, Word};
use super::super::memory::Workspace;
use super::super::runtime::{Gpu, arg, drv};
use super::chunk::{Buffers, Chunk, Marks};
use super::kernels::{GATHER_THREADS, Kernels, ROW_THREADS, WBLOCK};
use super::{Mode, Timings};
use crate::tuning::{KnownOrder, known_order};

/// Queue the group's kernels between `marks.e[1]` (recorded first, or by the graph's
/// submission once its parameters are set) and `marks.e[2]`; whether they went out through a
/// graph that recorded the workspace's span events around them.
pub(super) fn queue(
    g: &Gpu,
    kern: &Kernels,
    ws: &mut Workspace,
    c: &Chunk<'_>,
    d: &Buffers,
    marks: &Marks,
    t: &mut Timings,
) -> Result<bool, GpuError> {
    // `wmerge`'s launches are queued after the loop below in one submission (the workspace's
    // kernel graph), unless merge marks must sit between them (then each goes out at once).
    // The kernels' window opens then, once the graph's parameters are set (`submit`).
    let one_submission = c.warp && marks.merge.is_empty();
    if !one_submission {
        g.record(&marks.e[1])?;
    }
    let cs = g.stream.cu_stream();
    // (`wmerge`'s plan_scan clears the flags and the error word itself: its call queues
    // nothing but its three launches per step.)
    if !c.warp {
        // SAFETY: both targets lie inside buffers allocated with these sizes (`Chunk::buffers`).
        unsafe {
            result::memset_d8_async(d.d_out + c.flags_at as u64, 0, c.n, cs)
                .map_err(drv("memset"))?;
            result::memset_d8_async(d.misc, 0, 64, cs).map_err(drv("memset"))?;
        }
    }
    let a = Args::new(g, kern, c, d)?;
    let mut q = Queue {
        one: one_submission,
        queued: Vec::new(),
    };
    for step in 1..c.k as u32 {
        let s = Step::of(c, d, &a, step);
        // `wmerge`'s steps plan and scan in one launch (plan_scan: no compaction, the flags
        // cleared at step 1); each of its two look-backs gets an epoch of its own.
        let (row_epoch, piece_epoch) = if c.warp {
            (ws.epoch(cs)?, ws.epoch(cs)?)
        } else {
            (0, 0)
        };
        if c.warp {
            warp_step(
                g,
                kern,
                c,
                d,
                &a,
                &s,
                (row_epoch, piece_epoch),
                marks,
                &mut q,
            )?;
        } else {
            tile_step(g, kern, ws, c, d, &a, &s, marks)?;
        }
    }
    let mut spanned = false;
    if one_submission {
        if ws.span.is_none() {
            ws.span = Some((g.event()?, g.event()?));
        }
        let Workspace { graph, span, .. } = &mut *ws;
        let span = span.as_ref().expect("made above");
        let span_raw = (span.0.cu_event(), span.1.cu_event());
        // SAFETY: as each launch's note in the step functions; the span's events live in the
        // workspace after its graphs.
        if unsafe {
            graph.submit(
                &q.queued,
                cs,
                g.graphs,
                Some(span_raw),
                |_| g.record(&marks.e[1]),
                |l| g.launch_words(l),
            )?
        } {
            t.graph_launches += 1;
            spanned = true;
        }
    }
    g.record(&marks.e[2])?;
    Ok(spanned)
}

/// Launches queued for one submission, or each sent at once.
struct Queue {
    one: bool,
    queued: Vec<Launch>,
}

impl Queue {
    /// # Safety
    /// As [`Gpu::launch_words`]: `l` is made for its kernel's signature in
    /// kernels/intersect.cu, from buffers sized for its accesses.
    unsafe fn push(&mut self, g: &Gpu, l: Launch) -> Result<(), GpuError> {
        if self.one {
            self.queued.push(l);
            Ok(())
        } else {
            // SAFETY: the caller's contract.
            unsafe { g.launch_words(&l) }
        }
    }
}

/// The kernels' arguments that are the same at every step: the input region's tables, the
/// kernels' words in `misc`, the known-order ratio, sizes and grids.
struct Args {
    ptrs: u64,
    bases: u64,
    ords: u64,
    /// Bit 31 tells plan that the step runs `wmerge` (a path of A alone for every row).
    ratio: u32,
    valid_ptr: u64,
    valid_bit: u64,
    in_vals: u64,
    flags: u64,
    err: u64,
    scratch_top: u64,
    wsize: u64,
    scratch_cap: u64,
    k32: u32,
    n32: u32,
    n64: u64,
    tile32: u32,
    row_blocks: u32,
    part_blocks: u32,
    merge_blocks: u32,
    gather_blocks: u32,
}

impl Args {
    fn new(g: &Gpu, kern: &Kernels, c: &Chunk<'_>, d: &Buffers) -> Result<Self, GpuError> {
        let (d_in, tiles_max) = (d.d_in, c.tiles_max);
        let (valid_ptr, valid_bit) = match c.valid {
            Some((_, bit)) => (d_in + c.valid_at as u64, bit),
            None => (0u64, 0u64),
        };
        Ok(Args {
            ptrs: d_in + c.ptrs_at as u64,
            bases: d_in + c.bases_at as u64,
            ords: d_in + c.ords_at as u64,
            ratio: match (c.warp, known_order()) {
                (true, _) => 1 << 31,
                (false, KnownOrder::Search(r)) => r,
                (false, KnownOrder::Warp) => 4,
                _ => 0,
            },
            valid_ptr,
            valid_bit,
            in_vals: d_in,
            flags: d.d_out + c.flags_at as u64,
            err: d.misc + 4,
            scratch_top: d.misc + 16,
            wsize: d.misc + 28,
            scratch_cap: c.cap as u64,
            k32: c.k as u32,
            n32: c.n as u32,
            n64: c.n as u64,
            tile32: kern.tile() as u32,
            row_blocks: c.n.div_ceil(ROW_THREADS as usize) as u32,
            part_blocks: (tiles_max.div_ceil(ROW_THREADS as u64))
                .min(g.info.multiprocessors as u64 * 16) as u32,
            merge_blocks: u32::try_from(tiles_max).map_err(|_| {
                GpuError::Unsupported(format!("{tiles_max} tiles in one launch group"))
            })?,
            gather_blocks: (tiles_max * 32).div_ceil(u64::from(GATHER_THREADS)) as u32,
        })
    }
}

/// One step's addresses: where its A and its row offsets come from, where its offsets and
/// values go.
struct Step {
    step: u32,
    prev_off: u64,
    this_off: u64,
    a_vals: u64,
    /// 0: the last step of a count (no values).
    dst_vals: u64,
    /// Counting needs no values: the merge then writes no scratch.
    scratch_ptr: u64,
    /// The flags, cleared by step 1's plan_scan.
    step_flags: u64,
}

impl Step {
    fn of(c: &Chunk<'_>, d: &Buffers, a: &Args, step: u32) -> Self {
        let last = step as usize == c.k - 1;
        let dst_vals = match (last, c.mode) {
            (true, Mode::Values) => d.d_out + c.vals_out_at as u64,
            (true, Mode::Counts) => 0u64,
            (false, _) => d.res[step as usize % 2],
        };
        Step {
            step,
            prev_off: d.roff[(step as usize + 1) % 2],
            this_off: if last {
                d.d_out + c.offs_out_at as u64
            } else {
                d.roff[step as usize % 2]
            },
            a_vals: if step == 1 {
                a.in_vals
            } else {
                d.res[(step as usize + 1) % 2]
            },
            dst_vals,
            scratch_ptr: if dst_vals == 0 { 0u64 } else { d.scratch },
            step_flags: if step == 1 { a.flags } else { 0u64 },
        }
    }

    /// The rows' plan's arguments (plan and plan_scan begin alike).
    fn plan_args(&self, d: &Buffers, a: &Args) -> Vec<Word> {
        vec![
            a.n32.into(),
            a.k32.into(),
            self.step.into(),
            a.ptrs.into(),
            a.bases.into(),
            a.valid_ptr.into(),
            a.valid_bit.into(),
            self.prev_off.into(),
            a.ords.into(),
            a.ratio.into(),
            d.sel.into(),
            d.a_pos.into(),
            d.a_len.into(),
            d.b_pos.into(),
            d.b_len.into(),
            d.plen.into(),
            d.nz.into(),
            d.row_cnt.into(),
        ]
    }
}

/// A `wmerge` step: plan_scan, `wmerge`, `wplace`, queued in `q`; `epochs` are its two
/// look-backs' (rows, pieces).
#[allow(clippy::too_many_arguments)]
fn warp_step(
    g: &Gpu,
    kern: &Kernels,
    c: &Chunk<'_>,
    d: &Buffers,
    a: &Args,
    s: &Step,
    (row_epoch, piece_epoch): (u32, u32),
    marks: &Marks,
    q: &mut Queue,
) -> Result<(), GpuError> {
    let wp = kern.wpieces;
    let pieces_max = c.pieces_max;
    let plan = if c.osz == 4 {
        &kern.plan_scan_o32
    } else {
        &kern.plan_scan_o64
    };
    let mut args = s.plan_args(d, a);
    args.extend::<[Word; 9]>([
        d.act_start.into(),
        d.row_states.into(),
        row_epoch.into(),
        s.step_flags.into(),
        a.err.into(),
        wp.lo.into(),
        wp.hi.into(),
        c.wwant.into(),
        a.wsize.into(),
    ]);
    // SAFETY: plan_scan's parameters in kernels/intersect.cu; every pointer is a buffer of
    // `Chunk::buffers` sized for its accesses (n rows, n + 1 offsets, the row states of its
    // blocks), and the values each list's offsets address lie within its section of the
    // input region (or its resident copy).
    unsafe {
        q.push(
            g,
            Launch {
                f: plan.cu_function(),
                grid: a.row_blocks,
                block: ROW_THREADS,
                args,
            },
        )?
    };
    marks.mark(g, s.step, false)?;
    // A warp for each piece the step can have. `wplace` strides over the pieces with at most
    // `wplace_per_sm` blocks per multiprocessor.
    let wblocks = (pieces_max * 32).div_ceil(u64::from(WBLOCK));
    let wblocks = u32::try_from(wblocks)
        .map_err(|_| GpuError::Unsupported(format!("{pieces_max} pieces in one launch group")))?;
    let wplace_blocks = match kern.wplace_per_sm {
        0 => wblocks,
        per_sm => wblocks.min(g.info.multiprocessors.saturating_mul(per_sm).max(1)),
    };
    // SAFETY: `tile_cnt` (the pieces' counts), `tile_pos` (the rows each owns) and
    // `piece_states` hold `pieces_max` entries (the kernels check that the step's pieces
    // fit); a piece writes its matches into the scratch at its own A positions (fewer than
    // `cap`, checked by the kernel), `wplace` copies them to `dst_vals` (at most `cap` in
    // all), and the row offsets go to `this_off` (n + 1 entries, as `act_start`).
    unsafe {
        q.push(
            g,
            Launch {
                f: kern.wmerge[c.variant].cu_function(),
                grid: wblocks,
                block: WBLOCK,
                args: vec![
                    a.n32.into(),
                    a.wsize.into(),
                    pieces_max.into(),
                    d.act_start.into(),
                    s.a_vals.into(),
                    a.in_vals.into(),
                    d.a_pos.into(),
                    d.a_len.into(),
                    d.b_pos.into(),
                    d.b_len.into(),
                    d.tile_cnt.into(),
                    d.tile_pos.into(),
                    a.scratch_cap.into(),
                    a.flags.into(),
                    s.scratch_ptr.into(),
                    s.this_off.into(),
                    a.err.into(),
                ],
            },
        )?;
        q.push(
            g,
            Launch {
                f: kern.wplace[usize::from(c.esz == 8)].cu_function(),
                grid: wplace_blocks,
                block: WBLOCK,
                args: vec![
                    a.n32.into(),
                    a.wsize.into(),
                    pieces_max.into(),
                    d.act_start.into(),
                    d.tile_cnt.into(),
                    d.tile_pos.into(),
                    d.piece_states.into(),
                    piece_epoch.into(),
                    s.scratch_ptr.into(),
                    s.dst_vals.into(),
                    s.this_off.into(),
                ],
            },
        )?;
    }
    // `wplace` placed the step's values and finished its offsets.
    marks.mark(g, s.step, true)
}

/// A tile step: plan, the scans and compaction of the rows with work, partition and merge,
/// then (values wanted) the scan of the tiles' counts and `gather`, and the scan of the
/// rows' counts into the step's offsets; each launched at once.
#[allow(clippy::too_many_arguments)]
fn tile_step(
    g: &Gpu,
    kern: &Kernels,
    ws: &mut Workspace,
    c: &Chunk<'_>,
    d: &Buffers,
    a: &Args,
    s: &Step,
    marks: &Marks,
) -> Result<(), GpuError> {
    let cs = g.stream.cu_stream();
    let plan = if c.osz == 4 {
        &kern.plan_o32
    } else {
        &kern.plan_o64
    };
    let n64 = a.n64;
    // SAFETY: parameters match the kernels' signatures in kernels/intersect.cu; every pointer
    // is a buffer of `Chunk::buffers` sized for the accesses the kernel makes (n rows, n + 1
    // offsets, tiles_max tiles (+ 1 for the scan of their counts), cap result values in the
    // scratch and the destination), and the values each list's offsets address lie within
    // its section of the input region (or its resident copy).
    unsafe {
        g.launch_words(&Launch {
            f: plan.cu_function(),
            grid: a.row_blocks,
            block: ROW_THREADS,
            args: s.plan_args(d, a),
        })?;
        kern.scan(g, ws, d.nz, n64, d.act_at)?;
        g.launch(
            &kern.compact_rows,
            a.row_blocks,
            ROW_THREADS,
            &mut [
                arg(&a.n32),
                arg(&d.plen),
                arg(&d.act_at),
                arg(&d.act_row),
                arg(&d.act_len),
            ],
        )?;
        kern.scan(g, ws, d.act_len, n64, d.act_start)?;
        result::memset_d8_async(a.scratch_top, 0, 8, cs).map_err(drv("memset"))?;
    }
    marks.mark(g, s.step, false)?;
    // SAFETY: as above.
    unsafe {
        g.launch(
            &kern.partition[c.variant],
            a.part_blocks,
            ROW_THREADS,
            &mut [
                arg(&a.n32),
                arg(&a.tile32),
                arg(&d.act_start),
                arg(&d.act_row),
                arg(&s.a_vals),
                arg(&a.in_vals),
                arg(&d.a_pos),
                arg(&d.a_len),
                arg(&d.b_pos),
                arg(&d.b_len),
                arg(&d.descs),
            ],
        )?;
        g.launch(
            c.merge(kern),
            a.merge_blocks,
            kern.merge_threads,
            &mut [
                arg(&a.n32),
                arg(&d.act_start),
                arg(&d.act_row),
                arg(&s.a_vals),
                arg(&a.in_vals),
                arg(&d.a_pos),
                arg(&d.a_len),
                arg(&d.b_pos),
                arg(&d.b_len),
                arg(&d.descs),
                arg(&d.row_cnt),
                arg(&d.tile_cnt),
                arg(&d.tile_pos),
                arg(&a.scratch_top),
                arg(&a.scratch_cap),
                arg(&a.flags),
                arg(&s.scratch_ptr),
                arg(&a.err),
            ],
        )?;
    }
    marks.mark(g, s.step, true)?;
    let tiles_max = c.tiles_max;
    // SAFETY: as above.
    unsafe {
        if s.dst_vals != 0 {
            kern.scan(g, ws, d.tile_cnt, tiles_max, d.tile_excl)?;
            g.launch(
                &kern.gather[usize::from(c.esz == 8)],
                a.gather_blocks,
                GATHER_THREADS,
                &mut [
                    arg(&tiles_max),
                    arg(&d.tile_cnt),
                    arg(&d.tile_pos),
                    arg(&d.tile_excl),
                    arg(&d.scratch),
                    arg(&s.dst_vals),
                ],
            )?;
        }
        kern.scan(g, ws, d.row_cnt, n64, s.this_off)?;
    }
    Ok(())
}
