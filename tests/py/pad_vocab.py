#!/usr/bin/env python3
"""A padded vocabulary through the tools (passes/pad_vocab.c): GPT-2 at V = 250, which
--pad_vocab 64 (the default) stores as 256 rows, against the same model with --pad_vocab 0.

1. fsc --mem: the padding line names wte [250, 64] stored as [256, 64] and 384 padding
   elements in each copy; the bytes it says the padding adds are the padded arena less
   the unpadded plan's (each read from its own --mem), and, at these dims, the formula:
   the peak is in a block's backward, after the head's, where the logits and their
   gradient are dead, so the padding adds its model state alone: the fp32 param, its
   gradient and AdamW's two moments, 16 bytes per padding element. --mem=json counts the
   model's params (the same in both plans).
2. The logical tensor in files: --steps 0 --save-weights (fsexec's format and
   hf-gpt2's) of both plans are byte for byte the same file (init keys each logical
   element by its index; the padding is in no file); each plan loads either plan's file
   in either format to the same step-1 loss, bit for bit, and the two plans' losses agree
   to rounding (the head's GEMM is 256 columns wide in one, 250 in the other: OpenBLAS may
   round a few of its sums otherwise, as it does 1 in 70 of an evaluation's logits here).
3. Checkpoints: one written by the padded plan resumes into the unpadded plan and one
   of the unpadded plan into the padded, and each into its writer's plan: the three
   steps after the resume agree to rounding.
4. --predict of a model that outputs its logits writes the model's 250 columns of the
   padded plan's 256, the unpadded plan's predictions to rounding.
5. Sampling never draws a padding id: 300 tokens at temperature 5 from the untrained
   model (near uniform over all 256 columns: 300 draws miss 6 unmasked ones with
   probability (250/256)^300 < 0.1%), with the KV cache and without, all below 250.
6. Llama at V = 250, whose head `output` is stored [C, V]: the param keeps its shape and
   the head's GEMMs read a padded copy [64, 256] (--mem's padding line says so); its
   --save-weights files (fsexec's and hf-llama's) of both plans are the same file, each
   plan loads either to one step-1 loss, the two to rounding; checkpoints resume across
   the plans; sampling draws no padding id (the sampling programs read no padded copy).

usage: pad_vocab.py FSC FSEXEC
"""
import json
import os
import re
import struct
import subprocess
import sys
import tempfile

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPT2 = os.path.join(ROOT, "samples", "gpt2.fsm")
DIMS = ["-D", "L=1", "-D", "C=64", "-D", "NH=4", "-D", "T=16", "-D", "V=250", "-D", "B=2"]
V, VP, C = 250, 256, 64
failures = []


def check(ok, msg):
    print(("ok   " if ok else "FAIL ") + msg)
    if not ok:
        failures.append(msg)


def run(cmd, cwd):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode:
        sys.exit("FAIL: %s exited %d:\n%s" % (" ".join(cmd), r.returncode, r.stdout))
    return r.stdout


def arena(mem_text):
    return int(re.search(r"^  arena +\S+ \S+ \(([\d,]+) bytes\)", mem_text, re.M).group(1).replace(",", ""))


def losses(path):
    with open(path) as f:
        return {j["step"]: j["loss"] for j in map(json.loads, f)}


