# cmake/embed_maps.cmake: runtime/hf/NAME.json (the built-in --weights-format tables) as
# strings in one C file, so an installed fsexec carries them and needs no source tree.
# Run at build time: cmake -D DIR=runtime/hf -D OUT=hf_maps_src.c -P embed_maps.cmake
include(${CMAKE_CURRENT_LIST_DIR}/embed_common.cmake)
embed_files(${DIR} "*.json" map "\\.json$" arrays table i)
set(text "/* Made by cmake/embed_maps.cmake from the .json files of runtime/hf/ at build time: edit those. */\n")
string(APPEND text "#include \"runtime.h\"\n\n${arrays}\nconst RtHfBuiltin rt_hf_builtin[] = {\n${table}};\n")
string(APPEND text "const int rt_hf_n_builtin = ${i};\n")
embed_write(${OUT} "${text}")
