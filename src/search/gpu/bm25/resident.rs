//! The index on the device, made resident once per [`Scored`] (per index and parameter
//! set) and kept between batches: document ordinals (the rank of each doc id, so ordinal
//! order is doc-id order) and f64 impacts of the resident terms' postings, and per ordinal
//! the doc id and the weighted static score. When the whole index does not fit the budget,
//! the terms the queries visit most (counted over the batches seen) are admitted first (the
//! Wang et al. list cache).

use std::sync::{Arc, Mutex, Weak};

use rayon::prelude::*;

use crate::backend::gpu::{DevBuf, Gpu, GpuError, bytes_of};
use crate::search::index::InvertedIndex;
use crate::search::scoring::{FLOOR_K, Scored};
use crate::tuning::env;

/// The index on the device.
pub(super) struct Resident {
    pub(super) scored: Weak<Scored>,
    /// Ordinal of every posting of the index (host copy, for rebuilding the selection).
    pub(super) host_ord: Vec<u32>,
    /// Doc id of every ordinal.
    pub(super) ord_doc: Vec<u32>,
    /// Weighted static score of every ordinal (empty without static scores).
    pub(super) ord_static: Vec<f64>,
    /// Each term's `ListRef` (bm25.cu) as two words: the device position of its postings
    /// (`u64::MAX` where not resident), and its length with its maximum impact (f32, rounded
    /// up) above. One read per term when a batch is staged.
    pub(super) refs: Vec<[u64; 2]>,
    /// Every term's own floor at one k (`Scored::term_floor`), for the last k staged.
    pub(super) floors: Option<(usize, Vec<f64>)>,
    /// Times each term was visited by a query (over every batch seen).
    pub(super) visits: Vec<u64>,
    pub(super) all: bool,
    pub(super) ord: Option<DevBuf>,
    pub(super) imp: Option<DevBuf>,
    pub(super) stat: Option<DevBuf>,
    pub(super) doc: Option<DevBuf>,
    /// The device's copy of `refs` (device-planned batches), uploaded once.
    pub(super) d_refs: Option<DevBuf>,
    /// The device's copy of `floors` at one k.
    pub(super) d_floors: Option<(usize, DevBuf)>,
    pub(super) bytes: usize,
}

pub(super) static RESIDENT: Mutex<Option<Resident>> = Mutex::new(None);

/// The default budget: `DFSETS_GPU_INDEX_BUDGET` bytes, else half the device's memory.
pub(super) fn default_budget(g: &Gpu) -> usize {
    env().gpu_index_budget.unwrap_or(g.info.total_memory / 2)
}

impl Resident {
    pub(super) fn new(index: &InvertedIndex, scored: &Arc<Scored>) -> Result<Self, GpuError> {
        let mut ord_doc: Vec<u32> = index.docs().to_vec();
        ord_doc.par_sort_unstable();
        ord_doc.dedup();
        let host_ord: Vec<u32> = index
            .docs()
            .par_iter()
            .map(|d| ord_doc.binary_search(d).unwrap_or(0) as u32)
            .collect();
        let mut ord_static = Vec::new();
        if !scored.weighted_static.is_empty() {
            ord_static = vec![f64::NAN; ord_doc.len()];
            for (p, &o) in host_ord.iter().enumerate() {
                let s = scored.static_at(p);
                let slot = &mut ord_static[o as usize];
                if slot.is_nan() {
                    *slot = s;
                } else if slot.to_bits() != s.to_bits() {
                    return Err(GpuError::Unsupported(
                        "static scores differ between postings of one document".into(),
                    ));
                }
            }
        }
        Ok(Self {
            scored: Arc::downgrade(scored),
            host_ord,
            ord_doc,
            ord_static,
            refs: vec![[u64::MAX, 0]; index.terms()],
            floors: None,
            visits: vec![0; index.terms()],
            all: false,
            ord: None,
            imp: None,
            stat: None,
            doc: None,
            d_refs: None,
            d_floors: None,
            bytes: 0,
        })
    }

    pub(super) fn is_for(&self, scored: &Arc<Scored>) -> bool {
        self.scored
            .upgrade()
            .is_some_and(|s| Arc::ptr_eq(&s, scored))
    }

    pub(super) fn table_bytes(&self) -> usize {
        self.ord_doc.len() * 4 + self.ord_static.len() * 8
    }

