"""Records allocator traces from PyTorch on a CUDA device, in the format of
tests/fixtures/pytorch-traces/ (see that folder's README), for gpumem's fidelity tests.

usage: python3 record_traces.py OUT.json LABEL [FRACTION] [--streams] [--seeds N] [--ops N]
The allocator config is read by PyTorch from PYTORCH_CUDA_ALLOC_CONF at start-up, so run one
process per config:
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 record_traces.py out.json expandable

Each trace manipulates 12 slots holding `torch.empty(n, dtype=torch.uint8)` tensors, exactly as
the fixture README describes, from an empty allocator. After every op it records
`torch.cuda.memory_stats()` (every key), each occupied slot's `data_ptr()` (`ptrs`), every
segment of `torch.cuda.memory_snapshot()` as [address, total_size, is_expandable, stream]
(`segments`) and `torch.cuda.mem_get_info()[0]` (`free`).

With --streams, a third of the allocations run on a second stream (`op` gets a 4th element
"stream1"); such a slot's tensor is freed on that stream's pool (no record_stream), as PyTorch
does for a tensor used only on the stream that allocated it.
"""
import json
import os
import random
import sys

import torch

from trace_sizes import MIB, draw_size

args = [a for a in sys.argv[1:] if not a.startswith("--")]
out_path, label = args[0], args[1]
fraction = float(args[2]) if len(args) > 2 else 1.0
use_streams = "--streams" in sys.argv
seeds = 6
ops_per_trace = 250
for i, a in enumerate(sys.argv):
    if a == "--seeds":
        seeds = int(sys.argv[i + 1])
    if a == "--ops":
        ops_per_trace = int(sys.argv[i + 1])

dev = torch.device("cuda:0")
torch.cuda.init()
total = torch.cuda.get_device_properties(0).total_memory
if fraction < 1.0:
    torch.cuda.set_per_process_memory_fraction(fraction)
second_stream = torch.cuda.Stream() if use_streams else None


def snapshot_segments():
    return [[s["address"], s["total_size"], bool(s.get("is_expandable", False)), s["stream"]]
            for s in torch.cuda.memory_snapshot()]


def record(ops, slots, op):
    ops.append({
        "op": op,
        "stats": dict(torch.cuda.memory_stats()),
        "ptrs": {str(k): t.data_ptr() for k, t in slots.items()},
        "segments": snapshot_segments(),
        "free": torch.cuda.mem_get_info()[0],
    })


traces = []
for seed in range(2000, 2000 + seeds):
    rng = random.Random(seed)
    slots = {}
    ops = []
    for _ in range(ops_per_trace):
        r = rng.random()
        k = rng.randrange(12)
        if r < 0.62:
            n = draw_size(rng, fraction)
            on_second = use_streams and rng.random() < 0.33
            op = ["alloc", k, n]
            if on_second:
                # Marked before allocating, so an allocation refused on the second stream
                # still says where it was asked for.
                op.append("stream1")
            try:
                if on_second:
                    with torch.cuda.stream(second_stream):
                        t = torch.empty(n, dtype=torch.uint8, device=dev)
                else:
                    t = torch.empty(n, dtype=torch.uint8, device=dev)
                old = slots.get(k)
                slots[k] = t
                del old, t
            except torch.OutOfMemoryError:
                op.append("oom")
        elif r < 0.95:
            op = ["free", k]
            slots.pop(k, None)
        else:
            op = ["empty_cache"]
            torch.cuda.empty_cache()
        record(ops, slots, op)
    traces.append({"seed": seed, "ops": ops})
    slots.clear()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.reset_accumulated_memory_stats()

json.dump({
    "torch": torch.__version__,
    "gpu": torch.cuda.get_device_name(0),
    "total_memory": total,
    "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
    "memory_fraction": fraction,
    "label": label,
    "streams": use_streams,
    "per_trace_counters": "all: peaks and accumulated counters were reset at each trace start",
    "traces": traces,
}, open(out_path, "w"))
print(f"{label}: {len(traces)} traces, {sum(len(t['ops']) for t in traces)} ops -> {out_path}")
