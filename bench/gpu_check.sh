#!/usr/bin/env bash
# bench/gpu_check.sh: the CUDA backend checked end to end on a GPU machine, in one run of
# about 8 minutes, every step printing its numbers and the run going on past a failure:
#   1. op_check: every op of tiny GPT-2 and tiny Llama on CUDA against the CPU backend,
#      from identical inputs, in fp32, tf32, bf16 and fp16;
#   2. tiny GPT-2 trained 20 steps on --device cuda (plain and --cuda-graph, and bf16
#      with --offload optimizer, with and without --cuda-graph) and on --device cpu from
#      the same seed: per-step losses within fp32 1e-4 / bf16 2e-2 (offload's graph
#      against its run without: 1e-6);
#   3. memory: the arena the plan promised against what the device gave (the
#      "cuda memory:" start line), and the process's whole use of the device;
#   4. GPT-2 124M (B=8, T=1024, bf16, --cuda-graph): tokens/s and MFU against PyTorch on
#      the same GPU (bench/gpu_torch.py: eager, and torch.compile when time allows);
#   5. where the 124M step's time goes: a --trace of its steps 2-4 against fsc --kernels'
#      roofline on this GPU (H200 or H100), by op kind, the most time lost first
#      (bench/roofline.py; also $OUT/roofline.json);
#   6. (opt-in) attention alone: bench/gpu_attention.py, fsexec's packed attention forward
#      and backward against SDPA's flash and cuDNN back ends at the 124M and 1.5B shapes;
#   7. (opt-in) GPT-2 1.5B (B=8, T=1024, bf16, clip 0 so the host updates overlap the
#      backward): steps with and without --offload optimizer, their ratio, and each run's
#      arena against the plan.
# The GPU machine has the CUDA toolkit, a driver and PyTorch, but none of our Debian
# libraries (jansson, OpenBLAS, Open MPI) and no network: the binaries travel with them.
#
# Here, on the development machine (no GPU needed):
#   cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=Release && cmake --build build-gpu -j
#   bench/gpu_check.sh --pack build-gpu   # -> build-gpu/pack: fsc fsexec op_check libfs_cuda.so libs/
# Then with the device tool, from the repository root (build-gpu/ is git-ignored):
#   run  carry: ["build-gpu/pack"]  command: "bash bench/gpu_check.sh build-gpu/pack"  timeout_s: 600
# Results: on stdout, and under $OUT when it is set (the device tool brings back
# $OUT/summary.txt, gpu_check.log, results.json, roofline.json and 124m-trace.json). GPU_CHECK_BUDGET (seconds, default
# 480) bounds the run; the optional parts (torch.compile, the 124M run without a graph)
# are skipped when too little is left. GPU_CHECK_SECTIONS (default "1 2 3 4") picks parts:
# 1 op_check, 2 training, 3 the 124M run with its memory and roofline table, 4 PyTorch,
# 6 attention alone, 7 offload at 1.5B (e.g. GPU_CHECK_SECTIONS="6 7").
# Exit status: 0 when every check passed, else 1.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)

case "${1:-}" in -h|--help) sed -n '2,35p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;; esac

# ---- --pack BUILD: gather what the GPU machine needs --------------------------------------
if [ "${1:-}" = "--pack" ]; then
    build=${2:?usage: bench/gpu_check.sh --pack BUILD_DIR}
    packlibs=${PACK_LIBS:-$ROOT/../shared/device/pack-libs.sh}
    [ -f "$build/libfs_cuda.so" ] || { echo "gpu_check: $build/libfs_cuda.so missing: this build found no CUDA toolkit" >&2; exit 1; }
    rm -rf "$build/pack" && mkdir -p "$build/pack"
    cp "$build/fsc" "$build/fsexec" "$build/op_check" "$build/libfs_cuda.so" "$build/pack/" || exit 1
    bash "$packlibs" "$build/pack/libs" "$build/fsc" "$build/fsexec" "$build/op_check" "$build/libfs_cuda.so" || exit 1
    du -sh "$build/pack"
    exit 0
