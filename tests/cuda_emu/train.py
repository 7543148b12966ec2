#!/usr/bin/env python3
"""fsexec's device path, end to end, without a GPU: tiny models trained a few steps with
`--device cuda` on the cuda-emu backend (FS_CUDA_BACKEND=libfs_cudaemu.so) against the
same plans on `--device cpu`. This drives what op_check does not: fsexec's train loop on
a device (inputs up each step, loss / lr / norm / loss scale down, the overflow-at and
save-grads splits, --cuda-graph's run_step, weights downloaded before saving; with
offload, the host mirror running the update and the copies between the spaces; the
params brought down for --val-data's evaluations).

Checks, per case: every step's loss and gradient norm within a tolerance (relative) of
the CPU run's, the fp16 skip at the forced overflow step on both, and the saved weights
equal to within the tolerance of the largest |param|. The tolerance is 1e-5 for fp32
and 1e-3 in 16 bits, where a kernel that rounds one element the other way (a different
expf, a different summation order) moves it by 2^-11 (fp16) or 2^-8 (bf16). The saved
weights of bf16 runs get 1e-2: attention on tensor cores (codegen/kernels/flash.cuh)
rounds its probabilities P and their gradients dS to bf16 (2^-9 relative) for the
products, as every flash attention does, where the CPU keeps them in f32, and five SGD
steps with momentum carry that into the weights (3.5e-3 on tiny GPT-2). With offload,
every step's --log to_host_bytes and to_device_bytes, as the CUDA backend counts its
copies, are the bytes `fsc --comm` gives for the plan (tests/mpi/offload.py's reading).
Offload without clipping, whose host updates run during the backward, leaves on each
device the same weights to the bit as the same plan with its updates after the backward.
A plan compiled with the tf32 setting (attention on TF32 tensor cores) gets op_check's tf32
tolerance, 5e-3 (tests/py/tf32_error.py), says `| tf32` on fsexec's start line, and two
runs of it on the device save the same weights to the bit (dQ without atomics).
With --cuda-graph, offload's host work is captured as host-function nodes and replayed:
the same logs and weights to the bit as the run without the graph (fp32, bf16, and bf16
with the delayed update).

usage: train.py FSC FSEXEC LIBFS_CUDAEMU WORKDIR   (/usr/bin/python3 with numpy)
"""
import json
import os
import struct
import subprocess
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "mpi"))
from offload import copies  # noqa: E402  fsc --comm's bytes each way per step

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
TINY = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=2"]
# SGD, whose update is linear in the gradient, so the saved weights compare as tightly as
# the gradients (AdamW turns last-bit differences of near-zero gradients into whole
# steps of lr; op_check checks its kernel op by op).
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]
BF16_WEIGHTS = 1e-2
CASES = [  # name, fsc args, fsexec args, tolerance
    ("gpt2_fp32", ["samples/gpt2.fsm", *TINY, *SGD, "--clip", "1.0"], [], 1e-5),
    ("gpt2_bf16_graph", ["samples/gpt2.fsm", *TINY, *SGD, "--precision", "bf16"], ["--cuda-graph"], 1e-3),
    ("gpt2_fp16_overflow", ["samples/gpt2.fsm", *TINY, *SGD, "--precision", "fp16"], ["--debug-overflow-at", "3"], 1e-3),
    ("mlp_fp32", ["samples/mlp.fsm"], [], 1e-5),
    ("gpt2_tf32", ["samples/gpt2.fsm", *TINY, *SGD, "--tf32", "1"], [], 5e-3),
    # Offload: the update on the host mirror, copies between the arena and the host space.
    ("gpt2_fp32_offload", ["samples/gpt2.fsm", *TINY, *SGD, "--clip", "1.0", "--offload", "optimizer"], [], 1e-5),
    ("gpt2_bf16_offload", ["samples/gpt2.fsm", *TINY, *SGD, "--precision", "bf16", "--offload", "optimizer"], [], 1e-3),
    ("gpt2_fp16_offload_overflow", ["samples/gpt2.fsm", *TINY, *SGD, "--precision", "fp16", "--offload", "optimizer"],
     ["--debug-overflow-at", "3"], 1e-3),
]
STEPS = 5


def run(cmd, env=None):
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout))
    return r.stdout


def safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype=np.float32 if t["dtype"] == "F32" else np.uint16)
    return out


