//! The query evaluators: conjunctive (AND) and disjunctive (OR) top-k with exact dynamic
//! pruning, AND-then-OR, and the exhaustive scorer they are tested against.
//!
//! Documents are visited in increasing id order, so a document whose score equals the
//! current k-th best loses the tie (ties go to the smaller id): a document is kept only if its
//! score is strictly above the threshold θ once k documents are held. Bounds are sums of
//! per-term (or per-block) maximum impacts; they are compared with a relative slack of
//! 1e-12 so the different summation order of a bound never prunes a document that the
//! canonical sum (see `scoring`) would keep.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use super::index::InvertedIndex;
use super::scoring::{BLOCK, Scored};

/// How the query's terms combine.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mode {
    /// Documents holding every term.
    And,
    /// Documents holding any term.
    Or,
    /// AND; when it finds fewer than k documents, the OR result instead.
    AndOr,
}

impl Mode {
    pub fn from_name(s: &str) -> Option<Self> {
        match s.to_ascii_lowercase().as_str() {
            "and" => Some(Self::And),
            "or" => Some(Self::Or),
            "and_or" | "and-or" | "andor" => Some(Self::AndOr),
            _ => None,
        }
    }

    /// The mode's SQL name.
    pub fn name(self) -> &'static str {
        match self {
            Self::And => "and",
            Self::Or => "or",
            Self::AndOr => "and_or",
        }
    }
}

/// One ranked document.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Hit {
    pub doc: u32,
    pub score: f64,
}

/// Heap order: the worst hit on top (lowest score; among equal scores the largest id).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Worst(Hit);
impl Eq for Worst {}
impl PartialOrd for Worst {
    fn partial_cmp(&self, o: &Self) -> Option<Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Worst {
    fn cmp(&self, o: &Self) -> Ordering {
        o.0.score
            .total_cmp(&self.0.score)
            .then(self.0.doc.cmp(&o.0.doc))
    }
}

/// The best `k` hits seen so far.
pub struct TopK {
    k: usize,
    heap: BinaryHeap<Worst>,
}

/// Hits reserved up front; past it the heap grows with the documents that are pushed (it
/// never holds more than k + 1), so memory follows the matches, not `k`.
const RESERVED_HITS: usize = 1024;

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k.min(RESERVED_HITS) + 1),
        }
    }
    /// The score a new document must beat, or -inf while fewer than k are held.
    pub fn threshold(&self) -> f64 {
        if self.heap.len() < self.k {
            f64::NEG_INFINITY
        } else {
            self.heap.peek().map_or(f64::NEG_INFINITY, |w| w.0.score)
        }
    }
    /// Offer a hit (documents offered in increasing id order).
    pub fn push(&mut self, doc: u32, score: f64) {
        if self.k == 0 {
            return;
        }
        if self.heap.len() < self.k {
            self.heap.push(Worst(Hit { doc, score }));
        } else if score > self.threshold() {
            self.heap.pop();
            self.heap.push(Worst(Hit { doc, score }));
        }
    }
    /// Best first; ties by increasing id.
    pub fn into_sorted(self) -> Vec<Hit> {
        let mut v: Vec<Hit> = self.heap.into_iter().map(|w| w.0).collect();
        v.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
        v
    }
}

/// Whether a bound can still beat θ (with slack for summation order).
#[inline]
fn may_beat(bound: f64, theta: f64) -> bool {
    bound + 1e-12 * bound.abs().max(theta.abs()) > theta
}

/// The pruning cut for threshold θ: a bound ≤ the cut cannot beat θ. The cut lies a relative
/// 1e-12 below θ, slack for bounds summed in another order than the exact score; for the
/// non-negative bounds of BM25 this keeps everything [`may_beat`] keeps, with one comparison.
#[inline]
fn prune_below(theta: f64) -> f64 {
    theta - 1e-12 * theta.abs()
}

/// The distinct term ids of a query, ascending (the canonical summation order); unknown
/// terms are reported by `unknown`.
pub fn query_terms<'a>(
    index: &InvertedIndex,
    terms: impl IntoIterator<Item = &'a str>,
) -> (Vec<u32>, bool) {
    let mut unknown = false;
    let mut ids: Vec<u32> = terms
        .into_iter()
        .filter_map(|t| {
            let id = index.term_id(t);
            unknown |= id.is_none();
            id
        })
        .collect();
    ids.sort_unstable();
    ids.dedup();
    (ids, unknown)
}

