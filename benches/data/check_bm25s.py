#!/usr/bin/env python3
"""Independent check of our BM25 ranking against PyPI `bm25s` on gcide.

bm25s ("lucene" method, k1 = 1.2, b = 0.75, float64 scores) is built over the same tokens
our index holds: lowercase `[a-z0-9]+` runs of each gcide article (given to bm25s
pre-tokenized, so its own tokenizer, stemmer and stop words are not used). It ranks the same
`terabyte05-eff` queries (their distinct tokens, OR, top-10) and its results are compared with
ours, dumped by the real-data test:

    SETS_BM25_QUERIES=10000 SETS_BM25_DUMP=/tmp/ours_or.tsv cargo test --test bm25_real_data
    python3 benches/data/check_bm25s.py --ours /tmp/ours_or.tsv

bm25s's "lucene" score omits the (k1 + 1) factor of ours (and of Lucene's and tantivy's), so
its scores times 2.2 should equal ours. bm25s does not break ties by doc id: documents
whose scores are equal (relative tolerance 1e-6) may come in another order, and at the
cut-off another of the tied documents may be picked. Each query is classified as
  empty          no query term is in the index: no results from either;
  identical      the same doc ids in the same order;
  tie-reordered  the same doc ids, reordered only within tied scores;
  tie-cutoff     the same up to which of the documents tied with the 10th score were taken;
  DIFFERENT      anything else (listed);
and the largest relative difference between our score and 2.2 x bm25s's score of the same
document is reported.

Needs: pip install bm25s pyarrow numpy.
"""

import argparse
import collections
import os
import re
import sys
import time

import numpy as np
import pyarrow.parquet as pq

import bm25s

TOKEN_RE = re.compile(r"[a-z0-9]+")
K1, B = 1.2, 0.75
FACTOR = K1 + 1.0
RTOL = 1e-6


def tokenize(text):
    return TOKEN_RE.findall((text or "").lower())


def close(a, b):
    return abs(a - b) <= RTOL * max(abs(a), abs(b))


def read_ours(path):
    """qid -> [(doc_id, score)], best first, in file order of qids."""
    ours = collections.OrderedDict()
    with open(path) as f:
        for line in f:
            qid, rank, doc, score = line.rstrip("\n").split("\t")
            hits = ours.setdefault(qid, [])
            if rank != "0":
                hits.append((int(doc), float(score)))
    return ours


def classify(ours, theirs, scores_of, k):
    """ours, theirs: [(doc, score)] in our score units; scores_of(doc) -> bm25s score x 2.2."""
    od = [d for d, _ in ours]
    td = [d for d, _ in theirs]
    if od == td:
        return "identical"
    if len(od) != len(td):
        return "DIFFERENT"
    # Rank by rank, the scores must agree (ties may be ordered differently, but the score
    # sequence is the same).
    if not all(close(a, b) for (_, a), (_, b) in zip(ours, theirs)):
        return "DIFFERENT"
    # Within each run of tied scores, the same set of documents ...
    runs, start = [], 0
    for i in range(1, len(ours) + 1):
        if i == len(ours) or not close(ours[i][1], ours[start][1]):
            runs.append((start, i))
            start = i
    last = ours[-1][1]
    cutoff_tie = False
    for s, e in runs:
        if set(od[s:e]) == set(td[s:e]):
            continue
        # ... except for the run tied with the last score when the list is full: there any of
        # the tied documents may fill the remaining places.
        if e == len(ours) and len(ours) == k and close(ours[s][1], last):
            extra = set(td[s:e]) ^ set(od[s:e])
            if all(close(scores_of(d), last) for d in extra):
                cutoff_tie = True
                continue
        return "DIFFERENT"
    return "tie-cutoff" if cutoff_tie else "tie-reordered"


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ours", required=True, help="TSV from SETS_BM25_DUMP (qid, rank, doc_id, score)")
    ap.add_argument("--data", default=os.environ.get("SETS_BENCH_DATA", "bench-data"))
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--show", type=int, default=20, help="disagreements to print")
    args = ap.parse_args()

    ours = read_ours(args.ours)
    t = time.time()
    docs = pq.read_table(os.path.join(args.data, "gcide/docs.parquet"), columns=["doc_id", "text"])
    doc_ids = np.asarray(docs.column("doc_id").to_numpy(), dtype=np.int64)
    # bm25s numbers documents by row; gcide's doc_id is its row number (checked).
    assert (doc_ids == np.arange(len(doc_ids))).all(), "doc_id is not the row number"
    corpus = [tokenize(x) for x in docs.column("text").to_pylist()]
    retriever = bm25s.BM25(k1=K1, b=B, method="lucene", dtype="float64")
    retriever.index(corpus, show_progress=False)
    del corpus
    print(
        f"bm25s {bm25s.__version__}: indexed {len(doc_ids)} docs, {len(retriever.vocab_dict)} terms "
        f"in {time.time() - t:.1f} s",
        file=sys.stderr,
    )

    q = pq.read_table(os.path.join(args.data, "queries/queries.parquet"), columns=["source", "qid", "text"])
    text_of = {
        qid: text
        for src, qid, text in zip(
            q.column("source").to_pylist(), q.column("qid").to_pylist(), q.column("text").to_pylist()
        )
        if src == "terabyte05-eff"
    }

    t = time.time()
    counts = collections.Counter()
    max_rel = 0.0
    shown = 0
    for qid, our_hits in ours.items():
        # Distinct indexed tokens, in query order (we count a repeated term once; bm25s would
        # add it twice).
        terms = [w for w in dict.fromkeys(tokenize(text_of[qid])) if w in retriever.vocab_dict]
        if not terms:
            counts["empty" if not our_hits else "DIFFERENT"] += 1
            continue
        scores = retriever.get_scores(terms) * FACTOR
        res = retriever.retrieve([terms], k=args.k, show_progress=False, n_threads=0)
        idx, sc = res.documents[0], res.scores[0]
        theirs = [(int(doc_ids[i]), float(s) * FACTOR) for i, s in zip(idx, sc) if s > 0]
        # retrieve() and get_scores() must agree with each other.
        assert all(close(scores[i], float(s) * FACTOR) for i, s in zip(idx, sc)), qid
        for d, s in our_hits:
            max_rel = max(max_rel, abs(s - scores[d]) / max(abs(s), 1e-300))
        c = classify(our_hits, theirs, lambda d: scores[d], args.k)
        counts[c] += 1
        if c == "DIFFERENT" and shown < args.show:
            shown += 1
            print(f"DIFFERENT qid {qid} {text_of[qid]!r} terms {terms}", file=sys.stderr)
            print(f"  ours  {[(d, round(s, 6)) for d, s in our_hits]}", file=sys.stderr)
            print(f"  bm25s {[(d, round(s, 6)) for d, s in theirs]}", file=sys.stderr)
    n = sum(counts.values())
    print(f"compared {n} queries (OR, top-{args.k}) in {time.time() - t:.1f} s", file=sys.stderr)
    same = counts["empty"] + counts["identical"] + counts["tie-reordered"] + counts["tie-cutoff"]
    print(
        f"queries: {n}; no indexed term (both empty) {counts['empty']}, identical {counts['identical']}, reordered within ties {counts['tie-reordered']}, "
        f"other tied docs at the cut-off {counts['tie-cutoff']} => agree {same}; DIFFERENT {counts['DIFFERENT']}; "
        f"max relative score difference (ours vs 2.2 x bm25s) {max_rel:.2e}"
    )
    return 0 if counts["DIFFERENT"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
