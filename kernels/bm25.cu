// Batched BM25 top-k: one thread block per query (Wang et al., Algorithm 1), exact.
//
// The index is resident on the device: the postings of the resident terms, concatenated,
// as document ordinals (`post_ord`, the rank of the doc id among all doc ids, so ordinal
// order is doc-id order) and f64 impacts (`post_imp`, the CPU's `Scored::impacts`), plus
// per ordinal the weighted static score (`ord_static`, or null) and the doc id (`ord_doc`).
// A query is its term lists (`ListRef`, ascending term id = the canonical summation order
// of src/search/scoring.rs) and a mode: 0 AND, 1 OR, 2 AND-then-OR.
//
// Scores are the CPU's bits: a document's score is 0.0 + impact(slot 0) + impact(slot 1)
// + ... in slot order (only the slots holding it), then + static, all in f64 (no
// multiplications, so no contraction). Ties go to the smaller ordinal (= smaller doc id).
//
// AND: one thread per posting of the shortest list, a binary search in each other list
// from its cursor (past the previous chunk of 256 postings; in a long range, within the
// stride a shared fence of every stride-th posting points to), the sum in slot order in a
// register. A device-planned batch's short AND queries (the shortest list at most SHORT_LEAD
// postings) are ranked a warp each instead, eight to a block (`and_short`).
// OR: the ordinal space is swept in tiles of TILE ordinals starting at the smallest
// unvisited posting (tiles skip empty stretches); each list's postings in the tile are added
// into a shared accumulator one list after the other (slot order; a list holds a document
// once, so no two threads of one list touch the same entry), with a count of the lists
// holding each document; then each document of the tile is scored once and its entry
// cleared (sparse tiles: every posting claims its document with an atomic exchange of the
// count; dense tiles: one thread per ordinal of the tile, in ascending chunks).
//
// OR with a floor (the host's `Scored::theta_floor`, a lower bound of the k-th best score,
// for k <= 32): MaxScore (`or_pruned`). Lists whose maxima (plus the static bound) sum to no
// more than the threshold are not visited; candidates come from the other lists and are
// scored by binary searches in every list, in slot order. The threshold starts at the floor
// and rises with the block's k-th best candidate, putting more lists aside as it goes.
// Without a floor, the sweep.
//
// Pieces: the host may split a long query into pieces, each an ordinal range [lo, hi) of the
// documents (a document lies in exactly one range), ranked by a block of its own with the
// same code restricted to the range (an AND query's pieces run the AND, an OR or
// AND-then-OR query's the OR); each piece keeps its own k best (ordinals and scores), and
// `bm25_merge` takes the k best of the query's pieces (in a device-planned batch, the block
// that completes the query does, counting the blocks done in `piece_done`). The k best of
// the union are among the pieces' k best, and the order (score descending, ordinal
// ascending) is total, so the answer is the unsplit one. An AND-then-OR query so split gets
// one more block running its AND alone; the merge keeps the AND answer when it found k
// matches. A long query otherwise holds one block for as long as all the others take
// together (the kernel's tail).
//
// Top-k: candidates that beat the current threshold go to a shared buffer of CAP entries;
// when a chunk could overflow it, the buffer is bitonic-sorted (score descending, ordinal
// ascending) and cut to k, and the threshold becomes the k-th score. Documents are visited
// in increasing ordinal order, so a later document equal to the k-th score loses the tie:
// the filter is `score > theta`. Nothing is truncated: any number of candidates is handled.

typedef unsigned int u32;
typedef unsigned long long u64;

#define THREADS 256
// Ordinals per OR tile (the host may set it: `DFSETS_BM25_TILE`, a power of two, 256..4096).
#ifndef TILE
#define TILE 2048
#endif
#define CAP 1024
#define MAX_TERMS 64
// Pruned OR raises its threshold (a compaction) once this many candidates are held.
#ifndef EAGER
#define EAGER 64
#endif
// Pruned OR also for queries whose floor puts no list aside at first (1), or the sweep (0).
#ifndef PRUNE_ALL
#define PRUNE_ALL 1
#endif

struct ListRef {
    u64 start;  // first posting of the list in post_ord / post_imp
    u32 len;
    float max;  // the term's largest impact, rounded up to f32 (an upper bound)
};

__device__ __forceinline__ bool better(double sa, u32 oa, double sb, u32 ob) {
    return sa > sb || (sa == sb && oa < ob);
}

// First i in [lo, hi) with a[i] >= x (hi if none).
__device__ __forceinline__ u32 lower_bound(const u32* __restrict__ a, u32 lo, u32 hi, u64 x) {
    while (lo < hi) {
        u32 mid = lo + ((hi - lo) >> 1);
        if ((u64)a[mid] < x) {
            lo = mid + 1;
        } else {
            hi = mid;
        }
    }
    return lo;
}

// A block's work: query q, piece `part` of `cut & 0xffff` (1: the whole query), and what to
// run and where its answer goes: ks >> 30 is the kind (WHOLE: the query, answer to the
// query's output; AND_ONLY: the AND phase, answer to the query's output and its match count
// to and_count; PIECE: the AND phase of an AND query, the OR phase of the others, answer to
// piece slot ks & PIECE_MASK). Piece j of n holds the documents of ordinals [lo, hi), cut at
// equal shares of the query's list `cut >> 16` (the lead): lo is the ordinal of that list's
// posting len * j / n (0 for the first piece), hi the next piece's lo (NONE_ORD for the last).
struct Item {
    u32 q;
    u32 part;
    u32 cut;
    u32 ks;
};
#define NONE_ORD 0xffffffffu
#define WHOLE 0u
#define AND_ONLY 1u
#define PIECE 2u
#define PIECE_MASK 0x3fffffffu

// Diagnostics only (`-DBM25_TRACE`, the host's `DFSETS_BM25_TRACE=1`): the ranking kernels
// record, for each place of `order`, when its block (or, for a short item, its warp) started
// and ended on the device's global timer (ns) and what it ranked (query, kind: WHOLE, AND_ONLY,
// PIECE or 3 for a short item, and the multiprocessor). The host reads `bm25_trace` back.
#ifdef BM25_TRACE
#define TRACE_MAX 65536
__device__ unsigned long long bm25_trace[TRACE_MAX * 3];
__device__ __forceinline__ unsigned long long trace_now() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
// The last TRACE_KERNELS places hold the kernels' spans (below), the others the blocks'.
#define TRACE_KERNELS 8
__device__ __forceinline__ void trace_put(u32 pos, unsigned long long start, u32 q, u32 kind) {
    if (pos >= TRACE_MAX - TRACE_KERNELS) return;
    u32 sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    bm25_trace[pos * 3] = start;
    bm25_trace[pos * 3 + 1] = trace_now();
    bm25_trace[pos * 3 + 2] = (unsigned long long)q | (unsigned long long)kind << 32 |
                              (unsigned long long)sm << 40;
}
#define TRACE_START() const unsigned long long trace_start_ = trace_now()
#define TRACE_END(cond, pos, q, kind) \
    if (cond) trace_put(pos, trace_start_, q, kind)
// A kernel's span: the first start and the last end of its blocks' thread 0, at place
// TRACE_MAX - 1 - id as (~start, end, id | 255 << 32) (the start complemented, so that
// atomicMax keeps the earliest over a cleared record).
struct KernelSpan {
    u32 at;
    __device__ explicit KernelSpan(u32 id) : at((TRACE_MAX - 1 - id) * 3) {
        if (threadIdx.x == 0) atomicMax(&bm25_trace[at], ~trace_now());
    }
    __device__ ~KernelSpan() {
        if (threadIdx.x == 0) {
            atomicMax(&bm25_trace[at + 1], trace_now());
            bm25_trace[at + 2] = (unsigned long long)(TRACE_MAX - 1 - at / 3) | 255ull << 32;
        }
    }
};
#define KERNEL_SPAN(id) const KernelSpan kernel_span_(id)
#else
#define TRACE_START()
#define TRACE_END(cond, pos, q, kind)
#define KERNEL_SPAN(id)
#endif

struct Shared {
    double acc[TILE];
    u32 cnt[TILE];
    double cs[CAP];
    u32 co[CAP];
    u64 ls[MAX_TERMS];
    u32 ll[MAX_TERMS];   // end of each list in the block's ordinal range
    double lm[MAX_TERMS];
    u32 beg[MAX_TERMS];  // first posting of each list in the block's ordinal range
    u32 cur[MAX_TERMS];
    u32 nxt[MAX_TERMS];  // where each list's cursor moves after the chunk
    u32 seg[MAX_TERMS];
    u32 segoff[MAX_TERMS + 1];
    double theta;
    u32 theta_ord;    // the k-th best candidate's ordinal (NONE_ORD while fewer are held)
    double floor;     // lower bound of the k-th best score (-inf: none)
    u32 ess[MAX_TERMS];  // 1 for the essential lists of a pruned OR
    u32 done[MAX_TERMS]; // pruned OR: the ordinals below which a list's documents are scored
    u32 ncand;
    u32 matches;
    u32 d0;
    u32 lead;
    u32 last;  // this block completes its query's pieces (`piece_done`)
    u32 fence[THREADS];  // AND: every stride-th ordinal of the list being searched
};

