#!/usr/bin/env python3
"""Optimizer offload (`--offload optimizer`, and fsdp's `--offload params`) moves where
the update runs, not what it computes: the host runs the same kernels on the same
values, so an offloaded run equals the same run without offload bit for bit.

1. For the tiny GPT-2 (accumulate.py's), after 4 AdamW steps (clipping on): the saved
   params of the offloaded run equal those of the run without offload byte for byte,
   tensor by tensor, and so does every step's logged loss, learning rate, gradient
   norm, loss scale and skip. For shard none (world 1) and ddp, zero1, zero2 and fsdp at
   world 1 and 2, in fp32 and bf16; `--offload params` too for fsdp, with
   reshard_after_forward 1 and 0; `--microbatches 4` for none, zero2 and fsdp; fp16
   with an overflow at step 2 (skipped in both runs) for none and zero2; SGD with
   momentum for zero1 and fsdp; the tiny Llama (shard none, and zero2 in bf16); and two
   pipeline stages x 2 ranks (zero2 in bf16; fsdp with its params offloaded). Without
   clipping (`--clip 0`: the host updates run during the backward) for none and zero2
   in bf16 and fsdp in fp32 (its params offloaded too).
2. The bytes the runtime's copies move each step (--log's to_host_bytes and
   to_device_bytes) are those `fsc --comm` gives for the plan (its `device <-> host:`
   line), at every step, skipped or not; a plan without offload copies nothing. For
   zero2 at world 2 they follow from the units (their flat sizes, padded to the world,
   from the reduce-scatters `fsc --comm` lists): to the device, each unit's param shard
   in the compute dtype; to the host, each unit's gradient shard in the compute dtype,
   plus three 4-byte scalars (the learning rate, the clip coefficient and the AdamW step
   count, which the device computes).
3. From `fsc --mem=json` (zero2 at world 2, fsdp with either offload; bf16): the offloaded
   plan's device space holds no params in fp32 (the masters) and no optimizer state but
   the 4-byte step count; its host space holds the fp32 master shards and the
   exp_avg / exp_avg_sq shards, byte for byte the optimizer state of the plan without
   offload, less that step count. Without offload the host space is empty.
4. `--offload params` without fsdp is an error that says it needs fsdp.

usage: offload.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy)
"""
import json
import os
import re
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from trainrun import TRAIN, mpi_main, run  # noqa: E402

STEPS = 4
GPT2 = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=24"]
MODELS = {"gpt2": GPT2, "llama": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "F=64", "-D", "T=16", "-D", "V=256",
                                  "-D", "B=24"]}
SGD = ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "1e-2", "--weight_decay", "0.1", "--clip", "1.0",
       "--warmup", "2"]
LOGGED = ("loss", "lr", "grad_norm", "loss_scale", "skipped")
ELEM = {"fp32": 4, "bf16": 2, "fp16": 2}
# The AdamW step count (opt_step, i32): count_step runs on the device after the clip
# coefficient, so it stays there, and goes to the host with the lr and the coefficient.
STEP_COUNT = 4
SCALARS = 3 * 4
# How safetensors spells a dtype, as numpy reads its elements (bf16: the high half of an f32).
ST_DTYPES = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "F64": "<f8", "I32": "<i4", "I64": "<i8"}


def tensors(path):
    """A safetensors file as {name: (dtype, shape, raw bytes)}; a pipeline's, from its
    stages' files (a param two stages hold, the tied embedding, is the same in both)."""
    if not os.path.exists(path):
        out = {}
        for k in range(1, 9):
            shard = path.replace(".safetensors", "-%05d-of-%05d.safetensors")
            for n in range(k, 9):
                if os.path.exists(shard % (k, n)):
                    out.update(tensors(shard % (k, n)))
        return out
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    data = blob[8 + n:]
    return {name: (t["dtype"], t["shape"], data[t["data_offsets"][0]:t["data_offsets"][1]])
            for name, t in header.items() if name != "__metadata__"}


def values(dtype, raw):
    """A tensor's elements as numbers (to print the ones that differ)."""
    a = np.frombuffer(raw, dtype=ST_DTYPES[dtype])
    return (a.astype(np.uint32) << 16).view(np.float32) if dtype == "BF16" else a


