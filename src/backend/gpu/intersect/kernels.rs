//! The list intersection's kernels (kernels/intersect.cu, the runtime's base module): their
//! launch shapes, the compile options that fix them, and the function table, loaded once
//! per process when the backend starts (`super::super::ready`).

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::Ordering;
use std::time::Instant;

use cudarc::driver::CudaFunction;

use super::super::GpuError;
use super::super::memory::Workspace;
use super::super::modules::Module;
use super::super::runtime::{Gpu, arg, drv, panic_message};
use super::LAUNCH_BYTES;
use crate::backend::cpu::SetElem;
use crate::tuning::knobs;

/// Bytes of one tile descriptor (`TileDesc` in the kernel source).
pub(super) const DESC_BYTES: usize = 32;
/// Path positions per merge thread (`ITEMS` in the kernel source) and threads per merge
/// block, unless set for an experiment.
const MERGE_ITEMS: u32 = 8;
const MERGE_THREADS: u32 = 256;
/// Threads of a gather block (one warp per tile).
pub(super) const GATHER_THREADS: u32 = 256;
/// Threads of a `wmerge` block (`WBLOCK` in kernels/intersect.cu) and the blocks per
/// multiprocessor it is compiled for (`WMINB`).
pub(super) const WBLOCK: u32 = 256;
const WMINB: u32 = 6;
/// A `wmerge` step's piece size (see `WPieces`): the most and the fewest A positions per
/// piece, and the pieces per multiprocessor wanted.
const WPIECE_MAX: u32 = 2048;
const WPIECE_MIN: u32 = 256;
const WPIECES_PER_SM: u32 = 96;
/// Elements per block of the scan kernels, and their threads.
const SCAN_SEG: u64 = 4096;
const SCAN_THREADS: u32 = 1024;
/// Threads of the per-row kernels.
pub(super) const ROW_THREADS: u32 = 256;
/// `wplace` blocks per multiprocessor at most (it strides over the step's pieces): the
/// launch never holds blocks that find no piece (`wmerge`'s launch has a warp for each piece
/// the step can have, most of them past the step's last piece).
const WPLACE_BLOCKS_PER_SM: u32 = 8;
/// The smallest input (bytes of values) a launch group is cut down to when memory runs out.
pub(super) const MIN_BUDGET: usize = 16 << 20;

/// The kernels, loaded from the compiled module, and the shapes they were compiled for.
pub(crate) struct Kernels {
    pub(super) plan_o32: CudaFunction,
    pub(super) plan_o64: CudaFunction,
    pub(super) plan_scan_o32: CudaFunction,
    pub(super) plan_scan_o64: CudaFunction,
    scan_partials: CudaFunction,
    scan_partials_single: CudaFunction,
    scan_apply: CudaFunction,
    pub(super) compact_rows: CudaFunction,
    /// Indexed by [`elem_index`]: u32, i32, u64, i64.
    pub(super) partition: [CudaFunction; 4],
    /// Indexed by [`elem_index`].
    pub(super) merge: [CudaFunction; 4],
    /// The same for calls where a list's row order is known (a resident column's flags):
    /// skips the order check of known rows, searches B where plan says so.
    pub(super) merge_known: [CudaFunction; 4],
    /// Steps over lists all known increasing ([`crate::tuning::KnownOrder::Warp`]), by
    /// [`elem_index`].
    pub(super) wmerge: [CudaFunction; 4],
    /// `wplace_32`, `wplace_64`: after `wmerge`, each piece's matches to their place.
    pub(super) wplace: [CudaFunction; 2],
    /// 32-bit and 64-bit elements.
    pub(super) gather: [CudaFunction; 2],
    /// Row order of a resident column, by [`elem_index`], then 32- / 64-bit offsets.
    pub(super) row_order: [[CudaFunction; 2]; 4],
    /// Threads of a merge block; its tile is `merge_threads * merge_items` path positions.
    pub(super) merge_threads: u32,
    merge_items: u32,
    /// How a `wmerge` step sizes its pieces.
    pub(super) wpieces: WPieces,
    /// `wplace` blocks per multiprocessor at most (`WPLACE_BLOCKS_PER_SM`; the knob
    /// `gpu_wplace_per_sm`, 0 = one warp per piece the step can have, as `wmerge`).
    pub(super) wplace_per_sm: u32,
}

