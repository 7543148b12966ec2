#!/usr/bin/env python3
"""Lints on every sample's CUDA program, without a GPU, read from `fsc --kernels=json` (the
numbers a user sees):

1. A launch whose work passes 2^20 elements (its largest argument) fills the GPU: at least
   2 x SMs blocks (264 on an H100 or H200: 132 SMs) of at least 128 threads each, unless
   its kernel is on EXEMPT below with the reason. An exemption no launch needs any more
   fails the test, so that the list shrinks as kernels are rewritten.
2. The report adds up: each launch's roofline is max(FLOPs / rate, bytes / HBM) at the
   report's GPU, a GEMM does 2 m n k FLOPs, the kinds sum to the step, and GPT-2 124M's
   FLOPs are those fsc's summary counts (on --machine h200: HBM 4.8 TB/s).
3. No launch storms: GPT-2 124M's and Llama's instructions per step (samples/gpt2.fsm and
   samples/llama.fsm at their default dims, bf16) are printed and bounded by today's counts
   (BOUNDS, LLAMA_BOUNDS).
4. Every GEMM of GPT-2 124M and Llama in bf16 is 16-byte aligned (leading dimensions, batch
   strides, operand starts: what cuBLAS's fast tensor-core kernels need), and each report's
   count of misaligned GEMMs and their roofline agree with its launches; every sample's
   misaligned GEMMs are printed.

Every sample is checked at its default dims and at the tiny dims the other tests use, in
its own precision and in bf16. cuBLAS's GEMMs pick their own grids and are not linted.

usage: kernel_lints.py FSC
"""
import collections
import json
import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
FSC = sys.argv[1] if len(sys.argv) > 1 else "fsc"
WORK = 1 << 20
MIN_BLOCKS = 2 * 132
MIN_THREADS = 128

# Kernels (their name's prefix, the op) allowed to under-fill the GPU, each with why.
EXEMPT = {
    # Kernel 1 (dw, db partial sums) has one block per 32 rows: 256 blocks at B x T =
    # 8192, just under 264; kernel 2 (the finish) has one block per 32 columns (24 at
    # C = 768), but reads only the P x 2C partials (393 K floats), not the [B, T, C] tensor
    # whose bytes hold them, which is what the lint counts as its work.
    "layernorm_bwd": "32-row chunks give 256 blocks at 8192 rows; the finish reads only the partials",
    # The same kernels with a residual gradient added by the third (passes/epilogue.c).
    "layernorm_bwd_add": "layernorm_bwd's kernels, the residual gradient added in its dx kernel",
    # A slice moves only its output's elements: albert's CLS pooling, x[:, 0, :], is B x C
    # (6,144) of the [B, T, C] input (3.1 M) the lint counts as its work.
    "slice": "its work is its output (x[:, 0, :]: B x C of B x T x C); the grid covers that",
    # A block owns 32 table rows x 256 columns (codegen/cuda_embed.c): BERT's segment table has
    # 2 rows, so its gradient is 3 blocks that each read all B x T rows of dy's columns. Known
    # slow (a split over the indices with a second, reducing pass would fill the GPU).
    "embedding_bwd": "a table of few rows (BERT's 2 segments) is few blocks: one per 32 rows x 256 columns",
}

# GPT-2 124M, bf16, per step, today: 336 instructions (189 launches, 147 GEMMs; the bias
# adds, GELUs and their gradients in the GEMMs' epilogues, the residual adds in their GEMM
# (beta 1) or their layernorm's backward: passes/epilogue.c; the 16-bit params written by the
# update, adamw_cast; attention
# reads the QKV projection's rows in place: passes/packed_attn.c), 13 of
# them sumsq_parts and 13 adamw_cast (one per flat unit: 12 blocks and the params outside
# them), which also write the 16-bit params, so no cast of the master weights is left
# (cast_in_update: passes/shard.c). Attention's backward on tensor cores is three
# launches a layer, one more than before it: Dr = rowsum(dO o), which both of the others
# read, cannot share a launch with them (codegen/kernels/flash_bwd.cuh). No full zeroes a flat
# gradient buffer: each gradient is made in it, and only the gaps no gradient covers are
# zeroed (none at one rank: passes/shard.c's zero_gaps). Upper bounds: the
# counts may fall, never grow unnoticed.
BOUNDS = {"instructions": 336, "sumsq_parts": 13, "adamw": 13, "cast": 0, "full": 0, "misaligned": 0}
# Llama (samples/llama.fsm at its default dims, bf16), today: 371 instructions (200 launches,
# 171 GEMMs); rope and attention read q, k, v where their projections wrote them (rope_rows,
# attention_rows: passes/packed_attn.c), so no heads, merge_heads or rope launches are left
# (72 of them before).
LLAMA_BOUNDS = {"instructions": 371, "heads": 0, "merge_heads": 0, "rope": 0, "misaligned": 0}

