//! List columns kept on the device (`sets.gpu_resident_columns`): a column's values and
//! offsets buffers copied whole into one allocation, with the order of its rows found once on
//! the device; the bookkeeping (which columns, within which budget) is `super::super::columns`.

use cudarc::driver::result;

use super::super::GpuError;
use super::super::columns::{self, Admitted, Placement};
use super::super::fault::{self, Fault};
use super::super::memory::{DevBuf, Pinned, Workspace};
use super::super::runtime::{ALIGN, Gpu, align, arg, drv, par_copy};
use super::kernels::{Kernels, ROW_THREADS};
use super::{HostList, Timings};
use crate::backend::cpu::SetElem;
use crate::tuning::{KnownOrder, env, known_order};

/// Piece size of a column's upload through the two pinned staging buffers.
const UPLOAD_PIECE: usize = 8 << 20;

/// The default budget of resident columns: `DFSETS_GPU_COLUMN_BUDGET` bytes, else a quarter
/// of the device's memory.
pub(super) fn default_column_budget(g: &Gpu) -> usize {
    env().gpu_column_budget.unwrap_or(g.info.total_memory / 4)
}

/// A list column kept on the device: one allocation holding its values buffer (at 0), its
/// offsets buffer (at `offs_at`) and, when known, the order of its rows.
pub(crate) struct ResidentCol {
    buf: DevBuf,
    order: Option<RowOrder>,
}

/// Where a resident column's row-order flags are (one byte per entry of the offsets buffer but
/// the last, 1 = the row is strictly increasing) and what they were computed for: the child
/// values starting `v_shift` bytes into the values buffer, compared as elements of kind
/// `variant` ([`elem_index`]). A call that reads the buffers otherwise does not use them.
#[derive(Clone, Copy)]
struct RowOrder {
    at: usize,
    v_shift: usize,
    variant: usize,
}

/// What [`upload_column`] computes the row order for: the element kind, the offset width in
/// bytes and the byte shift of the child values in the values buffer.
struct OrderOf {
    variant: usize,
    osz: usize,
    v_shift: usize,
}

/// Copy a column's values and offsets buffers into one new device allocation (values at 0,
/// offsets at `offs_at`), in pieces staged through the two pinned buffers so that staging a
/// piece overlaps the copy of the one before; then, with `order`, find which of its rows are
/// strictly increasing (`row_order`, a streaming pass on the device; not when the offsets
/// address values outside the buffer).
fn upload_column(
    g: &Gpu,
    k: &Kernels,
    pins: [&mut Option<Pinned>; 2],
    values: &[u8],
    offsets: &[u8],
    offs_at: usize,
    order: Option<OrderOf>,
) -> Result<ResidentCol, GpuError> {
    let esz_of = |variant: usize| if variant < 2 { 4 } else { 8 };
    // Rows of the offsets buffer whose order is computed, and where the flags go.
    let order = order.and_then(|o| {
        let rows = (offsets.len() / o.osz).checked_sub(1).filter(|&r| r > 0)?;
        let entry = |i: usize| -> Option<usize> {
            let b = &offsets[i * o.osz..(i + 1) * o.osz];
            let v = if o.osz == 4 {
                i64::from(i32::from_le_bytes(b.try_into().ok()?))
            } else {
                i64::from_le_bytes(b.try_into().ok()?)
            };
            usize::try_from(v).ok()
        };
        let (first, last) = (entry(0)?, entry(rows)?);
        let esz = esz_of(o.variant);
        let room = values.len().checked_sub(o.v_shift)? / esz;
        (o.v_shift % esz == 0 && first <= last && last <= room).then_some((o, rows))
    });
    let ord_at = align(offs_at + offsets.len());
    let bytes = match order {
        Some((_, rows)) => ord_at + rows,
        None => offs_at + offsets.len(),
    }
    .max(ALIGN);
    if fault::armed(Fault::OutOfMemory) {
        return Err(GpuError::OutOfMemory("resident column allocation"));
    }
    // SAFETY: plain allocation; the context is bound by the caller.
    let ptr = unsafe { result::malloc_sync(bytes) }.map_err(drv("resident column allocation"))?;
    let buf = DevBuf { ptr, bytes };
    let events = [g.event()?, g.event()?];
    let mut in_flight = [false; 2];
    let pieces = values
        .chunks(UPLOAD_PIECE)
        .enumerate()
        .map(|(i, p)| (i * UPLOAD_PIECE, p))
        .chain(
            offsets
                .chunks(UPLOAD_PIECE)
                .enumerate()
                .map(|(i, p)| (offs_at + i * UPLOAD_PIECE, p)),
        );
    for (i, (at, piece)) in pieces.enumerate() {
        let slot = i % 2;
        if in_flight[slot] {
            events[slot]
                .synchronize()
                .map_err(drv("event synchronize"))?;
        }
        let pin = Workspace::pinned(&mut *pins[slot], piece.len())?;
        par_copy(&mut pin.as_mut_slice()[..piece.len()], piece);
        // SAFETY: `ptr + at .. + piece.len()` lies inside the allocation above; the pinned
        // source is not written again before this copy's event has completed (checked above)
        // and outlives the stream synchronize below.
        unsafe {
            result::memcpy_htod_async(
                ptr + at as u64,
                &pin.as_slice()[..piece.len()],
                g.stream.cu_stream(),
            )
        }
        .map_err(drv("host-to-device copy"))?;
        events[slot]
            .record(&g.stream)
            .map_err(drv("event record"))?;
        in_flight[slot] = true;
    }
    let order = match order {
        Some((o, rows)) => {
            let flags = ptr + ord_at as u64;
            let vals = ptr + o.v_shift as u64;
            let offs = ptr + offs_at as u64;
            let rows64 = rows as u64;
            let threads = ROW_THREADS;
            let blocks = (values.len() / esz_of(o.variant))
                .div_ceil(threads as usize)
                .clamp(1, g.info.multiprocessors as usize * 32) as u32;
            // SAFETY: `flags` holds `rows` bytes of the allocation; the kernel reads the
            // offsets buffer's `rows + 1` entries and the values they address, which lie in
            // the values buffer (checked above: first <= last <= its elements past v_shift).
            unsafe {
                result::memset_d8_async(flags, 1, rows, g.stream.cu_stream())
                    .map_err(drv("memset"))?;
                g.launch(
                    &k.row_order[o.variant][usize::from(o.osz == 8)],
                    blocks,
                    threads,
                    &mut [arg(&vals), arg(&offs), arg(&rows64), arg(&flags)],
                )?;
            }
            Some(RowOrder {
                at: ord_at,
                v_shift: o.v_shift,
                variant: o.variant,
            })
        }
        None => None,
    };
    g.sync()?;
    Ok(ResidentCol { buf, order })
}