def tensors(path):
    """name -> (shape, bytes) of a safetensors file."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        head = json.loads(f.read(n))
        data = f.read()
    return {k: (v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]) for k, v in head.items()
            if k != "__metadata__"}


def memory(fsc, work):
    padded = run([fsc, GPT2, *DIMS, "--mem", "-q"], work)
    plain = run([fsc, GPT2, *DIMS, "--pad_vocab", "0", "--mem", "-q"], work)
    line = re.search(r"^vocabulary padding \(--pad_vocab 64\): wte \[250, 64\] stored as \[256, 64\], (\d+) padding "
                     r"elements in each copy.*\n  the padding adds ([\d,]+) bytes to the device arena \(([\d,]+) bytes "
                     r"with --pad_vocab 0\)$", padded, re.M)
    check(line is not None, "--mem says how the vocabulary is padded")
    if not line:
        print(padded)
        return
    elems, adds, base = (int(g.replace(",", "")) for g in line.groups())
    check(elems == (VP - V) * C, "padding elements %d = (256 - 250) x 64" % elems)
    check(base == arena(plain), "the unpadded arena it names (%d) is --pad_vocab 0's own (%d)" % (base, arena(plain)))
    check(adds == arena(padded) - arena(plain),
          "the padding adds %d bytes: the padded arena %d less the unpadded %d" % (adds, arena(padded), arena(plain)))
    check(adds == 16 * (VP - V) * C, "%d bytes = 16 x %d padding elements (param, grad, two moments)" % (adds, elems))
    check("vocabulary padding" not in plain, "--pad_vocab 0 plans no padding")
    pj = json.loads(run([fsc, GPT2, *DIMS, "--mem=json", "-q"], work))
    uj = json.loads(run([fsc, GPT2, *DIMS, "--pad_vocab", "0", "--mem=json", "-q"], work))
    first = lambda j: j[0] if isinstance(j, list) else j
    check(first(pj)["params"]["count"] == first(uj)["params"]["count"],
          "the memory report counts the model's params: %d" % first(uj)["params"]["count"])


def weights(fsexec, work, tok):
    for fmt in ("fsexec", "hf-gpt2"):
        for plan in ("P", "U"):
            run([fsexec, plan + ".plan", "--data", tok, "--steps", "0", "--weights-format", fmt, "--save-weights",
                 "%s_%s.safetensors" % (plan, fmt)], work)
        a, b = (open(os.path.join(work, "%s_%s.safetensors" % (p, fmt)), "rb").read() for p in "PU")
        check(a == b, "%s --save-weights of the padded and unpadded plans: the same file (%d bytes)" % (fmt, len(a)))
        t = tensors(os.path.join(work, "P_%s.safetensors" % fmt))
        wte = t["wte" if fmt == "fsexec" else "transformer.wte.weight"]
        check(wte[0] == [V, C], "%s: wte is the model's [250, 64] (%s)" % (fmt, wte[0]))
    step1 = {"P": set(), "U": set()}
    for plan in "PU":
        for other in "PU":
            for fmt in ("fsexec", "hf-gpt2"):
                log = os.path.join(work, "load_%s_%s_%s.log" % (plan, other, fmt))
                run([fsexec, plan + ".plan", "--data", tok, "--steps", "1", "--weights-format", fmt, "--load-weights",
                     "%s_%s.safetensors" % (other, fmt), "--log", log], work)
                step1[plan].add(losses(log)[1])
    check(len(step1["P"]) == 1 and len(step1["U"]) == 1, "each plan: one step-1 loss from either plan's weights, in "
          "either format (%s)" % step1)
    p, u = step1["P"].pop(), step1["U"].pop()
    check(abs(p - u) <= 1e-6 * abs(u), "padded %.9g, unpadded %.9g: to rounding" % (p, u))


def checkpoints(fsexec, work, tok):
    for src in ("P", "U"):
        run([fsexec, src + ".plan", "--data", tok, "--steps", "3", "--checkpoint-dir", "ck" + src], work)
        got = {}
        for plan in ("P", "U"):
            log = os.path.join(work, "resume_%s_%s.log" % (src, plan))
            run([fsexec, plan + ".plan", "--data", tok, "--steps", "6", "--resume", "ck" + src, "--log", log], work)
            got[plan] = losses(log)
        into = "U" if src == "P" else "P"
        worst = max(abs(got[into][s] - got[src][s]) / abs(got[src][s]) for s in (4, 5, 6))
        check(sorted(got[into]) == [4, 5, 6] and worst < 1e-6, "a %s checkpoint resumed into the %s plan: steps 4-6 "
              "as the writer's own resume, to rounding (%.2g)" % (src, into, worst))


def predict(fsc, fsexec, work, tok):
    with open(GPT2) as f:
        src = f.read().replace("  loss = cross_entropy(logits, targets);\n",
                               "  loss = cross_entropy(logits, targets);\n  output logits;\n")
    with open(os.path.join(work, "out.fsm"), "w") as f:
        f.write(src)
    np.save(os.path.join(work, "x.npy"), np.random.default_rng(1).integers(0, V, (5, 16)).astype(np.int32))
    run([fsexec, "P.plan", "--data", tok, "--steps", "2", "--save-weights", "trained.safetensors"], work)
    got = {}
    for plan, pad in (("P", "64"), ("U", "0")):
        run([fsc, "out.fsm", *DIMS, "--pad_vocab", pad, "-o", "out%s.plan" % plan, "-q"], work)
        run([fsexec, "out%s.plan" % plan, "--predict", "--load-weights", "trained.safetensors", "--data",
             "tokens=x.npy", "--out", "pred%s.npy" % plan], work)
        got[plan] = np.load(os.path.join(work, "pred%s.npy" % plan))
    worst = float(np.abs(got["P"] - got["U"]).max() / np.abs(got["U"]).max())
    check(got["P"].shape == (5, 16, V) and worst < 1e-6,
          "--predict writes the model's logits %s, the unpadded plan's to %.2g" % (got["P"].shape, worst))


def sampling(fsexec, work):
    for extra in ([], ["--no-kv-cache"]):
        out = run([fsexec, "P.plan", "--sample", "300", "--prompt-ids", "1,2,3", "--temperature", "5", "--seed", "7",
                   *extra], work)
        ids = [int(x) for x in re.findall(r"\d+", out.strip().splitlines()[-1])]
        check(len(ids) >= 300 and max(ids) < V and max(ids) > 200,
              "%d tokens sampled%s, the largest %d: none of the padding" % (len(ids), " " + extra[0] if extra else "",
                                                                            max(ids)))


LLAMA = os.path.join(ROOT, "samples", "llama.fsm")
LDIMS = ["-D", "L=1", "-D", "C=64", "-D", "NH=4", "-D", "F=128", "-D", "T=16", "-D", "V=250", "-D", "B=2"]


def llama(fsc, fsexec, work, tok):
    run([fsc, LLAMA, *LDIMS, "-o", "LP.plan", "-q"], work)
    run([fsc, LLAMA, *LDIMS, "--pad_vocab", "0", "-o", "LU.plan", "-q"], work)
    mem = run([fsc, LLAMA, *LDIMS, "--mem", "-q"], work)
    check(re.search(r"^vocabulary padding \(--pad_vocab 64\): output \[64, 250\] stored as it is, its GEMMs reading "
                    r"a padded copy \[64, 256\] made each step \(no padding in the model state\) and 6 padded logit "
                    r"columns$", mem, re.M) is not None, "llama: --mem says the head is read through a padded copy")
    pj, uj = (json.loads(run([fsc, LLAMA, *LDIMS, *x, "--mem=json", "-q"], work)) for x in ([], ["--pad_vocab", "0"]))
    first = lambda j: j[0] if isinstance(j, list) else j
    check(first(pj)["params"]["count"] == first(uj)["params"]["count"], "llama: the model's params counted")
    for fmt in ("fsexec", "hf-llama"):
        for plan in ("LP", "LU"):
            run([fsexec, plan + ".plan", "--data", tok, "--steps", "0", "--weights-format", fmt, "--save-weights",
                 "%s_%s.safetensors" % (plan, fmt)], work)
        a, b = (open(os.path.join(work, "%s_%s.safetensors" % (p, fmt)), "rb").read() for p in ("LP", "LU"))
        check(a == b, "llama %s --save-weights of the padded and unpadded plans: the same file" % fmt)
        out = tensors(os.path.join(work, "LP_%s.safetensors" % fmt))["output" if fmt == "fsexec" else "lm_head.weight"]
        check(sorted(out[0]) == [C, V], "llama %s: the head is the model's (%s)" % (fmt, out[0]))
    step1 = {}
    for plan in ("LP", "LU"):
        got = set()
        for other in ("LP", "LU"):
            for fmt in ("fsexec", "hf-llama"):
                log = os.path.join(work, "lload_%s_%s_%s.log" % (plan, other, fmt))
                run([fsexec, plan + ".plan", "--data", tok, "--steps", "1", "--weights-format", fmt, "--load-weights",
                     "%s_%s.safetensors" % (other, fmt), "--log", log], work)
                got.add(losses(log)[1])
        check(len(got) == 1, "llama %s: one step-1 loss from either plan's weights, in either format (%s)" %
              (plan, got))
        step1[plan] = got.pop()
    check(abs(step1["LP"] - step1["LU"]) <= 1e-6 * abs(step1["LU"]), "llama: padded %.9g, unpadded %.9g" %
          (step1["LP"], step1["LU"]))
    run([fsexec, "LP.plan", "--data", tok, "--steps", "3", "--checkpoint-dir", "lck"], work)
    got = {}
    for plan in ("LP", "LU"):
        log = os.path.join(work, "lresume_%s.log" % plan)
        run([fsexec, plan + ".plan", "--data", tok, "--steps", "6", "--resume", "lck", "--log", log], work)
        got[plan] = losses(log)
    worst = max(abs(got["LU"][s] - got["LP"][s]) / abs(got["LP"][s]) for s in (4, 5, 6))
    check(sorted(got["LU"]) == [4, 5, 6] and worst < 1e-6, "llama: the padded plan's checkpoint resumes into the "
          "unpadded one to rounding (%.2g)" % worst)
    for extra in ([], ["--no-kv-cache"]):
        out = run([fsexec, "LP.plan", "--sample", "300", "--prompt-ids", "1,2,3", "--temperature", "5", "--seed", "7",
                   *extra], work)
        ids = [int(x) for x in re.findall(r"\d+", out.strip().splitlines()[-1])]
        check(len(ids) >= 300 and max(ids) < V and max(ids) > 200,
              "llama: %d tokens sampled%s, the largest %d: none of the padding" %
              (len(ids), " " + extra[0] if extra else "", max(ids)))


def main():
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        tok = os.path.join(work, "tokens.bin")
        head = np.zeros(256, np.int32)
        head[:3] = 20240520, 1, 20000
        with open(tok, "wb") as f:
            f.write(head.tobytes() + np.random.default_rng(0).integers(0, V, 20000).astype(np.uint16).tobytes())
        run([fsc, GPT2, *DIMS, "-o", "P.plan", "-q"], work)
        run([fsc, GPT2, *DIMS, "--pad_vocab", "0", "-o", "U.plan", "-q"], work)
        memory(fsc, work)
        weights(fsexec, work, tok)
        checkpoints(fsexec, work, tok)
        predict(fsc, fsexec, work, tok)
        sampling(fsexec, work)
        llama(fsc, fsexec, work, tok)
    if failures:
        sys.exit("%d check(s) failed" % len(failures))
    print("all passed")


if __name__ == "__main__":
    main()
