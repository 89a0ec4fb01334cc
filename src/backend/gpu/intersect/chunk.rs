//! One launch group: its plan (the layout of its input and output regions and the sizes its
//! kernels need, [`Chunk::plan`]), its device buffers ([`Chunk::buffers`]) and its timing
//! events ([`Marks`]), then the three phases [`run_chunk`] runs in order: `stage` (inputs
//! into pinned memory and up), `steps` (each step's kernels) and `collect` (the results down
//! and into the caller's output).

use cudarc::driver::{CudaEvent, CudaFunction};

use super::super::GpuError;
use super::super::memory::Workspace;
use super::super::runtime::{Gpu, align};
use super::kernels::{DESC_BYTES, Kernels, ROW_THREADS};
use super::resident::{ResidentAt, stages_offsets};
use super::{GpuOutput, HostList, HostOffsets, Mode, RowValidity, collect, stage, steps};
use crate::backend::cpu::SetElem;
use crate::tuning::{KnownOrder, known_order, merge_marks};

/// One launch group: rows `r0..r1`, appended to `out`.
#[allow(clippy::too_many_arguments)]
pub(super) fn run_chunk<T: SetElem>(
    g: &Gpu,
    kern: &Kernels,
    ws: &mut Workspace,
    variant: usize,
    lists: &[HostList<'_, T>],
    resident: &[ResidentAt],
    validity: Option<RowValidity<'_>>,
    r0: usize,
    r1: usize,
    mode: Mode,
    lend: bool,
    out: &mut GpuOutput<T>,
) -> Result<(), GpuError> {
    let c = Chunk::plan(g, kern, variant, lists, resident, validity, r0, r1, mode)?;
    let d = c.buffers(g, ws)?;
    let marks = Marks::new(g, c.k)?;
    let stage_ms = stage::stage(g, ws, &c, lists, resident, &d, &marks)?;
    let spanned = steps::queue(g, kern, ws, &c, &d, &marks, &mut out.timings)?;
    collect::collect(g, ws, &c, &d, &marks, lend, spanned, stage_ms, out)
}

/// What a launch group moves and where: the layout of its input region (identical in pinned
/// staging and on the device: value sections, offsets sections, validity, then the pointer,
/// base and order tables), of its output region (flags | offsets | values) and the bounds
/// its kernels' buffers are sized by.
pub(super) struct Chunk<'v> {
    /// Lists, rows, element and offset bytes.
    pub(super) k: usize,
    pub(super) n: usize,
    pub(super) r0: usize,
    pub(super) r1: usize,
    pub(super) esz: usize,
    pub(super) osz: usize,
    /// The kernels' variant for the element type ([`super::kernels::elem_index`]).
    pub(super) variant: usize,
    pub(super) mode: Mode,
    /// Each list's value section (none for a resident list) and offsets section (none when
    /// its offsets are on the device too).
    pub(super) val_at: Vec<usize>,
    pub(super) off_at: Vec<usize>,
    /// The group's validity bytes and the bit of its first row.
    pub(super) valid: Option<(&'v [u8], u64)>,
    pub(super) valid_at: usize,
    pub(super) ptrs_at: usize,
    pub(super) bases_at: usize,
    pub(super) ords_at: usize,
    pub(super) in_bytes: usize,
    /// The shortest list's values (a bound on every step's result), all the input values.
    pub(super) cap: usize,
    pub(super) total_values: usize,
    /// Every list known increasing and the warp kernel asked for: the steps run `wmerge`.
    pub(super) warp: bool,
    /// A list's row order is known: the merge with the known-order code.
    pub(super) known: bool,
    /// `wmerge`'s pieces at most and wanted per step.
    pub(super) pieces_max: u64,
    pub(super) wwant: u64,
    /// Tiles (or pieces) at most of any step.
    pub(super) tiles_max: u64,
    /// Output region: flags (n bytes) | offsets ((n + 1) u64) | values (cap elements).
    pub(super) flags_at: usize,
    pub(super) offs_out_at: usize,
    pub(super) vals_out_at: usize,
    pub(super) out_cap: usize,
}

impl<'v> Chunk<'v> {
    /// The plan of rows `r0..r1` (host arithmetic only).
    #[allow(clippy::too_many_arguments)]
    fn plan<T: SetElem>(
        g: &Gpu,
        kern: &Kernels,
        variant: usize,
        lists: &[HostList<'_, T>],
        resident: &[ResidentAt],
        validity: Option<RowValidity<'v>>,
        r0: usize,
        r1: usize,
        mode: Mode,
    ) -> Result<Self, GpuError> {
        let k = lists.len();
        let n = r1 - r0;
        let esz = std::mem::size_of::<T>();
        let osz = match lists[0].offsets {
            HostOffsets::I32(_) => 4,
            HostOffsets::I64(_) => 8,
        };
        if lists
            .iter()
            .any(|l| matches!(l.offsets, HostOffsets::I32(_)) != (osz == 4))
        {
            return Err(GpuError::Unsupported(
                "List and LargeList arguments mixed".into(),
            ));
        }

        // Layout of the input region, identical in pinned staging and on the device.
        let counts: Vec<usize> = lists
            .iter()
            .map(|l| l.offsets.at(r1) - l.offsets.at(r0))
            .collect();
        // Lists resident on the device have no section: the kernels read their copies.
        let mut val_at = Vec::with_capacity(k);
        let mut pos = 0usize;
        for (&c, r) in counts.iter().zip(resident) {
            val_at.push(pos);
            if r.is_none() {
                pos += align(c * esz);
            }
        }
        let mut off_at = Vec::with_capacity(k);
        for r in resident {
            off_at.push(pos);
            if stages_offsets(r) {
                pos += align((n + 1) * osz);
            }
        }
        let valid = validity.map(|v| {
            let first_bit = v.bit_offset + r0;
            let (b0, b1) = (first_bit / 8, (first_bit + n).div_ceil(8));
            (&v.bits[b0..b1], (first_bit % 8) as u64)
        });
        let valid_at = pos;
        pos += align(valid.map_or(0, |(b, _)| b.len()));
        let ptrs_at = pos;
        pos += align(k * 8);
        let bases_at = pos;
        pos += align(k * 8);
        let ords_at = pos;
        pos += align(k * 8);
        let in_bytes = pos;

        let cap = counts.iter().copied().min().unwrap_or(0);
        let max_b = counts.iter().copied().max().unwrap_or(0);
        let total_values: usize = counts.iter().sum();
        // Every list known increasing and the warp kernel asked for: `wmerge`'s pieces (each
        // step's size chosen by the kernels, see `WPieces`; A never holds more than `cap`
        // values) replace tiles. (A step's counts fit the look-back states' 38 bits: at most
        // `cap`.)
        let warp = known_order() == KnownOrder::Warp
            && resident
                .iter()
                .all(|r| matches!(r, Some((_, _, ord)) if *ord != 0))
            && (cap as u64) < 1 << 38;
        let wwant = kern.wwant(g);
        let pieces_max = kern.wpieces.pieces_max(cap as u64, wwant);
        // The tiles' (or pieces') counts and slots: every entry up to `tiles_max` is written
        // by the step's merge kernel before the scan and `gather` read it (the buffers are
        // reused). Tiles: every step's merge path is at most the shortest list's values (A:
        // the row's shortest list, or the previous step's result) plus the longest list's (B).
        let tiles_max = if warp {
            pieces_max
        } else {
            ((cap + max_b) as u64).div_ceil(kern.tile()).max(1)
        };
        // The merge without the known-order code unless a list's row order is known.
        let known = resident
            .iter()
            .any(|r| matches!(r, Some((_, _, ord)) if *ord != 0));
        // Output region: flags (n bytes) | offsets ((n + 1) u64) | values (cap elements).
        let flags_at = 0usize;
        let offs_out_at = align(n);
        let vals_out_at = offs_out_at + align((n + 1) * 8);
        let out_cap = vals_out_at + if mode == Mode::Values { cap * esz } else { 0 };
        Ok(Chunk {
            k,
            n,
            r0,
            r1,
            esz,
            osz,
            variant,
            mode,
            val_at,
            off_at,
            valid,
            valid_at,
            ptrs_at,
            bases_at,
            ords_at,
            in_bytes,
            cap,
            total_values,
            warp,
            known,
            pieces_max,
            wwant,
            tiles_max,
            flags_at,
            offs_out_at,
            vals_out_at,
            out_cap,
        })
    }

    /// The merge kernel of a tile step.
    pub(super) fn merge<'k>(&self, kern: &'k Kernels) -> &'k CudaFunction {
        if self.known {
            &kern.merge_known[self.variant]
        } else {
            &kern.merge[self.variant]
        }
    }

    /// The group's device buffers from the workspace's pool, in a fixed order (so that an
    /// allocation that fails is always the same one).
    fn buffers(&self, g: &Gpu, ws: &mut Workspace) -> Result<Buffers, GpuError> {
        let (n, cap, esz) = (self.n, self.cap, self.esz);
        let tiles_max = self.tiles_max as usize;
        let d_in = ws.dev("in", self.in_bytes)?;
        let sel = ws.dev("sel", n * 4)?;
        let a_pos = ws.dev("a_pos", n * 8)?;
        let a_len = ws.dev("a_len", n * 8)?;
        let b_pos = ws.dev("b_pos", n * 8)?;
        let b_len = ws.dev("b_len", n * 8)?;
        let plen = ws.dev("plen", n * 8)?;
        let nz = ws.dev("nz", n * 8)?;
        let act_start = ws.dev("act_start", (n + 1) * 8)?;
        let row_cnt = ws.dev("row_cnt", n * 8)?;
        // The tile path's compaction of the rows with work (`wmerge`'s plan_scan places every
        // row itself), its tile descriptors and the scan of the tiles' counts; `wmerge` has
        // none of them (0: never passed to a kernel it launches), its steps' look-back states
        // (per block of plan_scan, per piece of wplace) instead.
        let (act_at, act_row, act_len, descs, tile_excl) = if self.warp {
            (0, 0, 0, 0, 0)
        } else {
            (
                ws.dev("act_at", (n + 1) * 8)?,
                ws.dev("act_row", n * 4)?,
                ws.dev("act_len", n * 8)?,
                ws.dev("descs", tiles_max * DESC_BYTES)?,
                ws.dev("tile_excl", (tiles_max + 1) * 8)?,
            )
        };
        let (row_states, piece_states) = if self.warp {
            let cs = g.stream.cu_stream();
            (
                ws.states("row_states", n.div_ceil(ROW_THREADS as usize) * 8, cs)?,
                ws.states("piece_states", self.pieces_max as usize * 8, cs)?,
            )
        } else {
            (0, 0)
        };
        let tile_cnt = ws.dev("tile_cnt", tiles_max * 8)?;
        let tile_pos = ws.dev("tile_pos", tiles_max * 8)?;
        // Matches of each tile before `gather` puts them in place (a step makes at most
        // `cap`).
        let scratch = ws.dev("scratch", cap * esz)?;
        // err u32 @4, scratch top u64 @16, wmerge's piece size u32 @28
        let misc = ws.dev("misc", 64)?;
        let roff = [ws.dev("roff0", (n + 1) * 8)?, ws.dev("roff1", (n + 1) * 8)?];
        let res = if self.k > 2 {
            [ws.dev("res0", cap * esz)?, ws.dev("res1", cap * esz)?]
        } else {
            [0, 0]
        };
        let d_out = ws.dev("out", self.out_cap)?;
        Ok(Buffers {
            d_in,
            sel,
            a_pos,
            a_len,
            b_pos,
            b_len,
            plen,
            nz,
            act_start,
            row_cnt,
            act_at,
            act_row,
            act_len,
            descs,
            tile_excl,
            row_states,
            piece_states,
            tile_cnt,
            tile_pos,
            scratch,
            misc,
            roff,
            res,
            d_out,
        })
    }
}

