#!/usr/bin/env bash
# The similarity join through SQL on the GPU machine's host, the release dfsets: per case one
# session over the sets' Parquet file, `sets.backend` = each of BACKENDS (default 'cpu gpu
# auto') alternated ROUNDS times on all cores, then the CPU on one partition; every answer checked equal. The query is
# the issue's: SELECT count(*) FROM s r JOIN s u ON r.id < u.id AND f(r.tokens, u.tokens) >= t
# (the rewrite plans it as the join), and once per backend the pairs' count and two checksums
# of their ids (the pairs themselves then come back). EXPLAIN=1 adds an EXPLAIN ANALYZE of
# each backend.
# Here first: scripts/gpu/join-gpu.sh pack (DFSETS_BIN: a release dfsets built with
# `cargo build --release --features cli --bin dfsets`; the data of benches/data/build.sh in
# SETS_BENCH_DATA); then through the device tool: command `bash scripts/gpu/join-gpu.sh run`,
# carry ["carry/join-gpu"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/join-gpu
case "${1:-}" in
pack)
    data=${SETS_BENCH_DATA:-bench-data}
    bin=${DFSETS_BIN:-${CARGO_TARGET_DIR:-target}/release/dfsets}
    rm -rf "$carry" && mkdir -p "$carry/gcide_words" "$carry/debian_deps"
    strip -o "$carry/dfsets" "$bin" && xz -T0 ${XZ_LEVEL:--9e} -f "$carry/dfsets"
    cp "$data/gcide_words/sets.parquet" "$carry/gcide_words/"
    cp "$data/debian_deps/sets.parquet" "$carry/debian_deps/"
    du -sh "$carry"
    ;;
run)
    python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
        "$carry/dfsets.xz" >/tmp/dfsets
    chmod +x /tmp/dfsets
    grep -m1 "model name" /proc/cpuinfo
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    CASES=${CASES:-"gcide_words:jaccard:0.5 gcide_words:dice:0.5 debian_deps:dice:0.5 gcide_words:jaccard:0.8"}
    python3 - "$carry" "$CASES" "${ROUNDS:-3}" "${EXPLAIN:-0}" "${BACKENDS:-cpu gpu auto}" <<'EOF'
import re, subprocess, sys, os
carry, cases, rounds, explain = sys.argv[1], sys.argv[2].split(), int(sys.argv[3]), sys.argv[4] == "1"
backends = sys.argv[5].split()
cores = os.cpu_count()
for case in cases:
    data, measure, t = case.split(":")
    path = f"{carry}/{data}/sets.parquet"
    q = f"SELECT count(*) FROM s r JOIN s u ON r.id < u.id AND {measure}(r.tokens, u.tokens) >= {t}"
    # Every statement, with what it is; the output's Elapsed lines come in the same order.
    stmts = [("setup", f"SET datafusion.execution.target_partitions = {cores}"),
             ("setup", f"CREATE EXTERNAL TABLE s STORED AS PARQUET LOCATION '{path}'")]
    for _ in range(rounds):
        for b in backends:
            stmts += [("setup", f"SET sets.backend = '{b}'"), (b, q)]
    if explain:
        for b in backends:
            stmts += [("setup", f"SET sets.backend = '{b}'"), ("explain", "EXPLAIN ANALYZE " + q)]
    # The pairs themselves, once per backend: count and two checksums of the id pairs (the
    # pairs come back from the device for these).
    check = (f"SELECT count(*), sum(CAST(r.id AS BIGINT) * 1000003 + u.id), "
             f"sum(CAST(r.id % 1009 AS BIGINT) * (u.id % 997)) FROM s r JOIN s u "
             f"ON r.id < u.id AND {measure}(r.tokens, u.tokens) >= {t}")
    for b in backends:
        stmts += [("setup", f"SET sets.backend = '{b}'"), ("check", check)]
    stmts += [("setup", "SET datafusion.execution.target_partitions = 1"),
              ("setup", "SET sets.backend = 'cpu'"), ("cpu1", q)]
    sql = "".join(s + ";\n" for _, s in stmts)
    with open("/tmp/join-gpu.sql", "w") as f:
        f.write(sql)
    out = subprocess.run(["/tmp/dfsets", "-f", "/tmp/join-gpu.sql"], capture_output=True, text=True)
    text = out.stdout + out.stderr
    elapsed = [float(x) * 1e3 for x in re.findall(r"Elapsed ([0-9.]+) seconds", text)]
    counts = [int(x) for x in re.findall(r"^\| (\d+) +\|$", text, re.M)]
    if out.returncode != 0 or len(elapsed) != len(stmts):
        print(text[-4000:])
        sys.exit(f"{case}: dfsets failed or printed {len(elapsed)} times for {len(stmts)} statements")
    times = {}
    for (kind, _), ms in zip(stmts, elapsed):
        times.setdefault(kind, []).append(ms)
    n_queries = sum(1 for k, _ in stmts if k in backends or k == "cpu1")
    if len(counts) != n_queries or len(set(counts)) != 1:
        print(text[-4000:])
        sys.exit(f"{case}: answers differ or are missing: {counts}")
    sums = re.findall(r"^\| (\d+) +\| (\d+) +\| (\d+) +\|$", text, re.M)
    if len(sums) != len(backends) or len(set(sums)) != 1 or int(sums[0][0]) != counts[0]:
        print(text[-4000:])
        sys.exit(f"{case}: the pairs differ between the backends: {sums}")
    if explain:
        for line in text.splitlines():
            if "SimilarityJoinExec" in line:
                at = line.find("candidates=")
                print("   ", line[line.find("backend="):].split(",")[0], line[at:].strip(" |]")[:700])
    fmt = lambda v: " ".join(f"{x:.0f}" for x in v)
    best = {k: min(v) for k, v in times.items() if k != "setup"}
    print(f"{data} {measure} >= {t}: {counts[0]} pairs (all runs equal, pair checksums equal); {cores} cores: "
          + "; ".join(f"{b} ms {fmt(times[b])}" for b in backends)
          + f"; 1 partition cpu {fmt(times['cpu1'])} ms; best cpu / best of each: "
          + ", ".join(f"{b} {best['cpu'] / best[b]:.1f}x" for b in backends if b != "cpu"))
EOF
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