/// Index of the kernel variant for `T`.
pub(super) fn elem_index<T: SetElem>() -> Option<usize> {
    match (T::BITS, T::SIGNED) {
        (32, false) => Some(0),
        (32, true) => Some(1),
        (64, false) => Some(2),
        (64, true) => Some(3),
        _ => None,
    }
}

/// How a `wmerge` step sizes its pieces of A positions. The step's A total is known only on
/// the device (a later step's A is the previous step's matches), so the kernels choose
/// (`wpiece_of` in kernels/intersect.cu): `hi` positions, halved (never below `lo`) until the step
/// makes at least `per_sm` pieces per multiprocessor. Large pieces spread each piece's row
/// lookup and first search over more work; enough pieces keep every warp busy to the end of
/// the step (measured on an H200: kernels/DESIGN.md, "A piece size per step").
/// The knob `gpu_wpiece` fixes the size (`lo` = `hi`), `gpu_wpiece_min` / `_max` /
/// `_per_sm` set the rule's terms (experiments).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct WPieces {
    pub(super) lo: u32,
    pub(super) hi: u32,
    pub(super) per_sm: u32,
}

impl WPieces {
    fn from_knobs() -> Self {
        let k = knobs();
        let size = |v: Option<u32>| v.filter(|p| (32..=65_536).contains(p));
        let (lo, hi) = match size(k.gpu_wpiece) {
            Some(p) => (p, p),
            None => {
                let hi = size(k.gpu_wpiece_max).unwrap_or(WPIECE_MAX);
                (size(k.gpu_wpiece_min).unwrap_or(WPIECE_MIN).min(hi), hi)
            }
        };
        let per_sm = k
            .gpu_wpiece_per_sm
            .filter(|w| (1..=65_536).contains(w))
            .unwrap_or(WPIECES_PER_SM);
        WPieces { lo, hi, per_sm }
    }

    /// The pieces of any step whose A holds at most `cap` positions, `want` wanted: the
    /// kernels' size keeps halving only while the pieces are fewer than `want`, so a step makes
    /// fewer than 2 `want` of them unless its size stayed `hi` (then at most `cap / hi`), and
    /// never more than pieces of `lo` would make (a small call launches few warps).
    pub(super) fn pieces_max(&self, cap: u64, want: u64) -> u64 {
        let halved = if self.lo < self.hi { 2 * want } else { 0 };
        cap.div_ceil(u64::from(self.hi))
            .max(halved)
            .min(cap.div_ceil(u64::from(self.lo)))
            .max(1)
    }
}

/// The merge block's shape (threads, positions a thread): the defaults, or the knobs
/// `gpu_merge_threads` (64, 128 or 256) and `gpu_merge_items` (4, 8, 12 or 16; tiles of at most
/// 2,048 positions, so that the 64-bit kernels' shared memory stays under 48 KB). Experiments
/// only (kernels/DESIGN.md): one binary then measures the variants side by side.
fn merge_shape() -> (u32, u32) {
    let k = knobs();
    match (
        k.gpu_merge_threads.filter(|t| [64, 128, 256].contains(t)),
        k.gpu_merge_items.filter(|i| [4, 8, 12, 16].contains(i)),
    ) {
        (t, i) if t.unwrap_or(MERGE_THREADS) * i.unwrap_or(MERGE_ITEMS) <= 2048 => {
            (t.unwrap_or(MERGE_THREADS), i.unwrap_or(MERGE_ITEMS))
        }
        _ => (MERGE_THREADS, MERGE_ITEMS),
    }
}

/// kernels/intersect.cu's compile options: the merge block's shape, the blocks per
/// multiprocessor of the 32-bit merges (knob `gpu_merge_minb`, 1..=32) and of `wmerge`
/// (`gpu_wminb`, 1..=8), plan_scan's blocks (the per-row kernels', `PSCAN`) and, with the
/// knob `gpu_lineinfo`, line info for the profiler.
fn compile_options() -> Vec<String> {
    let k = knobs();
    let (merge_threads, merge_items) = merge_shape();
    let mut defines = vec![
        format!("-DTHREADS={merge_threads}"),
        format!("-DITEMS={merge_items}"),
    ];
    if let Some(b) = k.gpu_merge_minb.filter(|b| (1..=32).contains(b)) {
        defines.push(format!("-DMINB32={b}"));
    }
    let wminb = k.gpu_wminb.filter(|b| (1..=8).contains(b)).unwrap_or(WMINB);
    defines.push(format!("-DWMINB={wminb}"));
    defines.push(format!("-DPSCAN={ROW_THREADS}"));
    if k.gpu_lineinfo {
        defines.push("--generate-line-info".to_string());
    }
    defines
}

