#!/usr/bin/env bash
# On the GPU machine: `wmerge`'s piece sizes side by side (kernels/DESIGN.md, "A piece size per
# step"), then the GPU tests. Through the device tool, from the repository root:
#   command: OUT=$OUT CARRY=carry/new KO_BASE=carry/old bash scripts/gpu/wpiece.sh
#   carry:   ["carry/new", "carry/old"]
# (carry/new: scripts/gpu/build.sh with TESTS="gpu_props gpu_sql"; carry/old: gpu_props built
# from the commit before, TESTS=gpu_props.)
# Order: the base binary, this build's defaults, each entry of WP_ENVS (known-order.sh's
# KO_ENVS: "WPLACE_PER_SM=0", "WPIECE_PER_SM=96,WPIECE_MAX=4096", ...), then the base and the
# defaults again, so that a drift of the host shows up in both. Each run in its own process,
# `DFSETS_BENCH_KO_MODES=warp` (this build: `wmerge` and the tile kernel at ratio 4 alone).
# Then (AUTO_MAX_ROWS, below) `bench_auto_rows`, and run.sh with the benchmarks skipped:
# gpu_props (GPU == CPU on random batches, every known-order mode) and gpu_sql.
set -u
out="${OUT:-/tmp/out}"
carry=${CARRY:-carry/new}
mkdir -p "$out" /tmp/gpubin
for f in "$carry"/*.xz; do xz -dc "$f" >"/tmp/gpubin/$(basename "$f" .xz)"; done
chmod +x /tmp/gpubin/*
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
export DFSETS_BENCH_KO_MODES=warp
# The benchmarks' lines go to $OUT/summary.txt (printed again at the end), the tests' output
# to $OUT/tests.log (its last lines printed).
ko() { OUT="$out/ko" bash scripts/gpu/known-order.sh | tee -a "$out/summary.txt"; }
base=${KO_BASE:-}
KO_BASE=$base KO_ENVS=- ko
KO_BASE= KO_ENVS="${WP_ENVS:--}" ko
KO_BASE=$base KO_ENVS=- ko
# AUTO_MAX_ROWS=1000000: then `bench_auto_rows` of this build up to that many rows (auto
# against cpu and gpu through SQL; its lines go to the summary too).
if [ -n "${AUTO_MAX_ROWS:-}" ]; then
    echo "== bench_auto_rows to $AUTO_MAX_ROWS rows" | tee -a "$out/summary.txt"
    DFSETS_BENCH_AUTO_MAX_ROWS=$AUTO_MAX_ROWS DFSETS_BENCH_OUT="$out/auto.txt" timeout 300 \
        /tmp/gpubin/gpu_props --ignored --nocapture --test-threads=1 bench_auto_rows \
        >"$out/auto.log" 2>&1
    grep -E "^rows|auto vs" "$out/auto.log" | tee -a "$out/summary.txt"
fi
if [ "${SKIP_TESTS:-0}" != 1 ]; then
    SKIP_BENCH=1 CARRY="$carry" OUT="$out/tests" bash scripts/gpu/run.sh >"$out/tests.log" 2>&1
    echo "tests: exit $?"
    grep -E "^test result|FAILED|panicked|^== " "$out/tests.log" | tail -40
fi
echo "== summary"
cat "$out/summary.txt"
