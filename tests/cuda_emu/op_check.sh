#!/bin/sh
# tests/cuda_emu/op_check.sh: one ctest of the cuda-emu backend (tests/cuda_emu/backend.c).
# Compiles a small plan with fsc, then runs H3's op_check (tests/cuda/op_check.c, made
# for a GPU) on it with FS_CUDA_BACKEND pointing at libfs_cudaemu.so: every op of the
# plan, its kernels emulated on the CPU and its GEMMs run as the cuBLAS calls the CUDA
# backend makes, against the CPU backend, at op_check's own tolerances.
# usage: op_check.sh FSC OP_CHECK LIBFS_CUDAEMU OUTDIR NAME MODEL.fsm [fsc options...]
set -eu
fsc=$1 op_check=$2 lib=$3 out=$4 name=$5
shift 5
mkdir -p "$out"
"$fsc" -q "$@" -o "$out/$name.plan"
# OP_CHECK_ARGS: op_check's own options (--decode POS: the plan's decode program)
FS_CUDA_BACKEND=$lib exec "$op_check" ${OP_CHECK_ARGS:-} "$out/$name.plan"
