#!/usr/bin/env bash
# Two release dfsets side by side on the GPU machine's 16-core host: the similarity join
# through SQL (scripts/sql-self-join.sh: the SQL self-join, its R-S form and the table
# function, each 6 times in one session, the fastest 5 in ms) on gcide_words J >= 0.5, at 16
# and 4 partitions, the two binaries alternating, two rounds.
# Here first: DFSETS_A=<dfsets> DFSETS_B=<dfsets> scripts/gpu/join-ab.sh pack (each built with
# `cargo build --release --features cli --bin dfsets`; benches/data/build.sh's data); then
# through the device tool: command `bash scripts/gpu/join-ab.sh run`, carry ["carry/join-ab"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/join-ab
case "${1:-}" in
pack)
    data=${SETS_BENCH_DATA:-bench-data}
    # Two binaries and one data set: the carry limit is 64 MiB.
    rm -rf "$carry" && mkdir -p "$carry/gcide_words"
    for v in A B; do
        bin_var=DFSETS_$v
        strip -o "$carry/dfsets_$v" "${!bin_var}" && xz -T0 -9e -f "$carry/dfsets_$v"
    done
    cp "$data/gcide_words/sets.parquet" "$carry/gcide_words/"
    du -sh "$carry"
    ;;
run)
    for v in A B; do
        python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
            "$carry/dfsets_$v.xz" >"/tmp/dfsets_$v"
        chmod +x "/tmp/dfsets_$v"
    done
    grep -m1 "model name" /proc/cpuinfo
    nproc
    for p in 16 4; do
        for round in 1 2; do
            for v in A B; do
                echo "== $v, round $round"
                DFSETS=/tmp/dfsets_$v scripts/sql-self-join.sh "$carry/gcide_words/sets.parquet" 0.5 "$p"
            done
        done
    done
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
