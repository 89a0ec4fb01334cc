//! The hook between the SQL functions and the GPU: `intersect_rows` calls [`try_values`] /
//! [`try_counts`] first; `None` means "run on the CPU" (backend not chosen, element width
//! not handled, or no usable GPU — the reason goes to the debug log).
//!
//! The device computes every row; rows the CPU must redo are those the kernels flag (a list
//! not strictly increasing) and those holding a NULL element: they are recomputed with the
//! CPU's exact path, so results are always identical to the CPU backend's.

use std::any::TypeId;

use datafusion::arrow::array::OffsetSizeTrait;
use datafusion::arrow::buffer::NullBuffer;

use crate::backend::cpu::SetElem;
use crate::backend::gpu::{self, GpuOutput, HostList, HostOffsets, Mode, RowValidity};
use crate::config::BackendChoice;
use crate::intersect::lists::IntLists;
use crate::intersect::rows::{EngineOptions, ValuesOut, cpu_counts_rows, cpu_values_rows};
use crate::placement::plan::holder;

/// Arrow offsets of type `O` as the backend's [`HostOffsets`].
fn host_offsets<O: OffsetSizeTrait>(o: &[O]) -> Option<HostOffsets<'_>> {
    if TypeId::of::<O>() == TypeId::of::<i32>() {
        // SAFETY: `O` is `i32` (checked by `TypeId`), so the cast is the identity.
        Some(HostOffsets::I32(unsafe {
            std::slice::from_raw_parts(o.as_ptr().cast::<i32>(), o.len())
        }))
    } else if TypeId::of::<O>() == TypeId::of::<i64>() {
        // SAFETY: `O` is `i64` (checked by `TypeId`), so the cast is the identity.
        Some(HostOffsets::I64(unsafe {
            std::slice::from_raw_parts(o.as_ptr().cast::<i64>(), o.len())
        }))
    } else {
        None
    }
}

/// Run the batch on the GPU when the options ask for it; the rows to redo on the CPU.
fn run<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
    mode: Mode,
) -> Option<(GpuOutput<T>, Vec<usize>)> {
    // `auto` chose the CPU: a batch over columns met before may still run on them resident.
    let resident_budget = match (&opts.plan, opts.gpu_columns) {
        _ if opts.backend == BackendChoice::Gpu => None,
        (Some(p), Some(budget)) if p.resident_on_gpu => Some(budget),
        _ => return None,
    };
    if !matches!(T::BITS, 32 | 64) || lists.len() < 2 || lists[0].is_empty() {
        return None;
    }
    if resident_budget.is_some() {
        let n = lists[0].len();
        let values: usize = lists
            .iter()
            .map(|l| {
                let o = l.parts().0;
                o[n].as_usize().saturating_sub(o[0].as_usize())
            })
            .sum();
        if !crate::placement::resident_batch_on_gpu(values, n) {
            return None;
        }
    }
    let mut host = Vec::with_capacity(lists.len());
    let mut row_nulls: Option<NullBuffer> = None;
    let mut element_nulls = false;
    for l in lists {
        let (offsets, values, nulls, elem_nulls) = l.parts();
        let (values_buffer, offsets_buffer, _) = l.buffers();
        host.push(HostList {
            offsets: host_offsets(offsets)?,
            values,
            column: Some((values_buffer, offsets_buffer)),
        });
        row_nulls = NullBuffer::union(row_nulls.as_ref(), nulls);
        element_nulls |= elem_nulls.is_some();
    }
    let validity = row_nulls.as_ref().map(|nb| RowValidity {
        bits: nb.inner().values(),
        bit_offset: nb.inner().offset(),
    });
    let share = mode == Mode::Values;
    // The host memory the call stages through, reserved in the query's pool while it runs.
    let reservation = opts.plan.as_ref().and_then(|p| p.reservation());
    // On resident columns (the call below takes them only when all are) no values are staged.
    let staged = gpu::staging_bytes(
        &host,
        mode,
        gpu::launch_group_bytes(),
        resident_budget.is_some(),
    );
    if !holder(&reservation)(staged) {
        log::debug!(
            "datafusion-sets: list intersection on the CPU: the memory pool refused {staged} bytes of GPU staging"
        );
        return None;
    }
    let out = match resident_budget {
        None => gpu::intersect(&host, validity, mode, opts.gpu_columns, share),
        Some(budget) => {
            if !gpu::columns::all_met_before(&host) {
                return None;
            }
            gpu::intersect_resident(&host, validity, mode, budget, share)
        }
    };
    let out = match out {
        Ok(out) => out,
        Err(e) => {
            log::debug!("datafusion-sets: list intersection on the CPU: {e}");
            return None;
        }
    };
    gpu::BATCHES.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let n = lists[0].len();
    let mut redo = Vec::new();
    if out.any_flagged || element_nulls {
        for i in 0..n {
            if out.flagged[i] || (element_nulls && lists.iter().any(|l| l.row_has_null_element(i)))
            {
                redo.push(i);
            }
        }
    }
    if let Some(p) = &opts.plan {
        p.metrics
            .record_gpu(n as u64, 1, redo.len() as u64, &out.timings);
    }
    Some((out, redo))
}

/// `list_intersect` on the GPU, or `None` to run on the CPU.
pub(crate) fn try_values<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
) -> Option<ValuesOut<T>> {
    let (out, redo) = run(lists, opts, Mode::Values)?;
    let n = lists[0].len();
    let off = &out.offsets;
    let len = |r: usize| (off[r + 1] - off[r]) as usize;
    if redo.is_empty() {
        // The values are in `shared_values` (one launch group) or in `values`.
        return Some(ValuesOut {
            values: out.values,
            lengths: (0..n).map(len).collect(),
            validity: None,
            shared: out.shared_values,
        });
    }
    let gpu_values = out.values_slice();
    let mut res = ValuesOut {
        values: Vec::with_capacity(gpu_values.len()),
        lengths: Vec::with_capacity(n),
        validity: None,
        shared: None,
    };
    let append_gpu = |res: &mut ValuesOut<T>, a: usize, b: usize| {
        if a < b {
            res.values
                .extend_from_slice(&gpu_values[off[a] as usize..off[b] as usize]);
            res.lengths.extend((a..b).map(len));
            if let Some(v) = &mut res.validity {
                v.resize(res.values.len(), true);
            }
        }
    };
    let mut next = 0;
    let parts = cpu_values_rows(lists, &redo, opts);
    for (&i, part) in redo.iter().zip(parts) {
        append_gpu(&mut res, next, i);
        if part.validity.is_some() && res.validity.is_none() {
            res.validity = Some(vec![true; res.values.len()]);
        }
        res.values.extend_from_slice(&part.values);
        res.lengths.extend_from_slice(&part.lengths);
        if let Some(v) = &mut res.validity {
            match &part.validity {
                Some(pv) => v.extend_from_slice(pv),
                None => v.resize(res.values.len(), true),
            }
        }
        next = i + 1;
    }
    append_gpu(&mut res, next, n);
    Some(res)
}

/// `list_intersect_count` on the GPU, or `None` to run on the CPU.
pub(crate) fn try_counts<O: OffsetSizeTrait, T: SetElem>(
    lists: &[IntLists<'_, O, T>],
    opts: &EngineOptions,
) -> Option<Vec<u64>> {
    let (out, redo) = run(lists, opts, Mode::Counts)?;
    let mut counts: Vec<u64> = out.offsets.windows(2).map(|w| w[1] - w[0]).collect();
    for (&i, c) in redo.iter().zip(cpu_counts_rows(lists, &redo, opts)) {
        counts[i] = c;
    }
    Some(counts)
}
