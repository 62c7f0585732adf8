// Including this runs op: cuda (ops/cuda_op.h) on CPU inputs as its scan emulated on the host, for
// the whole test binary: the CPU suite checks the device kernels' own arithmetic and indexing.
#pragma once

#include <ATen/Context.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "attention/ops/cuda_op.h"
#include "attention/ops/cuda_scan_threads.h"

namespace darkformer::testing {

// LibTorch's deterministic algorithms on (as train.deterministic sets them) or off for a scope, then
// as they were. Warnings, not errors, for LibTorch's own ops that have no deterministic form (cuBLAS
// without CUBLAS_WORKSPACE_CONFIG): what the scope selects is op: cuda's own path.
class DeterministicScope {
 public:
  explicit DeterministicScope(bool on)
      : was_(at::globalContext().deterministicAlgorithms()),
        was_warn_only_(at::globalContext().deterministicAlgorithmsWarnOnly()) {
    at::globalContext().setDeterministicAlgorithms(on, /*warn_only=*/true);
  }
  ~DeterministicScope() { at::globalContext().setDeterministicAlgorithms(was_, was_warn_only_); }
  DeterministicScope(const DeterministicScope&) = delete;
  DeterministicScope& operator=(const DeterministicScope&) = delete;

 private:
  bool was_, was_warn_only_;
};

// DARKFORMER_EMULATED_THREADS=in_order or reversed runs every block of the emulation on the device's
// threads (ops/cuda_scan_threads.h) throughout the binary: a whole-suite check beside the suite's
// own (cuda_op_threads_test.cpp), slower, and not part of it.
inline const bool kCudaOpEmulatedOnTheHost = [] {
  EmulateCudaOpOnHostForTesting(true);
  if (const char* order = std::getenv("DARKFORMER_EMULATED_THREADS")) {
    const std::string name = order;
    if (name != "in_order" && name != "reversed") {
      std::fprintf(stderr, "DARKFORMER_EMULATED_THREADS=%s: expected in_order or reversed\n", order);
      std::exit(2);
    }
    cuda_scan::SetHostThreadOrderForTesting({/*device_threads=*/true, /*reversed=*/name == "reversed"});
  }
  return true;
}();

// The host emulation's order (cuda_scan_threads.h) for the scope's life, then the one before.
class ThreadOrderScope {
 public:
  explicit ThreadOrderScope(cuda_scan::HostThreadOrder order) : was_(cuda_scan::HostThreadOrderNow()) {
    cuda_scan::SetHostThreadOrderForTesting(order);
  }
  ~ThreadOrderScope() { cuda_scan::SetHostThreadOrderForTesting(was_); }
  ThreadOrderScope(const ThreadOrderScope&) = delete;
  ThreadOrderScope& operator=(const ThreadOrderScope&) = delete;

 private:
  cuda_scan::HostThreadOrder was_;
};

}  // namespace darkformer::testing
