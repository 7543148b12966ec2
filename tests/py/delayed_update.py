#!/usr/bin/python3
"""Offload's delayed parameter update (`--delayed_update 1`, ZeRO-Offload's DPU) against a
float64 PyTorch reference of its maths (passes/offload.c, docs/language.md):

    p_0 = the init;  for t >= 1:  g_t = grad of step t's loss at p_max(t-2, 0)
    c_t = min(1, clip / (||g_t|| + 1e-6))             (the norm of g_t itself)
    (p_t, m_t, v_t) = AdamW(p_{t-1}, m_{t-1}, v_{t-1}; c_t g_t, lr_t, step t)

so after N steps the params are p_{N-1}: update N waits, pending, for step N + 1.

For the tiny GPT-2 (fp32, AdamW, clipping on, 6 steps), on the CPU backend and, given the
cuda-emu library, on `--device cuda` through it:
  1. every step's loss and gradient norm within 1e-5 (relative) of the reference's, and
     the saved params after 6 steps within 1e-4 of the largest |param| of each tensor;
     the reference without the delay (each update before the next step) is more than
     100x that far from them, so the check tells the two apart;
  2. resuming at step 3 from a checkpoint (the pending update in it) gives step 4-6's
     log lines and the final params of the uninterrupted run, bit for bit;
  3. `--delayed_update 0` compiles to the same plan file as no flag (off by default);
     `--delayed_update 1` without offload is an fsc error that says it needs offload; a
     plan without it refuses to resume a checkpoint that holds a pending update.

usage: delayed_update.py FSC FSEXEC [LIBFS_CUDAEMU]
"""
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

import numpy as np  # noqa: E402
import torch  # noqa: E402

import models  # noqa: E402

DIMS = {"L": 2, "C": 32, "NH": 2, "T": 16, "V": 256, "B": 4}
# eps 1e-4: AdamW's normalisation turns a float32 rounding of a near-zero gradient into
# a step of lr (parity.py's note); a larger eps keeps the comparison about the delay.
HP = {"optimizer": "adamw", "lr": 1e-2, "beta1": 0.9, "beta2": 0.95, "eps": 1e-4, "weight_decay": 0.1,
      "clip": 0.5, "warmup": 2, "lr_schedule": "cosine", "steps": 20, "min_lr": 1e-3}
STEPS = 6
TOL_LOG, TOL_W = 1e-5, 1e-4


def run(cmd, cwd, env=None, ok=True):
    r = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if ok and r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout))
    return r


