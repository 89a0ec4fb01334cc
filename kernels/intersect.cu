// Batched k-way intersection of sorted integer lists, one Arrow list column per argument.
//
// Compiled at run time by NVRTC for the device's own architecture (src/backend/gpu/cuda.rs);
// no CUDA headers are included, so the source compiles with NVRTC alone.
//
// Scheme (see kernels/NOTES.md): a row's k lists are intersected shortest first, one list per
// step. Each step is a batched two-list intersection A ∩ B over all rows at once:
//
//   plan       one thread per row: the step's A and B ranges, the row's merge-path length
//              |A| + |B| and its tile count (TILE path elements per tile).
//   scan_*     exclusive scan of the tile counts: every row's first tile; tiles are numbered
//              row by row, so rows of any size spread over equal tiles (load balance across
//              rows of very different lengths, finer than the Wu et al. length buckets).
//   partition  one thread per tile: the merge-path split of the tile's first diagonal.
//   merge      a persistent grid takes tiles in order from an atomic counter; a tile loads its
//              A and B ranges into shared memory (each input value read once from DRAM),
//              checks that both are strictly increasing (flagging the row otherwise), merges
//              (ITEMS path steps per thread), counts matches, finds its output offset with a
//              decoupled look-back over the tiles before it, and writes its matches, compacted
//              and coalesced. Results come out as Arrow values, ascending per row.
//   row_offsets  each row's output offset = the exclusive prefix of its first tile.
//
// Elements are 32- or 64-bit words; signed types are compared on the bits with the sign bit
// flipped (equality on the bits). Keys are converted on load and back on store.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

#define THREADS 256
#define WARPS (THREADS / 32)

#define ST_AGG (1ull << 62)
#define ST_INC (2ull << 62)
#define ST_MASK (3ull << 62)
#define SPIN_LIMIT (1u << 26)

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

template <typename W, bool SIGNED>
__device__ __forceinline__ W to_key(W x) {
    return SIGNED ? (x ^ ((W)1 << (sizeof(W) * 8 - 1))) : x;
}

__device__ __forceinline__ u64 ld_volatile(const u64* p) {
    return *(const volatile u64*)p;
}

// Largest r in [0, n] with starts[r] <= t (starts nondecreasing, starts[0] == 0).
__device__ __forceinline__ u32 find_row(const u64* starts, u32 n, u64 t) {
    u32 lo = 0, hi = n;  // answer in [lo, hi]
    while (lo < hi) {
        u32 mid = lo + (hi - lo + 1) / 2;
        if (starts[mid] <= t) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// Merge path: how many of the first `d` merged elements come from A (ties: A first).
template <typename W, bool SIGNED>
__device__ __forceinline__ u64 merge_path_global(const W* a, u64 na, const W* b, u64 nb, u64 d) {
    u64 lo = d > nb ? d - nb : 0;
    u64 hi = d < na ? d : na;
    while (lo < hi) {
        u64 mid = (lo + hi) >> 1;
        if (to_key<W, SIGNED>(a[mid]) <= to_key<W, SIGNED>(b[d - 1 - mid])) lo = mid + 1; else hi = mid;
    }
    return lo;
}

template <typename W>
__device__ __forceinline__ u32 merge_path_shared(const W* a, u32 na, const W* b, u32 nb, u32 d) {
    u32 lo = d > nb ? d - nb : 0;
    u32 hi = d < na ? d : na;
    while (lo < hi) {
        u32 mid = (lo + hi) >> 1;
        if (a[mid] <= b[d - 1 - mid]) lo = mid + 1; else hi = mid;
    }
    return lo;
}

// Block-wide exclusive scan of one u32 per thread; returns the block total in *total.
__device__ __forceinline__ u32 block_exclusive_scan(u32 v, u32* warp_sums, u32* total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    u32 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        u32 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) warp_sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u32 s = lane < WARPS ? warp_sums[lane] : 0;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            u32 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < WARPS) warp_sums[lane] = s;  // inclusive
    }
    __syncthreads();
    u32 before = warp == 0 ? 0 : warp_sums[warp - 1];
    *total = warp_sums[WARPS - 1];
    return before + x - v;
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (u32 o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
    return __shfl_sync(0xffffffffu, v, 0);
}

