#!/usr/bin/python3
"""fsexec --data x=feats.npy,y=labels.npy: a classifier trains on the user's .npy arrays.

1. Data: 200 samples of 16 float64 features around 4 class centres, int64 labels (both
   converted as they load: f8 -> f32, i8 -> i32), saved with numpy's np.save.
2. samples/mlp.fsm (B = 64) trains 12 SGD steps (lr 0.1, momentum 0.9) with
   --data-order sequential: step s takes samples ((s - 1) * 64 + b) mod 200, so the
   batches wrap around the file. The same init (fsexec --steps 0 --save-weights) trains
   in PyTorch on the same batches, in float64: every step's loss matches to 1e-5
   (relative), the loss falls, and the logged accuracy is the batch's. At world 2 (each
   rank its 32 rows of the global batch; with mpirun) the losses are world 1's.
3. The same arrays in .npy format versions 2.0 and 3.0, and as float32/int32, train to
   the same step-1 loss bit for bit.
4. Bad files and --data texts get an error that names the file and input and says what
   was expected: Fortran order, big-endian, another dtype, a per-sample shape that is
   not the input's, sample counts that differ, a label outside the classes, an int64
   outside int32, a truncated file, an unknown input name, a missing input.

usage: /usr/bin/python3 tests/py/npy_data.py FSC FSEXEC   (numpy, torch; mpirun for world 2)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import load_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
N, D, K, B, STEPS, LR, MOMENTUM = 200, 16, 4, 64, 12, 0.1, 0.9


def run(cmd, expect_rc=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=quiet_mpi_leaks())
    if r.returncode != expect_rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, expect_rc, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def log_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def torch_run(init, x, y):
    """SGD on the mlp of samples/mlp.fsm (L = 2 hidden blocks) in float64: each step's loss and accuracy."""
    p = {k: v.to(torch.float64).clone().requires_grad_(True) for k, v in init.items()}
    opt = torch.optim.SGD(list(p.values()), lr=LR, momentum=MOMENTUM)
    X, Y = torch.from_numpy(x.astype(np.float32)).to(torch.float64), torch.from_numpy(y.astype(np.int64))
    out = []
    for s in range(1, STEPS + 1):
        rows = [((s - 1) * B + b) % N for b in range(B)]
        h = torch.relu(X[rows] @ p["w_in"] + p["b_in"])
        for k in range(2):
            h = torch.relu(h @ p["hidden.%d.w" % k] + p["hidden.%d.b" % k])
        logits = h @ p["w_out"] + p["b_out"]
        loss = torch.nn.functional.cross_entropy(logits, Y[rows])
        acc = (logits.argmax(-1) == Y[rows]).double().mean().item()
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append((loss.item(), acc))
    return out


