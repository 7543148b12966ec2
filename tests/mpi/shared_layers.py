#!/usr/bin/python3
"""A layer instance applied more than once (frontend/instance.c): one set of params.

(a) `h = Block(x @ inp) as shared; h = shared(h * 0.5);` trains 5 AdamW steps like the
    PyTorch model whose forward calls one nn.Module twice (float64, same init and .npy
    batches): every step's loss and the weights after the last, to 1e-5. The plan holds
    one copy of the block's params and one gradient (the sum over both uses).
(b) With `recompute Block` the losses and weights are bit for bit (a)'s, and each use
    reruns on its own before its backward: the bytes recomputed at once are fewer than
    the two uses' activations that are no longer saved.
(c) Under fsdp at world 2 (two ranks under mpirun), with and without recompute: the same
    training to rounding (1e-5).
(d) A universal-transformer stack, `Block[2](h) as u; h = u(h);` between two plain
    blocks, over 2 pipeline stages (1F1B, 2 micro-batches; the stages pass keeps u.0 and
    u.1 on one stage) trains like one stage.

usage: shared_layers.py FSC FSEXEC   (needs /usr/bin/python3's torch; mpirun for (c), (d))
"""
import json
import os
import shutil
import subprocess
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

SHARED = """model shared {
  dim B = 8, D = 6, C = 8, K = 4;
  input x: f32[B, D];
  input y: i32[B];
  layer Block {
    param ln.w: [C] = ones;
    param ln.b: [C] = zeros;
    param fc.w: [C, 2 * C] = normal(0.3);
    param fc.b: [2 * C] = zeros;
    param out.w: [2 * C, C] = normal(0.3);
    forward(h) {
      return h + gelu(layernorm(h, ln.w, ln.b) @ fc.w + fc.b) @ out.w;
    }
  }
  param inp: [D, C] = normal(0.4);
  param head: [C, K] = normal(0.3);
  h = Block(x @ inp) as shared;
  h = shared(h * 0.5);
  loss = cross_entropy(h @ head, y);
}
train { optimizer adamw(lr = 0.02, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.1); }
"""

UNIVERSAL = """model universal {
  dim B = 8, D = 6, C = 8, K = 4;
  input x: f32[B, D];
  input y: i32[B];
  layer Block {
    param w: [C, C] = normal(0.4);
    forward(h) {
      return h + tanh(h @ w);
    }
  }
  param inp: [D, C] = normal(0.4);
  param head: [C, K] = normal(0.3);
  h = Block(x @ inp) as pre;
  h = Block[2](h) as u;
  h = u(h);
  h = Block(h) as post;
  loss = cross_entropy(h @ head, y);
}
"""
STEPS, N, B = 5, 24, 8


def run(cmd, world=1):
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    if world > 1:
        cmd = ["mpirun", "--oversubscribe", "-np", str(world), *cmd]
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300, env=env)
    if r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def train(fsc, fsexec, P, model, tag, opts, world=1):
    plan, out, log = P(tag + ".plan"), P(tag + ".safetensors"), P(tag + ".jsonl")
    run([fsc, P(model), *opts, "--world", str(world), "-q", "-o", plan])
    run([fsexec, plan, "--data", "x=%s,y=%s" % (P("x.npy"), P("y.npy")), "--data-order", "sequential", "--steps",
         str(STEPS), "--threads", "1", "--log", log, "--save-weights", out], world)
    with open(log) as f:
        losses = [json.loads(line)["loss"] for line in f if line.strip()]
    if os.path.exists(out + ".index.json"):  # a pipeline's weights: one shard file per stage
        with open(out + ".index.json") as f:
            where = json.load(f)["weight_map"]
        files = {f: load_safetensors(P(f)) for f in set(where.values())}
        return losses, {name: files[f][name] for name, f in where.items()}, None
    with open(out, "rb") as f:
        raw = f.read()
    return losses, load_safetensors(out), raw


class Block(torch.nn.Module):
    def __init__(self, w, prefix):
        super().__init__()
        for name in ("ln.w", "ln.b", "fc.w", "fc.b", "out.w"):
            self.register_parameter(name.replace(".", "_"), torch.nn.Parameter(w[prefix + name].double().clone()))

    def forward(self, h):
        z = F.layer_norm(h, (h.shape[-1],), self.ln_w, self.ln_b, eps=1e-5)
        return h + F.gelu(z @ self.fc_w + self.fc_b, approximate="tanh") @ self.out_w


class Model(torch.nn.Module):
    def __init__(self, w):
        super().__init__()
        self.shared = Block(w, "shared.0.")
        self.inp = torch.nn.Parameter(w["inp"].double().clone())
        self.head = torch.nn.Parameter(w["head"].double().clone())

    def forward(self, x):
        h = self.shared(x @ self.inp)
        return self.shared(h * 0.5) @ self.head  # the same module, called twice


def rel(a, b):
    return float((a.double() - b.double()).norm() / max(float(b.double().norm()), 1e-30))


