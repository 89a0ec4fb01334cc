//! The similarity join's GPU verification against the CPU: the device's pair verifier
//! called directly (both layouts, exact and early-stopping) against a plain merge, and the
//! join through SQL with `sets.backend = 'gpu'` (the whole join on the device, and the CPU's
//! filter with the device's verification) against `'cpu'` and a brute-force nested loop (several chunks in flight, long sets, every measure, self and R-S joins, `count(*)`,
//! partitions); EXPLAIN ANALYZE's device counters; and, `#[ignore]`d, the benchmark on
//! `gcide_words` (Jaccard and Dice 0.5).
//!
//! Without a usable GPU every test prints a note and passes, unless `DFSETS_REQUIRE_GPU=1`
//! (the device script sets it), which makes the absence a failure.

mod common;

use std::sync::Arc;
use std::time::Instant;

use common::gpu_or_skip;
use datafusion::arrow::array::{
    Array, AsArray, Float64Array, Int64Array, ListArray, RecordBatch, UInt64Array,
};
use datafusion::arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::datasource::MemTable;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_sets::join::gpu::{self, PairBuffer, PairGroups, PairToVerify};

/// The expected answer of a pair below its minimum overlap.
const NONE: u32 = u32::MAX;
use datafusion_sets::Measure;
use datafusion_sets::tuning;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

/// A random ascending, distinct set of `len` values below `domain`.
fn random_set(rng: &mut StdRng, len: usize, domain: u32) -> Vec<u32> {
    let mut s: Vec<u32> = (0..len).map(|_| rng.random_range(0..domain)).collect();
    s.sort_unstable();
    s.dedup();
    s
}

/// `|a ∩ b|` of two ascending lists.
fn common_count(a: &[u32], b: &[u32]) -> u32 {
    common::common_count(a, b) as u32
}

/// A chunk pushed past its nominal size (the join pushes a whole probe's candidates at a
/// time) stays in page-locked memory, so its copy to the device stays asynchronous.
#[test]
fn engine_chunk_stays_pinned_past_its_size() {
    if !gpu_or_skip("engine_chunk_stays_pinned_past_its_size") {
        return;
    }
    let pair = |i: u32| PairToVerify { y: i, alpha: 1 };
    let mut b = PairBuffer::new(1 << 10, true);
    assert!(b.is_pinned(), "a GPU is there: the chunk is page-locked");
    let first = b.as_slice().as_ptr();
    for i in 0..5000 {
        b.push(pair(i));
    }
    assert!(
        b.is_full() && b.is_pinned(),
        "still page-locked after overshooting"
    );
    assert!(b.as_slice().iter().map(|p| p.y).eq(0..5000));
    b.clear();
    assert!(b.is_pinned() && b.is_empty());
    // Page-locked memory given up (the first allocation, when the chunk grew; the last one,
    // when it is dropped) is pooled: the next chunk of the first size reuses the first one,
    // the smallest that fits.
    drop(b);
    let c = PairBuffer::new(1 << 10, true);
    assert!(c.is_pinned());
    assert_eq!(
        c.as_slice().as_ptr(),
        first,
        "the pooled allocation is reused"
    );
}

