# Turns kernel template files into one C file of strings, each keyed by
# its folder (the target: host, gpu) and its name without extension (the
# op kind, or "prelude"):
#   const ds4_template ds4_templates[] = {{"host", "rmsnorm", "..."}, ...};
# Run as: cmake -DOUT=file.c -DFILES=kernels/host/a.c|kernels/gpu/a.hip -P embed.cmake
set(body "/* Generated from compiler/kernels by embed.cmake; do not edit. */\n")
string(APPEND body "#include \"templates.h\"\n\nconst ds4_template ds4_templates[] = {\n")
set(count 0)
string(REPLACE "|" ";" FILES "${FILES}")
foreach(f IN LISTS FILES)
  get_filename_component(kind ${f} NAME_WE)
  get_filename_component(dir ${f} DIRECTORY)
  get_filename_component(target ${dir} NAME)
  file(READ ${f} hex HEX)
  string(REGEX REPLACE "([0-9a-f][0-9a-f])" "0x\\1," bytes "${hex}")
  string(APPEND body "  {\"${target}\", \"${kind}\", (const char[]){${bytes}0x00}},\n")
  math(EXPR count "${count} + 1")
endforeach()
string(APPEND body "};\nconst int ds4_ntemplates = ${count};\n")
file(WRITE ${OUT}.tmp "${body}")
file(RENAME ${OUT}.tmp ${OUT})