// Sort the candidate buffer (best first), keep the best k, set the threshold. Called by
// every thread of the block (block-uniform), after a barrier. Sorts the smallest power of
// two holding the candidates (padded with the worst entry), not the whole buffer: most
// blocks end with a few dozen candidates, and pruned OR compacts early and often.
template <class S>
__device__ void compact(S& sh, u32 k) {
    const u32 tid = threadIdx.x;
    const u32 n = sh.ncand;
    u32 size_all = 2;
    while (size_all < n) size_all <<= 1;
    for (u32 i = n + tid; i < size_all; i += THREADS) {
        sh.cs[i] = -__longlong_as_double(0x7ff0000000000000ULL);
        sh.co[i] = 0xffffffffu;
    }
    __syncthreads();
    for (u32 size = 2; size <= size_all; size <<= 1) {
        for (u32 stride = size >> 1; stride > 0; stride >>= 1) {
            for (u32 i = tid; i < size_all / 2; i += THREADS) {
                u32 lo = (i / stride) * stride * 2 + (i % stride);
                u32 hi = lo + stride;
                bool best_first = (lo & size) == 0;
                double slo = sh.cs[lo], shi = sh.cs[hi];
                u32 olo = sh.co[lo], ohi = sh.co[hi];
                bool swap = best_first ? better(shi, ohi, slo, olo) : better(slo, olo, shi, ohi);
                if (swap) {
                    sh.cs[lo] = shi;
                    sh.cs[hi] = slo;
                    sh.co[lo] = ohi;
                    sh.co[hi] = olo;
                }
            }
            __syncthreads();
        }
    }
    if (tid == 0) {
        u32 kept = n < k ? n : k;
        sh.ncand = kept;
        sh.theta = kept == k ? sh.cs[k - 1] : -__longlong_as_double(0x7ff0000000000000ULL);
        sh.theta_ord = kept == k ? sh.co[k - 1] : NONE_ORD;
    }
    __syncthreads();
}

// Make room for one candidate per thread (block-uniform: every thread reads the count
// before the barrier, and nothing changes it until after).
template <class S>
__device__ __forceinline__ void room(S& sh, u32 k) {
    const bool full = sh.ncand + THREADS > CAP;
    __syncthreads();
    if (full) compact(sh, k);
}

template <class S>
__device__ __forceinline__ void offer(S& sh, double s, u32 ord) {
    if (s > sh.theta) {
        u32 pos = atomicAdd(&sh.ncand, 1u);
        sh.cs[pos] = s;
        sh.co[pos] = ord;
    }
}

// Pruned OR visits documents out of ordinal order: a document tying the threshold is kept
// when its ordinal is below the k-th best's (the compaction orders them by ordinal; one above
// it loses to all k held), and nothing below the floor is a candidate.
__device__ __forceinline__ void offer_any_order(Shared& sh, double s, u32 ord) {
    if ((s > sh.theta || (s == sh.theta && ord < sh.theta_ord)) && s >= sh.floor) {
        u32 pos = atomicAdd(&sh.ncand, 1u);
        sh.cs[pos] = s;
        sh.co[pos] = ord;
    }
}

// The chunk's searches: each thread looks its candidate up in every other list by a binary
// search from the list's cursor (the first posting not below the chunk's first candidate) to
// its end; the searches of one chunk share their first steps (cache hits). The thread of the
// chunk's last candidate completes every search (no early exit) and leaves in `nxt` where
// the next chunk starts in each list (past that candidate); `advance` moves the cursors there
// after the chunk. (One search per list per chunk to bound each list first was a chain of
// twice as many dependent global loads before any thread could start.)
__device__ __forceinline__ u32 find(const u32* __restrict__ a, u32 lo, u32 hi, u32 ord,
                                    bool& hit) {
    const u32 pos = lower_bound(a, lo, hi, ord);
    hit = pos < hi && a[pos] == ord;
    return pos;
}

__device__ __forceinline__ void advance(Shared& sh, u32 m, u32 skip) {
    const u32 tid = threadIdx.x;
    if (tid < m && tid != skip) sh.cur[tid] = sh.nxt[tid];
}

// AND looks a chunk's candidates up in a long list through a fence: the block loads every
// stride-th posting of the list's remaining range into shared memory (one load per thread,
// side by side), each thread finds its candidate's stride there, then searches that stride
// alone: ~log2(stride) dependent global loads instead of ~log2(range).
#ifndef FENCE_MIN
#define FENCE_MIN 1024
#endif

// First position in [lo, hi) of list `a` holding an ordinal >= ord, through the fence of
// `lo`'s range (`stride` postings apart, `nf` of them) already in sh.fence.
// How many of the fence's nf entries lie below ord (entry f is a[lo + f * stride]).
template <class S>
__device__ __forceinline__ u32 fence_below(const S& sh, u32 nf, u32 ord) {
    u32 f0 = 0, f1 = nf;
    while (f0 < f1) {
        const u32 mid = (f0 + f1) >> 1;
        if (sh.fence[mid] < ord) {
            f0 = mid + 1;
        } else {
            f1 = mid;
        }
    }
    return f0;
}

__device__ __forceinline__ u32 fenced(const Shared& sh, const u32* __restrict__ a, u32 lo,
                                      u32 hi, u32 stride, u32 nf, u32 ord) {
    const u32 f0 = fence_below(sh, nf, ord);
    if (f0 == 0) return lo;
    const u32 from = lo + (f0 - 1) * stride + 1;
    const u32 to = f0 < nf ? lo + f0 * stride : hi;
    return lower_bound(a, from, to, ord);
}

// Every stride-th posting of a's range [lo, hi) into sh.fence (N entries at most), when
// the range holds FENCE_MIN postings or more; returns whether it did (block-uniform: every
// thread calls it, and the barriers around the load are the block's).
template <u32 N, class S>
__device__ __forceinline__ bool load_fence(S& sh, const u32* __restrict__ a, u32 lo, u32 hi,
                                           u32& stride, u32& nf) {
    const u32 range = hi - lo;
    stride = 0;
    nf = 0;
    if (range < FENCE_MIN) return false;
    stride = (range + N - 1) / N;
    nf = (range + stride - 1) / stride;
    __syncthreads();  // the previous list's fence is no longer read
    for (u32 f = threadIdx.x; f < nf; f += THREADS) sh.fence[f] = a[lo + f * stride];
    __syncthreads();
    return true;
}

// The AND phase's start (every thread): the lead, the list with the fewest postings in the
// block's range (the first of them), and each list's search floor at its range's start.
template <class S>
__device__ __forceinline__ u32 start_and(S& sh, u32 m) {
    const u32 tid = threadIdx.x;
    if (tid == 0) {
        u32 lead = 0;
        for (u32 j = 1; j < m; j++) {
            if (sh.ll[j] - sh.beg[j] < sh.ll[lead] - sh.beg[lead]) lead = j;
        }
        sh.lead = lead;
    }
    if (tid < m) sh.cur[tid] = sh.beg[tid];
    __syncthreads();
    return sh.lead;
}

__device__ void and_phase(Shared& sh, u32 m, u32 k, const u32* __restrict__ post_ord,
                          const double* __restrict__ post_imp,
                          const double* __restrict__ ord_static) {
    const u32 tid = threadIdx.x;
    const u32 lead = start_and(sh, m);
    const u32 n = sh.ll[lead];
    for (u32 base = sh.beg[lead]; base < n; base += THREADS) {
        room(sh, k);
        const u32 i = base + tid;
        const bool last = i + 1 == (base + THREADS < n ? base + THREADS : n);
        const bool have = i < n;
        const u64 p = sh.ls[lead] + i;
        const u32 ord = have ? post_ord[p] : 0u;
        double s = 0.0;
        bool ok = have;
        // Lists in slot order (the sum's order); block-uniform, for the fences' barriers.
        for (u32 j = 0; j < m; j++) {
            if (j == lead) {
                if (ok) s += post_imp[p];
                continue;
            }
            const u32* a = post_ord + sh.ls[j];
            const u32 lo = sh.cur[j], hi = sh.ll[j];
            u32 stride, nf;
            const bool fence = load_fence<THREADS>(sh, a, lo, hi, stride, nf);
            if (!(ok || last)) continue;
            const u32 pos = fence ? fenced(sh, a, lo, hi, stride, nf, ord) : lower_bound(a, lo, hi, ord);
            const bool hit = pos < hi && a[pos] == ord;
            if (last) sh.nxt[j] = pos + hit;
            if (ok && hit) {
                s += post_imp[sh.ls[j] + pos];
            } else {
                ok = false;
            }
        }
        if (ok) {
            atomicAdd(&sh.matches, 1u);
            if (ord_static) s += ord_static[ord];
            offer(sh, s, ord);
        }
        __syncthreads();
        advance(sh, m, lead);
    }
}

// The lists a threshold `t` puts aside (thread 0): the smallest maxima first while their sum
// with the static bound stays at most t's cut. A document in none of the other lists scores
// below t, so it cannot be among the k best. Ties among maxima go to the lower slot, so a
// larger t puts aside a superset. Returns how many.
__device__ u32 set_aside(Shared& sh, u32 m, double static_max, double t) {
    const double cut = t - 1e-12 * fabs(t);
    for (u32 j = 0; j < m; j++) sh.ess[j] = 1;
    double sum = static_max;
    u32 ne = 0;
    while (ne < m) {
        u32 best = m;
        for (u32 j = 0; j < m; j++) {
            if (sh.ess[j] && (best == m || sh.lm[j] < sh.lm[best])) best = j;
        }
        if (!(sum + sh.lm[best] <= cut)) break;
        sum += sh.lm[best];
        sh.ess[best] = 0;
        ne++;
    }
    return ne;
}

