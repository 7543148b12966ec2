#!/usr/bin/env python3
"""Checkpoints that cannot be turned against their owner (issue 36, and issue 35's full
disk), at world 1, each case on a fresh copy of a good checkpoint:

1. Links and devices: a step directory, a rank file or a manifest that is a symbolic
   link, a rank file that is a character device: a run with --checkpoint-dir exits 1
   naming the path and what it is before any step, and the file a link points to is
   untouched; --resume of a linked manifest says what it is and quotes none of its
   bytes; a rank file linked to a text file is refused without its bytes as a number.
2. An output over an input: --export into the checkpoint's own rank file, and
   --save-weights into the resumed checkpoint's manifest, exit 1 before any work, the
   checkpoint still resumes.
3. The last good checkpoint: a save of a step that exists, under a file-size limit
   (ulimit -f: writes fail with EFBIG, as on a full disk), fails; the old checkpoint of
   that step still exports, and nothing of the failed save is left; a save into a new
   step under the limit leaves no step directory. A plan whose checkpoint cannot fit
   any disk is refused at start, before any step, with what it needs and what is free.
4. State: opt_step -5 and 2^31-1, loss_scale NaN, 0 and -8 (fp16), +Inf in an exp_avg,
   -1 in an exp_avg_sq, NaN in a param: --resume exits 1 with no step, naming the tensor,
   element and value; a param stored as I32 is refused by --export; a manifest file name
   "../x" says "file 0's name leaves the checkpoint directory".

usage: checkpoint_hostile.py FSC FSEXEC
"""
import json
import os
import re
import shutil
import struct
import subprocess
import sys
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from trainrun import ROOT, TRAIN, mpi_main  # noqa: E402

SMALL = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=4"]
STEP_LINE = re.compile(r"^step +\d+/\d+ \|", re.M)
failures = []


def check(ok, what, text=""):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        print("    " + text[-1500:].replace("\n", "\n    "))
        failures.append(what)


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data
        self.plans = {}

    def path(self, *names):
        return os.path.join(self.work, *names)

    def plan(self, *extra):
        if extra not in self.plans:
            out = self.path("p%d.plan" % len(self.plans))
            r = subprocess.run([self.fsc, "samples/gpt2.fsm", *SMALL, *TRAIN, *extra, "-q", "-o", out], cwd=ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode:
                sys.exit("FAIL: fsc %s:\n%s" % (" ".join(extra), r.stdout))
            self.plans[extra] = out
        return self.plans[extra]

    def run(self, *args, limit=None):
        cmd = [self.fsexec, *args]
        if limit:  # SIGXFSZ ignored, so a write past the limit fails with EFBIG as on a full disk
            cmd = ["sh", "-c", "trap '' XFSZ; ulimit -f %d; exec \"$@\"" % limit, "sh"] + cmd
        r = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           timeout=120)
        return r.returncode, r.stdout

    def train(self, plan, *args, limit=None):
        return self.run(plan, "--threads", "1", "--data", self.data, *args, limit=limit)

    def good(self, name, plan=None, steps=3):
        """A checkpoint directory with step `steps`'s checkpoint."""
        ck = self.path(name)
        shutil.rmtree(ck, ignore_errors=True)
        rc, text = self.train(plan or self.plan(), "--steps", str(steps), "--checkpoint-dir", ck)
        if rc:
            sys.exit("FAIL: the good checkpoint: %s" % text)
        return ck


def step3(ck):
    return os.path.join(ck, "step-00000003")


