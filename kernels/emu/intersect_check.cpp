// CPU check of kernels/intersect.cu (scripts/emulate-kernels.sh): the kernels run under
// kernels/emu/emu.h on random batches and every row is compared with a reference.
#include "emu.h"
#include "../intersect.cu"
#include <random>
#include <algorithm>
#include <set>
#include <string>
using namespace std;

static void scan(const u64* in, u64 n, u64* out) {
    u64 blocks = (n + SCAN_SEG - 1) / SCAN_SEG;
    vector<u64> partials(blocks + 1);
    u64* pp = partials.data();
    launch(blocks, SCAN_THREADS, [&] { scan_partials(in, n, pp); });
    launch(1, SCAN_THREADS, [&] { scan_partials_single(pp, blocks); });
    launch(blocks, SCAN_THREADS, [&] { scan_apply(in, n, pp, out); });
}

template <typename W, bool SIGNED>
struct K;
template <> struct K<u32, false> {
    static void part(u32 n, u32 t, const u64* as, const u32* ar, const u32* av, const u32* bv, const u64* ap, const u64* al, const u64* bp, const u64* bl, TileDesc* d) { partition_u32(n, t, as, ar, av, bv, ap, al, bp, bl, d); }
    template <class... A> static void merge(A... a) { merge_u32(a...); }
    template <class... A> static void merge_known(A... a) { merge_known_u32(a...); }
    template <class... A> static void wmerge(A... a) { wmerge_u32(a...); }
    template <class... A> static void place(A... a) { wplace_32(a...); }
    template <class... A> static void gather(A... a) { gather_32(a...); }
    template <class... A> static void order(A... a) { row_order_u32_o32(a...); }
};
template <> struct K<u32, true> {
    static void part(u32 n, u32 t, const u64* as, const u32* ar, const u32* av, const u32* bv, const u64* ap, const u64* al, const u64* bp, const u64* bl, TileDesc* d) { partition_i32(n, t, as, ar, av, bv, ap, al, bp, bl, d); }
    template <class... A> static void merge(A... a) { merge_i32(a...); }
    template <class... A> static void merge_known(A... a) { merge_known_i32(a...); }
    template <class... A> static void wmerge(A... a) { wmerge_i32(a...); }
    template <class... A> static void place(A... a) { wplace_32(a...); }
    template <class... A> static void gather(A... a) { gather_32(a...); }
    template <class... A> static void order(A... a) { row_order_i32_o32(a...); }
};
template <> struct K<u64, false> {
    static void part(u32 n, u32 t, const u64* as, const u32* ar, const u64* av, const u64* bv, const u64* ap, const u64* al, const u64* bp, const u64* bl, TileDesc* d) { partition_u64(n, t, as, ar, av, bv, ap, al, bp, bl, d); }
    template <class... A> static void merge(A... a) { merge_u64(a...); }
    template <class... A> static void merge_known(A... a) { merge_known_u64(a...); }
    template <class... A> static void wmerge(A... a) { wmerge_u64(a...); }
    template <class... A> static void place(A... a) { wplace_64(a...); }
    template <class... A> static void gather(A... a) { gather_64(a...); }
    template <class... A> static void order(A... a) { row_order_u64_o32(a...); }
};

// rows[r][j] = list j of row r (values as W bit patterns); valid[r]. known: which lists get
// row-order flags (bit j: list j; computed by row_order and checked against the rows), as a
// resident column has them; ratio: plan's search ratio (0: no row searches B); warp: the step
// runs wmerge, as the host does when every list is known (ratio's bit 31 for plan).
// wmerge's pieces, as the host's `WPieces`: `hi` A positions halved (down to `lo`) until a step
// has `want` pieces; lo == hi fixes the size. wmerge's blocks: a warp per piece the step can
// have, as the host launches it; wplace's: at most g_wblocks (the host caps them per
// multiprocessor), so that its warps stride over several pieces each.
static u32 g_wlo = 256, g_whi = 256;
static u64 g_wwant = 1;
static u32 g_wblocks = 3;
static void fixed_pieces(u32 p) { g_wlo = g_whi = p; }
// The piece size each wmerge step took (printed with the case).
static vector<u64> g_steps;
// As the host: look-back states kept from launch to launch (never cleared: each launch has
// its own epoch), for plan_scan's blocks and wmerge's pieces.
static vector<u64> g_row_states(1 << 16), g_piece_states(1 << 16);
static u32 g_epoch = 0;

