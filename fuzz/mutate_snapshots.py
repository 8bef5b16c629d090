#!/usr/bin/env python3
"""Structure-aware mutation of real snapshots, replayed by the `gpumem` binary.

AFL's byte mutations (fuzz_snapshot) mostly break the pickle itself, so the reader refuses
them before the replay sees an event. This script changes what a damaged or hand-edited file
would change instead, inside a valid pickle: an event's size, address, stream or action made
wrong (negative, 2^64, a string, None, another event's address), events dropped, swapped or
duplicated, the trace cut as a wrapped ring would cut it, segment and block fields and
allocator_settings made wrong, segments dropped. Each mutant is replayed through the whole
`gpumem replay` (random what-if config, capacity, --compare, --min-capacity, --placement
model, --json, --report), and must end with exit 0, 2 (a clean refusal) or 3, never a panic
or a hang.

usage: python3 fuzz/mutate_snapshots.py --gpumem target/release/gpumem [--seed 1] [-n 500]
           [--show-errors 0.1] SNAPSHOT...

Standard library only. Snapshots are read with an unpickler that builds no objects. Prints
every failure (the mutant kept beside it as bad-SEED-N.pickle in --keep) and a tally of exit
statuses; exit status 1 if any failed.
"""
import argparse
import collections
import copy
import io
import os
import pickle
import shutil
import random
import subprocess
import sys
import tempfile
import time

CONFIGS = ["", "max_split_size_mb:64", "expandable_segments:True",
           "garbage_collection_threshold:0.6,per_process_memory_fraction:0.5",
           "roundup_power2_divisions:4", "large_segment_size_mb:64",
           "per_process_memory_fraction:0.004",
           "max_split_size_mb:20,expandable_segments:True,garbage_collection_threshold:0.9",
           "max_split_size_mb:128,per_process_memory_fraction:0.003",
           "expandable_segments:True,per_process_memory_fraction:0.004"]
CAPACITIES = ["64MiB", "200MiB", "500MiB", "761MiB", "1GiB", "24GiB"]
# Values no PyTorch writer produces: each must be refused by name, or read as PyTorch would.
WRONG = [0, -1, -(1 << 40), 1, 511, 513, 1 << 62, (1 << 64) - 1, 1 << 64, 2 ** 70, 3.5, "x",
         None, True, [], {}]
ACTIONS = ["alloc", "free_requested", "free_completed", "segment_alloc", "segment_free",
           "segment_map", "segment_unmap", "oom", "snapshot", "empty_cache", "bogus"]


class NoObjects(pickle.Unpickler):
    """Refuses every global: a snapshot is dicts, lists, tuples, strings and numbers."""

    def find_class(self, module, name):
        raise pickle.UnpicklingError(f"refusing to build {module}.{name}")


def load(path):
    with open(path, "rb") as f:
        return NoObjects(io.BytesIO(f.read())).load()


