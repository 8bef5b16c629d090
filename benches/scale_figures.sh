#!/usr/bin/env bash
# Issue 18's figures on a machine with many cores and PyTorch (the 16-core GPU machine):
#   1. `--tune` throughput over 1, 2, 4, 8 and 16 threads (`gpumem bench tune`: the same 32
#      replays of a 2M-event synthetic snapshot per run; scaling and efficiency against one
#      thread);
#   2. one core's replay rate on a 10M-event synthetic snapshot (`gpumem bench replay`);
#   3. that 10M-event file replayed by `gpumem replay` and read by PyTorch's
#      `torch.cuda._memory_viz` (`trace_plot`, the memory timeline page, and `stats`): wall
#      time and peak resident memory of each;
#   4. `gpumem replay --tune` of a recorded fixture on all cores (the default grid).
# No Rust needed: the release binary is carried. From the repository root:
#   bash benches/scale_figures.sh [path/to/gpumem]
# Big files go to a temporary folder (removed at the end); only the figures are printed (and
# also written, as they come, to $OUT/scale_figures.txt when $OUT is set). Under 10 minutes
# (each step has its own time limit, 590 s in all).
set -u
GPUMEM=${1:-target/release/gpumem}
PYTHON=${PYTHON:-python3}
WORK=$(mktemp -d /tmp/gpumem-scale.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
REPORT="${OUT:-$WORK}/scale_figures.txt"

say() { echo "$@" | tee -a "$REPORT"; }

# measure LABEL TIMEOUT_S COMMAND...: runs the command, prints its last lines, wall time and
# peak resident memory (the child's ru_maxrss).
measure() {
    local label=$1 limit=$2
    shift 2
    "$PYTHON" - "$label" "$limit" "$@" <<'PY' | tee -a "$REPORT"
import resource, subprocess, sys, time
label, limit, command = sys.argv[1], float(sys.argv[2]), sys.argv[3:]
start = time.monotonic()
try:
    done = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=limit)
    status, output = done.returncode, done.stdout
except subprocess.TimeoutExpired as expired:
    status, output = f"killed after {limit:.0f} s", (expired.stdout or b"").decode(errors="replace")
wall = time.monotonic() - start
rss = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024
for line in output.strip().splitlines()[-12:]:
    print(f"    {line}")
print(f"  {label}: exit {status}, {wall:.2f} s wall, peak RSS {rss:.1f} MiB")
PY
}

say "== machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)"
# Whether the cores are SMT siblings: with 2 threads per core, 16 threads share 8 physical cores.
lscpu 2>/dev/null | grep -E '^(Thread|Core|Socket)' | sed 's/^/   /' | tee -a "$REPORT"
say "== gpumem: $("$GPUMEM" --version)"
"$PYTHON" -c 'import torch; print("== torch", torch.__version__)' 2>&1 | tee -a "$REPORT"

say "== 1. --tune throughput scaling (gpumem bench tune)"
measure "bench tune" 90 "$GPUMEM" bench tune --events 2000000 --file "$WORK/synth2m.pickle" \
    --threads 1,2,4,8,16
rm -f "$WORK/synth2m.pickle"

say "== 2. replay rate on one core, 10M events (gpumem bench replay)"
measure "bench replay" 60 "$GPUMEM" bench replay --events 10000000 --file "$WORK/synth10m.pickle" --keep
ls -l "$WORK/synth10m.pickle" | awk '{printf "  file: %.1f MB\n", $5/1e6}' | tee -a "$REPORT"

say "== 3. the same 10M-event file: gpumem replay, then PyTorch's _memory_viz"
measure "gpumem replay" 30 "$GPUMEM" replay "$WORK/synth10m.pickle"
measure "gpumem replay --json" 30 "$GPUMEM" replay "$WORK/synth10m.pickle" --json
measure "_memory_viz trace_plot" 200 "$PYTHON" -m torch.cuda._memory_viz trace_plot \
    "$WORK/synth10m.pickle" -o "$WORK/memory_viz.html"
ls -l "$WORK/memory_viz.html" 2>/dev/null | awk '{printf "  trace_plot page: %.1f MB\n", $5/1e6}' | tee -a "$REPORT"
measure "_memory_viz stats" 120 "$PYTHON" -m torch.cuda._memory_viz stats "$WORK/synth10m.pickle"
rm -f "$WORK/memory_viz.html"

say "== 4. gpumem replay --tune on a recorded fixture, all cores (the default grid)"
measure "replay --tune" 60 "$GPUMEM" replay tests/replay/fixtures/transformer_fp32.default.pickle --tune
say "== done"
