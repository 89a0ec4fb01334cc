#!/usr/bin/env bash
# On the GPU machine, after run.sh has unpacked the test binaries into /tmp/gpubin: the list
# intersection benchmarks (bench_resident, bench_gpu_intersect) once per merge-kernel variant,
# each in its own process (the kernels compile once per process), so that the variants are
# measured side by side on one machine. Variants: "threads minb" pairs (DFSETS_GPU_MERGE_THREADS,
# DFSETS_GPU_MERGE_MINB; kernels/NOTES.md). Writes $OUT/bench-<threads>-<minb>.txt(.resident).
set -u
out="${OUT:-/tmp/out}"
mkdir -p "$out"
for v in ${VARIANTS:-"256:5" "256:6" "128:10" "128:12"}; do
    t=${v%%:*}
    b=${v##*:}
    DFSETS_GPU_MERGE_THREADS=$t DFSETS_GPU_MERGE_MINB=$b DFSETS_BENCH_OUT="$out/bench-$t-$b.txt" \
        timeout 150 /tmp/gpubin/gpu_props --ignored --nocapture --test-threads=1 \
        bench_resident bench_gpu_intersect >"$out/bench-$t-$b.log" 2>&1
    echo "== merge threads $t, min blocks $b: $(grep -c 'test result: ok' "$out/bench-$t-$b.log") ok"
    grep -ho "^[^:]*: [0-9]* input values.*of D2D copy\|kernels [0-9.]* + copy out" "$out/bench-$t-$b.txt" "$out/bench-$t-$b.txt.resident" 2>/dev/null
    grep -h "^W" "$out/bench-$t-$b.txt.resident" 2>/dev/null | sed 's/; resident engine call.*kernels \([0-9.]*\).*/; kernels \1 ms/'
done