// ---------------------------------------------------------------------------------------
// plan: per row, the step's A and B ranges and its tile count.
//
// Step 1 picks the row's shortest list (first of equal lengths) as A and stores its index in
// `sel`; step s (1-based) takes as B the s-th list other than sel[r]. From step 2 on, A is
// the previous step's result (offsets prev_off, u64, n + 1 entries).
// Values of list j for row r live at positions bases[j] + off_j[r] .. bases[j] + off_j[r + 1]
// of the combined input buffer. A NULL row (validity bit clear) gets no tiles: its result is
// empty, as is any row with an empty list.
// ---------------------------------------------------------------------------------------

template <typename O>
__device__ void plan_impl(u32 n, u32 k, u32 step, u32 tile, const u64* off_ptrs, const i64* bases,
                          const u8* valid, u64 valid_off, const u64* prev_off, u32* sel,
                          u64* a_pos, u64* a_len, u64* b_pos, u64* b_len, u64* tile_cnt) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    bool is_null = false;
    if (valid) {
        u64 bit = valid_off + r;
        is_null = ((valid[bit >> 3] >> (bit & 7)) & 1) == 0;
    }
    u32 s;
    u64 ap, al;
    if (step == 1) {
        s = 0;
        u64 best = ~0ull;
        for (u32 j = 0; j < k; j++) {
            const O* off = (const O*)off_ptrs[j];
            u64 len = (u64)(off[r + 1] - off[r]);
            if (len < best) { best = len; s = j; }
        }
        sel[r] = s;
        const O* off = (const O*)off_ptrs[s];
        ap = (u64)(bases[s] + (i64)off[r]);
        al = best;
    } else {
        s = sel[r];
        ap = prev_off[r];
        al = prev_off[r + 1] - prev_off[r];
    }
    u32 bj = (step - 1 < s) ? step - 1 : step;
    const O* boff = (const O*)off_ptrs[bj];
    u64 bp = (u64)(bases[bj] + (i64)boff[r]);
    u64 bl = (u64)(boff[r + 1] - boff[r]);
    if (is_null) { al = 0; bl = 0; }
    a_pos[r] = ap; a_len[r] = al; b_pos[r] = bp; b_len[r] = bl;
    tile_cnt[r] = (al == 0 || bl == 0) ? 0 : (al + bl + tile - 1) / tile;
}

extern "C" __global__ void plan_o32(u32 n, u32 k, u32 step, u32 tile, const u64* off_ptrs, const i64* bases,
                                    const u8* valid, u64 valid_off, const u64* prev_off, u32* sel,
                                    u64* a_pos, u64* a_len, u64* b_pos, u64* b_len, u64* tile_cnt) {
    plan_impl<int>(n, k, step, tile, off_ptrs, bases, valid, valid_off, prev_off, sel, a_pos, a_len, b_pos, b_len, tile_cnt);
}
extern "C" __global__ void plan_o64(u32 n, u32 k, u32 step, u32 tile, const u64* off_ptrs, const i64* bases,
                                    const u8* valid, u64 valid_off, const u64* prev_off, u32* sel,
                                    u64* a_pos, u64* a_len, u64* b_pos, u64* b_len, u64* tile_cnt) {
    plan_impl<i64>(n, k, step, tile, off_ptrs, bases, valid, valid_off, prev_off, sel, a_pos, a_len, b_pos, b_len, tile_cnt);
}

// ---------------------------------------------------------------------------------------
// Exclusive scan of u64 counts (n entries) into out (n + 1 entries, out[n] = total), in three
// launches: per-segment sums, a one-block scan of those, per-segment scans.
// ---------------------------------------------------------------------------------------

#define SCAN_THREADS 1024
#define SCAN_ITEMS 4
#define SCAN_SEG (SCAN_THREADS * SCAN_ITEMS)

__device__ __forceinline__ u64 block_scan_u64(u64 v, u64* sums, u64* total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    u64 x = v;
#pragma unroll
    for (u32 o = 1; o < 32; o <<= 1) {
        u64 y = __shfl_up_sync(0xffffffffu, x, o);
        if (lane >= o) x += y;
    }
    if (lane == 31) sums[warp] = x;
    __syncthreads();
    if (warp == 0) {
        u64 s = lane < nwarps ? sums[lane] : 0;
#pragma unroll
        for (u32 o = 1; o < 32; o <<= 1) {
            u64 y = __shfl_up_sync(0xffffffffu, s, o);
            if (lane >= o) s += y;
        }
        if (lane < nwarps) sums[lane] = s;
    }
    __syncthreads();
    u64 before = warp == 0 ? 0 : sums[warp - 1];
    *total = sums[nwarps - 1];
    __syncthreads();
    return before + x - v;
}

