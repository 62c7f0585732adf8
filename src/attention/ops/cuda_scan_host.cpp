// The scan emulated on the host: each block by one thread, one block after another, in the
// device's order of steps (see cuda_scan.h).
#include "attention/ops/cuda_scan.h"

#include <algorithm>
#include <stdexcept>

namespace darkformer::cuda_scan {

void StatesOnHost(const Launch& x) {
  for (int64_t c = 0; c < x.SegmentChunkCount(); ++c) {
    const int64_t row = x.SegmentRow(c), n = x.SegmentChunk(c);
    if (!x.OwnStateEnters(n)) continue;  // the row's last chunk's enters no chunk
    ChunkOwnState(Block{}, x.RowOf(row), n, x.OwnStateOf(row, n), x.OwnRefOf(row, n), x.ResetOf(row, n),
                  x.ScratchOf(c % x.forward_blocks, false));
  }
  for (int64_t block = 0; block < x.rows * x.Slices(); ++block) {
    const int64_t row = block / x.Slices(), slice = block % x.Slices();
    EnteringStates(Block{}, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.ForwardOf(row));
  }
}

void ForwardOnHost(const Launch& x) {
  StatesOnHost(x);
  for (int64_t c = 0; c < x.SegmentChunkCount(); ++c) {
    const int64_t row = x.SegmentRow(c), n = x.SegmentChunk(c);
    ChunkForward(Block{}, x.RowOf(row), x.ForwardOf(row), n, x.ScratchOf(c % x.forward_blocks, false));
  }
}

// The backward's blocks (row, w) take the segment's chunks first + w, first + w + W, ...
void QuerySideOnHost(const Launch& x) {
  const int64_t w = x.backward_blocks;
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = x.first_chunk; n < x.SegmentEnd(); ++n) {
      ChunkQuerySide(Block{}, x.RowOf(row), x.BackwardOf(row), n,
                     x.ScratchOf(row * w + (n - x.first_chunk) % w, true));
    }
  }
}

void KeySideOnHost(const Launch& x) {
  const int64_t w = x.backward_blocks;
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = std::max<int64_t>(x.first_chunk, 1); n < x.SegmentEnd(); ++n) {  // chunk 0's share reaches nothing
      ChunkKeySide(Block{}, x.RowOf(row), x.BackwardOf(row), n, x.ZOwnOf(row, n), /*has_z=*/false,
                   /*gradients=*/false, x.ScratchOf(row * w + (n - x.first_chunk) % w, true));
    }
  }
  for (int64_t block = 0; block < x.rows * x.Slices(); ++block) {
    const int64_t row = block / x.Slices(), slice = block % x.Slices();
    ReverseStates(Block{}, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.BackwardOf(row), x.ZOf(row));
  }
  for (int64_t row = 0; row < x.rows; ++row) {
    for (int64_t n = x.first_chunk; n < x.SegmentEnd(); ++n) {
      ChunkKeySide(Block{}, x.RowOf(row), x.BackwardOf(row), n, x.ZAt(row, n), /*has_z=*/n + 1 < x.Chunks(),
                   /*gradients=*/true, x.ScratchOf(row * w + (n - x.first_chunk) % w, true));
    }
  }
}

#ifndef DARKFORMER_CUDA_OP
bool DeviceKernelsBuilt() { return false; }
bool ScratchFitsInSharedMemory(int64_t) { return false; }
int64_t ResidentBlocks(bool) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void StatesOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void ForwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void QuerySideOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void KeySideOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
#endif

}  // namespace darkformer::cuda_scan
