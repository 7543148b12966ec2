#!/usr/bin/env python3
"""Any strategy, same training (DESIGN.md invariant 1), across MPI ranks.

For the MLP and a tiny GPT-2, every strategy (ddp, zero1, zero2, fsdp) at world 1, 2, 3
and 4 (3 leaves uneven, padded shards) trains 5 AdamW steps from the same seed on the
same global batches; the consolidated params it saves must equal those of the
single-rank, unsharded run to rel 1e-5 (max|a - b| / max|b| per tensor), and so must
every step's logged loss.

One exception, as in tests/py/parity.py: GPT-2's key bias (the middle third of
attn.b) has a gradient that is zero in exact arithmetic (softmax ignores a shift that
is the same for every key); in fp32 it is rounding noise, different for every order of
summation, which AdamW turns into updates of ~1e-6. Those slices must stay within 1e-2
of the largest q/v bias instead.

usage: strategies.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy)
"""
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from models import load_safetensors  # noqa: E402

TOL = 1e-5
STEPS = 5
GPT2 = ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=256", "-D", "B=12"]
MLP = ["-D", "B=48"]
TRAIN = ["--optimizer", "adamw", "--lr", "1e-3", "--weight_decay", "0.1", "--clip", "1.0", "--warmup", "2"]


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f]


def rel(a, b):
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def train(fsc, fsexec, work, model, dims, data, shard, world):
    plan = os.path.join(work, "%s-%s-%d.plan" % (model, shard, world))
    out = os.path.join(work, "%s-%s-%d.safetensors" % (model, shard, world))
    log = os.path.join(work, "%s-%s-%d.jsonl" % (model, shard, world))
    run([fsc, "samples/%s.fsm" % model, *dims, *TRAIN, "--shard", shard, "--world", str(world), "-o", plan, "-q"],
        ROOT)
    cmd = [fsexec]
    if world > 1:
        cmd += ["--nproc", str(world)]
    cmd += [plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--data-order", "sequential",
            "--threads", "1"]
    if data:
        cmd += ["--data", data]
    run(cmd, ROOT)
    return load_safetensors(out), losses(log)


def compare(model, what, got, ref):
    worst, worst_name = 0.0, ""
    for name, b in ref.items():
        a = got[name].numpy().astype(np.float64)
        b = b.numpy().astype(np.float64)
        if model == "gpt2" and name.endswith(".attn.b"):
            q, k, v = np.split(a, 3)
            qb, kb, vb = np.split(b, 3)
            e = max(rel(q, qb), rel(v, vb))
            kb_err = float(np.max(np.abs(k - kb)) / max(np.max(np.abs(qb)), np.max(np.abs(vb))))
            if kb_err > 1e-2:
                sys.exit("FAIL %s %s: key bias %s differs by %.2e of the q/v bias" % (model, what, name, kb_err))
        else:
            e = rel(a, b)
        if e > worst:
            worst, worst_name = e, name
    if worst > TOL:
        sys.exit("FAIL %s %s: param %s differs from the single-rank run: rel %.2e > %.0e" %
                 (model, what, worst_name, worst, TOL))
    return worst, worst_name


ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))


def main():
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        tokens = os.path.join(work, "tokens.bin")
        np.random.default_rng(3).integers(0, 256, size=4000, dtype=np.uint16).tofile(tokens)
        for model, dims, data in (("mlp", MLP, None), ("gpt2", GPT2, tokens)):
            ref, ref_loss = train(fsc, fsexec, work, model, dims, data, "none", 1)
            for shard in ("ddp", "zero1", "zero2", "fsdp"):
                for world in (1, 2, 3, 4):
                    got, got_loss = train(fsc, fsexec, work, model, dims, data, shard, world)
                    what = "%s world %d" % (shard, world)
                    worst, name = compare(model, what, got, ref)
                    lerr = max(abs(a - b) / abs(b) for a, b in zip(got_loss, ref_loss))
                    if len(got_loss) != STEPS or lerr > TOL:
                        sys.exit("FAIL %s %s: losses %s, single rank %s" % (model, what, got_loss, ref_loss))
                    print("ok   %-5s %-6s world %d: params rel %.1e (%s), losses rel %.1e" %
                          (model, shard, world, worst, name, lerr))
    print("all strategies and worlds train like the single-rank run")


if __name__ == "__main__":
    main()