#[test]
fn engine_verify_pairs_equals_merge() {
    if !gpu_or_skip("engine_verify_pairs_equals_merge") {
        return;
    }
    let mut rng = StdRng::seed_from_u64(7);
    // Sets of every size class: empty, short (block per probe set), long (block per pair),
    // over a small domain so overlaps are large.
    let mut sets: Vec<Vec<u32>> = Vec::new();
    for i in 0..3000 {
        let len = match i % 10 {
            0 => rng.random_range(0..3),
            1 => rng.random_range(1000..5000),
            _ => rng.random_range(3..300),
        };
        let domain = if i % 10 == 1 { 8000 } else { 600 };
        sets.push(random_set(&mut rng, len, domain));
    }
    let mut tokens = Vec::new();
    let mut starts = vec![0usize];
    for s in &sets {
        tokens.extend_from_slice(s);
        starts.push(tokens.len());
    }
    let device = gpu::upload_sets(&tokens, &starts).expect("upload");
    assert_eq!(device.len(), sets.len());
    // Pairs: probes in runs (as the join sends them, each run a group), alphas around the
    // true overlap.
    let mut pairs = Vec::new();
    let mut group_starts = Vec::new();
    let mut probes = Vec::new();
    let mut expected = Vec::new();
    while pairs.len() < 200_000 {
        let x = rng.random_range(0..sets.len()) as u32;
        group_starts.push(pairs.len() as u32);
        probes.push(x);
        for _ in 0..rng.random_range(1..400) {
            let y = rng.random_range(0..sets.len()) as u32;
            let total = common_count(&sets[x as usize], &sets[y as usize]);
            let alpha = match rng.random_range(0..4) {
                0 => total,
                1 => total + 1,
                2 => total.saturating_sub(rng.random_range(0..10)),
                _ => rng.random_range(0..50),
            };
            pairs.push(PairToVerify { y, alpha });
            expected.push(if total >= alpha { total } else { NONE });
        }
    }
    let groups = PairGroups {
        starts: &group_starts,
        probes: &probes,
    };

    // The answers as one value per pair (NONE: not passing).
    let spread = |passed: &[(u32, u32)]| -> Vec<u32> {
        let mut v = vec![NONE; pairs.len()];
        for w in passed.windows(2) {
            assert!(w[0].0 < w[1].0, "answers by ascending index, each once");
        }
        for &(i, o) in passed {
            v[i as usize] = o;
        }
        v
    };
    let (passed, t) = gpu::verify_pairs(&device, &pairs, groups, true).expect("verify");
    assert!(t.groups > 0 && t.large_pairs > 0, "both layouts ran: {t:?}");
    assert!(t.h2d_bytes >= 8 * pairs.len() as u64, "{t:?}");
    // The counters and the passing pairs, and what came back with the counters before their
    // number was known (a guess of at most every pair's answer).
    let least = 12 + 8 * passed.len() as u64;
    assert!(
        (least..=least + 8 * pairs.len() as u64).contains(&t.d2h_bytes),
        "{t:?}"
    );
    let exact = spread(&passed);
    let wrong = exact.iter().zip(&expected).filter(|(a, b)| a != b).count();
    assert_eq!(wrong, 0, "exact answers differ from the merge");

    let (passed, _) = gpu::verify_pairs(&device, &pairs, groups, false).expect("verify");
    let lower = spread(&passed);
    for (i, (&l, &e)) in lower.iter().zip(&expected).enumerate() {
        if e == NONE {
            assert_eq!(l, NONE, "pair {i}: {:?}", pairs[i]);
        } else {
            assert!(l >= pairs[i].alpha && l <= e, "pair {i}: {l} for {e}");
        }
    }
    // Queued chunks (as the join sends them: each run of one probe set a group): four at
    // the device at once, one of them abandoned unfinished (a cancelled join), the others
    // finished in reverse order, each with the exact answers of its own pairs, and each
    // answer's pairs named by their group's probe set.
    let device = Arc::new(device);
    let mut bounds: Vec<usize> = (0..4)
        .map(|q| group_starts[group_starts.len() * q / 4] as usize)
        .collect();
    bounds.push(pairs.len());
    let mut queued = Vec::new();
    for w in bounds.windows(2) {
        let mut chunk = PairBuffer::new(w[1] - w[0], true);
        for (i, &pair) in pairs.iter().enumerate().take(w[1]).skip(w[0]) {
            if let Ok(g) = group_starts.binary_search(&(i as u32)) {
                chunk.start_group(probes[g]);
            }
            chunk.push(pair);
        }
        queued.push((w[0], gpu::submit_pairs(&device, Arc::new(chunk), true)));
    }
    drop(queued.remove(1));
    for (from, pending) in queued.into_iter().rev() {
        let (chunk, answer) = pending.finish();
        let (passed, t) = answer.expect("queued verification");
        // The host's time in the call need not cover the kernels: they ran while it went on.
        assert!(t.kernel_ms > 0.0 && t.total_ms >= t.wait_ms, "{t:?}");
        let mut got = vec![NONE; chunk.len()];
        let chunk_groups = chunk.groups().expect("grouped chunk");
        chunk_groups.each_probe(&passed, |x, i, o| {
            let at = from + i as usize;
            let g = group_starts.partition_point(|&s| s as usize <= at) - 1;
            assert_eq!(x, probes[g], "pair {at}'s probe set");
            got[i as usize] = o;
        });
        assert_eq!(
            got,
            expected[from..from + chunk.len()],
            "queued chunk from pair {from}"
        );
    }
    // An empty chunk answers nothing; a bad one answers its error from `finish`: pairs
    // outside any group, a candidate set or a probe set out of range.
    let (_, answer) = gpu::submit_pairs(&device, Arc::new(PairBuffer::new(8, true)), true).finish();
    assert!(answer.expect("empty chunk").0.is_empty());
    let n = sets.len() as u32;
    for (probe, y) in [(None, 1), (Some(0), n), (Some(n), 1)] {
        let mut bad_chunk = PairBuffer::new(8, true);
        if let Some(x) = probe {
            bad_chunk.start_group(x);
        }
        bad_chunk.push(PairToVerify { y, alpha: 1 });
        let (_, answer) = gpu::submit_pairs(&device, Arc::new(bad_chunk), true).finish();
        assert!(answer.is_err(), "refused: probe {probe:?}, candidate {y}");
    }
    // Malformed groups are refused.
    let malformed: [(&[u32], &[u32]); 4] = [
        (&[1, 5], &[0, 0]),
        (&[0, 5, 5], &[0, 0, 0]),
        (&[0, 5], &[0]),
        (&[], &[]),
    ];
    for (starts, probes) in malformed {
        let g = PairGroups { starts, probes };
        assert!(
            gpu::verify_pairs(&device, &pairs, g, true).is_err(),
            "{g:?}"
        );
    }
    let none = PairGroups {
        starts: &[],
        probes: &[],
    };
    assert!(
        gpu::verify_pairs(&device, &[], none, true)
            .unwrap()
            .0
            .is_empty()
    );
}

