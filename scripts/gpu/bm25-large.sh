#!/usr/bin/env bash
# topk_bm25 on a corpus 40x gcide (benches/data/synth_corpus.py: 5.05 M documents, ~230 M
# tokens, gcide's term statistics), through the release dfsets on the GPU machine: the index
# built by bm25_index, then batches of 10,000 and 100,000 real terabyte05 queries, OR and AND
# top-10, `sets.backend` 'cpu' and 'gpu' alternated in one process, every GPU answer checked
# equal to the CPU's. The numbers go in benches/README.md.
# Here first: scripts/gpu/bm25-large.sh pack (needs the release dfsets, built with `cargo
# build --release --features cli --bin dfsets`, and benches/data/build.sh's data); then
# through the device tool: command `bash scripts/gpu/bm25-large.sh run`, carry
# ["carry/bm25-large"]. SCALE (default 40) sizes the corpus; ROUNDS (default 3) the
# alternations; BATCHES (default "q10k q100k") the query batches timed; GCIDE and QUERIES
# read gcide's documents and the queries from elsewhere (another carry's copy). Logs go to
# $OUT (or /tmp/gpu-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/bm25-large
case "${1:-}" in
pack)
    data=${SETS_BENCH_DATA:-bench-data}
    bin=${DFSETS:-${CARGO_TARGET_DIR:-target}/release/dfsets}
    rm -rf "$carry" && mkdir -p "$carry"
    strip -o "$carry/dfsets" "$bin" && xz -T0 -6 -f "$carry/dfsets"
    cp "$data/gcide/docs.parquet" "$carry/gcide_docs.parquet"
    cp "$data/queries/queries.parquet" "$carry/queries.parquet"
    du -sh "$carry"
    ;;
run)
    out=${OUT:-/tmp/gpu-out}
    work=/tmp/dfsets-bm25-large
    mkdir -p "$out" "$work"
    # DFSETS_BIN: a dfsets to run instead of the carried one (a dry run here).
    dfsets=${DFSETS_BIN:-$work/dfsets}
    if [ -z "${DFSETS_BIN:-}" ]; then
        python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
            "$carry/dfsets.xz" >"$dfsets"
        chmod +x "$dfsets"
    fi
    queries=${QUERIES:-$PWD/$carry/queries.parquet}
    scale=${SCALE:-40}
    corpus=$work/synth_${scale}x
    [ -f "$corpus/docs.parquet" ] ||
        python3 benches/data/synth_corpus.py --scale "$scale" --gcide "${GCIDE:-$carry/gcide_docs.parquet}" --out "$corpus"
    sql=$work/bench.sql
    {
        echo "CREATE EXTERNAL TABLE docs STORED AS PARQUET LOCATION '$corpus/docs.parquet';"
        echo "CREATE EXTERNAL TABLE queries STORED AS PARQUET LOCATION '$queries';"
        # 100,000 queries: the 50,000 terabyte05 efficiency queries twice.
        echo "CREATE TABLE tb AS SELECT text FROM queries WHERE source = 'terabyte05-eff' ORDER BY qid;"
        echo "CREATE TABLE q100k AS SELECT row_number() OVER () AS n, text FROM (SELECT * FROM tb UNION ALL SELECT * FROM tb);"
        echo "CREATE TABLE q10k AS SELECT * FROM q100k WHERE n <= 10000;"
        echo "SELECT count(*) FROM q10k; SELECT count(*) FROM q100k;"
        echo "SELECT 'index build next' AS run;"
        echo "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'text');"
        echo "SELECT count(*) AS terms, sum(cardinality(doc_ids)) AS postings FROM idx WHERE term IS NOT NULL;"
        # EXPLAIN=1: EXPLAIN ANALYZE of the 10,000-query batches (after a warm-up of each
        # backend) instead of the timed rounds: where the time goes.
        batches=${BATCHES:-q10k q100k}
        [ "${EXPLAIN:-0}" = 1 ] && batches=""
        for mode in or and; do
            [ "${EXPLAIN:-0}" = 1 ] || break
            for b in cpu gpu; do
                echo "SET sets.backend = '$b';"
                echo "SELECT sum(cardinality(topk_bm25('idx', text, 10, '$mode'))) FROM q10k;"
                echo "EXPLAIN ANALYZE SELECT sum(cardinality(topk_bm25('idx', text, 10, '$mode'))) FROM q10k;"
            done
        done
        for q in $batches; do
            for mode in or and; do
                # Warm-up: the first GPU query uploads the index; each backend once.
                for b in cpu gpu; do
                    echo "SET sets.backend = '$b';"
                    echo "CREATE TABLE ${q}_${mode}_$b AS SELECT n, topk_bm25('idx', text, 10, '$mode') AS hits FROM $q;"
                done
                # Hits of one backend missing from the other's answer, both ways: must be 0.
                echo "SELECT '$q $mode gpu == cpu' AS run, count(*) AS differ FROM (SELECT n, unnest(hits) AS h FROM ${q}_${mode}_cpu EXCEPT SELECT n, unnest(hits) AS h FROM ${q}_${mode}_gpu);"
                echo "SELECT '$q $mode cpu == gpu' AS run, count(*) AS differ FROM (SELECT n, unnest(hits) AS h FROM ${q}_${mode}_gpu EXCEPT SELECT n, unnest(hits) AS h FROM ${q}_${mode}_cpu);"
                for r in $(seq 1 "${ROUNDS:-3}"); do
                    for b in cpu gpu; do
                        echo "SET sets.backend = '$b';"
                        echo "SELECT '$q $mode $b round $r' AS run, sum(cardinality(topk_bm25('idx', text, 10, '$mode'))) AS hits FROM $q;"
                    done
                done
            done
        done
    } >"$sql"
    {
        nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
        grep -m1 "model name" /proc/cpuinfo
        nproc
        cat "$corpus/stats.json"
        "$dfsets" -f "$sql"
    } 2>&1 | tee "$out/bm25-large.log"
    ;;
*)
    echo "usage: $0 pack | run" >&2
    exit 2
    ;;
esac
