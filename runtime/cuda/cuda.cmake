# runtime/cuda/cuda.cmake: the CUDA backend, built when the CUDA toolkit (driver API,
# NVRTC, cuBLAS) and NCCL are found; included from the top CMakeLists.txt.
#
# libfs_cuda.so is a MODULE next to fsexec, which dlopen()s it only for --device cuda or
# auto (runtime/backend.c): fsexec links no CUDA library. The module links the driver
# API through the toolkit's stub libcuda.so (the real libcuda.so.1 comes from the driver
# at run time), NVRTC, cuBLAS, NCCL and MPI (NCCL's id is broadcast over it). It carries
# its own copy of the plan and op layers, hidden with everything else but fs_cuda_backend().
# Its run path holds the toolkit's library directory and not the stub's, so the stub is
# never what the loader finds for libcuda.so.1.
#
# The schedule, the JIT cache and the memory check (fs_cuda_host) need no driver: their unit tests run on
# machines without a GPU. op_check (tests/cuda/op_check.c) compares every op of a plan on
# CUDA against the CPU backend; it needs a GPU to pass, and says so when there is none.
# fsexec finds the backend with dlopen (runtime/backend.c), CUDA or not.
target_link_libraries(fs_runtime PUBLIC ${CMAKE_DL_LIBS})

find_package(CUDAToolkit QUIET)
find_library(FS_NCCL_LIB nccl HINTS ${CUDAToolkit_LIBRARY_DIR})
find_path(FS_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS})
set(FS_CUDA OFF)
if(CUDAToolkit_FOUND AND TARGET CUDA::cuda_driver AND TARGET CUDA::nvrtc AND TARGET CUDA::cublas AND TARGET CUDA::cublasLt
   AND FS_NCCL_LIB AND FS_NCCL_INCLUDE)
  set(FS_CUDA ON)
endif()
message(STATUS "CUDA backend (libfs_cuda.so): ${FS_CUDA}")

if(FS_CUDA)
  set_target_properties(fs_plan PROPERTIES POSITION_INDEPENDENT_CODE ON)
  add_library(fs_cuda_host STATIC runtime/cuda/schedule.c runtime/cuda/jit.c runtime/cuda/fit.c)
  set_target_properties(fs_cuda_host PROPERTIES POSITION_INDEPENDENT_CODE ON C_VISIBILITY_PRESET hidden)
  target_include_directories(fs_cuda_host PUBLIC runtime/cuda)
  target_include_directories(fs_cuda_host SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
  # NVRTC's library alone: CUDA::nvrtc would bring the driver's libcuda.so.1 with it, which
  # the JIT tests must not need on machines without a driver.
  target_link_libraries(fs_cuda_host PUBLIC fs_plan fs_ops ${CUDA_nvrtc_LIBRARY})

  add_library(fs_cuda MODULE runtime/cuda/backend.c runtime/cuda/fail.c runtime/cuda/run.c runtime/cuda/nccl.c
              runtime/cuda/lt.c)
  target_include_directories(fs_cuda PRIVATE runtime)
  target_include_directories(fs_cuda SYSTEM PRIVATE ${FS_NCCL_INCLUDE})
  # NCCL is dlopen()ed for worlds of more than one rank only (nccl.c): headers, no library.
  target_link_libraries(fs_cuda PRIVATE fs_cuda_host CUDA::cuda_driver CUDA::cublas CUDA::cublasLt MPI::MPI_C ${CMAKE_DL_LIBS})
  set_target_properties(fs_cuda PROPERTIES C_VISIBILITY_PRESET hidden
                        LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR} SKIP_BUILD_RPATH ON)
  target_link_options(fs_cuda PRIVATE -Wl,--exclude-libs,ALL -Wl,-rpath,${CUDAToolkit_LIBRARY_DIR})
  add_dependencies(fsexec fs_cuda)

  add_executable(op_check tests/cuda/op_check.c)
  target_link_libraries(op_check PRIVATE fs_runtime)
  add_dependencies(op_check fs_cuda)

  if(CRITERION_LIB AND NOT FS_FUZZ)
    foreach(name test_cuda_schedule test_cuda_jit test_cuda_fit)
      add_executable(${name} tests/cuda/${name}.c)
      target_include_directories(${name} PRIVATE tests/support)
      target_link_libraries(${name} PRIVATE fs_cuda_host ${CRITERION_LIB} ${M_LIB})
      add_test(NAME ${name} COMMAND ${name} --jobs 2)
    endforeach()
    # The schedule on the samples' real plans, every strategy and rank.
    add_executable(test_cuda_plans tests/cuda/test_cuda_plans.c tests/support/sample.c)
    target_include_directories(test_cuda_plans PRIVATE tests/support)
    target_link_libraries(test_cuda_plans PRIVATE fs_frontend fs_passes fs_codegen fs_cuda_host fs_runtime ${CRITERION_LIB})
    target_compile_definitions(test_cuda_plans PRIVATE FS_SOURCE_DIR="${CMAKE_CURRENT_SOURCE_DIR}")
    add_test(NAME test_cuda_plans COMMAND test_cuda_plans --jobs 2)
  endif()
endif()