fi

PACK=$(cd "${1:?usage: bench/gpu_check.sh PACK_DIR (see the header)}" && pwd) || exit 1
OUTDIR=${OUT:-/tmp/gpu_check_out}
WORK=$(mktemp -d)
mkdir -p "$OUTDIR"
exec > >(tee "$OUTDIR/gpu_check.log") 2>&1
T0=$(date +%s)
BUDGET=${GPU_CHECK_BUDGET:-480}
left() { echo $((BUDGET - ($(date +%s) - T0))); }
FAILS=0
SUMMARY=$OUTDIR/summary.txt
: >"$SUMMARY"
RESULTS=$WORK/results.txt   # key=value lines, made into results.json at the end
: >"$RESULTS"
say() { echo "$*" | tee -a "$SUMMARY"; }
fail() { say "FAIL: $*"; FAILS=$((FAILS + 1)); }
result() { echo "$1=$2" >>"$RESULTS"; }
section() { echo; echo "==== $* ($(left) s left)"; }
want() { case " ${GPU_CHECK_SECTIONS:-1 2 3 4} " in *" $1 "*) return 0 ;; esac; return 1; }

# ---- libraries --------------------------------------------------------------------------------
# Ours: the carried ones this machine lacks (its own libstdc++, libgcc, zlib are newer and
# serve PyTorch too, so they are not shadowed). CUDA's: wherever this machine keeps them.
export CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$(readlink -f "$(command -v nvcc 2>/dev/null || echo /usr/local/cuda/bin/nvcc)")")")}
mkdir -p "$WORK/libs"
for f in "$PACK"/libs/*; do
    so=$(basename "$f")
    ldconfig -p | grep -q "^[[:space:]]*$so " || ln -s "$f" "$WORK/libs/$so"
done
LIBDIRS=$WORK/libs
PYNV=$(python3 -c 'import nvidia, os; print(" ".join(os.path.join(p, d, "lib") for p in nvidia.__path__ for d in os.listdir(p)))' 2>/dev/null)
for so in libcuda.so.1 libnvrtc.so.13 libnvrtc-builtins.so.13.0 libcublas.so.13 libcublasLt.so.13 libnccl.so.2; do
    ldconfig -p | grep -q "^[[:space:]]*$so " && continue
    dir=
    for d in "$CUDA_HOME/lib64" "$CUDA_HOME/lib" "$CUDA_HOME/targets/x86_64-linux/lib" /usr/local/nvidia/lib64 \
             /usr/local/nvidia/lib /usr/lib/x86_64-linux-gnu $PYNV; do
        [ -e "$d/$so" ] && { dir=$d; break; }
    done
    [ -z "$dir" ] && dir=$(find /usr /opt -name "$so" 2>/dev/null | head -1 | xargs -r dirname)
    if [ -n "$dir" ]; then LIBDIRS=$LIBDIRS:$dir; else echo "gpu_check: $so not found on this machine"; fi
done
fs() { LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }
# fs_t SECONDS CMD...: fs CMD, ended after SECONDS or when the budget (less 30 s for the
# summary) runs out, whichever is first; not run at all (status 124) when under 10 s are left.
fs_t() {
    local t=$1 l=$(( $(left) - 30 ))
    shift
    [ "$l" -lt "$t" ] && t=$l
    if [ "$t" -lt 10 ]; then echo "gpu_check: out of time, not run: ${1##*/}"; return 124; fi
    timeout -k 10 "$t" env LD_LIBRARY_PATH="$LIBDIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"
}
FSC=$PACK/fsc FSEXEC=$PACK/fsexec OPCHECK=$PACK/op_check
export FS_CUDA_CACHE=$WORK/cache OMP_NUM_THREADS=${OMP_NUM_THREADS:-$(nproc)}
# Without --data, fsexec and op_check read the bytes of a text every Debian machine has
# (runtime/data.c); where this one has none of them, the repository's sources stand in.
corpus=
for f in /usr/share/common-licenses/GPL-3 /usr/share/dict/words /usr/share/common-licenses/GPL-2 \
         /usr/share/common-licenses/Apache-2.0; do [ -s "$f" ] && corpus=$f; done
