#!/usr/bin/python3
"""normal(mean, std) and normal(std) initializers: the moments of large params.

fsc compiles a model with params of N = 2^20 elements initialized by normal(3, 0.25),
normal(-0.5, 2) and normal(0.02) (mean 0); fsexec --steps 0 --save-weights writes them.
For n independent draws of N(mu, sigma^2) the sample mean has standard error
sigma / sqrt(n) and the sample std about sigma / sqrt(2 n): each must lie within 6 of
them (a chance failure has probability below 1e-8), and the fraction of draws within one
sigma must be 0.6827 within 6 of its standard error sqrt(p (1 - p) / n). The same plan
with --world 2 --shard fsdp must initialize bit for bit the same values (each rank draws
only its shard).

usage: init_normal.py FSC FSEXEC     (Debian's /usr/bin/python3 with numpy)
"""
import math
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True

try:
    import torch  # noqa: F401  (models.py reads safetensors through torch)
except ImportError as e:
    sys.exit(f"init_normal.py: FAIL: cannot import torch ({e}); run with Debian's /usr/bin/python3")

import models  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

N = 1 << 20
CASES = {"a": (3.0, 0.25), "b": (-0.5, 2.0), "c": (0.0, 0.02)}
MODEL = """
model init {
  dim B = 2, D = %d, K = 4;
  input x: f32[B, D];
  input y: i32[B];
  param a: [D, K] = normal(3, 0.25);
  param b: [D, K] = normal(mean = -0.5, std = 2);
  param c: [D, K] = normal(0.02);
  loss = cross_entropy(x @ (a + b + c), y);
}
""" % (N // 4)


def run(cmd, cwd):
    p = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if p.returncode:
        sys.exit(f"init_normal.py: FAIL: {' '.join(cmd)} exited {p.returncode}:\n{p.stdout}")
    return p.stdout


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: init_normal.py FSC FSEXEC")
    fsc, fsexec = (os.path.abspath(a) for a in sys.argv[1:])
    quiet_mpi_leaks()  # the world-2 run, under AddressSanitizer
    fails = []
    with tempfile.TemporaryDirectory(prefix="fs-init-") as wd:
        with open(os.path.join(wd, "init.fsm"), "w") as f:
            f.write(MODEL)
        ir = run([fsc, "init.fsm", "--emit", "ir", "-q"], wd)
        for text in ("= normal(3, 0.25)", "= normal(-0.5, 2)", "= normal(0.02)"):
            if text not in ir:
                fails.append(f"--emit ir does not show '{text}'")
        run([fsc, "init.fsm", "-q", "-o", "w1.plan"], wd)
        run([fsexec, "w1.plan", "--steps", "0", "--save-weights", "w1.safetensors"], wd)
        w = models.load_safetensors(os.path.join(wd, "w1.safetensors"), torch.float64)
        for name, (mu, sigma) in CASES.items():
            x = w[name]
            mean, std = x.mean().item(), x.std().item()
            inside = ((x - mu).abs() < sigma).double().mean().item()
            p = math.erf(1 / math.sqrt(2))
            checks = (("mean", mean, mu, sigma / math.sqrt(N)), ("std", std, sigma, sigma / math.sqrt(2 * N)),
                      ("P(|x - mean| < std)", inside, p, math.sqrt(p * (1 - p) / N)))
            for what, got, want, se in checks:
                z = abs(got - want) / se
                ok = z <= 6
                print(f"{'ok  ' if ok else 'FAIL'} {name} = normal({mu:g}, {sigma:g}): {what} {got:.6f}, expected "
                      f"{want:.6f} +- {se:.2e} ({z:.1f} standard errors)")
                if not ok:
                    fails.append(f"{name} {what}")
        run([fsc, "init.fsm", "-q", "-o", "w2.plan", "--world", "2", "--shard", "fsdp"], wd)
        run([fsexec, "--nproc", "2", "w2.plan", "--steps", "0", "--save-weights", "w2.safetensors"], wd)
        w2 = models.load_safetensors(os.path.join(wd, "w2.safetensors"), torch.float64)
        for name in CASES:
            same = torch.equal(w[name], w2[name])
            print(f"{'ok  ' if same else 'FAIL'} {name}: world 2 fsdp shards initialize the same values, bit for bit")
            if not same:
                fails.append(f"{name} differs at world 2")
    if fails:
        sys.exit("init_normal.py: FAIL: " + "; ".join(fails))
    print("init_normal.py: all checks pass")


if __name__ == "__main__":
    main()
