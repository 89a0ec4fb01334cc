#!/usr/bin/env bash
# Build the GPU test binaries HERE (no CUDA needed), strip and compress them into carry/gpu/
# (git-ignored), with DataFusion's upstream .slt files they need, for scripts/gpu/run.sh to
# run on the GPU machine. Usage: scripts/gpu/build.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
out=carry/gpu
rm -rf "$out" && mkdir -p "$out/upstream/array"
# --no-default-features: the CLI binary is not needed by these tests.
# The library's unit tests ride along: on the GPU machine they exercise the CPU kernels on its
# own processor (VP2INTERSECT, when it has it, which the development machine may not).
cargo test --no-default-features --features cuda --lib --test gpu_props --test gpu_sql --test backend_rule --no-run \
    --message-format=json 2>/dev/null \
  | python3 -c '
import json, sys
for line in sys.stdin:
    try: m = json.loads(line)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] in ("gpu_props", "gpu_sql", "backend_rule"):
        print(m["target"]["name"], m["executable"])
    elif m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "datafusion_sets" and m["profile"]["test"]:
        print("lib_tests", m["executable"])
' | while read -r name exe; do
    strip -o "$out/$name" "$exe"
    xz -T0 -1 -f "$out/$name"
done
# The SQL suites the binaries were built with.
cp -r sql-tests "$out/sql-tests"
# DataFusion's own array_intersect cases (read from cargo's registry here).
src=$(ls -d "${CARGO_HOME:-$HOME/.cargo}"/registry/src/*/datafusion-sqllogictest-55.*/test_files | head -1)
cp "$src"/array/array_union.slt "$src"/array/arrays_zip.slt "$src"/array/*.slt.part "$out/upstream/array/"
ls -la "$out"
du -sh "$out"
