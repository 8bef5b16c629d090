#!/usr/bin/env python3
"""Times PyTorch's CUDA caching allocator and gpumem's on the same two patterns, in one run.

Patterns (identical in both):
  1. a cached 1 MiB malloc+free pair (a cache hit),
  2. 1000 live blocks of 512 B x k (k from a fixed LCG in 1..4000), all allocated then all freed.

PyTorch's side is a tiny C++ extension calling c10::cuda::CUDACachingAllocator::raw_alloc /
raw_delete (no Python in the timed loop); gpumem's side is `gpumem bench alloc --device cuda`.
Usage (on the GPU machine): python3 benches/compare/alloc_compare.py PATH/TO/gpumem
"""
import json
import subprocess
import sys
import time

import torch
from torch.utils.cpp_extension import load_inline

CPP = r"""
#include <torch/extension.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <algorithm>
#include <chrono>
#include <vector>

static double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Median ns per pair of each pattern over `rounds` samples, after a warm-up.
std::vector<double> time_patterns(std::vector<int64_t> sizes, int64_t rounds) {
  namespace alloc = c10::cuda::CUDACachingAllocator;
  const int pairs = 10000;
  std::vector<void*> live(sizes.size());
  for (int w = 0; w < 3; ++w) {
    alloc::raw_delete(alloc::raw_alloc(1 << 20));
    for (size_t i = 0; i < sizes.size(); ++i) live[i] = alloc::raw_alloc(sizes[i]);
    for (size_t i = 0; i < sizes.size(); ++i) alloc::raw_delete(live[i]);
  }
  std::vector<double> cached, mixed;
  for (int64_t r = 0; r < rounds; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < pairs; ++i) alloc::raw_delete(alloc::raw_alloc(1 << 20));
    auto t1 = std::chrono::steady_clock::now();
    cached.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / pairs);
    t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < sizes.size(); ++i) live[i] = alloc::raw_alloc(sizes[i]);
    for (size_t i = 0; i < sizes.size(); ++i) alloc::raw_delete(live[i]);
    t1 = std::chrono::steady_clock::now();
    mixed.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count() / sizes.size());
  }
  return {median(cached), median(mixed)};
}
"""


def mixed_sizes():
    """The same list as mixed_sizes() in src/cli/bench/alloc.rs."""
    state, mask, sizes = 0x2545F4914F6CDD1D, (1 << 64) - 1, []
    for _ in range(1000):
        state = (state * 6364136223846793005 + 1442695040888963407) & mask
        sizes.append(512 * ((state >> 33) % 4000 + 1))
    return sizes


SAMPLES = 5


def main():
    gpumem = sys.argv[1] if len(sys.argv) > 1 else "gpumem"
    rounds = 201
    torch.cuda.init()
    start = time.time()
    ext = load_inline(name="alloc_timing", cpp_sources=CPP, functions=["time_patterns"],
                      with_cuda=True, verbose=False)
    print(f"built the PyTorch timing extension in {time.time() - start:.1f} s")
    # Timings on a shared machine come in fast and slow spells that last a whole process, so
    # each side is measured SAMPLES times (alternating) and the best median of each is kept.
    torch_runs, gpumem_runs = [], []
    for _ in range(SAMPLES):
        torch_runs.append(ext.time_patterns(mixed_sizes(), rounds))
        out = subprocess.run([gpumem, "bench", "alloc", "--device", "cuda", "--rounds", str(rounds), "--json"],
                             check=True, capture_output=True, text=True).stdout
        ours = json.loads(out)
        gpumem_runs.append((ours["cached_pair_ns"], ours["mixed_pair_ns"]))
    for label, runs in [("PyTorch", torch_runs), ("gpumem", gpumem_runs)]:
        print(f"{label} samples (cached, mixed ns): " + ", ".join(f"({a:.1f}, {b:.1f})" for a, b in runs))
    best = lambda runs, i: min(run[i] for run in runs)
    print(f"{'pattern (best of ' + str(SAMPLES) + ')':<34}{'PyTorch 2.11':>14}{'gpumem':>12}{'speed-up':>10}")
    for i, name in enumerate(["cached 1 MiB malloc+free", "1000 live mixed, per pair"]):
        theirs, mine = best(torch_runs, i), best(gpumem_runs, i)
        print(f"{name:<34}{theirs:>11.1f} ns{mine:>9.1f} ns{theirs / mine:>9.1f}x")


if __name__ == "__main__":
    main()
