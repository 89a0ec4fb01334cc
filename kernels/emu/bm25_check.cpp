// kernels/bm25.cu's top-k kernels run on the CPU (emu.h) on random corpora and query
// batches, against a reference scorer: every document of a query scored in slot order,
// sorted by score (descending) then ordinal (ascending), cut to k; AND-then-OR answers with
// AND when AND finds k documents. Each batch runs unsplit (one WHOLE item per query) and
// split (OR and AND-then-OR queries cut into ordinal ranges, random boundaries, merged by
// bm25_merge), with and without static scores and floors, for several k. Prints one line
// per suite with the number of wrong queries ("bad=0" when all agree) and "OK" at the end.
#include "emu.h"
#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
// The device's global timer, on the CPU (bm25.cu's `device_clock`).
#define BM25_EMU
inline unsigned long long emu_clock_ns() {
    return (unsigned long long)std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
}
#undef __launch_bounds__
#define __launch_bounds__(...)
inline double __longlong_as_double(long long x) {
    double d;
    std::memcpy(&d, &x, 8);
    return d;
}
#include "../bm25.cu"

struct Corpus {
    unsigned docs;
    std::vector<std::vector<u32>> ord;     // per term: ascending ordinals
    std::vector<std::vector<double>> imp;  // per term: impacts
    std::vector<double> stat;              // per ordinal (empty: none)
};

static Corpus corpus(std::mt19937_64& rng, unsigned docs, unsigned terms, bool with_static) {
    Corpus c;
    c.docs = docs;
    for (unsigned t = 0; t < terms; t++) {
        // A few terms in most documents, most terms rare.
        double p = t < 3 ? 0.5 / (t + 1) : 8.0 / (docs * std::uniform_real_distribution<>(0.01, 1.0)(rng));
        std::vector<u32> o;
        std::vector<double> w;
        std::bernoulli_distribution in(std::min(p, 0.9));
        for (u32 d = 0; d < docs; d++) {
            if (in(rng)) {
                o.push_back(d);
                // Quantized impacts: equal scores across documents (ties on the ordinal).
                w.push_back(0.25 * (1 + rng() % 12));
            }
        }
        c.ord.push_back(o);
        c.imp.push_back(w);
    }
    // Three banded terms (`random_query` asks for all three at times): 40 in 45% of all
    // documents, 41 in every document of the upper half, 42 in 90% of all. AND over them leads
    // with 40 (with `bm25_topk_and`'s chunks of two candidates a thread, in two chunks or
    // more), whose first chunks lie in the lower half and match nothing: the cursors must
    // still move on for the later chunks, which match.
    for (unsigned t = 0; t < 3; t++) {
        std::vector<u32> o;
        std::vector<double> w;
        for (u32 d = 0; d < docs; d++) {
            const bool in = t == 0 ? rng() % 100 < 45 : t == 1 ? d >= docs / 2 : rng() % 10 != 0;
            if (in) {
                o.push_back(d);
                w.push_back(0.25 * (1 + rng() % 12));
            }
        }
        c.ord.push_back(o);
        c.imp.push_back(w);
    }
    if (with_static) {
        for (u32 d = 0; d < docs; d++) c.stat.push_back(0.125 * (rng() % 9));
    }
    return c;
}

struct Hit {
    double s;
    u32 o;
};

static std::vector<Hit> reference(const Corpus& c, const std::vector<u32>& ts, int mode, u32 k) {
    if (mode == MODE_NONE || ts.empty()) return {};  // left unranked: the cleared count
    std::vector<double> sc(c.docs, 0.0);
    std::vector<u32> n(c.docs, 0);
    for (u32 t : ts) {
        for (size_t i = 0; i < c.ord[t].size(); i++) {
            sc[c.ord[t][i]] += c.imp[t][i];
            n[c.ord[t][i]]++;
        }
    }
    auto pick = [&](bool all) {
        std::vector<Hit> h;
        for (u32 d = 0; d < c.docs; d++) {
            if (all ? n[d] == ts.size() : n[d] > 0) h.push_back({sc[d] + (c.stat.empty() ? 0.0 : c.stat[d]), d});
        }
        return h;
    };
    std::vector<Hit> h = pick(mode == 0 || mode == 2);
    if (mode == 2 && h.size() < k) h = pick(false);
    std::sort(h.begin(), h.end(), [](const Hit& a, const Hit& b) { return a.s > b.s || (a.s == b.s && a.o < b.o); });
    if (h.size() > k) h.resize(k);
    return h;
}

