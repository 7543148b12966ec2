#!/usr/bin/env python3
"""Pipeline parallelism (`--stages P`) trains like the single-rank run on the same global
batch (DESIGN.md invariant 1), and holds what its memory plan says.

1. Tiny GPT-2 (L = 8, its embedding tied to the head) and tiny Llama, fp32: P = 2 and 4,
   GPipe at M = 1, 2, 4, 8, 1F1B and zb1 (ZB-H1) at every M >= P, interleaved 1F1B with
   2 model chunks per stage at M = 4, 8 (a multiple of P), checkpoint except_last (the
   default); at M = 4 also always and never (interleaved and zb1 too), and GPT-2
   interleaved with 4 chunks.
   After 5 AdamW steps (clipping on) every param equals the single-rank, one-micro-batch
   run's to rel 1e-5 (or 3 times what that run differs from itself between 1 and 2
   threads), and so do the logged losses and gradient norms.
2. P = 2 x 2 data-parallel ranks with ddp, zero1, zero2 and fsdp (and interleaved with
   zero2, zb1 with fsdp), fp32 as above; bf16 with zero2 and fsdp to bf16's tolerance (each tensor
   5e-2, all together 2e-3).
3. The tied embedding: GPT-2's wte, held by the first and the last stage, is bitwise
   the same in both stages' files after the steps, at P = 2 and at P = 2 x dp = 2 under
   zero1 and zero2.
4. Sends forced synchronous (fsexec --sync-sends) complete and train the same.
5. From `fsc --mem=json`, with micro-batches of a fixed size: stage s of 1F1B holds the
   saved activations of min(P - s, M) micro-batches at their most, GPipe of M, to the
   byte; zb1 at most 1F1B's peak on every stage; checkpoint always less than never.
6. `fsc --timeline=unit`: GPipe and 1F1B take (M + P - 1) x 3 units, interleaved at
   P = 2, V = 2, M = 4 idles 1/8 of its ideal time, zb1 (F = B = W = 1) P - 1 units.
7. Errors name their numbers: 1f1b with M < P, more stages (or chunks) than blocks, a
   balance that leaves a stage without blocks, a world that does not split into the
   stages, interleaved with M not a multiple of P or with one chunk.

usage: pipeline.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy and torch)
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from trainrun import STEPS, TRAIN, compare as compare_runs, load_stages, mpi_main, rel, run  # noqa: E402

TOL = 1e-5
MODELS = {
    "gpt2": ["-D", "L=8", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=16"],
    "llama": ["-D", "L=4", "-D", "C=32", "-D", "NH=2", "-D", "F=64", "-D", "T=16", "-D", "V=256", "-D", "B=16"],
}


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data

    def train(self, model, extra, world=1, threads=1, run_flags=()):
        tag = re.sub(r"[^A-Za-z0-9]+", "-", "%s-%d-%s-%s-%d" % (model, world, "-".join(extra), "-".join(run_flags), threads))
        plan, out, log = (os.path.join(self.work, tag + ext) for ext in (".plan", ".safetensors", ".jsonl"))
        run([self.fsc, "samples/%s.fsm" % model, *MODELS[model], *TRAIN, "--world", str(world), *extra, "-o", plan, "-q"])
        cmd = [self.fsexec] + (["--nproc", str(world)] if world > 1 else [])
        run(cmd + [plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--data-order", "sequential",
                   "--threads", str(threads), "--data", self.data, *run_flags])
        with open(log) as f:
            logged = [(r["loss"], r["grad_norm"]) for r in map(json.loads, f)]
        params, copies = load_stages(out)
        return params, logged, copies


def tied_equal(what, copies, names):
    for name in names:
        c = copies.get(name)
        if not c or len(c) < 2:
            sys.exit("FAIL %s: %s is not in two stages' files" % (what, name))
        if any(not np.array_equal(c[0].numpy().view(np.uint32), x.numpy().view(np.uint32)) for x in c[1:]):
            sys.exit("FAIL %s: the stages' copies of %s differ" % (what, name))
    print("ok   %-52s tied %s bitwise equal on every stage holding it" % (what, ", ".join(names)))


def pipe(p, m, sched, ckpt=None, dp=1, shard="none", more=(), chunks=None):
    extra = ["--stages", str(p), "--microbatches", str(m), "--schedule", sched, "--shard", shard, *more]
    extra += ["--chunks", str(chunks)] if chunks else []
    return (extra + ["--checkpoint", ckpt] if ckpt else extra), p * dp


def compare(what, got, ref, floor, tol, whole_tol=None, loss_tol=None):
    compare_runs(what, got, ref, floor, tol, whole_tol, loss_tol, ref_name="the single-rank run")


def training(r):
    for model in MODELS:
        ref = r.train(model, ["--shard", "none"])
        other = r.train(model, ["--shard", "none"], threads=2)
        floor = {n: rel(other[0][n].numpy().astype(np.float64), t.numpy().astype(np.float64)) for n, t in ref[0].items()}
        cases = []
        for p in (2, 4):
            cases += [pipe(p, m, "gpipe") for m in (1, 2, 4, 8)]
            cases += [pipe(p, m, "1f1b") for m in (2, 4, 8) if m >= p]
            cases += [pipe(p, 4, s, c) for s in ("gpipe", "1f1b") for c in ("always", "never")]
            cases += [pipe(p, m, "interleaved", chunks=2) for m in (4, 8) if m % p == 0]
            cases += [pipe(p, m, "zb1") for m in (4, 8) if m >= p]
            cases += [pipe(p, 4, "zb1", c) for c in ("always", "never")]
        cases += [pipe(2, 4, "interleaved", c, chunks=2) for c in ("always", "never")]
        cases += [pipe(2, 4, "interleaved", chunks=4)] if model == "gpt2" else []
        if model == "llama":  # fewer: the same machinery, another model (of 4 blocks: 4 model chunks at most)
            cases = [c for c in cases if "8" not in c[0] and not ("interleaved" in c[0] and c[1] > 2)]
        for extra, world in cases:
            got = r.train(model, extra, world)
            compare("%s %s" % (model, " ".join(extra)), got, ref, floor, TOL)
            if model == "gpt2" and extra[1] == "2" and extra[3] == "4":
                tied_equal("%s %s" % (model, " ".join(extra)), got[2], ["wte"])
        for shard in ("ddp", "zero1", "zero2", "fsdp", "zero2-interleaved", "fsdp-zb1"):
            sched = shard.split("-")[1] if "-" in shard else "1f1b"
            extra, world = pipe(2, 4, sched, dp=2, shard=shard.split("-")[0], chunks=2 if sched == "interleaved" else None)
            got = r.train(model, extra, world)
            compare("%s %s world %d" % (model, " ".join(extra), world), got, ref, floor, TOL)
            if model == "gpt2" and shard in ("zero1", "zero2"):
                tied_equal("%s %s world %d" % (model, " ".join(extra), world), got[2], ["wte"])
        for shard in ("zero2", "fsdp"):
            extra, world = pipe(2, 4, "1f1b", dp=2, shard=shard, more=("--precision", "bf16"))
            bref = r.train(model, ["--shard", shard, "--precision", "bf16"], 2)
            compare("%s %s world %d" % (model, " ".join(extra), world), r.train(model, extra, world), bref, {}, 5e-2,
                    whole_tol=2e-3, loss_tol=5e-3)
        extra, world = pipe(2, 4, "1f1b")
        compare("%s %s --sync-sends" % (model, " ".join(extra)), r.train(model, extra, world, run_flags=("--sync-sends",)),
                ref, floor, TOL)


def stage_saved(r, model, extra):
    """Each stage's most saved activations at once, from fsc --mem=json."""
    out = json.loads(run([r.fsc, "samples/%s.fsm" % model, *MODELS[model], *extra, "--mem=json", "-q"]).stdout)
    stages = out.get("stages")
    if not stages:
        sys.exit("FAIL: fsc --mem=json of a pipeline has no stages:\n%s" % json.dumps(out)[:2000])
    return [next(c["max"] for c in s["categories"] if c["key"] == "saved") for s in stages]


