#!/usr/bin/python3
"""Indexing and slicing in the language (frontend/index.c): x[:, 0, :], x[:, 1:], x[..., a:b].

1. Values and gradients: a model that slices a param's rows (pos[2:-1, :]), takes a middle
   position (h[:, 0, 1:-2]), a slice from 1 (h[:, 1:, :]), an index after an index
   (h[:, -1, :][:, 4]) and a negative index inside a slice (h[:, 2:4, -3]). Its step-1
   loss and every gradient (--save-grads) equal PyTorch's in float64 on the same init and
   batch (the same indexing in torch); central finite differences of fsexec's own loss
   (runs from perturbed --load-weights) give its gradient, and the rows of pos that no
   slice reads get exactly zero (slice_bwd's zeros).
2. CLS pooling: a one-block BERT-style classifier (non-causal attention, post-LN) whose
   logits read the first position, x[:, 0, :], trains 6 AdamW steps on .npy tokens and
   labels like the same model in PyTorch float64: every step's loss, and the weights after
   the last step.

usage: /usr/bin/python3 tests/py/indexing.py FSC FSEXEC   (numpy, torch)
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

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import heads, layernorm, load_safetensors, merge_heads, save_safetensors  # noqa: E402

SLICES = """model slices {
  dim B = 4, T = 6, C = 8, K = 5;
  input x: f32[B, T, C];
  input y: i32[B];
  param w1: [C, C] = normal(0.3);
  param pos: [T + 3, C] = normal(0.3);
  param w2: [C - 3, K] = normal(0.3);
  param w3: [T - 1, K] = normal(0.3);
  h = tanh(x @ w1) + pos[2:-1, :];
  a = h[:, 0, 1:-2] @ w2;
  b = sum(h[:, 1:, :], axis = -1) @ w3;
  c = h[:, -1, :][:, 4];
  d = h[:, 2:4, -3];
  loss = cross_entropy(a + b + reshape(c, [B, 1]) + sum(d, axis = -1, keepdim = 1), y);
}
"""

CLS = """model cls {
  dim B = 8, T = 6, V = 32, C = 16, NH = 2, K = 3;
  input tokens: i32[B, T];
  input labels: i32[B];
  param wte: [V, C] = normal(0.1);
  param wpe: [T, C] = normal(0.1);
  param attn.w: [C, 3 * C] = normal(0.1);
  param proj.w: [C, C] = normal(0.1);
  param ln.w: [C] = ones;
  param ln.b: [C] = zeros;
  param head.w: [C, K] = normal(0.1);
  param head.b: [K] = zeros;
  x = embedding(wte, tokens) + embedding(wpe, arange(T));
  q, k, v = split(x @ attn.w, 3, axis = -1);
  x = layernorm(x + merge_heads(attention(heads(q, NH), heads(k, NH), heads(v, NH))) @ proj.w, ln.w, ln.b);
  logits = x[:, 0, :] @ head.w + head.b;
  loss = cross_entropy(logits, labels);
  output logits;
}
train { optimizer adamw(lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1); }
"""
STEPS, LR, WD = 6, 0.01, 0.1


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != 0:
        sys.exit("FAIL (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def losses(path):
    with open(path) as f:
        return [json.loads(line)["loss"] for line in f if line.strip()]


def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def slices_loss(p, x, y):
    h = torch.tanh(x @ p["w1"]) + p["pos"][2:-1, :]
    a = h[:, 0, 1:-2] @ p["w2"]
    b = h[:, 1:, :].sum(-1) @ p["w3"]
    c = h[:, -1, :][:, 4]
    d = h[:, 2:4, -3]
    return F.cross_entropy(a + b + c[:, None] + d.sum(-1, keepdim=True), y)


def gradients(fsc, fsexec, P):
    rng = np.random.default_rng(3)
    x, y = rng.normal(size=(4, 6, 8)).astype(np.float32), rng.integers(0, 5, size=4).astype(np.int32)
    np.save(P("x.npy"), x)
    np.save(P("y.npy"), y)
    with open(P("slices.fsm"), "w") as f:
        f.write(SLICES)
    run([fsc, P("slices.fsm"), "-q", "-o", P("slices.plan")])
    common = ["--data", "x=%s,y=%s" % (P("x.npy"), P("y.npy")), "--data-order", "sequential", "--threads", "1"]
    run([fsexec, P("slices.plan"), "--steps", "0", "--save-weights", P("w0.safetensors")])
    run([fsexec, P("slices.plan"), "--steps", "1", "--save-grads", P("g.safetensors"), "--log", P("g.jsonl"), *common])
    init, grads, got_loss = load_safetensors(P("w0.safetensors")), load_safetensors(P("g.safetensors")), \
        losses(P("g.jsonl"))[0]
    p = {n: t.double().requires_grad_(True) for n, t in init.items()}
    loss = slices_loss(p, torch.from_numpy(x).double(), torch.from_numpy(y).long())
    loss.backward()
    lerr = abs(got_loss - loss.item()) / loss.item()
    gerr = {n: rel(grads[n].double(), p[n].grad) for n in p}
    if lerr > 1e-6 or max(gerr.values()) > 1e-5:
        sys.exit("FAIL slices against PyTorch: loss %.8f vs %.8f; gradients rel %s" % (got_loss, loss.item(), gerr))
    unread = grads["pos"][[0, 1, 8]]
    if unread.abs().max().item() != 0 or grads["pos"][3:8].abs().min().item() == 0:
        sys.exit("FAIL: pos's gradient should be zero exactly on rows 0, 1, 8 (unsliced), not on 3..7:\n%s" % grads["pos"])
    print("ok   slices: loss rel %.1e, gradients rel %.1e of PyTorch float64; pos's unsliced rows get 0" %
          (lerr, max(gerr.values())))

    # Central differences of fsexec's own f32 loss.
    eps, worst = 1e-2, 0.0
    for name, idx in (("pos", (2, 1)), ("pos", (7, 5)), ("pos", (3, 0)), ("pos", (8, 3)), ("w1", (1, 2)),
                      ("w2", (4, 0)), ("w3", (0, 3))):
        side = []
        for sign in (1, -1):
            w = {n: t.clone() for n, t in init.items()}
            w[name][idx] += sign * eps
            save_safetensors(P("fd.safetensors"), w)
            run([fsexec, P("slices.plan"), "--steps", "1", "--load-weights", P("fd.safetensors"), "--log",
                 P("fd.jsonl"), *common])
            side.append(losses(P("fd.jsonl"))[0])
        fd, g = (side[0] - side[1]) / (2 * eps), grads[name][idx].item()
        if abs(fd - g) > 2e-3 + 1e-2 * abs(g):
            sys.exit("FAIL finite differences: d loss / d %s%s = %.6f, fsexec's gradient %.6f" % (name, idx, fd, g))
        worst = max(worst, abs(fd - g))
    print("ok   slices: central differences of fsexec's loss within %.1e of its gradient (7 elements)" % worst)


def cls_loss(p, tok, lab, NH=2):
    T = tok.shape[1]
    x = p["wte"][tok] + p["wpe"][torch.arange(T)]
    q, k, v = (x @ p["attn.w"]).split(x.shape[-1], dim=-1)
    q, k, v = heads(q, NH), heads(k, NH), heads(v, NH)
    a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v  # not causal
    x = layernorm(x + merge_heads(a) @ p["proj.w"], p["ln.w"], p["ln.b"])
    return F.cross_entropy(x[:, 0, :] @ p["head.w"] + p["head.b"], lab)


def cls_training(fsc, fsexec, P):
    rng = np.random.default_rng(5)
    N, B = 40, 8
    tok, lab = rng.integers(0, 32, size=(N, 6)).astype(np.int32), rng.integers(0, 3, size=N).astype(np.int32)
    np.save(P("tok.npy"), tok)
    np.save(P("lab.npy"), lab)
    with open(P("cls.fsm"), "w") as f:
        f.write(CLS)
    run([fsc, P("cls.fsm"), "-q", "-o", P("cls.plan")])
    run([fsexec, P("cls.plan"), "--steps", "0", "--save-weights", P("c0.safetensors")])
    run([fsexec, P("cls.plan"), "--data", "tokens=%s,labels=%s" % (P("tok.npy"), P("lab.npy")), "--data-order",
         "sequential", "--steps", str(STEPS), "--log", P("c.jsonl"), "--save-weights", P("c1.safetensors"),
         "--threads", "1"])
    got = losses(P("c.jsonl"))
    p = {n: t.double().requires_grad_(True) for n, t in load_safetensors(P("c0.safetensors")).items()}
    opt = torch.optim.AdamW(list(p.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
    T, Y = torch.from_numpy(tok).long(), torch.from_numpy(lab).long()
    want = []
    for s in range(1, STEPS + 1):
        rows = [((s - 1) * B + b) % N for b in range(B)]
        loss = cls_loss(p, T[rows], Y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    lerr = max(abs(a - b) / b for a, b in zip(got, want))
    final = load_safetensors(P("c1.safetensors"))
    perr = max(rel(final[n].double(), p[n].detach()) for n in p)
    if len(got) != STEPS or lerr > 1e-5 or perr > 1e-5:
        sys.exit("FAIL CLS pooling: losses %s, PyTorch %s (rel %.1e); weights rel %.1e" % (got, want, lerr, perr))
    if not want[-1] < want[0]:
        sys.exit("FAIL CLS pooling: the loss did not fall: %s" % want)
    print("ok   CLS pooling x[:, 0, :]: %d AdamW steps, losses rel %.1e (%.4f -> %.4f) and weights rel %.1e of "
          "PyTorch float64" % (STEPS, lerr, want[0], want[-1], perr))


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="indexing.")
    try:
        def P(name):
            return os.path.join(work, name)
        gradients(fsc, fsexec, P)
        cls_training(fsc, fsexec, P)
        print("indexing: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
