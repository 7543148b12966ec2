#!/usr/bin/env python3
"""tests/py/tf32_error.py: the error budget behind op_check's tf32 tolerance (TOL_TF32 in
tests/cuda/op_check.c, the README's Mixed precision section).

A plan compiled with the tf32 setting runs attention on TF32 tensor cores
(codegen/kernels/flash.cuh with E = float): every operand of a product is rounded to
tf32 (cvt.rna: 10-bit mantissa, ties away from zero) and the products are summed in f32.
This models exactly those roundings (q, k, v and P in the forward; dO, V, dS, K, Q, P in
the backward) in float64 otherwise, on random q, k, v whose scores have a standard
deviation of 1 to 9, causal and not, at T = 130 and head dims 24, 64, 128, and measures
each output's error as op_check does: max|tf32 - exact| / max|exact|. It checks that the
errors stay under the tolerance and that they are TF32's (above 2^-14: the roundings are
really there). Prints the worst error of each case.
"""
import sys

import torch

TOL_TF32 = 5e-3  # tests/cuda/op_check.c


def tf32(x):
    """f32 rounded to tf32, to nearest with ties away from zero (tc.cuh's fs_to_tf32)."""
    u = x.float().contiguous().view(torch.int32)
    return ((u + 0x1000) & ~0x1FFF).view(torch.float32)


def attention(q, k, v, do, causal, rnd, dtype):
    """o, dq, dk, dv of softmax(q k^T / sqrt(D)) v; rnd rounds each product's operands."""
    T, D = q.shape
    r = lambda x: rnd(x).to(dtype)
    q, k, v, do = q.to(dtype), k.to(dtype), v.to(dtype), do.to(dtype)
    scale = D ** -0.5
    s = (r(q) @ r(k).T) * scale
    if causal:
        s = s.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    p = torch.exp(s - torch.logsumexp(s, 1, keepdim=True))
    o = r(p) @ r(v)
    dp = r(do) @ r(v).T
    ds = p * (dp - (do * o).sum(1, keepdim=True))
    return o, r(ds) @ r(k) * scale, r(ds).T @ r(q) * scale, r(p).T @ r(do)


def main():
    torch.manual_seed(0)
    worst, bad = 0.0, []
    for D in (24, 64, 128):
        for sd in (1, 3, 9):  # the scores' standard deviation: q.k / sqrt(D) of entries of std sqrt(sd)
            for causal in (False, True):
                T = 130
                q, k = torch.randn(T, D) * sd ** 0.5, torch.randn(T, D) * sd ** 0.5
                v, do = torch.randn(T, D), torch.randn(T, D)
                exact = attention(q, k, v, do, causal, lambda x: x, torch.float64)
                got = attention(q, k, v, do, causal, tf32, torch.float64)
                errs = [((g - e).abs().max() / e.abs().max()).item() for g, e in zip(got, exact)]
                print(f"D {D:3d}, scores sd {sd}, {'causal' if causal else 'full  '}: "
                      + ", ".join(f"{n} {e:.1e}" for n, e in zip(("o", "dq", "dk", "dv"), errs)))
                worst = max(worst, max(errs))
                if max(errs) >= TOL_TF32 or min(errs) < 2 ** -14:
                    bad.append((D, sd, causal, errs))
    print(f"worst {worst:.2e} against the tolerance {TOL_TF32}")
    for b in bad:
        print("FAIL: D %d, sd %d, causal %s: errors %s (want 2^-14 <= error < %g)" % (*b[:3], b[3], TOL_TF32))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
