//! `topk_bm25` on the GPU against the CPU: random corpora and query batches ranked with the
//! GPU backend, compared exactly (doc ids, f64 score bits, order) with the CPU's pruned
//! top-k and the exhaustive scorer; the resident-index budget (queries whose lists are not
//! on the device finish on the CPU); and, `#[ignore]`d, the benchmark on gcide with 10,000
//! terabyte05-eff queries. (The SQL function under `sets.backend = 'gpu'` is checked by
//! `gpu_sql`.)
//!
//! Without a usable GPU every test prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`
//! (the device script sets it), which makes the absence a failure.

mod common;

use common::gpu_or_skip;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

use datafusion::arrow::array::{AsArray, RecordBatch};
use datafusion::arrow::datatypes::{DataType, UInt32Type};
use datafusion_sets::BackendChoice;
use datafusion_sets::backend::gpu;
use datafusion_sets::bm25::rank_terms;
use datafusion_sets::bm25::{Bm25Params, Scored};
use datafusion_sets::bm25::{IndexBuilder, IndexedDoc, InvertedIndex};
use datafusion_sets::bm25::{Mode, exhaustive, query_terms, top};
use datafusion_sets::bm25::{Queries, QueryTerms};
use datafusion_sets::bm25::{Tokenizer, TokenizerOptions};
use datafusion_sets::search::gpu as bm25_gpu;
use datafusion_sets::tuning;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// The tests share the process's one resident index: one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// A random corpus: `docs` documents with sparse, shuffled ids, texts over a Zipf-like
/// vocabulary (a few terms in most documents: lists spanning many device tiles and AND
/// chunks; most terms rare), some documents repeated (equal scores: ties), optional static
/// scores with ties.
fn corpus(rng: &mut StdRng, docs: usize, vocab: usize, with_static: bool) -> InvertedIndex {
    let words: Vec<String> = (0..vocab).map(|i| format!("w{i}")).collect();
    let mut texts: Vec<Vec<&str>> = Vec::with_capacity(docs);
    for _ in 0..docs {
        if !texts.is_empty() && rng.random_range(0..10) == 0 {
            let j = rng.random_range(0..texts.len());
            texts.push(texts[j].clone());
            continue;
        }
        let len = rng.random_range(0..40);
        texts.push(
            (0..len)
                .map(|_| {
                    let r: f64 = rng.random();
                    words[((r * r * r) * vocab as f64) as usize].as_str()
                })
                .collect(),
        );
    }
    let mut ids: Vec<u32> = Vec::with_capacity(docs);
    let mut id = rng.random_range(0..1000u32);
    for _ in 0..docs {
        id += 1 + rng.random_range(0..5u32);
        ids.push(id);
    }
    for i in (1..ids.len()).rev() {
        let j = rng.random_range(0..=i);
        ids.swap(i, j);
    }
    let docs: Vec<IndexedDoc> = texts
        .into_iter()
        .zip(ids)
        .map(|(terms, id)| IndexedDoc {
            id,
            terms,
            static_score: Some((id % 5) as f64 / 5.0),
        })
        .collect();
    InvertedIndex::build(&docs, TokenizerOptions::default(), with_static)
}

/// A random query batch: 0..8 words (some unknown, some repeated), a few with 70 words
/// (more than the device takes).
fn queries(rng: &mut StdRng, index: &InvertedIndex, n: usize, vocab: usize) -> Vec<QueryTerms> {
    (0..n)
        .map(|_| {
            let len = if rng.random_range(0..50) == 0 {
                70
            } else {
                rng.random_range(0..8)
            };
            let words: Vec<String> = (0..len)
                .map(|_| {
                    let r: f64 = rng.random();
                    format!("w{}", ((r * r) * (vocab + vocab / 10) as f64) as usize)
                })
                .collect();
            let (ids, unknown) = query_terms(index, words.iter().map(String::as_str));
            QueryTerms { ids, unknown }
        })
        .collect()
}

/// How many of a batch's queries the device ranks with the whole index resident: those with a
/// known term (under AND: no unknown one) and at most `BM25_MAX_TERMS` terms.
fn device_takes(qs: &[QueryTerms], mode: Mode) -> usize {
    qs.iter()
        .filter(|q| {
            !q.ids.is_empty()
                && q.ids.len() <= bm25_gpu::BM25_MAX_TERMS
                && !(mode == Mode::And && q.unknown)
        })
        .count()
}

fn check(
    index: &InvertedIndex,
    scored: &Arc<Scored>,
    qs: &[QueryTerms],
    k: usize,
    mode: Mode,
    budget: Option<usize>,
    what: &str,
) -> datafusion_sets::bm25::RankStats {
    let batch: Queries = qs.iter().collect();
    let (got, stats) = rank_terms(
        index,
        scored,
        &batch,
        k,
        mode,
        BackendChoice::Gpu,
        budget,
        &mut |_| true,
    );
    assert_eq!(got.len(), qs.len());
    let got = got.to_lists();
    for (i, (q, g)) in qs.iter().zip(&got).enumerate() {
        let pruned = top(index, scored, &q.ids, q.unknown, k, mode);
        let exact = exhaustive(index, scored, &q.ids, q.unknown, k, mode);
        assert_eq!(
            pruned, exact,
            "{what}: CPU pruned != exhaustive, query {i} {q:?}"
        );
        // Bit-identical scores: `Hit`'s f64 equality plus the bits.
        assert_eq!(
            g, &exact,
            "{what}: GPU != exhaustive, query {i} {q:?} k {k} {mode:?}"
        );
        for (a, b) in g.iter().zip(&exact) {
            assert_eq!(a.score.to_bits(), b.score.to_bits());
        }
    }
    stats
}

