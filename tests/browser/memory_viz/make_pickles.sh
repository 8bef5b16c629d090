#!/bin/sh
# Writes gpumem snapshots for the memviz harness into $OUT (default /tmp/memviz/pickles):
# each script of scripts/ with record_memory_history(true) before it and dump_snapshot after it,
# under the default config and (training_loop, fragmentation) under expandable_segments:True,
# plus PyTorch's own walkthrough snapshot and the H200-recorded fixtures as controls.
# Usage: make_pickles.sh REPO [OUT]
set -e
REPO=$(cd "$1" && pwd); OUT=${2:-/tmp/memviz/pickles}; G=$REPO/target/release/gpumem
mkdir -p "$OUT"; TMP=$(mktemp -d)
for n in walkthrough training_loop fragmentation oom; do
  for conf in default expandable; do
    case "$conf:$n" in expandable:walkthrough|expandable:oom) continue;; esac
    suffix=$([ $conf = expandable ] && echo -expandable || true)
    s=$TMP/$n$suffix.rhai
    { echo 'record_memory_history(true);'; cat "$REPO/scripts/$n.rhai"; echo
      echo "dump_snapshot(\"$OUT/gpumem-$n$suffix.pickle\");"; } > "$s"
    if [ $conf = expandable ]; then
      "$G" --device sim --alloc-conf expandable_segments:True run "$s" > "$TMP/$n$suffix.log"
    else
      "$G" --device sim run "$s" > "$TMP/$n$suffix.log"
    fi
  done
done
"$G" --device sim bench replay --events 20000 --file "$OUT/gpumem-bench-synthetic.pickle" --keep > /dev/null
cp "$REPO/tests/fixtures/pytorch-walkthrough-snapshot.pickle" "$OUT/pytorch-walkthrough.pickle"
for f in "$REPO"/tests/replay/fixtures/*.pickle; do cp "$f" "$OUT/h200-$(basename "$f")"; done
rm -rf "$TMP"; ls -la "$OUT"
