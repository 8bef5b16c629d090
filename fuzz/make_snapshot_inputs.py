"""Writes the hand-made inputs of the `fuzz_snapshot` target (see README.md).

usage: python3 fuzz/make_snapshot_inputs.py      (from the repository root; standard library only)

seeds/snapshot/: small structural mutations of a PyTorch 2.11 snapshot (tests/fixtures/
pytorch-walkthrough-snapshot.pickle): every pickle protocol, keys dropped or added, the trace cut
(a wrapped ring), whole actions skipped (`skip_actions`), two devices, legacy layouts, an OOM.
The fuzz run also seeds with every fixture pickle itself (README.md has the command).

regressions/snapshot/: crafted files that once broke `gpumem replay` or must never break it,
replayed by `cargo test --test fuzz_regressions`.
"""
import copy
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "regressions", "snapshot")
SEEDS = os.path.join(HERE, "seeds", "snapshot")
WALKTHROUGH = os.path.join(HERE, "..", "tests", "fixtures", "pytorch-walkthrough-snapshot.pickle")


def write(folder, name, data):
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, name), "wb") as f:
        f.write(data)


def event(action, addr, size, frames=None):
    e = {"action": action, "addr": addr, "size": size, "stream": 0, "time_us": 1}
    e["frames"] = frames if frames is not None else []
    return e


def snapshot(trace, segments=None, **extra):
    s = {"segments": segments or [], "device_traces": [trace]}
    s.update(extra)
    return s


def regressions():
    # Issue 21's crash, scaled down: nested lists, then nested tuples one byte per level.
    write(REGRESSIONS, "deep-lists", b"\x80\x04" + b"]" * 5000 + b"a" * 4999 + b".")
    write(REGRESSIONS, "deep-tuples", b"\x80\x04N" + b"\x85" * 5000 + b".")
    # A declared length far past the end of the file.
    write(REGRESSIONS, "huge-length", b"\x80\x04\x8d" + struct.pack("<Q", 1 << 62) + b"abc.")
    # 2^40 copies if shared lists were copied out; DUP doubling the same way.
    laughs = b"\x80\x04]\x940"
    for level in range(40):
        laughs += b"(h" + bytes([level]) + b"h" + bytes([level]) + b"l\x940"
    write(REGRESSIONS, "shared-doubling", laughs + b"h" + bytes([40]) + b".")
    write(REGRESSIONS, "dup-doubling", b"\x80\x04N" + b"2\x86" * 40 + b".")
    # A segment recorded at an address whose end wraps past 2^64: the replay's device placed
    # the segment there and the allocator's arithmetic overflowed (found by the wrong-type
    # tests of tests/snapshot_limits.rs).
    trace = [event("segment_alloc", -3, 2 << 20), event("alloc", -3, 512)]
    write(REGRESSIONS, "segment-at-wrapping-address", pickle.dumps(snapshot(trace), protocol=4))


def seeds():
    with open(WALKTHROUGH, "rb") as f:
        base = pickle.load(f)
    trace = base["device_traces"][0]

    def variant(name, snap, protocol=4):
        write(SEEDS, name, pickle.dumps(snap, protocol=protocol))

    for protocol in range(0, 6):
        variant(f"walkthrough-protocol-{protocol}", base, protocol)
    variant("no-settings", {k: v for k, v in base.items() if k != "allocator_settings"})
    variant("no-traces", {"segments": base["segments"]})
    expandable = copy.deepcopy(base)
    expandable["allocator_settings"]["expandable_segments"] = True
    expandable["allocator_settings"]["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    variant("expandable-settings", expandable)
    variant("ring-wrapped", dict(base, device_traces=[trace[len(trace) // 2:]]))
    skipped = [e for e in trace if e["action"] not in ("free_requested", "free_completed")]
    variant("skip-frees", dict(base, device_traces=[skipped]))
    variant("two-devices", dict(base, device_traces=[trace, trace[:5]]))
    variant("second-device-only", dict(base, device_traces=[[], trace]))
    oom = copy.deepcopy(trace[:4])
    oom.append({"action": "oom", "device_free": 1 << 20, "size": 1 << 40, "stream": 0,
                "time_us": 1, "frames": []})
    variant("oom", dict(base, device_traces=[oom]))
    extra = copy.deepcopy(trace)
    for e in extra:
        e["pool_id"] = (0, 0)
        e["internal_metadata"] = "mallocWithAddress"
    variant("pool-and-metadata", dict(base, device_traces=[extra]))
    markers = [{"action": "user_defined", "addr": 0, "size": 0, "stream": 0, "time_us": 1,
                "frames": [{"name": "START", "filename": "forward", "line": 0}]}]
    variant("user-defined", dict(base, device_traces=[markers + trace]))
    variant("legacy-list", base["segments"], protocol=2)
    legacy = copy.deepcopy(base["segments"])
    for segment in legacy:
        for block in segment["blocks"]:
            frames = block.pop("frames")
            block["history"] = [{"addr": block["address"], "real_size": block.pop("requested_size"),
                                 "frames": frames}]
            del block["address"]
    variant("legacy-history", {"segments": legacy, "device_traces": [trace]}, protocol=2)
    xpu = copy.deepcopy(base)
    for e in xpu["device_traces"][0]:
        if e["addr"]:
            e["addr"] += 0xFFFF_0000_0000_0000 - 0x7F00_0000_0000
    for segment in xpu["segments"]:
        segment["address"] += 0xFFFF_0000_0000_0000 - 0x7F00_0000_0000
        for block in segment["blocks"]:
            block["address"] += 0xFFFF_0000_0000_0000 - 0x7F00_0000_0000
    variant("xpu-addresses", xpu)


if __name__ == "__main__":
    regressions()
    seeds()
