// The scan on the device (see cuda_scan.h): one block per chunk of every segment (a key row, or a
// document of it), or per segment for the short scans over chunks. Nothing
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
// The forward's three steps (cuda_scan_body.h): one block per chunk of every segment, then one per
// segment, then one per chunk again.
__global__ void __launch_bounds__(kThreads) ChunkOwnStateKernel(Launch x) {
  const Segment s = x.SegmentAt(x.SegmentOfChunk(blockIdx.x));
  const int64_t n = blockIdx.x - s.first_chunk, mv = x.features * (x.value_dim + 1);
  if (n + 1 == x.Chunks(s)) return;  // the last chunk's own state enters no chunk
  ChunkOwnState(ThisBlock(), x.RowOf(s), n, x.OwnStateOf(s) + n * mv, x.OwnRefOf(s) + n * x.features,
                x.ScratchOf(blockIdx.x, false));
}

__global__ void __launch_bounds__(kThreads) EnteringStatesKernel(Launch x) {
  const Segment s = x.SegmentAt(blockIdx.x);
  EnteringStates(ThisBlock(), x.RowOf(s), x.OwnStateOf(s), x.OwnRefOf(s), x.ForwardOf(s), x.ScratchOf(blockIdx.x, false));
}

// A prefill's steps: every chunk's own state, the last's too; then each segment's states and the
// one after it.
__global__ void __launch_bounds__(kThreads) PrefillOwnStateKernel(Launch x) {
  const Segment s = x.SegmentAt(x.SegmentOfChunk(blockIdx.x));
  const int64_t n = blockIdx.x - s.first_chunk, mv = x.features * (x.value_dim + 1);
  ChunkOwnState(ThisBlock(), x.RowOf(s), n, x.OwnStateOf(s) + n * mv, x.OwnRefOf(s) + n * x.features,
                x.ScratchOf(blockIdx.x, false));
}

__global__ void __launch_bounds__(kThreads) PrefillStatesKernel(Launch x, float* final_states, float* final_refs) {
  const Segment s = x.SegmentAt(blockIdx.x);
  const int64_t mv = x.features * (x.value_dim + 1);
  EnteringStates(ThisBlock(), x.RowOf(s), x.OwnStateOf(s), x.OwnRefOf(s), x.ForwardOf(s), x.ScratchOf(blockIdx.x, false),
                 final_states + blockIdx.x * mv, final_refs + blockIdx.x * x.features);
}

__global__ void __launch_bounds__(kThreads) ChunkForwardKernel(Launch x) {
  const Segment s = x.SegmentAt(x.SegmentOfChunk(blockIdx.x));
  ChunkForward(ThisBlock(), x.RowOf(s), x.ForwardOf(s), blockIdx.x - s.first_chunk, x.ScratchOf(blockIdx.x, false));
}

// The backward's three steps: blocks (segment, w) take chunks w, w + W, ... of their segment, then
// one block per segment, then (segment, w) again.
__global__ void __launch_bounds__(kThreads) ChunkReverseShareKernel(Launch x) {
  const int64_t w = x.backward_blocks, mv = x.features * (x.value_dim + 1);
  const Segment s = x.SegmentAt(blockIdx.x / w);
  for (int64_t n = blockIdx.x % w; n < x.Chunks(s); n += w) {
    if (n == 0) continue;  // chunk 0's own share reaches no earlier chunk
    ChunkBackward(ThisBlock(), x.RowOf(s), x.BackwardOf(s), n, nullptr, false, x.ZOwnOf(s) + n * mv,
                  x.ScratchOf(blockIdx.x, true));
  }
}

__global__ void __launch_bounds__(kThreads) ReverseStatesKernel(Launch x) {
  const Segment s = x.SegmentAt(blockIdx.x);
  ReverseStates(ThisBlock(), x.RowOf(s), x.BackwardOf(s), x.ZOwnOf(s), x.ZOutOf(s));
}

__global__ void __launch_bounds__(kThreads) ChunkBackwardKernel(Launch x) {
  const int64_t w = x.backward_blocks, mv = x.features * (x.value_dim + 1);
  const Segment s = x.SegmentAt(blockIdx.x / w);
  const int64_t chunks = x.Chunks(s);
  for (int64_t n = blockIdx.x % w; n < chunks; n += w) {
    ChunkBackward(ThisBlock(), x.RowOf(s), x.BackwardOf(s), n, n + 1 < chunks ? x.ZOutOf(s) + n * mv : nullptr, true,
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
  const auto blocks = static_cast<unsigned>(x.chunk_count), segments = static_cast<unsigned>(x.segment_count);
  ChunkOwnStateKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks' own states)");
  EnteringStatesKernel<<<segments, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (entering states)");
  ChunkForwardKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks)");
}

void PrefillOnDevice(const Launch& x, float* final_states, float* final_refs, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  PrefillOwnStateKernel<<<static_cast<unsigned>(x.chunk_count), kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "prefill launch (chunks' own states)");
  PrefillStatesKernel<<<static_cast<unsigned>(x.segment_count), kThreads, 0, on>>>(x, final_states, final_refs);
  Check(cudaGetLastError(), "prefill launch (states)");
}

void BackwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(x.segment_count * x.backward_blocks),
             segments = static_cast<unsigned>(x.segment_count);
  ChunkReverseShareKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (chunks' own reverse states)");
  ReverseStatesKernel<<<segments, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (reverse states)");
  ChunkBackwardKernel<<<blocks, kThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (chunks)");
}

}  // namespace darkformer::cuda_scan
