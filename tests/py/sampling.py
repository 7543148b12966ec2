#!/usr/bin/env python3
"""Sampling (`fsexec PLAN --sample N`): the plan's sampling program against PyTorch.

1. Temperature 0: for a tiny GPT-2 and a tiny Llama (T = 16) with random weights large
   enough that the argmax moves from token to token (std 0.3; norms' weights 1 + 0.1 N(0, 1)),
   fsexec --load-weights W --sample 24 --prompt-ids from
   a 4-token prompt generates ids that are, token by token, the argmax of PyTorch's
   forward (tests/py/models.py, on the same weights) over the growing sequence, cropped
   to its last T tokens as nanoGPT does (4 + 24 > 16 crosses the crop). Where PyTorch's
   two best logits are within 1e-4 (a tie, which rounding may break either way) the
   token may be either. The tokens must not all be one. This is the decode program
   (a KV cache) up to T tokens and the window program past them, and --no-kv-cache
   (the window program throughout, a forward of T tokens per token) gives the same
   tokens but at such ties; a 40-token run from a 1-token prompt goes past T twice over. Also from --resume (a
   checkpoint of fsdp at world 2 after 2 steps from those weights, resharded into the
   world-2 plan's sampling program, which runs in one process) against the params that
   run saved.
2. --top-k 1 at temperature 1 is temperature 0; at temperature 1 (V = 256) one seed gives
   one text and another seed another; a byte-level --prompt prints its bytes and what
   follows as text; with --tokenizer (llm.c's format) the ids print as their bytes.
3. A model that cannot decode one token at a time (a non-causal attention): fsc's note
   says why, --mem shows no decode program, and --sample still samples (the window
   program), its tokens those of --no-kv-cache.
4. A bf16 or fp16 plan samples too (its sampling and decode programs compute in fp32, on
   the fp32 weights it loads): the fp32 plan's tokens, exactly.
5. Clear errors: a classifier (no sampling program), a prompt token outside the vocab,
   --prompt for a model that is not byte-level, --sample 0 or above 2^20, no prompt, a
   file that is not a tokenizer.

usage: sampling.py FSC FSEXEC   (uses /usr/bin/python3's torch)
"""
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from models import LOGITS, load_safetensors, num_layers, save_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
T = 16
HEADS = {"gpt2": (2,), "llama": (4, 2)}  # NH, and llama's NKV: grouped-query attention
MODELS = {
    "gpt2": ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=4"],
    "llama": ["-D", "L=2", "-D", "C=32", "-D", "NH=4", "-D", "NKV=2", "-D", "F=64", "-D", "T=16", "-D", "V=256",
              "-D", "B=4"],
}
PROMPT = [5, 17, 3, 42]
N = 24
TIE = 1e-4


def run(cmd, ok=True):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=300)
    if ok and r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr).decode(errors="replace")[-3000:]))
    return r


def ids_of(r):
    return [int(x) for x in r.stdout.decode().split()]


def random_weights(path):
    """The params of `path` replaced by random ones of their shapes (in place)."""
    g = torch.Generator().manual_seed(7)
    out = {}
    for name, t in sorted(load_safetensors(path).items()):
        r = torch.randn(t.shape, generator=g)
        out[name] = (1 + 0.1 * r if name.endswith(("norm.w", "ln1.w", "ln2.w", "lnf.w")) else 0.3 * r)
    save_safetensors(path, out)


def check_argmax(model, weights, got, what, prompt=PROMPT, window=None):
    """got (the prompt, then the tokens) against PyTorch's argmax; with window (the
    --no-kv-cache run's tokens), each token also equals the window program's but at a tie."""
    p = load_safetensors(weights)
    L = num_layers(p, model)
    seq = list(prompt)
    with torch.no_grad():
        for i, tok in enumerate(got[len(prompt):]):
            ctx = torch.tensor([seq[-T:]], dtype=torch.int32)
            logits = LOGITS[model](p, ctx, L, *HEADS[model])[0, -1]
            best = int(torch.argmax(logits))
            if tok != best and float(logits[best] - logits[tok]) > TIE:
                sys.exit("FAIL %s (%s): token %d is %d, PyTorch's argmax %d (logits %.6g vs %.6g) after %s" % (
                    model, what, i, tok, best, float(logits[tok]), float(logits[best]), seq))
            top2 = torch.topk(logits, 2).values
            if window is not None and window[len(seq)] != tok:
                if float(top2[0] - top2[1]) > TIE:
                    sys.exit("FAIL %s (%s): token %d is %d, the window program's (--no-kv-cache) %d, after %s" % (
                        model, what, i, tok, window[len(seq)], seq))
                break  # a tie broken two ways: the two runs continue from different texts
            seq.append(tok)
    if len(set(got[len(prompt):])) < 3:
        sys.exit("FAIL %s (%s): the argmax is (nearly) one token throughout, %s: a test that shows little" % (
            model, what, got))
    print("ok %s (%s): %d tokens = PyTorch's argmax%s: %s" % (model, what, len(got) - len(prompt),
                                                              " = the window program's" if window else "",
                                                              got[len(prompt):]))


