"""Rewrites when a snapshot's deferred frees complete, to tell whether a what-if pair differs by
the GPU's timing alone (as `gpumem replay --addresses-from` tells it for the driver's placement).

A free deferred by `record_stream` completes when the side stream's work is done, which the
trace of one process records and no other process repeats. A what-if replay of the base run
completes each one where the base run did (and on its own OOM path); PyTorch's run under the
other config completed them where its GPU had finished. Replaying the base run with the run's
completion points puts the two on the same timing.

usage:
  python3 retime.py BASE.pickle OUT.pickle --as-run RUN.pickle
      every deferred free the run completed before its first OOM (or at all, without one)
      completes after the same number of requests as in the run
  python3 retime.py BASE.pickle OUT.pickle --at-once
      every deferred free that completes at all completes right at its request (the GPU idle)

Then: gpumem replay OUT.pickle --alloc-conf "CONF,per_process_memory_fraction:F" --device
sim:TOTAL, as compare.py replays the pair.
"""
import argparse
import pickle

import sequences


def allocation_ordinals(trace):
    """{index of each `free_completed` of an allocated block: that block's allocation
    ordinal}, counted from 0 as `sequences.completions` counts them."""
    ordinal_at, ordinals, ordinal = {}, {}, 0
    for index, event in enumerate(trace):
        if event["action"] == "alloc":
            ordinal_at[event["addr"]] = ordinal
            ordinal += 1
        elif event["action"] == "free_completed" and event["addr"] in ordinal_at:
            ordinals[index] = ordinal_at.pop(event["addr"])
    return ordinals


def as_run(base_trace, run_trace):
    """The base trace with its completions moved to the run's points (module docstring)."""
    oom = next((i for i, e in enumerate(run_trace) if e["action"] == "oom"), len(run_trace))
    in_run = sequences.completions(run_trace[:oom])
    in_base = sequences.completions(base_trace)
    moved_to = {block: facts[0] for block, facts in in_run.items()
                if block in in_base and facts[0] != in_base[block][0]}
    ordinals = allocation_ordinals(base_trace)
    dropped, after_request = set(), {}
    for index, block in ordinals.items():
        if block in moved_to:
            dropped.add(index)
            after_request.setdefault(moved_to[block], []).append(base_trace[index])
    out, requests = list(after_request.get(0, [])), 0
    for index, event in enumerate(base_trace):
        if index in dropped:
            continue
        out.append(event)
        if event["action"] in ("alloc", "free_requested"):
            requests += 1
            out += after_request.get(requests, [])
    return out, len(dropped)


def at_once(trace):
    """The trace with every deferred free that completes at all completed at its request."""
    completes, requested_at = set(), {}
    for index, event in enumerate(trace):
        if event["action"] == "free_requested":
            requested_at[event["addr"]] = index
        elif event["action"] == "free_completed" and event["addr"] in requested_at:
            completes.add(requested_at.pop(event["addr"]))
    out, moved, count = [], set(), 0
    for index, event in enumerate(trace):
        if event["action"] == "free_completed" and event["addr"] in moved:
            moved.discard(event["addr"])
            continue
        out.append(event)
        if event["action"] == "free_requested" and index in completes:
            out.append(dict(event, action="free_completed"))
            moved.add(event["addr"])
            count += 1
    return out, count


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("base")
    parser.add_argument("out")
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--as-run", metavar="RUN")
    mode.add_argument("--at-once", action="store_true")
    args = parser.parse_args(argv)
    with open(args.base, "rb") as f:
        snapshot = pickle.load(f)
    trace = snapshot["device_traces"][0]
    if args.as_run:
        with open(args.as_run, "rb") as f:
            run_trace = pickle.load(f)["device_traces"][0]
        snapshot["device_traces"][0], moved = as_run(trace, run_trace)
    else:
        snapshot["device_traces"][0], moved = at_once(trace)
    with open(args.out, "wb") as f:
        pickle.dump(snapshot, f)
    print(f"{moved} completions moved")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
