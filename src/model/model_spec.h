// Shared by commands: read a model section from a YAML file (a model file, or a run config
// with a `model:` section) and an optional `attention:` section.
#pragma once

#include <string>

#include "attention/attention_config.h"
#include "model/gemma_config.h"

namespace darkformer {

struct ModelSpec {
  GemmaConfig model;
  AttentionConfig attention;
};

ModelSpec ReadModelSpec(const std::string& yaml_path);

}  // namespace darkformer
