# tests/cuda_emu/cuda_emu.cmake: the cuda-emu test backend and the tests that use it;
# included from the top CMakeLists.txt after runtime/cuda/cuda.cmake. Needs no CUDA at
# all: only a C++ compiler at test time (the plan's kernels are compiled as C++).
#
# libfs_cudaemu.so (tests/cuda_emu/backend.c) exports the CUDA backend's table, runs the
# plan's CUDA kernels in the CPU emulator of tests/cuda_emu/emu.hpp and its GEMMs as the
# cuBLAS calls runtime/cuda/schedule.c derives (compiled in here). op_check
# (tests/cuda/op_check.c, which only dlopens a backend) is built here too when the CUDA
# build did not make it. Each test compiles a small plan and checks every op of it
# against the CPU backend; op_check prints each kernel's memory measures (emulator's
# table) after its own.
set_target_properties(fs_plan PROPERTIES POSITION_INDEPENDENT_CODE ON)
add_library(fs_cudaemu MODULE tests/cuda_emu/backend.c tests/cuda_emu/module.c tests/cuda_emu/nccl_emu.c
            tests/cuda_emu/graph.c runtime/cuda/schedule.c)
target_include_directories(fs_cudaemu PRIVATE runtime runtime/cuda tests/cuda_emu)
target_compile_definitions(fs_cudaemu PRIVATE FS_CUDA_EMU_DIR="${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu")
target_link_libraries(fs_cudaemu PRIVATE fs_plan fs_ops MPI::MPI_C ${CMAKE_DL_LIBS} ${M_LIB})
set_target_properties(fs_cudaemu PROPERTIES C_VISIBILITY_PRESET hidden LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR})
target_link_options(fs_cudaemu PRIVATE -Wl,--exclude-libs,ALL)

if(NOT TARGET op_check)
  add_executable(op_check tests/cuda/op_check.c)
  target_link_libraries(op_check PRIVATE fs_runtime)
endif()

# The backend itself: each fault it claims to catch, made on purpose; and the emulated
# tensor-core and async-copy instructions of codegen/kernels/tc.cuh and the memory
# measures (test_tc). Criterion.
if(CRITERION_LIB AND NOT FS_FUZZ)
  foreach(t test_cuda_emu test_tc)
    add_executable(${t} tests/cuda_emu/${t}.c tests/cuda_emu/emu_plans.c)
    target_include_directories(${t} PRIVATE runtime tests/cuda_emu)
    target_link_libraries(${t} PRIVATE fs_plan ${CRITERION_LIB} ${CMAKE_DL_LIBS} ${M_LIB})
    target_compile_definitions(${t} PRIVATE FS_CUDAEMU_LIB="$<TARGET_FILE:fs_cudaemu>"
                               FS_BINARY_DIR="${CMAKE_CURRENT_BINARY_DIR}" FS_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
    add_dependencies(${t} fs_cudaemu)
    add_test(NAME ${t} COMMAND ${t} --jobs 2)
  endforeach()
  set_tests_properties(test_tc PROPERTIES LABELS cuda_emu)
endif()

# One test: plan NAME compiled from MODEL (relative to the source tree) with the fsc
# options that follow, then op_check on it through cuda-emu.
function(cuda_emu_test name model)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu)
  add_test(NAME cuda_emu_${name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/op_check.sh $<TARGET_FILE:fsc> $<TARGET_FILE:op_check>
                   $<TARGET_FILE:fs_cudaemu> ${dir} ${name} ${CMAKE_CURRENT_SOURCE_DIR}/${model} ${ARGN})
  set_tests_properties(cuda_emu_${name} PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT} ENVIRONMENT "FS_CUDA_EMU_CACHE=${dir}/cache")
endfunction()

