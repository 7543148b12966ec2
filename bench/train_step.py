#!/usr/bin/python3
"""One GPT-2 training step: fsexec vs PyTorch on CPU, and OpenBLAS's sgemm rate.

For each config (tiny, and the GPT-2 124M shape at a short context):
  - fsc compiles samples/gpt2.fsm with the config's dims, in fp32 and in bf16; fsexec
    exports its initial weights (--steps 0 --save-weights);
  - each party trains WARMUP + STEPS steps with N threads on a random token file, and its
    step time is the median of the last STEPS: fsexec fp32 and bf16 (--log's "ms"), and
    PyTorch (bench/torch_step.py: tests/py/models.py's model, the same initial weights and
    batches, forward, backward, clip_grad_norm_, AdamW) in Debian's torch 1.13 and, given
    --torch2 (a venv made by bench/venv.sh, found at /tmp/fs-bench-venv by default),
    PyTorch 2.x eager and torch.compile;
  - the parties run interleaved, one after the other, ROUNDS times (a shared machine's
    load shifts under a run), and each one's median over the rounds is reported;
  - OpenBLAS sgemm on a square GEMM (2048^3 by default), N threads, best of a few runs:
    with numpy when numpy's BLAS is OpenBLAS (checked in /proc/self/maps), else with a
    small C program compiled on the fly against -lopenblas (--sgemm c forces it);
  - --breakdown: fsexec's time by op kind, from a --trace of the timed steps;
  - --one-by-one: one more party, fsexec fp32 with --cpu-one-by-one (every op its own
    kernel call: what the runs of ops as one parallel region save).
Reported: every party's step time and FLOP rate, fsexec / each, bf16 / fp32 (and whether
the CPU has AVX-512 BF16), and fsexec's useful FLOP rate as a fraction of the sgemm rate,
with

    useful FLOPs per step = 6 * P * B * T  +  12 * L * C * T^2 * B

(P = every parameter, the tied wte counted once; 6 = forward 2 + backward 4 per multiply-
add; the second term is attention's q k^T and a v over the full T x T square, forward and
backward, as in nanoGPT's estimate_mfu and PaLM's appendix B; a causal-only count would
halve it). Embedding lookups, norms, softmax, GELU and AdamW count as zero.

usage: /usr/bin/python3 bench/train_step.py --fsc build/fsc --fsexec build/fsexec [--threads N]
           [--rounds R] [--torch2 PYTHON] [--breakdown] [--one-by-one] [--configs tiny,124m]
"""
import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

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


def median_ms(ms, warmup):
    return statistics.median(ms[warmup:])


def fsexec_ms(args, wd, plan, nsteps, extra=()):
    """Every step's ms of one fsexec run of plan (its --log), and the first loss."""
    base = [args.fsexec, plan, "--data", "tokens.bin", "--data-order", "sequential", "--threads", str(args.threads)]
    sh(base + ["--steps", str(nsteps), "--log", "log.jsonl"] + list(extra), cwd=wd)
    with open(os.path.join(wd, "log.jsonl")) as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return [r["ms"] for r in rows], rows[0]["loss"], ""


def torch_ms(python, mode, dims, args, wd, nsteps):
    """Every step's ms of one PyTorch run (bench/torch_step.py in `python`), its first loss and version."""
    out = sh([python, os.path.join(HERE, "torch_step.py"), wd, str(dims["L"]), str(dims["NH"]), str(dims["B"]),
              str(dims["T"]), str(nsteps), str(args.threads), mode, json.dumps(HP)])
    r = json.loads(out.strip().splitlines()[-1])
    return r["ms"], r["loss"], r["torch"]


