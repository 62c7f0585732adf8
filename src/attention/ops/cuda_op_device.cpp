// The CUDA operator's architectures against a device's (see cuda_op_device.h).
#include "attention/ops/cuda_op_device.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <mutex>
#include <sstream>

namespace darkformer {

std::vector<int> CudaOpArchitectures() {
#ifdef DARKFORMER_CUDA_ARCHITECTURES
  std::vector<int> architectures;
  std::istringstream text(DARKFORMER_CUDA_ARCHITECTURES);  // "80,90", from src/CMakeLists.txt
  for (std::string item; std::getline(text, item, ',');) architectures.push_back(std::stoi(item));
  return architectures;
#else
  return {};
#endif
}

bool CudaOpRunsOn(const std::vector<int>& architectures, int major, int minor) {
  const int device = 10 * major + minor;
  return std::any_of(architectures.begin(), architectures.end(), [device](int a) { return a <= device; });
}

namespace {

std::string DeviceProblem(const std::vector<int>& architectures, int64_t index) {
  if (architectures.empty()) return "this build has no CUDA kernels (CMake found no nvcc); use op: auto";
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, static_cast<int>(index)) != cudaSuccess) {
    (void)cudaGetLastError();  // the answer, not the next call's error
    return "CUDA device " + std::to_string(index) + " cannot be queried";
  }
  if (CudaOpRunsOn(architectures, properties.major, properties.minor)) return "";
  std::ostringstream why;
  why << "this build's kernels are for sm_" << architectures.front();
  for (size_t i = 1; i < architectures.size(); ++i) why << ", sm_" << architectures[i];
  why << " and later GPUs; CUDA device " << index << " (" << properties.name << ") is sm_" << properties.major
      << properties.minor << ": rebuild with -DDARKFORMER_CUDA_ARCHITECTURES=\"" << properties.major << properties.minor;
  for (int a : architectures) why << ";" << a;
  why << "\", or use op: auto";
  return why.str();
}

}  // namespace

std::string CudaOpDeviceProblem(int64_t index) {
  // Asked at every call of the operator: the device's answer is kept (the properties query is slow).
  static std::mutex mutex;
  static std::map<int64_t, std::string> known;
  std::lock_guard<std::mutex> lock(mutex);
  const auto found = known.find(index);
  if (found != known.end()) return found->second;
  return known[index] = DeviceProblem(CudaOpArchitectures(), index);
}

}  // namespace darkformer