/// One row: id and token list (`None`: NULL).
type Row = (i64, Option<Vec<i64>>);

/// Random collections: most sets short over a small domain (many candidates, so many chunks),
/// a few long ones (the block-per-pair layout), some empty, some NULL, near-duplicates.
fn collection(rng: &mut StdRng, n: usize, id_base: i64) -> Vec<Row> {
    let mut rows: Vec<Row> = Vec::with_capacity(n);
    for i in 0..n {
        let id = id_base + i as i64;
        let r = rng.random_range(0..100);
        let set: Option<Vec<i64>> = if r < 2 {
            None
        } else if r < 4 {
            Some(Vec::new())
        } else if r < 8 {
            let len = rng.random_range(800..2500);
            Some(
                random_set(rng, len, 3000)
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            )
        } else if r < 30 && !rows.is_empty() {
            // A near-duplicate of an earlier set: one token changed.
            let j = rng.random_range(0..rows.len());
            rows[j].1.clone().map(|mut s| {
                if !s.is_empty() {
                    let k = rng.random_range(0..s.len());
                    s[k] = rng.random_range(0..3000);
                }
                s
            })
        } else {
            let len = rng.random_range(1..40);
            Some(
                random_set(rng, len, 120)
                    .into_iter()
                    .map(i64::from)
                    .collect(),
            )
        };
        rows.push((id, set));
    }
    rows
}

fn table(rows: &[Row]) -> Arc<MemTable> {
    let ids = Int64Array::from(rows.iter().map(|r| r.0).collect::<Vec<_>>());
    let lists = ListArray::from_iter_primitive::<Int64Type, _, _>(rows.iter().map(|r| {
        r.1.as_ref()
            .map(|s| s.iter().map(|&v| Some(v)).collect::<Vec<_>>())
    }));
    let schema = Arc::new(Schema::new(vec![
        Field::new("id", DataType::Int64, false),
        Field::new("tokens", lists.data_type().clone(), true),
    ]));
    let batch = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(ids), Arc::new(lists)])
        .expect("batch");
    let n = batch.num_rows();
    let parts = vec![
        vec![batch.slice(0, n / 2)],
        vec![batch.slice(n / 2, n - n / 2)],
    ];
    Arc::new(MemTable::try_new(schema, parts).expect("table"))
}

/// A multi-threaded tokio runtime with `workers` threads.
fn runtime(workers: usize) -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
        .expect("tokio")
}

