# cmake/embed_maps.cmake: runtime/hf/*.json (the built-in --weights-format tables) as
# strings in one C file, so an installed fsexec carries them and needs no source tree.
# Run at build time: cmake -D DIR=runtime/hf -D OUT=hf_maps_src.c -P embed_maps.cmake
file(GLOB files RELATIVE ${DIR} ${DIR}/*.json)
list(SORT files)
set(arrays "")
set(table "")
set(i 0)
foreach(f ${files})
  file(READ ${DIR}/${f} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)"
         "\\1\n" hex "${hex}")
  string(REGEX REPLACE "\\.json$" "" name "${f}")
  string(APPEND arrays "static const char map${i}[] = {\n${hex}0};\n")
  string(APPEND table "    {\"${name}\", map${i}},\n")
  math(EXPR i "${i} + 1")
endforeach()
set(text "/* Made by cmake/embed_maps.cmake from the .json files of runtime/hf/ at build time: edit those. */\n")
string(APPEND text "#include \"runtime.h\"\n\n${arrays}\nconst RtHfBuiltin rt_hf_builtin[] = {\n${table}};\n")
string(APPEND text "const int rt_hf_n_builtin = ${i};\n")
# Written only when it changes, so a build that changed no table recompiles nothing.
if(EXISTS ${OUT})
  file(READ ${OUT} old)
endif()
if(NOT "${old}" STREQUAL "${text}")
  file(WRITE ${OUT} "${text}")
endif()
