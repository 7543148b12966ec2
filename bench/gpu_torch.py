#!/usr/bin/env python3
"""A plain PyTorch GPT-2 training step on a GPU: the reference bench/gpu_check.sh times
fsexec against.

The model is samples/gpt2.fsm's (GPT-2 124M by default: pre-norm blocks, causal
self-attention through F.scaled_dot_product_attention, tanh-GELU MLP, output projection
tied to the token embedding), trained as a user of PyTorch 2.x would: bf16 autocast,
fp32 weights, AdamW (fused) with clipping at 1.0, random tokens. For each mode (eager,
and torch.compile unless the time limit is too near) it runs WARMUP steps, then STEPS
timed steps (a device synchronize around each), and prints one JSON line:

    {"mode": "eager", "B": 8, "T": 1024, "params": 124439808, "ms": ..., "tokens_per_s": ...,
     "mfu": ...}

ms is the median step; MFU counts, per token, 6 * params + 12 * L * C * T FLOPs (the
matrix multiplies of forward and backward, attention over the full T x T square, as
nanoGPT's estimate_mfu and PaLM's appendix B; bench/train_step.py counts the same) against
--peak FLOP/s (989e12: the H100/H200 SXM dense bf16 datasheet rate).

usage: python3 bench/gpu_torch.py [--B 8] [--T 1024] [--steps 20] [--warmup 5]
                                  [--modes eager,compile] [--time-limit SECONDS]
"""
import argparse
import json
import math
import statistics
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, C, NH):
        super().__init__()
        self.NH = NH
        self.ln1 = nn.LayerNorm(C)
        self.attn = nn.Linear(C, 3 * C)
        self.proj = nn.Linear(C, C)
        self.ln2 = nn.LayerNorm(C)
        self.fc = nn.Linear(C, 4 * C)
        self.fcproj = nn.Linear(4 * C, C)

    def forward(self, x):
        B, T, C = x.shape
        q, k, v = self.attn(self.ln1(x)).split(C, dim=2)
        q, k, v = (t.view(B, T, self.NH, C // self.NH).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(a.transpose(1, 2).reshape(B, T, C))
        return x + self.fcproj(F.gelu(self.fc(self.ln2(x)), approximate="tanh"))


class GPT2(nn.Module):
    def __init__(self, V, T, C, NH, L):
        super().__init__()
        self.wte = nn.Embedding(V, C)
        self.wpe = nn.Embedding(T, C)
        self.blocks = nn.ModuleList(Block(C, NH) for _ in range(L))
        self.lnf = nn.LayerNorm(C)
        for name, p in self.named_parameters():
            if name.endswith("proj.weight"):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * L))
            elif p.dim() == 2:
                nn.init.normal_(p, std=0.02)

    def forward(self, tokens, targets):
        T = tokens.shape[1]
        x = self.wte(tokens) + self.wpe(torch.arange(T, device=tokens.device))
        for b in self.blocks:
            x = b(x)
        logits = self.lnf(x) @ self.wte.weight.t()  # tied
        return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), targets.reshape(-1))


def run(mode, a, dev):
    torch.manual_seed(1234)
    model = GPT2(a.V, a.T, a.C, a.NH, a.L).to(dev)
    params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=True)
    step_model = torch.compile(model) if mode == "compile" else model
    g = torch.Generator(device=dev).manual_seed(1)

    def step():
        tok = torch.randint(0, a.V, (a.B, a.T + 1), device=dev, generator=g)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = step_model(tok[:, :-1], tok[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

    times = []
    for i in range(a.warmup + a.steps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        if i >= a.warmup:
            times.append(time.perf_counter() - t0)
    ms = statistics.median(times) * 1e3
    tok_s = a.B * a.T / (ms / 1e3)
    flops_per_token = 6 * params + 12 * a.L * a.C * a.T
    return {"mode": mode, "B": a.B, "T": a.T, "params": params, "ms": round(ms, 3), "tokens_per_s": round(tok_s, 1),
            "mfu": round(tok_s * flops_per_token / a.peak, 4), "loss": round(float(loss), 4),
            "torch": torch.__version__, "device": torch.cuda.get_device_name(dev)}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    for k, v in {"B": 8, "T": 1024, "V": 50257, "C": 768, "NH": 12, "L": 12, "steps": 20, "warmup": 5}.items():
        ap.add_argument("--" + k, type=int, default=v)
    ap.add_argument("--modes", default="eager,compile")
    ap.add_argument("--peak", type=float, default=989e12)
    ap.add_argument("--time-limit", type=float, default=240, help="skip torch.compile when less than 150 s is left")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        sys.exit("gpu_torch.py: no CUDA device")
    torch.backends.cuda.matmul.allow_tf32 = True
    dev = torch.device("cuda")
    start = time.time()
    for mode in a.modes.split(","):
        left = a.time_limit - (time.time() - start)
        if mode == "compile" and left < 150:
            print(json.dumps({"mode": mode, "skipped": "%.0f s left of --time-limit" % left}), flush=True)
            continue
        try:
            print(json.dumps(run(mode, a, dev)), flush=True)
        except Exception as e:  # a failed mode is reported, the others still run
            print(json.dumps({"mode": mode, "error": repr(e)[:300]}), flush=True)
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
