// Peak memory of one device type (the CPU by default; CUDA's caching allocator reports the same
// way) over a stretch of code, from LibTorch's allocator reports: install with
// c10::DebugInfoGuard(c10::DebugInfoKind::PROFILER_STATE, info) and read peak() afterwards.
// Counts bytes allocated while installed, net of those of them freed while installed (tensors
// made before are not counted, nor is their release). Memory that does not come from LibTorch's
// allocator (std::string, std::vector, HDF5's own buffers) is not seen.
#pragma once

#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>

namespace darkformer {

class PeakMemory : public c10::MemoryReportingInfoBase {
 public:
  explicit PeakMemory(c10::DeviceType type = c10::DeviceType::CPU) : type_(type) {}
  // Called from every thread that allocates under the guard (the parallel operator's workers too).
  void reportMemoryUsage(void*, int64_t alloc_size, size_t, size_t, c10::Device device) override {
    if (device.type() != type_) return;
    const int64_t now = current_.fetch_add(alloc_size) + alloc_size;
    int64_t peak = peak_.load();
    while (now > peak && !peak_.compare_exchange_weak(peak, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
  int64_t peak() const { return peak_.load(); }
  // Bytes allocated under the guard and not yet freed (what a stretch of code left alive).
  int64_t current() const { return current_.load(); }
  double peak_mib() const { return peak() / (1024.0 * 1024.0); }

 private:
  c10::DeviceType type_;
  std::atomic<int64_t> current_{0}, peak_{0};
};

}  // namespace darkformer
