// The `attention` config section: which kernel each layer uses and each kernel's own options.
//
//   attention:
//     kernel: performer            # default for every layer
//     per_layer: {0: exact}        # optional overrides by layer index
//     performer: {num_features: 256, ...}   # a kernel's options, read by that kernel
#pragma once

#include <yaml-cpp/yaml.h>

#include <map>
#include <string>

#include "util/config_reader.h"

namespace darkformer {

struct AttentionConfig {
  std::string kernel = "exact";
  std::map<int64_t, std::string> per_layer;
  YAML::Node options = YAML::Node(YAML::NodeType::Map);  // the whole section, for kernel options
  std::string path = "attention";
  int64_t run_seed = 0;  // train.seed (set by the run config, not a key): offsets kernel draws

  std::string KernelForLayer(int64_t layer) const;
  // The options section of kernel `name` (empty when absent), with its key path.
  ConfigReader OptionsFor(const std::string& name) const;
  // Validates names and rejects unknown keys; kernel sections are checked by the kernels.
  static AttentionConfig FromConfig(const ConfigReader& reader, int64_t num_layers);
};

}  // namespace darkformer
