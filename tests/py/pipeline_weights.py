#!/usr/bin/python3
"""A pipeline's weights loaded back, and a pipeline plan that samples (issue 35, items 6, 7).

A tiny GPT-2 (samples/gpt2.fsm, T = 16, V = 256) with random weights large enough that
the argmax moves (std 0.3), trained 2 steps as 2 pipeline stages (--nproc 2), saved with
--save-weights W.safetensors: Hugging Face's sharded form, W-0000k-of-00002.safetensors
and W.safetensors.index.json, and a checkpoint.
7. --load-weights W.safetensors.index.json (and W.safetensors, which only the index
   stands for) into the one-stage plan, and into the pipeline plan again: every param is
   the shards' value, bit for bit. The same in --weights-format hf-gpt2 (the index names
   HF's tensors). An index naming a shard that is not there, one without a weight_map, and
   a shard that lacks a tensor its index puts there are errors that name the file.
6. The pipeline plan samples (--sample, one process): from its checkpoint (--resume) and
   from the sharded weights, the tokens are PyTorch's argmax token by token on the saved
   params (ties within 1e-4 aside), and the one-stage plan's from the same weights.

usage: /usr/bin/python3 tests/py/pipeline_weights.py FSC FSEXEC   (torch; mpirun)
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import gpt2_logits, load_safetensors, save_safetensors  # noqa: E402
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DIMS = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=4"]
T, L, NH = 16, 2, 2
PROMPT = [5, 17, 3, 42]
TIE = 1e-4


def run(cmd, expect_rc=0):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=quiet_mpi_leaks())
    if r.returncode != expect_rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, expect_rc, " ".join(cmd),
                                                          (r.stdout + r.stderr)[-3000:]))
    return r


def expect_error(cmd, needles, what):
    r = run(cmd, expect_rc=1)
    missing = [n for n in needles if n not in r.stderr]
    if missing:
        sys.exit("FAIL %s: the message lacks %s:\n%s" % (what, missing, r.stderr))
    print("ok   7. %s: %s" % (what, r.stderr.strip().splitlines()[-1]))


def shards(base):
    """The params of a pipeline's sharded weights, each from the shard its index names."""
    with open(base + ".index.json") as f:
        index = json.load(f)
    files = sorted(set(index["weight_map"].values()))
    if files != ["%s-%05d-of-00002.safetensors" % (os.path.basename(base[:-len(".safetensors")]), k)
                 for k in (1, 2)]:
        sys.exit("FAIL: the index names shards %s" % files)
    d = os.path.dirname(base)
    loaded = {f: load_safetensors(os.path.join(d, f)) for f in files}
    return {name: loaded[f][name] for name, f in index["weight_map"].items()}


def same(got, want, what):
    if sorted(got) != sorted(want):
        sys.exit("FAIL %s: params %s, want %s" % (what, sorted(got), sorted(want)))
    for k in want:
        if not torch.equal(got[k], want[k]):
            sys.exit("FAIL %s: '%s' differs (max %g)" % (what, k, float((got[k] - want[k]).abs().max())))
    print("ok   7. %s: all %d params bit for bit" % (what, len(want)))


def ids_of(r):
    return [int(x) for x in r.stdout.split()]