extern "C" __global__ void scan_partials(const u64* in, u64 n, u64* partials) {
    __shared__ u64 sums[32];
    u64 base = (u64)blockIdx.x * SCAN_SEG;
    u64 v = 0;
#pragma unroll
    for (u32 j = 0; j < SCAN_ITEMS; j++) {
        u64 i = base + (u64)threadIdx.x * SCAN_ITEMS + j;
        if (i < n) v += in[i];
    }
    u64 total;
    block_scan_u64(v, sums, &total);
    if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

// One block: exclusive scan of `nb` partials in place.
extern "C" __global__ void scan_partials_single(u64* partials, u64 nb) {
    __shared__ u64 sums[32];
    u64 carry = 0;
    for (u64 base = 0; base < nb; base += SCAN_THREADS) {
        u64 i = base + threadIdx.x;
        u64 v = i < nb ? partials[i] : 0;
        u64 total;
        u64 ex = block_scan_u64(v, sums, &total);
        if (i < nb) partials[i] = carry + ex;
        carry += total;
    }
}

extern "C" __global__ void scan_apply(const u64* in, u64 n, const u64* partials, u64* out) {
    __shared__ u64 sums[32];
    u64 base = (u64)blockIdx.x * SCAN_SEG + (u64)threadIdx.x * SCAN_ITEMS;
    u64 v[SCAN_ITEMS];
    u64 sum = 0;
#pragma unroll
    for (u32 j = 0; j < SCAN_ITEMS; j++) {
        v[j] = (base + j < n) ? in[base + j] : 0;
        sum += v[j];
    }
    u64 total;
    u64 ex = block_scan_u64(sum, sums, &total) + partials[blockIdx.x];
#pragma unroll
    for (u32 j = 0; j < SCAN_ITEMS; j++) {
        if (base + j < n) out[base + j] = ex;
        ex += v[j];
        if (base + j + 1 == n) out[n] = ex;
    }
}

// ---------------------------------------------------------------------------------------
// partition: tile t's descriptor: its row, the absolute start of its A and B ranges, their
// lengths (merge-path splits at both ends of the tile), and whether the lookahead elements
// exist. A non-monotone split (only possible on unsorted input) marks the tile bad.
// ---------------------------------------------------------------------------------------

struct TileDesc {
    u64 a_begin;
    u64 b_begin;
    u32 na;
    u32 nb;
    u32 row;
    u32 flags;  // bit 0: bad split, bit 1: A lookahead, bit 2: B lookahead
};

template <typename W, bool SIGNED>
__device__ void partition_impl(u32 n, u32 tile, const u64* tile_start, const W* a_vals,
                               const W* b_vals, const u64* a_pos, const u64* a_len,
                               const u64* b_pos, const u64* b_len, TileDesc* descs) {
    const u64 tiles = tile_start[n];
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < tiles; t += (u64)gridDim.x * blockDim.x) {
        const u32 r = find_row(tile_start, n, t);
        const u64 na = a_len[r], nb = b_len[r];
        const W* a = a_vals + a_pos[r];
        const W* b = b_vals + b_pos[r];
        const u64 d0 = (t - tile_start[r]) * tile;
        u64 d1 = d0 + tile;
        if (d1 > na + nb) d1 = na + nb;
        const u64 a0 = merge_path_global<W, SIGNED>(a, na, b, nb, d0);
        const u64 a1 = (t + 1 < tile_start[r + 1]) ? merge_path_global<W, SIGNED>(a, na, b, nb, d1) : na;
        const u64 b0 = d0 - a0;
        const u64 b1 = d1 - a1;
        const bool bad = a1 < a0 || d1 < a1 || b1 < b0;
        TileDesc d;
        d.a_begin = a_pos[r] + a0;
        d.b_begin = b_pos[r] + b0;
        d.na = bad ? 0 : (u32)(a1 - a0);
        d.nb = bad ? 0 : (u32)(b1 - b0);
        d.row = r;
        d.flags = bad ? 1u : (((a1 < na) ? 2u : 0u) | ((b1 < nb) ? 4u : 0u));
        descs[t] = d;
    }
}

