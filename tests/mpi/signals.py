#!/usr/bin/env python3
"""Ctrl-C and its kin, at world 1 and under fsexec --nproc 2, at points that do not depend
on timing: FSEXEC_TEST_SIGNAL=save:N (test-only, runtime/signals.c) sends a SIGINT at the
start of the checkpoint after step N (to the launcher under --nproc, which relays it) and
waits until the run has seen it; save:N:twice sends a second once the save's first
temporary file is open.

1. One SIGINT during a save (--save-every 2, the save after step 2): the save finishes,
   and the run stops right after it: steps 1 and 2 logged, step-00000002 the one
   checkpoint, exit 130, "stopped by SIGINT", one line saying the stop. Under --nproc
   that line is the launcher's and the "stopped by" line [rank 0]'s, each once; nothing
   says SIGTERM; mpirun says nothing of it.
2. Two SIGINTs, the second during the save after step 4: a line says that checkpoint was
   abandoned, no temporary file is left, step-00000004 has no manifest, and step
   00000002 stays complete; world 1 dies of SIGINT (what a shell shows as 130), --nproc
   exits 130.
3. A Ctrl-C as a terminal sends it (SIGINT to the launcher's process group) once --nproc 2
   trains: exit 130, the launcher's line once, "[rank 0] fsexec: stopped by SIGINT" once,
   and the checkpoint of the last logged step.

usage: signals.py FSC FSEXEC   (needs mpirun)
"""
import glob
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from mpienv import quiet_mpi_leaks  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
DIMS = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=12"]
failures = []


def fail(msg):
    failures.append(msg)
    print("FAIL " + msg)


def logged(path):
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [json.loads(line)["step"] for line in f if line.strip()]


def checkpoints(ck):
    """{step: complete} of the step directories in ck"""
    return {int(d[-8:]): os.path.exists(os.path.join(d, "manifest.json"))
            for d in glob.glob(os.path.join(ck, "step-*"))}


def say_lines(text):
    return re.findall(r"^(?:\[rank \d+\] )?fsexec: SIG\w+: stopping .*$", text, re.M)


def run(fsexec, plan, world, ck, log, hook, steps=10):
    cmd = [fsexec] + (["--nproc", str(world)] if world > 1 else []) + [
        plan, "--threads", "1", "--steps", str(steps), "--save-every", "2", "--checkpoint-dir", ck, "--log", log,
        "--log-every", "1"]
    env = dict(os.environ, FSEXEC_TEST_SIGNAL=hook)
    r = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       timeout=120)
    return r.returncode, r.stdout


def once(fsexec, plan, world, work):
    what = "world %d, one SIGINT in the save after step 2" % world
    ck, log = os.path.join(work, "once%d" % world), os.path.join(work, "once%d.jsonl" % world)
    rc, text = run(fsexec, plan, world, ck, log, "save:2")
    bad = []
    if rc != 130:
        bad.append("exit %d (want 130)" % rc)
    if logged(log) != [1, 2]:
        bad.append("logged steps %s (want [1, 2]: no step after the save)" % logged(log))
    if checkpoints(ck) != {2: True}:
        bad.append("checkpoints %s (want step 2 alone, complete)" % checkpoints(ck))
    said = say_lines(text)
    want_said = "fsexec: SIGINT: stopping every rank after this step" if world > 1 else \
        "fsexec: SIGINT: stopping after this step"
    if len(said) != 1 or not said[0].startswith(want_said):
        bad.append("lines saying the stop: %s (want one: %r)" % (said, want_said))
    stopped = re.findall(r"^.*stopped by .*$", text, re.M)
    want_stopped = ("[rank 0] " if world > 1 else "") + "fsexec: stopped by SIGINT; the checkpoint above"
    if len(stopped) != 1 or not stopped[0].startswith(want_stopped):
        bad.append("'stopped by' lines: %s (want one: %r)" % (stopped, want_stopped))
    if "SIGTERM" in text or "Forwarding signal" in text or re.search(r"^fsexec: signal:", text, re.M):
        bad.append("a SIGTERM, mpirun's forwarding or an unprefixed rank line in the output")
    if bad:
        fail("%s: %s:\n%s" % (what, "; ".join(bad), text[-2500:]))
    else:
        print("ok   %s: the save finished, then the run stopped (exit 130, steps 1-2, step-00000002 alone, one line)"
              % what)


