#!/usr/bin/env python3
"""--weights-format map:FILE.json (a user's table of Hugging Face names) and hf-bert.

1. The built-in table as a user's: runtime/hf/hf-gpt2.json given as map:FILE writes the
   same file as hf-gpt2, byte for byte.
2. A user's map for samples/mlp.fsm (rows as objects and as [hf, ours, transpose]
   arrays, a {N} block index): --save-weights fsexec,map:m.json writes HF's names with
   our matmul weights transposed where the row says so; loading it back (map,fsexec)
   gives the init again, bit for bit; `fsexec --export CKPT` through the map writes the
   same tensors.
3. hf-bert: a small BERT written to the table's names (tests/py/hf_maps.py's MODEL:
   post-LN encoder, token + position + segment embeddings, a masked-LM head tied to the
   word embeddings) round-trips through HF's names; a BertForPreTraining-style file (the
   pooler, the next-sentence head, the tied decoder weight and bias, without the "bert."
   prefix) loads, and the loss fsexec's evaluation program gives on a batch equals a
   PyTorch forward written against HF's names (nn.Linear's [out, in], tanh GELU, the
   model's layernorm eps 1e-5), to 1e-5.
4. Bad maps each get an error naming the file and the row: malformed JSON (line and
   column), a duplicate HF name, our param in two rows, an unknown key (of a row, of the
   table), no "tensors", {N} on one side,
   a tied row without its param, a row naming a param the model has not (unknown name),
   a row without transpose where the file holds HF's layout (shape mismatch), a missing
   file, and an unknown format name (usage error).

usage: hf_maps.py FSC FSEXEC   (/usr/bin/python3 with numpy and torch)
"""
import json
import os
import shutil
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from hf_weights import read_st, write_st  # noqa: E402
from npy_data import run  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
B, T, V, C, NH, L, S = 2, 16, 64, 32, 4, 2, 2
MODEL = """model bert {
  dim B = %d, T = %d, V = %d, C = %d, NH = %d, L = %d, S = %d;
  input tokens: i32[B, T];
  input segments: i32[B, T];
  input targets: i32[B, T];
  layer Encoder {
    param q.w: [C, C] = normal(0.1);
    param q.b: [C] = normal(0.1);
    param k.w: [C, C] = normal(0.1);
    param k.b: [C] = normal(0.1);
    param v.w: [C, C] = normal(0.1);
    param v.b: [C] = normal(0.1);
    param attn_out.w: [C, C] = normal(0.1);
    param attn_out.b: [C] = normal(0.1);
    param ln1.w: [C] = ones;
    param ln1.b: [C] = normal(0.1);
    param fc.w: [C, 4 * C] = normal(0.1);
    param fc.b: [4 * C] = normal(0.1);
    param fcproj.w: [4 * C, C] = normal(0.1);
    param fcproj.b: [C] = normal(0.1);
    param ln2.w: [C] = ones;
    param ln2.b: [C] = normal(0.1);
    forward(x) {
      a = attention(heads(x @ q.w + q.b, NH), heads(x @ k.w + k.b, NH), heads(x @ v.w + v.b, NH));
      x = layernorm(x + merge_heads(a) @ attn_out.w + attn_out.b, ln1.w, ln1.b);
      x = layernorm(x + gelu(x @ fc.w + fc.b) @ fcproj.w + fcproj.b, ln2.w, ln2.b);
      return x;
    }
  }
  param word_emb: [V, C] = normal(0.1);
  param pos_emb: [T, C] = normal(0.1);
  param seg_emb: [S, C] = normal(0.1);
  param emb_ln.w: [C] = ones;
  param emb_ln.b: [C] = normal(0.1);
  param mlm.dense.w: [C, C] = normal(0.1);
  param mlm.dense.b: [C] = normal(0.1);
  param mlm.ln.w: [C] = ones;
  param mlm.ln.b: [C] = normal(0.1);
  param mlm.bias: [V] = normal(0.1);
  x = embedding(word_emb, tokens) + embedding(pos_emb, arange(T)) + embedding(seg_emb, segments);
  x = layernorm(x, emb_ln.w, emb_ln.b);
  x = Encoder[L](x) as encoder;
  h = layernorm(gelu(x @ mlm.dense.w + mlm.dense.b), mlm.ln.w, mlm.ln.b);
  loss = cross_entropy(h @ transpose(word_emb) + mlm.bias, targets);
}
""" % (B, T, V, C, NH, L, S)