#[test]
fn gpu_top_k_equals_cpu_and_exhaustive() {
    if !gpu_or_skip("gpu_top_k_equals_cpu_and_exhaustive") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = StdRng::seed_from_u64(0x05ee_db25);
    let shapes = [
        (60, 12, false),
        (3000, 200, false),
        (9000, 400, true),
        (20000, 300, false),
        (5000, 60, true),
    ];
    let (mut on_gpu, mut pieces, mut and_pieces) = (0, [0, 0], [0, 0]);
    // Short AND queries ranked a warp each (device-planned batches only).
    let mut warp = [0, 0];
    // Each shape planned on the device, then on the host (other corpora: the rng goes on).
    let rounds = shapes
        .iter()
        .enumerate()
        .flat_map(|s| [(s, true), (s, false)]);
    for ((round, &(docs, vocab, with_static)), device_plan) in rounds {
        tuning::set_bm25_device_plan(device_plan);
        let index = corpus(&mut rng, docs, vocab, with_static);
        let params = Bm25Params {
            k1: [1.2, 0.9, 2.0, 1.2, 0.0][round],
            b: [0.75, 1.0, 0.3, 0.75, 0.5][round],
            alpha: 0.3,
        };
        let scored = Arc::new(Scored::new(&index, params));
        let qs = queries(&mut rng, &index, 400, vocab);
        for k in [1, 10, 100] {
            for mode in [Mode::And, Mode::Or, Mode::AndOr] {
                let what = format!(
                    "round {round} ({docs} docs, static {with_static}, device plan {device_plan})"
                );
                let stats = check(&index, &scored, &qs, k, mode, None, &what);
                assert!(stats.gpu_error.is_none(), "{what}: {:?}", stats.gpu_error);
                // Every query with a known term and at most 64 terms ran on the device.
                let expect = device_takes(&qs, mode);
                assert_eq!(stats.on_gpu, expect, "{what} k {k} {mode:?}");
                on_gpu += stats.on_gpu;
                let p = stats.timings.as_ref().map_or(0, |t| t.pieces);
                pieces[device_plan as usize] += p;
                if mode == Mode::And {
                    and_pieces[device_plan as usize] += p;
                }
                warp[device_plan as usize] += stats.timings.as_ref().map_or(0, |t| t.warp_queries);
            }
        }
    }
    assert!(on_gpu > 1000, "only {on_gpu} queries ran on the GPU");
    // With small pieces asked for (the device script runs this test again with
    // DFSETS_BM25_PIECE=16), long queries were split and merged on the device, AND ones too.
    let small_pieces = std::env::var("DFSETS_BM25_PIECE")
        .ok()
        .and_then(|v| v.parse::<u64>().ok())
        .is_some_and(|p| (1..=64).contains(&p));
    tuning::set_bm25_device_plan(true);
    // Short AND queries ranked a warp each, planned on the device only (with small pieces
    // nearly every query is split instead).
    assert!(
        warp[0] == 0 && (small_pieces || warp[1] > 0),
        "{warp:?} queries ranked a warp each (host plan, device plan)"
    );
    for path in 0..2 {
        assert!(
            !small_pieces || pieces[path] > 1000,
            "only {:?} pieces (host plan, device plan)",
            pieces
        );
        assert!(
            !small_pieces || and_pieces[path] > 100,
            "only {and_pieces:?} AND pieces (host plan, device plan)"
        );
    }
    eprintln!(
        "{on_gpu} queries on the GPU ({} a warp each), {pieces:?} pieces of split queries \
         ({and_pieces:?} AND) planned on the host / on the device",
        warp[1]
    );
    // k above the device's limit: the CPU, same answers.
    let index = corpus(&mut rng, 2000, 50, false);
    let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
    let qs = queries(&mut rng, &index, 50, 50);
    let stats = check(&index, &scored, &qs, 1000, Mode::Or, None, "k 1000");
    assert_eq!(stats.on_gpu, 0);
}

/// A random corpus and two batches of queries the device takes whole (more than 64 terms
/// would leave one to the CPU, and the answers would be copied out), on the device-planned
/// path (whose answers are lent).
fn lendable_batches(seed: u64) -> (InvertedIndex, Arc<Scored>, Queries, Queries) {
    tuning::set_bm25_device_plan(true);
    let mut rng = StdRng::seed_from_u64(seed);
    let index = corpus(&mut rng, 6000, 150, false);
    let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
    let mut batch = || -> Queries {
        queries(&mut rng, &index, 300, 150)
            .iter()
            .filter(|q| q.ids.len() <= bm25_gpu::BM25_MAX_TERMS)
            .collect()
    };
    let (a, b) = (batch(), batch());
    (index, scored, a, b)
}

/// A device-planned batch with every query on the device hands its answers to the caller in
/// the page-locked block the device packed them into (no copy). Such a result must stay as it
/// was while later batches run (each takes another block while it is held), and its block
/// must serve a later batch once it is dropped.
#[test]
fn answers_lent_to_the_result_stay_put() {
    if !gpu_or_skip("answers_lent_to_the_result_stay_put") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let (index, scored, a, b) = lendable_batches(0x1e47);
    for (k, mode) in [(10, Mode::Or), (7, Mode::And), (100, Mode::AndOr)] {
        let rank = |qs: &Queries, backend| {
            rank_terms(&index, &scored, qs, k, mode, backend, None, &mut |_| true)
        };
        let (want_a, _) = rank(&a, BackendChoice::Cpu);
        let (want_b, _) = rank(&b, BackendChoice::Cpu);
        let (got_a, sa) = rank(&a, BackendChoice::Gpu);
        let lent = sa.timings.as_ref().map_or(0, |t| t.lent_bytes);
        assert_eq!(
            lent,
            got_a.docs.len() as u64 * 12,
            "{mode:?} k {k}: answers copied out"
        );
        assert!(lent > 0, "{mode:?} k {k}: no hits");
        // Two more batches while `got_a` is held: their blocks are others.
        let (got_b, _) = rank(&b, BackendChoice::Gpu);
        let (again_a, _) = rank(&a, BackendChoice::Gpu);
        assert!(got_a == want_a, "{mode:?} k {k}: the held result changed");
        assert!(got_b == want_b, "{mode:?} k {k}: batch b");
        assert!(again_a == want_a, "{mode:?} k {k}: batch a again");
        // A buffer of the result outlives the result itself.
        let docs = got_a.docs.clone();
        drop((got_a, got_b, again_a));
        let (last_b, _) = rank(&b, BackendChoice::Gpu);
        assert!(
            last_b == want_b,
            "{mode:?} k {k}: after the blocks came back"
        );
        assert_eq!(&docs[..], &want_a.docs[..], "{mode:?} k {k}: a kept buffer");
    }
}

