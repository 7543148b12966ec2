#!/usr/bin/python3
"""attention_masked (a key padding mask, BERT's attention_mask) against PyTorch.

1. Values and gradients: a model whose params are q [B, NH, T, D], k and v [B, NH, S, D]
   and a random weight r [B, NH, T, Dv], with loss = sum(attention_masked(q, k, v, mask) * r)
   and mask an i32 [B, S] input read from .npy. fsexec --save-grads then holds d loss / d r
   (the attention output itself) and dq, dk, dv. The reference is PyTorch's
   scaled_dot_product_attention in float64 with the boolean attn_mask (mask[b, j] != 0,
   and under causal also j <= i). Batch items: all keys, the last keys padded, random
   holes, and every key masked; that last item's rows see no key, where SDPA gives NaN
   and fsexec gives output 0 and gradient 0 (docs/language.md), checked exactly. Odd
   shapes: causal T = S = 70 (two query tiles), not causal T = 37, S = 29; fp32 (1e-5 of
   the largest value) and bf16 (3e-2).
2. Central differences of fsexec's own fp32 loss for a few elements of q, k and v.
3. A tiny BERT-like encoder (non-causal, post-LN, CLS pooling) on .npy tokens, labels and
   a padding mask trains 4 AdamW steps like its PyTorch reference (losses and weights), with
   and without selective recompute (recompute attention), and --val-data's val_loss at
   step 0 equals PyTorch's loss on the same batch.

4. (--emu LIBFS_CUDAEMU) The CUDA kernels (codegen/kernels/attention_f32.cuh with the mask) on the
   cuda-emu backend against the CPU backend: case 1's plans, causal and not, fp32 and bf16, one
   step each; the output and dq, dk, dv within 1e-5 (fp32) or 1e-2 (bf16, where the kernels round
   their outputs once as the CPU does, in a different summation order) of the largest value, the
   fully masked item exactly 0 on both.

usage: attn_mask.py FSC FSEXEC [--emu LIBFS_CUDAEMU]   (Debian's /usr/bin/python3 with torch and numpy)
"""
import json
import math
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # never skip silently
    sys.exit(f"attn_mask.py: FAIL: cannot import torch ({e}); run with Debian's /usr/bin/python3")

from models import heads, layernorm, load_safetensors, merge_heads, save_safetensors  # noqa: E402

B, NH, D, DV = 4, 2, 16, 8
MODEL = """
model am {{
  dim B = {B}, NH = {NH}, T = {T}, S = {S}, D = {D}, DV = {DV};
  input mask: i32[B, S];
  param q: [B, NH, T, D] = normal(1);
  param k: [B, NH, S, D] = normal(1);
  param v: [B, NH, S, DV] = normal(0.5, 1);
  param r: [B, NH, T, DV] = normal(1);
  loss = sum(sum(sum(sum(attention_masked(q, k, v, mask{causal}) * r))));
}}
"""


def run(cmd, cwd=None):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if p.returncode:
        sys.exit(f"attn_mask.py: FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}")
    return p.stdout


def losses(path, key="loss"):
    with open(path) as f:
        return [json.loads(line)[key] for line in f if line.strip() and key in json.loads(line)]


def make_mask(S, causal):
    m = np.ones((B, S), np.int32)
    m[1, S - 7:] = 0                          # right padding
    holes = np.random.default_rng(S).random(S) < 0.3
    holes[0] = False                          # causal row 0 keeps a key
    m[2, holes] = 0                           # holes anywhere
    m[3, :] = 0                               # every key masked
    return m