fn session(partitions: usize, backend: &str, rt: &tokio::runtime::Runtime) -> SessionContext {
    let ctx = common::sets_session(SessionConfig::new().with_target_partitions(partitions));
    rt.block_on(async {
        ctx.sql(&format!("SET sets.backend = '{backend}'"))
            .await?
            .collect()
            .await
    })
    .expect("SET sets.backend");
    // DFSETS_BENCH_SPLIT_SCAN=0: the Parquet input read a row group per task (A/B runs).
    if std::env::var("DFSETS_BENCH_SPLIT_SCAN").is_ok_and(|v| v == "0") {
        rt.block_on(async {
            ctx.sql("SET tuning.similarity_join_split_scan = false")
                .await?
                .collect()
                .await
        })
        .expect("SET tuning.similarity_join_split_scan");
    }
    ctx
}

/// `(left id, right id, similarity bits)` of every row, sorted.
fn pairs_of(batches: &[RecordBatch]) -> Vec<(i64, i64, u64)> {
    let mut out = Vec::new();
    for b in batches {
        let l = b.column(0).as_primitive::<Int64Type>();
        let r = b.column(1).as_primitive::<Int64Type>();
        let s = b.column(2);
        for i in 0..b.num_rows() {
            let bits = match s.as_any().downcast_ref::<Float64Array>() {
                Some(f) => f.value(i).to_bits(),
                None => s
                    .as_any()
                    .downcast_ref::<UInt64Array>()
                    .map_or(u64::MAX, |u| u.value(i)),
            };
            out.push((l.value(i), r.value(i), bits));
        }
    }
    out.sort_unstable();
    out
}

/// The nested loop: every pair of non-NULL sets (self-join: `l.id < r.id`) whose measure
/// passes `>= t`, with the measure's own f64 formula.
fn brute_force(left: &[Row], right: Option<&[Row]>, m: Measure, t: f64) -> Vec<(i64, i64, u64)> {
    let dedup = |s: &Vec<i64>| {
        let mut v: Vec<u32> = s.iter().map(|&x| x as u32).collect();
        v.sort_unstable();
        v.dedup();
        v
    };
    let l: Vec<(i64, Vec<u32>)> = left
        .iter()
        .filter_map(|r| r.1.as_ref().map(|s| (r.0, dedup(s))))
        .collect();
    let r: Vec<(i64, Vec<u32>)> = match right {
        Some(rows) => rows
            .iter()
            .filter_map(|r| r.1.as_ref().map(|s| (r.0, dedup(s))))
            .collect(),
        None => l.clone(),
    };
    let mut out = Vec::new();
    for (a, x) in &l {
        for (b, y) in &r {
            if right.is_none() && a >= b {
                continue;
            }
            let o = u64::from(common_count(x, y));
            let score = m.score(o, x.len() as u64, y.len() as u64);
            if score >= t {
                let bits = if m == Measure::Overlap {
                    o
                } else {
                    score.to_bits()
                };
                out.push((*a, *b, bits));
            }
        }
    }
    out.sort_unstable();
    out
}