/// The default lent ceiling again when dropped, whatever a test set.
struct RestoreLentMax;

impl Drop for RestoreLentMax {
    fn drop(&mut self) {
        tuning::set_lent_max(usize::MAX);
    }
}

/// A test that moves the lent ceiling: `None` without a GPU (skipped), else the tests' lock
/// and the guard that puts the default ceiling back (a tuple drops its first field first: the
/// ceiling is back before the lock lets another test run).
fn lent_ceiling_test(test: &str) -> Option<(RestoreLentMax, MutexGuard<'static, ()>)> {
    if !gpu_or_skip(test) {
        return None;
    }
    let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    Some((RestoreLentMax, serial))
}

/// The kernels' window is reported whether the batch timed itself (answers written into the
/// host's memory: `bm25_pack`'s clock, no events) or was timed by events (answers copied
/// out, past a zero lent ceiling), in the first calls (launched one by one) and through the
/// kernel graph after them; the graphs of the two ways are kept apart.
#[test]
fn kernel_window_timed_with_and_without_events() {
    let Some(_serial) = lent_ceiling_test("kernel_window_timed_with_and_without_events") else {
        return;
    };
    let (index, scored, a, _) = lendable_batches(0x71c3);
    for mode in [Mode::And, Mode::Or] {
        let rank =
            |backend| rank_terms(&index, &scored, &a, 10, mode, backend, None, &mut |_| true);
        let (want, _) = rank(BackendChoice::Cpu);
        for (ceiling, lent) in [(usize::MAX, true), (0, false), (usize::MAX, true)] {
            tuning::set_lent_max(ceiling);
            for call in 0..4 {
                let (got, s) = rank(BackendChoice::Gpu);
                assert!(got == want, "{mode:?} lent {lent} call {call}: answers");
                let t = s.timings.expect("the GPU ran");
                assert_eq!(t.lent_bytes > 0, lent, "{mode:?} call {call}: {t:?}");
                assert!(
                    t.kernel_ms > 0.0 && t.kernel_ms <= t.total_ms,
                    "{mode:?} lent {lent} call {call}: kernels' window {} of {} ms",
                    t.kernel_ms,
                    t.total_ms
                );
            }
        }
    }
}

/// Past `tuning::lent_max` a batch's results are copied out of the workspace's buffer instead of
/// lent in a page-locked block: the same answers, for `topk_bm25` and for `list_intersect`'s
/// values, and lent again once the ceiling is back.
#[test]
fn results_copied_out_past_the_lent_ceiling() {
    let Some(_serial) = lent_ceiling_test("results_copied_out_past_the_lent_ceiling") else {
        return;
    };
    let (index, scored, a, b) = lendable_batches(0x1e48);
    let rank = |qs: &Queries, backend| {
        rank_terms(
            &index,
            &scored,
            qs,
            10,
            Mode::Or,
            backend,
            None,
            &mut |_| true,
        )
    };
    let lent_of =
        |s: &datafusion_sets::bm25::RankStats| s.timings.as_ref().map_or(0, |t| t.lent_bytes);
    let (want_a, _) = rank(&a, BackendChoice::Cpu);
    let (want_b, _) = rank(&b, BackendChoice::Cpu);
    let (got_a, sa) = rank(&a, BackendChoice::Gpu);
    assert!(lent_of(&sa) > 0, "lent under the default ceiling");
    // No block may be taken now: `got_a` holds the workspace's, the idle ones are freed.
    tuning::set_lent_max(0);
    let (got_b, sb) = rank(&b, BackendChoice::Gpu);
    assert_eq!(lent_of(&sb), 0, "copied out past the ceiling");
    assert!(got_b == want_b, "batch b copied out");
    assert!(got_a == want_a, "the held result");
    let held = gpu::lent_bytes();
    drop((got_a, got_b));
    assert!(
        gpu::lent_bytes() < held,
        "the held result's block freed, not pooled, under a zero ceiling"
    );

    // list_intersect's values (one launch group: lent when the ceiling allows).
    let rows = 2000usize;
    let offs: Vec<i32> = (0..=rows).map(|r| (r * 64) as i32).collect();
    let va: Vec<u32> = (0..rows * 64).map(|i| (i as u32) * 2).collect();
    let vb: Vec<u32> = (0..rows * 64).map(|i| (i as u32) * 3).collect();
    let lists = [&va, &vb].map(|v| gpu::HostList {
        offsets: gpu::HostOffsets::I32(&offs),
        values: v,
        column: None,
    });
    let reference =
        gpu::intersect(&lists, None, gpu::Mode::Values, None, false).expect("staged values");
    assert!(!reference.values_slice().is_empty());
    let copied = gpu::intersect(&lists, None, gpu::Mode::Values, None, true).expect("values");
    assert!(
        copied.shared_values.is_none(),
        "copied out past the ceiling"
    );
    assert_eq!(copied.values_slice(), reference.values_slice());
    assert_eq!(copied.offsets, reference.offsets);
    tuning::set_lent_max(usize::MAX);
    let shared = gpu::intersect(&lists, None, gpu::Mode::Values, None, true).expect("values");
    if shared.timings.chunks == 1 {
        assert!(shared.shared_values.is_some(), "lent again");
    }
    assert_eq!(shared.values_slice(), reference.values_slice());
    let (again_b, sb) = rank(&b, BackendChoice::Gpu);
    assert!(lent_of(&sb) > 0, "answers lent again");
    assert!(again_b == want_b, "batch b lent again");
}