def sdpa(q, k, v, attn_mask):
    """PyTorch's scaled_dot_product_attention with a boolean attn_mask (True = attend); Debian's torch may
    predate it, so where it lacks it, its documented math: masked_fill(-inf), softmax, times v."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    s = (q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(~attn_mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def allowed(mask, T, S, causal):
    a = torch.from_numpy(mask != 0)[:, None, None, :].expand(B, NH, T, S)
    if causal:
        a = a & torch.ones(T, S, dtype=torch.bool).tril()
    return a


def reference(p, mask, causal):
    """SDPA with the boolean mask on the items that see a key; item 3 sees none."""
    q, k, v, r = (p[n][:3].to(torch.float64).requires_grad_(True) for n in ("q", "k", "v", "r"))
    T, S = q.shape[2], k.shape[2]
    out = sdpa(q, k, v, allowed(mask, T, S, causal)[:3])
    (out * r).sum().backward()
    return {"r": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}


def emulated(fsexec, wd, data, emu, tol, tag):
    """Case 1's plan (am.plan, whose CPU gradients are g.safetensors) on the cuda-emu backend."""
    env = dict(os.environ, FS_CUDA_BACKEND=emu, FS_CUDA_EMU_CACHE=os.path.join(wd, "emu-cache"))
    p = subprocess.run([fsexec, "am.plan", "--device", "cuda", "--steps", "1", "--save-grads", "ge.safetensors",
                        *data], cwd=wd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=600)
    if p.returncode:
        sys.exit(f"attn_mask.py: FAIL: fsexec --device cuda (cuda-emu) exited {p.returncode}:\n{p.stdout[-3000:]}")
    cpu = load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)
    dev = load_safetensors(os.path.join(wd, "ge.safetensors"), torch.float64)
    fails = []
    for name, label in (("r", "output"), ("q", "dq"), ("k", "dk"), ("v", "dv")):
        err = ((dev[name] - cpu[name]).abs().max() / cpu[name].abs().max()).item()
        dead = dev[name][3].abs().max().item()
        ok = err <= tol and dead == 0.0
        print(f"{'ok  ' if ok else 'FAIL'} {tag:20} {label:6} cuda-emu against the CPU backend: {err:.2e} "
              f"(tol {tol:g}); fully masked item: max |.| = {dead:g}")
        if not ok:
            fails.append(f"cuda-emu {tag} {label}")
    return fails


def values_and_grads(fsc, fsexec, wd, emu):
    fails, n = [], 0
    for causal in (1, 0):
        T, S = (70, 70) if causal else (37, 29)
        mask = make_mask(S, causal)
        np.save(os.path.join(wd, "mask.npy"), mask)
        data = ["--data", "mask=" + os.path.join(wd, "mask.npy"), "--data-order", "sequential", "--threads", "2"]
        for prec, tol in (("fp32", 1e-5), ("bf16", 3e-2)):
            tag = f"{'causal T=S=70' if causal else 'T=37 S=29'} {prec}"
            with open(os.path.join(wd, "am.fsm"), "w") as f:
                f.write(MODEL.format(B=B, NH=NH, T=T, S=S, D=D, DV=DV, causal=", causal" if causal else ""))
            run([fsc, "am.fsm", "-q", "-o", "am.plan", "--precision", prec, "--seed", str(11 + causal)], wd)
            run([fsexec, "am.plan", "--steps", "0", "--save-weights", "w.safetensors"], wd)
            run([fsexec, "am.plan", "--steps", "1", "--save-grads", "g.safetensors", "--log", "g.jsonl", *data], wd)
            w = load_safetensors(os.path.join(wd, "w.safetensors"), torch.float64)
            got = load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)
            want = reference(w, mask, causal)
            for name, label in (("r", "output"), ("q", "dq"), ("k", "dk"), ("v", "dv")):
                a, b = got[name][:3], want[name]
                err = ((a - b).abs().max() / b.abs().max()).item() if a.shape == b.shape else float("inf")
                dead = got[name][3].abs().max().item()  # every key masked: exactly 0
                ok = err <= tol and dead == 0.0
                n += 1
                print(f"{'ok  ' if ok else 'FAIL'} {tag:20} {label:6} max|fs - sdpa| / max|sdpa| = {err:.2e} "
                      f"(tol {tol:g}); fully masked item: max |.| = {dead:g}")
                if not ok:
                    fails.append(f"{tag} {label}")
            if prec == "fp32" and not causal:
                fails += finite_differences(fsexec, wd, data, w, got)
                n += 1
            if emu:
                fails += emulated(fsexec, wd, data, emu, 1e-5 if prec == "fp32" else 1e-2, tag)
                n += 4
    if fails:
        sys.exit("attn_mask.py: FAIL: " + ", ".join(fails))
    print(f"ok   values and gradients: {n} checks against SDPA with a boolean mask")


