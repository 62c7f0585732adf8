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
  // Doc lines and accepted values: declared where distributed_config.cpp reads them.
  DistributedBackend backend = DistributedBackend::kAuto;
  int64_t timeout_s = 600;  // a dead or stuck rank ends the run instead of hanging it
  int64_t bucket_cap_mb = 25;
  bool find_unused_parameters = true;

  static DistributedConfig FromConfig(const ConfigReader& reader);
};

}  // namespace darkformer
