#!/usr/bin/env python3
"""What --resume compares with the checkpoint before it loads (runtime/record.c), world 1.

1. The data (issue 35, item 8). A checkpoint's manifest records its run's data: the kind
   (tokens, npy, synthetic) and each file's absolute path, size and the CRC-32 of its
   first MiB (checked against zlib's). Resuming a run that read a token file without
   --data is an error naming the file and --resume-other-data, with no step run; with
   --resume-other-data it runs. Another file of the same size (its first MiB differs) is a
   warning and runs; the same file, nothing. A run on .npy files records both, and
   resuming it without --data names both.
2. The model (issue 35, item 9). The manifest records the dims ("B=12 T=16 ...", the
   batch dim) and a hash of the param set. Resuming into another head count (NH, no param
   changes shape) is an error naming the dim; fewer layers names the 12 params only in
   the checkpoint; more layers the 12 this plan has and the checkpoint has not; another C
   the dim and the reshaped params with both shapes; each says --resume-partial, and none
   runs a step. With --resume-partial the deeper model resumes, its new layer at its start
   (named). The same model with another batch dim, or in bf16, resumes with no message.

usage: resume_checks.py FSC FSEXEC
"""
import json
import os
import re
import subprocess
import sys
import tempfile
import zlib

import numpy as np

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
GPT2 = os.path.join(ROOT, "samples", "gpt2.fsm")
DIMS = {"L": 2, "C": 32, "NH": 2, "T": 16, "V": 256, "B": 12}
STEP_LINE = re.compile(r"^step +\d+/\d+ \|", re.M)
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def ok(msg):
    print("ok   " + msg)


class Runner:
    def __init__(self, fsc, fsexec, work):
        self.fsc, self.fsexec, self.work = fsc, fsexec, work

    def path(self, name):
        return os.path.join(self.work, name)

    def run(self, cmd):
        r = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=300)
        return r.returncode, r.stdout

    def plan(self, name, source=GPT2, extra=(), **dims):
        d = dict(DIMS, **dims) if source == GPT2 else dims
        out = self.path(name + ".plan")
        rc, text = self.run([self.fsc, source, *sum((["-D", "%s=%d" % kv] for kv in d.items()), []), *extra,
                             "-o", out])
        if rc:
            sys.exit("FAIL fsc %s: %s" % (name, text))
        return out

    def fsx(self, *args):
        return self.run([self.fsexec, "--threads", "1", *args])


def manifest(ck, step):
    with open(os.path.join(ck, "step-%08d" % step, "manifest.json")) as f:
        return json.load(f)


def head_crc(path):
    with open(path, "rb") as f:
        return "%08x" % (zlib.crc32(f.read(1 << 20)) & 0xffffffff)


def data_checks(r, plan, ck, tok, tok2):
    m = manifest(ck, 3)["data"]
    want = {"kind": "tokens", "files": [{"name": "data", "path": os.path.realpath(tok), "bytes": os.path.getsize(tok),
                                         "head_crc32": head_crc(tok)}]}
    if {k: m.get(k) for k in want} != want:
        fail("the manifest's data record is %s, want %s" % (m, want))
    else:
        ok("the manifest records the token file: kind, absolute path, %d bytes, first MiB's CRC-32" % want["files"][0]
           ["bytes"])
    rc, text = r.fsx(plan, "--steps", "5", "--resume", ck)
    want = "fsexec: --resume: the checkpoint's run trained on %s (%d bytes); this run has no --data" % (
        os.path.realpath(tok), os.path.getsize(tok))
    if rc != 1 or want not in text or "--resume-other-data" not in text or STEP_LINE.search(text):
        fail("resume without --data: exit %d, want 1 and %r, no step:\n%s" % (rc, want, text))
    else:
        ok("resume without --data after a run on a token file: exit 1, names the file and --resume-other-data")
    rc, text = r.fsx(plan, "--steps", "4", "--resume", ck, "--resume-other-data")
    if rc != 0 or len(STEP_LINE.findall(text)) != 1 or "--resume:" in text:
        fail("resume without --data, with --resume-other-data: exit %d, want 0 and step 4 alone:\n%s" % (rc, text))
    else:
        ok("--resume-other-data: resumes on the built-in data, no message")
    rc, text = r.fsx(plan, "--steps", "4", "--resume", ck, "--data", tok2)
    want = "fsexec: warning: --resume: the checkpoint's run trained on %s (%d bytes); %s is not that file (its first " \
           "MiB differs)" % (os.path.realpath(tok), os.path.getsize(tok), os.path.realpath(tok2))
    if rc != 0 or want not in text or len(STEP_LINE.findall(text)) != 1:
        fail("resume on another file: exit %d, want 0 and %r:\n%s" % (rc, want, text))
    else:
        ok("resume on another token file of the same size: a warning, and it runs")
    rc, text = r.fsx(plan, "--steps", "4", "--resume", ck, "--data", tok)
    if rc != 0 or "--resume:" in text or len(STEP_LINE.findall(text)) != 1:
        fail("resume on the same file: exit %d, want 0 and no message:\n%s" % (rc, text))
    else:
        ok("resume on the same file: no message")


