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
expect version 0 "fsc 0.1.0" -- "$FSC" --version
expect no-input 1 "no input file" -- "$FSC"
expect missing-file 1 "nope.fsm: No such file or directory" -- "$FSC" "$tmp/nope.fsm"
expect directory 1 "not a regular file" -- "$FSC" "$tmp"
expect bad-flag 1 "unknown option '-x'" -- "$FSC" "$SRC/samples/mlp.fsm" -x
expect bad-define 1 "expected NAME=VALUE" -- "$FSC" "$SRC/samples/mlp.fsm" -D L
expect bad-define-value 1 "VALUE must be an integer" -- "$FSC" "$SRC/samples/mlp.fsm" -D L=two
expect unknown-dim 1 "did you mean 'L'" -- "$FSC" "$SRC/samples/mlp.fsm" -D LL=3
expect bad-setting 1 "did you mean 'fsdp'" -- "$FSC" "$SRC/samples/mlp.fsm" --shard fsdb
expect unknown-setting 1 "did you mean 'shard'" -- "$FSC" "$SRC/samples/mlp.fsm" --shrd fsdp
expect bad-print-after 1 "no pass named 'dcee'; did you mean 'dce'" -- "$FSC" "$SRC/samples/mlp.fsm" --print-after dcee
expect bad-emit 1 "--emit: expected 'ir' or 'ir-json'" -- "$FSC" "$SRC/samples/mlp.fsm" --emit asm

# GPT-2 124M: the parameter count the issue pins down.
expect gpt2-params 0 "gpt2: 124,439,808 params" -- "$FSC" "$SRC/samples/gpt2.fsm"
expect gpt2-ir 0 "attention(" -- "$FSC" "$SRC/samples/gpt2.fsm" --emit ir -q
expect llama 0 "llama:" -- "$FSC" "$SRC/samples/llama.fsm"
expect mlp-override 0 "shard fsdp, world 4" -- "$FSC" "$SRC/samples/mlp.fsm" --shard=zero3 --world 4
expect ir-json 0 '"model"' -- "$FSC" "$SRC/samples/mlp.fsm" --emit ir-json -q
expect print-after-lower 0 "matmul(" -- "$FSC" "$SRC/samples/mlp.fsm" --print-after lower -q

# A syntax error: file:line:col, the line and a caret; exit 1.
printf 'model m {\n  dim B = 4;\n  input x: f32[B, 8]\n  loss = sum(x);\n}\n' >"$tmp/bad.fsm"
expect syntax-error 1 "bad.fsm:3:21: error: expected ';'" -- "$FSC" "$tmp/bad.fsm"

# Plan: write, inspect, reject damage.
expect write-plan 0 "wrote $tmp/gpt2.plan" -- "$FSC" "$SRC/samples/gpt2.fsm" -D L=2 -D C=64 -D NH=4 -D T=32 -D V=256 -o "$tmp/gpt2.plan"
expect inspect 0 "gpt2" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"

