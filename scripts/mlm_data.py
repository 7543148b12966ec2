#!/usr/bin/env python3
"""scripts/mlm_data.py: a text or token file to the masked-LM inputs of samples/bert.fsm.

usage: scripts/mlm_data.py INPUT OUTDIR --seq-len T [--format auto|text|tokens] [--vocab V]
                           [--pad ID --cls ID --sep ID --mask ID] [--seed N] ...

Writes OUTDIR/tokens.npy, segments.npy, mask.npy and labels.npy, int32 [N, T] each, which
`fsexec bert.plan --data OUTDIR` feeds by name. Each row is one example, as BERT's
create_pretraining_data.py makes them (without the next-sentence task): the next tokens of
the input, split at a random point into sentences A and B,

  [CLS] A... [SEP] B... [SEP] [PAD]...

segment 0 for [CLS], A and its [SEP], 1 for B and its [SEP], 0 for the padding; mask 1
on the real tokens and 0 on the padding (attention_mask). A row holds T - 3 input tokens,
or (with probability --short-prob, BERT's 0.1) a length drawn from [2, T - 3], so some
rows are padded. Of each row's non-special positions, round(15%) (at least 1, BERT's
masked_lm_prob) are selected; each selected token becomes [MASK] with probability 0.8, a
random non-special token with 0.1, and stays with 0.1; labels hold the original token
at the selected positions and --ignore-index (-100, Hugging Face's) everywhere else, so
every row has a label (an all-ignored batch's loss is 0/0).

Input (--format auto: tokens when the file starts with llm.c's or .npy's magic, else text):
  text    each byte is a token (0-255), as scripts/tokenize.py --vocab bytes; the special
          tokens are 256 [PAD], 257 [CLS], 258 [SEP], 259 [MASK]: train with V >= 260.
  tokens  llm.c's token file (scripts/tokenize.py's output: a 256-int32 header, then
          uint16 tokens), or a 1-D integer .npy of token ids (a WordPiece tokenizer's
          output, say). Give --vocab V and the special ids; the defaults are
          bert-base-uncased's (V 30522, [PAD] 0, [CLS] 101, [SEP] 102, [MASK] 103).

Pure Python and numpy. Same input and --seed, same files.
"""
import argparse
import os
import struct
import sys

# scripts/tokenize.py, next to this file, would shadow the standard library's tokenize, which
# numpy's .npy reader imports: this directory leaves the import path first.
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path = [p for p in sys.path if os.path.abspath(p or os.curdir) != HERE]
import numpy as np  # noqa: E402

MAGIC, HEADER_INTS = 20240520, 256
BYTE_SPECIALS = {"pad": 256, "cls": 257, "sep": 258, "mask": 259}
BERT_SPECIALS = {"pad": 0, "cls": 101, "sep": 102, "mask": 103}


def fail(msg):
    sys.exit("mlm_data.py: " + msg)