def copies(comm):
    """(bytes to the host, bytes to the device) per step from `fsc --comm`; (0, 0) when
    it lists no copies. With pipeline stages, the last stage's: its first rank logs."""
    found = re.findall(r"device <-> host: (\d+) copies, ([\d,]+) bytes \([^)]*\) to the host, ([\d,]+) bytes \([^)]*\) "
                       r"to the device", comm)
    return (int(found[-1][1].replace(",", "")), int(found[-1][2].replace(",", ""))) if found else (0, 0)


def units(comm, elem):
    """Each unit's flat size (elements, padded to the world) from the reduce-scatters of
    its gradient in `fsc --comm` (bytes of the whole flat gradient in the reduce dtype)."""
    return {m.group(1): int(m.group(2).replace(",", "")) // elem
            for m in re.finditer(r"reduce_scatter\s+(\S+)\.flat_grad_shard\s+[a-z -]+?\s+([\d,]+)\s", comm)}


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data

    def compile(self, world, extra, offload, what="--comm", optim=TRAIN):
        model = "llama" if "llama" in extra else "gpt2"
        extra = [x for x in extra if x != "llama"]
        tag = re.sub(r"[^A-Za-z0-9]+", "-", "%s-%d-%s-%s-%s" % (model, world, "-".join(extra), offload, optim[1]))
        plan = os.path.join(self.work, tag + ".plan")
        out = run([self.fsc, "samples/%s.fsm" % model, *MODELS[model], *optim, *extra, "--world", str(world),
                   "--offload", offload, what, "-q"] + (["-o", plan] if what == "--comm" else [])).stdout
        return tag, plan, out

    def train(self, world, extra, offload, debug=(), optim=TRAIN):
        """(the saved tensors, the logged steps, the plan's --comm listing)"""
        tag, plan, comm = self.compile(world, extra, offload, optim=optim)
        out, log = (os.path.join(self.work, tag + ext) for ext in (".safetensors", ".jsonl"))
        cmd = [self.fsexec] + (["--nproc", str(world)] if world > 1 else [])
        run(cmd + [plan, "--steps", str(STEPS), "--save-weights", out, "--log", log, "--data-order", "sequential",
                   "--threads", "1", "--data", self.data, *debug])
        with open(log) as f:
            logged = [json.loads(line) for line in f]
        return tensors(out), logged, comm

    def mem(self, world, extra, offload):
        return json.loads(self.compile(world, extra, offload, "--mem=json")[2])


def counted(what, logged, comm):
    """Every step's copies, as the runtime counted them, are the plan's."""
    want = copies(comm)
    for rec in logged:
        got = (rec.get("to_host_bytes", 0), rec.get("to_device_bytes", 0))
        if got != want:
            sys.exit("FAIL %s: step %d copied %d bytes to the host and %d to the device; fsc --comm says %d and %d"
                     % (what, rec["step"], *got, *want))
    return want


def same(what, got, ref):
    """got and ref are train()'s: every tensor byte for byte, every step's log exactly."""
    (gt, gl, _), (rt, rl, _) = got, ref
    if set(gt) != set(rt):
        sys.exit("FAIL %s: saved %s, without offload %s" % (what, sorted(gt), sorted(rt)))
    for name, (dtype, shape, raw) in rt.items():
        if gt[name][:2] != (dtype, shape):
            sys.exit("FAIL %s: %s saved as %s %s, without offload %s %s" % (what, name, *gt[name][:2], dtype, shape))
        if gt[name][2] != raw:
            bits = "<u%d" % np.dtype(ST_DTYPES[dtype]).itemsize
            bad = np.flatnonzero(np.frombuffer(gt[name][2], bits) != np.frombuffer(raw, bits))
            a, b = values(dtype, gt[name][2]), values(dtype, raw)
            i = bad[0]
            sys.exit("FAIL %s: param %s differs from the run without offload in %d of %d elements; first at "
                     "[%d]: %r, without offload %r (max abs diff %.3e)"
                     % (what, name, len(bad), len(a), i, a[i], b[i],
                        np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)))))
    if len(gl) != STEPS or len(rl) != STEPS:
        sys.exit("FAIL %s: %d logged steps, without offload %d (want %d)" % (what, len(gl), len(rl), STEPS))
    for g, r in zip(gl, rl):
        for key in LOGGED:
            if g.get(key) != r.get(key):
                sys.exit("FAIL %s: step %d's %s is %r, without offload %r" % (what, r["step"], key, g.get(key),
                                                                              r.get(key)))