// The host's floor (src/search/scoring.rs `theta_floor`): the k-th best impact + static of
// any one list of the query, if positive.
static double floor_of(const Corpus& c, const std::vector<u32>& ts, u32 k) {
    double f = -INFINITY;
    if (k == 0 || k > 32) return f;
    for (u32 t : ts) {
        std::vector<double> v;
        for (size_t i = 0; i < c.ord[t].size(); i++) v.push_back(c.imp[t][i] + (c.stat.empty() ? 0.0 : c.stat[c.ord[t][i]]));
        if (v.size() < k) continue;
        std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<double>());
        f = std::max(f, v[k - 1]);
    }
    return f > 0.0 ? f : -INFINITY;
}

static float max_up(double x) {
    float f = (float)x;
    return (double)f < x ? std::nextafter(f, INFINITY) : f;
}

// 1-5 distinct non-empty terms, ascending; a quarter of them among the three common terms;
// one query in eight is the three banded terms.
static std::vector<u32> random_query(std::mt19937_64& rng, const Corpus& c) {
    if (rng() % 8 == 0) return {40, 41, 42};  // the banded terms (`corpus`)
    std::vector<u32> ts;
    unsigned m = 1 + rng() % 5;
    while (ts.size() < m) {
        u32 t = rng() % 4 == 0 ? rng() % 3 : rng() % c.ord.size();
        if (!c.ord[t].empty() && std::find(ts.begin(), ts.end(), t) == ts.end()) ts.push_back(t);
    }
    std::sort(ts.begin(), ts.end());
    return ts;
}

// The answers packed for the copy down, as the host launches it.
static void pack(u32 nq, u32 k, const std::vector<u32>& out_count, const std::vector<u32>& out_doc,
                 const std::vector<double>& out_score, std::vector<u32>& off, std::vector<u32>& pk_doc,
                 std::vector<double>& pk_score) {
    // The offsets on the device and their copy (the host's, when the answers are written into
    // its pinned memory) must agree.
    std::vector<u32> off_copy(nq + 1, 0xdeadbeef);
    // The host's grid: a block per PACK_QUERIES queries, at most PACK_BLOCKS (one at least).
    const u32 grid = std::max<u32>(1, std::min<u32>((nq + PACK_QUERIES - 1) / PACK_QUERIES, PACK_BLOCKS));
    // The batch's clock, as `bm25_clear` leaves the counters (start stamped, the rest 0), in
    // every other batch; the others are timed by events (no clock words: untouched).
    static unsigned calls = 0;
    const bool clocked = calls++ % 2 == 0;
    std::vector<u32> counters(16, 0);
    launch(1, 32, [&] { bm25_clear(counters.data(), 16); });
    const unsigned long long start = *reinterpret_cast<unsigned long long*>(&counters[C_CLOCK]);
    bool clock_ok = start != 0;
    for (u32 i = 0; i < 16; i++) clock_ok &= i == C_CLOCK || i == C_CLOCK + 1 || counters[i] == 0;
    unsigned long long clock_host[2] = {7, 7};
    launch(grid, PACK_QUERIES, [&] {
        bm25_pack(nq, k, out_count.data(), off.data(), off_copy.data(), out_doc.data(), out_score.data(),
                  pk_doc.data(), pk_score.data(), clocked ? counters.data() : nullptr,
                  clocked ? clock_host : nullptr);
    });
    // Clocked: every block counted, the start copied, the end after it. Else untouched.
    if (clocked) {
        clock_ok &= counters[C_PACKED] == grid && clock_host[0] == start && clock_host[1] >= start;
    } else {
        clock_ok &= counters[C_PACKED] == 0 && clock_host[0] == 7 && clock_host[1] == 7;
    }
    if (off_copy != off || !clock_ok) off[0] = 0xdeadbeef;  // read as a wrong offset by every check
}