def npy_checks(r):
    rng = np.random.default_rng(5)
    x, y = r.path("x.npy"), r.path("y.npy")
    np.save(x, rng.normal(size=(256, 16)).astype(np.float32))
    np.save(y, rng.integers(0, 4, size=256).astype(np.int32))
    plan = r.plan("mlp", os.path.join(ROOT, "samples", "mlp.fsm"))
    ck = r.path("ck-npy")
    rc, text = r.fsx(plan, "--steps", "2", "--data", "x=%s,y=%s" % (x, y), "--checkpoint-dir", ck)
    m = manifest(ck, 2)["data"] if rc == 0 else {}
    names = [(f["name"], f["path"]) for f in m.get("files", [])]
    if rc or m.get("kind") != "npy" or names != [("x", os.path.realpath(x)), ("y", os.path.realpath(y))]:
        fail("a run on .npy files: exit %d, data record %s:\n%s" % (rc, m, text))
        return
    rc, text = r.fsx(plan, "--steps", "4", "--resume", ck)
    if rc != 1 or os.path.realpath(x) not in text or os.path.realpath(y) not in text or STEP_LINE.search(text):
        fail("resume of an .npy run without --data: exit %d, want 1 naming both files:\n%s" % (rc, text))
    else:
        ok("a run on .npy files records both (kind npy); resuming it without --data names both, exit 1")
    rc, text = r.fsx(r.plan("plain"), "--steps", "2", "--checkpoint-dir", r.path("ck-syn"))
    m = manifest(r.path("ck-syn"), 2)["data"] if rc == 0 else {}
    if rc or m.get("kind") != "synthetic" or m.get("files") != []:
        fail("a run on the built-in data: exit %d, data record %s" % (rc, m))
    else:
        ok("a run on the built-in data records kind synthetic, no files")


def model_checks(r, ck, tok):
    m = manifest(ck, 3).get("model_check", {})
    if m.get("dims") != "B=12 T=16 V=256 C=32 NH=2 L=2" or m.get("batch_dim") != "B" or m.get("params") != 28 or \
            not re.fullmatch(r"[0-9a-f]{16}", m.get("param_set", "")):
        fail("the manifest's model record is %s" % m)
    else:
        ok("the manifest records the dims (%s), the batch dim and the param set's hash" % m["dims"])
    partial = "give --resume-partial to load what both have in the same shape on purpose"
    for what, plan, want in (
            ("NH=4", r.plan("nh4", NH=4), r"dims that differ \(1\): NH 2 in the checkpoint, 4 in this plan; give"),
            ("L=1", r.plan("l1", L=1), r"dims that differ \(1\): L 2 in the checkpoint, 1 in this plan; params only "
                                       r"in the checkpoint \(12\): h\.1\.attn\.b, h\.1\.attn\.w, "),
            ("L=3", r.plan("l3", L=3), r"params this plan has and the checkpoint has not \(12\): h\.2\.attn\.b, "),
            ("C=48", r.plan("c48", C=48), r"C 32 in the checkpoint, 48 in this plan; params of another shape \(28\): "
                                          r"h\.0\.attn\.b \(\[96\] in the checkpoint, \[144\] in this plan\)")):
        rc, text = r.fsx(plan, "--steps", "5", "--resume", ck, "--data", tok)
        found = re.search(r"fsexec: --resume: %s is of another model than this plan: .*%s" % (
            re.escape(os.path.join(ck, "step-00000003")), want), text)
        if rc != 1 or not found or partial not in text or STEP_LINE.search(text):
            fail("resume into %s: exit %d, want 1 and /%s/ and --resume-partial, no step:\n%s" % (what, rc, want, text))
        else:
            ok("resume into %-5s exit 1: %s" % (what, found.group(0)[found.group(0).index("model than this plan:"):]
                                               [:110]))
    rc, text = r.fsx(r.path("l3.plan"), "--steps", "4", "--resume", ck, "--data", tok, "--resume-partial")
    if rc != 0 or "fsexec: note: --resume:" not in text or len(STEP_LINE.findall(text)) != 1 or \
            not re.search(r"not in the checkpoint, at their start: h\.2\.attn\.b", text):
        fail("--resume-partial into L=3: exit %d, want 0, a note, h.2.* at their start:\n%s" % (rc, text))
    else:
        ok("--resume-partial into L=3: a note, resumes with layer h.2 at its start")
    for what, plan in (("B=24 (the batch dim)", r.plan("b24", B=24)),
                       ("bf16", r.plan("bf16", extra=("--precision", "bf16")))):
        rc, text = r.fsx(plan, "--steps", "4", "--resume", ck, "--data", tok)
        if rc != 0 or "--resume:" in text or len(STEP_LINE.findall(text)) != 1:
            fail("resume into the same model, %s: exit %d, want 0 and no message:\n%s" % (what, rc, text))
        else:
            ok("resume into the same model, %s: no message" % what)


def main():
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        r = Runner(fsc, fsexec, work)
        tok, tok2 = r.path("tok.bin"), r.path("tok2.bin")
        tokens = np.random.default_rng(1).integers(0, 256, size=20000, dtype=np.uint16)
        tokens.tofile(tok)
        tokens[::-1].copy().tofile(tok2)
        plan, ck = r.plan("base"), r.path("ck")
        rc, text = r.fsx(plan, "--steps", "3", "--data", tok, "--checkpoint-dir", ck)
        if rc:
            sys.exit("FAIL the first run: %s" % text)
        data_checks(r, plan, ck, tok, tok2)
        npy_checks(r)
        model_checks(r, ck, tok)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
