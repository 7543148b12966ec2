#!/usr/bin/env python3
"""Where a traced step's time goes against what the plan says it should cost: a table by
op kind of the measured ms per step (a fsexec --trace file: the mean over its traced
steps of the op kind's spans on one rank's compute lane), the roofline ms of the same
plan's CUDA program (fsc --kernels=json, the same model and settings), their ratio and
the time lost (measured - roofline), the most lost first; then the whole step's.

An op kind with no CUDA instruction (views, collectives, a fused group's members but
its last, whose launch computes the group) has no roofline: its ratio shows as '-'. A
fused group's time is its last op's, as is its roofline. The trace may come from any
backend: on the CPU the numbers are the CPU's (the test suite runs it so), on a GPU
they say how far each kernel is from its roofline.

usage: bench/roofline.py TRACE.json KERNELS.json [--rank R] [--json OUT.json]
"""
import argparse
import collections
import json
import sys


def measured(trace, rank=0):
    """{op kind: ms per step} of rank's compute lane, and the number of traced steps."""
    events = trace["traceEvents"] if isinstance(trace, dict) else trace
    ev = [e for e in events if e.get("ph") == "X" and e.get("pid") == rank and e.get("tid") == 0]
    steps = {e["args"]["step"] for e in ev}
    if not ev:
        raise ValueError(f"the trace has no compute spans of rank {rank}")
    ms = collections.defaultdict(float)
    for e in ev:
        ms[e["name"].split()[0]] += e["dur"] / 1e3 / len(steps)
    return dict(ms), len(steps)


def program(kernels, stage=0):
    """The --kernels object of one program: the plan's, or its stage's."""
    if "stages" not in kernels:
        return kernels
    for s in kernels["stages"]:
        if s["stage"] == stage:
            return s
    raise ValueError(f"the kernel report has no stage {stage}")


def table(trace, kernels, rank=0, stage=0):
    """Rows {kind, measured_ms, roofline_ms, ratio, lost_ms}, the most lost first, and the
    whole step's row (kind "step")."""
    have, steps = measured(trace, rank)
    roof = {k["kind"]: k["roofline_ms"] for k in program(kernels, stage)["kinds"]}
    rows = []
    for kind in sorted(set(have) | set(roof)):
        m, r = have.get(kind, 0.0), roof.get(kind)
        rows.append({"kind": kind, "measured_ms": m, "roofline_ms": r,
                     "ratio": m / r if r else None, "lost_ms": m - (r or 0.0)})
    rows.sort(key=lambda x: (-x["lost_ms"], x["kind"]))
    m, r = sum(have.values()), sum(roof.values())
    total = {"kind": "step", "measured_ms": m, "roofline_ms": r, "ratio": m / r if r else None, "lost_ms": m - r,
             "steps": steps}
    return rows, total


def render(rows, total, gpu_name):
    out = [f"time by op kind: measured (trace) against roofline ({gpu_name}), ms per step, the most lost first",
           f"{'op kind':20} {'measured':>10} {'roofline':>10} {'ratio':>10} {'lost':>10}"]
    for x in rows + [total]:
        ratio = f"{x['ratio']:9.1f}x" if x["ratio"] is not None else f"{'-':>10}"
        roof = f"{x['roofline_ms']:10.4f}" if x["roofline_ms"] is not None else f"{'-':>10}"
        out.append(f"{x['kind']:20} {x['measured_ms']:10.3f} {roof} {ratio} {x['lost_ms']:10.3f}")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace", help="a fsexec --trace file")
    ap.add_argument("kernels", help="fsc --kernels=json of the same model and settings")
    ap.add_argument("--rank", type=int, default=0, help="the rank whose compute lane is measured (0)")
    ap.add_argument("--json", help="also write the rows as JSON here")
    a = ap.parse_args()
    try:
        with open(a.trace) as f:
            trace = json.load(f)
        with open(a.kernels) as f:
            kernels = json.load(f)
        stage = 0
        if "stages" in kernels:  # rank r runs stage r / dp_world; the trace names it
            names = [e for e in trace["traceEvents"] if e.get("ph") == "M" and e.get("name") == "process_name"
                     and e.get("pid") == a.rank]
            stage = int(names[0]["args"]["name"].split("stage ")[1].split(",")[0]) if names else 0
        rows, total = table(trace, kernels, a.rank, stage)
    except (OSError, ValueError, KeyError, IndexError) as e:
        sys.exit(f"roofline: {e}")
    print(render(rows, total, kernels["gpu"]["name"]))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"gpu": kernels["gpu"]["name"], "rows": rows, "step": total}, f, indent=1)


if __name__ == "__main__":
    main()
