// One attention call as `darkformer kernel-check --bench` times it (kernel_bench.h): its inputs,
// how it treats the row's documents, and what one call measures: time and peak memory, what it
// computes in, the ops and host syncs it dispatches, and where its time goes (a profile).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <torch/torch.h>

#include "attention/attention_kernel.h"
#include "util/op_count.h"

namespace darkformer::kernel_bench {

// How a timed call treats the row's documents (--bench-documents).
enum class Documents { kNone, kMasked, kPerDocument };

// What every call of one bench row shares.
struct CallSetting {
  torch::Device device = torch::kCPU;         // --device
  torch::ScalarType dtype = torch::kFloat32;  // --dtype: q, k, v and the incoming gradient; bf16 forwards under autocast
  double norm = 0.0;                          // --bench-norm: > 0, sharp opposed rows of this norm; 0, N(0, 1)
  int64_t batch = 1, heads = 1, kv_heads = 1, length = 1, head_dim = 1;
  torch::Tensor documents;                    // B x L ids on the device, for calls with documents
};

struct Sample {
  double ms = 0, peak_mib = 0;
};

// Ops dispatched by one attention-layer call: its forward, then its backward alone (the incoming
// gradient made beforehand); and on a CUDA device the host syncs of one forward + backward.
struct LayerOps {
  OpCount forward, backward;
  std::optional<int64_t> host_syncs;
};

// Document ids of B rows of L positions on `device`: exponential lengths of mean `mean` (at least 1), seeded.
torch::Tensor PackedDocuments(int64_t batch, int64_t length, int64_t mean, const torch::Device& device);

// One forward + backward on fresh inputs: wall time (device synchronised on CUDA) and peak memory.
Sample TimeOnce(const CallSetting& setting, AttentionKernel& kernel, Documents documents);

// What an implementation computes in: SDPA's backend for these inputs (flash, efficient, cudnn or
// math), or the dtypes our causal operator recorded for its features and running state (what
// autocast left of the inputs aside). Empty for a path that records nothing (the composite one).
std::string ComputesIn(const CallSetting& setting, AttentionKernel& kernel, bool exact);

LayerOps CountLayerOps(const CallSetting& setting, AttentionKernel& kernel, Documents documents);

// One forward+backward of implementation `name` under LibTorch's profiler (on CUDA with the
// device's activity: each kernel launch's own device time): self time (own time minus the ops it
// called) and call count per op, summed over threads, top rows printed.
void ProfileOnce(const CallSetting& setting, const std::string& name, AttentionKernel& kernel);

}  // namespace darkformer::kernel_bench
