#!/usr/bin/env bash
# Records every PyTorch reference file gpumem's tests use (run on the H200; PyTorch 2.11 there).
# usage: bash tests/gpu/record/run_all.sh OUTDIR
# Writes: traces_*.json (allocator traces with addresses, see record_traces.py), the replay
# workloads' snapshots (tests/replay/record_snapshots.py) under default and expandable configs,
# and walkthrough.pytorch.pickle.
set -u
out=${1:?OUTDIR}
mkdir -p "$out"
here=$(dirname "$0")
export PYTHONUNBUFFERED=1
trace() { # LABEL CONF FRACTION [--streams]
    local label=$1 conf=$2 fraction=$3; shift 3
    PYTORCH_CUDA_ALLOC_CONF=$conf python3 "$here/record_traces.py" "$out/traces_$label.json" "$label" "$fraction" "$@" || echo "FAILED trace $label"
}
# One at a time: an expandable process that runs out of memory maps pages until the device is
# full, which would make a concurrent recording fail where it should not.
trace expandable_addr "expandable_segments:True" 1.0
trace expandable_frac05 "expandable_segments:True" 0.05
trace expandable_maxsplit64 "expandable_segments:True,max_split_size_mb:64" 0.05
trace expandable_pow2div4 "expandable_segments:True,roundup_power2_divisions:4" 1.0
trace expandable_gc06 "expandable_segments:True,garbage_collection_threshold:0.6" 0.04
trace expandable_streams "expandable_segments:True" 0.05 --streams
trace default_streams "" 0.05 --streams
trace default_streams_addr "" 1.0 --streams
for w in transformer_fp32 transformer_bf16 inference convnet; do
    python3 "$(dirname "$here")/../replay/record_snapshots.py" "$out" "$w" || echo "FAILED snapshot $w default" &
    PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python3 "$(dirname "$here")/../replay/record_snapshots.py" "$out" "$w" || echo "FAILED snapshot $w expandable" &
    wait
done
python3 "$here/walkthrough_snapshot.py" "$out/walkthrough.pytorch.pickle" || echo "FAILED walkthrough snapshot"
ls -la "$out"