#[test]
fn sql_gpu_equals_cpu_and_nested_loop() {
    if !gpu_or_skip("sql_gpu_equals_cpu_and_nested_loop") {
        return;
    }
    let rt = runtime(4);
    let mut rng = StdRng::seed_from_u64(11);
    let left = collection(&mut rng, 2500, 0);
    let right = collection(&mut rng, 1500, 100_000);
    let chunks_before = gpu::simjoin_chunks_run();
    let cases: &[(Measure, f64, bool, usize)] = &[
        (Measure::Jaccard, 0.3, true, 1),
        (Measure::Jaccard, 0.5, true, 4),
        (Measure::Cosine, 0.6, false, 4),
        (Measure::Dice, 0.5, true, 2),
        (Measure::Overlap, 6.0, false, 3),
        (Measure::Jaccard, 0.9, false, 1),
    ];
    for &(m, t, self_join, partitions) in cases {
        let call = if self_join {
            format!("similarity_join('l', 'id', 'tokens', '{}', {t})", m.name())
        } else {
            format!(
                "similarity_join('l', 'id', 'tokens', 'r', 'id', 'tokens', '{}', {t})",
                m.name()
            )
        };
        let expected = brute_force(&left, (!self_join).then_some(&right[..]), m, t);
        let mut answers = Vec::new();
        // "gpu": the whole join on the device; "gpu-verify": the CPU's filter, the device's
        // verification; "auto": from any size, one partition on the device, the others on
        // the CPU, claiming from the same counters.
        for run in ["cpu", "gpu", "gpu-verify", "auto"] {
            let backend = match run {
                "cpu" | "auto" => run,
                _ => "gpu",
            };
            tuning::set_sj_device_filter(run != "gpu-verify");
            tuning::set_sj_auto_gpu_from((run == "auto").then_some(0));
            tuning::set_sj_device_partitions((run == "auto").then_some(1));
            let chunks_before_run = gpu::simjoin_chunks_run();
            let ctx = session(partitions, backend, &rt);
            ctx.register_table("l", table(&left)).unwrap();
            ctx.register_table("r", table(&right)).unwrap();
            let (rows, count) = rt
                .block_on(async {
                    let rows = ctx
                        .sql(&format!("SELECT * FROM {call}"))
                        .await?
                        .collect()
                        .await?;
                    let count = ctx
                        .sql(&format!("SELECT count(*) FROM {call}"))
                        .await?
                        .collect()
                        .await?;
                    Ok::<_, datafusion::common::DataFusionError>((rows, count))
                })
                .unwrap_or_else(|e| panic!("{call} on {run}: {e}"));
            if run == "auto" {
                // With one partition the device probes every set; with more, the CPU's
                // partitions may have taken every range while the device's uploaded.
                let calls = gpu::simjoin_chunks_run() - chunks_before_run;
                eprintln!("{call} on auto, {partitions} partitions: {calls} device calls");
                assert!(
                    partitions > 1 || calls > 0,
                    "{call} on auto: the device took no probe range"
                );
            }
            let pairs = pairs_of(&rows);
            let counted = count[0].column(0).as_primitive::<Int64Type>().value(0);
            assert_eq!(counted as usize, pairs.len(), "{call} on {run}: count(*)");
            answers.push(pairs);
        }
        tuning::set_sj_device_filter(true);
        tuning::set_sj_auto_gpu_from(None);
        tuning::set_sj_device_partitions(None);
        assert_eq!(answers[0], expected, "{call}: cpu vs nested loop");
        assert_eq!(answers[1], expected, "{call}: gpu join vs nested loop");
        assert_eq!(
            answers[2], expected,
            "{call}: gpu verification vs nested loop"
        );
        assert_eq!(
            answers[3], expected,
            "{call}: cpu and gpu together vs nested loop"
        );
        eprintln!(
            "{call}: {} pairs, cpu == gpu join == gpu verification == cpu and gpu together == nested loop",
            expected.len()
        );
    }
    let chunks = gpu::simjoin_chunks_run() - chunks_before;
    eprintln!("{chunks} chunks verified on the GPU");
    assert!(
        chunks >= 4 * cases.len() as u64,
        "every join (rows and count, both GPU paths) ran at least one call on the GPU"
    );
}

