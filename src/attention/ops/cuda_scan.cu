// The scan on the device (see cuda_scan.h): one block per chunk of every key row, or per row for
// the short scans over chunks. Nothing
// here but the launches: the arithmetic is cuda_scan_body.h's, which the host emulation runs in the
// tests.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <stdexcept>
#include <string>

#include "attention/ops/cuda_scan.h"

namespace darkformer::cuda_scan {

namespace {

static_assert(kThreads % 32 == 0, "whole warps: the matrix products go warp by warp");

// One array of shared memory per kernel (a __shared__ in a device function is allocated once for
// each kernel that calls it): the matrix products' panels and tiles (cuda_scan_matmul.h).
__device__ Block ThisBlock() {
  __shared__ __align__(32) float tiles[kMatMulFloats];
  return Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), tiles};
}

// A per-chunk block's scratch: its own shared memory where the launch gives it (Launch::
// scratch_shared: the launch's dynamic shared memory, ScratchFloats floats), else its slot of the
// call's buffer in global memory. The arithmetic is the same either way: only where it lives.
__device__ Scratch ScratchFor(const Launch& x, bool backward) {
  extern __shared__ __align__(16) float shared_scratch[];
  return x.scratch_shared[backward ? 1 : 0]
             ? Scratch::Carve(shared_scratch, x.features, x.value_dim, x.group, x.sub, backward)
             : x.ScratchOf(blockIdx.x, backward);
}

// At most kThreads threads, at least one block an SM: the compiler keeps each thread within the
// registers a full block may use. Without the 1, ptxas chose 128 registers for ChunkOwnStateKernel
// (two blocks an SM) and spilled 234-270 bytes a thread; with it, no spill.
// The forward's three steps (cuda_scan_body.h): blocks that take the segment's chunks b, b + F,
// ... (F = forward_blocks; Launch::SegmentChunk), then one block per (row, slice of features), then
// chunks again.
__global__ void __launch_bounds__(kThreads, 1) ChunkOwnStateKernel(Launch x) {
  for (int64_t c = blockIdx.x; c < x.SegmentChunkCount(); c += gridDim.x) {
    const int64_t row = x.SegmentRow(c), n = x.SegmentChunk(c);
    if (!x.OwnStateEnters(n)) continue;  // the row's last chunk's enters no chunk
    ChunkOwnState(ThisBlock(), x.RowOf(row), n, x.OwnStateOf(row, n), x.OwnRefOf(row, n), x.ResetOf(row, n),
                  ScratchFor(x, false));
  }
}

// The scans over chunks take no products, so no shared memory: kScanThreads threads, one block per
// (row, slice of features).
__device__ Block ScanBlock() { return Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x), nullptr}; }

__global__ void __launch_bounds__(kScanThreads, kScanBlocksPerSm) EnteringStatesKernel(Launch x) {
  const int64_t row = blockIdx.x / x.Slices(), slice = blockIdx.x % x.Slices();
  EnteringStates(ScanBlock(), x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.ForwardOf(row));
}

__global__ void __launch_bounds__(kThreads, 1) ChunkForwardKernel(Launch x) {
  for (int64_t c = blockIdx.x; c < x.SegmentChunkCount(); c += gridDim.x) {
    const int64_t row = x.SegmentRow(c);
    ChunkForward(ThisBlock(), x.RowOf(row), x.ForwardOf(row), x.SegmentChunk(c), ScratchFor(x, false));
  }
}

// The backward's launches: the query side, blocks (row, w) taking chunks first + w, first + w + W,
// ... of their row's segment; then the key side's three steps: (row, w) again, one block per
// (row, slice of features), (row, w) again.
__global__ void __launch_bounds__(kThreads, 1) QuerySideKernel(Launch x) {
  const int64_t w = x.backward_blocks, row = blockIdx.x / w;
  for (int64_t n = x.first_chunk + blockIdx.x % w; n < x.SegmentEnd(); n += w) {
    ChunkQuerySide(ThisBlock(), x.RowOf(row), x.BackwardOf(row), n, ScratchFor(x, true));
  }
}

__global__ void __launch_bounds__(kThreads, 1) ReverseShareKernel(Launch x) {
  const int64_t w = x.backward_blocks, row = blockIdx.x / w;
  for (int64_t n = x.first_chunk + blockIdx.x % w; n < x.SegmentEnd(); n += w) {
    if (n == 0) continue;  // chunk 0's own share reaches no earlier chunk
    ChunkKeySide(ThisBlock(), x.RowOf(row), x.BackwardOf(row), n, x.ZOwnOf(row, n), /*has_z=*/false,
                 /*gradients=*/false, ScratchFor(x, true));
  }
}

__global__ void __launch_bounds__(kScanThreads, kScanBlocksPerSm) ReverseStatesKernel(Launch x) {
  const int64_t row = blockIdx.x / x.Slices(), slice = blockIdx.x % x.Slices();
  ReverseStates(ScanBlock(), x.RowOf(row), x.SliceFirst(slice), x.SliceLast(slice), x.BackwardOf(row), x.ZOf(row));
}

