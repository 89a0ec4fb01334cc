// Batched k-way intersection of sorted integer lists, one Arrow list column per argument.
//
// Compiled at run time by NVRTC for the device's own architecture (src/backend/gpu/cuda.rs);
// no CUDA headers are included, so the source compiles with NVRTC alone.
//
// Scheme (see kernels/DESIGN.md): a row's k lists are intersected shortest first, one list per
// step. Each step is a batched two-list intersection A ∩ B over all rows at once:
//
//   plan       one thread per row: the step's A and B ranges and its merge-path length
//              |A| + |B| (0 for a NULL row or one with an empty list). A list whose rows are
//              known to be strictly increasing (a device-resident column: `row_order` ran when
//              it was uploaded) skips the merge's order check, and a row whose B is such a list
//              and at least `ratio` times longer than A keeps B out of the path altogether:
//              its path is A alone, and each A element binary-searches B in global memory
//              (work |A| log |B| instead of reading |A| + |B|).
//   compact    the rows with a path, in order (scan of a 0/1 flag, then a scatter).
//   scan_*     exclusive scan of their path lengths: the rows' merge paths, concatenated,
//              are cut into tiles of TILE positions whatever the row sizes, so a 1e7-element
//              row spreads over thousands of tiles and hundreds of short rows share one (load
//              balance finer than the Wu et al. length buckets, and no idle threads on short
//              rows).
//   partition  one thread per tile: the rows the tile touches and the merge-path splits
//              where it enters the first and leaves the last.
//   merge      one block per tile: loads the tile's A and B parts of every row into shared
//              memory (each input value read once from DRAM), checks that they are strictly
//              increasing (flagging a row otherwise), looks each A element up in its row's B
//              part (binary search in shared memory; the merge path guarantees that an equal
//              B element is in the tile or is the one right after it), ranks the matches with
//              warp ballots into a slot of a scratch buffer taken with one atomic add, and
//              adds each row's match count to row_cnt. Tiles never wait for one another.
//   gather     every tile's matches to its place in the output (scan of the tile counts);
//              the row offsets are the scan of row_cnt. Results come out as Arrow values,
//              ascending per row.
//
//   wmerge     instead of partition and merge, when every list of the call is known strictly
//              increasing and the host asks for it (KnownOrder::Warp): one warp per piece of
//              the rows' A lists concatenated, both lists streamed in windows of 32 elements
//              (coalesced loads, the lookups done by shuffles), no shared memory, no barrier.
//              Such a step is three launches: plan_scan (plan and the scan of the path lengths,
//              a single-pass scan), wmerge, and wplace (each piece's matches to their place
//              and the row offsets, a single-pass scan of the pieces' counts).
//
//   row_order  (once per resident column, at upload) which rows are strictly increasing.
//
// Elements are 32- or 64-bit words; signed types are compared on the bits with the sign bit
// flipped (equality on the bits). Keys are converted on load and back on store.

typedef unsigned char u8;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef long long i64;

// Merge block size (the host sets it: 256, measured fastest with the v6 merge, or 64 / 128)
// and the blocks per multiprocessor the merge kernels are compiled for (kernels/DESIGN.md,
// "Search inside the tile").
#ifndef THREADS
#define THREADS 256
#endif
#define WARPS (THREADS / 32)
#ifndef MINB32
#define MINB32 (THREADS == 256 ? 6 : THREADS == 128 ? 12 : 20)
#endif
#define MINB64 (THREADS == 256 ? 4 : THREADS == 128 ? 8 : 12)

// Flags in the top bits of the per-row lengths a_len / b_len that plan writes (lengths are
// below 2^62): the list is known to be strictly increasing (no order check), and, on b_len,
// B is not in the row's path (A's elements search it in global memory).
#define LEN_KNOWN (1ull << 63)
#define LEN_SEARCH (1ull << 62)
#define LEN_MASK (LEN_SEARCH - 1)

// ---------------------------------------------------------------------------------------
// Small helpers
// ---------------------------------------------------------------------------------------

template <typename W, bool SIGNED>
__device__ __forceinline__ W to_key(W x) {
    return SIGNED ? (x ^ ((W)1 << (sizeof(W) * 8 - 1))) : x;
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

// ---------------------------------------------------------------------------------------
// plan: per row, the step's A and B ranges and its merge-path length.
//
// Step 1 picks the row's shortest list (first of equal lengths) as A and stores its index in
// `sel`; step s (1-based) takes as B the s-th list other than sel[r]. From step 2 on, A is
// the previous step's result (offsets prev_off, u64, n + 1 entries).
// Values of list j for row r live at positions bases[j] + off_j[r] .. bases[j] + off_j[r + 1]
// of the combined input buffer. A NULL row (validity bit clear) has no path: its result is
// empty, as is any row with an empty list. `nz` is 1 for a row with a path (the rows the
// step works on), `row_cnt` (the row's match count, summed by the merge) starts at 0.
// `ord_ptrs[j]`, when not 0, points at list j's row-order flags (`row_order`: 1 = the row is
// strictly increasing), indexed like its offsets. From step 2 on A is known to be increasing:
// a step's result is, unless the row was flagged, and a flagged row's result is discarded.
// `ratio` > 0: a row whose B is known increasing and |B| >= ratio |A| searches B (LEN_SEARCH).
// ---------------------------------------------------------------------------------------

template <typename O>
__device__ u64 plan_row(u32 r, u32 k, u32 step, const u64* off_ptrs, const i64* bases,
                        const u8* valid, u64 valid_off, const u64* prev_off, const u64* ord_ptrs,
                        u32 ratio, u32* sel, u64* a_pos, u64* a_len, u64* b_pos, u64* b_len,
                        u64* plen, u64* nz, u64* row_cnt) {
    bool is_null = false;
    if (valid) {
        u64 bit = valid_off + r;
        is_null = ((valid[bit >> 3] >> (bit & 7)) & 1) == 0;
    }
    u32 s;
    u64 ap, al;
    bool a_known = true;
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
        const u8* ord = (const u8*)ord_ptrs[s];
        a_known = ord != nullptr && ord[r] != 0;
    } else {
        s = sel[r];
        ap = prev_off[r];
        al = prev_off[r + 1] - prev_off[r];
    }
    u32 bj = (step - 1 < s) ? step - 1 : step;
    const O* boff = (const O*)off_ptrs[bj];
    u64 bp = (u64)(bases[bj] + (i64)boff[r]);
    u64 bl = (u64)(boff[r + 1] - boff[r]);
    const u8* bord = (const u8*)ord_ptrs[bj];
    const bool b_known = bord != nullptr && bord[r] != 0;
    if (is_null) { al = 0; bl = 0; }
    // Bit 31 of `ratio`: the step runs `wmerge` (every list known increasing), whose pieces cut
    // A alone; no row searches B there.
    const bool warp = (ratio >> 31) != 0;
    const u32 rr = ratio & 0x7fffffffu;
    const bool search = !warp && rr > 0 && b_known && bl >= (u64)rr * al;
    a_pos[r] = ap;
    a_len[r] = al | (a_known ? LEN_KNOWN : 0);
    b_pos[r] = bp;
    b_len[r] = bl | (b_known ? LEN_KNOWN : 0) | (search ? LEN_SEARCH : 0);
    const u64 len = (al == 0 || bl == 0) ? 0 : ((search || warp) ? al : al + bl);
    plen[r] = len;
    nz[r] = len > 0 ? 1 : 0;
    row_cnt[r] = 0;
    return len;
}