// OR with a floor (MaxScore on the device). Candidates are the postings of the essential
// lists, one list after the other in slot order; each is scored in slot order by a binary
// search in every other list, from its cursor as in AND, unless a list before it has scored
// it (its document lies below that list's `done` ordinal). The threshold starts at the floor
// and rises as the block goes: once EAGER candidates are held they are compacted to the k
// best (the k-th is a lower bound of the answer's), and the lists the new threshold puts
// aside are not visited, or no further: a list put aside in the middle is `done` up to the
// first document it did not visit. Exact: a document left unscored lies only in lists put
// aside at some threshold, all of them within the last threshold's set (it only grows), so
// it scores below the k-th best. Returns false (nothing done) when the floor puts no list
// aside and PRUNE_ALL is 0 (the sweep then).
__device__ bool or_pruned(Shared& sh, u32 m, u32 k, double static_max,
                          const u32* __restrict__ post_ord, const double* __restrict__ post_imp,
                          const double* __restrict__ ord_static) {
    const u32 tid = threadIdx.x;
    if (tid == 0) sh.d0 = set_aside(sh, m, static_max, sh.floor);
    if (tid < m) sh.done[tid] = 0;
    __syncthreads();
    if (!PRUNE_ALL && sh.d0 == 0) return false;
    for (u32 e = 0; e < m; e++) {
        if (!sh.ess[e]) continue;
        if (tid < m) sh.cur[tid] = sh.beg[tid];
        if (tid == 0) sh.done[e] = NONE_ORD;
        __syncthreads();
        const u32 n = sh.ll[e];
        for (u32 base = sh.beg[e]; base < n; base += THREADS) {
            room(sh, k);
            const u32 i = base + tid;
            const bool last = i + 1 == (base + THREADS < n ? base + THREADS : n);
            if (i < n) {
                const u64 p = sh.ls[e] + i;
                const u32 ord = post_ord[p];
                double s = 0.0;
                bool mine = true;
                for (u32 j = 0; j < m; j++) {
                    if (j == e) {
                        s += post_imp[p];
                        continue;
                    }
                    bool hit;
                    const u32 pos = find(post_ord + sh.ls[j], sh.cur[j], sh.ll[j], ord, hit);
                    if (last) sh.nxt[j] = pos + hit;
                    if (hit) {
                        if (j < e && ord < sh.done[j]) {
                            mine = false;  // an earlier list has scored it
                            if (!last) break;
                        }
                        s += post_imp[sh.ls[j] + pos];
                    }
                }
                if (mine) {
                    if (ord_static) s += ord_static[ord];
                    offer_any_order(sh, s, ord);
                }
            }
            __syncthreads();
            advance(sh, m, e);
            if (sh.ncand >= EAGER) {
                compact(sh, k);
                if (tid == 0) {
                    set_aside(sh, m, static_max, fmax(sh.theta, sh.floor));
                    if (!sh.ess[e] && base + THREADS < n) {
                        sh.done[e] = post_ord[sh.ls[e] + base + THREADS];
                    }
                }
                __syncthreads();
                if (!sh.ess[e]) break;
            }
        }
    }
    return true;
}

__device__ void or_phase(Shared& sh, u32 m, u32 k, const u32* __restrict__ post_ord,
                         const double* __restrict__ post_imp,
                         const double* __restrict__ ord_static, double static_max) {
    const u32 tid = threadIdx.x;
    if (sh.floor > -__longlong_as_double(0x7ff0000000000000ULL) &&
        or_pruned(sh, m, k, static_max, post_ord, post_imp, ord_static)) {
        return;
    }
    if (tid < m) sh.cur[tid] = sh.beg[tid];
    __syncthreads();
    while (true) {
        if (tid == 0) {
            u32 d = 0xffffffffu;
            for (u32 j = 0; j < m; j++) {
                if (sh.cur[j] < sh.ll[j]) {
                    u32 o = post_ord[sh.ls[j] + sh.cur[j]];
                    d = o < d ? o : d;
                }
            }
            sh.d0 = d;
        }
        __syncthreads();
        const u32 d0 = sh.d0;
        if (d0 == 0xffffffffu) break;
        const u64 dend = (u64)d0 + TILE;
        if (tid < m) {
            sh.seg[tid] = lower_bound(post_ord + sh.ls[tid], sh.cur[tid], sh.ll[tid], dend);
        }
        __syncthreads();
        if (tid == 0) {
            u32 t = 0;
            for (u32 j = 0; j < m; j++) {
                sh.segoff[j] = t;
                t += sh.seg[j] - sh.cur[j];
            }
            sh.segoff[m] = t;
        }
        // Accumulate, one list after the other (the canonical order).
        for (u32 j = 0; j < m; j++) {
            const u64 s0 = sh.ls[j];
            const u32 end = sh.seg[j];
            for (u32 i = sh.cur[j] + tid; i < end; i += THREADS) {
                const u32 o = post_ord[s0 + i] - d0;
                sh.acc[o] += post_imp[s0 + i];
                sh.cnt[o] += 1;
            }
            __syncthreads();
        }
        // Claim, score, clear. A tile of at most THREADS postings: one chunk, each posting
        // claims its document with an atomic exchange of the count (no compaction between
        // the offers of the tile). A denser tile: its ordinals are scanned in ascending
        // chunks of THREADS, one thread per ordinal (no global reads, no atomics, fewer
        // chunks than postings); a compaction between chunks then only ever holds smaller
        // ordinals than the ones still to come, so `score > theta` keeps the tie rule.
        const u32 total = sh.segoff[m];
        if (total <= THREADS) {
            room(sh, k);
            if (tid < total) {
                u32 j = 0;
                while (sh.segoff[j + 1] <= tid) j++;
                const u64 p = sh.ls[j] + sh.cur[j] + (tid - sh.segoff[j]);
                const u32 ord = post_ord[p];
                const u32 o = ord - d0;
                const u32 c = atomicExch(&sh.cnt[o], 0u);
                if (c != 0) {
                    double s = sh.acc[o];
                    sh.acc[o] = 0.0;
                    if (ord_static) s += ord_static[ord];
                    offer(sh, s, ord);
                }
            }
            __syncthreads();
        } else {
            for (u32 base = 0; base < TILE; base += THREADS) {
                room(sh, k);
                const u32 o = base + tid;
                if (sh.cnt[o] != 0) {
                    sh.cnt[o] = 0;
                    double s = sh.acc[o];
                    sh.acc[o] = 0.0;
                    const u32 ord = d0 + o;
                    if (ord_static) s += ord_static[ord];
                    offer(sh, s, ord);
                }
                __syncthreads();
            }
        }
        if (tid < m) sh.cur[tid] = sh.seg[tid];
        __syncthreads();
    }
}

// The k best of the block's candidates to `out_*` at row `row` (doc ids), or to a piece's slot
// (ordinals, for `bm25_merge`). Called by every thread after `compact`.
template <class S>
__device__ __forceinline__ void write_answer(const S& sh, u32 n, u64 at,
                                             const u32* __restrict__ ord_doc, u32* out_doc,
                                             double* out_score, bool as_ordinals) {
    for (u32 i = threadIdx.x; i < n; i += THREADS) {
        out_doc[at + i] = as_ordinals ? sh.co[i] : ord_doc[sh.co[i]];
        out_score[at + i] = sh.cs[i];
    }
}

// Pure-AND queries ranked whole whose shortest list holds at most SHORT_LEAD postings and
// that have at most SHORT_TERMS lists ("short" items, most of a web query log's AND queries)
// are ranked a warp each, THREADS / 32 of them to a block, with no block barrier: a block of
// the path above spends most of such a query waiting at its barriers for the one warp that
// searches (ncu on an H100: 48% of the stall cycles at barriers, 5 blocks a multiprocessor).
// Each lane takes a posting of the shortest list (the first shortest, as the plan's lead),
// binary-searches it in every other list in slot order and sums its score in that order;
// the matches (at most SHORT_LEAD) go to the warp's own part of the candidate buffer, which
// is bitonic-sorted best first (the block path's order: score descending, ordinal ascending)
// and cut to k. The same answer as the block path: every match is a candidate, and the order
// is total. (H100, the web query log's 10,000 AND queries at k 10: 4,437 of the 5,414 ranked
// are short; the ranking kernels' window 0.126 ms without the warps, 0.112 with them.)
#ifndef SHORT_LEAD
#define SHORT_LEAD 64
#endif
#define SHORT_TERMS 32
#define FULL_MASK 0xffffffffu

template <class S>
__device__ void and_short(S& sh, const Item it, const u32* __restrict__ q_off,
                          const ListRef* __restrict__ lists, const u32* __restrict__ post_ord,
                          const double* __restrict__ post_imp,
                          const double* __restrict__ ord_static, const u32* __restrict__ ord_doc,
                          u32 k, u32* __restrict__ out_count, u32* __restrict__ out_doc,
                          double* __restrict__ out_score) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 q = it.q;
    const u32 first = q_off[q];
    const u32 m = q_off[q + 1] - first;  // 1 ..= SHORT_TERMS (the plan's)
    u64 start = 0;
    u32 len = 0;
    if (lane < m) {
        start = lists[first + lane].start;
        len = lists[first + lane].len;
    }
    // The lead: the shortest list, the first of the shortest.
    u32 best_len = lane < m ? len : 0xffffffffu, best_j = lane;
    for (u32 d = 16; d > 0; d >>= 1) {
        const u32 ol = __shfl_xor_sync(FULL_MASK, best_len, d);
        const u32 oj = __shfl_xor_sync(FULL_MASK, best_j, d);
        if (ol < best_len || (ol == best_len && oj < best_j)) {
            best_len = ol;
            best_j = oj;
        }
    }
    const u32 lead = best_j;
    const u32 n = best_len < SHORT_LEAD ? best_len : SHORT_LEAD;  // the plan's bound
    const u64 lead_start = __shfl_sync(FULL_MASK, start, lead);
    double* cs = sh.cs + warp * SHORT_LEAD;
    u32* co = sh.co + warp * SHORT_LEAD;
    u32 count = 0;
    for (u32 base = 0; base < n; base += 32) {
        const u32 i = base + lane;
        const bool have = i < n;
        const u64 p = lead_start + i;
        const u32 ord = have ? post_ord[p] : 0u;
        double s = 0.0;
        bool ok = have;
        for (u32 j = 0; j < m; j++) {  // slot order: the sum's order
            const u64 sj = __shfl_sync(FULL_MASK, start, j);
            const u32 lj = __shfl_sync(FULL_MASK, len, j);
            if (!ok) continue;
            if (j == lead) {
                s += post_imp[p];
                continue;
            }
            const u32 pos = lower_bound(post_ord + sj, 0, lj, ord);
            if (pos < lj && post_ord[sj + pos] == ord) {
                s += post_imp[sj + pos];
            } else {
                ok = false;
            }
        }
        if (ok && ord_static) s += ord_static[ord];
        const u32 mask = __ballot_sync(FULL_MASK, ok);
        if (ok) {
            const u32 at = count + __popc(mask & ((1u << lane) - 1u));
            cs[at] = s;
            co[at] = ord;
        }
        count += __popc(mask);
    }
    u32 size = 2;
    while (size < count) size <<= 1;
    for (u32 i = count + lane; i < size; i += 32) {
        cs[i] = -__longlong_as_double(0x7ff0000000000000ULL);
        co[i] = 0xffffffffu;
    }
    __syncwarp();
    for (u32 span = 2; span <= size; span <<= 1) {
        for (u32 stride = span >> 1; stride > 0; stride >>= 1) {
            for (u32 i = lane; i < size / 2; i += 32) {
                const u32 lo = (i / stride) * stride * 2 + (i % stride);
                const u32 hi = lo + stride;
                const bool best_first = (lo & span) == 0;
                const double slo = cs[lo], shi = cs[hi];
                const u32 olo = co[lo], ohi = co[hi];
                const bool swap =
                    best_first ? better(shi, ohi, slo, olo) : better(slo, olo, shi, ohi);
                if (swap) {
                    cs[lo] = shi;
                    cs[hi] = slo;
                    co[lo] = ohi;
                    co[hi] = olo;
                }
            }
            __syncwarp();
        }
    }
    const u32 kept = count < k ? count : k;
    for (u32 i = lane; i < kept; i += 32) {
        out_doc[(u64)q * k + i] = ord_doc[co[i]];
        out_score[(u64)q * k + i] = cs[i];
    }
    if (lane == 0) out_count[q] = kept;
}

