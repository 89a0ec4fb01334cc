// Probe (device machine only): what a topk_bm25 call could save by queueing its graph on a
// second host thread while the calling thread writes the batch, the device held back by a
// stream wait on a word the host sets once the batch is written.
//
//   nvcc -O2 -std=c++17 -arch=sm_90 -o /tmp/launch_overlap scripts/gpu/probes/launch_overlap.cu -lcuda
//   /tmp/launch_overlap
//
// Prints medians (µs) of: cuGraphLaunch's host time for graphs shaped like the AND batch's
// (kernel nodes between two event records), with and without one node's parameters changed
// first; the hand-off between two host threads (spinning, parked); and a simulated call (a
// fill of the batch's size into page-locked memory, then a graph whose first kernel runs
// for the AND batch's device window) serial, gated on one thread, and gated with the launch
// on a helper thread.
#include <cuda.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <thread>
#include <vector>

#define CK(x)                                                                        \
    do {                                                                             \
        cudaError_t e_ = (x);                                                        \
        if (e_ != cudaSuccess) {                                                     \
            std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            std::exit(1);                                                            \
        }                                                                            \
    } while (0)
#define CD(x)                                                          \
    do {                                                               \
        CUresult r_ = (x);                                             \
        if (r_ != CUDA_SUCCESS) {                                      \
            const char* s_ = nullptr;                                  \
            cuGetErrorString(r_, &s_);                                 \
            std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, s_); \
            std::exit(1);                                              \
        }                                                              \
    } while (0)

using Clock = std::chrono::steady_clock;
static double us(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration<double, std::micro>(b - a).count();
}
static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}
static void busy(double micros) {
    auto t0 = Clock::now();
    while (us(t0, Clock::now()) < micros) {
    }
}

__global__ void work(unsigned long long ns, unsigned* sink, const unsigned* in) {
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (ns == 0) {
        if (in && threadIdx.x == 0 && blockIdx.x == 0) sink[1] = in[0];
        return;
    }
    do {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    } while (t - t0 < ns);
    if (threadIdx.x == 0 && blockIdx.x == 0) sink[0] += in ? in[0] : 1u;
}

// A kernel of 25 pointer-sized parameters (as `bm25_plan`'s), doing nothing.
__global__ void wide(unsigned long long a0, unsigned long long a1, unsigned long long a2,
                     unsigned long long a3, unsigned long long a4, unsigned long long a5,
                     unsigned long long a6, unsigned long long a7, unsigned long long a8,
                     unsigned long long a9, unsigned long long a10, unsigned long long a11,
                     unsigned long long a12, unsigned long long a13, unsigned long long a14,
                     unsigned long long a15, unsigned long long a16, unsigned long long a17,
                     unsigned long long a18, unsigned long long a19, unsigned long long a20,
                     unsigned long long a21, unsigned long long a22, unsigned long long a23,
                     unsigned* sink) {
    if (threadIdx.x == 0 && blockIdx.x == 0 && a0 == 12345) sink[0] = (unsigned)(a23 + a11);
}

