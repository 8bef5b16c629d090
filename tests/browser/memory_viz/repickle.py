#!/usr/bin/env python3
"""Load a snapshot pickle with Python's pickle and dump it again, as `python -m
torch.cuda._memory_viz trace_plot|segment_plot FILE` does before embedding it (_format_viz:
pickle.load, then pickle.dumps with the default protocol). Needs no torch: a snapshot is plain
dicts, lists, strings, numbers. Usage: repickle.py IN OUT"""
import pickle
import sys

with open(sys.argv[1], "rb") as f:
    data = pickle.load(f)
with open(sys.argv[2], "wb") as f:
    f.write(pickle.dumps(data))
print(f"{sys.argv[1]}: protocol {pickle.DEFAULT_PROTOCOL}, "
      f"{len(data.get('segments', []))} segments, "
      f"{[len(t) for t in data.get('device_traces', [])]} trace events per device")
