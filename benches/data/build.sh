#!/usr/bin/env bash
# Builds the real data the benchmarks and real-data tests need into the git-ignored
# `bench-data/` folder at the repository root, by calling the shared dataset builders
# (default /work/shared/datasets; override with DATASETS_DIR). Never commit the output.
#
#   bench-data/gcide/docs.parquet      (doc_id uint32, text, key)   from apt dict-gcide
#   bench-data/gcide/postings.parquet  (term, doc_ids list<uint32>, tfs list<uint32>)
#   bench-data/queries/queries.parquet (source, qid, text)          from PyPI pyserini==0.17.0
#   bench-data/debian_deps/sets.parquet (id uint32, tokens list<uint32>, key)  from apt's own
#                                       bookworm main amd64 Packages index (one set per package:
#                                       the names it depends on)
#   bench-data/gcide_words/sets.parquet (id uint32, tokens list<uint32>, key)  the word set of
#                                       each gcide article (from gcide/docs.parquet)
#   bench-data/translations/<xx>.parquet (doc_id uint32, package, text)  Debian's translated
#                                       package descriptions (bookworm main Translation-xx, for
#                                       de fr es ru ja zh_CN, at most 3,000 each; 3 MB in all)
#   bench-data/unicode/WordBreakTest.txt  Unicode's word boundary tests, from apt unicode-data
#
# Set token ids are numbered by increasing document frequency (the builders' order); the
# similarity join does not rely on it (it ranks tokens itself).
#
# Needs root (apt-get), python3 with pyarrow and numpy (`pip install pyarrow numpy`), and
# network access to the Debian and PyPI registries. About 2 minutes on 2 cores after the
# downloads. Idempotent: steps whose output exists are skipped (FORCE=1 rebuilds).
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
DATASETS_DIR=${DATASETS_DIR:-/work/shared/datasets}
export DATASETS_OUT=${DATASETS_OUT:-$REPO/bench-data}
PY=${PY:-python3}
FORCE=${FORCE:-0}

if [ ! -f "$DATASETS_DIR/build_dictd.py" ]; then
    echo "shared dataset builders not found in $DATASETS_DIR (set DATASETS_DIR)" >&2
    exit 1
fi
$PY -c 'import pyarrow, numpy' 2>/dev/null || {
    echo "python3 needs pyarrow and numpy: pip install pyarrow numpy" >&2
    exit 1
}
mkdir -p "$DATASETS_OUT"

need() { [ "$FORCE" = 1 ] || [ ! -f "$DATASETS_OUT/$1" ]; }

if need gcide/postings.parquet; then
    if [ ! -f /usr/share/dictd/gcide.index ]; then
        apt-get update
        apt-get install -y --no-install-recommends dict-gcide
    fi
    (cd "$DATASETS_DIR" && $PY build_dictd.py gcide && $PY build_postings.py gcide)
fi

if need queries/queries.parquet; then
    WHEEL_DIR=${WHEEL_DIR:-/tmp/pyserini-wheel}
    WHEEL="$WHEEL_DIR/pyserini-0.17.0-py3-none-any.whl"
    [ -f "$WHEEL" ] || pip download --no-deps -d "$WHEEL_DIR" pyserini==0.17.0
    (cd "$DATASETS_DIR" && $PY build_queries_anserini.py "$WHEEL")
fi

if need gcide_words/sets.parquet; then
    (cd "$DATASETS_DIR" && $PY build_word_sets.py gcide)
fi

if need debian_deps/sets.parquet; then
    # apt keeps the Packages index lz4-compressed once lz4 is installed; the builder reads
    # /var/lib/apt/lists/*_bookworm_main_binary-amd64_Packages.lz4 (a Debian 12 machine).
    if ! ls /var/lib/apt/lists/*_bookworm_main_binary-amd64_Packages.lz4 >/dev/null 2>&1; then
        command -v lz4cat >/dev/null || apt-get install -y --no-install-recommends lz4
        apt-get update
    fi
    (cd "$DATASETS_DIR" && $PY build_debian.py deps)
fi

if need translations/zh_CN.parquet; then
    # apt fetches the Translation-xx indexes it is asked for; a lists folder of our own leaves
    # the machine's apt state as it was.
    LISTS=${APT_I18N_LISTS:-/tmp/dfsets-apt-i18n}
    mkdir -p "$LISTS/partial" "$LISTS/cache"
    command -v lz4cat >/dev/null || apt-get install -y --no-install-recommends lz4
    apt-get update -o Dir::State::Lists="$LISTS" -o Dir::Cache="$LISTS/cache" \
        -o Acquire::Languages="de,fr,es,ru,ja,zh_CN"
    $PY "$REPO/benches/data/build_translations.py" "$LISTS" "$DATASETS_OUT/translations"
fi

if need unicode/WordBreakTest.txt; then
    if [ ! -f /usr/share/unicode/auxiliary/WordBreakTest.txt ]; then
        apt-get install -y --no-install-recommends unicode-data || {
            apt-get update
            apt-get install -y --no-install-recommends unicode-data
        }
    fi
    mkdir -p "$DATASETS_OUT/unicode"
    cp /usr/share/unicode/auxiliary/WordBreakTest.txt "$DATASETS_OUT/unicode/"
fi

ls -l "$DATASETS_OUT"/gcide/postings.parquet "$DATASETS_OUT"/queries/queries.parquet \
    "$DATASETS_OUT"/gcide_words/sets.parquet "$DATASETS_OUT"/debian_deps/sets.parquet \
    "$DATASETS_OUT"/translations/*.parquet "$DATASETS_OUT"/unicode/WordBreakTest.txt