def check_undecodable(fsc, fsexec, work, prompt):
    """A GPT-2 whose attention is not causal: no decode program, and fsc's note says why."""
    with open(os.path.join(ROOT, "samples", "gpt2.fsm")) as f:
        src = f.read()
    bidir = src.replace("heads(v, NH), causal)", "heads(v, NH))")
    if bidir == src:
        sys.exit("FAIL: samples/gpt2.fsm's attention is no longer written 'heads(v, NH), causal)'")
    fsm, plan = os.path.join(work, "bidir.fsm"), os.path.join(work, "bidir.plan")
    with open(fsm, "w") as f:
        f.write(bidir)
    r = run([fsc, fsm, *MODELS["gpt2"], "-o", plan, "-q"])
    note = r.stderr.decode()
    if "no decode program" not in note or "not causal" not in note or "line 25:" not in note:
        sys.exit("FAIL: fsc's note on a non-causal model does not say why it has no decode program:\n" + note)
    mem = run([fsc, fsm, *MODELS["gpt2"], "--mem", "-q"]).stdout.decode()
    if "\nsampling program" not in mem or "\ndecode program" in mem:
        sys.exit("FAIL: --mem of a non-causal model shows a decode program (or no sampling program)")
    base = [fsexec, plan, "--sample", "12", "--prompt-ids", prompt, "--temperature", "0"]
    got, window = ids_of(run(base)), ids_of(run(base + ["--no-kv-cache"]))
    if len(got) != len(PROMPT) + 12 or got != window:
        sys.exit("FAIL: a model without a decode program sampled %s, --no-kv-cache %s" % (got, window))
    print("ok a non-causal model: fsc notes '%s'; it samples with the window program" % note.strip()[:120])


