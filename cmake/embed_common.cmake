# cmake/embed_common.cmake: what the embed scripts share (embed_kernels.cmake: CUDA
# templates; embed_maps.cmake: --weights-format tables): a directory's files as C arrays
# and a table of them, and writing the generated file only when it changes, so a build
# that changed no source file recompiles nothing.

# The files of `dir` matching `glob` ("*.cuh"), sorted, each as `static const char
# <prefix>K[]`: their definitions into `arrays`, the rows {"NAME", <prefix>K} of a table
# into `table` (NAME: the file's name, less `strip`, a regex), their count into `count`.
function(embed_files dir glob prefix strip arrays table count)
  file(GLOB files RELATIVE ${dir} ${dir}/${glob})
  list(SORT files)
  set(a "")
  set(t "")
  set(i 0)
  foreach(f ${files})
    embed_hex(${dir}/${f} hex)
    string(REGEX REPLACE "${strip}" "" name "${f}")
    string(APPEND a "static const char ${prefix}${i}[] = {\n${hex}0};\n")
    string(APPEND t "    {\"${name}\", ${prefix}${i}},\n")
    math(EXPR i "${i} + 1")
  endforeach()
  set(${arrays} "${a}" PARENT_SCOPE)
  set(${table} "${t}" PARENT_SCOPE)
  set(${count} ${i} PARENT_SCOPE)
endfunction()

# The bytes of `path` as "0x..,0x..," sixteen to a line, into `var`.
function(embed_hex path var)
  file(READ ${path} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," hex "${hex}")
  string(REGEX REPLACE "(0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,0x..,)"
         "\\1\n" hex "${hex}")
  set(${var} "${hex}" PARENT_SCOPE)
endfunction()

function(embed_write out text)
  if(EXISTS ${out})
    file(READ ${out} old)
  endif()
  if(NOT "${old}" STREQUAL "${text}")
    file(WRITE ${out} "${text}")
  endif()
endfunction()
