#!/usr/bin/env bash
# On the GPU machine, after run.sh has unpacked the test binaries into /tmp/gpubin: the list
# intersection benchmarks (bench_resident, bench_gpu_intersect) once per merge-kernel variant,
# each in its own process (the kernels compile once per process), so that the variants are
# measured side by side on one machine. Variants: "threads:minb:items" (DFSETS_GPU_MERGE_THREADS,
# DFSETS_GPU_MERGE_MINB, DFSETS_GPU_MERGE_ITEMS; kernels/DESIGN.md), optionally ":source", a
# kernel file compiled instead of the embedded intersect.cu (DFSETS_GPU_INTERSECT_SOURCE), so
# that two kernel versions are measured by one binary. Writes
# $OUT/bench-<threads>-<minb>-<items>[-<source name>].txt(.resident).
set -u
out="${OUT:-/tmp/out}"
mkdir -p "$out"
for v in ${VARIANTS:-"128:12:8" "64:20:8" "64:24:8" "128:8:16" "128:10:12"}; do
    IFS=: read -r t b i src <<<"$v"
    i=${i:-8}
    tag="$t-$b-$i"
    if [ -n "${src:-}" ]; then
        tag="$tag-$(basename "$src" .cu)"
        export DFSETS_GPU_INTERSECT_SOURCE="$PWD/$src"
    else
        unset DFSETS_GPU_INTERSECT_SOURCE
    fi
    DFSETS_GPU_MERGE_THREADS=$t DFSETS_GPU_MERGE_MINB=$b DFSETS_GPU_MERGE_ITEMS=$i \
        DFSETS_BENCH_OUT="$out/bench-$tag.txt" \
        timeout 150 /tmp/gpubin/gpu_props --ignored --nocapture --test-threads=1 \
        bench_resident bench_gpu_intersect >"$out/bench-$tag.log" 2>&1
    echo "== merge threads $t, min blocks $b, items $i ${src:-(embedded)}: $(grep -c 'test result: ok' "$out/bench-$tag.log") ok"
    grep -ho "^[^:]*: [0-9]* input values.*of D2D copy\|kernels [0-9.]* + copy out" "$out/bench-$tag.txt" "$out/bench-$tag.txt.resident" 2>/dev/null
    grep -h "^W" "$out/bench-$tag.txt.resident" 2>/dev/null | sed 's/; resident engine call.*kernels \([0-9.]*\).*/; kernels \1 ms/'
done