def cases():
    """(world, fsc flags, offloads to compare with none, fsexec flags, optimizer flags)"""
    out = []
    for precision in ("fp32", "bf16"):
        p = ["--precision", precision]
        out.append((1, ["--shard", "none"] + p, ["optimizer"]))
        for shard in ("ddp", "zero1", "zero2", "fsdp"):
            for world in (1, 2):
                out.append((world, ["--shard", shard] + p, ["optimizer"] + (["params"] if shard == "fsdp" else [])))
    out += [(2, ["--shard", "fsdp", "--reshard_after_forward", "0", "--precision", "bf16"], ["optimizer", "params"]),
            (1, ["--shard", "fsdp", "--reshard_after_forward", "0"], ["params"])]
    out += [(1, ["--shard", "none", "--microbatches", "4"], ["optimizer"]),
            (2, ["--shard", "zero2", "--microbatches", "4"], ["optimizer"]),
            (2, ["--shard", "fsdp", "--microbatches", "4"], ["optimizer", "params"]),
            (2, ["--shard", "fsdp", "--microbatches", "4", "--precision", "bf16"], ["params"])]
    out += [(2, ["llama", "--shard", "zero2", "--precision", "bf16"], ["optimizer"]),
            (1, ["llama", "--shard", "none"], ["optimizer"]),
            (4, ["--stages", "2", "--microbatches", "4", "--shard", "zero2", "--precision", "bf16"], ["optimizer"]),
            (4, ["--stages", "2", "--microbatches", "4", "--shard", "fsdp"], ["params"])]
    # Without clipping the host updates run during the backward (passes/schedule.c).
    out += [(1, ["--shard", "none", "--precision", "bf16", "--clip", "0"], ["optimizer"]),
            (2, ["--shard", "zero2", "--precision", "bf16", "--clip", "0"], ["optimizer"]),
            (2, ["--shard", "fsdp", "--clip", "0"], ["optimizer", "params"])]
    out = [c + ([], TRAIN) for c in out]
    out += [(world, ["--shard", shard, "--precision", "fp16"], ["optimizer"], ["--debug-overflow-at", "2"], TRAIN)
            for world, shard in ((1, "none"), (2, "zero2"))]
    out += [(2, ["--shard", "zero1"], ["optimizer"], [], SGD),
            (2, ["--shard", "fsdp", "--precision", "bf16"], ["params"], [], SGD)]
    return out


def training(r):
    for world, extra, offloads, debug, optim in cases():
        flags = " ".join([x for x in extra if x != "--shard"] + debug + (["sgd"] if optim is SGD else []))
        ref = r.train(world, extra, "none", debug, optim)
        if counted("%s world %d without offload" % (flags, world), ref[1], ref[2]) != (0, 0):
            sys.exit("FAIL %s world %d: the plan without offload copies between device and host:\n%s"
                     % (flags, world, ref[2]))
        if debug and [rec.get("skipped", False) for rec in ref[1]] != [False, True, False, False]:
            sys.exit("FAIL %s world %d: step 2 was not the one skipped: %s" % (flags, world, ref[1]))
        for offload in offloads:
            what = "%s world %d offload %s" % (flags, world, offload)
            got = r.train(world, extra, offload, debug, optim)
            to_host, to_device = counted(what, got[1], got[2])
            if not to_host > SCALARS or not to_device > 0:
                sys.exit("FAIL %s: the plan copies %d bytes to the host and %d to the device a step:\n%s"
                         % (what, to_host, to_device, got[2]))
            same(what, got, ref)
            print("ok   %-58s bitwise equal; %6d bytes to the host, %6d to the device a step"
                  % (what, to_host, to_device))


