#!/usr/bin/env python3
"""A checkpoint (`fsexec --checkpoint-dir`) holds the whole training state, each element
once, and resuming it (`--resume`) continues the run it came from; any plan of the same
model resumes it, resharded.

1. Exact resume: for a tiny GPT-2 (AdamW, clipping on) in fp32 at world 1 (shard none)
   and world 3 (fsdp), and in fp16 with loss scaling at world 1 (none; an overflow at
   step 2, so the checkpoint carries a halved scale) and world 3 (zero2; an overflow at
   step 5, after the resume), 3 steps, a checkpoint, then a new run resumed from it to
   step 6 equals the run of 6 steps straight bit for bit: every saved param byte for
   byte, and steps 4-6 of the log in step, loss, lr, grad_norm, loss_scale and skipped
   (the resumed log counts 4, 5, 6; its start says "the plan that saved it"). Every
   step's data and random numbers follow from the step and the seed, so nothing else
   may differ. In the checkpoints after steps 3 and 6: the manifest lists world rank
   files; their pieces (read as safetensors) cover each logical tensor exactly once, no
   gap and no overlap, each piece's CRC-32 as recorded; the manifest's element counts
   are the pieces' and the model's: params = the saved params' elements, optimizer
   state twice that (AdamW's exp_avg and exp_avg_sq); and the params the step-6 pieces
   reassemble are --save-weights' of that run, bit for bit.
2. Reshard: a checkpoint after 3 steps of fsdp at world 4, with dims (C = 34, T = 15)
   whose flat units (9282 and 14314 elements) do not split evenly over 4 ranks nor
   the blocks' over 3 (padded shards), resumed to step 6 by zero1 at world 3, none at
   world 1, ddp at world 2, zero2 at world 2 with --offload optimizer, two pipeline
   stages (world 2, 2 micro-batches) and fsdp at world 3 with 2 micro-batches: each
   equals the 6 steps of the fsdp plan straight to rel 1e-5 per param tensor
   (||a - b|| / ||b||) and in every logged loss and gradient norm, and its start says
   "resharded to". Not bitwise: another world sums the batch's gradients in another
   order (and a pipeline splits the batch into micro-batches), so the values differ by
   rounding; fp32, so that no loss scale differs. What we measure is printed (about
   1e-7 to 1e-6). Where the world stays and the order with it, the reshard is exact: an
   fsdp checkpoint at world 1 resumed by shard none at world 1 equals the none run of
   6 steps straight bit for bit.
3. Another model is an error: a plan with C = 48 names a tensor and both shapes ("is
   f32 [96] in the checkpoint but f32 [144] in this plan"); SGD with momentum names
   the momentum_buffer it lacks. Both exit non-zero. Another precision is not: an
   fp32 checkpoint resumes into fp16, whose loss scale is "not in the checkpoint, at
   their start" and starts at 65536.
4. `fsexec --export` of each step-6 checkpoint of 1. is --save-weights of that run:
   the same names, f32, shapes and bytes. It streams: exporting the initial state of a
   GPT-2 with one large tensor (wte, V = 50257 x C = 256, 51 MB; 55 MB of params) peaks
   below the params' size and below its 16 MiB buffer + 40 MiB (the peak RSS of that
   one process, measured by a small forking helper, is printed).

usage: checkpoint.py FSC FSEXEC   (needs mpirun; uses /usr/bin/python3's numpy and torch)
"""
import glob
import json
import os
import re
import struct
import sys
import zlib

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "py"))
from models import load_safetensors  # noqa: E402
from trainrun import TRAIN, mpi_main, rel, run  # noqa: E402

