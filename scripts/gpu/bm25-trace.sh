#!/usr/bin/env bash
# Where a large corpus's top-k batch spends the device's time (diagnostics): gpu_bm25's
# `trace_large_corpus` over benches/data/synth_corpus.py's corpus (SCALE, default 10), the
# first 10,000 terabyte05 efficiency queries, in each mode of MODES (default "or") and each
# budget of piece slots per 8 ranked queries in SLOTS (e.g. "4,32"; default: the planner's
# own), once per kernel source in carry/variants/*.cu (DFSETS_BM25_SOURCE; none there: the
# embedded one),
# each answer checked equal to the CPU's; then a summary of each traced call: the ranking
# kernels' span, the busiest items, and the block time by number of lists.
# Here: `CARGO_TARGET_DIR=... RELEASE=1 CARRY=carry/gpuT TESTS=gpu_bm25 WITH_BENCH_DATA=1
# bash scripts/gpu/build.sh` (gcide's documents and the queries ride along), and kernel
# variants copied into carry/variants/ if any. There, through the device tool: command
# `bash scripts/gpu/bm25-trace.sh`, carry ["carry/gpuT", "carry/variants"]. Output in $OUT
# (or /tmp/gpu-out).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-/tmp/gpu-out}
work=/tmp/dfsets-bm25-trace
mkdir -p "$out" "$work"
python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
    carry/gpuT/gpu_bm25.xz >"$work/gpu_bm25"
chmod +x "$work/gpu_bm25"
scale=${SCALE:-10}
corpus=$work/synth_${scale}x
[ -f "$corpus/docs.parquet" ] ||
    python3 benches/data/synth_corpus.py --scale "$scale" --gcide carry/gpuT/bench-data/gcide/docs.parquet --out "$corpus"
variants=$(ls carry/variants/*.cu 2>/dev/null || true)
[ -n "$variants" ] || variants=embedded
for v in $variants; do
    tag=$(basename "$v" .cu)
    echo "== kernels: $tag"
    src=()
    [ "$v" = embedded ] || src=(env "DFSETS_BM25_SOURCE=$PWD/$v")
    "${src[@]}" env DFSETS_BM25_TRACE=1 DFSETS_TRACE_DOCS="$corpus/docs.parquet" \
        DFSETS_TRACE_MODES="${MODES:-or}" DFSETS_TRACE_SLOTS="${SLOTS:-}" \
        DFSETS_BENCH_DATA=carry/gpuT/bench-data \
        DFSETS_BENCH_OUT="$out/$tag" \
        "$work/gpu_bm25" --ignored --nocapture --test-threads=1 trace_large_corpus 2>&1 |
        grep -v "^$" | tail -8
    for csv in "$out/$tag".trace_*_large*.csv; do
        case "$csv" in *.kernels.csv) continue ;; esac
        echo "-- $(basename "$csv")"
        [ -f "$csv" ] || continue
        python3 - "$csv" <<'EOF'
import csv, sys
from collections import defaultdict
path = sys.argv[1]
rows = list(csv.DictReader(open(path)))
spans = list(csv.DictReader(open(path.replace(".csv", ".kernels.csv"))))
for s in spans:
    print(f"  kernel {s['kernel']}: {(int(s['end_ns']) - int(s['start_ns'])) / 1e6:.3f} ms")
for r in rows:
    r["dur"] = int(r["end_ns"]) - int(r["start_ns"])
total = sum(r["dur"] for r in rows)
print(f"  {len(rows)} items, {total / 1e6:.1f} ms of block time")
by_q = defaultdict(int)
for r in rows:
    by_q[r["q"]] += r["dur"]
top = sorted(by_q.items(), key=lambda x: -x[1])
for n in (10, 100, 1000):
    print(f"  the busiest {n} queries: {sum(d for _, d in top[:n]) / total:.0%} of the block time")
info = {r["q"]: r for r in rows}
print("  busiest queries: q, ms, items, lists, shortest list, postings")
items = defaultdict(int)
for r in rows:
    items[r["q"]] += 1
for q, d in top[:12]:
    r = info[q]
    print(f"    {q}, {d / 1e6:.2f}, {items[q]}, {r['lists']}, {r['shortest']}, {r['postings']}")
by_m = defaultdict(lambda: [0, 0])
for q, d in by_q.items():
    m = min(int(info[q]["lists"]), 8)
    by_m[m][0] += 1
    by_m[m][1] += d
print("  by lists (8: 8 or more): queries, share of block time")
for m in sorted(by_m):
    print(f"    {m}: {by_m[m][0]}, {by_m[m][1] / total:.0%}")
EOF
    done
done
