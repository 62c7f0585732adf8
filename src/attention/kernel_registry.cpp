// The table of attention kernels by name: one line per kernel.
#include "attention/kernel_registry.h"

#include <map>

#include "attention/baseline_kernels.h"
#include "attention/darkformer_kernel.h"
#include "attention/derf_kernel.h"
#include "attention/exact_kernel.h"
#include "attention/flexformer_kernel.h"
#include "attention/gerf_kernel.h"
#include "attention/lfk_kernel.h"
#include "attention/performer_kernel.h"
#include "attention/saderf_kernel.h"
#include "attention/slay_kernel.h"
#include "attention/trig_kernel.h"

namespace darkformer {

namespace {

template <typename KernelModule>
KernelFactory Factory() {
  return [](const KernelShape& shape, const ConfigReader& options) {
    // Upcast first: ModuleHolder's forwarding constructor would otherwise try to build the base.
    std::shared_ptr<AttentionKernelImpl> kernel = KernelModule(shape, options).ptr();
    return AttentionKernel(kernel);
  };
}

const std::map<std::string, KernelFactory>& Registry() {
  static const std::map<std::string, KernelFactory> registry = {
      {"aderf", Factory<AderfKernel>()},
      {"constant", Factory<ConstantKernel>()},
      {"darkformer", Factory<DarkformerKernel>()},
      {"exact", Factory<ExactKernel>()},
      {"flexformer", Factory<FlexformerKernel>()},
      {"gerf", Factory<GerfKernel>()},
      {"lfk", Factory<LfkKernel>()},
      {"performer", Factory<PerformerKernel>()},
      {"random", Factory<RandomKernel>()},
      {"saderf", Factory<SaderfKernel>()},
      {"sderf", Factory<SderfKernel>()},
      {"slay", Factory<SlayKernel>()},
      {"trig", Factory<TrigKernel>()},
  };
  return registry;
}

}  // namespace

AttentionKernel MakeAttentionKernel(const std::string& name, const KernelShape& shape, const ConfigReader& options) {
  const auto& registry = Registry();
  const auto it = registry.find(name);
  if (it == registry.end()) {
    std::string valid;
    for (const auto& [n, f] : registry) valid += (valid.empty() ? "" : ", ") + n;
    Fail("unknown attention kernel '" + name + "'" + DidYouMean(name, KernelNames()) + "; valid kernels: " + valid);
  }
  return it->second(shape, options);
}

std::vector<std::string> KernelNames() {
  std::vector<std::string> names;
  for (const auto& [name, factory] : Registry()) names.push_back(name);
  return names;
}

}  // namespace darkformer
