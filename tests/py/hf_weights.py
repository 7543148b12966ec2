#!/usr/bin/env python3
"""fsexec --weights-format hf-gpt2 | hf-llama: Hugging Face's names and layouts in and out.

Files with Hugging Face's names and layouts are made here with numpy (no `transformers`
needed: bench/hf_check.py runs the real GPT2LMHeadModel and LlamaForCausalLM):

1. Loading: tiny GPT-2 (with and without the "transformer." prefix, with GPT-2's
   attn.bias / attn.masked_bias buffers and a tied lm_head.weight, and as F16) and tiny
   Llama (nn.Linear's [out, in], the old rotary inv_freq buffer, and as BF16) load with
   --weights-format FMT,fsexec and --steps 0; the params saved in our format equal the
   HF tensors under README's mapping, exactly (16-bit values upcast exactly).
2. Round trip: an F32 HF file loaded and saved in the same format is the same file's
   params again, bit for bit (F32; no buffers, no tied lm_head for GPT-2), at world 1
   and at world 2 with fsdp (every rank reads, rank 0 writes the consolidated params),
   and a 2-stage Llama pipeline writes one file per stage and an index of HF's names;
   so is `fsexec --export CKPT FILE --weights-format hf-gpt2|hf-llama` of a checkpoint
   written after loading it (world 1, and world 2 with fsdp: shards consolidated).
3. Errors name what is wrong: a missing tensor (with what the file has), a transposed
   matrix (our [in, out] against HF's), a torch.save .pt zip or pickle, another model's
   file (the tensor and both shapes), a tied lm_head that is not the embedding, a tensor
   the model has not, a bad --weights-format.

usage: hf_weights.py FSC FSEXEC   (/usr/bin/python3 with numpy and torch; mpirun for world 2)
"""
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
L, C, NH, T, V, F = 2, 64, 4, 32, 256, 176
NKV = 2  # llama's kv heads: grouped-query attention, k_proj and v_proj [NKV * C / NH, C]
GPT2_DIMS = ["-D", "L=%d" % L, "-D", "C=%d" % C, "-D", "NH=%d" % NH, "-D", "T=%d" % T, "-D", "V=%d" % V, "-D", "B=2"]
LLAMA_DIMS = GPT2_DIMS + ["-D", "F=%d" % F, "-D", "NKV=%d" % NKV]

# ---------------------------------------------------------------- safetensors with numpy

DT = {"F32": "<f4", "F16": "<f2", "BF16": "<u2", "I32": "<i4"}  # BF16 as its raw 16 bits


def write_st(path, tensors):
    """tensors: name -> (dtype name, numpy array of that dtype's storage)."""
    header, chunks, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dt, a) in tensors.items():
        raw = np.ascontiguousarray(a, dtype=DT[dt]).tobytes()
        header[name] = {"dtype": dt, "shape": list(a.shape), "data_offsets": [off, off + len(raw)]}
        chunks.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(chunks))


def read_st(path):
    """name -> (dtype name, array); and the header's __metadata__."""
    with open(path, "rb") as f:
        blob = f.read()
    (n,) = struct.unpack("<Q", blob[:8])
    header = json.loads(blob[8:8 + n])
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        a, b = info["data_offsets"]
        arr = np.frombuffer(blob[8 + n + a:8 + n + b], dtype=DT[info["dtype"]]).reshape(info["shape"])
        out[name] = (info["dtype"], arr)
    return out, header.get("__metadata__", {})


def as_f32(dt, a):
    """A stored tensor's values as float32, exactly (BF16: its bits are the high half)."""
    if dt == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


def to_dtype(dt, a):
    """float32 values into dtype dt's storage (values exactly representable in it)."""
    if dt == "BF16":
        return (a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)
    return a.astype(DT[dt])


# ---------------------------------------------------------------- HF's names and layouts

