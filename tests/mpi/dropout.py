#!/usr/bin/env python3
"""dropout(x, p) through fsc and fsexec: recompute, world 2 and PyTorch.

(a) A small MLP with dropout inside its checkpointed layer and before it trains 5 steps;
    with `--recompute Hidden` (the backward re-runs the layer's forward, so it must draw
    the same masks) its losses and final weights are bit for bit those without; resumed
    from a checkpoint after step 2, steps 3-5 are bit for bit the straight run's.
(b) The same model under `shard fsdp`, world 2, two ranks under mpirun, trains like
    world 1: every step's loss and gradient norm and the final weights to rel 1e-5 (the
    tolerance of tests/mpi/strategies.py), since each rank draws its part of the global
    batch's mask; a rank that counted elements from 0 (its local mask) repeats rank 0's
    mask, and the losses differ by orders of magnitude more.
(c) The memory plan stores no mask: the model saves for backward exactly the bytes the
    same model without dropout saves (the backward regenerates each mask from its key).
(d) PyTorch semantics. An LM whose logits are dropout(embedding(wte, tokens), p), on a
    token file where step 1's B x T tokens are all distinct: then step 1's gradient of
    row tokens[b, t] of wte is mask[b, t] / (1 - p) * dlogits[b, t], zero exactly where
    the mask dropped. The mask read from fsexec's --save-grads is applied in PyTorch as
    F.dropout does (x * mask / (1 - p)); fsexec's step-1 loss and every gradient must
    match PyTorch's, the kept fraction must be 1 - p within 6 binomial sigma, and the
    kept values' scale must be F.dropout's own (torch's dropout of ones gives exactly
    {0, 1 / (1 - p)} in f32).

usage: dropout.py FSC FSEXEC   (needs /usr/bin/python3's torch; mpirun for (b))
"""
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from models import load_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

TOL = 1e-5
STEPS = 5
P = 0.25

MLP_TEMPLATE = """
model mlp {{
  dim B = 48, D = 16, H = 64, K = 4, L = 2;
  input x: f32[B, D];
  input y: i32[B];
  layer Hidden {{
    param w: [H, H] = normal(0.125);
    param b: [H] = zeros;
    forward(h) {{
      return {drop1};
    }}
  }}
  param w_in: [D, H] = uniform(-0.25, 0.25);
  param w_out: [H, K] = normal(0.125);
  h = Hidden[L]({drop0}) as hidden;
  logits = h @ w_out;
  loss = cross_entropy(logits, y);
  output logits;
}}
train {{ optimizer adamw(lr = 1e-2, eps = 1e-6); }}
"""
MLP = MLP_TEMPLATE.format(drop0="dropout(x @ w_in, 0.1)", drop1="dropout(relu(h @ w + b), 0.2)")
MLP_PLAIN = MLP_TEMPLATE.format(drop0="x @ w_in", drop1="relu(h @ w + b)")  # the same without dropout

LM = """
model lm {
  dim B = 4, T = 8, V = 256;
  input tokens: i32[B, T];
  input targets: i32[B, T];
  param wte: [V, V] = normal(1);
  loss = cross_entropy(dropout(embedding(wte, tokens), %g), targets);
}
""" % P


