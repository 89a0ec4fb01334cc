#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/run.sh has unpacked $CARRY's binaries into /tmp/gpubin:
# the topk_bm25 benchmark of a base binary (BASE=carry/old, a folder holding gpu_bm25.xz built
# by scripts/gpu/build.sh from an earlier commit) and of this one, alternated ROUNDS times
# (default 2), on the same data, so that two commits are compared on one machine in one call.
# VARIANTS="DFSETS_GPU_GRAPH=0 ...": in each round the new binary runs again once per entry,
# with that variable set (a knob of the new code against its default, in the same rounds);
# "A=1,B=2" sets both.
# Results: $OUT/bench_bm25_ab_<round>_<base|new|variant>.txt.
set -uo pipefail
carry=${CARRY:-carry/gpu}
out=${OUT:-/tmp/gpu-out}
base=${BASE:?BASE names the folder with the base gpu_bm25.xz}
mkdir -p "$out" /tmp/gpubin-base
xz -dc "$base/gpu_bm25.xz" >/tmp/gpubin-base/gpu_bm25 && chmod +x /tmp/gpubin-base/gpu_bm25
status=0
for round in $(seq 1 "${ROUNDS:-2}"); do
    for which in base new ${VARIANTS:-}; do
        bin=/tmp/gpubin/gpu_bm25
        [ "$which" = base ] && bin=/tmp/gpubin-base/gpu_bm25
        env=(DFSETS_REQUIRE_GPU=1)
        case "$which" in *=*) IFS=, read -r -a kv <<<"$which"; env+=("${kv[@]}") ;; esac
        tag=$(echo "$which" | tr '=/.,' '____')
        echo "== topk_bm25 benchmark, round $round, $which"
        env "${env[@]}" DFSETS_BENCH_DATA="$carry/bench-data" \
            DFSETS_BENCH_OUT="$out/bench_bm25_ab_${round}_$tag.txt" \
            "$bin" --ignored --nocapture bench >"/tmp/bench_bm25_ab_${round}_$tag.log" 2>&1 || status=1
        head -9 "$out/bench_bm25_ab_${round}_$tag.txt" 2>/dev/null | tail -6
    done
done
exit $status
