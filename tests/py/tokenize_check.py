#!/usr/bin/env python3
"""scripts/tokenize.py: the token files it writes are what fsexec --data reads.

1. Bytes (vocab 256): a small text becomes llm.c's format (magic 20240520, version 1,
   the count; uint16 tokens that are the text's bytes), and fsexec trains a tiny GPT-2
   (V = 256) on it for 2 steps, naming the file as llm.c's format.
2. GPT-2's byte-level BPE with a hand-made encoder.json and vocab.bpe of a few merges:
   the ids against ones worked out by hand from the merge ranks (the lowest-ranked pair
   merges first; a space joins the word after it as 'Ġ'), with GPT-2's pre-tokenizer
   splitting words, the space before each, and punctuation.
3. --vocab gpt2 without the two files says what to give; a token the encoder lacks is
   named.

Stdlib only. usage: tokenize_check.py FSC FSEXEC
"""
import json
import os
import struct
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
SCRIPT = os.path.join(ROOT, "scripts", "tokenize.py")
DIMS = ["-D", "L=1", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=2"]


def run(cmd, expect_rc=0):
    r = subprocess.run(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300)
    if r.returncode != expect_rc:
        sys.exit("FAIL (exit %d, expected %d): %s\n%s" % (r.returncode, expect_rc, " ".join(cmd), r.stdout[-3000:]))
    return r.stdout


def read_llmc(path):
    with open(path, "rb") as f:
        data = f.read()
    header = struct.unpack("<256i", data[:1024])
    n = header[2]
    if header[0] != 20240520 or header[1] != 1 or len(data) != 1024 + 2 * n:
        sys.exit("FAIL: %s: header %s, %d bytes" % (path, header[:3], len(data)))
    return list(struct.unpack("<%dH" % n, data[1024:]))


def check_bytes(fsc, fsexec, tmp):
    text = "".join("line %d: the quick brown fox jumps over the lazy dog. é\n" % i for i in range(60))
    src, out = os.path.join(tmp, "in.txt"), os.path.join(tmp, "bytes.bin")
    with open(src, "w", encoding="utf-8") as f:
        f.write(text)
    run([sys.executable, SCRIPT, src, out])
    ids = read_llmc(out)
    if ids != list(text.encode("utf-8")):
        sys.exit("FAIL: bytes mode: the tokens are not the file's bytes")
    plan = os.path.join(tmp, "gpt2.plan")
    run([fsc, "samples/gpt2.fsm", *DIMS, "-q", "-o", plan])
    said = run([fsexec, plan, "--steps", "2", "--data", out])
    if "bytes.bin (%d tokens, llm.c format)" % len(ids) not in said or "step 2/2" not in said:
        sys.exit("FAIL: fsexec --data %s:\n%s" % (out, said))
    print("ok   bytes: %d tokens, trained 2 steps on them" % len(ids))


# A vocabulary of the few characters the text uses and the tokens seven merges make.
ENCODER = {"h": 0, "e": 1, "l": 2, "o": 3, "Ġ": 4, "w": 5, "r": 6, "d": 7, "he": 8, "ll": 9, "hell": 10,
           "hello": 11, "Ġw": 12, "or": 13, "Ġwor": 14, "!": 15}
MERGES = ["h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or"]
# "hello world! hello" pre-tokenizes to "hello", " world", "!", " hello":
#   hello:  (h e)1 -> he l l o; (l l)2 -> he ll o; (he ll)3 -> hell o; (hell o)4 -> hello   = 11
#   Ġworld: (Ġ w)5 -> Ġw o r l d; (o r)6 -> Ġw or l d; (Ġw or)7 -> Ġwor l d; no more    = 14 2 7
#   !                                                                                   = 15
#   Ġhello: as hello after the Ġ; (Ġ hello) has no rank                                  = 4 11
GPT2_TEXT, GPT2_IDS = "hello world! hello", [11, 14, 2, 7, 15, 4, 11]


def check_gpt2(tmp):
    enc, bpe = os.path.join(tmp, "encoder.json"), os.path.join(tmp, "vocab.bpe")
    with open(enc, "w", encoding="utf-8") as f:
        json.dump(ENCODER, f, ensure_ascii=False)
    with open(bpe, "w", encoding="utf-8") as f:
        f.write("#version: 0.2\n" + "\n".join(MERGES) + "\n")
    src, out = os.path.join(tmp, "hello.txt"), os.path.join(tmp, "gpt2.bin")
    with open(src, "w", encoding="utf-8") as f:
        f.write(GPT2_TEXT)
    run([sys.executable, SCRIPT, src, out, "--vocab", "gpt2", "--encoder", enc, "--merges", bpe])
    ids = read_llmc(out)
    if ids != GPT2_IDS:
        sys.exit("FAIL: gpt2 mode: %r encodes to %s, expected %s" % (GPT2_TEXT, ids, GPT2_IDS))
    print("ok   gpt2: %r -> %s" % (GPT2_TEXT, ids))

    said = run([sys.executable, SCRIPT, src, out, "--vocab", "gpt2"], expect_rc=2)
    if "--vocab gpt2 needs --encoder encoder.json and --merges vocab.bpe" not in said:
        sys.exit("FAIL: --vocab gpt2 without its files says:\n" + said)
    with open(src, "w", encoding="utf-8") as f:
        f.write("hello xyz")
    said = run([sys.executable, SCRIPT, src, out, "--vocab", "gpt2", "--encoder", enc, "--merges", bpe], expect_rc=1)
    if "is not in the encoder.json given" not in said:
        sys.exit("FAIL: a token the encoder lacks says:\n" + said)
    print("ok   gpt2: errors name what is missing")


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: tokenize_check.py FSC FSEXEC")
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:])
    with tempfile.TemporaryDirectory() as tmp:
        check_bytes(fsc, fsexec, tmp)
        check_gpt2(tmp)


if __name__ == "__main__":
    main()