GPT2 = ["-D", "L=2", "-D", "C=32", "-D", "NH=2", "-D", "T=16", "-D", "V=256", "-D", "B=12"]
# flat units: the embeddings' 256 x 34 + 15 x 34 + 2 x 34 = 9282 elements, a block's
# 12 x 34^2 + 13 x 34 = 14314; padded at world 4, the blocks at world 3 too
UNEVEN = ["-D", "L=2", "-D", "C=34", "-D", "NH=2", "-D", "T=15", "-D", "V=256", "-D", "B=12"]
BIG = ["-D", "L=1", "-D", "C=256", "-D", "NH=4", "-D", "T=16", "-D", "V=50257", "-D", "B=2"]
SGD = ["--optimizer", "sgd", "--momentum", "0.9", "--lr", "1e-2", "--clip", "1.0", "--warmup", "2"]
LOGGED = ("step", "loss", "lr", "grad_norm", "loss_scale", "skipped")
TOL = 1e-5
MIB = 1 << 20
# Runs argv in a child forked from this small interpreter (not the test's, which holds
# numpy and torch), and prints the child's peak RSS in KiB.
PEAK_RSS = ("import os, resource, sys\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    os.execv(sys.argv[1], sys.argv[1:])\n"
            "_, status, _ = os.wait4(pid, 0)\n"
            "print('maxrss', resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
            "sys.exit(os.waitstatus_to_exitcode(status))\n")


def header(path):
    """A safetensors file's header: {name: {dtype, shape, data_offsets}, __metadata__}."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        return json.loads(f.read(n)), 8 + n


def weights(path):
    """--save-weights' params as {name: tensor}; a pipeline's from its stages' files (a
    param two stages hold, the tied embedding, is the same in both)."""
    if os.path.exists(path):
        return load_safetensors(path)
    out = {}
    for shard in sorted(glob.glob(path.replace(".safetensors", "-*-of-*.safetensors"))):
        out.update(load_safetensors(shard))
    if not out:
        sys.exit("FAIL: no saved params at %s" % path)
    return out


class Runner:
    def __init__(self, fsc, fsexec, work, data):
        self.fsc, self.fsexec, self.work, self.data = fsc, fsexec, work, data
        self.exports = []  # (what, step-6 checkpoint, --save-weights of that run) from part 1

    def path(self, tag, ext=""):
        return os.path.join(self.work, re.sub(r"[^A-Za-z0-9.]+", "-", tag) + ext)

    def compile(self, dims, world, extra, optim=TRAIN):
        plan = self.path("%s-%d-%s-%s" % ("-".join(dims[1::2]), world, "-".join(extra), optim[1]), ".plan")
        if not os.path.exists(plan):
            run([self.fsc, "samples/gpt2.fsm", *dims, *optim, "--world", str(world), *extra, "-o", plan, "-q"])
        return plan

    def train(self, tag, plan, world, steps, *flags, ok=True):
        """(saved params, logged steps, what fsexec printed); with ok=False, the run's
        exit status and output"""
        out, log = self.path(tag, ".safetensors"), self.path(tag, ".jsonl")
        if os.path.exists(log):
            sys.exit("FAIL: %s was run before (its log would be appended to)" % tag)
        cmd = [self.fsexec] + (["--nproc", str(world)] if world > 1 else [])
        res = run(cmd + [plan, "--steps", str(steps), "--save-weights", out, "--log", log, "--data-order", "sequential",
                         "--threads", "1", "--data", self.data, *flags], ok=ok)
        if not ok:
            return res.returncode, res.stdout
        with open(log) as f:
            logged = [json.loads(line) for line in f]
        if [rec["step"] for rec in logged] != list(range(steps - len(logged) + 1, steps + 1)) or not logged:
            sys.exit("FAIL %s: logged steps %s, want the last ones up to %d" % (tag, [rec["step"] for rec in logged],
                                                                              steps))
        return weights(out), logged, res.stdout


def resumed_line(what, text, want):
    line = next((ln for ln in text.splitlines() if ln.startswith("fsexec: resumed ")), None)
    if line is None or want not in line or "each element once; " not in line:
        sys.exit("FAIL %s: the resume says %r; want %r in it:\n%s" % (what, line, want, text[-2000:]))
    return line


def bitwise(what, got, ref, ref_name):
    """Two {name: tensor}: the same names and shapes, every element's bits."""
    if set(got) != set(ref):
        sys.exit("FAIL %s: params %s, %s's %s" % (what, sorted(got), ref_name, sorted(ref)))
    for name, b in ref.items():
        a = got[name]
        if tuple(a.shape) != tuple(b.shape):
            sys.exit("FAIL %s: %s is %s, %s's %s" % (what, name, list(a.shape), ref_name, list(b.shape)))
        a, b = a.numpy(), b.numpy()
        if a.tobytes() != b.tobytes():
            bad = np.flatnonzero(a.view(np.uint32) != b.view(np.uint32))
            i = bad[0]
            sys.exit("FAIL %s: %s differs from %s's in %d of %d elements; first at [%d]: %r, %r (rel %.2e)"
                     % (what, name, ref_name, len(bad), a.size, i, a.flat[i], b.flat[i],
                        rel(a.astype(np.float64), b.astype(np.float64))))


