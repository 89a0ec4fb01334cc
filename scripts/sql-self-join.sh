#!/bin/bash
# The SQL self-join against its R-S form and the table function, side by side in one run:
#   scripts/sql-self-join.sh <sets.parquet> <jaccard threshold> <target_partitions>
# Each form runs 6 times in one dfsets session; the fastest 5 `Elapsed` times are printed
# (ms), with the pair count. The R-S form is the same self-join with a one-sided no-op
# conjunct (`b.id IS NOT NULL`: the ids are never NULL), which makes the two sides different
# data to the rewrite: the plan a self-join over files got before `same_data` knew files.
# Needs the release CLI: cargo build --release --bin dfsets.
set -euo pipefail
bin=${DFSETS:-${CARGO_TARGET_DIR:-target}/release/dfsets}
file=$1 t=$2 p=$3
sql=$(mktemp --suffix=.sql)
trap 'rm -f "$sql"' EXIT
form() {
  {
    echo "SET datafusion.execution.target_partitions = $p;"
    echo "CREATE EXTERNAL TABLE s STORED AS PARQUET LOCATION '$file';"
    for _ in 1 2 3 4 5 6; do echo "$2;"; done
  } >"$sql"
  out=$("$bin" -f "$sql" 2>&1)
  times=$(grep Elapsed <<<"$out" | tail -6 | awk '{print $2 * 1000}' | sort -n | head -5 | tr '\n' ' ')
  count=$(grep -E '^\| [0-9]' <<<"$out" | tail -1 | tr -d '| ')
  printf '%-22s partitions %s: ms %s pairs %s\n' "$1" "$p" "$times" "$count"
}
form "SQL self-join" "SELECT count(*) FROM s a JOIN s b ON jaccard(a.tokens, b.tokens) >= $t AND a.id < b.id"
form "SQL as R-S + filter" "SELECT count(*) FROM s a JOIN s b ON jaccard(a.tokens, b.tokens) >= $t AND a.id < b.id AND b.id IS NOT NULL"
form "table function" "SELECT count(*) FROM similarity_join('s', 'id', 'tokens', 'jaccard', $t)"