#define PLAN_ARGS                                                                          \
    u32 n, u32 k, u32 step, const u64 *off_ptrs, const i64 *bases, const u8 *valid,        \
        u64 valid_off, const u64 *prev_off, const u64 *ord_ptrs, u32 ratio, u32 *sel,       \
        u64 *a_pos, u64 *a_len, u64 *b_pos, u64 *b_len, u64 *plen, u64 *nz, u64 *row_cnt
#define PLAN_PASS                                                                          \
    k, step, off_ptrs, bases, valid, valid_off, prev_off, ord_ptrs, ratio, sel, a_pos, a_len, \
        b_pos, b_len, plen, nz, row_cnt
extern "C" __global__ void plan_o32(PLAN_ARGS) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n) plan_row<int>(r, PLAN_PASS);
}
extern "C" __global__ void plan_o64(PLAN_ARGS) {
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r < n) plan_row<i64>(r, PLAN_PASS);
}

// The rows with a path, in order: act_row[j] is the j-th such row, act_len[j] its path length
// (act_at = exclusive scan of nz). act_len is zero past the last such row, so that its scan
// over n entries ends every row start at the total path length.
extern "C" __global__ void compact_rows(u32 n, const u64* plen, const u64* act_at, u32* act_row,
                                        u64* act_len) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r >= n) return;
    const u64 len = plen[r];
    if (len > 0) {
        const u64 j = act_at[r];
        act_row[j] = r;
        act_len[j] = len;
    }
    if (r >= act_at[n]) act_len[r] = 0;
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
// Decoupled look-back (Merrill and Garland, "Single-pass Parallel Prefix Scan with Decoupled
// Look-back"): entry i of a launch (a block of plan_scan, a piece of wplace) publishes its own
// count, then sums the counts of the entries before it, 32 at a time, until one has published
// the count of everything up to and including it. Entries are numbered in launch order
// (block index, or warp index within it): an entry waits only for entries already started
// (blocks are dispatched in index order, and a block's warps are resident together), which
// never wait for it.
// A state word: the call's epoch in the top 24 bits (the host numbers its launches; a word of
// an earlier launch reads as not yet published, so the states are never cleared per launch),
// the kind in the next 2 (1: the entry's own count, 2: inclusive), the count in the low 38.
// ---------------------------------------------------------------------------------------

#define ST_AGG 1ull
#define ST_INC 2ull
#define ST_VAL ((1ull << 38) - 1)
#define FULL 0xffffffffu

__device__ __forceinline__ u64 st_word(u32 epoch, u64 kind, u64 v) {
    return ((u64)epoch << 40) | (kind << 38) | (v & ST_VAL);
}