def gpt2_params():
    """(our name, HF name, HF shape, transpose?) for the tiny GPT-2, as README's table."""
    rows = [("wte", "transformer.wte.weight", [V, C]), ("wpe", "transformer.wpe.weight", [T, C])]
    for i in range(L):
        p, h = "h.%d." % i, "transformer.h.%d." % i
        rows += [(p + "ln1.w", h + "ln_1.weight", [C]), (p + "ln1.b", h + "ln_1.bias", [C]),
                 (p + "attn.w", h + "attn.c_attn.weight", [C, 3 * C]), (p + "attn.b", h + "attn.c_attn.bias", [3 * C]),
                 (p + "proj.w", h + "attn.c_proj.weight", [C, C]), (p + "proj.b", h + "attn.c_proj.bias", [C]),
                 (p + "ln2.w", h + "ln_2.weight", [C]), (p + "ln2.b", h + "ln_2.bias", [C]),
                 (p + "fc.w", h + "mlp.c_fc.weight", [C, 4 * C]), (p + "fc.b", h + "mlp.c_fc.bias", [4 * C]),
                 (p + "fcproj.w", h + "mlp.c_proj.weight", [4 * C, C]), (p + "fcproj.b", h + "mlp.c_proj.bias", [C])]
    rows += [("lnf.w", "transformer.ln_f.weight", [C]), ("lnf.b", "transformer.ln_f.bias", [C])]
    return [(o, h, s, False) for o, h, s in rows]  # Conv1D is [in, out], as ours


