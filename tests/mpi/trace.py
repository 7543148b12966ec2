#!/usr/bin/env python3
"""fsexec --trace FILE: a Chrome / Perfetto trace of some steps, every rank's in one file.

For each run below the file is JSON (Python's json parses it), and:
1. Every op of each rank's program is one "X" span per traced step, no more, no fewer:
   per step and rank, the spans' plan op ids are exactly that stage's range of op ids
   (its op count from `fsexec --inspect`), and their names, by op kind, are the plan's
   op histogram (`fsexec --inspect`'s "ops" list, summed over the stages); a span is
   named `op` or `op block` ("matmul h.1"), its args carry the step, the phase and, for
   ops the .fsm made, `gpt2.fsm:LINE:COL` of a line that exists in samples/gpt2.fsm.
2. Spans on one lane (a pid and tid) never overlap, and none has a negative length.
3. Collectives and point-to-point ops are on the collectives lane (tid 1), every other
   op on compute (tid 0); metadata names every process "rank R (stage S, dp D)" and its
   lanes compute, collectives, copies.
4. The steps traced: the default is the run's second to fourth; --trace-steps A:B
   chooses; a range outside the run, --trace-steps without --trace, and a directory for
   the file are errors that say so (exit 2, or 1 for the path).
Runs: world 1 on the CPU; world 1 through cuda-emu (--device cuda, the CUDA backend's
table, when FS_CUDAEMU is given); ddp at world 2 under mpirun (two processes in one
file, all_reduce on the collectives lane); two pipeline stages (rank 1 is stage 1); both
started by fsexec --nproc 2 (mpirun).

usage: trace.py FSC FSEXEC [CUDAEMU_LIB]   (needs mpirun for the world-2 runs)
"""
import collections
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "tests", "py"))
from mpienv import quiet_mpi_leaks  # noqa: E402

TINY = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=4"]
P2P = {"all_reduce", "reduce_scatter", "all_gather", "send", "recv"}
SOURCE_LINES = open(os.path.join(ROOT, "samples", "gpt2.fsm")).read().count("\n") + 1


def run(cmd, ok=True, env=None):
    r = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=300,
                       env=dict(os.environ, **(env or {})))
    if ok and r.returncode != 0:
        sys.exit("FAIL: %s\n%s" % (" ".join(cmd), r.stdout[-3000:]))
    return r


def inspect(fsexec, plan):
    """(op count per stage, {op kind: count over the stages}) from fsexec --inspect."""
    out = run([fsexec, "--inspect", plan]).stdout
    stages = [int(n) for n in re.findall(r"\d+/\d+/(\d+)", re.search(r"^programs .*$", out, re.M).group(0))]
    block = out.split("\nops (", 1)[1].split("\n\n", 1)[0].splitlines()[1:]
    kinds = {line.split()[0]: int(line.split()[1]) for line in block if line.strip()}
    if sum(kinds.values()) != sum(stages):
        sys.exit("FAIL: inspect's op kinds (%d) and stages (%s) disagree" % (sum(kinds.values()), stages))
    return stages, kinds


