// Including this runs op: cuda (ops/cuda_op.h) on CPU inputs as its scan emulated on the host, for
// the whole test binary: the CPU suite checks the device kernels' own arithmetic and indexing.
#pragma once

#include <ATen/Context.h>

#include "attention/ops/cuda_op.h"

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

inline const bool kCudaOpEmulatedOnTheHost = [] {
  EmulateCudaOpOnHostForTesting(true);
  return true;
}();

}  // namespace darkformer::testing