/// Device addresses of a list argument kept on the device: its first value, its first offset
/// (the call's `values[0]` and `offsets[0]`; 0 when only the values are kept and the call's
/// offsets are staged) and its first row's order flag (0: not known).
pub(super) type ResidentAt = Option<(u64, u64, u64)>;

/// Whether the call stages list `r`'s offsets (not kept on the device with its values).
pub(super) fn stages_offsets(r: &ResidentAt) -> bool {
    !matches!(r, Some((_, offs, _)) if *offs != 0)
}

/// Find or make resident the list columns of a call that can be (see
/// [`columns::placement`]). The rest (and every column after an upload error) are staged.
pub(super) fn resident_columns<T: SetElem>(
    g: &Gpu,
    k: &Kernels,
    ws: &mut Workspace,
    variant: usize,
    lists: &[HostList<'_, T>],
    budget: usize,
    t: &mut Timings,
) -> Vec<ResidentAt> {
    let with_order = known_order() != KnownOrder::Ignore;
    let stamp = ws.columns.begin_call();
    let mut failed = false;
    lists
        .iter()
        .map(|l| {
            let (vbuf, obuf) = l.column?;
            if failed {
                return None;
            }
            let Placement {
                key,
                v_shift,
                o_shift,
                osz,
                values_only,
            } = columns::placement(l)?;
            let offs_at = align(vbuf.len());
            // What is kept: values, offsets and a byte of row order per offset; or the values
            // alone (a slice of a larger batch: the call stages its offsets, whose address is
            // then 0, and row order is not known).
            let (bytes, offsets, order) = if values_only {
                (offs_at.max(ALIGN), &[][..], None)
            } else {
                let order = OrderOf {
                    variant,
                    osz,
                    v_shift,
                };
                let bytes = align(offs_at + obuf.len()) + obuf.len() / osz;
                (bytes, obuf.as_slice(), Some(order))
            };
            let at = |d: &ResidentCol| {
                let base = d.buf.ptr;
                if values_only {
                    return (base + v_shift as u64, 0, 0);
                }
                let ord = match d.order {
                    Some(o) if with_order && o.v_shift == v_shift && o.variant == variant => {
                        base + (o.at + o_shift / osz) as u64
                    }
                    _ => 0,
                };
                (
                    base + v_shift as u64,
                    base + (offs_at + o_shift) as u64,
                    ord,
                )
            };
            if let Some(d) = ws.columns.get(&key, stamp) {
                t.columns_reused += 1;
                return Some(at(d));
            }
            {
                let Workspace {
                    columns,
                    pin_in,
                    pin_out,
                    ..
                } = &mut *ws;
                let admitted = columns.admit(
                    key,
                    [vbuf.clone(), obuf.clone()],
                    bytes,
                    budget,
                    stamp,
                    || {
                        upload_column(
                            g,
                            k,
                            [pin_in, pin_out],
                            vbuf.as_slice(),
                            offsets,
                            offs_at,
                            order,
                        )
                    },
                );
                match admitted {
                    Ok(Admitted::Now(d)) => {
                        let got = at(d);
                        t.columns_uploaded += 1;
                        t.h2d_bytes += (vbuf.len() + offsets.len()) as u64;
                        log::debug!(
                            "datafusion-sets: list column of {bytes} bytes kept on the device \
                             ({} columns, {} bytes resident)",
                            columns.len(),
                            columns.bytes()
                        );
                        Some(got)
                    }
                    Ok(Admitted::DoesNotFit) => None,
                    Err(e) => {
                        log::debug!(
                            "datafusion-sets: list column staged, not kept on the device: {e}"
                        );
                        failed = true;
                        None
                    }
                }
            }
        })
        .collect()
}
