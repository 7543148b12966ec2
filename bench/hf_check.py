#!/usr/bin/env python3
"""fsexec --weights-format hf-gpt2 | hf-llama against Hugging Face's own models.

Outside CI (it needs `transformers`): builds a tiny random GPT2LMHeadModel and
LlamaForCausalLM with the dims of our tiny samples, saves each with
save_pretrained(safe_serialization=True), and checks both ways on one batch:

  HF -> fsexec  fsexec --load-weights model.safetensors --weights-format hf-...: the
                loss of step 1 (computed before the update) against HF's loss on the
                same batch (--data-order sequential: row b of step 1 is tokens
                [b*T, b*T + T], targets shifted by one; runtime/data.c)
  fsexec -> HF  weights fsexec trained (30 steps from its own init, saved in our
                format), written with --weights-format fsexec,hf-... and a config.json
                beside them, loaded by from_pretrained(dir) (no missing or unexpected
                keys), against fsexec's step-1 loss on the same weights

Both must agree to ~1e-6 relative (fp32 against fp32). HF's loss in float64 is printed
too. For Llama it also shows that the rope check is not vacuous: the same weights with
q/k rows permuted as convert_llama_weights_to_hf permutes Meta's (interleaved pairs to
halves) give a clearly different loss, so our rope is HF's rotate_half over the halves
of each head and the rows map as they are.

The first run makes a venv at /tmp/hfvenv (torch: the CPU wheel index, else PyPI, else
Debian's python3-torch through --system-site-packages; transformers, safetensors) and
runs again inside it.

usage: bench/hf_check.py [FSC FSEXEC]   (default: build/fsc build/fsexec)
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
VENV = "/tmp/hfvenv"
PY = os.path.join(VENV, "bin", "python")
L, C, NH, T, V, F, B = 2, 64, 4, 32, 256, 176, 4
NKV = 2  # llama's kv heads (grouped-query attention)


def have(py, modules):
    return os.path.exists(py) and subprocess.run([py, "-c", "import " + ", ".join(modules)],
                                                 stderr=subprocess.DEVNULL).returncode == 0


def make_venv():
    """The venv with torch, transformers and safetensors; a message and exit on failure."""
    if have(PY, ["torch", "transformers", "safetensors"]):
        return
    pip = [PY, "-m", "pip", "install", "-q"]
    subprocess.run([sys.executable, "-m", "venv", VENV], check=True)
    if not have(PY, ["torch"]):
        ok = subprocess.run(pip + ["torch", "--index-url", "https://download.pytorch.org/whl/cpu"]).returncode == 0
        if not ok and have("/usr/bin/python3", ["torch"]):  # Debian's torch; a transformers that still takes it
            print("hf_check: no CPU torch wheel reachable; using Debian's python3-torch", file=sys.stderr)
            subprocess.run(["/usr/bin/python3", "-m", "venv", "--clear", "--system-site-packages", VENV], check=True)
        elif not ok:
            subprocess.run(pip + ["torch"], check=True)
    import_torch = subprocess.run([PY, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    old = import_torch.stdout.strip().split(".")[0] in ("1",)
    subprocess.run(pip + ["transformers<4.46" if old else "transformers", "safetensors"], check=True)
    if not have(PY, ["torch", "transformers", "safetensors"]):
        sys.exit("hf_check: could not set up %s" % VENV)


def run(cmd):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    if r.returncode:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def write_tokens(path, tokens):
    """llm.c's token file: 256 int32 header (magic, version 1, count), then uint16 tokens."""
    header = [20240520, 1, len(tokens)] + [0] * 253
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header) + struct.pack("<%dH" % len(tokens), *tokens))


def step1_loss(fsexec, plan, data, log, extra=()):
    run([fsexec, plan, "--data", data, "--data-order", "sequential", "--steps", "1", "--log", log, *extra])
    with open(log) as f:
        return json.loads(f.readline())["loss"]