template <typename W, bool SIGNED>
int run_case(const vector<vector<vector<W>>>& rows, const vector<bool>& valid, bool counts, u32 known, u32 ratio, const char* name, bool warp = false) {
    u32 n = rows.size();
    u32 k = rows[0].size();
    // input: per list a values section, offsets start at 7 (sliced-like)
    vector<W> in;
    vector<vector<int>> offs(k);
    vector<i64> bases(k);
    for (u32 j = 0; j < k; j++) {
        size_t sec = in.size();
        int o = 7;
        offs[j].push_back(o);
        for (u32 r = 0; r < n; r++) {
            for (W v : rows[r][j]) in.push_back(v);
            o += rows[r][j].size();
            offs[j].push_back(o);
        }
        bases[j] = (i64)sec - 7;
    }
    in.push_back(0);
    vector<u64> ptrs(k);
    for (u32 j = 0; j < k; j++) ptrs[j] = (u64)offs[j].data();
    int bad = 0;
    vector<vector<u8>> ord(k, vector<u8>(n, 1));
    vector<u64> ords(k, 0);
    for (u32 j = 0; j < k; j++) {
        if (!((known >> j) & 1)) continue;
        const W* vals = in.data() + bases[j];
        const int* of = offs[j].data();
        u8* so = ord[j].data();
        launch(3, 64, [&] { K<W, SIGNED>::order(vals, of, (u64)n, so); });
        for (u32 r = 0; r < n; r++) {
            bool inc = true;
            for (size_t i = 1; i < rows[r][j].size(); i++)
                if (to_key<W, SIGNED>(rows[r][j][i - 1]) >= to_key<W, SIGNED>(rows[r][j][i])) inc = false;
            if (inc != (ord[j][r] != 0)) { printf("%s row %u list %u: row_order says %d\n", name, r, j, ord[j][r]); bad++; }
        }
        ords[j] = (u64)so;
    }
    vector<u8> vbits((n + 7) / 8 + 1);
    for (u32 r = 0; r < n; r++) if (valid[r]) vbits[r >> 3] |= 1 << (r & 7);
    size_t cap = SIZE_MAX, maxb = 0;
    for (u32 j = 0; j < k; j++) { size_t c = offs[j][n] - offs[j][0]; cap = min(cap, c); maxb = max(maxb, c); }
    u64 tiles_max = max<u64>((cap + maxb + TILE - 1) / TILE, 1);
    // As the host (`WPieces::pieces_max`): fewer than 2 want pieces once the size was halved,
    // and never more than pieces of `lo`.
    const u64 pieces_max = max<u64>(min<u64>(max<u64>((cap + g_whi - 1) / g_whi, g_wlo < g_whi ? 2 * g_wwant : 0), (cap + g_wlo - 1) / g_wlo), 1);
    if (warp) tiles_max = pieces_max;
    const u32 plan_ratio = warp ? (ratio | 0x80000000u) : ratio;
    vector<u32> sel(n), act_row(n);
    vector<u64> a_pos(n), a_len(n), b_pos(n), b_len(n), plen(n), nz(n), act_at(n + 1), act_len(n), act_start(n + 1), row_cnt(n);
    vector<TileDesc> descs(tiles_max);
    // Poisoned: every entry the scan and gather read must be written by the step's kernels
    // (the device reuses these buffers from call to call).
    vector<u64> tile_cnt(tiles_max, ~0ull), tile_pos(tiles_max, ~0ull), tile_excl(tiles_max + 1);
    vector<W> scratch(cap + 1), res0(cap + 1), res1(cap + 1), outv(cap + 1);
    vector<u64> roff0(n + 1), roff1(n + 1), outoff(n + 1);
    vector<u8> flags(n);
    u64 scratch_top = 0; u32 err = 0, wsize = 5;
    W* res[2] = {res0.data(), res1.data()};
    u64* roff[2] = {roff0.data(), roff1.data()};
    for (u32 step = 1; step < k; step++) {
        bool last = step == k - 1;
        u64* prev_off = roff[(step + 1) % 2];
        u64* this_off = last ? outoff.data() : roff[step % 2];
        const W* a_vals = step == 1 ? in.data() : res[(step + 1) % 2];
        W* dst = last ? (counts ? nullptr : outv.data()) : res[step % 2];
        W* scr = dst ? scratch.data() : nullptr;
        // As the host: the warp step's plan and scan in one launch (rows not compacted; the
        // flags cleared by it at step 1, poisoned here first).
        if (warp) {
            if (step == 1) { fill(flags.begin(), flags.end(), (u8)7); err = 5; fill(sel.begin(), sel.end(), 99u); }
            // The rows' plans poisoned too: wmerge reads only what plan_scan wrote (it writes
            // no plen, nz or row_cnt).
            for (auto* v : {&a_pos, &a_len, &b_pos, &b_len}) fill(v->begin(), v->end(), 0x5a5a5a5a5a5aull);
            const u32 ep = ++g_epoch;
            u8* fl = step == 1 ? flags.data() : nullptr;
            u64* rs = g_row_states.data();
            launch((n + PSCAN - 1) / PSCAN, PSCAN, [&] { plan_scan_o32(n, k, step, ptrs.data(), bases.data(), vbits.data(), 0, prev_off, ords.data(), plan_ratio, sel.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), plen.data(), nz.data(), row_cnt.data(), act_start.data(), rs, ep, fl, &err, g_wlo, g_whi, g_wwant, &wsize); });
        } else {
            launch((n + 255) / 256, 256, [&] { plan_o32(n, k, step, ptrs.data(), bases.data(), vbits.data(), 0, prev_off, ords.data(), plan_ratio, sel.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), plen.data(), nz.data(), row_cnt.data()); });
            scan(nz.data(), n, act_at.data());
            launch((n + 255) / 256, 256, [&] { compact_rows(n, plen.data(), act_at.data(), act_row.data(), act_len.data()); });
            scan(act_len.data(), n, act_start.data());
        }
        scratch_top = 0;
        if (warp) {
            // As the host: the piece states of earlier launches left in place (a new epoch);
            // the step's offsets poisoned (the device reuses the buffer: wmerge must write
            // every entry).
            fill(this_off, this_off + n + 1, ~0ull);
            const u32 ep = ++g_epoch;
            u64* ps = g_piece_states.data();
            // The piece counts poisoned too: wplace must read only what wmerge wrote.
            fill(tile_cnt.begin(), tile_cnt.end(), ~0ull);
            fill(tile_pos.begin(), tile_pos.end(), ~0ull);
            const u64 full = (pieces_max * 32 + WBLOCK - 1) / WBLOCK;
            const u32 wblocks = full, pblocks = min<u64>(full, g_wblocks);
            launch(wblocks, WBLOCK, [&] { K<W, SIGNED>::wmerge(n, &wsize, pieces_max, act_start.data(), a_vals, in.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), tile_cnt.data(), tile_pos.data(), (u64)cap, flags.data(), scr, this_off, &err); });
            launch(pblocks, WBLOCK, [&] { K<W, SIGNED>::place(n, &wsize, pieces_max, act_start.data(), tile_cnt.data(), tile_pos.data(), ps, ep, (const W*)scr, dst, this_off); });
            const u64 total = act_start[n];
            u64 wp = g_whi;
            while (wp / 2 >= g_wlo && total / wp < g_wwant) wp >>= 1;
            const u64 np = total == 0 ? 1 : (total + wp - 1) / wp;
            if (wsize != wp) { printf("%s step %u: pieces of %u, want %llu\n", name, step, wsize, (unsigned long long)wp); bad++; }
            g_steps.push_back(wp);
        } else {
        launch(2, 256, [&] { K<W, SIGNED>::part(n, TILE, act_start.data(), act_row.data(), a_vals, in.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), descs.data()); });
        // As the host: the known-order merge when a list has row-order flags.
        if (known != 0) {
            launch(tiles_max, THREADS, [&] { K<W, SIGNED>::merge_known(n, act_start.data(), act_row.data(), a_vals, in.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), descs.data(), row_cnt.data(), tile_cnt.data(), tile_pos.data(), &scratch_top, (u64)cap, flags.data(), scr, &err); });
        } else {
            launch(tiles_max, THREADS, [&] { K<W, SIGNED>::merge(n, act_start.data(), act_row.data(), a_vals, in.data(), a_pos.data(), a_len.data(), b_pos.data(), b_len.data(), descs.data(), row_cnt.data(), tile_cnt.data(), tile_pos.data(), &scratch_top, (u64)cap, flags.data(), scr, &err); });
        }
        }
        if (dst && !warp) {
            scan(tile_cnt.data(), tiles_max, tile_excl.data());
            launch((tiles_max * 32 + 255) / 256, 256, [&] { K<W, SIGNED>::gather(tiles_max, tile_cnt.data(), tile_pos.data(), tile_excl.data(), (const W*)scratch.data(), dst); });
        }
        if (!warp) scan(row_cnt.data(), n, this_off);
    }
    if (err) { printf("%s: err set\n", name); return 1; }
    // Arrow offsets: from 0, never decreasing, ending within the output.
    if (outoff[0] != 0) { printf("%s: first offset %llu\n", name, (unsigned long long)outoff[0]); bad++; }
    for (u32 r = 0; r < n; r++)
        if (outoff[r + 1] < outoff[r]) { printf("%s row %u: offsets decrease\n", name, r); return bad + 1; }
    if (outoff[n] > cap) { printf("%s: %llu results, more than %zu\n", name, (unsigned long long)outoff[n], cap); return bad + 1; }
    u64 searching = 0;
    for (u32 r = 0; r < n; r++) searching += (b_len[r] & LEN_SEARCH) ? 1 : 0;  // last step's
    for (u32 r = 0; r < n; r++) {
        bool sorted = true;
        for (u32 j = 0; j < k; j++)
            for (size_t i = 1; i < rows[r][j].size(); i++) {
                W x = to_key<W, SIGNED>(rows[r][j][i - 1]), y = to_key<W, SIGNED>(rows[r][j][i]);
                if (x >= y) sorted = false;
            }
        // a NULL row or one with an empty list is never looked at
        bool any_empty = false;
        for (u32 j = 0; j < k; j++) any_empty |= rows[r][j].empty();
        bool looked = valid[r] && !any_empty;
        if (!looked) {
            if (outoff[r + 1] != outoff[r]) { printf("%s row %u: not looked at but %llu results\n", name, r, outoff[r + 1] - outoff[r]); bad++; }
            if (flags[r]) { printf("%s row %u: not looked at but flagged\n", name, r); bad++; }
            continue;
        }
        if (!sorted) {
            // The first step must flag it when the unsorted list is A or B of a row looked at.
            // (Later steps only see lists still in play; an unsorted list in a row whose
            // intermediate result went empty is never read -- allowed, the CPU redoes flagged
            // rows only.) We require a flag when step 1's lists are unsorted.
            continue;
        }
        if (flags[r]) { printf("%s row %u: sorted but flagged\n", name, r); bad++; continue; }
        // reference
        vector<W> acc = rows[r][0];
        for (u32 j = 1; j < k; j++) {
            vector<W> nx;
            set<W> b(rows[r][j].begin(), rows[r][j].end());
            for (W v : acc) if (b.count(v)) nx.push_back(v);
            acc = nx;
        }
        u64 c = outoff[r + 1] - outoff[r];
        if (c != acc.size()) { printf("%s row %u: count %llu want %zu\n", name, r, c, acc.size()); bad++; continue; }
        if (!counts) for (size_t i = 0; i < c; i++) if (outv[outoff[r] + i] != acc[i]) { printf("%s row %u: value %zu differs\n", name, r, i); bad++; break; }
    }
    // unsorted rows in step 1's lists must be flagged
    for (u32 r = 0; r < n; r++) {
        if (!valid[r]) continue;
        bool any_empty = false;
        for (u32 j = 0; j < k; j++) any_empty |= rows[r][j].empty();
        if (any_empty) continue;
        // step 1 lists: shortest (first of equal) and the first other
        u32 s = 0;
        for (u32 j = 1; j < k; j++) if (rows[r][j].size() < rows[r][s].size()) s = j;
        u32 bj = s == 0 ? 1 : 0;
        bool uns = false;
        for (u32 j : {s, bj})
            for (size_t i = 1; i < rows[r][j].size(); i++)
                if (to_key<W, SIGNED>(rows[r][j][i - 1]) >= to_key<W, SIGNED>(rows[r][j][i])) uns = true;
        if (uns && !flags[r]) { printf("%s row %u: unsorted but not flagged\n", name, r); bad++; }
    }
    string sizes;
    for (u64 wp : g_steps) sizes += " " + to_string(wp);
    g_steps.clear();
    printf("%s: n=%u k=%u known=%u ratio=%u tiles_max=%llu total=%llu searching=%llu results=%llu pieces%s bad=%d\n", name, n, k, known, ratio, tiles_max, (unsigned long long)act_start[n], (unsigned long long)searching, (unsigned long long)outoff[n], warp ? sizes.c_str() : " -", bad);
    return bad;
}