def read_input(path, fmt):
    """The token stream of the file (int64) and whether it was a token file."""
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as e:
        fail("%s: cannot read it (%s)" % (path, e.strerror))
    magic = len(data) >= 4 * HEADER_INTS and struct.unpack("<i", data[:4])[0] == MAGIC
    if fmt == "auto":
        fmt = "tokens" if magic or data[:6] == b"\x93NUMPY" else "text"
    if fmt == "text":
        return np.frombuffer(data, np.uint8).astype(np.int64), False
    if data[:6] == b"\x93NUMPY":
        try:
            a = np.load(path, allow_pickle=False)
        except ValueError as e:
            fail("%s: not a .npy file numpy reads (%s)" % (path, e))
        if a.ndim != 1 or a.dtype.kind not in "iu":
            fail("%s: a .npy of tokens is 1-D integers; this one is %s %s" % (path, a.dtype, list(a.shape)))
        if len(a) and a.min() < 0:
            fail("%s: token %d (at %d) is negative" % (path, a.min(), int(np.argmin(a))))
        return a.astype(np.int64), True
    if not magic:
        fail("%s: not llm.c's token file (no magic %d in its header; is it text? then --format text)" % (path, MAGIC))
    count = struct.unpack("<i", data[8:12])[0]
    body = data[4 * HEADER_INTS:]
    if count < 0 or len(body) < 2 * count:
        fail("%s: the header says %d tokens but the file holds %d" % (path, count, len(body) // 2))
    return np.frombuffer(body[:2 * count], "<u2").astype(np.int64), True


def make_rows(stream, T, V, sp, short_prob, ignore_index, rng):
    """The four int32 arrays of the examples, in order through the stream."""
    specials = np.array(sorted(sp.values()))
    ordinary = np.setdiff1d(np.arange(V), specials)
    longest = T - 3
    rows, pos = [], 0
    while len(stream) - pos >= 2:
        n = longest if rng.random() >= short_prob else int(rng.integers(2, longest + 1))
        n = min(n, len(stream) - pos)
        body = stream[pos:pos + n]
        pos += n
        cut = int(rng.integers(1, n))   # A holds body[:cut], B the rest, both non-empty
        tok = np.full(T, sp["pad"], np.int64)
        tok[:n + 3] = np.concatenate([[sp["cls"]], body[:cut], [sp["sep"]], body[cut:], [sp["sep"]]])
        seg = np.zeros(T, np.int64)
        seg[cut + 2:n + 3] = 1
        att = np.zeros(T, np.int64)
        att[:n + 3] = 1
        lab = np.full(T, ignore_index, np.int64)
        cand = np.array([i for i in range(1, n + 2) if i != cut + 1 and tok[i] not in specials])
        if len(cand):
            pick = rng.choice(cand, size=max(1, int(round(0.15 * len(cand)))), replace=False)
            lab[pick] = tok[pick]
            u = rng.random(len(pick))
            tok[pick[u < 0.8]] = sp["mask"]
            rand = pick[(u >= 0.8) & (u < 0.9)]
            tok[rand] = rng.choice(ordinary, size=len(rand))
        rows.append((tok, seg, att, lab))
    return [np.stack([r[i] for r in rows]).astype(np.int32) for i in range(4)]


def main(argv=None):
    ap = argparse.ArgumentParser(
        prog="mlm_data.py", description="a text or token file to samples/bert.fsm's masked-LM inputs "
        "(OUTDIR/tokens.npy, segments.npy, mask.npy, labels.npy) for fsexec --data OUTDIR",
        epilog="text input: byte tokens, specials 256-259, train with V >= 260; token input: llm.c's file "
        "(scripts/tokenize.py) or a 1-D .npy of ids, with --vocab and the special ids (defaults: bert-base-uncased's)")
    ap.add_argument("input", help="a text file, llm.c's token file, or a 1-D .npy of token ids")
    ap.add_argument("outdir", help="where the four .npy files go (made if missing)")
    ap.add_argument("--seq-len", type=int, required=True, help="T, the model's sequence length (>= 5)")
    ap.add_argument("--format", choices=["auto", "text", "tokens"], default="auto")
    ap.add_argument("--vocab", type=int, help="the vocabulary size V (token input; default 30522)")
    for name in ("pad", "cls", "sep", "mask"):
        ap.add_argument("--" + name, type=int, help="the [%s] id (token input)" % name.upper())
    ap.add_argument("--short-prob", type=float, default=0.1, help="probability of a shorter row (BERT's 0.1)")
    ap.add_argument("--ignore-index", type=int, default=-100, help="the label of unselected positions (-100)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    if a.seq_len < 5:
        ap.error("--seq-len %d: a row needs at least 5 positions ([CLS] A [SEP] B [SEP])" % a.seq_len)
    if not 0 <= a.short_prob <= 1:
        ap.error("--short-prob %g: a probability, in [0, 1]" % a.short_prob)
    stream, is_tokens = read_input(a.input, a.format)
    given = {k: getattr(a, k) for k in BERT_SPECIALS if getattr(a, k) is not None}
    if is_tokens:
        V = a.vocab if a.vocab is not None else 30522
        sp = dict(BERT_SPECIALS, **given)
    else:
        if given or a.vocab is not None:
            ap.error("--vocab and the special ids are for token input; text is bytes with specials 256-259")
        V, sp = 260, dict(BYTE_SPECIALS)
    if len(set(sp.values())) != 4:
        ap.error("the special ids %s must differ" % sp)
    for k, v in sp.items():
        if not 0 <= v < V:
            ap.error("--%s %d: outside the vocabulary [0, %d)" % (k, v, V))
    if a.ignore_index in range(V):
        print("mlm_data.py: note: --ignore-index %d is a token id; the model's cross_entropy must ignore the same "
              "value" % a.ignore_index, file=sys.stderr)
    if len(stream) and stream.max() >= V:
        i = int(np.argmax(stream >= V))
        fail("%s: token %d (at %d) is outside the vocabulary [0, %d): give --vocab" % (a.input, stream[i], i, V))
    if len(stream) < 2:
        fail("%s: %d tokens; a row needs at least 2" % (a.input, len(stream)))
    arrays = make_rows(stream, a.seq_len, V, sp, a.short_prob, a.ignore_index, np.random.default_rng(a.seed))
    os.makedirs(a.outdir, exist_ok=True)
    for name, arr in zip(("tokens", "segments", "mask", "labels"), arrays):
        np.save(os.path.join(a.outdir, name + ".npy"), arr)
    print("mlm_data.py: %s: %d rows of %d (vocab %d), %d labels; train with --data %s" % (
        a.outdir, len(arrays[0]), a.seq_len, V, int((arrays[3] != a.ignore_index).sum()), a.outdir),
        file=sys.stderr)


if __name__ == "__main__":
    main()
