#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu/build.sh here): every GPU test, then the benchmark.
# Through the device tool: command `bash scripts/gpu/run.sh`, carry ["carry/gpu"].
# Logs go to $OUT (or /tmp/gpu-out).
set -uo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /tmp/gpubin
export DFSETS_REQUIRE_GPU=1 RUST_BACKTRACE=1
export DFSETS_UPSTREAM_SLT="$PWD/carry/gpu/upstream" DFSETS_SQL_TESTS="$PWD/carry/gpu/sql-tests"
for f in carry/gpu/*.xz; do
    b=/tmp/gpubin/$(basename "$f" .xz)
    if command -v xz >/dev/null; then xz -dc "$f" >"$b"; else python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" >"$b"; fi
    chmod +x "$b"
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
status=0
echo "== the CPU kernels' unit tests on this machine's processor"
grep -m1 "model name" /proc/cpuinfo | tee "$out/cpu.txt"
grep -qw avx512_vp2intersect /proc/cpuinfo && echo "VP2INTERSECT: yes" | tee -a "$out/cpu.txt" || echo "VP2INTERSECT: no" | tee -a "$out/cpu.txt"
if [ -x /tmp/gpubin/lib_tests ]; then /tmp/gpubin/lib_tests backend::cpu optimizer 2>&1 | tee "$out/lib_tests.log" | tail -3 || status=1; else echo "lib_tests not carried"; fi
echo "== property tests (GPU == CPU)"
/tmp/gpubin/gpu_props --test-threads=1 2>&1 | tee "$out/gpu_props.log" || status=1
echo "== SQL suites with sets.backend = 'gpu'"
/tmp/gpubin/gpu_sql 2>&1 | tee "$out/gpu_sql.log" || status=1
echo "== the backend rule: EXPLAIN ANALYZE shows the GPU's counters"
/tmp/gpubin/backend_rule 2>&1 | tee "$out/backend_rule.log" || status=1
if [ "${SKIP_BENCH:-0}" != 1 ]; then
    echo "== benchmark"
    DFSETS_BENCH_OUT="$out/bench.txt" /tmp/gpubin/gpu_props --ignored --nocapture bench 2>&1 | tee "$out/bench.log" || status=1
fi
if command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck on the engine tests"
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_props --test-threads=1 engine_ 2>&1 | tail -15 | tee "$out/memcheck.log" || status=1
fi
echo "== summary"
grep -E "^test result|passed|FAIL" "$out/gpu_props.log" "$out/gpu_sql.log" "$out/backend_rule.log" | tail -10
cat "$out/bench.txt" 2>/dev/null
exit $status