/// Equal scores in disjoint lists of one device tile: documents alternate between terms
/// (one term each, same length: every score equal), so the top-k is the k smallest doc ids
/// and a dense tile has to keep the tie rule across its lists (a compaction in the middle of
/// the tile must not let a later list's smaller ordinals lose to a larger kept one).
#[test]
fn ties_across_lists_in_one_tile() {
    if !gpu_or_skip("ties_across_lists_in_one_tile") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    for period in [2usize, 3, 5] {
        let words = ["a", "b", "c", "d", "e"];
        let docs: Vec<IndexedDoc> = (0..6000u32)
            .map(|i| IndexedDoc {
                id: 10 + 2 * i,
                terms: vec![words[i as usize % period]],
                static_score: None,
            })
            .collect();
        let index = InvertedIndex::build(&docs, TokenizerOptions::default(), false);
        let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
        let ids: Vec<&str> = words[..period].iter().rev().copied().collect();
        let (q, unknown) = query_terms(&index, ids);
        let qs = vec![
            QueryTerms {
                ids: q.clone(),
                unknown,
            };
            3
        ];
        for k in [1, 10, 100, 700] {
            for mode in [Mode::Or, Mode::AndOr] {
                let stats = check(&index, &scored, &qs, k, mode, None, "ties");
                assert_eq!(stats.on_gpu, qs.len(), "period {period} k {k} {mode:?}");
            }
        }
    }
    bm25_gpu::bm25_evict();
}

/// A term id beyond the index (a caller's bug) is refused with an error before any list is
/// looked up, with the whole index resident and with part of it: no fault, no wrong answer,
/// and the backend works on after it.
#[test]
fn a_term_beyond_the_index_is_refused() {
    if !gpu_or_skip("a_term_beyond_the_index_is_refused") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = StdRng::seed_from_u64(7);
    let index = corpus(&mut rng, 3000, 100, false);
    let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
    let mut qs = queries(&mut rng, &index, 300, 100);
    let on_cpu = |_: usize| Vec::new();
    let terms_beyond = index.terms() as u32 + 5;
    for budget in [
        None,
        Some(index.n_docs() as usize * 4 + index.docs().len() * 4),
    ] {
        bm25_gpu::bm25_evict();
        let stats = check(&index, &scored, &qs, 10, Mode::Or, budget, "before");
        assert!(stats.on_gpu > 0, "{stats:?}");
        qs[150].ids.push(terms_beyond);
        let with_beyond: Queries = qs.iter().collect();
        let batch = bm25_gpu::Bm25Batch {
            queries: &with_beyond,
            mode: Mode::Or,
        };
        let r = bm25_gpu::bm25_topk(&index, &scored, &batch, 10, budget, &on_cpu, &mut |_| true);
        assert!(
            matches!(&r, Err(gpu::GpuError::Unsupported(m)) if m.contains("malformed")),
            "{budget:?}: {:?}",
            r.map(|o| o.timings)
        );
        qs[150].ids.pop();
        let stats = check(&index, &scored, &qs, 10, Mode::AndOr, budget, "after");
        assert!(stats.on_gpu > 0 && stats.gpu_error.is_none(), "{stats:?}");
    }
    bm25_gpu::bm25_evict();
}

/// A budget too small for the whole index: the most visited lists are resident, queries
/// needing others finish on the CPU; a budget too small for anything: all on the CPU.
#[test]
fn resident_budget_keeps_answers_exact() {
    if !gpu_or_skip("resident_budget_keeps_answers_exact") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let mut rng = StdRng::seed_from_u64(99);
    let index = corpus(&mut rng, 8000, 300, false);
    let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
    let qs = queries(&mut rng, &index, 600, 300);
    bm25_gpu::bm25_evict();
    let tables = 8000 * 4;
    let budget = tables + index.docs().len() * 12 / 3;
    // A budgeted batch: its stats and timings, the resident bytes within the budget.
    let within = |mode: Mode, budget: usize, what: &str| {
        let stats = check(&index, &scored, &qs, 10, mode, Some(budget), what);
        let t = stats.timings.clone().expect("the GPU ran");
        assert!(t.resident_bytes as usize <= budget, "{t:?}");
        (stats, t)
    };
    for mode in [Mode::Or, Mode::And, Mode::AndOr] {
        let (stats, t) = within(mode, budget, "a third resident");
        assert!(stats.on_gpu > 0 && stats.on_cpu > 0, "{stats:?}");
        eprintln!(
            "budget {budget}: {} on the GPU, {} on the CPU, resident {} B",
            stats.on_gpu, stats.on_cpu, t.resident_bytes
        );
    }
    // The whole index resident: planned on the device (also what the device script runs
    // under compute-sanitizer), pieces of 16 or the default.
    bm25_gpu::bm25_evict();
    for mode in [Mode::Or, Mode::And, Mode::AndOr] {
        let stats = check(&index, &scored, &qs, 10, mode, None, "whole index resident");
        assert!(stats.on_gpu > 0 && stats.gpu_error.is_none(), "{stats:?}");
    }
    bm25_gpu::bm25_evict();
    let stats = check(
        &index,
        &scored,
        &qs,
        10,
        Mode::Or,
        Some(1000),
        "nothing resident",
    );
    assert_eq!(stats.on_gpu, 0);
    assert!(stats.gpu_error.is_some());
    // The device-planned path's tables (every term's list reference, and its floor at k)
    // count as resident: with room for the whole index but not for them, the host plans the
    // batch (exact either way) and the resident bytes stay within the budget.
    bm25_gpu::bm25_evict();
    let stats = check(&index, &scored, &qs, 10, Mode::Or, None, "tables counted");
    let full = stats.timings.clone().expect("the GPU ran");
    assert!(full.plan_ms > 0.0, "planned on the device: {full:?}");
    let tight = full.resident_bytes as usize - 1;
    bm25_gpu::bm25_evict();
    for mode in [Mode::Or, Mode::And] {
        let (stats, t) = within(mode, tight, "no room for the tables");
        // The whole index still fits (only the tables do not): every query the device takes
        // ran there.
        assert_eq!(stats.on_gpu, device_takes(&qs, mode), "{stats:?}");
        assert!(stats.gpu_error.is_none(), "{stats:?}");
        assert_eq!(t.plan_ms, 0.0, "planned on the host: {t:?}");
    }
    bm25_gpu::bm25_evict();
}

