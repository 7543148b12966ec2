#!/bin/sh
# bench/train_step.sh [BUILD_DIR] [train_step.py options]
# Times one GPT-2 training step in fsexec and in PyTorch (CPU, the same thread count,
# the same weights, AdamW) and OpenBLAS's sgemm rate; see bench/train_step.py.
#   bench/train_step.sh                       # build/, all cores, configs tiny and 124m
#   bench/train_step.sh build --threads 2 --configs tiny
# Builds BUILD_DIR first if fsc/fsexec are missing. Uses Debian's /usr/bin/python3
# (python3-torch); PYTHON=... overrides.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build
case "${1:-}" in
    ""|-*) ;;
    *) build=$(cd "$1" 2>/dev/null && pwd || echo "$1"); shift ;;
esac
if [ ! -x "$build/fsc" ] || [ ! -x "$build/fsexec" ]; then
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release
    cmake --build "$build" -j"$(nproc)" --target fsc fsexec
fi
exec "${PYTHON:-/usr/bin/python3}" "$root/bench/train_step.py" --fsc "$build/fsc" --fsexec "$build/fsexec" "$@"
