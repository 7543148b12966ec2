#!/usr/bin/env bash
# Command-line checks of fsc and fsexec as a user runs them: exit codes, the summary,
# error messages for bad flags and files, and a plan round trip through --inspect.
# usage: run.sh FSC FSEXEC SOURCE_DIR
set -uo pipefail
FSC=$1 FSEXEC=$2 SRC=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0

# expect NAME WANT_RC WANT_SUBSTRING -- COMMAND...: runs it, checks rc and output.
expect() {
  local name=$1 want_rc=$2 want=$3
  shift 4
  local out rc
  out=$("$@" 2>&1)
  rc=$?
  if [ "$rc" -ne "$want_rc" ] || ! grep -qF -- "$want" <<<"$out"; then
    echo "FAIL $name: rc=$rc (want $want_rc), output lacks '$want':"
    sed 's/^/    /' <<<"$out" | head -20
    failures=$((failures + 1))
  else
    echo "ok   $name"
  fi
}

expect help 0 "usage: fsc" -- "$FSC" --help
expect help-lists-settings 0 "--shard VALUE" -- "$FSC" --help
expect help-shows-defaults 0 "peak learning rate [0.001]" -- "$FSC" --help
expect help-shows-default-schedule 0 "the last decay_frac of the steps) [constant]" -- "$FSC" --help
expect version 0 "fsc 0.1.0" -- "$FSC" --version
expect version-short 0 "fsc 0.1.0 (plan format " -- "$FSC" -V
expect no-input 1 "no input file" -- "$FSC"
expect missing-file 1 "nope.fsm: cannot open: No such file or directory" -- "$FSC" "$tmp/nope.fsm"
expect directory 1 "is a directory; give a regular file" -- "$FSC" "$tmp"
# Every input of fsc is opened as fsexec's are: a FIFO is named, never waited on.
mkfifo "$tmp/fifo"
expect source-fifo 1 "fifo: is a FIFO (named pipe); give a regular file" -- timeout 10 "$FSC" "$tmp/fifo"
expect machine-fifo 1 "--machine $tmp/fifo: is a FIFO (named pipe); give a regular file" -- \
  timeout 10 "$FSC" "$SRC/samples/mlp.fsm" --fit 80GiB --world 8 --machine "$tmp/fifo"
# 250 chained elementwise ops: the fuse pass splits the run into groups of at most 64.
{
  echo "model chain { dim B = 4, D = 8; input x: f32[B, D]; input y: i32[B]; param w: [D] = ones; h = x * w;"
  for i in $(seq 125); do echo "  h = h * w; h = tanh(h);"; done
  echo "  loss = cross_entropy(h, y); }"
  echo "train { optimizer sgd(lr = 0.1); }"
} >"$tmp/chain.fsm"
expect fuse-250 0 "chain: 8 params" -- "$FSC" "$tmp/chain.fsm" -o "$tmp/chain.plan"
expect bad-flag 1 "unknown option '-x'" -- "$FSC" "$SRC/samples/mlp.fsm" -x
expect bad-define 1 "expected NAME=VALUE" -- "$FSC" "$SRC/samples/mlp.fsm" -D L
expect bad-define-value 1 "VALUE must be an integer" -- "$FSC" "$SRC/samples/mlp.fsm" -D L=two
expect unknown-dim 1 "did you mean 'L'" -- "$FSC" "$SRC/samples/mlp.fsm" -D LL=3
expect bad-setting 1 "did you mean 'fsdp'" -- "$FSC" "$SRC/samples/mlp.fsm" --shard fsdb
expect shard-group-summary 0 "shard fsdp in groups of 2, world 4" -- \
  "$FSC" "$SRC/samples/mlp.fsm" -D B=48 --shard fsdp --world 4 --shard-group 2
expect shard-group-divides 1 "shard_group 3 does not divide the 4 data-parallel ranks; valid values: 1, 2, 4" -- \
  "$FSC" "$SRC/samples/mlp.fsm" -D B=48 --shard fsdp --world 4 --shard-group 3
expect shard-group-of-a-stage 1 "shard_group 8 does not divide the 4 data-parallel ranks of a stage" -- \
  "$FSC" "$SRC/samples/mlp.fsm" -D B=48 --shard zero2 --world 8 --stages 2 --shard-group 8
expect shard-group-needs-sharding 1 "shard_group 2 needs a sharded strategy" -- \
  "$FSC" "$SRC/samples/mlp.fsm" -D B=48 --shard ddp --world 4 --shard_group 2
expect shard-group-in-help 0 "--shard_group VALUE" -- "$FSC" --help
expect unknown-setting 1 "did you mean 'shard'" -- "$FSC" "$SRC/samples/mlp.fsm" --shrd fsdp
expect bad-print-after 1 "no pass named 'dcee'; did you mean 'dce'" -- "$FSC" "$SRC/samples/mlp.fsm" --print-after dcee
expect bad-emit 1 "--emit: expected 'ir' or 'ir-json'" -- "$FSC" "$SRC/samples/mlp.fsm" --emit asm

# GPT-2 124M: the parameter count the issue pins down.
expect gpt2-params 0 "gpt2: 124,439,808 params" -- "$FSC" "$SRC/samples/gpt2.fsm"
expect gpt2-ir 0 "attention_qkv(" -- "$FSC" "$SRC/samples/gpt2.fsm" --emit ir -q
expect llama 0 "llama:" -- "$FSC" "$SRC/samples/llama.fsm"
# BERT-base with its masked-LM head: BertForMaskedLM's count (the decoder tied, its bias not).
expect bert-params 0 "bert: 109,514,298 params" -- "$FSC" "$SRC/samples/bert.fsm"
expect mlp-override 0 "shard fsdp, world 4" -- "$FSC" "$SRC/samples/mlp.fsm" --shard=zero3 --world 4
expect ir-json 0 '"model"' -- "$FSC" "$SRC/samples/mlp.fsm" --emit ir-json -q
expect print-after-lower 0 "matmul(" -- "$FSC" "$SRC/samples/mlp.fsm" --print-after lower -q

# A syntax error: file:line:col, the line and a caret; exit 1.
printf 'model m {\n  dim B = 4;\n  input x: f32[B, 8]\n  loss = sum(x);\n}\n' >"$tmp/bad.fsm"
expect syntax-error 1 "bad.fsm:3:21: error: expected ';'" -- "$FSC" "$tmp/bad.fsm"

# Plan: write, inspect, reject damage.
expect write-plan 0 "wrote $tmp/gpt2.plan" -- "$FSC" "$SRC/samples/gpt2.fsm" -D L=2 -D C=64 -D NH=4 -D T=32 -D V=256 -o "$tmp/gpt2.plan"
expect inspect 0 "gpt2" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"
expect fsc-given-plan 1 "$tmp/gpt2.plan is a plan compiled by fsc, not a model source; inspect it with fsexec --inspect $tmp/gpt2.plan" -- "$FSC" "$tmp/gpt2.plan"

