#!/usr/bin/python3
"""samples/bert.fsm against PyTorch: masked-LM pretraining on scripts/mlm_data.py's inputs.

1. scripts/mlm_data.py makes tokens, segments, mask and labels from a text (byte tokens,
   some rows shortened so the padding mask has zeros); the rows are checked against what
   its help promises (the [CLS] A [SEP] B [SEP] layout, segments, mask, the labels at the
   selected positions only, at least one a row, 80% of them [MASK]); token ids from a .npy
   get bert-base-uncased's special ids; bad inputs are refused with their message.
2. samples/bert.fsm at small dims (L=2, C=64, NH=4, T=32, V=300, B=4) trains 6 AdamW steps
   under BERT's recipe (weight decay on the matrices only, clip 1.0, the linear schedule
   with warmup) with fsexec --data DIR --data-order sequential; a hand-written BERT in
   PyTorch (post-LN, exact GELU, the key padding mask, the tied decoder with its bias,
   cross_entropy with ignore_index -100) trains from the same init on the same batches,
   in float64 and float32. Each step's loss, grad norm and lr, and every param after the
   6 steps, are judged as tests/py/parity.py judges GPT-2 and Llama (its Check and
   tolerances: within them of float64, or float32 rounding alone misses them).
3. --weights-format hf-bert: the reference's final weights, written under Hugging Face's
   names (nn.Linear's [out, in], the tied decoder, the `bert.` prefix), load into the
   plan, and its evaluation program's loss on the first batch (--val-data DIR
   --eval-batches 1) is the float64 reference's on that batch, to 1e-5.

4. (--emu LIBFS_CUDAEMU; instead of 2 and 3) The plan's CUDA kernels and cuBLAS calls on the
   cuda-emu backend against the CPU backend: every param's step-1 gradient, fp32 (1e-5) and
   bf16 (1.5e-2: three bf16 ulps of 2^-8; with the residual adds in their producers, each
   backend rounds the residual stream's gradient once, at places whose f32 sums are ordered
   differently, and encoder.1.ln2.w's gradient differs by 1.17e-2, 7.2e-3 with
   --fuse_residual 0).

usage: /usr/bin/python3 tests/py/bert_mlm.py FSC FSEXEC [--emu LIBFS_CUDAEMU]
"""
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.dont_write_bytecode = True
from models import load_safetensors, lr_at, save_safetensors  # noqa: E402
from parity import TOL, BoundCheck, Check, read_log  # noqa: E402

ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
DIMS = {"L": 2, "C": 64, "NH": 4, "T": 32, "V": 300, "B": 4}
HP = {"lr": 1e-3, "beta1": 0.9, "beta2": 0.999, "eps": 1e-6, "weight_decay": 0.01, "clip": 1.0,
      "lr_schedule": "linear", "warmup": 2, "min_lr": 0, "steps": 8}
NSTEPS, IGNORE, PAD, CLS, SEP, MASK = 6, -100, 256, 257, 258, 259


