// Peak memory since the last read (see step_memory.h).
#include "train/step_memory.h"

#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <cuda_runtime_api.h>

#include <fstream>
#include <sstream>

namespace darkformer {

namespace {

int64_t PeakRssBytes() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream in(line.substr(6));
      int64_t kib = 0;
      in >> kib;
      return kib * 1024;
    }
  }
  return 0;
}

}  // namespace

StepMemory::StepMemory(const torch::Device& device) : device_(device) {}

MemoryPeaks StepMemory::ReadAndReset() {
  MemoryPeaks p;
  p.rss = PeakRssBytes();
  if (rss_resets_) {
    std::ofstream clear("/proc/self/clear_refs");
    clear << "5";  // resets VmHWM to the current RSS (Linux >= 4.0)
    rss_resets_ = static_cast<bool>(clear.flush());
  }
  if (device_.is_cuda()) {
    // The allocator exists only once CUDA is initialised: a read before any tensor reached the
    // device (a test's baseline) would otherwise throw "Invalid device argument".
    at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
    namespace alloc = c10::cuda::CUDACachingAllocator;
    const int device = device_.has_index() ? device_.index() : 0;
    const auto stats = alloc::getDeviceStats(device);
    const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
    p.cuda_allocated = stats.allocated_bytes[all].peak;
    p.cuda_reserved = stats.reserved_bytes[all].peak;
    alloc::resetPeakStats(device);
  }
  return p;
}

std::string StepMemory::DeviceName() const {
  if (!device_.is_cuda()) return "cpu";
  cudaDeviceProp properties{};
  if (cudaGetDeviceProperties(&properties, device_.has_index() ? device_.index() : 0) != cudaSuccess) return "cuda";
  return properties.name;
}

}  // namespace darkformer
