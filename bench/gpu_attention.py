#!/usr/bin/env python3
"""fsexec's attention, forward and backward, against PyTorch's scaled_dot_product_attention
(its flash and cuDNN back ends) on the same GPU, in microseconds and TFLOP/s.

For each shape (124m: B=8, T=1024, NH=12, hd=64; 1.5b: B=8, T=1024, NH=25, hd=64; causal,
bf16 by default) the script writes a one-attention model (GPT-2's split -> heads ->
attention -> merge_heads on a param x [B, T, 3C], which fsc's pack_attention rewrite makes
one attention_qkv reading x's rows in place, and a small loss), compiles it with fsc, runs
fsexec --device cuda --trace over steps WARMUP+1 .. WARMUP+STEPS and takes the median, over
the traced steps, of the attention_qkv (forward) and attention_qkv_bwd (backward) spans
(the CUDA backend times each op by events). PyTorch runs the same shapes with q, k, v
[B, NH, T, hd] under torch.nn.attention.sdpa_kernel(FLASH_ATTENTION) and
(CUDNN_ATTENTION), each timed by CUDA events over STEPS calls after WARMUP: the forward,
and the backward alone (torch.autograd.grad of a kept graph). A back end PyTorch cannot
run on this GPU is reported as such, not as a failure.

TFLOP/s counts what the attention does: 4 B NH T^2 hd forward (Q K^T and P V), 2.5 times
that backward (five products, Q K^T recomputed), halved when causal (the tiles below the
diagonal), as FlashAttention's benchmarks do.

One JSON line per (shape, implementation) on stdout, then a table:

    {"shape": "124m", "impl": "fsexec", "fwd_us": ..., "bwd_us": ..., "fwd_tflops": ..., "bwd_tflops": ...}

Without a CUDA GPU (torch.cuda.is_available() false) it stops with exit status 2 and says
so, after building the plans: --dry-run stops there on purpose (exit 0), printing the
fsexec commands it would run; --device cpu runs fsexec's part on the CPU backend (a check
of the plan and trace handling on a machine without a GPU; PyTorch's part is skipped).

usage: python3 bench/gpu_attention.py --fsc FSC --fsexec FSEXEC [--shapes 124m,1.5b]
           [--precision bf16] [--steps 20] [--warmup 5] [--no-causal] [--dry-run]
           [--device cuda|cpu] [--work DIR] [--dims B=2,T=64,NH=2,HD=16]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

SHAPES = {
    "124m": {"B": 8, "T": 1024, "NH": 12, "HD": 64},
    "1.5b": {"B": 8, "T": 1024, "NH": 25, "HD": 64},
}

MODEL = """model attn_bench {{
  dim B = {B}, T = {T}, NH = {NH}, HD = {HD}, C = NH * HD, K = 4;
  input f: f32[B, K];
  input t: i32[B];
  param x: [B, T, 3 * C] = normal(1.0);
  param w: [K, K] = normal(0.1);
  q, k, v = split(x, 3);
  y = merge_heads(attention(heads(q, NH), heads(k, NH), heads(v, NH){causal}));
  loss = cross_entropy(f @ w + mean(mean(y, axis = 1), axis = -1, keepdim = 1), t);
}}
"""


class BenchError(Exception):
    pass


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--fsc", required=True, help="the fsc binary")
    ap.add_argument("--fsexec", required=True, help="the fsexec binary")
    ap.add_argument("--shapes", default="124m,1.5b", help="comma-separated: " + ", ".join(SHAPES))
    ap.add_argument("--dims", default="", help="one shape of your own instead, e.g. B=2,T=64,NH=2,HD=16")
    ap.add_argument("--precision", default="bf16", choices=["bf16", "fp16", "fp32"])
    ap.add_argument("--steps", type=int, default=20, help="timed steps (and calls of PyTorch's)")
    ap.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    ap.add_argument("--no-causal", action="store_true", help="attention over every key (default: causal)")
    ap.add_argument("--dry-run", action="store_true", help="build the plans, print the commands, run nothing")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"],
                    help="where fsexec runs (cpu: a check without a GPU; PyTorch's part is skipped)")
    ap.add_argument("--work", default=None, help="directory for models, plans and traces (default: a temporary one)")
    a = ap.parse_args(argv)
    if a.steps < 1 or a.warmup < 0:
        ap.error("--steps must be at least 1 and --warmup at least 0")
    if a.dims:
        try:
            d = dict(kv.split("=", 1) for kv in a.dims.split(","))
            a.shape_dims = {"custom": {k: int(d[k]) for k in ("B", "T", "NH", "HD")}}
        except (ValueError, KeyError):
            ap.error(f"--dims {a.dims!r}: want B=..,T=..,NH=..,HD=.. (integers)")
        if len(d) != 4 or min(a.shape_dims["custom"].values()) < 1:
            ap.error(f"--dims {a.dims!r}: want exactly B, T, NH and HD, each at least 1")
    else:
        names = [s for s in a.shapes.split(",") if s]
        bad = [s for s in names if s not in SHAPES]
        if bad or not names:
            ap.error(f"--shapes: unknown {', '.join(bad) or '(none given)'}; known: {', '.join(SHAPES)}")
        a.shape_dims = {s: SHAPES[s] for s in names}
    return a


def flops(d, causal):
    """(forward, backward) FLOPs of one attention call of dims d."""
    fwd = 4.0 * d["B"] * d["NH"] * d["T"] * d["T"] * d["HD"] * (0.5 if causal else 1.0)
    return fwd, 2.5 * fwd


def build_plan(a, name, d, work):
    """The model's .fsm and plan for shape d; the fsexec command that times it."""
    src = os.path.join(work, f"attn_{name}.fsm")
    plan = os.path.join(work, f"attn_{name}.plan")
    with open(src, "w") as f:
        f.write(MODEL.format(causal="" if a.no_causal else ", causal", **d))
    cmd = [a.fsc, src, "-q", "--precision", a.precision, "-o", plan]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        raise BenchError(f"fsc failed ({' '.join(cmd)}):\n{out.stderr.strip()}")
    first, last = a.warmup + 1, a.warmup + a.steps
    trace = os.path.join(work, f"attn_{name}.trace.json")
    run = [a.fsexec, plan, "--device", a.device, "--steps", str(last), "--trace", trace,
           "--trace-steps", f"{first}:{last}", "--log-every", str(last)]
    return plan, trace, run