static KERNELS: OnceLock<Result<Kernels, GpuError>> = OnceLock::new();

/// The kernels, compiled and looked up on the first call of the process (then the launch
/// groups' input budget is set: the knob `gpu_launch_bytes`, at least 16 MiB, so that tests
/// can split batches into many groups; else an eighth of the device's memory).
pub(crate) fn kernels(g: &Gpu) -> Result<&'static Kernels, GpuError> {
    KERNELS
        .get_or_init(|| {
            let r = catch_unwind(AssertUnwindSafe(|| load(g)))
                .unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
            if let Err(e) = &r {
                log::debug!("datafusion-sets: GPU backend unavailable, using the CPU: {e}");
            }
            r
        })
        .as_ref()
        .map_err(Clone::clone)
}

fn load(g: &Gpu) -> Result<Kernels, GpuError> {
    let started = Instant::now();
    let (merge_threads, merge_items) = merge_shape();
    let module = g.module(Module::Intersect, compile_options)?;
    let f = |name: &str| module.load_function(name).map_err(drv("kernel lookup"));
    let kernels = Kernels {
        plan_o32: f("plan_o32")?,
        plan_o64: f("plan_o64")?,
        plan_scan_o32: f("plan_scan_o32")?,
        plan_scan_o64: f("plan_scan_o64")?,
        scan_partials: f("scan_partials")?,
        scan_partials_single: f("scan_partials_single")?,
        scan_apply: f("scan_apply")?,
        compact_rows: f("compact_rows")?,
        partition: [
            f("partition_u32")?,
            f("partition_i32")?,
            f("partition_u64")?,
            f("partition_i64")?,
        ],
        merge: [
            f("merge_u32")?,
            f("merge_i32")?,
            f("merge_u64")?,
            f("merge_i64")?,
        ],
        merge_known: [
            f("merge_known_u32")?,
            f("merge_known_i32")?,
            f("merge_known_u64")?,
            f("merge_known_i64")?,
        ],
        wmerge: [
            f("wmerge_u32")?,
            f("wmerge_i32")?,
            f("wmerge_u64")?,
            f("wmerge_i64")?,
        ],
        wplace: [f("wplace_32")?, f("wplace_64")?],
        gather: [f("gather_32")?, f("gather_64")?],
        row_order: [
            [f("row_order_u32_o32")?, f("row_order_u32_o64")?],
            [f("row_order_i32_o32")?, f("row_order_i32_o64")?],
            [f("row_order_u64_o32")?, f("row_order_u64_o64")?],
            [f("row_order_i64_o32")?, f("row_order_i64_o64")?],
        ],
        merge_threads,
        merge_items,
        wpieces: WPieces::from_knobs(),
        wplace_per_sm: knobs().gpu_wplace_per_sm.unwrap_or(WPLACE_BLOCKS_PER_SM),
    };
    // The trap the fault injection queues (`Gpu::sync`) must be there too.
    #[cfg(feature = "tuning")]
    f("fault_trap")?;
    let info = &g.info;
    log::debug!(
        "datafusion-sets: GPU backend on {} (sm_{}{}, {} SMs), kernels compiled in {:.0} ms",
        info.name,
        info.compute_capability.0,
        info.compute_capability.1,
        info.multiprocessors,
        started.elapsed().as_secs_f64() * 1e3
    );
    // Input bytes per launch group.
    let budget = knobs()
        .gpu_launch_bytes
        .unwrap_or(info.total_memory / 8)
        .clamp(MIN_BUDGET, 4 << 30);
    g.workspace.lock().unwrap_or_else(|p| p.into_inner()).budget = budget;
    LAUNCH_BYTES.store(budget, Ordering::Relaxed);
    Ok(kernels)
}