def same_log(what, got, ref):
    """got's steps are ref's of the same number, in every logged key."""
    by_step = {rec["step"]: rec for rec in ref}
    for g in got:
        r = by_step[g["step"]]
        for key in LOGGED:
            if g.get(key) != r.get(key):
                sys.exit("FAIL %s: step %d's %s is %r, straight %r" % (what, g["step"], key, g.get(key), r.get(key)))


def close(what, got, ref):
    """(params, log) of got against ref's: each param to rel TOL, each of got's steps'
    loss and gradient norm too; the worst of each."""
    (gp, gl), (rp, rl) = got, ref
    if set(gp) != set(rp):
        sys.exit("FAIL %s: params %s, straight %s" % (what, sorted(gp), sorted(rp)))
    worst, worst_name = 0.0, ""
    for name, b in rp.items():
        e = rel(gp[name].numpy().astype(np.float64), b.numpy().astype(np.float64))
        if e > TOL:
            sys.exit("FAIL %s: param %s differs from the straight run: rel %.2e > %.0e" % (what, name, e, TOL))
        if e >= worst:
            worst, worst_name = e, name
    by_step = {rec["step"]: rec for rec in rl}
    lerr = 0.0
    for g in gl:
        for key in ("loss", "grad_norm"):
            e = abs(g[key] - by_step[g["step"]][key]) / abs(by_step[g["step"]][key])
            if e > TOL:
                sys.exit("FAIL %s: step %d's %s is %r, straight %r (rel %.2e)"
                         % (what, g["step"], key, g[key], by_step[g["step"]][key], e))
            lerr = max(lerr, e)
    return worst, worst_name, lerr


