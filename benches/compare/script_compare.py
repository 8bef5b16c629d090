#!/usr/bin/env python3
"""gpumem vs PyTorch on the GPU machine, measured in one run.

1. The allocation loop `t = torch.empty(1<<20, dtype=torch.uint8, device='cuda')` in Python vs
   `let t = empty(1048576, "uint8");` in a gpumem script: per-iteration cost of each and the
   ratio. Each side runs N iterations and 0 iterations in a fresh process (context creation
   included in both) and the difference is divided by N, so start-up does not count.
2. The seed walkthrough (tests/fixtures/pytorch-seed-walkthrough.json, steps[].python vs
   steps[].rhai) end to end: `python3` with `import torch` vs `gpumem run`, wall time of
   each (best of REPEATS), context creation included.

Usage (from the repository root, after `cargo build --release`):
    python3 benches/compare/script_compare.py [--gpumem target/release/gpumem] [--device cuda:0]
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

N = 100_000
REPEATS = 5


def wall(cmd):
    """Best wall time of REPEATS runs of cmd, in seconds."""
    best = float("inf")
    for _ in range(REPEATS):
        start = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        best = min(best, time.perf_counter() - start)
    return best


def write(directory, name, text):
    path = os.path.join(directory, name)
    with open(path, "w") as handle:
        handle.write(text)
    return path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpumem", default="target/release/gpumem")
    parser.add_argument("--device", default="cuda:0")
    parser.add_argument("--fixture", default="tests/fixtures/pytorch-seed-walkthrough.json")
    args = parser.parse_args()
    gpumem = [args.gpumem, "run", "--device", args.device]

    with tempfile.TemporaryDirectory() as tmp:
        def torch_loop(n):
            return write(tmp, f"loop{n}.py",
                         "import torch\n"
                         "torch.empty(1, device='cuda')\n"
                         f"for i in range({n}):\n"
                         "    t = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')\n"
                         "torch.cuda.synchronize()\n")

        def gpumem_loop(n):
            return write(tmp, f"loop{n}.rhai",
                         "let warm = empty(1, \"uint8\");\n"
                         f"for i in 0..{n} {{ let t = empty(1048576, \"uint8\"); }}\n"
                         "synchronize();\n")

        torch_us = (wall([sys.executable, torch_loop(N)]) - wall([sys.executable, torch_loop(0)])) / N * 1e6
        gpumem_us = (wall(gpumem + [gpumem_loop(N)]) - wall(gpumem + [gpumem_loop(0)])) / N * 1e6
        print(f"allocation loop, {N} iterations (best of {REPEATS}, start-up subtracted):")
        print(f"  PyTorch (Python loop):  {torch_us:.3f} us/iteration")
        print(f"  gpumem (Rhai loop):     {gpumem_us:.3f} us/iteration")
        print(f"  ratio PyTorch / gpumem: {torch_us / gpumem_us:.2f}x")

        with open(args.fixture) as handle:
            fixture = json.load(handle)
        python = "import torch\n" + "\n".join(s["python"] for s in fixture["steps"]) + "\ntorch.cuda.synchronize()\n"
        rhai = "\n".join(s["rhai"] for s in fixture["steps"]) + "\nsynchronize();\n"
        torch_s = wall([sys.executable, write(tmp, "walk.py", python)])
        gpumem_s = wall(gpumem + [write(tmp, "walk.rhai", rhai)])
        print(f"seed walkthrough, {len(fixture['steps'])} steps, whole process (best of {REPEATS}):")
        print(f"  python3 + import torch: {torch_s * 1e3:.1f} ms")
        print(f"  gpumem run:             {gpumem_s * 1e3:.1f} ms")
        print(f"  ratio:                  {torch_s / gpumem_s:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