// ---------------------------------------------------------------------------------------
// `bm25_topk_and`: the same items for a batch of AND queries only (the host launches it
// instead of `bm25_topk` when the batch's mode is AND). Its blocks hold no OR tile (18 KB of
// shared memory instead of 41) and none of OR's registers, and a long item's chunk is AND_G
// candidates a thread (AND_G * THREADS of the lead list), their searches side by side: the
// searches of one list run in lockstep (the same number of halvings), so a thread has AND_G
// independent loads in flight where `and_phase` has one. A long item's time is its chunks'
// chains of dependent loads, one after the other (a cost model of the benchmark's blocks:
// the longest is a two-list query of 3,626 candidates, 15 chunks of 256). Its fences hold
// AND_FENCE entries (256 in `and_phase`), so each search is log2(AND_FENCE / 256) halvings
// shorter. The sum is still added in slot order, the candidates are offered a slice of
// THREADS at a time in ascending ordinal order (the threshold's tie rule), so the answers are
// `and_phase`'s.
#ifndef AND_G
#define AND_G 4
#endif
#ifndef AND_FENCE
#define AND_FENCE 1024
#endif

struct SharedAnd {
    double cs[CAP];
    u32 co[CAP];
    u64 ls[MAX_TERMS];
    u32 ll[MAX_TERMS];
    u32 beg[MAX_TERMS];
    u32 cur[MAX_TERMS];
    u32 nxt[MAX_TERMS];
    double theta;
    u32 theta_ord;
    u32 ncand;
    u32 matches;
    u32 lead;
    u32 last;
    u32 fence[AND_FENCE];
};

template <bool B, class T, class F>
struct Pick {
    typedef T type;
};
template <class T, class F>
struct Pick<false, T, F> {
    typedef F type;
};

// Lower bound of x in a[from, from + n) where positions at or past `to` read as above every
// ordinal; the number of halvings depends on n alone (Khuong and Morin's branch-free
// search), so searches of equal n issued together run in lockstep. n >= 1.
template <u32 G>
__device__ __forceinline__ void lower_bounds(const u32* __restrict__ a, u32 (&b)[G],
                                             const u32 (&to)[G], const u32 (&x)[G],
                                             const bool (&live)[G], u32 n) {
    while (n > 1) {
        const u32 half = n >> 1;
        n -= half;
        u32 v[G];
#pragma unroll
        for (u32 g = 0; g < G; g++) {
            const u32 at = b[g] + half - 1;
            v[g] = live[g] && at < to[g] ? a[at] : 0xffffffffu;
        }
#pragma unroll
        for (u32 g = 0; g < G; g++) b[g] = v[g] < x[g] ? b[g] + half : b[g];
    }
}

// A long item whose lead holds few candidates in the block's range (at most THREADS):
// every (candidate, list) search at once, in rounds of the lists. A round takes as many of
// the other lists, in slot order, as its slots allow (`small_lists`: nc * lists <= G *
// THREADS and <= AND_FENCE), one search per (candidate, list) slot, AND_G slots a thread side
// by side, each a lower bound over the list's whole range in the block (no fence: the
// searches of one list share their first halvings, which stay in L1). Each slot leaves the
// posting it found (or NO_POS) in sh.fence[candidate * lists + list - first]; then each
// candidate's thread adds the round's impacts (and the lead's, at its place) in slot order,
// so the sum is `and_phase_wide`'s, and the next round reuses the fence. `and_phase_wide`
// searches the lists one after the other, a chain of dependent loads per list: an item of 11
// lists and 100 candidates took 40 µs there (H200 trace). AND_SMALL: the fewest
// lists an item needs to take this path (0: never); AND_SMALL_ROUNDS: the most rounds (1:
// only items whose searches fit one round).
#ifndef AND_SMALL
#define AND_SMALL 3
#endif
#ifndef AND_SMALL_ROUNDS
#define AND_SMALL_ROUNDS 4
#endif
#define NO_POS 0xffffffffu

// Lists a round of `and_small` searches for nc candidates (0: nc too many for one list).
__device__ __forceinline__ u32 small_lists(u32 nc) {
    const u32 slots = AND_G * THREADS < AND_FENCE ? AND_G * THREADS : AND_FENCE;
    return nc == 0 ? 0u : slots / nc;
}

__device__ void and_small(SharedAnd& sh, u32 m, u32 k, u32 lead, const u32* __restrict__ post_ord,
                          const double* __restrict__ post_imp,
                          const double* __restrict__ ord_static) {
    constexpr u32 G = AND_G;
    const u32 tid = threadIdx.x;
    const u32 others = m - 1;
    const u32 c0 = sh.beg[lead];
    const u32 nc = sh.ll[lead] - c0;  // candidates: 1 <= nc <= THREADS, small_lists(nc) >= 1
    const u64 lead_at = sh.ls[lead] + c0;
    const u32 per = small_lists(nc);
    const bool mine = tid < nc;  // this thread's candidate: lead_at + tid
    bool ok = mine;
    double s = 0.0;
    for (u32 first = 0; first < others; first += per) {
        const u32 lists = others - first < per ? others - first : per;
        const u32 slots = nc * lists;
        // Slot t = g * THREADS + tid: candidate t / lists, list first + t % lists (past the
        // lead).
        u32 b[G], n[G], x[G];
        const u32* a[G];
#pragma unroll
        for (u32 g = 0; g < G; g++) {
            const u32 t = g * THREADS + tid;
            const bool live = t < slots;
            const u32 c = live ? t / lists : 0u;
            const u32 j0 = first + (live ? t % lists : 0u);
            const u32 j = j0 < lead ? j0 : j0 + 1;
            a[g] = post_ord + sh.ls[j];
            b[g] = sh.beg[j];
            n[g] = live ? sh.ll[j] - sh.beg[j] : 0u;
            x[g] = live ? post_ord[lead_at + c] : 0u;
        }
        // Branch-free lower bounds of x in a[b, b + n), all of a thread's at once: each step
        // halves every window still longer than one.
        for (;;) {
            bool more = false;
            u32 v[G];
#pragma unroll
            for (u32 g = 0; g < G; g++) {
                more |= n[g] > 1;
                v[g] = n[g] > 1 ? a[g][b[g] + (n[g] >> 1) - 1] : 0u;
            }
            if (!more) break;
#pragma unroll
            for (u32 g = 0; g < G; g++) {
                if (n[g] > 1) {
                    const u32 half = n[g] >> 1;
                    b[g] = v[g] < x[g] ? b[g] + half : b[g];
                    n[g] -= half;
                }
            }
        }
        // The window is one posting (or none): the candidate's posting if it is there.
#pragma unroll
        for (u32 g = 0; g < G; g++) {
            const u32 t = g * THREADS + tid;
            if (t < slots) {
                const u32 j0 = first + t % lists;
                const u32 j = j0 < lead ? j0 : j0 + 1;
                const u32 end = sh.ll[j];
                u32 pos = b[g];
                if (n[g] == 1 && a[g][pos] < x[g]) pos++;
                sh.fence[t] = n[g] != 0 && pos < end && a[g][pos] == x[g] ? pos : NO_POS;
            }
        }
        __syncthreads();
        // The round's lists in slot order, the lead's impact at its place (before the list
        // past it, or after the last list when it is the last).
        for (u32 i = 0; i < lists && ok; i++) {
            const u32 j0 = first + i;
            if (j0 == lead) s += post_imp[lead_at + tid];
            const u32 j = j0 < lead ? j0 : j0 + 1;
            const u32 pos = sh.fence[tid * lists + i];
            if (pos == NO_POS) {
                ok = false;
            } else {
                s += post_imp[sh.ls[j] + pos];
            }
        }
        __syncthreads();  // the fence is the next round's
    }
    if (ok && lead == others) s += post_imp[lead_at + tid];
    room(sh, k);
    if (ok) {
        atomicAdd(&sh.matches, 1u);
        const u32 ord = post_ord[lead_at + tid];
        if (ord_static) s += ord_static[ord];
        offer(sh, s, ord);
    }
}

