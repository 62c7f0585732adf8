// The scan emulated on the host: each block by one thread, one block after another, in the
// device's order of steps (see cuda_scan.h).
#include "attention/ops/cuda_scan.h"

#include <stdexcept>

namespace darkformer::cuda_scan {

void ForwardOnHost(const Launch& x) {
  const int64_t chunks = x.checkpoints();
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t n = 0; n + 1 < chunks; ++n) {  // the last chunk's own state enters no chunk
      ChunkOwnState(Block{}, x.RowOf(r), n, x.OwnStateOf(r, n), x.OwnRefOf(r, n), x.ScratchOf(r * chunks + n, false));
    }
  }
  for (int64_t r = 0; r < x.rows; ++r) {
    EnteringStates(Block{}, x.RowOf(r), x.OwnStateOf(r, 0), x.OwnRefOf(r, 0), x.ForwardOf(r), x.ScratchOf(r, false));
  }
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t n = 0; n < chunks; ++n) ChunkForward(Block{}, x.RowOf(r), x.ForwardOf(r), n, x.ScratchOf(r * chunks + n, false));
  }
}

void BackwardOnHost(const Launch& x) {
  const int64_t chunks = x.checkpoints(), w = x.backward_blocks_per_row;
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t n = 1; n < chunks; ++n) {  // chunk 0's own share reaches no earlier chunk
      ChunkBackward(Block{}, x.RowOf(r), x.BackwardOf(r), n, nullptr, /*gradients=*/false, x.ZOwnOf(r, n),
                    x.ScratchOf(r * w + n % w, true));
    }
  }
  for (int64_t r = 0; r < x.rows; ++r) ReverseStates(Block{}, x.RowOf(r), x.BackwardOf(r), x.ZOwnOf(r, 0), x.ZOutOf(r, 0));
  for (int64_t r = 0; r < x.rows; ++r) {
    for (int64_t n = 0; n < chunks; ++n) {
      ChunkBackward(Block{}, x.RowOf(r), x.BackwardOf(r), n, n + 1 < chunks ? x.ZOutOf(r, n) : nullptr,
                    /*gradients=*/true, nullptr, x.ScratchOf(r * w + n % w, true));
    }
  }
}

#ifndef DARKFORMER_CUDA_OP
bool DeviceKernelsBuilt() { return false; }
void ForwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void BackwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
#endif

}  // namespace darkformer::cuda_scan
