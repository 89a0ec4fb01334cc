//! A launch group's inputs into pinned memory and up: offsets, validity, pointer table and
//! bases first (they follow the value sections), then the values piece by piece, each
//! piece's copy to the device queued as soon as it is staged so that the copy of one overlaps
//! the staging of the next (`stage_piece() == 0`: everything staged, then one copy).

use std::time::Instant;

use cudarc::driver::result;

use super::super::GpuError;
use super::super::memory::Workspace;
use super::super::runtime::{Gpu, bytes_of, drv, par_copy};
use super::chunk::{Buffers, Chunk, Marks};
use super::resident::{ResidentAt, stages_offsets};
use super::{HostList, HostOffsets};
use crate::backend::cpu::SetElem;
use crate::tuning::stage_piece;

/// Stage the group's inputs and queue their copies up (`marks.e[0]` recorded before the
/// first); the host's time staging them (ms).
pub(super) fn stage<T: SetElem>(
    g: &Gpu,
    ws: &mut Workspace,
    c: &Chunk<'_>,
    lists: &[HostList<'_, T>],
    resident: &[ResidentAt],
    d: &Buffers,
    marks: &Marks,
) -> Result<f64, GpuError> {
    let Chunk {
        k,
        r0,
        r1,
        esz,
        osz,
        in_bytes,
        valid,
        valid_at,
        ptrs_at,
        bases_at,
        ords_at,
        ..
    } = *c;
    let (val_at, off_at) = (&c.val_at, &c.off_at);
    let d_in = d.d_in;
    let e0 = &marks.e[0];
    let piece = stage_piece();
    let small_at = off_at.first().copied().unwrap_or(in_bytes);
    let t_stage = Instant::now();
    {
        let pin = Workspace::pinned(&mut ws.pin_in, c.in_bytes)?.as_mut_slice();
        for (j, l) in lists.iter().enumerate() {
            if !stages_offsets(&resident[j]) {
                continue;
            }
            let ob = offsets_bytes(&l.offsets, r0, r1);
            pin[off_at[j]..off_at[j] + ob.len()].copy_from_slice(ob);
        }
        if let Some((bits, _)) = valid {
            pin[valid_at..valid_at + bits.len()].copy_from_slice(bits);
        }
        for j in 0..k {
            let first = lists[j].offsets.at(r0) as i64;
            // Values of list j live at element positions `base + offset` from `d_in`. A
            // resident copy holds the whole values buffer, so an offset indexes it as is (the
            // staged section starts at the group's first offset instead); it may lie below
            // `d_in` (a negative base; the device's 64-bit address arithmetic wraps back).
            // A resident list's row-order flags (0: not known; staged lists are checked).
            // Values kept alone: the staged offsets index the kept values as is.
            let (p, base, ord) = match resident[j] {
                Some((vals, 0, _)) => (
                    d_in + off_at[j] as u64,
                    (vals as i64).wrapping_sub(d_in as i64) / esz as i64,
                    0,
                ),
                Some((vals, offs, ord)) => (
                    offs + (r0 * osz) as u64,
                    (vals as i64).wrapping_sub(d_in as i64) / esz as i64,
                    if ord == 0 { 0 } else { ord + r0 as u64 },
                ),
                None => (d_in + off_at[j] as u64, (val_at[j] / esz) as i64 - first, 0),
            };
            pin[ptrs_at + 8 * j..ptrs_at + 8 * j + 8].copy_from_slice(&p.to_le_bytes());
            pin[bases_at + 8 * j..bases_at + 8 * j + 8].copy_from_slice(&base.to_le_bytes());
            pin[ords_at + 8 * j..ords_at + 8 * j + 8].copy_from_slice(&ord.to_le_bytes());
        }
        let cs = g.stream.cu_stream();
        let copy = |pin: &[u8], at: usize, len: usize| {
            // SAFETY: `d_in` holds `in_bytes` bytes; each pinned source range is written
            // before its copy is queued and never again until the stream is synchronized
            // (the workspace owns the buffer).
            unsafe { result::memcpy_htod_async(d_in + at as u64, &pin[at..at + len], cs) }
                .map_err(drv("host-to-device copy"))
        };
        let mut started = false;
        for (j, l) in lists.iter().enumerate() {
            if resident[j].is_some() {
                continue;
            }
            let (v0, v1) = (l.offsets.at(r0), l.offsets.at(r1));
            let src = bytes_of(&l.values[v0..v1]);
            let step = if piece == 0 { src.len().max(1) } else { piece };
            for (i, part) in src.chunks(step).enumerate() {
                let at = val_at[j] + i * step;
                par_copy(&mut pin[at..at + part.len()], part);
                if piece > 0 {
                    if !started {
                        g.record(e0)?;
                        started = true;
                    }
                    copy(pin, at, part.len())?;
                }
            }
        }
        if piece == 0 {
            g.record(e0)?;
            copy(pin, 0, in_bytes)?;
        } else {
            if !started {
                g.record(e0)?;
            }
            copy(pin, small_at, in_bytes - small_at)?;
        }
    }
    Ok(t_stage.elapsed().as_secs_f64() * 1e3)
}

/// Offsets `r0..=r1` of one list as raw bytes.
fn offsets_bytes<'a>(o: &HostOffsets<'a>, r0: usize, r1: usize) -> &'a [u8] {
    match o {
        HostOffsets::I32(s) => bytes_of(&s[r0..=r1]),
        HostOffsets::I64(s) => bytes_of(&s[r0..=r1]),
    }
}