// ---------------------------------------------------------------------------------------------
// Benchmark
// ---------------------------------------------------------------------------------------------

/// The named columns of a Parquet file (the parquet reader alone: this binary does not link
/// the SQL engine, to stay small enough to carry to the GPU machine).
fn read_parquet(path: &str, columns: &[&str]) -> Vec<RecordBatch> {
    use datafusion::parquet::arrow::ProjectionMask;
    use datafusion::parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
    let file = std::fs::File::open(path).unwrap_or_else(|e| panic!("{path}: {e}"));
    let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let schema = builder.parquet_schema();
    let idx: Vec<usize> = columns
        .iter()
        .map(|c| {
            (0..schema.num_columns())
                .find(|&i| schema.column(i).name() == *c)
                .unwrap_or_else(|| panic!("{path}: no column {c}"))
        })
        .collect();
    let mask = ProjectionMask::leaves(schema, idx.iter().copied());
    let reader = builder.with_projection(mask).build().unwrap();
    let batches: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
    // Columns in the order asked for.
    batches
        .into_iter()
        .map(|b| {
            let cols: Vec<usize> = columns
                .iter()
                .map(|c| b.schema().index_of(c).unwrap())
                .collect();
            b.project(&cols).unwrap()
        })
        .collect()
}

/// Places at the end of the trace that hold the kernels' spans (`TRACE_KERNELS` in bm25.cu).
const TRACE_KERNELS: usize = 8;

