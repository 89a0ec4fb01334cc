#!/usr/bin/env python3
"""Print the median (ms) of every `list_intersect` criterion benchmark, with its confidence
interval, from the criterion output directory (default:
$CARGO_TARGET_DIR/criterion, else ./target/criterion).

    python3 benches/data/summarize.py [criterion_dir]
"""
import json
import os
import sys

root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(
    os.environ.get("CARGO_TARGET_DIR", "target"), "criterion")
GROUPS = ("sql_", "kernel_", "check_", "sql_threads_", "count_", "agg_")
rows = []
for group in sorted(os.listdir(root)):
    if not group.startswith(GROUPS):
        continue
    for bench in sorted(os.listdir(os.path.join(root, group))):
        path = os.path.join(root, group, bench, "new")
        try:
            est = json.load(open(os.path.join(path, "estimates.json")))
            bm = json.load(open(os.path.join(path, "benchmark.json")))
        except (FileNotFoundError, NotADirectoryError):
            continue
        med = est["median"]
        rows.append((bm["full_id"], med["point_estimate"] / 1e6,
                     med["confidence_interval"]["lower_bound"] / 1e6,
                     med["confidence_interval"]["upper_bound"] / 1e6))
width = max((len(r[0]) for r in rows), default=10)
print(f"{'benchmark':<{width}}  {'median ms':>10}  {'95% CI of the median':>22}")
for name, m, lo, hi in rows:
    print(f"{name:<{width}}  {m:>10.3f}  {lo:>10.3f} .. {hi:>8.3f}")