def mutate(snapshot, rng):
    """A deep copy of `snapshot` with one to four changes, and their description."""
    snapshot = copy.deepcopy(snapshot)
    done = []
    traces = snapshot.get("device_traces") if isinstance(snapshot, dict) else None
    trace = traces[0] if traces else []
    segments = snapshot.get("segments", []) if isinstance(snapshot, dict) else []
    for _ in range(rng.randint(1, 4)):
        if not trace:
            break
        kind = rng.randrange(12)
        i = rng.randrange(len(trace))
        event = trace[i]
        if kind == 0:
            del trace[i]
            done.append(f"drop {i}")
        elif kind == 1:
            event["size"] = rng.choice(WRONG + [event.get("size", 0) * 2])
            done.append(f"size {i}={event['size']!r}")
        elif kind == 2:
            event["addr"] = rng.choice(WRONG + [trace[rng.randrange(len(trace))].get("addr")])
            done.append(f"addr {i}={event['addr']!r}")
        elif kind == 3:
            event["action"] = rng.choice(ACTIONS)
            done.append(f"action {i}={event['action']}")
        elif kind == 4:
            event["stream"] = rng.choice([0, 1, 7, 94_000_000_000, -1, "s", 1 << 64])
            done.append(f"stream {i}={event['stream']!r}")
        elif kind == 5:
            j = rng.randrange(len(trace))
            trace[i], trace[j] = trace[j], trace[i]
            done.append(f"swap {i},{j}")
        elif kind == 6:
            trace.insert(i, copy.deepcopy(event))
            done.append(f"duplicate {i}")
        elif kind == 7:
            del trace[:i]
            done.append(f"ring from {i}")
        elif kind == 8 and segments:
            segment = rng.choice(segments)
            key = rng.choice(["total_size", "address", "stream", "segment_pool_id",
                              "is_expandable", "segment_type"])
            segment[key] = rng.choice(WRONG + [(1, 2)])
            done.append(f"segment {key}={segment[key]!r}")
        elif kind == 9 and isinstance(snapshot.get("allocator_settings"), dict):
            settings = snapshot["allocator_settings"]
            key = rng.choice(sorted(settings))
            settings[key] = rng.choice(WRONG + ["max_split_size_mb:1", 0.5, 1e300])
            done.append(f"setting {key}={settings[key]!r}")
        elif kind == 10 and event:
            key = rng.choice(sorted(event))
            event.pop(key)
            done.append(f"no {key} in {i}")
        elif kind == 11 and segments:
            if rng.random() < 0.5:
                del segments[rng.randrange(len(segments))]
                done.append("drop a segment")
            elif segments[0].get("blocks"):
                block = rng.choice(rng.choice(segments).get("blocks") or [{}])
                key = rng.choice(["size", "state", "address", "requested_size"])
                block[key] = rng.choice(WRONG + ["active_allocated", "active_pending_free",
                                                 "inactive"])
                done.append(f"block {key}={block[key]!r}")
    return snapshot, "; ".join(done)


def options(rng, scratch):
    """A random `gpumem replay` command line after the file."""
    args = []
    if rng.random() < 0.5:
        args += ["--alloc-conf", rng.choice(CONFIGS)]
    if rng.random() < 0.5:
        args += ["--capacity", rng.choice(CAPACITIES)]
    pick = rng.random()
    if pick < 0.1:
        args += ["--min-capacity"]
    elif pick < 0.2:
        args += ["--compare", rng.choice(CONFIGS), rng.choice(CONFIGS)]
    if rng.random() < 0.15:
        args += ["--placement", "model"]
    if rng.random() < 0.3:
        args += ["--json"]
    if rng.random() < 0.05:
        args += ["--report", os.path.join(scratch, "report.html")]
    return args


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("snapshots", nargs="+")
    p.add_argument("--gpumem", required=True)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("-n", type=int, default=500, help="mutants to replay")
    p.add_argument("--timeout", type=float, default=120)
    p.add_argument("--keep", default=".", help="where failing mutants are written")
    p.add_argument("--show-errors", type=float, default=0.0,
                   help="print this share of the refusals, to read their messages")
    args = p.parse_args(argv)
    rng = random.Random(args.seed)
    loaded = {}
    tally = collections.Counter()
    failures = 0
    with tempfile.TemporaryDirectory(prefix="mutate-") as scratch:
        mutant_path = os.path.join(scratch, "mutant.pickle")
        for n in range(args.n):
            source = rng.choice(args.snapshots)
            if source not in loaded:
                loaded[source] = load(source)
            mutant, what = mutate(loaded[source], rng)
            with open(mutant_path, "wb") as f:
                pickle.dump(mutant, f, protocol=rng.choice([2, 4, 5]))
            command = [args.gpumem, "replay", mutant_path] + options(rng, scratch)
            started = time.time()
            try:
                done = subprocess.run(command, capture_output=True, timeout=args.timeout)
                status, stderr = done.returncode, done.stderr.decode(errors="replace")
            except subprocess.TimeoutExpired:
                status, stderr = "timeout", ""
            tally[status] += 1
            label = f"{os.path.basename(source)} [{what}] {' '.join(command[3:])}"
            if status not in (0, 2, 3) or "panicked" in stderr:
                failures += 1
                os.makedirs(args.keep, exist_ok=True)
                kept = os.path.join(args.keep, f"bad-{args.seed}-{n}.pickle")
                shutil.move(mutant_path, kept)
                print(f"FAIL exit {status} after {time.time() - started:.1f} s: {label}\n"
                      f"  kept as {kept}\n{stderr[-2000:]}", flush=True)
            elif status == 2 and rng.random() < args.show_errors:
                print(f"refused: {label}\n  {stderr.strip()[:400]}", flush=True)
    print(f"{args.n} mutants, exit statuses {dict(tally)}, {failures} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