// cuGraphLaunch's host time for five kernel nodes shaped as the AND batch's graph (grids 1,
// 40, 1, `big`, 40), of 25 parameters each or of 1, with one node's parameters set per call.
static void wide_graph(cudaStream_t s, unsigned* sink, bool wide_args, unsigned big, int n) {
    const unsigned grids[] = {1, 40, 1, big, 40};
    cudaGraph_t g;
    CK(cudaGraphCreate(&g, 0));
    unsigned long long v[24];
    for (int i = 0; i < 24; i++) v[i] = i;
    void* wargs[25];
    for (int i = 0; i < 24; i++) wargs[i] = &v[i];
    wargs[24] = &sink;
    unsigned long long zero = 0;
    const unsigned* nul = nullptr;
    void* nargs[] = {&zero, &sink, &nul};
    std::vector<cudaGraphNode_t> nodes;
    cudaGraphNode_t last{};
    for (int i = 0; i < 5; i++) {
        cudaKernelNodeParams p{};
        p.func = wide_args ? (void*)wide : (void*)work;
        p.gridDim = dim3(grids[i]);
        p.blockDim = dim3(256);
        p.kernelParams = wide_args ? wargs : nargs;
        cudaGraphNode_t nd;
        CK(cudaGraphAddKernelNode(&nd, g, i ? &last : nullptr, i ? 1 : 0, &p));
        nodes.push_back(nd);
        last = nd;
    }
    cudaGraphExec_t x;
    CK(cudaGraphInstantiate(&x, g, 0));
    std::vector<double> l;
    for (int i = 0; i < n + 20; i++) {
        v[5] = i;
        cudaKernelNodeParams p{};
        p.func = wide_args ? (void*)wide : (void*)work;
        p.gridDim = dim3(40);
        p.blockDim = dim3(256);
        p.kernelParams = wide_args ? wargs : nargs;
        CK(cudaGraphExecKernelNodeSetParams(x, nodes[4], &p));
        auto t0 = Clock::now();
        CK(cudaGraphLaunch(x, s));
        auto t1 = Clock::now();
        CK(cudaStreamSynchronize(s));
        if (i >= 20) l.push_back(us(t0, t1));
        busy(100);
    }
    std::printf("5 kernel nodes, %s parameters, largest grid %u: cuGraphLaunch %.2f us\n",
                wide_args ? "25" : "3", big, median(l));
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
}

// The same with the kernel's start held until the previous kernel's memory is visible
// (programmatic dependent launch: the kernel may be launched before the previous one ends).
// stamp[0] = the first kernel's start, stamp[1] = the last kernel's end (global timer).
__global__ void work_pdl(unsigned long long ns, unsigned* sink, const unsigned* in,
                         unsigned long long* stamp, int last) {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    unsigned long long t0, t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
    if (ns != 0 && threadIdx.x == 0 && blockIdx.x == 0) stamp[0] = t0;
    while (ns != 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        if (t - t0 >= ns) break;
    }
    if (ns != 0 && threadIdx.x == 0 && blockIdx.x == 0) sink[0] += in ? in[0] : 1u;
    if (last && threadIdx.x == 0) {
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        atomicMax(stamp + 1, t);
    }
}

// Six kernels (grids as below) captured from a stream, with or without programmatic edges;
// the window from the kernels' own stamps.
static double stamped_window(cudaStream_t s, bool pdl, unsigned long long first_ns, unsigned* sink,
                             const unsigned* in, unsigned long long* stamp, int n) {
    static const unsigned grids[] = {40, 1, 2048, 64, 8, 8};
    cudaGraph_t g;
    cudaGraphExec_t x;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    for (int i = 0; i < 6; i++) {
        unsigned long long ns = i == 0 ? first_ns : 0;
        int last = i == 5;
        cudaLaunchConfig_t cfg{};
        cfg.gridDim = dim3(grids[i]);
        cfg.blockDim = dim3(128);
        cfg.stream = s;
        cudaLaunchAttribute at[1];
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = (pdl && i > 0) ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, work_pdl, ns, sink, in, stamp, last));
    }
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&x, g, 0));
    std::vector<double> v, l;
    unsigned long long h[2];
    for (int i = 0; i < n; i++) {
        busy(200);
        CK(cudaMemsetAsync(stamp, 0, 16, s));
        CK(cudaStreamSynchronize(s));
        auto t0 = Clock::now();
        CK(cudaGraphLaunch(x, s));
        auto t1 = Clock::now();
        CK(cudaStreamSynchronize(s));
        CK(cudaMemcpy(h, stamp, 16, cudaMemcpyDeviceToHost));
        v.push_back((h[1] - h[0]) / 1e3);
        l.push_back(us(t0, t1));
    }
    CK(cudaGraphExecDestroy(x));
    CK(cudaGraphDestroy(g));
    std::printf("6 kernels captured%s: cuGraphLaunch %.2f us, first kernel's start to last's end %.2f us\n",
                pdl ? ", programmatic edges" : "", median(l), median(v));
    return median(v);
}