def bench_config(name, dims, args, work):
    import numpy as np

    wd = os.path.join(work, name)
    os.makedirs(wd, exist_ok=True)
    B, T, V, C, L = (dims[k] for k in ("B", "T", "V", "C", "L"))
    timed = args.steps or TIMED_STEPS.get(name, 5)
    nsteps = args.warmup + timed
    for prec in ("fp32", "bf16"):
        cmd = [args.fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), "-q", "-o", f"gpt2_{prec}.plan",
               "--precision", prec]
        for k, v in dims.items():
            cmd += ["-D", f"{k}={v}"]
        for k, v in HP.items():
            cmd += [f"--{k}", str(v)]
        sh(cmd, cwd=wd)
    n_tok = max(4 * B * T * nsteps, 4096)
    np.random.default_rng(0).integers(0, V, size=n_tok, dtype=np.uint16).astype("<u2").tofile(
        os.path.join(wd, "tokens.bin"))
    sh([args.fsexec, "gpt2_fp32.plan", "--steps", "0", "--save-weights", "init.safetensors"], cwd=wd)
    with open(os.path.join(wd, "init.safetensors"), "rb") as f:  # every param, from the header
        head = json.loads(f.read(int.from_bytes(f.read(8), "little")))
    P = sum(int(np.prod(v["shape"])) for k, v in head.items() if k != "__metadata__")

    parties = {"fsexec": lambda: fsexec_ms(args, wd, "gpt2_fp32.plan", nsteps),
               "fsexec bf16": lambda: fsexec_ms(args, wd, "gpt2_bf16.plan", nsteps),
               **({"fsexec 1-by-1": lambda: fsexec_ms(args, wd, "gpt2_fp32.plan", nsteps, ["--cpu-one-by-one"])}
                  if args.one_by_one else {}),
               "torch1": lambda: torch_ms(sys.executable, "eager", dims, args, wd, nsteps)}
    if args.torch2:
        parties["torch2 eager"] = lambda: torch_ms(args.torch2, "eager", dims, args, wd, nsteps)
        parties["torch2 compile"] = lambda: torch_ms(args.torch2, "compile", dims, args, wd, nsteps)
    rounds = {k: [] for k in parties}
    first = {}
    for _ in range(args.rounds):  # interleaved: each party once a round; the median of the rounds
        for k, run in parties.items():
            ms, loss, version = run()
            rounds[k].append(median_ms(ms, args.warmup))
            first[k] = (loss, version)
    breakdown = ""
    if args.breakdown:
        import trace_summary
        fsexec_ms(args, wd, "gpt2_fp32.plan", nsteps,
                  ["--trace", "trace.json", "--trace-steps", f"{args.warmup + 1}:{nsteps}"])
        breakdown = trace_summary.summary(os.path.join(wd, "trace.json"), top=12)
    flops = 6.0 * P * B * T + 12.0 * L * C * T * T * B
    return {"name": name, "dims": dims, "timed": timed, "rounds": args.rounds, "params": P, "flops": flops,
            "ms": {k: statistics.median(v) for k, v in rounds.items()}, "round_ms": rounds,
            "first_loss": {k: v[0] for k, v in first.items()}, "versions": {k: v[1] for k, v in first.items()},
            "breakdown": breakdown}


def report(results, gflops):
    for r in results:
        d, ms = r["dims"], r["ms"]
        rate = r["flops"] / (ms["fsexec"] / 1e3) / 1e9
        two = [(ms[k], k) for k in ms if k.startswith("torch2")]
        print(f"{r['name']}: {r['params']:,d} params, B={d['B']} T={d['T']}, {r['flops'] / 1e9:.2f} GFLOP/step, "
              f"medians of {r['rounds']} interleaved rounds of {r['timed']} timed steps")
        for k, v in ms.items():
            ver = r["versions"][k]
            print(f"  {k:15} {v:10.2f} ms {r['flops'] / (v / 1e3) / 1e9:7.1f} GFLOP/s {v / ms['fsexec']:5.2f}x fsexec"
                  f"{'  (torch ' + ver + ')' if ver else ''}  rounds {[round(x, 1) for x in r['round_ms'][k]]}"
                  f"  step-1 loss {r['first_loss'][k]:.6f}")
        line = (f"  fsexec: {rate:.1f} GFLOP/s = {rate / gflops:.1%} of sgemm; bf16 / fp32 = "
                f"{ms['fsexec bf16'] / ms['fsexec']:.2f}; fsexec / torch 1.13 = {ms['fsexec'] / ms['torch1']:.2f}")
        if two:
            best = min(two)
            line += f"; fsexec / best torch 2 ({best[1]}) = {ms['fsexec'] / best[0]:.2f}"
            if "torch2 eager" in ms:
                line += f"; fsexec / torch 2 eager = {ms['fsexec'] / ms['torch2 eager']:.2f}"
        else:
            line += "; no torch 2 (bench/venv.sh, then --torch2 /tmp/fs-bench-venv/bin/python)"
        print(line)
        if r["breakdown"]:
            print("  fsexec by op kind (--trace):\n    " + r["breakdown"].replace("\n", "\n    "))
        r.update(fs_gflops=rate, fs_fraction_of_sgemm=rate / gflops)


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
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the median is reported")
    venv = "/tmp/fs-bench-venv/bin/python"
    ap.add_argument("--torch2", default=venv if os.path.exists(venv) else "",
                    help="a Python with PyTorch 2.x (bench/venv.sh makes %(default)s)")
    ap.add_argument("--breakdown", action="store_true", help="also fsexec's time by op kind, from --trace")
    ap.add_argument("--one-by-one", action="store_true",
                    help="also fsexec --cpu-one-by-one (no runs of ops as one parallel region), fp32")
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
          f"6*P*B*T + 12*L*C*T^2*B; cpu flags: {cpu_flags()}")
    report(results, gflops)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"threads": args.threads, "sgemm_gflops": gflops, "sgemm_how": how, "results": results}, f,
                      indent=1)
    return 0


def cpu_flags():
    """The vector extensions of this CPU that matter here (bf16: AVX-512 BF16 or AMX)."""
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"^flags\s*:\s*(.*)$", f.read(), re.M)
    except OSError:
        return "?"
    flags = set(m.group(1).split()) if m else set()
    want = ("avx2", "fma", "avx512f", "avx512_bf16", "amx_bf16")
    return " ".join(f for f in want if f in flags) + ("" if flags & {"avx512_bf16", "amx_bf16"} else
                                                      " (no AVX-512 BF16: bf16 is converted to f32 to compute)")


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            m = re.search(r"model name\s*:\s*(.*)", f.read())
        return m.group(1).strip() if m else "?"
    except OSError:
        return "?"


if __name__ == "__main__":
    sys.exit(main())
