// The scan emulated on the host: each key row by one thread standing for its block (see cuda_scan.h).
#include "attention/ops/cuda_scan.h"

#include <stdexcept>

namespace darkformer::cuda_scan {

void ForwardOnHost(const Launch& x) {
  for (int64_t r = 0; r < x.rows; ++r) ScanForward(Block{}, x.RowOf(r), x.ForwardOf(r), x.ScratchOf(r));
}

void BackwardOnHost(const Launch& x) {
  for (int64_t r = 0; r < x.rows; ++r) ScanBackward(Block{}, x.RowOf(r), x.BackwardOf(r), x.ScratchOf(r));
}

#ifndef DARKFORMER_CUDA_OP
bool DeviceKernelsBuilt() { return false; }
void ForwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void BackwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
#endif

}  // namespace darkformer::cuda_scan