def run(cmd, cwd, env=None):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def losses(path):
    with open(path) as f:
        return [(r["loss"], r["grad_norm"]) for r in map(json.loads, f)]


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def train_mlp(fsc, fsexec, work, tag, opts, world=1):
    plan, out, log = (os.path.join(work, tag + ext) for ext in (".plan", ".safetensors", ".jsonl"))
    run([fsc, os.path.join(work, "mlp.fsm"), *opts, "--world", str(world), "-o", plan, "-q"], work)
    cmd = [fsexec, plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--threads", "1"]
    if world > 1:
        env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
        run(["mpirun", "--oversubscribe", "-np", str(world), *cmd], work, env)
    else:
        run(cmd, work)
    with open(out, "rb") as f:
        raw = f.read()
    return load_safetensors(out), losses(log), raw


def recompute_and_world(fsc, fsexec, work):
    ref, ref_loss, ref_raw = train_mlp(fsc, fsexec, work, "ref", [])
    _, rc_loss, rc_raw = train_mlp(fsc, fsexec, work, "recompute", ["--recompute", "Hidden"])
    if rc_loss != ref_loss or rc_raw != ref_raw:
        sys.exit("FAIL recompute: losses %s, without recompute %s; weights %s" %
                 (rc_loss, ref_loss, "equal" if rc_raw == ref_raw else "differ"))
    print("ok   recompute Hidden: losses and weights bit for bit those without (%d steps)" % STEPS)
    # Resumed after step 2, the masks of steps 3.. are the straight run's: keyed by the step.
    ck, log = os.path.join(work, "ck"), os.path.join(work, "resumed.jsonl")
    plan = os.path.join(work, "ref.plan")
    run([fsexec, plan, "--steps", "2", "--checkpoint-dir", ck, "--threads", "1"], work)
    run([fsexec, plan, "--steps", str(STEPS), "--resume", ck, "--log", log, "--threads", "1"], work)
    if losses(log) != ref_loss[2:]:
        sys.exit("FAIL resume: steps 3-%d %s, straight %s" % (STEPS, losses(log), ref_loss[2:]))
    print("ok   resumed after step 2: steps 3-%d bit for bit the straight run's" % STEPS)
    if not shutil.which("mpirun"):
        print("SKIP fsdp world 2: mpirun not found")
        return
    got, got_loss, _ = train_mlp(fsc, fsexec, work, "fsdp2", ["--shard", "fsdp"], world=2)
    lerr = max(abs(a - b) / abs(b) for ga, gb in zip(got_loss, ref_loss) for a, b in zip(ga, gb))
    perr = max(rel(got[n].numpy().astype(np.float64), t.numpy().astype(np.float64)) for n, t in ref.items())
    if len(got_loss) != STEPS or lerr > TOL or perr > TOL:
        sys.exit("FAIL fsdp world 2: losses %s, world 1 %s (rel %.1e); params rel %.1e" % (got_loss, ref_loss, lerr, perr))
    print("ok   fsdp world 2 under mpirun: losses and norms rel %.1e, params rel %.1e of world 1" % (lerr, perr))


def memory_plan(fsc, work):
    """The backward regenerates the masks: the plan saves exactly what the model without
    dropout saves, and holds 16 bytes more input (the rng words)."""
    cats = {}
    for name in ("mlp.fsm", "plain.fsm"):
        out = run([fsc, os.path.join(work, name), "--mem=json"], work)
        cats[name] = {c["key"]: c["max"] for c in json.loads(out[out.index("{"):])["categories"]}
    d, p = cats["mlp.fsm"], cats["plain.fsm"]
    if d["saved"] != p["saved"] or d["inputs"] != p["inputs"] + 16:
        sys.exit("FAIL memory plan: saved for backward %d bytes with dropout, %d without; inputs %d, %d" %
                 (d["saved"], p["saved"], d["inputs"], p["inputs"]))
    print("ok   memory plan: saved for backward %d bytes with and without dropout; inputs +16 bytes (rng)" % d["saved"])


def pytorch(fsc, fsexec, work):
    B, T, V = 4, 8, 256
    tokens = os.path.join(work, "tokens.bin")
    np.arange(200, dtype=np.uint16).tofile(tokens)  # sequential windows: step 1 reads 0 .. B T
    plan, w0, grads, log = (os.path.join(work, n) for n in ("lm.plan", "w0.safetensors", "g.safetensors", "lm.jsonl"))
    run([fsc, os.path.join(work, "lm.fsm"), "-o", plan, "-q"], work)
    common = ["--data", tokens, "--data-format", "raw", "--data-order", "sequential", "--threads", "1"]
    run([fsexec, plan, "--steps", "0", "--save-weights", w0, *common], work)
    run([fsexec, plan, "--steps", "1", "--save-grads", grads, "--log", log, *common], work)
    wte = load_safetensors(w0)["wte"].double().requires_grad_(True)
    g = load_safetensors(grads)["wte"].double()
    loss_fsexec = losses(log)[0][0]
    tok = torch.arange(B * T).reshape(B, T)
    tgt = tok + 1
    x = wte[tok]
    mask = (g[tok] != 0).double()  # (B, T, V): every row's gradient is nonzero but where dropped
    kept, n, q = float(mask.sum()), mask.numel(), 1 - P
    sigma = math.sqrt(n * q * (1 - q))
    if abs(kept - n * q) > 6 * sigma:
        sys.exit("FAIL kept %d of %d, expected %.0f +- %.0f" % (kept, n, n * q, 6 * sigma))
    y = x * mask / (1 - P)  # F.dropout with this mask
    loss = F.cross_entropy(y.reshape(-1, V), tgt.reshape(-1))
    loss.backward()
    lerr = abs(loss.item() - loss_fsexec) / abs(loss.item())
    gerr = rel(g.numpy(), wte.grad.numpy())
    if lerr > 1e-6 or gerr > 1e-5:
        sys.exit("FAIL against PyTorch: loss %.8f vs %.8f (rel %.1e), gradient rel %.1e" %
                 (loss_fsexec, loss.item(), lerr, gerr))
    # E[mask / (1 - p)] = 1: the output keeps the input's mean magnitude (6 sigma of the sum).
    ax, ay = x.detach().abs(), y.detach().abs()
    spread = 6 * math.sqrt(P / q) * float(ax.pow(2).sum().sqrt()) / float(ax.sum())
    if abs(float(ay.sum()) / float(ax.sum()) - 1) > spread:
        sys.exit("FAIL mean |y| / mean |x| = %.4f, expected 1 +- %.4f" % (float(ay.sum() / ax.sum()), spread))
    ones = F.dropout(torch.ones(100000), P, training=True)
    values = sorted(set(ones.unique().tolist()))
    scale = float(np.float32(1.0 / (1.0 - P)))
    if values != [0.0, scale]:
        sys.exit("FAIL: torch's dropout of ones gives %s, fsexec scales by %r" % (values, scale))
    print("ok   PyTorch: kept %d of %d (expected %.0f +- %.0f); loss rel %.1e, gradient rel %.1e with fsexec's mask; "
          "scale %r as F.dropout's; mean |y| / mean |x| %.4f" % (kept, n, n * q, 6 * sigma, lerr, gerr, scale,
                                                                float(ay.sum() / ax.sum())))


def evaluation(fsc, fsexec, work):
    """The evaluation program (--val-data) runs the model with dropout as the identity:
    its loss before step 1 equals, bit for bit, the same model's without dropout, while
    step 1's training loss (dropout on) differs."""
    vals = {}
    for tag in ("mlp", "plain"):
        plan, log = (os.path.join(work, "eval_" + tag + ext) for ext in (".plan", ".jsonl"))
        run([fsc, os.path.join(work, tag + ".fsm"), "-o", plan, "-q"], work)
        run([fsexec, plan, "--steps", "1", "--val-data", "blobs", "--eval-batches", "2", "--log", log,
             "--threads", "1"], work)
        with open(log) as f:
            lines = [json.loads(line) for line in f if line.strip()]
        val = [x for x in lines if x.get("step") == 0 and "val_loss" in x]
        train = [x for x in lines if x.get("step") == 1 and "loss" in x]
        if not val or not train:
            sys.exit("FAIL evaluation (%s): no val_loss at step 0 or loss at step 1 in %s" % (tag, lines))
        vals[tag] = (val[0]["val_loss"], train[0]["loss"])
    if vals["mlp"][0] != vals["plain"][0]:
        sys.exit("FAIL evaluation: val_loss %r with dropout, %r without: the eval program must not drop"
                 % (vals["mlp"][0], vals["plain"][0]))
    if vals["mlp"][1] == vals["plain"][1]:
        sys.exit("FAIL evaluation: step 1's training loss %r is the same with and without dropout" % vals["mlp"][1])
    print("ok   evaluation: val_loss %.9g with and without dropout; training loss %.9g vs %.9g"
          % (vals["mlp"][0], vals["mlp"][1], vals["plain"][1]))


def main():
    quiet_mpi_leaks()
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        for name, src in (("mlp.fsm", MLP), ("plain.fsm", MLP_PLAIN), ("lm.fsm", LM)):
            with open(os.path.join(work, name), "w") as f:
                f.write(src)
        memory_plan(fsc, work)
        recompute_and_world(fsc, fsexec, work)
        pytorch(fsc, fsexec, work)
        evaluation(fsc, fsexec, work)
    print("dropout trains the same under recompute and fsdp world 2, as PyTorch's")


if __name__ == "__main__":
    main()
