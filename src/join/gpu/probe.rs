//! The whole similarity join on the device (`probe_join` in `kernels/simjoin.cu`): the host
//! side, the CUDA implementation of [`super::JoinProber`].
//!
//! - [`upload_index`] copies the join's prefix indexes (and each set's side, for an R-S
//!   join) next to its sets, once per join.
//! - [`probe`] runs the filter and the verification of a range of probe sets: one launch (a
//!   warp per probe set, claimed from a counter), the counters back, then the passing pairs
//!   (probe set, partner, overlap) when the caller wants them and they fit its capacity. A
//!   range whose pairs do not fit is answered with their count only, and the caller splits
//!   it. Calls from several threads run at once, each on a lane of its own (the lanes of the
//!   verification, `simjoin.rs`).

use std::sync::Arc;
use std::time::Instant;

use cudarc::driver::result;

use super::simjoin::{
    Sets, bytes_of_mut, free_on_device, give_back, guarded, take_lane, upload_staged,
};
use super::{IndexView, Probed, VerifyTimings};
use crate::backend::gpu::{
    DevBuf, GpuError, Workspace, align, arg, bytes_of, drv, launch_on, view,
};
use crate::intersect::similarity::Measure;
use crate::join::threshold::{Comparison, Threshold};

/// Threads of a `probe_join` block (`PROBE_THREADS` in the source): four warps, each a probe
/// set at a time.
pub(super) const PROBE_THREADS: u32 = 128;
/// `probe_join`'s counters: probe sets claimed, passing pairs, the malformed-input flag,
/// candidates verified.
const COUNTERS: usize = 4;
/// A pair as the kernel writes it: probe set, partner, overlap.
const PAIR_WORDS: usize = 3;

/// One join's prefix indexes on the device, beside its sets (freed when dropped).
pub(crate) struct Index {
    sets: Arc<Sets>,
    /// Each set's side (an R-S join; `None` for a self-join).
    sides: Option<DevBuf>,
    /// Per index: the offsets (`vocab + 1`, u64) and the postings (3 u32 each).
    offsets: [Option<DevBuf>; 2],
    postings: [Option<DevBuf>; 2],
    vocab: u32,
    self_join: bool,
    bytes: u64,
}

impl std::fmt::Debug for Index {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceJoin")
            .field("sets", &self.sets.len())
            .field("self_join", &self.self_join)
            .field("bytes", &self.bytes)
            .finish()
    }
}

impl Index {
    pub(super) fn bytes(&self) -> u64 {
        self.bytes
    }
}

impl Drop for Index {
    fn drop(&mut self) {
        let [o0, o1] = &mut self.offsets;
        let [q0, q1] = &mut self.postings;
        free_on_device(&mut [&mut self.sides, o0, o1, q0, q1]);
    }
}

