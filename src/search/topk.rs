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

impl TopK {
    pub fn new(k: usize) -> Self {
        Self {
            k,
            heap: BinaryHeap::with_capacity(k + 1),
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
    pub fn len(&self) -> usize {
        self.heap.len()
    }
    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
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

/// Top-k of documents holding any term of `terms` (distinct, ascending): MaxScore.
pub fn top_or(index: &InvertedIndex, scored: &Scored, terms: &[u32], k: usize) -> Vec<Hit> {
    let mut top = TopK::new(k);
    if terms.is_empty() || k == 0 {
        return Vec::new();
    }
    let mut cs = cursors(index, terms);
    // Ascending maximum impact: a prefix whose bounds sum to ≤ θ is non-essential.
    cs.sort_by(|a, b| {
        scored.term_max[a.term as usize].total_cmp(&scored.term_max[b.term as usize])
    });
    let n = cs.len();
    // prefix[i] = Σ_{j<i} max_j (+ static bound)
    let mut prefix = vec![scored.static_max; n + 1];
    for i in 0..n {
        prefix[i + 1] = prefix[i] + scored.term_max[cs[i].term as usize];
    }
    let mut essential = 0; // cs[essential..] are essential
    let mut at = vec![None; terms.len()];
    loop {
        let theta = top.threshold();
        while essential < n && !may_beat(prefix[essential + 1], theta) {
            essential += 1;
        }
        if essential == n {
            break;
        }
        // Next candidate: the smallest current document among the essential lists.
        let d = cs[essential..].iter().map(Cursor::doc).min().unwrap();
        if d == u32::MAX {
            break;
        }
        at.iter_mut().for_each(|a| *a = None);
        let mut partial = 0.0;
        for c in cs[essential..].iter_mut() {
            if c.doc() == d {
                let p = c.base + c.pos;
                at[c.slot] = Some(p);
                partial += scored.impacts[p];
                c.pos += 1;
            }
        }
        // Non-essential lists, largest bound first, while the document can still win.
        let mut alive = true;
        for i in (0..essential).rev() {
            if !may_beat(partial + prefix[i + 1], theta) {
                alive = false;
                break;
            }
            let c = &mut cs[i];
            c.seek(d);
            if c.doc() == d {
                let p = c.base + c.pos;
                at[c.slot] = Some(p);
                partial += scored.impacts[p];
            }
        }
        if alive {
            top.push(d, canonical(scored, &at));
        }
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
pub fn exhaustive(
    index: &InvertedIndex,
    scored: &Scored,
    terms: &[u32],
    unknown: bool,
    k: usize,
    mode: Mode,
) -> Vec<Hit> {
    use std::collections::BTreeMap;
    let mut per_doc: BTreeMap<u32, Vec<Option<usize>>> = BTreeMap::new();
    for (slot, &t) in terms.iter().enumerate() {
        for p in index.range(t) {
            per_doc
                .entry(index.docs()[p])
                .or_insert_with(|| vec![None; terms.len()])[slot] = Some(p);
        }
    }
    let all = |v: &Vec<Option<usize>>| !unknown && v.iter().all(Option::is_some);
    let rank = |and: bool| {
        let mut hits: Vec<Hit> = per_doc
            .iter()
            .filter(|(_, v)| !and || all(v))
            .map(|(&doc, v)| Hit {
                doc,
                score: canonical(scored, v),
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
