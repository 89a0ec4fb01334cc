#!/usr/bin/env python3
"""Independent check of our similarity join against PyPI `SetSimilaritySearch` (`all_pairs`).

`SetSimilaritySearch.all_pairs` (version 1.0.1, pure Python: AllPairs with a position filter,
after Bayardo et al.) self-joins a list of sets and yields `(x, y, sim)` for every pair of
list positions x != y with `sim >= t`. Its pairs are compared with the pairs our join wrote
through SQL, dumped by the real-data test:

    SETS_SIMJOIN_DUMP=/tmp/simjoin cargo test --test similarity_join_real_data
    python3 benches/data/check_similarity_join.py --ours /tmp/simjoin

Cases (the same names as the test's dump files, `<dataset>_<measure>_<t>.tsv`, one pair per
line, `left_id  right_id  similarity`, left_id < right_id):
  debian_deps jaccard >= 0.9, gcide_words jaccard >= 0.8, gcide_words dice >= 0.9;
  debian_deps cosine >= 0.9 only when asked for (--case): all_pairs' cosine filter is too
  loose to finish on it (see CASES).

Adaptation to all_pairs' semantics (read from its source):
- Input: `bench-data/<dataset>/sets.parquet` (`id` = 0..n-1 = list position, `tokens`
  sorted and deduplicated by the builders). all_pairs requires duplicate-free sets (it says
  duplicates give wrong output); the builders' sets have none, and this script asserts it.
  Identical sets in different rows (debian_deps has many) are distinct list entries for
  all_pairs and distinct rows for us: both pair them, similarity 1. A set is never paired
  with itself by either.
- Order: all_pairs yields (larger position, smaller position); our self-join yields
  (smaller id, larger id). Pairs are compared as unordered {x, y}, i.e. (min, max).
- Predicate: all_pairs keeps `sim >= t` with sim = |x∩y| / (|x|+|y|-|x∩y|) (Jaccard) or
  |x∩y| / sqrt(float(|x|*|y|)) (cosine) in float64: the same formulas, in the same double
  arithmetic, as our `jaccard` / `cosine`, so pairs at exactly the threshold agree. Its
  filters are conservative (prefix lengths from int(t*n), a position filter that ignores
  the overlap already seen), so it loses no pair.
- Dice: all_pairs has no Dice. dice = 2o/(n+m) >= d is jaccard >= d/(2-d) in exact
  arithmetic; we run all_pairs' Jaccard at d/(2-d) - 1e-9 (a superset: rounding moves
  either score by far less) and keep the pairs whose float64 (2*o)/(n+m), the formula of
  our `dice`, is >= d. The overlap o is recomputed from the sets.
- Empty sets: none in the data (the builders drop them); both joins would drop them.

Prints, per case: sizes of both pair sets, pairs only in ours / only in all_pairs (first 10
listed), the largest similarity difference on common pairs, and all_pairs' time. Exit
status 1 when any case differs.

Needs: pip install SetSimilaritySearch pyarrow numpy.
"""

import argparse
import os
import sys
import time

import pyarrow.parquet as pq
from SetSimilaritySearch import all_pairs

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))

CASES = [
    ("debian_deps", "jaccard", 0.9),
    ("gcide_words", "jaccard", 0.8),
    ("gcide_words", "dice", 0.9),
    # Runs for hours in all_pairs (its cosine prefix, |x| - int(t*sqrt(|x|)) + 1, is nearly
    # the whole set, and debian_deps' common dependencies have posting lists of tens of
    # thousands): only with --case debian_deps_cosine_0.9.
    ("debian_deps", "cosine", 0.9),
]
SLOW = {"debian_deps_cosine_0.9"}


def case_name(dataset, measure, t):
    return f"{dataset}_{measure}_{t}"


def load_sets(data_dir, dataset):
    t = pq.read_table(os.path.join(data_dir, dataset, "sets.parquet"), columns=["id", "tokens"])
    ids = t.column("id").to_pylist()
    assert ids == list(range(len(ids))), "ids are not 0..n-1 in file order"
    sets = t.column("tokens").to_pylist()
    for i, s in enumerate(sets):
        assert len(set(s)) == len(s), f"set {i} has duplicate tokens"
    return sets


def oracle(sets, measure, t):
    """{(min, max): similarity} by all_pairs."""
    out = {}
    if measure in ("jaccard", "cosine"):
        for x, y, sim in all_pairs(sets, similarity_func_name=measure, similarity_threshold=t):
            out[(min(x, y), max(x, y))] = float(sim)
    elif measure == "dice":
        jt = t / (2.0 - t) - 1e-9
        for x, y, _ in all_pairs(sets, similarity_func_name="jaccard", similarity_threshold=jt):
            o = len(set(sets[x]) & set(sets[y]))
            dice = float(2 * o) / float(len(sets[x]) + len(sets[y]))
            if dice >= t:
                out[(min(x, y), max(x, y))] = dice
    else:
        raise ValueError(measure)
    return out


def read_ours(path):
    out = {}
    with open(path) as f:
        for line in f:
            left, right, sim = line.rstrip("\n").split("\t")
            left, right = int(left), int(right)
            assert left < right, f"{path}: pair {left} {right} not oriented left < right"
            assert (left, right) not in out, f"{path}: pair {left} {right} twice"
            out[(left, right)] = float(sim)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ours", required=True, help="folder of the test's TSV dumps")
    ap.add_argument("--data", default=os.environ.get("SETS_BENCH_DATA", os.path.join(REPO, "bench-data")))
    ap.add_argument("--case", action="append", help="only these cases (e.g. debian_deps_jaccard_0.9)")
    args = ap.parse_args()

    failed = 0
    loaded = {}
    for dataset, measure, t in CASES:
        name = case_name(dataset, measure, t)
        if (args.case and name not in args.case) or (not args.case and name in SLOW):
            continue
        path = os.path.join(args.ours, name + ".tsv")
        if not os.path.exists(path):
            print(f"{name}: no dump {path}, skipped")
            continue
        if dataset not in loaded:
            loaded[dataset] = load_sets(args.data, dataset)
        sets = loaded[dataset]
        ours = read_ours(path)
        t0 = time.process_time()
        theirs = oracle(sets, measure, t)
        cpu = time.process_time() - t0
        only_ours = sorted(set(ours) - set(theirs))
        only_theirs = sorted(set(theirs) - set(ours))
        common = set(ours) & set(theirs)
        max_diff = max((abs(ours[p] - theirs[p]) for p in common), default=0.0)
        same = not only_ours and not only_theirs and max_diff == 0.0
        verdict = "IDENTICAL" if same else "DIFFERENT"
        print(
            f"{name}: {len(sets)} sets; ours {len(ours)} pairs, all_pairs {len(theirs)} pairs "
            f"({cpu:.1f} s CPU); only ours {len(only_ours)}, only all_pairs {len(only_theirs)}; "
            f"max |sim diff| {max_diff:g}: {verdict}"
        )
        for p in only_ours[:10]:
            print(f"  only ours: {p} {ours[p]!r} sizes {len(sets[p[0]])} {len(sets[p[1]])}")
        for p in only_theirs[:10]:
            print(f"  only all_pairs: {p} {theirs[p]!r} sizes {len(sets[p[0]])} {len(sets[p[1]])}")
        failed += not same
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