def pieces(what, step_dir, world):
    """A checkpoint's manifest, and its logical tensors {name: (kind, f32 values)}
    reassembled from the rank files' pieces, each element found exactly once."""
    with open(os.path.join(step_dir, "manifest.json")) as f:
        manifest = json.load(f)
    files = manifest["files"]
    names = sorted(os.listdir(step_dir))
    if ([x["rank"] for x in files] != list(range(world)) or manifest["plan"]["world"] != world
            or names != sorted(["manifest.json"] + ["rank-%05d.safetensors" % k for k in range(world)])):
        sys.exit("FAIL %s: %s holds %s; its manifest lists %s (want world %d)" % (what, step_dir, names, files, world))
    values, cover, kinds, counted = {}, {}, {}, {}
    for x in files:
        path = os.path.join(step_dir, x["name"])
        if os.path.getsize(path) != x["bytes"]:
            sys.exit("FAIL %s: %s is %d bytes; the manifest says %d" % (what, path, os.path.getsize(path), x["bytes"]))
        head, start = header(path)
        meta = json.loads(head["__metadata__"]["fsexec"])
        if meta["rank"] != x["rank"] or meta["step"] != manifest["step"]:
            sys.exit("FAIL %s: %s says rank %s step %s" % (what, path, meta["rank"], meta["step"]))
        with open(path, "rb") as f:
            blob = f.read()[start:]
        loaded = load_safetensors(path)
        if set(loaded) != set(meta["pieces"]):
            sys.exit("FAIL %s: %s holds %s, its pieces are %s" % (what, path, sorted(loaded), sorted(meta["pieces"])))
        for key, p in meta["pieces"].items():
            name, a, n = p["tensor"], p["first"], p["count"]
            size = int(np.prod(p["shape"], dtype=np.int64))
            whole = a == 0 and n == size
            if key != (name if whole else "%s[%d:%d]" % (name, a, a + n)) or loaded[key].numel() != n:
                sys.exit("FAIL %s: %s: piece %s is %s, %d elements" % (what, path, key, p, loaded[key].numel()))
            lo, hi = head[key]["data_offsets"]
            if "%08x" % zlib.crc32(blob[lo:hi]) != p["crc32"]:
                sys.exit("FAIL %s: %s: piece %s has CRC-32 %08x; it says %s"
                         % (what, path, key, zlib.crc32(blob[lo:hi]), p["crc32"]))
            if name not in values:
                values[name], cover[name] = np.zeros(size, np.float32), np.zeros(size, np.int32)
                kinds[name] = (p["kind"], list(p["shape"]))
            if kinds[name] != (p["kind"], list(p["shape"])):
                sys.exit("FAIL %s: %s is %s in one piece, %s in %s" % (what, name, kinds[name], p, path))
            values[name][a:a + n] = loaded[key].numpy().ravel()
            cover[name][a:a + n] += 1
            kind = "params" if p["kind"] == "param" else p["kind"]
            counted[kind] = counted.get(kind, 0) + n
    for name, c in cover.items():
        gaps, overlaps = np.flatnonzero(c == 0), np.flatnonzero(c > 1)
        if len(gaps) or len(overlaps):
            sys.exit("FAIL %s: of %s's %d elements, %d are in no piece (first at %s), %d in more than one (first at %s)"
                     % (what, name, len(c), len(gaps), gaps[:1].tolist(), len(overlaps), overlaps[:1].tolist()))
    if counted != {k: v for k, v in manifest["elements"].items() if v}:
        sys.exit("FAIL %s: the pieces hold %s elements; the manifest says %s" % (what, counted, manifest["elements"]))
    return manifest, {name: (kinds[name], values[name].reshape(kinds[name][1])) for name in values}


def counts(what, step_dir, world, params, reassembled=None):
    """The checkpoint's elements are the model's: its params, AdamW's two moments of
    each; with reassembled (--save-weights of the run), its params are those, bitwise."""
    manifest, tensors = pieces(what, step_dir, world)
    n = sum(t.numel() for t in params.values())
    el = manifest["elements"]
    if el["params"] != n or el["optimizer"] != 2 * n:
        sys.exit("FAIL %s: %s counts %s elements; the model has %d params (AdamW: %d of optimizer state)"
                 % (what, step_dir, el, n, 2 * n))
    if reassembled is not None:
        got = {name: torch.from_numpy(v) for name, ((kind, _), v) in tensors.items() if kind == "param"}
        bitwise(what + " (reassembled from " + os.path.basename(step_dir) + ")", got, reassembled, "--save-weights")
    return el