def pytorch(w0, x, y):
    m = Model(w0)
    opt = torch.optim.AdamW(m.parameters(), lr=0.02, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.1)
    X, Y = torch.from_numpy(x).double(), torch.from_numpy(y).long()
    losses = []
    for s in range(1, STEPS + 1):
        rows = [((s - 1) * B + b) % N for b in range(B)]
        loss = F.cross_entropy(m(X[rows]), Y[rows])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    p = dict(m.named_parameters())
    final = {"inp": p["inp"], "head": p["head"]}
    for name in ("ln.w", "ln.b", "fc.w", "fc.b", "out.w"):
        final["shared.0." + name] = p["shared." + name.replace(".", "_")]
    return losses, {n: t.detach() for n, t in final.items()}


def close(tag, got, want, tol):
    (gl, gw, _), (wl, ww) = got, want
    lerr = max(abs(a - b) / abs(b) for a, b in zip(gl, wl))
    werr = max(rel(gw[n], ww[n]) for n in ww)
    if len(gl) != STEPS or set(gw) != set(ww) or lerr > tol or werr > tol:
        sys.exit("FAIL %s: losses %s, want %s (rel %.1e); params %s rel %.1e" % (tag, gl, wl, lerr, sorted(gw), werr))
    return lerr, werr


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    quiet_mpi_leaks()
    work = tempfile.mkdtemp(prefix="shared_layers.")
    try:
        def P(name):
            return os.path.join(work, name)
        rng = np.random.default_rng(11)
        x, y = rng.normal(size=(N, 6)).astype(np.float32), rng.integers(0, 4, size=N).astype(np.int32)
        np.save(P("x.npy"), x)
        np.save(P("y.npy"), y)
        for name, src in (("shared.fsm", SHARED), ("universal.fsm", UNIVERSAL)):
            with open(P(name), "w") as f:
                f.write(src)
        run([fsc, P("shared.fsm"), "-q", "-o", P("w0.plan")])
        run([fsexec, P("w0.plan"), "--steps", "0", "--save-weights", P("w0.safetensors")])
        want = pytorch(load_safetensors(P("w0.safetensors")), x, y)
        ref = train(fsc, fsexec, P, "shared.fsm", "ref", [])
        lerr, werr = close("world 1 against PyTorch", ref, want, 1e-5)
        if not want[0][-1] < want[0][0]:
            sys.exit("FAIL: the loss did not fall: %s" % want[0])
        print("ok   one block applied twice: %d AdamW steps, losses rel %.1e (%.4f -> %.4f) and weights rel %.1e of "
              "PyTorch calling one module twice; %d params, one copy" % (STEPS, lerr, want[0][0], want[0][-1], werr,
                                                                         len(ref[1])))
        rc = train(fsc, fsexec, P, "shared.fsm", "recompute", ["--recompute", "Block"])
        if rc[0] != ref[0] or rc[2] != ref[2]:
            sys.exit("FAIL recompute Block: losses %s, without %s; weights %s" %
                     (rc[0], ref[0], "equal" if rc[2] == ref[2] else "differ"))
        mem = {}
        for tag, opts in (("none", []), ("recompute", ["--recompute", "Block"])):
            out = run([fsc, P("shared.fsm"), "--mem=json", "-q", *opts])
            mem[tag] = {c["key"]: c["max"] for c in json.loads(out[out.index("{"):])["categories"]}
        dropped = mem["none"]["saved"] - mem["recompute"]["saved"]
        if not 0 < mem["recompute"]["recompute"] < dropped:
            sys.exit("FAIL recompute memory: saved %d -> %d bytes, but %d bytes recomputed at once (both uses' "
                     "activations are %d)" % (mem["none"]["saved"], mem["recompute"]["saved"],
                                              mem["recompute"]["recompute"], dropped))
        print("ok   recompute Block: bit for bit without recompute; saved for backward %d -> %d bytes, the uses "
              "rerun one at a time (%d bytes at most)" % (mem["none"]["saved"], mem["recompute"]["saved"],
                                                          mem["recompute"]["recompute"]))
        if not shutil.which("mpirun"):
            print("SKIP fsdp world 2 and pipeline stages: mpirun not found")
            return
        for tag, opts in (("fsdp", ["--shard", "fsdp"]), ("fsdp_recompute", ["--shard", "fsdp", "--recompute", "Block"])):
            got = train(fsc, fsexec, P, "shared.fsm", tag, opts, world=2)
            lerr, werr = close(tag + " world 2", got, (ref[0], ref[1]), 1e-5)
            print("ok   %s at world 2 under mpirun: losses rel %.1e, weights rel %.1e of world 1" %
                  (" ".join(opts), lerr, werr))
        one = train(fsc, fsexec, P, "universal.fsm", "uni1", [])
        two = train(fsc, fsexec, P, "universal.fsm", "uni2", ["--stages", "2", "--microbatches", "2"], world=2)
        lerr, werr = close("universal over 2 stages", two, (one[0], one[1]), 1e-5)
        print("ok   Block[2] as u applied twice over 2 pipeline stages: losses rel %.1e, weights rel %.1e of one stage" %
              (lerr, werr))
        print("shared_layers: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
