#!/usr/bin/env python3
"""Checkpoints under faults: a run killed at any moment, a save included, leaves its newest
complete checkpoint whole; a damaged checkpoint is refused, with a message that says
which file and what is wrong, before training starts; a signal stops a run at a step
boundary with a checkpoint of exactly that step; --keep removes only what it should.

1. Kills, 20 of them (seeded): GPT-2 with 4.2M params (a checkpoint of 48 MiB, a few
   tenths of a second to save, as long as a step) at world 2 (fsdp), --save-every 1
   --keep 3 (so a kill can land in the removal of an old checkpoint too), killed with
   SIGKILL at a random moment after its first save: rank 0, rank 1 (mpirun must then end
   the job by itself within 10 s) or every process at once. After each kill `--export`
   of the directory succeeds and exports the newest complete checkpoint, and the next
   run resumes it (`--resume DIR`), starts at the step after it and saves again before
   it is killed in turn. A step run again after a kill logs the loss and gradient norm
   it logged the first time (the checkpoint is the whole state, and the data and random
   numbers follow from the seed and the step). The kills that landed inside a save (the
   newest step directory had no manifest, or temporary files were left) are counted:
   at least 3 must. At the end a run that completes leaves no temporary file and no
   incomplete step directory behind.
2. Damage, each on a copy of a good world-2 checkpoint: a flipped byte in a param and in
   an optimizer-state piece of rank-00001's data (the message names the file, the piece's
   key and "damaged", with a byte range that is the piece's and holds the flipped byte,
   and the CRCs that differ); a truncated file (its size and the manifest's); a missing
   file; a flipped byte in the header that keeps it valid JSON (the header CRC, as
   zlib computes it, against the manifest's) and one that does not; rank-00000 replaced
   by rank-00000 of another step of the same run ("a file of another checkpoint"). Each:
   `--resume` exits 1 and prints no step line and writes no log; `--export` exits 1 too,
   but for the optimizer-state byte, which a params export never reads: it succeeds.
3. Signals, to a run with --checkpoint-dir, --log and --save-weights: SIGINT to fsexec at
   world 1 (exit 130); at world 2 SIGTERM to both ranks, SIGINT to fsexec --nproc's
   launcher (a Ctrl-C: it relays it to the ranks and exits 130, with one line saying so),
   and SIGINT to rank 1 alone (the ranks agree at each step's end, so rank 0 stops after
   the same step, and names the signal). Each: a non-zero exit within
   8 s, "stopped by SIGINT" or "stopped by SIGTERM", one checkpoint, of exactly the last
   step in --log, and the --save-weights file holds the params of that checkpoint (as
   --export writes them, bit for bit); then `--resume` with --steps last+2 runs exactly
   steps last+1 and last+2, appended to the log. Without --checkpoint-dir: "nothing
   saved". A second SIGINT, sent while the save the first one asked for writes (once a
   temporary file shows), kills the process at once (Python's returncode -2, within
   2 s), and the newest complete checkpoint left exports.
4. --keep 2 --save-every 1 over 5 steps leaves exactly step-00000004 and step-00000005,
   a rank file put by hand into step-00000001 beforehand gone with it. A resumed run's
   save removes an incomplete step directory older than it (made by hand), keeps the one
   newer than it; `--resume` of a directory with no checkpoint says "no checkpoint".
5. Usage: --save-every and --keep without --checkpoint-dir, and --resume with
   --load-weights, exit 2; resuming a checkpoint at step 6 with --steps 6 (or fewer) says
   "nothing to run", exits 0 and runs nothing.

Failures are collected (each part runs to its end); the script exits 1 if any.

usage: checkpoint_faults.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy and torch)
"""
import ctypes
import glob
import json
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time
import zlib

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from models import load_safetensors  # noqa: E402
from trainrun import ROOT, TRAIN, mpi_main  # noqa: E402

SMALL = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=12"]
# 4.2M params: params and AdamW's two moments make 48 MiB a checkpoint, a few tenths of a
# second to write here, about as long as a step.
BIG = ["-D", "L=4", "-D", "C=256", "-D", "NH=4", "-D", "T=16", "-D", "V=4096", "-D", "B=4"]
KILLS = 20
STEP_LINE = re.compile(r"^(\[rank \d+\] )?step +\d+/\d+ \|", re.M)
SAVED = re.compile(r"^step (\d+): checkpoint (\S+) \((\d+) files?, ([\d.]+) MiB, ([\d.]+) s\)", re.M)
failures = []
T0 = time.monotonic()


def fail(msg):
    print("FAIL " + msg)
    failures.append(msg)