/// A cursor over one term's postings.
struct Cursor<'a> {
    docs: &'a [u32],
    /// Absolute position of `docs[0]` in the index.
    base: usize,
    /// Position within `docs`.
    pos: usize,
    /// Index of the term in the canonical order.
    slot: usize,
    term: u32,
}

impl Cursor<'_> {
    #[inline]
    fn doc(&self) -> u32 {
        self.docs.get(self.pos).copied().unwrap_or(u32::MAX)
    }
    #[inline]
    fn done(&self) -> bool {
        self.pos >= self.docs.len()
    }
    /// Move to the first posting with id ≥ `d` (galloping from the current position).
    #[inline]
    fn seek(&mut self, d: u32) {
        let docs = self.docs;
        if self.pos >= docs.len() || docs[self.pos] >= d {
            return;
        }
        let mut step = 1;
        let mut lo = self.pos;
        let mut hi = self.pos + 1;
        while hi < docs.len() && docs[hi] < d {
            lo = hi;
            step *= 2;
            hi = (hi + step).min(docs.len());
        }
        let hi = hi.min(docs.len());
        self.pos = lo + 1 + docs[lo + 1..hi].partition_point(|&x| x < d);
    }
}

fn cursors<'a>(index: &'a InvertedIndex, terms: &[u32]) -> Vec<Cursor<'a>> {
    terms
        .iter()
        .enumerate()
        .map(|(slot, &t)| {
            let r = index.range(t);
            Cursor {
                docs: &index.docs()[r.clone()],
                base: r.start,
                pos: 0,
                slot,
                term: t,
            }
        })
        .collect()
}

/// Canonical score from the impacts at the given absolute positions (one per term slot,
/// `None` where the document lacks the term) plus the static part.
#[inline]
fn canonical(scored: &Scored, at: &[Option<usize>]) -> f64 {
    let mut s = 0.0;
    let mut any = None;
    for p in at.iter().flatten() {
        s += scored.impacts[*p];
        any = Some(*p);
    }
    s + any.map_or(0.0, |p| scored.static_at(p))
}

/// Top-k of documents holding every term of `terms` (distinct, ascending).
pub fn top_and(
    index: &InvertedIndex,
    scored: &Scored,
    terms: &[u32],
    k: usize,
) -> (Vec<Hit>, usize) {
    let mut top = TopK::new(k);
    if terms.is_empty() || k == 0 {
        return (Vec::new(), 0);
    }
    let mut cs = cursors(index, terms);
    // Shortest list leads.
    cs.sort_by_key(|c| c.docs.len());
    let rest_max: f64 = cs[1..]
        .iter()
        .map(|c| scored.term_max[c.term as usize])
        .sum::<f64>()
        + scored.static_max;
    let mut at = vec![None; terms.len()];
    let mut matches = 0usize;
    let (lead, others) = cs.split_first_mut().unwrap();
    let lead_blocks = scored.block_start[lead.term as usize];
    'outer: while !lead.done() {
        // Block-max skip on the lead list: no document of this block can beat θ.
        let theta = top.threshold();
        let b = lead.pos / BLOCK;
        if !may_beat(scored.block_max[lead_blocks + b] + rest_max, theta) {
            // Counting matches is needed by AND-then-OR only up to k; skipped blocks may hide
            // matches, so the count is a lower bound once pruning starts (see `top_and_or`).
            lead.pos = ((b + 1) * BLOCK).min(lead.docs.len());
            continue;
        }
        let d = lead.doc();
        for c in others.iter_mut() {
            c.seek(d);
            if c.done() {
                break 'outer;
            }
            if c.doc() != d {
                // Leapfrog: the lead jumps to the other list's document.
                let next = c.doc();
                lead.seek(next);
                continue 'outer;
            }
        }
        matches += 1;
        at[lead.slot] = Some(lead.base + lead.pos);
        for c in others.iter() {
            at[c.slot] = Some(c.base + c.pos);
        }
        top.push(d, canonical(scored, &at));
        lead.pos += 1;
    }
    (top.into_sorted(), matches)
}

/// One term's postings with its block maxima, for OR.
struct OrList<'a> {
    cur: Cursor<'a>,
    /// Largest impact of each block of [`BLOCK`] postings.
    block_max: &'a [f64],
    term_max: f64,
    /// Upper bound of the term's impact over the current window.
    window_max: f64,
}

