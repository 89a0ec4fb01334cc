#!/bin/bash
# bm25_index with the Unicode tokenizer against the ASCII one, side by side in one dfsets
# session, on the documents of a Parquet file held in memory (no Parquet decoding timed):
#   scripts/tokenizer-speed.sh <docs.parquet> <target_partitions> [extra options]
# e.g. scripts/tokenizer-speed.sh bench-data/gcide/docs.parquet 2 'stem=english'
# Builds the index 7 times with each tokenizer, alternating, checks the two indexes hold the
# same terms and postings (on ASCII text the tokenizers agree; otherwise it prints how many
# terms differ), and prints the fastest 5 `Elapsed` times of each (ms) and their ratio.
# Needs the release CLI: cargo build --release --features cli --bin dfsets.
set -euo pipefail
bin=${DFSETS:-${CARGO_TARGET_DIR:-target}/release/dfsets}
file=$1 p=$2 extra=${3:-}
sql=$(mktemp --suffix=.sql)
trap 'rm -f "$sql"' EXIT
opts() { echo "tokenizer=$1${extra:+, $extra}"; }
{
  echo "SET datafusion.execution.target_partitions = $p;"
  echo "CREATE EXTERNAL TABLE raw STORED AS PARQUET LOCATION '$file';"
  echo "CREATE TABLE docs AS SELECT doc_id, text FROM raw;"
  echo "CREATE TABLE a AS SELECT term, doc_ids, tfs FROM bm25_index('docs', 'doc_id', 'text', '$(opts ascii)');"
  echo "CREATE TABLE u AS SELECT term, doc_ids, tfs FROM bm25_index('docs', 'doc_id', 'text', '$(opts unicode)');"
  echo "SELECT count(*) AS differ FROM ((SELECT * FROM a EXCEPT SELECT * FROM u) UNION ALL (SELECT * FROM u EXCEPT SELECT * FROM a));"
  for _ in 1 2 3 4 5 6 7; do
    echo "CREATE OR REPLACE TABLE i AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', '$(opts ascii)');"
    echo "CREATE OR REPLACE TABLE i AS SELECT * FROM bm25_index('docs', 'doc_id', 'text', '$(opts unicode)');"
  done
} >"$sql"
out=$("$bin" -f "$sql" 2>&1)
differ=$(grep -E '^\| [0-9]' <<<"$out" | head -1 | tr -d '| ')
elapsed=$(grep Elapsed <<<"$out" | tail -14 | awk '{print $2 * 1000}')
pick() { awk "NR % 2 == $1" <<<"$elapsed" | sort -n | head -5 | tr '\n' ' '; }
med() { awk "NR % 2 == $1" <<<"$elapsed" | sort -n | sed -n 4p; }
printf '%s, %s partitions, options "%s": terms differing between the indexes: %s\n' "$file" "$p" "$extra" "$differ"
printf '  ascii:   ms %s\n' "$(pick 1)"
printf '  unicode: ms %s\n' "$(pick 0)"
awk -v a="$(med 1)" -v u="$(med 0)" 'BEGIN { printf "  unicode / ascii (medians): %.2fx\n", u / a }'
