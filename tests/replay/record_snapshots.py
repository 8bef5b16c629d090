"""Records PyTorch memory snapshots of real workloads, the reference data for `gpumem replay`.

usage: python3 record_snapshots.py OUTDIR WORKLOAD [WORKLOAD...]
WORKLOAD: transformer_fp32 | transformer_bf16 | inference | convnet
The allocator config comes from PYTORCH_CUDA_ALLOC_CONF, read by PyTorch at start-up, so run
one process per config (tests/gpu/record/run_all.sh does both: default and
expandable_segments:True).

For each workload it writes OUTDIR/WORKLOAD.<label>.pickle (torch.cuda.memory._dump_snapshot:
segments, device_traces with Python stacks, allocator_settings) and OUTDIR/WORKLOAD.<label>.json
with what the replay must reproduce: PyTorch's final memory_stats(), the device's total memory
and the number of trace events. <label> is "default" or "expandable".
History recording starts before the first CUDA allocation, so the trace holds every event of
the process and a replay can start from an empty allocator.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

out_dir = sys.argv[1]
workloads = sys.argv[2:]
conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
label = "expandable" if "expandable_segments:True" in conf else "default"
dev = torch.device("cuda:0")


class TinyTransformer(nn.Module):
    """A small decoder-style language model: embedding, 4 encoder layers, a vocabulary head."""

    def __init__(self, vocab=8000, d_model=384, heads=6, layers=4):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.1,
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        seq = tokens.shape[1]
        mask = torch.triu(torch.full((seq, seq), float("-inf"), device=tokens.device), 1)
        return self.head(self.blocks(self.embed(tokens), mask=mask, is_causal=True))


def transformer_training(autocast_dtype):
    torch.manual_seed(0)
    model = TinyTransformer().to(dev)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4)
    for step in range(5):
        tokens = torch.randint(0, 8000, (16, 256), device=dev)
        with torch.autocast("cuda", dtype=autocast_dtype, enabled=autocast_dtype is not None):
            logits = model(tokens[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(),
                                   tokens[:, 1:].reshape(-1))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del logits, loss, tokens
    torch.cuda.synchronize()


def inference():
    torch.manual_seed(1)
    model = TinyTransformer().to(dev).eval()
    lengths = [37, 256, 64, 512, 128, 300, 17, 480, 200, 96, 384, 50]
    with torch.no_grad():
        for i, seq in enumerate(lengths):
            tokens = torch.randint(0, 8000, (8 if seq > 256 else 16, seq), device=dev)
            logits = model(tokens)
            next_tokens = logits[:, -1].argmax(-1)
            del logits, tokens, next_tokens
    torch.cuda.synchronize()


class SmallResNet(nn.Module):
    def __init__(self, classes=100):
        super().__init__()
        def block(cin, cout, stride):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout),
                                 nn.ReLU(inplace=True), nn.Conv2d(cout, cout, 3, 1, 1, bias=False),
                                 nn.BatchNorm2d(cout), nn.ReLU(inplace=True))
        self.stem = nn.Sequential(nn.Conv2d(3, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())
        self.layers = nn.Sequential(block(64, 64, 1), block(64, 128, 2), block(128, 256, 2), block(256, 512, 2))
        self.fc = nn.Linear(512, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def convnet():
    torch.manual_seed(2)
    torch.backends.cudnn.benchmark = False
    model = SmallResNet().to(dev)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4)
    for step in range(5):
        images = torch.randn(128, 3, 64, 64, device=dev)
        labels = torch.randint(0, 100, (128,), device=dev)
        loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        del images, labels, loss
    torch.cuda.synchronize()


WORKLOADS = {
    "transformer_fp32": lambda: transformer_training(None),
    "transformer_bf16": lambda: transformer_training(torch.bfloat16),
    "inference": inference,
    "convnet": convnet,
}

for name in workloads:
    # One workload per process keeps each trace starting from an empty allocator.
    assert len(workloads) == 1, "run one workload per process"
    torch.cuda.memory._record_memory_history(max_entries=10_000_000, stacks="python")
    WORKLOADS[name]()
    base = os.path.join(out_dir, f"{name}.{label}")
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._dump_snapshot(base + ".pickle")
    events = snapshot["device_traces"][0]
    actions = {}
    for e in events:
        actions[e["action"]] = actions.get(e["action"], 0) + 1
    json.dump({
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "workload": name,
        "alloc_conf": conf,
        "total_memory": torch.cuda.get_device_properties(0).total_memory,
        "memory_stats": dict(torch.cuda.memory_stats()),
        "events": len(events),
        "actions": actions,
        "streams": sorted({e["stream"] for e in events}),
    }, open(base + ".json", "w"), indent=1)
    print(f"{name} [{label}]: {len(events)} events {actions} -> {base}.pickle "
          f"({os.path.getsize(base + '.pickle')} bytes)")
