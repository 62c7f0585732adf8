// The `attention` config section (see attention_config.h).
#include "attention/attention_config.h"

#include "attention/kernel_registry.h"


namespace darkformer {

std::string AttentionConfig::KernelForLayer(int64_t layer) const {
  const auto it = per_layer.find(layer);
  return it == per_layer.end() ? kernel : it->second;
}

ConfigReader AttentionConfig::OptionsFor(const std::string& name) const {
  const std::string key_path = path + "." + name;
  if (options.IsMap() && options[name]) return ConfigReader(options[name], key_path);
  return ConfigReader(YAML::Node(YAML::NodeType::Map), key_path);
}

static void CheckKernelName(const std::string& name, const std::string& key_path) {
  const auto names = KernelNames();
  for (const auto& n : names) {
    if (n == name) return;
  }
  std::string valid;
  for (const auto& n : names) valid += (valid.empty() ? "" : ", ") + n;
  Fail("config key '" + key_path + "': unknown attention kernel '" + name + "'" + DidYouMean(name, names) +
       "; valid kernels: " + valid);
}

AttentionConfig AttentionConfig::FromConfig(const ConfigReader& reader, int64_t num_layers) {
  AttentionConfig c;
  c.path = reader.path().empty() ? "attention" : reader.path();
  c.options = reader.node() ? YAML::Clone(reader.node()) : YAML::Node(YAML::NodeType::Map);
  std::string kernels;
  for (const auto& name : KernelNames()) kernels += (kernels.empty() ? "" : " | ") + name;
  c.kernel = reader.Get<std::string>("kernel", c.kernel, KeySpec("every layer's kernel: " + kernels));
  CheckKernelName(c.kernel, reader.KeyPath("kernel"));
  const auto per_layer = reader.Get<std::map<int64_t, std::string>>(
      "per_layer", {}, "kernels by layer index that override `kernel`, e.g. {0: exact}");
  for (const auto& [layer, name] : per_layer) {
    const std::string key = reader.KeyPath("per_layer") + "." + std::to_string(layer);
    DF_CHECK(layer >= 0 && layer < num_layers,
             "config key '" << key << "': layer index out of range [0, " << num_layers << ")");
    CheckKernelName(name, key);
  }
  c.per_layer = per_layer;
  for (const auto& name : KernelNames()) reader.Allow(name);
  reader.RejectUnknown();
  return c;
}

}  // namespace darkformer
