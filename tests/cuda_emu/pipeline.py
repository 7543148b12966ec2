#!/usr/bin/env python3
"""Pipelines on CUDA ranks, without a GPU: each plan of pipeline stages runs under
`fsexec --nproc W --device cuda` on the cuda-emu backend (its kernels in the emulator,
NCCL's collectives and its point-to-point sends and receives over MPI:
tests/cuda_emu/nccl_emu.c) and under `--device cpu`, and the two train alike.

Cases: 2 and 4 stages x 1 and 2 data-parallel ranks; GPipe, 1F1B, interleaved 1F1B (2
model chunks a stage) and ZB-H1; fp32 and bf16; ddp, zero1, zero2 and fsdp over the
data-parallel ranks, and zero2 over hybrid shard groups (2 of a stage's 4 ranks);
GPT-2's embedding tied to its head (held by the first and the last stage: its gradients
summed over the pipeline by NCCL); one run with --cuda-graph (the emulator replays a
graph as the same ops: this checks fsexec's graph path takes a pipeline, not NCCL's
capture). Tiny dims and 3 SGD steps keep it fast on two cores. Checks, per case: every step's loss and gradient norm, and every
saved param tensor (norm of the difference over norm), within the tolerances of the CPU
pipeline test (tests/mpi/pipeline.py): 1e-5 in fp32; in bf16 5e-2 per tensor, 2e-3 for
all params together and 5e-3 for losses and norms. The CUDA run must say it ran on the
emulated device, and the tied embedding must be bitwise equal in both stages' files.

usage: pipeline.py FSC FSEXEC LIBFS_CUDAEMU   (/usr/bin/python3 with numpy and torch; mpirun)
"""
import json
import os
import re
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
import trainrun  # noqa: E402
from trainrun import compare, load_stages, mpi_main, run  # noqa: E402

trainrun.STEPS = 3  # compare() counts the logged steps against it
SGD = ["--optimizer", "sgd", "--lr", "0.05", "--momentum", "0.9"]
GPT2 = ["samples/gpt2.fsm", "-D", "L=4", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256"]
MLP = ["samples/mlp.fsm", "-D", "B=16", "-D", "H=16"]


def case(model, stages, dp, sched, prec="fp32", shard="none", mb=None, layers=None, graph=False, group=None):
    args = [*model, "-D", "B=%d" % (8 * dp) if model is GPT2 else "B=%d" % (16 * dp)]
    args += ["-D", "L=%d" % layers] if layers else []
    mb = mb or (2 * stages if sched == "interleaved" else stages)
    args += ["--stages", str(stages), "--world", str(stages * dp), "--microbatches", str(mb), "--schedule", sched,
             "--precision", prec, "--shard", shard, *SGD]
    args += ["--chunks", "2"] if sched == "interleaved" else []
    args += ["--shard_group", str(group)] if group else []
    return args, stages * dp, ["--cuda-graph"] if graph else []


CASES = [
    case(GPT2, 2, 1, "gpipe"),
    case(GPT2, 2, 1, "1f1b", "bf16", graph=True),
    case(MLP, 2, 1, "interleaved", layers=4),
    case(MLP, 2, 1, "zb1", "bf16", layers=4),
    case(MLP, 4, 1, "1f1b", layers=4),
    case(MLP, 4, 1, "zb1", layers=4),
    case(MLP, 4, 1, "interleaved", "bf16", layers=8),
    case(GPT2, 2, 2, "1f1b", shard="zero2"),
    case(MLP, 2, 2, "gpipe", shard="ddp", layers=4),
    case(MLP, 2, 2, "interleaved", shard="zero1", layers=4),
    case(MLP, 2, 2, "zb1", "bf16", shard="fsdp", layers=4),
    case(MLP, 4, 2, "1f1b", "bf16", shard="zero2", layers=4),
    case(MLP, 2, 4, "1f1b", shard="zero2", layers=2, group=2),  # hybrid: shard and replica groups inside a stage
]


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data

    def train(self, tag, args, world, device, flags=()):
        plan, out, log = (os.path.join(self.work, tag + ext) for ext in (".plan", ".%s.safetensors" % device,
                                                                           ".%s.jsonl" % device))
        if device == "cpu":
            run([self.fsc, *args, "-o", plan, "-q"])
        data = ["--data", self.data] if args[0] == GPT2[0] else []
        r = run([self.fsexec, "--nproc", str(world), plan, "--device", device, "--steps", str(trainrun.STEPS),
                 "--threads", "1", "--data-order", "sequential", "--save-weights", out, "--log", log, *data,
                 *flags])
        if device == "cuda" and "device: cuda" not in r.stdout:
            sys.exit("FAIL %s: fsexec did not run on the (emulated) CUDA backend:\n%s" % (tag, r.stdout[-3000:]))
        with open(log) as f:
            logged = [(x["loss"], x["grad_norm"]) for x in map(json.loads, f)]
        params, copies = load_stages(out)
        return params, logged, copies


def training(r):
    for args, world, flags in CASES:
        what = "%s world %d: %s" % (os.path.basename(args[0])[:-4], world,
                                   " ".join(a for a in args[args.index("--stages"):] if a not in SGD))
        what += " " + " ".join(flags) if flags else ""
        tag = re.sub(r"[^A-Za-z0-9]+", "-", what)
        cpu, cuda = r.train(tag, args, world, "cpu"), r.train(tag, args, world, "cuda", flags)
        if "bf16" in args:
            compare(what, cuda, cpu, {}, 5e-2, whole_tol=2e-3, loss_tol=5e-3, ref_name="the CPU run")
        else:
            compare(what, cuda, cpu, {}, 1e-5, ref_name="the CPU run")
        for name, c in cuda[2].items():  # a tied param: the stages' copies stay one
            if any(not np.array_equal(c[0].numpy().view(np.uint32), x.numpy().view(np.uint32)) for x in c[1:]):
                sys.exit("FAIL %s: the stages' copies of %s differ" % (what, name))
        if args[0] == GPT2[0] and "wte" not in cuda[2]:
            sys.exit("FAIL %s: the tied wte is not in two stages' files" % what)


def main():
    os.environ.update(FS_CUDA_BACKEND=os.path.abspath(sys.argv[3]), FS_CUDA_EMU_ORDER="forward",
                      FS_CUDA_EMU_MEASURE="0")
    mpi_main(Runner, [training], "pipelines train on (emulated) CUDA ranks as on CPU ranks")


if __name__ == "__main__":
    main()