def main():
    fsc, fsexec, emu, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, FS_CUDA_BACKEND=os.path.abspath(emu))
    for name, fsc_args, extra, tol in CASES:
        plan = os.path.join(work, name + ".plan")
        run([fsc, *fsc_args, "-o", plan, "-q"])
        logs, weights = {}, {}
        for device in ("cpu", "cuda"):
            log, st = (os.path.join(work, "%s.%s.%s" % (name, device, ext)) for ext in ("jsonl", "st"))
            flags = [x for x in extra if device == "cuda" or x != "--cuda-graph"]  # a CUDA-only flag
            out = run([fsexec, plan, "--device", device, "--steps", str(STEPS), "--log", log, "--save-weights", st,
                       *flags], env)
            if device == "cuda" and "device: cuda" not in out:
                sys.exit("FAIL %s: fsexec did not run on the (emulated) CUDA backend:\n%s" % (name, out))
            with open(log) as f:
                logs[device] = [json.loads(line) for line in f]
            weights[device] = safetensors(st)
        worst = 0.0
        for a, b in zip(logs["cuda"], logs["cpu"]):
            for key in ("loss", "grad_norm"):
                if key in b and b[key] is not None:
                    worst = max(worst, abs(a[key] - b[key]) / max(abs(b[key]), 1e-30))
            if bool(a.get("skipped")) != bool(b.get("skipped")):
                sys.exit("FAIL %s: step %d skipped on one device only" % (name, b["step"]))
        if len(logs["cuda"]) != STEPS or worst > tol:
            sys.exit("FAIL %s: %d steps, worst relative difference of loss / norm %.3g" % (name, len(logs["cuda"]), worst))
        wdiff = max(float(np.max(np.abs(weights["cuda"][k].astype(np.float64) - v))) / max(float(np.max(np.abs(v))), 1e-30)
                    for k, v in weights["cpu"].items())
        wtol = BF16_WEIGHTS if "bf16" in fsc_args else tol
        if weights["cuda"].keys() != weights["cpu"].keys() or wdiff > wtol:
            sys.exit("FAIL %s: saved weights differ (worst %.3g of the largest param)" % (name, wdiff))
        if "--offload" in fsc_args:
            want = copies(run([fsc, *fsc_args, "--comm", "-q"]))
            got = {(rec.get("to_host_bytes", 0), rec.get("to_device_bytes", 0)) for rec in logs["cuda"]}
            if want == (0, 0) or got != {want}:
                sys.exit("FAIL %s: the CUDA backend counted %s bytes (to the host, to the device) a step; fsc --comm "
                         "says %s" % (name, sorted(got), want))
        skipped = [l["step"] for l in logs["cuda"] if l.get("skipped")]
        print("ok   %-20s %d steps: loss / norm within %.2g of the CPU's, weights within %.2g%s" %
              (name, STEPS, worst, wdiff, ", skipped steps %s" % skipped if skipped else ""))
    graphs(fsc, fsexec, work, env)
    overlap(fsc, fsexec, work, env)
    evaluation(fsexec, work, env)
    tf32_repeats(fsexec, work, env)


def tf32_repeats(fsexec, work, env):
    """The tf32 plan (trained above) once more on the device: fsexec follows the plan's setting (its start line
    says so without --tf32), and the run saves the weights of the first to the bit."""
    plan, st = os.path.join(work, "gpt2_tf32.plan"), os.path.join(work, "tf32_repeat.st")
    out = run([fsexec, plan, "--device", "cuda", "--steps", str(STEPS), "--save-weights", st], env)
    if "| tf32" not in out:
        sys.exit("FAIL tf32: fsexec's start line does not say tf32:\n%s" % out)
    first, again = safetensors(os.path.join(work, "gpt2_tf32.cuda.st")), safetensors(st)
    differ = sorted(k for k in first if k not in again or not np.array_equal(first[k], again[k]))
    if differ or not first:
        sys.exit("FAIL tf32: two runs of the same plan saved different weights: %s" % differ)
    print("ok   tf32: two device runs of the plan save the same weights to the bit")