# Memory reports: text, JSON, HTML page, --mem-limit with what-ifs, the same report in
# fsexec --inspect, and the guard.
GPT2_SMALL=(-D L=2 -D C=64 -D NH=4 -D T=32 -D V=256)
expect mem-text 0 "arena / peak" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --mem -q
expect mem-peak-op 0 "peak op        11: buffer (backward) mlp.fsm:15:9" -- "$FSC" "$SRC/samples/mlp.fsm" --mem -q
expect mem-json 0 '"arena_bytes":' -- "$FSC" "$SRC/samples/mlp.fsm" --mem=json -q
expect mem-html 0 "wrote $tmp/mem.html" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=html "$tmp/mem.html"
expect mem-html-svg 0 '<g class="col"><title>' -- cat "$tmp/mem.html"
expect mem-html-no-file 1 "--mem=html needs a file name" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=html
expect mem-bad-format 1 "expected --mem, --mem=text, --mem=json or --mem=html FILE" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=xml
expect mem-sharded 0 "ranks 0-3 (one program for all 4 data-parallel ranks)" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 4 --mem -q
expect mem-limit-ok 0 "within --mem-limit 1.0 MiB" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 1MiB
expect mem-limit-over 1 "over the limit of 6.00 GiB" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-batch 1 "half the batch (B 8 -> 4)" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-recompute 1 "--recompute Block" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-microbatches 1 "accumulate over 2 micro-batches of 4 rows" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-batch-changes 1 "half the batch (B 8 -> 4) (changes the training)" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-shard 1 "--shard fsdp --world 8" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 6GiB -q
expect mem-limit-unit 1 "unknown unit 'GX'" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 80GX
expect mem-limit-no-unit 1 "has no unit" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 80
expect inspect-mem 0 "saved for backward, by the block whose backward reads it" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"
expect inspect-source 0 "source        gpt2.fsm" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"
"$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --mem -q >"$tmp/mem.txt"
"$FSEXEC" --inspect "$tmp/gpt2.plan" | sed -n '/^memory plan:/,/^communication per step/p' | head -n -2 >"$tmp/inspect_mem.txt"
expect mem-same-in-inspect 0 "" -- diff "$tmp/mem.txt" "$tmp/inspect_mem.txt"
expect comm-fsdp 0 "reduce_scatter h.0.flat_grad_shard" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 4 --comm -q
expect comm-none 0 "none" -- "$FSC" "$SRC/samples/mlp.fsm" --comm -q
# What each collective serves, with units; one total, the payload (each block's 199,936 bytes
# gathered twice and reduced once, the 74,240 outside blocks gathered and reduced once, two
# 8-byte scalars), and a ring's 3/4 of it.
COMM=("$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 4 --comm -q)
expect comm-forward-gather 0 "all_gather     h.0.gathered                 forward gather" -- "${COMM[@]}"
expect comm-backward-gather 0 "all_gather     h.0.gathered                 backward gather" -- "${COMM[@]}"
expect comm-update-gather 0 "all_gather     h.0.gathered                 update gather" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard zero1 --world 2 --precision bf16 --comm -q
expect comm-grad-reduction 0 "reduce_scatter h.0.flat_grad_shard          grad reduction" -- "${COMM[@]}"
expect comm-units 0 "grad reduction          199,936   195.2 KiB   146.4 KiB" -- "${COMM[@]}"
expect comm-total 0 "payload 1,348,112 bytes (1.3 MiB) per rank and step; a ring algorithm sends 1,011,084 bytes (987.4 KiB) of it" -- "${COMM[@]}"
# fsdp's params outside blocks: kept gathered (the default), or gathered per use with
# --reshard_root 1, which makes model state ZeRO-3's 16 Psi / N (4.00 bytes/param at N = 4).
expect reshard-root-help 0 "--reshard_root VALUE" -- "$FSC" --help
expect reshard-root-state 0 "model state    4.00 bytes/param: 16-bit params 0.50 + 16-bit grads 0.50 + fp32 params 1.00" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D L=4 -D B=8 --shard fsdp --world 4 --precision bf16 --reshard_root 1 --mem -q
expect reshard-root-kept 0 "model state    4.13 bytes/param" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D L=4 -D B=8 --shard fsdp --world 4 --precision bf16 --mem -q
expect reshard-root-gathers 0 "backward gather" -- bash -c "\"$FSC\" \"$SRC/samples/gpt2.fsm\" ${GPT2_SMALL[*]} -D B=8 --shard fsdp --world 4 --reshard_root 1 --comm -q | grep 'gpt2.gathered'"
# Every category shows at world 1024 (2 bytes/param over 1024 ranks is 0.00195, not 0.00).
expect mem-digits 0 "16-bit grads 0.00195 + fp32 params 0.00391 + fp32 grads 0.00 + optimizer state 0.00781" -- "$FSC" "$SRC/samples/gpt2.fsm" -D L=128 -D C=25600 -D NH=160 -D B=1024 --world 1024 --shard fsdp --precision bf16 --mem -q
# No report names a buffer "(null)" (once seen as "(null).exp_avg"): every sharded strategy
# with mixed precision, offload and pipeline stages, as text and JSON.
nulls=0
for shard in fsdp zero1 zero2; do
  for extra in "--precision bf16" "--precision fp16 --offload optimizer" "--stages 2 --microbatches 2 --precision bf16"; do
    for how in --mem --mem=json; do
      # shellcheck disable=SC2086
      "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard $shard --world 4 $extra $how -q 2>&1 | grep -q "(null)" && nulls=$((nulls + 1))
      "$FSC" "$SRC/samples/llama.fsm" -D L=2 -D T=32 -D B=8 --shard $shard --world 4 $extra $how -q 2>&1 | grep -q "(null)" && nulls=$((nulls + 1))
    done
  done
done
expect mem-no-null-names 0 "0 reports name (null)" -- echo "$nulls reports name (null)"
# Names in reports are the source's: x in instance h.0 is h.0.x (reassigned: the line).
expect mem-names 0 "    h.0.x@26         f32[8, 32, 64]     64.0 KiB  other activations      add 26:39 h.0" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --mem -q
expect ir-names 0 "%108:h.1.x@26: f32[8, 32, 64] = matmul_bias_add(" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --emit ir -q
expect ir-names-last 0 ":h.1.x: f32[8, 32, 64] = matmul_bias_add(" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --emit ir -q
expect timeline 0 "makespan 3; ideal 3" -- "$FSC" "$SRC/samples/mlp.fsm" --timeline=unit -q
expect timeline-lane 0 "  stage 0   |F0" -- "$FSC" "$SRC/samples/mlp.fsm" --timeline -q
expect timeline-accumulate 0 "bubble 0.0% of the makespan" -- "$FSC" "$SRC/samples/mlp.fsm" --microbatches 4 --timeline=unit -q
expect timeline-bad 1 "--timeline: expected --timeline or --timeline=unit, got '--timeline=ms'" -- "$FSC" "$SRC/samples/mlp.fsm" --timeline=ms
# A pipeline's reports: 1F1B over 2 stages and 4 micro-batches takes (M + P - 1) x 3.
PIPE=("$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --stages 2 --microbatches 4 --world 2 -q)
expect pipe-timeline 0 "makespan 15; ideal 12 (the busiest stage's work alone); bubble 20.0% of the makespan" -- "$FSC" "${PIPE[@]}" --timeline=unit
expect pipe-timeline-bf16 0 "makespan 15; ideal 12" -- "$FSC" "${PIPE[@]}" --precision bf16 --timeline=unit
expect pipe-timeline-flops 0 "  stage 1   " -- "$FSC" "${PIPE[@]}" --timeline
expect pipe-mem 0 "memory plan: gpt2, stage 1 of 2 (rank 1), 1 data-parallel rank; bytes per rank" -- "$FSC" "${PIPE[@]}" --mem
expect pipe-mem-json 0 '"n_stages": 2' -- "$FSC" "${PIPE[@]}" --mem=json
expect pipe-mem-limit 1 "(stage 0 of 2 (rank 0), the largest of the 2 stages)" -- "$FSC" "${PIPE[@]}" --mem-limit 64KiB
expect pipe-comm 0 "point-to-point, by peer" -- "$FSC" "${PIPE[@]}" --comm
expect pipe-comm-group 0 "over the pipeline group (2 ranks, one per stage)" -- "$FSC" "${PIPE[@]}" --comm
expect pipe-plan 0 "" -- "$FSC" "${PIPE[@]}" -o "$tmp/pipe.plan"
expect pipe-inspect 0 "programs (2)" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
expect pipe-inspect-timeline 0 "timeline: gpt2, 2 stages, 4 micro-batches" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
# The HTML page's stage table: each stage's param count in its params column (stage 0:
# wte, wpe and one block: 16,384 + 2,048 + 49,984), not its ranks.
expect pipe-mem-html 0 "" -- "$FSC" "${PIPE[@]}" --mem=html "$tmp/pipe.html"
expect pipe-html-stage-params 0 '<td class="n">0 B</td><td class="n">68,416</td></tr>' -- cat "$tmp/pipe.html"
# A pipeline's --inspect: inputs, outputs and step roles under their stage, the cut fsc
# chose beside `balance auto`, each stage's arena.
expect pipe-inspect-inputs-staged 0 "  stage 1   targets    i32[8, 32]" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
expect pipe-inspect-outputs-staged 0 "  stage 1   loss       f32[]                           4 B  (loss)" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
expect pipe-inspect-roles-staged 0 "  stage 1   opt_step     opt_step" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
expect pipe-inspect-cut 0 "balance                1,1 blocks per stage (stage 0: h.0; stage 1: h.1), balance auto" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
# A shared instance (tests/golden/ok_shared_layers.fsm: u.0 and u.1 applied twice) keeps the
# blocks between its applications on one stage: auto cuts around them, and says when it cannot.
SHARED=("$SRC/tests/golden/ok_shared_layers.fsm" --recompute none --microbatches 4 -q)
expect shared-stages-auto 0 "" -- "$FSC" "${SHARED[@]}" --stages 2 --world 2
expect shared-stages-balance 1 "balance '2,1' puts blocks u.0 and u.1 on different stages, but shared instance u.0" \
  -- "$FSC" "${SHARED[@]}" --stages 2 --world 2 --balance 2,1
expect shared-stages-no-cut 1 "3 stages need 2 cuts between blocks, but the model has 1 where one may fall" \
  -- "$FSC" "${SHARED[@]}" --stages 3 --world 3
pipe_arenas=$("$FSC" "${PIPE[@]}" --mem | sed -n 's/^  [01]  *rank [01]  *[0-9]*  *\([0-9.]* [KMG]*i*B\) .*/\1/p' | paste -sd/ | sed 's|/| / |')
expect pipe-inspect-arenas 0 "device arena  ${pipe_arenas%% / *} (" -- "$FSEXEC" --inspect "$tmp/pipe.plan"
# One formatter of sizes: fsc --mem, fsexec's start line and --inspect write an arena of
# 13.7 MiB alike (the start line wrote 14 MiB for such sizes).
"$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=40 -q -o "$tmp/b40.plan"
b40=$("$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=40 --mem -q | sed -n 's/^  arena  *\([0-9.]* [KMG]iB\) (.*/\1/p')
expect arena-size-fsc 0 "fsc arena 13.7 MiB" -- echo "fsc arena $b40"
expect arena-size-start-line 0 "| arena $b40 |" -- "$FSEXEC" "$tmp/b40.plan" --steps 0
expect arena-size-inspect 0 "device arena  $b40 (14,327,616 bytes) per rank" -- "$FSEXEC" --inspect "$tmp/b40.plan"
expect reduce-dtype-mismatch 1 "reduce_dtype bf16 with precision fp16" -- "$FSC" "$SRC/samples/mlp.fsm" --precision fp16 --reduce_dtype bf16
expect precision-bf16 0 "precision bf16" -- "$FSC" "$SRC/samples/mlp.fsm" --precision bf16
expect pipeline-world 1 "world 1 does not split into 2 pipeline stages" -- "$FSC" "$SRC/samples/mlp.fsm" --stages 2
expect pipeline-interleaved-chunks 1 "each stage needs at least 2 model chunks (--chunks 2)" -- "$FSC" "$SRC/samples/mlp.fsm" --stages 2 --world 2 --microbatches 2 --schedule interleaved
expect pipeline-zb1-microbatches 1 "schedule zb1 with microbatches 1 < stages 2" -- "$FSC" "$SRC/samples/mlp.fsm" --stages 2 --world 2 --schedule zb1
expect accumulate 0 "wrote $tmp/mlp4.plan" -- "$FSC" "$SRC/samples/mlp.fsm" --microbatches 4 -o "$tmp/mlp4.plan"
expect accumulate-batch 1 "does not split evenly over 1 data-parallel rank x 5 micro-batches; make it a multiple of 5" -- "$FSC" "$SRC/samples/mlp.fsm" --microbatches 5
expect offload-params-needs-fsdp 1 "so it needs --shard fsdp" -- "$FSC" "$SRC/samples/mlp.fsm" --offload params
expect offload-comm 0 "device <-> host: " -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer --comm -q
expect offload-mem 0 "host state" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer --mem -q
# Offloading the optimizer is not fsdp's offload params; the fp32 params are on the host.
expect offload-mem-sentence 0 "the optimizer updates the fp32 params and its state on the host" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer --precision bf16 --mem -q
expect offload-mem-not-params 1 "" -- bash -c "\"$FSC\" \"$SRC/samples/mlp.fsm\" --offload optimizer --precision bf16 --mem -q | grep -q \"offload params\""
expect offload-mem-params-place 0 "bf16 on the device, " -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer --precision bf16 --mem -q
expect offload-mem-f32-on-host 0 "f32 on the host" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer --precision bf16 --mem -q
# --offload sends each block's gradient to the host as it is made: no point of its step holds
# them all, and --save-grads says so before any step (it wrote zeros once) and writes nothing.
"$FSC" "$SRC/samples/mlp.fsm" --offload optimizer -q -o "$tmp/offload.plan"
expect save-grads-offload 1 "--save-grads: this plan never holds all its gradients at once: its optimizer reads them" \
  -- "$FSEXEC" "$tmp/offload.plan" --steps 1 --save-grads "$tmp/offload-grads.st"
expect save-grads-offload-no-file 1 "" -- test -e "$tmp/offload-grads.st"
expect offload-typo 1 "did you mean 'optimizer'" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimiser
expect offload-plan 0 "wrote $tmp/mlp-off.plan" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer -o "$tmp/mlp-off.plan"
expect offload-run 0 "step 2/2" -- "$FSEXEC" "$tmp/mlp-off.plan" --steps 2 --debug-guard --debug-nan
expect sgd-plain 0 "wrote $tmp/mlp-sgd.plan" -- "$FSC" "$SRC/samples/mlp.fsm" --momentum 0 -o "$tmp/mlp-sgd.plan"
expect sgd-plain-run 0 "step 2/2" -- "$FSEXEC" "$tmp/mlp-sgd.plan" --steps 2
expect debug-guard 0 "step 2/2" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2 --debug-guard
head -c 100 "$tmp/gpt2.plan" >"$tmp/short.plan"
expect inspect-truncated 1 "truncated" -- "$FSEXEC" --inspect "$tmp/short.plan"
expect inspect-text 1 "bad magic" -- "$FSEXEC" --inspect "$SRC/samples/mlp.fsm"
expect inspect-missing 1 "No such file" -- "$FSEXEC" --inspect "$tmp/none.plan"
expect fsexec-help 0 "usage: fsexec" -- "$FSEXEC" --help
# fsexec's own typos get fsc's "did you mean"; fsc's settings and dims say they are fsc's.
expect fsexec-typo-steps 2 "unknown option '--step'; did you mean '--steps'?" -- "$FSEXEC" "$tmp/gpt2.plan" --step 3
expect fsexec-typo-ckpt 2 "unknown option '--checkpoint_dir'; did you mean '--checkpoint-dir'?" -- "$FSEXEC" "$tmp/gpt2.plan" --checkpoint_dir d
expect fsexec-typo-eq 2 "unknown option '--save-weight=w.st'; did you mean '--save-weights'?" -- "$FSEXEC" "$tmp/gpt2.plan" --save-weight=w.st
expect fsexec-typo-switch 2 "did you mean '--debug-guard'?" -- "$FSEXEC" "$tmp/gpt2.plan" --debug-gaurd
expect fsexec-fsc-setting 2 "fsexec: --shard is a training setting, compiled into the plan by fsc: recompile the model with fsc MODEL.fsm --shard VALUE" -- "$FSEXEC" "$tmp/gpt2.plan" --shard fsdp
expect fsexec-fsc-setting-dashes 2 "--shard-group is a training setting" -- "$FSEXEC" "$tmp/gpt2.plan" --shard-group=2
expect fsexec-fsc-dim 2 "-D L=3 sets a model dim, compiled into the plan by fsc" -- "$FSEXEC" "$tmp/gpt2.plan" "-D L=3"
expect fsexec-unknown-far 2 "unknown option '--zzzzzz' (see fsexec --help)" -- "$FSEXEC" "$tmp/gpt2.plan" --zzzzzz
# --val-data evaluates pipelines through their stages (tests/mpi/evaluation.py); the help says so.
expect fsexec-help-val-data-pipelines 0 "Pipelines evaluate" -- "$FSEXEC" --help
expect fsexec-help-val-data-not-refused 1 "" -- bash -c "\"$FSEXEC\" --help | grep -q 'Not for pipelines'"
expect write-unwritable 1 "fsc: error:" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/no/such/dir/x.plan"

# An input fsexec cannot feed from --data (ops/feed.c's rule): fsc warns at its declaration
# (the plan is still written), and fsexec refuses it for the same reason. A third input
# it can feed trains from its .npy file like the other two (--data repeated).
printf 'model m {\n  dim B = 4;\n  input x: f32[B, 8];\n  input y: i32[B];\n  input z: f32[];\n  param w: [8, 3] = normal(0.1);\n  loss = cross_entropy(x @ w, y) + z;\n}\n' >"$tmp/scalar.fsm"
expect unfed-warning 0 "scalar.fsm:5:9: warning: fsexec cannot feed input 'z' from --data: a scalar input has no batch dim" -- "$FSC" "$tmp/scalar.fsm" -o "$tmp/scalar.plan"
expect unfed-caret 0 "$(printf '   input z: f32[];\n         ^')" -- "$FSC" "$tmp/scalar.fsm" -o "$tmp/scalar.plan"
expect unfed-fsexec 1 "fsexec: input 'z': a scalar input has no batch dim" -- "$FSEXEC" "$tmp/scalar.plan" --steps 1
printf 'model m {\n  dim B = 4;\n  input x: f32[B, 8];\n  input y: i32[B];\n  input z: f32[B];\n  param w: [8, 3] = normal(0.1);\n  loss = cross_entropy(x @ w, y) + mean(z);\n}\n' >"$tmp/three.fsm"
expect third-input-no-warning 0 "" -- bash -c "! \"$FSC\" \"$tmp/three.fsm\" -o \"$tmp/three.plan\" 2>&1 | grep -q warning"
/usr/bin/python3 -c "import numpy as n; n.save('$tmp/x.npy', n.ones((6, 8))); n.save('$tmp/y.npy', n.arange(6) % 3); n.save('$tmp/z.npy', n.zeros(6))"
expect third-input-trains 0 "data: x=$tmp/x.npy, y=$tmp/y.npy, z=$tmp/z.npy (6 samples)" -- "$FSEXEC" "$tmp/three.plan" --steps 1 --data "x=$tmp/x.npy" --data "y=$tmp/y.npy,z=$tmp/z.npy"
expect third-input-missing 1 "fsexec: --data: no file for input 'z'; give every input one, as in --data x=x.npy,y=y.npy,z=z.npy" -- "$FSEXEC" "$tmp/three.plan" --steps 1 --data "x=$tmp/x.npy,y=$tmp/y.npy"
mkdir -p "$tmp/inputs" && cp "$tmp/x.npy" "$tmp/y.npy" "$tmp/z.npy" "$tmp/inputs/"
expect data-directory 0 "data: x=$tmp/inputs/x.npy, y=$tmp/inputs/y.npy, z=$tmp/inputs/z.npy (6 samples)" -- "$FSEXEC" "$tmp/three.plan" --steps 1 --data "$tmp/inputs"
rm "$tmp/inputs/z.npy"
expect data-directory-missing 1 "--data $tmp/inputs: no file z.npy for input 'z'" -- "$FSEXEC" "$tmp/three.plan" --steps 1 --data "$tmp/inputs"
expect fed-no-warning 0 "" -- bash -c "! \"$FSC\" \"$SRC/samples/mlp.fsm\" -q 2>&1 | grep -q warning"
# A regressor (f32 targets) trains from .npy files, not from a token file.
printf 'model r {\n  dim B = 4;\n  input x: f32[B, 8];\n  input t: f32[B, 2];\n  param w: [8, 2] = normal(0.1);\n  d = x @ w - t;\n  loss = mean(mean(d * d));\n}\n' >"$tmp/reg.fsm"
expect regressor-plan 0 "" -- "$FSC" "$tmp/reg.fsm" -q -o "$tmp/reg.plan"
expect regressor-no-npy 1 "Give each input a .npy file: --data NAME=FILE.npy,NAME=FILE.npy" -- "$FSEXEC" "$tmp/reg.plan" --steps 1

# The HTML page: the peak's own bar (8 px, whatever a column's width), the legend of the
# phase band and the communication ticks, the zoom script, another plan overlaid.
HTML=("$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 2 -q)
"${HTML[@]}" --recompute Block -o "$tmp/recompute.plan"
"${HTML[@]}" --mem=html "$tmp/page.html" --compare "$tmp/recompute.plan"
expect html-peak-bar 0 'width="8"' -- grep -o '<g class="peakbar"><rect class="c-[a-z0-9]*" x="[0-9.]*" y="[0-9.]*" width="8"' "$tmp/page.html"
expect html-phase-legend 0 '<span>phases (the band under the axis):</span><span><i class="sw" style="background:#dbe3ec"></i>forward</span>' -- cat "$tmp/page.html"
expect html-tick-legend 0 '<i class="tick"></i>a communication op' -- cat "$tmp/page.html"
expect html-compare-series 0 '<path class="compare" d="M84.0 ' -- cat "$tmp/page.html"
expect html-compare-legend 0 "compared: <code>$tmp/recompute.plan" -- cat "$tmp/page.html"
expect html-zoom 0 "addEventListener('dblclick'" -- cat "$tmp/page.html"
expect html-peak-colour 0 '.peak{stroke:#6a3d9a' -- cat "$tmp/page.html"
expect html-compare-needs-html 1 "--compare $tmp/recompute.plan overlays a plan on the HTML page: give --mem=html FILE too" -- "${HTML[@]}" --mem --compare "$tmp/recompute.plan"
expect html-compare-bad 1 "fsc: error: --compare $SRC/samples/mlp.fsm: " -- "${HTML[@]}" --mem=html "$tmp/page2.html" --compare "$SRC/samples/mlp.fsm"
if command -v chromium >/dev/null || command -v chromium-browser >/dev/null || command -v google-chrome >/dev/null; then
  expect html-screenshot 0 "wrote $tmp/page.png" -- "$SRC/scripts/mem_screenshot.sh" "$FSC" "$tmp/page.png" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --compare "$tmp/recompute.plan"
fi

# Training from the command line.
expect mlp-plan 0 "wrote $tmp/mlp.plan" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/mlp.plan"
expect train-mlp 0 "acc" -- "$FSEXEC" "$tmp/mlp.plan" --steps 3
expect train-gpt2 0 "step 2/2" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2 --log "$tmp/log.jsonl"
# The lr schedule's length (fsc --steps) against the run's (fsexec --steps): a note, once.
expect lr-schedule-cut-short 0 "note: the learning-rate schedule runs to step 1000 (fsc --steps); this run stops at step 2, before it ends" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2
"$FSC" "$SRC/samples/gpt2.fsm" -D L=1 -D C=32 -D NH=2 -D T=16 -D V=256 --steps 2 -q -o "$tmp/gpt2-s2.plan"
expect lr-schedule-ended 0 "the schedule ended at step 2: the rest runs at min_lr" -- "$FSEXEC" "$tmp/gpt2-s2.plan" --steps 3
expect lr-schedule-same 0 "step 2/2" -- bash -c '! "$1" "$2" --steps 2 2>&1 | grep -q "learning-rate schedule" && "$1" "$2" --steps 2 2>&1' _ "$FSEXEC" "$tmp/gpt2-s2.plan"
expect log-lines 0 '"step": 2' -- cat "$tmp/log.jsonl"
# cross_entropy's ignore_index: a batch whose labels are all ignored has loss 0 and gradient 0
# (PyTorch's 0/0 is NaN; ops/ops.h), so training goes on past it (step 11 of this seed's blobs).
printf 'model m {\n  dim B = 2, K = 2;\n  input x: f32[B, 8];\n  input y: i32[B];\n  param w: [8, K] = normal(0.1);\n  logits = x @ w;\n  loss = cross_entropy(logits, y, ignore_index = 0);\n  output logits;\n}\n' >"$tmp/ignored.fsm"
"$FSC" "$tmp/ignored.fsm" -q -o "$tmp/ignored.plan"
"$FSEXEC" "$tmp/ignored.plan" --steps 40 --log "$tmp/ignored.jsonl" >/dev/null 2>&1
expect all-ignored-batch 0 '{"step": 11, "loss": 0, "lr": 0.00100000005, "grad_norm": 0,' -- cat "$tmp/ignored.jsonl"
expect all-ignored-batch-goes-on 0 '{"step": 40, ' -- cat "$tmp/ignored.jsonl"
expect export-weights 0 "0 steps" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 0 --save-weights "$tmp/w.safetensors"
expect import-weights 0 "step 1/1" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --load-weights "$tmp/w.safetensors"
expect import-wrong-model 1 "no tensor 'w_in', which the model has" -- "$FSEXEC" "$tmp/mlp.plan" --steps 1 --load-weights "$tmp/w.safetensors"
expect import-missing 1 "none.safetensors: cannot open: No such file or directory" -- "$FSEXEC" "$tmp/gpt2.plan" --load-weights "$tmp/none.safetensors"
expect bad-data-order 2 "expected 'random' or 'sequential', got 'foo'" -- "$FSEXEC" "$tmp/gpt2.plan" --data-order foo
printf 'abc' >"$tmp/odd.bin"
expect odd-data-file 1 "not a token file" -- "$FSEXEC" "$tmp/gpt2.plan" --data "$tmp/odd.bin"
expect world-2-no-strategy 1 "world 2 needs a data-parallel strategy" -- "$FSC" "$SRC/samples/mlp.fsm" --world 2
expect world-2 0 "wrote" -- "$FSC" "$SRC/samples/mlp.fsm" --world 2 --shard ddp -o "$tmp/w2.plan"

# Devices. --device auto runs on the CPU when there is no GPU and says why; --device cuda
# is then an error naming what is missing. The backend (libfs_cuda.so next to fsexec,
# when the build found CUDA) is only ever loaded for auto and cuda.
expect device-auto 0 "| device: cpu" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1
expect device-cpu 0 "| device: cpu |" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --device cpu
expect device-bad 2 "--device: expected 'auto', 'cpu' or 'cuda', got 'gpu'" -- "$FSEXEC" "$tmp/gpt2.plan" --device gpu
expect cuda-graph-on-cpu 2 "--cuda-graph needs a CUDA device" -- "$FSEXEC" "$tmp/gpt2.plan" --device cpu --cuda-graph
expect tf32-on-cpu 2 "--tf32 needs a CUDA device" -- "$FSEXEC" "$tmp/gpt2.plan" --device=cpu --tf32
# fsexec --tf32 only repeats a plan's tf32 setting: on a plan compiled without it, an error before any device
expect tf32-plan-without 2 "--tf32: $tmp/gpt2.plan was compiled with tf32 0, so its attention kernels compute in f32; \
compile it with --tf32 1" -- "$FSEXEC" "$tmp/gpt2.plan" --tf32
expect tf32-setting-bad 1 "tf32: 2 is out of range [0, 1]" -- "$FSC" "$SRC/samples/gpt2.fsm" --tf32 2
expect debug-nan-on-cuda 2 "--debug-nan checks the CPU backend's buffers" -- "$FSEXEC" "$tmp/gpt2.plan" --device cuda --debug-nan
expect device-backend-missing 1 "--device cuda: no CUDA backend: $tmp/none.so" -- env FS_CUDA_BACKEND="$tmp/none.so" "$FSEXEC" "$tmp/gpt2.plan" --device cuda
expect device-auto-backend-missing 0 "device: cpu (this build has no CUDA backend)" -- env FS_CUDA_BACKEND="$tmp/none.so" "$FSEXEC" "$tmp/gpt2.plan" --steps 1
BUILD=$(dirname "$FSEXEC")
if [ -f "$BUILD/libfs_cuda.so" ]; then
  if ! ldconfig -p 2>/dev/null | grep -q 'libcuda\.so\.1 ' && [ -z "${LD_LIBRARY_PATH:-}" ]; then  # no driver here
    expect device-cuda-no-driver 1 "--device cuda: no CUDA GPU: libcuda.so.1: cannot open shared object file" -- "$FSEXEC" "$tmp/gpt2.plan" --device cuda
    expect device-auto-no-driver 0 "device: cpu (no CUDA driver)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1
    expect op-check-no-driver 2 "op_check: no CUDA GPU: libcuda.so.1" -- "$BUILD/op_check" "$tmp/gpt2.plan"
  fi
  # The toolkit's stub libcuda.so found as the driver: cuInit fails, and says so.
  STUB=${CUDA_HOME:-/usr/local/cuda}/lib64/stubs/libcuda.so
  if [ -f "$STUB" ]; then
    mkdir -p "$tmp/stub" && ln -sf "$STUB" "$tmp/stub/libcuda.so.1"
    expect device-cuda-stub 1 "no CUDA GPU: cuInit: CUDA error 34 (the toolkit's stub libcuda.so was loaded" -- env LD_LIBRARY_PATH="$tmp/stub" "$FSEXEC" "$tmp/gpt2.plan" --device cuda
    expect device-auto-stub 0 "device: cpu (no CUDA driver)" -- env LD_LIBRARY_PATH="$tmp/stub" "$FSEXEC" "$tmp/gpt2.plan" --steps 1
  fi
fi

# outputs: special files, leftovers, late failures. Only a regular file is ever replaced:
# a device or a FIFO is written into, a directory refused. A write removes the temporary
# files a killed writer left, never a live one's. Outputs and --nproc are checked before
# any work starts; a failed write to stdout is an error.
# replay FILE RC: what one run printed, and its status, for several checks of that run.
replay() { cat "$1"; return "$2"; }
restore_dev_null() {  # as root, a regression would have replaced /dev/null: put it back
  if [ ! -c /dev/null ] && [ "$(id -u)" -eq 0 ]; then rm -f /dev/null && mknod -m 666 /dev/null c 1 3; fi
}
expect out-dev-null 0 "wrote /dev/null" -- "$FSC" "$SRC/samples/mlp.fsm" -o /dev/null
expect out-dev-null-stays-device 0 "" -- test -c /dev/null
restore_dev_null
expect save-weights-dev-null 0 "0 steps" -- "$FSEXEC" "$tmp/mlp.plan" --steps 0 --save-weights /dev/null
expect save-weights-dev-null-stays-device 0 "" -- test -c /dev/null
restore_dev_null
mkfifo "$tmp/fifo"
# The reader end is open before fsc starts (a background cat might not have opened it
# yet, and fsc refuses a FIFO with no reader); head reads the plan's size from it.
exec 3<>"$tmp/fifo"
timeout 60 head -c "$(stat -c %s "$tmp/mlp.plan")" <&3 >"$tmp/fifo.out" &
reader=$!
expect out-fifo 0 "wrote $tmp/fifo" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/fifo"
wait "$reader"
exec 3<&-
expect out-fifo-bytes 0 "" -- cmp "$tmp/fifo.out" "$tmp/mlp.plan"
expect out-fifo-stays-fifo 0 "" -- test -p "$tmp/fifo"
expect out-fifo-no-reader 1 "fsc: error: $tmp/fifo: is a FIFO (named pipe) with no reader" -- timeout 60 "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/fifo" -q
: >"$tmp/target.plan"
ln -s target.plan "$tmp/link.plan"
expect out-symlink 0 "wrote $tmp/link.plan" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/link.plan"
expect out-symlink-stays-link 0 "" -- test -L "$tmp/link.plan"
expect out-symlink-target-written 0 "" -- cmp "$tmp/target.plan" "$tmp/mlp.plan"
mkdir "$tmp/outdir"
timeout 120 "$FSEXEC" "$tmp/mlp.plan" --steps 1000000 --save-weights "$tmp/outdir" >"$tmp/run.log" 2>&1
expect save-weights-dir 1 "fsexec: --save-weights $tmp/outdir: is a directory; give a file name" -- replay "$tmp/run.log" $?
expect save-weights-dir-before-training 1 "" -- grep -qE "device:|step " "$tmp/run.log"
timeout 120 "$FSEXEC" "$tmp/mlp.plan" --steps 1000000 --log "$tmp/outdir" >"$tmp/run.log" 2>&1
expect log-dir 1 "fsexec: --log $tmp/outdir: is a directory; give a file name" -- replay "$tmp/run.log" $?
expect log-dir-before-training 1 "" -- grep -qE "device:|step " "$tmp/run.log"
"$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/outdir" >"$tmp/run.log" 2>&1
expect out-dir 1 "fsc: error: -o $tmp/outdir: is a directory; give a file name" -- replay "$tmp/run.log" $?
expect out-dir-before-compiling 1 "" -- grep -q "params" "$tmp/run.log"
expect mem-html-dir 1 "fsc: error: --mem=html $tmp/outdir: is a directory; give a file name" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=html "$tmp/outdir"
expect emit-cuda-no-parent 1 "fsc: error: --emit cuda $tmp/none/cuda: cannot write in $tmp/none: No such file or directory" -- "$FSC" "$SRC/samples/mlp.fsm" --emit cuda "$tmp/none/cuda"
dead=$(bash -c 'echo $$')  # a process that has ended
: >"$tmp/stale.safetensors.tmp.$dead.0"
: >"$tmp/stale.safetensors.tmp.$$.0"
expect stale-save 0 "0 steps" -- "$FSEXEC" "$tmp/mlp.plan" --steps 0 --save-weights "$tmp/stale.safetensors"
expect stale-temp-removed 1 "" -- test -e "$tmp/stale.safetensors.tmp.$dead.0"
expect live-temp-kept 0 "" -- test -e "$tmp/stale.safetensors.tmp.$$.0"
printf '#!/bin/sh\ntouch "%s"\n' "$tmp/mpirun-ran" >"$tmp/fake-mpirun"
chmod +x "$tmp/fake-mpirun"
expect nproc-world-mismatch 1 "fsexec: $tmp/mlp.plan: plan compiled for world 1, but --nproc asks for 1000 ranks; none started" -- env FSEXEC_MPIRUN="$tmp/fake-mpirun" "$FSEXEC" --nproc 1000 "$tmp/mlp.plan" --steps 1
expect nproc-world-mismatch-starts-nothing 1 "" -- test -e "$tmp/mpirun-ran"
expect nproc-world-match-starts 0 "" -- env FSEXEC_MPIRUN="$tmp/fake-mpirun" "$FSEXEC" --nproc 2 "$tmp/w2.plan" --steps 1
expect nproc-world-match-started 0 "" -- test -e "$tmp/mpirun-ran"
if [ -c /dev/full ]; then
  full() { "$@" >/dev/full; }
  for tool in fsc fsexec; do
    bin=$FSC && [ $tool = fsexec ] && bin=$FSEXEC
    expect "$tool-help-full" 1 "$tool: error writing to standard output: No space left on device" -- full "$bin" --help
    expect "$tool-version-full" 1 "$tool: error writing to standard output: No space left on device" -- full "$bin" --version
  done
  expect emit-ir-full 1 "fsc: error writing to standard output: No space left on device" -- full "$FSC" "$SRC/samples/gpt2.fsm" --emit ir -q
  expect mem-full 1 "fsc: error writing to standard output: No space left on device" -- full "$FSC" "$SRC/samples/mlp.fsm" --mem -q
  expect inspect-full 1 "fsexec: error writing to standard output: No space left on device" -- full "$FSEXEC" --inspect "$tmp/mlp.plan"
fi

# token files and loaded weights: a file that is not plainly llm.c's is raw uint16 only
# when told (--data-format raw) or when it can be nothing else; a damaged llm.c header, a
# .npy file and a text say what they are. Tokens outside the vocab are named by file,
# position and value; NaN or Inf in loaded weights by tensor and element, at load.
# le32 N: N as 4 little-endian bytes (printf escapes).
le32() { printf '\\x%02x\\x%02x\\x%02x\\x%02x' $(($1 & 255)) $(($1 >> 8 & 255)) $(($1 >> 16 & 255)) $(($1 >> 24 & 255)); }
# tokens_file PATH MAGIC [TOKEN5]: an llm.c file of 200 tokens (i mod 200, token 5 replaced).
tokens_file() {
  {
    printf "$(le32 "$2")$(le32 1)$(le32 200)"
    head -c 1012 /dev/zero
    for i in $(seq 0 199); do
      v=$i; [ "$i" -eq 5 ] && [ -n "${3:-}" ] && v=$3
      printf "$(le32 "$v" | cut -c1-8)"
    done
  } >"$1"
}
tokens_file "$tmp/llmc.bin" 20240520
tokens_file "$tmp/magic0.bin" 0
tokens_file "$tmp/flip.bin" $((20240520 ^ 1))
tokens_file "$tmp/oor.bin" 20240520 8227
npy_dict="{'descr': '<u2', 'fortran_order': False, 'shape': (200,), }"
{ printf '\x93NUMPY\x01\x00\x76\x00'; printf '%-117s\n' "$npy_dict"; tail -c 400 "$tmp/llmc.bin"; } >"$tmp/tokens.npy"
expect data-llmc 0 "llmc.bin (200 tokens, llm.c format)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/llmc.bin"
expect data-llmc-flag 0 "step 1/1" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/llmc.bin" --data-format llmc
expect data-magic-0 1 "magic0.bin: looks like an llm.c token file with a damaged header: its magic is 0, not 20240520; its version is 1; its count, 200 tokens, fits the file's size" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/magic0.bin"
expect data-magic-0-says-raw 1 "if it really holds raw uint16 tokens, pass --data-format raw" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/magic0.bin"
expect data-magic-0-raw 0 "magic0.bin (712 tokens, raw uint16)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/magic0.bin" --data-format raw
expect data-magic-flip 1 "flip.bin: looks like an llm.c token file with a damaged header: its magic is 20240521, not 20240520 (1 bit differs)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/flip.bin"
expect data-magic-flip-raw 1 "flip.bin: token 0 is 55433, outside the model's vocab of 256 (V): byte offset 0 of the file" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/flip.bin" --data-format=raw
expect data-npy 1 "tokens.npy: a NumPy .npy file (dtype '<u2', shape (200,)), not a token file: convert it with np.asarray(np.load(path), np.uint16).tofile(" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/tokens.npy"
expect data-text 1 "README.md: a text file (it starts \"# fsc / fsexec\"), not a token file: tokenize it first" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$SRC/README.md"
expect data-text-corpus 1 "or drop --data to train on the built-in byte-level corpus" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$SRC/README.md"
expect data-text-script 1 "tokenize it first, with scripts/tokenize.py in.txt out.bin" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$SRC/README.md"
tail -c 400 "$tmp/llmc.bin" >"$tmp/raw.bin"
expect data-raw-auto 0 "raw.bin (200 tokens, raw uint16)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/raw.bin"
expect data-raw-as-llmc 1 "raw.bin: not an llm.c token file (--data-format llmc)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/raw.bin" --data-format llmc
expect data-out-of-range 1 "oor.bin: token 5 is 8227, outside the model's vocab of 256 (V): byte offset 1034 of the file" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data "$tmp/oor.bin"
expect data-format-bad 2 "--data-format: expected 'auto', 'llmc' or 'raw', got 'npy'" -- "$FSEXEC" "$tmp/gpt2.plan" --data "$tmp/llmc.bin" --data-format npy
expect data-format-help 0 "--data-format FMT" -- "$FSEXEC" --help
# patch_f32 FILE TENSOR INDEX BYTES: overwrite one f32 of a tensor in a safetensors file.
patch_f32() {
  local hlen begin
  hlen=$(od -An -tu8 -N8 "$1" | tr -d ' ')
  begin=$(head -c $((8 + hlen)) "$1" | grep -ao "\"$2\":{[^}]*}" | sed 's/.*"data_offsets":\[\([0-9]*\),.*/\1/')
  printf "$4" | dd of="$1" bs=1 seek=$((8 + hlen + begin + 4 * $3)) conv=notrunc status=none
}
"$FSEXEC" "$tmp/gpt2.plan" --steps 0 --save-weights "$tmp/good.st" >/dev/null 2>&1
cp "$tmp/good.st" "$tmp/nan.st" && patch_f32 "$tmp/nan.st" h.0.attn.w 1234 '\x01\x00\xc0\x7f'
cp "$tmp/good.st" "$tmp/inf.st" && patch_f32 "$tmp/inf.st" wte 100 '\x00\x00\x80\xff'
expect weights-good 0 "0 steps" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 0 --load-weights "$tmp/good.st"
expect weights-nan 1 "nan.st: tensor 'h.0.attn.w' has NaN at index 1234 (row 6, column 82); the weights are damaged" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 0 --load-weights "$tmp/nan.st" --save-weights "$tmp/out.st"
expect weights-nan-saves-nothing 1 "" -- test -e "$tmp/out.st"
expect weights-inf 1 "inf.st: tensor 'wte' has -Inf at index 100 (row 1, column 36)" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2 --load-weights "$tmp/inf.st"

# inputs that are not regular files: each is named for what it is, at once (a FIFO with
# no writer used to block in open() for ever; the timeout is only a guard).
mkfifo "$tmp/in.fifo"
for what in plan inspect data load-weights; do
  case $what in
    plan) args=("$tmp/in.fifo") ;;
    inspect) args=(--inspect "$tmp/in.fifo") ;;
    data) args=("$tmp/gpt2.plan" --steps 1 --data "$tmp/in.fifo") ;;
    load-weights) args=("$tmp/gpt2.plan" --steps 1 --load-weights "$tmp/in.fifo") ;;
  esac
  expect "input-fifo-$what" 1 "$tmp/in.fifo: is a FIFO (named pipe); give a regular file" -- timeout 60 "$FSEXEC" "${args[@]}"
