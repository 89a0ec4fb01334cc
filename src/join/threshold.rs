//! A similarity threshold and its exact translation into overlaps and set sizes (the
//! "equivalent overlap" of Bellas & Gounaris, Table I).
//!
//! The join's predicate is, by definition, `score(o, n, m) >= t` (or `> t`) evaluated in
//! `f64` by [`Measure::score`], the very function the SQL functions return. Nothing here
//! trusts a closed formula with rounding: Table I's real-valued bound
//! (`t/(1+t)·(n+m)` for Jaccard, `t·sqrt(n·m)` for cosine, `t·(n+m)/2` for Dice, `t` for
//! overlap) only gives a first guess, which is then corrected with the predicate itself.
//! That is exact because, for fixed sizes, the `f64` score is monotone non-decreasing in the
//! overlap `o` (each formula is one correctly rounded operation of exact integers, or, for
//! cosine, a division by a fixed denominator), and, for fixed `o` and `n`, non-increasing in
//! the partner size `m`. So `passes(o, n, m) ⇔ o >= min_overlap(n, m)`: a pair exactly at the
//! threshold (Jaccard 4/5 against `0.8`) is neither lost nor gained, and the join returns
//! what `WHERE jaccard(a, b) >= 0.8` returns.

use std::fmt;

use datafusion::common::{Result, plan_err};

use crate::intersect::similarity::Measure;

/// `>=` (the default) or `>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Comparison {
    /// `score >= t`.
    GtEq,
    /// `score > t`.
    Gt,
}

impl Comparison {
    /// Parse `'>='` or `'>'`.
    pub fn from_op(op: &str) -> Option<Self> {
        match op.trim() {
            ">=" => Some(Self::GtEq),
            ">" => Some(Self::Gt),
            _ => None,
        }
    }
}

impl fmt::Display for Comparison {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::GtEq => ">=",
            Self::Gt => ">",
        })
    }
}

/// The join predicate `measure(a, b) <cmp> value`.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Threshold {
    measure: Measure,
    value: f64,
    cmp: Comparison,
}

impl Threshold {
    /// A validated threshold: finite and `> 0` (`>= 0` with [`Comparison::Gt`]: `score > 0`
    /// is "shares at least one element"), and `<= 1` for the normalized measures. These are
    /// exactly the thresholds an empty set (score 0) cannot pass, which is what lets the join
    /// drop empty sets. `who` names the caller in the error (e.g.
    /// `similarity_join: argument 8 (threshold)`).
    pub fn try_new(measure: Measure, value: f64, cmp: Comparison, who: &str) -> Result<Self> {
        let positive = match cmp {
            Comparison::GtEq => value > 0.0,
            Comparison::Gt => value >= 0.0,
        };
        if !value.is_finite() || !positive {
            if measure.is_normalized() {
                return plan_err!(
                    "{who}: the {} threshold must be in (0, 1], got {value}",
                    measure.name()
                );
            }
            return plan_err!(
                "{who}: the overlap threshold must be a positive number, got {value}"
            );
        }
        if measure.is_normalized() && value > 1.0 {
            return plan_err!(
                "{who}: the {} threshold must be in (0, 1], got {value}",
                measure.name()
            );
        }
        Ok(Self {
            measure,
            value,
            cmp,
        })
    }

    /// The measure.
    pub fn measure(&self) -> Measure {
        self.measure
    }

    /// The threshold value.
    pub fn value(&self) -> f64 {
        self.value
    }

    /// The comparison.
    pub fn comparison(&self) -> Comparison {
        self.cmp
    }

    /// Whether `score` satisfies the predicate.
    #[inline]
    pub fn accepts(&self, score: f64) -> bool {
        match self.cmp {
            Comparison::GtEq => score >= self.value,
            Comparison::Gt => score > self.value,
        }
    }

