# tests/cuda/nvrtc.cmake: NVRTC compiles every sample's CUDA module (tests/cuda/nvrtc_compile.c),
# for sm_80 and sm_90, wherever the CUDA toolkit is found: no GPU or driver needed.
# Included from the top CMakeLists.txt.
find_package(CUDAToolkit QUIET)
if(CUDAToolkit_FOUND AND TARGET CUDA::nvrtc AND NOT FS_FUZZ)
  find_package(Threads REQUIRED)
  list(GET CUDAToolkit_INCLUDE_DIRS 0 FS_CUDA_INCLUDE)
  add_executable(nvrtc_compile tests/cuda/nvrtc_compile.c tests/cuda/ptxas_report.c)
  # NVRTC's library itself, not the CUDA::nvrtc target, which also links the driver's stub
  # libcuda.so: a sanitized build keeps that, and then needs a driver to start.
  target_include_directories(nvrtc_compile SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})  # after codegen/cuda.h
  target_link_libraries(nvrtc_compile PRIVATE fs_frontend fs_passes fs_codegen ${CUDA_nvrtc_LIBRARY} Threads::Threads)
  set_target_properties(nvrtc_compile PROPERTIES BUILD_RPATH ${CUDAToolkit_LIBRARY_DIR})
  add_test(NAME nvrtc_compile COMMAND nvrtc_compile ${CMAKE_CURRENT_SOURCE_DIR} ${FS_CUDA_INCLUDE})
  set_tests_properties(nvrtc_compile PROPERTIES TIMEOUT 900)  # 16 modules x 2 archs: 230-410 s on 2 loaded cores
else()
  message(STATUS "CUDA toolkit (NVRTC) not found: the samples' CUDA modules are not compiled by the tests")
endif()
