#!/usr/bin/python3
"""Slices as views (passes/slice_view.c): a plan with them against the same plan with
--slice_views 0 (every slice a copy).

1. A model that slices params along their leading dim (`w[1]`, a [L, D, H] stack's
   matrix; `pos[1:5][0]`, `pos[2]`: one run of bytes each, an integer index chained
   after a slice) and reads `w[1]` and `w[2]` in GEMMs, which save them for the backward:
   - the IR after slice_view has 5 slice_view nodes with views on, none with them off;
   - fsc --mem=json: the bytes saved for the backward fall by exactly the two matrices
     (2 x D x H x 4 bytes), which lie in w's buffer with views; no arena grows;
   - 4 SGD steps on the CPU: every loss and every saved weight byte equal;
   - with LIBFS_CUDAEMU: the same two plans with --device cuda on the CUDA emulator
     (slice_view has no instruction there): losses and weights equal to each other's
     bytes, and within 1e-5 of the CPU run's.
2. GPT-2 at tiny dims with --microbatches 2 (each micro-batch's rows of tokens and
   targets: views of the inputs, 4 of them): 3 AdamW steps on the CPU, every loss and
   weight byte equal with and without views, and the arena no larger.
(A slice whose buffer is written while it is read stays a copy: tests/unit/test_slice_view.c,
on graphs built by hand, since the in-place ops of today's passes take only inputs that no
other node reads.)

usage: /usr/bin/python3 tests/py/slice_views.py FSC FSEXEC [LIBFS_CUDAEMU]
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import load_safetensors  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
D, H = 8, 16
MODEL = """model sv {
  dim B = 4, D = %d, H = %d, K = 3, L = 4;
  input x: f32[B, D];
  input y: i32[B];
  param w: [L, D, H] = normal(0.2);
  param pos: [6, D] = normal(0.3);
  param wo: [H, K] = normal(0.2);
  h = relu((x + pos[1:5][0]) @ w[1]);
  h2 = relu((x + pos[2]) @ w[2]);
  loss = cross_entropy((h + h2) @ wo, y);
}
train { optimizer sgd(lr = 0.1, momentum = 0.9); }
""" % (D, H)
GPT2 = [os.path.join(ROOT, "samples", "gpt2.fsm"), "-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D",
        "V=256", "-D", "B=4", "--microbatches", "2"]


def run(cmd, env=None, stdout_only=False):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE if stdout_only else subprocess.STDOUT,
                       text=True, timeout=600, env=env)
    if r.returncode:
        sys.exit("FAIL (exit %d): %s\n%s%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:], r.stderr or ""))
    return r.stdout


def views_in_ir(fsc, args):
    ir = run([fsc, *args, "--emit", "ir"], stdout_only=True)
    return sum(" = slice_view(" in line for line in ir.splitlines())


def mem(fsc, args):
    return json.loads(run([fsc, *args, "--mem=json"], stdout_only=True))


def train(fsexec, plan, log, weights, steps, flags=(), env=None):
    out = run([fsexec, plan, "--steps", str(steps), "--log", log, "--save-weights", weights, *flags], env)
    with open(log) as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    with open(weights, "rb") as f:
        return losses, f.read(), out


def same_run(what, a, b):
    if a[0] != b[0] or a[1] != b[1]:
        sys.exit("FAIL %s: views and copies train apart: losses %s and %s%s" % (what, a[0], b[0], "" if a[1] == b[1]
                                                                                else ", and the weights differ"))


def params_model(fsc, fsexec, emu, P):
    with open(P("sv.fsm"), "w") as f:
        f.write(MODEL)
    src = [P("sv.fsm")]
    on, off = views_in_ir(fsc, src), views_in_ir(fsc, src + ["--slice_views", "0"])
    if on != 5 or off != 0:
        sys.exit("FAIL slice_view nodes: %d with views (want 5), %d without (want 0)" % (on, off))
    mv, mc = mem(fsc, src), mem(fsc, src + ["--slice_views", "0"])
    saved = mc["saved_outside_blocks"] - mv["saved_outside_blocks"]
    if saved != 2 * D * H * 4 or mv["arena_bytes"] > mc["arena_bytes"]:
        sys.exit("FAIL --mem: views save %d bytes for the backward fewer (want 2 x %d x %d x 4 = %d); arena %d, "
                 "copies' %d" % (saved, D, H, 2 * D * H * 4, mv["arena_bytes"], mc["arena_bytes"]))
    print("ok   1. 5 slices of params are views; --mem: the saved w[1], w[2] copies gone (%d bytes), arena %d <= %d"
          % (saved, mv["arena_bytes"], mc["arena_bytes"]))
    run([fsc, *src, "-q", "-o", P("views.plan")])
    run([fsc, *src, "-q", "-o", P("copies.plan"), "--slice_views", "0"])
    cpu = train(fsexec, P("views.plan"), P("v.jsonl"), P("v.st"), 4, ["--device", "cpu"])
    same_run("on the CPU", cpu, train(fsexec, P("copies.plan"), P("c.jsonl"), P("c.st"), 4, ["--device", "cpu"]))
    print("ok   1. CPU: 4 steps with views equal those with copies, every loss and weight byte")
    if not emu:
        return
    env = dict(os.environ, FS_CUDA_BACKEND=emu, FS_CUDA_EMU_MEASURE="0")
    dev = train(fsexec, P("views.plan"), P("ve.jsonl"), P("ve.st"), 4, ["--device", "cuda"], env)
    if "device: cuda" not in dev[2]:
        sys.exit("FAIL the emulated run did not run on the CUDA backend:\n%s" % dev[2][-2000:])
    same_run("on cuda-emu", dev, train(fsexec, P("copies.plan"), P("ce.jsonl"), P("ce.st"), 4, ["--device", "cuda"],
                                       env))
    worst = max(abs(a - b) / abs(b) for a, b in zip(dev[0], cpu[0]))
    wd, wc = load_safetensors(P("ve.st")), load_safetensors(P("v.st"))
    werr = max(float((wd[k].double() - wc[k].double()).abs().max() / wc[k].double().abs().max()) for k in wc)
    if worst > 1e-5 or werr > 1e-5:
        sys.exit("FAIL cuda-emu against the CPU: losses %.1e, weights %.1e apart" % (worst, werr))
    print("ok   1. cuda-emu: views equal copies to the byte, and the CPU run within %.1e" % max(worst, werr))


def microbatches(fsc, fsexec, P):
    on = views_in_ir(fsc, GPT2)
    if on != 4:
        sys.exit("FAIL --microbatches 2: %d slice_view nodes (want 4: tokens' and targets' rows per micro-batch)" % on)
    run([fsc, *GPT2, "-q", "-o", P("mbv.plan")])
    run([fsc, *GPT2, "-q", "-o", P("mbc.plan"), "--slice_views", "0"])
    data = P("tokens.bin")
    np.random.default_rng(3).integers(0, 256, size=4000, dtype=np.uint16).tofile(data)
    flags = ["--device", "cpu", "--data", data]
    same_run("GPT-2, 2 micro-batches", train(fsexec, P("mbv.plan"), P("mv.jsonl"), P("mv.st"), 3, flags),
             train(fsexec, P("mbc.plan"), P("mc.jsonl"), P("mc.st"), 3, flags))
    av, ac = mem(fsc, GPT2)["arena_bytes"], mem(fsc, GPT2 + ["--slice_views", "0"])["arena_bytes"]
    if av > ac:
        sys.exit("FAIL --microbatches 2: the arena with views, %d, is larger than with copies, %d" % (av, ac))
    print("ok   2. GPT-2, 2 micro-batches: the inputs' rows are 4 views; 3 steps equal the copies' to the byte; "
          "arena %d <= %d" % (av, ac))


def main():
    if len(sys.argv) not in (3, 4):
        sys.exit("usage: slice_views.py FSC FSEXEC [LIBFS_CUDAEMU]")
    fsc, fsexec = sys.argv[1], sys.argv[2]
    emu = os.path.abspath(sys.argv[3]) if len(sys.argv) == 4 else None
    work = tempfile.mkdtemp(prefix="fs_slice_views_")
    P = lambda *a: os.path.join(work, *a)  # noqa: E731
    try:
        params_model(fsc, fsexec, emu, P)
        microbatches(fsc, fsexec, P)
        print("slice_views: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
