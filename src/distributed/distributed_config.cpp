// Reading train.distributed (see distributed_config.h).
#include "distributed/distributed_config.h"

namespace darkformer {

DistributedConfig DistributedConfig::FromConfig(const ConfigReader& r) {
  DistributedConfig d;
  d.backend = r.GetEnum("backend", d.backend, kDistributedBackendNames, "auto: nccl on CUDA, gloo on CPU");
  d.timeout_s = r.Get("timeout_s", d.timeout_s,
                      KeySpec("seconds a rendezvous or collective may wait for the other ranks before the job fails with an error").Above(0));
  d.bucket_cap_mb = r.Get("bucket_cap_mb", d.bucket_cap_mb, KeySpec("gradient all-reduce bucket size, MiB (torch DDP's default)").Above(0));
  d.find_unused_parameters = r.GetEnum(
      "find_unused_parameters", d.find_unused_parameters, kUnusedParameterSearchNames,
      KeySpec("search each step for trainable parameters without a gradient (torch DDP's flag; one graph "
              "traversal per step): auto = only where a layer's kernel ignores q and k (random, constant)"));
  r.RejectUnknown();
  return d;
}

}  // namespace darkformer
