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
#include "train/size_terms.h"

namespace darkformer {

enum class Workload { kTrain, kForward };

// The lower-bound terms of a run (see above). Zero-sized terms are left out.
// `devices`: data-parallel ranks splitting data.batch_size.
std::vector<SizeTerm> LowerBoundTerms(const RunConfig& config, Workload workload, int64_t devices = 1);

// Throws Error when the run cannot fit (see above). `ranks_sharing_memory`: processes of the same
// job sharing this device's memory (CPU data parallelism on one host); `devices`: data-parallel
// ranks splitting data.batch_size.
void CheckRunFits(const RunConfig& config, Workload workload, const torch::Device& device, int64_t devices = 1,
                  int64_t ranks_sharing_memory = 1);

}  // namespace darkformer