def op_times(trace):
    """Median microseconds per traced step of the packed attention's forward and backward."""
    with open(trace) as f:
        ev = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X" and e.get("pid") == 0]
    per = {"attention_qkv": {}, "attention_qkv_bwd": {}}
    for e in ev:
        kind = e["name"].split()[0]
        if kind in per:
            step = e["args"]["step"]
            per[kind][step] = per[kind].get(step, 0.0) + e["dur"]
    if not per["attention_qkv"] or not per["attention_qkv_bwd"]:
        raise BenchError(f"{trace}: no attention_qkv / attention_qkv_bwd spans (was the plan compiled with "
                         "pack_attention 0?)")
    return statistics.median(per["attention_qkv"].values()), statistics.median(per["attention_qkv_bwd"].values())


def time_fsexec(a, name, d, work):
    plan, trace, run = build_plan(a, name, d, work)
    out = subprocess.run(run, capture_output=True, text=True)
    if out.returncode:
        raise BenchError(f"fsexec failed ({' '.join(run)}):\n{(out.stderr or out.stdout).strip()[-2000:]}")
    return op_times(trace)


def time_torch(d, causal, precision, steps, warmup, backend):
    """(fwd_us, bwd_us) of F.scaled_dot_product_attention under one back end, or a string saying why not."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[precision]
    shape = (d["B"], d["NH"], d["T"], d["HD"])
    q, k, v = (torch.randn(shape, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, device="cuda", dtype=dt)
    be = {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}[backend]
    try:
        with sdpa_kernel([be]):
            out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            torch.autograd.grad(out, (q, k, v), dout)
            torch.cuda.synchronize()
    except RuntimeError as e:
        return f"not available here: {str(e).splitlines()[0][:200]}"

    def timed(fn):
        for _ in range(warmup):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(steps):
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
        return statistics.median(times)

    with sdpa_kernel([be]):
        fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        bwd = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
    return fwd, bwd


def row(shape, impl, d, causal, times):
    if isinstance(times, str):
        return {"shape": shape, "impl": impl, "skipped": times}
    f, b = flops(d, causal)
    return {"shape": shape, "impl": impl, **d, "causal": causal, "fwd_us": round(times[0], 2),
            "bwd_us": round(times[1], 2), "fwd_tflops": round(f / times[0] / 1e6, 1),
            "bwd_tflops": round(b / times[1] / 1e6, 1)}


def table(rows):
    lines = [f"{'shape':8} {'impl':12} {'fwd us':>10} {'bwd us':>10} {'fwd TF/s':>9} {'bwd TF/s':>9} "
             f"{'f+b vs cudnn':>13}"]
    ref = {r["shape"]: r for r in rows if r["impl"] == "torch-cudnn" and "fwd_us" in r}
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['shape']:8} {r['impl']:12} {r['skipped']}")
            continue
        c = ref.get(r["shape"])
        ratio = f"{(r['fwd_us'] + r['bwd_us']) / (c['fwd_us'] + c['bwd_us']):.2f}x" if c else "-"
        lines.append(f"{r['shape']:8} {r['impl']:12} {r['fwd_us']:10.1f} {r['bwd_us']:10.1f} {r['fwd_tflops']:9.1f} "
                     f"{r['bwd_tflops']:9.1f} {ratio:>13}")
    return "\n".join(lines)


def main(argv):
    a = parse_args(argv)
    for exe in (a.fsc, a.fsexec):
        if not (os.path.isfile(exe) and os.access(exe, os.X_OK)):
            print(f"gpu_attention: {exe}: not an executable file", file=sys.stderr)
            return 1
    work = a.work or tempfile.mkdtemp(prefix="gpu_attention.")
    os.makedirs(work, exist_ok=True)
    causal = not a.no_causal
    try:
        if a.dry_run:
            for name, d in a.shape_dims.items():
                plan, _, run = build_plan(a, name, d, work)
                print(f"{name}: {plan}\n  {' '.join(run)}")
            return 0
        gpu = False
        if a.device == "cuda":
            try:
                import torch
                gpu = torch.cuda.is_available()
            except ImportError:
                pass
            if not gpu:
                for name, d in a.shape_dims.items():
                    build_plan(a, name, d, work)
                print(f"gpu_attention: no CUDA GPU here (PyTorch sees none): the plans are built in {work}, "
                      "nothing was timed; run it on a GPU machine, or --device cpu / --dry-run to check it here",
                      file=sys.stderr)
                return 2
        rows = []
        for name, d in a.shape_dims.items():
            rows.append(row(name, "fsexec", d, causal, time_fsexec(a, name, d, work)))
            print(json.dumps(rows[-1]), flush=True)
            if not gpu:
                continue
            for be in ("flash", "cudnn"):
                rows.append(row(name, "torch-" + be, d, causal,
                                time_torch(d, causal, a.precision, a.steps, a.warmup, be)))
                print(json.dumps(rows[-1]), flush=True)
        print(table(rows))
        return 0
    except BenchError as e:
        print(f"gpu_attention: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
