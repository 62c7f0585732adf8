// The scan emulated on the host: the device's blocks one after another, each walking the chunks
// its kernel's block walks, by one thread or the device's count (cuda_scan_threads.h).
#include "attention/ops/cuda_scan.h"
#include "attention/ops/cuda_scan_threads.h"

#include <functional>
#include <stdexcept>

namespace darkformer::cuda_scan {

namespace {

// The launches' blocks as the device's kernels take them (cuda_scan.cu): per-chunk blocks walking
// their chunks, scan blocks one per (row, slice of features), each on the host's emulated block.
void ChunkBlocks(int64_t blocks, const std::function<void(int64_t, const Block&)>& body) {
  ForEachHostBlock(blocks, [&](int64_t block) { RunHostBlock(kThreads, [&](const Block& b) { body(block, b); }); });
}
void ScanBlocks(const Launch& x, const std::function<void(int64_t, int64_t, const Block&)>& body) {
  ForEachHostBlock(x.rows * x.Slices(), [&](int64_t block) {
    RunHostBlock(kScanThreads, [&](const Block& b) { body(block / x.Slices(), block % x.Slices(), b); });
  });
}

}  // namespace

void StatesOnHost(const Launch& x) {
  ChunkBlocks(x.forward_blocks, [&](int64_t block, const Block& b) {
    for (int64_t c = block; c < x.SegmentChunkCount(); c += x.forward_blocks) {
      const int64_t row = x.SegmentRow(c), n = x.SegmentChunk(c);
      if (!x.OwnStateEnters(n)) continue;  // the row's last chunk's enters no chunk
      ChunkOwnState(b, x.RowOf(row), n, x.OwnStateOf(row, n), x.OwnRefOf(row, n), x.ResetOf(row, n),
                    x.ScratchOf(block, false));
    }
  });
  ScanBlocks(x, [&](int64_t row, int64_t slice, const Block& b) {
    EnteringStates(b, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.ForwardOf(row));
  });
}

void ForwardOnHost(const Launch& x) {
  StatesOnHost(x);
  ChunkBlocks(x.forward_blocks, [&](int64_t block, const Block& b) {
    for (int64_t c = block; c < x.SegmentChunkCount(); c += x.forward_blocks) {
      ChunkForward(b, x.RowOf(x.SegmentRow(c)), x.ForwardOf(x.SegmentRow(c)), x.SegmentChunk(c),
                   x.ScratchOf(block, false));
    }
  });
}

// The backward's blocks (row, w) take the segment's chunks first + w, first + w + W, ...
void QuerySideOnHost(const Launch& x) {
  const int64_t w = x.backward_blocks;
  ChunkBlocks(x.rows * w, [&](int64_t block, const Block& b) {
    const int64_t row = block / w;
    for (int64_t n = x.first_chunk + block % w; n < x.SegmentEnd(); n += w) {
      ChunkQuerySide(b, x.RowOf(row), x.BackwardOf(row), n, x.ScratchOf(block, true));
    }
  });
}

void KeySideOnHost(const Launch& x) {
  const int64_t w = x.backward_blocks;
  ChunkBlocks(x.rows * w, [&](int64_t block, const Block& b) {
    const int64_t row = block / w;
    for (int64_t n = x.first_chunk + block % w; n < x.SegmentEnd(); n += w) {
      if (n == 0) continue;  // chunk 0's own share reaches no earlier chunk
      ChunkKeySide(b, x.RowOf(row), x.BackwardOf(row), n, x.ZOwnOf(row, n), /*has_z=*/false, /*gradients=*/false,
                   x.ScratchOf(block, true));
    }
  });
  ScanBlocks(x, [&](int64_t row, int64_t slice, const Block& b) {
    ReverseStates(b, x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.BackwardOf(row), x.ZOf(row));
  });
  ChunkBlocks(x.rows * w, [&](int64_t block, const Block& b) {
    const int64_t row = block / w;
    for (int64_t n = x.first_chunk + block % w; n < x.SegmentEnd(); n += w) {
      ChunkKeySide(b, x.RowOf(row), x.BackwardOf(row), n, x.ZAt(row, n), /*has_z=*/n + 1 < x.Chunks(),
                   /*gradients=*/true, x.ScratchOf(block, true));
    }
  });
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
