#!/usr/bin/env bash
# Where a CPU similarity join's time goes as cores are added, on the GPU machine's host: per
# case one session over the sets' Parquet file, the issue's query on the CPU backend at
# target_partitions 1, 2, 4, 8 and every core (ROUNDS runs each, all answers checked equal),
# then EXPLAIN ANALYZE at 1 partition and at every core, the join's and the scan's metrics
# printed, and the planning alone (EXPLAIN). Uses the carry of join-gpu.sh: here `scripts/gpu/join-gpu.sh pack`, there command
# `bash scripts/gpu/join-scaling.sh`, carry ["carry/join-gpu"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/join-gpu
[ -x /tmp/dfsets ] || {
    python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
        "$carry/dfsets.xz" >/tmp/dfsets
    chmod +x /tmp/dfsets
}
CASES=${CASES:-"gcide_words:jaccard:0.8 gcide_words:jaccard:0.5"}
python3 - "$carry" "$CASES" "${ROUNDS:-3}" <<'EOF'
import re, subprocess, sys, os
carry, cases, rounds = sys.argv[1], sys.argv[2].split(), int(sys.argv[3])
cores = os.cpu_count()
parts = sorted({p for p in (1, 2, 4, 8, cores) if p <= cores})
for case in cases:
    data, measure, t = case.split(":")
    q = (f"SELECT count(*) FROM s r JOIN s u ON r.id < u.id AND "
         f"{measure}(r.tokens, u.tokens) >= {t}")
    stmts = [("setup", f"CREATE EXTERNAL TABLE s STORED AS PARQUET LOCATION "
                       f"'{carry}/{data}/sets.parquet'"),
             ("setup", "SET sets.backend = 'cpu'")]
    for p in parts:
        stmts.append(("setup", f"SET datafusion.execution.target_partitions = {p}"))
        stmts += [(p, q)] * rounds
    for p in (1, cores):
        stmts += [("setup", f"SET datafusion.execution.target_partitions = {p}"),
                  ("explain", "EXPLAIN ANALYZE " + q)]
    # Planning alone: EXPLAIN plans the query without running it.
    stmts += [("plan", "EXPLAIN " + q)] * rounds
    with open("/tmp/join-scaling.sql", "w") as f:
        f.write("".join(s + ";\n" for _, s in stmts))
    out = subprocess.run(["/tmp/dfsets", "-f", "/tmp/join-scaling.sql"],
                         capture_output=True, text=True)
    text = out.stdout + out.stderr
    elapsed = [float(x) * 1e3 for x in re.findall(r"Elapsed ([0-9.]+) seconds", text)]
    counts = [int(x) for x in re.findall(r"^\| (\d+) +\|$", text, re.M)]
    if out.returncode != 0 or len(elapsed) != len(stmts) or len(set(counts)) != 1:
        print(text[-4000:])
        sys.exit(f"{case}: dfsets failed, or answers differ: {counts}")
    times = {}
    for (kind, _), ms in zip(stmts, elapsed):
        times.setdefault(kind, []).append(ms)
    best1 = min(times[1])
    print(f"{data} {measure} >= {t}: {counts[0]} pairs (all equal)")
    for p in parts:
        print(f"  {p:2} partitions: " + " ".join(f"{x:.0f}" for x in times[p])
              + f" ms; best 1 / best {p}: {best1 / min(times[p]):.1f}x")
    print("  EXPLAIN ANALYZE, explain wall ms:", " ".join(f"{x:.0f}" for x in times["explain"]))
    print(f"  planning alone (EXPLAIN, {cores} partitions):",
          " ".join(f"{x:.1f}" for x in times["plan"]), "ms")
    for line in text.splitlines():
        if "SimilarityJoinExec" in line and "metrics=" in line:
            print("    SimilarityJoinExec:", line[line.find("metrics="):].strip(" |")[:900])
        if "DataSourceExec" in line and "metrics=" in line:
            keep = re.findall(r"(?:time_elapsed_\w+|bytes_scanned|files_opened|output_batches)=[^,\]]+", line)
            print("    DataSourceExec:", ", ".join(keep))
EOF
