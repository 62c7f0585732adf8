// The scan emulated on the host: each block by one thread, one block after another, in the
// device's order of steps (see cuda_scan.h).
#include "attention/ops/cuda_scan.h"

#include <stdexcept>

namespace darkformer::cuda_scan {

void ForwardOnHost(const Launch& x) {
  const int64_t mv = x.features * (x.value_dim + 1);
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    const Segment s = x.SegmentAt(x.SegmentOfChunk(c));
    const int64_t n = c - s.first_chunk;
    if (n + 1 == x.Chunks(s)) continue;  // the last chunk's own state enters no chunk
    ChunkOwnState(Block{}, x.RowOf(s), n, x.OwnStateOf(s) + n * mv, x.OwnRefOf(s) + n * x.features,
                  x.ScratchOf(c, false));
  }
  for (int64_t i = 0; i < x.segment_count; ++i) {
    const Segment s = x.SegmentAt(i);
    EnteringStates(Block{}, x.RowOf(s), x.OwnStateOf(s), x.OwnRefOf(s), x.ForwardOf(s), x.ScratchOf(i, false));
  }
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    const Segment s = x.SegmentAt(x.SegmentOfChunk(c));
    ChunkForward(Block{}, x.RowOf(s), x.ForwardOf(s), c - s.first_chunk, x.ScratchOf(c, false));
  }
}

void PrefillOnHost(const Launch& x, float* final_states, float* final_refs) {
  const int64_t mv = x.features * (x.value_dim + 1);
  for (int64_t c = 0; c < x.chunk_count; ++c) {
    const Segment s = x.SegmentAt(x.SegmentOfChunk(c));
    const int64_t n = c - s.first_chunk;
    ChunkOwnState(Block{}, x.RowOf(s), n, x.OwnStateOf(s) + n * mv, x.OwnRefOf(s) + n * x.features,
                  x.ScratchOf(c, false));
  }
  for (int64_t i = 0; i < x.segment_count; ++i) {
    const Segment s = x.SegmentAt(i);
    EnteringStates(Block{}, x.RowOf(s), x.OwnStateOf(s), x.OwnRefOf(s), x.ForwardOf(s), x.ScratchOf(i, false),
                   final_states + i * mv, final_refs + i * x.features);
  }
}

void BackwardOnHost(const Launch& x) {
  const int64_t mv = x.features * (x.value_dim + 1), w = x.backward_blocks;
  for (int64_t i = 0; i < x.segment_count; ++i) {
    const Segment s = x.SegmentAt(i);
    for (int64_t n = 1; n < x.Chunks(s); ++n) {  // chunk 0's own share reaches no earlier chunk
      ChunkBackward(Block{}, x.RowOf(s), x.BackwardOf(s), n, nullptr, /*gradients=*/false, x.ZOwnOf(s) + n * mv,
                    x.ScratchOf(i * w + n % w, true));
    }
  }
  for (int64_t i = 0; i < x.segment_count; ++i) {
    const Segment s = x.SegmentAt(i);
    ReverseStates(Block{}, x.RowOf(s), x.BackwardOf(s), x.ZOwnOf(s), x.ZOutOf(s));
  }
  for (int64_t i = 0; i < x.segment_count; ++i) {
    const Segment s = x.SegmentAt(i);
    const int64_t chunks = x.Chunks(s);
    for (int64_t n = 0; n < chunks; ++n) {
      ChunkBackward(Block{}, x.RowOf(s), x.BackwardOf(s), n, n + 1 < chunks ? x.ZOutOf(s) + n * mv : nullptr,
                    /*gradients=*/true, nullptr, x.ScratchOf(i * w + n % w, true));
    }
  }
}

#ifndef DARKFORMER_CUDA_OP
bool DeviceKernelsBuilt() { return false; }
void ForwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
void PrefillOnDevice(const Launch&, float*, float*, void*) {
  throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)");
}
void BackwardOnDevice(const Launch&, void*) { throw std::runtime_error("op: cuda: this build has no CUDA kernels (CMake found no nvcc)"); }
#endif

}  // namespace darkformer::cuda_scan