def main():
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    quiet_mpi_leaks()  # the --resume case's checkpoint comes from two ranks under mpirun
    work = tempfile.mkdtemp()
    try:
        prompt = ",".join(map(str, PROMPT))
        for model, dims in MODELS.items():
            plan, weights = os.path.join(work, model + ".plan"), os.path.join(work, model + ".safetensors")
            run([fsc, "samples/%s.fsm" % model, *dims, "--lr", "1e-3", "--warmup", "0", "-o", plan, "-q"])
            run([fsexec, plan, "--steps", "0", "--save-weights", weights])
            random_weights(weights)
            base = [fsexec, plan, "--threads", "1", "--load-weights", weights, "--sample", str(N), "--prompt-ids", prompt]
            greedy = ids_of(run(base + ["--temperature", "0"]))
            if greedy[:len(PROMPT)] != PROMPT or len(greedy) != len(PROMPT) + N:
                sys.exit("FAIL %s: printed %s, expected the prompt %s and %d tokens" % (model, greedy, PROMPT, N))
            window = ids_of(run(base + ["--temperature", "0", "--no-kv-cache"]))
            check_argmax(model, weights, greedy, "--load-weights, KV cache", window=window)
            check_argmax(model, weights, window, "--load-weights, --no-kv-cache")
            long = [fsexec, plan, "--load-weights", weights, "--sample", "40", "--prompt-ids", "9", "--temperature", "0"]
            got, window = ids_of(run(long)), ids_of(run(long + ["--no-kv-cache"]))
            check_argmax(model, weights, got, "40 tokens from 1, KV cache", prompt=[9], window=window)
            top1 = ids_of(run(base + ["--top-k", "1"]))
            if top1 != greedy:
                sys.exit("FAIL %s: --top-k 1 gave %s, temperature 0 %s" % (model, top1, greedy))
            a, b, c = (ids_of(run(base + ["--seed", s])) for s in ("1", "1", "2"))
            if a != b or a == c:
                sys.exit("FAIL %s: seeds 1, 1, 2 at temperature 1 gave %s, %s, %s" % (model, a, b, c))
            print("ok %s: top-k 1 = argmax; seed 1 twice the same, seed 2 another" % model)
            # A 16-bit plan samples with fp32 sampling and decode programs: the same tokens.
            for prec in ("bf16", "fp16"):
                lp = os.path.join(work, "%s-%s.plan" % (model, prec))
                run([fsc, "samples/%s.fsm" % model, *dims, "--precision", prec, "-o", lp, "-q"])
                got = ids_of(run([fsexec, lp, "--threads", "1", "--load-weights", weights, "--sample", str(N),
                                  "--prompt-ids", prompt, "--temperature", "0"]))
                if got != greedy:
                    sys.exit("FAIL %s: a %s plan sampled %s, the fp32 plan %s" % (model, prec, got, greedy))
            print("ok %s: bf16 and fp16 plans sample the fp32 plan's tokens" % model)
            # From a checkpoint of an fsdp world-2 run, resharded into the sampling program.
            if shutil.which("mpirun") and model == "gpt2":
                fplan, ck, w2 = (os.path.join(work, n) for n in ("fsdp.plan", "ck", "fsdp.safetensors"))
                run([fsc, "samples/%s.fsm" % model, *dims, "--lr", "1e-3", "--world", "2", "--shard", "fsdp", "-o",
                     fplan, "-q"])
                run([fsexec, "--nproc", "2", fplan, "--steps", "2", "--threads", "1", "--load-weights", weights,
                     "--checkpoint-dir", ck, "--save-weights", w2])
                got = ids_of(run([fsexec, fplan, "--resume", ck, "--sample", str(N), "--prompt-ids", prompt,
                                  "--temperature", "0"]))
                check_argmax(model, w2, got, "--resume from fsdp world 2")
        gplan = os.path.join(work, "gpt2.plan")
        text = run([fsexec, gplan, "--sample", "8", "--prompt", "Hi", "--seed", "3"]).stdout
        if not text.startswith(b"Hi") or len(text) != 2 + 8 + 1:
            sys.exit("FAIL: --prompt Hi printed %r, expected Hi, 8 bytes and a newline" % text)
        # An llm.c tokenizer file (version 2): token i is "<i>" but for a few real words.
        tok = os.path.join(work, "tok.bin")
        words = [("w%d|" % i).encode() for i in range(256)]
        with open(tok, "wb") as f:
            f.write(struct.pack("<256I", *([20240328, 2, 256, 255] + [0] * 252)))
            for w in words:
                f.write(bytes([len(w)]) + w)
        got = ids_of(run([fsexec, gplan, "--load-weights", os.path.join(work, "gpt2.safetensors"), "--sample", str(N),
                          "--prompt-ids", prompt, "--temperature", "0"]))
        text = run([fsexec, gplan, "--load-weights", os.path.join(work, "gpt2.safetensors"), "--sample", str(N),
                    "--prompt-ids", prompt, "--temperature", "0", "--tokenizer", tok]).stdout
        if text != b"".join(words[i] for i in got) + b"\n":
            sys.exit("FAIL: --tokenizer printed %r for ids %s" % (text, got))
        print("ok --tokenizer: the ids' bytes by llm.c's tokenizer format")
        check_undecodable(fsc, fsexec, work, prompt)
        with open(os.path.join(work, "bad.bin"), "wb") as f:
            f.write(struct.pack("<256I", *([20240520, 1, 256] + [0] * 253)))
        mlp, v64 = os.path.join(work, "mlp.plan"), os.path.join(work, "v64.plan")
        run([fsc, "samples/mlp.fsm", "-o", mlp, "-q"])
        run([fsc, "samples/llama.fsm", *MODELS["llama"], "-D", "V=64", "-o", v64, "-q"])
        errors = [
            ([mlp, "--sample", "3", "--prompt-ids", "1"], "no sampling program"),
            ([gplan, "--sample", "3", "--prompt-ids", "1,300"], "outside the model's vocab"),
            ([v64, "--sample", "3", "--prompt", "hi"], "byte-level model's prompt"),
            ([gplan, "--sample", "0", "--prompt-ids", "1"], "--sample: expected an integer from 1"),
            ([gplan, "--sample", "2000000", "--prompt-ids", "1"], "--sample: expected an integer from 1"),
            ([gplan, "--sample", "3"], "--sample needs one prompt"),
            ([gplan, "--sample", "3", "--prompt-ids", "1", "--tokenizer", os.path.join(work, "bad.bin")],
             "not an llm.c tokenizer file"),
        ]
        for args, want in errors:
            r = run([fsexec, *args], ok=False)
            msg = (r.stdout + r.stderr).decode(errors="replace")
            if r.returncode == 0 or want not in msg:
                sys.exit("FAIL: %s: exit %d, expected an error saying '%s':\n%s" % (args, r.returncode, want, msg))
        print("ok errors: a classifier, a token outside the vocab, --prompt for V = 64, N 0 and 2e6, no prompt")
    finally:
        shutil.rmtree(work)
    print("sampling: all ok")


main()