/// The spread joins (`prefix`, `broadcast`: a self-join replicated, an R-S join with its
/// smaller side whole) on the device and on the CPU: the nested loop's pairs, through both
/// GPU paths.
#[test]
fn spread_joins_gpu_equals_cpu_and_nested_loop() {
    if !gpu_or_skip("spread_joins_gpu_equals_cpu_and_nested_loop") {
        return;
    }
    let rt = runtime(4);
    let mut rng = StdRng::seed_from_u64(23);
    let left = collection(&mut rng, 2000, 0);
    let right = collection(&mut rng, 400, 100_000);
    let chunks_before = gpu::simjoin_chunks_run();
    for distribution in ["prefix", "broadcast"] {
        for (m, t, self_join) in [
            (Measure::Jaccard, 0.5, true),
            (Measure::Dice, 0.4, false),
            (Measure::Cosine, 0.7, true),
        ] {
            let call = if self_join {
                format!("similarity_join('l', 'id', 'tokens', '{}', {t})", m.name())
            } else {
                format!(
                    "similarity_join('l', 'id', 'tokens', 'r', 'id', 'tokens', '{}', {t})",
                    m.name()
                )
            };
            let expected = brute_force(&left, (!self_join).then_some(&right[..]), m, t);
            for run in ["cpu", "gpu", "gpu-verify"] {
                tuning::set_sj_device_filter(run != "gpu-verify");
                let ctx = session(3, if run == "cpu" { "cpu" } else { "gpu" }, &rt);
                ctx.register_table("l", table(&left)).unwrap();
                ctx.register_table("r", table(&right)).unwrap();
                let rows = rt
                    .block_on(async {
                        ctx.sql(&format!(
                            "SET sets.similarity_join_distribution = '{distribution}'"
                        ))
                        .await?
                        .collect()
                        .await?;
                        ctx.sql(&format!("SELECT * FROM {call}"))
                            .await?
                            .collect()
                            .await
                    })
                    .unwrap_or_else(|e| panic!("{call} ({distribution}) on {run}: {e}"));
                assert_eq!(
                    pairs_of(&rows),
                    expected,
                    "{call} ({distribution}) on {run} vs nested loop"
                );
            }
            tuning::set_sj_device_filter(true);
            eprintln!(
                "{call} ({distribution}): {} pairs, cpu == gpu join == gpu verification == nested loop",
                expected.len()
            );
        }
    }
    let chunks = gpu::simjoin_chunks_run() - chunks_before;
    eprintln!("{chunks} chunks verified on the GPU");
    assert!(chunks > 0, "no spread join ran a call on the GPU");
}

/// The SQL join with a strict threshold (`f(a, b) > t`), at thresholds many pairs reach
/// exactly: the CPU equals the nested loop everywhere, and the GPU join equals both where a
/// GPU is present (with 1 and 3 partitions).
#[test]
fn sql_join_with_a_strict_threshold_gpu_equals_cpu_and_nested_loop() {
    let gpu = gpu_or_skip("sql_join_with_a_strict_threshold_gpu_equals_cpu_and_nested_loop");
    let rt = runtime(3);
    let mut rng = StdRng::seed_from_u64(23);
    let rows = collection(&mut rng, 1200, 0);
    let cases: &[(Measure, f64)] = &[
        (Measure::Jaccard, 0.5),
        (Measure::Cosine, 0.5),
        (Measure::Dice, 0.5),
        (Measure::Overlap, 5.0),
    ];
    for &(m, t) in cases {
        let at_threshold = |bits: u64| match m {
            Measure::Overlap => bits as f64 == t,
            _ => f64::from_bits(bits) == t,
        };
        let all = brute_force(&rows, None, m, t);
        let exact = all.iter().filter(|p| at_threshold(p.2)).count();
        assert!(exact > 0, "{}: no pair exactly at {t}", m.name());
        let want: Vec<(i64, i64)> = all
            .iter()
            .filter(|p| !at_threshold(p.2))
            .map(|p| (p.0, p.1))
            .collect();
        let sql = format!(
            "SELECT r.id, u.id FROM l r JOIN l u ON r.id < u.id AND {}(r.tokens, u.tokens) > {t}",
            m.name()
        );
        let backends: &[&str] = if gpu { &["cpu", "gpu"] } else { &["cpu"] };
        for &backend in backends {
            for partitions in [1, 3] {
                let ctx = session(partitions, backend, &rt);
                ctx.register_table("l", table(&rows)).unwrap();
                let before = gpu::simjoin_chunks_run();
                let batches = rt
                    .block_on(async { ctx.sql(&sql).await?.collect().await })
                    .unwrap_or_else(|e| panic!("{sql} on {backend}: {e}"));
                let mut got: Vec<(i64, i64)> = batches
                    .iter()
                    .flat_map(|b| {
                        let l = b.column(0).as_primitive::<Int64Type>().clone();
                        let r = b.column(1).as_primitive::<Int64Type>().clone();
                        (0..b.num_rows()).map(move |i| (l.value(i), r.value(i)))
                    })
                    .collect();
                got.sort_unstable();
                assert_eq!(got, want, "{sql} on {backend}, {partitions} partitions");
                if backend == "gpu" {
                    assert!(gpu::simjoin_chunks_run() > before, "{sql}: no device call");
                }
            }
        }
        eprintln!(
            "{sql}: {} pairs ({exact} exactly at the threshold left out), equal on {backends:?}",
            want.len()
        );
    }
}

