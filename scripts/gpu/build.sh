#!/usr/bin/env bash
# Build the GPU test binaries HERE (no CUDA needed), strip and compress them into carry/gpu/
# (git-ignored), with DataFusion's upstream .slt files they need, for scripts/gpu/run.sh to
# run on the GPU machine. Usage: scripts/gpu/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${CARRY:-carry/gpu}
rm -rf "$out" && mkdir -p "$out/upstream/array"
# --no-default-features: the CLI binary is not needed by these tests; `tuning`: the suites set
# measurement knobs and inject faults. FEATURES=all builds with --all-features instead (reuses
# the target directory of `cargo test --all-features`).
# The library's unit tests ride along: on the GPU machine they exercise the CPU kernels on its
# own processor (VP2INTERSECT, when it has it, which the development machine may not).
# The library's unit tests only with WITH_LIB_TESTS=1 (the carry limit is 64 MiB).
lib=""
[ "${WITH_LIB_TESTS:-0}" = 1 ] && lib="--lib"
# TESTS picks the test binaries (default: all eight).
features="--no-default-features --features cuda,tuning"
[ "${FEATURES:-}" = all ] && features="--all-features"
tests=${TESTS:-gpu_props gpu_sql backend_rule gpu_bm25 gpu_simjoin gpu_faults cancellation concurrency}
args=""
for t in $tests; do args="$args --test $t"; done
# XZ_LEVEL=-6 compresses faster (default -9e: smallest, minutes per binary on 2 cores).
# RELEASE=1 builds them optimised, dependencies included (for the benchmarks' numbers).
[ "${RELEASE:-0}" = 1 ] && args="$args --release"
cargo test $features $lib $args --no-run \
    --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_props", "gpu_sql", "backend_rule", "gpu_bm25", "gpu_simjoin", "gpu_faults", "cancellation", "concurrency"):
        print(m["target"]["name"], m["executable"])
    elif m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "datafusion_sets" and m["profile"]["test"]:
        print("lib_tests", m["executable"])
' | while read -r name exe; do
    strip -o "$out/$name" "$exe"
    xz -T0 ${XZ_LEVEL:--9e} -f "$out/$name"
done
# The SQL suites the binaries were built with.
cp -r sql-tests "$out/sql-tests"
cp scripts/gpu/run.sh "$out/run.sh"
# The benchmarks' data, when asked for: WITH_BENCH_DATA=1 (BM25, ~18 MB: gcide docs and the
# queries), WITH_SJ_DATA=1 (similarity join, ~8.5 MB: gcide_words sets).
if [ "${WITH_BENCH_DATA:-0}" = 1 ]; then
    mkdir -p "$out/bench-data/gcide" "$out/bench-data/queries"
    cp bench-data/gcide/docs.parquet "$out/bench-data/gcide/"
    cp bench-data/queries/queries.parquet "$out/bench-data/queries/"
fi
if [ "${WITH_SJ_DATA:-0}" = 1 ]; then
    mkdir -p "$out/bench-data/gcide_words"
    cp bench-data/gcide_words/sets.parquet "$out/bench-data/gcide_words/"
fi
# DataFusion's own array_intersect cases (read from cargo's registry here).
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/datafusion-sqllogictest-55.*/test_files | head -1)
cp "$src"/array/array_union.slt "$src"/array/arrays_zip.slt "$src"/array/*.slt.part "$out/upstream/array/"
# The device tool carries at most 64 MiB per call: past 60 MiB, the SQL binaries (the largest)
# move to a second folder, "${out}2", run by a second call (CARRY=${out}2 ... run.sh).
if [ "$(du -sm "$out" | cut -f1)" -gt 60 ]; then
    rm -rf "${out}2" && mkdir -p "${out}2"
    for b in gpu_sql backend_rule; do
        [ -f "$out/$b.xz" ] && mv "$out/$b.xz" "${out}2/"
    done
    cp -r "$out/sql-tests" "$out/upstream" "$out/run.sh" "${out}2/"
    echo "split: $out and ${out}2 (two device calls)"
    du -sh "${out}2"
fi
# Still past 60 MiB (every SQL-linked binary is ~23 MB): gpu_faults moves to "${out}3".
if [ "$(du -sm "$out" | cut -f1)" -gt 60 ] && [ -f "$out/gpu_faults.xz" ]; then
    rm -rf "${out}3" && mkdir -p "${out}3"
    mv "$out/gpu_faults.xz" "${out}3/"
    cp -r "$out/sql-tests" "$out/upstream" "$out/run.sh" "${out}3/"
    echo "split: also ${out}3 (a third device call)"
    du -sh "${out}3"
fi
ls -la "$out"
du -sh "$out"
