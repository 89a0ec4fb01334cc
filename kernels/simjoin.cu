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

// ---------------------------------------------------------------------------------------
// The whole join on the device: candidate generation and verification (`probe_join`).
//
// The inverted index over the sets' index prefixes (src/join/filter.rs) is on the device
// too: token w's postings are post[3 * off[w] .. 3 * off[w + 1]], each (set, position of w
// in it, set size), in the sets' global order (by size). A warp takes one probe set p at a
// time (claimed from a counter, so long and short probes balance) and walks the postings of
// its probe prefix, a lane per posting. A posting (q, pos) of token x[i] passes when q comes
// before p, |q| reaches the smallest admissible size and the positional filter holds for a
// first common token (1 + min(tokens left in x, tokens left in q) >= alpha). The pair is
// then counted only at its *first* common token: x[0..i) and q[0..pos) share no token (each
// earlier common token lies in both prefixes, so the pair also meets at it, and only the
// first meeting verifies). Verification merges the rest of both sets from after x[i] and
// q[pos], the early-terminating merge of `verify_merge`. The result is exactly the CPU
// filter's pairs: its state arrays keep each pair once and prune only pairs that cannot
// pass, and both verify the whole overlap.
//
// The thresholds are computed here as the CPU computes them (join/threshold.rs): the
// similarity of (o, n, m) in f64 with correctly rounded operations (no contraction), and
// min_overlap(n, m) the least o that passes.

#define PROBE_THREADS 128
#define M_JACCARD 0
#define M_COSINE 1
#define M_DICE 2
#define M_OVERLAP 3
// probe_join's counters: [0] probe sets claimed, [1] passing pairs, [2] a malformed posting
// or set was met (the host refuses the answer), [3] candidates verified.
#define PJ_NEXT 0
#define PJ_PASS 1
#define PJ_BAD 2
#define PJ_CAND 3

struct Sim {
    double value;
    int measure;
    int gt;  // 1: score > value; 0: score >= value
};

__device__ __forceinline__ double sim_score(const Sim& s, u64 o, u64 n, u64 m) {
    switch (s.measure) {
        case M_JACCARD: {
            u64 u = n + m - o;
            return u == 0 ? 0.0 : __ddiv_rn((double)o, (double)u);
        }
        case M_COSINE:
            if (n == 0 || m == 0) return 0.0;
            return __ddiv_rn((double)o, __dsqrt_rn(__dmul_rn((double)n, (double)m)));
        case M_DICE: {
            u64 sum = n + m;
            return sum == 0 ? 0.0 : __ddiv_rn((double)(2 * o), (double)sum);
        }
        default:
            return (double)o;
    }
}

__device__ __forceinline__ bool sim_passes(const Sim& s, u64 o, u64 n, u64 m) {
    double v = sim_score(s, o, n, m);
    return s.gt ? v > s.value : v >= s.value;
}

// The least overlap o <= min(n, m) with which sets of sizes n and m pass, or NONE. The guess
// only saves steps: the two walks make the answer exact whatever it is.
__device__ __forceinline__ u32 sim_min_overlap(const Sim& s, u32 n, u32 m) {
    u32 cap = n < m ? n : m;
    double t = s.value, nf = (double)n, mf = (double)m;
    double guess;
    switch (s.measure) {
        case M_JACCARD: guess = t / (1.0 + t) * (nf + mf); break;
        case M_COSINE: guess = t * sqrt(nf * mf); break;
        case M_DICE: guess = t * (nf + mf) / 2.0; break;
        default: guess = t; break;
    }
    double c = ceil(guess);
    u32 o = !(c >= 0.0) ? 0u : c > (double)cap + 1.0 ? cap + 1 : (u32)c;
    while (o > 0 && sim_passes(s, o - 1, n, m)) --o;
    while (o <= cap && !sim_passes(s, o, n, m)) ++o;
    return o <= cap ? o : NONE;
}

// The smallest partner size m <= n with which a set of size n can pass (at full overlap),
// or 0 when none can.
__device__ __forceinline__ u32 sim_min_partner(const Sim& s, u32 n) {
    if (n == 0 || !sim_passes(s, n, n, n)) return 0;
    u32 lo = 1, hi = n;
    while (lo < hi) {
        u32 mid = lo + (hi - lo) / 2;
        if (sim_passes(s, mid, n, mid)) hi = mid; else lo = mid + 1;
    }
    return lo;
}

// Whether the ascending lists a[0..na) and b[0..nb) share a token.
__device__ __forceinline__ bool share_any(const u32* a, u32 na, const u32* __restrict__ b,
                                          u32 nb) {
    u32 i = 0, j = 0;
    while (i < na && j < nb) {
        u32 x = a[i], y = b[j];
        if (x == y) return true;
        i += (x < y);
        j += (y < x);
    }
    return false;
}

