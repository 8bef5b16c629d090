#!/usr/bin/env python3
"""gpumem vs PyTorch on the GPU machine, measured in one run.

1. The allocation loop `t = torch.empty(1<<20, dtype=torch.uint8, device='cuda')` in Python vs
   `let t = empty(1048576, "uint8");` in a gpumem script: per-iteration cost of each and the
   ratio. Each side times its loop inside its own process, after a warm-up allocation that
   creates the context, so start-up does not count.
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


def in_process(cmd):
    """Best of REPEATS runs of cmd, each printing the seconds it measured as its last line."""
    best = float("inf")
    for _ in range(REPEATS):
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
        best = min(best, float(out.strip().splitlines()[-1]))
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
        # Each loop times itself inside its own process (after a warm-up allocation that
        # creates the context), so process start-up and imports are not part of the figure.
        torch_loop = write(tmp, "loop.py",
                           "import time, torch\n"
                           "torch.empty(1, device='cuda')\n"
                           "start = time.perf_counter()\n"
                           f"for i in range({N}):\n"
                           "    t = torch.empty(1 << 20, dtype=torch.uint8, device='cuda')\n"
                           "torch.cuda.synchronize()\n"
                           "print(time.perf_counter() - start)\n")
        gpumem_loop = write(tmp, "loop.rhai",
                            "let warm = empty(1, \"uint8\");\n"
                            "let start = timestamp();\n"
                            f"for i in 0..{N} {{ let t = empty(1048576, \"uint8\"); }}\n"
                            "synchronize();\n"
                            "print(start.elapsed);\n")
        torch_us = in_process([sys.executable, torch_loop]) / N * 1e6
        gpumem_us = in_process(gpumem + [gpumem_loop]) / N * 1e6
        print(f"allocation loop, {N} iterations (best of {REPEATS}, timed inside each process):")
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
