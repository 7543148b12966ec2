#!/usr/bin/python3
"""attention_masked (a key mask, BERT's attention_mask) against PyTorch.

1. Values and gradients: a model whose params are q [B, NH, T, D], k and v [B, NKV, S, D]
   and a random weight r [B, NH, T, Dv], with loss = sum(attention_masked(q, k, v, mask) * r)
   and mask an i32 [B, S] (boolean) or f32 [B, S] (additive) input read from .npy.
   fsexec --save-grads then holds d loss / d r (the attention output itself) and dq, dk, dv.
   The reference is PyTorch's scaled_dot_product_attention in float64 with the boolean
   attn_mask (mask[b, j] != 0, and under causal also j <= i), or the float one (the mask's
   values, -inf above the diagonal under causal), k and v repeat_interleave'd when NKV < NH.
   Batch items: all keys, the last keys padded, random holes (additive: random biases
   besides), and every key masked; that last item's rows see no key, where SDPA gives NaN
   and fsexec gives output 0 and gradient 0 (docs/language.md), checked exactly. Odd
   shapes: causal T = S = 70 (two query tiles), not causal T = 37, S = 29; fp32 (1e-5 of
   the largest value) and bf16 (3e-2; the additive mask itself rounded to bf16).
   The .npy loader lets the additive mask's -inf in, and refuses it where a sum reads the input too.
2. Central differences of fsexec's own fp32 loss for a few elements of q, k and v.
3. A tiny BERT-like encoder (non-causal, post-LN, CLS pooling) on .npy tokens, labels and
   a padding mask trains 4 AdamW steps like its PyTorch reference (losses and weights), with
   and without selective recompute (recompute attention), and --val-data's val_loss at
   step 0 equals PyTorch's loss on the same batch.

4. (--emu LIBFS_CUDAEMU) The CUDA kernels (codegen/kernels/attention_f32.cuh with the mask) on the
   cuda-emu backend against the CPU backend: case 1's plans (D != Dv: the f32 kernels in every
   precision), causal and not, boolean and additive, fp32 and bf16, one step each; the output and
   dq, dk, dv within 1e-5 (fp32) or 1e-2 (bf16, where the kernels round their outputs once as the
   CPU does, in a different summation order) of the largest value, the fully masked item exactly 0
   on both.
   Case 3's encoder is packed (attention_qkv_masked, passes/packed_attn.c): it also trains with
   pack_attention 0 (attention_masked) to the same losses and weights (1e-6).
5. (--emu-shapes LIBFS_CUDAEMU) D = Dv: the tensor-core kernels (flash.cuh, flash_bwd.cuh) in bf16
   and fp16, the f32 ones in fp32, on T = 37 (S = 29 when not causal), head dims 24 and 64, NKV = 1
   (grouped: 2 query heads a kv head) and NKV = NH, boolean and additive masks with a fully masked
   item, the loss a cross-entropy over the output's rows (f32 in fp16 too, whose 2^16 loss scale
   would overflow a 16-bit loss's backward): dq, dk, dv on cuda-emu against the CPU backend (1e-5,
   16 bits 1e-2) and the CPU's against SDPA (1e-5, 3e-2); the plan's
   kernels are checked to be the ones meant (attention_tc / attention_bwd_tc in 16 bits), and one
   backward run with the blocks in forward order and one in reverse give the same bits. Then case
   3's encoder in bf16, packed and not, and fp16 packed: cuda-emu's step-1 gradients against the
   CPU's, and packed against unpacked (1e-2).
6. (--emu-tf32 LIBFS_CUDAEMU) fp32 under the tf32 setting: tests/cuda_emu/attn_mask.fsm's four masked attentions
   (attention_masked and the packed attention_qkv_masked; causal and not, boolean and additive masks with a fully
   masked item, head dims 24, 40 and 64, T = 70 and 37) checked to run on the tensor-core kernels (mma m16n8k8
   tf32); one step's gradients (the outputs' among them) on cuda-emu against the CPU backend's fp32 ones within
   op_check's tf32 tolerance (5e-3 of the largest value), the fully masked item's exactly 0; TF32's rounding
   seen (the attentions' gradients farther than 1e-5); the backward's bits the same with the blocks reversed.
   (The CPU backend ignores tf32: its masked attention is case 1's and 5's, against SDPA.)

usage: attn_mask.py FSC FSEXEC [--emu | --emu-shapes | --emu-tf32 LIBFS_CUDAEMU]
(Debian's /usr/bin/python3 with torch and numpy)
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
  dim B = {B}, NH = {NH}, NKV = {NKV}, T = {T}, S = {S}, D = {D}, DV = {DV};
  input mask: {mdt}[B, S];
  param q: [B, NH, T, D] = normal(1);
  param k: [B, NKV, S, D] = normal(1);
  param v: [B, NKV, S, DV] = normal(0.5, 1);
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


def make_mask(S, causal, additive=False):
    """i32 (boolean) or, additive, f32: random biases where the boolean one attends, -inf where it masks."""
    m = np.ones((B, S), np.int32)
    m[1, S - 7:] = 0                          # right padding
    holes = np.random.default_rng(S).random(S) < 0.3
    holes[0] = False                          # causal row 0 keeps a key
    m[2, holes] = 0                           # holes anywhere
    m[3, :] = 0                               # every key masked
    if not additive:
        return m
    bias = np.random.default_rng(S + 1).normal(0, 1.5, (B, S)).astype(np.float32)
    return np.where(m != 0, bias, np.float32(-np.inf)).astype(np.float32)


def sdpa(q, k, v, attn_mask):
    """PyTorch's scaled_dot_product_attention with a boolean (True = attend) or float (added) attn_mask;
    Debian's torch may predate it, so where it lacks it, its documented math: masked_fill(-inf) or +,
    softmax, times v."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~attn_mask, float("-inf")) if attn_mask.dtype == torch.bool else s + attn_mask
    return torch.softmax(s, dim=-1) @ v


