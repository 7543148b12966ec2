#!/bin/sh
# tests/fuzz/seed.sh FSC OUTDIR: writes small plans that fsc makes (every sample, every
# --shard, every --precision, with and without --recompute, world 1 and 2) into OUTDIR,
# as the seed corpus of fuzz_plan and the set of valid plans rt_plan_check_ops must pass.
# Tiny dims (V = 256: the built-in corpus has byte tokens) keep a step of each plan quick.
set -eu
fsc=$1
out=$2
mkdir -p "$out"
dims_gpt2="-D L=1 -D C=16 -D T=8 -D V=256 -D NH=2 -D B=2"
dims_llama="-D L=1 -D C=16 -D NH=2 -D F=32 -D T=8 -D V=256 -D B=2"
dims_mlp="-D B=8 -D D=4 -D H=8 -D K=3 -D L=1"
n=0
for model in gpt2 llama mlp; do
  eval dims=\$dims_$model
  for prec in fp32 bf16 fp16; do
    for rc in none all; do
      for shard in none ddp zero1 zero2 fsdp; do
        for world in 1 2; do
          [ "$shard" = none ] && [ "$world" = 2 ] && continue
          name="$model-$prec-$rc-$shard-w$world"
          # shellcheck disable=SC2086
          "$fsc" "$(dirname "$0")/../../samples/$model.fsm" $dims -q --precision "$prec" --recompute "$rc" \
            --shard "$shard" --world "$world" -o "$out/$name.plan"
          n=$((n + 1))
        done
      done
    done
  done
done
echo "seed.sh: $n plans in $out"