def llama_params():
    rows = [("tok_embeddings", "model.embed_tokens.weight", [V, C], False)]
    for i in range(L):
        p, h = "layers.%d." % i, "model.layers.%d." % i
        rows += [(p + "attn_norm.w", h + "input_layernorm.weight", [C], False),
                 (p + "wq", h + "self_attn.q_proj.weight", [C, C], True),
                 (p + "wk", h + "self_attn.k_proj.weight", [NKV * C // NH, C], True),
                 (p + "wv", h + "self_attn.v_proj.weight", [NKV * C // NH, C], True),
                 (p + "wo", h + "self_attn.o_proj.weight", [C, C], True),
                 (p + "mlp_norm.w", h + "post_attention_layernorm.weight", [C], False),
                 (p + "w1", h + "mlp.gate_proj.weight", [F, C], True),   # nn.Linear: [out, in]
                 (p + "w3", h + "mlp.up_proj.weight", [F, C], True),
                 (p + "w2", h + "mlp.down_proj.weight", [C, F], True)]
    rows += [("norm.w", "model.norm.weight", [C], False), ("output", "lm_head.weight", [V, C], True)]
    return rows


def hf_file(rows, seed, dt="F32"):
    """HF name -> (dt, values) with random values exact in dt."""
    rng = np.random.default_rng(seed)
    out = {}
    for _, h, shape, _ in rows:
        x = rng.standard_normal(shape).astype(np.float32) * 0.05
        if dt == "BF16":
            x = as_f32("BF16", to_dtype("BF16", x))
        out[h] = (dt, to_dtype(dt, x))
    return out


def gpt2_buffers():
    mask = np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)
    out = {}
    for i in range(L):
        out["transformer.h.%d.attn.bias" % i] = ("F32", mask)
        out["transformer.h.%d.attn.masked_bias" % i] = ("F32", np.array(-1e4, np.float32))
    return out


# ---------------------------------------------------------------- running fsexec

def run(cmd, expect_rc=0):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != expect_rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, expect_rc, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def check_ours(ours_path, rows, hf, what):
    """Every param of ours equals its HF tensor under the mapping, bit for bit."""
    ours, _ = read_st(ours_path)
    if sorted(ours) != sorted(o for o, _, _, _ in rows):
        sys.exit("FAIL %s: our file holds %s" % (what, sorted(ours)))
    for o, h, _, transpose in rows:
        dt, a = ours[o]
        want = as_f32(*hf[h])
        want = want.T if transpose else want
        if dt != "F32" or a.shape != want.shape or a.tobytes() != np.ascontiguousarray(want).tobytes():
            sys.exit("FAIL %s: our '%s' (%s %s) is not HF's '%s' %s" % (what, o, dt, a.shape, h,
                                                                         "transposed" if transpose else ""))
    print("ok   %s: %d params equal HF's under the mapping" % (what, len(rows)))


def check_same_params(path, rows, hf, what):
    """A file saved in HF's format holds exactly the params of hf (F32), no more."""
    got, meta = read_st(path)
    want = sorted(h for _, h, _, _ in rows)
    if sorted(got) != want:
        sys.exit("FAIL %s: the file holds %s, not %s" % (what, sorted(got), want))
    if meta.get("format") != "pt":
        sys.exit("FAIL %s: __metadata__ %s lacks format pt (from_pretrained needs it)" % (what, meta))
    for h in want:
        if got[h][0] != "F32" or got[h][1].shape != hf[h][1].shape or got[h][1].tobytes() != hf[h][1].tobytes():
            sys.exit("FAIL %s: '%s' differs from the input" % (what, h))
    print("ok   %s: the %d params again, bit for bit" % (what, len(want)))


def expect_error(fsexec, plan, path, fmt, needles, what):
    out = run([fsexec, plan, "--steps", "0", "--load-weights", path, "--weights-format", fmt], expect_rc=1)
    missing = [n for n in needles if n not in out]
    if missing:
        sys.exit("FAIL %s: the message lacks %s:\n%s" % (what, missing, out))
    line = [l for l in out.splitlines() if "error" in l or path in l]
    print("ok   %s: %s" % (what, (line[-1] if line else out.strip())[:400]))


def main():
    quiet_mpi_leaks()
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    have_mpi = shutil.which("mpirun") is not None
    work = tempfile.mkdtemp(prefix="hf_weights.")
    try:
        def P(name):
            return os.path.join(work, name)

        plans = {}
        for model, dims in (("gpt2", GPT2_DIMS), ("llama", LLAMA_DIMS)):
            plans[model] = P(model + ".plan")
            run([fsc, "samples/%s.fsm" % model, *dims, "-o", plans[model], "-q"])
            plans[model + "-fsdp2"] = P(model + "-fsdp2.plan")
            run([fsc, "samples/%s.fsm" % model, *dims, "--world", "2", "--shard", "fsdp", "-o",
                 plans[model + "-fsdp2"], "-q"])
        plans["llama-pp2"] = P("llama-pp2.plan")
        run([fsc, "samples/llama.fsm", *LLAMA_DIMS, "--stages", "2", "--microbatches", "2", "--world", "2", "-o", plans["llama-pp2"], "-q"])

        g_rows, l_rows = gpt2_params(), llama_params()

        # 1. Loading, in every variant, at world 1.
        g32 = hf_file(g_rows, 1)
        g_tied = dict(g32, **gpt2_buffers())
        g_tied["lm_head.weight"] = g32["transformer.wte.weight"]
        write_st(P("gpt2.safetensors"), g_tied)
        run([fsexec, plans["gpt2"], "--steps", "0", "--load-weights", P("gpt2.safetensors"), "--weights-format",
             "hf-gpt2,fsexec", "--save-weights", P("gpt2.ours")])
        check_ours(P("gpt2.ours"), g_rows, g32, "hf-gpt2 F32, attn.bias/masked_bias buffers, tied lm_head")

        bare = {h[len("transformer."):] if h.startswith("transformer.") else h: v for h, v in g32.items()}
        write_st(P("gpt2-bare.safetensors"), bare)
        run([fsexec, plans["gpt2"], "--steps", "0", "--load-weights", P("gpt2-bare.safetensors"), "--weights-format",
             "hf-gpt2,fsexec", "--save-weights", P("gpt2-bare.ours")])
        check_ours(P("gpt2-bare.ours"), g_rows, g32, "hf-gpt2 without the transformer. prefix (GPT2Model)")

        g16 = hf_file(g_rows, 2, "F16")
        write_st(P("gpt2-f16.safetensors"), dict(g16, **gpt2_buffers()))
        run([fsexec, plans["gpt2"], "--steps", "0", "--load-weights", P("gpt2-f16.safetensors"), "--weights-format",
             "hf-gpt2,fsexec", "--save-weights", P("gpt2-f16.ours")])
        check_ours(P("gpt2-f16.ours"), g_rows, g16, "hf-gpt2 F16 upcast to f32")

        l32 = hf_file(l_rows, 3)
        l_buf = dict(l32)
        for i in range(L):
            l_buf["model.layers.%d.self_attn.rotary_emb.inv_freq" % i] = (
                "F32", (1.0 / 10000 ** (np.arange(0, C // NH, 2) / (C // NH))).astype(np.float32))
        write_st(P("llama.safetensors"), l32)
        write_st(P("llama-buf.safetensors"), l_buf)
        run([fsexec, plans["llama"], "--steps", "0", "--load-weights", P("llama-buf.safetensors"), "--weights-format",
             "hf-llama,fsexec", "--save-weights", P("llama.ours")])
        check_ours(P("llama.ours"), l_rows, l32, "hf-llama F32 (nn.Linear transposed), rotary inv_freq buffer")

        lbf = hf_file(l_rows, 4, "BF16")
        write_st(P("llama-bf16.safetensors"), lbf)
        run([fsexec, plans["llama"], "--steps", "0", "--load-weights", P("llama-bf16.safetensors"), "--weights-format",
             "hf-llama,fsexec", "--save-weights", P("llama-bf16.ours")])
        check_ours(P("llama-bf16.ours"), l_rows, lbf, "hf-llama BF16 upcast to f32")

        # 2. Round trips: HF's format in and out.
        run([fsexec, plans["gpt2"], "--steps", "0", "--load-weights", P("gpt2.safetensors"), "--weights-format",
             "hf-gpt2", "--save-weights", P("gpt2-back.safetensors")])
        check_same_params(P("gpt2-back.safetensors"), g_rows, g32, "hf-gpt2 round trip (world 1)")
        run([fsexec, plans["llama"], "--steps", "0", "--load-weights", P("llama.safetensors"), "--weights-format",
             "hf-llama", "--save-weights", P("llama-back.safetensors")])
        check_same_params(P("llama-back.safetensors"), l_rows, l32, "hf-llama round trip (world 1)")
        # fsexec --export CKPT FILE --weights-format FMT: a checkpoint's params in HF's format
        # (at world 2 with fsdp: consolidated from each rank's shards).
        exports = [("gpt2", [], g_rows, g32), ("llama", [], l_rows, l32)]
        if have_mpi:
            exports.append(("gpt2-fsdp2", ["--nproc", "2"], g_rows, g32))
        for plan, nproc, rows, hf in exports:
            model = plan.split("-")[0]
            ck = P(plan + "-ckpt")
            run([fsexec, *nproc, plans[plan], "--steps", "0", "--load-weights", P(model + ".safetensors"),
                 "--weights-format", "hf-%s,fsexec" % model, "--checkpoint-dir", ck])
            run([fsexec, "--export", ck, P(plan + "-export.safetensors"), "--weights-format", "hf-" + model])
            check_same_params(P(plan + "-export.safetensors"), rows, hf, "--export of a %s checkpoint as hf-%s" % (plan, model))
        if have_mpi:
            for model, rows, hf, src in (("gpt2", g_rows, g32, "gpt2.safetensors"),
                                         ("llama", l_rows, l32, "llama.safetensors")):
                fmt = "hf-" + model
                run([fsexec, "--nproc", "2", plans[model + "-fsdp2"], "--steps", "0", "--load-weights", P(src),
                     "--weights-format", fmt, "--save-weights", P(model + "-fsdp2.safetensors")])
                check_same_params(P(model + "-fsdp2.safetensors"), rows, hf, fmt + " round trip (world 2, fsdp)")
                run([fsexec, "--nproc", "2", plans[model + "-fsdp2"], "--steps", "0", "--load-weights", P(src),
                     "--weights-format", fmt + ",fsexec", "--save-weights", P(model + "-fsdp2.ours")])
                check_ours(P(model + "-fsdp2.ours"), rows, hf, fmt + " loaded at world 2, fsdp")
            run([fsexec, "--nproc", "2", plans["llama-pp2"], "--steps", "0", "--load-weights", P("llama.safetensors"),
                 "--weights-format", "hf-llama", "--save-weights", P("pp.safetensors")])
            with open(P("pp.safetensors.index.json")) as f:
                index = json.load(f)["weight_map"]
            stage = {}
            for k in (1, 2):
                got, _ = read_st(P("pp-%05d-of-00002.safetensors" % k))
                for h, (dt, a) in got.items():
                    if a.tobytes() != l32[h][1].tobytes():
                        sys.exit("FAIL pipeline: stage %d's '%s' differs from the input" % (k, h))
                    stage.setdefault(h, "pp-%05d-of-00002.safetensors" % k)
            if sorted(index) != sorted(l32) or index != stage:
                sys.exit("FAIL pipeline: index %s, stage files %s" % (index, stage))
            print("ok   hf-llama from a 2-stage pipeline: 2 files and an index of HF's %d names, bit for bit" % len(index))
        else:
            print("skip world 2 and pipeline round trips: no mpirun")

        # 3. Errors.
        gp = plans["gpt2"]
        broken = dict(g32)
        del broken["transformer.h.1.mlp.c_fc.bias"]
        write_st(P("missing.safetensors"), broken)
        expect_error(fsexec, gp, P("missing.safetensors"), "hf-gpt2",
                     ["no tensor 'transformer.h.1.mlp.c_fc.bias'", "our 'h.1.fc.b'", "%d tensors: " % (len(g32) - 1),
                      "transformer.wte.weight"], "missing tensor")
        flipped = dict(l32)
        dt, a = flipped["model.layers.0.mlp.gate_proj.weight"]
        flipped["model.layers.0.mlp.gate_proj.weight"] = (dt, np.ascontiguousarray(a.T))
        write_st(P("flipped.safetensors"), flipped)
        expect_error(fsexec, plans["llama"], P("flipped.safetensors"), "hf-llama",
                     ["'model.layers.0.mlp.gate_proj.weight'", "transpose", "[in, out]", "[%d, %d]" % (C, F)],
                     "transposed nn.Linear weight")
        mha = dict(l32)  # a multi-head checkpoint (num_key_value_heads = NH) into the grouped-query plan
        mha["model.layers.1.self_attn.v_proj.weight"] = ("F32", np.zeros((C, C), np.float32))
        write_st(P("mha.safetensors"), mha)
        expect_error(fsexec, plans["llama"], P("mha.safetensors"), "hf-llama",
                     ["'model.layers.1.self_attn.v_proj.weight'", "[%d, %d]" % (C, C), "[%d, %d]" % (NKV * C // NH, C),
                      "num_key_value_heads", "-D NKV="], "v_proj of another kv head count")
        flipped = dict(g32)
        dt, a = flipped["transformer.h.0.mlp.c_fc.weight"]
        flipped["transformer.h.0.mlp.c_fc.weight"] = (dt, np.ascontiguousarray(a.T))
        write_st(P("flipped-gpt2.safetensors"), flipped)
        expect_error(fsexec, gp, P("flipped-gpt2.safetensors"), "hf-gpt2",
                     ["'transformer.h.0.mlp.c_fc.weight'", "transpose", "[in, out]", "Conv1D"],
                     "GPT-2 weight in nn.Linear's layout")
        import torch
        sd = {h: torch.from_numpy(as_f32(*v).copy()) for h, v in g32.items()}
        torch.save(sd, P("pytorch_model.bin"))
        torch.save(sd, P("legacy.pt"), _use_new_zipfile_serialization=False)
        for name in ("pytorch_model.bin", "legacy.pt"):
            expect_error(fsexec, gp, P(name), "hf-gpt2", ["PyTorch pickle/zip checkpoint", "safetensors"],
                         "torch.save file (%s)" % name)
        expect_error(fsexec, gp, P("pytorch_model.bin"), "fsexec", ["PyTorch pickle/zip checkpoint"],
                     "torch.save file, our format")
        other = dict(g32)
        other["transformer.wte.weight"] = ("F32", np.zeros((512, C), np.float32))
        write_st(P("other.safetensors"), other)
        expect_error(fsexec, gp, P("other.safetensors"), "hf-gpt2",
                     ["'transformer.wte.weight'", "[512, %d]" % C, "[%d, %d]" % (V, C), "another model"],
                     "another model's file")
        untied = dict(g32)
        head = as_f32(*g32["transformer.wte.weight"]).copy()
        head[3, 5] += 1
        untied["lm_head.weight"] = ("F32", head)
        write_st(P("untied.safetensors"), untied)
        expect_error(fsexec, gp, P("untied.safetensors"), "hf-gpt2",
                     ["'lm_head.weight' differs from 'transformer.wte.weight'", "element %d" % (3 * C + 5), "ties"],
                     "lm_head that is not the tied embedding")
        deeper = dict(g32)
        deeper["transformer.h.2.ln_1.weight"] = ("F32", np.ones(C, np.float32))
        write_st(P("deeper.safetensors"), deeper)
        expect_error(fsexec, gp, P("deeper.safetensors"), "hf-gpt2",
                     ["'transformer.h.2.ln_1.weight'", "our 'h.2.ln1.w'", "has not"], "a layer the model has not")
        headless = {h: v for h, v in l32.items() if h != "lm_head.weight"}
        write_st(P("headless.safetensors"), headless)
        expect_error(fsexec, plans["llama"], P("headless.safetensors"), "hf-llama",
                     ["no tensor 'lm_head.weight'", "our 'output'", "tie_word_embeddings"], "Llama without lm_head")
        expect_error(fsexec, plans["llama"], P("gpt2.safetensors"), "hf-llama",
                     ["no tensor 'model.embed_tokens.weight'"], "GPT-2 file as hf-llama")
        nan = dict(g16)
        bad = nan["transformer.h.0.attn.c_attn.bias"][1].copy()
        bad[7] = np.float16("nan")
        nan["transformer.h.0.attn.c_attn.bias"] = ("F16", bad)
        write_st(P("nan.safetensors"), nan)
        expect_error(fsexec, gp, P("nan.safetensors"), "hf-gpt2", ["'transformer.h.0.attn.c_attn.bias' has NaN at index 7"],
                     "NaN in an F16 file")
        out = run([fsexec, gp, "--steps", "0", "--load-weights", P("gpt2.safetensors"), "--weights-format", "hf-gpt3"],
                  expect_rc=2)
        if "--weights-format" not in out:
            sys.exit("FAIL bad --weights-format: %s" % out)
        print("ok   --weights-format hf-gpt3: usage error")
        print("hf_weights: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
