#!/usr/bin/env python3
"""scripts/doc_numbers.py: the numbers the docs quote from fsc, made by fsc.

A number in a doc that fsc computes carries a marker right after it, invisible when the
Markdown is rendered: `7.83<!--n:g15_zero2_bf16-->`. NUMBERS below says, for each key,
the fsc command that makes it and how it is read from `fsc --mem=json`. With no flag
the script checks every marked number against fsc and fails, naming file, line, key and
both values, when one has drifted (the suite runs it: tests `doc_numbers`); with
--write it rewrites the marked numbers in place. A marker of an unknown key, and a key
no doc uses, are errors too, so the table and the docs stay one list.

usage: doc_numbers.py FSC SOURCE_DIR [--write] [DOC...]   (default DOC: README.md)
"""
import json
import os
import re
import subprocess
import sys

GIB, MIB = 2**30, 2**20
G124 = ["samples/gpt2.fsm", "-D", "B=8"]  # GPT-2 124M at B = 8, T = 1024: fp32, one rank
G15 = ["samples/gpt2.fsm", "-D", "L=48", "-D", "C=1600", "-D", "NH=25", "-D", "B=8", "--world", "8",
       "--shard", "zero2"]  # GPT-2 1.5B over 8 ranks


def category(d, key):
    return next(c for c in d["categories"] if c["key"] == key)


def gib(v):
    return "%.2f" % (v / GIB)


def mib(v):
    return "%.0f" % (v / MIB)


NUMBERS = {
    "g15_zero2_bf16": (G15 + ["--precision", "bf16"], lambda d: gib(d["arena_bytes"])),
    "g15_zero2_fp32": (G15 + ["--precision", "fp32"], lambda d: gib(d["arena_bytes"])),
    "g15_zero2_bf16_offload": (G15 + ["--precision", "bf16", "--offload", "optimizer"],
                               lambda d: gib(d["arena_bytes"])),
    "g15_zero2_bf16_offload_host": (G15 + ["--precision", "bf16", "--offload", "optimizer"],
                                    lambda d: gib(d["host"]["arena_bytes"])),
    "g124_peak": (G124, lambda d: gib(d["peak_bytes"])),
    # One micro-batch's gradient of the largest param beside the sum (accumulation).
    "g124_grad_extra_m2": (G124 + ["--microbatches", "2"],
                           lambda d: mib(category(d, "grads32")["max"] - category(d, "params")["max"])),
}
for m in (1, 2, 4):
    NUMBERS["g124_saved_m%d" % m] = (G124 + ["--microbatches", str(m)], lambda d: gib(category(d, "saved")["max"]))
    NUMBERS["g124_arena_m%d" % m] = (G124 + ["--microbatches", str(m)], lambda d: gib(d["arena_bytes"]))

MARK = re.compile(r"([0-9][0-9.,]*)<!--n:([A-Za-z0-9_]+)-->")


def main():
    args = [a for a in sys.argv[1:] if a != "--write"]
    write = len(args) < len(sys.argv) - 1
    if len(args) < 2:
        sys.exit(__doc__.split("usage: ")[1])
    fsc, src, docs = args[0], args[1], args[2:] or ["README.md"]
    reports = {}

    def value(key):
        cmd, read = NUMBERS[key]
        if tuple(cmd) not in reports:
            out = subprocess.run([fsc, *cmd, "--mem=json", "-q"], cwd=src, capture_output=True, text=True)
            if out.returncode:
                sys.exit("doc_numbers: fsc %s failed:\n%s" % (" ".join(cmd), out.stderr))
            reports[tuple(cmd)] = json.loads(out.stdout)
        return read(reports[tuple(cmd)])

    drift, used = [], set()
    for doc in docs:
        path = os.path.join(src, doc)
        text = open(path, encoding="utf-8").read()

        def fix(m):
            key = m.group(2)
            if key not in NUMBERS:
                line = text.count("\n", 0, m.start()) + 1
                sys.exit("doc_numbers: %s:%d: no number named '%s' (scripts/doc_numbers.py lists them)" % (doc, line,
                                                                                                        key))
            used.add(key)
            want = value(key)
            if m.group(1) != want:
                drift.append("%s:%d: %s says %s, fsc makes %s" % (doc, text.count("\n", 0, m.start()) + 1, key,
                                                                  m.group(1), want))
            return want + m.group(0)[len(m.group(1)):]

        new = MARK.sub(fix, text)
        if write and new != text:
            with open(path, "w", encoding="utf-8") as f:
                f.write(new)
    unused = sorted(set(NUMBERS) - used)
    if unused:
        sys.exit("doc_numbers: no doc quotes %s; drop it from NUMBERS or mark where it is quoted" % ", ".join(unused))
    if drift and not write:
        sys.exit("doc_numbers: numbers in the docs drifted from fsc (scripts/doc_numbers.py FSC . --write "
                 "rewrites them):\n  " + "\n  ".join(drift))
    print("doc_numbers: %d numbers %s" % (len(used), "rewritten" if write and drift else "agree with fsc"))


if __name__ == "__main__":
    main()