// Packing alone, for batches larger than the scan's block (runs of several counts a thread),
// empty ones and counts above k (read as k): offsets and packed hits against a loop.
static int pack_suite(std::mt19937_64& rng, u32 nq, u32 k) {
    std::vector<u32> out_count(nq), out_doc((size_t)nq * k);
    std::vector<double> out_score((size_t)nq * k);
    const bool some_above = nq == 5 || nq == 3000;  // counts above k in some batches
    for (u32 q = 0; q < nq; q++) out_count[q] = some_above && rng() % 7 == 0 ? k + 1 + rng() % 3 : rng() % (k + 1);
    // One batch with a single count above k, the first: only the block that reads every count
    // (the last) can mark it.
    if (nq == 1000) out_count[0] = k + 1;
    for (size_t i = 0; i < out_doc.size(); i++) {
        out_doc[i] = rng();
        out_score[i] = (double)(rng() % 1000) / 7.0;
    }
    std::vector<u32> off(nq + 1, 0xdeadbeef), pk_doc((size_t)nq * k + 1, 0xdeadbeef);
    std::vector<double> pk_score((size_t)nq * k + 1, -1.0);
    pack(nq, k, out_count, out_doc, out_score, off, pk_doc, pk_score);
    int bad = 0;
    u32 at = 0;
    bool above = false;
    for (u32 q = 0; q < nq; q++) above |= out_count[q] > k;
    // A count above k is marked in off[0].
    bad += nq > 0 && (off[0] == 0xffffffffu) != above;
    if (above) off[0] = 0;
    for (u32 q = 0; q < nq; q++) {
        const u32 c = std::min(out_count[q], k);
        bad += off[q] != at;
        for (u32 j = 0; j < c && off[q] == at; j++) {
            bad += pk_doc[at + j] != out_doc[(size_t)q * k + j] || pk_score[at + j] != out_score[(size_t)q * k + j];
        }
        at += c;
    }
    bad += off[nq] != at;
    std::printf("pack: queries=%u k=%u hits=%u bad=%d\n", nq, k, at, bad);
    return bad;
}

// Queries whose answer differs from the reference's, added to `bad` (the first few printed).
static int wrong_answers(const Corpus& c, const std::vector<std::vector<u32>>& qs,
                         const std::vector<unsigned char>& q_mode, u32 k, const std::vector<u32>& ord_doc,
                         const std::vector<u32>& out_count, const std::vector<u32>& out_doc,
                         const std::vector<double>& out_score, int bad) {
    // What the host reads: the answers packed (bm25_pack_offsets, bm25_pack).
    const u32 nq = qs.size();
    std::vector<u32> off(nq + 1, 0xdeadbeef), pk_doc(nq * k + 1, 0xdeadbeef);
    std::vector<double> pk_score(nq * k + 1, -1.0);
    pack(nq, k, out_count, out_doc, out_score, off, pk_doc, pk_score);
    for (u32 q = 0; q < nq; q++) {
        std::vector<Hit> want = reference(c, qs[q], q_mode[q], k);
        bool ok = out_count[q] == want.size() && off[q + 1] - off[q] == want.size();
        for (u32 i = 0; ok && i < want.size(); i++) {
            ok = out_doc[q * k + i] == ord_doc[want[i].o] && out_score[q * k + i] == want[i].s &&
                 pk_doc[off[q] + i] == ord_doc[want[i].o] && pk_score[off[q] + i] == want[i].s;
        }
        if (!ok) {
            if (bad < 3) {
                std::printf("  query %u mode %d terms %zu: got %u hits, want %zu\n", q, q_mode[q], qs[q].size(),
                            out_count[q], want.size());
            }
            bad++;
        }
    }
    return bad;
}