def links_and_devices(r):
    victim = r.path("victim")
    os.makedirs(victim, exist_ok=True)
    secret = os.path.join(victim, "secret.txt")
    for case in ("step dir", "rank file", "device"):
        with open(secret, "w") as f:
            f.write("ZQXJ secret\n")
        ck = r.good("links")
        if case == "step dir":
            os.symlink(victim, os.path.join(ck, "step-00000004"))
            want = "step-00000004 is a symbolic link"
        elif case == "rank file":
            os.symlink(secret, os.path.join(step3(ck), "rank-00000.1.safetensors"))
            want = "rank-00000.1.safetensors is a symbolic link"
        else:
            os.mknod(os.path.join(step3(ck), "rank-00000.1.safetensors"), 0o600 | 0o020000, os.makedev(1, 3))
            want = "rank-00000.1.safetensors is a character device"
        rc, text = r.train(r.plan(), "--steps", "5", "--checkpoint-dir", ck, "--save-every", "1", "--keep", "1")
        with open(secret) as f:
            kept = f.read() == "ZQXJ secret\n"
        check(rc == 1 and want in text and not STEP_LINE.search(text) and kept and os.listdir(victim) == ["secret.txt"],
              "a %s under a checkpoint's names: refused before any step, nothing outside written" % case, text)
    # A linked manifest and a linked rank file on --resume: named, no byte of them quoted.
    ck = r.good("linked-manifest")
    m = os.path.join(step3(ck), "manifest.json")
    os.unlink(m)
    os.symlink(secret, m)
    for args in (["--resume", ck], ["--resume", step3(ck)]):
        rc, text = r.train(r.plan(), "--steps", "5", *args)
        check(rc == 1 and "manifest.json is a symbolic link" in text and "ZQXJ" not in text,
              "--resume %s with a linked manifest: named, not quoted" % os.path.basename(args[1]), text)
    ck = r.good("linked-rank")
    f0 = os.path.join(step3(ck), "rank-00000.safetensors")
    os.unlink(f0)
    os.symlink(secret, f0)
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "rank-00000.safetensors is a symbolic link" in text and "ZQXJ" not in text,
          "--export with a linked rank file: named, not read", text)
    ck = r.good("text-rank")
    shutil.copy(secret, os.path.join(step3(ck), "rank-00000.safetensors"))
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "bytes 0-7 should hold the header's length" in text and not re.search(r"\d{12,}", text),
          "a text file as a rank file: its first bytes are not quoted as a header length", text)
    ck = r.good("json-garbage")
    with open(os.path.join(step3(ck), "manifest.json"), "w") as f:
        f.write("ZQXJ not json")
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "not valid JSON at byte" in text and "ZQXJ" not in text,
          "a manifest that is not JSON: where, not its bytes", text)


def output_over_input(r):
    ck = r.good("overlap")
    own = os.path.join(step3(ck), "rank-00000.safetensors")
    before = open(own, "rb").read()
    rc, text = r.run("--export", ck, own)
    check(rc == 1 and "a file of the checkpoint being exported" in text and open(own, "rb").read() == before,
          "--export into the checkpoint's own rank file: refused, the file untouched", text)
    m = os.path.join(step3(ck), "manifest.json")
    rc, text = r.train(r.plan(), "--steps", "5", "--resume", ck, "--save-weights", m)
    check(rc == 1 and "a file of the checkpoint this run resumes" in text and not STEP_LINE.search(text),
          "--save-weights into the resumed checkpoint's manifest: refused before any step", text)
    rc, text = r.train(r.plan(), "--steps", "1", "--save-weights", r.data)
    check(rc == 1 and "which this run reads" in text, "--save-weights over --data: refused", text)
    rc, text = r.run("--export", ck, r.path("fine.safetensors"))
    check(rc == 0, "the checkpoint still exports after all that", text)