def finite_differences(fsexec, wd, data, w, got):
    eps, worst, fails = 1e-2, 0.0, []
    init = {n: t.float() for n, t in w.items()}
    for name, idx in (("q", (0, 1, 5, 3)), ("q", (2, 0, 36, 0)), ("k", (1, 1, 3, 7)), ("k", (2, 0, 10, 2)),
                      ("v", (0, 0, 28, 4)), ("v", (1, 1, 2, 1))):
        side = []
        for sign in (1, -1):
            t = {n: x.clone() for n, x in init.items()}
            t[name][idx] += sign * eps
            save_safetensors(os.path.join(wd, "fd.safetensors"), t)
            run([fsexec, "am.plan", "--steps", "1", "--load-weights", "fd.safetensors", "--log", "fd.jsonl", *data], wd)
            side.append(losses(os.path.join(wd, "fd.jsonl"))[0])
        fd, g = (side[0] - side[1]) / (2 * eps), got[name][idx].item()
        worst = max(worst, abs(fd - g))
        if abs(fd - g) > 2e-2 + 1e-2 * abs(g):
            fails.append(f"finite differences d loss / d {name}{idx} = {fd:.5f}, fsexec {g:.5f}")
    print(f"{'ok  ' if not fails else 'FAIL'} central differences of fsexec's loss within {worst:.1e} of its "
          "gradient (6 elements of q, k, v)")
    return fails


BERT = """model bert {
  dim B = 8, T = 7, V = 32, C = 16, NH = 2, K = 3, L = 2;
  input tokens: i32[B, T];
  input labels: i32[B];
  input mask: i32[B, T];
  layer Block {
    param attn.w: [C, 3 * C] = normal(0.1);
    param proj.w: [C, C] = normal(0.1);
    param ln.w: [C] = ones;
    param ln.b: [C] = zeros;
    forward(x, m) {
      q, k, v = split(x @ attn.w, 3, axis = -1);
      a = attention_masked(heads(q, NH), heads(k, NH), heads(v, NH), m);
      return layernorm(x + merge_heads(a) @ proj.w, ln.w, ln.b);
    }
  }
  param wte: [V, C] = normal(0.1);
  param wpe: [T, C] = normal(0.1);
  param head.w: [C, K] = normal(0.1);
  param head.b: [K] = zeros;
  x = embedding(wte, tokens) + embedding(wpe, arange(T));
  x = Block[L](x, mask) as h;
  logits = x[:, 0, :] @ head.w + head.b;
  loss = cross_entropy(logits, labels);
  output logits;
}
train { optimizer adamw(lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1); RECOMPUTE }
"""
STEPS, LR, WD, N, BB = 4, 0.01, 0.1, 16, 8


def bert_loss(p, tok, lab, mask, NH=2, L=2):
    T = tok.shape[1]
    x = p["wte"][tok] + p["wpe"][torch.arange(T)]
    for i in range(L):
        w = lambda n: p["h.%d.%s" % (i, n)]  # noqa: E731
        q, k, v = (x @ w("attn.w")).split(x.shape[-1], dim=-1)
        q, k, v = heads(q, NH), heads(k, NH), heads(v, NH)
        a = sdpa(q, k, v, (mask != 0)[:, None, None, :].expand(-1, NH, T, T))
        x = layernorm(x + merge_heads(a) @ w("proj.w"), w("ln.w"), w("ln.b"))
    return F.cross_entropy(x[:, 0, :] @ p["head.w"] + p["head.b"], lab)


def rel(a, b):
    return float((a - b).norm() / max(float(b.norm()), 1e-30))


