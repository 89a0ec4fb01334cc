//! One submission for a call's kernel launches: a CUDA graph of kernel nodes, built once for a
//! sequence of kernels and re-launched with each call's parameters.
//!
//! A two-list `wmerge` call is three launches (plan_scan, `wmerge`, `wplace`) of ~0.4 ms in
//! all on an H200, and the device waited ~25 µs of it for the host to prepare and queue them
//! (kernels/DESIGN.md, "The device waits for the host"). A graph puts the whole sequence on the
//! stream with one `cuGraphLaunch`, once the host has prepared it; the device runs its nodes
//! back to back (measured: a few µs less than the same launches one by one; "One submission
//! per call"). A `topk_bm25` batch's launches (plan, order, rank, merge, pack) go the same
//! way: its AND k 10 call of 10,000 queries took 0.25-0.27 ms with them queued one by one
//! and 0.21-0.26 ms through a graph on an H200 (kernels/DESIGN.md, "topk_bm25: a batch in one
//! submission, short AND queries a warp each").
//!
//! Graphs are kept per workspace, one per kernel sequence (function and block size of each
//! launch, in order: a call's k and its element and offset types pick it), a few at most. A
//! call whose sequence has a graph runs through it: nodes whose grid or arguments changed get
//! theirs with `cuGraphExecKernelNodeSetParams` (a few of them per call: the look-back epochs
//! change every time), then one launch. A sequence seen for the first time is launched one by
//! one and remembered; its graph is built when a later call repeats it, so a sequence seen
//! once costs no graph. A failing graph call turns graphs off for the workspace (the kernels
//! are then launched one by one: none of the call's kernels was queued yet).

use std::ffi::c_void;
use std::ptr;

use cudarc::driver::sys;

use super::GpuError;
use super::runtime::drv;

/// A kernel argument by value (the kernels take 32- and 64-bit scalars and device pointers).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Word {
    U32(u32),
    U64(u64),
}

impl From<u32> for Word {
    fn from(v: u32) -> Self {
        Word::U32(v)
    }
}

impl From<u64> for Word {
    fn from(v: u64) -> Self {
        Word::U64(v)
    }
}

impl Word {
    fn addr(&self) -> *mut c_void {
        match self {
            Word::U32(v) => ptr::from_ref(v).cast_mut().cast(),
            Word::U64(v) => ptr::from_ref(v).cast_mut().cast(),
        }
    }
}

/// One kernel launch: function, grid and block (one dimension each), arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Launch {
    pub(crate) f: sys::CUfunction,
    pub(crate) grid: u32,
    pub(crate) block: u32,
    pub(crate) args: Vec<Word>,
}

impl Launch {
    /// The argument addresses the driver reads (valid while `self` is borrowed).
    pub(crate) fn addrs(&self) -> Vec<*mut c_void> {
        self.args.iter().map(Word::addr).collect()
    }

    fn node_params(&self, addrs: &mut [*mut c_void]) -> sys::CUDA_KERNEL_NODE_PARAMS_v2 {
        sys::CUDA_KERNEL_NODE_PARAMS_v2 {
            func: self.f,
            gridDimX: self.grid.max(1),
            gridDimY: 1,
            gridDimZ: 1,
            blockDimX: self.block,
            blockDimY: 1,
            blockDimZ: 1,
            sharedMemBytes: 0,
            kernelParams: addrs.as_mut_ptr(),
            extra: ptr::null_mut(),
            kern: ptr::null_mut(),
            ctx: ptr::null_mut(),
        }
    }

    fn same_kernel(&self, other: &Launch) -> bool {
        self.f == other.f && self.block == other.block
    }
}

/// An instantiated graph: a chain of kernel nodes and the launches they hold now.
struct Built {
    graph: sys::CUgraph,
    exec: sys::CUgraphExec,
    nodes: Vec<sys::CUgraphNode>,
    now: Vec<Launch>,
    /// Whether the graph records a span's events (event nodes at its ends).
    spanned: bool,
}

impl Drop for Built {
    fn drop(&mut self) {
        // SAFETY: both handles were created by `Built::new` and are destroyed once, here.
        // (Errors are ignored: the process may be tearing the context down.)
        unsafe {
            let _ = sys::cuGraphExecDestroy(self.exec);
            let _ = sys::cuGraphDestroy(self.graph);
        }
    }
}

