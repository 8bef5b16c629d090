"""Makes wrapped-history copies of recorded runs, for compare.py to judge gpumem's replay of a
trace that starts mid-run, without a GPU.

PyTorch's `_record_memory_history(max_entries=K)` keeps a device's last K trace entries in a
ring (`RingBuffer`); the snapshot's segments are the end state either way. So a run recorded
with the whole history, its trace cut to its last K entries, is the snapshot the same run
would have written with `max_entries=K`. Its `memory_stats()` are the run's own. A copy is
written for each kept fraction of the trace (default: 60%, 25% and 5%), named
`RUN.ringNN`, as a `special` run (self-replay only: compare.py checks its current counters,
its peaks against the whole run's, and its segment events in the window).

    python3 ringcut.py results-wave10 /tmp/rings-wave10 [--keep 0.6,0.25,0.05] [--only REGEX]
    python3 compare.py /tmp/rings-wave10 --gpumem ../../../target/release/gpumem
"""
import argparse
import json
import os
import pickle
import re
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from compare import load_runs, runs_folder  # noqa: E402
from sequences import load_snapshot  # noqa: E402


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("results", help="folder with whatif-results-*.tar, or with runs/")
    parser.add_argument("out", help="where to write the copies (OUT/runs/)")
    parser.add_argument("--keep", default="0.6,0.25,0.05",
                        help="fractions of each trace to keep, comma-separated (0 < f < 1)")
    parser.add_argument("--only", default="", help="copy only runs whose name matches this regex")
    parser.add_argument("--unpack-to", default="", help="where to unpack the tars")
    args = parser.parse_args(argv)
    try:
        args.keep = [float(f) for f in args.keep.split(",")]
    except ValueError:
        parser.error(f"--keep: not a list of numbers: {args.keep!r}")
    if not all(0 < f < 1 for f in args.keep):
        parser.error(f"--keep: each fraction must lie strictly between 0 and 1: {args.keep}")
    return args


def wrapped(snapshot, kept):
    """The snapshot as a ring of `kept` entries leaves it: device 0's last `kept` trace
    entries (the replay reads the first device with events), everything else as recorded."""
    traces = list(snapshot.get("device_traces") or [])
    copy = dict(snapshot)
    copy["device_traces"] = [traces[0][-kept:]] + traces[1:]
    return copy


def cut(run, keep, out_runs):
    """Writes the wrapped copies of one recorded run; returns their names."""
    snapshot = load_snapshot(run.pickle)
    traces = snapshot.get("device_traces") or []
    events = len(traces[0]) if traces else 0
    names = []
    for fraction in keep:
        kept = int(events * fraction)
        if kept < 1 or kept >= events:
            continue
        name = f"{run.name}.ring{round(fraction * 100):02d}"
        meta = dict(run.meta, name=name, role="special", max_entries=kept,
                    note=f"{run.name}'s trace cut to its last {kept} of {events} entries "
                         "(ringcut.py)")
        meta.pop("base", None)
        meta["history"] = dict(run.meta["history"], max_entries=kept)
        with open(os.path.join(out_runs, name + ".pickle"), "wb") as f:
            pickle.dump(wrapped(snapshot, kept), f)
        with open(os.path.join(out_runs, name + ".meta.json"), "w") as f:
            json.dump(meta, f, indent=1)
        with open(os.path.join(out_runs, name + ".stats.json"), "w") as f:
            json.dump(run.stats, f)
        names.append(name)
    return names


def main(argv=None):
    args = parse_args(argv)
    runs = load_runs(runs_folder(args.results, args.unpack_to), args.only)
    out_runs = os.path.join(args.out, "runs")
    os.makedirs(out_runs, exist_ok=True)
    written = []
    for run in runs.values():
        # Only runs with a whole history: a run without one has no trace to cut, and one
        # recorded wrapped already is not the whole run's.
        history = run.meta.get("history") or {}
        if (not run.recorded or run.meta.get("role") == "warmup" or not history
                or re.search(r"\.ring\d+$", run.name)
                or history.get("max_entries", 0) <= run.meta.get("events", 0)):
            continue
        written += cut(run, args.keep, out_runs)
    print(f"{len(written)} wrapped copies written to {out_runs}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
