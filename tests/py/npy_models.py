#!/usr/bin/python3
"""Models a user writes, trained on .npy files (issue 35, items 1-4 and 20).

1. A language model with dropout (its `rng` step-role input is the runtime's, not data)
   trains from tokens=...npy,targets=...npy; dropout is on (the loss differs from p = 0's).
2. A BERT-style classifier (i32 tokens [B, T], i32 labels [B]): a token past the
   embedding's rows, or a label past the classes, is refused when the file loads, naming
   the file, the element, its sample, what it indexes and the range (not an abort
   mid-run); a checkpoint written before is left as it was. A language model's target
   past its logits, the same.
3. --val-data NAME=FILE.npy for a regressor (no integer inputs): val_loss at step 0 is
   numpy's mean squared error of the exported init over the first --eval-batches
   sequential batches; for an mlp classifier on .npy (val_acc too) and the dropout LM
   (dropout off in evaluation: its val_loss is the p = 0 plan's). `--val-data blobs`
   and a token file for the regressor say what it takes.
4. Tokens per second of a language model on .npy: step lines, the done line and --log's
   tokens_per_s (B * T over the step's ms), at world 1, ddp over 2 ranks and 2 pipeline
   stages.
20. --steps 0 --save-weights exports a regressor's init without --data; a NaN or inf
   in an f32 .npy is refused at load, naming the file, element and sample.

usage: /usr/bin/python3 tests/py/npy_models.py FSC FSEXEC   (numpy; mpirun for world 2)
"""
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import load_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))

LM_DROP = """model lmdrop {
  dim B = 4, T = 8, V = 64, C = 16;
  input tokens: i32[B, T];
  input targets: i32[B, T];
  param wte: [V, C] = normal(0.02);
  param wpe: [T, C] = normal(0.02);
  param w: [C, C] = normal(0.3);
  x = embedding(wte, tokens) + embedding(wpe, arange(T));
  x = dropout(relu(x @ w), PROB);
  loss = cross_entropy(x @ transpose(wte), targets);
}
train { optimizer sgd(lr = 0.5); }
"""

BERT = """model bert {
  dim B = 4, T = 8, V = 128, C = 16, K = 3;
  input tokens: i32[B, T];
  input labels: i32[B];
  param wte: [V, C] = normal(0.02);
  param w: [C, K] = normal(0.1);
  logits = mean(embedding(wte, tokens), axis=1) @ w;
  loss = cross_entropy(logits, labels);
  output logits;
}
train { optimizer sgd(lr = 0.1); }
"""

REGRESSOR = """model reg {
  dim B = 8, D = 4;
  input x: f32[B, D];
  input y: f32[B, 1];
  param w: [D, 1] = normal(0.5);
  param b: [1] = zeros;
  d = x @ w + b - y;
  loss = mean(mean(d * d, axis=1), axis=0);
}
train { optimizer sgd(lr = 0.05); }
"""


def run(cmd, expect_rc=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=quiet_mpi_leaks())
    if r.returncode != expect_rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, expect_rc, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def expect_error(cmd, needles, what):
    out = run(cmd, expect_rc=1)
    missing = [n for n in needles if n not in out]
    if missing:
        sys.exit("FAIL %s: the message lacks %s:\n%s" % (what, missing, out))
    print("ok   %s: %s" % (what, out.strip().splitlines()[-1]))


def log_of(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def listing(d):
    out = {}
    for dirpath, _, files in os.walk(d):
        for f in files:
            p = os.path.join(dirpath, f)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, d)] = fh.read()
    return out


