#!/usr/bin/env bash
# The whole test suite: installs and builds what it needs, then runs every test
# (Criterion unit and golden tests, the command-line checks). With --sanitize, builds
# into build-asan/ with AddressSanitizer and UndefinedBehaviorSanitizer.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ "${1:-}" = "--sanitize" ]; then
  export FS_BUILD_DIR=build-asan
  scripts/setup.sh -DFS_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1
  export LSAN_OPTIONS=suppressions=$PWD/scripts/lsan.supp
else
  export FS_BUILD_DIR=build
  scripts/setup.sh
fi
ctest --test-dir "$FS_BUILD_DIR" --output-on-failure -j 2