def allowed(mask, T, S, causal, nh=NH):
    """SDPA's attn_mask for fsexec's mask: boolean for an i32 one, float64 (-inf above the diagonal
    under causal) for an additive one."""
    tril = torch.ones(T, S, dtype=torch.bool).tril()
    if mask.dtype != np.int32:
        a = torch.from_numpy(mask).to(torch.float64)[:, None, None, :].expand(B, nh, T, S)
        return a.masked_fill(~tril, float("-inf")) if causal else a
    a = torch.from_numpy(mask != 0)[:, None, None, :].expand(B, nh, T, S)
    return a & tril if causal else a


def reference(p, mask, causal, labels=None):
    """SDPA with the mask on the items that see a key; item 3 sees none (output 0). k and v
    repeat_interleave'd to q's heads (grouped-query attention), their gradients summed back by autograd.
    The loss sum(out * r), or with labels MODEL_CE's cross-entropy."""
    q, k, v = (p[n][:3].to(torch.float64).requires_grad_(True) for n in ("q", "k", "v"))
    T, S, g = q.shape[2], k.shape[2], q.shape[1] // k.shape[1]
    out = sdpa(q, k.repeat_interleave(g, 1), v.repeat_interleave(g, 1), allowed(mask, T, S, causal, q.shape[1])[:3])
    if labels is None:
        (out * p["r"][:3].to(torch.float64)).sum().backward()
        return {"r": out.detach(), "q": q.grad, "k": k.grad, "v": v.grad}
    full = torch.cat([out, torch.zeros((1, *out.shape[1:]), dtype=out.dtype)])
    F.cross_entropy(full.reshape(-1, full.shape[-1]), torch.from_numpy(labels).long().reshape(-1)).backward()
    return {"q": q.grad, "k": k.grad, "v": v.grad}


