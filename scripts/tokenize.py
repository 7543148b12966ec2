#!/usr/bin/env python3
"""scripts/tokenize.py: a text file to a token file fsexec --data reads (llm.c's format).

usage: scripts/tokenize.py in.txt out.bin [--vocab bytes|gpt2 --encoder encoder.json --merges vocab.bpe]

  --vocab bytes  (default) each byte of the file is a token: vocab 256, always works;
                 train a model with V >= 256.
  --vocab gpt2   GPT-2's byte-level BPE, from the two files OpenAI and Hugging Face ship
                 with GPT-2 (encoder.json: token -> id, vocab.bpe: the merges in rank
                 order); nothing is downloaded. Train a model with V >= 50257.

Output, as llm.c's dev/data scripts write it: a header of 256 little-endian int32
(magic 20240520, version 1, the token count, then zeros), then the tokens as uint16.

The GPT-2 encoder is OpenAI's encoder.py in pure Python (stdlib only). Its pre-tokenizer
splits on \\p{L} (letters) and \\p{N} (numbers), which Python's `re` lacks: with the
`regex` module installed the pattern is GPT-2's exactly; without it, letters are
[^\\W\\d_] and numbers \\d, the same on ASCII text and close elsewhere (they differ on
combining marks, which \\w counts as letters, and on numbers that are not decimal
digits, such as "²" or "Ⅻ"). A note on stderr says which one ran.
"""
import argparse
import json
import struct
import sys
from array import array

MAGIC, VERSION, HEADER_INTS = 20240520, 1, 256

GPT2_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
APPROX_PATTERN = r"""'s|'t|'re|'ve|'m|'ll|'d| ?[^\W\d_]+| ?\d+| ?(?:[^\s\w]|_)+|\s+(?!\S)|\s+"""


def pretokenizer():
    """GPT-2's pattern with `regex`, else the approximation (see the file's comment)."""
    try:
        import regex
        return regex.compile(GPT2_PATTERN), True
    except ImportError:
        import re
        return re.compile(APPROX_PATTERN), False


def bytes_to_unicode():
    """Every byte to a printable character, so BPE works on strings with no
    whitespace or control characters in them (OpenAI's table: printable Latin-1
    stands for itself, the other bytes for 256 and up)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def get_pairs(word):
    return {(word[i], word[i + 1]) for i in range(len(word) - 1)}


class Gpt2Encoder:
    def __init__(self, encoder, merges):
        self.encoder = encoder
        self.ranks = {pair: i for i, pair in enumerate(merges)}
        self.byte_encoder = bytes_to_unicode()
        self.pat, self.exact = pretokenizer()
        self.cache = {}

    def bpe(self, token):
        """Merges the adjacent pair of lowest rank until no pair has a rank."""
        if token in self.cache:
            return self.cache[token]
        word = tuple(token)
        pairs = get_pairs(word)
        while pairs:
            bigram = min(pairs, key=lambda p: self.ranks.get(p, float("inf")))
            if bigram not in self.ranks:
                break
            first, second = bigram
            merged, i = [], 0
            while i < len(word):
                if i < len(word) - 1 and word[i] == first and word[i + 1] == second:
                    merged.append(first + second)
                    i += 2
                else:
                    merged.append(word[i])
                    i += 1
            word = tuple(merged)
            pairs = get_pairs(word) if len(word) > 1 else set()
        self.cache[token] = word
        return word

    def encode(self, text):
        ids = []
        for piece in self.pat.findall(text):
            token = "".join(self.byte_encoder[b] for b in piece.encode("utf-8"))
            for part in self.bpe(token):
                if part not in self.encoder:
                    sys.exit("tokenize.py: the token %r is not in the encoder.json given: is it the one that goes "
                             "with this vocab.bpe?" % part)
                ids.append(self.encoder[part])
        return ids


def read_merges(path):
    """vocab.bpe: a '#version' line, then one merge 'a b' per line, in rank order."""
    merges = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            line = line.rstrip("\n")
            if not line or line.startswith("#version"):
                continue
            parts = line.split(" ")
            if len(parts) != 2:
                sys.exit("tokenize.py: %s: %r is not a merge 'a b' (is it GPT-2's vocab.bpe?)" % (path, line))
            merges.append(tuple(parts))
    return merges


def write_tokens(path, ids):
    """llm.c's format: 256 int32 header, then uint16 tokens, little-endian."""
    big = max(ids, default=0)
    if big > 0xFFFF:
        sys.exit("tokenize.py: token id %d does not fit llm.c's uint16 tokens" % big)
    header = [0] * HEADER_INTS
    header[0], header[1], header[2] = MAGIC, VERSION, len(ids)
    tokens = array("H", ids)
    if sys.byteorder == "big":
        tokens.byteswap()
    with open(path, "wb") as f:
        f.write(struct.pack("<%di" % HEADER_INTS, *header))
        f.write(tokens.tobytes())


def main(argv=None):
    ap = argparse.ArgumentParser(description="a text file to an llm.c token file for fsexec --data")
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument("--vocab", choices=["bytes", "gpt2"], default="bytes")
    ap.add_argument("--encoder", help="GPT-2's encoder.json (--vocab gpt2)")
    ap.add_argument("--merges", help="GPT-2's vocab.bpe (--vocab gpt2)")
    a = ap.parse_args(argv)
    with open(a.input, "rb") as f:
        data = f.read()
    if a.vocab == "bytes":
        ids, vocab = list(data), 256
    else:
        if not a.encoder or not a.merges:
            ap.error("--vocab gpt2 needs --encoder encoder.json and --merges vocab.bpe (GPT-2's, as OpenAI and "
                     "Hugging Face ship them)")
        with open(a.encoder, encoding="utf-8") as f:
            encoder = json.load(f)
        enc = Gpt2Encoder(encoder, read_merges(a.merges))
        if not enc.exact:
            print("tokenize.py: note: the `regex` module is not installed; pre-tokenizing with an approximation of "
                  "GPT-2's pattern (exact on ASCII text; see the script's comment)", file=sys.stderr)
        ids, vocab = enc.encode(data.decode("utf-8")), max(encoder.values()) + 1
    write_tokens(a.output, ids)
    print("tokenize.py: %s: %d tokens (vocab %d) in llm.c's format" % (a.output, len(ids), vocab), file=sys.stderr)


if __name__ == "__main__":
    main()
