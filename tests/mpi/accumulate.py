#!/usr/bin/env python3
"""Gradient accumulation (`--microbatches M`, one stage) trains like M = 1 on the same
global batch (DESIGN.md invariant 1), and costs what the memory plan says.

1. For a tiny GPT-2 and a tiny Llama, every strategy (none at world 1; ddp, zero1, zero2
   and fsdp at world 1, 2 and 3) with M = 2 and 4: after 5 AdamW steps (clipping on)
   the saved params equal the M = 1 run of the same strategy and world to rel 1e-5
   (||a - b|| / ||b|| per tensor), and so does every step's logged loss and gradient
   norm. fsdp also with reshard_after_forward 0 (one gather for the step), and with
   recompute; bf16 with fsdp, and with zero2 and recompute, to bf16's tolerance (each
   16-bit sum of M gradients rounds by 2^-8; GPT-2's attention bias, whose gradient is
   rounding noise, moves by 2e-2): each tensor 5e-2, all params together 2e-3, losses
   and norms 5e-3 (fp32's are 1e-7 here); fp16 with ddp (the loss scale times 1/M
   seeds each micro-batch) to the same.
   The global batch B = 24 splits over 2 or 3 ranks x 4 micro-batches.
   As in strategies.py, AdamW runs with eps 1e-6 (a gradient that is rounding noise
   does not become a step), and a tensor may differ by up to 3 times what the M = 1 run
   differs from itself between 1 and 2 threads, when that is more than 1e-5.
2. From `fsc --mem=json`: the saved activations of M micro-batches are those of the
   M = 1 plan of one micro-batch (B / M), byte for byte (the micro-batch's rows of the
   inputs are views; with --slice_views 0, copies that add the tokens' rows); M = 4's a
   quarter of M = 1's but for the few that do not scale with the batch.
3. From `fsc --comm`: ddp, zero1 and zero2 send the same bytes per step at every M
   (one reduction per step, after the last micro-batch); fsdp with
   reshard_after_forward 0 too (one gather per step).
4. A batch that does not split over world x M is an error naming B, the world and M.

usage: accumulate.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy)
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from models import load_safetensors  # noqa: E402
from trainrun import STEPS, TRAIN, compare as compare_runs, mpi_main, rel, run  # noqa: E402

TOL = 1e-5
MODELS = {
    "gpt2": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=24"],
    "llama": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "F=64", "-D", "T=16", "-D", "V=256", "-D", "B=24"],
}


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data

    def train(self, model, world, m, extra, threads=1):
        tag = re.sub(r"[^A-Za-z0-9]+", "-", "%s-%d-%d-%s-%d" % (model, world, m, "-".join(extra), threads))
        plan, out, log = (os.path.join(self.work, tag + ext) for ext in (".plan", ".safetensors", ".jsonl"))
        run([self.fsc, "samples/%s.fsm" % model, *MODELS[model], *TRAIN, "--world", str(world),
             "--microbatches", str(m), *extra, "-o", plan, "-q"])
        cmd = [self.fsexec] + (["--nproc", str(world)] if world > 1 else [])
        run(cmd + [plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--data-order", "sequential",
                   "--threads", str(threads), "--data", self.data])
        with open(log) as f:
            logged = [(r["loss"], r["grad_norm"]) for r in map(json.loads, f)]
        return load_safetensors(out), logged


def compare(what, got, ref, floor, tol, whole_tol=None, loss_tol=None):
    compare_runs(what, got, ref, floor, tol, whole_tol, loss_tol, ref_name="the M = 1 run")


def training(r):
    for model in MODELS:
        ref1, _ = r.train(model, 1, 1, ["--shard", "none"])
        other, _ = r.train(model, 1, 1, ["--shard", "none"], threads=2)
        floor = {n: rel(other[n].numpy().astype(np.float64), t.numpy().astype(np.float64)) for n, t in ref1.items()}
        cases = [(1, ["--shard", "none"])] + [(w, ["--shard", s]) for s in ("ddp", "zero1", "zero2", "fsdp")
                                              for w in (1, 2, 3)]
        cases += [(2, ["--shard", "fsdp", "--reshard_after_forward", "0"]),
                  (2, ["--shard", "fsdp", "--recompute", "all"]),
                  (3, ["--shard", "ddp", "--recompute", "all"])]
        for world, extra in cases:
            ref = r.train(model, world, 1, extra)
            for m in (2, 4):
                compare("%s %s world %d M %d" % (model, " ".join(extra[1:]), world, m), r.train(model, world, m, extra),
                        ref, floor, TOL)
        for world, extra in ((2, ["--shard", "fsdp", "--precision", "bf16"]),
                             (2, ["--shard", "zero2", "--precision", "bf16", "--recompute", "all"]),
                             (2, ["--shard", "ddp", "--precision", "fp16"])):
            ref = r.train(model, world, 1, extra)
            for m in (2, 4):
                compare("%s %s world %d M %d" % (model, " ".join(extra[1:]), world, m), r.train(model, world, m, extra),
                        ref, {}, 5e-2, whole_tol=2e-3, loss_tol=5e-3)


def mem_json(r, model, m, extra, dims=()):
    out = run([r.fsc, "samples/%s.fsm" % model, *MODELS[model], *dims, "--microbatches", str(m), *extra, "--mem=json",
               "-q"]).stdout
    return {c["key"]: c["max"] for c in json.loads(out)["categories"]}


def memory(r):
    """Saved activations are one micro-batch's: those of the M = 1 plan of a batch B / M,
    byte for byte; so a quarter of M = 1's at M = 4, but for what does not scale with
    the batch (the position embedding's rows, GPT-2's transposed embedding table)."""
    for model in MODELS:
        for extra, ranks in ((["--shard", "none"], 1), (["--shard", "fsdp", "--world", "3"], 3)):
            saved = {}
            for m in (1, 2, 4):
                saved[m] = mem_json(r, model, m, extra)["saved"]
                one = mem_json(r, model, 1, extra, ["-D", "B=%d" % (24 // m)])
                # The micro-batch's rows of the tokens, which the embedding's backward
                # reads, are a view of the input (passes/slice_view.c), in no saved bytes;
                # with --slice_views 0 they are a copy: half the inputs of that plan
                # (tokens and targets, the same size) less its 4-byte step counter. The
                # targets' rows are not saved: the fused loss (passes/xent.c) reads them in
                # the forward only.
                copies = mem_json(r, model, m, extra + ["--slice_views", "0"])["saved"]
                rows = (one["inputs"] - 4) // 2 if m > 1 else 0
                if saved[m] != one["saved"] or copies != one["saved"] + rows or not saved[m] > 0:
                    sys.exit("FAIL %s %s M %d: saved activations %d bytes (%d with the rows copied), but %d (+ %d) in "
                             "the M = 1 plan of one micro-batch" % (model, " ".join(extra), m, saved[m], copies,
                                                                    one["saved"], rows))
            if not saved[1] / saved[4] > 3.2 or not saved[1] / saved[2] > 1.8:
                sys.exit("FAIL %s %s: saved activations at M = 1, 2, 4: %s" % (model, " ".join(extra), saved))
            print("ok   %-5s %-22s saved activations at M = 1, 2, 4: %d, %d, %d bytes (M = 1 / M = 4: %.2f)"
                  % (model, " ".join(extra), saved[1], saved[2], saved[4], saved[1] / saved[4]))


def comm_bytes(r, model, m, extra):
    out = run([r.fsc, "samples/%s.fsm" % model, *MODELS[model], "--microbatches", str(m), *extra, "--comm", "-q"]).stdout
    found = re.search(r"total: (\d+) collectives, payload ([\d,]+) bytes", out)
    if not found:
        sys.exit("FAIL: no total in fsc --comm:\n" + out)
    return int(found.group(1)), int(found.group(2).replace(",", ""))


def communication(r):
    model = "gpt2"
    for shard in ("ddp", "zero1", "zero2", "fsdp-once", "fsdp"):
        extra = ["--shard", shard.split("-")[0], "--world", "2"] + (["--reshard_after_forward", "0"] if "once" in shard else [])
        got = {m: comm_bytes(r, model, m, extra) for m in (1, 2, 4)}
        if shard == "fsdp":  # gathers per micro-batch: every block's params twice more per extra micro-batch
            if not got[1][1] < got[2][1] < got[4][1]:
                sys.exit("FAIL fsdp: bytes per step %s do not grow with M" % got)
        elif len(set(got.values())) != 1:
            sys.exit("FAIL %s: collectives and bytes per step at M = 1, 2, 4 differ: %s" % (shard, got))
        print("ok   %-9s world 2: (collectives, bytes) per step at M = 1, 2, 4: %s" % (shard, [got[m] for m in (1, 2, 4)]))


def errors(r):
    res = run([r.fsc, "samples/gpt2.fsm", *MODELS["gpt2"], "-D", "B=10", "--world", "2", "--shard", "ddp",
               "--microbatches", "3", "-q"], ok=False)
    want = ("error: the batch dim B = 10 (the global batch of one step) does not split evenly over 2 data-parallel "
            "ranks x 3 micro-batches; make it a multiple of 6")
    if res.returncode == 0 or want not in res.stdout or not re.search(r"gpt2\.fsm:\d+:\d+: error", res.stdout):
        sys.exit("FAIL: B = 10 over world 2 x M 3 says:\n" + res.stdout)
    print("ok   B that does not split over world x M is an error")


def main():
    mpi_main(Runner, [errors, memory, communication, training],
             "gradient accumulation trains like one micro-batch, and costs what the plan says")


if __name__ == "__main__":
    main()
