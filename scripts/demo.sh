#!/usr/bin/env bash
# The main job, for now: build, compile a small GPT-2, print its IR and summary, write
# its plan and show what the plan holds. (Training lands with the CPU backend.)
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
small=(-D L=4 -D C=128 -D NH=4 -D T=64 -D V=512 -D B=4)
echo "== fsc samples/gpt2.fsm ${small[*]} --emit ir"
build/fsc samples/gpt2.fsm "${small[@]}" --emit ir
echo
echo "== fsc samples/gpt2.fsm (GPT-2 124M) -o build/gpt2.plan"
build/fsc samples/gpt2.fsm -o build/gpt2.plan
echo
echo "== fsexec --inspect build/gpt2.plan"
build/fsexec --inspect build/gpt2.plan