# The decode program (passes/decode.c) of a plan NAME compiled as cuda_emu_test does, op_check'd
# with token 1 at position POS over KV caches of random rows.
function(cuda_emu_decode_test name pos model)
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu)
  add_test(NAME cuda_emu_${name}
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/op_check.sh $<TARGET_FILE:fsc> $<TARGET_FILE:op_check>
                   $<TARGET_FILE:fs_cudaemu> ${dir} ${name} ${CMAKE_CURRENT_SOURCE_DIR}/${model} ${ARGN})
  set_tests_properties(cuda_emu_${name} PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${dir}/cache;OP_CHECK_ARGS=--decode ${pos}")
endfunction()

if(NOT FS_FUZZ)
  # The decode programs: rope_at and attention_decode (GQA), at a middle and the last position.
  cuda_emu_decode_test(gpt2_decode 9 samples/gpt2.fsm -D L=2 -D C=32 -D NH=2 -D T=16 -D V=256 -D B=2)
  cuda_emu_decode_test(llama_decode 15 samples/llama.fsm -D L=2 -D C=32 -D NH=4 -D NKV=2 -D T=16 -D V=256 -D B=2 -D F=64)
  # Small dims: every kernel still runs, at a cost CI can pay for every precision.
  set(tiny -D L=2 -D C=32 -D NH=2 -D T=16 -D V=256 -D B=2)
  foreach(prec fp32 bf16 fp16)
    cuda_emu_test(gpt2_${prec} samples/gpt2.fsm ${tiny} --precision ${prec})
    # llama: grouped-query attention, 4 query heads over 2 kv heads
    cuda_emu_test(llama_${prec} samples/llama.fsm -D L=2 -D C=32 -D NH=4 -D NKV=2 -D T=16 -D V=256 -D B=2 -D F=64
                  --precision ${prec})
    cuda_emu_test(mlp_${prec} samples/mlp.fsm --precision ${prec})
  endforeach()
  # The loss and its gradient as two ops (fuse_loss 0: cross_entropy_bwd's kernel), the tied
  # embedding's gradient as a table and an add (embed_grad_into 0), and the matmuls' biases,
  # GELUs and their gradients as kernels of their own (fuse_gemm 0); the plans above run the
  # fused loss (passes/xent.c), embedding_bwd_into (passes/embed_into.c) and the GEMM
  # epilogues (passes/epilogue.c).
  cuda_emu_test(gpt2_bf16_unfused samples/gpt2.fsm ${tiny} --precision bf16 --fuse_loss 0 --embed_grad_into 0
                --fuse_gemm 0 --pack_attention 0)
  # Every GEMM epilogue, on biases far from zero (GPT-2's start at zero).
  foreach(prec fp32 bf16 fp16)
    cuda_emu_test(epilogue_${prec} tests/cuda_emu/epilogue.fsm --precision ${prec})
  endforeach()
  cuda_emu_test(gpt2_fp16_accumulate samples/gpt2.fsm ${tiny} -D B=4 --precision fp16 --microbatches 2)
  cuda_emu_test(gpt2_bf16_fsdp_recompute samples/gpt2.fsm ${tiny} --precision bf16 --shard fsdp --world 1 --recompute Block)
  cuda_emu_test(gpt2_fp32_sgd samples/gpt2.fsm ${tiny} --optimizer sgd --momentum 0.9)
  # The step scalars of a warmup + cosine schedule with clipping (codegen/kernels/step.cuh).
  cuda_emu_test(gpt2_fp32_cosine samples/gpt2.fsm ${tiny} --lr_schedule cosine --warmup 3 --clip 1.0)
  # Frozen base weights (no gradient, no update) beside trainable adapters.
  cuda_emu_test(lora_bf16 samples/lora.fsm ${tiny} --precision bf16)
  # Odd shapes: head dims 21 and 22, sequences of 33 (a second, partial attention tile),
  # vocab rows of 1025 (block-wide rows; not padded), a batch of 3; llama's multi-query (NKV = 1).
  cuda_emu_test(gpt2_odd_fp32 samples/gpt2.fsm -D L=1 -D C=42 -D NH=2 -D T=33 -D V=1025 -D B=3 --pad_vocab 0)
  # A padded vocabulary (passes/pad_vocab.c): 300 of wte's 320 rows the model's, the loss's
  # kernels masking the rest (valid = 300), fused and as two ops, and the decode program's head.
  cuda_emu_test(gpt2_padded_fp32 samples/gpt2.fsm -D L=1 -D C=32 -D NH=2 -D T=16 -D V=300 -D B=2)
  cuda_emu_test(gpt2_padded_bf16_unfused samples/gpt2.fsm -D L=1 -D C=32 -D NH=2 -D T=16 -D V=300 -D B=2
                --precision bf16 --fuse_loss 0)
  cuda_emu_decode_test(gpt2_padded_decode 9 samples/gpt2.fsm -D L=1 -D C=32 -D NH=2 -D T=16 -D V=300 -D B=2)
  # Llama's head stored [C, V] read through a padded copy (pad(output) [C, 320]; the loss's valid = 300).
  cuda_emu_test(llama_padded_bf16 samples/llama.fsm -D L=1 -D C=32 -D NH=4 -D NKV=2 -D T=16 -D V=300 -D B=2 -D F=64
                --precision bf16)
  cuda_emu_test(llama_odd_bf16 samples/llama.fsm -D L=1 -D C=44 -D NH=2 -D NKV=1 -D T=33 -D V=1025 -D B=3 -D F=90
                --precision bf16 --pad_vocab 0)
  foreach(prec fp32 bf16 fp16)
    cuda_emu_test(ops_${prec} tests/cuda_emu/ops.fsm --precision ${prec})
  endforeach()
  # Indexing and slicing (slice, slice_bwd) and a layer instance applied twice.
  foreach(prec fp32 bf16)
    cuda_emu_test(index_${prec} tests/cuda_emu/index.fsm --precision ${prec})
  endforeach()
  # Issue 37's variants: interleaved rope, exact GELU, `**`, ignore_index (the fused loss; with
  # fuse_loss 0 its two ops), under the wsd and linear schedules' lr_at.
  cuda_emu_test(ops37_fp32 tests/cuda_emu/ops37.fsm --lr_schedule wsd --steps 4 --decay_frac 1)
  cuda_emu_test(ops37_bf16_unfused tests/cuda_emu/ops37.fsm -D V=300 --precision bf16 --fuse_loss 0
                --lr_schedule linear --steps 3)
  cuda_emu_test(ops37_fp16 tests/cuda_emu/ops37.fsm -D V=300 --precision fp16)
  # Attention on tensor cores (codegen/cuda_flash.c), not causal (T != S) and causal, grouped-query:
  # head dim 64 with T = 37 against S = 130 (one partial query tile, three key tiles); 32 with
  # T = 130 against 37 in fp16; 128 with a second, one-row tile; 24 (a multiple of 8, padded to 32).
  cuda_emu_test(attn_hd64_bf16 tests/cuda_emu/attn.fsm -D B=1 --precision bf16)
  cuda_emu_test(attn_hd32_fp16 tests/cuda_emu/attn.fsm -D B=1 -D T=130 -D S=37 -D C=64 -D NH=2 -D NKV=1 --precision fp16)
  cuda_emu_test(attn_hd128_bf16 tests/cuda_emu/attn.fsm -D B=1 -D T=65 -D S=70 -D NH=1 -D NKV=1 --precision bf16)
  cuda_emu_test(attn_hd24_fp16 tests/cuda_emu/attn.fsm -D C=48 -D NH=2 -D NKV=2 --precision fp16)
  # samples/bert.fsm's step-1 gradients on cuda-emu against the CPU backend, fp32 and bf16, on
  # scripts/mlm_data.py's inputs (the padding mask, exact GELU, ignore_index; tests/py/bert_mlm.py --emu).
  add_test(NAME cuda_emu_bert COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/bert_mlm.py
           $<TARGET_FILE:fsc> $<TARGET_FILE:fsexec> --emu $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(cuda_emu_bert PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT})
  # attention_masked (a key mask, boolean and additive; codegen/kernels/attention_f32.cuh, D != Dv) against the
  # CPU backend, fp32 and bf16, causal and not, with a fully masked batch item (tests/py/attn_mask.py --emu; 8
  # emulated steps: 4 minutes under load).
  add_test(NAME cuda_emu_attn_mask COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/attn_mask.py
           $<TARGET_FILE:fsc> $<TARGET_FILE:fsexec> --emu $<TARGET_FILE:fs_cudaemu>)
  math(EXPR attn_mask_timeout "2 * ${FS_SLOW_TIMEOUT}")
  set_tests_properties(cuda_emu_attn_mask PROPERTIES TIMEOUT ${attn_mask_timeout})
  # attention_masked on the tensor-core kernels (bf16, fp16) and the f32 ones (fp32) with D = Dv: T = 37, head
  # dims 24 and 64, grouped and not, causal and not, boolean and additive masks with a fully masked item, against
  # the CPU backend, and the backward's bits with the blocks in either order; attention_qkv_masked (packed) against
  # attention_masked (tests/py/attn_mask.py --emu-shapes).
  add_test(NAME cuda_emu_attn_mask_tc COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/attn_mask.py
           $<TARGET_FILE:fsc> $<TARGET_FILE:fsexec> --emu-shapes $<TARGET_FILE:fs_cudaemu>)
  # (10 emulated steps, each compiling its own kernels: about a minute, several on a loaded 2-core machine)
  math(EXPR attn_mask_tc_timeout "3 * ${FS_SLOW_TIMEOUT}")
  set_tests_properties(cuda_emu_attn_mask_tc PROPERTIES TIMEOUT ${attn_mask_tc_timeout})
  # The same under tf32 (an fp32 plan, --tf32 1: the flash kernels on mma m16n8k8 tf32): tests/cuda_emu/attn_mask.fsm's
  # attention_masked and attention_qkv_masked, causal and not, boolean and additive masks with a fully masked item,
  # head dims 24, 40 and 64, T = 70 and 37, one step against the CPU backend at op_check's tf32 tolerance, and the
  # backward's bits with the blocks in either order (tests/py/attn_mask.py --emu-tf32; 2 emulated steps, 50 s).
  add_test(NAME cuda_emu_attn_mask_tf32 COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/attn_mask.py
           $<TARGET_FILE:fsc> $<TARGET_FILE:fsexec> --emu-tf32 $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(cuda_emu_attn_mask_tf32 PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT})
  # attention_qkv (passes/packed_attn.c): the heads read from the QKV projection's rows, on tensor cores (head dims
  # 64, 24 and 128) and by the f32 kernels (fp32; 16-bit head dim 20, not a multiple of 8); GPT-2 without it keeps
  # attention's contiguous path covered in gpt2_bf16_unfused
  cuda_emu_test(attn_qkv_hd64_bf16 tests/cuda_emu/attn_qkv.fsm --precision bf16)
  cuda_emu_test(attn_qkv_hd24_fp16 tests/cuda_emu/attn_qkv.fsm -D T=130 -D C=48 --precision fp16)
  cuda_emu_test(attn_qkv_hd128_bf16 tests/cuda_emu/attn_qkv.fsm -D B=1 -D T=65 -D NH=1 --precision bf16)
  cuda_emu_test(attn_qkv_hd24_fp32 tests/cuda_emu/attn_qkv.fsm -D C=72 -D NH=3)
  cuda_emu_test(attn_qkv_hd20_bf16 tests/cuda_emu/attn_qkv.fsm -D C=40 --precision bf16)
  # rope_rows and attention_rows (passes/packed_attn.c): Llama's heads turned and read on its q, k, v projections'
  # rows, grouped-query (NKV < NH), both rope forms; tensor cores (head dims 64, 24, 128) and the f32 kernels (fp32;
  # 16-bit head dim 20). Llama without it keeps heads -> rope -> attention -> merge_heads covered.
  cuda_emu_test(attn_rows_hd64_bf16 tests/cuda_emu/attn_rows.fsm --precision bf16)
  cuda_emu_test(attn_rows_hd24_fp16 tests/cuda_emu/attn_rows.fsm -D T=130 -D C=96 -D NH=4 -D NKV=2 --precision fp16)
  cuda_emu_test(attn_rows_hd128_bf16 tests/cuda_emu/attn_rows.fsm -D B=1 -D T=65 -D C=256 --precision bf16)
  cuda_emu_test(attn_rows_hd24_fp32 tests/cuda_emu/attn_rows.fsm -D C=72 -D NH=3)
  cuda_emu_test(attn_rows_hd20_bf16 tests/cuda_emu/attn_rows.fsm -D C=80 -D NH=4 -D NKV=2 --precision bf16)
  cuda_emu_test(llama_bf16_unpacked samples/llama.fsm -D L=2 -D C=32 -D NH=4 -D NKV=2 -D T=16 -D V=256 -D B=2 -D F=64
                --precision bf16 --pack_attention 0)
  # fp32 attention under the tf32 setting: the same flash kernels on mma m16n8k8 tf32 (op_check's tf32 tolerance),
  # at T = 37 against S = 130 (head dim 64, NKV = 1), head dim 24 with NKV = NH / 2, a causal T = 300 at head dim
  # 128, attention_qkv at T = 300 (head dim 24), 128 and 64, and tiny GPT-2 whole (head dim 16); and the f32
  # kernels (fp32 without tf32) at head dims 24 (NKV = NH / 2) and 128, and attention_qkv at T = 130 (tiles of 32
  # and a tail of 2; T = 300 took 150 s of the suite, and at head dim 128 the emulator would take minutes). Masked
  # attention under tf32 is cuda_emu_attn_mask_tf32's, above.
  cuda_emu_test(attn_hd64_tf32 tests/cuda_emu/attn.fsm -D B=1 --tf32 1)
  cuda_emu_test(attn_hd24_tf32 tests/cuda_emu/attn.fsm -D C=96 -D NH=4 -D NKV=2 --tf32 1)
  cuda_emu_test(attn_hd128_t300_tf32 tests/cuda_emu/attn.fsm -D B=1 -D T=300 -D S=70 -D NH=1 -D NKV=1 --tf32 1)
  cuda_emu_test(attn_qkv_hd24_t300_tf32 tests/cuda_emu/attn_qkv.fsm -D T=300 -D C=48 --tf32 1)
  cuda_emu_test(attn_qkv_hd128_tf32 tests/cuda_emu/attn_qkv.fsm -D B=1 -D T=65 -D NH=1 --tf32 1)
  cuda_emu_test(attn_qkv_hd64_tf32 tests/cuda_emu/attn_qkv.fsm --tf32 1)
  cuda_emu_test(gpt2_tf32 samples/gpt2.fsm ${tiny} --tf32 1)
  cuda_emu_test(attn_hd24_fp32 tests/cuda_emu/attn.fsm -D C=96 -D NH=4 -D NKV=2)
  cuda_emu_test(attn_hd128_fp32 tests/cuda_emu/attn.fsm -D B=1 -D T=65 -D S=70 -D NH=1 -D NKV=1)
  cuda_emu_test(attn_qkv_hd24_t130_fp32 tests/cuda_emu/attn_qkv.fsm -D T=130 -D C=48)
endif()

# fsexec itself on the device path (--device cuda through cuda-emu) against --device cpu.
if(NOT FS_FUZZ)
  add_test(NAME cuda_emu_fsexec_train
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/train.py $<TARGET_FILE:fsc>
                   $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu> ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/train)
  set_tests_properties(cuda_emu_fsexec_train PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache;FS_CUDA_EMU_MEASURE=0")
  # adamw_cast and sgd_cast on the device: --cast_in_update 1 trains as 0, to the bit (tests/cuda_emu/cast_update.py).
  add_test(NAME cuda_emu_cast_update
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/cast_update.py $<TARGET_FILE:fsc>
                   $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu> ${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cast_update)
  set_tests_properties(cuda_emu_cast_update PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache;FS_CUDA_EMU_MEASURE=0")
  # Offload's delayed update against a float64 PyTorch reference of its maths, on the CPU
  # backend and --device cuda through cuda-emu; resume bit for bit; its refusals.
  add_test(NAME delayed_update
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/delayed_update.py $<TARGET_FILE:fsc>
                   $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(delayed_update PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache;FS_CUDA_EMU_MEASURE=0")
  # samples/vit.fsm's parity plan (tests/py/vit.py) with --device cuda against the CPU backend.
  add_test(NAME cuda_emu_vit
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/py/vit.py $<TARGET_FILE:fsc>
                   $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(cuda_emu_vit PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache;FS_CUDA_EMU_MEASURE=0")
  # A Python test NAME: SCRIPT (relative to the source tree) FSC FSEXEC LIBFS_CUDAEMU, with the shared kernel cache.
  function(cuda_emu_py_test name script)
    add_test(NAME ${name} COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/${script} $<TARGET_FILE:fsc>
             $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu>)
    set_tests_properties(${name} PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT}
                         ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache")
  endfunction()
  # Slices as views (passes/slice_view.c) against --slice_views 0: the same steps to the byte on the CPU and on
  # cuda-emu, the saved copies gone from fsc --mem, micro-batches' input rows as views.
  cuda_emu_py_test(slice_views tests/py/slice_views.py)
  # fsexec --predict with --device cuda (world 1, --cuda-graph, a bf16 plan, world 2 fsdp, a 2-stage
  # pipeline, the ViT) against the same plans' --device cpu predictions.
  cuda_emu_py_test(cuda_emu_predict tests/cuda_emu/predict.py)
  # Pipelines of 2 and 4 stages x 1 and 2 data-parallel ranks, every schedule, fp32 and bf16,
  # on cuda-emu ranks (NCCL's calls over MPI) against the CPU ranks' run of the same plan.
  add_test(NAME cuda_emu_pipeline
           COMMAND /usr/bin/python3 ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/pipeline.py $<TARGET_FILE:fsc>
                   $<TARGET_FILE:fsexec> $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(cuda_emu_pipeline PROPERTIES TIMEOUT 900 SKIP_RETURN_CODE 77
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache")
  # --timeout on cuda-emu ranks: a stopped stage's peer names the hung NCCL send or receive,
  # its .fsm line and the rank it waits for.
  add_test(NAME cuda_emu_watchdog
           COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/tests/cuda_emu/watchdog.sh $<TARGET_FILE:fsc> $<TARGET_FILE:fsexec>
                   $<TARGET_FILE:fs_cudaemu>)
  set_tests_properties(cuda_emu_watchdog PROPERTIES TIMEOUT ${FS_SLOW_TIMEOUT} SKIP_RETURN_CODE 77
                       ENVIRONMENT "FS_CUDA_EMU_CACHE=${CMAKE_CURRENT_BINARY_DIR}/cuda_emu/cache")
endif()
