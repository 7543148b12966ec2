#!/usr/bin/python3
"""cross_entropy(..., ignore_index) under every strategy: the mean over the targets the
whole global batch counts (DESIGN.md invariant 1; passes/xent_count.c).

Masked-LM-like data: each row keeps a different number of its targets (0 to T), so the
micro-batches and ranks of a step count different numbers; in step 2 the rows of one
quarter of the batch (one rank's micro-batch at world 2 x M 2) are all ignored, and in
step 4 every row is (a step that counts nothing: loss 0 and zero gradient, not NaN).
(a) World 1, fp32, 4 AdamW steps against a float64 PyTorch model trained on the same
    batches with the same init: every step's loss (F.cross_entropy(ignore_index=-100)
    over the whole batch; 0 in the all-ignored step) and the weights after, to 1e-5.
(b) The same global batch split: micro-batches 2 and 4 (and 4 unfused: --fuse_loss 0),
    ddp, zero2 (with 2 micro-batches) and fsdp at world 2, 2 pipeline stages (1F1B, 4
    micro-batches; and ZB-H1 with every micro-batch recomputing its stage), and 2 stages x 2
    data-parallel ranks: losses and weights equal to (a)'s run to fp32 rounding (1e-5; the
    per-micro-batch mean of before misses by 4e-2 in the losses and 0.2 in the weights).
    The count's all-reduce comes before the first backward node (fsc --emit ir).
    Two losses on the same targets (with heads of their own) train at world 2 x 2 micro-batches as at world 1.
(c) The evaluation program (--val-data) at world 2 logs (a)'s val_loss.
(d) CUDA ranks on the emulator (FS_CUDA_BACKEND=libfs_cudaemu.so): world 2 ddp with 2
    micro-batches trains as the CPU ranks do (target_count, the fused loss with per_row).

usage: ignore_index.py FSC FSEXEC [LIBFS_CUDAEMU]   (/usr/bin/python3 with torch; mpirun)
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "py"))
sys.dont_write_bytecode = True
from models import load_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402
from trainrun import load_stages, run as trainrun_run  # noqa: E402


def run(cmd):
    return trainrun_run(cmd).stdout

MODEL = """model ig {
  dim B = 16, T = 6, V = 24, C = 16, L = 2;
  input tokens: i32[B, T];
  input targets: i32[B, T];
  layer Block {
    param ln.w: [C] = ones;
    param ln.b: [C] = zeros;
    param fc.w: [C, C] = normal(0.3);
    forward(h) {
      return h + gelu(layernorm(h, ln.w, ln.b) @ fc.w);
    }
  }
  param wte: [V, C] = normal(0.5);
  param head: [C, V] = normal(0.3);
  x = Block[L](embedding(wte, tokens));
  loss = cross_entropy(x @ head, targets, ignore_index = -100);
}
train { optimizer adamw(lr = 0.02, beta1 = 0.9, beta2 = 0.999, eps = 1e-6, weight_decay = 0.1); }
"""
# Two losses on the same targets (one count serves both) and a head of their own each.
HEAD = "  param head: [C, V] = normal(0.3);\n"
TWO = MODEL.replace("model ig", "model two").replace(HEAD, HEAD + HEAD.replace("head", "head2")).replace(
    "loss = cross_entropy(x @ head, targets, ignore_index = -100);",
    "loss = cross_entropy(x @ head, targets, ignore_index = -100) + 0.5 * cross_entropy(x @ head2, targets, "
    "ignore_index = -100);")
STEPS, B, T, V, L = 4, 16, 6, 24, 2
TOL = 1e-5


def data(rng):
    tok = rng.integers(0, V, size=(STEPS * B, T)).astype(np.int32)
    tg = rng.integers(0, V, size=(STEPS * B, T)).astype(np.int32)
    for r in range(STEPS * B):
        tg[r, (r * 5) % (T + 1):] = -100  # row r keeps its first (5 r mod 7) targets
    tg[B + B // 4:B + B // 2] = -100       # step 2: rank 0's second micro-batch (world 2 x M 2) counts nothing
    tg[3 * B:4 * B] = -100                 # step 4: nothing counts
    return tok, tg


def feed(P):
    """fsexec's --data (and --val-data) for the two .npy inputs."""
    return ",".join("%s=%s" % (name, P(name + ".npy")) for name in ("tokens", "targets"))


