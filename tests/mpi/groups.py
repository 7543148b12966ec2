#!/usr/bin/env python3
"""Frozen params and weight-decay groups under every strategy, across MPI ranks.

A tiny GPT-2 with a matrix, a whole block's MLP matrix and the tied embedding frozen
(--freeze wte,h.0.attn.w,h.1.fc.w) and nanoGPT's decay groups (--weight_decay_on
matrices), so each block's flat buffer splits into a decayed, a not-decayed and a frozen
unit; and samples/lora.fsm (frozen base, trainable adapters). Each trains 5 AdamW steps
(weight decay 0.1, clipping) with ddp, zero1, zero2 and fsdp at world 1, 2 and 3 (3:
uneven, padded shards): the params must equal the single-rank unsharded run's, bit for
bit at world 1 and to rel 1e-5 otherwise (or 3x the single-rank run's own difference
between 1 and 2 threads; tests/mpi/strategies.py says why), every step's loss and
gradient norm too; and every frozen param must equal its initial value bit for bit.
A decay applied to the wrong segment of a shard, a frozen unit reduced or updated, or a
norm over frozen params differs by orders of magnitude more.

usage: groups.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy)
"""
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import strategies as st  # noqa: E402
from strategies import rel  # noqa: E402

GPT2 = st.GPT2 + ["--freeze", "wte,h.0.attn.w,h.1.fc.w", "--weight_decay_on", "matrices"]
LORA = st.GPT2 + ["-D", "R=4"]
FROZEN = {"gpt2": lambda k: k in ("wte", "h.0.attn.w", "h.1.fc.w"), "lora": lambda k: ".lora_" not in k}


def main():
    st.quiet_mpi_leaks()
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        tokens = os.path.join(work, "tokens.bin")
        np.random.default_rng(3).integers(0, 256, size=4000, dtype=np.uint16).tofile(tokens)
        for model, dims in (("gpt2", GPT2), ("lora", LORA)):
            init, _ = st.train(fsc, fsexec, work, model, dims, tokens, "none", 1, steps=0)
            ref, ref_loss = st.train(fsc, fsexec, work, model, dims, tokens, "none", 1)
            other, _ = st.train(fsc, fsexec, work, model, dims, tokens, "none", 1, threads=2)
            floor = {n: rel(other[n].numpy().astype(np.float64), t.numpy().astype(np.float64)) for n, t in ref.items()}
            frozen = [k for k in init if FROZEN[model](k)]
            if not frozen or len(frozen) == len(init):
                sys.exit("FAIL %s: %d of %d params frozen" % (model, len(frozen), len(init)))
            moved = [k for k in init if k not in frozen and np.array_equal(ref[k].numpy(), init[k].numpy())]
            if moved:
                sys.exit("FAIL %s: trainable params %s did not move" % (model, moved))
            for shard in ("none", "ddp", "zero1", "zero2", "fsdp"):
                for world in ((1,) if shard == "none" else (1, 2, 3)):
                    got, got_loss = (ref, ref_loss) if shard == "none" else \
                        st.train(fsc, fsexec, work, model, dims, tokens, shard, world)
                    what = "%s world %d" % (shard, world)
                    for k in frozen:
                        if not np.array_equal(got[k].numpy(), init[k].numpy()):
                            sys.exit("FAIL %s %s: frozen param %s changed" % (model, what, k))
                    worst, name = st.compare(model, what, got, ref, floor, world == 1)
                    lerr = max(abs(a - b) / abs(b) for ga, gb in zip(got_loss, ref_loss) for a, b in zip(ga, gb))
                    if len(got_loss) != st.STEPS or lerr > (0.0 if world == 1 else st.TOL):
                        sys.exit("FAIL %s %s: losses %s, single rank %s" % (model, what, got_loss, ref_loss))
                    match = "bit for bit" if world == 1 else "params at %.0f%% of tolerance at most (%s)" % (100 * worst, name)
                    print("ok   %-4s %-5s world %d: %d frozen params unchanged, %s, losses and norms rel %.1e"
                          % (model, shard, world, len(frozen), match, lerr))
    print("frozen params and decay groups train alike under every strategy and world")


if __name__ == "__main__":
    main()