impl Built {
    /// # Safety
    /// Each launch's arguments must match its kernel's parameter list (the graph keeps them
    /// for later launches).
    unsafe fn new(
        launches: &[Launch],
        span: Option<(sys::CUevent, sys::CUevent)>,
    ) -> Result<Self, GpuError> {
        let mut graph: sys::CUgraph = ptr::null_mut();
        // SAFETY: plain creation; the context is bound by the caller.
        unsafe { sys::cuGraphCreate(&mut graph, 0) }
            .result()
            .map_err(drv("graph create"))?;
        let mut built = Built {
            graph,
            exec: ptr::null_mut(),
            nodes: Vec::with_capacity(launches.len()),
            now: launches.to_vec(),
            spanned: span.is_some(),
        };
        // The span's first event, then the kernels, then its second event, in a chain.
        let mut last: sys::CUgraphNode = ptr::null_mut();
        if let Some(span) = span {
            // SAFETY: the event outlives the graph (the caller's contract); no dependencies.
            unsafe {
                sys::cuGraphAddEventRecordNode(&mut last, built.graph, ptr::null(), 0, span.0)
            }
            .result()
            .map_err(drv("graph event node"))?;
        }
        for l in launches {
            let mut addrs = l.addrs();
            let params = l.node_params(&mut addrs);
            let mut node: sys::CUgraphNode = ptr::null_mut();
            let deps = usize::from(!last.is_null());
            // SAFETY: `params` points at `addrs`, which point at `l`'s words, all alive for
            // the call (the driver copies the argument values); the one dependency is the
            // previous node of this graph.
            unsafe { sys::cuGraphAddKernelNode_v2(&mut node, built.graph, &last, deps, &params) }
                .result()
                .map_err(drv("graph kernel node"))?;
            built.nodes.push(node);
            last = node;
        }
        if let Some(span) = span {
            let mut end: sys::CUgraphNode = ptr::null_mut();
            // SAFETY: as the first event node; after the last kernel.
            unsafe { sys::cuGraphAddEventRecordNode(&mut end, built.graph, &last, 1, span.1) }
                .result()
                .map_err(drv("graph event node"))?;
        }
        let mut exec: sys::CUgraphExec = ptr::null_mut();
        // SAFETY: `built.graph` is complete; `exec` is destroyed with it.
        unsafe { sys::cuGraphInstantiateWithFlags(&mut exec, built.graph, 0) }
            .result()
            .map_err(drv("graph instantiate"))?;
        built.exec = exec;
        Ok(built)
    }

    fn fits(&self, launches: &[Launch], spanned: bool) -> bool {
        self.spanned == spanned
            && self.now.len() == launches.len()
            && self.now.iter().zip(launches).all(|(a, b)| a.same_kernel(b))
    }

    /// # Safety
    /// As [`Built::new`]; `launches` fit this graph.
    unsafe fn launch(
        &mut self,
        launches: &[Launch],
        stream: sys::CUstream,
        before: impl FnOnce() -> Result<(), GpuError>,
        times: &mut GraphCallTimes,
    ) -> Result<(), GpuError> {
        let t0 = std::time::Instant::now();
        for (i, l) in launches.iter().enumerate() {
            if self.now[i] == *l {
                continue;
            }
            let mut addrs = l.addrs();
            let params = l.node_params(&mut addrs);
            // SAFETY: as in `new`; the node belongs to the graph `exec` was made from, and
            // its function is unchanged (`fits`). Launches already queued keep their values.
            unsafe { sys::cuGraphExecKernelNodeSetParams_v2(self.exec, self.nodes[i], &params) }
                .result()
                .map_err(drv("graph kernel node update"))?;
            self.now[i] = l.clone();
            times.updated += 1;
        }
        times.update_ms = t0.elapsed().as_secs_f64() * 1e3;
        before()?;
        let t1 = std::time::Instant::now();
        // SAFETY: every node holds this call's launch.
        let r = unsafe { sys::cuGraphLaunch(self.exec, stream) }
            .result()
            .map_err(drv("graph launch"));
        times.launch_ms = t1.elapsed().as_secs_f64() * 1e3;
        r
    }
}

/// Graphs kept per workspace (one per kernel sequence: k and the element and offset types
/// pick it for `wmerge`, the path and whether a split query needs the merge for
/// `topk_bm25`), the most recently used first.
const GRAPHS_KEPT: usize = 4;
/// Kernel sequences remembered without a graph (seen once).
const SEQUENCES_SEEN: usize = 8;