template <typename W>
vector<W> sorted_list(mt19937_64& g, size_t len, u64 lo_gap, u64 hi_gap, W start) {
    vector<W> v;
    W x = start;
    uniform_int_distribution<u64> gap(lo_gap, hi_gap);
    for (size_t i = 0; i < len; i++) { x += (W)gap(g); v.push_back(x); }
    return v;
}

template <typename W, bool SIGNED>
int suite(u64 seed, u32 k, bool counts, u32 known, u32 ratio, const char* name, bool warp = false) {
    mt19937_64 g(seed);
    vector<vector<vector<W>>> rows;
    vector<bool> valid;
    auto len_of = [&](int kind) -> size_t {
        switch (kind) {
            case 0: return g() % 4;            // tiny, maybe empty
            case 1: return 1 + g() % 40;       // short
            case 2: return 100 + g() % 1500;   // medium
            default: return 3000 + g() % 9000; // spans tiles
        }
    };
    int nrows = 300;
    for (int r = 0; r < nrows; r++) {
        int kind = (g() % 10 < 5) ? 0 : (g() % 10 < 6 ? 1 : (g() % 10 < 7 ? 2 : 3));
        vector<vector<W>> row;
        W start = SIGNED ? (W)(0 - (W)(g() % 50)) : (W)(g() % 50);
        // Some longer rows' lists start far apart (one list's first values below every value
        // of another: the kernels jump over such stretches).
        const bool apart = kind >= 2 && g() % 3 == 0;
        for (u32 j = 0; j < k; j++) {
            size_t len = len_of(kind == 3 && j > 0 && g() % 2 ? 2 : kind);
            const W s = apart ? (W)(start + (W)(g() % 4000)) : start;
            row.push_back(sorted_list<W>(g, len, 1, 3, s));
        }
        if (g() % 25 == 0) {  // unsorted: swap or duplicate
            auto& l = row[g() % k];
            if (l.size() >= 2) { size_t i = g() % (l.size() - 1); if (g() % 2) swap(l[i], l[i + 1]); else l[i + 1] = l[i]; }
        }
        rows.push_back(row);
        valid.push_back(g() % 30 != 0);
    }
    // a run of many tiny rows (many segments in one tile)
    for (int r = 0; r < 1500; r++) {
        vector<vector<W>> row;
        for (u32 j = 0; j < k; j++) row.push_back(sorted_list<W>(g, 1 + g() % 2, 1, 2, (W)(g() % 3)));
        rows.push_back(row);
        valid.push_back(true);
    }
    // shuffle row order
    vector<size_t> idx(rows.size());
    for (size_t i = 0; i < idx.size(); i++) idx[i] = i;
    shuffle(idx.begin(), idx.end(), g);
    vector<vector<vector<W>>> r2; vector<bool> v2;
    for (size_t i : idx) { r2.push_back(rows[i]); v2.push_back(valid[i]); }
    return run_case<W, SIGNED>(r2, v2, counts, known, ratio, name, warp);
}