// and_k: an AND batch (every query mode 0) ranked by `bm25_topk_and`, as the host launches it.
static int suite(std::mt19937_64& rng, bool with_static, bool split, u32 k, unsigned nq, bool and_k = false) {
    Corpus c = corpus(rng, 700 + rng() % 600, 40, with_static);
    std::vector<u32> post_ord;
    std::vector<double> post_imp;
    std::vector<u64> start;
    for (size_t t = 0; t < c.ord.size(); t++) {
        start.push_back(post_ord.size());
        post_ord.insert(post_ord.end(), c.ord[t].begin(), c.ord[t].end());
        post_imp.insert(post_imp.end(), c.imp[t].begin(), c.imp[t].end());
    }
    std::vector<u32> ord_doc(c.docs);
    for (u32 d = 0; d < c.docs; d++) ord_doc[d] = 3 * d + 7;
    double static_max = 0.0;
    for (double s : c.stat) static_max = std::max(static_max, s);

    std::vector<std::vector<u32>> qs;
    std::vector<u32> q_off{0};
    std::vector<unsigned char> q_mode;
    std::vector<ListRef> lists;
    std::vector<double> q_floor;
    for (unsigned q = 0; q < nq; q++) {
        std::vector<u32> ts = random_query(rng, c);
        qs.push_back(ts);
        const unsigned char md = rng() % 3;
        q_mode.push_back(and_k ? 0 : md);
        for (u32 t : ts) {
            double mx = 0.0;
            for (double w : c.imp[t]) mx = std::max(mx, w);
            lists.push_back(ListRef{start[t], (u32)c.ord[t].size(), max_up(mx)});
        }
        q_off.push_back(lists.size());
        // Floors also where the mode ignores them, and sometimes none.
        q_floor.push_back(rng() % 4 == 0 ? -INFINITY : floor_of(c, ts, k));
    }
    std::vector<Item> items;
    std::vector<u32> split_q, split_p{0};
    u32 pieces = 0;
    for (u32 q = 0; q < nq; q++) {
        u32 np = split ? 1 + rng() % std::min<u32>(6, CAP / k) : 1;
        if (np == 1) {
            items.push_back(Item{q, 0, 1, WHOLE << 30});
            continue;
        }
        if (q_mode[q] == 2) items.push_back(Item{q, 0, 1, AND_ONLY << 30});
        // Cut at any of the query's lists (a short one gives empty pieces).
        u32 lead = rng() % (q_off[q + 1] - q_off[q]);
        for (u32 p = 0; p < np; p++) items.push_back(Item{q, p, lead << 16 | np, (PIECE << 30) | pieces++});
        split_q.push_back(q);
        split_p.push_back(pieces);
    }
    std::vector<u32> order(items.size());
    for (u32 i = 0; i < order.size(); i++) order[i] = i;
    std::shuffle(order.begin(), order.end(), rng);

    std::vector<u32> out_count(nq, 0xdeadbeef), out_doc(nq * k), and_count(nq, 0);
    std::vector<double> out_score(nq * k);
    std::vector<u32> piece_count(pieces + 1), piece_ord((pieces + 1) * k);
    std::vector<double> piece_score((pieces + 1) * k);
    const double* stat = c.stat.empty() ? nullptr : c.stat.data();
    launch(items.size(), THREADS, [&] {
        (and_k ? bm25_topk_and : bm25_topk)(items.size(), nullptr, nullptr, order.data(), items.data(), q_off.data(), q_mode.data(), lists.data(),
                  post_ord.data(), post_imp.data(), stat, ord_doc.data(), k, out_count.data(),
                  out_doc.data(), out_score.data(), q_floor.data(), static_max, piece_count.data(),
                  piece_ord.data(), piece_score.data(), and_count.data(), nullptr, nullptr);
    });
    if (!split_q.empty()) {
        // Fewer blocks than split queries in some suites: each block strides over them.
        const u32 grid = rng() % 2 == 0 ? split_q.size() : 1 + rng() % 3;
        launch(grid, THREADS, [&] {
            bm25_merge(split_q.size(), nullptr, split_q.data(), split_p.data(), split_p.data() + 1, q_mode.data(), and_count.data(), k,
                       piece_count.data(), piece_ord.data(), piece_score.data(), ord_doc.data(),
                       out_count.data(), out_doc.data(), out_score.data());
        });
    }
    int bad = wrong_answers(c, qs, q_mode, k, ord_doc, out_count, out_doc, out_score, 0);
    std::printf("%sstatic=%d split=%d k=%u queries=%u pieces=%u bad=%d\n", and_k ? "AND kernel: " : "", with_static, split, k, nq, pieces, bad);
    return bad;
}