// Called by every lane of one warp for entry `idx`; returns the sum of the counts of entries
// [0, idx) (the same in every lane) and publishes the inclusive count.
__device__ __forceinline__ u64 warp_lookback(u64* state, u64 idx, u64 own, u32 epoch, u32 lane) {
    if (lane == 0) atomicExch(&state[idx], st_word(epoch, idx == 0 ? ST_INC : ST_AGG, own));
    if (idx == 0) return 0;
    u64 excl = 0;
    u64 q = idx;
    for (;;) {
        // Lane l reads entry q - 1 - l; past entry 0 an inclusive zero.
        const u64 s = lane < q ? *(volatile const u64*)&state[q - 1 - lane]
                               : st_word(epoch, ST_INC, 0);
        const u64 kind = (u32)(s >> 40) == epoch ? (s >> 38) & 3 : 0;
        const u32 inc = __ballot_sync(FULL, kind == ST_INC);
        const u32 unready = __ballot_sync(FULL, kind == 0);
        // Only the lanes up to the first inclusive count matter.
        const u32 upto = inc != 0 ? (u32)__ffs(inc) - 1 : 31;
        const u32 below = upto == 31 ? FULL : (2u << upto) - 1;
        if ((unready & below) != 0) {
            __nanosleep(64);
            continue;
        }
        u64 v = lane <= upto ? (s & ST_VAL) : 0;
#pragma unroll
        for (u32 o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
        excl += v;
        if (inc != 0) break;
        q -= 32;
    }
    if (lane == 0) atomicExch(&state[idx], st_word(epoch, ST_INC, excl + own));
    return excl;
}

// The same for entries whose own counts are all known before the launch (`counts`, written by
// an earlier kernel): a state holds only inclusive counts, and an entry without one is read
// from `counts`, so no entry ever waits for another.
__device__ __forceinline__ u64 warp_prefix(u64* state, const u64* counts, u64 idx, u32 epoch,
                                           u32 lane) {
    u64 excl = 0;
    u64 q = idx;
    while (q > 0) {
        const u64 e = q - 1 - lane;
        const bool in = lane < q;
        const u64 s = in ? *(volatile const u64*)&state[e] : 0;
        const bool inc = in && (u32)(s >> 40) == epoch && ((s >> 38) & 3) == ST_INC;
        const u32 incs = __ballot_sync(FULL, inc);
        const u32 upto = incs != 0 ? (u32)__ffs(incs) - 1 : 31;
        u64 v = 0;
        if (in && lane <= upto) v = inc ? (s & ST_VAL) : counts[e];
#pragma unroll
        for (u32 o = 16; o >= 1; o >>= 1) v += __shfl_xor_sync(FULL, v, o);
        excl += v;
        if (incs != 0 || q <= 32) break;
        q -= 32;
    }
    return excl;
}

// A step's piece size: `hi` A positions, halved (never below `lo`) until the step's `total` A
// positions make at least `want` pieces. Chosen on the device from the step's own total (a
// later step's A, the previous step's matches, is known only there): large pieces spread each
// piece's row lookup and first search over more work, and enough pieces keep every
// multiprocessor's warps busy to the end (kernels/DESIGN.md, "A piece size per step").
__device__ __forceinline__ u32 wpiece_of(u64 total, u32 lo, u32 hi, u64 want) {
    u32 p = hi;
    while (p / 2 >= lo && total / p < want) p >>= 1;
    return p;
}

// plan and the scan of its path lengths in one launch (for wmerge's steps, whose rows are not
// compacted): act_start[r] = the paths of rows before r, act_start[n] = all of them. Blocks of
// PSCAN threads (the host's), a row each; `state` one word per block. `flags` (step 1 only,
// else null): every row's flag cleared, and the kernels' error word, so that the host need not
// clear them first. The step's piece size (`wpiece_of`, from the total) is written to `wsize`
// for wmerge and wplace.
#ifndef PSCAN
#define PSCAN 256
#endif
template <typename O>
__device__ void plan_scan_impl(u32 n, u32 k, u32 step, const u64* off_ptrs, const i64* bases,
                               const u8* valid, u64 valid_off, const u64* prev_off,
                               const u64* ord_ptrs, u32 ratio, u32* sel, u64* a_pos,
                               u64* a_len, u64* b_pos, u64* b_len, u64* plen, u64* nz,
                               u64* row_cnt, u64* act_start, u64* state, u32 epoch, u8* flags,
                               u32* err, u32 wlo, u32 whi, u64 wwant, u32* wsize) {
    __shared__ u64 sums[32];
    __shared__ u64 prefix;
    const u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    u64 len = 0;
    if (r < n) {
        len = plan_row<O>(r, PLAN_PASS);
        if (flags != nullptr) flags[r] = 0;
    }
    if (flags != nullptr && r == 0) *err = 0;
    u64 total;
    const u64 ex = block_scan_u64(len, sums, &total);
    if (threadIdx.x < 32) {
        const u64 pre = warp_lookback(state, blockIdx.x, total, epoch, threadIdx.x);
        if (threadIdx.x == 0) prefix = pre;
    }
    __syncthreads();
    if (r < n) act_start[r] = prefix + ex;
    if (r + 1 == n) {
        act_start[n] = prefix + ex + len;
        *wsize = wpiece_of(prefix + ex + len, wlo, whi, wwant);
    }
}

#define PLAN_SCAN_ARGS                                                                     \
    PLAN_ARGS, u64 *act_start, u64 *state, u32 epoch, u8 *flags, u32 *err,                  \
        u32 wlo, u32 whi, u64 wwant, u32 *wsize
#define PLAN_SCAN_PASS act_start, state, epoch, flags, err, wlo, whi, wwant, wsize
extern "C" __global__ void __launch_bounds__(PSCAN) plan_scan_o32(PLAN_SCAN_ARGS) {
    plan_scan_impl<int>(n, PLAN_PASS, PLAN_SCAN_PASS);
}
extern "C" __global__ void __launch_bounds__(PSCAN) plan_scan_o64(PLAN_SCAN_ARGS) {
    plan_scan_impl<i64>(n, PLAN_PASS, PLAN_SCAN_PASS);
}

// ---------------------------------------------------------------------------------------
// partition: tile t covers positions [t * TILE, (t + 1) * TILE) of the concatenated merge
// paths of the rows with a path (act_start: their exclusive scan). Its descriptor: the first
// and last such row it touches (j0, j1) and the merge-path splits where it enters j0 and
// leaves j1. A split that is not monotone (only possible on unsorted input, when the tile
// lies inside one row) marks the tile bad.
// ---------------------------------------------------------------------------------------

struct TileDesc {
    u64 a0;     // A elements of row j0 before the tile
    u64 a1;     // A elements of row j1 up to the tile's end
    u32 j0;
    u32 j1;
    u32 flags;  // bit 0: bad split
    u32 pad;
};

template <typename W, bool SIGNED>
__device__ void partition_impl(u32 n, u32 tile, const u64* act_start, const u32* act_row,
                               const W* a_vals, const W* b_vals, const u64* a_pos,
                               const u64* a_len, const u64* b_pos, const u64* b_len,
                               TileDesc* descs) {
    const u64 total = act_start[n];
    const u64 tiles = (total + tile - 1) / tile;
    for (u64 t = (u64)blockIdx.x * blockDim.x + threadIdx.x; t < tiles; t += (u64)gridDim.x * blockDim.x) {
        const u64 d0 = t * tile;
        const u64 d1 = (d0 + tile < total) ? d0 + tile : total;
        const u32 j0 = find_row(act_start, n, d0);
        const u32 j1 = find_row(act_start, n, d1 - 1);
        // A row that searches B has A alone as its path.
        u32 r = act_row[j0];
        const u64 e0 = d0 - act_start[j0];
        u64 bl = b_len[r];
        const u64 a0 = (bl & LEN_SEARCH) ? e0
                                         : merge_path_global<W, SIGNED>(a_vals + a_pos[r], a_len[r] & LEN_MASK,
                                                                        b_vals + b_pos[r], bl & LEN_MASK, e0);
        r = act_row[j1];
        bl = b_len[r];
        const u64 na = a_len[r] & LEN_MASK, nb = bl & LEN_MASK;
        const u64 e1 = d1 - act_start[j1];
        const u64 a1 = (bl & LEN_SEARCH) ? e1
                       : (e1 == na + nb)
                           ? na
                           : merge_path_global<W, SIGNED>(a_vals + a_pos[r], na, b_vals + b_pos[r], nb, e1);
        const bool bad = j0 == j1 && (a1 < a0 || e1 - a1 < e0 - a0);
        TileDesc d;
        d.a0 = a0;
        d.a1 = a1;
        d.j0 = j0;
        d.j1 = j1;
        d.flags = bad ? 1u : 0u;
        d.pad = 0;
        descs[t] = d;
    }
}

// ---------------------------------------------------------------------------------------
// merge: one block per tile (blocks past the last tile only zero their count). A tile holds
// up to TILE / 2 + 1 row segments (every row's path has at least 2 positions); segment i is
// the part of row j0 + i inside the tile, its A part then its B part, placed in shared memory
// at the tile-local path position where it starts, so path position p of the tile is element
// s_in[p]. The tile is thus a run of 2 * nseg parts, each contiguous in global memory and in
// shared memory (part 2i: A of segment i, part 2i + 1: its B).
//
//   load     each thread loads ITEMS elements strided by THREADS (coalesced, all loads in
//            flight at once); the part of an element is found by walking forward from the
//            thread's previous element (tiles of a few rows, the common case) or by a binary
//            search over the parts (many rows).
//   check    each element is compared with the next one of its part (or the lookahead past
//            the tile, for the last row's parts): a row whose part is not strictly increasing
//            is flagged, and the host discards its result (the CPU redoes the row).
//   search   each A element looks itself up in its segment's B part (binary search in shared
//            memory) and, for the tile's last row, in the lookahead: on sorted input the merge
//            path puts an A element's equal B element in the same tile or right after it. Work
//            is proportional to |A| log |B| rather than |A| + |B|, and each A element yields at
//            most one match (so a flagged row can never overflow the scratch buffer).
//   write    matches are ranked in path order (= row order) by per-warp ballots and one scan
//            of the per-round counts, written to a slot of `scratch` taken with one atomic add;
//            `tile_cnt` / `tile_pos` record it for `gather`, and each row's match count is
//            added to row_cnt.
// No tile waits for another.
// ---------------------------------------------------------------------------------------

#ifndef ITEMS
#define ITEMS 8
#endif
#define TILE (THREADS * ITEMS)
#define MAXSEG (TILE / 2 + 1)
#define MAXPART (2 * MAXSEG)
#define ROUNDS (ITEMS * WARPS)  // (round, warp) pairs: at most 64 (THREADS * ITEMS <= 2048)
// Tiles of at most this many rows find each element's part by walking forward.
#define WALK_SEGS 8

// Largest i < n with starts[i * stride] <= p (starts[0] == 0, nondecreasing).
template <typename P>
__device__ __forceinline__ u32 seg_of(const P* starts, u32 n, u32 stride, u32 p) {
    u32 lo = 0, hi = n - 1;
    while (lo < hi) {
        u32 mid = (lo + hi + 1) >> 1;
        if (starts[mid * stride] <= p) lo = mid; else hi = mid - 1;
    }
    return lo;
}

// The part of tile position c: walking forward from (k, pb, pe) when `walk`, else a binary
// search over the np parts.
template <typename P>
__device__ __forceinline__ void part_of(const P* s_p, u32 np, bool walk, u32 c, u32& k,
                                        u32& pb, u32& pe) {
    if (walk) {
        while (pe <= c) {
            k++;
            pb = pe;
            pe = s_p[k + 1];
        }
    } else {
        k = seg_of(s_p, np, 1, c);
        pb = s_p[k];
        pe = s_p[k + 1];
    }
}

template <bool KNOWN> struct PartStart { typedef u32 T; };
template <> struct PartStart<true> { typedef unsigned short T; };

// KNOWN: the merge_known_* kernels, run when a list of the call is resident with its row
// order known (plan may set LEN_KNOWN / LEN_SEARCH on a row's lists); the merge_* kernels
// (KNOWN false) check every element and never search: their loop has none of that code.
template <typename W, bool SIGNED, bool KNOWN>
__device__ void merge_impl(u32 n, const u64* act_start, const u32* act_row, const W* a_vals,
                           const W* b_vals, const u64* a_pos, const u64* a_len,
                           const u64* b_pos, const u64* b_len, const TileDesc* descs,
                           u64* row_cnt, u64* tile_cnt, u64* tile_pos, u64* scratch_top,
                           u64 scratch_cap, u8* flags, W* scratch, u32* err) {
    __shared__ W s_in[TILE + 1];
    // Part starts (tile positions, <= TILE <= 2048); s_p[2 * nseg] = len. 16-bit in the known
    // kernel (with s_info, 32-bit starts made it ~10% slower on the H200, likely fewer blocks
    // per SM); 32-bit in the other, as measured before known order existed.
    __shared__ typename PartStart<KNOWN>::T s_p[MAXPART + 1];
    __shared__ const W* s_src[MAXPART];  // each part's first element in global memory
    __shared__ u32 s_segcnt[MAXSEG];
    // Per segment: bit 0 its A, bit 1 its B known to be increasing (no check); bit 2 its B is
    // searched in global memory (s_src of its B part: B's first element; the part is empty).
    __shared__ u8 s_info[MAXSEG];
    __shared__ u32 s_rank[ROUNDS];
    __shared__ W s_la[2];
    __shared__ u32 s_has_la[2];
    __shared__ u64 s_base;

    const u64 t = blockIdx.x;
    const u32 tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const u64 total = act_start[n];
    const u64 tiles = (total + TILE - 1) / TILE;
    if (t >= tiles) {
        if (tid == 0) tile_cnt[t] = 0;
        return;
    }
    const TileDesc desc = descs[t];
    const u64 d0 = t * TILE;
    const u64 d1 = (d0 + TILE < total) ? d0 + TILE : total;
    const u32 len = (u32)(d1 - d0);
    const u32 j0 = desc.j0;
    const u32 nseg = desc.j1 - desc.j0 + 1;
    const u32 np = 2 * nseg;
    if (desc.flags & 1u) {
        if (tid == 0) {
            flags[act_row[j0]] = 1;
            tile_cnt[t] = 0;
        }
        return;
    }

    // Part table.
    for (u32 i = tid; i < nseg; i += THREADS) {
        const u32 j = j0 + i;
        const u32 r = act_row[j];
        const u64 st = act_start[j];
        const u64 al_raw = a_len[r], bl_raw = b_len[r];
        const u64 na = al_raw & LEN_MASK, nb = bl_raw & LEN_MASK;
        const bool srch = KNOWN && (bl_raw & LEN_SEARCH) != 0;
        const u64 next = act_start[j + 1];
        const u64 lo = i == 0 ? d0 - st : 0;
        const u64 hi = (next < d1 ? next : d1) - st;
        const u64 a_lo = i == 0 ? desc.a0 : 0;
        const u64 a_hi = i == nseg - 1 ? desc.a1 : na;
        const u64 b_lo = lo - a_lo;
        const u32 s = (u32)(st + lo - d0);
        // A searching row's path is A alone, so b_lo and b_hi below are 0.
        s_p[2 * i] = (typename PartStart<KNOWN>::T)s;
        s_p[2 * i + 1] = (typename PartStart<KNOWN>::T)(s + (u32)(a_hi - a_lo));
        s_segcnt[i] = 0;
        if (KNOWN) s_info[i] = (u8)(((al_raw & LEN_KNOWN) ? 1u : 0u) | ((bl_raw & LEN_KNOWN) ? 2u : 0u) |
                         (srch ? 4u : 0u));
        s_src[2 * i] = a_vals + a_pos[r] + a_lo;
        s_src[2 * i + 1] = b_vals + b_pos[r] + b_lo;
        if (i == nseg - 1) {
            const u64 b_hi = hi - a_hi;
            s_p[np] = (typename PartStart<KNOWN>::T)len;
            s_has_la[0] = a_hi < na;
            s_has_la[1] = !srch && b_hi < nb;
            s_la[0] = a_hi < na ? to_key<W, SIGNED>(a_vals[a_pos[r] + a_hi]) : (W)0;
            s_la[1] = b_hi < nb ? to_key<W, SIGNED>(b_vals[b_pos[r] + b_hi]) : (W)0;
        }
    }
    __syncthreads();

    // Load: ITEMS elements per thread, strided; all loads issued before the first store.
    const bool walk = nseg <= WALK_SEGS;
    W x[ITEMS];
    {
        u32 k = 0, pb = 0, pe = s_p[1];
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 c = tid + j * THREADS;
            x[j] = 0;
            if (c < len) {
                part_of(s_p, np, walk, c, k, pb, pe);
                x[j] = s_src[k][c - pb];
            }
        }
    }
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 c = tid + j * THREADS;
        x[j] = to_key<W, SIGNED>(x[j]);
        if (c < len) s_in[c] = x[j];
    }
    __syncthreads();

    // Check and search.
    const bool has0 = s_has_la[0], has1 = s_has_la[1];
    const W la0 = s_la[0], la1 = s_la[1];
    u32 mask = 0;
    {
        u32 k = 0, pb = 0, pe = s_p[1];
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 c = tid + j * THREADS;
            if (c < len) {
                part_of(s_p, np, walk, c, k, pb, pe);
                const bool is_a = (k & 1u) == 0;
                const bool last_row = k + 2 >= np;
                const u32 info = KNOWN ? s_info[k >> 1] : 0u;
                if (((info >> (k & 1u)) & 1u) == 0) {  // order not known: check it
                    bool bad;
                    if (c + 1 < pe) {
                        bad = x[j] >= s_in[c + 1];
                    } else if (last_row) {
                        bad = is_a ? (has0 && x[j] >= la0) : (has1 && x[j] >= la1);
                    } else {
                        bad = false;
                    }
                    if (bad) flags[act_row[j0 + (k >> 1)]] = 1;
                }
                if (is_a) {
                    bool hit;
                    if (KNOWN && (info & 4u)) {
                        // Lower bound of x in the whole of B, in global memory.
                        const W* bsrc = s_src[k + 1];
                        const u64 nb = b_len[act_row[j0 + (k >> 1)]] & LEN_MASK;
                        u64 lo = 0, m = nb;
                        while (m > 0) {
                            const u64 h = m >> 1;
                            const bool lt = to_key<W, SIGNED>(bsrc[lo + h]) < x[j];
                            lo = lt ? lo + h + 1 : lo;
                            m = lt ? m - h - 1 : h;
                        }
                        hit = lo < nb && to_key<W, SIGNED>(bsrc[lo]) == x[j];
                    } else {
                        // Lower bound of x in the segment's B part [pe, be).
                        const u32 be = s_p[k + 2];
                        u32 lo = pe, m = be - pe;
                        while (m > 0) {
                            const u32 h = m >> 1;
                            const bool lt = s_in[lo + h] < x[j];
                            lo = lt ? lo + h + 1 : lo;
                            m = lt ? m - h - 1 : h;
                        }
                        hit = lo < be ? s_in[lo] == x[j] : (last_row && has1 && x[j] == la1);
                    }
                    if (hit) {
                        mask |= 1u << j;
                        atomicAdd(&s_segcnt[k >> 1], 1u);
                    }
                }
            }
        }
    }

    // Rank the matches in path order: position c = j * THREADS + warp * 32 + lane, so (round
    // j, warp) pairs in order, lanes within.