/// With `DFSETS_BM25_TRACE=1` (kernels compiled with their timeline, `bm25_gpu::bm25_trace_take`):
/// one more device-planned call of the batch, and each ranking block's (or short item's warp's)
/// start and end, query, kind and multiprocessor, with the query's lists and shortest list, to
/// `$DFSETS_BENCH_OUT.trace_<tag>.csv` (times in ns from the first start), and each kernel's
/// span (its blocks' first start and last end) to `...trace_<tag>.kernels.csv`.
fn trace_csv<R>(tag: &str, call: &dyn Fn() -> R, qs: &[QueryTerms], index: &InvertedIndex) {
    if std::env::var("DFSETS_BM25_TRACE").as_deref() != Ok("1") {
        return;
    }
    tuning::set_bm25_device_plan(true);
    bm25_gpu::bm25_trace_take().unwrap();
    std::hint::black_box(call());
    let trace = bm25_gpu::bm25_trace_take().unwrap();
    // The last places hold the kernels' spans (`KernelSpan` in bm25.cu: the start
    // complemented), the others the blocks'.
    let (trace, kernels) = trace.split_at(trace.len().saturating_sub(TRACE_KERNELS));
    let t0 = trace
        .iter()
        .filter(|e| e[0] != 0)
        .map(|e| e[0])
        .chain(kernels.iter().filter(|e| e[0] != 0).map(|e| !e[0]))
        .min()
        .unwrap_or(0);
    let path = std::env::var("DFSETS_BENCH_OUT").unwrap_or_else(|_| "bench".into());
    let names = ["clear", "plan", "order", "rank", "pack", "merge", "-", "-"];
    let mut spans = String::from("kernel,start_ns,end_ns\n");
    for (i, e) in kernels.iter().rev().enumerate().filter(|(_, e)| e[0] != 0) {
        spans += &format!("{},{},{}\n", names[i], !e[0] - t0, e[1] - t0);
    }
    std::fs::write(format!("{path}.trace_{tag}.kernels.csv"), spans).unwrap();
    let mut csv = String::from("pos,start_ns,end_ns,q,kind,sm,lists,shortest,postings\n");
    for (pos, e) in trace.iter().enumerate().filter(|(_, e)| e[0] != 0) {
        let q = (e[2] & 0xffff_ffff) as usize;
        let ids = &qs[q].ids;
        let shortest = ids
            .iter()
            .map(|&t| index.postings_len(t))
            .min()
            .unwrap_or(0);
        let postings: usize = ids.iter().map(|&t| index.postings_len(t)).sum();
        csv += &format!(
            "{pos},{},{},{q},{},{},{},{shortest},{postings}\n",
            e[0] - t0,
            e[1] - t0,
            (e[2] >> 32) & 0xff,
            e[2] >> 40,
            ids.len()
        );
    }
    std::fs::write(format!("{path}.trace_{tag}.csv"), csv).unwrap();
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

/// Where a large corpus's batch spends the device's time (diagnostics, not a benchmark of
/// record): the documents of `$DFSETS_TRACE_DOCS` (a `doc_id, text` Parquet file, e.g.
/// `benches/data/synth_corpus.py`'s), the first 10,000 terabyte05-eff queries of
/// `$DFSETS_BENCH_DATA/queries/queries.parquet`, top-10 in each mode of `$DFSETS_TRACE_MODES`
/// (default `or`): the CPU backend once (timed), then for each budget of piece slots per 8
/// ranked queries in `$DFSETS_TRACE_SLOTS` (default: the planner's own), the GPU twice
/// (timed, answers equal to the CPU's) and, with `DFSETS_BM25_TRACE=1`, the traced call's
/// CSVs as `bench` writes them (tag `<mode>_large` or `<mode>_large_s<slots>`).
#[test]
#[ignore]
fn trace_large_corpus() {
    if !gpu_or_skip("trace_large_corpus") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Ok(path) = std::env::var("DFSETS_TRACE_DOCS") else {
        eprintln!("trace_large_corpus: DFSETS_TRACE_DOCS not set, skipped");
        return;
    };
    let dir = std::env::var("DFSETS_BENCH_DATA").unwrap_or_else(|_| "bench-data".into());
    let texts = terabyte05_queries(&dir, 10_000);
    let t = Instant::now();
    let docs = read_parquet(&path, &["doc_id", "text"]);
    let (index, scored, qs) = index_and_queries(&docs, &texts);
    eprintln!(
        "{path}: {} docs, {} postings, index built in {:.1?}",
        index.n_docs(),
        index.docs().len(),
        t.elapsed()
    );
    let batch: Queries = qs.iter().collect();
    let rank = |mode, backend| {
        rank_terms(
            &index,
            &scored,
            &batch,
            10,
            mode,
            backend,
            None,
            &mut |_| true,
        )
    };
    let modes = std::env::var("DFSETS_TRACE_MODES").unwrap_or_else(|_| "or".into());
    for name in modes.split(',') {
        let mode = Mode::from_name(name).expect("DFSETS_TRACE_MODES: and, or, and_or");
        let t0 = Instant::now();
        let (want, _) = rank(mode, BackendChoice::Cpu);
        let cpu = t0.elapsed();
        let slots = std::env::var("DFSETS_TRACE_SLOTS").unwrap_or_default();
        let slots: Vec<Option<u32>> = if slots.is_empty() {
            vec![None]
        } else {
            slots.split(',').map(|v| Some(v.parse().unwrap())).collect()
        };
        for per_8 in slots {
            tuning::set_bm25_piece_slots(per_8);
            for _ in 0..2 {
                let t0 = Instant::now();
                let (got, s) = rank(mode, BackendChoice::Gpu);
                let gpu = t0.elapsed();
                assert!(got == want, "GPU != CPU, {mode:?}, slots {per_8:?}");
                let kernel = s.timings.as_ref().map_or(0.0, |t| t.kernel_ms);
                eprintln!(
                    "{mode:?} k 10, slots {per_8:?}: CPU {cpu:.1?}, GPU {gpu:.1?} (kernels {kernel:.2} ms, {} on the GPU, {} pieces)",
                    s.on_gpu,
                    s.timings.as_ref().map_or(0, |t| t.pieces)
                );
            }
            let tag = match per_8 {
                None => format!("{mode:?}_large"),
                Some(v) => format!("{mode:?}_large_s{v}"),
            };
            trace_csv(&tag, &|| rank(mode, BackendChoice::Gpu), &qs, &index);
        }
        tuning::set_bm25_piece_slots(None);
    }
}

/// An index of `docs` (`doc_id`, `text` batches), its scores, and `texts` as term ids. Each
/// batch's documents are tokenized on rayon's threads, then added in order on this one.
fn index_and_queries(
    docs: &[RecordBatch],
    texts: &[String],
) -> (InvertedIndex, Arc<Scored>, Vec<QueryTerms>) {
    use rayon::prelude::*;
    let mut tok = Tokenizer::new(TokenizerOptions::default());
    let mut builder = IndexBuilder::new(TokenizerOptions::default(), false);
    for b in docs {
        let ids = datafusion::arrow::compute::cast(b.column(0), &DataType::UInt32).unwrap();
        let ids = ids.as_primitive::<UInt32Type>();
        let text = datafusion::arrow::compute::cast(b.column(1), &DataType::Utf8).unwrap();
        let text = text.as_string::<i32>();
        let terms: Vec<Vec<String>> = (0..b.num_rows())
            .into_par_iter()
            .map_init(
                || Tokenizer::new(TokenizerOptions::default()),
                |tok, i| tok.terms(text.value(i)),
            )
            .collect();
        for (i, terms) in terms.iter().enumerate() {
            builder.add_terms(ids.value(i), terms.iter().map(String::as_str), None);
        }
    }
    let index = builder.finish();
    let scored = Arc::new(Scored::new(&index, Bm25Params::default()));
    let qs = texts
        .iter()
        .map(|text| {
            let terms = tok.terms(text);
            let (ids, unknown) = query_terms(&index, terms.iter().map(String::as_str));
            QueryTerms { ids, unknown }
        })
        .collect();
    (index, scored, qs)
}

/// The first `n` terabyte05-eff queries of `dir/queries/queries.parquet`.
fn terabyte05_queries(dir: &str, n: usize) -> Vec<String> {
    let mut texts = Vec::new();
    for b in read_parquet(
        &format!("{dir}/queries/queries.parquet"),
        &["source", "text"],
    ) {
        let src = datafusion::arrow::compute::cast(b.column(0), &DataType::Utf8).unwrap();
        let src = src.as_string::<i32>();
        let text = datafusion::arrow::compute::cast(b.column(1), &DataType::Utf8).unwrap();
        let text = text.as_string::<i32>();
        for i in 0..b.num_rows() {
            if texts.len() < n && src.value(i) == "terabyte05-eff" {
                texts.push(text.value(i).to_string());
            }
        }
    }
    assert_eq!(texts.len(), n, "not enough terabyte05-eff queries");
    texts
}

/// gcide (126,240 articles) and the first 10,000 terabyte05-eff queries, top-10, GPU vs CPU
/// backend (all cores): `gpu_bm25 --ignored --nocapture bench`. Data from
/// `$DFSETS_BENCH_DATA` (default `bench-data`): `gcide/docs.parquet`,
/// `queries/queries.parquet`. Results to `$DFSETS_BENCH_OUT` (appended) and stdout.
#[test]
#[ignore]
fn bench_gpu_bm25() {
    if !gpu_or_skip("bench_gpu_bm25") {
        return;
    }
    let _g = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = std::env::var("DFSETS_BENCH_DATA").unwrap_or_else(|_| "bench-data".into());
    let docs = read_parquet(&format!("{dir}/gcide/docs.parquet"), &["doc_id", "text"]);
    let texts = terabyte05_queries(&dir, 10_000);
    let t = Instant::now();
    let (index, scored, qs) = index_and_queries(&docs, &texts);
    // Tokenization and term lookup as `rank_batch` does it (rayon), timed apart: the
    // benchmark below starts from the term ids.
    let tok_ms = median(
        (0..7)
            .map(|_| {
                use rayon::prelude::*;
                let t0 = Instant::now();
                let q: Vec<QueryTerms> = texts
                    .par_iter()
                    .map_init(
                        || Tokenizer::new(TokenizerOptions::default()),
                        |tok, text| {
                            let terms = tok.terms(text);
                            let (ids, unknown) =
                                query_terms(&index, terms.iter().map(String::as_str));
                            QueryTerms { ids, unknown }
                        },
                    )
                    .collect();
                assert!(q == qs);
                t0.elapsed().as_secs_f64() * 1e3
            })
            .collect(),
    );
    let threads = rayon::current_num_threads();
    let mut report = format!(
        "gcide: {} docs, {} terms, {} postings; {} queries ({} term ids; tokenize + lookup on rayon: {tok_ms:.2} ms); index built in {:.1?}; \
         CPU backend on {threads} rayon threads; device {}\n\
         GPU = planned on the device (the default); host-planned = the same batch staged and planned on the host (`set_bm25_device_plan(false)`), alternated in the same rounds\n\
         | mode | k | CPU ms (median of 7) | GPU ms (median of 7) | speed-up | host-planned GPU ms | speed-up | GPU kernel / H2D / D2H / host stage ms | cold GPU call ms (index upload) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
        index.n_docs(),
        index.terms(),
        index.docs().len(),
        qs.len(),
        qs.iter().map(|q| q.ids.len()).sum::<usize>(),
        t.elapsed(),
        gpu::device().map(|d| d.name).unwrap_or_default()
    );
    let mut breakdown = String::from(
        "GPU call breakdown (ms, medians of 7): lookup / fill / sort = host stage (residency + \
         device queries, pinned upload buffer, blocks in longest-first order); wait = host blocked \
         on the device after the CPU's share; kernel = the device's launches; cpu = the CPU's \
         share; unpack = results into the output layout; launch = queueing copies and launches; \
         inside = the whole of bm25_topk\n\
         plan = (device-planned) queueing the copy up, the planning and the ranking launches (no wait), part of launch\n\
         copy / modes = (device-planned) the parts of fill that write the term ids, offsets and flags (counting the queries) / pick the queries left to the CPU\n\
         copy up / submit = the parts of launch that queue the copy up (and its event) / the kernels (a graph launch); [set n / launch] = the part of submit setting n graph nodes' parameters / cuGraphLaunch\n\
         | mode | k | call | inside | lookup | fill (copy / modes) | sort | launch (copy up / submit [set n / launch]) | plan | wait (kernel) | cpu | unpack | on GPU (calls through a kernel graph) |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n",
    );
    let batch: Queries = qs.iter().collect();
    // `DFSETS_BENCH_REST_US`: a pause before each timed GPU call, so that the pool's workers,
    // still spinning after the CPU's batch (or the host-planned path's staging) when the call
    // starts right after it, have gone to sleep (default 0: back to back).
    let rest_us: u64 = std::env::var("DFSETS_BENCH_REST_US")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let rest = || {
        if rest_us > 0 {
            std::thread::sleep(std::time::Duration::from_micros(rest_us));
        }
    };
    let rank = |k, mode, backend| {
        rank_terms(&index, &scored, &batch, k, mode, backend, None, &mut |_| {
            true
        })
    };
    for k in [10, 100] {
        for mode in [Mode::And, Mode::Or, Mode::AndOr] {
            bm25_gpu::bm25_evict();
            let t0 = Instant::now();
            let (first, stats) = rank(k, mode, BackendChoice::Gpu);
            let cold = t0.elapsed().as_secs_f64() * 1e3;
            let upload = stats.timings.as_ref().map_or(0, |t| t.uploaded_bytes);
            let (want, _) = rank(k, mode, BackendChoice::Cpu);
            let same = first == want;
            assert!(same, "GPU != CPU on gcide, {mode:?} k {k}");
            let mut cpu = Vec::new();
            let mut gpu_ms = Vec::new();
            let mut host_ms = Vec::new();
            let mut tims: Vec<bm25_gpu::Bm25Timings> = Vec::new();
            // Untimed: each GPU path twice, so that one-time work (a kernel graph is built
            // the second time a batch's kernels repeat) stays out of the medians.
            for device_plan in [true, false, true, false] {
                tuning::set_bm25_device_plan(device_plan);
                std::hint::black_box(rank(k, mode, BackendChoice::Gpu));
            }
            tuning::set_bm25_device_plan(true);
            for round in 0..7 {
                let t0 = Instant::now();
                let r = rank(k, mode, BackendChoice::Cpu);
                cpu.push(t0.elapsed().as_secs_f64() * 1e3);
                std::hint::black_box(r);
                // The two GPU paths in turn, each first in every other round.
                for device_plan in [round % 2 == 0, round % 2 == 1] {
                    tuning::set_bm25_device_plan(device_plan);
                    rest();
                    let t0 = Instant::now();
                    let (r, s) = rank(k, mode, BackendChoice::Gpu);
                    let ms = t0.elapsed().as_secs_f64() * 1e3;
                    assert!(r == want, "device plan {device_plan}");
                    assert_eq!(s.on_gpu + s.on_cpu, qs.len());
                    if device_plan {
                        gpu_ms.push(ms);
                        tims.push(s.timings.unwrap_or_default());
                    } else {
                        host_ms.push(ms);
                    }
                }
                tuning::set_bm25_device_plan(true);
            }
            let (c, g, h) = (median(cpu), median(gpu_ms), median(host_ms));
            let med = |f: fn(&bm25_gpu::Bm25Timings) -> f64| median(tims.iter().map(f).collect());
            let line = format!(
                "| {mode:?} | {k} | {c:.2} | {g:.2} | {:.1}x | {h:.2} | {:.1}x | {:.2} / {:.3} / {:.3} / {:.2} ({} on GPU, {} pieces, {} a warp each) | {cold:.1} ({:.1} MB) |\n",
                c / g,
                c / h,
                med(|t| t.kernel_ms),
                med(|t| t.h2d_ms),
                med(|t| t.d2h_ms),
                med(|t| t.stage_ms),
                tims[0].on_device,
                tims[0].pieces,
                tims[0].warp_queries,
                upload as f64 / 1e6
            );
            eprint!("{line}");
            report += &line;
            let line = format!(
                "| {mode:?} | {k} | {g:.2} | {:.3} | {:.3} | {:.3} ({:.3} / {:.3}) | {:.3} | {:.3} ({:.3} / {:.3} [{:.4} {} / {:.4}]) | {:.3} | {:.3} ({:.3}) | {:.3} | {:.3} | {} ({}/{}) |\n",
                med(|t| t.total_ms),
                med(|t| t.lookup_ms),
                med(|t| t.fill_ms),
                med(|t| t.copy_ms),
                med(|t| t.modes_ms),
                med(|t| t.sort_ms),
                med(|t| t.launch_ms),
                med(|t| t.queue_copy_ms),
                med(|t| t.submit_ms),
                med(|t| t.graph_update_ms),
                tims[tims.len() - 1].graph_nodes_updated,
                med(|t| t.graph_launch_ms),
                med(|t| t.plan_ms),
                med(|t| t.wait_ms),
                med(|t| t.kernel_ms),
                med(|t| t.cpu_ms),
                med(|t| t.unpack_ms),
                tims[0].on_device,
                tims.iter().filter(|t| t.graph_launches > 0).count(),
                tims.len(),
            );
            eprint!("{line}");
            breakdown += &line;
            trace_csv(
                &format!("{mode:?}_k{k}"),
                &|| rank(k, mode, BackendChoice::Gpu),
                &qs,
                &index,
            );
        }
    }
    report += &breakdown;
    // Batch size: the first n queries, k 10, CPU vs GPU (for the 'auto' thresholds).
    let mut sizes = String::from(
        "Batch size (first n queries, k 10; ms, medians of 7; GPU index resident)\n\
         | mode | n | CPU ms | GPU ms | CPU / GPU |\n| --- | --- | --- | --- | --- |\n",
    );
    for mode in [Mode::And, Mode::Or, Mode::AndOr] {
        for n in [25, 50, 100, 250, 500, 1000, 2000, 4000, 10_000] {
            let sub = &batch.prefix(n);
            let mut cpu = Vec::new();
            let mut gpu_ms = Vec::new();
            for _ in 0..7 {
                let t0 = Instant::now();
                let a = rank_terms(
                    &index,
                    &scored,
                    sub,
                    10,
                    mode,
                    BackendChoice::Cpu,
                    None,
                    &mut |_| true,
                );
                cpu.push(t0.elapsed().as_secs_f64() * 1e3);
                let t0 = Instant::now();
                let b = rank_terms(
                    &index,
                    &scored,
                    sub,
                    10,
                    mode,
                    BackendChoice::Gpu,
                    None,
                    &mut |_| true,
                );
                gpu_ms.push(t0.elapsed().as_secs_f64() * 1e3);
                assert!(a.0 == b.0);
            }
            let (c, g) = (median(cpu), median(gpu_ms));
            let line = format!("| {mode:?} | {n} | {c:.3} | {g:.3} | {:.2} |\n", c / g);
            eprint!("{line}");
            sizes += &line;
        }
    }
    report += &sizes;
    // The calling thread's speed for the host's share of a call (a pass over the batch, as
    // staging makes), right after a CPU batch (rayon's workers just finished) and after 2 ms
    // asleep: whether the host's timings above are the work's or the machine's.
    let pass = |q: &Queries| {
        let t0 = Instant::now();
        let mut acc = 0u64;
        for i in 0..q.len() {
            acc += q.ids(i).len() as u64 * (1 + u64::from(q.unknown(i)));
        }
        std::hint::black_box(acc);
        t0.elapsed().as_secs_f64() * 1e3
    };
    let (mut after_cpu, mut after_sleep, mut copy) = (Vec::new(), Vec::new(), Vec::new());
    let mut to = vec![0u32; batch.all_ids().len()];
    for _ in 0..9 {
        std::hint::black_box(rank(10, Mode::And, BackendChoice::Cpu));
        after_cpu.push(pass(&batch));
        std::thread::sleep(std::time::Duration::from_millis(2));
        after_sleep.push(pass(&batch));
        let t0 = Instant::now();
        to.copy_from_slice(batch.all_ids());
        std::hint::black_box(&to);
        copy.push(t0.elapsed().as_secs_f64() * 1e3);
    }
    report += &format!(
        "Host probe: one pass over the {} queries on the calling thread, medians of 9: {:.4} ms right after a CPU batch, {:.4} ms after 2 ms asleep; their {} term ids copied into ordinary memory: {:.4} ms\n",
        batch.len(),
        median(after_cpu),
        median(after_sleep),
        batch.all_ids().len(),
        median(copy)
    );
    // How fast the host reads page-locked memory the device wrote (the unpack reads the
    // answers there), plain and with streaming loads, against ordinary memory.
    let p = gpu::pinned_read_probe(4 << 20).unwrap();
    report += &format!(
        "Host reads of 4 MiB, one thread, GB/s: page-locked after a copy down {:.1} plain / {:.1} streaming; ordinary {:.1} / {:.1}\n",
        p.pinned_plain_gbs, p.pinned_stream_gbs, p.ordinary_plain_gbs, p.ordinary_stream_gbs
    );
    println!("{report}");
    if let Ok(path) = std::env::var("DFSETS_BENCH_OUT") {
        use std::io::Write;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(path)
            .unwrap();
        f.write_all(report.as_bytes()).unwrap();
    }
}
