"""Seed walkthrough on a device, compared with PyTorch's recorded run.

usage: walkthrough.py GPUMEM FIXTURE DEVICE [SIM_OUTPUT]
Runs the fixture's steps as one Rhai script on DEVICE, printing every recorded counter after
each step, memory_summary() after the summary steps, and device_memory() after step 1.
Checks: every counter equals PyTorch's; the summary text equals PyTorch's; on cuda, the
process figure at step 1 is within 5% of PyTorch's and the parts add up. Prints `ok ...` /
`FAIL ...` lines; writes the raw output to SIM_OUTPUT-style file `walkthrough.<device>.out`.
"""
import json
import subprocess
import sys

gpumem, fixture_path, device = sys.argv[1], sys.argv[2], sys.argv[3]
fixture = json.load(open(fixture_path))
lines = []
for i, step in enumerate(fixture["steps"]):
    lines.append(step["rhai"])
    for key in step["stats"]:
        lines.append(f'print("S {i} {key} " + memory_stats()["{key}"]);')
    if i == 0:
        lines.append('let dm = device_memory();')
        lines.append('for k in dm.keys() { print("D " + k + " " + dm[k]); }')
lines.append('print("SUMMARY-BEGIN");')
lines.extend(fixture["summary_steps_rhai"])
lines.append('print("SUMMARY-END");')
script = f"walkthrough.{device.replace(':', '_')}.rhai"
open(script, "w").write("\n".join(lines) + "\n")
run = subprocess.run([gpumem, "--device", device, "run", script], capture_output=True, text=True)
out_name = f"walkthrough.{device.replace(':', '_')}.out"
open(out_name, "w").write(run.stdout)
if run.returncode != 0:
    print(f"FAIL walkthrough run exited {run.returncode}: {run.stderr.strip()[-500:]}")
    sys.exit(1)

failures = 0
stats, dm, summary, in_summary = {}, {}, [], False
for line in run.stdout.splitlines():
    if line == "SUMMARY-BEGIN":
        in_summary = True
    elif line == "SUMMARY-END":
        in_summary = False
    elif in_summary:
        summary.append(line)
    elif line.startswith("S "):
        _, i, key, value = line.split(" ", 3)
        stats[(int(i), key)] = value
    elif line.startswith("D "):
        _, key, value = line.split(" ", 2)
        dm[key] = value

for i, step in enumerate(fixture["steps"]):
    for key, expected in step["stats"].items():
        got = stats.get((i, key))
        if got != str(expected):
            failures += 1
            print(f"FAIL step {i} ({step['rhai']}) {key}: gpumem {got}, PyTorch {expected}")
print(f"counters: {sum(len(s['stats']) for s in fixture['steps'])} compared over {len(fixture['steps'])} steps, {failures} differ")

expected_summary = fixture["memory_summary"].rstrip("\n")
got_summary = "\n".join(summary).rstrip("\n")
if got_summary != expected_summary:
    failures += 1
    print("FAIL memory_summary differs from PyTorch's")
else:
    print("memory_summary: identical to PyTorch's")

if device.startswith("cuda"):
    mib = lambda b: f"{int(b) / 2**20:.1f} MiB"
    need = ["method", "used_bytes", "driver_reserved_bytes", "process_bytes", "other_processes_bytes",
            "allocator_reserved_bytes", "context_bytes", "used_v2_bytes", "total_bytes", "free_bytes"]
    missing = [k for k in need if k not in dm]
    if missing:
        failures += 1
        print(f"FAIL device_memory() lacks {missing}")
    else:
        print(f"device_memory() after `{fixture['steps'][0]['rhai']}` (method {dm['method']}):")
        print(f"  used on the device (nvidia-smi, NVML v1) {mib(dm['used_bytes'])}"
              f" = driver reserved {mib(dm['driver_reserved_bytes'])}"
              f" + this process {mib(dm['process_bytes'])}"
              f" + other processes {mib(dm['other_processes_bytes'])}")
        print(f"  this process {mib(dm['process_bytes'])} = its share of the CUDA context (and modules) {mib(dm['context_bytes'])}"
              f" + allocator reserved {mib(dm['allocator_reserved_bytes'])}")
        torch_process = fixture["steps"][0]["nvml_process_used_bytes"]
        ratio = int(dm["process_bytes"]) / torch_process
        print(f"  PyTorch's process figure at this step: {mib(torch_process)}; gpumem/PyTorch = {ratio:.4f}")
        if abs(ratio - 1) > 0.05:
            failures += 1
            print("FAIL process figure not within 5% of PyTorch's")
        parts = int(dm["driver_reserved_bytes"]) + int(dm["process_bytes"]) + int(dm["other_processes_bytes"])
        gap = int(dm["used_bytes"]) - parts
        print(f"  used - (reserved + process + others) = {gap} bytes ({mib(gap)})")
print("walkthrough:", "ok" if failures == 0 else f"FAIL ({failures})")
sys.exit(1 if failures else 0)
