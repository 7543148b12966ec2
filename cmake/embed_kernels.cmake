# cmake/embed_kernels.cmake: codegen/kernels/*.cuh as byte arrays in one C file, so fsc
# carries the kernel templates and a plan's module needs nothing from the source tree.
# Run at build time: cmake -D DIR=codegen/kernels -D OUT=kernels_src.c -P embed_kernels.cmake
include(${CMAKE_CURRENT_LIST_DIR}/embed_common.cmake)
embed_files(${DIR} "*.cuh" src "^$" arrays table i)
set(text "/* Made by cmake/embed_kernels.cmake from the .cuh files of codegen/kernels/ at build time: edit those. */\n")
string(APPEND text "#include \"cuda.h\"\n\n${arrays}\nconst CuSource cu_sources[] = {\n${table}};\n")
string(APPEND text "const int cu_n_sources = ${i};\n")
embed_write(${OUT} "${text}")