SAMPLES = {
    "gpt2": ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=256", "-D", "B=4"],
    "llama": ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "F=176", "-D", "T=32", "-D", "V=256", "-D", "B=4"],
    "lora": ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=256", "-D", "B=4", "-D", "R=4"],
    "mlp": ["-D", "B=16", "-D", "L=1"],
    "albert": ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "E=16", "-D", "T=32", "-D", "V=256", "-D", "B=4"],
    "bert": ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=300", "-D", "B=4"],
}


def kernels(sample, dims, precision, machine=None):
    cmd = [FSC, os.path.join(ROOT, "samples", sample + ".fsm"), *dims, "--kernels=json", "-q"]
    if machine:
        cmd += ["--machine", machine]
    if precision:
        cmd += ["--precision", precision]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"FAIL: {' '.join(cmd)}: rc {out.returncode}\n{out.stderr}")
    return json.loads(out.stdout)


def prefix(kernel):
    return kernel.rsplit("_", 1)[0]


def lint(what, d, used, failures):
    """Launches of program d (one stage) that pass 2^20 elements but under-fill the GPU."""
    for l in d["launches"]:
        if l["instruction"] != "launch" or l["elements"] <= WORK:
            continue
        if l["blocks"] >= MIN_BLOCKS and l["threads"] >= MIN_THREADS:
            continue
        name = prefix(l["kernel"])
        if name in EXEMPT:
            used[name] += 1
            continue
        failures.append(f"{what}: launch {l['index']} ({l['kind']}, {l['kernel']}): {l['elements']} elements "
                        f"on {l['blocks']} blocks x {l['threads']} threads (want >= {MIN_BLOCKS} x {MIN_THREADS})")


def consistent(what, d, failures, fsc_gflop=None):
    """The report's own arithmetic: each launch's roofline from its FLOPs and bytes at the
    report's GPU, a GEMM's 2 m n k FLOPs, the kinds summing to the step; and the step's
    FLOPs equal to fsc's own count (its summary), fused members and all."""
    gpu, bad = d["gpu"], []
    for prog in d.get("stages", [d]):
        for l in prog["launches"]:
            rate = (gpu["flops_tf32"] if l["tf32"] else gpu["flops_16bit"]) if l["tensor_core"] else gpu["flops_fp32"]
            want = max(l["flops"] / rate, (l["bytes_read"] + l["bytes_written"]) / gpu["hbm_bw"]) * 1e3
            if abs(l["roofline_ms"] - want) > 1e-9 * max(1, want):
                bad.append(f"launch {l['index']}: roofline {l['roofline_ms']} ms, want {want}")
            m, n, k, batch = l.get("gemm", (0, 0, 0, 0))
            # An epilogue or a residual added as C (passes/epilogue.c: beta 1) adds its op's
            # elementwise work to the product's.
            product = 2 * m * n * k * batch
            fused = l.get("epilogue", "none") != "none" or l.get("beta", 0)
            if l["instruction"] == "gemm" and (l["flops"] < product if fused else l["flops"] != product):
                bad.append(f"GEMM {l['index']}: {l['flops']} FLOPs for {l['gemm']}")
        gemms = [l for l in prog["launches"] if l["instruction"] == "gemm"]
        if any(l["aligned"] != (not l["misaligned"]) for l in gemms) or \
                any("aligned" in l for l in prog["launches"] if l["instruction"] != "gemm"):
            bad.append("a GEMM's aligned and misaligned disagree, or a launch has them")
        off = [l for l in gemms if not l["aligned"]]
        if prog["n_misaligned_gemms"] != len(off) or \
                abs(prog["misaligned_roofline_ms"] - sum(l["roofline_ms"] for l in off)) > 1e-9:
            bad.append(f"{prog['n_misaligned_gemms']} misaligned GEMMs, {prog['misaligned_roofline_ms']} ms; "
                       f"the launches say {len(off)}")
        for key in ("flops", "bytes_read", "bytes_written", "roofline_ms"):
            total = sum(k[key] for k in prog["kinds"])
            if abs(total - prog[key]) > 1e-9 * max(1, prog[key]):
                bad.append(f"the kinds' {key} sum to {total}, the step's is {prog[key]}")
    if fsc_gflop is not None and abs(d["flops"] / 1e9 - fsc_gflop) > 0.05:
        bad.append(f"{d['flops'] / 1e9:.2f} GFLOP in the launches, fsc's summary counts {fsc_gflop:.2f}")
    failures += [f"{what}: {b}" for b in bad[:5]]


