//! The CPU side of `auto`'s cost model, corrected for the host it runs on.
//!
//! The model's CPU constants ([`CPU_NS_PER_VALUE`], [`CPU_NS_PER_ROW`]) were fitted on one
//! 16-core host, and the GPU machines lent since differ from it by up to 1.5x on the same
//! query (benches/RESULTS.md: 1 M rows of two 10..100-value lists through SQL took 20.6 ms on
//! that host and 26.6-40.0 ms on H100 hosts), which moves the CPU/GPU crossing further than
//! the 5% the choice may cost. So the first time `auto` prices a call with a GPU present, the
//! CPU engine is timed on a fixed synthetic batch shaped like the model's calibration data
//! (16,384 rows of two strictly increasing `u32` lists of log-uniform length 10..100), once
//! on one thread and once split across every thread as a large batch is, and each estimate
//! of the model is scaled by the measured / modelled ratio for the threads it uses. About
//! 20 ms once per process on a 16-core host (more on fewer cores); never without a GPU.
//!
//! [`CPU_NS_PER_VALUE`]: super::backend_rule::CPU_NS_PER_VALUE
//! [`CPU_NS_PER_ROW`]: super::backend_rule::CPU_NS_PER_ROW

use std::sync::{Arc, OnceLock};
use std::time::Instant;

use datafusion::arrow::array::{Array, ListArray, UInt32Array};
use datafusion::arrow::buffer::OffsetBuffer;
use datafusion::arrow::datatypes::{DataType, Field, UInt32Type};

use super::backend_rule::{CPU_NS_PER_ROW, CPU_NS_PER_VALUE};
use crate::config::{BackendChoice, CpuKernelChoice};
use crate::functions::common::IntLists;
use crate::functions::intersect_rows::{EngineOptions, intersect_counts};

/// Measured / modelled CPU time on this host: `one_thread` for a batch run on one thread,
/// `all_threads` for a batch split across the pool (and for batches running side by side).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct HostFactors {
    pub one_thread: f64,
    pub all_threads: f64,
}

impl HostFactors {
    /// No correction.
    pub const NONE: HostFactors = HostFactors {
        one_thread: 1.0,
        all_threads: 1.0,
    };

    /// The factor for an estimate on `threads` threads.
    pub fn for_threads(&self, threads: usize) -> f64 {
        if threads <= 1 {
            self.one_thread
        } else {
            self.all_threads
        }
    }
}

/// Corrections are kept within this range: a measurement outside it (a host busy with other
/// work while it ran) must not send every later call to one device.
const CLAMP: (f64, f64) = (0.5, 2.5);

/// This host's factors, measured on first use (see the module docs).
pub fn host_factors() -> HostFactors {
    static FACTORS: OnceLock<HostFactors> = OnceLock::new();
    *FACTORS.get_or_init(|| {
        let f = measure(16_384, 3);
        log::debug!("datafusion-sets: auto's CPU model on this host: {f:?}");
        f
    })
}

/// Two columns of `rows` rows of strictly increasing lists, log-uniform 10..100 values.
fn columns(rows: usize) -> [ListArray; 2] {
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    [0, 1].map(|_| {
        let mut offsets = Vec::with_capacity(rows + 1);
        let mut values = Vec::new();
        offsets.push(0i32);
        for _ in 0..rows {
            let u = (next() >> 11) as f64 / (1u64 << 53) as f64;
            let len = (10.0 * 10f64.powf(u)) as usize;
            let mut x = 0u32;
            for _ in 0..len {
                x += 1 + (next() % 8) as u32;
                values.push(x);
            }
            offsets.push(values.len() as i32);
        }
        ListArray::new(
            Arc::new(Field::new_list_field(DataType::UInt32, true)),
            OffsetBuffer::new(offsets.into()),
            Arc::new(UInt32Array::from(values)),
            None,
        )
    })
}

/// Times the CPU count engine on `rows` synthetic rows (best of `reps` after a first run that
/// also records the rows' order, as a table queried again has) and returns the factors.
fn measure(rows: usize, reps: usize) -> HostFactors {
    let cols = columns(rows);
    let lists = [
        IntLists::<i32, u32>::new::<UInt32Type>(&cols[0]),
        IntLists::<i32, u32>::new::<UInt32Type>(&cols[1]),
    ];
    let values = (lists[0].total_values() + lists[1].total_values()) as f64;
    let model_ns = values * CPU_NS_PER_VALUE + rows as f64 * CPU_NS_PER_ROW;
    let threads = rayon::current_num_threads();
    let time = |split: bool| {
        let opts = EngineOptions {
            kernel: CpuKernelChoice::Auto,
            // Split into the pool's tasks as a large batch is, or not at all.
            parallel_min_values: usize::from(split),
            backend: BackendChoice::Cpu,
            plan: None,
            gpu_columns: None,
        };
        let mut best = f64::INFINITY;
        for _ in 0..=reps {
            let t = Instant::now();
            std::hint::black_box(intersect_counts(&lists, &opts));
            best = best.min(t.elapsed().as_nanos() as f64);
        }
        best
    };
    let one = time(false) / model_ns;
    let all = if threads > 1 {
        time(true) * threads as f64 / model_ns
    } else {
        one
    };
    HostFactors {
        one_thread: one.clamp(CLAMP.0, CLAMP.1),
        all_threads: all.clamp(CLAMP.0, CLAMP.1),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The measurement runs and yields factors within the clamp; on this machine's threads
    /// the split run is counted per thread (so a host whose threads all work at the model's
    /// rate gets 1).
    #[test]
    fn factors_are_measured_and_bounded() {
        let f = measure(2_048, 1);
        for v in [f.one_thread, f.all_threads] {
            assert!((CLAMP.0..=CLAMP.1).contains(&v), "{f:?}");
        }
        assert_eq!(f.for_threads(1), f.one_thread);
        assert_eq!(f.for_threads(16), f.all_threads);
        let [a, b] = columns(100);
        assert_eq!((a.len(), b.len()), (100, 100));
        for l in [&a, &b] {
            for i in 0..l.len() {
                let v = l.value(i);
                let v = v.as_any().downcast_ref::<UInt32Array>().unwrap();
                assert!((10..100).contains(&v.len()), "{}", v.len());
                assert!(v.values().windows(2).all(|w| w[0] < w[1]));
            }
        }
    }
}
