#!/usr/bin/python3
"""Grouped-query attention against PyTorch: values and gradients of q, k and v.

A model whose params are q [B, NH, T, D], k and v [B, NKV, S, D] and a random weight r
[B, NH, T, Dv], with loss = sum(attention(q, k, v) * r). fsexec --save-grads then holds
d loss / d r, which is the attention output itself (the forward values, element by
element), and d loss / dq, dk, dv. The reference is PyTorch in float64: k and v
repeat_interleave'd to NH heads (query head h reads kv head h // (NH // NKV), as Hugging
Face's repeat_kv), scores q k^T / sqrt(D), the causal mask, softmax, times v.

Cases: NH = 4 over NKV = 2 (grouped) and NKV = 1 (multi-query), causal with T = S = 70
(two query tiles of the CPU kernel) and not causal with S = 37 != T; NKV = 4 too (plain
multi-head, the same code path as before GQA). In fp32 the tolerance is 1e-5 of the
largest value (f32 rounding of sums of at most 70 terms); in bf16 (the precision pass
casts q, k, v and the kernel stages whole batch items) 3e-2, bf16's 2^-8 rounding of
inputs and outputs with room.

usage: gqa.py FSC FSEXEC     (Debian's /usr/bin/python3 with torch and numpy)
"""
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

try:
    import torch
except ImportError as e:  # never skip silently
    sys.exit(f"gqa.py: FAIL: cannot import torch ({e}); run with Debian's /usr/bin/python3")

import models  # noqa: E402

B, NH, T, D, DV = 2, 4, 70, 16, 8
MODEL = """
model gqa {{
  dim B = {B}, NH = {NH}, NKV = {NKV}, T = {T}, S = {S}, D = {D}, DV = {DV};
  input x: f32[B, 4];   # fsexec feeds (features, labels) or (tokens, targets):
  input y: i32[B];      # these do not touch the attention
  param q: [B, NH, T, D] = normal(1);
  param k: [B, NKV, S, D] = normal(1);
  param v: [B, NKV, S, DV] = normal(0.5, 1);
  param r: [B, NH, T, DV] = normal(1);
  loss = sum(sum(sum(sum(attention(q, k, v{causal}) * r)))) + 0 * cross_entropy(x, y);
}}
"""


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit(f"gqa.py: FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}")


def reference(p, causal):
    q, k, v, r = (p[n].to(torch.float64).requires_grad_(True) for n in ("q", "k", "v", "r"))
    g = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(g, dim=1), v.repeat_interleave(g, dim=1)
    s = q @ kk.transpose(-2, -1) / q.shape[-1] ** 0.5
    if causal:
        s = s.masked_fill(~torch.ones(s.shape[-2], s.shape[-1], dtype=torch.bool).tril(), float("-inf"))
    out = torch.softmax(s, dim=-1) @ vv
    (out * r).sum().backward()
    return {"r": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: gqa.py FSC FSEXEC")
    fsc, fsexec = (os.path.abspath(a) for a in sys.argv[1:])
    fails, n = [], 0
    with tempfile.TemporaryDirectory(prefix="fs-gqa-") as wd:
        for nkv in (2, 1, 4):
            for causal in (1, 0):
                for prec, tol in (("fp32", 1e-5), ("bf16", 3e-2)):
                    S = T if causal else 37
                    tag = f"NH={NH} NKV={nkv} {'causal' if causal else 'S=%d' % S} {prec}"
                    with open(os.path.join(wd, "gqa.fsm"), "w") as f:
                        f.write(MODEL.format(B=B, NH=NH, NKV=nkv, T=T, S=S, D=D, DV=DV, causal=", causal" if causal else ""))
                    run([fsc, "gqa.fsm", "-q", "-o", "gqa.plan", "--precision", prec, "--seed", str(7 + nkv)], wd)
                    base = [fsexec, "gqa.plan", "--threads", "2"]
                    run(base + ["--steps", "0", "--save-weights", "w.safetensors"], wd)
                    run(base + ["--steps", "1", "--save-grads", "g.safetensors"], wd)
                    w = models.load_safetensors(os.path.join(wd, "w.safetensors"), torch.float64)
                    got = models.load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)
                    want = reference(w, causal)
                    for name, label in (("r", "output"), ("q", "dq"), ("k", "dk"), ("v", "dv")):
                        a, b = got[name], want[name]
                        err = ((a - b).abs().max() / b.abs().max()).item() if a.shape == b.shape else float("inf")
                        ok = err <= tol
                        n += 1
                        print(f"{'ok  ' if ok else 'FAIL'} {tag:28} {label:6} {list(b.shape)}  max|fs - torch| / max|torch| "
                              f"= {err:.2e} (tol {tol:g})")
                        if not ok:
                            fails.append(f"{tag} {label}")
    if fails:
        sys.exit("gqa.py: FAIL: " + ", ".join(fails))
    print(f"gqa.py: all {n} checks pass")


if __name__ == "__main__":
    main()