/// A launch group's device buffers (addresses in the workspace's pool; 0: not used by this
/// group's path).
pub(super) struct Buffers {
    /// The input region (see [`Chunk`]).
    pub(super) d_in: u64,
    /// Per row: the plan's selection, A's and B's positions and lengths, the merge path's
    /// length, whether the row has work, its first place among the active rows, its count.
    pub(super) sel: u64,
    pub(super) a_pos: u64,
    pub(super) a_len: u64,
    pub(super) b_pos: u64,
    pub(super) b_len: u64,
    pub(super) plen: u64,
    pub(super) nz: u64,
    pub(super) act_start: u64,
    pub(super) row_cnt: u64,
    /// The tile path's compaction of the active rows, its tile descriptors and the scan of
    /// its tiles' counts.
    pub(super) act_at: u64,
    pub(super) act_row: u64,
    pub(super) act_len: u64,
    pub(super) descs: u64,
    pub(super) tile_excl: u64,
    /// `wmerge`'s look-back states.
    pub(super) row_states: u64,
    pub(super) piece_states: u64,
    /// Each tile's (piece's) count of matches and its row.
    pub(super) tile_cnt: u64,
    pub(super) tile_pos: u64,
    pub(super) scratch: u64,
    /// The kernels' error word, the scratch top and `wmerge`'s piece size.
    pub(super) misc: u64,
    /// Two row-offset buffers and two result buffers, alternating between steps.
    pub(super) roff: [u64; 2],
    pub(super) res: [u64; 2],
    /// The output region (see [`Chunk`]).
    pub(super) d_out: u64,
}

