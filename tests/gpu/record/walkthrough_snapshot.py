"""PyTorch's memory snapshot of the seed walkthrough (scripts/walkthrough.rhai's steps), the
reference a gpumem snapshot of the same steps is compared with (issue 10).

usage: python3 walkthrough_snapshot.py OUT.pickle
Records history from the start, runs the steps, dumps the snapshot with
torch.cuda.memory._dump_snapshot, and prints the keys of every level of the file.
"""
import pickle
import sys

import torch

out = sys.argv[1]
torch.cuda.memory._record_memory_history(max_entries=100000, stacks="python")
x = torch.randn((2, 3), device="cuda")
y = torch.randn((200, 300, 200, 20), device="cuda")
for _ in range(8):
    y = torch.randn((200, 300, 200, 20), device="cuda")
torch.cuda.empty_cache()
y = 2
torch.cuda.empty_cache()
torch.cuda.memory._dump_snapshot(out)
data = pickle.load(open(out, "rb"))
print("top:", sorted(data))
print("segment keys:", sorted(data["segments"][0]))
print("block keys:", sorted(data["segments"][0]["blocks"][0]))
print("trace keys:", sorted(data["device_traces"][0][0]))
print("frame keys:", sorted(data["device_traces"][0][0]["frames"][0]) if data["device_traces"][0][0]["frames"] else "no frames")
print("allocator_settings:", data.get("allocator_settings"))
print("actions:", [e["action"] for e in data["device_traces"][0]])
