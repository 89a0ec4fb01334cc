// CPU emulation of the CUDA subset intersect.cu uses: one block at a time, one std::thread per
// CUDA thread, std::barrier for __syncthreads and per-warp exchanges for shuffles.
#include <atomic>
#include <barrier>
#include <thread>
#include <vector>
#include <functional>
#include <cstdint>
#include <cstring>
#include <cstdio>
#include <cstdlib>
#define __global__
#define __device__
#define __shared__ static
#define __forceinline__ inline
#define __launch_bounds__(a,b)
struct dim3 { unsigned x = 0, y = 0, z = 0; };
thread_local dim3 threadIdx, blockIdx;
dim3 blockDim, gridDim;
std::barrier<>* g_block_bar;
std::vector<std::barrier<>*> g_warp_bar;
static unsigned long long g_xchg[1024];
inline void __syncthreads() { g_block_bar->arrive_and_wait(); }
inline int __syncthreads_or(int p) {
    static std::atomic<int> acc{0};
    if (p) acc.fetch_or(1);
    g_block_bar->arrive_and_wait();
    int r = acc.load();
    g_block_bar->arrive_and_wait();
    if (threadIdx.x == 0) acc.store(0);
    g_block_bar->arrive_and_wait();
    return r;
}
template <class T> inline T warp_x(T v, int src_lane, bool valid) {
    unsigned w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    std::memcpy(&g_xchg[threadIdx.x], &v, sizeof(T));
    g_warp_bar[w]->arrive_and_wait();
    T r = v;
    if (valid) std::memcpy(&r, &g_xchg[w * 32 + src_lane], sizeof(T));
    g_warp_bar[w]->arrive_and_wait();
    (void)lane;
    return r;
}
inline unsigned __ballot_sync(unsigned, int p) {
    unsigned w = threadIdx.x >> 5, lane = threadIdx.x & 31;
    g_xchg[threadIdx.x] = p ? 1 : 0;
    g_warp_bar[w]->arrive_and_wait();
    unsigned r = 0;
    for (unsigned l = 0; l < 32; l++) r |= (unsigned)g_xchg[w * 32 + l] << l;
    g_warp_bar[w]->arrive_and_wait();
    (void)lane;
    return r;
}
template <class T> T __shfl_up_sync(unsigned, T v, unsigned o) { int l = (threadIdx.x & 31); return warp_x(v, l - (int)o, l >= (int)o); }
template <class T> T __shfl_down_sync(unsigned, T v, unsigned o) { int l = (threadIdx.x & 31); return warp_x(v, l + (int)o, l + (int)o < 32); }
template <class T> T __shfl_sync(unsigned, T v, unsigned s) { return warp_x(v, (int)s, true); }
inline unsigned atomicAdd(unsigned* p, unsigned v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned long long atomicAdd(unsigned long long* p, unsigned long long v) { return __atomic_fetch_add(p, v, __ATOMIC_SEQ_CST); }
inline unsigned atomicExch(unsigned* p, unsigned v) { return __atomic_exchange_n(p, v, __ATOMIC_SEQ_CST); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __ffs(unsigned x) { return __builtin_ffs(x); }
inline void __trap() { std::abort(); }

inline void launch(unsigned grid, unsigned block, std::function<void()> k) {
    gridDim.x = grid; blockDim.x = block;
    for (unsigned b = 0; b < grid; b++) {
        std::barrier<> bar(block);
        g_block_bar = &bar;
        std::vector<std::barrier<>*> wb;
        for (unsigned w = 0; w < (block + 31) / 32; w++) wb.push_back(new std::barrier<>(32));
        g_warp_bar = wb;
        std::vector<std::thread> ts;
        for (unsigned t = 0; t < block; t++)
            ts.emplace_back([&, t, b] { threadIdx.x = t; blockIdx.x = b; k(); bar.arrive_and_drop(); });
        for (auto& t : ts) t.join();
        for (auto p : wb) delete p;
    }
}
