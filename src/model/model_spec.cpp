// Reading model specs from YAML files (see model_loading.h).
#include "model/model_spec.h"

#include <filesystem>

namespace darkformer {

ModelSpec ReadModelSpec(const std::string& yaml_path) {
  DF_CHECK(std::filesystem::exists(yaml_path), "config file not found: " << yaml_path);
  YAML::Node root;
  try {
    root = YAML::LoadFile(yaml_path);
  } catch (const YAML::Exception& e) {
    Fail(yaml_path + ": invalid YAML: " + e.what());
  }
  try {
    ModelSpec spec;
    const bool is_run_config = root.IsMap() && root["model"] && root["model"].IsMap();
    const ConfigReader model_reader = is_run_config ? ConfigReader(root["model"], "model") : ConfigReader(root, "");
    spec.model = GemmaConfig::FromConfig(model_reader);
    if (is_run_config && root["attention"]) {
      spec.attention = AttentionConfig::FromConfig(ConfigReader(root["attention"], "attention"), spec.model.num_hidden_layers);
    }
    return spec;
  } catch (const Error& e) {
    Fail(yaml_path + ": " + e.what());
  }
}

}  // namespace darkformer
