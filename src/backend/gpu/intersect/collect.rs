//! A launch group's results: the kernels' error word and result size, then the results in
//! one copy down (into the workspace's pinned buffer, or a block lent to the Arrow buffer that
//! will hold them), unstaged into the caller's output with the group's timings.

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::{CudaEvent, result};

use super::super::GpuError;
use super::super::memory::{LentPinned, Workspace};
use super::super::runtime::{Gpu, drv, par_copy};
use super::chunk::{Buffers, Chunk, Marks};
use super::{GpuOutput, Mode};
use crate::backend::cpu::SetElem;

/// Wait for the group's kernels, copy its results down and append them to `out` (`lend`:
/// the values stay in the page-locked block they were copied into, lent to
/// `out.shared_values`); `spanned`: the kernels went out through a graph that recorded the
/// workspace's span; `stage_ms`: the host's staging time.
#[allow(clippy::too_many_arguments)]
pub(super) fn collect<T: SetElem>(
    g: &Gpu,
    ws: &mut Workspace,
    c: &Chunk<'_>,
    d: &Buffers,
    marks: &Marks,
    lend: bool,
    spanned: bool,
    stage_ms: f64,
    out: &mut GpuOutput<T>,
) -> Result<(), GpuError> {
    let Chunk {
        n,
        esz,
        mode,
        cap,
        total_values,
        in_bytes,
        flags_at,
        offs_out_at,
        vals_out_at,
        ..
    } = *c;
    let cs = g.stream.cu_stream();
    // The result size and the kernels' error word, then the results in one copy.
    let mut head = [0u64; 2];
    let mut tail = [0u64; 1];
    // SAFETY: `misc` holds 64 bytes and `d_out` the offsets section; the host arrays live
    // across the synchronizing copies.
    unsafe {
        result::memcpy_dtoh_async(&mut head[..], d.misc, cs).map_err(drv("device-to-host copy"))?;
        result::memcpy_dtoh_async(&mut tail[..], d.d_out + (offs_out_at + n * 8) as u64, cs)
            .map_err(drv("device-to-host copy"))?;
    }
    g.sync()?;
    let kernel_err = (head[0] >> 32) as u32;
    if kernel_err != 0 {
        return Err(GpuError::Kernel(format!(
            "merge results overflowed their buffer (code {kernel_err})"
        )));
    }
    let got = tail[0] as usize;
    if got > cap {
        return Err(GpuError::Kernel(format!(
            "{got} results for a capacity of {cap}"
        )));
    }
    let back_bytes = vals_out_at + if mode == Mode::Values { got * esz } else { 0 };
    g.record(&marks.e[3])?;
    // The results land in the workspace's pinned buffer, or in a block lent to the Arrow
    // buffer that will hold the values.
    let mut lent = if lend {
        LentPinned::take(back_bytes)?
    } else {
        None
    };
    {
        let dst = match &mut lent {
            Some(b) => &mut b.as_mut_slice()[..back_bytes],
            None => {
                &mut Workspace::pinned(&mut ws.pin_out, back_bytes)?.as_mut_slice()[..back_bytes]
            }
        };
        // SAFETY: `d_out` holds at least `back_bytes` bytes (`got` ≤ `cap`); the pinned
        // destination is owned by the workspace (or `lent`) and read only after the
        // synchronize below.
        unsafe {
            result::memcpy_dtoh_async(dst, d.d_out, cs).map_err(drv("device-to-host copy"))?;
        }
    }
    g.record(&marks.e[4])?;
    g.sync()?;

    // Unstage: flags, offsets (shifted by what earlier launch groups produced), values.
    let t_unstage = Instant::now();
    let pin = match &lent {
        Some(b) => &b.as_slice()[..back_bytes],
        None => ws
            .pin_out
            .as_ref()
            .ok_or(GpuError::OutOfMemory("pinned allocation"))?
            .as_slice(),
    };
    out.flagged
        .extend(pin[flags_at..flags_at + n].iter().map(|&f| f != 0));
    let base = out.offsets.last().copied().unwrap_or(0);
    let offs = &pin[offs_out_at + 8..offs_out_at + 8 * (n + 1)];
    out.offsets.extend(offs.chunks_exact(8).map(|c| {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        base + u64::from_le_bytes(w)
    }));
    if let Some(block) = lent {
        // SAFETY: `vals_out_at` is 256-byte aligned within the block and starts the
        // `got * esz` bytes of values the device wrote (the copy is synchronized).
        out.shared_values =
            Some(unsafe { LentPinned::buffer(&Arc::new(block), vals_out_at, got * esz) });
    } else if mode == Mode::Values {
        let src = &pin[vals_out_at..vals_out_at + got * esz];
        let old = out.values.len();
        out.values.reserve(got);
        // SAFETY: `reserve` made room for `got` more elements; `src` holds exactly `got`
        // elements' bytes written by the device as values of `T` (a primitive integer, for
        // which every bit pattern is valid); `set_len` follows the full initialization.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(
                out.values.as_mut_ptr().add(old).cast::<u8>(),
                got * esz,
            );
            par_copy(dst, src);
            out.values.set_len(old + got);
        }
    }
    let unstage_ms = t_unstage.elapsed().as_secs_f64() * 1e3;

    let ms =
        |a: &CudaEvent, b: &CudaEvent| a.elapsed_ms(b).map(f64::from).map_err(drv("event timing"));
    let t = &mut out.timings;
    t.stage_ms += stage_ms;
    t.h2d_ms += ms(&marks.e[0], &marks.e[1])?;
    t.kernel_ms += ms(&marks.e[1], &marks.e[2])?;
    if let (true, Some((s0, s1))) = (spanned, &ws.span) {
        t.kernel_span_ms += ms(s0, s1)?;
    }
    for (a, b) in &marks.merge {
        t.merge_ms += ms(a, b)?;
    }
    t.d2h_ms += ms(&marks.e[3], &marks.e[4])?;
    t.unstage_ms += unstage_ms;
    t.h2d_bytes += in_bytes as u64;
    t.d2h_bytes += back_bytes as u64;
    t.input_values += total_values as u64;
    t.chunks += 1;
    Ok(())
}
