#!/usr/bin/env python3
"""Evaluation (`fsexec --val-data FILE`): the plan's evaluation program, fsc's forward
and loss without backward or optimizer, in an arena of its own.

1. Its loss on a batch is the training forward's loss on that batch: with --val-data the
   training's own token file, read in sequential order, the evaluation before step 1
   (step 0) reads the batch step 1 trains on, with the same params, so step 0's val_loss
   equals step 1's loss, to 4 f32 ulps (the same ops on the same rows; the sums of a
   rank's part may group differently). For a tiny GPT-2 and a tiny Llama at world 1,
   and under mpirun at world 2 with fsdp and with ddp; with --microbatches 2 (the
   training's loss the mean of two halves) to rel 1e-6; and with 2 pipeline stages
   (1F1B and ZB-H1 training; the evaluation's batch goes through the training's stages
   as one micro-batch, and its loss is the last stage's) to rel 1e-6. Every world logs the world-1
   val_loss to rel 1e-6 (each rank evaluates its rows; the loss is averaged over the
   ranks).
2. Every evaluation reads the same batches: with lr 0 the params do not move, and the
   evaluations at steps 0, 2 and 4 (--eval-every 2) log the same val_loss, bit for bit;
   with lr 1e-2 they are three different losses (each copies the params of its step).
3. A classifier (samples/mlp.fsm, --val-data blobs) logs val_loss and val_acc, in [0, 1],
   the same at world 2 (fsdp) as at world 1.
4. `fsc --mem` shows the evaluation program's own memory plan, whose arena is the one
   fsexec allocates for it (its start line).
5. Clear errors: --val-data with an interleaved pipeline plan, a file for a classifier, `blobs` for a
   language model, --eval-every without --val-data.

usage: evaluation.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy)
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from trainrun import mpi_main, run  # noqa: E402

MODELS = {
    "gpt2": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=8"],
    "llama": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "F=64", "-D", "T=16", "-D", "V=256", "-D", "B=8"],
    "mlp": ["-D", "B=32"],
}
ULP = float(np.finfo(np.float32).eps)


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data
        self.n = 0

    def plan(self, model, *flags):
        self.n += 1
        path = os.path.join(self.work, "%s-%d.plan" % (model, self.n))
        run([self.fsc, "samples/%s.fsm" % model, *MODELS[model], *flags, "-o", path, "-q"])
        return path

    def fsexec_run(self, plan, world, *flags, ok=True):
        log = os.path.join(self.work, "run-%d.jsonl" % self.n)
        cmd = [self.fsexec] + (["--nproc", str(world)] if world > 1 else [])
        r = run(cmd + [plan, "--threads", "1", "--log", log, *flags], ok=ok)
        rows = []
        if ok:
            with open(log) as f:
                rows = [json.loads(line) for line in f]
        return r, rows


def same_batch(r):
    for model in ("gpt2", "llama"):
        ref = None
        for world, shard, extra, tol in ((1, "none", [], 4 * ULP), (2, "fsdp", [], 4 * ULP), (2, "ddp", [], 4 * ULP),
                                         (1, "none", ["--microbatches", "2"], 1e-6),
                                         (2, "none", ["--stages", "2", "--microbatches", "2"], 1e-6),
                                         (2, "none", ["--stages", "2", "--microbatches", "2", "--schedule", "zb1"], 1e-6)):
            plan = r.plan(model, "--world", str(world), "--shard", shard, *extra)
            _, rows = r.fsexec_run(plan, world, "--steps", "1", "--data", r.data, "--data-order", "sequential",
                                   "--val-data", r.data, "--eval-batches", "1")
            val, loss = rows[0], rows[1]
            if val["step"] != 0 or "val_loss" not in val or loss["step"] != 1:
                sys.exit("FAIL %s world %d %s: log %s" % (model, world, shard, rows))
            d = abs(val["val_loss"] - loss["loss"]) / abs(loss["loss"])
            if d > tol:
                sys.exit("FAIL %s world %d %s %s: val_loss %.9g at step 0, the training loss of the same batch %.9g "
                         "(rel %.3g > %.3g)" % (model, world, shard, extra, val["val_loss"], loss["loss"], d, tol))
            ref = val["val_loss"] if ref is None else ref
            if abs(val["val_loss"] - ref) > 1e-6 * abs(ref):
                sys.exit("FAIL %s world %d %s: val_loss %.9g, world 1's %.9g" % (model, world, shard, val["val_loss"],
                                                                                  ref))
            print("ok %s world %d %s %s: val_loss %.9g = step 1's loss %.9g (rel %.2g)" % (
                model, world, shard, " ".join(extra), val["val_loss"], loss["loss"], d))


def same_batches_every_time(r):
    for lr, world, shard in (("0", 1, "none"), ("0", 2, "fsdp"), ("1e-2", 1, "none")):
        plan = r.plan("gpt2", "--world", str(world), "--shard", shard, "--lr", lr, "--warmup", "0", "--lr_schedule", "constant")
        _, rows = r.fsexec_run(plan, world, "--steps", "4", "--data", r.data, "--val-data", r.data, "--eval-every", "2",
                               "--eval-batches", "3")
        vals = [(x["step"], x["val_loss"]) for x in rows if "val_loss" in x]
        if [s for s, _ in vals] != [0, 2, 4]:
            sys.exit("FAIL: --eval-every 2 over 4 steps evaluated at steps %s, expected 0, 2, 4" % [s for s, _ in vals])
        losses = [v for _, v in vals]
        if lr == "0" and len(set(losses)) != 1:
            sys.exit("FAIL: with lr 0 the evaluations differ: %s (not the same batches each time?)" % losses)
        if lr != "0" and len(set(losses)) != 3:  # each evaluation copies the params as they are then
            sys.exit("FAIL: lr %s: val_loss %s did not follow the training" % (lr, losses))
        print("ok lr %s world %d %s: val_loss at steps 0, 2, 4: %s" % (lr, world, shard, losses))


def classifier(r):
    got = []
    for world, shard in ((1, "none"), (2, "fsdp")):
        plan = r.plan("mlp", "--world", str(world), "--shard", shard)
        _, rows = r.fsexec_run(plan, world, "--steps", "3", "--val-data", "blobs", "--eval-batches", "2")
        last = rows[-1]
        if "val_acc" not in last or not 0 <= last["val_acc"] <= 1 or "val_acc" not in rows[0]:
            sys.exit("FAIL mlp world %d: log %s" % (world, rows))
        got.append((rows[0]["val_loss"], rows[0]["val_acc"], last["val_loss"], last["val_acc"]))
    a, b = np.array(got[0]), np.array(got[1])
    if np.max(np.abs(a - b)) > 1e-5:
        sys.exit("FAIL mlp: world 2's (val_loss, val_acc) at steps 0 and 3 %s, world 1's %s" % (got[1], got[0]))
    print("ok mlp: val_loss, val_acc at steps 0 and 3: %s (world 2: %s)" % (got[0], got[1]))


def memory(r):
    src = ["samples/gpt2.fsm", *MODELS["gpt2"]]
    out = run([r.fsc, *src, "--mem", "-q"]).stdout
    m = re.search(r"evaluation program \(fsexec --val-data\).*?\n.*?\n.*?arena\s+(\S+ \S+) \(([\d,]+) bytes\)", out,
                  re.S)
    train = re.search(r"arena\s+\S+ \S+ \(([\d,]+) bytes\)", out)
    if not m or not train:
        sys.exit("FAIL: fsc --mem has no evaluation program section:\n" + out[-2000:])
    eval_bytes = int(m.group(2).replace(",", ""))
    plan = r.plan("gpt2")
    res, _ = r.fsexec_run(plan, 1, "--steps", "1", "--data", r.data, "--val-data", r.data, "--eval-batches", "1")
    shown = re.search(r"\+ eval ([\d.]+ [KMG]?i?B) ", res.stdout)
    if not shown or shown.group(1) != m.group(1):  # the size as fsc --mem writes it (one formatter)
        sys.exit("FAIL: fsc --mem's eval arena is %s (%d bytes); fsexec's start line: %s" % (m.group(1), eval_bytes,
                                                                                            res.stdout[:400]))
    print("ok --mem: evaluation arena %d bytes (training %s), fsexec allocates %s" % (
        eval_bytes, train.group(1), shown.group(1)))


def errors(r):
    cases = [
        (r.plan("gpt2", "-D", "L=4", "--world", "2", "--stages", "2", "--schedule", "interleaved", "--chunks", "2",
                "--microbatches", "2", "--shard", "none"), 2, ["--val-data", r.data],
         "with interleaved model chunks (or from an older fsc), for which fsc plans no evaluation program"),
        (r.plan("mlp"), 1, ["--val-data", r.data], "or on held-out Gaussian blobs (--val-data blobs)"),
        (r.plan("gpt2"), 1, ["--val-data", "blobs"], "--val-data blobs is for classifiers"),
        (r.plan("gpt2"), 1, ["--eval-every", "2"], "--eval-every says when"),
    ]
    for plan, world, flags, want in cases:
        res, _ = r.fsexec_run(plan, world, "--steps", "1", *flags, ok=False)
        if res.returncode == 0 or want not in res.stdout:
            sys.exit("FAIL: %s: exit %d, expected an error saying '%s':\n%s" % (flags, res.returncode, want,
                                                                               res.stdout[-1500:]))
    print("ok errors: interleaved pipeline, classifier with a file, blobs for a language model, --eval-every alone")


mpi_main(Runner, [same_batch, same_batches_every_time, classifier, memory, errors], "evaluation: all ok")
