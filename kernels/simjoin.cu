// Verification of the candidate pairs of the exact set similarity join (src/join), on the
// device. Compiled at run time with NVRTC (src/backend/gpu/simjoin.rs).
//
// The sets live on the device for the whole join: `tokens` holds every set's token ranks
// (ascending, distinct), set s is tokens[starts[s] .. starts[s + 1]]. A chunk of candidate
// pairs comes from the CPU's filter (the Bellas & Gounaris layout: the pairs of one probe
// set are contiguous, a group), each pair the candidate set and its minimum overlap `alpha`
// for the threshold; the group names the probe set. Each pair is merged from the sets' first
// tokens (8 bytes a pair cross the bus; the filter's prefix count would triple that). The
// answer is compacted on the device: the index and overlap of each pair that reaches
// `alpha`, in no particular order (the host puts them back in chunk order through a bitmap
// of passing indexes).
//
// Two layouts, as in the paper, chosen per pair on the device from what is left to merge:
// - verify_groups: one block per probe set; the probe set is read into shared memory once
//   and each thread verifies one candidate against it with the early-terminating merge
//   (the CPU's `verify`: the same branch-free steps and stops);
// - verify_large: one block per pair; the two remainders are cut into equal parts of the
//   merge path (Intersect Path), each thread counts the matches of its part, the block sums.

typedef unsigned int u32;
typedef unsigned long long u64;

#define NONE 0xffffffffu
#define GROUP_THREADS 128
#define LARGE_THREADS 256
// Tokens of a probe set kept in shared memory (longer probe sets are read from global memory).
#define SHARED_TOKENS 3072

struct Pair {
    u32 y;      // candidate set (the probe set is the group's)
    u32 alpha;  // minimum overlap
};

// |a ∩ b| if it reaches alpha, else NONE; with exact == 0 it may stop once alpha is reached
// (the count is then a lower bound). `a` may be in shared memory.
__device__ __forceinline__ u32 verify_merge(const u32* a, u32 na, const u32* __restrict__ b,
                                            u32 nb, u32 alpha, int exact) {
    u32 need = alpha;
    if (!exact && need == 0) return 0;
    if (na < need || nb < need) return NONE;
    long long slack_a = (long long)(na - need);
    long long slack_b = (long long)(nb - need);
    u32 i = 0, j = 0, o = 0;
    while (i < na && j < nb) {
        u32 x = a[i], y = b[j];
        slack_a -= (x < y);
        slack_b -= (y < x);
        o += (x == y);
        i += (x <= y);
        j += (y <= x);
        if ((slack_a | slack_b) < 0) return NONE;
        if (!exact && o >= need) return o;
    }
    return o >= need ? o : NONE;
}

// The merge-path layout's share: the pair's two sets together reach large_from tokens.
__device__ __forceinline__ bool is_large(u32 nx, u32 ny, u32 large_from) {
    return (u64)nx + ny >= large_from;
}

// counters[0]: large pairs listed (each as its index and probe set); counters[1]: passing
// pairs written.
#define LARGE_COUNT 0
#define PASS_COUNT 1
// Set when a pair names a set that does not exist (such a pair is not read, and the host
// refuses the whole chunk).
#define BAD_PAIR 2

// Record a passing pair (index and overlap) in the compacted answer.
__device__ __forceinline__ void pass(u32* counters, u32* pass_idx, u32* pass_ovl, u32 idx,
                                     u32 overlap) {
    u32 k = atomicAdd(&counters[PASS_COUNT], 1u);
    pass_idx[k] = idx;
    pass_ovl[k] = overlap;
}

