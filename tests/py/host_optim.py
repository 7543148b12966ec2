#!/usr/bin/env python3
"""The host optimizer (runtime/cpu/optim.c's cpu_adamw and cpu_sgd) against torch.optim.

1. Each of 10 steps of AdamW (lr 1e-3, betas (0.9, 0.999), eps 1e-8; weight_decay 0 and
   0.1; the gradient times a clipping coefficient of 1 or 0.5, torch's gradient scaled
   the same; and betas (0.3, 0.95), whose 1 - beta1 >= 0.5 takes lerp's other
   formula), taken from torch's p and state before that step, gives torch's m and v
   within 2 ulp per element, and p within 4. SGD (momentum 0.9 and 0, weight_decay 0.01)
   gives torch.optim.SGD's p and buf within 2. Each step starts from torch's state, so
   the check is of one update, not of 10 steps' drift.
   The ulp is that of the element's scale, the largest magnitude among the values its
   update is computed from: torch's kernels contract multiply-adds into FMAs and ours
   do not, and where terms cancel to near zero that rounding is many ulps of the result
   but within one or two of what cancelled. AdamW's p goes through six roundings in
   each implementation (sqrt, div, add, mul, div, add): over 28 seeds torch 1.13's and
   2.x's p are up to 3 and 4 ulp of its scale from ours, where m, v and SGD's values
   (one to three roundings) stay within 2.
   n = 100003: vector remainders and a thread boundary inside a vector are covered.
2. A coefficient of NaN (an overflowed fp16 step) changes nothing.
3. 10 steps from zero state are bit for bit the same at 1 and 2 OpenMP threads, and on
   every ISA's build of the loops that this CPU runs (optim_driver_<isa>; 77 from one
   means the CPU lacks that ISA).

usage: host_optim.py BINDIR ISA...   (BINDIR holds optim_driver and optim_driver_<isa>;
       /usr/bin/python3, with torch and numpy)
"""
import os
import subprocess
import sys
import tempfile

import numpy as np
import torch

N, STEPS, SEED = 100003, 10, 1234
# The learning rate reaches the kernels as an f32 tensor (lr_at's output): torch gets
# that float's value, so both start from the same lr.
LR, BETAS, EPS = float(np.float32(1e-3)), (0.9, 0.999), 1e-8
SGD_LR, SGD_WD = float(np.float32(1e-2)), 0.01
ULP, ADAMW_P_ULP = 2, 4  # tolerances: see 1. above

failures = []


def check(ok, what):
    print(("ok    " if ok else "FAIL  ") + what)
    if not ok:
        failures.append(what)


def inputs():
    """p ~ N(0, 1); gradients N(0, 1) times scales from 1e-4 to 10, so v spans a wide range."""
    rng = np.random.default_rng(SEED)
    p = rng.standard_normal(N).astype(np.float32)
    scale = (10.0 ** rng.uniform(-4, 1, N)).astype(np.float32)
    g = (rng.standard_normal((STEPS, N)).astype(np.float32) * scale).astype(np.float32)
    return p, g


class Driver:
    def __init__(self, bindir, work):
        self.bindir, self.work, self.runs = bindir, work, 0

    def run(self, op, first, args, state, grads, threads=2, exe="optim_driver"):
        """p and the state (arrays of N floats) after len(grads) steps from `state`,
        the first numbered `first`; None when the driver exits 77 (no such ISA)."""
        self.runs += 1
        src, out = (os.path.join(self.work, "%s%d.f32" % (w, self.runs)) for w in ("in", "out"))
        np.concatenate([np.ravel(x) for x in state + [grads]]).astype(np.float32).tofile(src)
        cmd = [os.path.join(self.bindir, exe), op, str(N), str(first), str(len(grads))] + [repr(a) for a in args]
        r = subprocess.run(cmd + [src, out], env=dict(os.environ, OMP_NUM_THREADS=str(threads)),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=60)
        os.remove(src)
        if r.returncode == 77:
            return None
        if r.returncode != 0:
            sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout))
        return list(np.fromfile(out, dtype=np.float32).reshape(len(state), N))


def torch_history(opt_class, kw, keys, p, g, coef):
    """torch's [p, state...] before step 1 (state zero) and after each step."""
    param = torch.nn.Parameter(torch.from_numpy(p.copy()))
    opt = opt_class([param], **kw)

    def snapshot():
        st = opt.state[param]
        return [param.detach().numpy().copy()] + [
            st[k].numpy().copy() if st.get(k) is not None else np.zeros(N, np.float32) for k in keys]
    history = [snapshot()]
    for s in range(STEPS):
        param.grad = torch.from_numpy(g[s]) * coef
        opt.step()
        history.append(snapshot())
    return history


def within(name, ours, ref, scales, names, tols):
    """|ours - ref| <= tol ulps of the larger of scale and |ref|, element by element."""
    for x, r, sc, what, tol in zip(ours, ref, scales, names, tols):
        sc = np.maximum(np.maximum(sc, np.abs(r)), 1e-30).astype(np.float32)
        err = np.abs(x.astype(np.float64) - r) / np.spacing(sc)
        worst = int(err.argmax())
        check(err[worst] <= tol, "%s: %s within %d ulp of torch (worst %.2f ulp at %d: %.9g vs %.9g)"
              % (name, what, tol, err[worst], worst, x[worst], r[worst]))


def adamw_update(m, v, step, betas):
    """-lr m / (sqrt(v) + eps) with the bias corrections, in float64."""
    m, v = m.astype(np.float64), v.astype(np.float64)
    bc1, bc2 = 1 - betas[0] ** step, 1 - betas[1] ** step
    return -LR / bc1 * m / (np.sqrt(v) / np.sqrt(bc2) + EPS)