def compare(got, want, tol, tag, what, items=slice(None)):
    """got against want (dicts of r (if any), q, k, v): max |a - b| / max |b| per tensor, and item 3
    (every key masked) of got exactly 0. The failures' names."""
    fails = []
    for name, label in (("r", "output"), ("q", "dq"), ("k", "dk"), ("v", "dv")):
        if name not in want:
            continue
        a, b = got[name][items], want[name]
        err = ((a - b).abs().max() / b.abs().max()).item() if a.shape == b.shape else float("inf")
        dead = got[name][3].abs().max().item()
        ok = err <= tol and dead == 0.0
        print(f"{'ok  ' if ok else 'FAIL'} {tag:34} {label:6} {what}: {err:.2e} (tol {tol:g}); "
              f"fully masked item: max |.| = {dead:g}")
        if not ok:
            fails.append(f"{tag} {label}")
    return fails


def emu_grads(fsexec, wd, data, emu, out, order=None, plan="am.plan"):
    """One step of plan on the cuda-emu backend (blocks and threads in `order`: both by default), its
    gradients saved to out."""
    env = dict(os.environ, FS_CUDA_BACKEND=emu, FS_CUDA_EMU_CACHE=os.path.join(wd, "emu-cache"))
    if order:
        env["FS_CUDA_EMU_ORDER"] = order
    p = subprocess.run([fsexec, plan, "--device", "cuda", "--steps", "1", "--save-grads", out, *data], cwd=wd,
                       env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=1200)
    if p.returncode:
        sys.exit(f"attn_mask.py: FAIL: fsexec --device cuda (cuda-emu) exited {p.returncode}:\n{p.stdout[-3000:]}")
    return load_safetensors(os.path.join(wd, out), torch.float64)


def emulated(fsexec, wd, data, emu, tol, tag):
    """Case 1's plan (am.plan, whose CPU gradients are g.safetensors) on the cuda-emu backend."""
    dev = emu_grads(fsexec, wd, data, emu, "ge.safetensors")
    cpu = load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)
    return compare(dev, cpu, tol, tag, "cuda-emu against the CPU backend")


def write_model(wd, T, S, causal, mask, nkv=NH, d=D, dv=DV, model=None):
    with open(os.path.join(wd, "am.fsm"), "w") as f:
        f.write((model or MODEL).format(B=B, NH=NH, NKV=nkv, T=T, S=S, D=d, DV=dv, causal=", causal" if causal else "",
                                        mdt="i32" if mask.dtype == np.int32 else "f32"))


def cpu_step(fsc, fsexec, wd, prec, seed, data):
    """am.fsm compiled in prec, its initial weights and one CPU step's gradients (g.safetensors)."""
    run([fsc, "am.fsm", "-q", "-o", "am.plan", "--precision", prec, "--seed", str(seed)], wd)
    run([fsexec, "am.plan", "--steps", "0", "--save-weights", "w.safetensors"], wd)
    run([fsexec, "am.plan", "--steps", "1", "--save-grads", "g.safetensors", "--log", "g.jsonl", *data], wd)
    w = load_safetensors(os.path.join(wd, "w.safetensors"), torch.float64)
    return w, load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)


def mask_data(wd, mask):
    np.save(os.path.join(wd, "mask.npy"), mask)
    return ["--data", "mask=" + os.path.join(wd, "mask.npy"), "--data-order", "sequential", "--threads", "2"]


def values_and_grads(fsc, fsexec, wd, emu):
    fails, n = [], 0
    for causal in (1, 0):
        T, S = (70, 70) if causal else (37, 29)
        for additive in (False, True):
            mask = make_mask(S, causal, additive)
            data = mask_data(wd, mask)
            write_model(wd, T, S, causal, mask)
            for prec, tol in (("fp32", 1e-5), ("bf16", 3e-2)):
                tag = f"{'causal T=S=70' if causal else 'T=37 S=29'} {'additive' if additive else 'boolean'} {prec}"
                w, got = cpu_step(fsc, fsexec, wd, prec, 11 + causal, data)
                fails += compare(got, reference(w, mask, causal), tol, tag, "max|fs - sdpa| / max|sdpa|", slice(0, 3))
                n += 4
                if prec == "fp32" and not causal:
                    fails += finite_differences(fsexec, wd, data, w, got)
                    n += 1
                if emu:
                    fails += emulated(fsexec, wd, data, emu, 1e-5 if prec == "fp32" else 1e-2, tag)
                    n += 4
    if fails:
        sys.exit("attn_mask.py: FAIL: " + ", ".join(fails))
    print(f"ok   values and gradients: {n} checks against SDPA with boolean and additive masks")
    if not emu:
        inf_only_in_masks(fsc, fsexec, wd)


