//! The CUDA side of [`super::intersect`]: a batch checked, its columns found or made
//! resident, then cut into launch groups ([`chunk_end`]) run one after the other
//! ([`run_chunk`]); a group short of memory is retried at half the input.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::super::runtime::{drv, panic_message};
use super::super::{GpuError, ready};
use super::chunk::run_chunk;
use super::kernels::{MIN_BUDGET, elem_index, kernels};
use super::resident::{default_column_budget, resident_columns};
use super::{GpuOutput, HostList, LAUNCH_BYTES, Mode, RowValidity};
use crate::backend::cpu::SetElem;

pub(super) fn intersect_in<T: SetElem>(
    lists: &[HostList<'_, T>],
    validity: Option<RowValidity<'_>>,
    mode: Mode,
    columns_budget: Option<usize>,
    share_values: bool,
    resident_only: bool,
) -> Result<GpuOutput<T>, GpuError> {
    let Some(variant) = elem_index::<T>() else {
        return Err(GpuError::Unsupported(format!("{}-bit elements", T::BITS)));
    };
    if lists.len() < 2 {
        return Err(GpuError::Unsupported("fewer than two lists".into()));
    }
    let n = lists[0].offsets.rows();
    for l in lists {
        let rows = l.offsets.rows();
        let (first, last) = if rows == n {
            (l.offsets.at(0), l.offsets.at(n))
        } else {
            (1, 0)
        };
        if rows != n || first > last || last > l.values.len() {
            return Err(GpuError::Unsupported(
                "list columns of different lengths or bad offsets".into(),
            ));
        }
    }
    if n > (u32::MAX as usize) - 1 {
        return Err(GpuError::Unsupported(
            "more than 2^32 - 2 rows in one batch".into(),
        ));
    }
    if let Some(v) = validity
        && v.bits.len() * 8 < v.bit_offset + n
    {
        return Err(GpuError::Unsupported(
            "validity bitmap shorter than the batch".into(),
        ));
    }
    let g = ready()?;
    let kern = kernels(g)?;
    let started = Instant::now();
    let mut out = GpuOutput::<T> {
        offsets: Vec::with_capacity(n + 1),
        ..Default::default()
    };
    out.offsets.push(0);
    out.flagged = Vec::with_capacity(n);
    if n == 0 {
        return Ok(out);
    }
    let mut ws = match g.workspace.lock() {
        Ok(ws) => ws,
        Err(poisoned) => {
            let mut ws = poisoned.into_inner();
            ws.clear();
            ws
        }
    };
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    let esz = std::mem::size_of::<T>();
    let mut resident = match columns_budget {
        Some(b) => {
            let budget = if b == 0 { default_column_budget(g) } else { b };
            resident_columns(g, kern, &mut ws, variant, lists, budget, &mut out.timings)
        }
        None => vec![None; lists.len()],
    };
    if resident_only && resident.iter().any(Option::is_none) {
        return Err(GpuError::Unsupported(
            "a list column is not on the device".into(),
        ));
    }
    let mut r0 = 0;
    while r0 < n {
        let budget_elems = (ws.budget / esz).max(1);
        let max_rows = (ws.budget / 64).max(1);
        let r1 = chunk_end(lists, r0, n, budget_elems, max_rows);
        let lend = share_values && mode == Mode::Values && r0 == 0 && r1 == n;
        let res = catch_unwind(AssertUnwindSafe(|| {
            run_chunk(
                g, kern, &mut ws, variant, lists, &resident, validity, r0, r1, mode, lend, &mut out,
            )
        }))
        .unwrap_or_else(|p| Err(GpuError::Panic(panic_message(p))));
        match res {
            Ok(()) => r0 = r1,
            Err(GpuError::OutOfMemory(what)) => {
                // Free the pools, wait for the stream, and retry with half the input.
                let _ = g.sync();
                ws.clear();
                resident.iter_mut().for_each(|r| *r = None);
                if ws.budget <= MIN_BUDGET || r1 == r0 + 1 {
                    return Err(GpuError::OutOfMemory(what));
                }
                ws.budget /= 2;
                LAUNCH_BYTES.store(ws.budget, Ordering::Relaxed);
                log::debug!(
                    "datafusion-sets: GPU memory short ({what}); launch groups cut to {} bytes",
                    ws.budget
                );
            }
            Err(e) => {
                if matches!(
                    e,
                    GpuError::Kernel(_) | GpuError::Panic(_) | GpuError::Driver { .. }
                ) {
                    g.mark_broken(&e);
                }
                return Err(e);
            }
        }
    }
    out.any_flagged = out.flagged.iter().any(|&f| f);
    out.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(out)
}

/// The end of the launch group starting at row `r0`: as many rows as fit `budget_elems`
/// input values (at least one row). Values per row group are monotone in the end row, so
/// this is a binary search over the offsets (no per-row work).
fn chunk_end<T>(
    lists: &[HostList<'_, T>],
    r0: usize,
    n: usize,
    budget_elems: usize,
    max_rows: usize,
) -> usize {
    let vals = |r1: usize| -> usize {
        lists
            .iter()
            .map(|l| l.offsets.at(r1) - l.offsets.at(r0))
            .sum()
    };
    let hi_cap = n.min(r0.saturating_add(max_rows));
    if vals(hi_cap) <= budget_elems {
        return hi_cap;
    }
    let (mut lo, mut hi) = (r0 + 1, hi_cap);
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if vals(mid) <= budget_elems {
            lo = mid
        } else {
            hi = mid - 1
        }
    }
    lo
}