def tensors(path):
    return {k: a for k, (dt, a) in read_st(path)[0].items()}


def bert_rows():
    """(HF name, our name, transposed?) of the small BERT, as runtime/hf/hf-bert.json says."""
    rows = [("bert.embeddings.word_embeddings.weight", "word_emb", False),
            ("bert.embeddings.position_embeddings.weight", "pos_emb", False),
            ("bert.embeddings.token_type_embeddings.weight", "seg_emb", False),
            ("bert.embeddings.LayerNorm.weight", "emb_ln.w", False), ("bert.embeddings.LayerNorm.bias", "emb_ln.b", False)]
    for i in range(L):
        h, o = "bert.encoder.layer.%d." % i, "encoder.%d." % i
        for hf, ours in (("attention.self.query", "q"), ("attention.self.key", "k"), ("attention.self.value", "v"),
                         ("attention.output.dense", "attn_out"), ("intermediate.dense", "fc"), ("output.dense", "fcproj")):
            rows += [(h + hf + ".weight", o + ours + ".w", True), (h + hf + ".bias", o + ours + ".b", False)]
        for hf, ours in (("attention.output.LayerNorm", "ln1"), ("output.LayerNorm", "ln2")):
            rows += [(h + hf + ".weight", o + ours + ".w", False), (h + hf + ".bias", o + ours + ".b", False)]
    rows += [("cls.predictions.transform.dense.weight", "mlm.dense.w", True),
             ("cls.predictions.transform.dense.bias", "mlm.dense.b", False),
             ("cls.predictions.transform.LayerNorm.weight", "mlm.ln.w", False),
             ("cls.predictions.transform.LayerNorm.bias", "mlm.ln.b", False), ("cls.predictions.bias", "mlm.bias", False)]
    return rows


