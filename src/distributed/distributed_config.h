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

// Whether c10d's Reducer searches each step's graph for trainable parameters that got no gradient
// (torch DDP's find_unused_parameters). auto: only where a layer's kernel ignores queries and keys
// (the random and constant baselines: KernelTraits::reads_queries_and_keys), since every other
// layer gives every trainable parameter one.
enum class UnusedParameterSearch { kAuto, kAlways, kNever };
inline const std::vector<std::pair<std::string, UnusedParameterSearch>> kUnusedParameterSearchNames = {
    {"auto", UnusedParameterSearch::kAuto}, {"true", UnusedParameterSearch::kAlways},
    {"false", UnusedParameterSearch::kNever}};

struct DistributedConfig {
  // Doc lines and accepted values: declared where distributed_config.cpp reads them.
  DistributedBackend backend = DistributedBackend::kAuto;
  int64_t timeout_s = 600;  // a dead or stuck rank ends the run instead of hanging it
  int64_t bucket_cap_mb = 25;
  UnusedParameterSearch find_unused_parameters = UnusedParameterSearch::kAuto;

  static DistributedConfig FromConfig(const ConfigReader& reader);
};

}  // namespace darkformer