def check(path, stages, kinds, steps, world):
    with open(path) as f:
        doc = json.load(f)
    ev = doc["traceEvents"]
    dp = world // len(stages)
    names = {(e["pid"], e.get("tid")): e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"].endswith("_name")}
    for r in range(world):
        want = "rank %d (stage %d, dp %d)" % (r, r // dp, r % dp)
        if names.get((r, None)) != want:
            sys.exit("FAIL %s: process %d is named %r, not %r" % (path, r, names.get((r, None)), want))
        for tid, lane in enumerate(("compute", "collectives", "copies")):
            if names.get((r, tid)) != lane:
                sys.exit("FAIL %s: rank %d lane %d is named %r" % (path, r, tid, names.get((r, tid))))
    spans = [e for e in ev if e["ph"] == "X"]
    if {e["pid"] for e in spans} != set(range(world)):
        sys.exit("FAIL %s: spans of pids %s, world %d" % (path, sorted({e["pid"] for e in spans}), world))
    for step in steps:
        hist = collections.Counter()
        for r in range(world):
            s = r // dp
            first = sum(stages[:s])
            ids = sorted(e["args"]["op"] for e in spans if e["pid"] == r and e["args"]["step"] == step)
            if ids != list(range(first, first + stages[s])):
                sys.exit("FAIL %s: step %d rank %d: %d spans, not one per op %d..%d" %
                         (path, step, r, len(ids), first, first + stages[s] - 1))
            if r % dp == 0:
                hist.update(e["name"].split()[0] for e in spans if e["pid"] == r and e["args"]["step"] == step)
        if hist != kinds:
            sys.exit("FAIL %s: step %d: spans by op kind %s, the plan's %s" % (path, step, dict(hist), kinds))
    if {e["args"]["step"] for e in spans} != set(steps):
        sys.exit("FAIL %s: traced steps %s, expected %s" % (path, sorted({e["args"]["step"] for e in spans}), steps))
    lanes = collections.defaultdict(list)
    for e in spans:
        kind = e["name"].split()[0]
        if e["tid"] != (1 if kind in P2P else 0):
            sys.exit("FAIL %s: %s on lane %d" % (path, e["name"], e["tid"]))
        if e["dur"] < 0:
            sys.exit("FAIL %s: %s has a negative length" % (path, e["name"]))
        m = re.fullmatch(r"gpt2\.fsm:(\d+):(\d+)", e["args"].get("source", "gpt2.fsm:1:1"))
        if not m or not 1 <= int(m.group(1)) <= SOURCE_LINES or e["args"]["phase"] not in (
                "forward", "backward", "recompute", "optimizer", "comm", "wgrad"):
            sys.exit("FAIL %s: %s: args %s" % (path, e["name"], e["args"]))
        if len(e["name"].split()) == 2 and not re.fullmatch(r"h\.\d+", e["name"].split()[1]):
            sys.exit("FAIL %s: span name %r" % (path, e["name"]))
        lanes[(e["pid"], e["tid"])].append((e["ts"], e["ts"] + e["dur"], e["name"]))
    for lane, ss in lanes.items():
        ss.sort()
        for a, b in zip(ss, ss[1:]):
            if b[0] < a[1] - 1e-6:
                sys.exit("FAIL %s: lane %s: %s [%.3f, %.3f] overlaps %s at %.3f" % (path, lane, a[2], a[0], a[1],
                                                                                b[2], b[0]))
    if not any(e["args"].get("source") for e in spans):
        sys.exit("FAIL %s: no span carries a .fsm line" % path)
    return spans


def main():
    fsc, fsexec = (os.path.abspath(p) for p in sys.argv[1:3])
    emu = os.path.abspath(sys.argv[3]) if len(sys.argv) > 3 else None
    quiet_mpi_leaks()
    with tempfile.TemporaryDirectory() as work:
        def path(name):
            return os.path.join(work, name)
        gpt2 = os.path.join(ROOT, "samples", "gpt2.fsm")
        run([fsc, gpt2] + TINY + ["-o", path("w1.plan")])
        stages, kinds = inspect(fsexec, path("w1.plan"))
        run([fsexec, path("w1.plan"), "--steps", "6", "--threads", "1", "--trace", path("w1.json")])
        check(path("w1.json"), stages, kinds, [2, 3, 4], 1)
        run([fsexec, path("w1.plan"), "--steps", "3", "--threads", "1", "--trace", path("s.json"),
             "--trace-steps", "1:3"])
        check(path("s.json"), stages, kinds, [1, 2, 3], 1)
        run([fsexec, path("w1.plan"), "--steps", "1", "--threads", "1", "--trace", path("one.json")])
        check(path("one.json"), stages, kinds, [1], 1)
        for args, status, says in (
                (["--trace", path("x.json"), "--trace-steps", "5:7"], 2, "outside the run's steps"),
                (["--trace-steps", "2:3"], 2, "give --trace"),
                (["--trace", path("x.json"), "--trace-steps", "3:2"], 2, "A <= B"),
                (["--trace", work], 1, "is a directory")):
            r = run([fsexec, path("w1.plan"), "--steps", "4"] + args, ok=False)
            if r.returncode != status or says not in r.stdout:
                sys.exit("FAIL: %s: exit %d, %r" % (" ".join(args), r.returncode, r.stdout[-500:]))
        if emu:
            run([fsexec, path("w1.plan"), "--steps", "3", "--device", "cuda", "--trace", path("emu.json")],
                env={"FS_CUDA_BACKEND": emu, "FS_CUDA_EMU_ORDER": "forward", "FS_CUDA_EMU_MEASURE": "0",
                     "FS_CUDA_EMU_CACHE": os.path.join(os.path.dirname(emu), "cuda_emu", "cache")})
            check(path("emu.json"), stages, kinds, [2, 3], 1)
        if not shutil.which("mpirun"):
            print("skip: no mpirun for the world-2 runs")
            sys.exit(77)
        for name, opts in (("ddp", ["--world", "2", "--shard", "ddp"]),
                           ("pp", ["--world", "2", "--stages", "2", "--microbatches", "2"])):
            run([fsc, gpt2] + TINY + opts + ["-o", path(name + ".plan")])
            stages, kinds = inspect(fsexec, path(name + ".plan"))
            run([fsexec, "--nproc", "2", path(name + ".plan"), "--steps", "4", "--threads", "1", "--trace",
                 path(name + ".json")])
            spans = check(path(name + ".json"), stages, kinds, [2, 3, 4], 2)
            if not any(e["tid"] == 1 for e in spans):
                sys.exit("FAIL %s: nothing on the collectives lane" % name)
    print("trace: every op once per traced step and rank, lanes apart and never overlapping, one file for the world")


if __name__ == "__main__":
    main()
