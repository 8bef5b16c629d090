"""PyTorch's side of `gpumem bench randn`: times torch.randn's normal_ on the same shape.

Prints one line, `torch_tbps=<TB/s> ms=<ms per call> torch=<version>`, timed with CUDA events
over the same number of repetitions after a warm-up, counting bytes written.
"""
import sys

import torch

reps = int(sys.argv[1]) if len(sys.argv) > 1 else 20
shape = (200, 300, 200, 20)
t = torch.empty(shape, device="cuda")
t.normal_()  # warm-up
torch.cuda.synchronize()
start = torch.cuda.Event(enable_timing=True)
stop = torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(reps):
    t.normal_()
stop.record()
stop.synchronize()
ms = start.elapsed_time(stop) / reps
print(f"torch_tbps={t.numel() * 4 / (ms * 1e-3) / 1e12:.3f} ms={ms:.4f} torch={torch.__version__}")