def graphs(fsc, fsexec, work, env):
    """--cuda-graph with offload: the host's ops are host-function nodes of the captured
    step, which cuda-emu replays with each as early as the graph's edges allow (ahead of
    device work the plan puts before it). AdamW in fp32 with clipping, bf16 without (its
    updates during the backward), and bf16 with the delayed update: every step's log and
    the saved weights equal to the bit to the same run without the graph."""
    base = ["samples/gpt2.fsm", *TINY, "--optimizer", "adamw", "--offload", "optimizer"]
    cases = [("fp32", ["--clip", "1.0"]), ("bf16", ["--precision", "bf16", "--clip", "0"]),
             ("bf16_delayed", ["--precision", "bf16", "--clip", "1.0", "--delayed_update", "1"])]
    for name, args in cases:
        plan = os.path.join(work, "graph_%s.plan" % name)
        run([fsc, *base, *args, "-o", plan, "-q"])
        logs, weights = [], []
        for graph in ([], ["--cuda-graph"]):
            stem = os.path.join(work, "graph_%s%s" % (name, "_g" if graph else ""))
            log, st = stem + ".jsonl", stem + ".st"
            run([fsexec, plan, "--device", "cuda", "--steps", str(STEPS), "--log", log, "--save-weights", st, *graph],
                env)
            with open(log) as f:
                logs.append([(r["loss"], r["grad_norm"], r.get("to_host_bytes"), r.get("to_device_bytes"))
                             for r in map(json.loads, f)])
            weights.append(safetensors(st))
        differ = sorted(k for k in weights[0]
                        if k not in weights[1] or not np.array_equal(weights[0][k], weights[1][k]))
        if len(logs[0]) != STEPS or logs[0] != logs[1] or differ or not weights[0]:
            sys.exit("FAIL --cuda-graph with offload, %s: the replayed steps differ from the run without a graph: "
                     "params %s, logs\n%s\n%s" % (name, differ, logs[0], logs[1]))
        print("ok   --cuda-graph with offload, %-12s %d steps (graph from step 2): logs and weights equal to the bit "
              "to the run without it" % (name + ":", STEPS))


def overlap(fsc, fsexec, work, env):
    """Offload without clipping runs each unit's host update during the backward
    (passes/schedule.c); a clip no norm reaches (1e9: the coefficient is exactly 1) keeps
    the updates after the backward. The same maths in another order: on each device the
    saved weights of the two are equal to the bit."""
    args = ["samples/gpt2.fsm", *TINY, "--optimizer", "adamw", "--precision", "bf16", "--offload", "optimizer"]
    for device in ("cpu", "cuda"):
        got = []
        for clip in ("0", "1e9"):
            plan, st = (os.path.join(work, "overlap_%s.%s.%s" % (clip, device, ext)) for ext in ("plan", "st"))
            run([fsc, *args, "--clip", clip, "-o", plan, "-q"])
            run([fsexec, plan, "--device", device, "--steps", str(STEPS), "--save-weights", st], env)
            got.append(safetensors(st))
        differ = sorted(k for k in got[1] if k not in got[0] or not np.array_equal(got[0][k], got[1][k]))
        if differ or not got[1]:
            sys.exit("FAIL overlap on %s: weights differ from the updates after the backward: %s" % (device, differ))
    print("ok   offload's updates during the backward: weights equal to the bit to those after it, cpu and cuda")


def evaluation(fsexec, work, env):
    """--val-data on a device: the params brought down to the host mirror before each
    evaluation (which runs on the CPU), so every val_loss is the CPU run's."""
    plan, data = os.path.join(work, "gpt2_fp32.plan"), os.path.join(work, "val.bin")
    np.random.default_rng(5).integers(0, 256, size=2000, dtype=np.uint16).tofile(data)
    got = {}
    for device in ("cpu", "cuda"):
        log = os.path.join(work, "eval.%s.jsonl" % device)
        run([fsexec, plan, "--device", device, "--steps", "1", "--val-data", data, "--data-format", "raw",
             "--eval-every", "1", "--eval-batches", "1", "--log", log], env)
        with open(log) as f:
            got[device] = [(r["step"], r["val_loss"]) for r in map(json.loads, f) if "val_loss" in r]
    steps = [s for s, _ in got["cuda"]]
    worst = max(abs(a[1] - b[1]) / abs(b[1]) for a, b in zip(got["cuda"], got["cpu"]))
    if steps != [0, 1] or [s for s, _ in got["cpu"]] != steps or worst > 1e-5:
        sys.exit("FAIL: --val-data on the device: %s, on the CPU: %s" % (got["cuda"], got["cpu"]))
    print("ok   --val-data on the device: val_loss before and after a step within %.2g of the CPU's" % worst)


if __name__ == "__main__":
    main()