def check_rates(log, tokens, what):
    """Every step's tokens_per_s is B * T tokens over its ms."""
    for row in log:
        if "loss" not in row:
            continue
        want = tokens / (row["ms"] / 1000)
        if not row.get("tokens_per_s") or abs(row["tokens_per_s"] - want) > 1e-3 * want:
            sys.exit("FAIL %s: step %d's tokens_per_s %r, not %d tokens over %g ms" % (
                what, row["step"], row.get("tokens_per_s"), tokens, row["ms"]))


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    have_mpi = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="npy_models.")
    try:
        def P(name):
            return os.path.join(work, name)

        def source(name, text):
            with open(P(name), "w") as f:
                f.write(text)
            return P(name)

        rng = np.random.default_rng(3)
        # ---- 1 and 4: a language model with dropout on .npy tokens ----
        tok = rng.integers(0, 64, size=(40, 9))
        np.save(P("tok.npy"), tok[:, :8])
        np.save(P("tgt.npy"), tok[:, 1:])
        lm_data = "tokens=%s,targets=%s" % (P("tok.npy"), P("tgt.npy"))
        run([fsc, source("lmdrop.fsm", LM_DROP.replace("PROB", "0.5")), "-q", "-o", P("lmdrop.plan")])
        run([fsc, source("lm0.fsm", LM_DROP.replace("PROB", "0.0")), "-q", "-o", P("lm0.plan")])
        out = run([fsexec, P("lmdrop.plan"), "--data", lm_data, "--steps", "3", "--data-order", "sequential",
                   "--log", P("drop.jsonl")])
        drop = log_of(P("drop.jsonl"))
        run([fsexec, P("lm0.plan"), "--data", lm_data, "--steps", "3", "--data-order", "sequential",
             "--log", P("nodrop.jsonl")])
        nodrop = log_of(P("nodrop.jsonl"))
        if len(drop) != 3 or drop[0]["loss"] == nodrop[0]["loss"]:
            sys.exit("FAIL: dropout 0.5's losses %s, p = 0's %s: dropout did not act" % (
                [r["loss"] for r in drop], [r["loss"] for r in nodrop]))
        print("ok   1. a dropout LM trains on tokens=.npy,targets=.npy (loss %.4f, p = 0's %.4f)" % (
            drop[0]["loss"], nodrop[0]["loss"]))
        # 4: its rate in tokens, at world 1, ddp world 2 and a 2-stage pipeline
        check_rates(drop, 4 * 8, "lmdrop world 1")
        rates = re.findall(r"\| ([0-9.]+[kMG]?) tok/s \|", out)
        done = re.search(r"done: .* ([0-9.]+[kMG]?) tok/s on average", out)
        if len(rates) != 3 or any(r in ("0", "0.0") for r in rates) or not done or done.group(1) in ("0", "0.0"):
            sys.exit("FAIL: step lines' and the done line's tok/s: %s\n%s" % (rates, out))
        print("ok   4. tokens/s of an LM on .npy at world 1: --log's tokens_per_s is B*T/ms; lines show %s" % rates)
        gpt2 = os.path.join(ROOT, "samples", "gpt2.fsm")
        dims = ["-D", "L=2", "-D", "C=16", "-D", "NH=2", "-D", "T=8", "-D", "V=64", "-D", "B=4"]
        if have_mpi:
            for what, flags in (("ddp world 2", ["--world", "2", "--shard", "ddp"]),
                                ("2 pipeline stages", ["--world", "2", "--stages", "2", "--microbatches", "2"])):
                run([fsc, gpt2, "-q", *dims, *flags, "-o", P("g.plan")])
                out = run([fsexec, "--nproc", "2", P("g.plan"), "--data", lm_data, "--steps", "2", "--log",
                           P("g.jsonl")])
                check_rates(log_of(P("g.jsonl")), 4 * 8, what)
                if "tok/s on average" not in out or re.search(r"\| 0(\.0)? tok/s", out):
                    sys.exit("FAIL %s: tok/s on the lines:\n%s" % (what, out))
                print("ok   4. tokens/s of an LM on .npy, %s: tokens_per_s is B*T/ms" % what)

        # ---- 2: integer inputs that index, checked at load ----
        src = source("bert.fsm", BERT)
        run([fsc, src, "-q", "-o", P("bert.plan")])
        btok = rng.integers(0, 128, size=(40, 8))
        labels = rng.integers(0, 3, size=40)
        np.save(P("btok.npy"), btok)
        np.save(P("lab.npy"), labels)
        bad = btok.copy()
        bad[30, 3] = 100000
        np.save(P("btok_bad.npy"), bad)
        neg = btok.copy()
        neg[2, 0] = -1
        np.save(P("btok_neg.npy"), neg)
        lab3 = labels.copy()
        lab3[7] = 3
        np.save(P("lab3.npy"), lab3)
        ck = P("ck")
        run([fsexec, P("bert.plan"), "--data", "tokens=%s,labels=%s" % (P("btok.npy"), P("lab.npy")), "--steps", "2",
             "--checkpoint-dir", ck])
        before = listing(ck)
        expect_error([fsexec, P("bert.plan"), "--data", "tokens=%s,labels=%s" % (P("btok_bad.npy"), P("lab.npy")),
                      "--steps", "14", "--data-order", "sequential", "--checkpoint-dir", ck, "--resume", ck],
                     ["btok_bad.npy: element 243 (sample 30) is 100000, outside the rows of embedding table 'wte' "
                      "(0 to 127), which input 'tokens' indexes"], "2. a token past the embedding's rows")
        if listing(ck) != before:
            sys.exit("FAIL: the refused run changed the checkpoint directory")
        print("ok   2. the checkpoint written before is as it was")
        expect_error([fsexec, P("bert.plan"), "--data", "tokens=%s,labels=%s" % (P("btok_neg.npy"), P("lab.npy"))],
                     ["btok_neg.npy: element 16 (sample 2) is -1, outside the rows of embedding table 'wte'"],
                     "2. a negative token")
        expect_error([fsexec, P("bert.plan"), "--data", "tokens=%s,labels=%s" % (P("btok.npy"), P("lab3.npy"))],
                     ["lab3.npy: element 7 is 3, outside the model's classes (0 to 2), which input 'labels' indexes"],
                     "2. a label past the classes")
        tgt = tok[:, 1:].copy()
        tgt[5, 5] = 64
        np.save(P("tgt_bad.npy"), tgt)
        expect_error([fsexec, P("lmdrop.plan"), "--data", "tokens=%s,targets=%s" % (P("tok.npy"), P("tgt_bad.npy"))],
                     ["tgt_bad.npy: element 45 (sample 5) is 64, outside the model's classes (0 to 63), which input "
                      "'targets' indexes"], "2. an LM's target past its logits")

        # ---- 20 and 3: a regressor ----
        src = source("reg.fsm", REGRESSOR)
        run([fsc, src, "-q", "-o", P("reg.plan")])
        run([fsexec, P("reg.plan"), "--steps", "0", "--save-weights", P("reg0.safetensors")])
        init = {k: v.numpy().astype(np.float64) for k, v in load_safetensors(P("reg0.safetensors")).items()}
        if sorted(init) != ["b", "w"] or init["w"].shape != (4, 1):
            sys.exit("FAIL: the exported init holds %s" % {k: v.shape for k, v in init.items()})
        print("ok   20. --steps 0 --save-weights exports the regressor's init without --data")
        x = rng.normal(size=(40, 4))
        y = x @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
        np.save(P("x.npy"), x)
        np.save(P("y.npy"), y)
        xv = rng.normal(size=(24, 4))
        yv = xv @ np.array([[1.0], [-2.0], [0.5], [3.0]]) + 0.1
        np.save(P("xv.npy"), xv)
        np.save(P("yv.npy"), yv)
        xn = x.copy()
        xn[3, 2] = np.nan
        np.save(P("xnan.npy"), xn)
        yi = y.copy()
        yi[9, 0] = -np.inf
        np.save(P("yinf.npy"), yi.astype(np.float32))
        data = "x=%s,y=%s" % (P("x.npy"), P("y.npy"))
        run([fsexec, P("reg.plan"), "--data", data, "--steps", "4", "--val-data",
             "x=%s,y=%s" % (P("xv.npy"), P("yv.npy")),
             "--eval-batches", "2", "--log", P("reg.jsonl")])
        rows = log_of(P("reg.jsonl"))
        xv32, yv32 = xv.astype(np.float32).astype(np.float64), yv.astype(np.float32).astype(np.float64)
        want = np.mean([np.mean((xv32[k * 8:(k + 1) * 8] @ init["w"] + init["b"] - yv32[k * 8:(k + 1) * 8]) ** 2)
                        for k in range(2)])
        got = rows[0].get("val_loss")
        if rows[0]["step"] != 0 or got is None or abs(got - want) > 1e-5 * want:
            sys.exit("FAIL: the regressor's val_loss at step 0 is %r, numpy's %r" % (got, want))
        if "val_loss" not in rows[-1] or not rows[-1]["val_loss"] < got:
            sys.exit("FAIL: val_loss after 4 steps %r, not below the first %r" % (rows[-1].get("val_loss"), got))
        print("ok   3. --val-data x=.npy,y=.npy for a regressor: val_loss %.6f = numpy's on the exported init, "
              "then %.6f" % (got, rows[-1]["val_loss"]))
        expect_error([fsexec, P("reg.plan"), "--data", data, "--val-data", "blobs"],
                     ["--val-data blobs is for classifiers", "--val-data NAME=FILE.npy,NAME=FILE.npy"],
                     "3. --val-data blobs for a regressor")
        expect_error([fsexec, P("reg.plan"), "--data", data, "--val-data", P("x.npy")],
                     ["this model's inputs take .npy files: --val-data NAME=FILE.npy,NAME=FILE.npy"],
                     "3. --val-data FILE for a regressor")
        expect_error([fsexec, P("reg.plan"), "--data", "x=%s,y=%s" % (P("xnan.npy"), P("y.npy"))],
                     ["xnan.npy: element 14 (sample 3) is NaN; input 'x' takes finite numbers"], "20. a NaN in x.npy")
        expect_error([fsexec, P("reg.plan"), "--data", "x=%s,y=%s" % (P("x.npy"), P("yinf.npy"))],
                     ["yinf.npy: element 9 is -inf; input 'y' takes finite numbers"], "20. an inf in y.npy")
        expect_error([fsexec, P("reg.plan"), "--data", data, "--val-data", "x=%s,y=%s" % (P("xnan.npy"), P("y.npy"))],
                     ["--val-data x=", "xnan.npy: element 14 (sample 3) is NaN"], "20. a NaN in --val-data's x.npy")

        # ---- 3: a classifier and the dropout LM on .npy held-out data ----
        mlp = os.path.join(ROOT, "samples", "mlp.fsm")
        run([fsc, mlp, "-q", "-o", P("mlp.plan")])
        cx = rng.normal(size=(128, 16))
        cy = rng.integers(0, 4, size=128)
        np.save(P("cx.npy"), cx)
        np.save(P("cy.npy"), cy)
        cdata = "x=%s,y=%s" % (P("cx.npy"), P("cy.npy"))
        run([fsexec, P("mlp.plan"), "--data", cdata, "--steps", "2", "--val-data", cdata, "--eval-batches", "2",
             "--log", P("mlp.jsonl")])
        first = log_of(P("mlp.jsonl"))[0]
        if "val_loss" not in first or not 0 <= first.get("val_acc", -1) <= 1:
            sys.exit("FAIL: the mlp's evaluation on .npy: %s" % first)
        print("ok   3. --val-data x=.npy,y=.npy for the mlp classifier: val_loss %.4f, val_acc %.3f" % (
            first["val_loss"], first["val_acc"]))
        for plan, name in (("lmdrop.plan", "d.jsonl"), ("lm0.plan", "n.jsonl")):
            run([fsexec, P(plan), "--data", lm_data, "--steps", "1", "--val-data", lm_data, "--eval-batches", "3",
                 "--log", P(name)])
        vd, vn = log_of(P("d.jsonl"))[0], log_of(P("n.jsonl"))[0]
        if "val_loss" not in vd or vd["val_loss"] != vn["val_loss"]:
            sys.exit("FAIL: the dropout LM's val_loss %r, the p = 0 plan's %r (evaluation drops nothing)" % (
                vd.get("val_loss"), vn.get("val_loss")))
        print("ok   3. --val-data tokens=.npy,targets=.npy for the dropout LM: val_loss %.6f = p = 0's"
              % vd["val_loss"])
        print("npy_models: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
