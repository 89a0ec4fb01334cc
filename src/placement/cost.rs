//! The cost model behind `auto`: the time of a list-intersection batch on the CPU and on
//! the GPU, from its value and row counts. Calibrated on the GPU machine (an H200 with a
//! 16-core Xeon host) through SQL; `benches/README.md` has the measurements.

use super::InputSize;

/// GPU, end to end through the SQL function, ns per input value (H200, 2 lists).
pub const GPU_NS_PER_VALUE: f64 = 0.24;
/// GPU, ns per row (the row's plan, tiles, output offsets).
pub const GPU_NS_PER_ROW: f64 = 22.0;
/// GPU fixed cost per batch (one device call: launches, copies' latency, waits), ns. The
/// GPU backend's time over the CPU's on batches of 1 to 100 rows through SQL measured
/// 0.13-0.24 ms on H200 and H100 hosts since the staging was overlapped (benches/README.md,
/// "auto by row count"; 0.3 ms was fitted before that).
pub const GPU_NS_PER_BATCH: f64 = 2.5e5;
/// GPU with the list columns already on the device, through the SQL function: fixed cost per
/// batch (launches, the results' copy latency, waits), ns. Fitted on many small resident
/// batches (H100 host, benches/README.md "`auto` on a table queried again": 8,192-row
/// batches took 0.21-0.28 ms each; 0.3 ms, fitted on one-batch runs, over-priced them).
pub const GPU_RESIDENT_NS_PER_BATCH: f64 = 2.0e5;
/// The same, ns per input value (kernels, results copied out and into Arrow arrays).
pub const GPU_RESIDENT_NS_PER_VALUE: f64 = 0.0105;
/// The same, ns per row.
pub const GPU_RESIDENT_NS_PER_ROW: f64 = 6.0;
/// CPU, ns per input value on one thread (the H200 machine's Xeon, 16 threads measured).
pub const CPU_NS_PER_VALUE: f64 = 0.87;
/// CPU, ns per row on one thread (the row's sortedness check, kernel choice and call).
pub const CPU_NS_PER_ROW: f64 = 345.0;

/// The model's estimates (ms) for one batch of `values` input values in `rows` rows: the CPU
/// on `threads` threads, and the GPU with the batch's list columns already on the device.
/// Calibrated on the H200 machine through SQL (benches/README.md, "known row order": W1, W2
/// and both 4x, resident, against the CPU backend on 16 threads).
pub fn estimate_resident_ms(values: usize, rows: usize, threads: usize) -> (f64, f64) {
    let (values, rows, threads) = (values as f64, rows as f64, threads.max(1) as f64);
    let cpu_ms = (values * CPU_NS_PER_VALUE + rows * CPU_NS_PER_ROW) / threads / 1e6;
    let gpu_ms = (GPU_RESIDENT_NS_PER_BATCH
        + values * GPU_RESIDENT_NS_PER_VALUE
        + rows * GPU_RESIDENT_NS_PER_ROW)
        / 1e6;
    (cpu_ms, gpu_ms)
}

/// The threads the CPU backend keeps busy on `batches` batches of `values` input values in
/// all: a batch of at least `split_values` values (`sets.parallel_min_values`; 0 never) is
/// split across every thread, a smaller one runs on one, beside the other batches.
pub fn cpu_threads_used(
    values: usize,
    batches: usize,
    threads: usize,
    split_values: usize,
) -> usize {
    let (batches, threads) = (batches.max(1), threads.max(1));
    if split_values > 0 && values / batches >= split_values {
        threads
    } else {
        threads.min(batches)
    }
}

/// The model's estimates (ms) for `values` input values (CPU; GPU). The CPU prices each batch
/// by its own size (the values spread over the rows evenly): a batch of at least
/// `split_values` runs on all `threads`; the last, shorter batch below it after full batches
/// that were split runs alone on one thread; batches all below it run beside one another
/// ([`cpu_threads_used`]).
pub fn estimate_ms(
    values: usize,
    size: InputSize,
    threads: usize,
    split_values: usize,
) -> (f64, f64) {
    let rows = size.rows.unwrap_or(0);
    let batch_rows = size.batch_rows.max(1);
    let batches = rows.div_ceil(batch_rows).max(1);
    let cost = |v: f64, r: f64| v * CPU_NS_PER_VALUE + r * CPU_NS_PER_ROW;
    let cpu_ns = if rows <= batch_rows {
        cost(values as f64, rows as f64) / cpu_threads_used(values, 1, threads, split_values) as f64
    } else {
        let (full, last_rows) = (rows / batch_rows, rows % batch_rows);
        let per_row = values as f64 / rows as f64;
        let full_values = (per_row * batch_rows as f64) as usize;
        let last_values = (per_row * last_rows as f64) as usize;
        let full_ns = full as f64 * cost(full_values as f64, batch_rows as f64);
        let last_ns = cost(last_values as f64, last_rows as f64);
        let split = |v: usize| split_values > 0 && v >= split_values;
        let all = threads.max(1) as f64;
        match (split(full_values), split(last_values)) {
            (true, true) => (full_ns + last_ns) / all,
            (true, false) => full_ns / all + last_ns,
            _ => {
                (full_ns + last_ns)
                    / cpu_threads_used(values, batches, threads, split_values) as f64
            }
        }
    };
    let rows = rows as f64;
    let gpu_ms = (batches as f64 * GPU_NS_PER_BATCH
        + values as f64 * GPU_NS_PER_VALUE
        + rows * GPU_NS_PER_ROW)
        / 1e6;
    (cpu_ns / 1e6, gpu_ms)
}