def main():
    if os.path.realpath(sys.prefix) != os.path.realpath(VENV):
        make_venv()
        os.execv(PY, [PY, os.path.abspath(__file__), *sys.argv[1:]])
    import torch
    import torch.nn.functional as Fn
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

    fsc, fsexec = (os.path.abspath(p) for p in (sys.argv[1:3] if len(sys.argv) > 2 else
                                                 ("build/fsc", "build/fsexec")))
    print("torch %s, transformers %s" % (torch.__version__, transformers.__version__))
    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="hf_check.")
    tokens = torch.randint(0, V, (4096,)).tolist()
    data = os.path.join(work, "tokens.bin")
    write_tokens(data, tokens)
    # Step 1 of --data-order sequential: row b is the window at b * T (runtime/data.c).
    win = torch.tensor([tokens[b * T:b * T + T + 1] for b in range(B)])
    x, y = win[:, :-1], win[:, 1:]

    def hf_loss(model, dtype=torch.float32):
        m = model.to(dtype).eval()
        with torch.no_grad():
            logits = m(input_ids=x).logits
        loss = Fn.cross_entropy(logits.reshape(-1, V).double(), y.reshape(-1)).item()
        model.float()
        return loss

    def randomize(model, big=()):
        """Every param random (norms around 1, biases too), so each row of the mapping
        shows in the loss; the `big` ones large enough that attention is far from uniform."""
        g = torch.Generator().manual_seed(1)
        with torch.no_grad():
            for name, p in model.named_parameters():
                std = 0.3 if any(b in name for b in big) else 0.08
                noise = torch.randn(p.shape, generator=g) * std
                p.copy_(1 + 0.1 * noise / std if ("ln" in name or "norm" in name) and name.endswith("weight") else noise)

    def compare(what, ours, theirs, theirs64):
        rel = abs(ours - theirs) / abs(theirs)
        print("%-46s fsexec %.9f  HF %.9f  diff %.2e (rel %.2e)  [HF float64 %.9f]" %
              (what, ours, theirs, ours - theirs, rel, theirs64))
        if rel > 5e-6:
            sys.exit("FAIL %s: relative difference %.2e" % (what, rel))

    models = {
        "gpt2": (GPT2LMHeadModel, GPT2Config(vocab_size=V, n_positions=T, n_embd=C, n_layer=L, n_head=NH,
                                             activation_function="gelu_new", layer_norm_epsilon=1e-5,
                                             resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0),
                 ["-D", "L=%d" % L, "-D", "C=%d" % C, "-D", "NH=%d" % NH, "-D", "T=%d" % T, "-D", "V=%d" % V,
                  "-D", "B=%d" % B], ("c_attn",)),
        "llama": (LlamaForCausalLM, LlamaConfig(vocab_size=V, hidden_size=C, intermediate_size=F,
                                                num_hidden_layers=L, num_attention_heads=NH, num_key_value_heads=NKV,
                                                max_position_embeddings=T, rms_norm_eps=1e-5, rope_theta=10000.0,
                                                hidden_act="silu", tie_word_embeddings=False, attention_bias=False,
                                                attn_implementation="eager"),
                  ["-D", "L=%d" % L, "-D", "C=%d" % C, "-D", "NH=%d" % NH, "-D", "T=%d" % T, "-D", "V=%d" % V,
                   "-D", "F=%d" % F, "-D", "NKV=%d" % NKV, "-D", "B=%d" % B], ("q_proj", "k_proj")),
    }
    for name, (cls, cfg, dims, big) in models.items():
        fmt = "hf-" + name
        plan = os.path.join(work, name + ".plan")
        run([fsc, "samples/%s.fsm" % name, *dims, "-o", plan, "-q"])
        tplan = os.path.join(work, name + "-train.plan")
        run([fsc, "samples/%s.fsm" % name, *dims, "--lr", "1e-2", "-o", tplan, "-q"])

        # HF -> fsexec
        model = cls(cfg)
        randomize(model, big)
        src = os.path.join(work, name + "-hf")
        model.save_pretrained(src, safe_serialization=True)
        ours = step1_loss(fsexec, plan, data, os.path.join(work, name + "-in.jsonl"),
                          ["--load-weights", os.path.join(src, "model.safetensors"), "--weights-format", fmt])
        compare("%s: HF's save_pretrained -> fsexec" % name, ours, hf_loss(model), hf_loss(model, torch.float64))

        if name == "llama":  # the rows as Meta's interleaved layout would need: another loss
            perm = lambda n: torch.arange(n * C // NH).view(n, 2, C // NH // 2).transpose(1, 2).reshape(n * C // NH)
            bad = cls(cfg)
            bad.load_state_dict(model.state_dict())
            with torch.no_grad():
                for layer in bad.model.layers:
                    for proj, n in ((layer.self_attn.q_proj, NH), (layer.self_attn.k_proj, NKV)):
                        proj.weight.copy_(proj.weight[perm(n)])
            alt = os.path.join(work, "llama-permuted")
            bad.save_pretrained(alt, safe_serialization=True)
            wrong = step1_loss(fsexec, plan, data, os.path.join(work, "permuted.jsonl"),
                               ["--load-weights", os.path.join(alt, "model.safetensors"), "--weights-format", fmt])
            print("%-46s fsexec %.9f  (HF's loss without it %.9f: rope pairs matter by %.2e)" %
                  ("llama: q/k rows permuted (interleaved pairs)", wrong, hf_loss(model), wrong - hf_loss(model)))
            if abs(wrong - hf_loss(model)) < 1e-3:
                sys.exit("FAIL: the permuted q/k rows give the same loss: the rope check would prove nothing")

        # fsexec -> HF: weights fsexec trained (30 steps at lr 1e-2 from its own init), in our
        # format; fsexec's step-1 loss on them, and the same weights through the hf save.
        trained = os.path.join(work, name + "-trained.safetensors")
        run([fsexec, tplan, "--data", data, "--steps", "30", "--save-weights", trained])
        out = os.path.join(work, name + "-ours")
        os.makedirs(out)
        run([fsexec, plan, "--steps", "0", "--load-weights", trained, "--save-weights",
             os.path.join(out, "model.safetensors"), "--weights-format", "fsexec," + fmt])
        cfg.save_pretrained(out)
        back, info = cls.from_pretrained(out, output_loading_info=True)
        keys = {k: v for k, v in info.items() if v}
        if keys.get("missing_keys") or keys.get("unexpected_keys") or keys.get("mismatched_keys"):
            sys.exit("FAIL %s: from_pretrained: %s" % (name, keys))
        ours = step1_loss(fsexec, plan, data, os.path.join(work, name + "-out.jsonl"), ["--load-weights", trained])
        compare("%s: fsexec --save-weights -> from_pretrained" % name, ours, hf_loss(back),
                hf_loss(back, torch.float64))
        print("%-46s from_pretrained loading info: %s" % ("", keys or "no missing or unexpected keys"))
    print("hf_check: all agree")


if __name__ == "__main__":
    main()
