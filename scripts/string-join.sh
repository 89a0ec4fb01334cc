#!/bin/bash
# The similarity join on strings against the join on integer ids, side by side in one dfsets
# session, on gcide_words (each article's word set; the builder's dictionary spells the ids):
#   scripts/string-join.sh <bench-data dir> <jaccard threshold> <target_partitions> [backend]
# Builds `ids` (the integer sets) and `words` (the same sets as lists of strings) in memory,
# checks the string join on `backend` (sets.backend: auto, cpu or gpu; default auto) returns
# the pairs and similarities of the integer join on the CPU, then runs each
# `SELECT count(*) FROM similarity_join(...)` 6 times on `backend`, alternating; prints the
# fastest 5 `Elapsed` times of each (ms) and the pair count.
# Needs the release CLI: cargo build --release --features cli --bin dfsets.
set -euo pipefail
bin=${DFSETS:-${CARGO_TARGET_DIR:-target}/release/dfsets}
dir=$1 t=$2 p=$3 backend=${4:-auto}
sql=$(mktemp --suffix=.sql)
trap 'rm -f "$sql"' EXIT
ids="SELECT count(*) FROM similarity_join('ids', 'id', 'tokens', 'jaccard', $t)"
words="SELECT count(*) FROM similarity_join('words', 'id', 'tokens', 'jaccard', $t)"
{
  echo "SET datafusion.execution.target_partitions = $p;"
  echo "CREATE EXTERNAL TABLE sets STORED AS PARQUET LOCATION '$dir/gcide_words/sets.parquet';"
  echo "CREATE EXTERNAL TABLE dict STORED AS PARQUET LOCATION '$dir/gcide_words/tokens.parquet';"
  echo "CREATE TABLE ids AS SELECT id, tokens FROM sets;"
  echo "CREATE TABLE words AS SELECT s.id, array_agg(d.token) AS tokens
        FROM (SELECT id, unnest(tokens) AS t FROM sets) s JOIN dict d ON s.t = d.token_id
        GROUP BY s.id;"
  echo "SET sets.backend = 'cpu';"
  echo "CREATE TABLE want AS SELECT * FROM similarity_join('ids', 'id', 'tokens', 'jaccard', $t);"
  echo "SET sets.backend = '$backend';"
  echo "CREATE TABLE got AS SELECT * FROM similarity_join('words', 'id', 'tokens', 'jaccard', $t);"
  # Different answers: a non-zero count here.
  echo "SELECT count(*) AS differ FROM ((SELECT * FROM got EXCEPT SELECT * FROM want)
          UNION ALL (SELECT * FROM want EXCEPT SELECT * FROM got));"
  for _ in 1 2 3 4 5 6; do echo "$ids;"; echo "$words;"; done
} >"$sql"
out=$("$bin" -f "$sql" 2>&1)
counts=$(grep -E '^\| [0-9]' <<<"$out" | tr -d '| ')
differ=$(sed -n 1p <<<"$counts")
if [ "$differ" != 0 ]; then
  echo "the joins differ in $differ pairs" >&2
  exit 1
fi
elapsed=$(grep Elapsed <<<"$out" | tail -12 | awk '{print $2 * 1000}')
pick() { awk "NR % 2 == $1" <<<"$elapsed" | sort -n | head -5 | tr '\n' ' '; }
pairs=$(tail -1 <<<"$counts")
printf 'gcide_words J >= %s, %s partitions, backend %s: %s pairs (equal)\n' "$t" "$p" "$backend" "$pairs"
printf '  integer ids: ms %s\n' "$(pick 1)"
printf '  strings:     ms %s\n' "$(pick 0)"
