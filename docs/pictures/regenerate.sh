#!/usr/bin/env bash
# Regenerates the pictures of the scripts in scripts/: for each, the timeline (PNG) and a
# screenshot of its HTML report in headless Chromium (tests/browser/check_report.mjs, which also
# hovers the middle of the first chart, so the tooltip shows), here in docs/pictures/; and the
# README's two pictures (docs/timeline.png, docs/report.png) from scripts/training_loop.rhai.
#
#   cargo build && docs/pictures/regenerate.sh      # $GPUMEM: another gpumem binary
#
# Needs node and Chromium ($CHROMIUM, else /usr/bin/chromium), as tests/report_browser.rs does.
set -euo pipefail
cd "$(dirname "$0")/../.."
gpumem=${GPUMEM:-target/debug/gpumem}
scratch=$(mktemp -d)
trap 'rm -rf "$scratch"' EXIT

# The height of each report screenshot: the header, the first timeline, its zoom and the map.
report_height=1700

for script in scripts/*.rhai; do
  name=$(basename "$script" .rhai)
  "$gpumem" run --device sim "$script" \
    --timeline "docs/pictures/$name-timeline.png" --report "$scratch/$name.html" >/dev/null
  SCREENSHOT_HEIGHT=$report_height node tests/browser/check_report.mjs \
    "$scratch/$name.html" "docs/pictures/$name-report.png" >/dev/null
done

cp docs/pictures/training_loop-timeline.png docs/timeline.png
# The README shows the report's top: the header, the timeline with its tooltip, the zoom.
SCREENSHOT_HEIGHT=1060 node tests/browser/check_report.mjs \
  "$scratch/training_loop.html" docs/report.png >/dev/null
