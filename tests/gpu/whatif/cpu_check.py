"""Runs the harness's workloads on the CPU, at their real sizes, to check them without a GPU:
shapes, control flow, the batch-size search, and an estimate of each trace's length.

usage: python3 cpu_check.py [WORKLOAD...]     (default: every workload; needs torch)

The estimate counts the tensors each workload creates that own new memory (every operator
output that is not a view of an input), as a TorchDispatchMode sees them: on CUDA each is
roughly one `alloc`, one `free_requested` and one `free_completed` in the trace, so about three
events each, plus workspaces and segment events the CPU does not show. The harness wants
traces well under 100k events. A workload's own CUDA-only parts (side streams, pinned memory,
CUDA graphs, NCCL) run as plain CPU code here (workloads.Job).
"""
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from workloads import WORKLOADS, Job, WorkloadSkipped


class AllocationCounter(TorchDispatchMode):
    """Counts operator outputs that do not alias an input (new storage), and their bytes."""

    def __init__(self):
        super().__init__()
        self.tensors = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        aliases = any(r.alias_info is not None for r in func._schema.returns)
        if not aliases:
            for t in out if isinstance(out, (tuple, list)) else (out,):
                if isinstance(t, torch.Tensor):
                    self.tensors += 1
                    self.bytes += t.numel() * t.element_size()
        return out


def check(name):
    """Runs one workload on the CPU under the counter; returns a line about it."""
    job = Job("cpu")
    counter = AllocationCounter()
    started = time.time()
    try:
        with counter:
            WORKLOADS[name](job)
    except WorkloadSkipped as why:
        return f"{name:<18} skipped: {why}"
    seconds = time.time() - started
    return (f"{name:<18} ok in {seconds:5.1f} s on the CPU: {counter.tensors} new tensors "
            f"(~{3 * counter.tensors} trace events), {counter.bytes / 2**30:.2f} GiB allocated "
            f"in all; notes {job.notes}")


def main(names):
    """Checks the named workloads (all when none are named); exit 1 if one raised."""
    torch.set_num_threads(2)
    failed = 0
    for name in names or list(WORKLOADS):
        try:
            print(check(name), flush=True)
        except Exception as error:  # noqa: BLE001 - report every workload, then fail
            failed += 1
            print(f"{name:<18} FAILED: {type(error).__name__}: {error}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
