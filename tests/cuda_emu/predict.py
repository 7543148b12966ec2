#!/usr/bin/env python3
"""fsexec --predict on CUDA ranks, without a GPU: the evaluation program with
`--device cuda` on the cuda-emu backend (its kernels in the emulator, its GEMMs as the
cuBLAS calls, NCCL over MPI: tests/cuda_emu/nccl_emu.c) against the same plan's
`--device cpu` predictions.

The models: tests/py/predict.py's (three inputs, two outputs `logits` and `h`, N = 52
samples in batches of 8: the last batch cut) trained 3 SGD steps on the CPU, and
samples/vit.fsm at tests/py/vit.py's small dims (attention, exact GELU, layernorm, the
CLS slice) at its init. Cases: world 1 fp32; --cuda-graph (the batches replay one
captured step with new inputs); a bf16 plan (its evaluation program computes in bf16 as
its training does: 1e-2, where a kernel may round an element the other way); world 2 under fsdp (each rank its rows, the
params all-gathered by NCCL) and a 2-stage pipeline (the stages' activations by NCCL's
send and receive), both with `fsexec --nproc 2`; the ViT. Checks, per case: fsexec says
it wrote each file on the emulated device, every output file has the CPU run's shape and
dtype, and its values are within 1e-5 of the CPU run's of the same plan and world
(max|a - b| / max|b|: fp32 kernels that sum in another order).

usage: predict.py FSC FSEXEC LIBFS_CUDAEMU   (/usr/bin/python3 with numpy and torch; mpirun
for the world-2 cases, skipped without it)
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "py"))
sys.dont_write_bytecode = True
from mpienv import quiet_mpi_leaks  # noqa: E402
from predict import B, D, H, K, LR, MODEL, N  # noqa: E402  tests/py/predict.py's model
from vit import DIMS, SAMPLE, dims_flags  # noqa: E402

TOL = 1e-5
BF16_TOL = 1e-2


def run(cmd):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode:
        sys.exit("FAIL (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def predict(fsexec, plan, world, device, weights, data, out, flags=()):
    cmd = [fsexec, plan] if world == 1 else [fsexec, "--nproc", str(world), plan]
    said = run(cmd + ["--predict", "--device", device, "--threads", "1", "--load-weights", weights, "--data", data,
                      "--out", out, *flags])
    if device == "cuda" and " on cuda-emu" not in said:
        sys.exit("FAIL %s: --predict did not run on the (emulated) CUDA device:\n%s" % (plan, said[-3000:]))
    return said


def compare(what, names, cpu_out, cuda_out, tol=TOL):
    worst = 0.0
    for name in names:
        a, b = np.load(cuda_out(name)), np.load(cpu_out(name))
        if a.shape != b.shape or a.dtype != b.dtype:
            sys.exit("FAIL %s: %s is %s %s on the device, %s %s on the CPU" % (what, name, a.dtype, a.shape, b.dtype,
                                                                             b.shape))
        err = float(np.abs(a.astype(np.float64) - b).max() / max(float(np.abs(b).max()), 1e-30))
        if not np.isfinite(a).all() or err > tol:
            sys.exit("FAIL %s: %s differs from the CPU run's by %.2e (tol %g)" % (what, name, err, tol))
        worst = max(worst, err)
    print("ok   %s: %s within %.1e of the CPU run's" % (what, " and ".join(names), worst))


def main():
    fsc, fsexec, emu = (os.path.abspath(p) for p in sys.argv[1:4])
    os.environ.update(FS_CUDA_BACKEND=emu, FS_CUDA_EMU_MEASURE="0")
    quiet_mpi_leaks()
    have_mpi = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="fs_emu_predict_")
    P = lambda *a: os.path.join(work, *a)  # noqa: E731
    try:
        rng = np.random.default_rng(11)
        np.save(P("x.npy"), rng.standard_normal((N, D)).astype(np.float32))
        np.save(P("s.npy"), 0.5 * rng.standard_normal((N, D)).astype(np.float32))
        np.save(P("y.npy"), rng.integers(0, K, N).astype(np.int32))
        with open(P("p.fsm"), "w") as f:
            f.write(MODEL % (B, D, H, K, "output h;", LR))
        run([fsc, P("p.fsm"), "-q", "-o", P("p.plan")])
        run([fsexec, P("p.plan"), "--device", "cpu", "--steps", "3", "--data-order", "sequential", "--save-weights",
             P("w.st"), "--data", "x=%s,y=%s,s=%s" % (P("x.npy"), P("y.npy"), P("s.npy"))])
        data = "x=%s,s=%s" % (P("x.npy"), P("s.npy"))
        names = ("logits", "h")
        cases = [("world 1, fp32", [], 1, []), ("world 1, --cuda-graph", [], 1, ["--cuda-graph"]),
                 ("world 1, a bf16 plan", ["--precision", "bf16"], 1, [])]
        if have_mpi:
            cases += [("world 2, fsdp", ["--world", "2", "--shard", "fsdp"], 2, []),
                      ("a 2-stage pipeline", ["--world", "2", "--stages", "2", "--microbatches", "2"], 2, [])]
        else:
            print("skip world 2 and the pipeline: no mpirun")
        for k, (what, fsc_flags, world, flags) in enumerate(cases):
            plan = P("case%d.plan" % k)
            run([fsc, P("p.fsm"), "-q", "-o", plan, *fsc_flags])
            predict(fsexec, plan, world, "cpu", P("w.st"), data, P("cpu%d.npy" % k))
            predict(fsexec, plan, world, "cuda", P("w.st"), data, P("emu%d.npy" % k), flags)
            compare(what, names, lambda n: P("cpu%d.%s.npy" % (k, n)), lambda n: P("emu%d.%s.npy" % (k, n)),
                    BF16_TOL if "bf16" in fsc_flags else TOL)

        # The ViT at its init: attention, exact GELU, layernorm and the CLS slice on the device.
        d = DIMS
        np.save(P("images.npy"), rng.standard_normal((3 * d["B"] + 1, d["H"], d["W"], 3)).astype(np.float32))
        run([fsc, SAMPLE, "-q", *dims_flags(d), "-o", P("vit.plan")])
        run([fsexec, P("vit.plan"), "--steps", "0", "--save-weights", P("vit.st")])
        vdata = "images=" + P("images.npy")
        predict(fsexec, P("vit.plan"), 1, "cpu", P("vit.st"), vdata, P("vit_cpu.npy"))
        predict(fsexec, P("vit.plan"), 1, "cuda", P("vit.st"), vdata, P("vit_emu.npy"))
        compare("ViT, world 1", ("logits",), lambda n: P("vit_cpu.npy"), lambda n: P("vit_emu.npy"))
        print("predict on (emulated) CUDA ranks: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
