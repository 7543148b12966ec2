"""What the multi-rank training tests share (tests/mpi/accumulate.py, pipeline.py): running
fsc and fsexec, the training settings, and comparing trained params, losses and norms
against a reference run."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

from mpienv import quiet_mpi_leaks

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
STEPS = 5
# AdamW with eps 1e-6: a gradient that is rounding noise does not become a step.
TRAIN = ["--optimizer", "adamw", "--lr", "1e-3", "--eps", "1e-6", "--weight_decay", "0.1", "--clip", "1.0", "--warmup", "2"]


def run(cmd, ok=True):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if ok and r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r


def load_stages(out):
    """The params of every stage's file (HF's sharded names beside OUT), and for names in
    more than one file each file's copy."""
    from models import load_safetensors  # torch: only the tests that read weights pay for it
    files = sorted(glob.glob(re.sub(r"\.safetensors$", "", out) + "-*-of-*.safetensors"))
    if not files:
        return load_safetensors(out), {}
    params, copies = {}, {}
    for f in files:
        for name, t in load_safetensors(f).items():
            copies.setdefault(name, []).append(t)
            params.setdefault(name, t)
    return params, {n: c for n, c in copies.items() if len(c) > 1}


def rel(a, b):
    return float(np.linalg.norm(a - b) / max(np.linalg.norm(b), 1e-30))


def compare(what, got, ref, floor, tol, whole_tol=None, loss_tol=None, ref_name="the reference run"):
    """got and ref are (params, [(loss, grad_norm) per step]). Each param tensor to rel tol
    (or 3 times its floor: what the reference differs from itself between thread counts);
    with whole_tol, all params as one vector too; every step's loss and norm to loss_tol
    (tol)."""
    (gp, gl), (rp, rl) = got[:2], ref[:2]
    if set(gp) != set(rp):
        sys.exit("FAIL %s: params %s, %s's %s" % (what, sorted(gp), ref_name, sorted(rp)))
    worst, worst_name = 0.0, ""
    for name, b in rp.items():
        e = rel(gp[name].float().numpy().astype(np.float64), b.float().numpy().astype(np.float64))
        t = max(tol, 3 * floor.get(name, 0.0))
        if e > t:
            sys.exit("FAIL %s: param %s differs from %s: rel %.2e > %.1e" % (what, name, ref_name, e, t))
        if e / t > worst:
            worst, worst_name = e / t, name
    whole = ""
    if whole_tol:
        flat = lambda ps: np.concatenate([ps[n].float().numpy().astype(np.float64).ravel() for n in rp])  # noqa: E731
        e = rel(flat(gp), flat(rp))
        if e > whole_tol:
            sys.exit("FAIL %s: all params together differ from %s: rel %.2e > %.1e" % (what, ref_name, e, whole_tol))
        whole = ", all together rel %.1e" % e
    lerr = max(abs(a - b) / abs(b) for ga, gb in zip(gl, rl) for a, b in zip(ga, gb))
    if len(gl) != STEPS or lerr > (loss_tol or tol):
        sys.exit("FAIL %s: losses and norms %s, %s's: %s" % (what, gl, ref_name, rl))
    print("ok   %-52s params at %3.0f%% of tolerance at most (%s)%s, losses and norms rel %.1e"
          % (what, 100 * worst, worst_name, whole, lerr))


def mpi_main(make_runner, parts, done):
    """A multi-rank test's main (usage: TEST FSC FSEXEC): skipped (exit 77) without mpirun;
    else, in a temporary directory with a token file of 4000 tokens below 256, each of
    parts(runner) in turn, runner = make_runner(fsc, fsexec, work, data); then `done`."""
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        sys.exit(77)
    quiet_mpi_leaks()
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        data = os.path.join(work, "tokens.bin")
        np.random.default_rng(3).integers(0, 256, size=4000, dtype=np.uint16).tofile(data)
        r = make_runner(fsc, fsexec, work, data)
        for part in parts:
            part(r)
    print(done)