def exact(r):
    cases = [("fp32 world 1 none", 1, ["--shard", "none"], []),
             ("fp32 world 3 fsdp", 3, ["--shard", "fsdp"], []),
             ("fp16 world 1 none", 1, ["--shard", "none", "--precision", "fp16"], ["--debug-overflow-at", "2"]),
             ("fp16 world 3 zero2", 3, ["--shard", "zero2", "--precision", "fp16"], ["--debug-overflow-at", "5"])]
    for what, world, extra, debug in cases:
        plan = r.compile(GPT2, world, extra)
        ckpt = r.path(what + " ckpt")
        straight = r.train(what + " straight", plan, world, 6, *debug)
        first = r.train(what + " first", plan, world, 3, "--checkpoint-dir", ckpt, *debug)
        resumed = r.train(what + " resumed", plan, world, 6, "--resume", ckpt, "--checkpoint-dir", ckpt, *debug)
        same_log(what + " (steps 1-3)", first[1], straight[1])
        if [rec["step"] for rec in resumed[1]] != [4, 5, 6]:
            sys.exit("FAIL %s: the resumed run logged steps %s" % (what, [rec["step"] for rec in resumed[1]]))
        same_log(what + " resumed", resumed[1], straight[1])
        bitwise(what + " resumed", resumed[0], straight[0], "the straight run")
        line = resumed_line(what, resumed[2], "at step 3: ")
        resumed_line(what, resumed[2], "the plan that saved it")
        if debug:
            skipped = [rec["step"] for rec in straight[1] if rec.get("skipped")]
            scales = [rec.get("loss_scale") for rec in straight[1]]
            if skipped != [int(debug[1])] or scales[int(debug[1])] != 65536 / 2:
                sys.exit("FAIL %s: the straight run skipped steps %s, loss scales %s" % (what, skipped, scales))
        el = counts(what, os.path.join(ckpt, "step-00000003"), world, straight[0])
        counts(what, os.path.join(ckpt, "step-00000006"), world, straight[0], reassembled=resumed[0])
        r.exports.append((what, os.path.join(ckpt, "step-00000006"), r.path(what + " resumed", ".safetensors")))
        print("ok   %-20s resumed at step 3 bitwise equal to 6 steps straight (loss scales %s); %d + %d + %d "
              "elements in %d file(s), each once" % (what, [rec.get("loss_scale") for rec in resumed[1]], el["params"],
                                                  el["optimizer"], el["state"], world))
    print("     (%s)" % line)


def reshard(r):
    src = r.compile(UNEVEN, 4, ["--shard", "fsdp"])
    ckpt = r.path("fsdp world 4 ckpt")
    straight = r.train("fsdp world 4 straight", src, 4, 6)
    r.train("fsdp world 4 first", src, 4, 3, "--checkpoint-dir", ckpt)
    cases = [(3, ["--shard", "zero1"]),
             (1, ["--shard", "none"]),
             (2, ["--shard", "ddp"]),
             (2, ["--shard", "zero2", "--offload", "optimizer"]),
             (2, ["--stages", "2", "--microbatches", "2"]),
             (3, ["--shard", "fsdp", "--microbatches", "2"])]
    for world, extra in cases:
        what = "fsdp world 4 -> %s world %d" % (" ".join(x.lstrip("-") for x in extra if x != "--shard"), world)
        got = r.train(what, r.compile(UNEVEN, world, extra), world, 6, "--resume", ckpt)
        resumed_line(what, got[2], "saved by world 4, fsdp, fp32, resharded to world %d" % world)
        worst, name, lerr = close(what, got[:2], straight[:2])
        print("ok   %-48s params rel %.1e at most (%s), losses and norms rel %.1e" % (what, worst, name, lerr))
    none = r.compile(UNEVEN, 1, ["--shard", "none"])
    fsdp = r.compile(UNEVEN, 1, ["--shard", "fsdp"])
    ckpt = r.path("fsdp world 1 ckpt")
    ref = r.train("none world 1 straight", none, 1, 6)
    r.train("fsdp world 1 first", fsdp, 1, 3, "--checkpoint-dir", ckpt)
    got = r.train("fsdp world 1 -> none world 1", none, 1, 6, "--resume", ckpt)
    resumed_line("fsdp world 1 -> none world 1", got[2], "saved by world 1, fsdp, fp32, resharded to world 1, none")
    same_log("fsdp world 1 -> none world 1", got[1], ref[1])
    bitwise("fsdp world 1 -> none world 1", got[0], ref[0], "the straight none run")
    print("ok   fsdp world 1 -> none world 1 at step 3 bitwise equal to 6 steps of none straight")


