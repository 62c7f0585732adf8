// Peak memory since the last read, for the step line and metrics.jsonl: the process's peak RSS on
// the CPU (VmHWM, reset after each read through /proc/self/clear_refs), the CUDA caching
// allocator's allocated and reserved peaks on a GPU (reset after each read).
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>

namespace darkformer {

struct MemoryPeaks {
  int64_t rss = 0;                // bytes; the process's peak resident set since the last read
  int64_t cuda_allocated = -1;    // -1 on a CPU run
  int64_t cuda_reserved = -1;
};

class StepMemory {
 public:
  explicit StepMemory(const torch::Device& device);
  MemoryPeaks ReadAndReset();
  // The device's name for the MFU peak lookup ("cpu" on the CPU).
  std::string DeviceName() const;

 private:
  torch::Device device_;
  bool rss_resets_ = true;  // false once a reset failed: the peak is then since the process started
};

}  // namespace darkformer