#[test]
fn explain_analyze_shows_device_counters() {
    if !gpu_or_skip("explain_analyze_shows_device_counters") {
        return;
    }
    let rt = runtime(2);
    let mut rng = StdRng::seed_from_u64(5);
    let rows = collection(&mut rng, 1500, 0);
    let ctx = session(2, "gpu", &rt);
    ctx.register_table("l", table(&rows)).unwrap();
    let text = rt
        .block_on(async {
            let b = ctx
                .sql("EXPLAIN ANALYZE SELECT count(*) FROM similarity_join('l', 'id', 'tokens', 'jaccard', 0.4)")
                .await?
                .collect()
                .await?;
            Ok::<_, datafusion::common::DataFusionError>(
                datafusion::arrow::util::pretty::pretty_format_batches(&b)?.to_string(),
            )
        })
        .expect("explain analyze");
    let line = text
        .lines()
        .find(|l| l.contains("SimilarityJoinExec"))
        .expect("the join in the plan");
    assert!(line.contains("backend=gpu"), "{line}");
    let metric = |name: &str| -> u64 {
        let at = line
            .find(&format!("{name}="))
            .unwrap_or_else(|| panic!("{name} missing: {line}"));
        line[at + name.len() + 1..]
            .chars()
            .take_while(|c| c.is_ascii_digit())
            .collect::<String>()
            .parse()
            .unwrap_or(0)
    };
    assert!(metric("gpu_chunks") > 0, "{line}");
    // The whole join on the device: a call per claimed range of at least 1,024 probe sets
    // (a count needs no pair back, so no range overflows and splits).
    assert!(metric("gpu_chunks") <= 8, "{line}");
    assert!(metric("gpu_pairs") > 0, "{line}");
    assert!(line.contains("bytes_to_device="), "{line}");
    assert!(line.contains("gpu_kernel_time="), "{line}");
}