done
expect input-device 1 "/dev/zero: is a character device; give a regular file" -- timeout 60 "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --data /dev/zero
expect input-directory 1 "$tmp: is a directory; give a regular file" -- timeout 60 "$FSEXEC" --inspect "$tmp"

# fsc --fit: the search's errors, its report, and the plan it writes: the plan of the
# command line it prints (bit for bit), the same bytes every run, and the arena --mem
# prints for those settings.
FIT=("$SRC/samples/gpt2.fsm" -D L=2 -D C=32 -D NH=2 -D T=16 -D V=64 -D B=4 --world 2)
expect fit-help 0 "--fit SIZE" -- "$FSC" --help
expect fit-needs-world 1 "--fit needs --world W" -- "$FSC" "$SRC/samples/gpt2.fsm" --fit 80GiB
expect fit-bad-size 1 "--fit: 'lots' is not a size" -- "$FSC" "${FIT[@]}" --fit lots
expect fit-no-unit 1 "--fit: '80' has no unit" -- "$FSC" "${FIT[@]}" --fit 80
expect fit-no-size 1 "--fit needs a size per rank" -- "$FSC" "${FIT[@]}" --fit
expect fit-machine-without-fit 1 "--machine describes the machine of --fit" -- "$FSC" "${FIT[@]}" --machine m.json
expect fit-bad-gpus 1 "--gpus-per-node: expected an integer from 1 to 1024, got 'eight'" -- "$FSC" "${FIT[@]}" --fit 1GiB --gpus-per-node eight
expect fit-machine-missing 1 "--machine $tmp/none.json: " -- "$FSC" "${FIT[@]}" --fit 1GiB --machine "$tmp/none.json"
printf '{"gpus_per_node": 8, "flops_fp32": 1e13,' > "$tmp/bad.json"
expect fit-machine-bad-json 1 "--machine $tmp/bad.json: line 1" -- "$FSC" "${FIT[@]}" --fit 1GiB --machine "$tmp/bad.json"
printf '{"gpus_per_node": 8, "flops": 1e13}' > "$tmp/key.json"
expect fit-machine-unknown-key 1 "--machine $tmp/key.json: flops: unknown key" -- "$FSC" "${FIT[@]}" --fit 1GiB --machine "$tmp/key.json"
printf '{"gpus_per_node": 8}' > "$tmp/few.json"
expect fit-machine-missing-key 1 "--machine $tmp/few.json: flops_fp32: missing" -- "$FSC" "${FIT[@]}" --fit 1GiB --machine "$tmp/few.json"
# fsc --kernels: each launch's cost on the machine's GPU (h100, h200, or a machine file).
TINY=("$SRC/samples/gpt2.fsm" -D L=2 -D C=64 -D NH=4 -D T=32 -D V=256 -q)
expect kernels-text 0 "step: 76 instructions (" -- "$FSC" "${TINY[@]}" --precision bf16 --kernels
expect kernels-kinds 0 "by op kind (the longest first):" -- "$FSC" "${TINY[@]}" --kernels
expect kernels-h100 0 "on H100-SXM-8: 989 TFLOP/s bf16/fp16 tensor cores, 67 TFLOP/s fp32, 3350 GB/s HBM" -- \
  "$FSC" "${TINY[@]}" --kernels=text
