#!/usr/bin/env bash
# On the GPU machine: the SQL suites with sets.backend = 'gpu' (tests/gpu_sql.rs) and the
# similarity join's GPU tests, from a carried folder:
#   CARRY=carry/gsql bash scripts/gpu/sql-suite.sh
# CARRY holds gpu_sql.xz (and optionally gpu_simjoin.xz, gpu_props.xz): stripped release test
# binaries (`cargo bench --no-run --test gpu_sql --test gpu_simjoin`), sql-tests/ (a copy of the
# repository's) and upstream/ (DataFusion's test_files/array/ files the suite runs).
set -uo pipefail
c=${CARRY:-carry/gsql}; mkdir -p /tmp/b
export DFSETS_REQUIRE_GPU=1 RUST_BACKTRACE=1
export DFSETS_UPSTREAM_SLT="$PWD/$c/upstream" DFSETS_SQL_TESTS="$PWD/$c/sql-tests"
for f in "$c"/*.xz; do b=/tmp/b/$(basename "$f" .xz); xz -dc "$f" >"$b"; chmod +x "$b"; done
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; grep -m1 "model name" /proc/cpuinfo
status=0
echo "== gpu_sql"; /tmp/b/gpu_sql 2>&1 | tail -16 || status=1
if [ -x /tmp/b/gpu_simjoin ]; then
  echo "== gpu_simjoin"; /tmp/b/gpu_simjoin --test-threads=1 2>&1 | grep -E "^test |test result|panicked" || status=1
fi
if [ -x /tmp/b/gpu_props ]; then
  echo "== gpu_props"; /tmp/b/gpu_props --test-threads=1 2>&1 | grep -E "^test |test result|panicked" || status=1
fi
exit $status