# Case 5's plans: (precision, head dim, NKV, causal, additive); every value of each meets the others'.
SHAPES = (("bf16", 64, 1, 1, False), ("bf16", 24, NH, 0, True), ("fp16", 24, NH, 1, True),
          ("fp16", 64, 1, 0, False), ("fp32", 24, 1, 1, True), ("fp32", 64, NH, 0, False))


# Case 5's model: a cross-entropy over the attention's rows (V = DV classes), whose loss is f32 in every
# precision, so fp16's step 1 does not overflow (a sum in fp16 seeds its backward with the loss scale 2^16,
# past fp16's largest number).
MODEL_CE = """
model am {{
  dim B = {B}, NH = {NH}, NKV = {NKV}, T = {T}, S = {S}, D = {D}, DV = {DV};
  input mask: {mdt}[B, S];
  input y: i32[B, NH * T];
  param q: [B, NH, T, D] = normal(1);
  param k: [B, NKV, S, D] = normal(1);
  param v: [B, NKV, S, DV] = normal(0.5, 1);
  loss = cross_entropy(reshape(attention_masked(q, k, v, mask{causal}), [B * NH * T, DV]), reshape(y, [B * NH * T]));
}}
"""


def emulated_shapes(fsc, fsexec, wd, emu):
    fails, n, T = [], 0, 37
    for prec, hd, nkv, causal, additive in SHAPES:
        S = T if causal else 29
        mask = make_mask(S, causal, additive)
        labels = np.random.default_rng(hd).integers(0, hd, size=(B, NH * T)).astype(np.int32)
        np.save(os.path.join(wd, "y.npy"), labels)
        data = mask_data(wd, mask)
        data[1] += ",y=" + os.path.join(wd, "y.npy")
        write_model(wd, T, S, causal, mask, nkv, hd, hd, MODEL_CE)
        kind = ("causal " if causal else "") + ("additive" if additive else "boolean")
        tag = f"T={T} S={S} hd={hd} NKV={nkv} {kind} {prec}"
        w, cpu = cpu_step(fsc, fsexec, wd, prec, 5 + hd + nkv, data)
        # fp16's saved gradients come unscaled (fsexec --save-grads divides out the loss scale)
        fails += compare({n: cpu[n] for n in "qkv"}, reference(w, mask, causal, labels),
                         1e-5 if prec == "fp32" else 3e-2, tag, "CPU against SDPA", slice(0, 3))
        launches = run([fsc, "am.fsm", "-q", "--precision", prec, "--kernels"], wd)
        tc = "attention_tc" in launches and "attention_bwd_tc" in launches
        print(f"{'ok  ' if tc == (prec != 'fp32') else 'FAIL'} {tag:34} runs on the "
              f"{'tensor-core' if tc else 'f32'} kernels")
        if tc != (prec != "fp32"):
            fails.append(f"{tag}: the {'tensor-core' if tc else 'f32'} kernels:\n{launches}")
        dev = emu_grads(fsexec, wd, data, emu, "ge.safetensors", "forward")
        fails += compare(dev, {n: cpu[n] for n in "qkv"}, 1e-5 if prec == "fp32" else 1e-2, tag,
                         "cuda-emu against the CPU backend")
        n += 7
        if n == 7:  # the first plan (bf16, grouped, causal): the blocks in reverse order give the same bits
            rev = emu_grads(fsexec, wd, data, emu, "gr.safetensors", "reverse")
            same = all(torch.equal(dev[k], rev[k]) for k in ("q", "k", "v"))
            print(f"{'ok  ' if same else 'FAIL'} {tag:34} backward with the blocks in reverse order: same bits")
            if not same:
                fails.append(f"{tag}: two backward runs differ")
            n += 1
    fails += emulated_packed(fsc, fsexec, wd, emu)
    if fails:
        sys.exit("attn_mask.py: FAIL: " + ", ".join(fails))
    print(f"ok   tensor-core and f32 kernels with masks: {n + 4} checks")


