"""Replays PyTorch's recorded allocator traces through the gpumem binary on a device and compares
every recorded counter after every op (the GPU-side twin of tests/pytorch_traces.rs).

usage: traces.py GPUMEM DEVICE FIXTURE.json[.gz] [...]
Each fixture becomes one Rhai script: the traces' ops on 12 slots, `memory_stats()` printed after
every op, run with the fixture's allocator config and memory fraction (on a card of another
size than the recording's, given in the CARD_TOTAL environment variable, the fraction that
gives the recording's cap in bytes). An allocation the
recording made on its second stream (op `["alloc", k, n, "stream1"]`) is made inside
`with_stream(side, ...)` on a stream the script creates, so it draws from that stream's pools as
PyTorch's did. Prints one line per fixture and `FAIL` lines for the first mismatches; exits 1 on
any mismatch. tests/stream_traces.rs runs the same scripts on sim in `cargo test`.
"""
import gzip
import json
import os
import subprocess
import sys

# Counters the shared fixtures count from each trace's start (their README); the recorded .gz
# fixtures reset every accumulated counter at each trace start instead.
PER_TRACE = ["num_alloc_retries", "num_device_alloc", "num_device_free", "num_ooms"]


def load(path):
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rt") as f:
        return json.load(f)


def fraction_on_card(fixture, card_total):
    """The memory fraction that gives the recording's cap (its fraction of the memory it was
    recorded on) on a card of `card_total` bytes; None where that card is too small for it."""
    fraction = float(fixture["memory_fraction"])
    recorded = fixture.get("total_memory")
    if not card_total or not recorded or card_total == recorded:
        return fraction
    scaled = fraction * recorded / card_total
    return scaled if scaled <= 1.0 else None


def script_for(fixture, keys, fraction):
    lines = ["let slots = [(), (), (), (), (), (), (), (), (), (), (), ()];"]
    if fixture.get("streams"):
        lines.append("let side = stream();")
    if fixture["memory_fraction"] < 1.0:
        lines.append(f"set_per_process_memory_fraction({fraction!r});")
    resets = fixture.get("per_trace_counters", "").startswith("all")
    for t, trace in enumerate(fixture["traces"]):
        lines.append("slots = [(), (), (), (), (), (), (), (), (), (), (), ()];")
        lines.append("synchronize(); empty_cache(); reset_peak_memory_stats();")
        if resets:
            lines.append("reset_accumulated_memory_stats();")
        lines.append(f'print("T {t} " + memory_stats().to_json());')
        for i, step in enumerate(trace["ops"]):
            op = step["op"]
            if op[0] == "alloc":
                make = f'empty({op[2]}, "uint8")'
                if "stream1" in op[3:]:
                    make = f"with_stream(side, || {make})"
                lines.append(f'try {{ slots[{op[1]}] = {make}; print("A {t} {i} ok"); }} '
                             f'catch (e) {{ print("A {t} {i} oom"); }}')
            elif op[0] == "free":
                lines.append(f"slots[{op[1]}] = ();")
            else:
                lines.append("empty_cache();")
            lines.append(f'print("S {t} {i} " + memory_stats().to_json());')
    return "\n".join(lines) + "\n"


def main():
    gpumem, device, paths = sys.argv[1], sys.argv[2], sys.argv[3:]
    failures = 0
    for path in paths:
        fixture = load(path)
        keys = sorted(fixture["traces"][0]["ops"][0]["stats"])
        card_total = int(os.environ.get("CARD_TOTAL") or 0)
        fraction = fixture["memory_fraction"]
        if fraction < 1.0:
            fraction = fraction_on_card(fixture, card_total)
            if fraction is None:
                print(f"FAIL {path}: its cap does not fit a card of {card_total} bytes")
                failures += 1
                continue
            if fraction != fixture["memory_fraction"]:
                print(f"{os.path.basename(path)}: fraction {fixture['memory_fraction']} of "
                      f"{fixture['total_memory']} bytes given as {fraction!r} of {card_total}")
        script = f"/tmp/gpumem-trace-{os.path.basename(path)}.rhai"
        open(script, "w").write(script_for(fixture, keys, fraction))
        run = subprocess.run([gpumem, "--device", device, "--alloc-conf", fixture["alloc_conf"],
                              "--max-operations", "0", "run", script],
                             capture_output=True, text=True)
        if run.returncode != 0:
            print(f"FAIL {path}: exit {run.returncode}: {run.stderr[-800:]}")
            failures += 1
            continue
        base, stats, outcome = {}, {}, {}
        for line in run.stdout.splitlines():
            kind, rest = line[:1], line[2:]
            if kind == "T":
                t, js = rest.split(" ", 1)
                base[int(t)] = json.loads(js)
            elif kind == "S":
                t, i, js = rest.split(" ", 2)
                stats[(int(t), int(i))] = json.loads(js)
            elif kind == "A":
                t, i, what = rest.split(" ")
                outcome[(int(t), int(i))] = what
        resets = fixture.get("per_trace_counters", "").startswith("all")
        compared = mismatches = 0
        for t, trace in enumerate(fixture["traces"]):
            for i, step in enumerate(trace["ops"]):
                op = step["op"]
                if op[0] == "alloc":
                    expected = "oom" if op[-1] == "oom" else "ok"
                    if outcome.get((t, i)) != expected:
                        mismatches += 1
                        if mismatches <= 5:
                            print(f"FAIL {os.path.basename(path)} trace {t} op {i} {op}: "
                                  f"gpumem {outcome.get((t, i))}, PyTorch {expected}")
                got = stats.get((t, i), {})
                for key, want in step["stats"].items():
                    value = got.get(key)
                    if value is not None and not resets and key in PER_TRACE:
                        value -= base[t].get(key, 0)
                    compared += 1
                    if value != want:
                        mismatches += 1
                        if mismatches <= 5:
                            print(f"FAIL {os.path.basename(path)} trace {t} op {i} {op} {key}: "
                                  f"gpumem {value}, PyTorch {want}")
        print(f"{os.path.basename(path)} on {device}: {compared} counters compared, {mismatches} differ")
        failures += mismatches > 0
    sys.exit(1 if failures else 0)


main()