if [ -z "$corpus" ]; then
    mkdir -p /usr/share/dict && cat "$ROOT"/*/*.[ch] >/usr/share/dict/words &&
        echo "gpu_check: no built-in corpus text on this machine; wrote the sources to /usr/share/dict/words"
fi

section "machine"
nvidia-smi -L 2>&1 | head -4
fs "$FSEXEC" --version
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 | tail -1
missing=$(fs ldd "$PACK/libfs_cuda.so" "$FSEXEC" | grep "not found" | sort -u)
[ -n "$missing" ] && fail "libraries not found: $missing"

GPT2_TINY=(-D L=2 -D C=64 -D NH=4 -D T=32 -D V=256 -D B=4)
LLAMA_TINY=(-D L=2 -D C=64 -D NH=4 -D F=176 -D T=32 -D V=256 -D B=4)

# plan MODEL PRECISION [tf32]: a tiny plan (path on stdout), or nothing after a message; tf32: compiled with
# --tf32 1 (fp32 attention and GEMMs on TF32 tensor cores).
plan() {
    local model=$1 prec=$2 out=$WORK/$1-$2${3:+-$3}.plan dims tf=()
    [ "${3:-}" = tf32 ] && tf=(--tf32 1)
    if [ "$model" = gpt2 ]; then dims=("${GPT2_TINY[@]}"); else dims=("${LLAMA_TINY[@]}"); fi
    if [ ! -f "$out" ] && ! fs "$FSC" "$ROOT/samples/$model.fsm" "${dims[@]}" --precision "$prec" "${tf[@]}" -o "$out" \
        -q >&2; then
        fail "fsc $model --precision $prec ${tf[*]}"
        return 1
    fi
    echo "$out"
}

# ---- 1. every op against the CPU ----------------------------------------------------------------
want 1 && section "1. op_check: each op on CUDA against the CPU backend"
want 1 && for model in gpt2 llama; do
    for cfg in fp32 tf32 bf16 fp16; do
        prec=$cfg tf=
        [ "$cfg" = tf32 ] && prec=fp32 tf=tf32
        p=$(plan "$model" "$prec" $tf) || continue
        log=$WORK/op_check-$model-$cfg.txt
        fs_t 120 "$OPCHECK" "$p" >"$log" 2>&1
        rc=$?
        sed 's/^/    /' "$log" | tail -40
        worst=$(awk '$1 != "op" && NF >= 4 && $3 ~ /^([0-9.e+-]+|inf)$/ {print $3, $1}' "$log" | sort -g | tail -1)
        result "op_check_${model}_${cfg}_rc" "$rc"
        if [ "$rc" -eq 0 ]; then say "op_check $model $cfg: ok (worst relative error: ${worst:-?})"
        else fail "op_check $model $cfg: rc $rc (worst: ${worst:-?}; log above)"; fi
    done
done

# ---- 2. training: CUDA against CPU ----------------------------------------------------------------
want 2 && section "2. tiny GPT-2, 20 steps: losses on CUDA against the CPU"
compare_losses() {  # A.jsonl B.jsonl TOL NAME
    python3 - "$@" <<'EOF'
import json, os, sys
a, b, tol, name = sys.argv[1], sys.argv[2], float(sys.argv[3]), sys.argv[4]
for path in (a, b):
    if not os.path.exists(path):
        print(f"{name}: no {os.path.basename(path)} (that run failed; see above)"); sys.exit(1)
la = [json.loads(l)["loss"] for l in open(a)]
lb = [json.loads(l)["loss"] for l in open(b)]
if len(la) != len(lb) or not la:
    print(f"{name}: {len(la)} against {len(lb)} steps"); sys.exit(1)
rel = [abs(x - y) / max(abs(y), 1e-30) if x is not None and y is not None else float("inf") for x, y in zip(la, lb)]
worst = max(range(len(rel)), key=lambda i: rel[i])
print(f"{name}: worst step {worst + 1}: {la[worst]} vs {lb[worst]}, relative {rel[worst]:.2e} (tolerance {tol:g}); "
      f"step 1 {la[0]} vs {lb[0]}, step {len(la)} {la[-1]} vs {lb[-1]}")
sys.exit(0 if rel[worst] <= tol else 1)
EOF
}
want 2 && for prec in fp32 bf16; do
    tol=1e-4
    [ "$prec" = bf16 ] && tol=2e-2
    p=$(plan gpt2 "$prec") || continue
    common=(--steps 20 --seed 7 --log-every 10)
    fs_t 120 "$FSEXEC" "$p" "${common[@]}" --device cpu --log "$WORK/cpu-$prec.jsonl" 2>&1 | tail -3
    fs_t 120 "$FSEXEC" "$p" "${common[@]}" --device cuda --log "$WORK/cuda-$prec.jsonl" 2>&1 | tail -6
    fs_t 120 "$FSEXEC" "$p" "${common[@]}" --device cuda --cuda-graph --log "$WORK/graph-$prec.jsonl" 2>&1 | tail -3
    if out=$(compare_losses "$WORK/cuda-$prec.jsonl" "$WORK/cpu-$prec.jsonl" "$tol" "cuda vs cpu $prec" 2>&1); then say "$out"; else fail "$out"; fi
    if out=$(compare_losses "$WORK/graph-$prec.jsonl" "$WORK/cuda-$prec.jsonl" "$tol" "cuda-graph vs cuda $prec" 2>&1); then say "$out"; else fail "$out"; fi
done
# Offload: the update on the host (page-locked host space, copies on the compute stream).
p=$WORK/gpt2-bf16-offload.plan
if ! want 2; then
    :
elif fs "$FSC" "$ROOT/samples/gpt2.fsm" "${GPT2_TINY[@]}" --precision bf16 --offload optimizer -o "$p" -q; then
    fs_t 120 "$FSEXEC" "$p" --steps 20 --seed 7 --log-every 10 --device cpu --log "$WORK/cpu-offload.jsonl" 2>&1 | tail -2
    fs_t 120 "$FSEXEC" "$p" --steps 20 --seed 7 --log-every 10 --device cuda --log "$WORK/cuda-offload.jsonl" 2>&1 | tail -3
    if out=$(compare_losses "$WORK/cuda-offload.jsonl" "$WORK/cpu-offload.jsonl" 2e-2 "cuda vs cpu bf16 offload" 2>&1); then
        say "$out"; else fail "$out"; fi
    # The host's update as host-function nodes of the captured step: the same losses.
    fs_t 120 "$FSEXEC" "$p" --steps 20 --seed 7 --log-every 10 --device cuda --cuda-graph \
        --log "$WORK/graph-offload.jsonl" 2>&1 | tail -3
    if out=$(compare_losses "$WORK/graph-offload.jsonl" "$WORK/cuda-offload.jsonl" 1e-6 \
        "cuda-graph vs cuda bf16 offload" 2>&1); then
        say "$out"; else fail "$out"; fi
else
    fail "fsc --offload optimizer"
fi

# ---- 3 and 4. GPT-2 124M: memory, speed, against PyTorch -----------------------------------------
want 3 && section "3, 4. GPT-2 124M (B=8, T=1024, bf16): memory and speed"
P124=$WORK/gpt2-124m.plan
if want 3 && fs "$FSC" "$ROOT/samples/gpt2.fsm" -D B=8 -D T=1024 --precision bf16 -o "$P124" -q; then
    fs_t 240 "$FSEXEC" "$P124" --device cuda --cuda-graph --steps 30 \
        --log "$WORK/124m.jsonl" --log-every 10 >"$WORK/124m.txt" 2>&1
    rc=$?
    cat "$WORK/124m.txt" | tail -12
    [ "$rc" -eq 0 ] || fail "fsexec GPT-2 124M --device cuda: rc $rc"
    # 5. the time by op kind against the roofline: a trace times each op by events (never
    # as a graph); the kernel report is of the same plan (fsc is deterministic).
    gpu=h100
    nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | grep -q H200 && gpu=h200
    fs_t 90 "$FSEXEC" "$P124" --device cuda --steps 4 --trace "$OUTDIR/124m-trace.json" >"$WORK/124m-trace.txt" 2>&1
    if [ $? -eq 0 ] &&
       fs "$FSC" "$ROOT/samples/gpt2.fsm" -D B=8 -D T=1024 --precision bf16 --kernels=json --machine "$gpu" -q \
           >"$WORK/124m-kernels.json"; then
        python3 "$ROOT/bench/roofline.py" "$OUTDIR/124m-trace.json" "$WORK/124m-kernels.json" \
            --json "$OUTDIR/roofline.json" | tee -a "$SUMMARY"
        [ "${PIPESTATUS[0]}" -eq 0 ] || fail "bench/roofline.py on the 124M trace"
    else
        tail -5 "$WORK/124m-trace.txt"
        fail "the 124M trace or its kernel report"
    fi
    if [ "$(left)" -gt 200 ]; then  # how much the graph saves: the same without it
        fs_t 90 "$FSEXEC" "$P124" --device cuda --steps 12 \
            --log "$WORK/124m-nograph.jsonl" --log-every 6 2>&1 | tail -2
    fi
fi
# ---- 6. attention alone, against PyTorch's SDPA ---------------------------------------------------
if want 6; then
    section "6. attention (packed, bf16, causal) against SDPA"
    fs_t 240 python3 "$ROOT/bench/gpu_attention.py" --fsc "$FSC" --fsexec "$FSEXEC" --shapes 124m,1.5b \
        --work "$WORK/attention" | tee "$OUTDIR/attention.txt" | tail -12
    [ "${PIPESTATUS[0]}" -eq 0 ] || fail "bench/gpu_attention.py"
fi

# ---- 7. offload at 1.5B: the step with and without --offload optimizer ---------------------------
if want 7; then
    section "7. GPT-2 1.5B (B=8, T=1024, bf16, clip 0): --offload optimizer against none"
    XL=(-D L=48 -D C=1600 -D NH=25 -D B=8 -D T=1024 --precision bf16 --clip 0)
    for mode in none optimizer; do
        p=$WORK/gpt2-xl-$mode.plan
        if fs "$FSC" "$ROOT/samples/gpt2.fsm" "${XL[@]}" --offload "$mode" -o "$p" -q; then
            fs_t 200 "$FSEXEC" "$p" --device cuda --steps 12 --log "$WORK/xl-$mode.jsonl" --log-every 1 \
                >"$WORK/xl-$mode.txt" 2>&1 || fail "GPT-2 1.5B --offload $mode"
            grep -E "cuda memory:" "$WORK/xl-$mode.txt" | head -1
            tail -2 "$WORK/xl-$mode.txt"
        else
            fail "fsc GPT-2 1.5B --offload $mode"
        fi
    done
    python3 - "$WORK" <<'EOF7' | tee -a "$SUMMARY"
import json, os, statistics, sys
work = sys.argv[1]
ms = {}
for mode in ("none", "optimizer"):
    path = os.path.join(work, f"xl-{mode}.jsonl")
    rows = [json.loads(l) for l in open(path)] if os.path.exists(path) else []
    steps = [r["ms"] for r in rows[4:] if r.get("ms")]
    if steps:
        ms[mode] = statistics.median(steps)
        print(f"GPT-2 1.5B bf16 --offload {mode}: {ms[mode]:.0f} ms a step (median of {len(steps)})")
if len(ms) == 2:
    print(f"offload / none: {ms['optimizer'] / ms['none']:.2f}x (issue 34's goal: 1.15x)")
EOF7
fi
TORCH_LIMIT=$(( $(left) - 20 ))
if ! want 4; then
    :
elif [ "$TORCH_LIMIT" -gt 40 ]; then
    timeout -k 10 "$TORCH_LIMIT" python3 "$ROOT/bench/gpu_torch.py" --B 8 --T 1024 --time-limit "$((TORCH_LIMIT - 10))" \
        >"$WORK/torch.jsonl" 2>"$WORK/torch.err"
    cat "$WORK/torch.jsonl"; tail -3 "$WORK/torch.err"
else
    fail "no time left for PyTorch"
fi
python3 - "$WORK" "$RESULTS" "$OUTDIR" <<'EOF' | tee -a "$SUMMARY"
import json, os, re, statistics, sys
work, results, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
L, C, T, B, PEAK = 12, 768, 1024, 8, 989e12
def log(name):
    path = os.path.join(work, name)
    return [json.loads(l) for l in open(path)] if os.path.exists(path) else []
def median_rate(rows, skip):
    rates = [r["tokens_per_s"] for r in rows[skip:] if r.get("tokens_per_s")]
    return statistics.median(rates) if rates else None
out = {}
text = open(os.path.join(work, "124m.txt")).read() if os.path.exists(os.path.join(work, "124m.txt")) else ""
m = re.search(r"\| ([\d,]+) params", text)
params = int(m.group(1).replace(",", "")) if m else 124439808
fpt = 6 * params + 12 * L * C * T
mem = re.search(r"cuda memory: arena ([\d.]+ \w+) \(planned ([\d.]+ \w+)\).*; device ([\d.]+ \w+) of ([\d.]+ \w+) in use", text)
if mem:
    print(f"memory: arena taken {mem.group(1)} for {mem.group(2)} planned; the device {mem.group(3)} of {mem.group(4)} in use")
    out.update(arena_taken=mem.group(1), arena_planned=mem.group(2), device_in_use=mem.group(3))
else:
    print("memory: no 'cuda memory:' line from the 124M run")
for name, rows, skip in (("fsexec cuda-graph", log("124m.jsonl"), 5), ("fsexec no graph", log("124m-nograph.jsonl"), 4)):
    r = median_rate(rows, skip)
    if r:
        print(f"{name}: {r:,.0f} tok/s, MFU {r * fpt / PEAK:.1%} ({params:,} params, {fpt / 1e6:.0f} MFLOP/token)")
        out[name.replace(" ", "_")] = r
torch = {}
if os.path.exists(os.path.join(work, "torch.jsonl")):
    for line in open(os.path.join(work, "torch.jsonl")):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if "tokens_per_s" in row:
            torch[row["mode"]] = row["tokens_per_s"]
            print(f"pytorch {row['mode']}: {row['tokens_per_s']:,.0f} tok/s, MFU {row['mfu']:.1%} ({row['torch']})")
        else:
            print(f"pytorch {row.get('mode')}: {row.get('skipped') or row.get('error')}")
ours = out.get("fsexec_cuda-graph")
for mode, rate in torch.items():
    out["torch_" + mode] = rate
    if ours:
        print(f"fsexec / pytorch {mode}: {ours / rate:.2f}x")
for line in open(results):
    k, _, v = line.strip().partition("=")
    out[k] = v
json.dump(out, open(os.path.join(outdir, "results.json"), "w"), indent=1)
EOF

section "summary"
cat "$SUMMARY"
echo "gpu_check: $FAILS failure(s), $(( $(date +%s) - T0 )) s"
rm -rf "$WORK"
[ "$FAILS" -eq 0 ]
