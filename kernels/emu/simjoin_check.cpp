// kernels/simjoin.cu's probe_join (candidate generation and verification of the similarity
// join on the device) runs on the CPU (emu.h) on random collections, against a nested loop
// over every pair: each pair of sets of the two sides (or of one side, for a self-join) whose
// exact overlap passes the threshold, with that overlap. The collections are built as
// src/join/build.rs builds them: tokens renamed by increasing frequency, sets in global order
// by (size, side, row), one index per side over the index prefixes. Every measure, `>=` and
// `>`, thresholds that pairs reach exactly, near-duplicate sets, one large set; ranges of
// probe sets launched separately; a small output capacity, so that ranges overflow and are
// split. Prints one line per suite ("bad=0" when all agree) and "OK" at the end.
#include "emu.h"
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>
inline double __ddiv_rn(double a, double b) { return a / b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dsqrt_rn(double a) { return std::sqrt(a); }
inline unsigned atomicOr(unsigned* p, unsigned v) { return __atomic_fetch_or(p, v, __ATOMIC_SEQ_CST); }
#include "../simjoin.cu"

struct Coll {
    std::vector<u32> tokens;
    std::vector<u64> starts;
    std::vector<unsigned char> sides;
    // Per index: offsets (distinct + 1) and postings (set, pos, size).
    std::vector<std::vector<u64>> off;
    std::vector<std::vector<u32>> post;
    u32 distinct = 0;
};

using Found = std::tuple<u32, u32, u32>;  // (p, q, overlap), p the later set

static Coll build(const std::vector<std::vector<u32>>& raw, const std::vector<unsigned char>& side,
                  bool self_join, const Sim& s) {
    std::map<u32, u64> freq;
    for (auto& r : raw)
        for (u32 v : r) freq[v]++;
    std::vector<std::pair<u64, u32>> order;
    for (auto& [v, f] : freq) order.push_back({f, v});
    std::sort(order.begin(), order.end());
    std::map<u32, u32> rank;
    for (u32 i = 0; i < order.size(); i++) rank[order[i].second] = i;
    std::vector<u32> ids(raw.size());
    for (u32 i = 0; i < raw.size(); i++) ids[i] = i;
    std::stable_sort(ids.begin(), ids.end(), [&](u32 a, u32 b) {
        return std::make_tuple(raw[a].size(), side[a], a) < std::make_tuple(raw[b].size(), side[b], b);
    });
    Coll c;
    c.distinct = order.size();
    c.starts.push_back(0);
    for (u32 id : ids) {
        std::vector<u32> t;
        for (u32 v : raw[id]) t.push_back(rank[v]);
        std::sort(t.begin(), t.end());
        c.tokens.insert(c.tokens.end(), t.begin(), t.end());
        c.starts.push_back(c.tokens.size());
        c.sides.push_back(side[id]);
    }
    int indexes = self_join ? 1 : 2;
    for (int ix = 0; ix < indexes; ix++) {
        std::vector<std::vector<std::array<u32, 3>>> lists(c.distinct);
        for (u32 p = 0; p + 1 < c.starts.size(); p++) {
            if (!self_join && c.sides[p] != ix) continue;
            u32 n = c.starts[p + 1] - c.starts[p];
            u32 a = sim_min_overlap(s, n, n);
            u32 len = a == NONE ? 0 : n - (a > 1 ? a : 1) + 1;
            for (u32 i = 0; i < len; i++) lists[c.tokens[c.starts[p] + i]].push_back({p, i, n});
        }
        std::vector<u64> off{0};
        std::vector<u32> post;
        for (auto& l : lists) {
            for (auto& e : l) post.insert(post.end(), e.begin(), e.end());
            off.push_back(post.size() / 3);
        }
        c.off.push_back(off);
        c.post.push_back(post);
    }
    return c;
}

static std::set<Found> nested_loop(const Coll& c, bool self_join, const Sim& s) {
    std::set<Found> out;
    u32 sets = c.starts.size() - 1;
    for (u32 p = 0; p < sets; p++)
        for (u32 q = 0; q < p; q++) {
            if (!self_join && c.sides[p] == c.sides[q]) continue;
            const u32* x = &c.tokens[c.starts[p]];
            const u32* y = &c.tokens[c.starts[q]];
            u32 n = c.starts[p + 1] - c.starts[p], m = c.starts[q + 1] - c.starts[q];
            u32 o = 0;
            for (u32 i = 0, j = 0; i < n && j < m;) {
                if (x[i] == y[j]) o++, i++, j++;
                else if (x[i] < y[j]) i++;
                else j++;
            }
            if (o > 0 && sim_passes(s, o, n, m)) out.insert({p, q, o});
        }
    return out;
}

// Runs probe_join over p0..p1 with capacity cap; a range that overflows is split in two.
static void run(const Coll& c, bool self_join, const Sim& s, u32 p0, u32 p1, u32 cap, int exact,
                std::vector<Found>& out, u64& counted, unsigned& splits, bool& bad) {
    std::vector<u32> counters(4, 0), buf(3 * (size_t)cap + 3);
    const Coll& k = c;
    const std::vector<u64>& o1 = k.off.size() > 1 ? k.off[1] : k.off[0];
    const std::vector<u32>& q1 = k.post.size() > 1 ? k.post[1] : k.post[0];
    unsigned grid = 1 + (p1 - p0) % 3;
    launch(grid, PROBE_THREADS, [&] {
        probe_join(k.tokens.data(), k.starts.data(), k.starts.size() - 1, k.sides.data(),
                   self_join, k.off[0].data(), k.distinct, k.post[0].data(), o1.data(),
                   k.distinct, q1.data(), s.measure, s.value, s.gt, p0, p1, exact, 1,
                   counters.data(), cap, buf.data());
    });
    if (counters[PJ_BAD]) bad = true;
    u32 passed = counters[PJ_PASS];
    if (passed > cap) {
        splits++;
        if (p1 - p0 == 1) {
            run(c, self_join, s, p0, p1, passed, exact, out, counted, splits, bad);
            return;
        }
        u32 mid = p0 + (p1 - p0) / 2;
        run(c, self_join, s, p0, mid, cap, exact, out, counted, splits, bad);
        run(c, self_join, s, mid, p1, cap, exact, out, counted, splits, bad);
        return;
    }
    counted += passed;
    for (u32 i = 0; i < passed; i++) out.push_back({buf[3 * i], buf[3 * i + 1], buf[3 * i + 2]});
}

int main() {
    std::mt19937_64 rng(20261206);
    int failures = 0;
    const double normalized[] = {0.2, 0.5, 2.0 / 3.0, 0.8, 1.0};
    const double overlaps[] = {1.0, 2.0, 2.5, 4.0};
    for (int suite = 0; suite < 4; suite++) {
        bool self_join = suite % 2 == 0;
        bool large = suite >= 2;
        unsigned bad_count = 0, cases = 0, pairs = 0, splits_total = 0;
        for (int round = 0; round < 2; round++) {
            // Sets: a Zipf-like universe of 300 tokens; near-duplicates of earlier sets (a few
            // tokens changed) so that pairs land on and near every threshold.
            u32 sets = 60 + rng() % 120;
            std::vector<std::vector<u32>> raw;
            std::vector<unsigned char> side;
            for (u32 i = 0; i < sets; i++) {
                std::vector<u32> r;
                if (!raw.empty() && rng() % 3 == 0) {
                    r = raw[rng() % raw.size()];
                    for (int ch = rng() % 3; ch > 0 && !r.empty(); ch--) r[rng() % r.size()] = rng() % 300;
                    if (rng() % 2) r.push_back(rng() % 300);
                } else {
                    u32 len = 1 + rng() % (rng() % 4 == 0 ? 40 : 10);
                    if (large && i == sets / 2) len = 250;
                    for (u32 j = 0; j < len; j++) {
                        double u = std::uniform_real_distribution<>(0.0, 1.0)(rng);
                        r.push_back((u32)(300 * u * u * u));
                    }
                }
                std::sort(r.begin(), r.end());
                r.erase(std::unique(r.begin(), r.end()), r.end());
                if (r.empty()) r.push_back(rng() % 300);
                raw.push_back(r);
                side.push_back(self_join ? 0 : rng() % 2);
            }
            for (int measure = 0; measure < 4; measure++) {
                const double* values = measure == M_OVERLAP ? overlaps : normalized;
                size_t nv = measure == M_OVERLAP ? 4 : 5;
                for (size_t vi = 0; vi < nv; vi++)
                    for (int gt = 0; gt < 2; gt++) {
                        if (gt == 0 && values[vi] == 0.0) continue;
                        Sim s{values[vi], measure, gt};
                        Coll c = build(raw, side, self_join, s);
                        auto want = nested_loop(c, self_join, s);
                        for (int exact = 1; exact >= 0; exact--) {
                            std::vector<Found> got;
                            u64 counted = 0;
                            unsigned splits = 0;
                            bool bad = false;
                            u32 n = c.starts.size() - 1;
                            u32 cap = 1 + rng() % 400;
                            // Three ranges of probe sets, each its own launch.
                            u32 a = rng() % (n + 1), b = rng() % (n + 1);
                            if (a > b) std::swap(a, b);
                            for (auto [lo, hi] : {std::pair{0u, a}, {a, b}, {b, n}})
                                if (lo < hi) run(c, self_join, s, lo, hi, cap, exact, got, counted, splits, bad);
                            splits_total += splits;
                            std::set<Found> g;
                            bool ok = !bad && counted == want.size();
                            for (auto [p, q, o] : got) {
                                if (!exact) {
                                    auto it = want.lower_bound({p, q, 0});
                                    if (it == want.end() || std::get<0>(*it) != p || std::get<1>(*it) != q || o > std::get<2>(*it) || !sim_passes(s, o, c.starts[p + 1] - c.starts[p], c.starts[q + 1] - c.starts[q])) ok = false;
                                    else o = std::get<2>(*it);
                                }
                                if (!g.insert({p, q, o}).second) ok = false;
                            }
                            if (g != want) ok = false;
                            cases++;
                            pairs += want.size();
                            if (!ok) {
                                bad_count++;
                                if (bad_count <= 3)
                                    std::printf("  mismatch: measure %d value %g gt %d exact %d: want %zu pairs, got %zu (bad=%d)\n",
                                                measure, s.value, gt, exact, want.size(), got.size(), (int)bad);
                            }
                        }
                    }
            }
        }
        std::printf("probe_join %s%s: %u cases, %u pairs, %u overflow splits, bad=%u\n",
                    self_join ? "self-join" : "R-S join", large ? " with a large set" : "", cases,
                    pairs, splits_total, bad_count);
        failures += bad_count;
    }
    if (failures) return 1;
    std::printf("OK\n");
    return 0;
}