def train(fsc, fsexec, P, tag, opts, world=1, extra=(), model="ig.fsm"):
    plan, out, log = P(tag + ".plan"), P(tag + ".safetensors"), P(tag + ".jsonl")
    run([fsc, P(model), *opts, "--world", str(world), "-q", "-o", plan])
    run([fsexec, *(["--nproc", str(world)] if world > 1 else []), plan, "--data", feed(P), "--data-order", "sequential",
         "--steps", str(STEPS), "--threads", "1", "--log", log, "--save-weights", out, *extra])
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    losses, val = [r["loss"] for r in rows if "loss" in r], [r["val_loss"] for r in rows if "val_loss" in r]
    return losses, load_stages(out)[0], val


def pytorch(w0, tok, tg):
    """float64: the loss is the sum over the batch's counted targets over their count (F.cross_entropy's
    mean with ignore_index, checked against it), 0 when none counts; AdamW as fsexec's."""
    p = {n: torch.nn.Parameter(t.double().clone()) for n, t in w0.items()}
    opt = torch.optim.AdamW(list(p.values()), lr=0.02, betas=(0.9, 0.999), eps=1e-6, weight_decay=0.1)
    losses = []
    for s in range(STEPS):
        x = torch.from_numpy(tok[s * B:(s + 1) * B]).long()
        y = torch.from_numpy(tg[s * B:(s + 1) * B]).long()
        h = p["wte"][x]
        for i in range(L):
            z = F.layer_norm(h, (h.shape[-1],), p["h.%d.ln.w" % i], p["h.%d.ln.b" % i], eps=1e-5)
            h = h + F.gelu(z @ p["h.%d.fc.w" % i], approximate="tanh")
        logits = (h @ p["head"]).reshape(-1, V)
        n = int((y != -100).sum())
        loss = F.cross_entropy(logits, y.reshape(-1), ignore_index=-100, reduction="sum") / max(n, 1)
        if n:
            mean = F.cross_entropy(logits, y.reshape(-1), ignore_index=-100)
            assert abs(float(mean) - float(loss)) < 1e-12, (float(mean), float(loss))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses, {n: t.detach() for n, t in p.items()}