    /// Whether sets of sizes `n`, `m` sharing `o` elements satisfy the predicate.
    #[inline]
    pub fn passes(&self, o: u64, n: u64, m: u64) -> bool {
        self.accepts(self.measure.score(o, n, m))
    }

    /// The smallest overlap `o <= min(n, m)` with which sets of sizes `n`, `m` pass, `None`
    /// when even `o = min(n, m)` does not. Symmetric in `n`, `m`; non-decreasing in each.
    #[inline]
    pub fn min_overlap(&self, n: u64, m: u64) -> Option<u64> {
        let cap = n.min(m);
        let t = self.value;
        let (nf, mf) = (n as f64, m as f64);
        let guess = match self.measure {
            Measure::Jaccard => t / (1.0 + t) * (nf + mf),
            Measure::Cosine => t * (nf * mf).sqrt(),
            Measure::Dice => t * (nf + mf) / 2.0,
            Measure::Overlap => t,
        };
        // `as` saturates (and maps NaN to 0); the loops below make the guess exact.
        let mut o = (guess.ceil() as u64).min(cap.saturating_add(1));
        while o > 0 && self.passes(o - 1, n, m) {
            o -= 1;
        }
        while o <= cap && !self.passes(o, n, m) {
            o += 1;
        }
        (o <= cap).then_some(o)
    }

    /// The probe prefix of a set of size `n`: how many of its smallest tokens (under any one
    /// total order of the tokens) must include a token of every set it passes with, whatever
    /// that set's size; `None` when it passes with no set. Any passing pair shares at least
    /// `min_overlap(n, m)` tokens, which is least for the smallest partner size `m`
    /// (`min_overlap` does not decrease in `m`), so `n - min_overlap + 1` tokens suffice
    /// (the prefix filtering principle). The prefix-partitioned join routes on it.
    pub fn prefix_len(&self, n: u64) -> Option<u64> {
        let m = self.min_partner_size(n)?;
        let o = self.min_overlap(n, m)?;
        Some(n - o.max(1) + 1)
    }

    /// The smallest size `m <= n` of a set that can pass with a set of size `n` (the length
    /// filter for partners no larger than `n`), `None` when none can.
    pub fn min_partner_size(&self, n: u64) -> Option<u64> {
        // `passes(m, n, m)` (the best case, partner ⊂ set) is non-decreasing in m on [1, n].
        if n == 0 || !self.passes(n, n, n) {
            return None;
        }
        let (mut lo, mut hi) = (1u64, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            if self.passes(mid, n, mid) {
                hi = mid
            } else {
                lo = mid + 1
            }
        }
        Some(lo)
    }
}

