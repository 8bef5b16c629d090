"""One run of the what-if harness: one workload, one allocator config, one fresh process.

usage: python3 run_one.py --name NAME --workload W --out DIR [--conf CONF]
           [--fraction F | --limit-bytes B] [--max-entries N] [--context alloc|state|all|none]
           [--stacks python|all] [--no-history] [--skip-actions a,b] [--role R] [--base NAME]
           [--device cuda:0|cpu]

PyTorch reads PYTORCH_CUDA_ALLOC_CONF once, when its allocator starts, and keeps cuBLAS/cuDNN
workspaces and cached blocks for the life of the process; so every run is its own process, and
this script sets the variable (and clears PYTORCH_ALLOC_CONF, which would win) before it imports
torch. It then records the allocator's history from before the first allocation, applies the
per-process memory fraction if asked (--limit-bytes B means B / total_memory), runs the
workload, and writes:

  DIR/NAME.pickle      torch.cuda.memory._dump_snapshot (the file users give gpumem)
  DIR/NAME.stats.json  torch.cuda.memory_stats() at the end (what a replay must reproduce)
  DIR/NAME.meta.json   what ran and how it ended (always written, also on failure)

The meta's "status": "completed"; "oom" (an OOM the workload did not catch ended it: the
snapshot and stats are still written, in the handler, before the job's objects die, and the job
does not fit); "skipped" (the workload cannot
run on this machine); "failed" (any other error; "stage" says where: import, setup, workload,
dump). The exit status is 0 for completed, oom and skipped, 1 for failed.
"""
import argparse
import collections
import gc
import json
import os
import platform
import re
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
# How PyTorch words a refused PYTORCH_CUDA_ALLOC_CONF ("Unrecognized key 'x' in ... allocator
# config", "Unrecognized CachingAllocator option: x", "... must be >= ...").
CONFIG_ERROR = re.compile(r"(?i)unrecognized (key|cachingallocator option)|allocator ?config|"
                          r"CachingAllocator option|_mb too small")


def parse_args(argv=None):
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--name", required=True, help="run name: the output files' stem")
    p.add_argument("--workload", required=True, help="a key of workloads.WORKLOADS")
    p.add_argument("--out", required=True, help="folder for the three output files")
    p.add_argument("--conf", default="", help="PYTORCH_CUDA_ALLOC_CONF for this run")
    limit = p.add_mutually_exclusive_group()
    limit.add_argument("--fraction", help="set_per_process_memory_fraction(F), as text (exact)")
    limit.add_argument("--limit-bytes", type=int,
                       help="a fraction of B / total_memory (the workload's own memory limit)")
    p.add_argument("--max-entries", type=int, default=1_000_000,
                   help="history ring size (smaller than the trace: the ring wraps)")
    p.add_argument("--context", default="alloc", choices=["alloc", "state", "all", "none"],
                   help="frames recorded (none: context=None, no frames)")
    p.add_argument("--stacks", default="python", choices=["python", "all"],
                   help="all: C++ frames too")
    p.add_argument("--no-history", action="store_true",
                   help="never call _record_memory_history (a snapshot with an empty trace)")
    p.add_argument("--skip-actions", default="",
                   help="comma-separated trace actions PyTorch should not record")
    p.add_argument("--role", default="special",
                   help="base | whatif | special | warmup (for compare.py)")
    p.add_argument("--base", default="", help="the base run this run is a what-if pair of")
    p.add_argument("--config-label", default="", help="the config's short name")
    p.add_argument("--device", default="cuda:0",
                   help="cuda:0 on the GPU machine; cpu runs the workload only (no snapshot)")
    args = p.parse_args(argv)
    if args.device == "cpu" and (args.fraction or args.limit_bytes):
        p.error("a memory fraction needs a CUDA device")
    return args


def history_options(args):
    """The keyword arguments of torch.cuda.memory._record_memory_history, or None."""
    if args.no_history:
        return None
    options = {
        "enabled": "all",
        "context": None if args.context == "none" else args.context,
        "stacks": args.stacks,
        "max_entries": args.max_entries,
    }
    if args.skip_actions:
        options["skip_actions"] = [a for a in args.skip_actions.split(",") if a]
    return options


def set_alloc_conf(conf):
    """Makes `conf` the only allocator config PyTorch will see (empty = PyTorch's defaults)."""
    for name in ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        os.environ.pop(name, None)
    if conf:
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = conf


def trace_facts(snapshot):
    """What the meta keeps about a snapshot: event counts by action, streams, pool ids."""
    traces = snapshot.get("device_traces") or [[]]
    events = traces[0] if traces else []
    actions = collections.Counter(e["action"] for e in events)
    return {
        "events": len(events),
        "actions": dict(sorted(actions.items())),
        "oom_events": actions.get("oom", 0),
        "streams": sorted({e["stream"] for e in events}),
        "segments_at_end": len(snapshot.get("segments", [])),
        "segment_pool_ids": sorted({tuple(s.get("segment_pool_id", (0, 0)))
                                    for s in snapshot.get("segments", [])}),
        "allocator_settings": snapshot.get("allocator_settings"),
    }


