// See heap_retention.h.
#include "util/heap_retention.h"

#include <cstdlib>
#include <cstring>

#if defined(__GLIBC__)
#include <malloc.h>
#endif

extern char** environ;

namespace darkformer {

namespace {

bool UserChoseMallocSettings() {
  for (char** entry = environ; entry != nullptr && *entry != nullptr; ++entry) {
    const char* e = *entry;
    if (std::strncmp(e, "MALLOC_", 7) == 0) return true;
    if (std::strncmp(e, "GLIBC_TUNABLES=", 15) == 0 && std::strstr(e, "glibc.malloc.") != nullptr) return true;
  }
  return false;
}

}  // namespace

bool RetainFreedHeapMemory() {
#if defined(__GLIBC__)
  if (UserChoseMallocSettings()) return false;
  // No block from mmap (each would be unmapped on free and faulted in again), and the heap's free
  // top handed back only above 1 GiB. Where the heap cannot grow, glibc still falls back to mmap.
  const bool no_mmap = mallopt(M_MMAP_MAX, 0) == 1;
  const bool no_trim = mallopt(M_TRIM_THRESHOLD, 1 << 30) == 1;
  return no_mmap && no_trim;
#else
  return false;
#endif
}

}  // namespace darkformer
