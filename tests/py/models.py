"""PyTorch reimplementations of samples/gpt2.fsm, samples/llama.fsm and samples/lora.fsm.

Parameters are a plain dict of tensors keyed exactly by the .fsm param names
("wte", "h.0.attn.w", "layers.1.wq", "tok_embeddings", ...), as fsexec writes them
with --save-weights. Matmul weights are stored [in, out] (the .fsm writes `x @ w`),
not torch.nn.Linear's [out, in].

Also: a dependency-free safetensors reader/writer, the token-window batches of
`fsexec --data-order sequential`, fsexec's learning-rate schedule, and one AdamW
training step the way fsexec's plan does it (clip_grad_norm_, then AdamW on every
param). Everything works in float32 or float64 (pass dtype).

Run with Debian's /usr/bin/python3 (python3-torch, python3-numpy).
"""
import json
import math
import struct

import numpy as np
import torch
import torch.nn.functional as F

# ---------------------------------------------------------------- safetensors

_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16,
              "I32": np.int32, "I64": np.int64}


def load_safetensors(path, dtype=torch.float32):
    """Read a safetensors file: u64 LE header length, JSON header, raw LE data."""
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        if info["dtype"] == "BF16":  # numpy has no bfloat16: its bits are an f32's top half
            bits = np.frombuffer(data[a:b], dtype="<u2").astype(np.uint32) << 16
            out[name] = torch.from_numpy(bits.view(np.float32).reshape(info["shape"]).copy()).to(dtype)
            continue
        np_dtype = np.dtype(_ST_DTYPES[info["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[a:b], dtype=np_dtype).reshape(info["shape"])
        out[name] = torch.from_numpy(arr.astype(np_dtype.newbyteorder("="), copy=True)).to(dtype)
    return out


def save_safetensors(path, tensors):
    """Write f32 safetensors (for tools that want to hand weights back to fsexec)."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, t in tensors.items():
        raw = t.detach().to(torch.float32).contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode("utf-8")
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


# ---------------------------------------------------------------- ops, as the .fsm means them

def heads(x, n):
    """(B, T, C) -> (B, n, T, C/n)"""
    B, T, C = x.shape
    return x.view(B, T, n, C // n).transpose(1, 2)


def merge_heads(x):
    """(B, n, T, D) -> (B, T, n*D)"""
    B, n, T, D = x.shape
    return x.transpose(1, 2).contiguous().view(B, T, n * D)


def attention(q, k, v):
    """softmax(q k^T / sqrt(D) + causal mask) v, as F.scaled_dot_product_attention(is_causal=True)."""
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    T, D = q.shape[-2], q.shape[-1]
    s = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(D))
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).tril()
    s = s.masked_fill(~mask, float("-inf"))
    return torch.softmax(s, dim=-1) @ v


def layernorm(x, w, b):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps=1e-5)


def rmsnorm(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, theta=10000.0, interleaved=False):
    """Rotary embedding on (..., T, D); position = index along T. Rotate-half (Llama,
    NeoX) pairs (i, i + D/2); interleaved (GPT-J's rotate_every_two) pairs (2i, 2i + 1)."""
    T, D = x.shape[-2], x.shape[-1]
    half = D // 2
    i = torch.arange(half, dtype=torch.float64)
    f = theta ** (-2.0 * i / D)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * f[None, :]   # (T, D/2)
    cos, sin = ang.cos().to(x.dtype), ang.sin().to(x.dtype)
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
        return torch.stack([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).flatten(-2)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def gelu(x, exact=False):
    return F.gelu(x, approximate="none" if exact else "tanh")


def cross_entropy(logits, targets, ignore_index=-100):
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1).long(), ignore_index=ignore_index)


# ---------------------------------------------------------------- models

def gpt2_loss(p, tokens, targets, L, NH, exact=False, ignore_index=-100):
    """samples/gpt2.fsm: tokens, targets int [B, T]; p keyed by the .fsm names. exact: the
    MLP's GELU in its erf form; ignore_index: targets that count for nothing."""
    return cross_entropy(gpt2_logits(p, tokens, L, NH, exact), targets, ignore_index)


def gpt2_logits(p, tokens, L, NH, exact=False):
    T = tokens.shape[1]
    x = p["wte"][tokens.long()] + p["wpe"][torch.arange(T)]
    for l in range(L):
        g = lambda n: p[f"h.{l}.{n}"]
        qkv = layernorm(x, g("ln1.w"), g("ln1.b")) @ g("attn.w") + g("attn.b")
        q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        a = attention(heads(q, NH), heads(k, NH), heads(v, NH))
        x = x + merge_heads(a) @ g("proj.w") + g("proj.b")
        h = gelu(layernorm(x, g("ln2.w"), g("ln2.b")) @ g("fc.w") + g("fc.b"), exact)
        x = x + h @ g("fcproj.w") + g("fcproj.b")
    return layernorm(x, p["lnf.w"], p["lnf.b"]) @ p["wte"].transpose(0, 1)   # tied


def llama_loss(p, tokens, targets, L, NH, NKV=None, interleaved=False):
    """samples/llama.fsm: RMSNorm, rope, grouped-query attention (NKV kv heads, each
    repeat_interleave'd to NH / NKV query heads, as Hugging Face's repeat_kv does),
    SwiGLU, untied output [C, V]. NKV defaults to NH; interleaved: GPT-J's rope."""
    return cross_entropy(llama_logits(p, tokens, L, NH, NKV, interleaved), targets)


def llama_logits(p, tokens, L, NH, NKV=None, interleaved=False):
    G = NH // (NKV or NH)
    x = p["tok_embeddings"][tokens.long()]
    for l in range(L):
        g = lambda n: p[f"layers.{l}.{n}"]
        h = rmsnorm(x, g("attn_norm.w"))
        q = rope(heads(h @ g("wq"), NH), interleaved=interleaved)
        k = rope(heads(h @ g("wk"), NH // G), interleaved=interleaved).repeat_interleave(G, dim=1)
        v = heads(h @ g("wv"), NH // G).repeat_interleave(G, dim=1)
        x = x + merge_heads(attention(q, k, v)) @ g("wo")
        h = rmsnorm(x, g("mlp_norm.w"))
        x = x + (F.silu(h @ g("w1")) * (h @ g("w3"))) @ g("w2")
    return rmsnorm(x, p["norm.w"]) @ p["output"]


def lora_loss(p, tokens, targets, L, NH, scale=2.0):
    """samples/lora.fsm: gpt2_loss with adapters on qkv and the output projection,
    W x + scale * (x A) B, as peft's LoRA Linear (alpha / r = 16 / 8)."""
    T = tokens.shape[1]
    x = p["wte"][tokens.long()] + p["wpe"][torch.arange(T)]
    for l in range(L):
        g = lambda n: p[f"h.{l}.{n}"]
        h = layernorm(x, g("ln1.w"), g("ln1.b"))
        qkv = h @ g("attn.w") + g("attn.b") + h @ g("attn.lora_a") @ g("attn.lora_b") * scale
        q, k, v = qkv.split(qkv.shape[-1] // 3, dim=-1)
        a = merge_heads(attention(heads(q, NH), heads(k, NH), heads(v, NH)))
        x = x + a @ g("proj.w") + g("proj.b") + a @ g("proj.lora_a") @ g("proj.lora_b") * scale
        x = x + gelu(layernorm(x, g("ln2.w"), g("ln2.b")) @ g("fc.w") + g("fc.b")) @ g("fcproj.w") + g("fcproj.b")
    logits = layernorm(x, p["lnf.w"], p["lnf.b"]) @ p["wte"].transpose(0, 1)
    return cross_entropy(logits, targets)


MODELS = {"gpt2": gpt2_loss, "llama": llama_loss, "lora": lora_loss}
LOGITS = {"gpt2": gpt2_logits, "llama": llama_logits}


def num_layers(params, model):
    prefix = "layers." if model == "llama" else "h."
    return 1 + max(int(k.split(".")[1]) for k in params if k.startswith(prefix))


# ---------------------------------------------------------------- data and training

def read_tokens(path):
    """A raw uint16 token file, or llm.c's (256 int32 header, magic 20240520, then uint16)."""
    raw = np.fromfile(path, dtype="<u2")
    head = np.frombuffer(raw[:512].tobytes(), dtype="<i4") if raw.size >= 512 else None
    if head is not None and head[0] == 20240520:
        return raw[512:512 + int(head[2])].astype(np.int64)
    return raw.astype(np.int64)


def sequential_batch(tok, step, B, T):
    """fsexec --data-order sequential: row b of step s (1-based) starts at
    ((s - 1) * B + b) * T mod (N - T - 1)."""
    m = len(tok) - T - 1
    x = np.empty((B, T), np.int64)
    y = np.empty((B, T), np.int64)
    for b in range(B):
        o = ((step - 1) * B + b) * T % m
        x[b] = tok[o:o + T]
        y[b] = tok[o + 1:o + T + 1]
    return torch.from_numpy(x), torch.from_numpy(y)


def lr_at(step, lr, warmup, steps, min_lr, schedule="cosine", decay_frac=0.2):
    """Linear warmup (step <= warmup: lr * step / warmup), then constant, or a decay to
    min_lr at step `steps`: cosine or linear from the warmup's end (BERT's linear schedule),
    or wsd (warmup-stable-decay): lr until the last round(decay_frac * steps) steps (not
    before the warmup ends), then linear to min_lr over them."""
    if warmup > 0 and step <= warmup:
        return lr * step / warmup
    if schedule == "constant":
        return lr
    start = max(warmup, steps - int(decay_frac * steps + 0.5)) if schedule == "wsd" else warmup
    progress = min(1.0, max(0.0, (step - start) / max(1, steps - start)))
    if schedule == "cosine":
        return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))
    return lr - (lr - min_lr) * progress


def train(params, loss_fn, tok, B, T, nsteps, hp, on_step=None, frozen=(), no_decay=()):
    """Runs nsteps of training the way an fsexec plan does: loss, backward,
    clip_grad_norm_(clip), lr from the schedule, AdamW on every param.
    params: dict of leaf tensors (modified in place). Returns per-step dicts.
    frozen: names with requires_grad=False, outside the optimizer and the norm;
    no_decay: names in a second param group with weight_decay 0."""
    names = [n for n in params if n not in frozen]
    plist = [params[n] for n in names]
    for t in plist:
        t.requires_grad_(True)
    groups = [{"params": [params[n] for n in names if n not in no_decay]},
              {"params": [params[n] for n in names if n in no_decay], "weight_decay": 0.0}]
    opt = torch.optim.AdamW([g for g in groups if g["params"]], lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]),
                            eps=hp["eps"], weight_decay=hp["weight_decay"])
    log = []
    for s in range(1, nsteps + 1):
        x, y = sequential_batch(tok, s, B, T)
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(params, x, y)
        loss.backward()
        if on_step is not None:   # the raw gradients, before clipping (fsexec --save-grads)
            on_step(s, loss, {n: params[n].grad.detach().clone() for n in names})
        if hp.get("clip", 0) > 0:
            norm = torch.nn.utils.clip_grad_norm_(plist, hp["clip"])
        else:
            norm = torch.sqrt(sum((t.grad.double() ** 2).sum() for t in plist))
        lr = lr_at(s, hp["lr"], hp["warmup"], hp["steps"], hp["min_lr"], hp.get("lr_schedule", "cosine"),
                   hp.get("decay_frac", 0.2))
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        log.append({"step": s, "loss": float(loss), "lr": lr, "grad_norm": float(norm)})
    return log
