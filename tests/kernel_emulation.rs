//! The list-intersection kernels of `kernels/intersect.cu`, the BM25 top-k kernels of
//! `kernels/bm25.cu` and the similarity join's `probe_join` of `kernels/simjoin.cu`, run on
//! the CPU by
//! `scripts/emulate-kernels.sh` (g++ only: each CUDA thread a fiber, barriers for
//! `__syncthreads` and shuffles) on random batches and compared row by row with a reference. CI has no GPU:
//! this is where a change to the kernels' logic meets a test there. Skipped, with a note, on a
//! machine without g++.

use std::process::Command;

#[test]
fn intersect_kernels_match_a_reference_under_cpu_emulation() {
    if Command::new("g++").arg("--version").output().is_err() {
        eprintln!("kernel_emulation: skipped (no g++ on this machine)");
        return;
    }
    let out = Command::new("bash")
        .arg(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/scripts/emulate-kernels.sh"
        ))
        .output()
        .expect("run scripts/emulate-kernels.sh");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "kernel emulation failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Intersection: both block sizes, twenty-seven suites each (six with no row order known,
    // six with known order and searches, fifteen through `wmerge`, three of them with a piece
    // size per step, the second time in blocks of 2,048 threads); BM25: sixteen suites (four
    // k, with and without static scores, whole and split) and sixteen planned on the device,
    // eighteen AND batches through `bm25_topk_and` (three k, with and without static scores:
    // host-planned whole and split, and planned on the device), then all again with AND's
    // fences on short lists; the answers' packing on six batch sizes in each BM25 build; every
    // one without a bad row; the similarity join: four suites (self and R-S joins, with and
    // without a large set) against a nested loop.
    assert_eq!(
        stdout.matches(" bad=").count(),
        54 + 64 + 36 + 12 + 4,
        "{stdout}"
    );
    assert_eq!(
        stdout.matches(" bad=0\n").count(),
        54 + 64 + 36 + 12 + 4,
        "{stdout}"
    );
    assert_eq!(stdout.matches("AND kernel: ").count(), 36, "{stdout}");
    assert_eq!(stdout.matches("pack: queries=").count(), 12, "{stdout}");
    assert_eq!(
        stdout.matches("device plan: static").count(),
        32 + 12,
        "{stdout}"
    );
    // Device-planned batches read where the host wrote them and copied up, both; ranked by a
    // block per item and by a few blocks claiming the items, both.
    for mapped in [" mapped=0 ", " mapped=1 ", " claimed=0 ", " claimed=1 "] {
        assert!(stdout.matches(mapped).count() >= 8, "{mapped}: {stdout}");
    }
    assert_eq!(
        stdout.matches("a term beyond the index refused").count(),
        2,
        "{stdout}"
    );
    assert_eq!(stdout.matches(" warp").count(), 30, "{stdout}");
    assert_eq!(stdout.matches("pieces per step").count(), 6, "{stdout}");
    assert_eq!(stdout.matches(" split=1 ").count(), 16 + 12, "{stdout}");
    assert_eq!(stdout.matches("\nprobe_join ").count(), 4, "{stdout}");
    assert!(!stdout.contains(" 0 overflow splits"), "{stdout}");
    assert_eq!(stdout.matches("\nOK").count(), 5, "{stdout}");
}
