#!/bin/sh
# bench/venv.sh [DIR]: a Python virtual environment with PyTorch 2.x and numpy from PyPI
# (pip), for bench/train_step.py --torch2 DIR/bin/python. Default DIR /tmp/fs-bench-venv.
# For benchmarks only: no test and no CI step uses it (the tests use Debian's
# python3-torch). Made once; run again, it only checks what is there.
set -eu
dir=${1:-/tmp/fs-bench-venv}
py=${PYTHON:-python3}
if [ ! -x "$dir/bin/python" ]; then
    "$py" -m venv "$dir"
fi
"$dir/bin/python" -m pip install --quiet --upgrade pip
"$dir/bin/python" -m pip install --quiet "torch>=2" numpy
"$dir/bin/python" -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__, "in '"$dir"'")'
