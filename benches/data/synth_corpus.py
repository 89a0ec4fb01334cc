#!/usr/bin/env python3
"""A large BM25 benchmark corpus with gcide's term statistics.

gcide (126,240 articles, 5.7 M tokens) is too small for a GPU to matter. This writes a corpus
SCALE times its size whose text follows gcide's statistics, fitted here from
bench-data/gcide/docs.parquet:

- term frequencies: a Zipf-Mandelbrot law, f(r) ~ (r + q)^-s over term rank r, fitted to
  gcide's collection frequencies (least squares in log-log, every rank weighted alike);
- vocabulary size: Heaps' law, V(N) = K N^beta, fitted to the vocabulary growth over gcide's
  token stream, so a larger corpus has the vocabulary a larger text of that kind would;
- document lengths: drawn from gcide's own length distribution (its empirical law: the
  lengths of the articles, in tokens).

The words are gcide's own, by rank (the r-th most frequent gcide term is rank r), so real
English queries (terabyte05) hit it as they hit gcide; ranks beyond gcide's vocabulary are
synthetic terms (`zq` and base-36 digits, never an English word). Tokens are drawn
independently per document (no burstiness), which is what the fit describes.

Terms are what the crate's `ascii` tokenizer (and the default `unicode` one, on ASCII text)
gives: `[a-z0-9]+` over the lowercased text.

Output (deterministic for a given seed and scale), in OUT (default bench-data/synth_<scale>x):
  docs.parquet  doc_id uint32, text string; row groups of 100,000 documents
  stats.json    the fit and the corpus' counts

Usage: synth_corpus.py [--scale 40] [--seed 1] [--gcide bench-data/gcide/docs.parquet] [--out DIR]
At --scale 40 (5.05 M documents, ~230 M tokens) it takes ~2 minutes and ~3 GB of memory on
16 cores; the 2-core development machine uses --scale 2.
"""

import argparse
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

ROWS_PER_GROUP = 100_000
WORD = re.compile(r"[a-z0-9]+")


def gcide_statistics(path):
    """gcide's terms by decreasing collection frequency, their frequencies, the document
    lengths, and the vocabulary size after each of a range of stream prefixes."""
    texts = pq.read_table(path, columns=["text"]).column("text").to_pylist()
    counts = Counter()
    lengths = np.empty(len(texts), dtype=np.int64)
    growth_at = set(np.unique(np.geomspace(1_000, len(texts), 40).astype(int)).tolist())
    growth = []
    tokens = 0
    for i, text in enumerate(texts):
        words = WORD.findall((text or "").lower())
        counts.update(words)
        lengths[i] = len(words)
        tokens += len(words)
        if i + 1 in growth_at:
            growth.append((tokens, len(counts)))
    ranked = counts.most_common()
    return [w for w, _ in ranked], np.array([c for _, c in ranked], dtype=np.float64), lengths, growth


def fit_zipf_mandelbrot(freqs):
    """(s, q) of f(r) ~ C (r + q)^-s, least squares in log-log over every rank."""
    ranks = np.arange(1, len(freqs) + 1, dtype=np.float64)
    logf = np.log(freqs)
    best = None
    for q in np.concatenate([[0.0], np.geomspace(0.01, 100.0, 120)]):
        x = np.log(ranks + q)
        slope, intercept = np.polyfit(x, logf, 1)
        err = float(np.mean((intercept + slope * x - logf) ** 2))
        if best is None or err < best[0]:
            best = (err, -slope, q)
    return best[1], best[2], best[0]


def fit_heaps(growth):
    """(K, beta) of V(N) = K N^beta over (tokens, vocabulary) points."""
    n = np.log([g[0] for g in growth])
    v = np.log([g[1] for g in growth])
    beta, log_k = np.polyfit(n, v, 1)
    return float(np.exp(log_k)), float(beta)


def synthetic_word(rank, taken):
    """A term for a rank beyond gcide's vocabulary: `zq` and base-36 digits."""
    digits = np.base_repr(rank, 36).lower()
    word = "zq" + digits
    while word in taken:
        word = "zq" + word
    return word