/// Blocks scanned for a window's maximum before falling back to the term's maximum.
const WINDOW_SCAN: usize = 16;

impl OrList<'_> {
    /// Last document of block `b`.
    #[inline]
    fn block_last(&self, b: usize) -> u32 {
        self.cur.docs[((b + 1) * BLOCK).min(self.cur.docs.len()) - 1]
    }
    /// The block holding the first posting with id ≥ `d` (None past the end), moving the
    /// cursor forward to that block's start when it lies before it (every posting skipped
    /// has an id < `d`). Reads one document id per block, never the postings inside.
    #[inline]
    fn shallow(&mut self, d: u32) -> Option<usize> {
        let n_blocks = self.block_max.len();
        let mut b = self.cur.pos / BLOCK;
        while b < n_blocks && self.block_last(b) < d {
            b += 1;
        }
        if b == n_blocks {
            self.cur.pos = self.cur.docs.len();
            return None;
        }
        self.cur.pos = self.cur.pos.max(b * BLOCK);
        Some(b)
    }
    /// An upper bound of the term's impact on documents `lo..=hi`: the largest block maximum
    /// of the blocks overlapping the range (the term's maximum when more than
    /// [`WINDOW_SCAN`] do), 0 when no posting is left at or after `lo`.
    #[inline]
    fn window_bound(&mut self, lo: u32, hi: u32) -> f64 {
        let Some(b) = self.shallow(lo) else {
            return 0.0;
        };
        if self.cur.doc() > hi {
            return 0.0; // the term's next document lies past the window
        }
        let mut m = self.block_max[b];
        let mut j = b + 1;
        while j < self.block_max.len() && self.cur.docs[j * BLOCK] <= hi {
            if j - b > WINDOW_SCAN {
                return self.term_max;
            }
            m = m.max(self.block_max[j]);
            j += 1;
        }
        m
    }
}

