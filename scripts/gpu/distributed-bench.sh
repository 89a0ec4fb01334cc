#!/usr/bin/env bash
# The similarity join, the index build and 10,000 searches on 1, 2 and 4 datafusion-distributed
# workers (processes on 127.0.0.1, THREADS tokio threads each) against one process, on the GPU
# machine's 16-core host (benches/distributed.rs; the numbers go in benches/README.md).
# PARTS picks what runs (default: "join search"; "shards": the search over a sharded index).
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
    cp "$data/gcide/docs.parquet" "$carry/gcide_docs.parquet"
    cp "$data/queries/queries.parquet" "$carry/queries.parquet"
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
    # workers N [DATA]: N workers on ports 50101.., their ports in $ports, pids in $pids.
    workers() {
        ports=""
        pids=""
        for i in $(seq 1 "$1"); do
            port=$((50100 + i))
            "$bin" worker "$port" "$threads" "${2:-}" &
            pids="$pids $!"
            ports="$ports${ports:+,}$port"
        done
        sleep 2
    }
    stop() {
        kill $pids 2>/dev/null || true
        wait 2>/dev/null || true
    }
    if [[ " ${PARTS:-join search} " == *" search "* ]]; then
        docs="docs=$carry/gcide_docs.parquet"
        "$bin" local "$docs" 16 \
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text')) TO '$tmp/idx.parquet' STORED AS PARQUET" >/dev/null
        search="idx=$tmp/idx.parquet,queries=$carry/queries.parquet"
        build="SELECT count(*), sum(cardinality(doc_ids)), max(n_docs), max(total_len) FROM bm25_index('docs', 'doc_id', 'text')"
        # 10,000 queries (every fifth terabyte05 efficiency-track query), top 10 each.
        topk="SELECT sum(cardinality(hits)), sum(hits[1]['doc_id']) FROM (SELECT topk_bm25('idx', text, 10) AS hits FROM queries WHERE source = 'terabyte05-eff' AND CAST(qid AS BIGINT) % 5 = 0)"
        for t in "$threads" 16; do
            echo "== index build: one process, $t threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" local "$docs" "$t" "$build" || echo "(timed out or failed)"
            echo "== 10,000 searches: one process, $t threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" local "$search" "$t" "$topk" || echo "(timed out or failed)"
        done
        for w in 1 2 4; do
            workers "$w" "$search"
            echo "== index build: $w workers x $threads threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$docs" "$threads" auto "$ports" "$build" || echo "(timed out or failed)"
            echo "== 10,000 searches: $w workers x $threads threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$search" "$threads" auto "$ports" "$topk" || echo "(timed out or failed)"
            stop
        done
    fi
    if [[ " ${PARTS:-join search} " == *" shards "* ]]; then
        # 10,000 searches over the index in SHARDS shards (default 16), shard by shard: as one
        # Parquet file (each query shuffles its rows by shard) and Hive-partitioned by shard
        # (read with preserve_file_partitions: no shuffle); one process ranks the same table
        # whole ('single', its load cached) and shard by shard ('shards').
        docs="docs=$carry/gcide_docs.parquet"
        shards=${SHARDS:-16}
        BENCH_RUNS=1 "$bin" local "$docs" 16 \
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'shards=$shards')) TO '$tmp/idx_sh.parquet' STORED AS PARQUET" >/dev/null
        # One run: every COPY into a directory adds files beside the last ones.
        rm -rf "$tmp/idx_hive" && BENCH_RUNS=1 "$bin" local "$docs" 16 \
            "COPY (SELECT * FROM bm25_index('docs', 'doc_id', 'text', 'shards=$shards')) TO '$tmp/idx_hive/' STORED AS PARQUET PARTITIONED BY (shard)" >/dev/null
        q="queries=$carry/queries.parquet"
        sh="idx=$tmp/idx_sh.parquet,$q"
        hive="idx=$tmp/idx_hive/,$q"
        # The answer in integers (a sum of floats depends on the order the partitions add in).
        topk="SELECT count(*), sum(cardinality(hits)), sum(hits[1]['doc_id']), sum(CAST(hits[10]['score'] * 1e9 AS BIGINT)) FROM (SELECT topk_bm25('idx', text, 10) AS hits FROM queries WHERE source = 'terabyte05-eff' AND CAST(qid AS BIGINT) % 5 = 0)"
        preserve="SET datafusion.optimizer.preserve_file_partitions = 1"
        for t in "$threads" 16; do
            for d in single shards; do
                echo "== sharded search: one process, $t threads, $d"
                BENCH_SETTINGS="SET sets.topk_bm25_distribution = '$d'" \
                    timeout "${RUN_TIMEOUT:-180}" "$bin" local "$sh" "$t" "$topk" || echo "(timed out or failed)"
            done
            echo "== sharded search, Hive-partitioned: one process, $t threads, shards"
            BENCH_SETTINGS="$preserve; SET sets.topk_bm25_distribution = 'shards'" \
                timeout "${RUN_TIMEOUT:-180}" "$bin" local "$hive" "$t" "$topk" || echo "(timed out or failed)"
        done
        for w in 1 2 4; do
            workers "$w" "$q"
            echo "== sharded search: $w workers x $threads threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$sh" "$threads" auto "$ports" "$topk" || echo "(timed out or failed)"
            echo "== sharded search, Hive-partitioned: $w workers x $threads threads"
            BENCH_SETTINGS="$preserve" \
                timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$hive" "$threads" auto "$ports" "$topk" || echo "(timed out or failed)"
            stop
        done
    fi
    [[ " ${PARTS:-join search} " == *" join "* ]] || exit 0
    "$bin" scale "$carry/gcide_words.parquet" 1 "$tmp/x1.parquet"
    "$bin" scale "$carry/gcide_words.parquet" 8 "$tmp/x8.parquet"
    sql="SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', 'jaccard', ${THRESHOLD:-0.5})"
    for data in ${DATASETS:-x1 x8}; do
        for t in "$threads" 16; do
            echo "== $data: one process, $t threads"
            timeout "${RUN_TIMEOUT:-180}" "$bin" local "$tmp/$data.parquet" "$t" "$sql" || echo "(timed out or failed)"
        done
        for w in 1 2 4; do
            workers "$w"
            for d in ${DISTRIBUTIONS:-broadcast prefix}; do
                echo "== $data: $w workers x $threads threads, $d"
                timeout "${RUN_TIMEOUT:-180}" "$bin" cluster "$tmp/$data.parquet" "$threads" "$d" "$ports" "$sql" \
                    || echo "(timed out or failed)"
            done
            stop
        done
    done
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
