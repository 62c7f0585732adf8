# Writes OUT, the C++ source of darkformer::BuildVersion() (util/build_version.h): `git describe`
# of SOURCE_DIR when the binary is built. Run at every build (src/CMakeLists.txt); the file is
# rewritten only when the text changes, so a build recompiles it after a commit or an edit that
# makes the tree dirty, and nothing otherwise. Outside a git checkout (a source tarball, a tree
# copied without .git) the version is "unknown".
execute_process(COMMAND git -C "${SOURCE_DIR}" describe --always --dirty --abbrev=12
                OUTPUT_VARIABLE version OUTPUT_STRIP_TRAILING_WHITESPACE ERROR_QUIET RESULT_VARIABLE status)
if(NOT status EQUAL 0 OR version STREQUAL "")
  set(version "unknown")
endif()
string(CONCAT text "// Generated at build time by src/util/build_version.cmake: do not edit.\n"
                   "#include \"util/build_version.h\"\n\n"
                   "const char* darkformer::BuildVersion() { return \"${version}\"; }\n")
set(old "")
if(EXISTS "${OUT}")
  file(READ "${OUT}" old)
endif()
if(NOT old STREQUAL text)
  file(WRITE "${OUT}" "${text}")
endif()
