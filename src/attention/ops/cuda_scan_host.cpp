// The scan emulated on the host: each block by one thread, one block after another, in the
// device's order of steps (see cuda_scan.h).
#include "attention/ops/cuda_scan.h"

#include <stdexcept>

namespace darkformer::cuda_scan {

void StatesOnHost(const Launch& x) {
  const int64_t chunks = x.Chunks();
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    const int64_t row = c / chunks, n = c % chunks;
    if (n + 1 == chunks) continue;  // the last chunk's own state enters no chunk
    ChunkOwnState(Block{}, x.RowOf(row), n, x.OwnStateOf(row, n), x.OwnRefOf(row, n), x.resets + c,
                  x.ScratchOf(c % x.forward_blocks, false));
  }
  for (int64_t block = 0; block < x.rows * x.Slices(); ++block) {
    const int64_t row = block / x.Slices(), slice = block % x.Slices();
    EnteringStates(Block{}, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.ForwardOf(row));
  }
}

void ForwardOnHost(const Launch& x) {
  StatesOnHost(x);
  const int64_t chunks = x.Chunks();
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    ChunkForward(Block{}, x.RowOf(c / chunks), x.ForwardOf(c / chunks), c % chunks,
                 x.ScratchOf(c % x.forward_blocks, false));
  }
}

void PrefillOnHost(const Launch& x, float* final_states, float* final_refs) {
  const int64_t mv = x.features * (x.value_dim + 1), chunks = x.Chunks();
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    const int64_t row = c / chunks, n = c % chunks;
    const bool last = n + 1 == chunks;  // its own state goes to the row's final state
    ChunkOwnState(Block{}, x.RowOf(row), n, last ? final_states + row * mv : x.OwnStateOf(row, n),
                  last ? final_refs + row * x.features : x.OwnRefOf(row, n), x.resets + c,
                  x.ScratchOf(c % x.forward_blocks, false));
  }
  for (int64_t block = 0; block < x.rows * x.Slices(); ++block) {
    const int64_t row = block / x.Slices(), slice = block % x.Slices();
    EnteringStates(Block{}, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.ForwardOf(row),
                   final_states + row * mv, final_refs + row * x.features);
  }
}

void QuerySideOnHost(const Launch& x) {
  const int64_t w = x.backward_blocks, chunks = x.Chunks();
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = 0; n < chunks; ++n) {
      ChunkQuerySide(Block{}, x.RowOf(row), x.BackwardOf(row), n, x.ScratchOf(row * w + n % w, true));
    }
  }
}

void KeySideOnHost(const Launch& x) {
  const int64_t mv = x.features * (x.value_dim + 1), w = x.backward_blocks, chunks = x.Chunks();
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = 1; n < chunks; ++n) {  // chunk 0's own share reaches no earlier chunk
      ChunkKeySide(Block{}, x.RowOf(row), x.BackwardOf(row), n, x.ZOwnOf(row, n), /*has_z=*/false,
                   /*gradients=*/false, x.ScratchOf(row * w + n % w, true));
    }
  }
  for (int64_t block = 0; block < x.rows * x.Slices(); ++block) {
    const int64_t row = block / x.Slices(), slice = block % x.Slices();
    ReverseStates(Block{}, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.BackwardOf(row), x.ZOf(row));
  }
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = 0; n < chunks; ++n) {
      ChunkKeySide(Block{}, x.RowOf(row), x.BackwardOf(row), n, x.ZOf(row) + n * mv, /*has_z=*/n + 1 < chunks,
                   /*gradients=*/true, x.ScratchOf(row * w + n % w, true));
    }
  }
}

#ifndef DARKFORMER_CUDA_OP
bool DeviceKernelsBuilt() { return false; }
bool ScratchFitsInSharedMemory(int64_t) { return false; }
int64_t ResidentBlocks(bool) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void StatesOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void ForwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void PrefillOnDevice(const Launch&, float*, float*, void*) {
  throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
}
void QuerySideOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void KeySideOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
#endif

}  // namespace darkformer::cuda_scan
