//! A batch of tokenized queries in one flat (CSR) layout: every query's term ids in one
//! vector, cut by offsets, as an Arrow list column holds them.
//!
//! One allocation for the batch instead of one per query: the GPU path copies the term ids
//! into its upload buffer in one sequential pass (a vector per query cost a cache miss per
//! query: ~0.1 ms of a 10,000-query batch, on the parallel groups that hid it), and the CPU
//! path reads each query's terms from memory its neighbours share.

use super::index::InvertedIndex;
use super::topk::query_terms;

/// One tokenized query: its distinct known term ids, ascending, and whether it had a term
/// the index does not hold (see [`query_terms`]).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QueryTerms {
    pub ids: Vec<u32>,
    pub unknown: bool,
}

impl QueryTerms {
    /// The query of `terms` (tokens) against `index`.
    pub fn of<'a>(index: &InvertedIndex, terms: impl IntoIterator<Item = &'a str>) -> Self {
        let (ids, unknown) = query_terms(index, terms);
        Self { ids, unknown }
    }
}

/// A batch of queries: query `i`'s term ids are `ids[offsets[i]..offsets[i + 1]]` (distinct,
/// ascending), and `unknown[i]` says whether it had a term the index does not hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Queries {
    offsets: Vec<usize>,
    ids: Vec<u32>,
    unknown: Vec<bool>,
}

impl Default for Queries {
    fn default() -> Self {
        Self::new()
    }
}

impl Queries {
    /// No queries.
    pub fn new() -> Self {
        Self {
            offsets: vec![0],
            ids: Vec::new(),
            unknown: Vec::new(),
        }
    }

    /// Add a query: its distinct term ids, ascending, and whether it had an unknown term.
    pub fn push(&mut self, ids: &[u32], unknown: bool) {
        self.ids.extend_from_slice(ids);
        self.offsets.push(self.ids.len());
        self.unknown.push(unknown);
    }

    /// Add every query of `other` after these.
    pub fn append(&mut self, other: &Queries) {
        let base = self.ids.len();
        self.ids.extend_from_slice(&other.ids);
        self.offsets
            .extend(other.offsets[1..].iter().map(|&o| base + o));
        self.unknown.extend_from_slice(&other.unknown);
    }

    /// Queries held.
    pub fn len(&self) -> usize {
        self.unknown.len()
    }

    pub fn is_empty(&self) -> bool {
        self.unknown.is_empty()
    }

    /// Query `i`'s term ids.
    #[inline]
    pub fn ids(&self, i: usize) -> &[u32] {
        &self.ids[self.offsets[i]..self.offsets[i + 1]]
    }

    /// Whether query `i` had a term the index does not hold.
    #[inline]
    pub fn unknown(&self, i: usize) -> bool {
        self.unknown[i]
    }

    /// Every term id of the batch.
    pub fn all_ids(&self) -> &[u32] {
        &self.ids
    }

    /// Where each query's ids start in [`Self::all_ids`] (and, last, where they end).
    pub fn offsets(&self) -> &[usize] {
        &self.offsets
    }

    /// Whether each query had a term the index does not hold.
    pub fn unknown_flags(&self) -> &[bool] {
        &self.unknown
    }

    /// Query `i` on its own.
    pub fn get(&self, i: usize) -> QueryTerms {
        QueryTerms {
            ids: self.ids(i).to_vec(),
            unknown: self.unknown(i),
        }
    }

    /// The first `n` queries.
    pub fn prefix(&self, n: usize) -> Queries {
        let n = n.min(self.len());
        Queries {
            offsets: self.offsets[..=n].to_vec(),
            ids: self.ids[..self.offsets[n]].to_vec(),
            unknown: self.unknown[..n].to_vec(),
        }
    }

    /// Batches written in parallel, one after another.
    pub fn concat(parts: &[Queries]) -> Queries {
        let mut all = Queries {
            offsets: Vec::with_capacity(parts.iter().map(Queries::len).sum::<usize>() + 1),
            ids: Vec::with_capacity(parts.iter().map(|p| p.ids.len()).sum()),
            unknown: Vec::with_capacity(parts.iter().map(Queries::len).sum()),
        };
        all.offsets.push(0);
        for p in parts {
            all.append(p);
        }
        all
    }
}

impl<'a> FromIterator<&'a QueryTerms> for Queries {
    fn from_iter<I: IntoIterator<Item = &'a QueryTerms>>(iter: I) -> Self {
        let mut q = Queries::new();
        for t in iter {
            q.push(&t.ids, t.unknown);
        }
        q
    }
}

impl FromIterator<QueryTerms> for Queries {
    fn from_iter<I: IntoIterator<Item = QueryTerms>>(iter: I) -> Self {
        let mut q = Queries::new();
        for t in iter {
            q.push(&t.ids, t.unknown);
        }
        q
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Pushed one by one, appended in parts, or cut to a prefix: every query reads back
        /// as it went in.
        #[test]
        fn queries_round_trip(
            qs in proptest::collection::vec(
                (proptest::collection::vec(0u32..50, 0..6), proptest::bool::ANY),
                0..40,
            ),
            cut in 0usize..41,
        ) {
            let terms: Vec<QueryTerms> =
                qs.iter().map(|(ids, unknown)| QueryTerms { ids: ids.clone(), unknown: *unknown }).collect();
            let all: Queries = terms.iter().collect();
            proptest::prop_assert_eq!(all.len(), terms.len());
            for (i, t) in terms.iter().enumerate() {
                proptest::prop_assert_eq!(&all.get(i), t);
            }
            let cut = cut.min(terms.len());
            let (a, b) = terms.split_at(cut);
            let parts = [a.iter().collect::<Queries>(), b.iter().collect::<Queries>()];
            proptest::prop_assert_eq!(&Queries::concat(&parts), &all);
            let p = all.prefix(cut);
            proptest::prop_assert_eq!(p, parts[0].clone());
            proptest::prop_assert_eq!(
                all.all_ids().len(),
                terms.iter().map(|t| t.ids.len()).sum::<usize>()
            );
        }
    }
}