__device__ void and_phase_wide(SharedAnd& sh, u32 m, u32 k, const u32* __restrict__ post_ord,
                               const double* __restrict__ post_imp,
                               const double* __restrict__ ord_static) {
    constexpr u32 G = AND_G;
    constexpr u32 CHUNK = G * THREADS;
    const u32 tid = threadIdx.x;
    const u32 lead = start_and(sh, m);
    const u32 n = sh.ll[lead];
    const u64 lead_at = sh.ls[lead];
    if (AND_SMALL != 0 && m >= AND_SMALL) {  // block-uniform
        const u32 nc = n - sh.beg[lead];
        const u32 per = small_lists(nc);
        if (nc <= THREADS && per != 0 && m - 1 <= per * AND_SMALL_ROUNDS) {
            and_small(sh, m, k, lead, post_ord, post_imp, ord_static);
            return;
        }
    }
    for (u32 base = sh.beg[lead]; base < n; base += CHUNK) {
        const u32 top = base + CHUNK < n ? base + CHUNK : n;
        // The chunk's last candidate: slice glast, thread tlast.
        const u32 glast = (top - 1 - base) / THREADS;
        const bool last = tid == (top - 1 - base) % THREADS;
        u32 ord[G];
        double s[G];
        bool ok[G];
#pragma unroll
        for (u32 g = 0; g < G; g++) {
            const u32 i = base + g * THREADS + tid;
            ok[g] = i < top;
            ord[g] = ok[g] ? post_ord[lead_at + i] : 0u;
            s[g] = 0.0;
        }
        for (u32 j = 0; j < m; j++) {  // slot order (the sum's); block-uniform
            if (j == lead) {
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    if (ok[g]) s[g] += post_imp[lead_at + base + g * THREADS + tid];
                }
                continue;
            }
            const u32* a = post_ord + sh.ls[j];
            const u32 lo = sh.cur[j], hi = sh.ll[j];
            u32 stride, nf;
            const bool fence = load_fence<AND_FENCE>(sh, a, lo, hi, stride, nf);
            bool live[G];
            bool any = false;
#pragma unroll
            for (u32 g = 0; g < G; g++) {
                live[g] = ok[g] || (last && g == glast);
                any |= live[g];
            }
            if (!any) continue;
            // Each live candidate's window: [b, to), searched as n_win positions.
            u32 b[G], to[G];
            u32 n_win;
            if (fence) {
                n_win = stride - 1;
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    const u32 f0 = fence_below(sh, nf, ord[g]);
                    // f0 == 0: the answer is lo (an empty window there).
                    b[g] = f0 == 0 ? lo : lo + (f0 - 1) * stride + 1;
                    to[g] = f0 == 0 ? lo : (f0 < nf ? lo + f0 * stride : hi);
                }
            } else {
                n_win = hi - lo;
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    b[g] = lo;
                    to[g] = hi;
                }
            }
            u32 pos[G];
            bool hit[G];
            if (n_win == 0) {
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    pos[g] = b[g];
                    hit[g] = live[g] && pos[g] < hi && a[pos[g]] == ord[g];
                }
            } else {
                lower_bounds<G>(a, b, to, ord, live, n_win);
                // The lower bound is b or b + 1 (b <= to <= hi; the window's end, when b
                // reaches it, is read as it is: the fence entry there may be ord itself).
                u32 v[G];
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    v[g] = live[g] && b[g] < hi ? a[b[g]] : 0xffffffffu;
                }
#pragma unroll
                for (u32 g = 0; g < G; g++) {
                    pos[g] = v[g] < ord[g] ? b[g] + 1 : b[g];
                    hit[g] = live[g] && pos[g] < hi &&
                             (pos[g] == b[g] ? v[g] == ord[g] : a[pos[g]] == ord[g]);
                }
            }
            if (last) sh.nxt[j] = pos[glast] + hit[glast];
#pragma unroll
            for (u32 g = 0; g < G; g++) {
                if (ok[g] && hit[g]) {
                    s[g] += post_imp[sh.ls[j] + pos[g]];
                } else {
                    ok[g] = false;
                }
            }
        }
        // The slices in ascending order, room made before each (the tie rule: a candidate
        // offered after a compaction lies above every ordinal offered before it).
#pragma unroll
        for (u32 g = 0; g < G; g++) {
            if (base + g * THREADS >= top) break;  // block-uniform
            if (g > 0) __syncthreads();  // the previous slice's offers are in the count
            room(sh, k);
            if (ok[g]) {
                atomicAdd(&sh.matches, 1u);
                double sg = s[g];
                if (ord_static) sg += ord_static[ord[g]];
                offer(sh, sg, ord[g]);
            }
        }
        __syncthreads();
        if (tid < m && tid != lead) sh.cur[tid] = sh.nxt[tid];
        __syncthreads();  // the next chunk reads the cursors
    }
}

// One block per item (see `Item`): the items are the first n_items of `order` or, when
// `n_items_dev` is not null, the first min(n_items, *n_items_dev) (a device-planned batch
// launches an upper bound of blocks without waiting for `bm25_plan`'s count; the blocks past
// the count return at once). `order[b]` is the item of block b (longest first); query
// q's lists are lists[q_off[q] .. q_off[q + 1]] (1 ..= MAX_TERMS of them, checked by the host).
// Its results: out_count[q] hits at out_doc / out_score[q * k ..], best first; a piece's:
// piece_count[s] hits at piece_ord / piece_score[s * k ..]; an AND_ONLY item also writes its
// match count to and_count[q]. With `n_short_dev` (not null), the last *n_short_dev of those
// items are short (`and_short`): the blocks after the others' take THREADS / 32 of them each.
// The ranking kernels' parameters (`bm25_topk`, `bm25_topk_and`: one list, as the host
// passes it to either), and the same names as arguments.
#define TOPK_PARAMS                                                                             \
    u32 n_items, const u32* __restrict__ n_items_dev, const u32* __restrict__ n_short_dev,      \
        const u32* __restrict__ order, const Item* __restrict__ items,                          \
        const u32* __restrict__ q_off, const unsigned char* __restrict__ q_mode,                \
        const ListRef* __restrict__ lists, const u32* __restrict__ post_ord,                    \
        const double* __restrict__ post_imp, const double* __restrict__ ord_static,             \
        const u32* __restrict__ ord_doc, u32 k, u32* __restrict__ out_count,                    \
        u32* __restrict__ out_doc, double* __restrict__ out_score,                              \
        const double* __restrict__ q_floor, double static_max, u32* __restrict__ piece_count,   \
        u32* __restrict__ piece_ord, double* __restrict__ piece_score,                          \
        u32* __restrict__ and_count, u32* __restrict__ piece_done, u32* __restrict__ claim
#define TOPK_ARGS                                                                               \
    n_items, n_items_dev, n_short_dev, order, items, q_off, q_mode, lists, post_ord, post_imp,  \
        ord_static, ord_doc, k, out_count, out_doc, out_score, q_floor, static_max, piece_count, \
        piece_ord, piece_score, and_count, piece_done, claim

// Unit `u` of `topk_items` (its n_items and n_long, read once per block).
template <bool AND_K, class S>
__device__ void topk_unit(S& sh, const u32 u, const u32 n_items_, const u32 n_long, TOPK_PARAMS) {
    n_items = n_items_;
    const u32 tid = threadIdx.x;
    if (u >= n_long) {
        const u32 w0 = n_long + (u - n_long) * (THREADS / 32);
        if (w0 >= n_items) return;  // block-uniform
        const u32 idx = w0 + (tid >> 5);
        if (idx >= n_items) return;  // warp-uniform; no block barrier follows
        TRACE_START();
        const Item its = items[order[idx]];
        and_short(sh, its, q_off, lists, post_ord, post_imp, ord_static, ord_doc, k, out_count,
                  out_doc, out_score);
        TRACE_END((tid & 31) == 0, idx, its.q, 3u);
        return;
    }
    TRACE_START();
    const Item it = items[order[u]];
    const u32 q = it.q;
    const u32 kind = it.ks >> 30;
    const u32 first = q_off[q];
    const u32 m = q_off[q + 1] - first;
    const u32 mode = q_mode[q];
    if constexpr (!AND_K) {
        for (u32 i = tid; i < TILE; i += THREADS) {
            sh.acc[i] = 0.0;
            sh.cnt[i] = 0;
        }
    }
    // The block's ordinal range, then within each list: its start found by thread j, its end
    // by thread MAX_TERMS + j (two searches side by side).
    const u32 np = it.cut & 0xffffu;
    u32 lo = 0, hi = NONE_ORD;
    if (np > 1) {
        const u64 lead = lists[first + (it.cut >> 16)].start;
        const u64 len = lists[first + (it.cut >> 16)].len;
        if (it.part > 0) lo = post_ord[lead + len * it.part / np];
        if (it.part + 1 < np) hi = post_ord[lead + len * (it.part + 1) / np];
    }
    if (tid < m) {
        const u64 start = lists[first + tid].start;
        const u32 len = lists[first + tid].len;
        sh.ls[tid] = start;
        if constexpr (!AND_K) sh.lm[tid] = (double)lists[first + tid].max;
        sh.beg[tid] = lo == 0 ? 0u : lower_bound(post_ord + start, 0, len, lo);
    } else if (tid >= MAX_TERMS && tid < MAX_TERMS + m) {
        const u32 j = tid - MAX_TERMS;
        const u64 start = lists[first + j].start;
        const u32 len = lists[first + j].len;
        sh.ll[j] = hi == NONE_ORD ? len : lower_bound(post_ord + start, 0, len, hi);
    }
    if (tid == 0) {
        sh.ncand = 0;
        sh.matches = 0;
        sh.theta = -__longlong_as_double(0x7ff0000000000000ULL);
        sh.theta_ord = NONE_ORD;
        if constexpr (!AND_K) sh.floor = q_floor[q];
        if constexpr (AND_K) {
            // A one-term query's floor (positive, or -inf: `bm25_plan`) is at most its k-th best
            // score: the threshold starts just below it, so `score > theta` keeps every score at
            // or above the floor (ties included) and nearly nothing is offered.
            if (m == 1 && q_floor != nullptr && q_floor[q] > 0.0) {
                sh.theta = nextafter(q_floor[q], -__longlong_as_double(0x7ff0000000000000ULL));
            }
        }
    }
    __syncthreads();
    if constexpr (AND_K) {
        // The host launches this kernel for AND batches only: mode 0, no AND_ONLY items.
        and_phase_wide(sh, m, k, post_ord, post_imp, ord_static);
    } else {
        if (kind == PIECE && mode != 0) {
            or_phase(sh, m, k, post_ord, post_imp, ord_static, static_max);
        } else if (mode != 1) {
            and_phase(sh, m, k, post_ord, post_imp, ord_static);
            __syncthreads();
            if (kind == WHOLE && mode == 2 && sh.matches < k) {
                __syncthreads();
                if (tid == 0) {
                    sh.ncand = 0;
                    sh.theta = -__longlong_as_double(0x7ff0000000000000ULL);
                    sh.theta_ord = NONE_ORD;
                }
                __syncthreads();
                or_phase(sh, m, k, post_ord, post_imp, ord_static, static_max);
            }
        } else {
            or_phase(sh, m, k, post_ord, post_imp, ord_static, static_max);
        }
    }
    __syncthreads();
    compact(sh, k);
    const u32 n = sh.ncand;
    if (kind == PIECE) {
        const u32 s = it.ks & PIECE_MASK;
        write_answer(sh, n, (u64)s * k, ord_doc, piece_ord, piece_score, true);
        if (tid == 0) piece_count[s] = n;
    } else {
        write_answer(sh, n, (u64)q * k, ord_doc, out_doc, out_score, false);
        if (tid == 0) {
            out_count[q] = n;
            if (kind == AND_ONLY) and_count[q] = sh.matches;
        }
    }
    // A device-planned batch's split query is merged by the block that completes it: the
    // last of its pieces (and of its AND_ONLY item, for AND-then-OR) to count itself in
    // piece_done[first piece slot] (cleared by `bm25_plan`). An AND_ONLY item carries its
    // query's first piece slot in ks and its piece count in `part`.
    if (piece_done != nullptr && (kind == PIECE || (kind == AND_ONLY && it.part > 1))) {
        const u32 slot = it.ks & PIECE_MASK;
        const u32 p0 = kind == PIECE ? slot - it.part : slot;
        const u32 pieces = kind == PIECE ? np : it.part;
        const u32 expect = pieces + (mode == 2 ? 1u : 0u);
        __threadfence();  // this block's answer is visible before it is counted
        __syncthreads();
        if (tid == 0) sh.last = atomicAdd(piece_done + p0, 1u) + 1 == expect;
        __syncthreads();
        if (sh.last) {  // block-uniform
            __threadfence();
            if (!(mode == 2 && __ldcg(and_count + q) >= k)) {
                merge_query(sh, q, p0, pieces, k, true, piece_count, piece_ord, piece_score,
                            ord_doc, out_count, out_doc, out_score);
            }
        }
    }
    TRACE_END(tid == 0, u, q, kind);
}