def ok(msg):
    print("ok   " + msg)


def step_dir(ck, step):
    return os.path.join(ck, "step-%08d" % step)


def steps_in(ck):
    """{step: complete} of the step directories in ck."""
    out = {}
    for d in glob.glob(os.path.join(ck, "step-" + "[0-9]" * 8)):
        out[int(os.path.basename(d)[5:])] = os.path.isfile(os.path.join(d, "manifest.json"))
    return out


def logged(path):
    """The JSON lines of a --log file (a last line cut by a kill left out)."""
    out = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
    return out


def children(pid):
    out = []
    for stat in glob.glob("/proc/[0-9]*/stat"):
        try:
            with open(stat) as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.split("/")[2]))
    return out


def descendants(pid):
    out, pending = [], [pid]
    while pending:
        kids = children(pending.pop())
        out += kids
        pending += kids
    return out


def alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def mpi_rank(pid):
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            env = dict(v.split(b"=", 1) for v in f.read().split(b"\0") if b"=" in v)
        return int(env.get(b"OMPI_COMM_WORLD_RANK", b"-1"))
    except (OSError, ValueError):
        return -1


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data
        self.plans = {}

    def path(self, *names):
        return os.path.join(self.work, *names)

    def plan(self, dims, world):
        key = (tuple(dims), world)
        if key not in self.plans:
            out = self.path("p%d.plan" % len(self.plans))
            shard = ["--shard", "fsdp"] if world > 1 else ["--shard", "none"]
            r = subprocess.run([self.fsc, "samples/gpt2.fsm", *dims, *TRAIN, "--world", str(world), *shard, "-q",
                                "-o", out], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode:
                sys.exit("FAIL: fsc %s --world %d:\n%s" % (" ".join(dims), world, r.stdout))
            self.plans[key] = out
        return self.plans[key]

    def cmd(self, world, plan, *args):
        """fsexec PLAN ARGS at world (--nproc when > 1), one thread a rank, on the test's tokens."""
        return [self.fsexec] + (["--nproc", str(world)] if world > 1 else []) + [plan, "--threads", "1", "--data",
                                                                                 self.data, *args]

    def run(self, cmd, timeout=120):
        """(exit status, stdout and stderr together)"""
        try:
            r = subprocess.run(cmd, cwd=self.work, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               timeout=timeout)
        except subprocess.TimeoutExpired:
            fail("%s: still running after %d s" % (" ".join(cmd), timeout))
            return -1, ""
        return r.returncode, r.stdout

    def export(self, ck, name="export.safetensors"):
        out = self.path(name)
        if os.path.exists(out):
            os.unlink(out)
        rc, text = self.run([self.fsexec, "--export", ck, out])
        return rc, text, out

    def start(self, cmd, out):
        """cmd in the background (its own session), stdout and stderr into the file out;
        killed if this script dies first (a test runner's timeout), so that no long run
        outlives it (its ranks end when mpirun does)."""
        f = open(out, "w")
        p = subprocess.Popen(cmd, cwd=self.work, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                             preexec_fn=die_with_parent)
        f.close()
        return p


def die_with_parent():
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, kept across exec


def read(path):
    with open(path, errors="replace") as f:
        return f.read()


def wait_for(p, out, pattern, timeout, what):
    """The first match of pattern in the file out, polled while p runs; None (after a
    failure) if p ends first or timeout passes."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        m = re.search(pattern, read(out), re.M)
        if m:
            return m
        if p.poll() is not None:
            m = re.search(pattern, read(out), re.M)
            if m:
                return m
            fail("%s: the run ended (status %s) before %r:\n%s" % (what, p.returncode, pattern, read(out)[-2000:]))
            return None
        time.sleep(0.01)
    fail("%s: no %r within %d s:\n%s" % (what, pattern, timeout, read(out)[-2000:]))
    return None


def kill_tree(p, also=()):
    """SIGKILL to p, every process under it (mpirun puts each rank in a process group of
    its own) and the pids in also (ranks seen under it before); waits for all of them."""
    pids = descendants(p.pid) + [pid for pid in also if pid != p.pid]
    for pid in [p.pid] + pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass
    p.wait()
    t0 = time.monotonic()
    while any(alive(pid) for pid in pids) and time.monotonic() - t0 < 10:
        time.sleep(0.01)
    left = [pid for pid in pids if alive(pid)]
    if left:
        fail("processes %s still alive 10 s after SIGKILL" % left)


def ranks_of(p, world, timeout=20):
    """{rank: pid} of the rank processes under p (fsexec --nproc execs mpirun)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        found = {mpi_rank(pid): pid for pid in descendants(p.pid)}
        found.pop(-1, None)
        if len(found) == world:
            return found
        time.sleep(0.01)
    return {}


def header(path):
    """(header length n, the header as JSON, the fsexec metadata as JSON) of a rank file."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        h = json.loads(f.read(n))
    return n, h, json.loads(h["__metadata__"]["fsexec"])


def flip(path, at, mask=0x01):
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)[0]
        f.seek(at)
        f.write(bytes([b ^ mask]))


# ---------------------------------------------------------------- 1. kills

def newest_complete(ck):
    done = [s for s, c in steps_in(ck).items() if c]
    return max(done) if done else None


def exported_ok(r, ck, want_step, names, what):
    """--export of ck succeeds, names the checkpoint of want_step, and writes finite params
    (with names and shapes as names says, when given). The params, or None."""
    rc, text, out = r.export(ck)
    want = "exported the params of %s (step %d)" % (step_dir(ck, want_step), want_step)
    if rc != 0 or want not in text:
        fail("%s: --export %s exits %d, says (want %r):\n%s" % (what, ck, rc, want, text))
        return None
    params = load_safetensors(out)
    bad = [k for k, v in params.items() if not np.isfinite(v.numpy()).all()]
    shapes = {k: tuple(v.shape) for k, v in params.items()}
    if bad or (names is not None and shapes != names):
        fail("%s: the export of step %d holds %s (not finite: %s)" % (what, want_step, sorted(shapes), bad))
        return None
    return shapes


def kills(r):
    plan = r.plan(BIG, 2)
    ck = r.path("kills")
    log = r.path("kills.jsonl")
    rng = random.Random(1234)
    start, names, landed, tmp_left, no_manifest, save_s, took, ready = 0, None, 0, 0, 0, [], [], []
    by = {"rank 0": 0, "rank 1": 0, "all": 0}
    t_part = time.monotonic()
    for i in range(KILLS + 1):
        last = i == KILLS  # the last run completes: one step more
        what = "kill %d" % (i + 1) if not last else "the run after the last kill"
        out = r.path("kill-%02d.out" % i)
        steps = start + 1 if last else 100000
        args = ["--steps", str(steps), "--checkpoint-dir", ck, "--save-every", "1", "--keep", "3", "--log", log,
                "--log-every", "1"] + (["--resume", ck] if start else [])
        t_run = time.monotonic()
        p = r.start(r.cmd(2, plan, *args), out)
        if last:
            try:
                p.wait(timeout=60)
            except subprocess.TimeoutExpired:
                kill_tree(p)
            text = read(out)
            if p.returncode != 0 or not re.search(r"^step +%d/%d \|" % (start + 1, steps), text, re.M):
                fail("%s: --resume %s --steps %d exits %s:\n%s" % (what, ck, steps, p.returncode, text[-3000:]))
            break
        m = wait_for(p, out, SAVED.pattern, 60, what)
        if not m:
            kill_tree(p)
            return
        text = read(out)
        first = re.search(r"^step +(\d+)/", text, re.M)
        if start and (not first or int(first.group(1)) != start + 1 or
                      "resumed %s at step %d" % (step_dir(ck, start), start) not in text):
            fail("%s: the run resumed from %s does not start at step %d:\n%s" % (what, step_dir(ck, start), start + 1,
                                                                               text[-2000:]))
        save_s.append(float(m.group(5)))
        ready.append(time.monotonic() - t_run)
        time.sleep(rng.uniform(0.0, 0.5))
        victim = rng.choice(sorted(by))
        ranks = ranks_of(p, 2)
        if len(ranks) != 2:
            fail("%s: the ranks under mpirun are not found" % what)
            kill_tree(p)
            return
        by[victim] += 1
        t0 = time.monotonic()
        if victim == "all":
            kill_tree(p, ranks.values())
        else:
            os.kill(ranks[int(victim[-1])], signal.SIGKILL)
            try:  # mpirun ends the job
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                fail("%s: mpirun still runs 10 s after %s was killed" % (what, victim))
            kill_tree(p, ranks.values())
        took.append(time.monotonic() - t0)
        if p.returncode == 0:
            fail("%s: exit status 0 after SIGKILL of %s" % (what, victim))
        # Where the kill landed: a save was cut off if its step directory has no manifest
        # yet, or a temporary file of a rank file or of the manifest is left.
        found = steps_in(ck)
        tmps = glob.glob(os.path.join(ck, "step-*", "*.tmp.*"))
        cut = max(found) if found and not found[max(found)] else None
        landed += bool(tmps or cut)
        tmp_left += bool(tmps)
        no_manifest += bool(cut) and not tmps
        now = newest_complete(ck)
        if now is None or now <= start:
            fail("%s: the newest complete checkpoint is %s; the run resumed at %d and saved at least once" %
                 (what, now, start))
            return
        shapes = exported_ok(r, ck, now, names, what)
        if shapes is None:
            return
        names = names or shapes
        start = now
    # Each step run again after a kill: the same loss and gradient norm as the first time.
    seen, again, differ = {}, 0, []
    for rec in logged(log):
        key = (rec["loss"], rec["grad_norm"])
        if rec["step"] in seen:
            again += 1
            if seen[rec["step"]] != key:
                differ.append((rec["step"], seen[rec["step"]], key))
        seen.setdefault(rec["step"], key)
    if differ:
        fail("steps run again after a kill differ from their first run (step, (loss, norm) first, again): %s" % differ)
    if sorted(seen) != list(range(1, start + 2)):
        fail("the log of the killed runs has steps %s, not 1 to %d" % (sorted(seen), start + 1))
    left = glob.glob(os.path.join(ck, "step-*", "*.tmp.*"))
    found = steps_in(ck)
    if left or not all(found.values()) or sorted(found) != list(range(max(1, start - 1), start + 2)):
        fail("after a run that completed, %s holds %s (complete or not) and temporary files %s; want steps %d to %d, "
             "complete, and no temporary file" % (ck, found, left, start - 1, start + 1))
    ok("%d kills (rank 0 %d, rank 1 %d, all at once %d) at world 2, 48 MiB checkpoints (saves %.2f-%.2f s): after "
       "each the newest complete checkpoint exports and resumes; %d steps run again logged what they logged the "
       "first time; %.0f s" % (KILLS, by["rank 0"], by["rank 1"], by["all"], min(save_s), max(save_s), again,
                               time.monotonic() - t_part))
    print("     kills inside a save: %d of %d (%d left temporary files, %d left rank files without a manifest); a run "
          "made its first save %.1f-%.1f s after its start; the job ended %.2f-%.2f s after a kill"
          % (landed, KILLS, tmp_left, no_manifest, min(ready), max(ready), min(took), max(took)))
    if landed < 3:
        fail("only %d of %d kills landed inside a save (want at least 3)" % (landed, KILLS))


# ---------------------------------------------------------------- 2. damage

def damage(r):
    plan = r.plan(SMALL, 2)
    good = r.path("good")
    rc, text = r.run(r.cmd(2, plan, "--steps", "3", "--save-every", "1", "--checkpoint-dir", good))
    if rc != 0 or sorted(steps_in(good).items()) != [(1, True), (2, True), (3, True)]:
        fail("damage: the world-2 run that saves steps 1 to 3 exits %d with %s:\n%s" % (rc, steps_in(good), text))
        return
    with open(os.path.join(step_dir(good, 3), "manifest.json")) as f:
        manifest = {e["name"]: e for e in json.load(f)["files"]}

    def case(name, change, want, export_fails=True):
        """A copy of step 3 of good, changed by change(step_dir) (which returns anything it
        wants checked: a function of the output, or None); resume and export of it."""
        ck = r.path("damage-" + name)
        sdir = step_dir(ck, 3)
        shutil.copytree(step_dir(good, 3), sdir)
        check = change(sdir)
        log = r.path("damage-%s.jsonl" % name)
        # the step directory itself for some, the checkpoint directory for the others
        path = sdir if len(name) % 2 else ck
        rc, text = r.run(r.cmd(2, plan, "--resume", path, "--steps", "5", "--log", log))
        bad = []
        if rc != 1:
            bad.append("exits %d" % rc)
        if not re.search(want, text):
            bad.append("no %r" % want)
        if STEP_LINE.search(text) or os.path.exists(log):
            bad.append("training started")
        if check:
            bad += check(text)
        if bad:
            fail("damage %s: --resume %s: %s:\n%s" % (name, path, "; ".join(bad), text[-2500:]))
            return
        line = next(x for x in text.splitlines() if re.search(want, x))
        erc, etext, out = r.export(path, "damage.safetensors")
        if export_fails and (erc != 1 or not re.search(want, etext) or os.path.exists(out)):
            fail("damage %s: --export exits %d (want 1 with %r):\n%s" % (name, erc, want, etext))
        elif not export_fails and (erc != 0 or not os.path.exists(out)):
            fail("damage %s: --export of the params exits %d (want 0: it reads no optimizer state):\n%s"
                 % (name, erc, etext))
        else:
            ok("damage %-16s resume exits 1 before any step, export %s: %s" %
               (name, "exits 1 too" if export_fails else "of the params succeeds", line.strip()[:150]))

    def data_byte(kind):
        def change(sdir):
            f = os.path.join(sdir, "rank-00001.safetensors")
            n, h, meta = header(f)
            keys = sorted(k for k, v in meta["pieces"].items() if v["kind"] == kind)
            key = keys[len(keys) // 2]
            a, b = (8 + n + x for x in h[key]["data_offsets"])
            at = a + (b - a) // 2 + 1
            with open(f, "rb") as fh:
                fh.seek(a)
                crc = zlib.crc32(bytes(x ^ (i == at - a) for i, x in enumerate(fh.read(b - a))))
            flip(f, at)

            def check(text):
                m = re.search(r"%s: tensor '([^']+)' \(bytes (\d+) to (\d+) of the file\) has CRC-32 ([0-9a-f]{8}), "
                              r"saved as ([0-9a-f]{8}): the file is damaged" % re.escape(f), text)
                if not m:
                    return ["no message naming %s, a tensor and its bytes" % f]
                got = (m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4), 16), m.group(5))
                want = (key, a, b, crc, meta["pieces"][key]["crc32"])
                if got != want or not got[1] <= at < got[2]:
                    return ["says (key, from, to, CRC, saved CRC) %s for a flipped byte at %d: want %s" %
                            (got, at, want)]
                return []
            return check
        return change

    def truncate(sdir):
        f = os.path.join(sdir, "rank-00000.safetensors")
        size = os.path.getsize(f)
        with open(f, "r+b") as fh:
            fh.truncate(size - 1000)
        return lambda text: [] if re.search(r"%s: %d bytes where the manifest says %d \(truncated or replaced\)" % (
            re.escape(f), size - 1000, manifest["rank-00000.safetensors"]["bytes"]), text) else ["sizes not said"]

    def delete(sdir):
        os.unlink(os.path.join(sdir, "rank-00001.safetensors"))

    def header_crc(sdir):
        """One hex digit of a piece's CRC in the metadata, another: valid JSON still."""
        f = os.path.join(sdir, "rank-00000.safetensors")
        with open(f, "rb") as fh:
            blob = bytearray(fh.read())
        (n,) = struct.unpack("<Q", blob[:8])
        if "%08x" % zlib.crc32(bytes(blob[:8 + n])) != manifest["rank-00000.safetensors"]["header_crc32"]:
            fail("damage header: the manifest's header CRC-32 of rank-00000 is not zlib's CRC-32 of its first %d "
                 "bytes" % (8 + n))
        at = blob.index(b'crc32\\":\\"', 8) + len(b'crc32\\":\\"')
        blob[at] = ord("0") if blob[at] != ord("0") else ord("1")
        with open(f, "wb") as fh:
            fh.write(blob)
        want = "its header's CRC-32 is %08x, the manifest says %s (the header is damaged)" % (
            zlib.crc32(bytes(blob[:8 + n])), manifest["rank-00000.safetensors"]["header_crc32"])
        return lambda text: [] if want in text else ["no %r" % want]

    def header_json(sdir):
        flip(os.path.join(sdir, "rank-00000.safetensors"), 8, ord("{") ^ ord("X"))  # its opening brace

    def other_step(sdir):
        """A whole file of step 2, of the size the manifest says (so no size check can tell)."""
        f = os.path.join(sdir, "rank-00000.safetensors")
        shutil.copy(os.path.join(step_dir(good, 2), "rank-00000.safetensors"), f)
        size = os.path.getsize(f)
        return lambda text: [] if size == manifest["rank-00000.safetensors"]["bytes"] else [
            "step 2's rank-00000 has %d bytes, step 3's %d" % (size, manifest["rank-00000.safetensors"]["bytes"])]

    f0, f1 = (re.escape(os.path.join("step-00000003", "rank-%05d.safetensors" % k)) for k in (0, 1))
    case("param-byte", data_byte("param"), f1 + ": tensor '[^']+' .* the file is damaged")
    case("optimizer-byte", data_byte("optimizer"), f1 + ": tensor '[^']+' .* the file is damaged", export_fails=False)
    case("truncated", truncate, f0 + r": \d+ bytes where the manifest says \d+ \(truncated or replaced\)")
    case("deleted", delete, f1 + ": cannot open: No such file or directory")
    case("header-crc", header_crc, f0 + ": its header's CRC-32 is [0-9a-f]{8}, the manifest says [0-9a-f]{8}")
    case("header-json", header_json, f0 + ": header is not valid JSON")
    case("other-step", other_step, f0 + ": saved at step 2 by plan [0-9a-f]+, but the manifest is of step 3 .*a file "
         "of another checkpoint")


# ---------------------------------------------------------------- 3. signals

def same_params(a, b):
    """Two safetensors files of params: the same names, shapes and values, bit for bit."""
    x, y = load_safetensors(a), load_safetensors(b)
    return set(x) == set(y) and all(x[k].shape == y[k].shape and bool((x[k] == y[k]).all()) for k in x)


def stop_and_resume(r, world, how):
    """A long run (with --save-weights) stopped by a signal, how: 'SIGINT to fsexec',
    'SIGTERM to both ranks', 'SIGINT to the launcher' or 'SIGINT to rank 1 alone' (which rank 0
    learns of when the ranks agree at the step's end); then resumed for 2 more steps."""
    what = "world %d, %s" % (world, how)
    plan = r.plan(SMALL, world)
    tag = re.sub(r"\W+", "-", what)
    ck, log, out, weights = (r.path("sig-%s%s" % (tag, ext)) for ext in ("", ".jsonl", ".out", ".safetensors"))
    # --timeout: a rank left waiting after the stop ends the job in 10 s, not 600
    p = r.start(r.cmd(world, plan, "--steps", "100000", "--checkpoint-dir", ck, "--log", log, "--save-weights",
                      weights, *(["--timeout", "10"] if world > 1 else [])), out)
    t0 = time.monotonic()
    while len(logged(log)) < 5 and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    ranks = ranks_of(p, world) if world > 1 else {}
    if len(logged(log)) < 5 or (world > 1 and len(ranks) != world):
        fail("%s: the run did not start training (ranks %s):\n%s" % (what, ranks, read(out)[-2000:]))
        kill_tree(p)
        return
    name = "SIGTERM" if "SIGTERM" in how else "SIGINT"
    for pid in (ranks.values() if "both ranks" in how else [ranks[1]] if "rank 1" in how else [p.pid]):
        os.kill(pid, getattr(signal, how.split()[0]))
    t0 = time.monotonic()
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        fail("%s: still running 30 s after the signal" % what)
        kill_tree(p)
        return
    took = time.monotonic() - t0
    text, steps = read(out), [rec["step"] for rec in logged(log)]
    want_rc = 130 if world == 1 or "launcher" in how else None
    bad = []
    if (want_rc and p.returncode != want_rc) or p.returncode == 0:
        bad.append("exit status %d (want %s)" % (p.returncode, want_rc or "non-zero"))
    if took > 8:
        bad.append("the job took %.1f s to end after the signal" % took)
    for want in ("stopped by " + name, "the checkpoint above has every step so far: continue with --resume"):
        if want not in text:
            bad.append("no %r" % want)
    said = re.findall(r"^(?:\[rank \d\] )?fsexec: %s: stopping (?:every rank )?after this step \(send it again to "
                      r"stop now\)$" % name, text, re.M)
    if len(said) != (2 if "both ranks" in how else 1):  # one line a rank signalled, or the launcher's
        bad.append("%d lines say the stop, want %d" % (len(said), 2 if "both ranks" in how else 1))
    L = steps[-1] if steps else -1
    if steps != list(range(1, L + 1)):
        bad.append("logged steps %s..." % steps[:10])
    if steps_in(ck) != {L: True} or not re.search(r"^step %d: checkpoint %s " % (L, re.escape(step_dir(ck, L))), text,
                                                  re.M):
        bad.append("checkpoints %s; the last logged step is %d" % (steps_in(ck), L))
    elif not os.path.exists(weights):
        bad.append("no --save-weights file")
    else:
        rc, etext, exported = r.export(ck)
        if rc != 0 or not same_params(weights, exported):
            bad.append("the --save-weights file is not the params of step %d's checkpoint (export: %s)" % (L, etext))
    if bad:
        fail("%s: %s:\n%s" % (what, "; ".join(bad), text[-2500:]))
        return
    rc, rtext = r.run(r.cmd(world, plan, "--resume", ck, "--steps", str(L + 2), "--checkpoint-dir", ck, "--log", log,
                            "--log-every", "1"))
    after = [rec["step"] for rec in logged(log)]
    if rc != 0 or after != list(range(1, L + 3)) or len(STEP_LINE.findall(rtext)) != 2 or \
            "resumed %s at step %d" % (step_dir(ck, L), L) not in rtext or steps_in(ck) != {L: True, L + 2: True}:
        fail("%s: --resume %s --steps %d exits %d, logs steps %s after %d, checkpoints %s:\n%s"
             % (what, ck, L + 2, rc, after[len(steps):], L, steps_in(ck), rtext[-2500:]))
        return
    ok("%-30s exit %3d in %.1f s, stopped after step %d with its checkpoint and weights; resumed: steps %d and %d" %
       (what, p.returncode, took, L, L + 1, L + 2))


def nothing_saved(r):
    plan = r.plan(SMALL, 1)
    log, out = r.path("sig-nothing.jsonl"), r.path("sig-nothing.out")
    p = r.start(r.cmd(1, plan, "--steps", "100000", "--log", log), out)
    t0 = time.monotonic()
    while len(logged(log)) < 5 and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    os.kill(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=30)
    except subprocess.TimeoutExpired:
        kill_tree(p)
    text = read(out)
    if p.returncode != 143 or "stopped by SIGTERM; nothing saved (no --checkpoint-dir)" not in text:
        fail("world 1, SIGTERM without --checkpoint-dir: exit %d:\n%s" % (p.returncode, text[-2000:]))
    else:
        ok("world 1, SIGTERM without --checkpoint-dir: exit 143, 'nothing saved'")


def second_signal(r):
    """Two SIGINTs: the second, sent while the save the first asked for writes (once its
    temporary file shows), ends the process at once."""
    plan = r.plan(BIG, 1)
    ck, out = r.path("sig-twice"), r.path("sig-twice.out")
    p = r.start(r.cmd(1, plan, "--steps", "100000", "--checkpoint-dir", ck, "--save-every", "2", "--log-every", "1"),
                out)
    if not wait_for(p, out, SAVED.pattern, 60, "second signal"):
        kill_tree(p)
        return
    os.kill(p.pid, signal.SIGINT)
    t0 = time.monotonic()
    while not glob.glob(os.path.join(ck, "*", "*.tmp.*")) and p.poll() is None and time.monotonic() - t0 < 10:
        time.sleep(0.002)
    if p.poll() is not None:
        fail("second signal: fsexec ended (status %d) before its save after the first SIGINT was seen writing:\n%s"
             % (p.returncode, read(out)[-2000:]))
        return
    t0 = time.monotonic()
    os.kill(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=10)
    except subprocess.TimeoutExpired:
        fail("second signal: fsexec still runs 10 s after the second SIGINT")
        kill_tree(p)
        return
    took = time.monotonic() - t0
    text = read(out)
    if p.returncode != -signal.SIGINT or took > 2 or "stopping after this step" not in text or "stopped by" in text:
        fail("second signal: returncode %d after %.2f s (want -2, killed by SIGINT, within 2 s):\n%s" %
             (p.returncode, took, text[-2000:]))
        return
    now = newest_complete(ck)
    if now is None or exported_ok(r, ck, now, None, "second signal") is None:
        fail("second signal: no loadable checkpoint left in %s: %s" % (ck, steps_in(ck)))
        return
    cut = glob.glob(os.path.join(ck, "*", "*.tmp.*")) or not all(steps_in(ck).values())
    ok("two SIGINTs: killed by the second in %.2f s (returncode -2), %s; step %d's checkpoint exports"
       % (took, "a save cut off" if cut else "no save in progress", now))


def signals(r):
    stop_and_resume(r, 1, "SIGINT to fsexec")
    stop_and_resume(r, 2, "SIGTERM to both ranks")
    stop_and_resume(r, 2, "SIGINT to the launcher")
    nothing_saved(r)
    second_signal(r)
    stop_and_resume(r, 2, "SIGINT to rank 1 alone")


# ---------------------------------------------------------------- 4. --keep

def keep(r):
    plan = r.plan(SMALL, 1)
    ck = r.path("keep")
    os.makedirs(step_dir(ck, 1))
    with open(os.path.join(step_dir(ck, 1), "rank-00001.safetensors"), "wb") as f:
        f.write(b"\0" * 64)
    rc, text = r.run(r.cmd(1, plan, "--steps", "5", "--save-every", "1", "--keep", "2", "--checkpoint-dir", ck))
    want = ["manifest.json", "rank-00000.safetensors"]
    held = {os.path.basename(d): sorted(os.listdir(d)) for d in glob.glob(os.path.join(ck, "*"))}
    if rc != 0 or [int(m.group(1)) for m in SAVED.finditer(text)] != [1, 2, 3, 4, 5] or \
            held != {"step-00000004": want, "step-00000005": want}:
        fail("--keep 2 --save-every 1 over 5 steps: exit %d, %s holds %s:\n%s" % (rc, ck, held, text))
    else:
        ok("--keep 2 --save-every 1 over 5 steps: 5 saves, step-00000004 and step-00000005 left (and nothing of "
           "step-00000001, a stray rank file included)")
    # An incomplete step directory older than the next save goes; a newer one stays.
    for s in (3, 9):
        os.makedirs(step_dir(ck, s))
        shutil.copy(os.path.join(step_dir(ck, 4), "rank-00000.safetensors"), step_dir(ck, s))
    rc, text = r.run(r.cmd(1, plan, "--resume", ck, "--steps", "6", "--keep", "2", "--checkpoint-dir", ck))
    if rc != 0 or steps_in(ck) != {5: True, 6: True, 9: False} or "resumed %s at step 5" % step_dir(ck, 5) not in text:
        fail("--resume with incomplete step-00000003 and step-00000009 (--keep 2, --steps 6): exit %d, %s holds %s "
             "(want 5, 6 complete and 9 incomplete):\n%s" % (rc, ck, steps_in(ck), text))
    else:
        ok("resumed at 5 past an incomplete step-00000009: step 6's save removed incomplete step-00000003 and "
           "step-00000004 (--keep 2), kept step-00000009")
    empty, cut = r.path("keep-empty"), r.path("keep-cut")
    os.makedirs(empty)
    os.makedirs(step_dir(cut, 2))
    shutil.copy(os.path.join(step_dir(ck, 6), "rank-00000.safetensors"), step_dir(cut, 2))
    for path, want in ((empty, r"no checkpoint in it \(a step-NNNNNNNN directory with a manifest.json\)$"),
                       (cut, r"no checkpoint in it .*; the incomplete ones were cut off while being saved"),
                       (r.path("keep-none"), r"keep-none: No such file or directory")):
        rc, text = r.run(r.cmd(1, plan, "--resume", path, "--steps", "6"))
        erc, etext, _ = r.export(path)
        if rc != 1 or erc != 1 or not re.search(want, text, re.M) or not re.search(want, etext, re.M) or \
                STEP_LINE.search(text):
            fail("--resume/--export %s: exit %d/%d (want 1 and %r):\n%s%s" % (path, rc, erc, want, text, etext))
        else:
            ok("--resume and --export of %-10s exit 1: %s" % (os.path.basename(path), text.strip().splitlines()[-1]))


# ---------------------------------------------------------------- 5. usage

def usage(r):
    plan = r.plan(SMALL, 1)
    ck = r.path("usage")
    rc, text = r.run(r.cmd(1, plan, "--steps", "6", "--checkpoint-dir", ck, "--save-weights", r.path("w.safetensors")))
    if rc != 0 or steps_in(ck) != {6: True}:
        fail("usage: the 6-step run exits %d with %s:\n%s" % (rc, steps_in(ck), text))
        return
    for args, want in ((["--save-every", "2"], "--save-every needs --checkpoint-dir"),
                       (["--keep", "2"], "--keep needs --checkpoint-dir"),
                       (["--resume", ck, "--load-weights", r.path("w.safetensors")], "drop --load-weights")):
        rc, text = r.run(r.cmd(1, plan, "--steps", "8", *args))
        if rc != 2 or want not in text or STEP_LINE.search(text):
            fail("usage: %s exits %d (want 2 and %r):\n%s" % (" ".join(args), rc, want, text))
        else:
            ok("usage: %-40s exit 2: %s" % (" ".join(a.replace(r.work + "/", "") for a in args),
                                            text.strip().splitlines()[0][:90]))
    for path, steps in ((ck, 6), (step_dir(ck, 6), 4)):
        log = r.path("usage.jsonl")
        rc, text = r.run(r.cmd(1, plan, "--resume", path, "--steps", str(steps), "--log", log))
        want = "%s is at step 6 and --steps %d is the run's total: nothing to run" % (step_dir(ck, 6), steps)
        if rc != 0 or want not in text or STEP_LINE.search(text) or os.path.exists(log):
            fail("usage: --resume %s --steps %d exits %d (want 0 and %r, no step):\n%s" % (path, steps, rc, want, text))
        else:
            ok("--resume of step 6 with --steps %d: exit 0, nothing to run" % steps)


def verdict(r):
    print("     %.0f s in all" % (time.monotonic() - T0))
    if failures:
        print("%d failure(s):" % len(failures))
        for f in failures:
            print("  - " + f.splitlines()[0][:200])
        sys.exit(1)


def main():
    mpi_main(Runner, [usage, keep, damage, signals, kills, verdict],
             "checkpoints survive kills, refuse damage by name, and stop on a signal at a step")


if __name__ == "__main__":
    main()
