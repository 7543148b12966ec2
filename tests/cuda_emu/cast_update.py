#!/usr/bin/env python3
"""cast_in_update on the device, without a GPU: a 16-bit plan whose update writes the 16-bit
params (adamw_cast, sgd_cast: codegen/kernels/optim.cuh; --cast_in_update 1, the default)
trains with `--device cuda` on the cuda-emu backend as the same plan with a cast of each
unit's master per step (--cast_in_update 0): the same losses, the same skipped step, and
the same saved weights, to the bit (AdamW and SGD, bf16 and fp16 with a forced overflow,
fsdp). The CPU side of the same comparison is tests/unit/test_cast_update.c; op_check
(the cuda_emu_* tests) compares adamw_cast's w with the CPU backend's, op by op.

usage: cast_update.py FSC FSEXEC LIBFS_CUDAEMU WORKDIR   (/usr/bin/python3 with numpy)
"""
import json
import os
import sys

import numpy as np

from train import SGD, STEPS, TINY, run, safetensors


def cast_in_update(fsc, fsexec, work, env):
    """adamw_cast and sgd_cast on the device (codegen/kernels/optim.cuh): the plan with the
    update writing the 16-bit params against the plan that casts them each step."""
    cases = [("adamw_bf16", ["--optimizer", "adamw", "--precision", "bf16"], []),
             ("sgd_fp16_overflow", [*SGD, "--precision", "fp16"], ["--debug-overflow-at", "3"]),
             ("adamw_bf16_fsdp", ["--optimizer", "adamw", "--precision", "bf16", "--shard", "fsdp"], [])]
    for name, args, extra in cases:
        got = []
        for on in ("1", "0"):
            plan, st, log = (os.path.join(work, "cast_%s_%s.%s" % (name, on, ext)) for ext in ("plan", "st", "jsonl"))
            run([fsc, "samples/gpt2.fsm", *TINY, *args, "--cast_in_update", on, "-o", plan, "-q"])
            out = run([fsexec, plan, "--device", "cuda", "--steps", str(STEPS), "--save-weights", st, "--log", log,
                       *extra], env)
            if "device: cuda" not in out:
                sys.exit("FAIL cast_in_update %s: fsexec did not run on the (emulated) CUDA backend:\n%s" % (name, out))
            with open(log) as f:
                got.append(([(r["loss"], bool(r.get("skipped"))) for r in map(json.loads, f)], safetensors(st)))
        (la, wa), (lb, wb) = got
        differ = sorted(k for k in wb if k not in wa or not np.array_equal(wa[k], wb[k]))
        if la != lb or len(la) != STEPS or differ or not wb:
            sys.exit("FAIL cast_in_update %s on cuda: losses %s vs %s, weights differ: %s" % (name, la, lb, differ))
    print("ok   cast_in_update: the update's 16-bit params train as the per-step casts, to the bit, on cuda")


if __name__ == "__main__":
    fsc, fsexec, emu, work = sys.argv[1:5]
    os.makedirs(work, exist_ok=True)
    cast_in_update(fsc, fsexec, work, dict(os.environ, FS_CUDA_BACKEND=os.path.abspath(emu)))