def check_argmax(params, got, what):
    """got (the prompt, then the tokens) against PyTorch's argmax over the last T tokens."""
    seq = list(PROMPT)
    with torch.no_grad():
        for i, tok in enumerate(got[len(PROMPT):]):
            logits = gpt2_logits(params, torch.tensor([seq[-T:]], dtype=torch.int32), L, NH)[0, -1]
            best = int(torch.argmax(logits))
            if tok != best and float(logits[best] - logits[tok]) > TIE:
                sys.exit("FAIL %s: token %d is %d, PyTorch's argmax %d, after %s" % (what, i, tok, best, seq))
            seq.append(tok)
    if got[:len(PROMPT)] != PROMPT or len(set(got[len(PROMPT):])) < 3:
        sys.exit("FAIL %s: %s shows little" % (what, got))
    print("ok   6. %s: %d tokens = PyTorch's argmax: %s" % (what, len(got) - len(PROMPT), got[len(PROMPT):]))


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    if shutil.which("mpirun") is None:
        print("pipeline_weights: skipped (no mpirun)")
        return
    work = tempfile.mkdtemp(prefix="pipeline_weights.")
    try:
        def P(name):
            return os.path.join(work, name)

        gpt2 = os.path.join(ROOT, "samples", "gpt2.fsm")
        run([fsc, gpt2, "-q", *DIMS, "-o", P("one.plan")])
        run([fsc, gpt2, "-q", *DIMS, "--world", "2", "--stages", "2", "--microbatches", "2", "-o", P("pipe.plan")])
        run([fsexec, P("one.plan"), "--steps", "0", "--save-weights", P("init.safetensors")])
        g = torch.Generator().manual_seed(7)
        rand = {}
        for name, t in sorted(load_safetensors(P("init.safetensors")).items()):
            r = torch.randn(t.shape, generator=g)
            rand[name] = 1 + 0.1 * r if name.endswith(("ln1.w", "ln2.w", "lnf.w")) else 0.3 * r
        save_safetensors(P("rand.safetensors"), rand)
        w = P("w.safetensors")
        run([fsexec, "--nproc", "2", P("pipe.plan"), "--load-weights", P("rand.safetensors"), "--steps", "2",
             "--save-weights", w, "--checkpoint-dir", P("ck")])
        trained = shards(w)
        if torch.equal(trained["h.0.attn.w"], rand["h.0.attn.w"]):
            sys.exit("FAIL: 2 steps left the params as they were loaded")

        # 7. the sharded weights back in
        for what, path in (("the one-stage plan from W.safetensors.index.json", w + ".index.json"),
                           ("the one-stage plan from W.safetensors (its index beside it)", w)):
            run([fsexec, P("one.plan"), "--steps", "0", "--load-weights", path, "--save-weights",
                 P("back.safetensors")])
            same(load_safetensors(P("back.safetensors")), trained, what)
        run([fsexec, "--nproc", "2", P("pipe.plan"), "--steps", "0", "--load-weights", w + ".index.json",
             "--save-weights", P("again.safetensors")])
        same(shards(P("again.safetensors")), trained, "the pipeline plan from its own index")
        hf = P("hf.safetensors")
        run([fsexec, "--nproc", "2", P("pipe.plan"), "--steps", "0", "--load-weights", w, "--save-weights", hf,
             "--weights-format", "fsexec,hf-gpt2"])
        with open(hf + ".index.json") as f:
            if "transformer.h.0.attn.c_attn.weight" not in json.load(f)["weight_map"]:
                sys.exit("FAIL: the hf-gpt2 index does not name HF's tensors")
        run([fsexec, P("one.plan"), "--steps", "0", "--load-weights", hf + ".index.json", "--weights-format",
             "hf-gpt2,fsexec",
             "--save-weights", P("hfback.safetensors")])
        same(load_safetensors(P("hfback.safetensors")), trained, "the one-stage plan from an hf-gpt2 index")

        with open(w + ".index.json") as f:
            index = json.load(f)
        missing = dict(index, weight_map=dict(index["weight_map"], wpe="gone-00009-of-00009.safetensors"))
        with open(P("missing.index.json"), "w") as f:
            json.dump(missing, f)
        expect_error([fsexec, P("one.plan"), "--steps", "0", "--load-weights", P("missing.index.json")],
                     [P("gone-00009-of-00009.safetensors") + ": "], "an index naming a shard that is not there")
        with open(P("nomap.index.json"), "w") as f:
            json.dump({"metadata": {}}, f)
        expect_error([fsexec, P("one.plan"), "--steps", "0", "--load-weights", P("nomap.index.json")],
                     ["nomap.index.json: no \"weight_map\" object"], "an index without a weight_map")
        moved = dict(index, weight_map=dict(index["weight_map"], wpe="w-00002-of-00002.safetensors"))
        if index["weight_map"]["wpe"] == moved["weight_map"]["wpe"]:
            sys.exit("FAIL: wpe is in the last stage's shard")
        with open(P("w.moved.index.json"), "w") as f:
            json.dump(moved, f)
        expect_error([fsexec, P("one.plan"), "--steps", "0", "--load-weights", P("w.moved.index.json")],
                     ["w-00002-of-00002.safetensors: no tensor 'wpe', which the model has"],
                     "a shard without a tensor its index puts there")

        # 6. sampling from a pipeline plan
        prompt = ["--sample", "20", "--prompt-ids", ",".join(map(str, PROMPT)), "--temperature", "0"]
        ck = os.path.join(P("ck"), sorted(os.listdir(P("ck")))[-1])
        resumed = ids_of(run([fsexec, P("pipe.plan"), *prompt, "--resume", ck]))
        check_argmax(trained, resumed, "the pipeline plan from its checkpoint (--resume)")
        for what, plan in (("the pipeline plan", "pipe.plan"), ("the one-stage plan", "one.plan")):
            got = ids_of(run([fsexec, P(plan), *prompt, "--load-weights", w + ".index.json"]))
            if got != resumed:
                sys.exit("FAIL: %s from the sharded weights samples %s, the checkpoint %s" % (what, got, resumed))
            print("ok   6. %s from the sharded weights: the same tokens" % what)
        print("pipeline_weights: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