def main():
    repo = Path(__file__).resolve().parents[2]
    data = Path(os.environ.get("SETS_BENCH_DATA", repo / "bench-data"))
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--scale", type=float, default=40.0, help="documents as a multiple of gcide's (default 40)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--gcide", type=Path, default=data / "gcide" / "docs.parquet")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    out = args.out or data / f"synth_{args.scale:g}x"
    out.mkdir(parents=True, exist_ok=True)
    started = time.time()

    words, freqs, lengths, growth = gcide_statistics(args.gcide)
    s, q, err = fit_zipf_mandelbrot(freqs)
    heaps_k, heaps_beta = fit_heaps(growth)
    docs = int(round(len(lengths) * args.scale))
    rng = np.random.default_rng(args.seed)
    doc_lengths = rng.choice(lengths, size=docs, replace=True)
    total_tokens = int(doc_lengths.sum())
    vocab = max(len(words), int(round(heaps_k * total_tokens**heaps_beta)))

    # The vocabulary as one blob of "word " strings, and the sampling law over ranks.
    taken = set(words)
    all_words = words + [synthetic_word(r, taken) for r in range(len(words) + 1, vocab + 1)]
    encoded = [(w + " ").encode() for w in all_words]
    blob = np.frombuffer(b"".join(encoded), dtype=np.uint8)
    word_len = np.array([len(e) for e in encoded], dtype=np.int64)  # with its space
    word_start = np.concatenate([[0], np.cumsum(word_len)[:-1]])
    cdf = np.cumsum((np.arange(1, vocab + 1, dtype=np.float64) + q) ** -s)
    cdf /= cdf[-1]

    schema = pa.schema([("doc_id", pa.uint32()), ("text", pa.string())])
    path = out / "docs.parquet"
    tmp = out / "docs.parquet.tmp"
    written_tokens = 0
    with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
        for first in range(0, docs, ROWS_PER_GROUP):
            lens = doc_lengths[first : first + ROWS_PER_GROUP]
            n = int(lens.sum())
            ranks = np.searchsorted(cdf, rng.random(n), side="right")
            ranks = np.minimum(ranks, vocab - 1)
            token_len = word_len[ranks]
            out_start = np.cumsum(token_len) - token_len
            total = int(token_len.sum())
            # Byte i of the output is byte (i - out_start[t] + word_start[rank t]) of the blob.
            shift = np.repeat(word_start[ranks] - out_start, token_len)
            text_bytes = blob[np.arange(total, dtype=np.int64) + shift]
            doc_token_start = np.concatenate([[0], np.cumsum(lens)])
            offsets = np.concatenate([out_start, [total]])[doc_token_start].astype(np.int64)
            text = pa.LargeStringArray.from_buffers(
                len(lens), pa.py_buffer(offsets.tobytes()), pa.py_buffer(text_bytes.tobytes())
            ).cast(pa.string())
            ids = pa.array(np.arange(first, first + len(lens), dtype=np.uint32))
            writer.write_table(pa.table([ids, text], schema=schema), row_group_size=ROWS_PER_GROUP)
            written_tokens += n
    tmp.replace(path)

    stats = {
        "source": f"benches/data/synth_corpus.py --scale {args.scale:g} --seed {args.seed}, fitted to {args.gcide.name} of gcide",
        "docs": docs,
        "tokens": written_tokens,
        "vocabulary_drawn_from": vocab,
        "gcide": {"docs": len(lengths), "tokens": int(lengths.sum()), "terms": len(words)},
        "zipf_mandelbrot": {"s": s, "q": q, "mse_log": err},
        "heaps": {"K": heaps_k, "beta": heaps_beta},
        "doc_tokens": {
            "mean": float(doc_lengths.mean()),
            "median": float(np.median(doc_lengths)),
            "max": int(doc_lengths.max()),
        },
        "seconds": round(time.time() - started, 1),
    }
    (out / "stats.json").write_text(json.dumps(stats, indent=1) + "\n")
    print(json.dumps(stats, indent=1))


if __name__ == "__main__":
    main()