def adamw_reference(before, after, ours, gs, step, betas):
    """torch's p, m and v after the step, and their scales. m's scale: m, g and g - m
    (lerp); v's: v (its terms are all positive); p's: p and the update. torch 1.13
    takes mul and add for the lerp, so m may differ by an ulp of m's scale, which where
    m cancels is many ulps of m and so of the update: torch's p is given the difference
    that our m and v make to the update (in float64), so that p is checked for its own
    rounding."""
    p, m, v = (x.astype(np.float64) for x in before)
    update = adamw_update(after[1], after[2], step, betas)
    p_ref = after[0] + (adamw_update(ours[1], ours[2], step, betas) - update)
    scales = [np.maximum(np.abs(p), np.abs(update)),
              np.maximum.reduce([np.abs(m), np.abs(gs), np.abs(gs - m)]), v]
    return [p_ref, after[1], after[2]], scales


def sgd_scales(before, gs, mom):
    """d = g + wd p; buf = mom buf + d; p - lr buf (p - lr d without momentum): the
    largest of each one's terms and of what they were computed from."""
    p, buf = (x.astype(np.float64) for x in before)
    d_scale = np.maximum.reduce([np.abs(gs), SGD_WD * np.abs(p), np.abs(gs + SGD_WD * p)])
    buf_scale = np.maximum(mom * np.abs(buf), d_scale)
    return [np.maximum(np.abs(p), SGD_LR * buf_scale), buf_scale]


def bitwise(a, b):
    return all(np.array_equal(x.view(np.int32), y.view(np.int32)) for x, y in zip(a, b))


def same_everywhere(drv, name, op, args, start, g, isas):
    """10 steps from start: the same bits at 1 and 2 threads and from every ISA's build."""
    ref = drv.run(op, 1, args, start, g)
    one = drv.run(op, 1, args, start, g, threads=1)
    check(bitwise(one, ref), "%s: 10 steps at 1 and 2 threads bitwise equal" % name)
    for isa in isas:
        got = drv.run(op, 1, args, start, g, exe="optim_driver_" + isa)
        if got is None:
            print("skip  %s: this CPU has no %s" % (name, isa))
        else:
            check(bitwise(got, ref), "%s: 10 steps of the %s build bitwise equal to the dispatched" % (name, isa))


def adamw_cases(drv, p, g, isas):
    zero = np.zeros(N, np.float32)
    # beta1 0.3: 1 - beta1 >= 0.5 takes torch's other lerp formula
    for betas, wd, coef in [(BETAS, 0.0, 1.0), (BETAS, 0.1, 1.0), (BETAS, 0.1, 0.5), ((0.3, 0.95), 0.1, 1.0)]:
        name = "adamw betas=%s wd=%g coef=%g" % (betas, wd, coef)
        args = [LR, betas[0], betas[1], EPS, wd, coef]
        hist = torch_history(torch.optim.AdamW, dict(lr=LR, betas=betas, eps=EPS, weight_decay=wd),
                             ["exp_avg", "exp_avg_sq"], p, g, coef)
        for t in range(1, STEPS + 1):
            ours = drv.run("adamw", t, args, hist[t - 1], g[t - 1:t])
            ref, scales = adamw_reference(hist[t - 1], hist[t], ours, g[t - 1].astype(np.float64) * coef, t, betas)
            within("%s step %d" % (name, t), ours, ref, scales, ["p", "m", "v"], [ADAMW_P_ULP, ULP, ULP])
        same_everywhere(drv, name, "adamw", args, [p, zero, zero], g, isas)


def sgd_cases(drv, p, g, isas):
    zero = np.zeros(N, np.float32)
    for mom, coef in [(0.9, 1.0), (0.9, 0.5), (0.0, 1.0)]:
        name = "sgd momentum=%g coef=%g" % (mom, coef)
        args = [SGD_LR, mom, SGD_WD, coef]
        hist = torch_history(torch.optim.SGD, dict(lr=SGD_LR, momentum=mom, weight_decay=SGD_WD),
                             ["momentum_buffer"], p, g, coef)
        for t in range(1, STEPS + 1):
            ours = drv.run("sgd", t, args, hist[t - 1], g[t - 1:t])
            gs = g[t - 1].astype(np.float64) * coef
            names = ["p", "buf"] if mom else ["p"]  # without momentum torch keeps no buffer
            scales = sgd_scales(hist[t - 1], gs, mom)
            within("%s step %d" % (name, t), ours, hist[t], scales, names, [ULP, ULP])
        same_everywhere(drv, name, "sgd", args, [p, zero], g, isas)


def skipped_step(drv, p, g):
    state = [p, np.full(N, 0.5, np.float32), np.full(N, 0.25, np.float32)]
    got = drv.run("adamw", 3, [LR, BETAS[0], BETAS[1], EPS, 0.1, float("nan")], state, g[:1])
    check(bitwise(got, state), "adamw coef=nan: p, m and v unchanged")
    got = drv.run("sgd", 3, [SGD_LR, 0.9, SGD_WD, float("nan")], state[:2], g[:1])
    check(bitwise(got, state[:2]), "sgd coef=nan: p and buf unchanged")


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    bindir, isas = sys.argv[1], sys.argv[2:]
    torch.set_num_threads(2)
    p, g = inputs()
    with tempfile.TemporaryDirectory() as work:
        drv = Driver(bindir, work)
        adamw_cases(drv, p, g, isas)
        sgd_cases(drv, p, g, isas)
        skipped_step(drv, p, g)
    print("%d failed" % len(failures) if failures else "host optimizer: all checks passed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