// Work units: unit u < n_long is the long item order[u], ranked by the whole block; a unit
// past them is THREADS / 32 short items (`and_short`), a warp each. Without `claim` a block
// runs unit blockIdx.x (the grid covers the units). With it (a device-planned batch, whose
// count of items the host does not know) the grid is what the device holds at once, and each
// block claims units from the counter until none is left: longest first, as ordered, with no
// block launched for the piece slots the plan left unused.
template <bool AND_K>
__device__ __forceinline__ void topk_items(TOPK_PARAMS) {
    __shared__ typename Pick<AND_K, SharedAnd, Shared>::type sh;
    __shared__ u32 unit;
    if (n_items_dev != nullptr && *n_items_dev < n_items) n_items = *n_items_dev;
    u32 n_short = n_short_dev != nullptr ? *n_short_dev : 0u;
    if (n_short > n_items) n_short = n_items;
    const u32 n_long = n_items - n_short;
    const u32 n_units = n_long + (n_short + THREADS / 32 - 1) / (THREADS / 32);
    if (claim == nullptr) {
        if (blockIdx.x < n_units) topk_unit<AND_K>(sh, blockIdx.x, n_items, n_long, TOPK_ARGS);
        return;
    }
    for (;;) {
        if (threadIdx.x == 0) unit = atomicAdd(claim, 1u);
        __syncthreads();
        const u32 u = unit;
        if (u >= n_units) return;  // block-uniform
        topk_unit<AND_K>(sh, u, n_items, n_long, TOPK_ARGS);
        __syncthreads();  // the unit's last reads of `unit` and `sh` before the next claim
    }
}

extern "C" __global__ void __launch_bounds__(THREADS) bm25_topk(TOPK_PARAMS) {
    KERNEL_SPAN(3);
    topk_items<false>(TOPK_ARGS);
}

// The same for a batch of AND queries only (`and_phase_wide`, see above). AND_MIN_BLOCKS:
// the blocks a multiprocessor should hold, a register budget for the compiler (5: at most 51
// registers a thread, where it took 78; the AND k 10 window 0.082-0.092 -> 0.079-0.080 ms on
// an H200, two calls).
#ifndef AND_MIN_BLOCKS
#define AND_MIN_BLOCKS 5
#endif
extern "C" __global__ void __launch_bounds__(THREADS, AND_MIN_BLOCKS) bm25_topk_and(TOPK_PARAMS) {
    KERNEL_SPAN(3);
    topk_items<true>(TOPK_ARGS);
}

// The k best of query q's pieces p0 .. p0 + np (at most CAP / k of them), its answer. Called
// by every thread of the block; `sh`'s candidate buffer is free. With `l2` the pieces are
// read through L2 (`__ldcg`): other blocks of the same launch wrote them (`piece_done`).
template <class S>
__device__ void merge_query(S& sh, u32 q, u32 p0, u32 np, u32 k, bool l2,
                            const u32* __restrict__ piece_count, const u32* __restrict__ piece_ord,
                            const double* __restrict__ piece_score,
                            const u32* __restrict__ ord_doc, u32* __restrict__ out_count,
                            u32* __restrict__ out_doc, double* __restrict__ out_score) {
    const u32 tid = threadIdx.x;
    __syncthreads();  // the buffer's last readers are done
    if (tid == 0) sh.ncand = 0;
    __syncthreads();
    for (u32 i = tid; i < np * k; i += THREADS) {
        const u32 p = p0 + i / k;
        const u32 j = i % k;
        const u32 have = l2 ? __ldcg(piece_count + p) : piece_count[p];
        if (j < have) {
            const u64 at_p = (u64)p * k + j;
            const u32 at = atomicAdd(&sh.ncand, 1u);
            sh.cs[at] = l2 ? __ldcg(piece_score + at_p) : piece_score[at_p];
            sh.co[at] = l2 ? __ldcg(piece_ord + at_p) : piece_ord[at_p];
        }
    }
    __syncthreads();
    compact(sh, k);
    const u32 n = sh.ncand;
    write_answer(sh, n, (u64)q * k, ord_doc, out_doc, out_score, false);
    if (tid == 0) out_count[q] = n;
}

// Split queries, block-strided: split_q[b]'s answer is the k best of the pieces
// split_lo[b] .. split_hi[b] (at most CAP / k of them, checked by the host), unless it is an
// AND-then-OR query whose AND found k matches (its AND_ONLY item has written that answer).
// There are n_split of them or, when `n_split_dev` is not null, min(n_split, *n_split_dev)
// (the device-planned batch's count, not waited for). (A host-staged batch passes its piece
// offsets as split_lo and, one further, split_hi. A device-planned batch's pieces merge
// themselves instead: `piece_done`.)
extern "C" __global__ void __launch_bounds__(THREADS) bm25_merge(
    u32 n_split, const u32* __restrict__ n_split_dev, const u32* __restrict__ split_q,
    const u32* __restrict__ split_lo, const u32* __restrict__ split_hi,
    const unsigned char* __restrict__ q_mode, const u32* __restrict__ and_count, u32 k,
    const u32* __restrict__ piece_count, const u32* __restrict__ piece_ord,
    const double* __restrict__ piece_score, const u32* __restrict__ ord_doc,
    u32* __restrict__ out_count, u32* __restrict__ out_doc, double* __restrict__ out_score) {
    __shared__ Shared sh;
    KERNEL_SPAN(5);
    if (n_split_dev != nullptr && *n_split_dev < n_split) n_split = *n_split_dev;
    for (u32 b = blockIdx.x; b < n_split; b += gridDim.x) {
        const u32 q = split_q[b];
        if (q_mode[q] == 2 && and_count[q] >= k) continue;  // block-uniform
        merge_query(sh, q, split_lo[b], split_hi[b] - split_lo[b], k, false, piece_count,
                    piece_ord, piece_score, ord_doc, out_count, out_doc, out_score);
    }
}

// ---------------------------------------------------------------------------------------
// The batch planned on the device (the whole index resident): the host uploads only each
// query's term ids (CSR) and mode; `bm25_plan` looks the lists up in the resident table of
// every term's ListRef (`refs`), takes the query's floor from the terms' own floors, plans
// the query as the host's `plan` does (src/backend/gpu/bm25.rs: the same work, lead list and
// count of pieces) and writes its items; `bm25_order` puts the items longest first (buckets
// of work, descending). Then `bm25_topk` and `bm25_merge` run as for a host-staged batch.

#define WORK_BUCKETS 256
// counters[]: items, pieces, split queries, term ids beyond the index (an error).
#define C_ITEMS 0
#define C_PIECES 1
#define C_SPLITS 2
#define C_BAD 3
// Written by `bm25_order`: the short items (`and_short`), ordered last.
#define C_SHORT 4
// The blocks of `bm25_pack` that have finished (its clock, below).
#define C_PACKED 5
// The ranking kernel's work units claimed (`topk_items`).
#define C_CLAIM 6
// The batch's start on the device's global timer (ns, a 64-bit word), written by
// `bm25_clear`.
#define C_CLOCK 8

// The device's global timer (ns).
__device__ __forceinline__ unsigned long long device_clock() {
#ifdef BM25_EMU
    return emu_clock_ns();
#else
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
#endif
}

// Buckets of work, four per power of two (the host's `work_bucket`).
__device__ __forceinline__ u32 work_bucket(u64 work) {
    if (work < 4) return (u32)work;
    const u32 lz = 63u - (u32)__clzll((long long)work);
    const u32 frac = (u32)((work >> (lz - 2)) & 3u);
    return 4u * (lz - 1u) + frac;
}

#ifndef AND2_PIECE
#define AND2_PIECE 1024
#endif
// Terms a plan thread looks up side by side (`bm25_plan`).
#ifndef PLAN_CHUNK
#define PLAN_CHUNK 8
#endif
// The most lists of an AND query cut every AND2_PIECE candidates (below).
#ifndef AND_CUT_LISTS
#define AND_CUT_LISTS 2
#endif