// wmerge's row offsets at the edges: rows without work (empty lists, NULL) before, between
// and after the rows with work, rows starting exactly where pieces start, and a batch with no
// work at all (every offset still written).
int warp_edges() {
    int bad = 0;
    mt19937_64 g(99);
    vector<vector<vector<u32>>> rows;
    vector<bool> valid;
    auto empty_row = [&] { rows.push_back({{}, sorted_list<u32>(g, 5, 1, 2, 0)}); valid.push_back(true); };
    for (int i = 0; i < 5; i++) empty_row();
    for (int r = 0; r < 40; r++) {
        // A of exactly one piece (g_wpiece = 32), so rows start where pieces start.
        rows.push_back({sorted_list<u32>(g, 32, 1, 2, 0), sorted_list<u32>(g, 40 + g() % 40, 1, 2, 0)});
        valid.push_back(true);
        if (r % 3 == 0) empty_row();
        if (r % 5 == 0) { rows.push_back({{1, 2}, {2, 3}}); valid.push_back(false); }
    }
    for (int i = 0; i < 7; i++) empty_row();
    fixed_pieces(32);
    bad += run_case<u32, false>(rows, valid, false, 3, 0, "u32 k2 warp, edges", true);
    vector<vector<vector<u32>>> none(rows.begin(), rows.begin() + 5);
    vector<bool> nv(5, true);
    nv[2] = false;
    bad += run_case<u32, false>(none, nv, false, 3, 0, "u32 k2 warp, no work", true);
    bad += run_case<u32, false>(none, nv, true, 3, 0, "u32 k2 warp counts, no work", true);
    fixed_pieces(256);
    return bad;
}

