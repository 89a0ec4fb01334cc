#!/usr/bin/env bash
# On the GPU machine: the Unicode tokenizer against the ASCII one (bm25_index on gcide) and
# the string similarity join against the integer one (gcide_words J >= 0.5, on the CPU and
# on the GPU, each checked equal to the CPU integer join), through the release dfsets.
# Here first: scripts/gpu/strings.sh pack (builds nothing: needs the release dfsets, built
# with `cargo build --release --features cli --bin dfsets`, and benches/data/build.sh's data);
# then through the device tool: command `bash scripts/gpu/strings.sh run`, carry
# ["carry/strings"]. Logs go to $OUT (or /tmp/gpu-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/strings
case "${1:-}" in
pack)
    data=${SETS_BENCH_DATA:-bench-data}
    bin=${DFSETS:-${CARGO_TARGET_DIR:-target}/release/dfsets}
    rm -rf "$carry" && mkdir -p "$carry/data/gcide" "$carry/data/gcide_words"
    strip -o "$carry/dfsets" "$bin" && xz -T0 -6 -f "$carry/dfsets"
    cp "$data/gcide/docs.parquet" "$carry/data/gcide/"
    cp "$data/gcide_words/sets.parquet" "$data/gcide_words/tokens.parquet" "$carry/data/gcide_words/"
    du -sh "$carry"
    ;;
run)
    out=${OUT:-/tmp/gpu-out}
    mkdir -p "$out"
    export DFSETS=/tmp/dfsets
    python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
        "$carry/dfsets.xz" >"$DFSETS"
    chmod +x "$DFSETS"
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
        grep -m1 "model name" /proc/cpuinfo
        nproc
        for p in 16 1; do
            scripts/tokenizer-speed.sh "$carry/data/gcide/docs.parquet" "$p"
            scripts/tokenizer-speed.sh "$carry/data/gcide/docs.parquet" "$p" 'stem=english'
        done
        for b in cpu gpu; do scripts/string-join.sh "$carry/data" 0.5 16 "$b"; done
        scripts/string-join.sh "$carry/data" 0.5 1 cpu
    } 2>&1 | tee "$out/strings.log"
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
