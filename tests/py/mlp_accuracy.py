#!/usr/bin/python3
"""fsexec trains a classifier: samples/mlp.fsm on fsexec's built-in Gaussian blobs.

Compiles samples/mlp.fsm, runs `fsexec --steps 300 --log`, and asserts that the mean
"accuracy" of the last 20 logged steps is above 95%, that every accuracy is a fraction in
[0, 1] and that the loss went down. Needs only the standard library.

usage: python3 tests/py/mlp_accuracy.py --fsc build/fsc --fsexec build/fsexec [--steps 300]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsc", required=True)
    ap.add_argument("--fsexec", required=True)
    ap.add_argument("--samples", default=os.path.join(HERE, "..", "..", "samples"))
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--last", type=int, default=20)
    ap.add_argument("--min-accuracy", type=float, default=0.95)
    args = ap.parse_args()

    with tempfile.TemporaryDirectory(prefix="fs-mlp-") as wd:
        plan, log = os.path.join(wd, "mlp.plan"), os.path.join(wd, "mlp.jsonl")
        for cmd in ([args.fsc, os.path.join(args.samples, "mlp.fsm"), "-q", "-o", plan],
                    [args.fsexec, plan, "--steps", str(args.steps), "--log", log]):
            r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode != 0:
                print(f"mlp_accuracy.py: FAIL: exit {r.returncode}: {' '.join(cmd)}\n{r.stdout}", file=sys.stderr)
                return 1
        with open(log) as f:
            rows = [json.loads(line) for line in f if line.strip()]

    if len(rows) != args.steps:
        print(f"mlp_accuracy.py: FAIL: {len(rows)} log lines for {args.steps} steps", file=sys.stderr)
        return 1
    bad = [r for r in rows if not isinstance(r.get("accuracy"), (int, float)) or not 0 <= r["accuracy"] <= 1]
    if bad:
        print(f"mlp_accuracy.py: FAIL: step {bad[0].get('step')}: \"accuracy\" is {bad[0].get('accuracy')!r}, "
              f"not a fraction in [0, 1]", file=sys.stderr)
        return 1
    if not all(math.isfinite(r["loss"]) for r in rows):
        print("mlp_accuracy.py: FAIL: a loss is not finite", file=sys.stderr)
        return 1
    tail = rows[-args.last:]
    acc = sum(r["accuracy"] for r in tail) / len(tail)
    first, last_loss = rows[0], sum(r["loss"] for r in tail) / len(tail)
    print(f"mlp: step 1 loss {first['loss']:.4f} accuracy {first['accuracy']:.3f}; "
          f"last {len(tail)} steps: mean loss {last_loss:.4g}, mean accuracy {acc:.4f} "
          f"(min {min(r['accuracy'] for r in tail):.3f})")
    if not last_loss < first["loss"]:
        print(f"mlp_accuracy.py: FAIL: the loss did not go down ({first['loss']:.4g} -> {last_loss:.4g})",
              file=sys.stderr)
        return 1
    if not acc > args.min_accuracy:
        print(f"mlp_accuracy.py: FAIL: mean accuracy of the last {len(tail)} steps is {acc:.4f}, "
              f"not above {args.min_accuracy}", file=sys.stderr)
        return 1
    print("mlp_accuracy.py: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
