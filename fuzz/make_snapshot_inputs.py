"""Writes the hand-made inputs of the `fuzz_snapshot` target (see README.md).

usage: python3 fuzz/make_snapshot_inputs.py      (from the repository root; standard library only)

regressions/snapshot/: crafted files that once broke `gpumem replay` or must never break it,
replayed by `cargo test --test fuzz_regressions`.
"""
import os
import pickle
import struct

HERE = os.path.dirname(os.path.abspath(__file__))
REGRESSIONS = os.path.join(HERE, "regressions", "snapshot")


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


if __name__ == "__main__":
    regressions()