// ---------------------------------------------------------------------------------------
// merge: see the header. `out` is null in counting mode (no values written).
// ---------------------------------------------------------------------------------------

template <typename W, bool SIGNED, int ITEMS>
__device__ void merge_impl(u32 n, const u64* tile_start, const W* a_vals, const W* b_vals,
                           const TileDesc* descs, u32* tile_counter, u64* status,
                           u64* tile_excl, u64* total_out, u8* flags, W* out, u32* err) {
    constexpr u32 TILE = THREADS * ITEMS;
    __shared__ W s_in[TILE + 2];
    __shared__ W s_out[TILE];
    __shared__ u32 warp_sums[WARPS];
    __shared__ u64 s_tile;
    __shared__ TileDesc s_desc;
    __shared__ u64 s_excl;

    const u64 tiles = tile_start[n];
    const u32 tid = threadIdx.x, lane = tid & 31;

    while (true) {
        // Tiles are claimed in order (the look-back below relies on it), one at a time: a
        // tile claimed ahead would hold up the look-back of every later tile.
        if (tid == 0) {
            u64 t = atomicAdd(tile_counter, 1u);
            s_tile = t;
            if (t < tiles) s_desc = descs[t];
        }
        __syncthreads();
        const u64 t = s_tile;
        if (t >= tiles) break;
        const TileDesc desc = s_desc;

        const u32 r = desc.row;
        const bool bad = desc.flags & 1u;
        const u32 na = desc.na, nb = desc.nb;
        const u32 a_la = (desc.flags >> 1) & 1u;
        const u32 b_la = (desc.flags >> 2) & 1u;
        const u32 na_all = na + a_la;
        const u32 total_in = na_all + nb + b_la;
        const W* ga = a_vals + desc.a_begin;
        const W* gb = b_vals + desc.b_begin;

        // Load A (with lookahead) then B (with lookahead) into shared memory, as keys.
#pragma unroll
        for (u32 j = 0; j < ITEMS + 1; j++) {
            u32 c = tid + j * THREADS;
            if (c < total_in) {
                W v = c < na_all ? ga[c] : gb[c - na_all];
                s_in[c] = to_key<W, SIGNED>(v);
            }
        }
        __syncthreads();

        // Both ranges strictly increasing (lookaheads included, so pairs across tiles are
        // checked by the earlier tile).
        int unsorted = 0;
#pragma unroll
        for (u32 j = 0; j < ITEMS + 1; j++) {
            u32 c = tid + j * THREADS;
            if (c + 1 < total_in && c + 1 != na_all && s_in[c] >= s_in[c + 1]) unsorted = 1;
        }
        unsorted = __syncthreads_or(unsorted);
        if (tid == 0 && (unsorted || bad)) flags[r] = 1;

        // Per-thread merge of ITEMS path steps; matches recorded as bits over A indices.
        const W* sa = s_in;
        const W* sb = s_in + na_all;
        const u32 nsb = nb + b_la;  // B elements visible for the equality test
        u32 mask = 0, ai0 = 0;
        const u32 dl = tid * ITEMS;
        if (dl < na + nb) {
            u32 ai = merge_path_shared<W>(sa, na, sb, nb, dl);
            u32 bi = dl - ai;
            ai0 = ai;
#pragma unroll
            for (u32 s = 0; s < ITEMS; s++) {
                if (ai + bi < na + nb) {
                    if (bi >= nb || (ai < na && sa[ai] <= sb[bi])) {
                        if (bi < nsb && sa[ai] == sb[bi]) mask |= 1u << (ai - ai0);
                        ai++;
                    } else {
                        bi++;
                    }
                }
            }
        }
        // A tile that is not strictly increasing produces nothing (its row is redone on the
        // CPU): this also bounds every tile's output by its A range.
        if (unsorted || bad) mask = 0;
        const u32 cnt = __popc(mask);
        u32 tile_total;
        const u32 my_off = block_exclusive_scan(cnt, warp_sums, &tile_total);

        // Decoupled look-back: the tile's exclusive output prefix.
        if (tid < 32) {
            u64 excl = 0;
            if (t == 0) {
                if (lane == 0) atomicExch(&status[0], ST_INC | (u64)tile_total);
            } else {
                if (lane == 0) atomicExch(&status[t], ST_AGG | (u64)tile_total);
                i64 base = (i64)t - 1;
                u32 spins = 0;
                while (true) {
                    i64 idx = base - (i64)lane;
                    u64 v = idx >= 0 ? ld_volatile(&status[idx]) : ST_INC;
                    while (__any_sync(0xffffffffu, (v & ST_MASK) == 0)) {
                        if (++spins > SPIN_LIMIT) { v = ST_INC; atomicExch(err, 1u); }
                        if ((v & ST_MASK) == 0) {
                            __nanosleep(64);
                            v = ld_volatile(&status[idx]);
                        }
                    }
                    u32 inc = __ballot_sync(0xffffffffu, (v & ST_MASK) == ST_INC);
                    u64 val = v & ~ST_MASK;
                    if (inc) {
                        u32 first_inc = __ffs(inc) - 1;
                        excl += warp_sum_u64(lane <= first_inc ? val : 0);
                        break;
                    }
                    excl += warp_sum_u64(val);
                    base -= 32;
                }
                if (lane == 0) atomicExch(&status[t], ST_INC | (excl + tile_total));
            }
            if (lane == 0) {
                s_excl = excl;
                tile_excl[t] = excl;
                if (t + 1 == tiles) *total_out = excl + tile_total;
            }
        }
        __syncthreads();
        const u64 excl = s_excl;

        if (out != nullptr && tile_total > 0) {
            u32 o = my_off;
            u32 m = mask;
            while (m) {
                u32 bit = __ffs(m) - 1;
                m &= m - 1;
                s_out[o++] = sa[ai0 + bit];
            }
            __syncthreads();
            W* dst = out + excl;
            for (u32 i = tid; i < tile_total; i += THREADS) dst[i] = to_key<W, SIGNED>(s_out[i]);
        }
        __syncthreads();
    }
}

