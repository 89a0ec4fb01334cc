#!/usr/bin/env bash
# Two builds of the distributed bench binary (benches/distributed.rs, `cargo bench --features
# distributed --bench distributed --no-run`), A and B, each with its own workers on
# 127.0.0.1, running the same spread similarity join in turns (ROUNDS times each; each run
# prints the best of its 3 runs, the answer, and the join's metrics):
#   DIST_A=<binary> DIST_B=<binary> scripts/distributed-join-ab.sh <sets.parquet> [workers] [threads]
# Env: DISTRIBUTION (prefix), MEASURE (jaccard), THRESHOLD (0.5), ROUNDS (2).
set -euo pipefail
file=$1 workers=${2:-2} threads=${3:-1}
sql="SELECT count(*) FROM similarity_join('sets', 'id', 'tokens', '${MEASURE:-jaccard}', ${THRESHOLD:-0.5})"
run() {
    local bin=$1 pids="" ports=""
    for i in $(seq 1 "$workers"); do
        "$bin" worker $((50200 + i)) "$threads" >/dev/null 2>&1 &
        pids="$pids $!"
        ports="$ports${ports:+,}$((50200 + i))"
    done
    sleep 2
    "$bin" cluster "$file" "$threads" "${DISTRIBUTION:-prefix}" "$ports" "$sql" 2>&1 \
        | grep -E "best_ms|SimilarityJoinExec" | sed -E 's/output_bytes.*candidates/candidates/; s/gpu_chunks.*verified/verified/; s/, gpu_call_time.*//' | cut -c1-400
    kill $pids 2>/dev/null || true
    wait $pids 2>/dev/null || true
}
for round in $(seq 1 "${ROUNDS:-2}"); do
    for side in A B; do
        bin_var=DIST_$side
        echo "== round $round, $side: ${!bin_var}"
        run "${!bin_var}"
    done
done
