#!/usr/bin/env python3
"""Mixed precision trains like fp32, and fp16's loss scaling skips what overflows.

1. bf16 and fp16 training of a tiny GPT-2 tracks fp32: the mean loss of the last 10 of
   200 steps is within 2% of fp32's (world 1), at world 1 and at world 2 with fsdp
   (16-bit gathers and reductions), zero2 (16-bit reduce-scatter) and fsdp with
   reduce_dtype fp32.
2. fp16 with an overflow forced at step K (fsexec --debug-overflow-at K, which makes
   step K's backward seed infinite): step K is logged as skipped and the loss scale
   halves from 65536 to 32768; the params after it are bit for bit those of the same run
   stopped at step K-1 (a skipped step changes nothing); the loss of step K is that of
   the unforced run; and the run then goes on without further skips, its loss falling.
3. fsexec --save-grads in bf16 and fp16 writes step 1's gradients of the loss itself: within
   their precision of fp32's (largest difference over largest value), fp16's unscaled (the
   backward's are the loss scale's 65536 times those) and written as f32, as PyTorch's
   GradScaler.unscale_ leaves them.

usage: precision.py FSC FSEXEC   (mpirun for world 2; /usr/bin/python3 with numpy)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpienv import quiet_mpi_leaks  # noqa: E402
from models import load_safetensors  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIMS = ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=256", "-D", "B=8"]
TRAIN = ["--lr", "2e-3", "--warmup", "20", "--lr_schedule", "cosine", "--steps", "200", "--min_lr", "2e-4"]


def run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def log(path):
    with open(path) as f:
        return [json.loads(line) for line in f]


def train(fsc, fsexec, work, tag, precision, world=1, steps=200, extra=(), shard="none", fsc_extra=()):
    plan = os.path.join(work, tag + ".plan")
    out = os.path.join(work, tag + ".jsonl")
    run([fsc, "samples/gpt2.fsm", *DIMS, *TRAIN, "--precision", precision, "--shard", shard, "--world", str(world),
         *fsc_extra, "-o", plan, "-q"])
    cmd = [fsexec] + (["--nproc", str(world)] if world > 1 else [])
    run(cmd + [plan, "--steps", str(steps), "--log", out, "--data-order", "sequential", *extra])
    return log(out)


def tail_loss(lines):
    return float(np.mean([l["loss"] for l in lines[-10:]]))


def main():
    quiet_mpi_leaks()
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        # fp32 at world 1 is the reference: every strategy trains like it (invariant 1).
        ref = tail_loss(train(fsc, fsexec, work, "fp32", "fp32"))
        cases = [(1, "none", "bf16", ()), (1, "none", "fp16", ()),
                 (2, "fsdp", "bf16", ()), (2, "fsdp", "fp16", ()),  # 16-bit gathers and reductions
                 (2, "zero2", "bf16", ()),                          # 16-bit reduce-scatter, fp32 params
                 (2, "fsdp", "bf16", ("--reduce_dtype", "fp32"))]   # FairScale's fp32_reduce_scatter
        for world, shard, precision, fsc_extra in cases:
            tag = "%s-%d-%s%s" % (precision, world, shard, "-".join(fsc_extra))
            lines = train(fsc, fsexec, work, tag, precision, world, shard=shard, fsc_extra=fsc_extra)
            got = tail_loss(lines)
            rel = abs(got - ref) / ref
            what = "%s world %d (%s%s)" % (precision, world, shard, " " + " ".join(fsc_extra) if fsc_extra else "")
            if rel > 0.02:
                sys.exit("FAIL %s: loss %.4f after 200 steps, fp32 %.4f (%.1f%% apart)" % (what, got, ref, 100 * rel))
            skipped = [l["step"] for l in lines if l.get("skipped")]
            print("ok   %s: loss %.4f, fp32 %.4f (%.2f%% apart), skipped steps %s" %
                  (what, got, ref, 100 * rel, skipped or "none"))

        K = 5
        clean = train(fsc, fsexec, work, "clean", "fp16", steps=K + 5)
        forced = train(fsc, fsexec, work, "forced", "fp16", steps=K + 5,
                       extra=["--debug-overflow-at", str(K), "--save-weights", os.path.join(work, "forced.st")])
        run([fsexec, os.path.join(work, "clean.plan"), "--steps", str(K - 1), "--data-order", "sequential",
             "--save-weights", os.path.join(work, "before.st")])
        forced_k = train(fsc, fsexec, work, "forced_k", "fp16", steps=K,
                         extra=["--debug-overflow-at", str(K), "--save-weights", os.path.join(work, "at_k.st")])
        skipped = [l["step"] for l in forced if l.get("skipped")]
        if skipped != [K]:
            sys.exit("FAIL: forced overflow at step %d: skipped steps %s" % (K, skipped))
        scales = [l["loss_scale"] for l in forced]
        if scales[K - 2] != 65536 or any(s != 32768 for s in scales[K - 1:]):
            sys.exit("FAIL: loss scale around the overflow: %s" % scales)
        if forced[K - 1]["loss"] != clean[K - 1]["loss"]:
            sys.exit("FAIL: step %d's loss %r, unforced %r" % (K, forced[K - 1]["loss"], clean[K - 1]["loss"]))
        with open(os.path.join(work, "at_k.st"), "rb") as a, open(os.path.join(work, "before.st"), "rb") as b:
            # The header holds the step number; the tensors follow it.
            da, db = a.read(), b.read()
            ha, hb = int.from_bytes(da[:8], "little"), int.from_bytes(db[:8], "little")
            if da[8 + ha:] != db[8 + hb:]:
                sys.exit("FAIL: the skipped step %d changed the params" % K)
        after = [l["loss"] for l in forced[K:]]
        if not all(np.isfinite(after)) or after[-1] >= forced[0]["loss"]:
            sys.exit("FAIL: after the skip the loss does not go on falling: %s" % after)
        print("ok   fp16 overflow forced at step %d: skipped, scale 65536 -> 32768, params unchanged, "
              "then %d more steps without a skip (loss %.4f -> %.4f)" % (K, len(after), after[0], after[-1]))

        grads = {}
        for precision in ("fp32", "bf16", "fp16"):
            path = os.path.join(work, "grads-%s.st" % precision)
            train(fsc, fsexec, work, "grads-" + precision, precision, steps=1, extra=["--save-grads", path])
            with open(path, "rb") as f:
                header = json.loads(f.read(int.from_bytes(f.read(8), "little")))
            grads[precision] = (load_safetensors(path), {k: v["dtype"] for k, v in header.items() if "dtype" in v})
        ref = grads["fp32"][0]
        for precision, tol, dtype in (("bf16", 3e-2, "BF16"), ("fp16", 1e-2, "F32")):
            got, dtypes = grads[precision]
            if sorted(got) != sorted(ref):
                sys.exit("FAIL: %s --save-grads names %s, fp32's %s" % (precision, sorted(got), sorted(ref)))
            worst = max(float((got[k] - ref[k]).abs().max() / ref[k].abs().max()) for k in ref)
            if worst > tol or set(dtypes.values()) != {dtype}:
                sys.exit("FAIL: %s --save-grads: %.3g from fp32's gradients (tolerance %g), dtypes %s (want %s)" %
                         (precision, worst, tol, sorted(set(dtypes.values())), dtype))
            print("ok   %s --save-grads: %d gradients, %s, within %.2g of fp32's (tolerance %g)" %
                  (precision, len(ref), dtype, worst, tol))


if __name__ == "__main__":
    main()