// A graph: event record, kernels (grids as the AND batch's plan, order, ranking launches and
// pack), event record. The first kernel runs `first_ns`.
struct G {
    cudaGraph_t g;
    cudaGraphExec_t x;
    std::vector<cudaGraphNode_t> nodes;
};
static G build(int n_kernels, bool events, unsigned long long first_ns, unsigned* sink,
               const unsigned* in, cudaEvent_t e0, cudaEvent_t e1) {
    static const unsigned grids[] = {40, 1, 2048, 1100, 140, 64, 8, 8};
    G r{};
    CK(cudaGraphCreate(&r.g, 0));
    cudaGraphNode_t last{};
    bool have_last = false;
    if (events) {
        CK(cudaGraphAddEventRecordNode(&last, r.g, nullptr, 0, e0));
        have_last = true;
    }
    for (int i = 0; i < n_kernels; i++) {
        unsigned long long ns = i == 0 ? first_ns : 0;
        void* args[] = {&ns, &sink, &in};
        cudaKernelNodeParams p{};
        p.func = (void*)work;
        p.gridDim = dim3(grids[i % 8]);
        p.blockDim = dim3(128);
        p.kernelParams = args;
        cudaGraphNode_t n;
        CK(cudaGraphAddKernelNode(&n, r.g, have_last ? &last : nullptr, have_last ? 1 : 0, &p));
        r.nodes.push_back(n);
        last = n;
        have_last = true;
    }
    if (events) {
        cudaGraphNode_t n;
        CK(cudaGraphAddEventRecordNode(&n, r.g, &last, 1, e1));
    }
    CK(cudaGraphInstantiate(&r.x, r.g, 0));
    return r;
}

