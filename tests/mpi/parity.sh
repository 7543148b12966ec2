#!/usr/bin/env bash
# Any strategy, same training (DESIGN.md invariant 1): for mlp and a tiny GPT-2, every
# strategy (ddp, zero1, zero2, fsdp) at world 2, 3 (uneven, padded shards) and 4 trains
# 5 steps from the same init on the same global batches as the world-1 plan, and ends
# with the same consolidated params (fsexec --save-weights gathers the shards) and the
# same logged loss and gradient norm, to fp32 rounding. usage: parity.sh FSC FSEXEC SOURCE_DIR
source "$(dirname "$0")/lib.sh"
here=$(dirname "$0")

run_model() {
  local model=$1
  shift
  local src="$SRC/samples/$model.fsm"
  if ! "$FSC" "$src" "$@" -o "$tmp/$model.1.plan" >/dev/null 2>"$tmp/fsc.err" ||
    ! "$FSEXEC" "$tmp/$model.1.plan" --steps 5 --threads 1 --log "$tmp/ref.jsonl" \
      --save-weights "$tmp/ref.safetensors" 2>"$tmp/run.err"; then
    fail "$model world 1"
    cat "$tmp/fsc.err" "$tmp/run.err" | head -10
    return
  fi
  for world in 2 3 4; do
    for shard in ddp zero1 zero2 fsdp; do
      local name="$model-$shard-world-$world"
      if ! "$FSC" "$src" "$@" --world "$world" --shard "$shard" -o "$tmp/p.plan" >/dev/null 2>"$tmp/fsc.err"; then
        fail "$name: fsc"
        sed 's/^/    /' "$tmp/fsc.err" | head -10
        continue
      fi
      if ! timeout 120 "$FSEXEC" --nproc "$world" "$tmp/p.plan" --steps 5 --threads 1 --log "$tmp/run.jsonl" \
        --save-weights "$tmp/run.safetensors" >"$tmp/run.err" 2>&1; then
        fail "$name: fsexec"
        sed 's/^/    /' "$tmp/run.err" | head -10
        continue
      fi
      if out=$(python3 "$here/compare.py" "$tmp/ref.safetensors" "$tmp/ref.jsonl" "$tmp/run.safetensors" \
        "$tmp/run.jsonl"); then
        ok "$name: $out"
      else
        fail "$name:"
        sed 's/^/    /' <<<"$out"
      fi
    done
  done
}

run_model mlp -D B=48
run_model gpt2 "${GPT_DIMS[@]}"
finish