__global__ void __launch_bounds__(kThreads, 1) KeySideKernel(Launch x) {
  const int64_t w = x.backward_blocks, row = blockIdx.x / w;
  for (int64_t n = x.first_chunk + blockIdx.x % w; n < x.SegmentEnd(); n += w) {
    ChunkKeySide(ThisBlock(), x.RowOf(row), x.BackwardOf(row), n, x.ZAt(row, n), /*has_z=*/n + 1 < x.Chunks(),
                 /*gradients=*/true, ScratchFor(x, true));
  }
}

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string("op: cuda: ") + what + ": " + cudaGetErrorString(error));
}

}  // namespace

bool DeviceKernelsBuilt() { return true; }

namespace {

// The launches that carve a scratch (ScratchFor) and the dynamic shared memory each may take.
const void* const kScratchKernels[] = {
    reinterpret_cast<const void*>(ChunkOwnStateKernel), reinterpret_cast<const void*>(ChunkForwardKernel),
    reinterpret_cast<const void*>(QuerySideKernel), reinterpret_cast<const void*>(ReverseShareKernel),
    reinterpret_cast<const void*>(KeySideKernel)};

size_t SharedBytes(const Launch& x, bool backward) {
  return x.scratch_shared[backward ? 1 : 0] ? static_cast<size_t>(x.ScratchFloats(backward)) * sizeof(float) : 0;
}

// compute(device) for the current device, once per device (the first kDevices; any later one each
// time): `known` holds the value + 1, 0 where not asked yet.
constexpr int kDevices = 64;
template <typename Compute>
int64_t OncePerDevice(std::atomic<int64_t> (&known)[kDevices], Compute compute) {
  int device = 0;
  Check(cudaGetDevice(&device), "device");
  if (device < kDevices) {
    if (const int64_t k = known[device].load(); k > 0) return k - 1;
  }
  const int64_t value = compute(device);
  if (device < kDevices) known[device].store(value + 1);
  return value;
}

}  // namespace

bool ScratchFitsInSharedMemory(int64_t floats) {
  static std::atomic<int64_t> known[kDevices] = {};
  const int64_t limit = OncePerDevice(known, [](int device) {
    // The device's opt-in limit per block, less each kernel's static shared memory (the panels);
    // each kernel is then allowed that much dynamic shared memory, once per device.
    int optin = 0;
    Check(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device), "shared memory per block");
    int64_t bytes = optin;
    for (const void* kernel : kScratchKernels) {
      cudaFuncAttributes attributes{};
      Check(cudaFuncGetAttributes(&attributes, kernel), "kernel attributes");
      bytes = std::min<int64_t>(bytes, optin - static_cast<int64_t>(attributes.sharedSizeBytes));
    }
    bytes = std::max<int64_t>(bytes, 0);
    for (const void* kernel : kScratchKernels) {
      // A device that refuses leaves every scratch in global memory (the error cleared: not the call's).
      if (cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes)) !=
          cudaSuccess) {
        (void)cudaGetLastError();
        return int64_t{0};
      }
    }
    return bytes / static_cast<int64_t>(sizeof(float));
  });
  return floats <= limit;
}

int64_t ResidentBlocks(bool backward) {
  static std::atomic<int64_t> known[2][kDevices] = {};
  return OncePerDevice(known[backward ? 1 : 0], [backward](int device) {
    int sms = 0, per_sm = 0;
    Check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
    // The forward's heaviest per-chunk kernel, or the backward's.
    const void* kernel = backward ? reinterpret_cast<const void*>(KeySideKernel)
                                  : reinterpret_cast<const void*>(ChunkForwardKernel);
    Check(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, kThreads, 0), "occupancy");
    return static_cast<int64_t>(sms) * (per_sm > 0 ? per_sm : 1);
  });
}

void StatesOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(x.forward_blocks), slices = static_cast<unsigned>(x.rows * x.Slices());
  ChunkOwnStateKernel<<<blocks, kThreads, SharedBytes(x, false), on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks' own states)");
  EnteringStatesKernel<<<slices, kScanThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "forward launch (entering states)");
}

void ForwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  StatesOnDevice(x, stream);
  const auto on = static_cast<cudaStream_t>(stream);
  ChunkForwardKernel<<<static_cast<unsigned>(x.forward_blocks), kThreads, SharedBytes(x, false), on>>>(x);
  Check(cudaGetLastError(), "forward launch (chunks)");
}

void QuerySideOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  QuerySideKernel<<<static_cast<unsigned>(x.rows * x.backward_blocks), kThreads, SharedBytes(x, true),
                    static_cast<cudaStream_t>(stream)>>>(x);
  Check(cudaGetLastError(), "backward launch (query side)");
}

void KeySideOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  const auto on = static_cast<cudaStream_t>(stream);
  const auto blocks = static_cast<unsigned>(x.rows * x.backward_blocks),
             slices = static_cast<unsigned>(x.rows * x.Slices());
  ReverseShareKernel<<<blocks, kThreads, SharedBytes(x, true), on>>>(x);
  Check(cudaGetLastError(), "backward launch (chunks' own reverse states)");
  ReverseStatesKernel<<<slices, kScanThreads, 0, on>>>(x);
  Check(cudaGetLastError(), "backward launch (reverse states)");
  KeySideKernel<<<blocks, kThreads, SharedBytes(x, true), on>>>(x);
  Check(cudaGetLastError(), "backward launch (key side)");
}

}  // namespace darkformer::cuda_scan
