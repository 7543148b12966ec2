#!/usr/bin/python3
"""samples/vit.fsm (a ViT-style image classifier) against PyTorch, and trained on
scripts/image_data.py's synthetic patterns (issue 37, "Samples and tests").

1. Parity: the sample at small dims (8 x 8 images, patch 4, C = 16, 2 heads, L = 2,
   3 classes) trains 6 AdamW steps (clip 1.0, cosine schedule with warmup) by fsexec on
   .npy images and labels, in the batches of --data-order sequential, and the same model
   written by hand in PyTorch float64 (patches by view and transpose, cls_token.expand,
   torch.cat, learned positions, pre-LN blocks with unmasked softmax attention and
   exact F.gelu, CLS pooling) from fsexec's exported init: every step's loss
   within 1e-5 relative and the weights after the last step within 1e-4 (max|a - b| / max|b|),
   the key bias apart, as tests/py/parity.py checks GPT-2 (AdamW's eps 1e-5: gradient
   elements near 1e-7, whose float32 rounding Adam would magnify, stay noise); step 1's
   gradients (--save-grads) within 1e-4; every step's `accuracy` in --log is the
   reference logits' argmax accuracy.
2. Prediction: --predict on the trained weights writes the logits of a PyTorch forward.
3. Learning: image_data.py's set (seed 0, 4 classes, 16 x 16) trains 120 steps of a small
   ViT (C = 32, L = 2, fixed seed); the held-out accuracy (val_acc) starts near chance and
   ends above 0.8 (chance 0.25), and the mean loss of the last 10 steps is below 0.7x the first 10's.
4. image_data.py's errors: a bad --classes, --size, --noise and --out are refused with a message.
5. With LIBFS_CUDAEMU (the ctest cuda_emu_vit): after 1 and 2, the parity plan's steps with
   --device cuda on the CUDA emulator against the CPU backend's run (loss, norm, weights).

usage: /usr/bin/python3 tests/py/vit.py FSC FSEXEC [LIBFS_CUDAEMU]   (numpy, torch)
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
from models import layernorm, load_safetensors, lr_at  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SAMPLE = os.path.join(ROOT, "samples", "vit.fsm")
DATA = os.path.join(ROOT, "scripts", "image_data.py")
DIMS = dict(B=4, H=8, W=8, P=4, K=3, C=16, NH=2, L=2)
HP = dict(lr=0.01, warmup=2, steps=6, min_lr=0.001, wd=0.05, clip=1.0, eps=1e-5)
STEPS = 6


def run(cmd, rc=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode != rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, rc, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def log_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def err(a, b):
    """max|a - b| / max|b|, as tests/py/parity.py compares tensors."""
    return float((a - b).abs().max() / max(float(b.abs().max()), 1e-30))


def weight_errors(final, p, C):
    """The largest error of the weights after training against PyTorch's, and the key
    bias's size next to the q and v biases'. The key bias adds q.b_k to every score of a
    row, which softmax ignores: its gradient is exactly zero, so in float32 it is rounding
    noise that Adam divides by its own RMS, in every implementation (tests/py/parity.py's
    case): its q and v parts are compared, its k part only has to stay noise next to them."""
    perr, kerr = 0.0, 0.0
    for n, ref in p.items():
        fs = final[n].double()
        if n.endswith(".attn.b"):
            qv = torch.cat([ref[:C], ref[2 * C:]])
            kerr = max(kerr, float(fs[C:2 * C].abs().max() / qv.abs().max()))
            fs, ref = torch.cat([fs[:C], fs[2 * C:]]), qv
        perr = max(perr, err(fs, ref))
    return perr, kerr


def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def dims_flags(d):
    return [a for k, v in d.items() for a in ("-D", "%s=%d" % (k, v))]


def vit_logits(p, images, P, NH, L):
    """samples/vit.fsm in PyTorch: images [B, H, W, 3] channels last."""
    B, H, W, _ = images.shape
    GH, GW = H // P, W // P
    patches = images.reshape(B, GH, P, GW, P * 3).transpose(2, 3).reshape(B, GH * GW, P * P * 3)
    e = patches @ p["patch.w"] + p["patch.b"]
    x = torch.cat([p["cls"].expand(B, -1, -1), e], dim=1) + p["pos"]
    for l in range(L):
        g = lambda n: p["h.%d.%s" % (l, n)]  # noqa: E731
        q, k, v = (layernorm(x, g("ln1.w"), g("ln1.b")) @ g("attn.w") + g("attn.b")).split(x.shape[-1], dim=-1)
        hd = lambda t: t.view(B, t.shape[1], NH, -1).transpose(1, 2)  # noqa: E731
        q, k, v = hd(q), hd(k), hd(v)
        a = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1) @ v  # not causal
        x = x + a.transpose(1, 2).reshape(x.shape) @ g("proj.w") + g("proj.b")
        f = F.gelu(layernorm(x, g("ln2.w"), g("ln2.b")) @ g("fc.w") + g("fc.b"), approximate="none")
        x = x + f @ g("fcproj.w") + g("fcproj.b")
    return layernorm(x, p["lnf.w"], p["lnf.b"])[:, 0, :] @ p["head.w"] + p["head.b"]


def reference(init, images, labels):
    """STEPS AdamW steps of the PyTorch model from init in float64, in the batches of fsexec's
    --data-order sequential: the trained params, each step's loss and argmax accuracy."""
    d, N = DIMS, len(images)
    p = {n: t.double().requires_grad_(True) for n, t in init.items()}
    opt = torch.optim.AdamW(list(p.values()), lr=HP["lr"], betas=(0.9, 0.999), eps=HP["eps"], weight_decay=HP["wd"])
    X, Y = torch.from_numpy(images).double(), torch.from_numpy(labels).long()
    losses, accs = [], []
    for s in range(1, STEPS + 1):
        idx = [((s - 1) * d["B"] + b) % N for b in range(d["B"])]
        logits = vit_logits(p, X[idx], d["P"], d["NH"], d["L"])
        loss = F.cross_entropy(logits, Y[idx])
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(p.values()), HP["clip"])
        for g in opt.param_groups:
            g["lr"] = lr_at(s, HP["lr"], HP["warmup"], HP["steps"], HP["min_lr"], "cosine")
        opt.step()
        losses.append(loss.item())
        accs.append(float((logits.argmax(-1) == Y[idx]).double().mean()))
    return {n: t.detach() for n, t in p.items()}, losses, accs