# Case 6: tests/cuda_emu/attn_mask.fsm's four masked attentions in one fp32 plan under the tf32 setting. Its
# gradients that only the attentions' products reach (those of the unpacked attentions' q, k, v; the packed
# ones' pass through the QKV projections' GEMMs, TF32 on the device too).
TF32_ATTN = ("q", "k", "v", "q2", "k2", "v2")
TF32_TOL = 5e-3  # op_check's TOL_TF32 (tests/cuda/op_check.c): TF32 rounds every product's inputs to 2^-11


def tf32_kernels(fsc, wd, args):
    """The plan's attention launches (fsc --kernels): every masked forward on attention_tc, every backward's two
    tiled kernels on attention_bwd_tc (the f32 kernels would be attention_ and attention_bwd_ alone). The
    failures' names."""
    fwd, bwd = [], []
    for line in run([fsc, *args, "--kernels"], wd).splitlines():
        f = line.split()
        if len(f) > 3 and f[2] in ("attention_masked", "attention_qkv_masked"):
            fwd.append(f[3])
        elif len(f) > 3 and f[2] in ("attention_masked_bwd", "attention_qkv_masked_bwd"):
            bwd.append(f[3])
    ok = len(fwd) == 4 and all(k.startswith("attention_tc_") for k in fwd) and \
        sum(k.startswith("attention_bwd_tc_") for k in bwd) == 8
    print(f"{'ok  ' if ok else 'FAIL'} tf32: the masked attentions run on the tensor-core kernels: forward {fwd}, "
          f"backward {len(bwd)} launches")
    return [] if ok else [f"tf32 kernels: forward {fwd}, backward {bwd}"]


def emulated_tf32(fsc, fsexec, wd, emu):
    """Case 6 (--emu-tf32): one step of attn_mask.fsm compiled with --tf32 1 on cuda-emu (the flash kernels on mma
    m16n8k8 tf32) against the CPU backend's (which ignores tf32: fp32), every gradient within op_check's tf32
    tolerance of its largest value, the fully masked item's exactly 0 on both; the attentions' own gradients
    farther than fp32's 1e-5 (TF32's rounding shows: not the f32 kernels); the backward's bits the same with the
    blocks in reverse order."""
    np.save(os.path.join(wd, "mb.npy"), make_mask(70, 1))
    np.save(os.path.join(wd, "ma.npy"), make_mask(70, 1, True))
    data = ["--data", "mb=mb.npy,ma=ma.npy", "--data-order", "sequential", "--threads", "2"]
    args = [os.path.join(HERE, "..", "cuda_emu", "attn_mask.fsm"), "-q", "--precision", "fp32", "--tf32", "1"]
    fails = tf32_kernels(fsc, wd, args)
    run([fsc, *args, "-o", "am.plan"], wd)
    run([fsexec, "am.plan", "--steps", "1", "--save-grads", "g.safetensors", *data], wd)
    cpu = load_safetensors(os.path.join(wd, "g.safetensors"), torch.float64)
    dev = emu_grads(fsexec, wd, data, emu, "ge.safetensors", "forward")
    errs = {}
    for name in sorted(cpu):
        err = errs[name] = ((dev[name] - cpu[name]).abs().max() / cpu[name].abs().max()).item()
        item = not name.startswith("w")  # the projections' weights have no batch axis
        dead = max(dev[name][3].abs().max().item(), cpu[name][3].abs().max().item()) if item else 0.0
        ok = err <= TF32_TOL and dead == 0.0
        print(f"{'ok  ' if ok else 'FAIL'} tf32 d loss / d {name:3}: cuda-emu against the CPU backend {err:.2e} "
              f"(tol {TF32_TOL:g})" + (f"; fully masked item: max |.| = {dead:g}" if item else ""))
        if not ok:
            fails.append(f"tf32 {name}")
    seen = max(errs[n] for n in TF32_ATTN)
    print(f"{'ok  ' if seen > 1e-5 else 'FAIL'} tf32: the attentions' gradients differ from fp32's by up to "
          f"{seen:.1e} (TF32's rounding; the f32 kernels stay within 1e-5)")
    if seen <= 1e-5:
        fails.append("tf32: no TF32 rounding seen")
    rev = emu_grads(fsexec, wd, data, emu, "gr.safetensors", "reverse")
    same = all(torch.equal(dev[n], rev[n]) for n in cpu)
    print(f"{'ok  ' if same else 'FAIL'} tf32: backward with the blocks in reverse order: same bits")
    if not same:
        fails.append("tf32: two backward runs differ")
    if fails:
        sys.exit("attn_mask.py: FAIL: " + ", ".join(fails))
    print(f"ok   tf32 masked attention: {2 * len(cpu) + 3} checks")