impl fmt::Display for Threshold {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} {}", self.measure.name(), self.cmp, self.value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn thresholds() -> Vec<Threshold> {
        let mut out = Vec::new();
        for measure in Measure::ALL {
            out.push(Threshold::try_new(measure, 0.0, Comparison::Gt, "test").unwrap());
        }
        for measure in Measure::ALL {
            let values: &[f64] = if measure.is_normalized() {
                &[
                    0.01,
                    0.1,
                    0.2,
                    1.0 / 3.0,
                    0.5,
                    0.6,
                    2.0 / 3.0,
                    0.7,
                    0.75,
                    0.8,
                    0.9,
                    0.95,
                    0.99,
                    1.0,
                ]
            } else {
                &[0.5, 1.0, 2.0, 2.5, 3.0, 7.0, 40.0]
            };
            for &v in values {
                for cmp in [Comparison::GtEq, Comparison::Gt] {
                    out.push(Threshold::try_new(measure, v, cmp, "test").unwrap());
                }
            }
        }
        out
    }

    /// `min_overlap` is exactly the boundary of `passes`, for every size pair up to 60.
    #[test]
    fn min_overlap_is_exact() {
        for th in thresholds() {
            for n in 0..60u64 {
                for m in 0..60u64 {
                    let want = (0..=n.min(m)).find(|&o| th.passes(o, n, m));
                    assert_eq!(th.min_overlap(n, m), want, "{th} n={n} m={m}");
                    assert_eq!(th.min_overlap(m, n), want, "symmetry {th} n={n} m={m}");
                    if let Some(o) = want {
                        assert!((o..=n.min(m)).all(|o| th.passes(o, n, m)), "monotone {th}");
                    }
                }
            }
        }
    }

    #[test]
    fn min_partner_size_is_exact() {
        for th in thresholds() {
            for n in 0..200u64 {
                let want = (1..=n).find(|&m| th.passes(m, n, m));
                assert_eq!(th.min_partner_size(n), want, "{th} n={n}");
            }
        }
    }

    /// Every passing pair of sizes `n`, `m` shares at least `n - prefix_len(n) + 1` tokens
    /// (and as many by `m`), so both prefixes hold a common token; and the bound is tight:
    /// one token fewer in the prefix and some pair passes with exactly that overlap.
    #[test]
    fn prefix_len_covers_every_passing_pair() {
        for th in thresholds() {
            for n in 1..80u64 {
                let Some(p) = th.prefix_len(n) else {
                    assert!(
                        (1..200).all(|m| th.min_overlap(n, m).is_none()),
                        "{th} n={n}"
                    );
                    continue;
                };
                assert!((1..=n).contains(&p), "{th} n={n} p={p}");
                let least = (1..200)
                    .filter_map(|m| th.min_overlap(n, m))
                    .min()
                    .expect("a partner");
                assert_eq!(p, n - least + 1, "{th} n={n}");
            }
        }
    }

    /// Pairs exactly at the threshold pass `>=` and fail `>`.
    #[test]
    fn at_the_threshold() {
        let ge = Threshold::try_new(Measure::Jaccard, 0.8, Comparison::GtEq, "t").unwrap();
        let gt = Threshold::try_new(Measure::Jaccard, 0.8, Comparison::Gt, "t").unwrap();
        assert_eq!(ge.min_overlap(10, 10), Some(9)); // the paper's example: 9/11 >= 0.8
        assert_eq!(ge.min_overlap(5, 4), Some(4)); // 4/5 == 0.8
        assert_eq!(gt.min_overlap(5, 4), None);
        let dice = Threshold::try_new(Measure::Dice, 0.8, Comparison::GtEq, "t").unwrap();
        assert_eq!(dice.min_overlap(2, 3), Some(2)); // 4/5
        let cos = Threshold::try_new(Measure::Cosine, 0.5, Comparison::GtEq, "t").unwrap();
        assert_eq!(cos.min_overlap(4, 4), Some(2)); // 2/4
        let ov = Threshold::try_new(Measure::Overlap, 3.0, Comparison::GtEq, "t").unwrap();
        assert_eq!(ov.min_overlap(10, 2), None);
        assert_eq!(ov.min_overlap(10, 3), Some(3));
    }

    #[test]
    fn bad_values() {
        for v in [0.0, -0.5, 1.5, f64::NAN, f64::INFINITY] {
            assert!(
                Threshold::try_new(Measure::Jaccard, v, Comparison::GtEq, "f").is_err(),
                "{v}"
            );
        }
        assert!(Threshold::try_new(Measure::Overlap, 3.0, Comparison::GtEq, "f").is_ok());
        assert!(Threshold::try_new(Measure::Overlap, 0.0, Comparison::GtEq, "f").is_err());
        // `> 0` is "at least one common element"; `> -0.5` would let empty sets pass.
        for m in Measure::ALL {
            let th = Threshold::try_new(m, 0.0, Comparison::Gt, "f").unwrap();
            assert_eq!(th.min_overlap(3, 5), Some(1));
            assert_eq!(th.min_overlap(0, 5), None);
            assert!(Threshold::try_new(m, -0.5, Comparison::Gt, "f").is_err());
        }
    }
}
