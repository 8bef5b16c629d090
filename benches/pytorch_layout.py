#!/usr/bin/env python3
"""Re-pickle a snapshot in the layout PyTorch's own snapshots have, for `gpumem bench replay`.

`gpumem bench replay --keep` writes its synthetic snapshot with serde-pickle: every key and
string written out, nothing memoized. PyTorch's `_dump_snapshot` pickles with Python's pickler
what its C++ writer built: key and action strings shared (memoized once, fetched with BINGET
after), and in every trace entry a new `compile_context` string object and a new `frames` list
(each memoized anew). This script rebuilds that sharing and writes protocol 4, so the reader's
speed and memory can be measured on the layout users' files have.

    gpumem bench replay --events 2000000 --file /tmp/s2m.pickle --keep
    python3 benches/pytorch_layout.py /tmp/s2m.pickle /tmp/s2m-torch.pickle
    gpumem bench replay --file /tmp/s2m-torch.pickle
"""

import pickle
import sys


def main(source: str, target: str) -> None:
    with open(source, "rb") as f:
        snapshot = pickle.load(f)
    shared: dict[str, str] = {}

    def share(text: str) -> str:
        return shared.setdefault(text, text)

    for trace in snapshot.get("device_traces", []):
        for i, entry in enumerate(trace):
            rebuilt = {}
            for key, value in entry.items():
                key = share(key)
                if key == "compile_context":
                    value = "".join(["N", "/A"]) if value == "N/A" else "".join([value])
                elif key == "frames":
                    value = list(value)
                elif isinstance(value, str):
                    value = share(value)
                rebuilt[key] = value
            trace[i] = rebuilt
    with open(target, "wb") as f:
        pickle.dump(snapshot, f, protocol=4)


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit("usage: pytorch_layout.py SOURCE.pickle TARGET.pickle")
    main(sys.argv[1], sys.argv[2])
