#!/usr/bin/env bash
# Ranks started do not fit the plan, or cannot be started: a clear error on every rank,
# naming both numbers, and a non-zero exit; nothing hangs. usage: world_mismatch.sh FSC FSEXEC SOURCE_DIR
source "$(dirname "$0")/lib.sh"

# expect NAME WANT_RC WANT_SUBSTRING -- COMMAND...: rc (any non-zero for "nz") and output.
expect() {
  local name=$1 want_rc=$2 want=$3
  shift 4
  local out rc
  out=$(timeout 60 "$@" 2>&1)
  rc=$?
  if { [ "$want_rc" = nz ] && [ "$rc" -eq 0 ]; } || { [ "$want_rc" != nz ] && [ "$rc" -ne "$want_rc" ]; } ||
    [ "$rc" -eq 124 ] || ! grep -qF -- "$want" <<<"$out"; then
    fail "$name: rc=$rc (want $want_rc), output lacks '$want':"
    sed 's/^/    /' <<<"$out" | head -20
  else
    ok "$name"
  fi
}

"$FSC" "$SRC/samples/mlp.fsm" --world 2 --shard ddp -o "$tmp/w2.plan" >/dev/null 2>&1 || fail "fsc world 2"
"$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/w1.plan" >/dev/null 2>&1 || fail "fsc world 1"

# --nproc reads the plan first and starts nothing that cannot run it.
expect nproc-3-for-2 1 "plan compiled for world 2, but --nproc asks for 3 ranks; none started" \
  -- "$FSEXEC" --nproc 3 "$tmp/w2.plan" --steps 1
for r in 0 1 2; do
  expect "3-ranks-for-2-rank-$r" nz "[rank $r] fsexec: $tmp/w2.plan: plan compiled for world 2, but 3 ranks started" \
    -- mpirun -np 3 --oversubscribe "$FSEXEC" "$tmp/w2.plan" --steps 1
done
expect alone-for-2 1 "plan compiled for world 2, but 1 rank started (start 2: mpirun -np 2" \
  -- "$FSEXEC" "$tmp/w2.plan" --steps 1
expect nproc-2-for-1 1 "plan compiled for world 1, but --nproc asks for 2 ranks; none started" \
  -- "$FSEXEC" --nproc 2 "$tmp/w1.plan" --steps 1
for r in 0 1; do
  expect "2-ranks-for-1-rank-$r" nz "[rank $r] fsexec: $tmp/w1.plan: plan compiled for world 1, but 2 ranks started" \
    -- mpirun -np 2 --oversubscribe "$FSEXEC" "$tmp/w1.plan" --steps 1
done
expect torchrun-env 1 "(torchrun style), but fsexec's CPU ranks talk through MPI" \
  -- env RANK=1 WORLD_SIZE=2 MASTER_ADDR=localhost MASTER_PORT=29500 "$FSEXEC" "$tmp/w2.plan" --steps 1
expect torchrun-env-world-1 0 "step 1/1" \
  -- env RANK=0 WORLD_SIZE=1 "$FSEXEC" "$tmp/w1.plan" --steps 1
expect bad-rank-env 1 "OMPI_COMM_WORLD_RANK=5 is not below OMPI_COMM_WORLD_SIZE=2" \
  -- env OMPI_COMM_WORLD_RANK=5 OMPI_COMM_WORLD_SIZE=2 "$FSEXEC" "$tmp/w2.plan" --steps 1
expect no-mpirun 1 "cannot run $tmp/none/mpirun: No such file or directory" \
  -- env FSEXEC_MPIRUN="$tmp/none/mpirun" "$FSEXEC" --nproc 2 "$tmp/w2.plan" --steps 1
expect nproc-inside-a-rank 2 "--nproc starts ranks, but this process already is rank 0 of 2" \
  -- env OMPI_COMM_WORLD_RANK=0 OMPI_COMM_WORLD_SIZE=2 "$FSEXEC" --nproc 2 "$tmp/w2.plan"
expect save-grads-world-2 nz "--save-grads is supported for world 1 only" \
  -- "$FSEXEC" --nproc 2 "$tmp/w2.plan" --steps 1 --save-grads "$tmp/g.safetensors"
expect nproc-runs 0 "step 2/2" -- "$FSEXEC" --nproc 2 "$tmp/w2.plan" --steps 2
expect help-documents-nproc 0 "--nproc N" -- "$FSEXEC" --help
finish
