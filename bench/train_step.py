#!/usr/bin/python3
"""One GPT-2 training step: fsexec vs PyTorch on CPU, and OpenBLAS's sgemm rate.

For each config (tiny, and the GPT-2 124M shape at a short context):
  - fsc compiles samples/gpt2.fsm with the config's dims; fsexec exports its initial
    weights (--steps 0 --save-weights);
  - fsexec trains WARMUP + STEPS steps with --threads N on a random token file
    (--data-order sequential); its step time is the median of the "ms" of the last STEPS
    lines of --log;
  - PyTorch (tests/py/models.py, the same model, the same initial weights, the same
    batches) trains WARMUP + STEPS steps with torch.set_num_threads(N): forward, backward,
    clip_grad_norm_, AdamW; median wall time of the last STEPS;
  - OpenBLAS sgemm on a square GEMM (2048^3 by default), N threads, best of a few runs:
    with numpy when numpy's BLAS is OpenBLAS (checked in /proc/self/maps), else with a
    small C program compiled on the fly against -lopenblas (--sgemm c forces it).
Reported: both step times, fsexec / PyTorch, and fsexec's useful FLOP rate as a fraction
of the sgemm rate, with

    useful FLOPs per step = 6 * P * B * T  +  12 * L * C * T^2 * B

(P = every parameter, the tied wte counted once; 6 = forward 2 + backward 4 per multiply-
add; the second term is attention's q k^T and a v over the full T x T square, forward and
backward, as in nanoGPT's estimate_mfu and PaLM's appendix B; a causal-only count would
halve it). Embedding lookups, norms, softmax, GELU and AdamW count as zero.

usage: /usr/bin/python3 bench/train_step.py --fsc build/fsc --fsexec build/fsexec [--threads N]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
sys.dont_write_bytecode = True   # no __pycache__ in the source tree

CONFIGS = {
    "tiny": {"L": 4, "C": 128, "NH": 4, "T": 64, "V": 512, "B": 4},
    "124m": {"L": 12, "C": 768, "NH": 12, "T": 64, "V": 50257, "B": 4},
}
TIMED_STEPS = {"tiny": 20, "124m": 5}   # default --steps: a tiny step is ~20 ms, a 124M one ~2 s
HP = {"optimizer": "adamw", "lr": 6e-4, "beta1": 0.9, "beta2": 0.95, "eps": 1e-8, "weight_decay": 0.1,
      "clip": 1.0, "lr_schedule": "cosine", "warmup": 2, "min_lr": 6e-5, "steps": 1000}

SGEMM_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
enum { RowMajor = 101, NoTrans = 111 };
void cblas_sgemm(int, int, int, int, int, int, float, const float *, int, const float *, int, float,
                 float *, int);
void openblas_set_num_threads(int);
static double now(void) { struct timespec t; clock_gettime(CLOCK_MONOTONIC, &t); return t.tv_sec + 1e-9 * t.tv_nsec; }
int main(int argc, char **argv) {
    int n = atoi(argv[1]), threads = atoi(argv[2]), reps = atoi(argv[3]);
    openblas_set_num_threads(threads);
    float *a = malloc(sizeof(float) * n * n), *b = malloc(sizeof(float) * n * n), *c = malloc(sizeof(float) * n * n);
    for (long i = 0; i < (long)n * n; i++) a[i] = (float)(i % 7) * 0.1f, b[i] = (float)(i % 5) * 0.1f;
    double best = 1e30;
    for (int r = 0; r < reps + 1; r++) {
        double t0 = now();
        cblas_sgemm(RowMajor, NoTrans, NoTrans, n, n, n, 1.0f, a, n, b, n, 0.0f, c, n);
        double t = now() - t0;
        if (r > 0 && t < best) best = t;
    }
    printf("%.6f\n", best);
    return c[0] == 12345.0f;
}
"""

SGEMM_NUMPY = r"""
import sys, time
import numpy as np
n, reps = int(sys.argv[1]), int(sys.argv[2])
a = np.random.default_rng(0).standard_normal((n, n), dtype=np.float32)
b = np.random.default_rng(1).standard_normal((n, n), dtype=np.float32)
a @ b
maps = open("/proc/self/maps").read()
lib = "openblas" if "openblas" in maps.lower() else "other"
best = 1e30
for _ in range(reps):
    t0 = time.perf_counter(); a @ b; best = min(best, time.perf_counter() - t0)
print(lib, best)
"""