def twice(fsexec, plan, world, work):
    what = "world %d, a second SIGINT in the save after step 4" % world
    ck, log = os.path.join(work, "twice%d" % world), os.path.join(work, "twice%d.jsonl" % world)
    rc, text = run(fsexec, plan, world, ck, log, "save:4:twice")
    bad = []
    want_rc = 130 if world > 1 else -signal.SIGINT
    if rc != want_rc:
        bad.append("exit %d (want %d)" % (rc, want_rc))
    gone = re.findall(r"^%sfsexec: the checkpoint after step 4 \(%s\) was being written: abandoned, its temporary "
                      r"file removed" % (r"\[rank 0\] " if world > 1 else "", re.escape(ck + "/step-00000004")),
                      text, re.M)
    if len(gone) != 1:
        bad.append("%d lines say step 4's checkpoint was abandoned (want 1)" % len(gone))
    left = glob.glob(os.path.join(ck, "**", "*.tmp.*"), recursive=True)
    if left:
        bad.append("temporary files left: %s" % left)
    held = checkpoints(ck)
    if held.get(2) is not True or held.get(4):
        bad.append("checkpoints %s (want step 2 complete, step 4 not)" % held)
    if "stopped by" in text:
        bad.append("a 'stopped by' line: the second signal stops at once")
    if bad:
        fail("%s: %s:\n%s" % (what, "; ".join(bad), text[-2500:]))
    else:
        print("ok   %s: exit %d, 'abandoned' once, no temporary file, step 2 complete" % (what, rc))


def ctrl_c(fsexec, plan, work):
    what = "--nproc 2, SIGINT to the launcher's process group (Ctrl-C)"
    ck, log, out = (os.path.join(work, "ctrlc" + ext) for ext in ("", ".jsonl", ".out"))
    with open(out, "w") as f:
        p = subprocess.Popen([fsexec, "--nproc", "2", plan, "--threads", "1", "--steps", "1000000",
                              "--checkpoint-dir", ck, "--log", log, "--log-every", "1"], cwd=ROOT, stdout=f,
                             stderr=subprocess.STDOUT, start_new_session=True)
    t0 = time.monotonic()
    while len(logged(log)) < 3 and p.poll() is None and time.monotonic() - t0 < 60:
        time.sleep(0.01)
    if p.poll() is not None or len(logged(log)) < 3:
        fail("%s: the run did not start training" % what)
        p.kill()
        return
    os.killpg(p.pid, signal.SIGINT)
    try:
        p.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        fail("%s: still running 60 s after the signal" % what)
        return
    with open(out) as f:
        text = f.read()
    steps = logged(log)
    bad = []
    if p.returncode != 130:
        bad.append("exit %d (want 130)" % p.returncode)
    said = say_lines(text)
    if said != ["fsexec: SIGINT: stopping every rank after this step (send it again to stop now)"]:
        bad.append("lines saying the stop: %s" % said)
    if len(re.findall(r"^\[rank 0\] fsexec: stopped by SIGINT;", text, re.M)) != 1 or "SIGTERM" in text:
        bad.append("not one '[rank 0] fsexec: stopped by SIGINT' line, or a SIGTERM")
    if not steps or checkpoints(ck) != {steps[-1]: True}:
        bad.append("checkpoints %s, last logged step %s" % (checkpoints(ck), steps[-1:]))
    if bad:
        fail("%s: %s:\n%s" % (what, "; ".join(bad), text[-2500:]))
    else:
        print("ok   %s: exit 130, one line each from the launcher and rank 0, step %d's checkpoint"
              % (what, steps[-1]))


def main():
    if not shutil.which("mpirun"):
        print("skip: no mpirun")
        sys.exit(77)
    quiet_mpi_leaks()
    os.environ.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    with tempfile.TemporaryDirectory() as work:
        plans = {}
        for world in (1, 2):
            plans[world] = os.path.join(work, "w%d.plan" % world)
            r = subprocess.run([fsc, os.path.join(ROOT, "samples", "gpt2.fsm"), *DIMS, "--world", str(world),
                                "--shard", "fsdp" if world > 1 else "none", "-o", plans[world]],
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            if r.returncode:
                sys.exit("FAIL fsc: %s" % r.stdout)
        for world in (1, 2):
            once(fsexec, plans[world], world, work)
            twice(fsexec, plans[world], world, work)
        ctrl_c(fsexec, plans[2], work)
    print("%d failure(s)" % len(failures))
    sys.exit(1 if failures else 0)


if __name__ == "__main__":
    main()
