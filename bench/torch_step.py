"""One PyTorch timing round of bench/train_step.py, in whichever Python runs it (Debian's
torch 1.13, or torch 2.x from the bench venv, bench/venv.sh): the GPT-2 of
tests/py/models.py from fsexec's initial weights, on fsexec's batches, STEPS steps of
forward, backward, clip_grad_norm_ and AdamW; prints one JSON line: the torch version,
every step's ms, the first loss.

usage: PYTHON bench/torch_step.py WORKDIR L NH B T STEPS THREADS eager|compile HP_JSON
"""
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tests", "py"))
sys.dont_write_bytecode = True

import torch  # noqa: E402

import models  # noqa: E402


def train_ms(params, tok, L, NH, B, T, steps, hp, loss_fn=models.gpt2_loss, schedule=True):
    """Each step's ms and loss: forward, backward, clip_grad_norm_, AdamW (its lr set per
    step by models.lr_at when schedule)."""
    plist = list(params.values())
    for t in plist:
        t.requires_grad_(True)
    opt = torch.optim.AdamW(plist, lr=hp["lr"], betas=(hp["beta1"], hp["beta2"]), eps=hp["eps"],
                            weight_decay=hp["weight_decay"])
    ms, losses = [], []
    for s in range(1, steps + 1):
        x, y = models.sequential_batch(tok, s, B, T)
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = loss_fn(params, x, y, L, NH)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(plist, hp["clip"])
        for g in opt.param_groups if schedule else ():
            g["lr"] = models.lr_at(s, hp["lr"], hp["warmup"], hp["steps"], hp["min_lr"])
        opt.step()
        ms.append((time.perf_counter() - t0) * 1e3)
        losses.append(float(loss))
    return ms, losses


def main():
    wd, L, NH, B, T, steps, threads, mode, hp = sys.argv[1:10]
    L, NH, B, T, steps, threads, hp = int(L), int(NH), int(B), int(T), int(steps), int(threads), json.loads(hp)
    torch.set_num_threads(threads)
    params = models.load_safetensors(os.path.join(wd, "init.safetensors"))
    tok = models.read_tokens(os.path.join(wd, "tokens.bin"))
    loss_fn = torch.compile(models.gpt2_loss) if mode == "compile" else models.gpt2_loss
    ms, losses = train_ms(params, tok, L, NH, B, T, steps, hp, loss_fn)
    print(json.dumps({"torch": torch.__version__, "ms": ms, "loss": losses[0]}))


if __name__ == "__main__":
    main()
