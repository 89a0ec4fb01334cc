#!/usr/bin/env python3
"""The house rules that the compiler does not check, run by .ci/run:

1. `src/backend/` (the CPU kernels and the GPU runtime) names nothing of the crate above it:
   no `crate::functions`, `crate::search`, `crate::join`, `crate::optimizer`, `crate::config`
   (nor the other rooms above it).
2. No import circle between the top-level modules of `src/` (`lib.rs`, the facade, excepted).
3. No file under `src/` is over 1,200 lines, its `#[cfg(test)] mod tests` excepted.

Comments and string literals are ignored; exits 1 with one line per violation.
"""
import re
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parent.parent / "src"
ABOVE_BACKEND = ["functions", "search", "join", "optimizer", "config", "intersect",
                 "placement", "session", "io", "catalog"]
MAX_LINES = 1200


def code_of(text: str) -> str:
    """`text` without comments, string and char literals (roughly, but safely for paths)."""
    text = re.sub(r"/\*.*?\*/", " ", text, flags=re.S)
    text = re.sub(r'r#+".*?"#+', '""', text, flags=re.S)
    text = re.sub(r'"(?:\\.|[^"\\])*"', '""', text, flags=re.S)
    text = re.sub(r"//[^\n]*", "", text)
    return text


def top_module(path: Path) -> str:
    rel = path.relative_to(SRC)
    return rel.parts[0].removesuffix(".rs")


def main() -> int:
    problems = []
    edges: dict[str, set[str]] = {}
    for path in sorted(SRC.rglob("*.rs")):
        text = path.read_text()
        code = code_of(text)
        top = top_module(path)
        rel = path.relative_to(SRC.parent)
        # `use crate::{a, b::c}` and `crate::a::...` paths alike.
        named = set(re.findall(r"\bcrate::(\w+)", code))
        for group in re.findall(r"\bcrate::\{([^}]*)\}", code):
            named |= set(re.findall(r"(?:^|,)\s*(\w+)", group))
        if top == "backend":
            for m in sorted(named & set(ABOVE_BACKEND)):
                problems.append(f"{rel}: the backend layer names crate::{m}")
        if top not in ("lib", "bin"):
            edges.setdefault(top, set()).update(n for n in named if n != top)
        body = re.split(r"\n#\[cfg\(test\)\]\n(?:pub(?:\(\w+\))? )?mod tests\b", text, maxsplit=1)[0]
        lines = body.count("\n") + 1
        if lines > MAX_LINES:
            problems.append(f"{rel}: {lines} lines outside its tests (at most {MAX_LINES})")
    modules = {p.name.removesuffix(".rs") for p in SRC.iterdir()} - {"lib", "bin"}
    graph = {m: {n for n in edges.get(m, ()) if n in modules} for m in modules}
    # Tarjan's strongly connected components: any with two or more modules is a circle.
    index, low, stack, on, sccs = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            sccs.append(scc)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    for scc in sccs:
        if len(scc) > 1:
            members = set(scc)
            detail = "; ".join(
                f"{a} -> {', '.join(sorted(graph[a] & members))}" for a in sorted(members)
            )
            problems.append(f"import circle between {', '.join(sorted(members))} ({detail})")
    for p in problems:
        print(p)
    if problems:
        return 1
    print(f"layers: {len(modules)} top-level modules, backend self-contained, no circle, "
          f"no file over {MAX_LINES} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
