// Which GPUs this build's CUDA operator runs on: the architectures CMake compiled its kernels for
// (DARKFORMER_CUDA_ARCHITECTURES), against a device's compute capability, so that op: cuda on a
// GPU it has no code for is refused naming both, before a launch fails.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace darkformer {

// The architectures of this build's kernels, as CMake writes them ({80, 90}: sm_80 and sm_90);
// empty in a build without the operator.
std::vector<int> CudaOpArchitectures();

// Whether kernels compiled for `architectures` run on a device of compute capability
// major.minor. Each is compiled as its own code, which runs on devices of its major version and
// the same or a higher minor, and as PTX, which the driver compiles for any later device: so
// whether one of them is at or below the device's.
bool CudaOpRunsOn(const std::vector<int>& architectures, int major, int minor);

// "" where CUDA device `index` runs the operator; else why not, naming the device, its
// architecture and the build's.
std::string CudaOpDeviceProblem(int64_t index);

}  // namespace darkformer