def bert_training(fsc, fsexec, wd):
    P = lambda name: os.path.join(wd, name)  # noqa: E731
    rng = np.random.default_rng(9)
    tok, lab = rng.integers(0, 32, size=(N, 7)).astype(np.int32), rng.integers(0, 3, size=N).astype(np.int32)
    lens = rng.integers(2, 8, size=N)
    mask = (np.arange(7)[None, :] < lens[:, None]).astype(np.int32)  # right padding, 2..7 real tokens
    for name, arr in (("tok", tok), ("lab", lab), ("msk", mask)):
        np.save(P(name + ".npy"), arr)
    data = "tokens=%s,labels=%s,mask=%s" % (P("tok.npy"), P("lab.npy"), P("msk.npy"))
    p = None
    for rc in ("", 'recompute "attention";'):
        with open(P("bert.fsm"), "w") as f:
            f.write(BERT.replace("RECOMPUTE", rc))
        run([fsc, P("bert.fsm"), "-q", "-o", P("bert.plan")])
        run([fsexec, P("bert.plan"), "--steps", "0", "--save-weights", P("b0.safetensors")])
        run([fsexec, P("bert.plan"), "--data", data, "--data-order", "sequential", "--steps", str(STEPS), "--log",
             P("b.jsonl"), "--save-weights", P("b1.safetensors"), "--threads", "1", "--val-data", data,
             "--eval-batches", "1", "--eval-every", str(STEPS)])
        got, val = losses(P("b.jsonl")), losses(P("b.jsonl"), "val_loss")
        p = {n: t.double().requires_grad_(True) for n, t in load_safetensors(P("b0.safetensors")).items()}
        opt = torch.optim.AdamW(list(p.values()), lr=LR, betas=(0.9, 0.999), eps=1e-8, weight_decay=WD)
        Tk, Y, M = (torch.from_numpy(a).long() for a in (tok, lab, mask))
        with torch.no_grad():
            val0 = bert_loss(p, Tk[:BB], Y[:BB], M[:BB]).item()
        want = []
        for s in range(1, STEPS + 1):
            rows = [((s - 1) * BB + b) % N for b in range(BB)]
            loss = bert_loss(p, Tk[rows], Y[rows], M[rows])
            opt.zero_grad()
            loss.backward()
            opt.step()
            want.append(loss.item())
        lerr = max(abs(a - b) / b for a, b in zip(got, want))
        final = load_safetensors(P("b1.safetensors"))
        perr = max(rel(final[n].double(), p[n].detach()) for n in p)
        verr = abs(val[0] - val0) / val0 if val else float("inf")
        what = "selective recompute" if rc else "no recompute"
        if len(got) != STEPS or lerr > 1e-5 or perr > 1e-5 or verr > 1e-5:
            sys.exit("attn_mask.py: FAIL BERT-like encoder (%s): losses %s, PyTorch %s (rel %.1e); weights rel %.1e; "
                     "val_loss %s vs %.6f" % (what, got, want, lerr, perr, val, val0))
        if not want[-1] < want[0]:
            sys.exit("attn_mask.py: FAIL BERT-like encoder: the loss did not fall: %s" % want)
        print("ok   BERT-like encoder with a padding mask (%s): %d AdamW steps, losses rel %.1e (%.4f -> %.4f), "
              "weights rel %.1e, val_loss rel %.1e of PyTorch float64" % (what, STEPS, lerr, want[0], want[-1], perr,
                                                                           verr))


def main():
    if len(sys.argv) not in (3, 5) or len(sys.argv) == 5 and sys.argv[3] != "--emu":
        sys.exit("usage: attn_mask.py FSC FSEXEC [--emu LIBFS_CUDAEMU]")
    fsc, fsexec = (os.path.abspath(a) for a in sys.argv[1:3])
    emu = os.path.abspath(sys.argv[4]) if len(sys.argv) == 5 else None
    with tempfile.TemporaryDirectory(prefix="fs-attn-mask-") as wd:
        values_and_grads(fsc, fsexec, wd, emu)
        if not emu:  # the emulated run checks the kernels; the encoder's training is the CPU run's
            bert_training(fsc, fsexec, wd)
    print("attn_mask.py: all passed")


if __name__ == "__main__":
    main()