// A query the device leaves unranked (q_mode): no terms under its mode's rule, or ranked on
// the CPU. Its answer count stays as the host cleared it (0); it has no items.
#define MODE_NONE 3

// The plan's counters cleared, before `bm25_plan`, when the batch is read where the host
// wrote it (below); a copied-up batch brings them cleared. Its clock word gets the batch's
// start instead (the kernels' window, read back by `bm25_pack`'s last block).
extern "C" __global__ void bm25_clear(u32* __restrict__ counters, u32 n) {
    KERNEL_SPAN(0);
    const u32 tid = threadIdx.x;
    if (n > C_CLOCK + 1 && tid == C_CLOCK) {
        *reinterpret_cast<unsigned long long*>(counters + C_CLOCK) = device_clock();
    } else if (tid < n && !(n > C_CLOCK + 1 && tid == C_CLOCK + 1)) {
        counters[tid] = 0;
    }
}

// One thread per query; each clears its query's answer count (out_count[q]) and turns its
// unknown-term flag (q_flag[q] as the host uploads it: 1 when the query had a term the index
// does not hold) into its mode (0 AND, 1 OR, 2 AND-then-OR, MODE_NONE) in q_mode[q], from the
// batch's mode (`batch_mode`, 0..2). The batch (q_off_in, q_terms, q_flag) is read where the
// host wrote it, across the bus (page-locked, mapped), and its offsets copied into q_off for
// the ranking kernels; or it was copied up, and q_off is q_off_in and q_mode is q_flag (each
// query's flag turned into its mode in place). `term_floor` is null when k has no floors.
// `most` is the most pieces of one query (min(CAP / k, 64)), `piece` the work a piece
// should hold (0: never split). Pieces come from a budget of `max_pieces` slots; a query that
// does not find room in it is ranked whole (exact either way). Splits: split_lo[s] ..
// split_hi[s] are split_q[s]'s piece slots.
extern "C" __global__ void bm25_plan(
    u32 nq, const u32* q_off_in, const u32* __restrict__ q_terms, const unsigned char* q_flag,
    u32* q_off, unsigned char* q_mode, u32 batch_mode, u32 n_terms,
    const ListRef* __restrict__ refs,
    const double* __restrict__ term_floor, double static_max, u32 k, u64 piece, u32 most,
    u32 max_pieces, ListRef* __restrict__ lists, double* __restrict__ q_floor,
    Item* __restrict__ items, unsigned char* __restrict__ keys, u32* __restrict__ split_q,
    u32* __restrict__ split_lo, u32* __restrict__ split_hi, u32* __restrict__ counters,
    u32* __restrict__ out_count, u32* __restrict__ piece_done) {
    KERNEL_SPAN(1);
    const u32 q = blockIdx.x * blockDim.x + threadIdx.x;
    if (q >= nq) return;
    out_count[q] = 0;  // a query left unranked answers empty; the ranking kernels come after
    const u32 first = q_off_in[q];
    const u32 end = q_off_in[q + 1];
    // The query's mode from its unknown-term flag (the host's `Bm25Batch::terms` and `mode`):
    // under AND an unknown term leaves no terms; AND-then-OR with one is OR. Unranked: no
    // terms, or more than MAX_TERMS (the host ranks those on the CPU).
    const bool unknown = q_flag[q] != 0;
    if (q_off != q_off_in) {
        q_off[q] = first;
        if (q + 1 == nq) q_off[nq] = end;
    }
    const u32 m = batch_mode == 0 && unknown ? 0u : end - first;
    const u32 mode = m == 0 || m > MAX_TERMS ? MODE_NONE : (batch_mode == 2 && unknown ? 1u : batch_mode);
    q_mode[q] = (unsigned char)mode;  // for the ranking kernels, launched after this one
    if (mode == MODE_NONE) return;
    const double neg_inf = -__longlong_as_double(0x7ff0000000000000ULL);
    double floor = neg_inf;
    const bool floored = mode != 0 || m == 1;
    // PLAN_CHUNK terms at a time, each step's loads side by side: the term ids (across the
    // bus), then their lists and floors, rather than one term's chain of loads after another
    // (H200 trace: the plan 13.0 -> 12.3 µs for 10,000 AND queries; most of the
    // rest is the reads across the bus, the plan taking 6.0 µs on a copy in device memory).
    for (u32 j0 = 0; j0 < m; j0 += PLAN_CHUNK) {
        u32 t[PLAN_CHUNK];
#pragma unroll
        for (u32 i = 0; i < PLAN_CHUNK; i++) t[i] = j0 + i < m ? q_terms[first + j0 + i] : 0u;
        bool bad = false;
#pragma unroll
        for (u32 i = 0; i < PLAN_CHUNK; i++) bad |= j0 + i < m && t[i] >= n_terms;
        if (bad) {
            atomicAdd(&counters[C_BAD], 1u);
            return;
        }
        ListRef r[PLAN_CHUNK];
#pragma unroll
        for (u32 i = 0; i < PLAN_CHUNK; i++) {
            if (j0 + i < m) r[i] = refs[t[i]];
        }
        if (term_floor != nullptr && floored) {
            double f[PLAN_CHUNK];
#pragma unroll
            for (u32 i = 0; i < PLAN_CHUNK; i++) f[i] = j0 + i < m ? term_floor[t[i]] : neg_inf;
#pragma unroll
            for (u32 i = 0; i < PLAN_CHUNK; i++) floor = fmax(floor, f[i]);
        }
#pragma unroll
        for (u32 i = 0; i < PLAN_CHUNK; i++) {
            if (j0 + i < m) lists[first + j0 + i] = r[i];
        }
    }
    // `Scored::floor_of_terms`: the largest own floor, if positive. AND reads it for a one-term
    // query only (`bm25_topk_and`): its answer is its list's top k, whose k-th score the floor
    // bounds from below; the floor of one of several terms bounds nothing under AND.
    if (!(floor > 0.0) || !floored) floor = neg_inf;
    q_floor[q] = floor;
    // `plan`: the work (candidates times the lists each is searched in) and the lead list.
    const u64 searched = m > 1 ? m - 1 : 1;
    u64 work = 0;
    u32 lead = 0;
    bool can_split = true;
    u64 shortest = ~0ull;
    if (mode == 0) {
        for (u32 j = 0; j < m; j++) {
            if ((u64)lists[first + j].len < shortest) {
                shortest = lists[first + j].len;
                lead = j;
            }
        }
        work = m == 0 ? 0 : shortest * searched;
    } else if (floor == neg_inf) {
        // The sweep, never split.
        for (u32 j = 0; j < m; j++) work += lists[first + j].len;
        can_split = false;
    } else {
        u64 essential = m >= 64 ? ~0ull : (1ull << m) - 1;
        const double cut = floor - 1e-12 * fabs(floor);
        double sum = static_max;
        while (essential != 0) {
            u32 best = 64;
            for (u32 j = 0; j < m; j++) {
                if ((essential >> j & 1) &&
                    (best == 64 || (double)lists[first + j].max < (double)lists[first + best].max)) {
                    best = j;
                }
            }
            const double mx = (double)lists[first + best].max;
            if (sum + mx > cut) break;
            sum += mx;
            essential &= ~(1ull << best);
        }
        if (essential == 0) {
            can_split = false;  // nothing can reach the floor
        } else {
            u64 lens = 0, longest = 0;
            for (u32 j = 0; j < m; j++) {
                if (essential >> j & 1) {
                    const u64 l = lists[first + j].len;
                    lens += l;
                    if (l >= longest) {  // the last longest, as the host's max_by_key
                        longest = l;
                        lead = j;
                    }
                }
            }
            work = lens * searched;
        }
    }
    u32 pieces = 1;
    if (can_split && piece != 0 && most >= 2) {
        u64 p = (work + piece - 1) / piece;
        // A two-list AND query is also cut every AND2_PIECE candidates: its chunks of
        // AND_G * THREADS candidates cost ~14 µs each alone on a multiprocessor (fence, search,
        // offers of a dense intersection), where the work above prices them as a few-list
        // query's searches (H200 trace: 3,626 candidates, unsplit, the AND batch's
        // last block at 56 µs). The host-staged path's `plan` does not cut them.
        if (mode == 0 && m >= 2 && m <= AND_CUT_LISTS && AND2_PIECE != 0) {
            const u64 p2 = (shortest + AND2_PIECE - 1) / AND2_PIECE;
            p = p2 > p ? p2 : p;
        }
        pieces = p < 1 ? 1u : (p > most ? most : (u32)p);
    }
    // The query's slots, taken only when they all fit (a query refused takes none, so a
    // smaller one planned later may still find room); no room: ranked whole.
    u32 base = 0;
    if (pieces > 1) {
        u32 seen = *(volatile u32*)&counters[C_PIECES];
        for (;;) {
            if (seen + pieces > max_pieces) {
                pieces = 1;
                break;
            }
            const u32 was = atomicCAS(&counters[C_PIECES], seen, seen + pieces);
            if (was == seen) {
                base = seen;
                break;
            }
            seen = was;
        }
    }
    // Keys: work buckets from 1 (at most 252); 0 marks a short item (`and_short`), which
    // `bm25_order` puts last.
    if (pieces == 1) {
        const u32 at = atomicAdd(&counters[C_ITEMS], 1u);
        items[at] = Item{q, 0, 1, WHOLE << 30};
        const bool short_and = mode == 0 && m <= SHORT_TERMS && shortest <= SHORT_LEAD;
        keys[at] = short_and ? (unsigned char)0 : (unsigned char)(work_bucket(work) + 1u);
        return;
    }
    const bool and_or = mode == 2;
    const unsigned char key = (unsigned char)(work_bucket(work / pieces) + 1u);
    piece_done[base] = 0;  // `bm25_topk`'s count of the query's completed blocks
    u32 at = atomicAdd(&counters[C_ITEMS], pieces + (and_or ? 1u : 0u));
    if (and_or) {
        // Its query's first piece slot and piece count, for `piece_done`.
        items[at] = Item{q, pieces, 1, (AND_ONLY << 30) | base};
        keys[at++] = key;
    }
    for (u32 j = 0; j < pieces; j++) {
        items[at + j] = Item{q, j, lead << 16 | pieces, (PIECE << 30) | (base + j)};
        keys[at + j] = key;
    }
    const u32 s = atomicAdd(&counters[C_SPLITS], 1u);
    split_q[s] = q;
    split_lo[s] = base;
    split_hi[s] = base + pieces;
}