# Memory reports: text, JSON, HTML page, --mem-limit with what-ifs, the same report in
# fsexec --inspect, and the guard.
GPT2_SMALL=(-D L=2 -D C=64 -D NH=4 -D T=32 -D V=256)
expect mem-text 0 "arena / peak" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --mem -q
expect mem-peak-op 0 "peak op        16: matmul (backward) mlp.fsm:22:14" -- "$FSC" "$SRC/samples/mlp.fsm" --mem -q
expect mem-json 0 '"arena_bytes":' -- "$FSC" "$SRC/samples/mlp.fsm" --mem=json -q
expect mem-html 0 "wrote $tmp/mem.html" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=html "$tmp/mem.html"
expect mem-html-svg 0 '<g class="col"><title>' -- cat "$tmp/mem.html"
expect mem-html-no-file 1 "--mem=html needs a file name" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=html
expect mem-bad-format 1 "expected --mem, --mem=text, --mem=json or --mem=html FILE" -- "$FSC" "$SRC/samples/mlp.fsm" --mem=xml
expect mem-sharded 0 "ranks 0-3 (one program for all 4 data-parallel ranks)" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 4 --mem -q
expect mem-limit-ok 0 "within --mem-limit 1.0 MiB" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 1MiB
expect mem-limit-over 1 "over the limit of 8.00 GiB" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 8GiB -q
expect mem-limit-batch 1 "half the batch (B 8 -> 4)" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 8GiB -q
expect mem-limit-recompute 1 "--recompute Block" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 8GiB -q
expect mem-limit-shard 1 "--shard fsdp --world 8" -- "$FSC" "$SRC/samples/gpt2.fsm" --mem-limit 8GiB -q
expect mem-limit-unit 1 "unknown unit 'GX'" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 80GX
expect mem-limit-no-unit 1 "has no unit" -- "$FSC" "$SRC/samples/mlp.fsm" --mem-limit 80
expect inspect-mem 0 "saved for backward, by the block whose backward reads it" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"
expect inspect-source 0 "source        gpt2.fsm" -- "$FSEXEC" --inspect "$tmp/gpt2.plan"
"$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" --mem -q >"$tmp/mem.txt"
"$FSEXEC" --inspect "$tmp/gpt2.plan" | sed -n '/^memory plan:/,/^communication per step/p' | head -n -2 >"$tmp/inspect_mem.txt"
expect mem-same-in-inspect 0 "" -- diff "$tmp/mem.txt" "$tmp/inspect_mem.txt"
expect comm-fsdp 0 "reduce_scatter h.0.flat_grad_shard" -- "$FSC" "$SRC/samples/gpt2.fsm" "${GPT2_SMALL[@]}" -D B=8 --shard fsdp --world 4 --comm -q
expect comm-none 0 "none" -- "$FSC" "$SRC/samples/mlp.fsm" --comm -q
expect reduce-dtype-mismatch 1 "reduce_dtype bf16 with precision fp16" -- "$FSC" "$SRC/samples/mlp.fsm" --precision fp16 --reduce_dtype bf16
expect precision-bf16 0 "precision bf16" -- "$FSC" "$SRC/samples/mlp.fsm" --precision bf16
expect pipeline-not-yet 1 "pipeline parallelism is not implemented yet" -- "$FSC" "$SRC/samples/mlp.fsm" --stages 2
expect offload-not-yet 1 "optimizer offload is not implemented yet" -- "$FSC" "$SRC/samples/mlp.fsm" --offload optimizer
expect debug-guard 0 "step 2/2" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2 --debug-guard
head -c 100 "$tmp/gpt2.plan" >"$tmp/short.plan"
expect inspect-truncated 1 "truncated" -- "$FSEXEC" --inspect "$tmp/short.plan"
expect inspect-text 1 "bad magic" -- "$FSEXEC" --inspect "$SRC/samples/mlp.fsm"
expect inspect-missing 1 "No such file" -- "$FSEXEC" --inspect "$tmp/none.plan"
expect fsexec-help 0 "usage: fsexec" -- "$FSEXEC" --help
expect write-unwritable 1 "fsc: error:" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/no/such/dir/x.plan"

# Training from the command line.
expect mlp-plan 0 "wrote $tmp/mlp.plan" -- "$FSC" "$SRC/samples/mlp.fsm" -o "$tmp/mlp.plan"
expect train-mlp 0 "acc" -- "$FSEXEC" "$tmp/mlp.plan" --steps 3
expect train-gpt2 0 "step 2/2" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 2 --log "$tmp/log.jsonl"
expect log-lines 0 '"step": 2' -- cat "$tmp/log.jsonl"
expect export-weights 0 "0 steps" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 0 --save-weights "$tmp/w.safetensors"
expect import-weights 0 "step 1/1" -- "$FSEXEC" "$tmp/gpt2.plan" --steps 1 --load-weights "$tmp/w.safetensors"
expect import-wrong-model 1 "no tensor 'w_in', which the model has" -- "$FSEXEC" "$tmp/mlp.plan" --steps 1 --load-weights "$tmp/w.safetensors"
expect import-missing 1 "none.safetensors: No such file or directory" -- "$FSEXEC" "$tmp/gpt2.plan" --load-weights "$tmp/none.safetensors"
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

echo "$failures failure(s)"
[ "$failures" -eq 0 ]