expect kernels-h200 0 "on H200-SXM-8: 989 TFLOP/s bf16/fp16 tensor cores, 67 TFLOP/s fp32, 4800 GB/s HBM" -- \
  "$FSC" "${TINY[@]}" --kernels --machine H200
# a tf32 plan's attention kernels and f32 GEMMs priced at the TF32 rate (the H200's: 495 TFLOP/s dense)
expect kernels-tf32 0 '"flops_tf32": 495000000000000' -- "$FSC" "${TINY[@]}" --kernels=json --machine H200 --tf32 1
printf '{"name": "slow", "gpus_per_node": 4, "flops_fp32": 1e13, "flops_16bit": 1e14, "hbm_bw": 1e12, "nvlink_bw": 1e11,
 "ib_bw": 1e10, "pcie_bw": 1e10, "host_flops": 1e11, "host_bw": 1e10, "collective_latency": 1e-5}' > "$tmp/slow.json"
expect kernels-machine-file 0 '"hbm_bw": 1000000000000' -- "$FSC" "${TINY[@]}" --kernels=json --machine "$tmp/slow.json"
expect kernels-json 0 '"n_instructions": 76' -- "$FSC" "${TINY[@]}" --precision bf16 --kernels=json
# GEMMs that are not 16-byte aligned (cuBLAS's fast tensor-core kernels need it): tiny GPT-2's are all aligned;
# mlp's 4-class head in bf16 has rows of 8 bytes (in fp32, 16); GPT-2 at C = 100 has rows of 200 bytes.
expect kernels-aligned 0 "GEMMs: all 27 have leading dimensions, batch strides and offsets that are multiples" \
  -- "$FSC" "${TINY[@]}" --precision bf16 --kernels