def bert_loss(w, tokens, segments, targets):
    """BertForMaskedLM's forward on HF's names, in float64 (tanh GELU, layernorm eps 1e-5)."""
    import torch
    import torch.nn.functional as F
    g = {k: torch.from_numpy(np.asarray(v, np.float64)) for k, v in w.items()}
    ln = lambda x, p: F.layer_norm(x, (C,), g[p + ".weight"], g[p + ".bias"], 1e-5)  # noqa: E731
    lin = lambda x, p: x @ g[p + ".weight"].T + g[p + ".bias"]  # noqa: E731
    tok, seg = torch.from_numpy(tokens.astype(np.int64)), torch.from_numpy(segments.astype(np.int64))
    x = g["bert.embeddings.word_embeddings.weight"][tok] + g["bert.embeddings.position_embeddings.weight"][:T] + \
        g["bert.embeddings.token_type_embeddings.weight"][seg]
    x = ln(x, "bert.embeddings.LayerNorm")
    for i in range(L):
        p = "bert.encoder.layer.%d." % i
        hd = lambda t: t.view(B, T, NH, C // NH).transpose(1, 2)  # noqa: E731
        q, k, v = (hd(lin(x, p + "attention.self." + n)) for n in ("query", "key", "value"))
        a = torch.softmax(q @ k.transpose(-1, -2) / (C // NH) ** 0.5, -1) @ v
        x = ln(x + lin(a.transpose(1, 2).reshape(B, T, C), p + "attention.output.dense"), p + "attention.output.LayerNorm")
        inter = F.gelu(lin(x, p + "intermediate.dense"), approximate="tanh")
        x = ln(x + lin(inter, p + "output.dense"), p + "output.LayerNorm")
    h = ln(F.gelu(lin(x, "cls.predictions.transform.dense"), approximate="tanh"), "cls.predictions.transform.LayerNorm")
    logits = h @ g["bert.embeddings.word_embeddings.weight"].T + g["cls.predictions.bias"]
    return F.cross_entropy(logits.reshape(-1, V), torch.from_numpy(targets.astype(np.int64)).reshape(-1)).item()


def expect_error(cmd, rc, needles, what):
    out = run(cmd, expect_rc=rc)
    missing = [n for n in needles if n not in out]
    if missing:
        sys.exit("FAIL %s: the message lacks %s:\n%s" % (what, missing, out))
    print("ok   %s: %s" % (what, out.strip().splitlines()[-1]))


def main():
    fsc, fsexec = sys.argv[1], sys.argv[2]
    work = tempfile.mkdtemp(prefix="fs_hfmaps_")
    P = lambda *a: os.path.join(work, *a)  # noqa: E731
    try:
        # 1. The built-in table, given as a user's map, writes the same file.
        gpt2 = P("gpt2.plan")
        run([fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), "-q", "-o", gpt2, "-D", "L=2", "-D", "C=64", "-D", "NH=4",
             "-D", "T=32", "-D", "V=256", "-D", "B=2"])
        shutil.copy(os.path.join(ROOT, "runtime", "hf", "hf-gpt2.json"), P("gpt2-copy.json"))
        run([fsexec, gpt2, "--steps", "0", "--save-weights", P("builtin.st"), "--weights-format", "fsexec,hf-gpt2"])
        run([fsexec, gpt2, "--steps", "0", "--save-weights", P("user.st"), "--weights-format",
             "fsexec,map:" + P("gpt2-copy.json")])
        with open(P("builtin.st"), "rb") as a, open(P("user.st"), "rb") as b:
            if a.read() != b.read():
                sys.exit("FAIL hf-gpt2.json as map:FILE writes another file than hf-gpt2")
        print("ok   runtime/hf/hf-gpt2.json as map:FILE: the file hf-gpt2 writes, byte for byte")

        # 2. A user's map round-trips, through --save-weights, --load-weights and --export.
        mlp = P("mlp.plan")
        run([fsc, os.path.join(ROOT, "samples", "mlp.fsm"), "-q", "-o", mlp])
        user = {"prefix": "net.", "tensors": [
            {"hf": "net.fc_in.weight", "ours": "w_in", "transpose": True},
            ["net.fc_in.bias", "b_in"],
            {"hf": "net.hidden.{N}.weight", "ours": "hidden.{N}.w", "transpose": True},
            ["net.hidden.{N}.bias", "hidden.{N}.b", False],
            ["net.head.weight", "w_out", True],
            {"hf": "net.head.bias", "ours": "b_out"}]}
        with open(P("m.json"), "w") as f:
            json.dump(user, f)
        m = "map:" + P("m.json")
        run([fsexec, mlp, "--steps", "0", "--save-weights", P("init.st"), "--checkpoint-dir", P("ck")])
        run([fsexec, mlp, "--steps", "0", "--save-weights", P("hf.st"), "--weights-format", "fsexec," + m])
        ours, hf = tensors(P("init.st")), tensors(P("hf.st"))
        want = {"net.fc_in.weight": ours["w_in"].T, "net.fc_in.bias": ours["b_in"], "net.head.weight": ours["w_out"].T,
                "net.head.bias": ours["b_out"]}
        for i in range(2):
            want["net.hidden.%d.weight" % i] = ours["hidden.%d.w" % i].T
            want["net.hidden.%d.bias" % i] = ours["hidden.%d.b" % i]
        if sorted(hf) != sorted(want) or any(not np.array_equal(hf[k], want[k]) for k in want):
            sys.exit("FAIL user map: the file holds %s" % sorted(hf))
        print("ok   a user's map: %d tensors under its names, transposed where it says" % len(hf))
        run([fsexec, mlp, "--steps", "0", "--load-weights", P("hf.st"), "--weights-format", m + ",fsexec",
             "--save-weights", P("back.st")])
        back = tensors(P("back.st"))
        if sorted(back) != sorted(ours) or any(not np.array_equal(back[k], ours[k]) for k in ours):
            sys.exit("FAIL user map: loading the map's file gives other params")
        bare = {k[len("net."):]: ("F32", v) for k, v in hf.items()}  # without the prefix, as a base model's
        write_st(P("bare.st"), bare)
        run([fsexec, mlp, "--steps", "0", "--load-weights", P("bare.st"), "--weights-format", m + ",fsexec",
             "--save-weights", P("back2.st")])
        if any(not np.array_equal(tensors(P("back2.st"))[k], ours[k]) for k in ours):
            sys.exit("FAIL user map: the file without the prefix loads other params")
        run([fsexec, "--export", P("ck"), P("export.st"), "--weights-format", m])
        ex = tensors(P("export.st"))
        if sorted(ex) != sorted(want) or any(not np.array_equal(ex[k], want[k]) for k in want):
            sys.exit("FAIL user map: --export writes other tensors")
        print("ok   the user's map round-trips: load (with and without its prefix) gives the init bit for bit, "
              "--export the same tensors")

        # 3. hf-bert.
        with open(P("bert.fsm"), "w") as f:
            f.write(MODEL)
        bert = P("bert.plan")
        run([fsc, P("bert.fsm"), "-q", "-o", bert])
        run([fsexec, bert, "--steps", "0", "--save-weights", P("b-ours.st")])
        run([fsexec, bert, "--steps", "0", "--save-weights", P("b-hf.st"), "--weights-format", "fsexec,hf-bert"])
        ours, hf = tensors(P("b-ours.st")), tensors(P("b-hf.st"))
        rows = bert_rows()
        if sorted(hf) != sorted(h for h, _, _ in rows) or \
                any(not np.array_equal(hf[h], ours[o].T if t else ours[o]) for h, o, t in rows):
            sys.exit("FAIL hf-bert: the file holds %s" % sorted(set(hf) ^ set(h for h, _, _ in rows)))
        print("ok   hf-bert: %d tensors under BertForMaskedLM's names, nn.Linear weights transposed" % len(hf))
        rng = np.random.default_rng(3)
        full = {h: ("F32", (0.1 * rng.standard_normal(hf[h].shape)).astype(np.float32)) for h in hf}
        for h in full:
            if h.endswith("LayerNorm.weight"):
                full[h] = ("F32", (1 + 0.1 * rng.standard_normal(hf[h].shape)).astype(np.float32))
        pre = {(k[len("bert."):] if k.startswith("bert.") else k): v for k, v in full.items()}  # BertModel's names
        pre["pooler.dense.weight"] = ("F32", np.ones((C, C), np.float32))
        pre["pooler.dense.bias"] = ("F32", np.zeros(C, np.float32))
        pre["cls.seq_relationship.weight"] = ("F32", np.ones((2, C), np.float32))
        pre["cls.seq_relationship.bias"] = ("F32", np.zeros(2, np.float32))
        pre["cls.predictions.decoder.weight"] = full["bert.embeddings.word_embeddings.weight"]
        pre["cls.predictions.decoder.bias"] = full["cls.predictions.bias"]
        write_st(P("pretraining.st"), pre)
        tokens, segments, targets = (rng.integers(0, n, (B, T)) for n in (V, S, V))
        for name, a in (("tokens", tokens), ("segments", segments), ("targets", targets)):
            np.save(P(name + ".npy"), a)
        val = "tokens=%s,segments=%s,targets=%s" % (P("tokens.npy"), P("segments.npy"), P("targets.npy"))
        out = run([fsexec, bert, "--steps", "0", "--load-weights", P("pretraining.st"), "--weights-format",
                   "hf-bert,fsexec", "--val-data", val, "--eval-batches", "1", "--save-weights", P("b-back.st")])
        back = tensors(P("b-back.st"))
        if any(not np.array_equal(back[o], full[h][1].T if t else full[h][1]) for h, o, t in rows):
            sys.exit("FAIL hf-bert: a BertForPreTraining file loads other params")
        got = float(out.split("val_loss")[1].split()[0])
        want = bert_loss({k: v for k, (_, v) in full.items()}, tokens, segments, targets)
        if abs(got - want) > 1e-5 * abs(want):
            sys.exit("FAIL hf-bert: loss %.6f, PyTorch's forward on HF's names %.6f" % (got, want))
        print("ok   hf-bert: a BertForPreTraining file (pooler, NSP head, tied decoder, no prefix) loads; the loss, "
              "%.6f, is PyTorch's on HF's names" % got)
        untied = dict(pre)
        w = pre["cls.predictions.decoder.weight"][1].copy()
        w[1, 2] += 1
        untied["cls.predictions.decoder.weight"] = ("F32", w)
        write_st(P("untied.st"), untied)
        expect_error([fsexec, bert, "--steps", "0", "--load-weights", P("untied.st"), "--weights-format", "hf-bert"], 1,
                     ["'cls.predictions.decoder.weight' differs from 'embeddings.word_embeddings.weight'", "ties"],
                     "hf-bert, a decoder that is not the word embeddings")

        # 4. Bad maps.
        def bad(name, table, needles, plan=mlp, file=P("hf.st"), text=None, rc=1):
            with open(P(name), "w") as f:
                f.write(text if text is not None else json.dumps(table))
            expect_error([fsexec, plan, "--steps", "0", "--load-weights", file, "--weights-format",
                          "map:" + P(name)], rc, needles, name)
        rows = user["tensors"]
        bad("malformed.json", None, ["malformed.json: not a table of names (JSON)", "line 2"],
            text='{"tensors": [\n  {"hf": "a" "ours": "b"}]}')
        bad("dup-hf.json", {"tensors": rows + [["net.head.bias", "b_extra"]]},
            ["dup-hf.json: tensors[5] and tensors[6] both map HF's 'net.head.bias' (a duplicate entry)"])
        bad("dup-ours.json", {"tensors": rows + [["net.other.bias", "b_out"]]},
            ["dup-ours.json: tensors[5] and tensors[6] both map our 'b_out'", "\"tied\""])
        bad("key.json", {"tensors": rows[:-1] + [{"hf": "net.head.bias", "ours": "b_out", "tranpose": True}]},
            ["key.json: tensors[5]: unknown key \"tranpose\""])
        bad("mark.json", {"tensors": rows[:2] + [["net.hidden.weight", "hidden.{N}.w", True]] + rows[3:]},
            ["mark.json: tensors[2] ('net.hidden.weight'): {N}, the block index, goes once into both names"])
        bad("tied.json", {"tensors": rows + [{"hf": "net.copy", "ours": "w_hidden", "tied": True}]},
            ["tied.json: tensors[6] ('net.copy') is a tied copy of our 'w_hidden', which no other row maps"])
        bad("unknown.json", {"tensors": rows + [["net.extra.weight", "w_extra"]]},
            ["the map " + P("unknown.json") + ": tensors[6] ('net.extra.weight') names our 'w_extra', which is no "
             "param of this model (unknown name"])
        bad("shape.json", {"tensors": rows[:4] + [["net.head.weight", "w_out", False]] + rows[5:]},
            ["tensor 'net.head.weight' is F32 [4, 64]", "our 'w_out' [64, 4]", "holds the transpose"])
        bad("tensors.json", {"rows": rows}, ["tensors.json: a table is a JSON object whose \"tensors\" lists its rows"])
        bad("prefx.json", {"tensors": rows, "prefx": "net."}, ["prefx.json: unknown key \"prefx\""])
        expect_error([fsexec, mlp, "--steps", "0", "--load-weights", P("hf.st"), "--weights-format",
                      "map:" + P("none.json")], 1, [P("none.json") + ": cannot open the table"], "a missing map")
        expect_error([fsexec, mlp, "--steps", "0", "--load-weights", P("hf.st"), "--weights-format", "hf-gpt3"], 2,
                     ["--weights-format: expected fsexec, hf-bert, hf-gpt2, hf-llama or map:FILE.json"],
                     "an unknown format")
        print("hf_maps: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