// The batch planned on the device (bm25_plan, bm25_order), then ranked as above: every term's
// ListRef in a table, per-term floors (or none), small pieces so that queries split, and
// sometimes a piece budget too small for all of them (those queries are ranked whole).
static int device_suite(std::mt19937_64& rng, bool with_static, u32 k, unsigned nq, bool and_k = false) {
    Corpus c = corpus(rng, 700 + rng() % 600, 40, with_static);
    std::vector<u32> post_ord;
    std::vector<double> post_imp;
    std::vector<ListRef> refs;
    std::vector<double> term_floor;
    for (size_t t = 0; t < c.ord.size(); t++) {
        double mx = 0.0;
        for (double w : c.imp[t]) mx = std::max(mx, w);
        refs.push_back(ListRef{post_ord.size(), (u32)c.ord[t].size(), max_up(mx)});
        post_ord.insert(post_ord.end(), c.ord[t].begin(), c.ord[t].end());
        post_imp.insert(post_imp.end(), c.imp[t].begin(), c.imp[t].end());
        // The term's own floor (`Scored::term_floor`): its k-th best impact + static.
        std::vector<double> v;
        for (size_t i = 0; i < c.ord[t].size(); i++) v.push_back(c.imp[t][i] + (c.stat.empty() ? 0.0 : c.stat[c.ord[t][i]]));
        double f = -INFINITY;
        if (k <= 32 && v.size() >= k) {
            std::nth_element(v.begin(), v.begin() + (k - 1), v.end(), std::greater<double>());
            f = v[k - 1];
        }
        term_floor.push_back(f);
    }
    std::vector<u32> ord_doc(c.docs);
    for (u32 d = 0; d < c.docs; d++) ord_doc[d] = 5 * d + 3;
    double static_max = 0.0;
    for (double s : c.stat) static_max = std::max(static_max, s);
    std::vector<std::vector<u32>> qs;
    std::vector<u32> q_off{0}, q_terms;
    std::vector<unsigned char> q_mode;
    // The batch's mode, and each query's unknown-term flag as the host uploads it (in q_mode,
    // which `bm25_plan` turns into the query's mode); some queries with no terms and a few
    // with more than MAX_TERMS, as the host sends a whole batch. want_mode: the modes by the
    // host's rules (AND with an unknown term has no terms; AND-then-OR with one is OR; no terms
    // or too many: unranked).
    const u32 batch_mode = and_k ? 0u : (u32)(rng() % 3);
    std::vector<unsigned char> want_mode;
    for (unsigned q = 0; q < nq; q++) {
        std::vector<u32> ts = random_query(rng, c);
        if (rng() % 8 == 0) ts.clear();
        if (rng() % 40 == 0) ts.assign(MAX_TERMS + 1 + rng() % 3, 7);  // read by no kernel
        const bool unknown = rng() % 6 == 0;
        const size_t m = batch_mode == 0 && unknown ? 0 : ts.size();
        want_mode.push_back(m == 0 || m > MAX_TERMS ? MODE_NONE : batch_mode == 2 && unknown ? 1 : batch_mode);
        qs.push_back(ts);
        q_mode.push_back(unknown);
        q_terms.insert(q_terms.end(), ts.begin(), ts.end());
        q_off.push_back(q_terms.size());
    }
    const bool floors = rng() % 4 != 0;
    const u64 piece = 1 + rng() % 200;
    const u32 most = std::min<u32>(CAP / k, 64);
    const u32 max_pieces = rng() % 3 == 0 ? 7 : 64 * nq;
    const size_t cap_items = nq + max_pieces + max_pieces;
    std::vector<ListRef> lists(q_terms.size());
    std::vector<double> q_floor(nq);
    std::vector<Item> items(cap_items);
    std::vector<unsigned char> keys(cap_items);
    // The batch read where the host wrote it (`mapped`: the offsets copied and the modes
    // written into the device's own arrays, the counters cleared by `bm25_clear`), or copied
    // up (offsets and flags read and the modes written in place; the counters come cleared).
    const bool mapped = rng() % 2 == 0;
    std::vector<u32> split_q(nq), split_lo(nq), split_hi(nq), counters(16, mapped ? 0xdeadbeefu : 0u), order(cap_items, 0xffffffffu);
    const std::vector<unsigned char> q_flag(q_mode);
    std::vector<u32> q_off_dev(nq + 1, 0xdeadbeefu);
    std::vector<unsigned char> q_mode_dev(nq, 0xee);
    if (mapped) launch(1, 32, [&] { bm25_clear(counters.data(), 16); });
    // Not cleared: `bm25_plan` clears each query's count.
    std::vector<u32> out_count(nq, 0xdeadbeef), out_doc(nq * k), and_count(nq, 0);
    // Not cleared either: `bm25_plan` clears the count of each split query's completed blocks.
    std::vector<u32> piece_done(max_pieces + 1, 0xdeadbeef);
    launch((nq + 63) / 64, 64, [&] {
        bm25_plan(nq, q_off.data(), q_terms.data(), mapped ? q_flag.data() : q_mode.data(),
                  mapped ? q_off_dev.data() : q_off.data(), mapped ? q_mode_dev.data() : q_mode.data(),
                  batch_mode, refs.size(), refs.data(),
                  floors ? term_floor.data() : nullptr, static_max, k, piece, most, max_pieces,
                  lists.data(), q_floor.data(), items.data(), keys.data(), split_q.data(),
                  split_lo.data(), split_hi.data(), counters.data(), out_count.data(),
                  piece_done.data());
    });
    // The counters' copy for the host, in some suites (null in the others, as with
    // DFSETS_BM25_ZERO_COPY=0).
    std::vector<u32> counters_host(16, 0xdeadbeef);
    const bool to_host = rng() % 2 == 0;
    launch(1, 1024, [&] {
        bm25_order(counters.data(), keys.data(), order.data(),
                   to_host ? counters_host.data() : nullptr);
    });
    const u32 n_items = counters[C_ITEMS], n_split = counters[C_SPLITS];
    int bad = counters[C_BAD] != 0;
    if (mapped) {
        // The host's copy untouched; the device's offsets are the host's, its modes the
        // host's rules.
        bad += q_mode != q_flag || q_off_dev != q_off;
        q_mode = q_mode_dev;
    }
    bad += q_mode != want_mode;
    // Entries 0 ..= C_SHORT are the host's; the rest is not written.
    for (u32 i = 0; i < 16; i++) bad += counters_host[i] != (to_host && i <= C_SHORT ? counters[i] : 0xdeadbeef);
    // Cleared (mapped) or uploaded cleared: the clock word stamped by `bm25_clear` alone.
    for (u32 i = C_SHORT + 1; i < 16; i++) bad += (counters[i] != 0) != (mapped && (i == C_CLOCK || i == C_CLOCK + 1) && counters[C_CLOCK + 1] != 0);
    // The short items (key 0: pure AND, whole, at most SHORT_TERMS lists, the shortest at most
    // SHORT_LEAD postings) counted and ordered last, for `and_short`.
    const u32 n_short = counters[C_SHORT];
    u32 want_short = 0;
    for (u32 i = 0; i < n_items; i++) {
        const Item& it = items[i];
        const u32 q = it.q, m = q_off[q + 1] - q_off[q];
        u32 shortest = 0xffffffffu;
        for (u32 j = 0; j < m; j++) shortest = std::min(shortest, lists[q_off[q] + j].len);
        const bool is_short = q_mode[q] == 0 && (it.ks >> 30) == WHOLE && m <= SHORT_TERMS && shortest <= SHORT_LEAD;
        want_short += is_short;
        bad += is_short != (keys[i] == 0);
    }
    bad += n_short != want_short;
    for (u32 i = 0; i < n_items; i++) bad += (i >= n_items - n_short) != (keys[order[i]] == 0);
    // Every item once, longest first.
    std::vector<u32> seen(order.begin(), order.begin() + n_items);
    std::sort(seen.begin(), seen.end());
    for (u32 i = 0; i < n_items; i++) bad += seen[i] != i;
    for (u32 i = 1; i < n_items; i++) bad += keys[order[i - 1]] < keys[order[i]];
    u32 pieces = 0;
    for (u32 s = 0; s < n_split; s++) pieces += split_hi[s] - split_lo[s];
    // The host launches without reading the counts: `bm25_topk` on an upper bound of blocks
    // (the queries ranked plus the piece budget: `planned::launch`), `bm25_merge` on at most
    // as many blocks as split queries can be, each reading the device's count.
    u32 ranked = 0;
    for (u32 q = 0; q < nq; q++) ranked += want_mode[q] != MODE_NONE;
    const u32 item_bound = ranked + max_pieces;
    bad += n_items > item_bound || n_split > std::min(ranked, max_pieces / 2);
    std::vector<double> out_score(nq * k);
    std::vector<u32> piece_count(max_pieces + 1), piece_ord((max_pieces + 1) * (size_t)k);
    std::vector<double> piece_score((max_pieces + 1) * (size_t)k);
    const double* stat = c.stat.empty() ? nullptr : c.stat.data();
    // A block per unit (an upper bound of blocks), or a few blocks claiming units from the
    // counter (`claimed`, as the host launches it).
    const bool claimed = rng() % 2 == 0;
    const u32 topk_grid =
        claimed ? 1 + (u32)(rng() % 4) : std::min(item_bound, n_items + 1 + (u32)(rng() % 40));
    launch(topk_grid, THREADS, [&] {
        (and_k ? bm25_topk_and : bm25_topk)(item_bound, &counters[C_ITEMS], &counters[C_SHORT], order.data(), items.data(), (mapped ? q_off_dev : q_off).data(), q_mode.data(), lists.data(),
                  post_ord.data(), post_imp.data(), stat, ord_doc.data(), k, out_count.data(),
                  out_doc.data(), out_score.data(), q_floor.data(), static_max, piece_count.data(),
                  piece_ord.data(), piece_score.data(), and_count.data(), piece_done.data(),
                  claimed ? &counters[C_CLAIM] : nullptr);
    });
    // No `bm25_merge`: the block completing a split query merges it (`piece_done`).
    bad = wrong_answers(c, qs, want_mode, k, ord_doc, out_count, out_doc, out_score, bad);
    std::printf("%sdevice plan: static=%d k=%u queries=%u mapped=%d claimed=%d floors=%d piece=%llu budget=%u items=%u short=%u splits=%u pieces=%u bad=%d\n",
                and_k ? "AND kernel: " : "", with_static, k, nq, mapped, claimed, floors, piece, max_pieces, n_items, n_short, n_split, pieces, bad);
    return bad;
}