WIDE=("$SRC/samples/gpt2.fsm" -D L=2 -D C=100 -D NH=4 -D T=32 -D V=256 -q --precision bf16)
MLP=("$SRC/samples/mlp.fsm" -q --precision bf16 --pad_vocab 0)  # its head as the model has it, whatever pads heads
expect kernels-misaligned-count 0 \
  "GEMMs with a leading dimension, batch stride or offset not a multiple of 16 bytes: 3 of 11" \
  -- "$FSC" "${MLP[@]}" --kernels
expect kernels-misaligned-head 0 "  op 7 matmul_bias at mlp.fsm:22:22: ldb 4 x 2 B, ldc 4 x 2 B (a classifier head)" \
  -- "$FSC" "${MLP[@]}" --kernels
expect kernels-misaligned-dx 0 "  op 14 matmul at mlp.fsm:22:14: lda 4 x 2 B, ldb 4 x 2 B (a classifier head)" -- \
  "$FSC" "${MLP[@]}" --kernels
expect kernels-misaligned-fix 0 "fix: such a dim a multiple of 8 elements in 16 bits, 4 in fp32" -- \
  "$FSC" "${MLP[@]}" --kernels
expect kernels-misaligned-head-fix 0 \
  "  a classifier head: --pad_vocab pads a head stored [V, C] (and its bias), or one stored [C, V] with no bias" \
  -- "$FSC" "${MLP[@]}" --kernels
