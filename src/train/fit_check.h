// Refuses, before anything is allocated, a run whose sizes cannot fit the device: a model or batch
// so large that its tensors overflow int64, or that needs more memory than the device has free.
// LibTorch would otherwise fail deep inside the allocator ("can't allocate memory: you tried to
// allocate 512000000000000 bytes") or the kernel would kill the process, with no key named.
//
// Two bounds, both from the config alone:
//  - a lower bound, summed from named terms in long double (so nothing overflows): the weights (and,
//    for training, their gradients and AdamW state), the kernels' feature projections, and the
//    activations and logits one batch cannot do without. A run is refused when even this exceeds
//    the free memory; the error names the term's dominant key (the largest factor of the largest
//    term), e.g. "model.hidden_size = 1000000000".
//  - for training, the full estimate of train/memory_estimate.h (within ~15 %; docs/memory.md),
//    checked only once the lower bound fits. `train.memory_check: false` skips this second check.
#pragma once

#include <torch/torch.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "train/run_config.h"

namespace darkformer {

enum class Workload { kTrain, kForward };

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

// The lower-bound terms of a run (see above). Zero-sized terms are left out.
// `devices`: data-parallel ranks splitting data.batch_size.
std::vector<SizeTerm> LowerBoundTerms(const RunConfig& config, Workload workload, int64_t devices = 1);

// Bytes the device can still allocate: CUDA's free memory on that device; on the CPU, MemAvailable
// of /proc/meminfo, capped by the cgroup's memory limit when there is one. 0 when unknown.
int64_t AvailableDeviceMemory(const torch::Device& device);

// Throws Error when the run cannot fit (see above). `ranks_sharing_memory`: processes of the same
// job sharing this device's memory (CPU data parallelism on one host); `devices`: data-parallel
// ranks splitting data.batch_size.
void CheckRunFits(const RunConfig& config, Workload workload, const torch::Device& device, int64_t devices = 1,
                  int64_t ranks_sharing_memory = 1);

// The kernels' draws are made when the config is validated (each kernel in use is built once, on
// the CPU): a num_features whose projection cannot fit is refused before that, naming the key.
void CheckKernelDrawsFit(const AttentionConfig& attention, const GemmaConfig& model);

// kernel-check's kernels, built from --options (a YAML map) rather than a run config: the
// projection check above, and (max_length > 0) one batch x heads x max_length x num_features fp32
// feature map, against what `device` has free. Refused naming num_features, not in the allocator.
void CheckKernelOptionsFit(const std::string& kernel, const YAML::Node& options, int64_t head_dim, int64_t batch = 1,
                           int64_t heads = 1, int64_t max_length = 0, const torch::Device& device = torch::kCPU);

}  // namespace darkformer