def write_json(path, value):
    """Writes `value` as indented JSON (atomically: a killed run leaves no half file)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(value, f, indent=1, default=str)
    os.replace(tmp, path)


def main(argv=None):
    """Runs one workload as described in the module docstring; returns the exit status."""
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    base = os.path.join(args.out, args.name)
    started = time.time()
    meta = {
        "name": args.name,
        "workload": args.workload,
        "role": args.role,
        "base": args.base,
        "config_label": args.config_label,
        "conf": args.conf,
        "fraction": args.fraction,
        "limit_bytes": args.limit_bytes,
        "history": history_options(args),
        "device": args.device,
        "python": platform.python_version(),
        # How the driver loads kernels (unset: CUDA 12+'s lazy loading, on first use). A kernel
        # module loaded on first use takes device memory no snapshot shows, in the address
        # space the allocator's segments share (README: "Memory no snapshot shows").
        "cuda_module_loading": os.environ.get("CUDA_MODULE_LOADING", ""),
        "status": "failed",
        "stage": "import",
        "completed": False,
        "caught_ooms": 0,
    }
    set_alloc_conf(args.conf)
    job = None
    torch = None
    try:
        import torch
        sys.path.insert(0, HERE)
        from workloads import WORKLOADS, Job, WorkloadSkipped
        meta["torch"] = torch.__version__
        meta["cuda"] = torch.version.cuda
        workload = WORKLOADS[args.workload]

        meta["stage"] = "setup"
        job = Job(args.device)
        if job.cuda:
            torch.cuda.init()
            props = torch.cuda.get_device_properties(0)
            meta["gpu"] = props.name
            meta["total_memory"] = props.total_memory
            options = meta["history"]
            if options is not None:
                torch.cuda.memory._record_memory_history(**options)
            if args.limit_bytes:
                meta["fraction"] = repr(args.limit_bytes / props.total_memory)
            if meta["fraction"] is not None:
                torch.cuda.set_per_process_memory_fraction(float(meta["fraction"]))

        meta["stage"] = "workload"
        t0 = time.time()
        try:
            workload(job)
            meta["status"] = "completed"
            meta["completed"] = True
        except WorkloadSkipped as why:
            meta["status"] = "skipped"
            meta["skip_reason"] = str(why)
        except torch.OutOfMemoryError as error:
            meta["status"] = "oom"
            meta["uncaught_oom"] = str(error).splitlines()[0][:300]
            meta["workload_s"] = round(time.time() - t0, 3)
            # Written here, while `error`'s traceback still holds the job's frames: the state
            # at the OOM, as a user's handler (or an OOM observer) sees it. Once the handler
            # ends, the frames die, and a MemPool among their locals runs emptyCache(pool) as
            # it goes: a synchronisation (`num_sync_all_streams`) no trace event shows when the
            # pool has nothing to release, which is teardown of the harness, not the job.
            meta["stage"] = "dump"
            write_results(torch, job, base, meta)
        if meta["stage"] != "dump":
            meta["workload_s"] = round(time.time() - t0, 3)
            meta["stage"] = "dump"
            write_results(torch, job, base, meta)
        meta["stage"] = "done"
    except BaseException as error:  # noqa: BLE001 - every failure is recorded, then reported
        meta["status"] = "failed"
        meta["error"] = f"{type(error).__name__}: {error}"[:2000]
        meta["traceback"] = traceback.format_exc()[-4000:]
        meta["config_refused"] = bool(CONFIG_ERROR.search(meta["error"]))
        if torch is not None and job is not None and job.cuda and meta["stage"] == "workload":
            # The snapshot of a failed job still helps to see why it failed.
            try:
                write_results(torch, job, base, meta)
            except BaseException as second:  # noqa: BLE001
                meta["dump_error"] = f"{type(second).__name__}: {second}"[:500]
    finally:
        if job is not None:
            meta["caught_ooms"] = job.caught_ooms
            meta["notes"] = job.notes
        meta["wall_s"] = round(time.time() - started, 3)
        write_json(base + ".meta.json", meta)
    print(f"{args.name}: {meta['status']} (stage {meta['stage']}) in {meta['wall_s']} s"
          + (f": {meta.get('error') or meta.get('skip_reason') or meta.get('uncaught_oom')}"
             if meta["status"] != "completed" else ""), flush=True)
    return 1 if meta["status"] == "failed" else 0


def write_results(torch, job, base, meta):
    """Writes memory_stats() and the snapshot (CUDA only) and adds the trace's facts to meta.

    Garbage collection is run once and then held off, so no tensor dies between the counters
    and the snapshot: both describe the same state."""
    if not job.cuda:
        return
    gc.collect()
    gc.disable()
    try:
        stats = dict(torch.cuda.memory_stats())
        write_json(base + ".stats.json", stats)
        torch.cuda.memory._dump_snapshot(base + ".pickle")
    finally:
        gc.enable()
    meta["pickle_bytes"] = os.path.getsize(base + ".pickle")
    import pickle
    with open(base + ".pickle", "rb") as f:
        meta.update(trace_facts(pickle.load(f)))


if __name__ == "__main__":
    sys.exit(main())