expect kernels-misaligned-offset 0 "4 in fp32 (an offset: the sizes of what lies before it)" -- \
  "$FSC" "${WIDE[@]}" --kernels
expect kernels-misaligned-column 0 "0.00 ! lda,ldb" -- "$FSC" "${MLP[@]}" --kernels
expect kernels-fp32-aligned 0 "GEMMs: all 11 have" -- "$FSC" "$SRC/samples/mlp.fsm" -q --pad_vocab 0 --kernels
expect kernels-misaligned-json 0 '"n_misaligned_gemms": 3' -- "$FSC" "${MLP[@]}" --kernels=json
# The JSON's per-GEMM verdicts: [op, aligned, rules] of each misaligned GEMM.
"$FSC" "${MLP[@]}" --kernels=json > "$tmp/mlp_kernels.json"
cat > "$tmp/misaligned.py" <<'PY'
import json, sys
launches = json.load(open(sys.argv[1]))["launches"]
print([[l["op"], l["aligned"], l["misaligned"]] for l in launches if l["instruction"] == "gemm" and not l["aligned"]])
PY
expect kernels-misaligned-json-rules 0 \
  "[[7, False, ['ldb', 'ldc']], [13, False, ['ldb', 'ldc']], [14, False, ['lda', 'ldb']]]" \
  -- /usr/bin/python3 "$tmp/misaligned.py" "$tmp/mlp_kernels.json"
