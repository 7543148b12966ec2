#!/usr/bin/env python3
"""Checkpoint save and load against PyTorch, GPT-2 124M shapes (fp32 AdamW state: 124M
params and two moments, 1.5 GB), in the same run, interleaved, medians of ROUNDS.

fsexec: the save a checkpoint prints ("checkpoint ... (1 file, X MiB, Y s)": every piece
written from the arena, CRC-32 per piece, the file fsync'ed and renamed, the manifest
after) and the load `--resume` prints ("loaded in Y s": every file's header checked, each
piece read into the arena with its CRC checked). PyTorch: torch.save of {"model":
state_dict, "optimizer": AdamW's state_dict} of tensors of the same shapes, then fsync
(so both reach the disk), and torch.load of it. Both write to the same directory; the
page cache is not dropped between runs (so loads are mostly from memory, for both).

usage: bench/checkpoint_io.py [BUILD_DIR]   (default build/; /usr/bin/python3: Debian's torch)
"""
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BUILD = os.path.abspath(sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build"))
ROUNDS = 3


def sh(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-2000:]))
    return r.stdout


def shapes(step_dir):
    """The params' logical shapes, from the checkpoint's piece metadata."""
    with open(os.path.join(step_dir, "rank-00000.safetensors"), "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        head = json.loads(f.read(n))
    pieces = json.loads(head["__metadata__"]["fsexec"])["pieces"]
    return {p["tensor"]: p["shape"] for p in pieces.values() if p["kind"] == "param"}


def torch_round(shp, path):
    model = {k: torch.randn(*s) for k, s in shp.items()}
    params = [torch.nn.Parameter(t) for t in model.values()]
    opt = torch.optim.AdamW(params, lr=1e-4)
    for p in params:
        p.grad = torch.zeros_like(p)
    opt.step()  # makes exp_avg and exp_avg_sq
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        torch.save({"model": model, "optimizer": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    save = time.perf_counter() - t0
    t0 = time.perf_counter()
    torch.load(path)
    load = time.perf_counter() - t0
    return save, load, os.path.getsize(path)


def main():
    fsc, fsexec = os.path.join(BUILD, "fsc"), os.path.join(BUILD, "fsexec")
    with tempfile.TemporaryDirectory(dir=ROOT) as tmp:
        plan = os.path.join(tmp, "gpt2.plan")
        sh([fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), "-D", "B=1", "-D", "T=64", "-o", plan])
        rows = {"fsexec save": [], "fsexec load": [], "torch save": [], "torch load": []}
        size = {}
        for r in range(ROUNDS):
            ck = os.path.join(tmp, "ck%d" % r)
            out = sh([fsexec, plan, "--steps", "1", "--checkpoint-dir", ck])
            m = re.search(r"checkpoint \S+ \(1 file, ([\d.]+) MiB, ([\d.]+) s\)", out)
            rows["fsexec save"].append(float(m.group(2)))
            size["fsexec"] = float(m.group(1)) * 2**20
            out = sh([fsexec, plan, "--steps", "2", "--resume", ck])
            rows["fsexec load"].append(float(re.search(r"loaded in ([\d.]+) s", out).group(1)))
            s, l, b = torch_round(shapes(os.path.join(ck, "step-00000001")), os.path.join(tmp, "t%d.pt" % r))
            rows["torch save"].append(s)
            rows["torch load"].append(l)
            size["torch"] = b
            sh(["rm", "-rf", ck, os.path.join(tmp, "t%d.pt" % r)])
    med = {k: statistics.median(v) for k, v in rows.items()}
    print("GPT-2 124M fp32 AdamW state; fsexec %.0f MiB, torch %.0f MiB; medians of %d (torch %s)"
          % (size["fsexec"] / 2**20, size["torch"] / 2**20, ROUNDS, torch.__version__))
    for what in ("save", "load"):
        f, t = med["fsexec " + what], med["torch " + what]
        print("%-5s fsexec %6.2f s (%5.2f GB/s)  torch %6.2f s (%5.2f GB/s)  ratio fsexec/torch %.2f"
              % (what, f, size["fsexec"] / f / 1e9, t, size["torch"] / t / 1e9, f / t))


if __name__ == "__main__":
    main()