// Row offsets of a step's output: out_off[r] = exclusive prefix of row r's first tile.
extern "C" __global__ void row_offsets(u32 n, const u64* tile_start, const u64* tile_excl,
                                       const u64* total, u64* out_off) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r > n) return;
    const u64 tiles = tile_start[n];
    const u64 ts = tile_start[r];
    out_off[r] = ts < tiles ? tile_excl[ts] : (tiles == 0 ? 0 : *total);
}

#define INSTANTIATE_PARTITION(NAME, W, SIGNED)                                                \
    extern "C" __global__ void partition_##NAME(                                              \
        u32 n, u32 tile, const u64* tile_start, const W* a_vals, const W* b_vals,             \
        const u64* a_pos, const u64* a_len, const u64* b_pos, const u64* b_len,               \
        TileDesc* descs) {                                                                    \
        partition_impl<W, SIGNED>(n, tile, tile_start, a_vals, b_vals, a_pos, a_len, b_pos,   \
                                  b_len, descs);                                              \
    }

#define INSTANTIATE_MERGE(NAME, W, SIGNED, ITEMS, MINB)                                           \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) merge_##NAME##_##ITEMS(       \
        u32 n, const u64* tile_start, const W* a_vals, const W* b_vals,                       \
        const TileDesc* descs, u32* tile_counter, u64* status, u64* tile_excl,                \
        u64* total_out, u8* flags, W* out, u32* err) {                                        \
        merge_impl<W, SIGNED, ITEMS>(n, tile_start, a_vals, b_vals, descs, tile_counter,      \
                                     status, tile_excl, total_out, flags, out, err);          \
    }

INSTANTIATE_PARTITION(u32, u32, false)
INSTANTIATE_PARTITION(i32, u32, true)
INSTANTIATE_PARTITION(u64, u64, false)
INSTANTIATE_PARTITION(i64, u64, true)
// Path steps per thread: 8 or 16 for 32-bit elements (shared memory 16 / 32 KB), 8 for
// 64-bit ones (32 KB).
INSTANTIATE_MERGE(u32, u32, false, 8, 8)
INSTANTIATE_MERGE(i32, u32, true, 8, 8)
INSTANTIATE_MERGE(u32, u32, false, 16, 6)
INSTANTIATE_MERGE(i32, u32, true, 16, 6)
INSTANTIATE_MERGE(u64, u64, false, 8, 6)
INSTANTIATE_MERGE(i64, u64, true, 8, 6)

// Fault injection (src/backend/gpu/fault.rs, `DFSETS_GPU_FAULT=kernel`): a kernel that
// faults, queued before a wait so the host's error path meets a real launch failure.
extern "C" __global__ void fault_trap() { __trap(); }
