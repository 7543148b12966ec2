#!/usr/bin/env bash
# --timeout on (emulated) CUDA ranks: 2 pipeline stages of a tiny MLP train on cuda-emu
# (NCCL's sends and receives over MPI: tests/cuda_emu/nccl_emu.c); rank 1 is stopped with
# SIGSTOP (mpirun notices nothing). Rank 0, whose host waits for its device, not in MPI,
# must end every rank through the watchdog, naming the hung NCCL call (its plan op, and its
# .fsm line where it has one: the compiler's all-reduce of the loss has none) and the ranks it waits for: rank 1, stage 1 (a send or receive), or the
# stages (the loss's all-reduce over the pipeline); or, stopped between steps, MPI's
# diagnosis blaming rank 1.
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

# Rank 1 stops wherever it is: mostly inside a step's device work, where rank 0's device
# waits in a send, receive or the loss's all-reduce over the stages (the device's
# diagnosis); sometimes between steps, where rank 0 waits in MPI's agreement on the loss
# (the host's diagnosis, which must blame rank 1 too). Up to 3 tries to see the device's.
START_TRIES=600  # emulated steps are slow on a busy machine: up to a minute to the first step
device_seen=0
for try in 1 2 3; do
  name=sigstop-cuda-stage-1-try-$try
  if ! start_training "$name" 2 "$plan" --device cuda --timeout 10; then
    fail "$name: the ranks did not start training"
    sed 's/^/    /' "$tmp/$name.out" | head -20
    break
  fi
  pid=$(rank_pid 1 $ranks)
  t0=$(now_ms)
  kill -STOP "$pid"
  ends_within "$name" 60 "$t0" || break
  head='^\[rank 0, stage 0\] fsexec: timeout: step [0-9]+ did not finish within 10 s \(--timeout\): '
  device=$(grep -aE "${head}on the device, op [0-9]+ \((send|recv|all_reduce)\)( at mlp\.fsm:[0-9]+:[0-9]+)?, ((to|from) rank 1 \(stage 1\)|over the 2 stages at data-parallel index 0) did not complete \(NCCL.s communicators aborted\)" \
    "$tmp/$name.out" | head -1)
  host=$(grep -aE "${head}.* did not complete: .*rank 1 (has not run for|did not reach it|started it, then stopped|runs but waits in nothing)" \
    "$tmp/$name.out" | head -1)
  if [ -n "$device" ]; then
    ok "$name: $device"
    device_seen=1
    break
  fi
  [ -n "$host" ] && ok "$name (between steps): $host" ||
    { fail "$name: no diagnosis naming the hung call and rank 1"; grep -a timeout "$tmp/$name.out"; break; }
done
[ "$device_seen" = 1 ] || fail "no try stopped rank 1 inside a step's device work"
finish