/// Host time of the last call through a built graph: its nodes' parameters set (and how
/// many nodes changed), then `cuGraphLaunch`.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct GraphCallTimes {
    pub(crate) update_ms: f64,
    pub(crate) launch_ms: f64,
    pub(crate) updated: u32,
}

/// A workspace's graphs and what it needs to decide when to build one.
#[derive(Default)]
pub(crate) struct LaunchGraph {
    /// The last call through a built graph.
    pub(crate) last: GraphCallTimes,
    built: Vec<Built>,
    /// Kernel sequences (function and block of each launch) seen once, oldest first.
    seen: Vec<Vec<(usize, u32)>>,
    /// Why graphs were turned off for the workspace (the failing graph call), if they were.
    pub(crate) off: Option<String>,
}

// SAFETY: the graph handles are owned, used only under the workspace mutex.
unsafe impl Send for LaunchGraph {}

impl LaunchGraph {
    /// Queue `launches` on `stream`, in order: through a graph when a call with the same
    /// kernels came before (unless graphs are off: the knob `gpu_graph`), else one by one
    /// through `one`. `before` runs once, right before the first thing is queued (a graph's
    /// parameters are set by then), told whether a graph is about to run them. A graph
    /// records `span`'s events, if any, before its first kernel and after its last (the
    /// events must outlive this `LaunchGraph`; graphs with and without them are kept apart:
    /// event nodes cost `cuGraphLaunch` ~3 µs each on the H200 hosts). Whether a graph ran the
    /// launches.
    ///
    /// # Safety
    /// Each launch's arguments must match its kernel's parameter list, and every device
    /// pointer among them must be valid for the accesses the kernel makes.
    pub(crate) unsafe fn submit(
        &mut self,
        launches: &[Launch],
        stream: sys::CUstream,
        enabled: bool,
        span: Option<(sys::CUevent, sys::CUevent)>,
        before: impl FnOnce(bool) -> Result<(), GpuError>,
        mut one: impl FnMut(&Launch) -> Result<(), GpuError>,
    ) -> Result<bool, GpuError> {
        let mut before = Some(before);
        if enabled && self.off.is_none() && !launches.is_empty() {
            // SAFETY: the caller's contract, passed on.
            match unsafe { self.try_graph(launches, stream, span, &mut before) } {
                Ok(true) => return Ok(true),
                Ok(false) => {}
                Err(e) => {
                    log::debug!("datafusion-sets: kernel graphs off for this workspace: {e}");
                    self.off = Some(e.to_string());
                    self.built.clear();
                }
            }
        }
        if let Some(b) = before.take() {
            b(false)?;
        }
        launches.iter().try_for_each(&mut one)?;
        Ok(false)
    }

    /// Launches through a graph (building it for a sequence seen before); `false` when the
    /// kernels should be launched one by one instead (nothing queued then).
    unsafe fn try_graph<B: FnOnce(bool) -> Result<(), GpuError>>(
        &mut self,
        launches: &[Launch],
        stream: sys::CUstream,
        span: Option<(sys::CUevent, sys::CUevent)>,
        before: &mut Option<B>,
    ) -> Result<bool, GpuError> {
        let run_before = |before: &mut Option<B>| before.take().map_or(Ok(()), |b| b(true));
        if let Some(i) = self
            .built
            .iter()
            .position(|b| b.fits(launches, span.is_some()))
        {
            let b = self.built.remove(i);
            self.built.insert(0, b);
            self.last = GraphCallTimes::default();
            // SAFETY: the caller's contract; the graph fits the launches (`fits`).
            unsafe {
                self.built[0].launch(launches, stream, || run_before(before), &mut self.last)?
            };
            return Ok(true);
        }
        let kernels: Vec<(usize, u32)> = launches.iter().map(|l| (l.f as usize, l.block)).collect();
        let Some(i) = self.seen.iter().position(|s| *s == kernels) else {
            if self.seen.len() == SEQUENCES_SEEN {
                self.seen.remove(0);
            }
            self.seen.push(kernels);
            return Ok(false);
        };
        self.seen.remove(i);
        // SAFETY: the caller's contract, passed on.
        let b = unsafe { Built::new(launches, span)? };
        run_before(before)?;
        // SAFETY: the nodes hold this call's launches already (made from them above).
        unsafe { sys::cuGraphLaunch(b.exec, stream) }
            .result()
            .map_err(drv("graph launch"))?;
        self.built.truncate(GRAPHS_KEPT - 1);
        self.built.insert(0, b);
        Ok(true)
    }
}