// First posting of post[3 * from .. 3 * to) whose field `f` (0: set, 2: size) is >= v (the
// fields ascend along a list).
__device__ __forceinline__ u64 posting_bound(const u32* __restrict__ post, u64 from, u64 to,
                                             int f, u32 v) {
    while (from < to) {
        u64 mid = from + (to - from) / 2;
        if (post[3 * mid + f] < v) from = mid + 1; else to = mid;
    }
    return from;
}

// Probe sets p0..p1 (global positions; each meets only sets before it). Index 0 serves a
// self-join (self_join != 0) and the probes of side 1; index 1 the probes of side 0
// (sides[p]). Each passing pair is written as (p, q, overlap) to out[3 * k ..] for k below
// cap (the count may pass cap: the host then splits the range); with emit == 0 pairs are only
// counted. exact == 0 lets a passing pair stop counting at its alpha.
extern "C" __global__ void __launch_bounds__(PROBE_THREADS)
probe_join(const u32* __restrict__ tokens, const u64* __restrict__ starts, u32 sets,
           const unsigned char* __restrict__ sides, int self_join,
           const u64* __restrict__ off0, u32 voc0, const u32* __restrict__ post0,
           const u64* __restrict__ off1, u32 voc1, const u32* __restrict__ post1,
           int measure, double value, int gt, u32 p0, u32 p1, int exact, int emit,
           u32* __restrict__ counters, u32 cap, u32* __restrict__ out) {
    Sim s;
    s.value = value;
    s.measure = measure;
    s.gt = gt;
    const u32 lane = threadIdx.x & 31;
    u32 verified = 0;
    for (;;) {
        u32 p = 0;
        if (lane == 0) p = p0 + atomicAdd(&counters[PJ_NEXT], 1u);
        p = __shfl_sync(0xffffffffu, p, 0);
        if (p >= p1 || p >= sets) break;
        u64 xb = starts[p];
        u64 xe = starts[p + 1];
        if (xe < xb || xe - xb > 0xfffffffeull) {
            if (lane == 0) atomicOr(&counters[PJ_BAD], 1u);
            continue;
        }
        u32 n = (u32)(xe - xb);
        const u32* x = tokens + xb;
        u32 lo = sim_min_partner(s, n);
        if (lo == 0) continue;
        u32 alpha_lo = sim_min_overlap(s, n, lo);
        if (alpha_lo == NONE) continue;
        u32 plen = n - (alpha_lo > 1 ? alpha_lo : 1) + 1;
        bool use1 = !self_join && sides[p] == 0;
        const u64* off = use1 ? off1 : off0;
        const u32* post = use1 ? post1 : post0;
        u32 voc = use1 ? voc1 : voc0;
        for (u32 i = 0; i < plen; ++i) {
            u32 w = x[i];
            if (w >= voc) continue;
            u64 b = off[w], e = off[w + 1];
            if (e < b) {
                if (lane == 0) atomicOr(&counters[PJ_BAD], 1u);
                continue;
            }
            b = posting_bound(post, b, e, 2, lo);
            e = posting_bound(post, b, e, 0, p);
            u32 left_x = n - i - 1;
            for (u64 k = b + lane; k < e; k += 32) {
                u32 q = post[3 * k], pos = post[3 * k + 1], m = post[3 * k + 2];
                if (q >= sets) {
                    atomicOr(&counters[PJ_BAD], 1u);
                    continue;
                }
                u64 yb = starts[q];
                if (starts[q + 1] - yb != (u64)m || pos >= m || tokens[yb + pos] != w) {
                    atomicOr(&counters[PJ_BAD], 1u);
                    continue;
                }
                u32 a = sim_min_overlap(s, n, m);
                if (a == NONE) continue;
                if (a == 0) a = 1;
                u32 left_y = m - pos - 1;
                if (1 + (left_x < left_y ? left_x : left_y) < a) continue;
                const u32* y = tokens + yb;
                if (share_any(x, i, y, pos)) continue;
                ++verified;
                u32 r = verify_merge(x + i + 1, left_x, y + pos + 1, left_y, a - 1, exact);
                if (r == NONE) continue;
                u32 slot = atomicAdd(&counters[PJ_PASS], 1u);
                if (emit && slot < cap) {
                    out[3 * (u64)slot] = p;
                    out[3 * (u64)slot + 1] = q;
                    out[3 * (u64)slot + 2] = r + 1;
                }
            }
        }
    }
    if (verified) atomicAdd(&counters[PJ_CAND], verified);
}
