// CPU emulation of the CUDA subset the kernels use: one block at a time, each CUDA thread a
// fiber (ucontext) with its own stack on the calling thread, run in turn by a round-robin
// scheduler; `__syncthreads` and the per-warp exchanges behind shuffles and ballots are
// barriers that yield until every live thread of the block (or warp) has arrived. One OS
// thread: no futex per barrier, and the interleaving is deterministic. A block whose threads
// all wait on barriers that can never complete (a thread exited before a warp exchange, or a
// barrier only some threads reach) aborts with a message instead of hanging.
#include <atomic>
#include <vector>
#include <functional>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#include <ucontext.h>
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(...)
struct dim3 { unsigned x = 0, y = 0, z = 0; };
inline dim3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

namespace emu {
// Threads that must arrive, threads arrived, and the barrier's round.
struct Barrier { unsigned expected = 0, arrived = 0; unsigned long long round = 0; };
struct Fiber { ucontext_t ctx; bool done = false; };
inline ucontext_t scheduler;
inline std::vector<Fiber> fibers;
inline unsigned current = 0;
inline std::function<void()>* kernel = nullptr;
inline Barrier block_bar;
inline std::vector<Barrier> warp_bars;
// Bumped by every arrival, release and exit: a scheduler round without a change is a deadlock.
inline unsigned long long events = 0;
// Spin-wait pauses in the current launch (`__nanosleep`).
inline unsigned long long spins = 0;
constexpr size_t STACK = 256 * 1024;

inline void yield() { swapcontext(&fibers[current].ctx, &scheduler); }
inline void release(Barrier& b) { b.arrived = 0; b.round++; events++; }
inline void arrive_and_wait(Barrier& b) {
    unsigned long long round = b.round;
    events++;
    if (++b.arrived == b.expected) { release(b); return; }
    while (b.round == round) yield();
}
// An exiting thread: the barrier no longer waits for it.
inline void drop(Barrier& b) {
    b.expected--;
    events++;
    if (b.expected > 0 && b.arrived == b.expected) release(b);
}
inline void run_thread() {
    (*kernel)();
    drop(block_bar);
    drop(warp_bars[threadIdx.x >> 5]);
    fibers[current].done = true;
    events++;
    swapcontext(&fibers[current].ctx, &scheduler);  // never resumed
}
inline std::vector<char*>& stacks() { static std::vector<char*> s; return s; }
} // namespace emu

static unsigned long long g_xchg[4096];
inline void __syncthreads() { emu::arrive_and_wait(emu::block_bar); }
inline int __syncthreads_or(int p) {
    static int acc = 0;
    if (p) acc = 1;
    emu::arrive_and_wait(emu::block_bar);
    int r = acc;
    emu::arrive_and_wait(emu::block_bar);
    if (threadIdx.x == 0) acc = 0;
    emu::arrive_and_wait(emu::block_bar);
    return r;
}
template <class T> inline T warp_x(T v, int src_lane, bool valid) {
    unsigned w = threadIdx.x >> 5;
    std::memcpy(&g_xchg[threadIdx.x], &v, sizeof(T));
    emu::arrive_and_wait(emu::warp_bars[w]);
    T r = v;
    if (valid) std::memcpy(&r, &g_xchg[w * 32 + src_lane], sizeof(T));
    emu::arrive_and_wait(emu::warp_bars[w]);
    return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
    unsigned w = threadIdx.x >> 5;
    g_xchg[threadIdx.x] = p ? 1 : 0;
    emu::arrive_and_wait(emu::warp_bars[w]);
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++) r |= (unsigned)g_xchg[w * 32 + l] << l;
    emu::arrive_and_wait(emu::warp_bars[w]);
    return r;
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned o) { int l = (threadIdx.x & 31); return warp_x(v, l - (int)o, l >= (int)o); }
template <class T> T __shfl_down_sync(unsigned, T v, unsigned o) { int l = (threadIdx.x & 31); return warp_x(v, l + (int)o, l + (int)o < 32); }
template <class T> T __shfl_sync(unsigned, T v, unsigned s) { return warp_x(v, (int)s, true); }
template <class T> T __shfl_xor_sync(unsigned, T v, unsigned m) { return warp_x(v, (int)((threadIdx.x & 31) ^ m), true); }
inline void __syncwarp(unsigned = 0xffffffffu) { emu::arrive_and_wait(emu::warp_bars[threadIdx.x >> 5]); }
// A spin-wait's pause: yields to the other threads of the block (earlier blocks have finished).
// A wait that never ends (a thread waiting on a state nobody will write) aborts.
inline void __nanosleep(unsigned) {
    if (++emu::spins > 10000000ull) { std::fprintf(stderr, "emu: a spin-wait never ended\n"); std::abort(); }
    emu::events++;
    emu::yield();
}
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicCAS(unsigned* p, unsigned expected, unsigned v) {
    __atomic_compare_exchange_n(p, &expected, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);
    return expected;  // the old value, whether or not it was swapped
}
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicExch(unsigned long long* p, unsigned long long v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __clzll(long long x) { return x == 0 ? 64 : __builtin_clzll((unsigned long long)x); }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline void __trap() { std::abort(); }
// Blocks run one after another here: every store is seen by the later blocks.
inline void __threadfence() {}
template <class T>
inline T __ldcg(const T* p) { return *p; }

inline void launch(unsigned grid, unsigned block, std::function<void()> k) {
    using namespace emu;
    gridDim.x = grid; blockDim.x = block;
    auto& st = stacks();
    while (st.size() < block) {
        char* s = static_cast<char*>(std::malloc(STACK));
        if (!s) { std::fprintf(stderr, "emu: out of memory for thread stacks\n"); std::abort(); }
        st.push_back(s);
    }
    kernel = &k;
    spins = 0;
    unsigned warps = (block + 31) / 32;
    for (unsigned b = 0; b < grid; b++) {
        blockIdx.x = b;
        block_bar = Barrier{block, 0, 0};
        warp_bars.assign(warps, Barrier{});
        for (unsigned w = 0; w < warps; w++) warp_bars[w].expected = block - 32 * w < 32 ? block - 32 * w : 32;
        fibers.assign(block, Fiber{});
        for (unsigned t = 0; t < block; t++) {
            Fiber& f = fibers[t];
            getcontext(&f.ctx);
            f.ctx.uc_stack.ss_sp = st[t];
            f.ctx.uc_stack.ss_size = STACK;
            f.ctx.uc_link = nullptr;
            makecontext(&f.ctx, run_thread, 0);
        }
        unsigned live = block;
        while (live > 0) {
            unsigned long long before = events;
            for (unsigned t = 0; t < block; t++) {
                if (fibers[t].done) continue;
                current = t;
                threadIdx.x = t;
                swapcontext(&scheduler, &fibers[t].ctx);
                if (fibers[t].done) live--;
            }
            if (live > 0 && events == before) {
                std::fprintf(stderr, "emu: block %u of %u deadlocked: %u threads wait on barriers "
                             "that cannot complete\n", b, grid, live);
                std::abort();
            }
        }
    }
}