#pragma unroll
    for (u32 j = 0; j < ITEMS; j++) {
        const u32 b = __ballot_sync(0xffffffffu, (mask >> j) & 1u);
        if (lane == 0) s_rank[j * WARPS + warp] = __popc(b);
    }
    __syncthreads();
    if (warp == 0) {
        u32 carry = 0;
#pragma unroll
        for (u32 base = 0; base < ROUNDS; base += 32) {
            const u32 v = base + lane < ROUNDS ? s_rank[base + lane] : 0;
            u32 s = v;
#pragma unroll
            for (u32 o = 1; o < 32; o <<= 1) {
                const u32 y = __shfl_up_sync(0xffffffffu, s, o);
                if (lane >= o) s += y;
            }
            if (base + lane < ROUNDS) s_rank[base + lane] = carry + s - v;
            carry += __shfl_sync(0xffffffffu, s, 31);
        }
        if (lane == 0) {
            u64 base = 0;
            u64 kept = carry;
            if (scratch != nullptr && carry > 0) {
                base = atomicAdd(scratch_top, (u64)carry);
                if (base + carry > scratch_cap) {
                    atomicExch(err, 1u);
                    kept = 0;
                }
            }
            tile_cnt[t] = kept;
            tile_pos[t] = base;
            s_base = kept ? base : ~0ull;
        }
    }
    __syncthreads();
    for (u32 i = tid; i < nseg; i += THREADS) {
        const u32 c = s_segcnt[i];
        if (c) atomicAdd(&row_cnt[act_row[j0 + i]], (u64)c);
    }
    const u64 base = s_base;
    if (scratch != nullptr && base != ~0ull) {
        const u32 lt = (1u << lane) - 1;
#pragma unroll
        for (u32 j = 0; j < ITEMS; j++) {
            const u32 b = __ballot_sync(0xffffffffu, (mask >> j) & 1u);
            if ((mask >> j) & 1u)
                scratch[base + s_rank[j * WARPS + warp] + __popc(b & lt)] = to_key<W, SIGNED>(x[j]);
        }
    }
}

