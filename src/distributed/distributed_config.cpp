// Reading train.distributed (see distributed_config.h).
#include "distributed/distributed_config.h"

namespace darkformer {

DistributedConfig DistributedConfig::FromConfig(const ConfigReader& r) {
  DistributedConfig d;
  d.backend = r.GetEnum("backend", d.backend, kDistributedBackendNames);
  d.timeout_s = r.Get<int64_t>("timeout_s", d.timeout_s);
  d.bucket_cap_mb = r.Get<int64_t>("bucket_cap_mb", d.bucket_cap_mb);
  d.find_unused_parameters = r.Get<bool>("find_unused_parameters", d.find_unused_parameters);
  r.RejectUnknown();
  DF_CHECK(d.timeout_s > 0, "config key '" << r.KeyPath("timeout_s") << "' must be positive, got " << d.timeout_s);
  DF_CHECK(d.bucket_cap_mb > 0,
           "config key '" << r.KeyPath("bucket_cap_mb") << "' must be positive, got " << d.bucket_cap_mb);
  return d;
}

}  // namespace darkformer
