// darkformer keeps freed memory in its heap (util/heap_retention.h): a large block freed and
// allocated again is not faulted in again, page by page, as glibc's mmap'd blocks are; and a
// user's own malloc settings in the environment are left alone.
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <optional>
#include <string>

#include "util/heap_retention.h"

namespace darkformer {
namespace {

#if defined(__GLIBC__)
long MinorPageFaults() {
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return usage.ru_minflt;
}

// Sets an environment variable for one scope, then puts back what was there.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* old = std::getenv(name)) old_ = old;
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (old_) {
      setenv(name_, old_->c_str(), 1);
    } else {
      unsetenv(name_);
    }
  }

 private:
  const char* name_;
  std::optional<std::string> old_;
};

// Writes one byte per page, through a volatile pointer so that no write is optimised away.
void TouchEveryPage(void* block, size_t bytes) {
  volatile char* p = static_cast<volatile char*>(block);
  for (size_t i = 0; i < bytes; i += 4096) p[i] = 1;
}

TEST(HeapRetention, LeavesTheUsersMallocSettingsAlone) {
  {
    const ScopedEnv env("MALLOC_TOP_PAD_", "0");
    EXPECT_FALSE(RetainFreedHeapMemory());
  }
  const ScopedEnv env("GLIBC_TUNABLES", "glibc.malloc.arena_max=2");
  EXPECT_FALSE(RetainFreedHeapMemory());
}

TEST(HeapRetention, AFreedLargeBlockIsReusedWithoutFaultingItsPagesAgain) {
  for (char** entry = environ; *entry != nullptr; ++entry) {
    if (std::string(*entry).rfind("MALLOC_", 0) == 0) GTEST_SKIP() << "the environment sets malloc's options";
  }
  constexpr size_t kBytes = size_t{64} << 20;  // above glibc's largest mmap threshold (32 MiB)
  constexpr long kPages = kBytes / 4096;
  long control = MinorPageFaults();  // malloc's default, for the log: every page again (fewer with huge pages)
  for (int i = 0; i < 2; ++i) {
    void* block = std::malloc(kBytes);
    ASSERT_NE(block, nullptr);
    if (i == 1) control = MinorPageFaults();
    TouchEveryPage(block, kBytes);
    if (i == 1) control = MinorPageFaults() - control;
    std::free(block);
  }
  ASSERT_TRUE(RetainFreedHeapMemory());
  void* first = std::malloc(kBytes);
  ASSERT_NE(first, nullptr);
  TouchEveryPage(first, kBytes);
  std::free(first);
  const long before = MinorPageFaults();
  void* second = std::malloc(kBytes);
  ASSERT_NE(second, nullptr);
  TouchEveryPage(second, kBytes);
  const long faults = MinorPageFaults() - before;
  std::free(second);
  std::printf("[heap retention] page faults touching a reallocated 64 MiB block: %ld of %ld pages (malloc's default: %ld)\n",
              faults, kPages, control);
  EXPECT_LT(faults, kPages / 16);  // an mmap'd block faults every page again
}
#endif

}  // namespace
}  // namespace darkformer