impl Kernels {
    /// Merge-path positions per tile.
    pub(super) fn tile(&self) -> u64 {
        u64::from(self.merge_threads * self.merge_items)
    }

    /// The pieces wanted per `wmerge` step on `g` (the kernels' `wwant`).
    pub(super) fn wwant(&self, g: &Gpu) -> u64 {
        u64::from(g.info.multiprocessors) * u64::from(self.wpieces.per_sm)
    }

    /// Exclusive scan of `n` u64 at `input` into `n + 1` u64 at `out`, on `g`'s stream.
    pub(super) fn scan(
        &self,
        g: &Gpu,
        ws: &mut Workspace,
        input: u64,
        n: u64,
        out: u64,
    ) -> Result<(), GpuError> {
        let blocks = n.div_ceil(SCAN_SEG);
        let partials = ws.dev("scan_partials", (blocks as usize) * 8)?;
        // SAFETY: parameters match the kernels in kernels/intersect.cu; `input` holds `n`,
        // `out` `n + 1` and `partials` `blocks` u64.
        unsafe {
            g.launch(
                &self.scan_partials,
                blocks as u32,
                SCAN_THREADS,
                &mut [arg(&input), arg(&n), arg(&partials)],
            )?;
            g.launch(
                &self.scan_partials_single,
                1,
                SCAN_THREADS,
                &mut [arg(&partials), arg(&blocks)],
            )?;
            g.launch(
                &self.scan_apply,
                blocks as u32,
                SCAN_THREADS,
                &mut [arg(&input), arg(&n), arg(&partials), arg(&out)],
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::WPieces;
    use proptest::prelude::*;

    /// The kernels' `wpiece_of` and `wpieces` (kernels/intersect.cu), step by step.
    fn kernel_pieces(w: WPieces, total: u64, want: u64) -> u64 {
        let mut p = w.hi;
        while p / 2 >= w.lo && total / u64::from(p) < want {
            p >>= 1;
        }
        if total == 0 {
            1
        } else {
            total.div_ceil(u64::from(p))
        }
    }

    proptest! {
        /// Whatever A total a step has (at most the call's shortest column), the pieces the
        /// kernels make of it fit the buffers the host sizes (the kernels flag a step that
        /// would not, as an error, never silently).
        #[test]
        fn any_step_fits_the_pieces_sized(
            lo in 32u32..4096,
            hi in 32u32..65_536,
            fixed in any::<bool>(),
            want in 1u64..100_000,
            cap in 0u64..(1 << 38),
            frac in 0.0f64..=1.0,
        ) {
            let w = if fixed {
                WPieces { lo: hi, hi, per_sm: 1 }
            } else {
                WPieces { lo: lo.min(hi), hi, per_sm: 1 }
            };
            let max = w.pieces_max(cap, want);
            for total in [0, 1, cap / 2, cap, (cap as f64 * frac) as u64] {
                let total = total.min(cap);
                prop_assert!(kernel_pieces(w, total, want) <= max, "total {total}: {w:?}, max {max}");
            }
        }
    }

    #[test]
    fn the_step_sizes_measured_on_the_h200() {
        // 132 multiprocessors, the defaults: the issue shape's first step (41.8 M A positions)
        // takes pieces of 2,048, its second (16.5 M) pieces of 1,024, the skewed shape's
        // (2.1 M) pieces of 256 (kernels/DESIGN.md, "A piece size per step").
        let w = WPieces {
            lo: super::WPIECE_MIN,
            hi: super::WPIECE_MAX,
            per_sm: super::WPIECES_PER_SM,
        };
        let want = 132 * u64::from(w.per_sm);
        let size = |total: u64| total.div_ceil(kernel_pieces(w, total, want));
        assert_eq!(size(41_800_000), 2048);
        assert_eq!(size(16_500_000), 1024);
        assert_eq!(size(2_100_000), 256);
        assert_eq!(
            w.pieces_max(145_000_000, want),
            145_000_000u64.div_ceil(2048)
        );
        // (A call whose shortest column is 2.1 M values: no more pieces than of 256.)
        assert_eq!(w.pieces_max(2_100_000, want), 2_100_000u64.div_ceil(256));
        assert_eq!(w.pieces_max(1000, want), 4);
    }
}
