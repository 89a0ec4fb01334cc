#!/usr/bin/env bash
# On the GPU machine, after run.sh has unpacked the test binaries into /tmp/gpubin: the
# known-order benchmarks side by side (kernels/DESIGN.md, "Known order" and "wmerge").
#   bench_known_order  resident columns, kernels alone, every KnownOrder mode alternated in
#                      one process; once per entry of KO_ENVS ("WPIECE=1024 WMINB=8": the
#                      benchmark again with DFSETS_GPU_<entry> set, "A=1,B=2" sets two; "-":
#                      the defaults), each in its own process (the kernels compile once per
#                      process)
#   bench_resident     the SQL function on resident columns (W1 / W2 x4 against the CPU on
#                      every core), once per entry of KO_RATIOS (DFSETS_GPU_SEARCH_RATIO)
# KO_BASE=carry/<dir>: a folder holding gpu_props.xz built from an earlier commit; each
# bench_known_order then runs the base binary first and this one after it, on the same data.
# Writes $OUT/known-<tag>.txt and $OUT/resident-<ratio>.txt(.resident).
set -u
out="${OUT:-/tmp/out}"
mkdir -p "$out"
bins=(/tmp/gpubin/gpu_props)
if [ -n "${KO_BASE:-}" ] && [ -f "$KO_BASE/gpu_props.xz" ]; then
    mkdir -p /tmp/gpubin-base
    xz -dc "$KO_BASE/gpu_props.xz" >/tmp/gpubin-base/gpu_props && chmod +x /tmp/gpubin-base/gpu_props
    bins=(/tmp/gpubin-base/gpu_props /tmp/gpubin/gpu_props)
fi
for v in ${KO_ENVS:--}; do
    tag=$(echo "$v" | sed 's#[^,]*/##g' | tr '=/.,' '____')
    envs=()
    if [ "$v" != - ]; then IFS=, read -ra kv <<<"$v"; for e in "${kv[@]}"; do envs+=("DFSETS_GPU_$e"); done; fi
    for bin in "${bins[@]}"; do
        echo "== bench_known_order ${envs[*]:-(defaults)}: $bin"
        env "${envs[@]}" DFSETS_BENCH_OUT="$out/known-$tag.txt" \
            timeout 200 "$bin" --ignored --nocapture --test-threads=1 bench_known_order \
            >"$out/known-$tag.log" 2>&1
        grep -h "input values" "$out/known-$tag.log" | sed 's/; resident kernels[^:]*:/:/'
    done
done
for r in ${KO_RATIOS:-}; do
    echo "== bench_resident, DFSETS_GPU_SEARCH_RATIO=$r"
    DFSETS_GPU_SEARCH_RATIO=$r DFSETS_BENCH_OUT="$out/resident-$r.txt" \
        timeout 200 /tmp/gpubin/gpu_props --ignored --nocapture --test-threads=1 bench_resident \
        >"$out/resident-$r.log" 2>&1
    grep -h "^W" "$out/resident-$r.txt.resident" 2>/dev/null
done
