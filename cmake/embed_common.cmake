# cmake/embed_common.cmake: what the embed scripts share (embed_kernels.cmake: CUDA
# templates; embed_maps.cmake: --weights-format tables): a file's bytes as a C array
# initializer, and writing the generated file only when it changes, so a build that
# changed no source file recompiles nothing.

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
