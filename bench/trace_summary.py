#!/usr/bin/env python3
"""The time of a fsexec --trace file by op kind: per traced step (the mean over its
steps), each op kind's total span time on rank 0's compute lane, its share of the step
and its op count; then the collectives' lane. The step is the span from the first op's
start to the last op's end.

usage: bench/trace_summary.py TRACE.json [--rank R] [--top N]
"""
import argparse
import collections
import json


def summary(path, rank=0, top=30):
    ev = [e for e in json.load(open(path))["traceEvents"] if e["ph"] == "X" and e["pid"] == rank]
    steps = sorted({e["args"]["step"] for e in ev})
    lines = []
    for lane, title in ((0, "compute"), (1, "collectives"), (2, "copies")):
        es = [e for e in ev if e["tid"] == lane]
        if not es:
            continue
        by = collections.defaultdict(lambda: [0.0, 0])
        for e in es:
            by[e["name"].split()[0]][0] += e["dur"] / len(steps)
            by[e["name"].split()[0]][1] += 1
        total = sum(v[0] for v in by.values())
        lines.append(f"{title}: {total / 1e3:.2f} ms of spans per step, over steps {steps[0]}-{steps[-1]}")
        for k, (us, n) in sorted(by.items(), key=lambda kv: -kv[1][0])[:top]:
            lines.append(f"  {k:20} {us / 1e3:9.3f} ms {us / total:6.1%} {n // len(steps):5d} ops")
    walls = []
    for s in steps:
        es = [e for e in ev if e["args"]["step"] == s]
        walls.append(max(e["ts"] + e["dur"] for e in es) - min(e["ts"] for e in es))
    lines.append("step (first op's start to last op's end): " + ", ".join(f"{w / 1e3:.2f} ms" for w in walls))
    return "\n".join(lines)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("trace")
    ap.add_argument("--rank", type=int, default=0)
    ap.add_argument("--top", type=int, default=30)
    a = ap.parse_args()
    print(summary(a.trace, a.rank, a.top))
