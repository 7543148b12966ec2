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
  set_tests_properties(nvrtc_compile PROPERTIES TIMEOUT 900)  # 31 modules x 2 archs: 44 s in CI, 71 s on 2 loaded cores
else()
  message(STATUS "CUDA toolkit (NVRTC) not found: the samples' CUDA modules are not compiled by the tests")
endif()

# Each kernel template file compiles alone (codegen/kernels/*.cuh: a reader can open and
# build one as CUDA), with nvcc for sm_90 and every warning an error. Templates are
# checked as far as a compiler checks a template; their instances are compiled above.
if(CUDAToolkit_NVCC_EXECUTABLE AND NOT FS_FUZZ)
  file(GLOB FS_CUDA_TEMPLATES CONFIGURE_DEPENDS ${CMAKE_CURRENT_SOURCE_DIR}/codegen/kernels/*.cuh)
  foreach(t ${FS_CUDA_TEMPLATES})
    get_filename_component(name ${t} NAME_WE)
    file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/cuda_templates/${name}.cu "#include \"${name}.cuh\"\n")
    add_test(NAME cuda_template_${name}
             COMMAND ${CUDAToolkit_NVCC_EXECUTABLE} -std=c++17 -arch=sm_90 -Werror all-warnings
                     -I ${CMAKE_CURRENT_SOURCE_DIR}/codegen/kernels -c ${CMAKE_CURRENT_BINARY_DIR}/cuda_templates/${name}.cu
                     -o ${CMAKE_CURRENT_BINARY_DIR}/cuda_templates/${name}.o)
  endforeach()
endif()