def sh(cmd, **kw):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)
    if r.returncode != 0:
        sys.exit(f"train_step.py: command exited {r.returncode}: {' '.join(cmd)}\n{r.stdout}")
    return r.stdout


def sgemm_rate(n, threads, how, work):
    """(GFLOP/s, description) of an n^3 sgemm with OpenBLAS on `threads` threads."""
    env = dict(os.environ, OPENBLAS_NUM_THREADS=str(threads), OMP_NUM_THREADS=str(threads))
    if how in ("auto", "numpy"):
        out = sh([sys.executable, "-c", SGEMM_NUMPY, str(n), "5"], env=env).split()
        if out[0] == "openblas":
            return 2.0 * n ** 3 / float(out[1]) / 1e9, "numpy (linked to OpenBLAS, seen in /proc/self/maps)"
        if how == "numpy":
            sys.exit("train_step.py: numpy's BLAS is not OpenBLAS")
    src, exe = os.path.join(work, "sgemm.c"), os.path.join(work, "sgemm")
    with open(src, "w") as f:
        f.write(SGEMM_C)
    sh(["cc", "-O2", "-o", exe, src, "-lopenblas"])
    t = float(sh([exe, str(n), str(threads), "5"], env=env))
    return 2.0 * n ** 3 / t / 1e9, "a C program calling cblas_sgemm, linked with -lopenblas"


