#!/usr/bin/python3
"""A third data input, and fsexec --predict, against PyTorch.

The model: inputs x (f32 [B, D]), y (i32 [B]) and a third, s (f32 [B, D], added to x),
two hidden blocks, outputs `logits` and `h` (the last hidden state).
1. Three inputs train: --data x=...,y=... --data s=... (repeated), 4 SGD steps with
   --data-order sequential; every loss equals PyTorch float64's on the same batches and
   init (1e-5 relative).
2. --predict --load-weights W --data x=,s= --out P.npy (y left out: only the loss reads
   it): P.logits.npy and P.h.npy hold one row per sample in data order (N = 52, not a
   multiple of B = 8: the last batch is cut), equal to a PyTorch forward of W (1e-5),
   and to the evaluation program's: --val-data over the first 48 samples gives the loss
   the predicted logits give. World 2 (fsdp; with mpirun) and a 2-stage
   pipeline predict the same values; --resume CKPT predicts what --load-weights of the
   same step's weights does; a single output writes --out itself.
3. Errors: an input an output reads left out, --out without --predict, --predict
   without params, a model without outputs, a file of the wrong dtype (naming the input).

usage: /usr/bin/python3 tests/py/predict.py FSC FSEXEC   (numpy, torch; mpirun for world 2)
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import load_safetensors  # noqa: E402
from npy_data import run  # noqa: E402

N, D, H, K, B, STEPS, LR = 52, 16, 32, 4, 8, 4, 0.1
MODEL = """model p {
  dim B = %d, D = %d, H = %d, K = %d, L = 2;
  input x: f32[B, D];
  input y: i32[B];
  input s: f32[B, D];
  layer Hidden {
    param w: [H, H] = normal(0.2);
    param b: [H] = zeros;
    forward(h) { return relu(h @ w + b); }
  }
  param w_in: [D, H] = normal(0.25);
  param b_in: [H] = zeros;
  param w_out: [H, K] = normal(0.2);
  param b_out: [K] = zeros;
  h = relu((x + s) @ w_in + b_in);
  h = Hidden[L](h) as hidden;
  logits = h @ w_out + b_out;
  loss = cross_entropy(logits, y);
  output logits;
  %s
}
train { optimizer sgd(lr = %g, momentum = 0); }
"""


def forward(p, x, s):
    h = torch.relu((x + s) @ p["w_in"] + p["b_in"])
    for k in range(2):
        h = torch.relu(h @ p["hidden.%d.w" % k] + p["hidden.%d.b" % k])
    return h @ p["w_out"] + p["b_out"], h


def torch_losses(init, x, y, s):
    p = {k: torch.from_numpy(np.asarray(v, np.float64)).requires_grad_(True) for k, v in init.items()}
    X, Y, S = (torch.from_numpy(a) for a in (x.astype(np.float64), y.astype(np.int64), s.astype(np.float64)))
    out = []
    for step in range(1, STEPS + 1):
        rows = [((step - 1) * B + b) % N for b in range(B)]
        loss = torch.nn.functional.cross_entropy(forward(p, X[rows], S[rows])[0], Y[rows])
        for v in p.values():
            v.grad = None
        loss.backward()
        with torch.no_grad():
            for v in p.values():
                v -= LR * v.grad
        out.append(loss.item())
    return out


def close(a, b, tol=1e-5):
    return a.shape == b.shape and np.allclose(a, b, rtol=tol, atol=tol)


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    have_mpi = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="fs_predict_")
    P = lambda *a: os.path.join(work, *a)  # noqa: E731
    try:
        rng = np.random.default_rng(7)
        x = rng.standard_normal((N, D))
        s = 0.5 * rng.standard_normal((N, D)).astype(np.float32)
        y = rng.integers(0, K, N)
        np.save(P("x.npy"), x), np.save(P("s.npy"), s), np.save(P("y.npy"), y)
        np.save(P("xi.npy"), y)
        with open(P("p.fsm"), "w") as f:
            f.write(MODEL % (B, D, H, K, "output h;", LR))
        with open(P("one.fsm"), "w") as f:
            f.write(MODEL % (B, D, H, K, "", LR))
        with open(P("none.fsm"), "w") as f:
            f.write(MODEL.replace("  output logits;\n", "") % (B, D, H, K, "", LR))
        run([fsc, P("p.fsm"), "-q", "-o", P("p.plan")])
        run([fsc, P("one.fsm"), "-q", "-o", P("one.plan")])
        run([fsc, P("none.fsm"), "-q", "-o", P("none.plan")])
        data = ["--data", "x=%s,y=%s" % (P("x.npy"), P("y.npy")), "--data", "s=" + P("s.npy")]
        pdata = ["--data", "x=%s,s=%s" % (P("x.npy"), P("s.npy"))]

        # 1. Three inputs train as PyTorch does.
        run([fsexec, P("p.plan"), "--steps", "0", "--save-weights", P("init.st")])
        run([fsexec, P("p.plan"), "--steps", str(STEPS), "--data-order", "sequential", "--log", P("log.jsonl"),
             "--save-weights", P("w.st"), "--checkpoint-dir", P("ck")] + data)
        with open(P("log.jsonl")) as f:
            got = [json.loads(line)["loss"] for line in f if line.strip()]
        want = torch_losses(load_safetensors(P("init.st")), x, y, s)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
        if len(got) != STEPS or worst > 1e-5:
            sys.exit("FAIL three inputs: losses %s, PyTorch's %s" % (got, want))
        print("ok   a third input (--data repeated): %d losses within %.1e of PyTorch float64" % (STEPS, worst))

        # 2. Predictions: against PyTorch, the evaluation program, world 2, a pipeline, --resume.
        out = run([fsexec, P("p.plan"), "--predict", "--load-weights", P("w.st"), "--out", P("pred.npy")] + pdata)
        if "pred.logits.npy (logits)" not in out or "pred.h.npy (h)" not in out:
            sys.exit("FAIL --predict's message names its files: %s" % out)
        logits, h = np.load(P("pred.logits.npy")), np.load(P("pred.h.npy"))
        w = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in load_safetensors(P("w.st")).items()}
        X = torch.from_numpy(x.astype(np.float32).astype(np.float64))
        tl, th = forward(w, X, torch.from_numpy(s.astype(np.float64)))
        if logits.dtype != np.float32 or not close(logits, tl.numpy()) or not close(h, th.numpy()):
            sys.exit("FAIL --predict: logits %s %s against PyTorch's %s" % (logits.dtype, logits.shape, tuple(tl.shape)))
        print("ok   --predict: logits (%d, %d) and h (%d, %d) in data order equal a PyTorch forward of the weights"
              % (logits.shape + h.shape))
        out = run([fsexec, P("p.plan"), "--steps", "0", "--load-weights", P("w.st"), "--val-data",
                   "x=%s,y=%s,s=%s" % (P("x.npy"), P("y.npy"), P("s.npy")), "--eval-batches", str(48 // B)] + data)
        val = [float(line.split("val_loss")[1].split()[0]) for line in out.splitlines() if "val_loss" in line]
        lt = torch.from_numpy(logits[:48].astype(np.float64))
        ce = torch.nn.functional.cross_entropy(lt, torch.from_numpy(y[:48].astype(np.int64))).item()
        if len(val) != 1 or abs(val[0] - ce) > 2e-6 * abs(ce):
            sys.exit("FAIL the evaluation program's loss %s, the predicted logits' %.6f" % (val, ce))
        print("ok   the evaluation program's val_loss over 48 samples, %.6f, is the predicted logits' loss" % ce)
        run([fsexec, P("one.plan"), "--predict", "--load-weights", P("w.st"), "--out", P("single.npy")] + pdata)
        if not np.array_equal(np.load(P("single.npy")), logits):
            sys.exit("FAIL one output: --out itself holds the logits")
        print("ok   one output: --out FILE.npy itself")
        run([fsexec, P("p.plan"), "--predict", "--resume", P("ck"), "--out", P("ck.npy")] + pdata)
        if not np.array_equal(np.load(P("ck.logits.npy")), logits):
            sys.exit("FAIL --resume: other predictions than --load-weights of the same step's weights")
        print("ok   --predict --resume CKPT: the predictions of the same step's weights")
        if have_mpi:
            for name, flags in (("world 2, fsdp", ["--world", "2", "--shard", "fsdp"]),
                                ("2-stage pipeline", ["--world", "2", "--stages", "2", "--microbatches", "2"])):
                plan = P(name.split(",")[0].replace(" ", "_") + ".plan")
                run([fsc, P("p.fsm"), "-q", "-o", plan] + flags)
                run([fsexec, "--nproc", "2", plan, "--predict", "--load-weights", P("w.st"), "--out", P("w2.npy")]
                    + pdata)
                a, b = np.load(P("w2.logits.npy")), np.load(P("w2.h.npy"))
                if not close(a, logits, 1e-6) or not close(b, h, 1e-6):
                    sys.exit("FAIL %s: predictions differ from world 1's by %g" % (name, abs(a - logits).max()))
                print("ok   --predict on a %s: world 1's predictions" % name)
                run([fsexec, "--nproc", "2", plan, "--steps", str(STEPS), "--data-order", "sequential", "--log",
                     P("w2.jsonl")] + data)
                with open(P("w2.jsonl")) as f:
                    w2 = [json.loads(line)["loss"] for line in f if line.strip()]
                if len(w2) != STEPS or max(abs(a - b) / abs(b) for a, b in zip(w2, got)) > 1e-6:
                    sys.exit("FAIL %s: three inputs train to losses %s, world 1's %s" % (name, w2, got))
                print("ok   three inputs on a %s (each stage fed the inputs it reads): world 1's losses" % name)
        else:
            print("skip world 2 and pipeline: no mpirun")

        # 3. Errors.
        cases = [
            ([fsexec, P("p.plan"), "--predict", "--load-weights", P("w.st"), "--out", P("e.npy"), "--data",
              "s=" + P("s.npy")], 1, ["no file for input 'x'"]),
            ([fsexec, P("p.plan"), "--out", P("e.npy")] + data, 2, ["--out names --predict's file"]),
            ([fsexec, P("p.plan"), "--predict", "--out", P("e.npy")] + pdata, 2, ["--predict needs trained params"]),
            ([fsexec, P("none.plan"), "--predict", "--load-weights", P("w.st"), "--out", P("e.npy")] + pdata, 1,
             ["declares none but the loss", "output NAME"]),
            ([fsexec, P("p.plan"), "--predict", "--load-weights", P("w.st"), "--out", P("e.npy"), "--data",
              "x=%s,s=%s" % (P("xi.npy"), P("s.npy"))], 1, ["xi.npy: input 'x' is f32, but the file holds integers"]),
        ]
        for cmd, rc, needles in cases:
            out = run(cmd, expect_rc=rc)
            missing = [n for n in needles if n not in out]
            if missing or os.path.exists(P("e.npy")):
                sys.exit("FAIL %s: the message lacks %s (or e.npy was written):\n%s" % (" ".join(cmd), missing, out))
            print("ok   %s" % out.strip().splitlines()[-1].replace(work + "/", ""))
        print("predict: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
