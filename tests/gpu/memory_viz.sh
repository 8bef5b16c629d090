#!/usr/bin/env bash
# Issue 10: PyTorch's own snapshot tools read gpumem's snapshots. Run on a machine with
# torch 2.11 installed (the H200 machine); no GPU is needed for this check.
#
# usage: tests/gpu/memory_viz.sh [GPUMEM]     (GPUMEM defaults to ./gpumem, then target/release/gpumem)
#
# It records the seed walkthrough's history with gpumem (scripts/walkthrough.rhai between
# record_memory_history(true) and dump_snapshot), then runs every subcommand of
# torch.cuda._memory_viz on the file: stats, trace, trace_plot and segment_plot from the
# command line; memory, segments and compare from Python with a format_flamegraph that returns the
# lines (the command line would download flamegraph.pl, unreachable offline). It also checks
# that the file uses only pickle opcodes the memory_viz page's own JavaScript unpickler
# (MemoryViz.js from the installed torch, or the copy MEMORYVIZ_JS names) knows, and, where
# node is installed, runs that
# unpickler on it. PyTorch's own walkthrough snapshot goes through the same checks as a
# control. Any exception fails the check; the last line is PASS or FAIL.

set -u
cd "$(dirname "$0")"
GPUMEM=${1:-./gpumem}
[ -x "$GPUMEM" ] || GPUMEM=../../target/release/gpumem
GPUMEM=$(realpath "$GPUMEM")
WALKTHROUGH=walkthrough.rhai
[ -f "$WALKTHROUGH" ] || WALKTHROUGH=../../scripts/walkthrough.rhai
CONTROL=pytorch-walkthrough-snapshot.pickle
[ -f "$CONTROL" ] || CONTROL=../fixtures/pytorch-walkthrough-snapshot.pickle
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT

# The walkthrough with history recorded from its first line and the snapshot dumped at the end.
{
    echo 'record_memory_history(true);'
    cat "$WALKTHROUGH"
    echo "dump_snapshot(\"$WORK/gpumem.pickle\");"
} >"$WORK/walkthrough_history.rhai"
# Its imports resolve to the embedded standard library, so the script may live anywhere.
if ! "$GPUMEM" --device sim run "$WORK/walkthrough_history.rhai" >"$WORK/run.log" 2>&1; then
    cat "$WORK/run.log"
    echo "FAIL memory_viz: gpumem could not dump the walkthrough's snapshot"
    exit 1
fi

check_file() {
    local file=$1 label=$2 out="$WORK/$2"
    mkdir -p "$out"
    echo "--- $label: $file"
    python3 -m torch.cuda._memory_viz stats "$file" >"$out/stats.txt" || return 1
    python3 -m torch.cuda._memory_viz trace "$file" >"$out/trace.txt" || return 1
    python3 -m torch.cuda._memory_viz trace_plot "$file" -o "$out/trace.html" || return 1
    python3 -m torch.cuda._memory_viz segment_plot "$file" -o "$out/segments.html" || return 1
    python3 - "$file" "$CONTROL" <<'PY' || return 1
import os, pickle, pickletools, re, shutil, subprocess, sys
import torch
from torch.cuda import _memory_viz as viz

path, control = sys.argv[1], sys.argv[2]
data = pickle.load(open(path, "rb"))
identity = lambda lines: lines
# memory, segments and compare shell out to flamegraph.pl from the command line; the
# functions themselves take the formatter.
lines = viz.memory(data, format_flamegraph=identity)
lines += viz.segments(data, format_flamegraph=identity)
lines += viz.compare(data["segments"], data["segments"], format_flamegraph=identity)
assert lines.strip(), "memory/segments produced nothing"
print(next(l for l in viz.segsum(data).splitlines() if l.startswith("total_reserved")))
print(viz.trace(data).splitlines()[1])

# The same keys as PyTorch's own snapshot of the same steps, level by level.
ref = pickle.load(open(control, "rb"))
def keys(d):
    return sorted(d)
assert keys(data) == keys(ref), (keys(data), keys(ref))
assert keys(data["segments"][0]) == keys(ref["segments"][0])
assert keys(data["segments"][0]["blocks"][0]) == keys(ref["segments"][0]["blocks"][0])
assert keys(data["device_traces"][0][0]) == keys(ref["device_traces"][0][0])
assert keys(data["allocator_settings"]) == keys(ref["allocator_settings"])
assert [e["action"] for e in data["device_traces"][0]] == [e["action"] for e in ref["device_traces"][0]]

# The memory_viz page reads the file with MemoryViz.js's own unpickler. pip's torch does not
# ship that file (it lives in the source tree, torch/utils/viz/); MEMORYVIZ_JS may name a copy.
js_path = os.environ.get("MEMORYVIZ_JS") or os.path.join(
    os.path.dirname(torch.__file__), "utils", "viz", "MemoryViz.js")
if not os.path.exists(js_path):
    print(f"MemoryViz.js not found ({js_path}): the page's unpickler was not checked here")
    sys.exit(0)
js = open(js_path).read()
# Opcodes: only those MemoryViz.js's unpickler handles (its switch statement's cases).
known = set(re.findall(r"case ([A-Z_0-9]+):", js))
used = {op.name for op, _, _ in pickletools.genops(open(path, "rb").read())}
missing = used - known
assert not missing, f"opcodes MemoryViz.js does not read: {sorted(missing)}"
print("opcodes used:", sorted(used))

# MemoryViz.js's unpickler itself, where node is installed.
node = shutil.which("node") or shutil.which("nodejs")
if node:
    start = js.index("function unpickle(")
    end = js.index("function decode_base64(")
    program = js[start:end] + """
const fs = require('fs');
const bytes = fs.readFileSync(process.argv[1]);
const data = unpickle(bytes.buffer.slice(bytes.byteOffset, bytes.byteOffset + bytes.length));
const events = data.device_traces[0];
if (!Array.isArray(data.segments) || !events.length) throw new Error('no segments or trace');
for (const e of events) {
  if (typeof e.addr !== 'number' || typeof e.size !== 'number') throw new Error('addr/size not numbers: ' + JSON.stringify(e));
}
console.log('MemoryViz.js unpickled', data.segments.length, 'segments and', events.length, 'events');
"""
    script = os.path.join(os.path.dirname(path), "unpickle.cjs")
    open(script, "w").write(program)
    subprocess.run([node, script, path], check=True)
else:
    print("node not installed: MemoryViz.js's unpickler not run (its opcode set was checked)")
PY
}

ok=0
check_file "$CONTROL" pytorch || ok=1
check_file "$WORK/gpumem.pickle" gpumem || ok=1
if [ $ok -eq 0 ]; then
    echo "PASS memory_viz"
else
    echo "FAIL memory_viz"
fi
exit $ok