def run(cmd, cwd=None):
    r = subprocess.run(cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if r.returncode:
        sys.exit("FAIL (exit %d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def check_data(d):
    """The rows hold what mlm_data.py's help says."""
    tok, seg, att, lab = (d[n] for n in ("tokens", "segments", "mask", "labels"))
    T = tok.shape[1]
    masked = kept = 0
    for i in range(len(tok)):
        n = int(att[i].sum())
        seps = np.flatnonzero(tok[i, :n] == SEP)
        orig = np.where(lab[i] != IGNORE, lab[i], tok[i])
        bad = (tok[i, 0] != CLS or n < 5 or len(seps) != 2 or seps[1] != n - 1 or (att[i, :n] != 1).any()
               or (tok[i, n:] != PAD).any() or (seg[i, :seps[0] + 1] != 0).any() or (seg[i, seps[0] + 1:n] != 1).any()
               or (seg[i, n:] != 0).any() or (orig[:n] > 255).sum() != 3 or (lab[i, n:] != IGNORE).any()
               or (lab[i] != IGNORE).sum() != max(1, round(0.15 * (n - 3)))
               or (lab[i][[0, seps[0], n - 1]] != IGNORE).any())
        if bad:
            sys.exit("FAIL mlm_data.py: row %d is not [CLS] A [SEP] B [SEP] [PAD]... with its segments, mask and "
                     "labels:\n%s\n%s\n%s\n%s" % (i, tok[i], seg[i], att[i], lab[i]))
        sel = lab[i] != IGNORE
        masked += int((tok[i][sel] == MASK).sum())
        kept += int((tok[i][sel] == lab[i][sel]).sum())
    total = int((lab != IGNORE).sum())
    padded = int((att == 0).any(axis=1).sum())
    if not 0.7 < masked / total < 0.9 or not 0.03 < kept / total < 0.2 or padded == 0 or T != DIMS["T"]:
        sys.exit("FAIL mlm_data.py: %d labels, %d [MASK], %d unchanged, %d padded rows" % (total, masked, kept, padded))
    print("ok   1. mlm_data.py: %d rows ([CLS] A [SEP] B [SEP], %d padded), %d labels: %.0f%% [MASK], %.0f%% unchanged"
          % (len(tok), padded, total, 100 * masked / total, 100 * kept / total))


def data_errors(P):
    """mlm_data.py on token ids (a 1-D .npy: bert-base-uncased's specials) and on bad input."""
    script = os.path.join(ROOT, "scripts", "mlm_data.py")
    np.save(P("ids.npy"), np.random.default_rng(2).integers(1000, 30000, 3000))
    run([sys.executable, script, P("ids.npy"), P("ids"), "--seq-len", "64"])
    tok, lab = np.load(P("ids", "tokens.npy")), np.load(P("ids", "labels.npy"))
    if (tok[:, 0] != 101).any() or not (tok == 103).any() or tok.max() >= 30522 or (lab[lab != IGNORE] < 1000).any():
        sys.exit("FAIL mlm_data.py: token ids in a .npy do not make [CLS]=101 ... [MASK]=103 rows")
    np.save(P("ids2d.npy"), np.zeros((3, 3), np.int64))
    with open(P("empty.txt"), "w") as f:
        f.write("a")
    for args, needle in (([P("none.txt"), P("o"), "--seq-len", "32"], "none.txt: cannot read it"),
                         ([P("text.txt"), P("o"), "--seq-len", "4"], "--seq-len 4: a row needs at least 5"),
                         ([P("ids2d.npy"), P("o"), "--seq-len", "32"], "a .npy of tokens is 1-D integers"),
                         ([P("ids.npy"), P("o"), "--seq-len", "32", "--vocab", "2000"],
                          "outside the vocabulary [0, 2000)"),
                         ([P("ids.npy"), P("o"), "--seq-len", "32", "--mask", "101"], "must differ"),
                         ([P("text.txt"), P("o"), "--seq-len", "32", "--vocab", "9"], "for token input"),
                         ([P("empty.txt"), P("o"), "--seq-len", "32"], "1 tokens; a row needs at least 2"),
                         ([P("text.txt"), P("o"), "--seq-len", "32", "--format", "tokens"], "not llm.c's token file")):
        r = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode == 0 or needle not in r.stdout or "Traceback" in r.stdout:
            sys.exit("FAIL mlm_data.py %s: exit %d, wanted a message with %r:\n%s" % (args, r.returncode, needle,
                                                                                    r.stdout))
    if os.path.exists(P("o")):
        sys.exit("FAIL mlm_data.py: a refused input left an output directory")
    print("ok   1. mlm_data.py: token ids from a .npy (bert-base-uncased's specials); 8 bad inputs refused, each "
          "with its message")


def bert_loss(p, tokens, segments, mask, labels, L, NH):
    """samples/bert.fsm in PyTorch on its param names (matmul weights [in, out])."""
    B, T = tokens.shape
    C = p["word_emb"].shape[1]
    ln = lambda x, n: F.layer_norm(x, (C,), p[n + ".w"], p[n + ".b"], 1e-12)  # noqa: E731
    x = p["word_emb"][tokens] + p["pos_emb"][torch.arange(T)] + p["seg_emb"][segments]
    x = ln(x, "emb_ln")
    keep = (mask != 0)[:, None, None, :]   # (B, 1, 1, S): the keys each query may see
    hd = lambda t: t.view(B, T, NH, C // NH).transpose(1, 2)  # noqa: E731
    for i in range(L):
        g = lambda n: p["encoder.%d.%s" % (i, n)]  # noqa: E731
        q, k, v = (hd(x @ g(n + ".w") + g(n + ".b")) for n in ("q", "k", "v"))
        s = (q @ k.transpose(-1, -2)) / (C // NH) ** 0.5
        a = torch.softmax(s.masked_fill(~keep, float("-inf")), -1) @ v
        a = a.transpose(1, 2).reshape(B, T, C)
        x = ln(x + a @ g("attn_out.w") + g("attn_out.b"), "encoder.%d.ln1" % i)
        x = ln(x + F.gelu(x @ g("fc.w") + g("fc.b")) @ g("fcproj.w") + g("fcproj.b"), "encoder.%d.ln2" % i)
    h = ln(F.gelu(x @ p["mlm.dense.w"] + p["mlm.dense.b"]), "mlm.ln")
    logits = h @ p["word_emb"].T + p["mlm.bias"]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def batch(d, step, B):
    """fsexec --data-order sequential: row b of step s is sample ((s - 1) B + b) mod N."""
    n = len(d["tokens"])
    idx = [((step - 1) * B + b) % n for b in range(B)]
    return [torch.from_numpy(d[k][idx].astype(np.int64)) for k in ("tokens", "segments", "mask", "labels")]


def train_ref(init, d, dtype):
    """NSTEPS of fsexec's training: loss, backward, clip_grad_norm_, the schedule's lr, AdamW
    with BERT's groups (the matrices decay, the 1-D params do not)."""
    p = {k: v.clone().to(dtype).requires_grad_(True) for k, v in init.items()}
    groups = [{"params": [t for t in p.values() if t.dim() >= 2]},
              {"params": [t for t in p.values() if t.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=HP["lr"], betas=(HP["beta1"], HP["beta2"]), eps=HP["eps"],
                            weight_decay=HP["weight_decay"])
    log = []
    for s in range(1, NSTEPS + 1):
        opt.zero_grad(set_to_none=True)
        loss = bert_loss(p, *batch(d, s, DIMS["B"]), DIMS["L"], DIMS["NH"])
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(list(p.values()), HP["clip"])
        lr = lr_at(s, HP["lr"], HP["warmup"], HP["steps"], HP["min_lr"], "linear")
        for g in opt.param_groups:
            g["lr"] = lr
        opt.step()
        log.append({"loss": float(loss), "grad_norm": float(norm), "lr": lr})
    return log, {k: v.detach() for k, v in p.items()}


def hf_names(p, L):
    """Our params under BertForMaskedLM's names: nn.Linear weights [out, in], the tied decoder."""
    out = {"bert.embeddings.word_embeddings.weight": p["word_emb"],
           "bert.embeddings.position_embeddings.weight": p["pos_emb"],
           "bert.embeddings.token_type_embeddings.weight": p["seg_emb"],
           "bert.embeddings.LayerNorm.weight": p["emb_ln.w"], "bert.embeddings.LayerNorm.bias": p["emb_ln.b"],
           "cls.predictions.transform.dense.weight": p["mlm.dense.w"].T,
           "cls.predictions.transform.dense.bias": p["mlm.dense.b"],
           "cls.predictions.transform.LayerNorm.weight": p["mlm.ln.w"],
           "cls.predictions.transform.LayerNorm.bias": p["mlm.ln.b"], "cls.predictions.bias": p["mlm.bias"],
           "cls.predictions.decoder.weight": p["word_emb"], "cls.predictions.decoder.bias": p["mlm.bias"]}
    for i in range(L):
        h, o = "bert.encoder.layer.%d." % i, "encoder.%d." % i
        for hf, ours in (("attention.self.query", "q"), ("attention.self.key", "k"), ("attention.self.value", "v"),
                         ("attention.output.dense", "attn_out"), ("intermediate.dense", "fc"),
                         ("output.dense", "fcproj")):
            out[h + hf + ".weight"], out[h + hf + ".bias"] = p[o + ours + ".w"].T, p[o + ours + ".b"]
        for hf, ours in (("attention.output.LayerNorm", "ln1"), ("output.LayerNorm", "ln2")):
            out[h + hf + ".weight"], out[h + hf + ".bias"] = p[o + ours + ".w"], p[o + ours + ".b"]
    return out


def plan(fsc, out, *extra):
    cmd = [fsc, os.path.join(ROOT, "samples", "bert.fsm"), "-q", "-o", out, *extra]
    for k, v in DIMS.items():
        cmd += ["-D", "%s=%d" % (k, v)]
    for k, v in HP.items():
        cmd += ["--" + k, str(v)]
    run(cmd)


def emulated(fsc, fsexec, emu, P):
    """4: step-1 gradients on cuda-emu against the CPU backend's, fp32 and bf16."""
    env = dict(os.environ, FS_CUDA_BACKEND=emu, FS_CUDA_EMU_CACHE=P("emu-cache"))
    failed = False
    for prec, tol in (("fp32", 1e-5), ("bf16", 1.5e-2)):
        plan(fsc, P(prec + ".plan"), "--precision", prec)
        base = [fsexec, P(prec + ".plan"), "--data", P("data"), "--data-order", "sequential", "--steps", "1"]
        run(base + ["--save-grads", P(prec + "-cpu.st")])
        r = subprocess.run(base + ["--device", "cuda", "--save-grads", P(prec + "-emu.st")], env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        if r.returncode:
            sys.exit("FAIL (exit %d): fsexec --device cuda (cuda-emu)\n%s" % (r.returncode, r.stdout[-3000:]))
        cpu, dev = load_safetensors(P(prec + "-cpu.st"), torch.float64), load_safetensors(P(prec + "-emu.st"),
                                                                                         torch.float64)
        errs = {k: ((dev[k] - cpu[k]).abs().max() / cpu[k].abs().max().clamp_min(1e-30)).item()
                for k in cpu if not k.endswith(".k.b")}   # k.b's gradient is 0: rounding noise on both
        worst = max(errs, key=errs.get)
        ok = set(dev) == set(cpu) and errs[worst] <= tol
        print("%s 4. cuda-emu %s: step-1 gradients against the CPU backend's, worst %s %.2e (tol %g)" % (
            "ok  " if ok else "FAIL", prec, worst, errs[worst], tol))
        failed |= not ok
    if failed:
        sys.exit("FAIL: samples/bert.fsm's CUDA program differs from the CPU backend")


def main():
    if len(sys.argv) not in (3, 5) or len(sys.argv) == 5 and sys.argv[3] != "--emu":
        sys.exit("usage: bert_mlm.py FSC FSEXEC [--emu LIBFS_CUDAEMU]")
    fsc, fsexec = (os.path.abspath(a) for a in sys.argv[1:3])
    emu = os.path.abspath(sys.argv[4]) if len(sys.argv) == 5 else None
    work = tempfile.mkdtemp(prefix="fs_bert_")
    P = lambda *a: os.path.join(work, *a)  # noqa: E731
    try:
        # 1. the data: a text of words, byte tokens
        rng = np.random.default_rng(5)
        words = ["the", "cat", "sat", "on", "a", "mat", "while", "dogs", "ran", "far", "away", "and", "back"]
        with open(P("text.txt"), "w") as f:
            f.write(" ".join(rng.choice(words, 400)) + "\n")
        run([sys.executable, os.path.join(ROOT, "scripts", "mlm_data.py"), P("text.txt"), P("data"),
             "--seq-len", str(DIMS["T"]), "--short-prob", "0.3", "--seed", "7"])
        d = {k: np.load(P("data", k + ".npy")) for k in ("tokens", "segments", "mask", "labels")}
        check_data(d)
        data_errors(P)
        if emu:
            emulated(fsc, fsexec, emu, P)
            print("bert_mlm --emu: all passed")
            return

        # 2. fsexec and the reference, 6 steps from the same init
        plan(fsc, P("bert.plan"))
        base = [fsexec, P("bert.plan"), "--data", P("data"), "--data-order", "sequential"]
        run(base + ["--steps", "0", "--save-weights", P("init.st")])
        run(base + ["--steps", str(NSTEPS), "--log", P("log.jsonl"), "--save-weights", P("final.st")])
        init, fs_final = load_safetensors(P("init.st")), load_safetensors(P("final.st"))
        fs_log = read_log(P("log.jsonl"))
        if len(fs_log) != NSTEPS or set(fs_final) != set(init):
            sys.exit("FAIL: %d log lines, final weights %s" % (len(fs_log), sorted(set(fs_final) ^ set(init))))
        (log32, fin32), (log64, fin64) = (train_ref(init, d, dt) for dt in (torch.float32, torch.float64))
        checks = []
        for key, tol in (("loss", TOL["losses"]), ("grad_norm", TOL["grad_norm"]), ("lr", TOL["lr"])):
            c = Check("bert", key + " of each step", tol)
            for i in range(NSTEPS):
                c.add("step %d" % (i + 1), fs_log[i][key], log32[i][key], log64[i][key])
            checks.append(c)
        c = Check("bert", "weights after %d steps" % NSTEPS, TOL["param"])
        kb = BoundCheck("bert", "key bias max|k.b|/max|q.b, v.b|", TOL["key_bias"])
        for k in sorted(init):
            if k.endswith(".k.b"):
                # k.b adds q . k.b to every score of a query's row, which softmax ignores: its
                # gradient is exactly 0, so in float32 rounding noise that Adam divides by its
                # own size (parity.py's key bias): it only has to stay noise next to q.b, v.b.
                kb.add(k, fs_final[k], fin32[k], fin64[k], torch.cat([fin64[k[:-3] + "q.b"], fin64[k[:-3] + "v.b"]]))
            else:
                c.add(k, fs_final[k], fin32[k], fin64[k])
        checks += [c, kb]
        failed = False
        for c in checks:
            ok, note, (name, e32, e64, t64) = c.verdict()
            print("%s 2. %s: worst %s, fsexec vs f64 %.2e (tol %g), vs f32 %.2e%s" % (
                "ok  " if ok else "FAIL", c.what, name, e64, c.tol, e32, "; " + note if note else ""))
            failed |= not ok
        if failed:
            sys.exit("FAIL: samples/bert.fsm does not train as the PyTorch reference does")
        if not log64[-1]["loss"] < log64[0]["loss"]:
            sys.exit("FAIL: the reference's loss did not fall (%s): the check says little" % [r["loss"] for r in log64])

        # 3. the reference's weights under HF's names, loaded with --weights-format hf-bert
        save_safetensors(P("hf.st"), hf_names(fin64, DIMS["L"]))
        out = run([fsexec, P("bert.plan"), "--steps", "0", "--load-weights", P("hf.st"), "--weights-format",
                   "hf-bert", "--val-data", P("data"), "--eval-batches", "1"])
        got = float(out.split("val_loss")[1].split()[0])
        f32 = {k: v.to(torch.float32).to(torch.float64) for k, v in fin64.items()}   # as the file holds them
        want = bert_loss(f32, *batch(d, 1, DIMS["B"]), DIMS["L"], DIMS["NH"]).item()
        if abs(got - want) > 1e-5 * abs(want):
            sys.exit("FAIL 3. hf-bert: val_loss %.7f, the reference's %.7f on the first batch" % (got, want))
        print("ok   3. hf-bert: the reference's weights under HF's names load; val_loss %.6f is its %.6f" % (got, want))
        print("bert_mlm: all passed")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