def save_version(path, a, version):
    with open(path, "wb") as f:
        np.lib.format.write_array(f, np.ascontiguousarray(a), version=version)


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    have_mpi = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="npy_data.")
    try:
        def P(name):
            return os.path.join(work, name)

        rng = np.random.default_rng(7)
        centres = rng.normal(size=(K, D))
        y = rng.integers(0, K, size=N)                      # int64
        x = centres[y] + 0.8 * rng.normal(size=(N, D))       # float64
        np.save(P("x.npy"), x)
        np.save(P("y.npy"), y)
        data = "x=%s,y=%s" % (P("x.npy"), P("y.npy"))
        sample = os.path.join(ROOT, "samples", "mlp.fsm")
        run([fsc, sample, "-q", "-o", P("mlp.plan")])
        run([fsexec, P("mlp.plan"), "--steps", "0", "--save-weights", P("init.safetensors")])
        run([fsexec, P("mlp.plan"), "--data", data, "--data-order", "sequential", "--steps", str(STEPS), "--log",
             P("w1.jsonl")])
        got = log_of(P("w1.jsonl"))
        want = torch_run(load_safetensors(P("init.safetensors")), x, y)
        if len(got) != STEPS:
            sys.exit("FAIL: %d log lines for %d steps" % (len(got), STEPS))
        for s, (row, (loss, acc)) in enumerate(zip(got, want), 1):
            if abs(row["loss"] - loss) > 1e-5 * abs(loss):
                sys.exit("FAIL step %d: fsexec's loss %.9g, PyTorch's (float64, same data) %.9g" % (s, row["loss"], loss))
            if abs(row["accuracy"] - acc) > 1e-9:
                sys.exit("FAIL step %d: fsexec's accuracy %g, PyTorch's %g" % (s, row["accuracy"], acc))
        if not want[-1][0] < 0.5 * want[0][0]:
            sys.exit("FAIL: the loss did not fall: %s" % [round(w[0], 4) for w in want])
        print("ok   mlp on .npy data, %d steps (wrapping at %d samples): every loss within 1e-5 of PyTorch float64 "
              "(%.4f -> %.4f), accuracy equal" % (STEPS, N, want[0][0], want[-1][0]))
        if have_mpi:
            run([fsc, sample, "-q", "--world", "2", "--shard", "ddp", "-o", P("mlp2.plan")])
            run([fsexec, "--nproc", "2", P("mlp2.plan"), "--data", data, "--data-order", "sequential", "--steps",
                 str(STEPS), "--log", P("w2.jsonl")])
            w2 = log_of(P("w2.jsonl"))
            worst = max(abs(a["loss"] - b["loss"]) / abs(b["loss"]) for a, b in zip(w2, got))
            if len(w2) != STEPS or worst > 1e-5:
                sys.exit("FAIL world 2: losses %s, world 1's %s" % ([r["loss"] for r in w2], [r["loss"] for r in got]))
            print("ok   world 2 (32 rows each of the global batch): losses within %.1e of world 1's" % worst)

        # 3. Other format versions and dtypes: the same step-1 loss, bit for bit.
        save_version(P("x2.npy"), x, (2, 0))
        save_version(P("y3.npy"), y, (3, 0))
        np.save(P("x32.npy"), x.astype(np.float32))
        np.save(P("y32.npy"), y.astype(np.int32))
        for what, xs, ys in (("versions 2.0 and 3.0", "x2.npy", "y3.npy"), ("float32 and int32", "x32.npy", "y32.npy")):
            run([fsexec, P("mlp.plan"), "--data", "x=%s,y=%s" % (P(xs), P(ys)), "--data-order", "sequential",
                 "--steps", "1", "--log", P("v.jsonl")])
            if log_of(P("v.jsonl"))[0]["loss"] != got[0]["loss"]:
                sys.exit("FAIL %s: step-1 loss %r, not %r" % (what, log_of(P("v.jsonl"))[0]["loss"], got[0]["loss"]))
            print("ok   .npy %s: the same step-1 loss, bit for bit" % what)

        # 4. Errors.
        np.save(P("fortran.npy"), np.asfortranarray(x))
        np.save(P("big.npy"), x.astype(">f8"))
        np.save(P("f16.npy"), x.astype(np.float16))
        np.save(P("narrow.npy"), x[:, :8])
        np.save(P("short.npy"), x[:150])
        np.save(P("label9.npy"), np.where(np.arange(N) == 17, 9, y))
        np.save(P("huge.npy"), np.where(np.arange(N) == 5, 1 << 40, y))
        with open(P("x.npy"), "rb") as f:
            blob = f.read()
        with open(P("cut.npy"), "wb") as f:
            f.write(blob[:-100])
        cases = [
            ("x=fortran.npy,y=y.npy", ["fortran.npy: a Fortran-order array (shape (200, 16))", "np.ascontiguousarray"]),
            ("x=big.npy,y=y.npy", ["big.npy: dtype '>f8' (shape (200, 16))", "little-endian"]),
            ("x=f16.npy,y=y.npy", ["f16.npy: dtype '<f2'"]),
            ("x=narrow.npy,y=y.npy", ["narrow.npy: shape (200, 8), but input 'x' takes samples of shape (16,): the "
                                      "file's shape must be (N, 16)"]),
            ("x=short.npy,y=y.npy", ["short.npy holds 150 samples for input 'x' and", "y.npy 200 for input 'y'"]),
            ("x=y.npy,y=y.npy", ["y.npy: input 'x' is f32, but the file holds integers ('<i8')"]),
            ("x=x.npy,y=label9.npy", ["label9.npy: element 17 is 9, outside the model's classes (0 to 3)"]),
            ("x=x.npy,y=huge.npy", ["huge.npy: element 5 is 1099511627776, outside int32's range"]),
            ("x=cut.npy,y=y.npy", ["cut.npy: shape (200, 16) of '<f8' needs 25600 bytes of data; the file holds 25500"]),
            ("x=x.npy,z=y.npy", ["the model has no input 'z'; its inputs are x (f32 [B, 16]), y (i32 [B])"]),
            ("x=x.npy", ["no file for input 'y'"]),
        ]
        for spec, needles in cases:
            spec = ",".join("%s=%s" % (k, P(v)) for k, v in (item.split("=") for item in spec.split(",")))
            out = run([fsexec, P("mlp.plan"), "--data", spec, "--steps", "1"], expect_rc=1)
            missing = [n for n in needles if n not in out]
            if missing:
                sys.exit("FAIL --data %s: the message lacks %s:\n%s" % (spec, missing, out))
            print("ok   %s" % out.strip().splitlines()[-1].replace(work + "/", ""))
        print("npy_data: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
