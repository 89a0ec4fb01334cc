//! Device probes for benchmarks and tests (feature `tuning`): the transfer ceilings, host
//! reads of page-locked memory, the look-back epochs and the state of kernel graphs.

use std::time::Instant;

use cudarc::driver::result;

use super::memory::{EPOCH_LIMIT, Workspace};
use super::runtime::{Gpu, drv};
use super::{Ceilings, GpuError, PinnedReads};

/// The epoch the next launch with look-back states gets (from 1; at 2^24 the numbers start
/// again at 1 and the state buffers are cleared), so that a test can reach the wrap-around
/// in a few calls. No effect before the device is set up.
pub(super) fn set_next_epoch(next: u32) {
    if let Ok(g) = super::ready() {
        let mut ws = g.workspace.lock().unwrap_or_else(|e| e.into_inner());
        ws.epoch = next.clamp(1, EPOCH_LIMIT) - 1;
    }
}

/// Why kernel graphs were turned off in this process (see `super::kernel_graphs_off`).
pub(super) fn kernel_graphs_off() -> Option<String> {
    let g = super::ready().ok()?;
    let ws = g.workspace.lock().unwrap_or_else(|e| e.into_inner());
    ws.graph.off.clone()
}

/// The process's GPU, its workspace locked and its context bound to this thread (the
/// diagnostics below).
fn locked() -> Result<(&'static Gpu, std::sync::MutexGuard<'static, Workspace>), GpuError> {
    let g = super::ready()?;
    let ws = g
        .workspace
        .lock()
        .map_err(|_| GpuError::Broken("workspace lock poisoned".into()))?;
    g.ctx.bind_to_thread().map_err(drv("bind context"))?;
    Ok((g, ws))
}

/// See [`PinnedReads`] (diagnostics: the benchmarks print it beside the host's timings).
pub(super) fn pinned_read_probe(bytes: usize) -> Result<PinnedReads, GpuError> {
    use super::pinned_read::sum_words;
    let (g, mut ws) = locked()?;
    let words = bytes.max(1 << 20) / 8;
    let bytes = words * 8;
    let dev = ws.dev("probe_src", bytes)?;
    let cs = g.stream.cu_stream();
    // SAFETY: `dev` holds at least `bytes` bytes.
    unsafe { result::memset_d8_async(dev, 0x11, bytes, cs) }.map_err(drv("memset"))?;
    let ordinary = vec![0x1111_1111_1111_1111u64; words];
    let pin = Workspace::pinned(&mut ws.pin_out, bytes)?;
    let mut best = [f64::MAX; 4];
    let mut check = 0u64;
    for _ in 0..5 {
        for (i, streaming) in [(0, false), (1, true)] {
            // SAFETY: `pin` holds at least `bytes` bytes, read after the synchronize.
            unsafe { result::memcpy_dtoh_async(&mut pin.as_mut_slice()[..bytes], dev, cs) }
                .map_err(drv("device-to-host copy"))?;
            g.sync()?;
            let host = &pin.as_mut_slice()[..bytes];
            // SAFETY: the pinned allocation is page-aligned, so its words are aligned.
            let w = unsafe { std::slice::from_raw_parts(host.as_ptr().cast::<u64>(), words) };
            let t = Instant::now();
            check = check.wrapping_add(sum_words(w, streaming));
            best[i] = best[i].min(t.elapsed().as_secs_f64());
            let t = Instant::now();
            check = check.wrapping_add(sum_words(std::hint::black_box(&ordinary), streaming));
            best[2 + i] = best[2 + i].min(t.elapsed().as_secs_f64());
        }
    }
    std::hint::black_box(check);
    let gbs = |s: f64| bytes as f64 / s / 1e9;
    Ok(PinnedReads {
        pinned_plain_gbs: gbs(best[0]),
        pinned_stream_gbs: gbs(best[1]),
        ordinary_plain_gbs: gbs(best[2]),
        ordinary_stream_gbs: gbs(best[3]),
    })
}

/// Measure the device's copy ceilings with `bytes`-byte buffers: device-to-device (bytes
/// read plus written), pinned host-to-device and device-to-pinned-host; median of 5.
pub(super) fn measure_ceilings(bytes: usize) -> Result<Ceilings, GpuError> {
    let (g, mut ws) = locked()?;
    let bytes = bytes.max(1 << 20);
    let a = ws.dev("ceil_a", bytes)?;
    let b = ws.dev("ceil_b", bytes)?;
    let cs = g.stream.cu_stream();
    // SAFETY: `a` holds at least `bytes` bytes.
    unsafe { result::memset_d8_async(a, 0x5a, bytes, cs) }.map_err(drv("memset"))?;
    let time = |f: &dyn Fn() -> Result<(), GpuError>| -> Result<f64, GpuError> {
        let mut v = Vec::new();
        f()?; // warm-up
        for _ in 0..5 {
            let (s, e) = (g.event()?, g.event()?);
            g.record(&s)?;
            f()?;
            g.record(&e)?;
            g.sync()?;
            v.push(f64::from(s.elapsed_ms(&e).map_err(drv("event timing"))?));
        }
        v.sort_by(f64::total_cmp);
        Ok(v[2])
    };
    let d2d = time(&|| {
        // SAFETY: both buffers hold at least `bytes` bytes.
        unsafe { result::memcpy_dtod_async(b, a, bytes, cs) }.map_err(drv("device copy"))
    })?;
    let pin = Workspace::pinned(&mut ws.pin_in, bytes)?;
    let host = pin.as_mut_slice();
    host[..bytes].fill(0x3c);
    let host_ptr = host.as_mut_ptr();
    let h2d = time(&|| {
        // SAFETY: `host_ptr` points to at least `bytes` pinned bytes that outlive the
        // synchronized copy; `a` holds `bytes` bytes.
        unsafe {
            let src = std::slice::from_raw_parts(host_ptr.cast_const(), bytes);
            result::memcpy_htod_async(a, src, cs)
        }
        .map_err(drv("host-to-device copy"))
    })?;
    let d2h = time(&|| {
        // SAFETY: as above, in the other direction.
        unsafe {
            let dst = std::slice::from_raw_parts_mut(host_ptr, bytes);
            result::memcpy_dtoh_async(dst, a, cs)
        }
        .map_err(drv("device-to-host copy"))
    })?;
    ws.free_dev("ceil_");
    let gbps = |b: f64, ms: f64| b / (ms * 1e-3) / 1e9;
    Ok(Ceilings {
        d2d_gbps: gbps(2.0 * bytes as f64, d2d),
        h2d_gbps: gbps(bytes as f64, h2d),
        d2h_gbps: gbps(bytes as f64, d2h),
    })
}
