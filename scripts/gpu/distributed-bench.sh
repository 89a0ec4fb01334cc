#!/usr/bin/env bash
# The similarity join on 1, 2 and 4 datafusion-distributed workers (processes on 127.0.0.1,
# THREADS tokio threads each) against one process, on the GPU machine's 16-core host
# (benches/distributed.rs; the numbers go in benches/README.md).
# Here first: scripts/gpu/distributed-bench.sh pack (builds the release bench binary with the
# `distributed` feature; benches/data/build.sh's data); then through the device tool: command
# `bash scripts/gpu/distributed-bench.sh run`, carry ["carry/distributed"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/distributed
case "${1:-}" in
pack)
    data=${SETS_BENCH_DATA:-bench-data}
    rm -rf "$carry" && mkdir -p "$carry"
    exe=$(cargo bench --features distributed --bench distributed --no-run --message-format=json 2>/dev/null \
        | python3 -c 'import json,sys
for l in sys.stdin:
    try: m = json.loads(l)
    except ValueError: continue
    if m.get("reason") == "compiler-artifact" and m.get("executable") and m["target"]["name"] == "distributed":
        print(m["executable"])')
    strip -o "$carry/distributed" "$exe" && xz -T0 -6 -f "$carry/distributed"
    cp "$data/gcide_words/sets.parquet" "$carry/gcide_words.parquet"
    du -sh "$carry"
    ;;
run)
    tmp=/tmp/dfsets-distributed && mkdir -p "$tmp"
    bin=$tmp/distributed
    python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
        "$carry/distributed.xz" >"$bin"
    chmod +x "$bin"
    grep -m1 "model name" /proc/cpuinfo
    nproc
    threads=${THREADS:-4}
    "$bin" scale "$carry/gcide_words.parquet" 1 "$tmp/x1.parquet"
    "$bin" scale "$carry/gcide_words.parquet" 8 "$tmp/x8.parquet"
    sql="SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', 'jaccard', ${THRESHOLD:-0.5})"
    for data in ${DATASETS:-x1 x8}; do
        for t in "$threads" 16; do
            echo "== $data: one process, $t threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" local "$tmp/$data.parquet" "$t" "$sql" || echo "(timed out or failed)"
        done
        for w in 1 2 4; do
            ports=""
            pids=""
            for i in $(seq 1 "$w"); do
                port=$((50100 + i))
                "$bin" worker "$port" "$threads" &
                pids="$pids $!"
                ports="$ports${ports:+,}$port"
            done
            sleep 2
            for d in ${DISTRIBUTIONS:-broadcast prefix}; do
                echo "== $data: $w workers x $threads threads, $d"
                timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$tmp/$data.parquet" "$threads" "$d" "$ports" "$sql" \
                    || echo "(timed out or failed)"
            done
            kill $pids 2>/dev/null || true
            wait 2>/dev/null || true
        done
    done
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