int main(int argc, char** argv) {
    setvbuf(stdout, nullptr, _IOLBF, 0);  // a crash keeps the lines before it
    int bad = 0;
    // "warp": the wmerge suites alone.
    const bool warp_only = argc > 1 && string(argv[1]) == "warp";
    if (!warp_only) {
    // Staged lists (no row-order flags), then lists with flags (as resident columns), rows
    // searching B where |B| >= ratio |A|.
    bad += suite<u32, false>(1, 2, false, 0, 0, "u32 k2");
    bad += suite<u32, false>(2, 2, true, 0, 0, "u32 k2 counts");
    bad += suite<u32, false>(3, 3, false, 0, 0, "u32 k3");
    bad += suite<u32, true>(4, 2, false, 0, 0, "i32 k2");
    bad += suite<u64, false>(5, 2, false, 0, 0, "u64 k2");
    bad += suite<u32, false>(6, 4, true, 0, 0, "u32 k4 counts");
    bad += suite<u32, false>(7, 2, false, 3, 2, "u32 k2 known, search");
    bad += suite<u32, false>(8, 2, true, 2, 2, "u32 k2 counts, B known, search");
    bad += suite<u32, false>(9, 3, false, 6, 3, "u32 k3 lists 1, 2 known, search");
    bad += suite<u32, true>(10, 2, false, 3, 2, "i32 k2 known, search");
    bad += suite<u64, false>(11, 2, false, 1, 2, "u64 k2 A known");
    bad += suite<u32, false>(12, 4, false, 15, 0, "u32 k4 known, no search");
    }
    // wmerge: every list known (as the host requires), with and without rows that search.
    // wmerge: every list known (as the host requires); plan ignores the search ratio there.
    fixed_pieces(32);  // pieces of one window: many pieces per row, rows sharing pieces
    bad += suite<u32, false>(20, 2, false, 3, 0, "u32 k2 warp, pieces of 32", true);
    bad += suite<u32, false>(21, 3, false, 7, 0, "u32 k3 warp, pieces of 32", true);
    fixed_pieces(1000);
    bad += suite<u32, false>(22, 2, false, 3, 2, "u32 k2 warp, pieces of 1000, ratio ignored", true);
    // Each step's own size (the host's rule): 2,048 halved until 40 pieces (the last steps of
    // k = 3 and 4, over fewer A positions, take smaller pieces), a size not a power of two
    // halved down to its floor (1,000, 500, 250, 125; not 62), and wplace in one block (a warp
    // places up to a fifth of the pieces).
    g_wlo = 32, g_whi = 2048, g_wwant = 40;
    bad += suite<u32, false>(23, 3, false, 7, 0, "u32 k3 warp, pieces per step", true);
    bad += suite<u32, false>(24, 4, true, 15, 0, "u32 k4 warp counts, pieces per step", true);
    g_wlo = 100, g_whi = 1000;
    g_wblocks = 1;
    bad += suite<u64, false>(25, 3, false, 7, 0, "u64 k3 warp, pieces per step from 1000", true);
    g_wblocks = 3;
    g_wwant = 1;
    fixed_pieces(256);
    bad += suite<u32, false>(13, 2, false, 3, 0, "u32 k2 warp", true);
    bad += suite<u32, false>(15, 2, true, 3, 0, "u32 k2 warp counts", true);
    bad += suite<u32, false>(16, 3, false, 7, 0, "u32 k3 warp", true);
    bad += suite<u32, true>(17, 2, false, 3, 0, "i32 k2 warp", true);
    bad += suite<u64, false>(18, 2, false, 3, 0, "u64 k2 warp", true);
    bad += suite<u32, false>(19, 4, false, 15, 0, "u32 k4 warp", true);
    bad += warp_edges();
    printf(bad ? "FAIL\n" : "OK\n");
    return bad != 0;
}
