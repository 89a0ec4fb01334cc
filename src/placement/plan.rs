//! The backend a planned call of `list_intersect` / `list_intersect_count` runs on, chosen
//! at planning time by `optimizer::backend_rule`, and what the call did (for `EXPLAIN
//! ANALYZE`, through `optimizer::backend_exec`).

use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};

use crate::config::BackendChoice;

/// A planning-time choice: the backend (`Cpu` or `Gpu`), why, and the call's counters.
#[derive(Debug)]
pub struct BackendPlan {
    pub backend: BackendChoice,
    pub reason: String,
    pub metrics: BackendMetrics,
    /// `auto` chose the CPU, but a batch whose list columns an earlier call met (a table
    /// queried again) runs on the GPU, its columns kept there, when the cost model prices
    /// the batch faster on device-resident columns than on the CPU.
    pub resident_on_gpu: bool,
    /// The memory pool of the query that runs the call, and the consumer name to reserve
    /// under (set by `SetsBackendExec::execute` from its `TaskContext`): a GPU call reserves
    /// the host memory it stages through there for as long as it runs, and runs on the CPU
    /// when the pool refuses.
    pool: Mutex<Option<(Arc<dyn MemoryPool>, String)>>,
}

impl BackendPlan {
    pub fn new(backend: BackendChoice, reason: impl Into<String>) -> Self {
        Self {
            backend,
            reason: reason.into(),
            metrics: BackendMetrics::default(),
            resident_on_gpu: false,
            pool: Mutex::new(None),
        }
    }

    /// Binds the call to the memory pool of the query executing it; GPU work reserves under
    /// `consumer` (e.g. `list_intersect[gpu]`).
    pub fn bind_pool(&self, pool: &Arc<dyn MemoryPool>, consumer: &str) {
        let mut slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        if slot.as_ref().is_none_or(|(p, _)| !Arc::ptr_eq(p, pool)) {
            *slot = Some((Arc::clone(pool), consumer.to_string()));
        }
    }

    /// An empty reservation in the bound pool, `None` when the call was not bound to one
    /// (a function invoked outside a planned query).
    pub fn reservation(&self) -> Option<MemoryReservation> {
        let slot = self.pool.lock().unwrap_or_else(|p| p.into_inner());
        slot.as_ref()
            .map(|(pool, name)| MemoryConsumer::new(name.clone()).register(pool))
    }
}

/// Host memory a GPU call holds, kept within a reservation when there is one: `hold(bytes)`
/// asks to hold `bytes` in all (not more), `false` when the pool refuses. With no
/// reservation every request is granted (a function invoked outside a planned query).
pub(crate) fn holder(r: &Option<MemoryReservation>) -> impl FnMut(usize) -> bool + '_ {
    move |bytes| r.as_ref().is_none_or(|r| r.try_resize(bytes).is_ok())
}

/// Counters of one planned call, summed over its batches and partitions.
#[derive(Debug, Default)]
pub struct BackendMetrics {
    /// Rows computed.
    pub rows: AtomicU64,
    /// Batches computed on the CPU (including batches the GPU could not take).
    pub cpu_batches: AtomicU64,
    /// Batches sent to the GPU.
    pub gpu_batches: AtomicU64,
    /// Device launch groups (a batch larger than the device's buffers is split).
    pub gpu_launches: AtomicU64,
    /// Rows the GPU flagged and the CPU recomputed.
    pub gpu_rows_redone: AtomicU64,
    /// Nanoseconds in CPU batches.
    pub cpu_ns: AtomicU64,
    /// Nanoseconds in device kernels.
    pub kernel_ns: AtomicU64,
    /// Nanoseconds in whole GPU calls (staging, copies, kernels).
    pub gpu_ns: AtomicU64,
    /// Bytes copied to the device.
    pub h2d_bytes: AtomicU64,
    /// Bytes copied back from the device.
    pub d2h_bytes: AtomicU64,
    /// List arguments the GPU read from copies kept on the device (no copy).
    pub gpu_columns_reused: AtomicU64,
    /// List arguments copied whole to the device and kept there for later batches.
    pub gpu_columns_uploaded: AtomicU64,
}

impl BackendMetrics {
    pub fn add(counter: &AtomicU64, v: u64) {
        counter.fetch_add(v, Relaxed);
    }
    pub fn get(counter: &AtomicU64) -> u64 {
        counter.load(Relaxed)
    }

    /// Counts what GPU work did: `rows` rows in `batches` device calls, `redone` of them
    /// recomputed on the CPU, and the calls' summed timings (launches, kernel and whole-call
    /// time, bytes each way, list columns reused or uploaded).
    pub fn record_gpu(
        &self,
        rows: u64,
        batches: u64,
        redone: u64,
        t: &crate::backend::gpu::Timings,
    ) {
        Self::add(&self.rows, rows);
        Self::add(&self.gpu_batches, batches);
        Self::add(&self.gpu_launches, t.chunks as u64);
        Self::add(&self.gpu_rows_redone, redone);
        Self::add(&self.kernel_ns, (t.kernel_ms * 1e6) as u64);
        Self::add(&self.gpu_ns, (t.total_ms * 1e6) as u64);
        Self::add(&self.h2d_bytes, t.h2d_bytes);
        Self::add(&self.d2h_bytes, t.d2h_bytes);
        Self::add(&self.gpu_columns_reused, t.columns_reused as u64);
        Self::add(&self.gpu_columns_uploaded, t.columns_uploaded as u64);
    }
}

/// The planning-time choice a function instance is bound to, if any. Compared and hashed by
/// identity, so UDF structs holding one can derive `PartialEq`, `Eq` and `Hash`.
#[derive(Clone, Debug, Default)]
pub struct PlanSlot(pub Option<Arc<BackendPlan>>);

impl PartialEq for PlanSlot {
    fn eq(&self, o: &Self) -> bool {
        match (&self.0, &o.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}
impl Eq for PlanSlot {}
impl Hash for PlanSlot {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0
            .as_ref()
            .map_or(0, |p| Arc::as_ptr(p) as usize)
            .hash(state);
    }
}
