#!/usr/bin/env bash
# Runs kernels/intersect.cu's list-intersection kernels on the CPU (kernels/emu/emu.h: each
# CUDA thread a fiber on one OS thread, barriers for __syncthreads and shuffles) against a reference, on random
# batches: tiny, empty, NULL, unsorted and tile-spanning rows, k = 2..4, u32 / i32 / u64,
# values and counts; then kernels/bm25.cu's kernels (kernels/emu/bm25_check.cpp: random
# corpora and query batches, whole and split into pieces, against a reference scorer), and
# kernels/simjoin.cu's probe_join (kernels/emu/simjoin_check.cpp: random collections, every
# measure, against a nested loop over all pairs). Needs
# only g++ (C++20); no GPU, no CUDA. Takes under a minute.
set -euo pipefail
cd "$(dirname "$0")/../kernels/emu"
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
out="$dir/intersect-check"
# Both merge block sizes the host can choose (DFSETS_GPU_MERGE_THREADS); the second run also
# gives wmerge blocks of 2,048 threads (64 warps), so that a piece's look-back passes more than
# 32 pieces still without their inclusive counts (the device's 8 warps per block never need
# the emulator to interleave that many). plan_scan (256 threads a block on the device) runs
# in blocks of 1,024 in the first pass and of 64 in the second, so that its look-back passes
# many blocks.
for threads in 256 128; do
    wblock=$([ "$threads" = 256 ] && echo 256 || echo 2048)
    pscan=$([ "$threads" = 256 ] && echo 1024 || echo 64)
    echo "merge blocks of $threads threads, wmerge blocks of $wblock, plan_scan blocks of $pscan"
    g++ -std=c++20 -O1 -w -pthread -DTHREADS=$threads -DWBLOCK=$wblock -DPSCAN=$pscan -o "$out" intersect_check.cpp
    "$out"
done
# Small OR tiles, so that a query's sweep spans several; pruned OR raising its threshold
# from 16 candidates on, so that lists are put aside (and stopped) in the middle.
echo "bm25 top-k, tiles of 256 ordinals, thresholds raised from 16 candidates"
g++ -std=c++20 -O1 -w -pthread -DTILE=256 -DEAGER=16 -o "$dir/bm25-check" bm25_check.cpp
"$dir/bm25-check"
# AND's fences on every list of 16 postings or more (the device uses them from 1,024; the
# harness's lists are shorter), `bm25_topk_and`'s of 4 entries (strides of several postings)
# and chunks of two candidates a thread; two-list AND queries of the device's plan cut every
# 64 candidates (the device: 1,024); the answers packed by at most 3 blocks instead of 64
# (each block then scans several chunks of 256 queries in the pack suite's larger batches);
# the plan looking terms up two at a time (the device: 8), so that queries take several steps.
echo "bm25 top-k, AND through fences from 16 postings, packing by at most 3 blocks"
g++ -std=c++20 -O1 -w -pthread -DTILE=256 -DEAGER=16 -DFENCE_MIN=16 -DAND_FENCE=4 -DAND_G=2 -DAND2_PIECE=64 -DPACK_BLOCKS=3 -DPLAN_CHUNK=2 -o "$dir/bm25-fence-check" bm25_check.cpp
"$dir/bm25-fence-check"
# The similarity join on the device: random collections against a nested loop, with output
# capacities small enough that ranges overflow and are split.
echo "similarity join: probe_join against a nested loop"
g++ -std=c++20 -O1 -w -pthread -o "$dir/simjoin-check" simjoin_check.cpp
"$dir/simjoin-check"
