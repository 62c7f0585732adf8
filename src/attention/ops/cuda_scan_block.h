// The executor of the CUDA operator's scan (cuda_scan_body.h): a CUDA block, or one host thread
// that emulates it, and its one kind of step.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#define DF_HD __host__ __device__
#define DF_EXP2 exp2f
#else
#include <cmath>
#define DF_HD
#define DF_EXP2 std::exp2
#endif

namespace darkformer::cuda_scan {

// Threads per block of every launch (cuda_scan.cu), and the floats of shared memory each warp
// stages its matrix tiles in (cuda_scan_matmul.h: A 16 x 8, B 8 x 16, C 16 x 16).
constexpr int kThreads = 256;
constexpr int kTileFloats = 16 * 8 + 8 * 16 + 16 * 16;

// The executor: a CUDA block (tid = threadIdx.x of size = blockDim.x, tiles its warps' shared
// memory), or one host thread (0 of 1, no tiles).
struct Block {
  int tid = 0, size = 1;
  float* tiles = nullptr;
  DF_HD void Sync() const {
#ifdef __CUDA_ARCH__
    __syncthreads();
#endif
  }
};

// *to += value where other blocks may add to the same element in the same launch: an atomic add on
// the device (its order, and so the sum's last bits, may change from run to run), in order on the
// host thread.
DF_HD inline void AddShared(float* to, float value) {
#ifdef __CUDA_ARCH__
  atomicAdd(to, value);
#else
  *to += value;
#endif
}

// f(i) for i in [0, n), split between the block's threads, then a barrier.
template <typename F>
DF_HD void ParallelFor(const Block& b, int64_t n, F f) {
  for (int64_t i = b.tid; i < n; i += b.size) f(i);
  b.Sync();
}

}  // namespace darkformer::cuda_scan
