// The scan on the device: one CUDA block per key row (see cuda_scan.h). Nothing here but the
// launch: the arithmetic is cuda_scan_body.h's, which the host emulation runs in the tests.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "attention/ops/cuda_scan.h"

namespace darkformer::cuda_scan {

namespace {

constexpr int kThreads = 256;

// At most kThreads threads: the compiler keeps each thread within the registers a full block may use.
__global__ void __launch_bounds__(kThreads) ForwardKernel(Launch x) {
  const int64_t r = blockIdx.x;
  ScanForward(Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}, x.RowOf(r), x.ForwardOf(r),
              x.ScratchOf(r));
}

__global__ void __launch_bounds__(kThreads) BackwardKernel(Launch x) {
  const int64_t r = blockIdx.x;
  ScanBackward(Block{static_cast<int>(threadIdx.x), static_cast<int>(blockDim.x)}, x.RowOf(r), x.BackwardOf(r),
               x.ScratchOf(r));
}

void Check(cudaError_t error, const char* what) {
  if (error != cudaSuccess) throw std::runtime_error(std::string("op: cuda: ") + what + ": " + cudaGetErrorString(error));
}

}  // namespace

bool DeviceKernelsBuilt() { return true; }

void ForwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  ForwardKernel<<<static_cast<unsigned>(x.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x);
  Check(cudaGetLastError(), "forward launch");
}

void BackwardOnDevice(const Launch& x, void* stream) {
  if (x.rows == 0 || x.length == 0) return;
  BackwardKernel<<<static_cast<unsigned>(x.rows), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(x);
  Check(cudaGetLastError(), "backward launch");
}

}  // namespace darkformer::cuda_scan