def read_log(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def reference(init, tok, delayed):
    """The losses, norms and final params of STEPS steps in float64: delayed, or each
    update before the next step (torch.optim.AdamW's maths, written out)."""
    B, T, L, NH = DIMS["B"], DIMS["T"], DIMS["L"], DIMS["NH"]
    master = {k: v.double().clone() for k, v in init.items()}
    m = {k: torch.zeros_like(v) for k, v in master.items()}
    v2 = {k: torch.zeros_like(v) for k, v in master.items()}
    b1, b2, eps, wd = HP["beta1"], HP["beta2"], HP["eps"], HP["weight_decay"]

    def update(u):
        grads, lr, coef, t = u
        for k, p in master.items():
            g = coef * grads[k]
            m[k] = b1 * m[k] + (1 - b1) * g
            v2[k] = b2 * v2[k] + (1 - b2) * g * g
            denom = v2[k].sqrt() / (1 - b2 ** t) ** 0.5 + eps
            master[k] = p * (1 - lr * wd) - lr / (1 - b1 ** t) * m[k] / denom

    pending, log = None, []
    for t in range(1, STEPS + 1):
        fwd = {k: p.clone().requires_grad_(True) for k, p in master.items()}
        if pending is not None:  # on the host, while the device computes step t on the params before it
            update(pending)
        x, y = models.sequential_batch(tok, t, B, T)
        loss = models.gpt2_loss(fwd, x, y, L, NH)
        loss.backward()
        grads = {k: p.grad.detach() for k, p in fwd.items()}
        norm = float(torch.sqrt(sum((g ** 2).sum() for g in grads.values())))
        coef = min(1.0, HP["clip"] / (norm + 1e-6))
        lr = models.lr_at(t, HP["lr"], HP["warmup"], HP["steps"], HP["min_lr"], HP["lr_schedule"])
        pending = (grads, lr, coef, t)
        if not delayed:
            update(pending)
            pending = None
        log.append({"loss": float(loss), "grad_norm": norm})
    return log, master


def worst_weight(got, ref):
    return max(float((got[k].double() - ref[k]).abs().max()) / max(float(ref[k].abs().max()), 1e-30) for k in ref)


def check_run(label, log, final, ref_log, ref_final, plain_final):
    if len(log) != STEPS:
        sys.exit("FAIL %s: %d log lines, not %d" % (label, len(log), STEPS))
    for got, want in zip(log, ref_log):
        for key in ("loss", "grad_norm"):
            err = abs(got[key] - want[key]) / abs(want[key])
            if err > TOL_LOG:
                sys.exit("FAIL %s: step %d %s %.9g, the delayed reference %.9g (rel %.3g)" %
                         (label, got["step"], key, got[key], want[key], err))
    if set(final) != set(ref_final):
        sys.exit("FAIL %s: saved params %s" % (label, sorted(set(final) ^ set(ref_final))))
    w, plain = worst_weight(final, ref_final), worst_weight(final, plain_final)
    if w > TOL_W:
        sys.exit("FAIL %s: params after %d steps %.3g from the delayed reference" % (label, STEPS, w))
    if plain < 100 * TOL_W:
        sys.exit("FAIL %s: params after %d steps only %.3g from the reference without the delay: the check "
                 "cannot tell the two apart" % (label, STEPS, plain))
    print("ok   %-5s %d steps: loss / norm within %g of the delayed float64 reference, params within %.2g "
          "(%.2g from the undelayed one)" % (label, STEPS, TOL_LOG, w, plain))


def main():
    with tempfile.TemporaryDirectory(prefix="fs_delayed_") as wd:
        check(wd)


def check(wd):
    fsc, fsexec = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
    emu = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
    src = os.path.join(ROOT, "samples", "gpt2.fsm")
    dims = [x for k, v in DIMS.items() for x in ("-D", "%s=%d" % (k, v))]
    hp = [x for k, v in HP.items() for x in ("--" + k, str(v))]
    base = [fsc, src, "-q", *dims, *hp, "--offload", "optimizer"]
    run(base + ["--delayed_update", "1", "-o", "d.plan"], wd)
    tok = np.random.default_rng(7).integers(0, DIMS["V"], size=2001, dtype=np.uint16)
    tok.astype("<u2").tofile(os.path.join(wd, "tokens.bin"))
    data = ["--data", "tokens.bin", "--data-format", "raw", "--data-order", "sequential"]
    run([fsexec, "d.plan", *data, "--steps", "0", "--save-weights", "init.st"], wd)
    init = models.load_safetensors(os.path.join(wd, "init.st"))
    tok64 = tok.astype(np.int64)
    ref_log, ref_final = reference(init, tok64, True)
    _, plain_final = reference(init, tok64, False)

    # 1. CPU, and the emulated CUDA backend
    devices = [("cpu", None)] + ([("cuda", dict(os.environ, FS_CUDA_BACKEND=emu))] if emu else [])
    for device, env in devices:
        log, st = device + ".jsonl", device + ".st"
        out = run([fsexec, "d.plan", *data, "--device", device, "--steps", str(STEPS), "--log", log,
                   "--save-weights", st], wd, env).stdout
        if device == "cuda" and "device: cuda" not in out:
            sys.exit("FAIL: fsexec did not run on the (emulated) CUDA backend:\n" + out)
        check_run(device, read_log(os.path.join(wd, log)), models.load_safetensors(os.path.join(wd, st)), ref_log,
                  ref_final, plain_final)

    # 2. a checkpoint at step 3 with its update pending, resumed
    run([fsexec, "d.plan", *data, "--steps", "3", "--checkpoint-dir", "ck"], wd)
    run([fsexec, "d.plan", *data, "--steps", str(STEPS), "--resume", "ck", "--log", "resumed.jsonl",
         "--save-weights", "resumed.st"], wd)
    whole, resumed = read_log(os.path.join(wd, "cpu.jsonl")), read_log(os.path.join(wd, "resumed.jsonl"))
    keys = ("step", "loss", "lr", "grad_norm")
    if [[r[k] for k in keys] for r in resumed] != [[r[k] for k in keys] for r in whole[3:]]:
        sys.exit("FAIL resume: steps 4-6 differ from the uninterrupted run's:\n%s\n%s" % (resumed, whole[3:]))
    with open(os.path.join(wd, "resumed.st"), "rb") as a, open(os.path.join(wd, "cpu.st"), "rb") as b:
        if a.read() != b.read():
            sys.exit("FAIL resume: the params after step %d differ from the uninterrupted run's" % STEPS)
    print("ok   resumed at step 3 (its update pending in the checkpoint): steps 4-6 and the params bit for bit")

    # 3. off by default; refused without offload; a pending update is not dropped
    run(base + ["-o", "none.plan"], wd)
    run(base + ["--delayed_update", "0", "-o", "zero.plan"], wd)
    with open(os.path.join(wd, "none.plan"), "rb") as a, open(os.path.join(wd, "zero.plan"), "rb") as b:
        if a.read() != b.read():
            sys.exit("FAIL: --delayed_update 0 compiles to another plan than the default")
    r = run([fsc, src, "-q", *dims, "--delayed_update", "1", "-o", "x.plan"], wd, ok=False)
    if r.returncode == 0 or "needs --offload optimizer" not in r.stdout:
        sys.exit("FAIL: --delayed_update 1 without offload (exit %d):\n%s" % (r.returncode, r.stdout))
    r = run([fsexec, "none.plan", *data, "--steps", str(STEPS), "--resume", "ck"], wd, ok=False)
    if r.returncode == 0 or "still pending" not in r.stdout:
        sys.exit("FAIL: a plan without the delay resumed a pending update (exit %d):\n%s" % (r.returncode, r.stdout))
    print("ok   off by default; refused without offload; a pending update is not resumed into a plan without one")


if __name__ == "__main__":
    main()