def main():
    failures, used = [], collections.Counter()
    for sample, tiny in SAMPLES.items():
        for dims, label in (([], "default dims"), (tiny, "tiny dims")):
            for precision in (None, "bf16"):
                what = f"{sample} ({label}, {precision or 'its precision'})"
                d = kernels(sample, dims, precision)
                for prog in d.get("stages", [d]):
                    lint(what, prog, used, failures)
                consistent(what, d, failures)
                off = [f"{l['kind']} (op {l['op']}: {','.join(l['misaligned'])})" for p in d.get("stages", [d])
                       for l in p["launches"] if l["instruction"] == "gemm" and not l["aligned"]]
                print(f"{what}: {d['n_instructions']} instructions, roofline {d['roofline_ms']:.3f} ms; "
                      f"{len(off)} misaligned GEMMs{': ' + ', '.join(off[:4]) if off else ''}")
    for name, why in EXEMPT.items():
        print(f"exempt {name}: {used[name]} launches ({why})")
        if not used[name]:
            failures.append(f"exemption {name} is not needed any more: remove it from EXEMPT")

    d = kernels("gpt2", [], "bf16", "h200")
    summary = subprocess.run([FSC, os.path.join(ROOT, "samples", "gpt2.fsm"), "--precision", "bf16"],
                             capture_output=True, text=True).stderr
    line = next(l for l in summary.splitlines() if l.startswith("GFLOP per step"))
    gflop = sum(float(x.split()[-1]) for x in line.split(":")[1].split(","))
    consistent("GPT-2 124M bf16 on an H200", d, failures, gflop)
    if d["gpu"]["hbm_bw"] != 4.8e12:
        failures.append(f"--machine h200: HBM {d['gpu']['hbm_bw']} B/s, want 4.8e12")
    count = collections.Counter(l["kind"] for l in d["launches"])
    count["adamw"] += count["adamw_cast"]  # the update, writing the 16-bit params too or not
    print(f"GPT-2 124M bf16: {d['n_instructions']} instructions per step ({d['n_launches']} launches, "
          f"{d['n_gemms']} GEMMs), {count['sumsq_parts']} sumsq_parts, {count['adamw']} adamw, {count['cast']} casts; "
          f"roofline {d['roofline_ms']:.2f} ms on {d['gpu']['name']}")
    have = {"instructions": d["n_instructions"], "sumsq_parts": count["sumsq_parts"], "adamw": count["adamw"],
            "cast": count["cast"], "full": count["full"], "misaligned": d["n_misaligned_gemms"]}
    for key, bound in BOUNDS.items():
        if have[key] > bound:
            failures.append(f"GPT-2 124M bf16: {have[key]} {key} per step, above the bound {bound}")
    ld = kernels("llama", [], "bf16", "h200")
    lcount = collections.Counter(l["kind"] for l in ld["launches"])
    print(f"Llama bf16: {ld['n_instructions']} instructions per step ({ld['n_launches']} launches, "
          f"{ld['n_gemms']} GEMMs); roofline {ld['roofline_ms']:.3f} ms on {ld['gpu']['name']}")
    for key, bound in LLAMA_BOUNDS.items():
        n = ld["n_instructions"] if key == "instructions" else \
            ld["n_misaligned_gemms"] if key == "misaligned" else lcount[key]
        if n > bound:
            failures.append(f"Llama bf16: {n} {key} per step, above the bound {bound}")
    if sum(l["instruction"] == "gemm" for l in d["launches"]) != d["n_gemms"] or \
            d["n_launches"] + d["n_gemms"] != d["n_instructions"]:
        failures.append("GPT-2 124M bf16: the JSON's counts disagree with its launches")

    for f in failures:
        print("FAIL:", f)
    print(f"kernel_lints: {len(failures)} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
