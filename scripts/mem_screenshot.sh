#!/usr/bin/env bash
# Renders fsc's HTML memory report in headless Chromium to a PNG, to check that the page
# draws (the timeline, legend and tables) with nothing but the browser.
# usage: scripts/mem_screenshot.sh [FSC] [OUT.png] [MODEL.fsm [fsc args...]]
#   defaults: build/fsc, mem_report.png, a small GPT-2 (samples/gpt2.fsm, L=4 C=128).
# Needs chromium (Debian: apt-get install chromium); without it, says so and exits 0,
# so CI machines without a browser skip it. The HTML is kept next to the PNG.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
fsc=${1:-$here/build/fsc}
out=${2:-mem_report.png}
shift $(($# >= 2 ? 2 : $#))
if [ $# -eq 0 ]; then
  set -- "$here/samples/gpt2.fsm" -D L=4 -D C=128 -D NH=4 -D T=64 -D V=512
fi
browser=$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)
if [ -z "$browser" ]; then
  echo "mem_screenshot: no chromium installed; skipped (apt-get install chromium)"
  exit 0
fi
html=${out%.png}.html
"$fsc" "$@" -q --mem=html "$html"
profile=$(mktemp -d)
trap 'rm -rf "$profile"' EXIT
"$browser" --headless --no-sandbox --disable-gpu --hide-scrollbars --user-data-dir="$profile" \
  --window-size=1366,1400 --screenshot="$(realpath -m "$out")" "file://$(realpath "$html")" >/dev/null 2>&1
[ -s "$out" ] || { echo "mem_screenshot: chromium wrote no $out" >&2; exit 1; }
echo "wrote $out (from $html)"