// Each tile's matches from its scratch slot to its place in the step's output (tile_excl:
// exclusive scan of tile_cnt); one warp per tile.
template <typename W>
__device__ void gather_impl(u64 tiles, const u64* tile_cnt, const u64* tile_pos,
                            const u64* tile_excl, const W* scratch, W* out) {
    const u64 t = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u32 lane = threadIdx.x & 31;
    if (t >= tiles) return;
    const u64 c = tile_cnt[t];
    if (c == 0) return;
    const W* src = scratch + tile_pos[t];
    W* dst = out + tile_excl[t];
    for (u64 i = lane; i < c; i += 32) dst[i] = src[i];
}

extern "C" __global__ void gather_32(u64 tiles, const u64* tile_cnt, const u64* tile_pos,
                                     const u64* tile_excl, const u32* scratch, u32* out) {
    gather_impl<u32>(tiles, tile_cnt, tile_pos, tile_excl, scratch, out);
}
extern "C" __global__ void gather_64(u64 tiles, const u64* tile_cnt, const u64* tile_pos,
                                     const u64* tile_excl, const u64* scratch, u64* out) {
    gather_impl<u64>(tiles, tile_cnt, tile_pos, tile_excl, scratch, out);
}

#define INSTANTIATE_PARTITION(NAME, W, SIGNED)                                                \
    extern "C" __global__ void partition_##NAME(                                              \
        u32 n, u32 tile, const u64* act_start, const u32* act_row, const W* a_vals,           \
        const W* b_vals, const u64* a_pos, const u64* a_len, const u64* b_pos,                \
        const u64* b_len, TileDesc* descs) {                                                  \
        partition_impl<W, SIGNED>(n, tile, act_start, act_row, a_vals, b_vals, a_pos, a_len,  \
                                  b_pos, b_len, descs);                                       \
    }