def memory(r):
    """With micro-batches of a fixed size (B = 2M), a stage's saved activations at their most
    are a per micro-batch it holds at once, plus c (c: what does not grow with them, such as
    GPT-2's transposed embedding table): GPipe holds M, 1F1B min(P - s, M). a and c come
    from GPipe at M = 1 and 2; every other plan must match to the byte."""
    model = "gpt2"
    for p in (2, 4):
        def saved(m, sched, ckpt="never"):
            return stage_saved(r, model, pipe(p, m, sched, ckpt)[0] + ["--world", str(p), "-D", "B=%d" % (2 * m)])
        g1, g2 = saved(1, "gpipe"), saved(2, "gpipe")
        a = [g2[s] - g1[s] for s in range(p)]
        c = [g1[s] - a[s] for s in range(p)]
        for m in (4, 8):
            for sched in ("gpipe", "1f1b"):
                got = saved(m, sched)
                held = [m if sched == "gpipe" else min(p - s, m) for s in range(p)]
                want = [held[s] * a[s] + c[s] for s in range(p)]
                if got != want or min(a) <= 0:
                    sys.exit("FAIL %s P=%d M=%d %s checkpoint never: saved activations per stage %s, want %s (%s "
                             "micro-batches of %s, plus %s)" % (model, p, m, sched, got, want, held, a, c))
                print("ok   %s P=%d M=%d %-5s saved activations per stage %s: %s micro-batches of %s bytes, plus %s"
                      % (model, p, m, sched, got, held, a, c))
            zb = saved(m, "zb1")  # W later, but ZB-H1's peak is 1F1B's: its first stage's
            if max(zb) > max(got):
                sys.exit("FAIL %s P=%d M=%d: zb1 saves %s, more than 1F1B's peak %d" % (model, p, m, zb, max(got)))
            print("ok   %s P=%d M=%d zb1   saved activations per stage %s: at most 1F1B's peak %d" % (model, p, m, zb, max(got)))
            always = saved(m, "1f1b", "always")
            if not all(always[s] < got[s] for s in range(p)):
                sys.exit("FAIL %s P=%d M=%d: checkpoint always saves %s, never %s" % (model, p, m, always, got))
            print("ok   %s P=%d M=%d 1f1b checkpoint always saves %s (never: %s)" % (model, p, m, always, got))