def bench_config(name, dims, args, work):
    import numpy as np
    import torch
    import models

    wd = os.path.join(work, name)
    os.makedirs(wd, exist_ok=True)
    B, T, V, C, L, NH = (dims[k] for k in ("B", "T", "V", "C", "L", "NH"))
    timed = args.steps or TIMED_STEPS.get(name, 5)
    nsteps = args.warmup + timed

    cmd = [args.fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), "-q", "-o", "gpt2.plan"]
    for k, v in dims.items():
        cmd += ["-D", f"{k}={v}"]
    for k, v in HP.items():
        cmd += [f"--{k}", str(v)]
    sh(cmd, cwd=wd)
    n_tok = max(4 * B * T * nsteps, 4096)
    np.random.default_rng(0).integers(0, V, size=n_tok, dtype=np.uint16).astype("<u2").tofile(
        os.path.join(wd, "tokens.bin"))

    base = [args.fsexec, "gpt2.plan", "--data", "tokens.bin", "--data-order", "sequential",
            "--threads", str(args.threads)]
    sh(base + ["--steps", "0", "--save-weights", "init.safetensors"], cwd=wd)
    t0 = time.perf_counter()
    sh(base + ["--steps", str(nsteps), "--log", "log.jsonl"], cwd=wd)
    fs_wall = time.perf_counter() - t0
    with open(os.path.join(wd, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    fs_ms = [r["ms"] for r in rows[args.warmup:]]

    init = models.load_safetensors(os.path.join(wd, "init.safetensors"))
    P = sum(t.numel() for t in init.values())
    tok = models.read_tokens(os.path.join(wd, "tokens.bin"))
    params = {k: v.clone() for k, v in init.items()}
    del init
    plist = list(params.values())
    for t in plist:
        t.requires_grad_(True)
    opt = torch.optim.AdamW(plist, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"],
                            weight_decay=HP["weight_decay"])
    pt_ms, pt_loss = [], []
    for s in range(1, nsteps + 1):
        x, y = models.sequential_batch(tok, s, B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = models.gpt2_loss(params, x, y, L, NH)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, HP["clip"])
        for g in opt.param_groups:
            g["lr"] = models.lr_at(s, HP["lr"], HP["warmup"], HP["steps"], HP["min_lr"])
        opt.step()
        pt_ms.append((time.perf_counter() - t0) * 1e3)
        pt_loss.append(float(loss))
    del params, plist, opt

    flops = 6.0 * P * B * T + 12.0 * L * C * T * T * B
    return {"name": name, "dims": dims, "timed": timed, "params": P, "flops": flops,
            "fs_ms": statistics.median(fs_ms), "fs_all": [r["ms"] for r in rows], "fs_wall": fs_wall,
            "pt_ms": statistics.median(pt_ms[args.warmup:]), "pt_all": pt_ms,
            "loss_fs": rows[0]["loss"], "loss_pt": pt_loss[0]}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fsc", required=True)
    ap.add_argument("--fsexec", required=True)
    ap.add_argument("--threads", type=int, default=os.cpu_count())
    ap.add_argument("--steps", type=int, default=0, help="timed steps, median taken (default: tiny 20, 124m 5)")
    ap.add_argument("--warmup", type=int, default=2, help="untimed steps first")
    ap.add_argument("--configs", default="tiny,124m")
    ap.add_argument("--sgemm-n", type=int, default=2048)
    ap.add_argument("--sgemm", choices=("auto", "numpy", "c"), default="auto")
    ap.add_argument("--omp-wait", choices=("default", "passive"), default="default",
                    help="passive: OMP_WAIT_POLICY=PASSIVE for fsexec, torch and sgemm alike (idle OpenMP "
                         "threads sleep instead of spinning; matters when OpenBLAS's own threads share the cores)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    args = ap.parse_args()
    args.fsc, args.fsexec = os.path.abspath(args.fsc), os.path.abspath(args.fsexec)

    # The same OpenBLAS thread count for every party; then torch's own.
    os.environ["OPENBLAS_NUM_THREADS"] = str(args.threads)
    if args.omp_wait == "passive":
        os.environ["OMP_WAIT_POLICY"] = "PASSIVE"   # before torch loads libgomp; inherited by fsexec
    try:
        import torch
    except ImportError as e:
        sys.exit(f"train_step.py: cannot import torch ({e}); use Debian's /usr/bin/python3 with python3-torch")
    torch.set_num_threads(args.threads)

    load0 = " ".join(open("/proc/loadavg").read().split()[:3]) if os.path.exists("/proc/loadavg") else "?"
    with tempfile.TemporaryDirectory(prefix="fs-bench-") as work:
        gflops, how = sgemm_rate(args.sgemm_n, args.threads, args.sgemm, work)
        results = [bench_config(c, CONFIGS[c], args, work) for c in args.configs.split(",")]

    print(f"threads {args.threads} | OMP_WAIT_POLICY {os.environ.get('OMP_WAIT_POLICY', '(unset)')} | "
          f"load average before: {load0} | torch {torch.__version__} (threads {torch.get_num_threads()}) | "
          f"cpu: {cpu_name()}")
    print(f"OpenBLAS sgemm {args.sgemm_n}^3: {gflops:.1f} GFLOP/s (best of 5), measured with {how}")
    print(f"step time: median of the timed steps after {args.warmup} warm-up steps; useful FLOPs per step = "
          f"6*P*B*T + 12*L*C*T^2*B")
    hdr = (f"{'config':6} {'params':>12} {'B':>2} {'T':>4} {'steps':>5} {'GFLOP/step':>10} {'fsexec ms':>10} {'torch ms':>10} "
           f"{'fs/torch':>8} {'fs GFLOP/s':>10} {'of sgemm':>8} {'torch GFLOP/s':>13}")
    print(hdr)
    for r in results:
        d = r["dims"]
        fs_rate = r["flops"] / (r["fs_ms"] / 1e3) / 1e9
        pt_rate = r["flops"] / (r["pt_ms"] / 1e3) / 1e9
        print(f"{r['name']:6} {r['params']:12,d} {d['B']:2d} {d['T']:4d} {r['timed']:5d} {r['flops'] / 1e9:10.2f} "
              f"{r['fs_ms']:10.2f} {r['pt_ms']:10.2f} {r['fs_ms'] / r['pt_ms']:8.2f} {fs_rate:10.1f} "
              f"{fs_rate / gflops:8.1%} {pt_rate:13.1f}")
        r.update(fs_gflops=fs_rate, pt_gflops=pt_rate, fs_over_pt=r["fs_ms"] / r["pt_ms"],
                 fs_fraction_of_sgemm=fs_rate / gflops)
    for r in results:
        print(f"{r['name']}: every step's ms: fsexec {[round(x, 1) for x in r['fs_all']]}, "
              f"torch {[round(x, 1) for x in r['pt_all']]}; step-1 loss fsexec {r['loss_fs']:.6f} "
              f"torch {r['loss_pt']:.6f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "sgemm_gflops": gflops, "sgemm_how": how, "results": results}, f,
                      indent=1)
    return 0


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
        return m.group(1).strip() if m else "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