    /// The terms to hold within `budget` bytes: all when they fit, else the most visited.
    pub(super) fn select(&self, index: &InvertedIndex, budget: usize) -> Option<Vec<bool>> {
        let tables = self.table_bytes();
        if tables > budget {
            return None;
        }
        let room = (budget - tables) / 12;
        if index.docs().len() <= room {
            return Some(vec![true; index.terms()]);
        }
        let mut cand: Vec<u32> = (0..index.terms() as u32)
            .filter(|&t| self.visits[t as usize] > 0)
            .collect();
        cand.sort_unstable_by_key(|&t| {
            (
                std::cmp::Reverse(self.visits[t as usize]),
                index.postings_len(t),
            )
        });
        let mut sel = vec![false; index.terms()];
        let mut used = 0usize;
        for t in cand {
            let len = index.postings_len(t);
            if used + len <= room {
                used += len;
                sel[t as usize] = true;
            }
        }
        Some(sel)
    }

    /// Upload the postings of the selected terms (and the ordinal tables).
    pub(super) fn upload(
        &mut self,
        g: &Gpu,
        index: &InvertedIndex,
        scored: &Scored,
        sel: &[bool],
    ) -> Result<usize, GpuError> {
        self.ord = None;
        self.imp = None;
        self.stat = None;
        self.doc = None;
        self.d_refs = None;
        self.d_floors = None;
        self.bytes = 0;
        let mut ord = Vec::new();
        let mut imp = Vec::new();
        self.refs.iter_mut().for_each(|r| *r = [u64::MAX, 0]);
        self.all = sel.iter().all(|&s| s);
        // A ListRef is { u64 start; u32 len; f32 max }: two little-endian u64 words.
        let word = |t: u32| {
            index.postings_len(t) as u64
                | (u64::from(max_up(scored.term_max[t as usize]).to_bits()) << 32)
        };
        if self.all {
            // The whole index in its own layout: term t starts at its index offset.
            for t in 0..index.terms() as u32 {
                self.refs[t as usize] = [index.range(t).start as u64, word(t)];
            }
        } else {
            for t in 0..index.terms() as u32 {
                if sel[t as usize] {
                    self.refs[t as usize] = [ord.len() as u64, word(t)];
                    let r = index.range(t);
                    ord.extend_from_slice(&self.host_ord[r.clone()]);
                    imp.extend_from_slice(&scored.impacts[r]);
                }
            }
        }
        let (ord_s, imp_s): (&[u32], &[f64]) = if self.all {
            (&self.host_ord, &scored.impacts)
        } else {
            (&ord, &imp)
        };
        let up = |v: &[u8]| DevBuf::upload(v, "index allocation", "index upload");
        self.ord = Some(up(bytes_of(ord_s))?);
        self.imp = Some(up(bytes_of(imp_s))?);
        self.doc = Some(up(bytes_of(&self.ord_doc))?);
        if !self.ord_static.is_empty() {
            self.stat = Some(up(bytes_of(&self.ord_static))?);
        }
        let _ = g;
        self.bytes = ord_s.len() * 12 + self.table_bytes();
        Ok(self.bytes)
    }

    pub(super) fn ptr(b: &Option<DevBuf>) -> u64 {
        b.as_ref().map_or(0, |b| b.ptr)
    }

    /// Bytes the device-planned path's tables take at `k`: every term's `ListRef` (16
    /// bytes), and its floor when k has floors (8 bytes).
    pub(super) fn plan_table_bytes(&self, k: usize) -> usize {
        let floors = self.floors.as_ref().is_some_and(|(fk, _)| *fk == k);
        DevBuf::bytes_for(self.refs.len() * 16)
            + if floors {
                DevBuf::bytes_for(self.refs.len() * 8)
            } else {
                0
            }
    }

    /// Bytes of those tables on the device now.
    pub(super) fn device_table_bytes(&self) -> usize {
        self.d_refs.as_ref().map_or(0, |b| b.bytes)
            + self.d_floors.as_ref().map_or(0, |(_, b)| b.bytes)
    }

    /// Computes every term's own floor at `k` (none above [`FLOOR_K`]) unless the last batch
    /// had the same k.
    pub(super) fn cache_floors(&mut self, scored: &Scored, k: usize) {
        if k == 0 || k > FLOOR_K || self.floors.as_ref().is_some_and(|(fk, _)| *fk == k) {
            return;
        }
        let f = (0..self.refs.len() as u32)
            .into_par_iter()
            .map(|t| scored.term_floor(t, k))
            .collect();
        self.floors = Some((k, f));
    }
}

/// `x` as an f32 no smaller than it (the kernel's list maxima are upper bounds).
pub(super) fn max_up(x: f64) -> f32 {
    let f = x as f32;
    if f64::from(f) < x { f.next_up() } else { f }
}
