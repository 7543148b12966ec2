#!/bin/sh
# tests/py/run.sh FSC FSEXEC: fsexec against PyTorch (tests/py/parity.py) and a classifier
# that must learn (tests/py/mlp_accuracy.py). Exit status non-zero if either fails.
#
# Uses Debian's /usr/bin/python3 (python3-torch, python3-numpy): another python3 on PATH
# need not have them. Without torch this FAILS (it never skips): install python3-torch.
# PYTHON=... overrides the interpreter.
set -u
if [ $# -ne 2 ]; then
    echo "usage: $0 FSC FSEXEC" >&2
    exit 2
fi
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-/usr/bin/python3}
if ! "$py" -c 'import torch, numpy' 2>/dev/null; then
    echo "tests/py/run.sh: FAIL: $py cannot import torch and numpy; apt-get install python3-torch python3-numpy" >&2
    exit 1
fi
rc=0
"$py" "$here/parity.py" --fsc "$1" --fsexec "$2" || rc=1
"$py" "$here/mlp_accuracy.py" --fsc "$1" --fsexec "$2" || rc=1
exit $rc