def formula(r):
    """zero2 at world 2: the copies move each unit's shard in the compute dtype."""
    world = 2
    for precision in ("fp32", "bf16"):
        extra = ["--shard", "zero2", "--precision", precision]
        elem = ELEM[precision]
        sizes = units(r.compile(world, extra, "none")[2], elem)
        count = r.mem(world, extra, "none")["params"]["count"]
        padded = sum(sizes.values())
        if not sizes or any(n % world for n in sizes.values()) or not count <= padded < count + world * len(sizes):
            sys.exit("FAIL zero2 %s: units %s (padded to world %d) do not hold the %d params"
                     % (precision, sizes, world, count))
        shards = sum(n // world for n in sizes.values())
        got = copies(r.compile(world, extra, "optimizer")[2])
        want = (elem * shards + SCALARS, elem * shards)
        if got != want:
            sys.exit("FAIL zero2 %s world 2: %d bytes to the host and %d to the device a step; the units %s make "
                     "%d and %d (%d-byte elements, %d per rank)" % (precision, *got, sizes, *want, elem, shards))
        print("ok   zero2 %s world 2: units %s; %d bytes to the device (%d x %d), %d to the host (+ %d)"
              % (precision, sizes, want[1], elem, shards, want[0], SCALARS))


def categories(d, space):
    return {c["key"]: c["max"] for c in (d["host"] if space == "host" else d)["categories"]}


def memory(r):
    world = 2
    for shard, offload in (("zero2", "optimizer"), ("fsdp", "optimizer"), ("fsdp", "params")):
        extra = ["--shard", shard, "--precision", "bf16"]
        what = "%s bf16 world 2 offload %s" % (shard, offload)
        shards = sum(n // world for n in units(r.compile(world, extra, "none")[2], ELEM["bf16"]).values())
        off, on = r.mem(world, extra, "none"), r.mem(world, extra, offload)
        off_dev, on_dev, on_host = categories(off, "device"), categories(on, "device"), categories(on, "host")
        if off["host"]["arena_bytes"] or any(categories(off, "host").values()):
            sys.exit("FAIL %s: the plan without offload has a host space: %s" % (what, off["host"]))
        if on_dev["params"] or on_dev["opt_state"] != STEP_COUNT:  # "params": fp32 params, masters included
            sys.exit("FAIL %s: the device space holds fp32 params %d and optimizer state %d bytes (want "
                     "0 and the %d-byte step count)" % (what, on_dev["params"], on_dev["opt_state"], STEP_COUNT))
        if on_host["opt_state"] != off_dev["opt_state"] - STEP_COUNT or on_host["opt_state"] != 2 * 4 * shards:
            sys.exit("FAIL %s: the host's optimizer state is %d bytes; without offload the device's is %d (with the "
                     "%d-byte step count); exp_avg and exp_avg_sq of %d fp32 elements are %d"
                     % (what, on_host["opt_state"], off_dev["opt_state"], STEP_COUNT, shards, 8 * shards))
        if on_host["params"] != 4 * shards:
            sys.exit("FAIL %s: the host holds %d bytes of fp32 params; the fp32 shards are %d"
                     % (what, on_host["params"], 4 * shards))
        if not on["arena_bytes"] < off["arena_bytes"]:
            sys.exit("FAIL %s: the device arena is %d bytes, %d without offload" % (what, on["arena_bytes"],
                                                                                  off["arena_bytes"]))
        print("ok   %-34s device arena %d -> %d bytes (saves %d: params %d -> %d, optimizer state %d -> %d); "
              "host arena %d" % (what, off["arena_bytes"], on["arena_bytes"], off["arena_bytes"] - on["arena_bytes"],
                                 off_dev["params"], on_dev["params"], off_dev["opt_state"], on_dev["opt_state"],
                                 on["host"]["arena_bytes"]))


def errors(r):
    for shard in ("none", "ddp", "zero1", "zero2"):
        res = run([r.fsc, "samples/gpt2.fsm", *GPT2, "--world", "2", "--shard", shard, "--offload", "params", "-q"],
                  ok=False)
        if res.returncode == 0 or "error:" not in res.stdout or "--shard fsdp" not in res.stdout:
            sys.exit("FAIL: --offload params with --shard %s says (exit %d):\n%s" % (shard, res.returncode, res.stdout))
    print("ok   --offload params without fsdp is an error that names fsdp")


def main():
    mpi_main(Runner, [errors, memory, formula, training],
             "offload trains bit for bit like no offload, and copies what the plan says")


if __name__ == "__main__":
    main()