/// The issue's verification-bound cases on `gcide_words`, through SQL (`count(*)`: no pair
/// is built), side by side in one process: the CPU on one core and on all cores, the filter
/// alone (`DFSETS_SJ_FILTER_ONLY=1`), the filter writing the pairs into the GPU chunks
/// without sending them (`DFSETS_SJ_FILTER_ONLY=serialize`), and the join with GPU
/// verification. Writes a table to
/// `DFSETS_BENCH_OUT` when set. Data: `DFSETS_BENCH_DATA` (default `bench-data`).
#[test]
#[ignore = "benchmark: run on the GPU machine (scripts/gpu/run.sh)"]
fn bench_gpu_simjoin() {
    if !gpu_or_skip("bench_gpu_simjoin") {
        return;
    }
    let dir = std::env::var("DFSETS_BENCH_DATA").unwrap_or_else(|_| "bench-data".into());
    let path = format!("{dir}/gcide_words/sets.parquet");
    assert!(std::path::Path::new(&path).exists(), "{path} missing");
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let reps: usize = std::env::var("DFSETS_BENCH_REPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(3);
    // filter_only: DFSETS_SJ_FILTER_ONLY's value ("" for a real join), set for the run with
    // `tuning::set_sj_filter_only`.
    let run = |cores_used: usize, backend: &str, filter_only: &str, sql: &str| -> (f64, i64) {
        let rt = if cores_used == 1 {
            tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
        } else {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(cores_used)
                .enable_all()
                .build()
        }
        .expect("tokio");
        let ctx = session(cores_used, backend, &rt);
        rt.block_on(async {
            ctx.sql(&format!(
                "CREATE EXTERNAL TABLE sets STORED AS PARQUET LOCATION '{path}'"
            ))
            .await?
            .collect()
            .await
        })
        .expect("register");
        tuning::set_sj_filter_only(Some(match filter_only {
            "1" => tuning::SjFilterOnly::Count,
            "serialize" => tuning::SjFilterOnly::Serialize,
            _ => tuning::SjFilterOnly::Off,
        }));
        let t0 = Instant::now();
        let b = rt
            .block_on(async { ctx.sql(sql).await?.collect().await })
            .expect("query");
        let ms = t0.elapsed().as_secs_f64() * 1e3;
        if std::env::var("DFSETS_BENCH_EXPLAIN").is_ok_and(|v| v == "1") {
            // Where the time went (a second run, not timed above).
            let text = rt
                .block_on(async {
                    let b = ctx
                        .sql(&format!("EXPLAIN ANALYZE {sql}"))
                        .await?
                        .collect()
                        .await?;
                    Ok::<_, datafusion::common::DataFusionError>(
                        datafusion::arrow::util::pretty::pretty_format_batches(&b)?.to_string(),
                    )
                })
                .expect("explain analyze");
            for line in text.lines().filter(|l| l.contains("SimilarityJoinExec")) {
                let at = line.find("metrics=").unwrap_or(0);
                eprintln!("  {}", line[at..].trim_end_matches([' ', '|']));
            }
        }
        tuning::set_sj_filter_only(None);
        (ms, b[0].column(0).as_primitive::<Int64Type>().value(0))
    };
    let mut report = format!(
        "similarity_join on gcide_words (126,240 sets), count(*), {cores} cores; best of {reps} (ms)\n\
         | case | CPU 1 core | CPU {cores} cores | filter only, {cores} cores | filter + pairs written, {cores} cores | GPU verify, {cores} cores | GPU / filter | 1 core / GPU | filter only, 1 core | GPU verify, 1 core |\n\
         | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n"
    );
    for (name, measure) in [("Jaccard >= 0.5", "jaccard"), ("Dice >= 0.5", "dice")] {
        let sql = format!(
            "SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', '{measure}', 0.5)"
        );
        let best = |cores_used: usize, backend: &str, filter_only: &str, reps: usize| {
            let mut ms = f64::INFINITY;
            let mut count = 0;
            for _ in 0..reps {
                let (t, c) = run(cores_used, backend, filter_only, &sql);
                eprintln!(
                    "{name}: {cores_used} cores, {backend}, filter_only={filter_only:?}: {t:.0} ms, {c}"
                );
                ms = ms.min(t);
                count = c;
            }
            (ms, count)
        };
        let (gpu_all, pairs_gpu) = best(cores, "gpu", "", reps);
        let (filter_all, candidates) = best(cores, "cpu", "1", reps);
        // The filter with the candidates written into the GPU chunks (not sent).
        let (written_all, written) = best(cores, "gpu", "serialize", reps);
        assert_eq!(written, candidates, "{name}: candidates written");
        let (cpu_all, pairs_cpu) = best(cores, "cpu", "", reps);
        // DFSETS_BENCH_ONE_CORE=0 skips the one-core runs (variants of the GPU path).
        let one_core = !std::env::var("DFSETS_BENCH_ONE_CORE").is_ok_and(|v| v == "0");
        let (gpu_one, pairs_gpu1) = if one_core {
            best(1, "gpu", "", 1)
        } else {
            (f64::NAN, pairs_cpu)
        };
        let (filter_one, _) = if one_core {
            best(1, "cpu", "1", 1)
        } else {
            (f64::NAN, 0)
        };
        let (cpu_one, pairs_one) = if one_core {
            best(1, "cpu", "", 1)
        } else {
            (f64::NAN, pairs_cpu)
        };
        assert_eq!(pairs_gpu, pairs_cpu, "{name}: GPU and CPU pair counts");
        assert_eq!(
            pairs_gpu1, pairs_one,
            "{name}: GPU and CPU pair counts (1 core)"
        );
        assert_eq!(pairs_one, pairs_cpu, "{name}: 1 core and all cores");
        eprintln!("{name}: {pairs_cpu} pairs, {candidates} candidates");
        report.push_str(&format!(
            "| {name} ({pairs_cpu} pairs, {candidates} candidates) | {cpu_one:.0} | {cpu_all:.0} | {filter_all:.0} | {written_all:.0} | {gpu_all:.0} | {:.2}× | {:.1}× | {filter_one:.0} | {gpu_one:.0} |\n",
            gpu_all / filter_all,
            cpu_one / gpu_all,
        ));
    }
    println!("{report}");
    if let Ok(out) = std::env::var("DFSETS_BENCH_OUT") {
        std::fs::write(out, report).expect("write the report");
    }
}
