#!/usr/bin/env python3
"""Hybrid sharding (shard_group S, FSDP's HYBRID_SHARD) trains like every other strategy.

World 4 as 2 replica groups x 2 shard groups: fsdp, zero2 and zero1 with shard_group 2
train 3 AdamW steps of the MLP and a tiny GPT-2 from the same seed on the same global
batches. Their consolidated params must equal fsdp's and ddp's at world 4 (rel 1e-5 per
tensor), and their loss and gradient-norm curve must equal the single-rank fp32 run's
(rel 1e-5), as tests/mpi/strategies.py holds every other strategy to. A pipeline of 2
stages x 4 data-parallel ranks with shard_group 2 (world 8) holds its params and its
curve to the single-rank run's.

Checkpoints: replicas hold the same shard, so each of them writes an even part of it and
every element is in the checkpoint once (tests/mpi/checkpoint.py's piece check). A
checkpoint of fsdp shard_group 2 at world 4 after 3 steps, resumed to step 6 by the same
plan, equals 6 steps straight bit for bit; resumed by fsdp without groups at world 4 and
by ddp at world 2 it equals them to rel 1e-5 (another world sums in another order); and
a checkpoint of plain fsdp at world 4 resumes into zero2 shard_group 2 alike.

What would fail: a view that selects its shard by the data-parallel index (a rank of the
second replica group would update a shard it does not hold, outside its buffer), an
average over the replica group alone (gradients off by the factor S), a gradient summed
in the shard group only (each replica its own half of the batch), the grad norm summed
over replicas too (off by sqrt(D/S)), a gather over the wrong group.

usage: hybrid.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy and torch)
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from strategies import GPT2, MLP, ROOT, TOL, TRAIN, losses, rel, run, train  # noqa: E402
from pipeline import load_stages  # noqa: E402
import checkpoint as ck  # noqa: E402
from trainrun import mpi_main  # noqa: E402

STEPS = 3


def worst_rel(got, ref):
    return max((rel(got[n].numpy().astype(np.float64), t.numpy().astype(np.float64)), n) for n, t in ref.items())


def curve_rel(got, ref):
    if len(got) != len(ref) or len(got) != STEPS:
        sys.exit("FAIL: %d steps logged, expected %d" % (len(got), STEPS))
    return max(abs(a - b) / abs(b) for ga, gb in zip(got, ref) for a, b in zip(ga, gb))


def pipelined(fsc, fsexec, work, model, dims, extra):
    """A pipeline's run: the same as strategies.train, but each stage saves its own file."""
    plan, out, log = (os.path.join(work, "pipe" + ext) for ext in (".plan", ".safetensors", ".jsonl"))
    run([fsc, "samples/%s.fsm" % model, *dims, *TRAIN, "--shard", "fsdp", "--world", "8", *extra, "-o", plan, "-q"], ROOT)
    run([fsexec, "--nproc", "8", plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--data-order",
         "sequential", "--threads", "1"], ROOT)
    return load_stages(out)[0], losses(log)


def checkpoints(r):
    hybrid = ["--shard", "fsdp", "--shard-group", "2"]
    src = r.compile(ck.UNEVEN, 4, hybrid)
    ckpt = r.path("hybrid ckpt")
    straight = r.train("hybrid straight", src, 4, 6)
    first = r.train("hybrid first", src, 4, 3, "--checkpoint-dir", ckpt)
    resumed = r.train("hybrid resumed", src, 4, 6, "--resume", ckpt)
    ck.same_log("hybrid (steps 1-3)", first[1], straight[1])
    ck.same_log("hybrid resumed", resumed[1], straight[1])
    ck.bitwise("hybrid resumed", resumed[0], straight[0], "the straight run")
    el = ck.counts("hybrid", os.path.join(ckpt, "step-00000003"), 4, straight[0])
    print("ok   fsdp shard_group 2 world 4 resumed at step 3 bitwise equal to 6 steps straight; %d + %d + %d elements "
          "in 4 files, each once" % (el["params"], el["optimizer"], el["state"]))
    for world, extra in ((4, ["--shard", "fsdp"]), (2, ["--shard", "ddp"])):
        what = "fsdp shard_group 2 world 4 -> %s world %d" % (extra[1], world)
        got = r.train(what, r.compile(ck.UNEVEN, world, extra), world, 6, "--resume", ckpt)
        ck.resumed_line(what, got[2], "resharded to world %d" % world)
        worst, name, lerr = ck.close(what, got[:2], straight[:2])
        print("ok   %-44s params rel %.1e at most (%s), losses and norms rel %.1e" % (what, worst, name, lerr))
    plain = r.compile(ck.UNEVEN, 4, ["--shard", "fsdp"])
    pckpt = r.path("plain ckpt")
    r.train("plain first", plain, 4, 3, "--checkpoint-dir", pckpt)
    what = "fsdp world 4 -> zero2 shard_group 2 world 4"
    got = r.train(what, r.compile(ck.UNEVEN, 4, ["--shard", "zero2", "--shard-group", "2"]), 4, 6, "--resume", pckpt)
    worst, name, lerr = ck.close(what, got[:2], straight[:2])
    print("ok   %-44s params rel %.1e at most (%s), losses and norms rel %.1e" % (what, worst, name, lerr))


def training(r):
    fsc, fsexec, work = r.fsc, r.fsexec, r.work
    for model, dims, data in (("mlp", MLP, None), ("gpt2", GPT2, r.data)):
        alone, single = train(fsc, fsexec, work, model, dims, data, "none", 1, steps=STEPS)
        fsdp, _ = train(fsc, fsexec, work, model, dims, data, "fsdp", 4, steps=STEPS)
        ddp, _ = train(fsc, fsexec, work, model, dims, data, "ddp", 4, steps=STEPS)
        runs = [(shard, 4, ["--shard-group", "2"]) for shard in ("fsdp", "zero2", "zero1")]
        if model == "mlp":
            runs.append(("fsdp", 8, ["--shard-group", "2", "--stages", "2", "--microbatches", "2"]))
        for shard, world, extra in runs:
            if world == 8:
                got, curve = pipelined(fsc, fsexec, work, model, dims, extra)
            else:
                got, curve = train(fsc, fsexec, work, model, dims, data, shard, world, steps=STEPS, extra=extra)
            what = "%s %s world %d" % (model, shard, world) + (" (2 stages)" if world == 8 else "")
            lerr = curve_rel(curve, single)
            if lerr > TOL:
                sys.exit("FAIL %s shard_group 2: losses and norms %s, single rank %s" % (what, curve, single))
            line = "ok   %-28s shard_group 2: loss curve rel %.1e of the single-rank run" % (what, lerr)
            for other, ref in (("fsdp", fsdp), ("ddp", ddp)) if world == 4 else (("the single rank", alone),):
                e, name = worst_rel(got, ref)
                if e > TOL:
                    sys.exit("FAIL %s shard_group 2: param %s differs from %s (world 4 or 1): rel %.2e > %.0e"
                             % (what, name, other, e, TOL))
                line += "; params rel %.1e of %s%s (%s)" % (e, other, " world 4" if world == 4 else "", name)
            print(line)


def main():
    mpi_main(ck.Runner, [training, checkpoints],
             "hybrid sharding trains like fsdp, ddp and the single-rank run, and its checkpoints resume into any plan")


if __name__ == "__main__":
    main()
