// Including this runs op: cuda (ops/cuda_op.h) on CPU inputs as its scan emulated on the host, for
// the whole test binary: the CPU suite checks the device kernels' own arithmetic and indexing.
#pragma once

#include "attention/ops/cuda_op.h"

namespace darkformer::testing {

inline const bool kCudaOpEmulatedOnTheHost = [] {
  EmulateCudaOpOnHostForTesting(true);
  return true;
}();

}  // namespace darkformer::testing