def inf_only_in_masks(fsc, fsexec, wd):
    """The loader lets -inf into an f32 input that only attention_masked's masks read (the runs above), and
    still refuses it where anything else reads the input too."""
    mask = make_mask(29, 0, True)
    data = mask_data(wd, mask)
    write_model(wd, 37, 29, 0, mask)
    with open(os.path.join(wd, "am.fsm")) as f:
        src = f.read().replace("* r))));", "* r)))) + sum(sum(mask));")
    with open(os.path.join(wd, "am2.fsm"), "w") as f:
        f.write(src)
    run([fsc, "am2.fsm", "-q", "-o", "am2.plan"], wd)
    p = subprocess.run([fsexec, "am2.plan", "--steps", "1", *data], cwd=wd, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    want = "is -inf; input 'mask' takes finite numbers: clean the file"
    if p.returncode != 1 or want not in p.stdout:
        sys.exit(f"attn_mask.py: FAIL: -inf in a mask that a sum also reads: exit {p.returncode}, "
                 f"wanted '{want}':\n{p.stdout[-2000:]}")
    print("ok   -inf passes into an input only masks read, and is refused where a sum reads it too")


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
    p, first = None, None
    for rc, pack in (("", "1"), ('recompute "attention";', "1"), ("", "0")):
        bert_plan(fsc, wd, "fp32", pack, rc)
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
        what = ("selective recompute" if rc else "no recompute") + (", packed" if pack == "1" else ", unpacked")
        if first is None:
            first = got, final
        elif pack == "0":  # the same steps as the packed plan's (attention_qkv_masked), to fp32 rounding
            werr = max(rel(final[n].double(), first[1][n].double()) for n in final)
            gap = max(abs(a - b) / b for a, b in zip(got, first[0]))
            print("%s BERT-like encoder unpacked against packed: losses rel %.1e, weights rel %.1e"
                  % ("ok  " if gap <= 1e-6 and werr <= 1e-6 else "FAIL", gap, werr))
            if gap > 1e-6 or werr > 1e-6:
                sys.exit("attn_mask.py: FAIL packed and unpacked plans differ")
        if len(got) != STEPS or lerr > 1e-5 or perr > 1e-5 or verr > 1e-5:
            sys.exit("attn_mask.py: FAIL BERT-like encoder (%s): losses %s, PyTorch %s (rel %.1e); weights rel %.1e; "
                     "val_loss %s vs %.6f" % (what, got, want, lerr, perr, val, val0))
        if not want[-1] < want[0]:
            sys.exit("attn_mask.py: FAIL BERT-like encoder: the loss did not fall: %s" % want)
        print("ok   BERT-like encoder with a padding mask (%s): %d AdamW steps, losses rel %.1e (%.4f -> %.4f), "
              "weights rel %.1e, val_loss rel %.1e of PyTorch float64" % (what, STEPS, lerr, want[0], want[-1], perr,
                                                                           verr))


def bert_plan(fsc, wd, prec, pack, rc=""):
    """The BERT-like encoder's plan, bert.plan, with pack_attention `pack`; packed, its attention is
    attention_qkv_masked (passes/packed_attn.c), else attention_masked."""
    with open(os.path.join(wd, "bert.fsm"), "w") as f:
        f.write(BERT.replace("RECOMPUTE", rc))
    args = ["bert.fsm", "-q", "--precision", prec, "--pack_attention", pack]
    run([fsc, *args, "-o", "bert.plan"], wd)
    ir = run([fsc, *args, "--emit", "ir"], wd)
    if ("attention_qkv_masked(" in ir) != (pack == "1") or ("attention_masked(" in ir) != (pack == "0"):
        sys.exit(f"attn_mask.py: FAIL pack_attention {pack}: the plan's attention is not the one meant:\n{ir}")


def emulated_packed(fsc, fsexec, wd, emu):
    """The BERT-like encoder (head dim 8, right padding) in bf16, packed and not, and in fp16 packed: one
    step's gradients on cuda-emu (the tensor-core kernels, attention_tc) against the CPU backend's, and
    packed against unpacked."""
    rng = np.random.default_rng(4)
    mask = (np.arange(7)[None, :] < rng.integers(2, 8, size=8)[:, None]).astype(np.int32)
    for name, arr in (("tok", rng.integers(0, 32, size=(8, 7))), ("lab", rng.integers(0, 3, size=8)), ("msk", mask)):
        np.save(os.path.join(wd, name + ".npy"), arr.astype(np.int32))
    data = ["--data", "tokens=tok.npy,labels=lab.npy,mask=msk.npy", "--data-order", "sequential", "--steps", "1"]
    fails = []
    for prec, packs in (("bf16", ("1", "0")), ("fp16", ("1",))):
        grads = {}
        for pack in packs:
            bert_plan(fsc, wd, prec, pack)
            run([fsexec, "bert.plan", *data, "--save-grads", "gc.safetensors"], wd)
            dev = emu_grads(fsexec, wd, data[:-2], emu, "ge.safetensors", "forward", "bert.plan")
            cpu = load_safetensors(os.path.join(wd, "gc.safetensors"), torch.float64)
            err = max(((dev[n] - cpu[n]).abs().max() / cpu[n].abs().max()).item() for n in cpu)
            grads[pack] = dev
            ok = err <= 1e-2
            print(f"{'ok  ' if ok else 'FAIL'} BERT-like encoder {prec} {'packed' if pack == '1' else 'unpacked'}: "
                  f"cuda-emu's gradients against the CPU backend's: {err:.2e} (tol 0.01)")
            if not ok:
                fails.append(f"BERT-like {prec} pack {pack}")
        if len(packs) == 1:
            continue
        err = max(((grads["1"][n] - grads["0"][n]).abs().max() / grads["0"][n].abs().max()).item() for n in grads["0"])
        ok = err <= 1e-2
        print(f"{'ok  ' if ok else 'FAIL'} BERT-like encoder {prec}: cuda-emu packed against unpacked: {err:.2e}")
        if not ok:
            fails.append(f"BERT-like {prec} packed against unpacked")
    return fails


def main():
    if len(sys.argv) not in (3, 5) or len(sys.argv) == 5 and sys.argv[3] not in ("--emu", "--emu-shapes",
                                                                                  "--emu-tf32"):
        sys.exit("usage: attn_mask.py FSC FSEXEC [--emu | --emu-shapes | --emu-tf32 LIBFS_CUDAEMU]")
    fsc, fsexec = (os.path.abspath(a) for a in sys.argv[1:3])
    emu = os.path.abspath(sys.argv[4]) if len(sys.argv) == 5 else None
    with tempfile.TemporaryDirectory(prefix="fs-attn-mask-") as wd:
        if emu and sys.argv[3] == "--emu-shapes":
            emulated_shapes(fsc, fsexec, wd, emu)
            print("attn_mask.py: all passed")
            return
        if emu and sys.argv[3] == "--emu-tf32":
            emulated_tf32(fsc, fsexec, wd, emu)
            print("attn_mask.py: all passed")
            return
        values_and_grads(fsc, fsexec, wd, emu)
        if not emu:  # the emulated run checks the kernels; the encoder's training is the CPU run's
            bert_training(fsc, fsexec, wd)
    print("attn_mask.py: all passed")


if __name__ == "__main__":
    main()