// One block: order[] lists the items longest first (descending buckets of work; within a
// bucket in any order: the order only schedules, every answer is exact). The plan's counters
// are final here: with `counters_host` (the host's pinned memory, or null) the block also
// writes them there, so that the host reads them after its one wait with no copy down.
extern "C" __global__ void __launch_bounds__(1024) bm25_order(
    u32* __restrict__ counters, const unsigned char* __restrict__ keys,
    u32* __restrict__ order, u32* __restrict__ counters_host) {
    KERNEL_SPAN(2);
    __shared__ u32 at[WORK_BUCKETS];
    const u32 tid = threadIdx.x;
    const u32 n = counters[C_ITEMS];
    if (counters_host != nullptr && tid < 4) counters_host[tid] = counters[tid];
    for (u32 b = tid; b < WORK_BUCKETS; b += blockDim.x) at[b] = 0;
    __syncthreads();
    for (u32 i = tid; i < n; i += blockDim.x) atomicAdd(&at[keys[i]], 1u);
    __syncthreads();
    if (tid == 0) {  // the short items (key 0) come last; `bm25_topk` reads their count
        counters[C_SHORT] = at[0];
        if (counters_host != nullptr) counters_host[C_SHORT] = at[0];
    }
    // Each bucket's first place, from the longest: the first warp scans the buckets in
    // descending order, WORK_BUCKETS / 32 consecutive ones a lane (one thread's serial scan
    // of the 256 took ~4 us).
    if (tid < 32) {
        constexpr u32 PER = WORK_BUCKETS / 32;
        u32 c[PER];
        u32 sum = 0;
        for (u32 p = 0; p < PER; p++) {
            c[p] = at[WORK_BUCKETS - 1 - (tid * PER + p)];
            sum += c[p];
        }
        u32 x = sum;
        for (u32 d = 1; d < 32; d <<= 1) {
            const u32 y = __shfl_up_sync(0xffffffffu, x, d);
            if (tid >= d) x += y;
        }
        u32 run = x - sum;
        for (u32 p = 0; p < PER; p++) {
            at[WORK_BUCKETS - 1 - (tid * PER + p)] = run;
            run += c[p];
        }
    }
    __syncthreads();
    for (u32 i = tid; i < n; i += blockDim.x) order[atomicAdd(&at[keys[i]], 1u)] = i;
}

// ---------------------------------------------------------------------------------------
// The answers packed for the copy down: after `bm25_topk` / `bm25_merge`, query q's hits lie
// at out_doc / out_score[q * k ..] (out_count[q] of them). The host reads them as one flat
// list (its `Ranked`, the Arrow list's layout): `bm25_pack` writes each query's first
// position and moves the hits there, so that the host copies two dense runs instead of a
// short run per query (10,000 small copies out of memory the copy down has just written).

#define PACK_QUERIES 256
// At most this many blocks: each block sums the counts of every query before its own, so
// the reads grow with blocks x queries (10,000 queries: 40 blocks, ~200,000 reads of 40 KB
// that sit in L2).
#ifndef PACK_BLOCKS
#define PACK_BLOCKS 64
#endif

__device__ __forceinline__ u32 hits_of(u32 count, u32 k) { return count < k ? count : k; }

// Exclusive scan of one value a thread over the block (PACK_QUERIES threads); *total gets
// the sum. Every thread calls it; `wsum` is free on entry and on return.
__device__ __forceinline__ u32 block_exclusive(u32 v, u32* wsum, u32* total) {
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    constexpr u32 WARPS = PACK_QUERIES / 32;
    u32 x = v;
    for (u32 d = 1; d < 32; d <<= 1) {
        const u32 y = __shfl_up_sync(0xffffffffu, x, d);
        if (lane >= d) x += y;
    }
    if (lane == 31) wsum[warp] = x;
    __syncthreads();
    u32 before = 0, all = 0;
    for (u32 w = 0; w < WARPS; w++) {
        const u32 t = wsum[w];
        before += w < warp ? t : 0u;
        all += t;
    }
    *total = all;
    __syncthreads();  // wsum is read by every thread before anyone writes it again
    return before + x - v;
}

// The answers packed in one launch: off[q] = hits of the queries before q, off[n] = all hits,
// and the hits of every query moved to pk_doc / pk_score[off[q] ..] (at most k a query: a
// count above k, never written by the kernels above, is read as k and marked: off[0] is
// then not 0, which the host refuses). `off_copy` (the host's pinned memory, or null) gets
// the offsets too. Block b of the grid (at most PACK_BLOCKS) takes `per` consecutive queries
// (a multiple of PACK_QUERIES): it sums the hits of all queries before its first (reads side
// by side, nothing to wait for from other blocks), then, PACK_QUERIES at a time, scans its
// own, writes their offsets and moves their hits, each warp's stores consecutive (the packed
// answers may lie in the host's pinned memory, written across the bus). off[0] is written by
// the block holding the last query, the only one that has read every count. (Two kernels
// before, one block scanning every count: ~13 + 5 us for 10,000 queries on an H100.)
__device__ __forceinline__ void pack_answers(
    u32 n, u32 k, const u32* __restrict__ count, u32* __restrict__ off,
    u32* __restrict__ off_copy, const u32* __restrict__ out_doc,
    const double* __restrict__ out_score, u32* __restrict__ pk_doc,
    double* __restrict__ pk_score) {
    __shared__ u32 so[PACK_QUERIES + 1];
    __shared__ u32 wsum[PACK_QUERIES / 32];
    __shared__ u32 above_k;
    const u32 tid = threadIdx.x;
    if (n == 0) {
        if (blockIdx.x == 0 && tid == 0) {
            off[0] = 0;
            if (off_copy != nullptr) off_copy[0] = 0;
        }
        return;
    }
    const u32 blocks = (n + PACK_QUERIES - 1) / PACK_QUERIES;
    const u32 grid = blocks < PACK_BLOCKS ? blocks : PACK_BLOCKS;
    const u32 per = (n + grid - 1) / grid;
    const u32 per_r = (per + PACK_QUERIES - 1) / PACK_QUERIES * PACK_QUERIES;
    const u32 q0 = blockIdx.x * per_r;
    if (q0 >= n) return;  // block-uniform
    const u32 q1 = n - q0 < per_r ? n : q0 + per_r;
    if (tid == 0) above_k = 0;
    // The hits before q0.
    u32 mine = 0;
    bool above = false;
#pragma unroll 8
    for (u32 i = tid; i < q0; i += PACK_QUERIES) {
        const u32 c = count[i];
        above |= c > k;
        mine += hits_of(c, k);
    }
    u32 carry;
    block_exclusive(mine, wsum, &carry);
    for (u32 c0 = q0; c0 < q1; c0 += PACK_QUERIES) {
        const u32 nb = q1 - c0 < PACK_QUERIES ? q1 - c0 : PACK_QUERIES;
        const u32 i = c0 + tid;
        u32 h = 0;
        if (tid < nb) {
            const u32 c = count[i];
            above |= c > k;
            h = hits_of(c, k);
        }
        u32 total;
        const u32 at = carry + block_exclusive(h, wsum, &total);
        if (tid < nb) so[tid] = at;
        if (tid == 0) so[nb] = carry + total;
        if (tid < nb && i > 0) {
            off[i] = at;
            if (off_copy != nullptr) off_copy[i] = at;
        }
        __syncthreads();
        const u32 lo = so[0], hi = so[nb];
        for (u32 p = lo + tid; p < hi; p += PACK_QUERIES) {
            // The last query of the chunk starting at or before p (queries with no hits
            // share their start with the next one).
            u32 a = 0, b = nb;  // so[a] <= p < so[b]
            while (b - a > 1) {
                const u32 m = (a + b) / 2;
                if (so[m] <= p) a = m; else b = m;
            }
            const u64 from = (u64)(c0 + a) * k + (p - so[a]);
            pk_doc[p] = out_doc[from];
            pk_score[p] = out_score[from];
        }
        carry += total;
        __syncthreads();  // so[] is rewritten by the next chunk
    }
    if (above) above_k = 1;
    __syncthreads();
    if (q1 == n && tid == 0) {
        const u32 first = above_k ? 0xffffffffu : 0u;
        off[0] = first;
        off[n] = carry;
        if (off_copy != nullptr) {
            off_copy[0] = first;
            off_copy[n] = carry;
        }
    }
}

// `pack_answers`, then the batch's clock: with `clock_host` (the host's pinned memory, or
// null) the last block to finish writes there the batch's start (counters[C_CLOCK], from
// `bm25_clear`) and its own end on the global timer, so that the host times the kernels
// without timing events (each cost the host's launch ~3 us). The last block is
// the one whose count of finished blocks (counters[C_PACKED], cleared with the counters)
// reaches the grid: every other block has finished by then.
extern "C" __global__ void __launch_bounds__(PACK_QUERIES) bm25_pack(
    u32 n, u32 k, const u32* __restrict__ count, u32* __restrict__ off,
    u32* __restrict__ off_copy, const u32* __restrict__ out_doc,
    const double* __restrict__ out_score, u32* __restrict__ pk_doc,
    double* __restrict__ pk_score, u32* __restrict__ counters,
    unsigned long long* __restrict__ clock_host) {
    KERNEL_SPAN(4);
    pack_answers(n, k, count, off, off_copy, out_doc, out_score, pk_doc, pk_score);
    if (clock_host != nullptr && threadIdx.x == 0) {
        if (atomicAdd(&counters[C_PACKED], 1u) == gridDim.x - 1) {
            clock_host[0] = *reinterpret_cast<volatile unsigned long long*>(counters + C_CLOCK);
            clock_host[1] = device_clock();
        }
    }
}
