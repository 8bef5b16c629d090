#!/usr/bin/env bash
# PyTorch's own run-to-run variation: run the runs matching REGEX (and the base runs they
# need) N times, each time in fresh processes, into $OUT/rep1 .. $OUT/repN. compare.py on each
# folder shows whether PyTorch's counters for the same config and the same base recording
# differ between repetitions, which no replay of one recording can follow.
#
# usage: cd tests/gpu/whatif && OUT=$OUT bash repeat.sh N REGEX [run_all.py options]
set -euo pipefail
cd "$(dirname "$0")"
n=$1
pattern=$2
shift 2
for i in $(seq 1 "$n"); do
  OUT="${OUT:-./whatif-out}/rep$i" python3 run_all.py --only "$pattern" "$@"
done
