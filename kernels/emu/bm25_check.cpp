// kernels/bm25.cu's top-k kernels run on the CPU (emu.h) on random corpora and query
// batches, against a reference scorer: every document of a query scored in slot order,
// sorted by score (descending) then ordinal (ascending), cut to k; AND-then-OR answers with
// AND when AND finds k documents. Each batch runs unsplit (one WHOLE item per query) and
// split (OR and AND-then-OR queries cut into ordinal ranges, random boundaries, merged by
// bm25_merge), with and without static scores and floors, for several k. Prints one line
// per suite with the number of wrong queries ("bad=0" when all agree) and "OK" at the end.
#include "emu.h"
#include <algorithm>
#include <cmath>
#include <random>
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

static int suite(std::mt19937_64& rng, bool with_static, bool split, u32 k, unsigned nq) {
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
        std::vector<u32> ts;
        unsigned m = 1 + rng() % 5;
        while (ts.size() < m) {
            u32 t = rng() % 4 == 0 ? rng() % 3 : rng() % c.ord.size();
            if (!c.ord[t].empty() && std::find(ts.begin(), ts.end(), t) == ts.end()) ts.push_back(t);
        }
        std::sort(ts.begin(), ts.end());
        qs.push_back(ts);
        q_mode.push_back(rng() % 3);
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
        bm25_topk(items.size(), order.data(), items.data(), q_off.data(), q_mode.data(), lists.data(),
                  post_ord.data(), post_imp.data(), stat, ord_doc.data(), k, out_count.data(),
                  out_doc.data(), out_score.data(), q_floor.data(), static_max, piece_count.data(),
                  piece_ord.data(), piece_score.data(), and_count.data());
    });
    if (!split_q.empty()) {
        launch(split_q.size(), THREADS, [&] {
            bm25_merge(split_q.size(), split_q.data(), split_p.data(), q_mode.data(), and_count.data(), k,
                       piece_count.data(), piece_ord.data(), piece_score.data(), ord_doc.data(),
                       out_count.data(), out_doc.data(), out_score.data());
        });
    }
    int bad = 0;
    for (u32 q = 0; q < nq; q++) {
        std::vector<Hit> want = reference(c, qs[q], q_mode[q], k);
        bool ok = out_count[q] == want.size();
        for (u32 i = 0; ok && i < want.size(); i++) {
            ok = out_doc[q * k + i] == ord_doc[want[i].o] && out_score[q * k + i] == want[i].s;
        }
        if (!ok) {
            if (bad < 3) {
                std::printf("  query %u mode %d terms %zu: got %u hits, want %zu\n", q, q_mode[q], qs[q].size(),
                            out_count[q], want.size());
            }
            bad++;
        }
    }
    std::printf("static=%d split=%d k=%u queries=%u pieces=%u bad=%d\n", with_static, split, k, nq, pieces, bad);
    return bad;
}

int main() {
    std::mt19937_64 rng(20261125);
    int bad = 0;
    for (u32 k : {1u, 10u, 32u, 100u}) {
        for (int st = 0; st < 2; st++) {
            for (int split = 0; split < 2; split++) bad += suite(rng, st, split, k, 24);
        }
    }
    if (bad == 0) std::printf("OK\n");
    return bad == 0 ? 0 : 1;
}
