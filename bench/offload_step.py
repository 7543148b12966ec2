#!/usr/bin/env python3
"""Training-step time of tiny GPT-2 with and without optimizer offload on CPU ranks, and
what each step copies between the device and the host space.

On the CPU backend the host space is an allocation of its own and the copies are real
memcpy's run in order (no copy engine overlaps them), so the ratio is what offload's
copies and host casts cost here: an upper bound of what they cost where a copy stream
overlaps them with compute. Runs alternate (off, on, off, on, ...) so drift hits both;
each time is the median step of a run after 3 warm-up steps, then the median over runs.
The bytes are the runtime's own counters (`fsexec --log`: to_host_bytes,
to_device_bytes), checked against `fsc --comm`'s.

usage: bench/offload_step.py [--fsc build/fsc] [--fsexec build/fsexec] [--steps 20] [--rounds 3]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
DIMS = ["-D", "L=4", "-D", "C=128", "-D", "NH=4", "-D", "T=64", "-D", "V=512", "-D", "B=8"]
CASES = [("none", 1, "fp32"), ("none", 1, "bf16"), ("zero2", 2, "bf16"), ("fsdp", 2, "bf16")]


def sh(cmd, env=None):
    return subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env).stdout


def comm_copies(fsc, args):
    out = sh([fsc, "samples/gpt2.fsm", *DIMS, *args, "--comm", "-q"])
    m = re.search(r"device <-> host: \d+ copies, (\d+) bytes to the host .*?, (\d+) bytes to the device", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def run(fsexec, plan, world, steps, log, env):
    cmd = [fsexec] + (["--nproc", str(world)] if world > 1 else []) + [plan, "--steps", str(steps), "--log", log,
                                                                      "--threads", "1" if world > 1 else "2"]
    sh(cmd, env)
    with open(log) as f:
        rows = [json.loads(line) for line in f]
    return statistics.median(r["ms"] for r in rows[3:]), rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsc", default=os.path.join(ROOT, "build", "fsc"))
    ap.add_argument("--fsexec", default=os.path.join(ROOT, "build", "fsexec"))
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    print("tiny GPT-2 (L=4, C=128, NH=4, T=64, V=512), global batch 8, AdamW; %d cores; CPU backend" % os.cpu_count())
    print("%-6s %5s %5s %10s %10s %7s %12s %12s" % ("shard", "world", "prec", "ms off", "ms on", "on/off",
                                                    "to host B", "to device B"))
    with tempfile.TemporaryDirectory() as work:
        for shard, world, prec in CASES:
            args = ["--shard", shard, "--world", str(world), "--precision", prec]
            plans = {}
            for off in ("none", "optimizer"):
                plans[off] = os.path.join(work, "%s-%s-%s.plan" % (shard, prec, off))
                sh([a.fsc, "samples/gpt2.fsm", *DIMS, *args, "--offload", off, "-o", plans[off], "-q"])
            times = {"none": [], "optimizer": []}
            rows = None
            for _ in range(a.rounds):
                for off in ("none", "optimizer"):
                    ms, r = run(a.fsexec, plans[off], world, a.steps, os.path.join(work, "log.jsonl"), env)
                    times[off].append(ms)
                    if off == "optimizer":
                        rows = r
            want = comm_copies(a.fsc, args + ["--offload", "optimizer"])
            got = {(r.get("to_host_bytes", 0), r.get("to_device_bytes", 0)) for r in rows}
            if got != {want}:
                raise SystemExit("FAIL: the runtime copied %s per step; fsc --comm says %s" % (got, want))
            t0, t1 = statistics.median(times["none"]), statistics.median(times["optimizer"])
            print("%-6s %5d %5s %10.2f %10.2f %7.3f %12d %12d" % (shard, world, prec, t0, t1, t1 / t0, *want))


if __name__ == "__main__":
    main()
