// Sizes from config values, before anything is allocated: products of named factors (the key
// that makes a term large is the one an error names), bytes a person reads, the memory a device
// has; and the kernels' draws checked against it (what the config reader and kernel-check refuse
// before building a kernel). fit_check.h sums such terms for a whole run.
#pragma once

#include <torch/torch.h>
#include <yaml-cpp/yaml.h>

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "attention/attention_config.h"
#include "model/gemma_config.h"

namespace darkformer {

// Past int64 no tensor can even be described, whatever the device.
constexpr long double kInt64Max = static_cast<long double>(std::numeric_limits<int64_t>::max());

// One product of config values: `what` takes prod(factors) * bytes_per_element bytes.
struct SizeTerm {
  std::string what;
  std::vector<std::pair<std::string, int64_t>> factors;  // (key path, value)
  long double multiplier = 1;                           // constant factors and bytes per element
  bool activation = false;                              // grows with the batch, not the weights
  long double Bytes() const;
  // The key of the largest factor: the one that makes this term large.
  const std::pair<std::string, int64_t>& DominantFactor() const;
};

// "13.2 GiB", also for sizes far beyond int64.
std::string HumanBytes(long double bytes);

// The kernel options' num_features, read without building the kernel (0 when not set: the
// defaults are small, and leaving them out keeps the bound a lower bound).
int64_t ConfiguredFeatures(const AttentionConfig& attention, const std::string& kernel);

// Bytes the device can still allocate: CUDA's free memory on that device; on the CPU, MemAvailable
// of /proc/meminfo, capped by the cgroup's memory limit when there is one. 0 when unknown.
int64_t AvailableDeviceMemory(const torch::Device& device);

// The kernels' draws are made when the config is validated (each kernel in use is built once, on
// the CPU): a num_features whose projection cannot fit is refused before that, naming the key.
void CheckKernelDrawsFit(const AttentionConfig& attention, const GemmaConfig& model);

// kernel-check's kernels, built from --options (a YAML map) rather than a run config: the
// projection check above, and (max_length > 0) one batch x heads x max_length x num_features fp32
// feature map, against what `device` has free. Refused naming num_features, not in the allocator.
void CheckKernelOptionsFit(const std::string& kernel, const YAML::Node& options, int64_t head_dim, int64_t batch = 1,
                           int64_t heads = 1, int64_t max_length = 0, const torch::Device& device = torch::kCPU);

}  // namespace darkformer
