#!/usr/bin/env python3
"""bench/roofline.py, the table bench/gpu_check.sh prints of a GPU step (measured ms by op
kind against fsc --kernels' roofline), on a trace made on the CPU backend, so that it
cannot rot on machines without a GPU:

1. tiny GPT-2 planned (fsc -o) and reported (fsc --kernels=json) with the same settings,
   3 steps traced on the CPU (steps 2-3);
2. the table's measured ms per kind equal the trace's spans on rank 0's compute lane,
   summed here by each span's plan op (the kernel report's op ids name the same ops),
   over the 2 traced steps; its roofline ms equal the report's kinds; ratio and lost are
   measured / roofline and measured - roofline; rows run from the most lost; the step's
   row sums them;
3. the command prints that table and writes it as JSON; a missing file, or a trace
   without the rank, is an error that says so.

usage: roofline_table.py FSC FSEXEC
"""
import collections
import json
import os
import subprocess
import sys
import tempfile

ROOT = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import roofline  # noqa: E402

FSC, FSEXEC = sys.argv[1], sys.argv[2]
DIMS = ["-D", "L=2", "-D", "C=64", "-D", "NH=4", "-D", "T=32", "-D", "V=256", "-D", "B=4", "--precision", "bf16"]
SCRIPT = os.path.join(ROOT, "bench", "roofline.py")
failures = []


def check(ok, what):
    print(("ok   " if ok else "FAIL ") + what)
    if not ok:
        failures.append(what)


def run(cmd):
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode:
        sys.exit(f"FAIL: {' '.join(cmd)}: rc {out.returncode}\n{out.stdout}{out.stderr}")
    return out.stdout


def close(a, b):
    return abs(a - b) <= 1e-9 * max(1.0, abs(a), abs(b))


with tempfile.TemporaryDirectory() as tmp:
    plan, trace_path, kern_path = (os.path.join(tmp, n) for n in ("t.plan", "trace.json", "kernels.json"))
    model = os.path.join(ROOT, "samples", "gpt2.fsm")
    run([FSC, model, *DIMS, "-o", plan, "-q"])
    with open(kern_path, "w") as f:
        f.write(run([FSC, model, *DIMS, "--kernels=json", "-q"]))
    run([FSEXEC, plan, "--device", "cpu", "--steps", "3", "--trace", trace_path])
    trace, kernels = json.load(open(trace_path)), json.load(open(kern_path))

    # What the table should say, by another route: spans by plan op id, named by the op.
    spans = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["pid"] == 0 and e["tid"] == 0]
    steps = sorted({e["args"]["step"] for e in spans})
    by_op = collections.defaultdict(float)
    kind_of = {}
    for e in spans:
        by_op[e["args"]["op"]] += e["dur"] / 1e3 / len(steps)
        kind_of[e["args"]["op"]] = e["name"].split()[0]
    want = collections.defaultdict(float)
    for op, ms in by_op.items():
        want[kind_of[op]] += ms
    launch_kinds = {l["op"]: l["kind"] for l in kernels["launches"]}
    check(all(kind_of.get(op) == k for op, k in launch_kinds.items()),
          "the kernel report's op ids name the trace's ops (same plan)")
    check(steps == [2, 3], f"the trace holds steps 2 and 3 ({steps})")

    rows, total = roofline.table(trace, kernels)
    got = {r["kind"]: r for r in rows}
    roof = {k["kind"]: k["roofline_ms"] for k in kernels["kinds"]}
    check(set(got) == set(want) | set(roof), f"a row per op kind ({len(got)})")
    check(all(close(got[k]["measured_ms"], want[k]) for k in want), "measured ms per kind = the trace's spans")
    check(all(close(got[k]["roofline_ms"], roof[k]) for k in roof), "roofline ms per kind = fsc --kernels' kinds")
    check(all(got[k]["roofline_ms"] is None and got[k]["ratio"] is None for k in set(want) - set(roof)),
          "kinds without a CUDA instruction have no roofline (views: " + ", ".join(sorted(set(want) - set(roof))) + ")")
    check(all(r["ratio"] is None or close(r["ratio"], r["measured_ms"] / r["roofline_ms"]) for r in rows),
          "ratio = measured / roofline")
    check(all(close(r["lost_ms"], r["measured_ms"] - (r["roofline_ms"] or 0)) for r in rows),
          "lost = measured - roofline")
    check([r["lost_ms"] for r in rows] == sorted((r["lost_ms"] for r in rows), reverse=True), "the most lost first")
    check(close(total["measured_ms"], sum(want.values())) and close(total["roofline_ms"], kernels["roofline_ms"]),
          f"the step's row: {total['measured_ms']:.3f} ms measured, {total['roofline_ms']:.5f} ms roofline")
    check(any(r["measured_ms"] > 0 and r["roofline_ms"] for r in rows), "some kind was both measured and priced")

    out_json = os.path.join(tmp, "table.json")
    text = run(["/usr/bin/python3", SCRIPT, trace_path, kern_path, "--json", out_json])
    print(text)
    lines = text.splitlines()
    check(lines[0].startswith("time by op kind") and "H100-SXM-8" in lines[0], "the title names the GPU")
    check([l.split()[0] for l in lines[2:]] == [r["kind"] for r in rows] + ["step"],
          "a line per row, in order, then step")
    first = lines[2].split()
    check(close(float(first[1]), round(rows[0]["measured_ms"], 3)), "the first line's measured ms")
    saved = json.load(open(out_json))
    check(saved["rows"] == json.loads(json.dumps(rows)) and saved["gpu"] == "H100-SXM-8", "--json writes the rows")

    bad = subprocess.run(["/usr/bin/python3", SCRIPT, os.path.join(tmp, "none.json"), kern_path],
                         capture_output=True, text=True)
    check(bad.returncode != 0 and "roofline: " in bad.stderr and "none.json" in bad.stderr, "a missing trace: an error")
    bad = subprocess.run(["/usr/bin/python3", SCRIPT, trace_path, kern_path, "--rank", "5"],
                         capture_output=True, text=True)
    check(bad.returncode != 0 and "no compute spans of rank 5" in bad.stderr, "a rank the trace lacks: an error")

print(f"roofline_table: {len(failures)} failure(s)")
sys.exit(1 if failures else 0)
