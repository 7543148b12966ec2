#!/usr/bin/env python3
"""bench/gpu_attention.py's parts that need no GPU: its arguments, the one-attention plans
it builds (fsc compiles them; the packed attention_qkv is in each), fsexec's run of one on
the CPU backend with the trace it times by, and its clear stop where there is no GPU.

usage: gpu_attention.py FSC FSEXEC
"""
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FSC, FSEXEC = sys.argv[1], sys.argv[2]
SCRIPT = os.path.join(ROOT, "bench", "gpu_attention.py")
TINY = ["--dims", "B=2,T=40,NH=2,HD=16"]


def bench(*args):
    return subprocess.run([sys.executable, SCRIPT, "--fsc", FSC, "--fsexec", FSEXEC, *args], capture_output=True,
                          text=True)


def expect(cond, what, out):
    if not cond:
        sys.exit(f"FAIL {what}:\n{out.stdout}\n{out.stderr}")
    print(f"ok   {what}")


work = tempfile.mkdtemp(prefix="gpu_attention_test.")
out = bench("--dry-run", "--work", work)
expect(out.returncode == 0 and "--trace-steps 6:25" in out.stdout, "dry run: the commands of both shapes", out)
for shape in ("124m", "1.5b"):
    plan = os.path.join(work, f"attn_{shape}.plan")
    expect(os.path.getsize(plan) > 0, f"{shape}: a plan", out)
    ir = subprocess.run([FSC, os.path.join(work, f"attn_{shape}.fsm"), "--emit", "ir"], capture_output=True, text=True)
    expect(ir.returncode == 0 and "attention_qkv(" in ir.stdout and "merge_heads(" not in ir.stdout,
           f"{shape}: attention reads the QKV rows in place", ir)

out = bench(*TINY, "--device", "cpu", "--steps", "2", "--warmup", "1", "--work", work)
rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
expect(out.returncode == 0 and len(rows) == 1 and rows[0]["fwd_us"] > 0 and rows[0]["bwd_us"] > 0,
       "--device cpu: fsexec's forward and backward timed from its trace", out)
expect(rows[0]["causal"] and rows[0]["T"] == 40, "--device cpu: the shape asked for", out)

import torch  # noqa: E402  (the stop without a GPU is the only part that depends on it)

if not torch.cuda.is_available():
    out = bench(*TINY, "--work", work)
    expect(out.returncode == 2 and "no CUDA GPU here" in out.stderr, "no GPU: exit status 2, said so", out)

for bad, msg in ((["--shapes", "7b"], "--shapes: unknown 7b"), (["--dims", "B=2,T=4"], "--dims 'B=2,T=4'"),
                 (["--steps", "0"], "--steps must be at least 1")):
    out = bench(*bad)
    expect(out.returncode == 2 and msg in out.stderr, f"bad arguments {' '.join(bad)}", out)
out = subprocess.run([sys.executable, SCRIPT, "--fsc", "/nonexistent/fsc", "--fsexec", FSEXEC, "--dry-run"],
                     capture_output=True, text=True)
expect(out.returncode == 1 and "/nonexistent/fsc: not an executable file" in out.stderr, "a missing fsc", out)
