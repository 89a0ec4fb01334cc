#!/usr/bin/env bash
# On the GPU machine: the similarity join's benchmark (tests/gpu_simjoin.rs, bench) with the
# one-row-group Parquet input read in row ranges (split, the default) and a row group per task
# (SETS split off), alternated in one process per round, after the join's GPU tests.
#   CARRY=carry/sj OUT=$OUT bash scripts/gpu/simjoin-split.sh
# CARRY holds gpu_simjoin.xz (and optionally gpu_faults.xz), stripped release test binaries
# (`cargo bench --no-run --test gpu_simjoin --test gpu_faults`), and
# bench-data/gcide_words/sets.parquet. ROUNDS: "one-core-runs:split ..." (1/0 each).
set -uo pipefail
c=${CARRY:-carry/sj}; out=${OUT:-/tmp/out}; mkdir -p "$out" /tmp/b
export DFSETS_REQUIRE_GPU=1 RUST_BACKTRACE=1
for f in "$c"/*.xz; do b=/tmp/b/$(basename "$f" .xz); xz -dc "$f" >"$b"; chmod +x "$b"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo; nproc
if [ -x /tmp/b/gpu_faults ]; then
  echo "== gpu_faults"; /tmp/b/gpu_faults --nocapture 2>&1 | grep -E "^test |test result|panicked" | tail -6
fi
echo "== gpu_simjoin tests"; /tmp/b/gpu_simjoin --test-threads=1 2>&1 | grep -E "^test |test result|panicked" | tail -8
n=0
for r in ${ROUNDS:-1:1 1:0 0:1 0:0 0:1 0:0}; do
  one=${r%%:*}; split=${r##*:}; n=$((n+1))
  echo "== round $n: split $split (one core: $one)"
  DFSETS_BENCH_SPLIT_SCAN=$split DFSETS_BENCH_ONE_CORE=$one DFSETS_BENCH_DATA="$c/bench-data" \
    DFSETS_BENCH_OUT=/tmp/t.txt /tmp/b/gpu_simjoin --ignored --nocapture bench >/tmp/l.txt 2>&1 \
    || { echo FAILED; tail -20 /tmp/l.txt; }
  grep -E "^\| (Jacc|Dice)" /tmp/t.txt
  grep -E "cores, (gpu|cpu)" /tmp/l.txt | head -3 | sed 's/^/  first runs: /'
  cp /tmp/l.txt "$out/round$n.log"
done
