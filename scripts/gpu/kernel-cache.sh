#!/usr/bin/env bash
# The first GPU queries of a `dfsets` process, with the kernel cache empty (every module
# compiled by NVRTC) and filled by an earlier process (every module loaded from disk), beside
# the same queries on the CPU: one process per run, ROUNDS rounds of cpu / gpu cold / gpu
# warm alternated, every answer checked equal. Each process runs, in order, a list
# intersection, a topk_bm25 batch and a similarity join, the first query to need each of the
# three kernel modules (kernels/intersect.cu, bm25.cu, simjoin.cu).
# Here first: scripts/gpu/kernel-cache.sh pack (DFSETS_BIN: a release dfsets built with
# `cargo build --release --features cli --bin dfsets`); then through the device tool: command
# `bash scripts/gpu/kernel-cache.sh run`, carry ["carry/kernel-cache"].
set -euo pipefail
cd "$(dirname "$0")/../.."
carry=carry/kernel-cache
case "${1:-}" in
pack)
    bin=${DFSETS_BIN:-${CARGO_TARGET_DIR:-target}/release/dfsets}
    rm -rf "$carry" && mkdir -p "$carry"
    strip -o "$carry/dfsets" "$bin" && xz -T0 ${XZ_LEVEL:--9e} -f "$carry/dfsets"
    du -sh "$carry"
    ;;
run)
    python3 -c "import lzma,sys; sys.stdout.buffer.write(lzma.open(sys.argv[1]).read())" \
        "$carry/dfsets.xz" >/tmp/dfsets
    chmod +x /tmp/dfsets
    grep -m1 "model name" /proc/cpuinfo
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader || true
    python3 - "$carry" "${ROUNDS:-3}" <<'EOF'
import os, re, shutil, subprocess, sys, time
carry, rounds = sys.argv[1], int(sys.argv[2])
setup = [
    f"SET datafusion.execution.target_partitions = {os.cpu_count()}",
    "CREATE TABLE s AS SELECT v AS id, CAST(range(v % 997, v % 997 + 20 + v % 13) AS INT[]) AS tokens "
    "FROM generate_series(1, 30000) AS g(v)",
    "CREATE TABLE t AS SELECT CAST(range(v % 7, 2000 + v % 300, 3) AS INT[]) AS a, "
    "CAST(range(v % 5, 2500, 2) AS INT[]) AS b FROM generate_series(1, 20000) AS g(v)",
    "CREATE TABLE docs AS SELECT v AS doc_id, concat('w', v % 101, ' x', v % 37, ' y', v % 13, "
    "' z', v % 1009) AS body FROM generate_series(1, 50000) AS g(v)",
    "CREATE TABLE idx AS SELECT * FROM bm25_index('docs', 'doc_id', 'body')",
    "CREATE TABLE q AS SELECT concat('w', v % 101, ' x', v % 41, ' z', v % 997) AS text "
    "FROM generate_series(1, 5000) AS g(v)",
]
queries = [
    ("intersect", "SELECT sum(cardinality(list_intersect(a, b))) FROM t"),
    ("topk_bm25", "SELECT sum(cardinality(topk_bm25('idx', text, 10))) FROM q"),
    ("join", "SELECT count(*) FROM s r JOIN s u ON r.id < u.id AND jaccard(r.tokens, u.tokens) >= 0.8"),
]
def run(backend, cache):
    stmts = setup + [f"SET sets.backend = '{backend}'"] + [q for _, q in queries]
    with open("/tmp/kernel-cache.sql", "w") as f:
        f.write("".join(s + ";\n" for s in stmts))
    env = dict(os.environ, DFSETS_KERNEL_CACHE=cache, RUST_LOG="datafusion_sets=debug")
    t0 = time.perf_counter()
    out = subprocess.run(["/tmp/dfsets", "-f", "/tmp/kernel-cache.sql"], capture_output=True, text=True, env=env)
    wall = (time.perf_counter() - t0) * 1e3
    text = out.stdout + out.stderr
    elapsed = [float(x) * 1e3 for x in re.findall(r"Elapsed ([0-9.]+) seconds", text)]
    answers = re.findall(r"^\| (\d+) +\|$", text, re.M)
    if out.returncode != 0 or len(elapsed) != len(stmts) or len(answers) != len(queries):
        print(text[-4000:])
        sys.exit(f"{backend}: dfsets failed or printed {len(elapsed)} times for {len(stmts)} statements")
    compiled = len(re.findall(r"compiled by NVRTC", text))
    cached = len(re.findall(r"loaded from the kernel cache", text))
    return wall, elapsed[-len(queries):], answers, compiled, cached
results = {}
want = None
for r in range(rounds):
    cache = f"/tmp/kernel-cache-{r}"
    shutil.rmtree(cache, ignore_errors=True)
    for label, backend in [("cpu", "cpu"), ("gpu, cache empty", "gpu"), ("gpu, cache filled", "gpu")]:
        wall, times, answers, compiled, cached = run(backend, cache)
        want = want or answers
        if answers != want:
            sys.exit(f"{label}: answers {answers} differ from {want}")
        if backend == "gpu" and (compiled, cached) != ((3, 0) if "empty" in label else (0, 3)):
            sys.exit(f"{label}: {compiled} modules compiled, {cached} from the cache")
        results.setdefault(label, []).append((wall, times))
        print(f"round {r + 1} {label}: process {wall:.0f} ms; "
              + ", ".join(f"{n} {t:.0f} ms" for (n, _), t in zip(queries, times))
              + (f"; modules compiled {compiled}, from the cache {cached}" if backend == "gpu" else ""))
print(f"answers (all runs equal): {dict(zip([n for n, _ in queries], want))}")
for label, runs in results.items():
    walls = sorted(w for w, _ in runs)
    firsts = sorted(sum(t) for _, t in runs)
    print(f"{label}: process {walls[0]:.0f}-{walls[-1]:.0f} ms; the three queries {firsts[0]:.0f}-{firsts[-1]:.0f} ms")
EOF
    ;;
*)
    echo "usage: $0 pack|run" >&2
    exit 2
    ;;
esac