int main() {
    CK(cudaSetDevice(0));
    CK(cudaFree(0));
    cudaStream_t s;
    CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t e0, e1;
    CK(cudaEventCreate(&e0));
    CK(cudaEventCreate(&e1));
    unsigned* sink;
    CK(cudaMalloc(&sink, 64));
    int dev = 0, memops = 0;
    cuDeviceGetAttribute(&memops, CU_DEVICE_ATTRIBUTE_CAN_USE_STREAM_MEM_OPS_V1, dev);
    std::printf("stream mem ops attribute: %d\n", memops);

    // The batch's upload: 10,000 queries, ~28,000 term ids, offsets, modes (~150 KB), and a
    // gate word, in mapped page-locked memory.
    const size_t fill_bytes = 150 * 1024;
    unsigned char* pin;
    CK(cudaHostAlloc((void**)&pin, fill_bytes + 4096, cudaHostAllocMapped));
    volatile unsigned* gate = (volatile unsigned*)(pin + fill_bytes);
    *gate = 0;
    CUdeviceptr gate_dev;
    CD(cuMemHostGetDevicePointer(&gate_dev, (void*)gate, 0));
    unsigned* pin_dev;
    CK(cudaHostGetDevicePointer((void**)&pin_dev, pin, 0));
    std::vector<unsigned char> src(fill_bytes);
    for (size_t i = 0; i < fill_bytes; i++) src[i] = (unsigned char)(i * 131);
    auto fill = [&]() {
        std::memcpy(pin, src.data(), fill_bytes);
        src[0]++;
    };

    const int N = 300;
    // 1. cuGraphLaunch's host time.
    for (int nk : {1, 4, 6, 8}) {
        for (bool ev : {false, true}) {
            G g = build(nk, ev, 0, sink, pin_dev, e0, e1);
            std::vector<double> launch, update;
            for (int i = 0; i < N + 20; i++) {
                auto t0 = Clock::now();
                unsigned long long ns = 0;
                unsigned* snk = sink + (i & 1);
                const unsigned* inp = pin_dev;
                void* args[] = {&ns, &snk, &inp};
                cudaKernelNodeParams p{};
                p.func = (void*)work;
                p.gridDim = dim3(64);
                p.blockDim = dim3(128);
                p.kernelParams = args;
                CK(cudaGraphExecKernelNodeSetParams(g.x, g.nodes.back(), &p));
                auto t1 = Clock::now();
                CK(cudaGraphLaunch(g.x, s));
                auto t2 = Clock::now();
                CK(cudaStreamSynchronize(s));
                if (i >= 20) {
                    update.push_back(us(t0, t1));
                    launch.push_back(us(t1, t2));
                }
                busy(100);
            }
            std::printf("graph %d kernels%s: set params %.2f us, cuGraphLaunch %.2f us\n", nk,
                        ev ? " + 2 events" : "", median(update), median(launch));
            CK(cudaGraphExecDestroy(g.x));
            CK(cudaGraphDestroy(g.g));
        }
    }

    // 1b. Wide parameter lists and a large grid.
    for (bool w : {false, true})
        for (unsigned big : {2048u, 12000u}) wide_graph(s, sink, w, big, N);
    if (std::getenv("PROBE_WIDE_ONLY")) return 0;
    const bool skip_handoff = std::getenv("PROBE_NO_HANDOFF") != nullptr;

    // 2. Hand-off between two threads.
    if (!skip_handoff) {
        std::atomic<int> go{0}, ack{0};
        std::atomic<bool> park{false}, quit{false};
        std::mutex m;
        std::condition_variable cv;
        std::thread h([&] {
            int seen = 0;
            while (!quit.load()) {
                if (park.load()) {
                    std::unique_lock<std::mutex> l(m);
                    cv.wait(l, [&] { return go.load() != seen || quit.load(); });
                } else {
                    while (go.load(std::memory_order_acquire) == seen && !quit.load()) {
                    }
                }
                seen = go.load();
                ack.store(seen, std::memory_order_release);
            }
        });
        for (bool parked : {false, true}) {
            park.store(parked);
            std::vector<double> v;
            for (int i = 0; i < N; i++) {
                busy(parked ? 2000 : 50);  // parked: the helper's vCPU goes idle
                auto t0 = Clock::now();
                int want = go.load() + 1;
                {
                    std::lock_guard<std::mutex> l(m);
                    go.store(want, std::memory_order_release);
                }
                cv.notify_one();
                while (ack.load(std::memory_order_acquire) != want) {
                }
                v.push_back(us(t0, Clock::now()));
            }
            std::printf("hand-off to a %s helper and back: %.2f us\n",
                        parked ? "parked" : "spinning", median(v));
        }
        quit.store(true);
        {
            std::lock_guard<std::mutex> l(m);
            go.store(go.load() + 1);
        }
        cv.notify_one();
        h.join();
    }

    // 3. A simulated call: lookup (busy 10 us), fill (150 KB into the pinned buffer), a graph
    // of 6 kernels + 2 events whose first kernel runs 70 us, wait.
    G g = build(6, true, 70000, sink, pin_dev, e0, e1);
    {
        std::vector<double> v, lf, ln;
        for (int i = 0; i < N; i++) {
            busy(200);
            auto t0 = Clock::now();
            fill();
            auto t1 = Clock::now();
            CK(cudaGraphLaunch(g.x, s));
            lf.push_back(us(t1, Clock::now()));
            CK(cudaStreamSynchronize(s));
            v.push_back(us(t0, Clock::now()));
        }
        for (int i = 0; i < N; i++) {
            busy(200);
            auto t1 = Clock::now();
            CK(cudaGraphLaunch(g.x, s));
            ln.push_back(us(t1, Clock::now()));
            CK(cudaStreamSynchronize(s));
        }
        std::printf("cuGraphLaunch right after the fill %.2f us, with no fill before %.2f us\n",
                    median(lf), median(ln));
        std::vector<double> f;
        for (int i = 0; i < N; i++) {
            busy(200);
            auto t0 = Clock::now();
            fill();
            f.push_back(us(t0, Clock::now()));
        }
        std::printf("fill alone %.2f us; serial call (fill, launch, wait) %.2f us\n", median(f),
                    median(v));
    }
    unsigned seq = 0;
    {
        std::vector<double> v;
        for (int i = 0; i < N; i++) {
            busy(200);
            auto t0 = Clock::now();
            seq++;
            CD(cuStreamWaitValue32((CUstream)s, gate_dev, seq, CU_STREAM_WAIT_VALUE_GEQ));
            CK(cudaGraphLaunch(g.x, s));
            fill();
            std::atomic_thread_fence(std::memory_order_release);
            *gate = seq;
            CK(cudaStreamSynchronize(s));
            v.push_back(us(t0, Clock::now()));
        }
        std::printf("gated on one thread (wait, launch, fill, open, wait) %.2f us\n", median(v));
    }
    for (bool parked : {false, true}) {
        std::atomic<unsigned> go{0}, queued{0};
        std::atomic<bool> quit{false};
        std::mutex m;
        std::condition_variable cv;
        std::thread h([&] {
            CK(cudaSetDevice(0));
            unsigned seen = 0;
            while (true) {
                if (parked) {
                    std::unique_lock<std::mutex> l(m);
                    cv.wait(l, [&] { return go.load() != seen || quit.load(); });
                } else {
                    while (go.load(std::memory_order_acquire) == seen && !quit.load()) {
                    }
                }
                if (quit.load()) break;
                seen = go.load();
                CD(cuStreamWaitValue32((CUstream)s, gate_dev, seen, CU_STREAM_WAIT_VALUE_GEQ));
                CK(cudaGraphLaunch(g.x, s));
                queued.store(seen, std::memory_order_release);
            }
        });
        std::vector<double> v, late;
        for (int i = 0; i < N; i++) {
            busy(200);
            auto t0 = Clock::now();
            seq++;
            {
                std::lock_guard<std::mutex> l(m);
                go.store(seq, std::memory_order_release);
            }
            if (parked) cv.notify_one();
            fill();
            std::atomic_thread_fence(std::memory_order_release);
            *gate = seq;
            auto t1 = Clock::now();
            while (queued.load(std::memory_order_acquire) != seq) {
            }
            auto t2 = Clock::now();
            CK(cudaStreamSynchronize(s));
            v.push_back(us(t0, Clock::now()));
            late.push_back(us(t1, t2));
        }
        quit.store(true);
        {
            std::lock_guard<std::mutex> l(m);
            go.store(go.load() + 1);
        }
        cv.notify_one();
        h.join();
        std::printf("gated, launch on a %s helper: call %.2f us (waited for the helper %.2f us)\n",
                    parked ? "parked" : "spinning", median(v), median(late));
    }
    {
        unsigned long long* stamp;
        CK(cudaMalloc(&stamp, 16));
        for (int rep = 0; rep < 2; rep++) {
            stamped_window(s, false, 70000, sink, pin_dev, stamp, N);
            stamped_window(s, true, 70000, sink, pin_dev, stamp, N);
        }
    }
    // The kernel alone (device time of the first kernel + the rest), for reference.
    {
        std::vector<double> v;
        for (int i = 0; i < N; i++) {
            busy(200);
            CK(cudaGraphLaunch(g.x, s));
            CK(cudaStreamSynchronize(s));
            float ms = 0;
            CK(cudaEventElapsedTime(&ms, e0, e1));
            v.push_back(ms * 1e3);
        }
        std::printf("graph's window (events) %.2f us\n", median(v));
    }
    return 0;
}
