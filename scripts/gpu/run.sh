#!/usr/bin/env bash
# On the GPU machine (after scripts/gpu/build.sh here): every GPU test, then the benchmark.
# Through the device tool: command `bash scripts/gpu/run.sh`, carry ["carry/gpu"].
# Logs go to $OUT (or /tmp/gpu-out).
# CARRY names the carried folder (default carry/gpu, relative to the repository root, where
# the command runs); without it the script changes to the root of its own checkout.
set -uo pipefail
[ -n "${CARRY:-}" ] || cd "$(dirname "$0")/../.."
carry=${CARRY:-carry/gpu}
out=${OUT:-/tmp/gpu-out}
mkdir -p "$out" /tmp/gpubin
export DFSETS_REQUIRE_GPU=1 RUST_BACKTRACE=1
# A kernel cache of its own, empty at the start: the first binary compiles, the rest load.
export DFSETS_KERNEL_CACHE=${DFSETS_KERNEL_CACHE:-/tmp/dfsets-kernels-$$}
export DFSETS_UPSTREAM_SLT="$PWD/$carry/upstream" DFSETS_SQL_TESTS="$PWD/$carry/sql-tests"
for f in "$carry"/*.xz; do
    b=/tmp/gpubin/$(basename "$f" .xz)
    if command -v xz >/dev/null; then xz -dc "$f" >"$b"; else python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" "$f" >"$b"; fi
    chmod +x "$b"
done
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv | tee "$out/device.txt"
status=0
echo "== the CPU kernels' unit tests on this machine's processor"
grep -m1 "model name" /proc/cpuinfo | tee "$out/cpu.txt"
grep -qw avx512_vp2intersect /proc/cpuinfo && echo "VP2INTERSECT: yes" | tee -a "$out/cpu.txt" || echo "VP2INTERSECT: no" | tee -a "$out/cpu.txt"
if [ -x /tmp/gpubin/lib_tests ]; then /tmp/gpubin/lib_tests backend::cpu optimizer functions:: 2>&1 | tee "$out/lib_tests.log" | tail -3 || status=1; else echo "lib_tests not carried"; fi
# Each step runs when its binary was carried (scripts/gpu/build.sh TESTS=...).
have() { [ -x "/tmp/gpubin/$1" ] || { echo "($1 not carried)"; return 1; }; }
if have gpu_bm25; then
    echo "== topk_bm25: GPU == CPU pruned == exhaustive"
    /tmp/gpubin/gpu_bm25 --test-threads=1 2>&1 | tee "$out/gpu_bm25.log" || status=1
    echo "== the same with nearly every query split into pieces of 16 (bm25_merge)"
    DFSETS_BM25_PIECE=16 /tmp/gpubin/gpu_bm25 --test-threads=1 2>&1 | tee "$out/gpu_bm25_pieces.log" || status=1
fi
if have gpu_simjoin; then
    echo "== similarity_join: GPU join == GPU verification == CPU == nested loop"
    /tmp/gpubin/gpu_simjoin --test-threads=1 --nocapture 2>&1 | tee "$out/gpu_simjoin.log" || status=1
    echo "== the same joins with at most 64 pairs a device call (ranges split, big probes on the CPU)"
    DFSETS_SJ_DEVICE_PAIRS=64 /tmp/gpubin/gpu_simjoin --test-threads=1 --nocapture sql_gpu_equals 2>&1 | tee "$out/gpu_simjoin_small.log" || status=1
fi
if have gpu_faults; then
    echo "== injected faults (no driver / NVRTC / device, compile error, out of memory, kernel fault): CPU answers"
    /tmp/gpubin/gpu_faults --nocapture 2>&1 | tee "$out/gpu_faults.log" || status=1
fi
if have cancellation; then
    echo "== cancellation with sets.backend = 'gpu', then 'cpu', on this host's cores: control back within 1 s"
    for b in gpu cpu; do
        SETS_TEST_BACKEND=$b SETS_CANCEL_BACK_MS=1000 /tmp/gpubin/cancellation --nocapture 2>&1 | tee "$out/cancellation_$b.log" || status=1
    done
fi
if have concurrency; then
    echo "== concurrent queries with sets.backend = 'gpu' == serial CPU answers"
    SETS_TEST_BACKEND=gpu /tmp/gpubin/concurrency --nocapture 2>&1 | tee "$out/concurrency_gpu.log" || status=1
fi
if have gpu_props; then
    echo "== property tests (GPU == CPU)"
    /tmp/gpubin/gpu_props --test-threads=1 2>&1 | tee "$out/gpu_props.log" || status=1
    echo "== the same with launch groups of 16 MiB (batches split into several groups)"
    DFSETS_GPU_LAUNCH_BYTES=16777216 /tmp/gpubin/gpu_props --test-threads=1 engine_ gpu_equals_cpu_on_random 2>&1 | tee "$out/gpu_props_groups.log" || status=1
    echo "== the same with the input staged in 4 KiB pieces (many copies overlapping the staging)"
    DFSETS_GPU_STAGE_PIECE=4096 /tmp/gpubin/gpu_props --test-threads=1 engine_ gpu_equals_cpu_on_random 2>&1 | tee "$out/gpu_props_pieces.log" || status=1
fi
if have gpu_sql; then
    echo "== SQL suites with sets.backend = 'gpu'"
    /tmp/gpubin/gpu_sql 2>&1 | tee "$out/gpu_sql.log" || status=1
fi
if have backend_rule; then
    echo "== the backend rule: EXPLAIN ANALYZE shows the GPU's counters"
    /tmp/gpubin/backend_rule 2>&1 | tee "$out/backend_rule.log" || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && have gpu_props; then
    echo "== benchmark: list_intersect"
    # GPU_PROPS_BENCH picks the benchmarks by name (default: all: bench_gpu_intersect,
    # bench_batch_rows, bench_auto_rows, bench_resident_columns).
    DFSETS_BENCH_OUT="$out/bench.txt" /tmp/gpubin/gpu_props --ignored --nocapture --test-threads=1 "${GPU_PROPS_BENCH:-bench}" 2>&1 | tee "$out/bench.log" || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -d "$carry/bench-data" ] && have gpu_bm25; then
    echo "== benchmark: topk_bm25 (gcide, 10,000 terabyte05-eff queries)"
    nproc | sed 's/^/cores: /' | tee -a "$out/cpu.txt"
    DFSETS_BENCH_DATA="$carry/bench-data" DFSETS_BENCH_OUT="$out/bench_bm25.txt" \
        /tmp/gpubin/gpu_bm25 --ignored --nocapture bench 2>&1 | tee "$out/bench_bm25.log" || status=1
fi
if [ "${SKIP_BENCH:-0}" != 1 ] && [ -f "$carry/bench-data/gcide_words/sets.parquet" ] && have gpu_simjoin; then
    # BASE=carry/gpuB (a folder built the same way from an earlier commit, gpu_simjoin only):
    # its benchmark runs first, on the same data, for a side-by-side comparison.
    if [ -n "${BASE:-}" ] && [ -f "$BASE/gpu_simjoin.xz" ]; then
        echo "== benchmark: similarity_join, the base binary ($BASE)"
        mkdir -p /tmp/gpubin-base
        xz -dc "$BASE/gpu_simjoin.xz" >/tmp/gpubin-base/gpu_simjoin && chmod +x /tmp/gpubin-base/gpu_simjoin
        DFSETS_BENCH_EXPLAIN=1 DFSETS_BENCH_DATA="$carry/bench-data" DFSETS_BENCH_OUT="$out/bench_simjoin_base.txt" \
            /tmp/gpubin-base/gpu_simjoin --ignored --nocapture bench 2>&1 | tee "$out/bench_simjoin_base.log" || status=1
    fi
    echo "== benchmark: similarity_join (gcide_words, Jaccard and Dice 0.5)"
    DFSETS_BENCH_EXPLAIN=1 DFSETS_BENCH_DATA="$carry/bench-data" DFSETS_BENCH_OUT="$out/bench_simjoin.txt" \
        /tmp/gpubin/gpu_simjoin --ignored --nocapture bench 2>&1 | tee "$out/bench_simjoin.log" || status=1
    # SJ_ENVS="LANES=4 LARGE_FROM=512": the benchmark again once per entry, DFSETS_SJ_<entry> set.
    for v in ${SJ_ENVS:-}; do
        tag=$(echo "$v" | tr '=/.' '___')
        echo "== benchmark: similarity_join with DFSETS_SJ_$v"
        env "DFSETS_SJ_$v" DFSETS_BENCH_ONE_CORE=0 DFSETS_BENCH_DATA="$carry/bench-data" DFSETS_BENCH_OUT="$out/bench_simjoin_$tag.txt" \
            /tmp/gpubin/gpu_simjoin --ignored --nocapture bench >"$out/bench_simjoin_$tag.log" 2>&1 || status=1
        tail -3 "$out/bench_simjoin_$tag.txt" 2>/dev/null
    done
fi
# Kernel variants A/B: BM25_ENVS="TILE=1024 TILE=512" runs the BM25 tests and benchmark
# again once per entry with DFSETS_BM25_<entry> set (BM25_TILES="1024 512" = TILE=... entries).
variants="${BM25_ENVS:-}"
for tile in ${BM25_TILES:-}; do variants="$variants TILE=$tile"; done
for v in $variants; do
    if have gpu_bm25; then
        tag=$(echo "$v" | tr '=/.' '___')
        echo "== topk_bm25 with DFSETS_BM25_$v"
        env "DFSETS_BM25_$v" /tmp/gpubin/gpu_bm25 --test-threads=1 2>&1 | tee "$out/gpu_bm25_$tag.log" | tail -3 || status=1
        if [ -d "$carry/bench-data" ]; then
            env "DFSETS_BM25_$v" DFSETS_BENCH_DATA="$carry/bench-data" DFSETS_BENCH_OUT="$out/bench_bm25_$tag.txt" \
                /tmp/gpubin/gpu_bm25 --ignored --nocapture bench >"$out/bench_bm25_$tag.log" 2>&1 || status=1
            head -9 "$out/bench_bm25_$tag.txt" 2>/dev/null
        fi
    fi
done
if [ "${SKIP_SANITIZER:-0}" != 1 ] && command -v compute-sanitizer >/dev/null; then
    echo "== compute-sanitizer memcheck on the engine tests"
    if have gpu_props; then
        timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_props --test-threads=1 engine_ 2>&1 | tail -15 | tee "$out/memcheck.log" || status=1
        echo "== compute-sanitizer racecheck on the list kernels (shared memory, ballots)"
        timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/gpubin/gpu_props --test-threads=1 engine_ 2>&1 | tail -6 | tee "$out/racecheck.log" || status=1
    fi
    if have gpu_simjoin; then
        echo "== compute-sanitizer memcheck and racecheck on the similarity-join kernels"
        timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_simjoin --test-threads=1 engine_ 2>&1 | tail -6 | tee "$out/memcheck_simjoin.log" || status=1
        timeout 150 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/gpubin/gpu_simjoin --test-threads=1 engine_ 2>&1 | tail -6 | tee "$out/racecheck_simjoin.log" || status=1
        # probe_join (the whole join on the device) through one SQL join.
        timeout 150 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_simjoin --test-threads=1 explain_analyze 2>&1 | tail -6 | tee "$out/memcheck_probe_join.log" || status=1
    fi
    if have gpu_bm25; then
        echo "== compute-sanitizer memcheck and racecheck on the BM25 kernel"
        timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_bm25 --test-threads=1 resident 2>&1 | tail -6 | tee "$out/memcheck_bm25.log" || status=1
        timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/gpubin/gpu_bm25 --test-threads=1 resident 2>&1 | tail -6 | tee "$out/racecheck_bm25.log" || status=1
        echo "== the same with nearly every query split into pieces of 16 (bm25_merge)"
        DFSETS_BM25_PIECE=16 timeout 100 compute-sanitizer --tool memcheck --error-exitcode 9 /tmp/gpubin/gpu_bm25 --test-threads=1 resident 2>&1 | tail -6 | tee "$out/memcheck_bm25_pieces.log" || status=1
        DFSETS_BM25_PIECE=16 timeout 100 compute-sanitizer --tool racecheck --error-exitcode 9 /tmp/gpubin/gpu_bm25 --test-threads=1 resident 2>&1 | tail -6 | tee "$out/racecheck_bm25_pieces.log" || status=1
    fi
fi
echo "== summary"
grep -E "^test result|passed|FAIL" "$out"/*.log | tail -14
cat "$out/bench.txt" "$out/bench.txt.batch_rows" "$out/bench.txt.auto_rows" "$out/bench.txt.resident" "$out/bench_bm25.txt" "$out/bench_simjoin_base.txt" "$out/bench_simjoin.txt" 2>/dev/null
exit $status
