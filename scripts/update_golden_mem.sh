#!/usr/bin/env bash
# Regenerates the golden memory reports (tests/golden_mem/*.txt) from the current code:
# runs test_memreport with FS_UPDATE_GOLDEN=1, which writes each report before comparing.
# Read `git diff tests/golden_mem` afterwards: every change there is a change users see.
# usage: scripts/update_golden_mem.sh [BUILD_DIR]   (default: build)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
cmake --build "$build" --target test_memreport >/dev/null
FS_UPDATE_GOLDEN=1 "$build/test_memreport" --filter 'memreport/golden_*'
git -C "$here" diff --stat -- tests/golden_mem