#define INSTANTIATE_MERGE(NAME, W, SIGNED, MINB)                                              \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) merge_##NAME(                 \
        u32 n, const u64* act_start, const u32* act_row, const W* a_vals, const W* b_vals,    \
        const u64* a_pos, const u64* a_len, const u64* b_pos, const u64* b_len,               \
        const TileDesc* descs, u64* row_cnt, u64* tile_cnt, u64* tile_pos, u64* scratch_top,  \
        u64 scratch_cap, u8* flags, W* scratch, u32* err) {                                   \
        merge_impl<W, SIGNED, false>(n, act_start, act_row, a_vals, b_vals, a_pos, a_len,     \
                                     b_pos, b_len, descs, row_cnt, tile_cnt, tile_pos,        \
                                     scratch_top, scratch_cap, flags, scratch, err);          \
    }                                                                                         \
    extern "C" __global__ void __launch_bounds__(THREADS, MINB) merge_known_##NAME(           \
        u32 n, const u64* act_start, const u32* act_row, const W* a_vals, const W* b_vals,    \
        const u64* a_pos, const u64* a_len, const u64* b_pos, const u64* b_len,               \
        const TileDesc* descs, u64* row_cnt, u64* tile_cnt, u64* tile_pos, u64* scratch_top,  \
        u64 scratch_cap, u8* flags, W* scratch, u32* err) {                                   \
        merge_impl<W, SIGNED, true>(n, act_start, act_row, a_vals, b_vals, a_pos, a_len,      \
                                    b_pos, b_len, descs, row_cnt, tile_cnt, tile_pos,         \
                                    scratch_top, scratch_cap, flags, scratch, err);           \
    }

INSTANTIATE_PARTITION(u32, u32, false)
INSTANTIATE_PARTITION(i32, u32, true)
INSTANTIATE_PARTITION(u64, u64, false)
INSTANTIATE_PARTITION(i64, u64, true)
// Shared memory per block (256 threads x 8 positions): about 37 KB for 32-bit elements, 45 KB
// for 64-bit ones; half that with 128 threads.
INSTANTIATE_MERGE(u32, u32, false, MINB32)
INSTANTIATE_MERGE(i32, u32, true, MINB32)
INSTANTIATE_MERGE(u64, u64, false, MINB64)
INSTANTIATE_MERGE(i64, u64, true, MINB64)

// ---------------------------------------------------------------------------------------
// wmerge: a step over lists all known to be strictly increasing (device-resident columns
// whose row order was computed at upload), a warp at a time per piece of consecutive positions
// of the rows' A lists concatenated (plan gives every row with work a path of |A| positions;
// the host does not compact the rows first: `act_start` is the scan over every row, a row
// without work an empty range that the walk steps over). The piece size is the step's own
// (`wpiece_of`, from its A total).
// A piece may hold the end of one row, whole short rows and the start of another. For each of
// its row segments (a segment starting inside a row first finds where its first A element
// would sit in B, by a 32-way search) the warp walks A and B in windows of 32 elements, one
// element per lane, both loaded coalesced:
// each A element looks itself up in the B window by a binary search over the lanes (shuffles,
// no memory), the A elements not above the window's last B element are decided (matched or
// not), and each side moves past what can no longer match (at least one side by a whole
// window per round); a B window wholly below A's is jumped over by a search. A piece's matches
// go to its own slot of `scratch` (the piece's A positions: a step makes at most one match per
// A element), so no atomic slot is taken; with it the piece writes its count, and the offsets
// of the rows that start in it counted from the piece's first match. wplace, the next launch,
// then puts the matches in place and adds the piece's place to those offsets (a first version
// did that at the end of wmerge itself, each piece waiting for the counts of the pieces before
// it: slower, most likely because the waiting warps held their slots; kernels/DESIGN.md). No
// scan or gather runs between them. A row whose lists are not both known increasing (a
// descent in a resident row) is flagged and left to the CPU. Each value comes from DRAM
// once (a window's unconsumed part is read again from the caches), and no block waits at a
// barrier.
// ---------------------------------------------------------------------------------------

// (The emulator also runs blocks of 2,048 threads, so that a look-back passes more than 32
// pieces that have not yet published their inclusive counts.)
#ifndef WBLOCK
#define WBLOCK 256
#endif
// Blocks of WBLOCK threads per multiprocessor wmerge is compiled for (registers: 65536 /
// (WBLOCK * WMINB) per thread at most).
#ifndef WMINB
#define WMINB 6
#endif
// Lower bound of x (the same in every lane) in keys v[lo, hi): a 32-way search, one load per
// lane per round.
template <typename W, bool SIGNED>
__device__ __forceinline__ u64 warp_lower_bound(const W* v, u64 lo, u64 hi, W x, u32 lane) {
    while (hi - lo > 32) {
        const u64 step = (hi - lo + 31) >> 5;
        const u64 p = lo + (u64)lane * step;
        const bool lt = p < hi && to_key<W, SIGNED>(v[p]) < x;
        const u32 c = __popc(__ballot_sync(FULL, lt));
        const u64 pc = lo + (u64)c * step;
        if (c < 32 && pc < hi) hi = pc;
        if (c > 0) lo += (u64)(c - 1) * step + 1;
    }
    const u64 p = lo + lane;
    const bool lt = p < hi && to_key<W, SIGNED>(v[p]) < x;
    return lo + __popc(__ballot_sync(FULL, lt));
}