/// A launch group's events: before the copies up (`e[0]`), after them (`e[1]`, the kernels'
/// window opens), after the kernels (`e[2]`), before and after the copy down (`e[3]`,
/// `e[4]`); and around each step's merge kernels (partition and merge, or `wmerge` and
/// `wplace`), for the benchmarks' breakdown when they ask for it ([`merge_marks`]: each mark
/// is one more operation the host queues between the kernels, while the device may be waiting
/// for the next launch). Made before anything is queued, so that nothing but launches sits
/// between the kernels.
pub(super) struct Marks {
    pub(super) e: [CudaEvent; 5],
    pub(super) merge: Vec<(CudaEvent, CudaEvent)>,
}

impl Marks {
    fn new(g: &Gpu, k: usize) -> Result<Self, GpuError> {
        let e = [g.event()?, g.event()?, g.event()?, g.event()?, g.event()?];
        let merge = if merge_marks() {
            (1..k)
                .map(|_| Ok((g.event()?, g.event()?)))
                .collect::<Result<Vec<_>, GpuError>>()?
        } else {
            Vec::new()
        };
        Ok(Marks { e, merge })
    }

    /// Record step `step`'s merge mark (its start, or with `end` its end), if marks are on.
    pub(super) fn mark(&self, g: &Gpu, step: u32, end: bool) -> Result<(), GpuError> {
        match self.merge.get(step as usize - 1) {
            Some((m0, m1)) => g.record(if end { m1 } else { m0 }),
            None => Ok(()),
        }
    }
}
