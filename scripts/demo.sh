#!/usr/bin/env bash
# The main job: build, compile a small GPT-2 (byte-level vocabulary) and train it on the
# CPU for a few hundred steps on a text every Debian machine has; the loss falls from
# ln(256) = 5.5 to about 2. Then show what the plan holds, and end with a text sampled
# from the trained model. About a minute on 2 cores.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
mkdir -p build/demo
small=(-D V=256 -D L=4 -D C=128 -D NH=4 -D T=128 -D B=8)
build/fsc samples/gpt2.fsm "${small[@]}" --lr 2e-3 --warmup 30 --lr_schedule cosine --steps 400 --min_lr 2e-4 \
  -o build/demo/gpt2-small.plan
build/fsexec build/demo/gpt2-small.plan --steps 400 --log build/demo/train.jsonl \
  --save-weights build/demo/gpt2-small.safetensors
echo
echo "per-step log: build/demo/train.jsonl; weights (safetensors, loadable in PyTorch): build/demo/gpt2-small.safetensors"
echo
# sed, not head: it reads everything, so fsexec gets no SIGPIPE (this script runs under pipefail)
build/fsexec --inspect build/demo/gpt2-small.plan | sed -n "1,60p"
echo
echo "a sample from the trained model (fsexec --sample 300 --prompt ... --temperature 0.8 --top-k 20):"
build/fsexec build/demo/gpt2-small.plan --load-weights build/demo/gpt2-small.safetensors --sample 300 \
  --prompt "The GNU General Public License " --temperature 0.8 --top-k 20
