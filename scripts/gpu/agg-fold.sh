#!/usr/bin/env bash
# On the GPU machine: list_intersect_agg's GPU fold, two builds of gpu_props side by side
# (CARRY holds gpu_props_base.xz and gpu_props_new.xz, stripped `cargo test --profile bench
# --no-run --test gpu_props` binaries): the new build's agg tests, then `bench_agg_groups`
# alternated base / new (ROUNDS, default 2), with each fold's host and device times logged.
#   CARRY=carry/agg OUT=$OUT bash scripts/gpu/agg-fold.sh
set -uo pipefail
c=${CARRY:-carry/agg}; out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/b
export DFSETS_REQUIRE_GPU=1 RUST_BACKTRACE=1
for f in "$c"/*.xz; do b=/tmp/b/$(basename "$f" .xz); xz -dc "$f" >"$b"; chmod +x "$b"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo; nproc
echo "== new: the aggregate's GPU tests"
/tmp/b/gpu_props_new --test-threads=1 agg 2>&1 | grep -E "^test |test result|panicked" | tail -6
for r in $(seq "${ROUNDS:-2}"); do
  for v in base new; do
    echo "== round $r: $v"
    RUST_LOG=datafusion_sets=debug /tmp/b/gpu_props_$v --ignored --nocapture --test-threads=1 \
      bench_agg_groups >"$out/$v$r.log" 2>&1 || { echo FAILED; tail -20 "$out/$v$r.log"; }
    grep -E "^(small|large):" "$out/$v$r.log"
    # The large shape's folds (2,000 groups), in the order they ran.
    grep -E "(folded on the (GPU|CPU)|GPU fold of).* 2000 groups|2000 groups folded" "$out/$v$r.log" \
      | sed 's/^.*datafusion-sets: //' | head -12
  done
done
