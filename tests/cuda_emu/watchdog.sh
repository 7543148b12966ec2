#!/usr/bin/env bash
# --timeout on (emulated) CUDA ranks: 2 pipeline stages of a tiny MLP train on cuda-emu
# (NCCL's sends and receives over MPI: tests/cuda_emu/nccl_emu.c); rank 1 is stopped with
# SIGSTOP (mpirun notices nothing). Rank 0, whose host waits for its device, not in MPI,
# must end every rank through the watchdog, naming the hung NCCL call (its plan op and
# .fsm line) and the ranks it waits for: rank 1, stage 1 (a send or receive), or the
# stages (the loss's all-reduce over the pipeline).
# usage: watchdog.sh FSC FSEXEC LIBFS_CUDAEMU
set -uo pipefail
FSC_=$(realpath "$1") FSEXEC_=$(realpath "$2")
export FS_CUDA_BACKEND=$(realpath "$3") FS_CUDA_EMU_ORDER=forward FS_CUDA_EMU_MEASURE=0
source "$(dirname "$0")/../mpi/lib.sh" "$FSC_" "$FSEXEC_" ""
plan=$tmp/mlp.plan
"$FSC" "$(dirname "$0")/../../samples/mlp.fsm" -D L=2 -D B=8 -D H=8 --stages 2 --world 2 --microbatches 2 \
  --schedule 1f1b -o "$plan" -q || { fail "fsc"; finish; }
# One step first, so the emulator's compiled kernels are cached before the timed run.
"$FSEXEC" --nproc 2 "$plan" --device cuda --steps 1 >"$tmp/warm.out" 2>&1 ||
  { fail "a first step on cuda-emu"; sed 's/^/    /' "$tmp/warm.out" | tail -20; finish; }

name=sigstop-cuda-stage-1
START_TRIES=600  # emulated steps are slow on a busy machine: up to a minute to the first step
if start_training "$name" 2 "$plan" --device cuda --timeout 10; then
  pid=$(rank_pid 1 $ranks)
  t0=$(now_ms)
  kill -STOP "$pid"
  if ends_within "$name" 60 "$t0"; then
    line=$(grep -E '^\[rank 0, stage 0\] fsexec: timeout: step [0-9]+ did not finish within 10 s \(--timeout\): on the device, op [0-9]+ \((send|recv|all_reduce)\) at mlp\.fsm:[0-9]+:[0-9]+, ((to|from) rank 1 \(stage 1\)|over the 2 stages at data-parallel index 0) did not complete \(NCCL.s communicators aborted\)' \
      "$tmp/$name.out" | head -1)
    [ -n "$line" ] && ok "$name: $line" || { fail "$name: no diagnosis naming the hung NCCL call and rank 1"; grep -a timeout "$tmp/$name.out"; }
  fi
else
  fail "$name: the ranks did not start training"
  sed 's/^/    /' "$tmp/$name.out" | head -20
fi
finish