/// Top-k of documents holding any term of `terms` (distinct, ascending): block-max MaxScore.
///
/// The documents are cut into windows `lo..=hi`, `hi` the nearest end of a block among the
/// lists that were essential in the previous window. In a window every list's impact is
/// bounded by the largest maximum of its blocks there; the lists sorted by that bound, the
/// prefix whose bounds (plus the static bound) sum to ≤ θ is non-essential: a document
/// holding only those terms cannot beat θ. A window where every list is non-essential is
/// skipped without reading its postings. Otherwise the candidates are the documents of the
/// essential lists; each one's non-essential terms are looked up largest bound first, after
/// checking that the known part plus the bound of the term's block at that document plus the
/// smaller lists' bounds can still beat θ. The partition is refined as θ rises.
pub fn top_or(index: &InvertedIndex, scored: &Scored, terms: &[u32], k: usize) -> Vec<Hit> {
    let mut top = TopK::new(k);
    if terms.is_empty() || k == 0 {
        return Vec::new();
    }
    let mut ls: Vec<OrList> = cursors(index, terms)
        .into_iter()
        .map(|cur| {
            let t = cur.term as usize;
            OrList {
                block_max: &scored.block_max[scored.block_start[t]..scored.block_start[t + 1]],
                term_max: scored.term_max[t],
                window_max: 0.0,
                cur,
            }
        })
        .collect();
    let n = ls.len();
    // No document below this can be among the k best (it only prunes; the heap admits as before).
    let floor = scored.theta_floor(terms, k);
    let has_static = !scored.weighted_static.is_empty();
    // prefix[i] = static bound + Σ_{j<i} window_max_j, over the lists sorted by window_max.
    let mut prefix = vec![0.0; n + 1];
    let mut at = vec![None; n];
    let mut touched: Vec<usize> = Vec::with_capacity(n);
    let mut essential = 0; // ls[essential..] are essential
    let mut lo = 0u32;
    loop {
        // The window's end: the nearest block end among the lists essential last time (the
        // list with the largest bound when none was), or among all lists when those are done.
        let mut hi = None::<u32>;
        for l in ls[essential.min(n - 1)..].iter_mut() {
            if let Some(b) = l.shallow(lo) {
                hi = Some(hi.map_or(l.block_last(b), |h| h.min(l.block_last(b))));
            }
        }
        if hi.is_none() {
            for l in ls.iter_mut() {
                if let Some(b) = l.shallow(lo) {
                    hi = Some(hi.map_or(l.block_last(b), |h| h.min(l.block_last(b))));
                }
            }
        }
        let Some(hi) = hi else {
            break; // every list is done
        };
        for l in ls.iter_mut() {
            l.window_max = l.window_bound(lo, hi);
        }
        // Insertion sort by bound (a few lists; stable).
        for i in 1..n {
            let mut j = i;
            while j > 0 && ls[j - 1].window_max > ls[j].window_max {
                ls.swap(j - 1, j);
                j -= 1;
            }
        }
        prefix[0] = scored.static_max;
        for i in 0..n {
            prefix[i + 1] = prefix[i] + ls[i].window_max;
        }
        let mut theta = top.threshold().max(floor);
        let mut cut = prune_below(theta);
        essential = 0;
        while essential < n && prefix[essential + 1] <= cut {
            essential += 1;
        }
        if essential < n {
            for l in ls[essential..].iter_mut() {
                l.cur.seek(lo);
            }
        }
        while essential < n {
            // Next candidate: the smallest document of the essential lists in the window.
            let d = ls[essential..]
                .iter()
                .filter(|l| !l.cur.done())
                .map(|l| l.cur.doc())
                .min();
            let d = match d {
                Some(d) if d <= hi => d,
                _ => break,
            };
            let mut partial = 0.0;
            for l in ls[essential..].iter_mut() {
                if !l.cur.done() && l.cur.doc() == d {
                    let p = l.cur.base + l.cur.pos;
                    at[l.cur.slot] = Some(p);
                    touched.push(l.cur.slot);
                    partial += scored.impacts[p];
                    l.cur.pos += 1;
                }
            }
            // Non-essential lists, largest bound first, while the document can still win.
            let mut alive = true;
            for i in (0..essential).rev() {
                if partial + prefix[i + 1] <= cut {
                    alive = false;
                    break;
                }
                let l = &mut ls[i];
                let Some(b) = l.shallow(d) else {
                    continue;
                };
                if partial + l.block_max[b] + prefix[i] <= cut {
                    alive = false;
                    break;
                }
                l.cur.seek(d);
                if l.cur.doc() == d {
                    let p = l.cur.base + l.cur.pos;
                    at[l.cur.slot] = Some(p);
                    touched.push(l.cur.slot);
                    partial += scored.impacts[p];
                }
            }
            // With static scores (possibly negative) the exact score decides.
            if alive && (has_static || partial > cut) {
                top.push(d, canonical(scored, &at));
                let t = top.threshold().max(floor);
                if t != theta {
                    theta = t;
                    cut = prune_below(theta);
                    while essential < n && prefix[essential + 1] <= cut {
                        essential += 1;
                    }
                }
            }
            for &s in &touched {
                at[s] = None;
            }
            touched.clear();
        }
        if hi == u32::MAX {
            break;
        }
        lo = hi + 1;
    }
    top.into_sorted()
}

/// AND; the OR result when AND finds fewer than k documents.
pub fn top_and_or(index: &InvertedIndex, scored: &Scored, terms: &[u32], k: usize) -> Vec<Hit> {
    let (hits, _) = top_and(index, scored, terms, k);
    // Pruning only starts once k documents are held, so fewer than k hits means AND
    // matched fewer than k documents.
    if hits.len() >= k {
        hits
    } else {
        top_or(index, scored, terms, k)
    }
}

/// Rank one query.
pub fn top(
    index: &InvertedIndex,
    scored: &Scored,
    terms: &[u32],
    unknown: bool,
    k: usize,
    mode: Mode,
) -> Vec<Hit> {
    match mode {
        // A term absent from the index matches no document: AND is empty.
        Mode::And if unknown => Vec::new(),
        Mode::And => top_and(index, scored, terms, k).0,
        Mode::Or => top_or(index, scored, terms, k),
        Mode::AndOr if unknown => top_or(index, scored, terms, k),
        Mode::AndOr => top_and_or(index, scored, terms, k),
    }
}