int main() {
    std::mt19937_64 rng(20261125);
    int bad = 0;
    for (u32 k : {1u, 10u, 32u, 100u}) {
        for (int st = 0; st < 2; st++) {
            for (int split = 0; split < 2; split++) bad += suite(rng, st, split, k, 24);
            for (int rep = 0; rep < 2; rep++) bad += device_suite(rng, st, k, 24);
        }
    }
    // AND batches through `bm25_topk_and`: host-planned (whole and split) and device-planned.
    for (u32 k : {1u, 10u, 100u}) {
        for (int st = 0; st < 2; st++) {
            for (int split = 0; split < 2; split++) bad += suite(rng, st, split, k, 24, true);
            bad += device_suite(rng, st, k, 24, true);
        }
    }
    for (u32 nq : {0u, 1u, 5u, 1000u, 3000u, 20000u}) bad += pack_suite(rng, nq, nq > 5000 ? 2 : 10);
    {
        // A term id beyond the table: counted as an error, nothing looked up.
        std::vector<u32> q_off{0, 2}, q_terms{1, 40}, counters(4, 0), sq(1), sl(1), sh(1), cnt(1, 7);
        std::vector<unsigned char> q_mode{0}, keys(4);  // no unknown term; an OR batch
        std::vector<ListRef> refs(40, ListRef{0, 1, 1.0f}), lists(2);
        std::vector<double> q_floor(1);
        std::vector<Item> items(4);
        launch(1, 32, [&] {
            bm25_plan(1, q_off.data(), q_terms.data(), q_mode.data(), q_off.data(), q_mode.data(), 1, 40, refs.data(), nullptr, 0.0, 10, 16, 64,
                      2, lists.data(), q_floor.data(), items.data(), keys.data(), sq.data(), sl.data(), sh.data(),
                      counters.data(), cnt.data(), nullptr);
        });
        const bool ok = counters[C_BAD] == 1 && counters[C_ITEMS] == 0 && cnt[0] == 0;
        std::printf("device plan: a term beyond the index %s\n", ok ? "refused" : "NOT refused");
        bad += !ok;
    }
    if (bad == 0) std::printf("OK\n");
    return bad == 0 ? 0 : 1;
}