def step1_grads(init, images, labels):
    """PyTorch float64's gradients of step 1's loss (the first B samples) at init."""
    p = {n: t.double().requires_grad_(True) for n, t in init.items()}
    B = DIMS["B"]
    x, y = torch.from_numpy(images[:B]).double(), torch.from_numpy(labels[:B]).long()
    F.cross_entropy(vit_logits(p, x, DIMS["P"], DIMS["NH"], DIMS["L"]), y).backward()
    return {n: t.grad for n, t in p.items()}


def parity(fsc, fsexec, P):
    d = DIMS
    rng = np.random.default_rng(11)
    N = 20  # not a multiple of B: sequential batches wrap around
    images = rng.normal(size=(N, d["H"], d["W"], 3)).astype(np.float32)
    labels = rng.integers(0, d["K"], size=N).astype(np.int32)
    np.save(P("images.npy"), images)
    np.save(P("labels.npy"), labels)
    run([fsc, SAMPLE, "-q", *dims_flags(d), "--lr", str(HP["lr"]), "--warmup", str(HP["warmup"]),
         "--steps", str(HP["steps"]), "--min_lr", str(HP["min_lr"]), "--eps", str(HP["eps"]), "-o", P("vit.plan")])
    run([fsexec, P("vit.plan"), "--steps", "0", "--save-weights", P("v0.safetensors")])
    data = "images=%s,labels=%s" % (P("images.npy"), P("labels.npy"))
    run([fsexec, P("vit.plan"), "--data", data, "--data-order", "sequential", "--steps", str(STEPS), "--log",
         P("v.jsonl"), "--save-weights", P("v1.safetensors"), "--save-grads", P("g1.safetensors"), "--threads", "1"])
    rows = [r for r in log_of(P("v.jsonl")) if "loss" in r]
    init = load_safetensors(P("v0.safetensors"))
    if init["cls"].shape != (1, 1, d["C"]) or init["pos"].shape != (d["H"] * d["W"] // d["P"] ** 2 + 1, d["C"]):
        sys.exit("FAIL: the exported init's cls %s, pos %s" % (tuple(init["cls"].shape), tuple(init["pos"].shape)))
    grads = load_safetensors(P("g1.safetensors"))
    gerr = max(err(grads[n].double(), g) for n, g in step1_grads(init, images, labels).items())
    if gerr > 1e-4:
        sys.exit("FAIL ViT parity: step 1's gradients %.1e of PyTorch float64's" % gerr)
    p, want, accs = reference(init, images, labels)
    got = [r["loss"] for r in rows]
    lerr = max(abs(a - b) / b for a, b in zip(got, want)) if len(got) == STEPS else float("inf")
    final = load_safetensors(P("v1.safetensors"))
    perr, kerr = weight_errors(final, p, d["C"])
    if lerr > 1e-5 or perr > 1e-4 or kerr > 1e-2:
        sys.exit("FAIL ViT parity: losses %s, PyTorch %s (rel %.1e); weights %.1e; key bias %.1e" % (
            got, want, lerr, perr, kerr))
    if [r.get("accuracy") for r in rows] != accs:
        sys.exit("FAIL ViT parity: the log's accuracy %s, PyTorch's argmax accuracy %s" % (
            [r.get("accuracy") for r in rows],
                                                                                       accs))
    print("ok   1. ViT %s: step 1's gradients %.1e, %d AdamW steps' losses rel %.1e, weights %.1e (key bias %.1e "
          "of q, v's) of PyTorch float64; accuracy per step %s" % (d, gerr, STEPS, lerr, perr, kerr, accs))
    # 2: --predict writes the logits of a PyTorch forward on the trained weights
    run([fsexec, P("vit.plan"), "--predict", "--load-weights", P("v1.safetensors"), "--data", data,
         "--out", P("pred.npy")])
    got = torch.from_numpy(np.load(P("pred.npy"))).double()
    with torch.no_grad():
        ref = vit_logits({n: t.double() for n, t in final.items()}, torch.from_numpy(images).double(), d["P"],
                         d["NH"], d["L"])
    if got.shape != ref.shape or rel(got, ref) > 1e-5:
        sys.exit("FAIL ViT --predict: logits %s rel %.1e of PyTorch's %s" % (tuple(got.shape), rel(got, ref),
                                                                             tuple(ref.shape)))
    print("ok   2. --predict's logits [%d, %d] are PyTorch's forward (rel %.1e)" % (*got.shape, rel(got, ref)))


def learning(fsc, fsexec, P):
    out = run([sys.executable, DATA, "--out", P("set"), "--train", "1024", "--val", "256", "--size", "16"])
    print("     " + out.strip())
    small = dict(B=32, H=16, W=16, P=4, K=4, C=32, NH=2, L=2)
    run([fsc, SAMPLE, "-q", *dims_flags(small), "--lr", "0.003", "--warmup", "10", "--steps", "120", "--min_lr",
         "0.0003", "-o", P("learn.plan")])
    run([fsexec, P("learn.plan"), "--data", P("set/train"), "--val-data", P("set/val"), "--eval-every", "60",
         "--eval-batches", "8", "--steps", "120", "--seed", "7", "--log", P("learn.jsonl"), "--threads", "1"])
    rows = log_of(P("learn.jsonl"))
    val = [(r["step"], r["val_acc"]) for r in rows if "val_acc" in r]
    losses = [r["loss"] for r in rows if "loss" in r]
    if len(val) < 2 or val[0][0] != 0 or not val[0][1] < 0.45 or not val[-1][1] > 0.8:
        sys.exit("FAIL ViT learning: val_acc by step %s: not from near chance (0.25) to above 0.8" % val)
    first, last = np.mean(losses[:10]), np.mean(losses[-10:])
    if not last < 0.7 * first:
        sys.exit("FAIL ViT learning: the loss went %.4f -> %.4f (means of 10 steps), not down by 30%%" % (first, last))
    print("ok   3. ViT on image_data.py's patterns: val_acc %s by step, loss %.3f -> %.3f" % (
        ", ".join("%.3f@%d" % (a, s) for s, a in val), first, last))


def data_errors(P):
    for args, needle in ((["--classes", "7"], "--classes 7: must be 2 to 6"),
                         (["--size", "2"], "--size 2: must be at least 4"),
                         (["--noise", "nan"], "--noise nan: must be a finite number"),
                         (["--out", DATA], "exists and is not a directory")):
        cmd = [sys.executable, DATA, "--out", P("e")] + args
        r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0 or needle not in r.stdout:
            sys.exit("FAIL image_data.py %s: exit %d, %r" % (" ".join(args), r.returncode, r.stdout))
    print("ok   4. image_data.py refuses a bad --classes, --size, --noise and --out")


def emulated(fsc, fsexec, emu, P):
    """The parity plan's 6 steps with --device cuda on cuda-emu (FS_CUDA_BACKEND) against
    the CPU run: every step's loss and norm within 1e-5 relative, the weights within 1e-5
    of the largest |param| (tests/cuda_emu/train.py's fp32 tolerances)."""
    env = dict(os.environ, FS_CUDA_BACKEND=os.path.abspath(emu))
    data = "images=%s,labels=%s" % (P("images.npy"), P("labels.npy"))
    cmd = [fsexec, P("vit.plan"), "--device", "cuda", "--data", data, "--data-order", "sequential", "--steps",
           str(STEPS), "--log", P("e.jsonl"), "--save-weights", P("e1.safetensors")]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, timeout=1200)
    if r.returncode != 0 or "device: cuda" not in r.stdout:
        sys.exit("FAIL (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    cpu, cuda = log_of(P("v.jsonl")), log_of(P("e.jsonl"))
    worst = max(abs(a[k] - b[k]) / abs(b[k]) for a, b in zip(cuda, cpu) for k in ("loss", "grad_norm"))
    w_cpu, w_cuda = load_safetensors(P("v1.safetensors")), load_safetensors(P("e1.safetensors"))
    wdiff = max(err(w_cuda[n].double(), w_cpu[n].double()) for n in w_cpu)
    if len(cuda) != STEPS or worst > 1e-5 or wdiff > 1e-5:
        sys.exit("FAIL ViT on cuda-emu: %d steps, loss / norm %.1e of the CPU run's, weights %.1e" % (
            len(cuda), worst, wdiff))
    print("ok   5. the ViT plan on cuda-emu (--device cuda): losses and norms %.1e, weights %.1e of the CPU "
          "backend's" % (worst, wdiff))


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    emu = sys.argv[3] if len(sys.argv) > 3 else None
    work = tempfile.mkdtemp(prefix="vit.")
    try:
        def P(name):
            return os.path.join(work, name)
        parity(fsc, fsexec, P)
        if emu:  # the ctest cuda_emu_vit: only the emulated run, after the parity that makes its CPU run
            emulated(fsc, fsexec, emu, P)
            print("vit (cuda-emu): all passed")
            return
        data_errors(P)
        learning(fsc, fsexec, P)
        print("vit: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
