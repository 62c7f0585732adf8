// The train.distributed section: how a torchrun worker joins its data-parallel group. Without
// torchrun's environment these keys have no effect.
#pragma once

#include <string>
#include <vector>

#include "util/config_reader.h"

namespace darkformer {

enum class DistributedBackend { kAuto, kGloo, kNccl };
inline const std::vector<std::pair<std::string, DistributedBackend>> kDistributedBackendNames = {
    {"auto", DistributedBackend::kAuto}, {"gloo", DistributedBackend::kGloo}, {"nccl", DistributedBackend::kNccl}};

struct DistributedConfig {
  DistributedBackend backend = DistributedBackend::kAuto;  // auto: NCCL on CUDA, Gloo on CPU
  // Seconds any rendezvous or collective may wait for the other ranks before the job fails with
  // an error (a dead or stuck rank ends the run instead of hanging it).
  int64_t timeout_s = 600;
  int64_t bucket_cap_mb = 25;  // gradient all-reduce buckets (torch DDP's default)
  // Let a trainable parameter receive no gradient in a step (e.g. q/k under constant attention);
  // costs one graph traversal per step.
  bool find_unused_parameters = true;

  static DistributedConfig FromConfig(const ConfigReader& reader);
};

}  // namespace darkformer