// One block per group: pairs[group_start[g] .. group_start[g + 1]], candidates of probe set
// group_probe[g] (read into shared memory once). Pairs whose sets are large together are
// listed for verify_large (index, probe set); the others are verified here. Passing pairs go
// to the compacted answer.
extern "C" __global__ void __launch_bounds__(GROUP_THREADS)
verify_groups(const u32* __restrict__ tokens, const u64* __restrict__ starts, u32 sets,
              const Pair* __restrict__ pairs, const u32* __restrict__ group_start,
              const u32* __restrict__ group_probe, u32 groups, u32 large_from, int exact,
              u32* __restrict__ counters, u32* __restrict__ large, u32* __restrict__ pass_idx,
              u32* __restrict__ pass_ovl) {
    __shared__ u32 xs[SHARED_TOKENS];
    for (u32 g = blockIdx.x; g < groups; g += gridDim.x) {
        u32 p0 = group_start[g], p1 = group_start[g + 1];
        u32 x = group_probe[g];
        if (x >= sets) {
            // An unknown probe set: its pairs are not read, the chunk is refused.
            if (threadIdx.x == 0) atomicOr(&counters[BAD_PAIR], 1u);
            continue;
        }
        u64 xb = starts[x];
        u32 nx = (u32)(starts[x + 1] - xb);
        const u32* shared_x = tokens + xb;
        if (nx <= SHARED_TOKENS) {
            __syncthreads();
            for (u32 t = threadIdx.x; t < nx; t += blockDim.x) xs[t] = shared_x[t];
            __syncthreads();
            shared_x = xs;
        }
        for (u32 idx = p0 + threadIdx.x; idx < p1; idx += blockDim.x) {
            Pair p = pairs[idx];
            if (p.y >= sets) {
                atomicOr(&counters[BAD_PAIR], 1u);
                continue;
            }
            u64 yb = starts[p.y];
            u32 ny = (u32)(starts[p.y + 1] - yb);
            if (is_large(nx, ny, large_from)) {
                u32 l = atomicAdd(&counters[LARGE_COUNT], 1u);
                large[2 * l] = idx;
                large[2 * l + 1] = x;
                continue;
            }
            u32 r = verify_merge(shared_x, nx, tokens + yb, ny, p.alpha, exact);
            if (r != NONE) pass(counters, pass_idx, pass_ovl, idx, r);
        }
    }
}

// Where diagonal d of the merge path of a (na) and b (nb) crosses: the number of a's tokens
// among the first d merged (ties taken from a first).
__device__ __forceinline__ u32 merge_split(const u32* __restrict__ a, u32 na,
                                           const u32* __restrict__ b, u32 nb, u32 d) {
    u32 lo = d > nb ? d - nb : 0;
    u32 hi = d < na ? d : na;
    while (lo < hi) {
        u32 mid = (lo + hi) >> 1;
        if (a[mid] <= b[d - 1 - mid]) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// One block per pair listed by verify_groups (long sets).
extern "C" __global__ void __launch_bounds__(LARGE_THREADS)
verify_large(const u32* __restrict__ tokens, const u64* __restrict__ starts,
             const Pair* __restrict__ pairs, const u32* __restrict__ large,
             u32* __restrict__ counters, u32* __restrict__ pass_idx,
             u32* __restrict__ pass_ovl) {
    __shared__ u32 warp_sums[LARGE_THREADS / 32];
    u32 n_large = counters[LARGE_COUNT];
    for (u32 l = blockIdx.x; l < n_large; l += gridDim.x) {
        u32 idx = large[2 * l], x = large[2 * l + 1];
        Pair p = pairs[idx];
        u64 xb = starts[x], yb = starts[p.y];
        const u32* a = tokens + xb;
        const u32* b = tokens + yb;
        u32 na = (u32)(starts[x + 1] - xb), nb = (u32)(starts[p.y + 1] - yb);
        u64 total = (u64)na + nb;
        u32 d0 = (u32)(total * threadIdx.x / blockDim.x);
        u32 d1 = (u32)(total * (threadIdx.x + 1) / blockDim.x);
        u32 i = merge_split(a, na, b, nb, d0);
        u32 j = d0 - i;
        u32 o = 0;
        for (u32 s = d0; s < d1; ++s) {
            // Take a[i] when b is exhausted or a[i] <= b[j]; b[j] is then the first token of b
            // not below a[i], so a[i] is common iff they are equal.
            if (j >= nb || (i < na && a[i] <= b[j])) {
                o += (j < nb && a[i] == b[j]);
                ++i;
            } else {
                ++j;
            }
        }
        for (int off = 16; off > 0; off >>= 1) o += __shfl_down_sync(0xffffffffu, o, off);
        __syncthreads();
        if ((threadIdx.x & 31) == 0) warp_sums[threadIdx.x >> 5] = o;
        __syncthreads();
        if (threadIdx.x == 0) {
            u32 sum = 0;
            for (u32 w = 0; w < blockDim.x / 32; ++w) sum += warp_sums[w];
            if (sum >= p.alpha) pass(counters, pass_idx, pass_ovl, idx, sum);
        }
    }
}
