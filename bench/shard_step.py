#!/usr/bin/env python3
"""Training-step time of tiny GPT-2 under ddp and fsdp at world 1, 2 and 4 on this
machine, and the bytes each rank communicates per step against the theory.

Ranks are local processes under mpirun (fsexec --nproc), oversubscribed when the world
exceeds the cores: the times say what the plan costs here, not what a cluster does.
Theory (ZeRO paper, per rank, Psi = fp32 bytes of the padded flat params): ddp
all-reduces the gradients, 2 Psi; fsdp all-gathers each block's params before its
forward and again before its backward and reduce-scatters its gradients, 3 Psi, except
that the params outside blocks stay gathered from forward to backward (2 Psi for them).

usage: bench/shard_step.py [--fsc build/fsc] [--fsexec build/fsexec] [--steps 12]
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


def sh(cmd):
    return subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True).stdout


def theory(fsc, plan_world, strategy):
    """Psi per unit from the unsharded model, padded for the world."""
    ir = sh([fsc, "samples/gpt2.fsm", *DIMS, "--emit", "ir-json", "-q"])
    g = json.loads(ir)
    units = {}
    for v in g["values"]:
        if v["role"] == "param":
            n = 1
            for d in v["shape"]:
                n *= d
            units[v["block"]] = units.get(v["block"], 0) + n
    total = 0.0
    for block, n in units.items():
        psi = 4 * ((n + plan_world - 1) // plan_world * plan_world)
        total += 2 * psi if strategy == "ddp" or block is None else 3 * psi
    return total


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--fsc", default=os.path.join(ROOT, "build", "fsc"))
    ap.add_argument("--fsexec", default=os.path.join(ROOT, "build", "fsexec"))
    ap.add_argument("--steps", type=int, default=12)
    a = ap.parse_args()
    print("tiny GPT-2 (L=4, C=128, NH=4, T=64, V=512), global batch 8; %d cores; median step after 2 warm-up steps"
          % os.cpu_count())
    print("%-5s %5s %10s %14s %14s %8s" % ("shard", "world", "ms/step", "bytes/step", "theory", "bytes/th"))
    times = {}
    with tempfile.TemporaryDirectory() as work:
        for world in (1, 2, 4):
            for strategy in ("ddp", "fsdp"):
                plan = os.path.join(work, "%s%d.plan" % (strategy, world))
                log = os.path.join(work, "%s%d.jsonl" % (strategy, world))
                sh([a.fsc, "samples/gpt2.fsm", *DIMS, "--shard", strategy, "--world", str(world), "-o", plan, "-q"])
                comm = sh([a.fsc, "samples/gpt2.fsm", *DIMS, "--shard", strategy, "--world", str(world), "--comm", "-q"])
                sent = float(re.search(r"collectives, (\d+) bytes", comm).group(1))
                cmd = [a.fsexec] + (["--nproc", str(world)] if world > 1 else []) + [plan, "--steps", str(a.steps),
                                                                                    "--log", log]
                sh(cmd)
                with open(log) as f:
                    ms = statistics.median(json.loads(line)["ms"] for line in list(f)[2:])
                times[strategy, world] = ms
                th = theory(a.fsc, world, strategy)
                print("%-5s %5d %10.1f %14.0f %14.0f %8.4f" % (strategy, world, ms, sent, th, sent / th))
        for world in (1, 2, 4):
            print("world %d: fsdp / ddp step time %.2f" % (world, times["fsdp", world] / times["ddp", world]))


if __name__ == "__main__":
    main()