def rel(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


def close(tag, got, want, tol=TOL):
    (gl, gw), (wl, ww) = got[:2], want[:2]
    if len(gl) != STEPS or set(gw) != set(ww) or any(x != x for x in gl):
        sys.exit("FAIL %s: losses %s, params %s; want %s, %s" % (tag, gl, sorted(gw), wl, sorted(ww)))
    lerr = max(abs(a - b) / max(abs(b), 1e-30) if b else abs(a) for a, b in zip(gl, wl))
    werr, worst = max((rel(gw[n], ww[n]), n) for n in ww)
    if lerr > tol or werr > tol:
        sys.exit("FAIL %s: losses %s, want %s (rel %.1e); param %s rel %.1e > %.0e" % (tag, gl, wl, lerr, worst, werr,
                                                                                       tol))
    return lerr, werr


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    emu = sys.argv[3] if len(sys.argv) > 3 else None
    quiet_mpi_leaks()
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    work = tempfile.mkdtemp(prefix="ignore_index.")
    try:
        def P(name):
            return os.path.join(work, name)
        tok, tg = data(np.random.default_rng(5))
        for name, a in (("tokens", tok), ("targets", tg)):
            np.save(P(name + ".npy"), a)
        for name, text in (("ig.fsm", MODEL), ("two.fsm", TWO)):
            with open(P(name), "w") as f:
                f.write(text)
        run([fsc, P("ig.fsm"), "-q", "-o", P("w0.plan")])  # the init, for PyTorch
        run([fsexec, P("w0.plan"), "--steps", "0", "--save-weights", P("w0.safetensors"), "--data", feed(P)])
        want = pytorch(load_safetensors(P("w0.safetensors")), tok, tg)
        val_feed = ["--val-data", feed(P), "--eval-batches", "3", "--eval-every", "2"]
        ref = train(fsc, fsexec, P, "ref", [], extra=val_feed)
        lerr, werr = close("world 1 against PyTorch", ref, want)
        if ref[0][3] != 0.0 or not ref[0][0] > 0:
            sys.exit("FAIL: the all-ignored step's loss is %r, not 0 (losses %s)" % (ref[0][3], ref[0]))
        print("ok   world 1: %d AdamW steps, losses %s rel %.1e and weights rel %.1e of PyTorch's "
              "cross_entropy(ignore_index) over the whole batch (an all-ignored step: loss 0)" %
              (STEPS, ["%.4f" % x for x in ref[0]], lerr, werr))
        for opts in (["--world", "2", "--shard", "zero2", "--microbatches", "2"],
                     ["--world", "4", "--stages", "2", "--shard", "ddp", "--microbatches", "2"]):
            ir = run([fsc, P("ig.fsm"), *opts, "--emit", "ir"]).split("# stage ")[-1].splitlines()  # the loss's stage
            count = [i for i, line in enumerate(ir) if "targets_counted: f32[] = all_reduce(" in line]
            backward = [i for i, line in enumerate(ir) if "[backward]" in line]
            if len(count) != 1 or not backward or count[0] > backward[0]:
                sys.exit("FAIL %s: the count's all-reduce (lines %s) must come once, before the first backward node "
                         "(line %s)" % (" ".join(opts), count, backward[:1]))
        print("ok   the global count is all-reduced once, before the first backward node (zero2; 2 stages x ddp 2)")
        cases = [("microbatches 2", ["--microbatches", "2"], 1), ("microbatches 4", ["--microbatches", "4"], 1),
                 ("microbatches 4 unfused", ["--microbatches", "4", "--fuse_loss", "0"], 1)]
        if shutil.which("mpirun"):
            cases += [("ddp world 2", ["--shard", "ddp"], 2),
                      ("zero2 world 2 x microbatches 2", ["--shard", "zero2", "--microbatches", "2"], 2),
                      ("fsdp world 2", ["--shard", "fsdp"], 2),
                      ("2 stages x microbatches 4", ["--stages", "2", "--microbatches", "4"], 2),
                      ("2 stages zb1, checkpoint always", ["--stages", "2", "--microbatches", "4", "--schedule", "zb1",
                                                           "--checkpoint", "always"], 2),
                      ("2 stages x ddp 2 x microbatches 2", ["--stages", "2", "--microbatches", "2", "--shard", "ddp"],
                       4)]
        else:
            print("SKIP world 2 and pipeline stages: mpirun not found")
        for tag, opts, world in cases:
            got = train(fsc, fsexec, P, tag.replace(" ", "_"), opts, world)
            lerr, werr = close(tag, got, ref)
            print("ok   %-36s losses rel %.1e, weights rel %.1e of world 1" % (tag + ":", lerr, werr))
        if shutil.which("mpirun"):
            one = train(fsc, fsexec, P, "two_w1", [], model="two.fsm")
            got = train(fsc, fsexec, P, "two_w2", ["--shard", "ddp", "--microbatches", "2"], 2, model="two.fsm")
            lerr, werr = close("two losses on the same targets", got, one)
            print("ok   two losses on the same targets, ddp world 2 x microbatches 2: losses rel %.1e, weights rel "
                  "%.1e of world 1" % (lerr, werr))
            got = train(fsc, fsexec, P, "eval_w2", ["--shard", "ddp"], 2, extra=val_feed)
            if len(got[2]) != len(ref[2]) or max(abs(a - b) / b for a, b in zip(got[2], ref[2])) > TOL:
                sys.exit("FAIL val_loss at world 2: %s, world 1's %s" % (got[2], ref[2]))
            print("ok   val_loss at world 2 (ddp): %s, world 1's to %.0e" % (["%.4f" % x for x in got[2]], TOL))
        if emu and shutil.which("mpirun"):
            os.environ.update(FS_CUDA_BACKEND=os.path.abspath(emu), FS_CUDA_EMU_ORDER="forward")
            for tag, opts in (("cuda-emu ddp world 2 x microbatches 2", ["--microbatches", "2"]),
                              ("cuda-emu unfused", ["--microbatches", "2", "--fuse_loss", "0"])):
                got = train(fsc, fsexec, P, tag.replace(" ", "_"), ["--shard", "ddp", *opts], 2,
                            extra=["--device", "cuda"])
                lerr, werr = close(tag, got, ref)
                print("ok   %-36s losses rel %.1e, weights rel %.1e of world 1 on CPU" % (tag + ":", lerr, werr))
        print("ignore_index: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
