// The scan on the device (see cuda_scan.h): the forward's blocks are (key row, chunk) pairs but for
// the short scan of entering states, one block per row; the backward's one block per row. Nothing
// here but the launches: the arithmetic is cuda_scan_body.h's, which the host emulation runs in the
// tests.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "attention/ops/cuda_scan.h"

namespace darkformer::cuda_scan {

namespace {

constexpr int kThreads = 256;

__device__ Block ThisBlock() { return Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}; }

// At most kThreads threads: the compiler keeps each thread within the registers a full block may use.
// The forward's three steps (cuda_scan_body.h): blocks (row, chunk), then rows, then (row, chunk).
__global__ void __launch_bounds__(kThreads) ChunkOwnStateKernel(Launch x) {
  const int64_t chunks = x.checkpoints(), r = blockIdx.x / chunks, n = blockIdx.x % chunks;
  if (n + 1 == chunks) return;  // the last chunk's own state enters no chunk
  ChunkOwnState(ThisBlock(), x.RowOf(r), n, x.OwnStateOf(r, n), x.OwnRefOf(r, n), x.ScratchOf(blockIdx.x, false));
}

__global__ void __launch_bounds__(kThreads) EnteringStatesKernel(Launch x) {
  const int64_t r = blockIdx.x;
  EnteringStates(ThisBlock(), x.RowOf(r), x.OwnStateOf(r, 0), x.OwnRefOf(r, 0), x.ForwardOf(r), x.ScratchOf(r, false));
}

__global__ void __launch_bounds__(kThreads) ChunkForwardKernel(Launch x) {
  const int64_t chunks = x.checkpoints(), r = blockIdx.x / chunks, n = blockIdx.x % chunks;
  ChunkForward(ThisBlock(), x.RowOf(r), x.ForwardOf(r), n, x.ScratchOf(blockIdx.x, false));
}

// The backward's three steps: blocks (row, w) take chunks w, w + W, ... (W blocks per row), then
// rows, then (row, w) again.
__global__ void __launch_bounds__(kThreads) ChunkReverseShareKernel(Launch x) {
  const int64_t w = x.backward_blocks_per_row, r = blockIdx.x / w;
  for (int64_t n = blockIdx.x % w; n < x.checkpoints(); n += w) {
    if (n == 0) continue;  // chunk 0's own share reaches no earlier chunk
    ChunkBackward(ThisBlock(), x.RowOf(r), x.BackwardOf(r), n, nullptr, false, x.ZOwnOf(r, n), x.ScratchOf(blockIdx.x, true));
  }
}

__global__ void __launch_bounds__(kThreads) ReverseStatesKernel(Launch x) {
  const int64_t r = blockIdx.x;
  ReverseStates(ThisBlock(), x.RowOf(r), x.BackwardOf(r), x.ZOwnOf(r, 0), x.ZOutOf(r, 0));
}

__global__ void __launch_bounds__(kThreads) ChunkBackwardKernel(Launch x) {
  const int64_t w = x.backward_blocks_per_row, r = blockIdx.x / w, chunks = x.checkpoints();
  for (int64_t n = blockIdx.x % w; n < chunks; n += w) {
    ChunkBackward(ThisBlock(), x.RowOf(r), x.BackwardOf(r), n, n + 1 < chunks ? x.ZOutOf(r, n) : nullptr, true,
                  nullptr, x.ScratchOf(blockIdx.x, true));
  }
}

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string("op: cuda: ") + what + ": " + cudaGetErrorString(error));
}

}  // namespace

bool DeviceKernelsBuilt() { return true; }

void ForwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(x.rows * x.checkpoints()), rows = static_cast<unsigned>(x.rows);
  ChunkOwnStateKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks' own states)");
  EnteringStatesKernel<<<rows, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (entering states)");
  ChunkForwardKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks)");
}

void BackwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(x.rows * x.backward_blocks_per_row), rows = static_cast<unsigned>(x.rows);
  ChunkReverseShareKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (chunks' own reverse states)");
  ReverseStatesKernel<<<rows, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (reverse states)");
  ChunkBackwardKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (chunks)");
}

}  // namespace darkformer::cuda_scan
