#!/usr/bin/env python3
"""The host AdamW (runtime/cpu/optim.c, the CPU backend's kernel and optimizer offload's)
against the memory bandwidth and against PyTorch's CPU AdamW.

One AdamW step on N fp32 params (default 100M) with T threads (default 2), the median
of REPS steps, timed by build/optim_driver (tests/support/optim_driver.c) in one run
with two yardsticks on the same buffers:
  copy     memcpy of 4N bytes, each thread its half; GB/s counts bytes read + written
           (8N), as STREAM's copy does.
  streams  AdamW's own traffic (read p, g, m, v; write p, m, v) with adds only.
Effective GB/s counts AdamW's traffic, 28 bytes a param; the bound is 28 N / copy GB/s.
AdamW can beat that bound: a copy's stores go to lines it never read, which costs the
memory system a read as well (write-allocate) or slower non-temporal stores, where
AdamW stores only to lines it has just read. streams is the ceiling for its traffic.
Then torch.optim.AdamW on one N-param tensor, with torch.set_num_threads(T), under each
interpreter given with --python (default /usr/bin/python3, Debian's torch): the
default (the for-loop over ops), foreach=True and, where that torch has it, fused=True.
The first step of each (it allocates the state) is not timed. Nothing here is a test:
it prints a table, and times vary with whatever else runs on the machine.

usage: host_adamw.py [--driver build/optim_driver] [--n N] [--threads T] [--reps R]
                     [--python PY]...
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
BYTES_PER_PARAM = 28  # read p, g, m, v and write p, m, v: 7 floats


def torch_worker(n, threads, reps):
    """Seconds per step of each torch AdamW variant, as one JSON line."""
    import torch
    torch.set_num_threads(threads)
    out = {"version": torch.__version__, "seconds": {}}
    for name, kw in [("default", {}), ("foreach", {"foreach": True}), ("fused", {"fused": True})]:
        param = torch.nn.Parameter(torch.rand(n))
        param.grad = torch.rand(n) * 1e-3
        try:
            opt = torch.optim.AdamW([param], lr=1e-3, weight_decay=0.01, **kw)
            opt.step()
        except (RuntimeError, TypeError, ValueError) as e:  # no such variant in this torch, or not on CPU
            out["seconds"][name] = str(e).splitlines()[0][:80]
            continue
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            opt.step()
            times.append(time.perf_counter() - t0)
        out["seconds"][name] = times
        del opt, param
    print(json.dumps(out))


def run_json(cmd, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    if r.returncode != 0:
        sys.exit("host_adamw.py: %s failed:\n%s" % (" ".join(cmd), r.stderr[-2000:]))
    return json.loads(r.stdout.strip().splitlines()[-1])


def row(name, sec, n, ours):
    ms = 1e3 * sec
    gbs = BYTES_PER_PARAM * n / sec / 1e9
    print("%-34s %10.1f %9.2f %10s" % (name, ms, gbs, "%.2fx" % (sec / ours)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--driver", default=os.path.join(ROOT, "build", "optim_driver"))
    ap.add_argument("--n", type=int, default=100_000_000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--python", action="append", help="an interpreter with torch (repeatable)")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a.n, a.threads, a.reps)

    env = dict(os.environ, OMP_NUM_THREADS=str(a.threads))
    ours = run_json([a.driver, "bench", str(a.n), str(a.reps)], env)
    adamw, copy, streams = (statistics.median(ours[k]) for k in ("adamw_s", "copy_s", "streams_s"))
    copy_gbs = 8 * a.n / copy / 1e9
    bound = BYTES_PER_PARAM * a.n / (copy_gbs * 1e9)
    torches = []
    for py in a.python or ["/usr/bin/python3"]:
        cmd = [py, os.path.abspath(__file__), "--torch-worker", "--n", str(a.n), "--threads", str(a.threads),
               "--reps", str(a.reps)]
        torches.append(run_json(cmd))

    print("AdamW step, %d fp32 params, %d threads, median of %d steps" % (a.n, a.threads, a.reps))
    print("%-34s %10s %9s %10s" % ("", "ms/step", "GB/s", "time/ours"))
    row("fs cpu_adamw", adamw, a.n, adamw)
    row("bound: 28 B/param at copy GB/s", bound, a.n, adamw)
    row("streams: AdamW's traffic, adds only", streams, a.n, adamw)
    for t in torches:
        for name, sec in t["seconds"].items():
            label = "torch %s %s" % (t["version"].split("+")[0], name)
            if isinstance(sec, list):
                row(label, statistics.median(sec), a.n, adamw)
            else:
                print("%-34s %s" % (label, "n/a: " + sec))
    print("copy: %.2f GB/s (memcpy of %d MB, bytes read + written); ours at %.2fx the copy bound, %.2fx streams"
          % (copy_gbs, 4 * a.n // 1000000, adamw / bound, adamw / streams))


if __name__ == "__main__":
    main()
