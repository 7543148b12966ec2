#!/usr/bin/python3
"""Pipeline step time on this machine: GPT-2 (small dims) cut into 2 stages, GPipe and
1F1B at M = 4 and 8, against the same model on one rank, and PyTorch on CPU in the same
run; with the bubble each plan's timeline predicts and the one the clock shows.

Every rank runs one thread (--threads 1), so two stages on two cores compare with the
one-rank run's single thread. For each plan:
  - the median step time of fsexec (--log "ms", steps after WARMUP);
  - the planned bubble: `fsc --timeline` (the cost model's FLOP-timed schedule): the
    busiest stage's idle share of the makespan;
  - the measured bubble: 1 - T1 / (P x Tp): the share of P ranks' time that is not the
    one-rank run's work (T1: one rank's step; Tp: the pipeline's), which also holds the
    sends, the waits and any imbalance the timeline does not price;
  - PyTorch: tests/py/models.py's GPT-2 (the same weights and batches), one thread,
    forward, backward, clip_grad_norm_, AdamW; the ratio is fsexec's pipeline step over
    PyTorch's one-process step.

usage: /usr/bin/python3 bench/pipeline_step.py [--fsc build-release/fsc] [--fsexec build-release/fsexec]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
DIMS = {"L": 8, "C": 128, "NH": 4, "T": 64, "V": 512, "B": 16}
HP = {"lr": 6e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1, "clip": 1.0, "warmup": 0,
      "steps": 1000, "min_lr": 0.0}


def sh(cmd, cwd):
    return subprocess.run(cmd, cwd=cwd, check=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True).stdout


def fsc_cmd(a, extra):
    cmd = [a.fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), "-q", "--optimizer", "adamw"]
    for k, v in DIMS.items():
        cmd += ["-D", "%s=%d" % (k, v)]
    for k in ("lr", "beta1", "beta2", "eps", "weight_decay", "clip", "warmup", "steps", "min_lr"):
        cmd += ["--%s" % k, str(HP[k])]
    return cmd + extra


def fsexec_ms(a, work, name, extra, world):
    plan, log = os.path.join(work, name + ".plan"), os.path.join(work, name + ".jsonl")
    sh(fsc_cmd(a, extra + ["-o", plan]), work)
    cmd = [a.fsexec] + (["--nproc", str(world)] if world > 1 else [])
    sh(cmd + [plan, "--steps", str(a.warmup + a.steps), "--threads", "1", "--data", "tokens.bin",
              "--data-order", "sequential", "--log", log], work)
    with open(log) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return statistics.median(r["ms"] for r in rows[a.warmup:])


def planned_bubble(a, work, extra):
    out = sh(fsc_cmd(a, extra + ["--timeline"]), work)
    m = re.search(r"bubble ([\d.]+)% of the makespan", out)
    return float(m.group(1)) / 100 if m else float("nan")


def torch_ms(a, work):
    import torch
    import models
    from torch_step import train_ms
    torch.set_num_threads(1)
    sh([a.fsexec, "one.plan", "--steps", "0", "--save-weights", "init.safetensors"], work)
    params = models.load_safetensors(os.path.join(work, "init.safetensors"))
    tok = models.read_tokens(os.path.join(work, "tokens.bin"))
    ms, _ = train_ms(params, tok, DIMS["L"], DIMS["NH"], DIMS["B"], DIMS["T"], a.warmup + a.steps, HP,
                     schedule=False)
    return statistics.median(ms[a.warmup:])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsc", default=os.path.join(ROOT, "build-release", "fsc"))
    ap.add_argument("--fsexec", default=os.path.join(ROOT, "build-release", "fsexec"))
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT", "1")
    os.environ.setdefault("OMPI_ALLOW_RUN_AS_ROOT_CONFIRM", "1")
    import numpy as np
    with tempfile.TemporaryDirectory() as work:
        n = DIMS["B"] * DIMS["T"] * (a.warmup + a.steps + 2) * 2
        np.random.default_rng(0).integers(0, DIMS["V"], size=n, dtype=np.uint16).astype("<u2").tofile(
            os.path.join(work, "tokens.bin"))
        print("GPT-2 %s, fp32, global batch %d; %d cores; one thread per rank; median of %d steps after %d"
              % (", ".join("%s=%d" % kv for kv in DIMS.items() if kv[0] != "B"), DIMS["B"], os.cpu_count(),
                 a.steps, a.warmup))
        t1 = fsexec_ms(a, work, "one", [], 1)
        pt = torch_ms(a, work)
        print("%-28s %9s %10s %10s %10s" % ("plan", "ms/step", "bubble", "planned", "/ torch"))
        print("%-28s %9.1f %10s %10s %10.2f" % ("1 rank", t1, "-", "-", t1 / pt))
        for sched in ("gpipe", "1f1b"):
            for m in (4, 8):
                extra = ["--stages", "2", "--world", "2", "--microbatches", str(m), "--schedule", sched]
                tp = fsexec_ms(a, work, "%s%d" % (sched, m), extra, 2)
                print("%-28s %9.1f %9.1f%% %9.1f%% %10.2f" % ("2 stages, %s, M=%d" % (sched, m), tp,
                                                             100 * (1 - t1 / (2 * tp)),
                                                             100 * planned_bubble(a, work, extra), tp / pt))
        print("PyTorch %s, one process, one thread: %.1f ms/step" % (__import__("torch").__version__, pt))


if __name__ == "__main__":
    main()