/// Every matching document scored, sorted, cut at k: the oracle of the tests.
///
/// A dense accumulator over the query's documents (their sorted distinct ids): the terms are
/// added in ascending term-id order, the canonical order, so each sum is the one `canonical`
/// computes.
pub fn exhaustive(
    index: &InvertedIndex,
    scored: &Scored,
    terms: &[u32],
    unknown: bool,
    k: usize,
    mode: Mode,
) -> Vec<Hit> {
    let mut ids: Vec<u32> = terms
        .iter()
        .flat_map(|&t| index.docs()[index.range(t)].iter().copied())
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut sum = vec![0.0f64; ids.len()];
    let mut count = vec![0usize; ids.len()];
    let mut last = vec![0usize; ids.len()]; // a posting of the document, for its static score
    for &t in terms {
        for p in index.range(t) {
            let r = ids.binary_search(&index.docs()[p]).unwrap();
            sum[r] += scored.impacts[p];
            count[r] += 1;
            last[r] = p;
        }
    }
    let rank = |and: bool| {
        let mut hits: Vec<Hit> = (0..ids.len())
            .filter(|&r| !and || (!unknown && count[r] == terms.len()))
            .map(|r| Hit {
                doc: ids[r],
                score: sum[r] + scored.static_at(last[r]),
            })
            .collect();
        hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
        hits
    };
    let mut hits = match mode {
        Mode::And => rank(true),
        Mode::Or => rank(false),
        Mode::AndOr => {
            let h = rank(true);
            if h.len() >= k { h } else { rank(false) }
        }
    };
    hits.truncate(k);
    hits
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::search::index::IndexedDoc;
    use crate::search::scoring::Bm25Params;
    use crate::search::tokenize::TokenizerOptions;

    /// A random corpus over a Zipf-like vocabulary: a few terms in most documents (long lists
    /// that span many blocks), most terms rare; optional static scores with ties.
    fn corpus(rng: &mut StdRng, docs: usize, vocab: usize, with_static: bool) -> InvertedIndex {
        let words: Vec<String> = (0..vocab).map(|i| format!("w{i}")).collect();
        let texts: Vec<Vec<&str>> = (0..docs)
            .map(|_| {
                let len = rng.random_range(0..30);
                (0..len)
                    .map(|_| {
                        let r: f64 = rng.random();
                        words[((r * r * r) * vocab as f64) as usize].as_str()
                    })
                    .collect()
            })
            .collect();
        let mut ids: Vec<u32> = (0..docs as u32 * 3).step_by(3).collect();
        // Ids in shuffled input order: the index sorts them.
        ids.reverse();
        let docs: Vec<IndexedDoc> = texts
            .into_iter()
            .zip(ids)
            .map(|(terms, id)| IndexedDoc {
                id,
                terms,
                static_score: Some((id % 7) as f64 / 7.0),
            })
            .collect();
        InvertedIndex::build(&docs, TokenizerOptions::default(), with_static)
    }

    /// A `k` far above the matches (up to the largest `topk_bm25` accepts) reserves nothing
    /// in proportion to it: it used to reserve `k` hits up front, and aborted on allocation.
    #[test]
    fn huge_k_allocates_for_the_matches_only() {
        let mut rng = StdRng::seed_from_u64(11);
        let index = corpus(&mut rng, 300, 40, false);
        let scored = Scored::new(&index, Bm25Params::default());
        let (terms, unknown) = query_terms(&index, ["w0", "w1", "w7"]);
        for k in [300_000_000, u32::MAX as usize] {
            assert!(TopK::new(k).heap.capacity() <= RESERVED_HITS + 1);
            for mode in [Mode::And, Mode::Or, Mode::AndOr] {
                let got = top(&index, &scored, &terms, unknown, k, mode);
                let want = exhaustive(&index, &scored, &terms, unknown, 1000, mode);
                assert_eq!(got, want, "k {k} {mode:?}");
            }
        }
    }

    #[test]
    fn pruned_top_k_equals_exhaustive() {
        let mut rng = StdRng::seed_from_u64(7);
        for round in 0..12 {
            let with_static = round % 3 == 2;
            let index = corpus(&mut rng, 200 + round * 150, 40 + round * 5, with_static);
            let params = Bm25Params {
                k1: [1.2, 0.0, 2.0][round % 3],
                b: [0.75, 1.0, 0.0][round % 3],
                alpha: 0.3,
            };
            let scored = Scored::new(&index, params);
            for _ in 0..60 {
                let q: Vec<String> = (0..rng.random_range(0..5))
                    .map(|_| format!("w{}", rng.random_range(0..(60 + round * 5))))
                    .collect();
                let (terms, unknown) = query_terms(&index, q.iter().map(String::as_str));
                for k in [1, 3, 10, 1000] {
                    for mode in [Mode::And, Mode::Or, Mode::AndOr] {
                        let got = top(&index, &scored, &terms, unknown, k, mode);
                        let want = exhaustive(&index, &scored, &terms, unknown, k, mode);
                        assert_eq!(got, want, "round {round} query {q:?} k {k} {mode:?}");
                    }
                }
            }
        }
    }

    #[test]
    fn ties_go_to_the_smaller_id_and_k_zero_is_empty() {
        // Three identical documents: identical scores, ranked by id.
        let docs: Vec<IndexedDoc> = [9u32, 4, 6]
            .into_iter()
            .map(|id| IndexedDoc {
                id,
                terms: vec!["a", "b"],
                static_score: None,
            })
            .collect();
        let index = InvertedIndex::build(&docs, TokenizerOptions::default(), false);
        let scored = Scored::new(&index, Bm25Params::default());
        let (terms, unknown) = query_terms(&index, ["a", "b", "a"]);
        assert_eq!(terms.len(), 2);
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            let hits = top(&index, &scored, &terms, unknown, 2, mode);
            assert_eq!(hits.iter().map(|h| h.doc).collect::<Vec<_>>(), [4, 6]);
            assert_eq!(hits[0].score, hits[1].score);
            assert!(top(&index, &scored, &terms, unknown, 0, mode).is_empty());
        }
        // An unknown term empties AND; AND-then-OR falls back to OR.
        let (terms, unknown) = query_terms(&index, ["a", "zzz"]);
        assert!(top(&index, &scored, &terms, unknown, 5, Mode::And).is_empty());
        assert_eq!(
            top(&index, &scored, &terms, unknown, 5, Mode::AndOr).len(),
            3
        );
    }

    /// Every document of the index scored by looking each query term up in it: a second,
    /// independent oracle for `exhaustive` itself.
    fn naive(
        index: &InvertedIndex,
        scored: &Scored,
        terms: &[u32],
        unknown: bool,
    ) -> Vec<(Hit, bool)> {
        let mut ids = index.docs().to_vec();
        ids.sort_unstable();
        ids.dedup();
        let mut hits = Vec::new();
        for doc in ids {
            let at: Vec<Option<usize>> = terms
                .iter()
                .map(|&t| index.range(t).find(|&p| index.docs()[p] == doc))
                .collect();
            if at.iter().any(Option::is_some) {
                let all = !unknown && at.iter().all(Option::is_some);
                let score = canonical(scored, &at);
                hits.push((Hit { doc, score }, all));
            }
        }
        hits
    }

    /// A corpus built for block boundaries and ties: `n` documents with scrambled distinct ids
    /// (sometimes including `u32::MAX`), term `j` in a document with probability `dens[j]`
    /// (dense terms give lists of many 64-posting blocks); with `ties`, every impact of a term
    /// equal, else mostly low frequencies with rare high ones (block maxima that differ from
    /// block to block); optional static scores with few values.
    fn block_corpus(
        n: usize,
        dens: &[f64],
        seed: u64,
        ties: bool,
        with_static: bool,
    ) -> InvertedIndex {
        const WORDS: [&str; 6] = ["t0", "t1", "t2", "t3", "t4", "t5"];
        let mut rng = StdRng::seed_from_u64(seed);
        let max_id = seed.is_multiple_of(3);
        let docs: Vec<IndexedDoc> = (0..n)
            .map(|i| {
                let mut terms = Vec::new();
                for (j, &p) in dens.iter().enumerate() {
                    if rng.random::<f64>() < p {
                        // Rare spikes of a high frequency make block maxima differ.
                        let tf = match (ties, rng.random::<f64>() < 0.03) {
                            (true, _) => 1,
                            (false, true) => rng.random_range(4..12),
                            (false, false) => rng.random_range(1..3),
                        };
                        terms.extend(std::iter::repeat_n(WORDS[j], tf));
                    }
                }
                let pad = if ties { 3 } else { rng.random_range(0..30) };
                terms.extend(std::iter::repeat_n("pad", pad));
                let id = if max_id && i == n / 2 {
                    u32::MAX
                } else {
                    (i as u32).wrapping_mul(2_654_435_761) % 4_000_000_000
                };
                IndexedDoc {
                    id,
                    terms,
                    static_score: Some((id % 3) as f64 / 2.0),
                }
            })
            .collect();
        InvertedIndex::build(&docs, TokenizerOptions::default(), with_static)
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]
        /// Long lists (many blocks), dense and sparse terms together, heavy ties, k from 1 to
        /// beyond the number of matches: the pruned evaluators equal the exhaustive scorer,
        /// which equals a per-document lookup.
        #[test]
        fn block_boundaries_and_ties(
            n in 1usize..2500,
            dens in proptest::collection::vec(
                proptest::sample::select(vec![0.97, 0.6, 0.3, 0.05, 0.005]), 1..6),
            seed in proptest::prelude::any::<u64>(),
            ties in proptest::prelude::any::<bool>(),
            with_static in proptest::prelude::any::<bool>(),
            params in proptest::sample::select(vec![(1.2, 0.75), (0.0, 0.5), (2.0, 0.0), (0.5, 1.0)]),
            queries in proptest::collection::vec(
                proptest::collection::vec(0usize..7, 1..6), 1..5),
        ) {
            let index = block_corpus(n, &dens, seed, ties, with_static);
            let scored = Scored::new(&index, Bm25Params { k1: params.0, b: params.1, alpha: 0.4 });
            for q in &queries {
                // Word 6 is unknown (never indexed).
                let words: Vec<String> = q
                    .iter()
                    .map(|&w| if w == 6 { "nope".to_string() } else { format!("t{w}") })
                    .collect();
                let (terms, unknown) = query_terms(&index, words.iter().map(String::as_str));
                let all = naive(&index, &scored, &terms, unknown);
                let matches = all.len();
                for k in [1, 2, 10, 63, 64, 65, matches, matches + 1, 5000] {
                    for mode in [Mode::And, Mode::Or, Mode::AndOr] {
                        let want = exhaustive(&index, &scored, &terms, unknown, k, mode);
                        let got = top(&index, &scored, &terms, unknown, k, mode);
                        proptest::prop_assert_eq!(&got, &want, "{:?} k {} {:?}", words, k, mode);
                        // The oracle against the per-document lookup.
                        let and: Vec<Hit> = all.iter().filter(|h| h.1).map(|h| h.0).collect();
                        let or: Vec<Hit> = all.iter().map(|h| h.0).collect();
                        let mut naive_hits = match mode {
                            Mode::And => and,
                            Mode::Or => or,
                            Mode::AndOr => if and.len() >= k { and } else { or },
                        };
                        naive_hits.sort_by(|a, b| b.score.total_cmp(&a.score).then(a.doc.cmp(&b.doc)));
                        naive_hits.truncate(k);
                        proptest::prop_assert_eq!(&want, &naive_hits, "oracle {:?} k {} {:?}", words, k, mode);
                    }
                }
            }
        }
    }

    /// The formula on a case small enough to write out.
    #[test]
    fn bm25_by_hand() {
        // d1 = "a a b" (len 3), d2 = "b c" (len 2): N = 2, avgdl = 2.5.
        let docs = vec![
            IndexedDoc {
                id: 1,
                terms: vec!["a", "a", "b"],
                static_score: None,
            },
            IndexedDoc {
                id: 2,
                terms: vec!["b", "c"],
                static_score: None,
            },
        ];
        let index = InvertedIndex::build(&docs, TokenizerOptions::default(), false);
        let scored = Scored::new(&index, Bm25Params::default());
        let (k1, b, avgdl) = (1.2f64, 0.75f64, 2.5f64);
        let idf = |n: f64| (1.0 + (2.0 - n + 0.5) / (n + 0.5)).ln();
        let tw = |tf: f64, len: f64, n: f64| {
            idf(n) * tf * (k1 + 1.0) / (tf + k1 * (1.0 - b + b * len / avgdl))
        };
        let (terms, _) = query_terms(&index, ["a", "b"]);
        let hits = top(&index, &scored, &terms, false, 10, Mode::Or);
        assert_eq!(hits[0].doc, 1);
        assert!((hits[0].score - (tw(2.0, 3.0, 1.0) + tw(1.0, 3.0, 2.0))).abs() < 1e-12);
        assert_eq!(hits[1].doc, 2);
        assert!((hits[1].score - tw(1.0, 2.0, 2.0)).abs() < 1e-12);
    }
}