// Matches of A[i0, i1) in B[0, nb) (keys compared, values written), ascending, to dst (null:
// count only). Returns their number (the same in every lane). A window of B wholly below A's
// window is jumped over by a 32-way search for A's first element (from B's start for a piece
// that begins inside a row, found the same way).
// Positions are 32-bit (wmerge leaves rows with longer lists to the CPU).
template <typename W, bool SIGNED>
__device__ __forceinline__ u32 wstream(const W* A, u32 i0, u32 i1, const W* B, u32 nb, W* dst,
                                       u32 lane) {
    u32 ai = i0;
    u32 bj = i0 == 0 ? 0
                     : (u32)warp_lower_bound<W, SIGNED>(B, 0, nb, to_key<W, SIGNED>(A[i0]), lane);
    u32 m = 0;
    while (ai < i1 && bj < nb) {
        const u32 ia = ai + lane, ib = bj + lane;
        const bool av = ia < i1, bv = ib < nb;
        const W a = av ? to_key<W, SIGNED>(A[ia]) : (W)0;
        // Lanes past B's end hold the largest key: the search below needs no bound check
        // (a match at such a lane is ruled out by c < nbw).
        const W b = bv ? to_key<W, SIGNED>(B[ib]) : (W)~(W)0;
        const u32 na = (i1 - ai < 32) ? (u32)(i1 - ai) : 32u;
        const u32 nbw = (nb - bj < 32) ? (u32)(nb - bj) : 32u;
        const W alast = __shfl_sync(FULL, a, na - 1);
        const W blast = __shfl_sync(FULL, b, nbw - 1);
        const W afirst = __shfl_sync(FULL, a, 0);
        const W bfirst = __shfl_sync(FULL, b, 0);
        if (blast < afirst) {  // B's window lies below every A element: jump to A's first
            bj = (u32)warp_lower_bound<W, SIGNED>(B, bj + nbw, nb, afirst, lane);
            continue;
        }
        if (alast < bfirst) {  // A's window lies below every B element: none matches
            ai += na;
            continue;
        }
        // c = how many of the window's B elements are below a.
        u32 c = 0;
#pragma unroll
        for (u32 s = 16; s >= 1; s >>= 1) {
            const W y = __shfl_sync(FULL, b, c + s - 1);
            if (y < a) c += s;
        }
        const W y = __shfl_sync(FULL, b, c);
        const bool decided = av && a <= blast;
        const bool hit = decided && c < nbw && y == a;
        const u32 hm = __ballot_sync(FULL, hit);
        if (dst != nullptr && hit) dst[m + __popc(hm & ((1u << lane) - 1u))] = to_key<W, SIGNED>(a);
        m += __popc(hm);
        ai += __popc(__ballot_sync(FULL, decided));
        bj += __popc(__ballot_sync(FULL, bv && b <= alast));
    }
    return m;
}

// Whether the step's pieces (at least one: piece 0 writes the offsets of a step without work)
// are more than `pieces_max`.
__device__ __forceinline__ bool wpieces_over(u64 total, u32 wp, u64 pieces_max) {
    return total > pieces_max * wp;
}

// A warp per piece (the launch has a warp for each piece the step can have).
template <typename W, bool SIGNED>
__device__ void wmerge_impl(u32 n, const u32* wsize, u64 pieces_max,
                            const u64* act_start, const W* a_vals, const W* b_vals,
                            const u64* a_pos, const u64* a_len, const u64* b_pos,
                            const u64* b_len, u64* pcount, u64* prows, u64 scratch_cap,
                            u8* flags, W* scratch, u64* offs, u32* err) {
    const u32 lane = threadIdx.x & 31;
    const u64 total = act_start[n];
    const u32 wp = *wsize;
    if (wpieces_over(total, wp, pieces_max)) {  // never on the host's sizes; no results
        if (lane == 0) atomicExch(err, 1u);
        return;
    }
    const u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const u64 g0 = p * wp;
    // Past the last piece (piece 0 always runs).
    if (g0 >= total && p > 0) return;
    // The piece: positions [g0, g0 + wp) of the step's `total`.
    const u64 g1 = (g0 + wp < total) ? g0 + wp : total;
    if (scratch != nullptr && g1 > scratch_cap) {  // never on the host's sizes; no results
        if (lane == 0) {
            atomicExch(err, 1u);
            pcount[p] = 0;
            prows[p] = 0;
        }
        return;
    }
    // The rows this piece owns (their offsets are written here): those starting in
    // [g0, g1), and for the piece ending the work every row after it too (they start at
    // `total`), with offs[n]. The walk starts at the first owned row, or at the row before
    // it when that row runs across g0.
    const u32 own0 = (u32)warp_lower_bound<u64, false>(act_start, 0, (u64)n + 1, g0, lane);
    u32 j = (own0 > 0 && act_start[own0] > g0) ? own0 - 1 : own0;
    u64 g = g0;
    u64 out = 0;
    while (g < g1) {
        const u64 st = act_start[j];
        const u64 en = act_start[j + 1];
        // An owned row's offset within the piece (the pieces before it are added below).
        if (st >= g0 && lane == 0) offs[j] = out;
        if (en == st) {  // a row without work
            j++;
            continue;
        }
        const u64 i0 = g - st, i1 = (en < g1 ? en : g1) - st;
        const u64 al = a_len[j], bl = b_len[j];
        u32 m = 0;
        // A row not known increasing, or with nearly 2^32 elements or more in a list
        // (32-bit positions keep the loop in 40 registers), is left to the CPU.
        if ((al & LEN_KNOWN) == 0 || (bl & LEN_KNOWN) == 0 ||
            ((al | bl) & LEN_MASK) > 0xffffff00ull) {
            if (lane == 0) flags[j] = 1;
        } else {
            const W* A = a_vals + a_pos[j];
            const W* B = b_vals + b_pos[j];
            const u64 nb = bl & LEN_MASK;
            W* d = scratch != nullptr ? scratch + g0 + out : nullptr;
            m = wstream<W, SIGNED>(A, (u32)i0, (u32)i1, B, (u32)nb, d, lane);
        }
        out += m;
        g = st + i1;
        j++;
    }
    if (g1 == total)
        for (u32 r = j + lane; r <= n; r += 32) offs[r] = out;
    // The piece's count, and the rows it owns (for wplace): [own0, own1), past the last
    // row for the piece that ends the work.
    if (lane == 0) {
        pcount[p] = out;
        prows[p] = (u64)own0 | ((u64)(g1 == total ? n + 1 : j) << 32);
    }
}

