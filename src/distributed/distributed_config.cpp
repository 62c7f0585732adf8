// Reading train.distributed (see distributed_config.h).
#include "distributed/distributed_config.h"

namespace darkformer {

DistributedConfig DistributedConfig::FromConfig(const ConfigReader& r) {
  DistributedConfig d;
  d.backend = r.GetEnum("backend", d.backend, kDistributedBackendNames, "auto: nccl on CUDA, gloo on CPU");
  d.timeout_s = r.Get("timeout_s", d.timeout_s,
                      KeySpec("seconds a rendezvous or collective may wait for the other ranks before the job fails with an error").Above(0));
  d.bucket_cap_mb = r.Get("bucket_cap_mb", d.bucket_cap_mb, KeySpec("gradient all-reduce bucket size, MiB (torch DDP's default)").Above(0));
  d.find_unused_parameters = r.Get("find_unused_parameters", d.find_unused_parameters,
                                   "allow trainable parameters without a gradient (constant attention's q/k); one graph traversal per step");
  r.RejectUnknown();
  return d;
}

}  // namespace darkformer