/// Copy the join's prefix indexes to the device: one for a self-join, else one per side
/// (index 0 over side 0's sets, read by side 1's probes, and the other way round), with each
/// set's side. The sets are `sets`' (already on the device).
pub(super) fn upload_index(
    sets: &Arc<Sets>,
    sides: &[u8],
    indexes: &[IndexView<'_>],
) -> Result<Index, GpuError> {
    let bad = |why: &str| Err(GpuError::Unsupported(format!("join index: {why}")));
    if indexes.is_empty() || indexes.len() > 2 {
        return bad("one or two indexes");
    }
    if sides.len() != sets.len() || sets.len() >= u32::MAX as usize {
        return bad("one side per set");
    }
    let vocab = indexes[0].offsets.len().saturating_sub(1);
    for ix in indexes {
        let (off, post) = (ix.offsets, ix.postings);
        if off.len() != vocab + 1
            || off.first() != Some(&0)
            || off.windows(2).any(|w| w[0] > w[1])
            || off[vocab].checked_mul(PAIR_WORDS) != Some(post.len())
        {
            return bad("malformed offsets");
        }
    }
    if vocab >= u32::MAX as usize {
        return bad("too many tokens");
    }
    let self_join = indexes.len() == 1;
    let offsets: Vec<Vec<u64>> = indexes
        .iter()
        .map(|ix| ix.offsets.iter().map(|&o| o as u64).collect())
        .collect();
    let mut parts: Vec<&[u8]> = Vec::with_capacity(5);
    if !self_join {
        parts.push(sides);
    }
    for (ix, off) in indexes.iter().zip(&offsets) {
        parts.push(bytes_of(off));
        parts.push(bytes_of(ix.postings));
    }
    let bytes = parts.iter().map(|p| p.len() as u64).sum();
    let mut bufs = upload_staged(&parts, "join index")?.into_iter();
    let sides = if self_join { None } else { bufs.next() };
    let (off0, post0) = (bufs.next(), bufs.next());
    let (off1, post1) = (bufs.next(), bufs.next());
    Ok(Index {
        sets: Arc::clone(sets),
        sides,
        offsets: [off0, off1],
        postings: [post0, post1],
        vocab: vocab as u32,
        self_join,
        bytes,
    })
}

/// The kernel's code for a measure (`M_*` in the source).
fn measure_code(m: Measure) -> i32 {
    match m {
        Measure::Jaccard => 0,
        Measure::Cosine => 1,
        Measure::Dice => 2,
        Measure::Overlap => 3,
    }
}

/// Filter and verify probe sets `p0..p1` (global positions) on the device: every pair of a
/// probe set with a set before it (of the other side, for an R-S join) that passes
/// `threshold`. With `emit`, the pairs come back when at most `cap` passed; else only their
/// count (`Probed::overflow` says which).
pub(super) fn probe(
    index: &Index,
    threshold: &Threshold,
    (p0, p1): (usize, usize),
    exact: bool,
    emit: bool,
    cap: usize,
) -> Result<Probed, GpuError> {
    let sets = index.sets.len();
    if p0 > p1 || p1 > sets || cap >= (u32::MAX as usize) / PAIR_WORDS {
        return Err(GpuError::Unsupported("probe range out of the sets".into()));
    }
    if p0 == p1 {
        return Ok(Probed::default());
    }
    let started = Instant::now();
    let (g, k, lane) = take_lane()?;
    let (lane, answer) = guarded(g, lane, |lane| {
        let mut t = VerifyTimings::default();
        let stream = &lane.stream;
        let cs = stream.cu_stream();
        let ws = &mut lane.ws;
        let cnt_bytes = align(COUNTERS * 4);
        let out_cap = if emit { cap } else { 0 };
        let d_out = ws.dev("pj_out", cnt_bytes + out_cap * PAIR_WORDS * 4)?;
        let (e1, e2) = (g.event()?, g.event()?);
        // SAFETY: the counters are the first `COUNTERS * 4` bytes of `d_out`.
        unsafe { result::memset_d8_async(d_out, 0, COUNTERS * 4, cs) }.map_err(drv("memset"))?;
        e1.record(stream).map_err(drv("event record"))?;
        let ptr = |b: &Option<DevBuf>| b.as_ref().map_or(0, |b| b.ptr);
        let (p_tokens, p_starts) = (ptr(&index.sets.tokens), ptr(&index.sets.starts));
        let p_sides = ptr(&index.sides);
        let (p_off0, p_post0) = (ptr(&index.offsets[0]), ptr(&index.postings[0]));
        let (p_off1, p_post1) = if index.self_join {
            (p_off0, p_post0)
        } else {
            (ptr(&index.offsets[1]), ptr(&index.postings[1]))
        };
        let sets32 = sets as u32;
        let self_join = i32::from(index.self_join);
        let vocab = index.vocab;
        let measure = measure_code(threshold.measure());
        let value = threshold.value();
        let gt = i32::from(threshold.comparison() == Comparison::Gt);
        let (p0_32, p1_32) = (p0 as u32, p1 as u32);
        let (exact32, emit32) = (i32::from(exact), i32::from(emit));
        let cap32 = out_cap as u32;
        let p_cnt = d_out;
        let p_pairs = d_out + cnt_bytes as u64;
        let warps_per_block = (PROBE_THREADS / 32) as usize;
        let grid = ((p1 - p0).div_ceil(warps_per_block) as u32).min(k.probe_grid.max(1));
        // SAFETY: the parameters match `probe_join` in kernels/simjoin.cu. The sets' buffers
        // hold every set's tokens and `sets + 1` starts; each index holds `vocab + 1` offsets
        // (ascending, the last times 3 the postings' length: checked at upload) and its
        // postings; `sides` holds a byte per set (read only for an R-S join); the kernel
        // checks each posting's set, position and size against the sets before reading
        // through them. The output holds the counters (zeroed above) and `cap` pairs of 3
        // u32, and the kernel writes a pair only below `cap`.
        unsafe {
            launch_on(
                stream,
                &k.probe,
                grid,
                PROBE_THREADS,
                &mut [
                    arg(&p_tokens),
                    arg(&p_starts),
                    arg(&sets32),
                    arg(&p_sides),
                    arg(&self_join),
                    arg(&p_off0),
                    arg(&vocab),
                    arg(&p_post0),
                    arg(&p_off1),
                    arg(&vocab),
                    arg(&p_post1),
                    arg(&measure),
                    arg(&value),
                    arg(&gt),
                    arg(&p0_32),
                    arg(&p1_32),
                    arg(&exact32),
                    arg(&emit32),
                    arg(&p_cnt),
                    arg(&cap32),
                    arg(&p_pairs),
                ],
            )?;
        }
        e2.record(stream).map_err(drv("event record"))?;
        let pin = Workspace::pinned(&mut ws.pin_out, cnt_bytes)?;
        // SAFETY: the counters into the pinned buffer, read after the wait.
        unsafe {
            result::memcpy_dtoh_async(&mut pin.as_mut_slice()[..COUNTERS * 4], p_cnt, cs)
                .map_err(drv("device-to-host copy"))?;
        }
        let waited = Instant::now();
        g.wait_asleep(stream)?;
        let mut counters = [0u32; COUNTERS];
        bytes_of_mut(&mut counters).copy_from_slice(&pin.as_slice()[..COUNTERS * 4]);
        t.d2h_bytes = (COUNTERS * 4) as u64;
        if counters[2] != 0 {
            return Err(GpuError::Kernel(
                "similarity-join probe met a malformed posting or set".into(),
            ));
        }
        let passed = counters[1] as usize;
        let mut out = Probed {
            passed: passed as u64,
            verified: u64::from(counters[3]),
            // Pairs past the capacity were not written; a count near 2^32 may have wrapped:
            // the caller splits the range either way.
            overflow: (emit && passed > out_cap) || passed >= (1 << 31),
            ..Probed::default()
        };
        if emit && !out.overflow && passed > 0 {
            let bytes = passed * PAIR_WORDS * 4;
            let pin = Workspace::pinned(&mut ws.pin_out, bytes)?;
            // SAFETY: `passed` pairs (within the output's `cap`) into the pinned buffer, read
            // after the wait.
            unsafe {
                result::memcpy_dtoh_async(&mut pin.as_mut_slice()[..bytes], p_pairs, cs)
                    .map_err(drv("device-to-host copy"))?;
            }
            g.wait_asleep(stream)?;
            t.d2h_bytes += bytes as u64;
            let words = view::<u32>(&pin.as_slice()[..bytes]);
            out.pairs = words
                .chunks_exact(PAIR_WORDS)
                .map(|w| (w[0], w[1], w[2]))
                .collect();
            if out
                .pairs
                .iter()
                .any(|&(p, q, _)| (p as usize) < p0 || (p as usize) >= p1 || q >= p)
            {
                return Err(GpuError::Kernel(
                    "similarity-join probe answered a pair out of its range".into(),
                ));
            }
        }
        t.wait_ms = waited.elapsed().as_secs_f64() * 1e3;
        t.kernel_ms = f64::from(e1.elapsed_ms(&e2).map_err(drv("event timing"))?);
        out.timings = t;
        Ok(out)
    })?;
    give_back(lane);
    let mut answer = answer;
    answer.timings.total_ms = started.elapsed().as_secs_f64() * 1e3;
    Ok(answer)
}
