"""What a MemPool's death does to PyTorch's counters and trace (run on the GPU, PyTorch 2.11).

usage: python3 probe_pool_teardown.py

The sixth and seventh waves' `.frac` runs, each ended by an OOM the workload did not catch,
counted one `num_sync_all_streams` more than their traces show. This probe checks where that
synchronisation comes from, in four cases under a 1 GiB cap:

  inside_pool_kept   the OOM inside `use_mem_pool`, the pool held a freed 24 MiB block, and the
                     traceback (so the pool) is alive when the counters are read
  inside_pool_died   the same, read again once the handler ended and the frames died
  empty_pool_died    a pool that never got memory, alive through an OOM in the default pools,
                     then dying with the frames
  pool_deleted       a pool with a freed block, deleted by `del` (its emptyCache releases it)

For each it prints `num_sync_all_streams`, the private pools' segments and the trace events
after the step, so the harness's rule (write the results in the OOM handler, run_one.py) rests
on PyTorch's own behaviour, not on a guess.
"""
import gc
import json

import torch

MIB = 1 << 20


def syncs():
    """PyTorch's count of allocator-wide synchronisations so far."""
    return torch.cuda.memory_stats().get("num_sync_all_streams", 0)


def pool_segments():
    """The private pools' segments now: (pool id, MiB, block states)."""
    return [(tuple(s["segment_pool_id"]), s["total_size"] // MIB,
             [b["state"] for b in s["blocks"]])
            for s in torch.cuda.memory._snapshot()["segments"]
            if tuple(s["segment_pool_id"]) != (0, 0)]


def trace_length():
    """How many events the device's trace holds (history is recorded for every allocation)."""
    traces = torch.cuda.memory._snapshot()["device_traces"]
    return len(traces[0]) if traces else 0


def report(case, mark, events_before):
    """One line of JSON: the case, the counters and the events since `events_before`."""
    trace = torch.cuda.memory._snapshot()["device_traces"][0]
    print(json.dumps({
        "case": case,
        "num_sync_all_streams": syncs(),
        "pool_segments": pool_segments(),
        "events": [(e["action"], e["size"] // MIB) for e in trace[events_before:]],
        "mark": mark,
    }), flush=True)


def oom_inside_pool(device):
    """Allocates 24 MiB in a new MemPool, frees it, and runs out of memory in the same pool."""
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        scratch = torch.empty(24 * MIB, dtype=torch.uint8, device=device)
        del scratch
        torch.empty(4 << 30, dtype=torch.uint8, device=device)


def oom_beside_an_empty_pool(device):
    """Makes a MemPool that never gets memory, then runs out of memory in the default pools."""
    pool = torch.cuda.MemPool()  # noqa: F841 - alive in this frame until it dies
    torch.empty(4 << 30, dtype=torch.uint8, device=device)


def oom_then_teardown(case, job, device):
    """Runs `job` until its OOM; reports in the handler (`CASE_kept`: the traceback holds the
    job's frames) and once they died (`CASE_died`)."""
    start = trace_length()
    try:
        job(device)
    except torch.OutOfMemoryError:
        report(case + "_kept", "in the handler, traceback alive", start)
        start = trace_length()
    gc.collect()
    report(case + "_died", "after the handler, frames gone", start)


def main():
    device = torch.device("cuda:0")
    torch.cuda.init()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.memory._record_memory_history(max_entries=100000)
    torch.cuda.set_per_process_memory_fraction((1 << 30) / total)
    print(json.dumps({"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}))

    oom_then_teardown("inside_pool", oom_inside_pool, device)
    oom_then_teardown("empty_pool", oom_beside_an_empty_pool, device)

    start = trace_length()
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        scratch = torch.empty(24 * MIB, dtype=torch.uint8, device=device)
    del scratch
    report("pool_alive", "a freed 24 MiB block in a live pool", start)
    start = trace_length()
    del pool
    gc.collect()
    report("pool_deleted", "after del pool", start)


if __name__ == "__main__":
    main()