def full_disk(r):
    ck = r.good("full")
    rc, before = r.run("--export", ck, r.path("before.safetensors"))
    size = os.path.getsize(os.path.join(step3(ck), "rank-00000.safetensors"))
    # A save of step 3 again, with the disk "full" (writes past half the file fail).
    rc, text = r.train(r.plan(), "--steps", "3", "--checkpoint-dir", ck, limit=size // 2 // 512)
    left = sorted(os.listdir(step3(ck)))
    rc2, _ = r.run("--export", ck, r.path("after.safetensors"))
    read = lambda name: open(r.path(name), "rb").read()  # noqa: E731
    same = rc2 == 0 and read("before.safetensors") == read("after.safetensors")
    check(rc != 0 and left == ["manifest.json", "rank-00000.safetensors"] and same,
          "a save over step 3 on a full disk fails; step 3's checkpoint stays whole (left: %s)" % left, text)
    rc, text = r.train(r.plan(), "--steps", "4", "--resume", ck, "--checkpoint-dir", ck, limit=size // 2 // 512)
    check(rc != 0 and sorted(os.listdir(ck)) == ["step-00000003"],
          "a failed save of a new step leaves no step directory (%s)" % sorted(os.listdir(ck)), text)
    huge = r.path("huge.plan")
    subprocess.run([r.fsc, "samples/mlp.fsm", "-D", "H=2097152", "-D", "L=1", "-D", "B=2", "-q", "-o", huge], cwd=ROOT,
                   check=True)
    rc, text = r.run(huge, "--steps", "1", "--checkpoint-dir", r.path("huge-ck"))
    check(rc == 1 and "a checkpoint of this plan takes" in text and "free" in text and not STEP_LINE.search(text),
          "a checkpoint larger than the disk's free space: refused at start", text)


def rewrite(path, name, fn):
    """Applies fn to the numpy array of tensor `name` in the rank file, fixing the CRCs
    (the piece's in the metadata, the header's in the manifest) so only the values differ."""
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    (n,) = struct.unpack("<Q", raw[:8])
    head = json.loads(raw[8:8 + n])
    meta = json.loads(head["__metadata__"]["fsexec"])
    t = head[name]
    dt = {"F32": np.float32, "I32": np.int32}[t["dtype"]]
    a, b = t["data_offsets"]
    arr = np.frombuffer(bytes(raw[8 + n + a:8 + n + b]), dtype=dt).copy()
    arr = fn(arr)
    raw[8 + n + a:8 + n + b] = arr.tobytes()
    old = meta["pieces"][name]["crc32"]
    new = "%08x" % zlib.crc32(arr.tobytes())
    text = raw[8:8 + n].decode().replace('\\"crc32\\":\\"%s\\"' % old, '\\"crc32\\":\\"%s\\"' % new, 1)
    raw[8:8 + n] = text.encode()
    with open(path, "wb") as f:
        f.write(raw)
    mpath = os.path.join(os.path.dirname(path), "manifest.json")
    with open(mpath) as f:
        m = json.load(f)
    m["files"][0]["header_crc32"] = "%08x" % zlib.crc32(bytes(raw[:8 + n]))
    with open(mpath, "w") as f:
        json.dump(m, f)


def set_at(i, v):
    def fn(a):
        a[i] = v
        return a
    return fn


def state(r):
    fp16 = r.plan("--precision", "fp16")
    cases = [
        (None, "opt_step", set_at(0, -5), "tensor 'opt_step' element 0 is -5"),
        (None, "opt_step", set_at(0, 2**31 - 1), "tensor 'opt_step' element 0 is 2147483647"),
        (fp16, "loss_scale", set_at(0, np.nan), "tensor 'loss_scale' element 0 is nan"),
        (fp16, "loss_scale", set_at(0, 0.0), "tensor 'loss_scale' element 0 is 0"),
        (fp16, "loss_scale", set_at(0, -8.0), "tensor 'loss_scale' element 0 is -8"),
        (None, "h.0.attn.w.exp_avg", set_at(7, np.inf), "tensor 'h.0.attn.w.exp_avg' element 7 is inf"),
        (None, "h.0.attn.w.exp_avg_sq", set_at(3, -1.0), "tensor 'h.0.attn.w.exp_avg_sq' element 3 is -1"),
        (None, "lnf.w", set_at(5, np.nan), "tensor 'lnf.w' element 5 is nan"),
    ]
    for plan, name, fn, want in cases:
        ck = r.good("state", plan)
        try:
            rewrite(os.path.join(step3(ck), "rank-00000.safetensors"), name, fn)
        except KeyError:
            check(False, "%s: not in the checkpoint" % name)
            continue
        rc, text = r.train(plan or r.plan(), "--steps", "5", "--resume", ck)
        check(rc == 1 and want in text and not STEP_LINE.search(text), "--resume refuses %s" % want, text)
    ck = r.good("state")
    rewrite(os.path.join(step3(ck), "rank-00000.safetensors"), "lnf.w", set_at(1, np.nan))
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "tensor 'lnf.w' element 1 is nan" in text, "--export applies the same checks", text)
    ck = r.good("i32")
    path = os.path.join(step3(ck), "rank-00000.safetensors")
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    (n,) = struct.unpack("<Q", raw[:8])
    text = raw[8:8 + n].decode()
    i = text.index('"lnf.w":{"dtype":"F32"')
    raw[8 + i:8 + i + len('"lnf.w":{"dtype":"F32"')] = b'"lnf.w":{"dtype":"I32"'
    with open(path, "wb") as f:
        f.write(raw)
    m = json.load(open(os.path.join(step3(ck), "manifest.json")))
    m["files"][0]["header_crc32"] = "%08x" % zlib.crc32(bytes(raw[:8 + n]))
    json.dump(m, open(os.path.join(step3(ck), "manifest.json"), "w"))
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "tensor 'lnf.w' is i32; a param is a float dtype" in text, "--export refuses an I32 param", text)
    ck = r.good("escape")
    m = json.load(open(os.path.join(step3(ck), "manifest.json")))
    m["files"][0]["name"] = "../x"
    json.dump(m, open(os.path.join(step3(ck), "manifest.json"), "w"))
    rc, text = r.run("--export", ck, r.path("x.safetensors"))
    check(rc == 1 and "file 0's name leaves the checkpoint directory" in text, "a manifest name '../x': said so", text)


def verdict(r):
    if failures:
        print("%d failure(s):" % len(failures))
        for f in failures:
            print("  - " + f)
        sys.exit(1)


def main():
    mpi_main(Runner, [links_and_devices, output_over_input, full_disk, state, verdict],
             "checkpoints follow no link, write no output over an input, keep the last good one, check the state")


if __name__ == "__main__":
    main()