// wplace, after wmerge: the same pieces (the same size, from the same total), each warp taking
// every (warps in the launch)-th. The piece's place is the sum of the counts of the pieces
// before it (warp_prefix: a single-pass scan whose counts are all known, so no warp waits); it
// copies its matches from the scratch to there (dst null: counting) and adds the place to the
// offsets of the rows it owns (wmerge wrote them within the piece, and which rows those are in
// `prows`). A piece's few loads are independent of one another: it is short, and its latency
// is what the launch costs.
template <typename W>
__device__ void wplace_impl(u32 n, const u32* wsize, u64 pieces_max,
                            const u64* act_start, const u64* pcount, const u64* prows,
                            u64* pstate, u32 epoch, const W* scratch, W* dst, u64* offs) {
    const u32 lane = threadIdx.x & 31;
    const u64 total = act_start[n];
    // (piece 0 of a call without work: every offset is 0 already)
    if (total == 0) return;
    const u32 wp = *wsize;
    if (wpieces_over(total, wp, pieces_max)) return;  // (wmerge set the error word)
    const u64 warps = ((u64)gridDim.x * blockDim.x) >> 5;
    for (u64 p = ((u64)blockIdx.x * blockDim.x + threadIdx.x) >> 5; p * wp < total; p += warps) {
        const u64 own = pcount[p];
        const u64 rows = prows[p];
        const u64 g0 = p * wp;
        const u64 excl = warp_prefix(pstate, pcount, p, epoch, lane);
        if (lane == 0) atomicExch(&pstate[p], st_word(epoch, ST_INC, excl + own));
        if (scratch != nullptr && dst != nullptr)
            for (u64 i = lane; i < own; i += 32) dst[excl + i] = scratch[g0 + i];
        if (excl == 0) continue;
        const u32 own1 = (u32)(rows >> 32);
        for (u32 t = (u32)rows + lane; t < own1; t += 32) offs[t] += excl;
    }
}

#define INSTANTIATE_WMERGE(NAME, W, SIGNED)                                                   \
    extern "C" __global__ void __launch_bounds__(WBLOCK, WMINB) wmerge_##NAME(                \
        u32 n, const u32* wsize, u64 pieces_max, const u64* act_start,                        \
        const W* a_vals, const W* b_vals, const u64* a_pos, const u64* a_len,                 \
        const u64* b_pos, const u64* b_len, u64* pcount, u64* prows, u64 scratch_cap,         \
        u8* flags, W* scratch, u64* offs, u32* err) {                                         \
        wmerge_impl<W, SIGNED>(n, wsize, pieces_max, act_start, a_vals,                       \
                               b_vals, a_pos, a_len, b_pos, b_len, pcount, prows,             \
                               scratch_cap, flags, scratch, offs, err);                       \
    }
INSTANTIATE_WMERGE(u32, u32, false)
INSTANTIATE_WMERGE(i32, u32, true)
INSTANTIATE_WMERGE(u64, u64, false)
INSTANTIATE_WMERGE(i64, u64, true)

#define WPLACE_ARGS                                                                        \
    u32 n, const u32 *wsize, u64 pieces_max, const u64 *act_start,                          \
        const u64 *pcount, const u64 *prows, u64 *pstate, u32 epoch
#define WPLACE_PASS n, wsize, pieces_max, act_start, pcount, prows, pstate, epoch
extern "C" __global__ void __launch_bounds__(WBLOCK) wplace_32(WPLACE_ARGS, const u32* scratch,
                                                               u32* dst, u64* offs) {
    wplace_impl<u32>(WPLACE_PASS, scratch, dst, offs);
}
extern "C" __global__ void __launch_bounds__(WBLOCK) wplace_64(WPLACE_ARGS, const u64* scratch,
                                                               u64* dst, u64* offs) {
    wplace_impl<u64>(WPLACE_PASS, scratch, dst, offs);
}

// ---------------------------------------------------------------------------------------
// row_order: which rows of a list column are strictly increasing (`sorted`, one byte per row,
// set to 1 by the host first; a row with a descent gets 0). One thread per pair of neighbouring
// values over the values the offsets cover (grid-stride, a streaming read); a descent found is
// placed in its row by a binary search of the offsets, so on sorted data only the descents
// between rows pay one. `vals` is the column's first value (offsets index from it), `nrows` >=
// 1 rows, offsets nondecreasing.
// ---------------------------------------------------------------------------------------

template <typename W, bool SIGNED, typename O>
__device__ void row_order_impl(const W* vals, const O* offs, u64 nrows, u8* sorted) {
    const u64 v0 = (u64)offs[0], v1 = (u64)offs[nrows];
    const u64 stride = (u64)gridDim.x * blockDim.x;
    for (u64 i = v0 + (u64)blockIdx.x * blockDim.x + threadIdx.x; i + 1 < v1; i += stride) {
        if (to_key<W, SIGNED>(vals[i]) >= to_key<W, SIGNED>(vals[i + 1])) {
            u64 lo = 0, hi = nrows - 1;  // the row: largest r with offs[r] <= i
            while (lo < hi) {
                const u64 mid = (lo + hi + 1) >> 1;
                if ((u64)offs[mid] <= i) lo = mid; else hi = mid - 1;
            }
            if (i + 1 < (u64)offs[lo + 1]) sorted[lo] = 0;
        }
    }
}

#define INSTANTIATE_ROW_ORDER(NAME, W, SIGNED)                                                \
    extern "C" __global__ void row_order_##NAME##_o32(const W* vals, const int* offs,         \
                                                      u64 nrows, u8* sorted) {                \
        row_order_impl<W, SIGNED, int>(vals, offs, nrows, sorted);                            \
    }                                                                                         \
    extern "C" __global__ void row_order_##NAME##_o64(const W* vals, const i64* offs,         \
                                                      u64 nrows, u8* sorted) {                \
        row_order_impl<W, SIGNED, i64>(vals, offs, nrows, sorted);                            \
    }
INSTANTIATE_ROW_ORDER(u32, u32, false)
INSTANTIATE_ROW_ORDER(i32, u32, true)
INSTANTIATE_ROW_ORDER(u64, u64, false)
INSTANTIATE_ROW_ORDER(i64, u64, true)

// Fault injection (src/backend/gpu/fault.rs, `DFSETS_GPU_FAULT=kernel`): a kernel that
// faults, queued before a wait so the host's error path meets a real launch failure.
extern "C" __global__ void fault_trap() { __trap(); }
