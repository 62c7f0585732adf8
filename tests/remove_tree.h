// Removes a directory tree in the tests without std::filesystem::remove_all: libtorch.so exports
// its own std::filesystem, and where its remove_all wins symbol lookup it jumps to address 0. The
// link order in the root CMakeLists.txt avoids that here, but not with the GPU machine's GCC 13.3
// (/opt/gcc): every test that removed its temp dir that way died of SIGSEGV there. nftw needs neither.
#pragma once

#include <ftw.h>

#include <cstdio>
#include <string>

namespace darkformer::testing {

inline void RemoveTree(const std::string& path) {
  ::nftw(
      path.c_str(), [](const char* p, const struct stat*, int, struct FTW*) { return std::remove(p); }, 16,
      FTW_DEPTH | FTW_PHYS);
}

}  // namespace darkformer::testing
