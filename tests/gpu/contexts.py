#!/usr/bin/env python3
"""When does a CUDA context come into being? gpumem's model (docs/devices.md) against PyTorch.

usage: python3 contexts.py GPUMEM

Each case runs a few calls in a fresh PyTorch process and the same calls in a fresh
`gpumem --device cuda:0 run` process, then reads which devices hold a CUDA context:
PyTorch's through the driver (cuDevicePrimaryCtxGetState, which creates nothing), gpumem's
through its own NVML view (device_memory(i).process_bytes > 0). The two-device cases run only
where two GPUs are visible. Prints one line per case and exits 1 on any difference.
"""
import ast
import os
import subprocess
import sys
import tempfile

# (name, GPUs needed, PyTorch statements, gpumem statements)
CASES = [
    ("nothing", 1, "pass", "let nothing = 0;"),
    ("counters and summaries", 1,
     "torch.cuda.memory_allocated(); torch.cuda.memory_stats(); torch.cuda.memory_summary(); torch.cuda.memory_snapshot()",
     "memory_allocated(); memory_stats(); memory_summary(); memory_snapshot();"),
    ("empty_cache", 1, "torch.cuda.empty_cache()", "empty_cache();"),
    ("device_count, current_device", 1,
     "torch.cuda.device_count(); torch.cuda.current_device()",
     "device_count(); current_device();"),
    ("manual_seed", 1, "torch.manual_seed(1)", "manual_seed(1);"),
    ("a tensor of 0 bytes", 1, "t = torch.empty(0, device='cuda')", "let t = empty(0, \"uint8\");"),
    ("a tensor", 1, "t = torch.randn(8, device='cuda')", "let t = randn(8);"),
    ("synchronize", 1, "torch.cuda.synchronize()", "synchronize();"),
    ("mem_get_info", 1, "torch.cuda.mem_get_info()", "mem_get_info();"),
    ("set_device(0)", 1, "torch.cuda.set_device(0)", "set_device(0);"),
    ("with device(0)", 1, "with torch.cuda.device(0):\n    pass", "with_device(0, || ());"),
    ("with device(1), a tensor there", 2,
     "with torch.cuda.device(1):\n    t = torch.randn(8, device='cuda')",
     "let t = with_device(1, || randn(8));"),
    ("... then synchronize", 2,
     "with torch.cuda.device(1):\n    t = torch.randn(8, device='cuda')\ntorch.cuda.synchronize()",
     "let t = with_device(1, || randn(8));\nsynchronize();"),
    ("set_device(1)", 2, "torch.cuda.set_device(1)", "set_device(1);"),
    ("current and default stream", 1,
     "torch.cuda.current_stream(); torch.cuda.default_stream()",
     "current_stream(); default_stream();"),
    ("a stream", 1, "s = torch.cuda.Stream()", "let s = stream();"),
    ("a stream of device 1", 2, "s = torch.cuda.Stream(device=1)", "let s = stream(1);"),
    ("with stream(s) of device 1", 2,
     "s = torch.cuda.Stream(device=1)\nwith torch.cuda.stream(s):\n    pass",
     "let s = stream(1);\nwith_stream(s, || ());"),
    ("a copy from device 1 to 0", 2,
     "with torch.cuda.device(1):\n    t = torch.randn(8, device='cuda')\nu = t.to(0)",
     "let t = with_device(1, || randn(8));\nlet u = t.to(0);"),
]

TORCH_PROBE = """
import ctypes
cuda = ctypes.CDLL("libcuda.so.1")
cuda.cuInit(0)
states = []
for i in range({count}):
    dev, flags, active = ctypes.c_int(), ctypes.c_uint(), ctypes.c_int()
    cuda.cuDeviceGet(ctypes.byref(dev), i)
    cuda.cuDevicePrimaryCtxGetState(dev, ctypes.byref(flags), ctypes.byref(active))
    states.append(bool(active.value))
print(states)
"""

GPUMEM_PROBE = """
let states = [];
for i in 0..{count} {{ states.push(device_memory(i).process_bytes > 0); }}
print(states);
"""


def last_list(text):
    """The last line of `text` read as a list of booleans (Python's or Rhai's spelling)."""
    line = text.strip().splitlines()[-1]
    return ast.literal_eval(line.replace("true", "True").replace("false", "False"))


def torch_states(statements, count):
    code = "import torch\n" + statements + "\n" + TORCH_PROBE.format(count=count)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return last_list(out.stdout)


def gpumem_states(gpumem, statements, count):
    with tempfile.NamedTemporaryFile("w", suffix=".rhai", delete=False) as script:
        script.write(statements + "\n" + GPUMEM_PROBE.format(count=count))
    try:
        out = subprocess.run([gpumem, "--device", "cuda:0", "run", script.name],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(script.name)
    return last_list(out.stdout)


def main():
    gpumem = sys.argv[1]
    import torch
    gpus = torch.cuda.device_count()
    count = min(gpus, 2)
    print(f"{gpus} GPU(s) visible; contexts of devices 0..{count - 1} after each case")
    differ = 0
    for name, needed, torch_code, gpumem_code in CASES:
        if needed > gpus:
            print(f"SKIP {name}: needs {needed} GPUs")
            continue
        theirs = torch_states(torch_code, count)
        ours = gpumem_states(gpumem, gpumem_code, count)
        same = theirs == ours
        differ += not same
        print(f"{'same' if same else 'DIFF'} {name}: PyTorch {theirs}, gpumem {ours}")
    sys.exit(1 if differ else 0)


if __name__ == "__main__":
    main()