expect kernels-misaligned-width 0 "at gpt2.fsm:24:59: lda 100 x 2 B, ldb 300 x 2 B, ldc 300 x 2 B" -- \
  "$FSC" "${WIDE[@]}" --kernels
expect kernels-misaligned-more 0 "  and 22 more ops" -- "$FSC" "${WIDE[@]}" --kernels
expect kernels-bad-format 1 "--kernels: expected --kernels, --kernels=text or --kernels=json, got '--kernels=xml'" -- \
  "$FSC" "${TINY[@]}" --kernels=xml
expect kernels-bad-machine 1 "--machine $tmp/none.json: " -- "$FSC" "${TINY[@]}" --kernels --machine "$tmp/none.json"
expect kernels-help 0 "--kernels[=text|json]" -- "$FSC" --help
expect machine-needs-fit-or-kernels 1 "--machine describes the machine of --fit and --kernels" -- \
  "$FSC" "${TINY[@]}" --machine h200
expect gpus-per-node-needs-fit 1 "--gpus-per-node describes the machine of --fit: give --fit SIZE too" -- \
  "$FSC" "${TINY[@]}" --kernels --gpus-per-node 4
expect fit-h200 0 "machine H200-SXM-8" -- "$FSC" "${FIT[@]}" --fit 1GiB --machine h200 -q
expect fit-bad-setting 1 "--shard: unknown value 'fsdb'; did you mean 'fsdp'?" -- "$FSC" "${FIT[@]}" --fit 1GiB --shard fsdb
expect fit-alias-pinned 0 "shard {fsdp} (pinned)" -- "$FSC" "${FIT[@]}" --fit 1GiB --shard zero3 -q
expect fit-below-minimum 1 "nothing fits in 1.0 KiB per rank: the smallest arena found is" -- "$FSC" "${FIT[@]}" --fit 1KiB -q
expect fit-counts 0 "compiled" -- "$FSC" "${FIT[@]}" --fit 1GiB -q
expect fit-front 0 "Pareto front of the compiled candidates" -- "$FSC" "${FIT[@]}" --fit 1GiB -q
expect fit-pinned 0 "shard {fsdp} (pinned)" -- "$FSC" "${FIT[@]}" --shard fsdp --fit 1GiB -q
expect fit-reshard-root 0 "reshard_after_forward {0,1}; reshard_root {0,1}; " -- "$FSC" "${FIT[@]}" --shard fsdp --fit 1GiB -q
"$FSC" "${FIT[@]}" --fit 1GiB -q -o "$tmp/fit1.plan" > "$tmp/fit1.txt" 2>&1
"$FSC" "${FIT[@]}" --fit 1GiB -q -o "$tmp/fit2.plan" > "$tmp/fit2.txt" 2>&1
expect fit-deterministic 0 "" -- cmp "$tmp/fit1.plan" "$tmp/fit2.plan"
sed -i "s|fit2.plan|fit1.plan|" "$tmp/fit2.txt"
expect fit-same-report 0 "" -- cmp "$tmp/fit1.txt" "$tmp/fit2.txt"
winner=$(grep -A1 '^winner' "$tmp/fit1.txt" | tail -1 | sed "s|^ *fsc ||; s| -o $tmp/fit1.plan\$||")
read -r -a wargs <<<"$winner"
"$FSC" "${wargs[@]}" -q -o "$tmp/fit3.plan" >/dev/null 2>&1
expect fit-plan-is-the-command-line 0 "" -- cmp "$tmp/fit1.plan" "$tmp/fit3.plan"
# The winner is a point of the Pareto front the report prints (same time: the smaller arena).
wset=$(grep -A1 '^winner' "$tmp/fit1.txt" | tail -1 | sed "s|.* --world 2 ||; s| -o $tmp/fit1.plan\$||")
expect fit-winner-on-front 0 "fits  $wset" -- grep -x ".*fits  $wset" "$tmp/fit1.txt"
want=$(grep '^winner' "$tmp/fit1.txt" | sed 's/.*(\([0-9]*\) bytes).*/\1/')
mem=$("$FSC" "${wargs[@]}" --mem=json -q | grep -o '"arena_bytes": *[0-9]*' | head -1 | grep -o '[0-9]*$')
expect fit-arena-is-mem 0 "$want" -- echo "mem arena $mem"
# One rank: fsexec allocates the winner's arena and runs a step in it, the guard on.
"$FSC" "$SRC/samples/gpt2.fsm" -D L=2 -D C=32 -D NH=2 -D T=16 -D V=256 -D B=4 --world 1 --fit 1GiB -q \
  -o "$tmp/fit_w1.plan" > "$tmp/fit_w1.txt" 2>&1
fit_arena=$("$FSEXEC" --inspect "$tmp/fit_w1.plan" | sed -n 's/^device arena  \(.*\) ([0-9,]* bytes) per rank$/\1/p')
expect fit-inspect-arena 0 "" -- test -n "$fit_arena"
expect fit-fsexec-arena 0 "| arena $fit_arena |" -- "$FSEXEC" "$tmp/fit_w1.plan" --steps 1 --debug-guard

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