def errors(r):
    ckpt = os.path.join(r.path("fp32 world 1 none ckpt"), "step-00000003")  # exact()'s: C = 32, AdamW
    for what, plan, want in (
            ("C = 48", r.compile(GPT2 + ["-D", "C=48"], 1, ["--shard", "none"]),
             r"is of another model than this plan: dims that differ \(1\): C 32 in the checkpoint, 48 in this plan; "
             r"params of another shape \(\d+\): [\w.]+ \(\[\d+(, \d+)*\] in the checkpoint, \[\d+(, \d+)*\] in this "
             r"plan\)"),
            ("SGD with momentum", r.compile(GPT2, 1, ["--shard", "none"], optim=SGD),
             r"no optimizer state '[\w.]+\.momentum_buffer'")):
        rc, out = r.train("resume " + what, plan, 1, 6, "--resume", ckpt, ok=False)
        found = re.search(want, out)
        if rc == 0 or not found:
            sys.exit("FAIL: resuming a C = 32 AdamW checkpoint with %s: exit %d, want /%s/:\n%s"
                     % (what, rc, want, out))
        print("ok   resuming with %-17s fails (exit %d): %s" % (what, rc, found.group(0)))
    got = r.train("fp32 -> fp16", r.compile(GPT2, 1, ["--shard", "none", "--precision", "fp16"]), 1, 6,
                  "--resume", ckpt)
    line = resumed_line("fp32 -> fp16", got[2], "resharded to world 1, none, fp16; not in the checkpoint, at their "
                                                "start: loss_scale")
    if [rec.get("loss_scale") for rec in got[1]] != [65536] * 3:
        sys.exit("FAIL fp32 -> fp16: loss scales %s" % [rec.get("loss_scale") for rec in got[1]])
    print("ok   fp32 -> fp16 resumes, its loss scale at 65536 (%s)" % line[line.index("resharded"):])


def peak_rss(cmd):
    """(exit status, output, peak RSS in bytes) of cmd, the one child measured"""
    res = run([sys.executable, "-c", PEAK_RSS, *cmd], ok=False)
    found = re.search(r"^maxrss (\d+)$", res.stdout, re.MULTILINE)
    if not found:
        sys.exit("FAIL: no peak RSS from %s:\n%s" % (" ".join(cmd), res.stdout))
    return res.returncode, res.stdout, 1024 * int(found.group(1))


def export(r):
    for what, step_dir, saved in r.exports:
        out = r.path(what + " export", ".safetensors")
        run([r.fsexec, "--export", step_dir, out])
        head, _ = header(out)
        if any(t["dtype"] != "F32" for name, t in head.items() if name != "__metadata__"):
            sys.exit("FAIL %s: --export wrote %s" % (what, head))
        bitwise(what + " --export", load_safetensors(out), load_safetensors(saved), "--save-weights")
        print("ok   --export of %-20s step 6 is its --save-weights bit for bit" % what)
    plan = r.compile(BIG, 1, ["--shard", "none"])
    ckpt = r.path("big ckpt")
    run([r.fsexec, plan, "--steps", "0", "--checkpoint-dir", ckpt, "--threads", "1", "--data", r.data])
    out = r.path("big export", ".safetensors")
    rc, text, rss = peak_rss([r.fsexec, "--export", os.path.join(ckpt, "step-00000000"), out])
    if rc != 0:
        sys.exit("FAIL: --export of the large model (exit %d):\n%s" % (rc, text))
    size = os.path.getsize(out)
    wte = header(out)[0]["wte"]
    floor = peak_rss(["/bin/true"])[2]
    if wte["shape"] != [50257, 256] or not rss < size or not rss < 16 * MIB + 40 * MIB:
        sys.exit("FAIL: --export of %d bytes of params (wte %s) peaked at %.1f MiB RSS; want below both and "
                 "16 MiB + 40 MiB" % (size, wte["shape"], rss / MIB))
    print("ok   --export of %.1f MiB of params (wte %.1f MiB) peaks at %.1f MiB RSS (the helper's floor: %.1f MiB)"
          % (size / MIB, (wte["data_offsets"][1] - wte["data_offsets"][0]) / MIB, rss / MIB, floor / MIB))


def main():
    mpi_main(Runner, [exact, reshard, errors, export],
             "checkpoints resume bit for bit, reshard into any plan of the model, and export in bounded memory")


if __name__ == "__main__":
    main()