def timelines(r):
    """`fsc --timeline=unit` (forward 1, backward 2 per micro-batch and model chunk): GPipe and
    1F1B take (M + P - 1) x 3; interleaved at P = 2, V = 2, M = 4 idles 1/8 of its ideal;
    zb1 (forward = input-grad = weight-grad = 1) idles P - 1 units per stage."""
    for p, m, sched, chunks, makespan, ideal in ((2, 4, "gpipe", None, 15, 12), (2, 4, "1f1b", None, 15, 12),
                                                 (4, 8, "gpipe", None, 33, 24), (4, 8, "1f1b", None, 33, 24),
                                                 (2, 4, "interleaved", 2, 27, 24), (2, 4, "zb1", None, 13, 12),
                                                 (4, 8, "zb1", None, 27, 24)):
        extra = pipe(p, m, sched, chunks=chunks)[0] + ["--world", str(p), "--timeline=unit"]
        out = run([r.fsc, "samples/gpt2.fsm", *MODELS["gpt2"], *extra, "-q"]).stdout
        got = re.search(r"makespan (\d+); ideal (\d+)", out)
        if not got or (int(got.group(1)), int(got.group(2))) != (makespan, ideal):
            sys.exit("FAIL: %s: want makespan %d, ideal %d:\n%s" % (" ".join(extra), makespan, ideal, out))
        print("ok   timeline P=%d M=%d %-11s unit costs: makespan %d, ideal %d (bubble %.3f of the ideal)"
              % (p, m, sched, makespan, ideal, (makespan - ideal) / ideal))


def errors(r):
    base = [r.fsc, "samples/gpt2.fsm", *MODELS["gpt2"], "-q"]
    for args, want in (
            (["--stages", "4", "--world", "4", "--microbatches", "2", "--schedule", "1f1b"],
             "schedule 1f1b with microbatches 2 < stages 4"),
            (["--stages", "16", "--world", "16", "--microbatches", "16"], "stages 16: the model has 8 blocks"),
            (["--stages", "2", "--world", "2", "--microbatches", "2", "--balance", "8,0"], "stage 1 has 0 blocks"),
            (["--stages", "2", "--world", "2", "--microbatches", "2", "--balance", "4,3"],
             "balance '4,3' places 7 blocks on 2 stages; the model has 8 blocks"),
            (["--stages", "2", "--world", "3", "--microbatches", "2"], "world 3 does not split into 2 pipeline stages"),
            (["--stages", "4", "--world", "4", "--microbatches", "2", "--schedule", "interleaved", "--chunks", "2"],
             "microbatches must be a multiple of the stages (Megatron's rule); use microbatches 4"),
            (["--stages", "2", "--world", "2", "--microbatches", "4", "--schedule", "interleaved"],
             "each stage needs at least 2 model chunks"),
            (["--stages", "4", "--world", "4", "--microbatches", "4", "--schedule", "interleaved", "--chunks", "4"],
             "stages 4 x chunks 4 = 16 model chunks: the model has 8 blocks")):
        res = run(base + args, ok=False)
        if res.returncode == 0 or want not in res.stdout:
            sys.exit("FAIL: %s says:\n%s\n(want: %s)" % (" ".join(args), res.stdout, want))
    print("ok   1f1b with M < P, more stages than blocks, a stage without blocks, a bad balance, a world that does "
          "not split: errors with their numbers")


def main():
    mpi_main(Runner, [errors, timelines, memory, training],
             "pipeline stages train like the single-rank run, and hold what the plan says")


if __name__ == "__main__":
    main()
